"""CPU time of a command's whole process tree, sampled while it runs: the evidence of "one core" limits.

``python -m peercache.lab.system.cpusample --out FILE [--interval S] -- COMMAND...``
runs COMMAND (stdin, stdout and stderr are its own), and every ``interval``
seconds appends one JSON line to FILE: the time, the summed user+system CPU
seconds of every live process of the tree, and the CPU seconds of each
thread. It exits with the command's status; SIGTERM/SIGINT are passed on.
It runs on the host of the side it measures, so local, network-namespace and
SSH hosts are all sampled the same way; the runner fetches the file.

:func:`window_usage` (pure) turns the samples into what the window used:
cores (CPU seconds per second) and the busiest thread's share of one core.
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

from peercache.sysfs import proc_path

CLK_TCK = os.sysconf("SC_CLK_TCK")
DEFAULT_INTERVAL_S = 0.25
#: Every how many samples the resident pages per NUMA node are read too.
NUMA_EVERY = 4


def _stat_fields(text: str) -> list[str]:
    """Fields of a /proc stat line after the ``(comm)``, which may hold spaces and parentheses."""
    return text[text.rindex(")") + 2:].split()


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in proc_path(pid, "task").glob("*"):
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
    """Resident pages per NUMA node of ``pids`` (``/proc/<pid>/numa_maps`` ``N<node>=<pages>`` fields)."""
    out: dict[str, int] = {}
    for p in pids:
        try:
            text = proc_path(p, "numa_maps").read_text()
        except OSError:
            continue
        for tok in text.split():
            if tok[:1] == "N" and "=" in tok and tok[1:tok.index("=")].isdigit():
                node, pages = tok[1:].split("=", 1)
                if pages.isdigit():
                    out[node] = out.get(node, 0) + int(pages)
    return out


def sample(pid: int, with_numa: bool = False) -> dict:
    """One sample of the tree under ``pid``: time, processes, CPU seconds in all and per thread
    (and, when asked, resident pages per NUMA node)."""
    threads: dict[str, float] = {}
    procs = 0
    pids = tree(pid)
    for p in pids:
        tasks = list(proc_path(p, "task").glob("*"))
        if tasks:
            procs += 1
        for task in tasks:
            try:
                f = _stat_fields((task / "stat").read_text())
            except (OSError, ValueError):
                continue
            # fields after comm: state(0) ppid ... utime(11) stime(12)
            threads[f"{p}/{task.name}"] = (int(f[11]) + int(f[12])) / CLK_TCK
    out = {"t": time.time(), "procs": procs, "cpu_s": round(sum(threads.values()), 3),
           "threads": {k: round(v, 3) for k, v in threads.items()}}
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
    numa_pages: dict[str, int] | None = None   #: resident pages per NUMA node, last sample in the window

    @property
    def memory_node(self) -> int | None:
        """The NUMA node holding most of the tree's resident pages."""
        if not self.numa_pages:
            return None
        return int(max(self.numa_pages, key=self.numa_pages.get))

    def as_dict(self) -> dict:
        return {"cores": round(self.cores, 3), "busiest_thread": round(self.busiest_thread, 3),
                "busiest": self.busiest, "seconds": round(self.seconds, 3), "samples": self.samples,
                "numa_pages": self.numa_pages, "memory_node": self.memory_node}


def window_usage(samples: list[dict], start: float, end: float) -> Usage | None:
    """CPU use between the samples nearest inside [start, end] (None without two such samples)."""
    inside = [s for s in samples if start <= s["t"] <= end]
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
    return Usage(max(0.0, sum(per.values()) / dt), (per[busiest] / dt) if busiest else 0.0, busiest, dt,
                 len(inside), numa[-1] if numa else None)


def combine(usages: dict[str, dict[str, dict]]) -> dict[str, dict]:
    """Per-group {label: usage} -> one {label: usage}: cores summed, the busiest thread of all."""
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
    return out


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
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    with open(a.out, "a") as f:
        n = 0
        while child.poll() is None:
            # numa_maps is costly to read for a big process: every NUMA_EVERY-th sample only.
            f.write(json.dumps(sample(child.pid, with_numa=n % NUMA_EVERY == NUMA_EVERY - 1)) + "\n")
            n += 1
            f.flush()
            try:
                child.wait(timeout=a.interval)
            except subprocess.TimeoutExpired:
                pass
    return child.returncode if child.returncode >= 0 else 128 - child.returncode


if __name__ == "__main__":
    sys.exit(main())
