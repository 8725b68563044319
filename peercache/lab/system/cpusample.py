"""CPU time of a command's whole process tree, sampled while it runs: the evidence of "one core" limits.

``python -m peercache.lab.system.cpusample --out FILE [--interval S] -- COMMAND...``
runs COMMAND (stdin, stdout and stderr are its own), and every ``interval``
seconds appends one JSON line to FILE: the time, the summed user+system CPU
seconds of every live process of the tree, the CPU seconds of each thread
and the seconds each thread waited in a run queue for a CPU
(``/proc/<pid>/task/<tid>/schedstat``), and the whole machine's CPU time
(``/proc/stat``: busy, interrupts and softirq, stolen by a hypervisor) with
the CPU seconds of its ``ksoftirqd`` threads. It exits with the command's status; SIGTERM/SIGINT are passed on.
It runs on the host of the side it measures, so local, network-namespace and
SSH hosts are all sampled the same way; the runner fetches the file.

Besides the samples, FILE holds the evidence of a NUMA binding (see
:mod:`peercache.lab.system.numa`): one ``host`` record (this host's NUMA
nodes and their CPUs, from sysfs) and ``binding`` records, one per process
of the tree once it has run ``SETTLE_S`` seconds and one more with its last
reading (taken every ``NUMA_EVERY`` samples and when a signal is passed on):
its ``Cpus_allowed_list`` and ``Mems_allowed_list`` (``/proc/<pid>/status``)
and its memory per node, policy and largest mappings (``numa_maps``). A
sample line has ``threads``; the others do not.

:func:`window_usage` (pure) turns the samples into what the window used:
cores (CPU seconds per second), the busiest thread's share of one core, the
thread that was runnable longest (on a CPU or waiting for one), and the
machine's busy CPUs with their softirq, ksoftirqd and stolen parts.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from peercache.sysfs import proc_path, read_attr, sysfs_path

CLK_TCK = os.sysconf("SC_CLK_TCK")
DEFAULT_INTERVAL_S = 0.25
#: Every how many samples the resident pages per NUMA node (and each process's binding) are read too.
NUMA_EVERY = 4
#: A process's first binding record is written once it has run this long (its buffers are allocated).
SETTLE_S = 1.0
#: How many of a process's largest mappings its binding record names.
LARGEST = 3
#: numa_maps file mappings that are a process's own memory (placed by its policy when it faults them
#: in), not the page cache of binaries and libraries (placed where whoever read them first ran).
OWN_FILES = ("/dev/shm/", "/memfd:", "/SYSV", "/dev/hugepages/", "/dev/zero", "/anon_hugepage")


def _stat_fields(text: str) -> list[str]:
    """Fields of a /proc stat line after the ``(comm)``, which may hold spaces and parentheses."""
    return text[text.rindex(")") + 2:].split()


def _tasks(pid: int) -> list:
    """The thread folders of ``pid`` (/proc/<pid>/task/*); none once it has exited, which a process of the
    tree may do between being listed and being read (a sampler that raised there ended its wrapped client)."""
    try:
        return list(proc_path(pid, "task").glob("*"))
    except OSError:
        return []


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in _tasks(pid):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return out


def tree(pid: int) -> list[int]:
    """``pid`` and its live descendants."""
    seen, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.append(p)
        todo += _children(p)
    return seen


def numa_pages(pids: list[int]) -> dict[str, int]:
    """The own memory of ``pids`` per NUMA node, in 4 KiB pages (``/proc/<pid>/numa_maps``).

    Own memory only (anonymous, heap, stack, shm, memfd: :func:`parse_numa_maps`): pages of
    binaries and libraries sit wherever the page cache first read them, which says nothing about
    where the process put its buffers.
    """
    out: dict[str, int] = {}
    for p in pids:
        try:
            text = proc_path(p, "numa_maps").read_text()
        except OSError:
            continue
        for node, kb in parse_numa_maps(text)["own_kb_per_node"].items():
            out[node] = out.get(node, 0) + kb // 4
    return out


def parse_numa_maps(text: str) -> dict:
    """A process's memory per NUMA node from its ``numa_maps`` text (pure).

    ``pages_per_node``: resident pages of every mapping (``N<node>=<pages>``); ``own_kb_per_node``:
    kB of its own memory only (anonymous, heap, stack, shm, memfd: see ``OWN_FILES``), page sizes
    applied; ``policies``: the memory policies of those mappings (``default``, ``bind:0`` ...);
    ``largest``: its ``LARGEST`` largest mappings (address, what, policy, pages per node).
    """
    pages: dict[str, int] = {}
    own_kb: dict[str, int] = {}
    policies: set[str] = set()
    maps = []
    for line in text.splitlines():
        toks = line.split()
        if len(toks) < 2:
            continue
        nodes: dict[str, int] = {}
        what, page_kb = "anon", 4
        for tok in toks[2:]:
            key, eq, val = tok.partition("=")
            if key[:1] == "N" and key[1:].isdigit() and val.isdigit():
                nodes[key[1:]] = nodes.get(key[1:], 0) + int(val)
            elif key == "file" and eq:
                what = val.replace("\\040", " ")
            elif key in ("heap", "stack") and not eq:
                what = key
            elif key == "kernelpagesize_kB" and val.isdigit():
                page_kb = int(val)
        own = not what.startswith("/") or what.startswith(OWN_FILES)
        for node, n in nodes.items():
            pages[node] = pages.get(node, 0) + n
            if own:
                own_kb[node] = own_kb.get(node, 0) + n * page_kb
        if own:
            policies.add(toks[1])
        if nodes:
            maps.append({"start": toks[0], "what": what, "policy": toks[1], "pages": sum(nodes.values()),
                         "page_kB": page_kb, "nodes": nodes})
    maps.sort(key=lambda m: m["pages"] * m["page_kB"], reverse=True)
    return {"pages_per_node": pages, "own_kb_per_node": own_kb, "policies": sorted(policies),
            "largest": maps[:LARGEST]}


def parse_status(text: str) -> dict:
    """``Name``, ``Cpus_allowed_list`` and ``Mems_allowed_list`` of a ``/proc/<pid>/status`` text (pure)."""
    out: dict[str, str | None] = {"comm": None, "cpus_allowed_list": None, "mems_allowed_list": None}
    for line in text.splitlines():
        key, sep, val = line.partition(":")
        if not sep:
            continue
        k = {"Name": "comm", "Cpus_allowed_list": "cpus_allowed_list",
             "Mems_allowed_list": "mems_allowed_list"}.get(key)
        if k:
            out[k] = val.strip()
    return out


def read_binding(pid: int) -> dict | None:
    """Where process ``pid`` may run and where its memory sits: /proc/<pid>/status and numa_maps (None once gone)."""
    try:
        status = proc_path(pid, "status").read_text()
    except OSError:
        return None
    rec: dict = {"pid": pid, **parse_status(status)}
    try:
        rec.update(parse_numa_maps(proc_path(pid, "numa_maps").read_text()))
    except OSError as e:   # a kernel without NUMA support has no numa_maps
        rec["numa_maps"] = f"not read: {e.strerror or e}"
    return rec


def host_nodes() -> dict:
    """This host's NUMA nodes and their CPU lists ({"0": "0-1"}), from sysfs (empty without NUMA support)."""
    base = sysfs_path("devices", "system", "node")
    out = {}
    try:
        names = sorted((n.name for n in base.iterdir() if n.name[4:].isdigit() and n.name.startswith("node")),
                       key=lambda n: int(n[4:]))
    except OSError:
        return {}
    for name in names:
        text, _ = read_attr(base / name / "cpulist")
        out[name[4:]] = text
    return out


class _Bindings:
    """The binding records of a tree: a first one per process once settled, and each one's latest reading."""

    def __init__(self) -> None:
        self.first_seen: dict[int, float] = {}
        self.settled: set[int] = set()
        self.latest: dict[int, dict] = {}

    def read(self, pids: list[int], now: float) -> list[dict]:
        """Read every process of ``pids``; returns the records to write now (the newly settled ones)."""
        out = []
        for p in pids:
            self.first_seen.setdefault(p, now)
            rec = read_binding(p)
            if rec is None:
                continue
            rec["age_s"] = round(now - self.first_seen[p], 3)
            self.latest[p] = {"t": now, "binding": rec}
            if p not in self.settled and rec["age_s"] >= SETTLE_S:
                self.settled.add(p)
                self.latest[p]["written"] = True      # as its settled record: not written again as last
                out.append({"t": now, "binding": dict(rec, at="settled")})
        return out

    def last(self) -> list[dict]:
        """Each process's latest reading, marked ``last`` (none where it is the ``settled`` record itself)."""
        return [{"t": r["t"], "binding": dict(r["binding"], at="last")} for r in self.latest.values()
                if not (r["binding"]["pid"] in self.settled and r.get("written"))]


#: The fields of /proc/stat's ``cpu`` line, in order (USER_HZ ticks summed over every CPU).
PROC_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice")


def parse_proc_stat(text: str) -> dict:
    """The machine's CPU seconds from a /proc/stat text (pure): ``busy`` (everything but idle, iowait and
    steal; ``guest`` time is inside ``user`` already), ``softirq`` (interrupts and softirqs), ``steal``
    (time a hypervisor ran something else), ``total`` and ``cpus`` (its ``cpuN`` lines)."""
    ticks: dict[str, int] = {}
    cpus = 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if name == "cpu":
            ticks = dict(zip(PROC_STAT_FIELDS, (int(v) for v in rest.split())))
        elif name.startswith("cpu") and name[3:].isdigit():
            cpus += 1
    if not ticks:
        raise ValueError("no 'cpu' line in /proc/stat")
    total = sum(ticks.get(k, 0) for k in PROC_STAT_FIELDS[:8])
    idle = ticks.get("idle", 0) + ticks.get("iowait", 0) + ticks.get("steal", 0)
    return {"busy": round((total - idle) / CLK_TCK, 2),
            "softirq": round((ticks.get("irq", 0) + ticks.get("softirq", 0)) / CLK_TCK, 2),
            "steal": round(ticks.get("steal", 0) / CLK_TCK, 2), "total": round(total / CLK_TCK, 2), "cpus": cpus}


def ksoftirqd_threads() -> list[int]:
    """The pids of this machine's ``ksoftirqd/N`` threads (the softirq work the interrupted tasks left over)."""
    out = []
    for d in proc_path().glob("[0-9]*"):
        try:
            if (d / "comm").read_text().startswith("ksoftirqd/"):
                out.append(int(d.name))
        except (OSError, ValueError):
            continue
    return sorted(out)


def _cpu_seconds(stat: Path) -> float:
    f = _stat_fields(stat.read_text())
    # fields after comm: state(0) ppid ... utime(11) stime(12)
    return (int(f[11]) + int(f[12])) / CLK_TCK


def _run_delay(task: Path) -> float | None:
    """Seconds the thread has waited in a run queue for a CPU (schedstat's second field, ns), or None."""
    try:
        return int((task / "schedstat").read_text().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def boot_id() -> str | None:
    """This kernel's boot id: two samplers that read the same one ran on one machine (network namespaces)."""
    text, _ = read_attr(proc_path("sys", "kernel", "random", "boot_id"))
    return text


def machine_sample(ksoftirqd: list[int]) -> dict | None:
    """This machine's CPU seconds (:func:`parse_proc_stat`) and its ``ksoftirqd`` threads' (None: unreadable)."""
    try:
        out = parse_proc_stat(proc_path("stat").read_text())
    except (OSError, ValueError):
        return None
    ksoft = 0.0
    for pid in ksoftirqd:
        try:
            ksoft += _cpu_seconds(proc_path(pid, "stat"))
        except (OSError, ValueError, IndexError):
            continue
    out["ksoftirqd"] = round(ksoft, 3)
    return out


def sample(pid: int, with_numa: bool = False, ksoftirqd: list[int] | None = None) -> dict:
    """One sample of the tree under ``pid``: time, processes, CPU seconds in all and per thread, each thread's
    run-queue wait, the machine's CPU time (with its ``ksoftirqd`` threads', where given) and, when asked,
    resident pages per NUMA node."""
    threads: dict[str, float] = {}
    waits: dict[str, float] = {}
    procs = 0
    pids = tree(pid)
    for p in pids:
        tasks = _tasks(p)
        if tasks:
            procs += 1
        for task in tasks:
            try:
                threads[f"{p}/{task.name}"] = _cpu_seconds(task / "stat")
            except (OSError, ValueError, IndexError):
                continue
            wait = _run_delay(task)
            if wait is not None:
                waits[f"{p}/{task.name}"] = wait
    out = {"t": time.time(), "procs": procs, "cpu_s": round(sum(threads.values()), 3),
           "threads": {k: round(v, 3) for k, v in threads.items()},
           "waits": {k: round(v, 4) for k, v in waits.items()}}
    machine = machine_sample(ksoftirqd or [])
    if machine:
        out["machine"] = machine
    if with_numa:
        out["numa_pages"] = numa_pages(pids)
    return out


@dataclass
class Usage:
    """What a side used over a window."""

    cores: float                 #: CPU seconds per second of the whole tree
    busiest_thread: float        #: the busiest thread's CPU seconds per second (1.0 = one full core)
    busiest: str | None          #: that thread, as pid/tid
    seconds: float               #: the window actually covered by samples
    samples: int
    numa_pages: dict[str, int] | None = None   #: own memory per NUMA node (4 KiB pages), last sample in the window
    #: the thread that was runnable longest: (on a CPU + waiting for one) per second, 1.0 = the whole window
    runnable: float | None = None
    runnable_thread: str | None = None
    runnable_wait: float | None = None           #: of that: seconds per second it waited in a run queue
    wait_cores: float | None = None              #: every thread's run-queue wait, seconds per second
    machine: dict | None = None                  #: the machine's busy CPUs and their parts (:func:`machine_usage`)

    @property
    def memory_node(self) -> int | None:
        """The NUMA node holding most of the tree's own memory (its buffers; not library pages)."""
        if not self.numa_pages:
            return None
        return int(max(self.numa_pages, key=self.numa_pages.get))

    def as_dict(self) -> dict:
        out = {"cores": round(self.cores, 3), "busiest_thread": round(self.busiest_thread, 3),
               "busiest": self.busiest, "seconds": round(self.seconds, 3), "samples": self.samples,
               "numa_pages": self.numa_pages, "memory_node": self.memory_node}
        if self.runnable is not None:
            out.update(runnable=round(self.runnable, 3), runnable_thread=self.runnable_thread,
                       runnable_wait=round(self.runnable_wait or 0.0, 3), wait_cores=round(self.wait_cores or 0.0, 3))
        if self.machine:
            out["machine"] = self.machine
        return out


def machine_usage(a: dict, b: dict, seconds: float, boot: str | None = None) -> dict | None:
    """The machine's CPUs between two ``machine`` readings ``seconds`` apart, in CPUs (CPU seconds per second):
    ``busy_cores`` (interrupts, softirqs and ksoftirqd included), ``softirq_cores``, ``ksoftirqd_cores``,
    ``steal_cores``, ``cpus``, and the kernel's ``boot`` id given (pure; None without both readings)."""
    if not a or not b or seconds <= 0 or not b.get("cpus"):
        return None
    per = {k: max(0.0, (b.get(k, 0.0) - a.get(k, 0.0)) / seconds) for k in ("busy", "softirq", "steal", "ksoftirqd")}
    return {"cpus": int(b["cpus"]), "busy_cores": round(per["busy"], 3), "softirq_cores": round(per["softirq"], 3),
            "ksoftirqd_cores": round(per["ksoftirqd"], 3), "steal_cores": round(per["steal"], 3),
            "boot": boot}


def window_usage(samples: list[dict], start: float, end: float) -> Usage | None:
    """CPU use between the samples nearest inside [start, end] (None without two such samples)."""
    inside = [s for s in samples if "threads" in s and start <= s["t"] <= end]
    if len(inside) < 2:
        return None
    a, b = inside[0], inside[-1]
    dt = b["t"] - a["t"]
    if dt <= 0:
        return None
    # A thread that started inside the window counts from 0; one that ended is not in b and is dropped
    # (it then under-counts, never over-counts).
    per = {k: v - a["threads"].get(k, 0.0) for k, v in b["threads"].items()}
    busiest = max(per, key=per.get) if per else None
    numa = [x["numa_pages"] for x in inside if x.get("numa_pages")]
    use = Usage(max(0.0, sum(per.values()) / dt), (per[busiest] / dt) if busiest else 0.0, busiest, dt,
                len(inside), numa[-1] if numa else None)
    if "waits" in b:   # samplers older than the run-queue reading have none
        wait = {k: max(0.0, v - a.get("waits", {}).get(k, 0.0)) for k, v in b["waits"].items()}
        live = {k: per.get(k, 0.0) + wait.get(k, 0.0) for k in set(per) | set(wait)}
        if live:
            top = max(sorted(live), key=live.get)
            use.runnable, use.runnable_thread = live[top] / dt, top
            use.runnable_wait, use.wait_cores = wait.get(top, 0.0) / dt, sum(wait.values()) / dt
    use.machine = machine_usage(a.get("machine"), b.get("machine"), dt, (host_record(samples) or {}).get("boot"))
    return use


def combine(usages: dict[str, dict[str, dict]]) -> dict[str, dict]:
    """Per-group {label: usage} -> one {label: usage}: cores and run-queue waits summed, the busiest thread and
    the thread runnable longest of all, and the machine's reading (one machine per label: the groups' samplers
    on one host read the same /proc/stat; the first group's is kept)."""
    out: dict[str, dict] = {}
    for per in usages.values():
        for label, u in per.items():
            if "cores" not in u:
                continue
            o = out.setdefault(label, {"cores": 0.0, "busiest_thread": 0.0, "busiest": None, "groups": 0})
            o["cores"] = round(o["cores"] + u["cores"], 3)
            o["groups"] += 1
            if u["busiest_thread"] > o["busiest_thread"]:
                o["busiest_thread"], o["busiest"] = u["busiest_thread"], u["busiest"]
            if u.get("runnable") is not None:
                o["wait_cores"] = round(o.get("wait_cores", 0.0) + (u.get("wait_cores") or 0.0), 3)
                if u["runnable"] > o.get("runnable", -1.0):
                    o.update(runnable=u["runnable"], runnable_thread=u.get("runnable_thread"),
                             runnable_wait=u.get("runnable_wait"))
            if u.get("machine") and "machine" not in o:
                o["machine"] = u["machine"]
    return out


def bindings(samples: list[dict]) -> list[dict]:
    """The ``binding`` records of a sample file's lines (each with its time ``t``)."""
    return [dict(s["binding"], t=s.get("t")) for s in samples if isinstance(s.get("binding"), dict)]


def host_record(samples: list[dict]) -> dict | None:
    """The ``host`` record of a sample file's lines (its NUMA nodes), or None."""
    return next((s["host"] for s in samples if isinstance(s.get("host"), dict)), None)


def read_samples(text: str) -> list[dict]:
    """The JSON lines of a sample file (a truncated last line, from a killed sampler, is dropped)."""
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def wrap(argv: list[str], out: str, launcher: list[str] | None = None,
         interval: float = DEFAULT_INTERVAL_S) -> list[str]:
    """``argv`` run under the sampler, writing to ``out`` on the host it runs on (pure).

    ``launcher`` is how that host runs this module (default: this interpreter).
    """
    return [*(launcher or [sys.executable, "-m", "peercache.lab.system.cpusample"]), "--out", out,
            "--interval", f"{interval:g}", "--", *argv]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m peercache.lab.system.cpusample", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="append JSON-line samples here")
    ap.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, help="seconds between samples")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("no command given (put it after --)")
    if not 0.01 <= a.interval <= 10:
        ap.error("--interval must be in [0.01, 10] seconds")
    try:
        child = subprocess.Popen(cmd)
    except OSError as e:
        print(f"cpusample: cannot start {cmd[0]}: {e}", file=sys.stderr)
        return 127
    held = _Bindings()

    def forward(sig: int, _frame) -> None:
        # The runner ends servers with a signal: take the last binding reading before passing it on.
        try:
            held.read(tree(child.pid), time.time())
        except Exception:  # noqa: BLE001 - the signal must be passed on whatever happens here
            pass
        child.send_signal(sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    with open(a.out, "a") as f:
        f.write(json.dumps({"t": time.time(), "host": {"nodes": host_nodes(), "boot": boot_id()}}) + "\n")
        n = 0
        ksoftirqd = ksoftirqd_threads()
        while child.poll() is None:
            # numa_maps is costly to read for a big process: every NUMA_EVERY-th sample only.
            s = sample(child.pid, with_numa=False, ksoftirqd=ksoftirqd)
            if n % NUMA_EVERY == NUMA_EVERY - 1:
                new = held.read(tree(child.pid), s["t"])
                s["numa_pages"] = _summed({p: r["binding"] for p, r in held.latest.items()
                                           if r["t"] == s["t"]})
                f.write(json.dumps(s) + "\n")
                for rec in new:
                    f.write(json.dumps(rec) + "\n")
            else:
                f.write(json.dumps(s) + "\n")
            n += 1
            f.flush()
            try:
                child.wait(timeout=a.interval)
            except subprocess.TimeoutExpired:
                pass
        for rec in held.last():
            f.write(json.dumps(rec) + "\n")
    return child.returncode if child.returncode >= 0 else 128 - child.returncode


def _summed(readings: dict[int, dict]) -> dict[str, int]:
    """Own memory per node in 4 KiB pages, summed over processes' binding readings (what :func:`numa_pages` gives)."""
    out: dict[str, int] = {}
    for r in readings.values():
        for node, kb in (r.get("own_kb_per_node") or {}).items():
            out[node] = out.get(node, 0) + kb // 4
    return out


if __name__ == "__main__":
    sys.exit(main())
