"""Preflight: check a testbed's hosts before anything runs on them.

``python -m peercache.lab.pipeline validate --testbed T --connect`` runs it and
prints the result; the pipeline's first rule (``preflight``, rules/capture.smk)
runs it through ``python -m peercache.lab.pipeline preflight`` and stops there
when a host fails, so no capture and no point starts on a broken testbed.

Per host (producer and consumer; every listed host of a testbed that lists its hosts):

1. SSH logs in with BatchMode (an SSH host; a failed login is one line).
2. The host's Python (its ``python`` field, :func:`runpoint.host_python`)
   exists, imports PeerCache and the modules the lab runs there, and that
   PeerCache is at this checkout's git revision — all in one remote Python
   run that prints JSON, inside the one probe command of step 1-4.
3. The tools are on the host's PATH: perftest (``ib_read_bw``,
   ``ib_write_bw``) on an rdma testbed, ``numactl`` and ``perf``.
4. On an rdma testbed, each device the testbed names for the host exists,
   its port is ACTIVE, and the GID at ``gid_index`` is a RoCE v2
   IPv4-mapped entry; the active MTU is reported.
5. The hosts reach each other: each pings every other host's ``address`` and,
   on an rdma testbed, the IPv4 of the other's GID on each rail (a second command).

Hosts on this machine need no SSH and run this interpreter: only the tools
(and devices) are checked there, with the lab's own needs (perftest on rdma
testbeds, perf where a point runs perf stat; a missing numactl is noted, the
lab then runs unbound and records why). Network-namespace hosts are created
per point, so nothing can be pinged before: their reachability is skipped
with a note. Every failure is one line ``role (host spec): what; fix`` (a listed host: its name).

Builders (:func:`probe_script`, :func:`ping_script`) and parsers
(:func:`parse_probe`, :func:`parse_pings`, :func:`probe_findings`) are pure
and tested on captured text; :func:`check` runs them on the hosts.
"""
from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peercache import atomic
from peercache import sysfs
from peercache.sysfs import gid_ipv4
from peercache.bench import meta as bench_meta
from peercache.lab.launch import netns
from peercache.lab.launch.hosts import CommandTimeout, Host, HostError, LocalHost, SshHost, parse_host
from peercache.lab.pipeline import experiments
from peercache.lab.pipeline.plan import Plan
from peercache.lab.pipeline.runpoint import host_python
from peercache.lab.system.hostinfo import _iboe_mtu
from peercache.lab.system.slowness import scaled

PERFTEST_TOOLS = ("ib_read_bw", "ib_write_bw")
#: What each missing tool is installed from (the fix of its line).
INSTALL = {"ib_read_bw": "perftest", "ib_write_bw": "perftest", "ib_send_bw": "perftest",
           "numactl": "numactl", "perf": "linux-perf (Debian) / linux-tools-$(uname -r) (Ubuntu)",
           "ping": "iputils-ping"}
#: One echo request, two seconds for the reply (per address; all of a host's run in parallel).
PING = ("ping", "-c", "1", "-W", "2")
#: Modules the lab runs with ``python -m`` on a host: the remote probe imports each.
REMOTE_MODULES = ("peercache.lab.cli", "peercache.lab.system.cpusample", "peercache.bench.cli")
#: Seconds a probe / the pings may take on a plain host (times the guest's slowness).
PROBE_TIMEOUT_S = 60.0
PING_TIMEOUT_S = 30.0
MTU_CODES = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}
#: Hosts probed (and pinging) at once.
MAX_PARALLEL = 16

# The one Python run of the probe: version, PeerCache's location and revision, the lab's modules.
# Kept to what any Python 3 parses, so an old interpreter still answers with its version.
PY_PROBE = """\
import json, sys
d = {"executable": sys.executable, "version": "%d.%d.%d" % tuple(sys.version_info[:3])}
try:
    import peercache
    d["peercache"] = getattr(peercache, "__file__", None)
    from peercache.bench import meta
    d["revision"] = meta.git_revision()
    if d["revision"] is None:
        import os, subprocess
        try:
            r = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(peercache.__file__)), "rev-parse",
                                "HEAD"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               universal_newlines=True, timeout=10)
            d["revision_error"] = r.stdout.strip()[-300:] or "git rev-parse exited %d" % r.returncode
        except Exception as e:
            d["revision_error"] = "%s: %s" % (type(e).__name__, e)
    d["modules"] = {}
    import importlib
    for m in MODULES:
        try:
            importlib.import_module(m)
            d["modules"][m] = None
        except Exception as e:
            d["modules"][m] = "%s: %s" % (type(e).__name__, e)
except Exception as e:
    d["error"] = "%s: %s" % (type(e).__name__, e)
print("@pyjson " + json.dumps(d))
"""


# --- builders (pure) ---------------------------------------------------------------------------

def probe_script(tools: list[str] | tuple[str, ...], devices: list[str] | tuple[str, ...] = (), port: int = 1,
                 gid_index: int | None = None, python: str | None = None, sysfs_root: str | os.PathLike = "/"
                 ) -> str:
    """The ``sh`` script of one host's probe: tools, RDMA devices, then (``python`` given) one Python run.

    Prints ``@tool NAME PATH`` (PATH empty: not found), ``@have DEV...`` (the RDMA devices there),
    ``@dev DEV KEY VALUE`` per named device (``missing``/``noport``, or state, link_layer, sysfs_mtu,
    gid, gid_type, ndev, ndev_mtu, verbs_mtu), ``@pyrc RC`` and the Python run's output as ``@py`` lines.
    ``sysfs_root`` is where /sys is read on the host (a fixture tree in tests; ``ibv_devinfo`` is asked
    only on the live root).
    """
    q = shlex.quote
    root = Path(sysfs_root)
    ib = sysfs.sysfs_path("class", "infiniband", root=root)
    net = sysfs.sysfs_path("class", "net", root=root)
    live = sysfs.is_live(root)
    lines = [f"S={q(str(ib))}", f"N={q(str(net))}", 'T=""; command -v timeout >/dev/null 2>&1 && T="timeout 10"']
    if tools:
        lines.append(f"for t in {' '.join(q(t) for t in tools)}; do "
                     "printf '@tool %s %s\\n' \"$t\" \"$(command -v \"$t\" 2>/dev/null)\"; done")
    if devices:
        lines.append("printf '@have'; for d in \"$S\"/*; do [ -e \"$d\" ] && printf ' %s' \"${d##*/}\"; done; "
                     "printf '\\n'")
        body = [f'P="$S/$d/ports/{int(port)}"',
                "if [ ! -e \"$S/$d\" ]; then printf '@dev %s missing\\n' \"$d\"; continue; fi",
                "if [ ! -d \"$P\" ]; then printf '@dev %s noport\\n' \"$d\"; continue; fi",
                "printf '@dev %s state %s\\n' \"$d\" \"$(cat \"$P/state\" 2>/dev/null)\"",
                "printf '@dev %s link_layer %s\\n' \"$d\" \"$(cat \"$P/link_layer\" 2>/dev/null)\"",
                "printf '@dev %s sysfs_mtu %s\\n' \"$d\" \"$(cat \"$P/active_mtu\" 2>/dev/null)\""]
        if gid_index is not None:
            i = int(gid_index)
            body += [f"printf '@dev %s gid %s\\n' \"$d\" \"$(cat \"$P/gids/{i}\" 2>/dev/null)\"",
                     f"printf '@dev %s gid_type %s\\n' \"$d\" \"$(cat \"$P/gid_attrs/types/{i}\" 2>/dev/null)\"",
                     f"n=$(cat \"$P/gid_attrs/ndevs/{i}\" 2>/dev/null)",
                     "printf '@dev %s ndev %s\\n' \"$d\" \"$n\"",
                     "[ -n \"$n\" ] && printf '@dev %s ndev_mtu %s\\n' \"$d\" \"$(cat \"$N/$n/mtu\" 2>/dev/null)\""]
        if live:
            body.append(f"printf '@dev %s verbs_mtu %s\\n' \"$d\" \"$($T ibv_devinfo -d \"$d\" -i {int(port)} "
                        "2>/dev/null | sed -n 's/^[[:space:]]*active_mtu:[[:space:]]*//p' | head -n 1)\"")
        lines.append(f"for d in {' '.join(q(d) for d in devices)}; do\n  " + "\n  ".join(body) + "\ndone")
    if python is not None:
        code = PY_PROBE.replace("MODULES", repr(tuple(REMOTE_MODULES)))
        lines += [f"o=$({q(python)} -c {q(code)} 2>&1); r=$?",
                  "printf '@pyrc %s\\n' \"$r\"",
                  "printf '%s\\n' \"$o\" | sed 's/^/@py /'"]
    lines.append("true")
    return "\n".join(lines) + "\n"


def probe_argv(*args: Any, **kw: Any) -> list[str]:
    """:func:`probe_script` as an argv for :meth:`Host.run`."""
    return ["sh", "-c", probe_script(*args, **kw), "pclab-preflight"]


def ping_script(addresses: list[str] | tuple[str, ...]) -> str:
    """``sh`` script pinging every address in parallel (``ping -c 1 -W 2``, bounded by ``timeout 10``).

    Prints ``@noping`` when ping is missing, else ``@ping ADDR RC LAST-LINE-OF-ITS-OUTPUT`` per address.
    """
    q = shlex.quote
    ping = " ".join(PING)
    return ("command -v ping >/dev/null 2>&1 || { echo @noping; exit 0; }\n"
            'T=""; command -v timeout >/dev/null 2>&1 && T="timeout 10"\n'
            f"for a in {' '.join(q(a) for a in addresses)}; do\n"
            f"  ( o=$($T {ping} \"$a\" 2>&1); r=$?; "
            "printf '@ping %s %s %s\\n' \"$a\" \"$r\" \"$(printf '%s\\n' \"$o\" | grep . | tail -n 1)\" ) &\n"
            "done\nwait\n")


# --- parsers (pure) ----------------------------------------------------------------------------

@dataclass
class Probe:
    """What one host's probe printed, parsed."""

    tools: dict[str, str | None] = field(default_factory=dict)      #: name -> path (None: not on PATH)
    have: list[str] | None = None                                   #: RDMA devices there (None: not asked)
    devices: dict[str, dict[str, str]] = field(default_factory=dict)  #: name -> {key: value}, or {"missing": ""}
    python_rc: int | None = None                                    #: None: Python not asked
    python_out: list[str] = field(default_factory=list)             #: its output lines, JSON line left out
    python: dict[str, Any] | None = None                            #: the JSON it printed


def parse_probe(text: str) -> Probe:
    """Parse :func:`probe_script` output (unknown lines are ignored)."""
    p = Probe()
    for line in text.splitlines():
        tag, _, rest = line.partition(" ")
        if tag == "@tool":
            name, _, path = rest.partition(" ")
            p.tools[name] = path.strip() or None
        elif tag == "@have":
            p.have = rest.split()
        elif tag == "@dev":
            parts = rest.split(" ", 2)
            if len(parts) >= 2:
                p.devices.setdefault(parts[0], {})[parts[1]] = parts[2].strip() if len(parts) > 2 else ""
        elif tag == "@pyrc":
            p.python_rc = int(rest) if rest.strip().lstrip("-").isdigit() else None
        elif tag == "@py":
            if rest.startswith("@pyjson "):
                try:
                    p.python = json.loads(rest[len("@pyjson "):])
                except ValueError:
                    p.python_out.append(rest)
            else:
                p.python_out.append(rest)
    return p


def parse_pings(text: str) -> tuple[bool, dict[str, tuple[int, str]]]:
    """(ping present, {address: (rc, last line of its output)}) from :func:`ping_script` output."""
    out: dict[str, tuple[int, str]] = {}
    present = True
    for line in text.splitlines():
        if line.strip() == "@noping":
            present = False
        elif line.startswith("@ping "):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[2].lstrip("-").isdigit():
                out[parts[1]] = (int(parts[2]), parts[3].strip() if len(parts) > 3 else "")
    return present, out


def _mtu_text(info: dict[str, str]) -> str | None:
    """The port's active MTU as text: sysfs, else ibv_devinfo's, else derived from the netdev's MTU."""
    if info.get("sysfs_mtu"):
        return info["sysfs_mtu"]
    if info.get("verbs_mtu"):
        return info["verbs_mtu"]
    ndev_mtu = info.get("ndev_mtu") or ""
    if ndev_mtu.isdigit() and info.get("link_layer", "Ethernet") == "Ethernet":
        mtu = _iboe_mtu(int(ndev_mtu))
        if mtu:
            return f"{mtu} ({MTU_CODES.get(mtu, '?')}), derived from {info.get('ndev')} MTU {ndev_mtu}"
    return None


@dataclass
class Expect:
    """What one host must have (from the testbed), and how its lines name it."""

    role: str                                    #: producer/consumer, or the name of a listed host
    spec: str
    tools: tuple[str, ...] = ()                  #: required on PATH
    optional_tools: tuple[str, ...] = ()         #: noted when missing
    devices: tuple[str, ...] = ()                #: this host's names of the testbed's devices
    devices_field: str = "devices"               #: where the testbed names them (the fix)
    port: int = 1
    gid_index: int | None = None
    python: str | None = None                    #: the interpreter checked there (None: not checked)
    revision: str | None = None                  #: this checkout's revision
    field: str | None = None                     #: the host's block in the testbed (default hosts.<role>)

    @property
    def host_field(self) -> str:
        return self.field or f"hosts.{self.role}"

    @property
    def who(self) -> str:
        return f"{self.role} ({self.spec})"


def _one_line(text: str, n: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n] + "..."


def python_findings(e: Expect, p: Probe) -> tuple[list[str], dict[str, Any]]:
    """(failure lines, summary) of the Python part of a probe."""
    fail, who = [], e.who
    fix_py = (f"set {e.host_field}.python in the testbed to the interpreter that has PeerCache installed there "
              "(absolute, or relative to this checkout for a shared install)")
    if p.python_rc is None:
        return [f"{who}: the probe printed no Python result; check the host's shell"], {}
    if p.python is None:
        out = _one_line(" ".join(p.python_out)) or "no output"
        if p.python_rc == 127:
            return [f"{who}: python {e.python} not found there ({out}); {fix_py}"], {}
        if p.python_rc == 126:
            return [f"{who}: python {e.python} is not executable there ({out}); {fix_py}"], {}
        return [f"{who}: python {e.python} could not run the check (rc {p.python_rc}: {out}); {fix_py}"], {}
    info = p.python
    summary = {"python": e.python, "executable": info.get("executable"), "version": info.get("version"),
               "peercache": info.get("peercache"), "revision": info.get("revision")}
    where = f"python {e.python} ({info.get('version')})"
    if info.get("error"):
        fail.append(f"{who}: {where} cannot import peercache ({_one_line(info['error'])}); install PeerCache "
                    f"there (pip install -e '<checkout>[lab]') or {fix_py}")
        return fail, summary
    bad = {m: why for m, why in (info.get("modules") or {}).items() if why}
    for m, why in bad.items():
        fail.append(f"{who}: {where} imports peercache but not {m} ({_one_line(why)}); install PeerCache with "
                    "its lab dependencies there (pip install -e '<checkout>[lab]')")
    theirs, ours = info.get("revision"), e.revision
    same, note = revisions_match(theirs, ours)
    if note:
        summary["revision_note"] = note
    if ours and not same:
        if theirs is None:
            why = _one_line(info.get("revision_error") or "", 200)
            fail.append(f"{who}: PeerCache there ({info.get('peercache')}) has no git revision"
                        + (f" (git: {why})" if why else "") + f", so it cannot be compared with this checkout's "
                        f"{ours}; install it there from a checkout at {ours} (git and, for a checkout owned by "
                        "another user, safe.directory must work there)")
        else:
            fail.append(f"{who}: PeerCache there is at revision {theirs}, this checkout at {ours}; bring the host's "
                        f"checkout ({info.get('peercache')}) to {ours} (same commit, same local changes)")
    return fail, summary


#: What git_revision() appends when it could not run `git status` in time (a slow host).
_STATUS_UNKNOWN = "status-unknown"


def revisions_match(theirs: str | None, ours: str | None) -> tuple[bool, str | None]:
    """(same revision?, a note) of two ``git_revision()`` answers, ``<commit>[-dirty|-status-unknown]`` (pure).

    The commits must be equal, and so must the local-changes marks, except where one side could
    not run ``git status`` in time (an emulated host over a 9p root takes seconds): then the
    commits decide and the note says what could not be compared.
    """
    if not ours or theirs == ours:
        return True, None
    if theirs is None:
        return False, None
    (tc, _, tm), (oc, _, om) = theirs.partition("-"), ours.partition("-")
    if tc != oc:
        return False, None
    if _STATUS_UNKNOWN in (tm, om):
        side = "the host" if tm == _STATUS_UNKNOWN else "this checkout"
        return True, (f"same commit {tc}; whether {side} has local changes is unknown (git status did not "
                      "answer in time there)")
    return False, None


def device_findings(e: Expect, p: Probe) -> tuple[list[str], list[dict[str, Any]]]:
    """(failure lines, per-device summary) of the RDMA part of a probe."""
    fail, out, who = [], [], e.who
    have = ", ".join(p.have or []) or "none"
    for i, d in enumerate(e.devices):
        info = p.devices.get(d)
        if info is None:
            fail.append(f"{who}: RDMA device {d} was not reported by the probe; check the host's shell")
            continue
        if "missing" in info:
            fail.append(f"{who}: RDMA device {d} not found (have: {have}); fix the testbed's {e.devices_field}")
            continue
        if "noport" in info:
            fail.append(f"{who}: RDMA device {d} has no port {e.port}; fix the testbed's ib_port")
            continue
        state = info.get("state") or ""
        s = {"rail": i, "device": d, "port": e.port, "state": state, "mtu": _mtu_text(info)}
        out.append(s)
        if not state.upper().endswith("ACTIVE"):
            fail.append(f"{who}: RDMA device {d} port {e.port} is {state or 'of unknown state'}, not ACTIVE; bring "
                        f"its link up (ip link set {info.get('ndev') or '<netdev>'} up; cable, switch port)")
        if e.gid_index is None:
            continue
        gid, gtype = info.get("gid") or "", info.get("gid_type") or ""
        ip = gid_ipv4(gid)
        s.update(gid_index=e.gid_index, gid=gid, gid_type=gtype, ipv4=ip, netdev=info.get("ndev") or None)
        if not gid or gid == sysfs.ZERO_GID:
            fail.append(f"{who}: RDMA device {d} port {e.port} has no GID at index {e.gid_index}; fix the testbed's "
                        f"gid_index (show_gids lists the table) or give the rail's netdev its IPv4 address")
        elif ip is None:
            fail.append(f"{who}: GID {e.gid_index} of {d} is {gid}, not an IPv4-mapped ::ffff:a.b.c.d entry; set "
                        "gid_index to the RoCE v2 entry of the rail's IPv4 address (show_gids)")
        elif gtype != "RoCE v2":
            fail.append(f"{who}: GID {e.gid_index} of {d} ({ip}) is of type {gtype or 'unknown'!r}, not RoCE v2; set "
                        "gid_index to the RoCE v2 entry of that address (show_gids)")
    return fail, out


def probe_findings(e: Expect, p: Probe) -> tuple[list[str], list[str], dict[str, Any]]:
    """(failure lines, notes, summary) of one host's probe against what it must have."""
    fail, notes = [], []
    summary: dict[str, Any] = {"tools": {t: p.tools.get(t) for t in (*e.tools, *e.optional_tools)}}
    for t in e.tools:
        if not p.tools.get(t):
            fail.append(f"{e.who}: {t} is not on the PATH there; install {INSTALL.get(t, t)}")
    for t in e.optional_tools:
        if not p.tools.get(t):
            notes.append(f"{e.who}: {t} is not on the PATH (optional here: commands run unbound and their "
                         f"records say why); install {INSTALL.get(t, t)} to bind them")
    if e.python is not None:
        f, summary["python"] = python_findings(e, p)
        fail += f
    if e.devices:
        f, summary["devices"] = device_findings(e, p)
        fail += f
    return fail, notes, summary


# --- running it on the hosts -------------------------------------------------------------------

@dataclass
class Report:
    """The preflight's result: failure lines (empty: passed), notes, and per-host summaries."""

    testbed: str
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)
    revision: str | None = None

    @property
    def ok(self) -> bool:
        return not self.failures

    def as_dict(self) -> dict[str, Any]:
        return {"testbed": self.testbed, "ok": self.ok, "failures": self.failures, "notes": self.notes,
                "revision": self.revision, "hosts": self.hosts}

    def summary_lines(self) -> list[str]:
        """The OK summary: one line per host, one more per device and for its reachability."""
        out = []
        for role, h in self.hosts.items():
            py = h.get("python") or {}
            if h.get("on_this_machine"):
                pytxt = f"python {py.get('executable')} {py.get('version')} (this interpreter)"
            else:
                pytxt = f"python {py.get('python')} {py.get('version')} (peercache {py.get('peercache')})"
            tools = h.get("tools") or {}
            tooltxt = ", ".join(f"{t}" if p else f"{t} MISSING" for t, p in tools.items()) or "none needed"
            out.append(f"{role} ({h['spec']}): OK: {pytxt}; revision {py.get('revision') or 'unknown'}; "
                       f"tools: {tooltxt}")
            if py.get("revision_note"):
                out.append(f"  note: {py['revision_note']}")
            for d in h.get("devices") or []:
                gid = (f", GID {d['gid_index']} {d.get('ipv4')} ({d.get('gid_type')}"
                       + (f" on {d['netdev']}" if d.get("netdev") else "") + ")") if "gid_index" in d else ""
                out.append(f"  rail {d['rail']}: {d['device']} port {d['port']} {d['state']}, MTU "
                           f"{d.get('mtu') or 'unknown'}{gid}")
            reach = h.get("reach")
            if isinstance(reach, str):
                out.append(f"  reachability: {reach}")
            elif reach:
                out.append("  reaches " + ", ".join(f"{r['what']} {r['address']}" for r in reach))
        return out


def required_tools(tb: experiments.Testbed, points: list | None, remote: bool) -> tuple[tuple[str, ...],
                                                                                          tuple[str, ...]]:
    """(required, optional) tools of a host: every check's tool on a remote host; on this machine the ones the
    testbed's points run (perftest on rdma testbeds, perf where a point has perf_stat), numactl optional."""
    live = [p for p in (points or []) if not p.skipped]
    perftest = [*PERFTEST_TOOLS]
    for p in live:
        t = p.params.get("tool") if p.kind == "perftest" else None
        if t and t not in perftest:
            perftest.append(t)
    perftest_needed = tb.form == "rdma" or any(p.kind == "perftest" for p in live)
    if remote:
        return (*(perftest if perftest_needed else ()), "numactl", "perf"), ()
    needs_perf = points is None or any(p.params.get("perf_stat") for p in live)
    return (*(perftest if perftest_needed else ()), *(("perf",) if needs_perf else ())), ("numactl",)


def _probe_host(host: Host) -> Host:
    # A host created per point (a namespace of the built-in testbed) exists only while a point runs; its files
    # and PATH are this machine's.
    return LocalHost() if host.created_per_point else host


def check(tb: experiments.Testbed, points: list | None = None, sysfs_root: str | os.PathLike | None = None,
          log=None) -> Report:
    """Run the preflight on ``tb``'s hosts (``points``: the testbed's, for the tools they need).

    ``sysfs_root`` is where every host's /sys is read (default: the current :mod:`peercache.sysfs` root;
    a fixture tree in tests). Nothing but the probes and the pings is started; every ssh connection is
    closed before returning.
    """
    rep = Report(tb.name)
    if tb.guest:
        rep.notes.append(f"testbed {tb.name} runs every measurement inside its Soft-RoCE guest; its hosts exist "
                         "only there, so there is nothing to check from here")
        return rep
    root = Path(sysfs_root) if sysfs_root is not None else sysfs.get_root()
    probe_s, ping_s = scaled(PROBE_TIMEOUT_S), scaled(PING_TIMEOUT_S)
    cluster = tb.cluster
    names = [h.name for h in cluster]     # producer, consumer; or the listed hosts' names
    defs = {h.name: h.as_host_def() for h in cluster}
    fields = {h.name: f"hosts.{i}" if tb.is_cluster else f"hosts.{h.name}" for i, h in enumerate(cluster)}
    hosts: dict[str, Host] = {}
    try:
        for name in names:
            try:
                hosts[name] = parse_host(defs[name]["host"])
            except HostError as e:
                rep.failures.append(f"{name} ({defs[name]['host']}): {e}")
        if len(hosts) < len(names):
            return rep
        if any(h.created_per_point for h in hosts.values()):
            ok, why = netns.available()
            if not ok and tb.get("netns_pair"):
                fb = tb.get("fallback_hosts") or {}
                rep.notes.append(f"network namespaces unavailable ({why}): the points will run on the fallback "
                                 "hosts " + ", ".join(f"{r} {fb[r]['host']}" for r in names if r in fb))
            elif not ok and tb.get("netns_bridge"):
                rep.notes.append(f"network namespaces unavailable ({why}): all {len(names)} hosts will run on this "
                                 "machine's loopback 127.0.0.1")
        rep.revision = bench_meta.git_revision()
        if tb.form == "rdma" and tb.get("gid_index") is None:
            rep.notes.append("gid_index is not set: the GIDs and the rails' addresses are not checked")
        expects: dict[str, Expect] = {}
        for ch in cluster:
            role, h = ch.name, hosts[ch.name]
            req, opt = required_tools(tb, points, remote=not h.on_this_machine)
            expects[role] = Expect(
                role=role, spec=h.spec, tools=req, optional_tools=opt,
                devices=tuple(tb.host_devices(ch, tb.devices)) if tb.form == "rdma" else (),
                devices_field=f"{fields[role]}.devices" if ch.devices else "devices", port=int(tb.get("ib_port", 1)),
                gid_index=tb.get("gid_index"),
                python=None if h.on_this_machine else host_python(h, defs[role])[0], revision=rep.revision,
                field=fields[role])
            rep.hosts[role] = {"spec": h.spec, "on_this_machine": h.on_this_machine}
            if h.on_this_machine and defs[role].get("python"):
                rep.notes.append(f"{expects[role].who}: python {defs[role]['python']} ignored: hosts on this "
                                 "machine run this checkout's interpreter")

        def probe(role: str) -> tuple[list[str], list[str], dict[str, Any], Probe | None]:
            h, e = hosts[role], expects[role]
            if h.reached_over_ssh:
                try:
                    h.connect()
                except HostError as err:
                    why = _one_line(str(err).removeprefix(f"{h.spec}: "), 600)
                    return [f"{e.who}: cannot log in over SSH with BatchMode: {why}"], [], {}, None
            argv = probe_argv(e.tools + e.optional_tools, e.devices, e.port, e.gid_index, e.python, root)
            try:
                r = _probe_host(h).run(argv, timeout=probe_s)
            except CommandTimeout:
                return [f"{e.who}: the preflight probe did not finish within {probe_s:.0f}s; "
                        "check the host's load and its shell"], [], {}, None
            except HostError as err:
                return [f"{e.who}: {_one_line(str(err), 600)}"], [], {}, None
            if r.rc == 255 and isinstance(h, SshHost):       # 255: ssh's own failure, told apart by its words
                return [f"{e.who}: ssh failed running the probe: {_one_line(h.failure(r.stderr, r.rc), 600)}"], [], {}, None
            p = parse_probe(r.stdout)
            fail, notes, summary = probe_findings(e, p)
            if h.on_this_machine:
                summary["python"] = {"executable": sys.executable, "version": platform.python_version(),
                                     "revision": rep.revision}
            return fail, notes, summary, p

        with ThreadPoolExecutor(min(len(names), MAX_PARALLEL)) as pool:
            results = dict(zip(names, pool.map(probe, names)))
        probes: dict[str, Probe | None] = {}
        for role in names:
            fail, notes, summary, p = results[role]
            rep.failures += fail
            rep.notes += notes
            rep.hosts[role].update(summary)
            probes[role] = p
        _reach(tb, hosts, expects, probes, rep, ping_s)
        return rep
    finally:
        for h in hosts.values():
            try:
                h.close()
            except Exception as e:  # a master that will not exit times out on its own (ControlPersist)
                rep.notes.append(f"{h.spec}: closing the ssh connection failed: {e}")


def _reach(tb: experiments.Testbed, hosts: dict[str, Host], expects: dict[str, Expect],
           probes: dict[str, Probe | None], rep: Report, ping_s: float) -> None:
    """Each host pings every other host's address and (rdma) the other's GID address of every rail, within
    ``ping_s`` seconds (:data:`PING_TIMEOUT_S`, scaled)."""
    if any(h.created_per_point for h in hosts.values()):
        why = ("skipped: network-namespace hosts are created for each point (and removed after it), so there is "
               "nothing to ping before a point runs")
        for role in hosts:
            rep.hosts[role]["reach"] = why
        return
    address = {h.name: h.address for h in tb.cluster}
    targets: dict[str, list[tuple[str, str]]] = {}
    for role in hosts:
        if probes.get(role) is None:
            continue                      # not logged in there: its line says so
        t = []
        for peer in hosts:
            if peer == role:
                continue
            t.append((f"{peer}'s address" if tb.is_cluster else f"the {peer}'s address", address[peer]))
            pp = probes.get(peer)
            for i, d in enumerate(expects[peer].devices if pp is not None and expects[peer].gid_index is not None
                                  else ()):
                ip = gid_ipv4((pp.devices.get(d) or {}).get("gid"))
                if ip:
                    t.append((f"rail {i} ({expects[role].devices[i]} -> {d}): the {peer}'s GID address", ip))
        targets[role] = t

    def ping(role: str) -> tuple[list[str], Any]:
        e = expects[role]
        addrs = list(dict.fromkeys(a for _, a in targets[role]))
        try:
            r = hosts[role].run(["sh", "-c", ping_script(addrs), "pclab-preflight"], timeout=ping_s)
        except CommandTimeout:
            return [f"{e.who}: the pings did not finish within {ping_s:.0f}s"], None
        except HostError as err:
            return [f"{e.who}: {_one_line(str(err), 600)}"], None
        present, res = parse_pings(r.stdout)
        if not present:
            return [f"{e.who}: ping is not on the PATH there, so reachability cannot be checked; install "
                    f"{INSTALL['ping']}"], None
        fail, ok = [], []
        for what, a in targets[role]:
            rc, last = res.get(a, (None, "no result"))
            if rc == 0:
                ok.append({"what": what, "address": a})
            else:
                fail.append(f"{e.who}: cannot reach {what} {a} (`{' '.join(PING)} {a}` rc {rc}: "
                            f"{_one_line(last, 200) or 'no reply'}); check the route, firewall and link, and the "
                            f"testbed's addresses")
        return fail, ok

    roles = list(targets)
    if not roles:
        return
    with ThreadPoolExecutor(min(len(roles), MAX_PARALLEL)) as pool:
        for role, (fail, ok) in zip(roles, pool.map(ping, roles)):
            rep.failures += fail
            if ok is not None:
                rep.hosts[role]["reach"] = ok


def run(testbed_path: str, scenarios_path: str | None = None, out: str | None = None,
        sysfs_root: str | os.PathLike | None = None, stream=None, plan=None) -> int:
    """Check ``testbed_path``'s hosts (``plan``: its loaded Plan, if at hand); print failures (or the OK
    summary); write ``out`` (JSON). 0 when all pass."""
    plan = plan or Plan(testbed_path, scenarios_path)
    rep = check(plan.testbed, plan.points, sysfs_root=sysfs_root)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        atomic.write_text(out, json.dumps(rep.as_dict(), indent=1, default=str))
    so = stream or sys.stdout
    se = stream or sys.stderr
    for n in rep.notes:
        print(f"note: {n}", file=so)
    if rep.failures:
        for line in rep.failures:
            print(line, file=se)
        print(f"preflight of testbed {rep.testbed}: {len(rep.failures)} problem(s); nothing was started",
              file=se, flush=True)
        return 1
    for line in rep.summary_lines():
        print(line, file=so)
    print(f"preflight of testbed {rep.testbed}: all checks passed", file=so, flush=True)
    return 0
