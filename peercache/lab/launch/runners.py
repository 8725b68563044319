"""Server/client pairs and per-NIC process groups on lab hosts.

:class:`PairRunner` starts a server, waits until it is ready (an output
pattern or a listening port), starts the client, waits for both with bounded
timeouts and returns a :class:`PairResult` holding both outputs, exit codes,
exact commands, times and NUMA bindings. :class:`GroupRunner` does the same
for one pair (or one server and several readers) per NIC, all in parallel,
with every client launched after one barrier so that all groups measure the
same window; :func:`aggregate_window` turns per-group bytes into an aggregate
only when those windows really coincide.

Every process a runner starts is ended on every path — success, failure,
timeout, Ctrl-C — and a failed run raises with the partial result attached;
a partial result is never returned as if it were complete.
"""
from __future__ import annotations

import os
import shlex
import signal
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from peercache.lab.launch.hosts import CommandTimeout, Completed, Handle, Host, HostError, IsoTimes
from peercache.lab.system.numa import numa_binding

#: Poll period while waiting on several processes at once.
_POLL_S = 0.05


# --- specs and results ------------------------------------------------------

@dataclass
class SideSpec:
    """One process to run: where, what, and which NUMA node to bind it to."""

    host: Host
    argv: list[str]
    numa_node: int | None = None   #: the NIC's node from the testbed capture; None/-1 = unknown
    device: str | None = None      #: the NIC this side uses (recorded with the binding)
    numactl: bool | None = None    #: numactl present on the host; None = ask the host


@dataclass
class Readiness:
    """How to tell that a server accepts clients."""

    #: regex in the server's output (e.g. perftest's "Waiting for client"); its named groups fill the
    #: client's ``{name}`` placeholders (a server that picks its own port and prints it: Mooncake's P2P
    #: handshake)
    pattern: str | None = None
    port: int | None = None        #: or: a listening TCP port on the server host
    addr: str | None = None        #: the port's address (None = any)
    timeout: float = 10.0          #: seconds before the server counts as never ready

    def __post_init__(self) -> None:
        if self.pattern is None and self.port is None:
            raise ValueError("Readiness needs a pattern or a port")


@dataclass
class SideResult(IsoTimes):
    """What one process did: commands, output, exit status, times, binding."""

    role: str
    host: str
    command: list[str]             #: argv as asked (no host or numactl prefix)
    argv: list[str]                #: argv executed on this machine, prefixes included
    numa_binding: dict[str, Any]
    stdout: str = ""
    stderr: str = ""
    rc: int | None = None
    start: float | None = None
    end: float | None = None
    stopped: bool = False          #: ended by the runner rather than on its own
    log_path: str | None = None
    #: (epoch s, stdout bytes read by then) of each read of its stdout (:meth:`Handle.arrivals`)
    stdout_arrivals: list[tuple[float, int]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict, times also as ISO 8601."""
        d = asdict(self)
        d.update(start_iso=self.start_iso, end_iso=self.end_iso)
        return d

    def stdout_line_at(self, line_no: int) -> float | None:
        """When line ``line_no`` (1-based) of stdout had all arrived, newline included (epoch s), or None."""
        lines = self.stdout.encode().splitlines(keepends=True)
        if not 1 <= line_no <= len(lines):
            return None
        return arrival(self.stdout_arrivals, sum(len(ln) for ln in lines[:line_no]))


@dataclass
class PairResult:
    """Both sides of one pair run; ``ok`` only when both finished as expected."""

    name: str
    server: SideResult | None
    client: SideResult | None
    ok: bool
    error: str | None
    start: float
    end: float
    #: the client's warm-up run before the measured one, where the pair had one (its figure discarded)
    warmup: SideResult | None = None

    @property
    def complete(self) -> bool:
        """True when both sides ran to the end and the run succeeded."""
        return self.ok and self.server is not None and self.client is not None

    def commands(self) -> dict[str, list[str]]:
        """side -> exact argv, for RunMeta.commands."""
        return {s.role: s.argv for s in (self.server, self.warmup, self.client) if s is not None}

    def numa_bindings(self) -> dict[str, dict[str, Any]]:
        """side -> binding record, for RunMeta.numa_binding."""
        return {s.role: s.numa_binding for s in (self.server, self.client) if s is not None}


def arrival(arrivals: Sequence[tuple[float, int]], size: int) -> float | None:
    """When the first ``size`` bytes of a stream had arrived (pure): the time of the first read that brought the
    stream to ``size`` bytes or more (``arrivals``: (epoch s, bytes by then) per read, in order), None if none."""
    return next((t for t, n in arrivals if n >= size), None)


class PairFailed(RuntimeError):
    """A pair run failed; ``result`` keeps both sides' logs (``result.ok`` is False)."""

    def __init__(self, message: str, result: PairResult):
        super().__init__(message)
        self.result = result


# --- one running side -------------------------------------------------------

def _numactl_on(host: Host) -> bool:
    # Cached on the host: asking an SSH host costs a round trip.
    cached = getattr(host, "_pclab_numactl", None)
    if cached is None:
        cached = host.which("numactl")
        host._pclab_numactl = cached
    return cached


class _Side:
    """A side being run: its spec, binding, handle, and result once done."""

    def __init__(self, role: str, spec: SideSpec, log_dir: Path | None,
                 substitutions: Mapping[str, str] | None = None):
        self.role = role
        self.spec = spec
        command = [a.format_map(_Subst(substitutions)) if substitutions else a for a in spec.argv]
        self.command = command
        node = spec.numa_node
        usable = node is not None and not isinstance(node, bool) and node >= 0
        available = (spec.numactl if spec.numactl is not None
                     else (_numactl_on(spec.host) if usable else False))
        self.prefix, self.binding = numa_binding(node, available, spec.device)
        self.log_path = (log_dir / f"{role}.log") if log_dir else None
        self.handle: Handle | None = None
        #: ended on purpose during the run (a churn event): its exit breaks nothing
        self.expected_exit = False

    def start(self) -> Handle:
        self.handle = self.spec.host.start([*self.prefix, *self.command], self.log_path)
        return self.handle

    def result(self) -> SideResult:
        h = self.handle
        r = SideResult(role=self.role, host=self.spec.host.spec, command=self.command,
                       argv=self.spec.host.wrap([*self.prefix, *self.command]),
                       numa_binding=self.binding,
                       log_path=str(self.log_path) if self.log_path else None)
        if h is not None:
            r.argv = h.argv
            r.stdout, r.stderr, r.rc = h.stdout, h.stderr, h.returncode
            r.start, r.end, r.stopped = h.start_time, h.end, h.stopped
            r.stdout_arrivals = h.arrivals("stdout")
        return r


class _Subst(dict):
    """format_map mapping that leaves unknown ``{names}`` as they are."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def _alive(h: Handle | None) -> bool:
    return h is not None and (h.running or h._group_alive())


def _stop_all(sides: Sequence[_Side], grace: float) -> None:
    # Stop clients before servers so a server is not torn down under a
    # client that would then report a spurious error; each stop is bounded.
    for s in reversed(sides):
        if s.handle is not None:
            try:
                s.handle.stop(grace)
            except Exception:  # noqa: BLE001 - keep stopping the others
                pass


def _await_ready(side: _Side, ready: Readiness, deadline: float) -> dict[str, str]:
    """Wait until the server is ready; the named groups of its readiness pattern's match (none for a port)."""
    h = side.handle
    timeout = max(0.0, deadline - time.monotonic())
    if ready.pattern is not None:
        m = h.wait_for(ready.pattern, timeout)
        return {k: v for k, v in m.groupdict().items() if v is not None}
    # Port readiness: poll the host's listening sockets, bounded by the
    # deadline and by a count, and notice a server that died meanwhile.
    for _ in range(int(ready.timeout / 0.1) + 2):
        if not h.running:
            raise HostError(f"{side.spec.host.spec}: server {shlex.join(side.command)} exited "
                            f"with rc {h.returncode} before listening on port {ready.port}; "
                            f"output: {(h.stdout + h.stderr).strip()[-500:]!r}")
        if side.spec.host.is_port_open(ready.addr, ready.port, timeout=5):
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    raise HostError(f"{side.spec.host.spec}: server {shlex.join(side.command)} was not "
                    f"listening on {ready.addr or '*'}:{ready.port} within {ready.timeout:g}s; "
                    f"output so far: {(h.stdout + h.stderr).strip()[-500:]!r}")


def _release(hosts: Sequence[Host], path: str, start: float, lead: float) -> None:
    """Write the shared ``start`` (epoch s) into ``path`` on each of ``hosts`` (whole, by a rename), the
    hosts in parallel. A write that does not finish within ``lead`` fails the run: its clients would
    have missed the start."""
    script = 'printf "%s\\n" "$1" > "$2.tmp" && mv "$2.tmp" "$2"'
    errors: list[str] = []

    def write(h: Host) -> None:
        try:
            h.run(["sh", "-c", script, "sh", f"{start:.6f}", path], timeout=lead)
        except HostError as e:
            errors.append(f"could not write the shared start time to {path} on {h.spec} within "
                          f"{lead:.1f} s: {e}")

    threads = [threading.Thread(target=write, args=(h,), daemon=True) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(lead + 30)
    if errors:
        raise HostError("; ".join(errors))


def _remove(host: Host, path: str) -> None:
    """Best effort: the start file of a run, gone from ``host``."""
    try:
        host.run(["rm", "-f", path, f"{path}.tmp"], timeout=30)
    except HostError:
        pass


def fill_placeholders(argv: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """``argv`` with each ``{name}`` of ``values`` replaced (literally: other braces, as in JSON, stay)."""
    out = []
    for a in argv:
        for k, v in values.items():
            a = a.replace("{" + k + "}", v)
        out.append(a)
    return out


def _failed_rc(side: _Side) -> str | None:
    rc = side.handle.returncode if side.handle else None
    if rc not in (None, 0):
        return (f"{side.role} on {side.spec.host.spec} exited with rc {rc}; "
                f"stderr: {side.handle.stderr.strip()[-500:]!r}")
    return None


def _wait_clients(servers: Sequence[_Side], clients: Sequence[_Side], timeout: float,
                  server_exits: bool) -> str | None:
    """Wait until every client ends; the first failure (as text) or None."""
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / _POLL_S) + 2):
        for c in clients:
            err = _failed_rc(c)
            if err:
                return err
        for s in servers:
            # A server that dies with an error, or a long-lived one that
            # exits at all, while clients still run has broken the run
            # (unless the run ended it on purpose).
            if s.expected_exit:
                continue
            rc = s.handle.returncode
            if rc not in (None, 0) or (rc == 0 and not server_exits):
                if any(c.handle.running for c in clients):
                    return (f"server on {s.spec.host.spec} exited with rc {rc} while its "
                            f"client was running; stderr: {s.handle.stderr.strip()[-500:]!r}")
        if all(not c.handle.running for c in clients):
            for c in clients:
                c.handle.wait(5)  # reaps and drains the output readers
            return None
        if time.monotonic() >= deadline:
            break
        time.sleep(_POLL_S)
    late = [f"{c.role} on {c.spec.host.spec}" for c in clients if c.handle.running]
    return f"{', '.join(late)} did not finish within {timeout:g}s (stopped; logs kept)"


def _finish_servers(servers: Sequence[_Side], timeout: float, server_exits: bool,
                    grace: float) -> str | None:
    """Let one-shot servers exit (bounded) or stop long-lived ones; first failure or None."""
    deadline = time.monotonic() + timeout
    for s in servers:
        if s.expected_exit:
            continue
        if server_exits:
            try:
                s.handle.wait(max(0.0, deadline - time.monotonic()))
            except CommandTimeout:
                return (f"server on {s.spec.host.spec} did not exit within {timeout:g}s "
                        "after its client finished (stopped; logs kept)")
            err = _failed_rc(s)
            if err:
                return err
        else:
            if not s.handle.running:
                return (f"server on {s.spec.host.spec} had exited (rc {s.handle.returncode}) "
                        "before the runner stopped it")
            s.handle.stop(grace)
    return None


# --- pair runner --------------------------------------------------------------

class PairRunner:
    """Server first, readiness, then client; bounded waits; everything ended on every path.

    ``warmup``: a client run against the same server before the measured one, waited for and its output kept
    apart (``warmup.log``): the steady state of a tool that has no warm-up of its own (its window starts
    with its connection)."""

    def __init__(self, server: SideSpec, client: SideSpec, ready: Readiness, *,
                 client_timeout: float = 60.0, server_timeout: float = 10.0,
                 server_exits: bool = True, grace: float = 2.0,
                 log_dir: str | os.PathLike | None = None, name: str = "pair", warmup: SideSpec | None = None):
        self.server = server
        self.client = client
        self.warmup = warmup
        self.ready = ready
        self.client_timeout = client_timeout      #: seconds the client may run
        self.server_timeout = server_timeout      #: seconds a one-shot server may take to exit after
        self.server_exits = server_exits          #: False: long-lived server, stopped after the client
        self.grace = grace                        #: SIGTERM -> SIGKILL delay when stopping
        self.log_dir = Path(log_dir) if log_dir else None
        self.name = name

    def run(self) -> PairResult:
        """Run the pair; return the complete result or raise PairFailed with the partial one."""
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        server = _Side("server", self.server, self.log_dir)
        client = _Side("client", self.client, self.log_dir)
        warm = _Side("warmup", self.warmup, self.log_dir) if self.warmup else None
        sides = [server, client] + ([warm] if warm else [])
        error: str | None = None
        try:
            server.start()
            found = _await_ready(server, self.ready, time.monotonic() + self.ready.timeout)
            if found:
                client.command = fill_placeholders(client.command, found)
                if warm is not None:
                    warm.command = fill_placeholders(warm.command, found)
            if warm is not None:
                warm.start()
                error = _wait_clients([server], [warm], self.client_timeout, self.server_exits)
                if error is not None:
                    error = f"the warm-up run before the measured one failed: {error}"
            if error is None:
                client.start()
                error = _wait_clients([server], [client], self.client_timeout, self.server_exits)
            if error is None:
                error = _finish_servers([server], self.server_timeout, self.server_exits, self.grace)
        except HostError as e:
            error = str(e)
        finally:
            # Runs on KeyboardInterrupt too; the interrupt then propagates.
            _stop_all(sides, self.grace)
        result = PairResult(name=self.name, server=server.result(),
                            client=client.result(),
                            ok=error is None, error=error, start=t0, end=time.time(),
                            warmup=warm.result() if warm is not None else None)
        if error is not None:
            raise PairFailed(f"pair {self.name!r} failed: {error}", result)
        return result


# --- ports ------------------------------------------------------------------

def local_port_free(port: int) -> bool:
    """True when nothing on this machine holds ``port`` on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


class PortAllocator:
    """Hands out distinct TCP ports from ``[first, last]`` to pairs that run at once."""

    def __init__(self, first: int = 20000, last: int = 29999,
                 probe: Callable[[int], bool] | None = local_port_free):
        if not 1024 <= first <= last <= 65535:
            raise ValueError(f"port range {first}..{last} must lie within 1024..65535")
        self.first, self.last = first, last
        self.probe = probe                 #: extra check that a port is free (None = trust the range)
        self._used: set[int] = set()
        self._next = first
        self._lock = threading.Lock()

    def allocate(self) -> int:
        """A port not handed out before (and not busy per ``probe``); raise when none is left."""
        with self._lock:
            span = self.last - self.first + 1
            for _ in range(span):  # at most one pass over the range
                port = self._next
                self._next = self.first + (self._next - self.first + 1) % span
                if port in self._used or (self.probe and not self.probe(port)):
                    continue
                self._used.add(port)
                return port
        raise HostError(f"no free port left in {self.first}..{self.last}; widen the range "
                        "or release ports of finished pairs")

    def release(self, port: int) -> None:
        """Give ``port`` back for later pairs."""
        with self._lock:
            self._used.discard(port)


# --- shared window and aggregate ---------------------------------------------

@dataclass
class WindowBytes:
    """Bytes one group moved and the wall-clock window (epoch s) it moved them in."""

    bytes: float
    start: float
    end: float


class WindowMismatch(ValueError):
    """Per-group windows do not coincide within the tolerance; no aggregate is given."""

    def __init__(self, message: str, details: dict[str, Any]):
        super().__init__(message)
        self.details = details


@dataclass
class Aggregate:
    """Per-group figures and the aggregate over the groups' shared window (bytes, seconds, B/s)."""

    groups: dict[str, dict[str, float]]   #: name -> bytes, start, end, seconds, rate_Bps
    total_bytes: float
    window_start: float                   #: earliest group start (epoch s)
    window_end: float                     #: latest group end (epoch s)
    window_s: float
    rate_Bps: float                       #: total_bytes / window_s
    start_skew_s: float                   #: latest start - earliest start
    end_skew_s: float                     #: latest end - earliest end
    tolerance_s: float


def aggregate_window(per_group: Mapping[str, WindowBytes], tolerance_s: float | None = None,
                     rel_tolerance: float = 0.05) -> Aggregate:
    """Aggregate = total bytes / shared window; raise WindowMismatch if windows differ beyond tolerance.

    The shared window runs from the earliest start to the latest end, so the
    aggregate never exceeds what was moved in it. ``tolerance_s`` (default
    ``rel_tolerance`` x the shortest window) bounds both the start skew and
    the end skew: beyond it the groups did not measure the same window and
    adding their bytes would describe no real interval.
    """
    if not per_group:
        raise ValueError("aggregate_window needs at least one group")
    groups: dict[str, dict[str, float]] = {}
    for name, w in per_group.items():
        if not w.end > w.start:
            raise ValueError(f"group {name!r}: window end {w.end} is not after start {w.start}")
        if w.bytes < 0:
            raise ValueError(f"group {name!r}: negative byte count {w.bytes}")
        secs = w.end - w.start
        groups[name] = {"bytes": float(w.bytes), "start": w.start, "end": w.end,
                        "seconds": secs, "rate_Bps": w.bytes / secs}
    starts = [g["start"] for g in groups.values()]
    ends = [g["end"] for g in groups.values()]
    tol = tolerance_s if tolerance_s is not None else rel_tolerance * min(g["seconds"] for g in groups.values())
    start_skew, end_skew = max(starts) - min(starts), max(ends) - min(ends)
    details = {"groups": groups, "start_skew_s": start_skew, "end_skew_s": end_skew,
               "tolerance_s": tol}
    if start_skew > tol or end_skew > tol:
        raise WindowMismatch(
            f"group windows do not coincide: start skew {start_skew:.3f}s, end skew "
            f"{end_skew:.3f}s, tolerance {tol:.3f}s; per-group figures kept, no aggregate. "
            "Start all clients after one barrier with equal durations, or widen the tolerance "
            "if the tools' windows are known to be coarse", details)
    total = sum(g["bytes"] for g in groups.values())
    w0, w1 = min(starts), max(ends)
    return Aggregate(groups=groups, total_bytes=total, window_start=w0, window_end=w1,
                     window_s=w1 - w0, rate_Bps=total / (w1 - w0), start_skew_s=start_skew,
                     end_skew_s=end_skew, tolerance_s=tol)


# --- group runner -------------------------------------------------------------

@dataclass
class GroupSpec:
    """One NIC's (or one host's) processes: an optional server and clients (readers); a group without
    clients has a server (a producer that only serves, as in a cluster's incast)."""

    name: str                          #: usually the NIC, e.g. "mlx5_0"; a cluster's host name
    clients: list[SideSpec]
    server: SideSpec | None = None
    ready: Readiness | None = None     #: required when there is a server


@dataclass
class FirstSpec:
    """A process every group needs up before its own start (a cluster's shared directory): started and
    awaited before any group's server, stopped after all of them."""

    name: str
    side: SideSpec
    ready: Readiness


@dataclass
class GroupResult:
    """One group's sides after the run."""

    name: str
    server: SideResult | None
    clients: list[SideResult]

    def commands(self) -> dict[str, list[str]]:
        """role -> exact argv."""
        sides = ([self.server] if self.server else []) + self.clients
        return {s.role: s.argv for s in sides}

    def numa_bindings(self) -> dict[str, dict[str, Any]]:
        """role -> binding record."""
        sides = ([self.server] if self.server else []) + self.clients
        return {s.role: s.numa_binding for s in sides}


@dataclass
class GroupRunResult:
    """All groups of one whole-machine run, the barrier time and the aggregate."""

    groups: dict[str, GroupResult]
    barrier: float | None              #: epoch s at which every client was released
    ok: bool
    error: str | None
    start: float
    end: float
    windows: dict[str, WindowBytes] = field(default_factory=dict)
    aggregate: Aggregate | None = None
    flags: list[str] = field(default_factory=list)
    #: the processes started before the groups (:class:`FirstSpec`), by name
    first: dict[str, SideResult] = field(default_factory=dict)
    #: what the run's events did, when (:class:`EventControl`)
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """True when every group ran to the end and the aggregate was computed (if asked)."""
        return self.ok


class GroupFailed(RuntimeError):
    """A group run failed; ``result`` keeps every side's logs and per-group figures."""

    def __init__(self, message: str, result: GroupRunResult):
        super().__init__(message)
        self.result = result


class EventControl:
    """What a run's events may do during the shared window, each logged with its time (epoch s):

    - to a group's server: it leaves (SIGTERM: it leaves the directory on its way out), crashes (SIGKILL,
      no handler runs), or a new one joins (started, and stopped with the rest): membership churn;
    - to any process of the run, a group's server or one started before the groups (a :class:`FirstSpec`,
      by its name): a signal (SIGSTOP, then SIGCONT: a process that hangs, then goes on; SIGKILL: a crash),
      or a restart (SIGKILL, a pause, the same command started again and awaited: a directory restarted
      at the same address);
    - a command run on a host (an operator's action, such as a manual failover), with its output.

    A process an event ends is expected to end: its exit breaks nothing. A first process started again is
    watched as its predecessor was, and stopped with the rest.
    """

    def __init__(self, barrier: float, servers: dict[str, "_Side"], started: list["_Side"],
                 log_dir: Path | None, grace: float, firsts: dict[str, "_Side"] | None = None,
                 first_specs: dict[str, FirstSpec] | None = None, watched: list["_Side"] | None = None):
        self.barrier = barrier                 #: epoch s of the shared start
        self._servers, self._started, self._log_dir, self._grace = servers, started, log_dir, grace
        self._firsts = firsts if firsts is not None else {}
        self._first_specs = first_specs or {}
        #: the processes whose early exit breaks the run (a restarted first process joins them)
        self._watched = watched if watched is not None else []
        self.log: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        #: threads an event left running (a leave awaiting its process's exit): :meth:`settle` joins them
        self._background: list[threading.Thread] = []

    def at(self, t: float, stop: threading.Event) -> bool:
        """Sleep until epoch ``t``; False when the run ended first."""
        return not stop.wait(max(0.0, t - time.time()))

    def _note(self, event: str, group: str, **kw: Any) -> float:
        t = time.time()
        with self._lock:
            self.log.append({"t": t, "event": event, "group": group, **kw})
        return t

    def _side(self, name: str) -> "_Side":
        """The first process called ``name``, else the server of group ``name``."""
        side = self._firsts.get(name) or self._servers.get(name)
        if side is None:
            raise KeyError(f"no process {name!r} in this run; its first processes are {sorted(self._firsts)} and "
                           f"its groups with a server {sorted(self._servers)}")
        return side

    def leave(self, group: str) -> None:
        """SIGTERM ``group``'s server (a clean leave) and return: its exit (SIGKILL after the grace) is awaited
        in the background, logged as ``left`` with the seconds it took, so that a slow leave does not delay
        the run's next event."""
        side = self._servers[group]
        side.expected_exit = True
        t0 = self._note("leave", group, host=side.spec.host.spec)

        def finish() -> None:
            side.handle.stop(self._grace)
            self._note("left", group, host=side.spec.host.spec, seconds=round(time.time() - t0, 3))

        th = threading.Thread(target=finish, daemon=True, name=f"leave-{group}")
        self._background.append(th)
        th.start()

    def settle(self) -> None:
        """Wait for what the events left running in the background (a leave's exit): bounded by the grace
        and the reaping wait of :meth:`Handle.stop`."""
        for th in self._background:
            th.join(max(self._grace, 1.0) + 10)

    def crash(self, group: str) -> None:
        """SIGKILL ``group``'s server (a crash)."""
        side = self._servers[group]
        side.expected_exit = True
        self._note("crash", group, host=side.spec.host.spec)
        side.handle.kill()

    def join(self, group: str, spec: SideSpec, ready: Readiness) -> None:
        """Start a server for ``group`` (a new member) and wait until it is ready (the time it took, logged).

        The join is logged when its start is asked for: starting a process (and its output readers) can
        take this busy process a second or more on a loaded machine, and that is the joiner's start-up,
        as its ready time is, not a later moment of the join."""
        gdir = self._log_dir / group if self._log_dir else None
        if gdir:
            gdir.mkdir(parents=True, exist_ok=True)
        side = _Side("server", spec, gdir)
        t0 = self._note("join", group, host=spec.host.spec)
        side.start()
        with self._lock:
            self._servers[group] = side
            self._started.append(side)
        _await_ready(side, ready, time.monotonic() + ready.timeout)
        self._note("ready", group, host=spec.host.spec, seconds=round(time.time() - t0, 3))

    def signal(self, name: str, sig: int) -> float:
        """Send ``sig`` to the process ``name`` (a first process, else a group's server), logged as ``signal``
        with the signal's name; its time (epoch s). SIGKILL and SIGTERM end it (expected: its exit breaks
        nothing); any other signal (SIGSTOP, SIGCONT) leaves it to the caller to undo."""
        side = self._side(name)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            side.expected_exit = True
        t = self._note("signal", name, signal=signal.Signals(sig).name, host=side.spec.host.spec)
        if sig == signal.SIGKILL:
            side.handle.kill()
        elif sig == signal.SIGTERM:
            side.handle.stop(self._grace)
        else:
            side.handle.send_signal(sig)
        return t

    def restart(self, name: str, pause_s: float = 0.0) -> float:
        """SIGKILL the first process ``name``, wait ``pause_s``, start its command again (the same address:
        a directory restarted in place) and wait until it is ready, as it was awaited at the start. Logged as
        ``restart`` (killed) and ``back`` (ready again, with ``down_s``); the time it was killed (epoch s)."""
        if name not in self._first_specs:
            raise KeyError(f"no first process {name!r} to restart; this run's are {sorted(self._first_specs)}")
        spec, old = self._first_specs[name], self._firsts[name]
        old.expected_exit = True
        t0 = self._note("restart", name, host=spec.side.host.spec, pause_s=pause_s)
        old.handle.kill()
        time.sleep(max(0.0, t0 + pause_s - time.time()))
        side = _Side(name, spec.side, self._log_dir)       # its log goes on in the same file
        side.start()
        with self._lock:
            self._firsts[name] = side
            self._started.append(side)
        _await_ready(side, spec.ready, time.monotonic() + spec.ready.timeout)
        with self._lock:
            self._watched.append(side)
        self._note("back", name, host=spec.side.host.spec, down_s=round(time.time() - t0, 3))
        return t0

    def command(self, label: str, host: Host, argv: list[str], timeout: float) -> Completed:
        """Run ``argv`` on ``host`` (an operator's action), logged as ``command`` under ``label`` with its exit
        status and the start of its output; its record (HostError when it did not finish in ``timeout``)."""
        t = time.time()
        done = host.run(argv, timeout=timeout)
        with self._lock:
            self.log.append({"t": t, "event": "command", "group": label, "host": host.spec, "rc": done.rc,
                             "output": (done.stdout + done.stderr).strip()[:200]})
        return done


class GroupRunner:
    """Per-NIC groups in parallel, clients released together after one barrier."""

    def __init__(self, groups: Sequence[GroupSpec], *, client_timeout: float = 60.0,
                 server_timeout: float = 10.0, server_exits: bool = True, grace: float = 2.0,
                 barrier_lead: float = 0.2,
                 client_ready: Readiness | None = None,
                 measure: Callable[[GroupResult], WindowBytes] | None = None,
                 window_tolerance_s: float | None = None,
                 log_dir: str | os.PathLike | None = None, first: Sequence[FirstSpec] = (),
                 events: Callable[[EventControl, threading.Event], None] | None = None):
        names = [g.name for g in groups]
        if not groups or len(set(names)) != len(names):
            raise ValueError(f"group names must be present and distinct, got {names}")
        firsts = [f.name for f in first]
        if len(set(firsts)) != len(firsts) or set(firsts) & set(names):
            raise ValueError(f"the first processes' names must be distinct and not a group's (an event names "
                             f"either), got {firsts} beside the groups {names}")
        if not any(g.clients for g in groups):
            raise ValueError(f"no group has a client: {names}")
        for g in groups:
            if not g.clients and g.server is None:
                raise ValueError(f"group {g.name!r} has neither a server nor a client")
            if g.server is not None and g.ready is None:
                raise ValueError(f"group {g.name!r} has a server but no Readiness")
        self.groups = list(groups)
        self.client_timeout = client_timeout
        self.server_timeout = server_timeout
        self.server_exits = server_exits
        self.grace = grace
        self.barrier_lead = barrier_lead      #: seconds between "all ready" and the shared start
        #: None: clients are launched at the shared start ({start_at}). Given (a pattern): clients are
        #: launched once the servers are ready, with a file path as {start_file}; once every client printed
        #: the pattern, the shared start (barrier_lead from then) is written into that file on each client
        #: host, so a client's own spawn time (seconds on an emulated host) never eats into the lead.
        self.client_ready = client_ready
        if client_ready is not None and client_ready.pattern is None:
            raise ValueError("client_ready needs a pattern the clients print once ready")
        self.measure = measure                #: group result -> WindowBytes (bytes and window)
        self.window_tolerance_s = window_tolerance_s
        self.log_dir = Path(log_dir) if log_dir else None
        self.first = list(first)
        #: what happens to the servers during the shared window (run in a thread from the shared start)
        self.events = events

    def run(self) -> GroupRunResult:
        """Run every group; return the complete result or raise GroupFailed with the partial one."""
        t0 = time.time()
        servers: dict[str, _Side] = {}
        clients: dict[str, list[_Side]] = {}
        started: list[_Side] = []
        barrier: float | None = None
        error: str | None = None
        start_file, start_hosts = "", []
        firsts: dict[str, _Side] = {}
        control: EventControl | None = None
        event_thread, event_stop, event_error = None, threading.Event(), []
        try:
            for f in self.first:
                firsts[f.name] = _Side(f.name, f.side, self.log_dir)
                firsts[f.name].start()
                started.append(firsts[f.name])
                _await_ready(firsts[f.name], f.ready, time.monotonic() + f.ready.timeout)
            for g in self.groups:
                gdir = self.log_dir / g.name if self.log_dir else None
                if gdir:
                    gdir.mkdir(parents=True, exist_ok=True)
                if g.server is not None:
                    servers[g.name] = _Side("server", g.server, gdir)
                    servers[g.name].start()
                    started.append(servers[g.name])
            # One deadline for all: the servers come up concurrently.
            deadline = time.monotonic() + max(g.ready.timeout for g in self.groups if g.ready) \
                if servers else time.monotonic()
            for g in self.groups:
                if g.name in servers:
                    _await_ready(servers[g.name], g.ready, deadline)
            if self.client_ready is None:
                # Barrier: every server is ready. Clients get the shared start
                # time as {start_at} (for tools that can wait for it) and are all
                # launched back to back at that moment.
                barrier = time.time() + self.barrier_lead
                subst = {"start_at": f"{barrier:.6f}"}
            else:
                start_file = f"/tmp/pclab-start-{uuid.uuid4().hex[:12]}"
                subst = {"start_file": start_file}
            for g in self.groups:
                gdir = self.log_dir / g.name if self.log_dir else None
                clients[g.name] = [_Side(f"client{i}" if len(g.clients) > 1 else "client", c,
                                         gdir, subst) for i, c in enumerate(g.clients)]
            all_clients = [c for cs in clients.values() for c in cs]
            if barrier is not None:
                time.sleep(max(0.0, barrier - time.time()))
            for c in all_clients:
                c.start()
                started.append(c)
            if self.client_ready is not None:
                # Barrier: every client is ready and waits on its start file.
                deadline = time.monotonic() + self.client_ready.timeout
                for c in all_clients:
                    _await_ready(c, self.client_ready, deadline)
                barrier = time.time() + self.barrier_lead
                start_hosts = list({c.spec.host.spec: c.spec.host for c in all_clients}.values())
                _release(start_hosts, start_file, barrier, self.barrier_lead)
            watched = [*firsts.values(), *servers.values()]
            if self.events is not None:
                control = EventControl(barrier, servers, started, self.log_dir, self.grace, firsts=firsts,
                                       first_specs={f.name: f for f in self.first}, watched=watched)

                def play() -> None:
                    try:
                        self.events(control, event_stop)
                    except Exception as e:  # noqa: BLE001 - an event that failed fails the run, said so
                        event_error.append(f"an event of the run failed: {type(e).__name__}: {e}")

                event_thread = threading.Thread(target=play, daemon=True, name="group-events")
                event_thread.start()
            error = _wait_clients(watched, all_clients, self.client_timeout, self.server_exits)
            if event_thread is not None:
                event_stop.set()
                event_thread.join(self.client_timeout)
                control.settle()       # a leave's stop ends before the servers are stopped below, not beside it
                error = error or (event_error[0] if event_error else None)
            if error is None:
                error = _finish_servers(list(servers.values()), self.server_timeout,
                                        self.server_exits, self.grace)
            if error is None:
                error = _finish_servers(list(firsts.values()), self.server_timeout, False, self.grace)
        except HostError as e:
            error = str(e)
        finally:
            event_stop.set()
            if event_thread is not None:
                event_thread.join(self.client_timeout)
            if control is not None:
                control.settle()
            _stop_all(started, self.grace)
            for h in start_hosts:
                _remove(h, start_file)
        results = {g.name: GroupResult(
            name=g.name,
            server=servers[g.name].result() if g.name in servers else None,
            clients=[c.result() for c in clients.get(g.name, []) if c.handle is not None])
            for g in self.groups}
        for name, side in servers.items():      # a server an event started for a group of its own
            if name not in results and side.handle is not None:
                results[name] = GroupResult(name=name, server=side.result(), clients=[])
        result = GroupRunResult(groups=results, barrier=barrier, ok=error is None, error=error,
                                start=t0, end=time.time(),
                                first={n: f.result() for n, f in firsts.items() if f.handle is not None},
                                events=list(control.log) if control else [])
        if error is None and self.measure is not None:
            try:
                result.windows = {n: self.measure(r) for n, r in results.items() if r.clients}
                result.aggregate = aggregate_window(result.windows, self.window_tolerance_s)
            except WindowMismatch as e:
                result.flags.append("window_mismatch")
                error = str(e)
            except Exception as e:  # noqa: BLE001 - a measure that cannot read the output fails the run
                error = f"measuring the groups failed: {type(e).__name__}: {e}"
            result.ok, result.error = error is None, error
        if error is not None:
            raise GroupFailed(f"group run failed: {error}", result)
        return result
