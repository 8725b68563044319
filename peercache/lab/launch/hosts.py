"""Where lab commands run: this machine, a network namespace on it, or an SSH host.

A host is named by a spec string: ``local``, ``netns:<name>`` or
``ssh:[user@]host[:port]``; :func:`parse_host` turns it into a :class:`Host`.
SSH hosts may take their settings from an OpenSSH client config file
(``SshHost(config=...)``, ``ssh -F``); :func:`parse_host` uses the file named
by ``PEERCACHE_SSH_CONFIG`` when none is given (a launcher that boots test
machines writes one per run and exports that variable).
Every host can run a command to completion (:meth:`Host.run`) or start one in
the background (:meth:`Host.start`) and hand back a :class:`Handle` that
captures output as it arrives, waits for a readiness pattern, and stops the
whole process group — on an SSH host the remote group too.
"""
from __future__ import annotations

import abc
import fcntl
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from peercache.address import split
from peercache.lab.system.slowness import HOST_COMMAND_S, scaled, slowness  # noqa: F401 (slowness re-exported)

#: Line the SSH wrapper prints on stderr to tell us the remote process group.
_PGID_MARKER = "@@PCLAB-PGID"
_PGID_RE = re.compile(rf"^{_PGID_MARKER} (\d+)\n", re.M)

#: Upper bound on how long a reader thread may take to drain after exit.
_READER_JOIN_S = 5.0


class HostError(RuntimeError):
    """A host could not run what it was asked to (bad spec, missing tool, no access)."""


class CommandTimeout(HostError):
    """A command did not finish in time; ``completed`` holds what it printed."""

    def __init__(self, message: str, completed: "Completed"):
        super().__init__(message)
        self.completed = completed


class ReadyTimeout(HostError):
    """A readiness pattern did not appear in time."""


class ProcessExited(HostError):
    """A process ended before the awaited output appeared."""


def iso(t: float | None) -> str | None:
    """Epoch seconds as ISO 8601 UTC (None stays None)."""
    if t is None:
        return None
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat(timespec="microseconds")


class IsoTimes:
    """``start_iso`` / ``end_iso`` of a record with epoch ``start`` and ``end``."""

    start: float | None
    end: float | None

    @property
    def start_iso(self) -> str | None:
        return iso(self.start)

    @property
    def end_iso(self) -> str | None:
        return iso(self.end)


def _tail(text: str, n: int = 800) -> str:
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]


@dataclass
class Completed(IsoTimes):
    """A finished command: what was asked, what ran, what it printed, when."""

    host: str                 #: host spec, e.g. "netns:pc0a"
    command: list[str]        #: the argv as asked for
    argv: list[str]           #: the argv actually executed here (host prefix included)
    stdout: str
    stderr: str
    rc: int | None            #: exit status; negative = killed by that signal (local)
    start: float              #: epoch seconds
    end: float | None
    timed_out: bool = False
    stopped: bool = False     #: ended by stop() rather than on its own



class Handle:
    """A background process on a host: output so far, readiness, exit code, stop."""

    def __init__(self, host: "Host", command: list[str], argv: list[str],
                 log_path: str | os.PathLike | None = None, stdin_pipe: bool = False):
        self.host = host
        self.command = list(command)
        self.argv = list(argv)
        self.log_path = Path(log_path) if log_path else None
        self._buf = {"stdout": bytearray(), "stderr": bytearray()}
        #: per stream, (epoch s, bytes read by then) of each read: when each part of the output came
        self._arrivals: dict[str, list[tuple[float, int]]] = {"stdout": [], "stderr": []}
        self._cond = threading.Condition()
        self._log = open(self.log_path, "ab") if self.log_path else None
        self.stopped = False
        self.end: float | None = None
        self.start_time = time.time()
        try:
            # A new session makes the process its own group leader, so stop()
            # reaches every child it forked and a terminal Ctrl-C does not hit
            # it before the runner has had a chance to clean up in order.
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except FileNotFoundError as e:
            self._close_log()
            raise HostError(f"{host.spec}: cannot start {argv[0]!r} ({e.strerror}); "
                            f"install it or check PATH") from e
        self.pgid = self.proc.pid
        self._readers = [threading.Thread(target=self._pump, args=(name, pipe), daemon=True)
                         for name, pipe in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr))]
        self._open_readers = len(self._readers)
        for t in self._readers:
            t.start()
        # The end time is taken when the process exits, not when someone
        # next looks: group windows are computed from it.
        threading.Thread(target=self._reap, daemon=True).start()

    def _reap(self) -> None:
        self.proc.wait()
        with self._cond:
            if self.end is None:
                self.end = time.time()
            self._cond.notify_all()

    # --- output capture ---------------------------------------------------
    def _pump(self, name: str, pipe) -> None:
        fd = pipe.fileno()
        try:
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                with self._cond:
                    self._buf[name].extend(chunk)
                    self._arrivals[name].append((time.time(), len(self._buf[name])))
                    if self._log:
                        self._log.write(chunk)
                        self._log.flush()
                    self._cond.notify_all()
        except OSError:
            pass  # pipe closed under us by stop(); nothing more to read
        finally:
            pipe.close()  # the reader owns its pipe: EOF (or error) means done with it
            with self._cond:
                self._open_readers -= 1
                self._cond.notify_all()

    def _text(self, name: str) -> str:
        with self._cond:
            raw = bytes(self._buf[name])
        text = raw.decode("utf-8", errors="replace")
        return _PGID_RE.sub("", text) if name == "stderr" else text

    def arrivals(self, name: str) -> list[tuple[float, int]]:
        """(epoch s, bytes of ``name`` read by then) of each read of that stream (stdout or stderr), in order: when
        a line a process flushes as it prints (line-buffered) was printed, give or take the read's wake-up."""
        with self._cond:
            return list(self._arrivals[name])

    @property
    def stdout(self) -> str:
        """Everything the process wrote on stdout so far."""
        return self._text("stdout")

    @property
    def stderr(self) -> str:
        """Everything the process wrote on stderr so far (wrapper lines removed)."""
        return self._text("stderr")

    @property
    def returncode(self) -> int | None:
        """Exit status, or None while it runs."""
        return self.proc.poll()

    @property
    def running(self) -> bool:
        """True while the process has not exited."""
        return self.proc.poll() is None

    def wait_for(self, pattern: str | re.Pattern, timeout: float,
                 stream: str = "any") -> re.Match:
        """Block until ``pattern`` appears in the output; raise on timeout or early exit."""
        rx = re.compile(pattern, re.M) if isinstance(pattern, str) else pattern
        streams = ("stdout", "stderr") if stream == "any" else (stream,)
        deadline = time.monotonic() + timeout
        while True:
            for name in streams:
                m = rx.search(self._text(name))
                if m:
                    return m
            with self._cond:
                drained = self._open_readers == 0
            if drained and self.proc.poll() is not None:
                raise ProcessExited(
                    f"{self.host.spec}: {shlex.join(self.command)} exited with rc "
                    f"{self.proc.returncode} before printing {rx.pattern!r}; "
                    f"stderr: {_tail(self.stderr)!r} stdout: {_tail(self.stdout)!r}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ReadyTimeout(
                    f"{self.host.spec}: {shlex.join(self.command)} did not print "
                    f"{rx.pattern!r} within {timeout:g}s; output so far: "
                    f"{_tail(self.stdout + self.stderr)!r}")
            with self._cond:
                self._cond.wait(min(remaining, 0.2))

    def wait(self, timeout: float) -> int:
        """Wait for exit and return the exit status; raise CommandTimeout if still running."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise CommandTimeout(
                f"{self.host.spec}: {shlex.join(self.command)} still running after "
                f"{timeout:g}s", self.completed(timed_out=True)) from None
        self._finish()
        return rc

    def _finish(self) -> None:
        if self.end is None:
            self.end = time.time()
        for t in self._readers:
            t.join(_READER_JOIN_S)
        if self.proc.stdin:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        self._close_log()

    def _close_log(self) -> None:
        if getattr(self, "_log", None):
            with self._cond:
                self._log.close()
                self._log = None

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.pgid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass  # gone, or the number now belongs to someone else's group

    def _remote_stop(self, grace: float) -> None:
        """Hook for hosts whose processes live elsewhere (SSH)."""

    def stop(self, grace: float = 2.0) -> int | None:
        """End the whole process group: SIGTERM, then SIGKILL after ``grace`` seconds."""
        if self.proc.poll() is None:
            self.stopped = True
        self._remote_stop(grace)
        if self.proc.stdin:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        # The leader may have exited while children it forked still hold the
        # group, so signal the group whenever it exists, not only the leader.
        if self._group_alive():
            self._signal_group(signal.SIGTERM)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                self.proc.poll()
                if not self._group_alive():
                    break
                time.sleep(0.02)
            if self._group_alive():
                self._signal_group(signal.SIGKILL)
        try:
            self.proc.wait(timeout=max(grace, 1.0) + 5)
        except subprocess.TimeoutExpired:
            pass  # unkillable (D state); returncode stays None and says so
        self._finish()
        return self.proc.returncode

    def _remote_kill(self) -> None:
        """Hook for hosts whose processes live elsewhere (SSH): SIGKILL their remote group."""

    def kill(self) -> int | None:
        """End the whole process group with SIGKILL at once, as a crash would (no handler of it runs)."""
        if self.proc.poll() is None:
            self.stopped = True
        self._remote_kill()
        if self._group_alive():
            self._signal_group(signal.SIGKILL)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass  # unkillable (D state); returncode stays None and says so
        self._finish()
        return self.proc.returncode

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the whole process group and return (SIGSTOP and SIGCONT: a process that hangs,
        then goes on); a process that already ended is left alone. Use :meth:`stop` and :meth:`kill` to
        end it (they also reap it)."""
        if self._group_alive():
            self._signal_group(sig)

    def completed(self, timed_out: bool = False) -> Completed:
        """Snapshot of this process as a :class:`Completed` record."""
        return Completed(host=self.host.spec, command=self.command, argv=self.argv,
                         stdout=self.stdout, stderr=self.stderr, rc=self.proc.poll(),
                         start=self.start_time, end=self.end, timed_out=timed_out,
                         stopped=self.stopped)

    def __enter__(self) -> "Handle":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class Host(abc.ABC):
    """Base of the three host kinds; subclasses say how an argv is executed."""

    kind = "?"
    #: True for hosts that are this machine (local, a network namespace on it): they run this
    #: checkout with this interpreter and see this filesystem; False for remote (SSH) hosts.
    on_this_machine = False
    #: True for a host in this process's network namespace (this machine, not a namespace on it): a
    #: server started here on 127.0.0.1 is reachable from it.
    shares_our_loopback = False
    #: True for a host that exists only while a point runs (a network namespace the point creates and
    #: removes): before a point there is nothing there to probe or ping, and making one needs root.
    created_per_point = False
    #: True for a host reached over SSH: a check must log in first, and exit status 255 is ssh's own failure.
    reached_over_ssh = False

    def __init__(self, spec: str):
        self.spec = spec
        #: the CPUs every command started here runs on (a CPU list, "0" or "0-3,8"); None: wherever the
        #: scheduler puts it. A pair of hosts on one machine given one CPU each runs like two hosts: one
        #: side's threads cannot take the other's CPU.
        self.cpus: str | None = None

    def pin(self, cpus: str | None) -> "Host":
        """Run every command started on this host on ``cpus`` (a CPU list; None: unpinned); returns the host."""
        if cpus is not None:
            check_cpu_list(cpus)
        self.cpus = cpus
        return self

    def _pinned(self, argv: list[str]) -> list[str]:
        """``argv`` under ``taskset`` when the host has CPUs (inside the host's wrapper: a namespace or ssh)."""
        return ["taskset", "--cpu-list", self.cpus, *argv] if self.cpus else list(argv)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.spec}>"

    def __str__(self) -> str:
        """The host spec (``ssh:pc-consumer``): what rows, captures and messages name a host by."""
        return self.spec

    @abc.abstractmethod
    def wrap(self, argv: list[str]) -> list[str]:
        """The argv to execute on this machine so that ``argv`` runs on the host."""

    def _check(self) -> None:
        """Raise HostError if this host cannot be used right now."""

    def start(self, argv: list[str], log_path: str | os.PathLike | None = None) -> Handle:
        """Start ``argv`` in the background and return its handle."""
        if not argv:
            raise HostError(f"{self.spec}: empty command")
        self._check()
        return Handle(self, argv, self.wrap(self._pinned(argv)), log_path)

    def run(self, argv: list[str], timeout: float = 60.0,
            log_path: str | os.PathLike | None = None) -> Completed:
        """Run ``argv`` to completion; raise CommandTimeout (process group ended) if it overruns."""
        h = self.start(argv, log_path)
        try:
            h.wait(timeout)
        except CommandTimeout:
            h.stop()
            raise CommandTimeout(f"{self.spec}: {shlex.join(argv)} did not finish within "
                                 f"{timeout:g}s and was stopped", h.completed(timed_out=True))
        except BaseException:
            h.stop()
            raise
        return h.completed()

    def which(self, program: str) -> bool:
        """True when ``program`` is on the host's PATH."""
        return shutil.which(program) is not None

    def is_port_open(self, addr: str | None, port: int, timeout: float = 5.0) -> bool:
        """True when something listens on ``addr:port`` (``addr`` None = any) on this host.

        Reads the listening sockets with ``ss`` instead of connecting, because a
        probe connection would be taken by one-shot servers (``iperf3 -s -1``,
        perftest) as their one client.
        """
        c = self.run(["ss", "-Hltn", f"sport = :{int(port)}"], timeout=scaled(timeout))
        if c.rc != 0:
            raise HostError(f"{self.spec}: `ss -Hltn` failed (rc {c.rc}): {_tail(c.stderr)}; "
                            "install iproute2 on the host")
        return listening_on(c.stdout, addr, port)

    def close(self) -> None:
        """Release anything the host keeps open (SSH master connection)."""

    def __enter__(self) -> "Host":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


#: hosts (brackets dropped) of a listener on every interface, as ss writes them
_WILDCARDS = {"0.0.0.0", "*", "::", "::ffff:0.0.0.0"}


def listening_on(ss_output: str, addr: str | None, port: int) -> bool:
    """True when ``ss -Hltn`` output lists a listener covering ``addr:port``."""
    for line in ss_output.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        local = fields[3]
        host, p = split(local)
        if p != str(port):
            continue
        host = host.split("%", 1)[0]  # "127.0.0.53%lo" names the interface too
        if addr is None or host in _WILDCARDS or host == addr:
            return True
    return False


class LocalHost(Host):
    """This machine, this network namespace."""

    kind = "local"
    on_this_machine = True
    shares_our_loopback = True

    def __init__(self, spec: str = "local"):
        super().__init__(spec)

    def wrap(self, argv: list[str]) -> list[str]:
        return list(argv)


class NetnsHost(Host):
    """A network namespace on this machine (``ip netns exec``; needs root)."""

    kind = "netns"
    on_this_machine = True
    created_per_point = True

    def __init__(self, name: str):
        super().__init__(f"netns:{name}")
        self.name = name

    def _check(self) -> None:
        if os.geteuid() != 0:
            raise HostError(f"{self.spec}: network-namespace hosts need root; "
                            "run as root or use a local/ssh host")
        if not Path("/run/netns", self.name).exists():
            raise HostError(f"{self.spec}: namespace {self.name!r} does not exist "
                            "(create it first, e.g. with peercache.lab.launch.netns.NetnsPair)")

    def wrap(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]


# The remote side of an SSH command. The command runs in its own session
# (background `setsid` from a non-leader does not fork, so $! is the new
# process group id), its group id is printed for stop(), and a watchdog
# reading the SSH channel's stdin kills that group when the session ends —
# so a remote process cannot outlive a local ssh that died or was killed.
_REMOTE_WRAPPER = (
    'exec 3<&0 </dev/null\n'
    'setsid "$@" 3<&- &\n'
    'g=$!\n'
    f'echo "{_PGID_MARKER} $g" >&2\n'
    '( cat <&3 >/dev/null 2>&1; kill -TERM -$g $g 2>/dev/null; i=0;'
    ' while [ $i -lt 50 ] && kill -0 -$g 2>/dev/null; do sleep 0.1; i=$((i+1)); done;'
    ' kill -KILL -$g 2>/dev/null ) >/dev/null 2>&1 &\n'
    'w=$!\n'
    'exec 3<&-\n'
    'wait $g; rc=$?\n'
    'kill $w 2>/dev/null\n'
    'exit $rc\n'
)

# Remote stop: TERM the group, poll (bounded) until it is gone, then KILL.
_REMOTE_KILL = ('g={g}; kill -TERM -$g $g 2>/dev/null; i=0; '
                'while [ $i -lt {n} ] && kill -0 -$g 2>/dev/null; do sleep 0.1; i=$((i+1)); done; '
                'kill -KILL -$g 2>/dev/null; true')


class SshHandle(Handle):
    """A handle whose process runs on an SSH host, in a remote process group."""

    def remote_pgid(self, timeout: float = 5.0) -> int | None:
        """The remote process group id, once the wrapper has printed it."""
        deadline = time.monotonic() + timeout
        while True:
            with self._cond:
                m = _PGID_RE.search(bytes(self._buf["stderr"]).decode("utf-8", "replace"))
                if m:
                    return int(m.group(1))
                if self._open_readers == 0 or time.monotonic() >= deadline:
                    return None
                self._cond.wait(0.1)

    def _remote_stop(self, grace: float) -> None:
        rc = self.proc.poll()
        if rc is not None and rc != 255:
            return  # the remote wrapper exited and reported; its group is gone
        pgid = self.remote_pgid(timeout=0.5 if rc is None else 0)
        if pgid is None:
            return  # never started remotely; the watchdog covers the rest
        script = _REMOTE_KILL.format(g=pgid, n=max(1, int(grace * 10)))
        try:
            subprocess.run(self.host.ssh_argv(["sh", "-c", script]), stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=grace + self.host.connect_timeout + 5)
        except subprocess.TimeoutExpired:
            pass  # closing stdin below makes the remote watchdog kill the group


    def _remote_kill(self) -> None:
        pgid = self.remote_pgid(timeout=0.5) if self.proc.poll() in (None, 255) else None
        if pgid is None:
            return
        try:
            subprocess.run(self.host.ssh_argv(["kill", "-KILL", "--", f"-{pgid}"]), stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=self.host.connect_timeout + 5)
        except subprocess.TimeoutExpired:
            pass  # closing stdin makes the remote watchdog kill the group


    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the remote process group (the local ssh client is left running: stopping it
        would stall the output, not the process)."""
        pgid = self.remote_pgid(timeout=0.5) if self.proc.poll() in (None, 255) else None
        if pgid is None:
            return
        name = signal.Signals(sig).name.removeprefix("SIG")
        try:
            subprocess.run(self.host.ssh_argv(["kill", f"-{name}", "--", f"-{pgid}"]), stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=self.host.connect_timeout + 5)
        except subprocess.TimeoutExpired:
            pass  # the host did not answer in time; the caller's own check (a role, an answer) says what happened


#: Environment variable naming a folder where SSH hosts share one master connection per host.
SSH_CONTROL_DIR_ENV = "PEERCACHE_SSH_CONTROL_DIR"
#: Longest such folder: ssh binds DIR/<40 hex>.<16 random> (sun_path holds 107 bytes).
MAX_CONTROL_DIR = 107 - 1 - 40 - 17


#: ssh's ConnectTimeout on a plain machine, seconds (times the hosts' slowness on emulated ones).
SSH_CONNECT_TIMEOUT_S = 10


#: ssh's own failures, told apart by OpenSSH's words on stderr, first match wins: (its words, what
#: happened, what to do). ``{host}``, ``{port}``, ``{timeout}`` and ``{keygen}`` are filled in by
#: :func:`ssh_failure`.
SSH_FAILURES = (
    (("Could not resolve hostname",),
     "the host name {host} does not resolve",
     "check the name in the testbed's host spec (or the Host alias of the ssh config), or give its IP address"),
    (("Connection refused",),
     "connection refused: nothing listens for ssh on {host} port {port}",
     "start sshd on that host (e.g. `sudo systemctl start ssh`), or give the port it listens on "
     "(ssh:user@host:PORT)"),
    (("Connection timed out", "Operation timed out"),
     "connection timed out: {host} did not answer on port {port} within {timeout} s",
     "check that the host is up and that no firewall drops this machine's packets to its ssh port "
     "(`nc -vz {host} {port}`)"),
    (("No route to host", "Network is unreachable"),
     "no route from this machine to {host}",
     "check the address and this machine's network (`ip route get <address of {host}>`)"),
    (("Host key verification failed", "REMOTE HOST IDENTIFICATION HAS CHANGED"),
     "host key verification failed: {host}'s key is not the one known_hosts holds for it (or unknown, and "
     "checking is strict)",
     "if the host was reinstalled, remove its old key (`{keygen}`) and log in once by hand (`ssh {host}`) to "
     "accept the new one; otherwise find out why its key changed"),
    (("Permission denied",),
     "authentication failed (permission denied): {host} accepted no key of this machine, and batch mode asks "
     "for no password",
     "install this machine's public key for that user on the host (`ssh-copy-id user@{host}`), or name the "
     "key to use in ~/.ssh/config (IdentityFile)"),
    (("kex_exchange_identification", "Connection closed by", "Connection reset by peer"),
     "{host} closed the connection before the login",
     "check sshd's log on that host (MaxStartups, AllowUsers, a firewall), and that sshd, not another "
     "service, listens on port {port}"),
)


def ssh_failure(stderr: str, host: str, port: int | None = None, timeout: int | None = None,
                known_hosts: str | None = None) -> tuple[str, str] | None:
    """What ssh's ``stderr`` says went wrong reaching ``host``, and what to do, or None when it is none of
    :data:`SSH_FAILURES` (pure)."""
    keygen = shlex.join(["ssh-keygen", *(["-f", known_hosts] if known_hosts else []), "-R",
                         host if not port or port == 22 else f"[{host}]:{port}"])
    for words, what, fix in SSH_FAILURES:
        if any(w in stderr for w in words):
            fill = {"host": host, "port": port or 22, "timeout": timeout if timeout is not None else "?",
                    "keygen": keygen}
            return what.format(**fill), fix.format(**fill)
    return None


class SshHost(Host):
    """A remote host over OpenSSH: batch mode, keys only, one reused master connection.

    ``target`` is ``[user@]host`` as ssh takes it: with ``config`` (an OpenSSH
    client config file, passed as ``ssh -F config`` to every ssh this host runs:
    the master, each command, stop and close) it may be a ``Host`` alias of that
    file, whose HostName, Port, User, IdentityFile, ProxyJump... then apply.
    Options given here (``port``, ``identity``, ``known_hosts``, ``extra_options``)
    are command-line options and win over the file's; BatchMode=yes is always set.

    ``control_dir`` (default ``$PEERCACHE_SSH_CONTROL_DIR``) shares one master connection per
    host among every process of a run: a pipeline's jobs then each skip the connection set-up (a
    key exchange, seconds against an emulated host). The first to connect starts the master; it
    stays for ``control_persist`` seconds after its last session, and close() leaves it to that.
    Without it, each SshHost has a private master that close() ends.
    """

    kind = "ssh"
    reached_over_ssh = True

    def __init__(self, target: str, *, port: int | None = None, identity: str | None = None,
                 strict_host_key_checking: str = "accept-new", known_hosts: str | None = None,
                 connect_timeout: int | None = None, control_persist: int = 120,
                 extra_options: list[str] | tuple[str, ...] = (), ssh: str = "ssh",
                 config: str | os.PathLike | None = None, control_dir: str | os.PathLike | None = None):
        shk = str(strict_host_key_checking)
        if shk not in ("yes", "no", "accept-new", "ask"):
            raise HostError(f"StrictHostKeyChecking={shk!r} is not yes/no/accept-new")
        if shk == "ask":
            raise HostError("StrictHostKeyChecking=ask would prompt; batch runs need "
                            "yes, accept-new or no")
        if not isinstance(target, str) or not _TARGET_RE.fullmatch(target):
            raise HostError(f"ssh host: {_ssh_target_problem(str(target))}")
        spec = f"ssh:{target}" + (f":{port}" if port else "")
        super().__init__(spec)
        self.target = target
        self.port = port
        self.identity = identity
        self.strict_host_key_checking = shk
        self.known_hosts = known_hosts
        # ssh's ConnectTimeout also bounds the banner exchange: an emulated host's sshd under load took
        # longer than 10 s to answer ("Connection timed out during banner exchange"), so it stretches
        self.connect_timeout = int(connect_timeout if connect_timeout is not None
                                   else round(scaled(SSH_CONNECT_TIMEOUT_S)))
        self.control_persist = int(control_persist)
        self.extra_options = list(extra_options)
        self.ssh = ssh
        self.config = os.fspath(config) if config else None
        # Unix socket paths are limited to ~100 bytes, so keep the dir short
        # and let ssh name the socket by the %C hash.
        self.shared_master = control_dir is not None
        if self.shared_master:
            self._control_dir = os.fspath(control_dir)
            # The socket is DIR/<40 hex>, made as DIR/<40 hex>.<16 random>: within sun_path's 107 bytes.
            if len(os.fsencode(self._control_dir)) > MAX_CONTROL_DIR:
                raise HostError(f"ssh control folder {self._control_dir!r} is {len(self._control_dir)} characters long; "
                                f"ssh's sockets in it would not fit a Unix socket path: use one of at most "
                                f"{MAX_CONTROL_DIR} characters (for example under /tmp) for ${SSH_CONTROL_DIR_ENV}")
            os.makedirs(self._control_dir, mode=0o700, exist_ok=True)
        else:
            self._control_dir = tempfile.mkdtemp(prefix="pclab-ssh-")
        self.control_path = os.path.join(self._control_dir, "%C")
        self._master_lock = threading.Lock()
        self._master_up = False

    def _options(self) -> list[str]:
        # -F first: the file is read before anything else; -o options below still override it.
        opts = ["-F", self.config] if self.config else []
        opts += ["-o", "BatchMode=yes",                      # never prompt
                "-o", f"StrictHostKeyChecking={self.strict_host_key_checking}",
                "-o", f"ConnectTimeout={self.connect_timeout}",
                "-o", f"ControlPath={self.control_path}",
                "-o", "LogLevel=ERROR", "-T"]
        if self.port:
            opts += ["-p", str(self.port)]
        if self.identity:
            opts += ["-i", self.identity, "-o", "IdentitiesOnly=yes"]
        if self.known_hosts:
            opts += ["-o", f"UserKnownHostsFile={self.known_hosts}"]
        for o in self.extra_options:
            opts += ["-o", o]
        return opts

    def _destination(self) -> list[str]:
        # `--` ends ssh's options: whatever the target is, ssh never reads it (or what follows) as one
        return ["--", self.target]

    def ssh_argv(self, remote_argv: list[str]) -> list[str]:
        """Plain ssh argv over the master connection (no process-group wrapper)."""
        # ControlMaster=no: use the master if it is up, else connect directly;
        # never let a command become a master that would hold our pipes open.
        # The remote command is one shell string (ssh joins its words with spaces and the remote
        # shell splits them again): shlex.join keeps each word whole.
        return [self.ssh, *self._options(), "-o", "ControlMaster=no", *self._destination(),
                shlex.join(remote_argv)]

    def wrap(self, argv: list[str]) -> list[str]:
        remote = shlex.join(["sh", "-c", _REMOTE_WRAPPER, "pclab", *argv])
        return [self.ssh, *self._options(), "-o", "ControlMaster=no", *self._destination(),
                "exec " + remote]

    def _master_alive(self) -> bool:
        try:
            r = subprocess.run([self.ssh, *self._options(), "-O", "check", *self._destination()], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=15)
        except (FileNotFoundError, subprocess.TimeoutExpired):
            return False      # then starting one says why
        return r.returncode == 0

    def connect(self) -> None:
        """Open the master connection, or join the run's shared one (idempotent); raise HostError saying why not."""
        with self._master_lock:
            if self._master_up:
                return
            if not self.shared_master:
                self._start_master()
                return
            # One master per host for all processes: whoever holds the lock checks, then starts it.
            with open(os.path.join(self._control_dir, ".lock"), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if self._master_alive():
                    self._master_up = True
                    return
                self._start_master()

    def _start_master(self) -> None:
        errlog = os.path.join(self._control_dir, f"master-{os.getpid()}.err")
        # stderr goes to a file: the backgrounded master keeps the fds it
        # was given, and a pipe here would never see EOF.
        with open(errlog, "wb") as err:
            try:
                r = subprocess.run(
                    [self.ssh, *self._options(), "-M", "-N", "-f",
                     "-o", f"ControlPersist={self.control_persist}", *self._destination()],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                    timeout=self.connect_timeout + 10)
            except FileNotFoundError as e:
                raise HostError(f"{self.spec}: {self.ssh!r} not found; install "
                                "openssh-client") from e
            except subprocess.TimeoutExpired:
                raise HostError(f"{self.spec}: " + self.failure("Connection timed out", None)) from None
        if r.returncode != 0:
            raise HostError(f"{self.spec}: " + self.failure(Path(errlog).read_text(errors="replace"), r.returncode))
        os.unlink(errlog)     # nothing to report; a shared folder would otherwise collect one per process
        self._master_up = True

    def failure(self, stderr: str, rc: int | None) -> str:
        """One line on why ssh to this host failed (``stderr``: ssh's; ``rc``: its exit status, None when it
        was stopped at our timeout): what happened, what ssh said, and what to do."""
        said = " ".join(stderr.split())[-400:]
        host = _TARGET_RE.fullmatch(self.target)["host"] if _TARGET_RE.fullmatch(self.target) else self.target
        why = ssh_failure(stderr, host, self.port, self.connect_timeout, self.known_hosts)
        if why is None:
            return (f"ssh failed (exit {rc}): {said or 'no message'}; run `ssh -o BatchMode=yes {self.target} true` "
                    "by hand to see why (batch mode asks for no password)")
        what, fix = why
        return f"{what} (ssh said: {said}); {fix}" if said and rc is not None else f"{what}; {fix}"

    def _check(self) -> None:
        self.connect()

    def start(self, argv: list[str], log_path: str | os.PathLike | None = None) -> Handle:
        if not argv:
            raise HostError(f"{self.spec}: empty command")
        self._check()
        # stdin stays an open pipe: the remote watchdog kills the command's
        # group when it sees EOF, i.e. when this ssh client goes away.
        return SshHandle(self, argv, self.wrap(self._pinned(argv)), log_path, stdin_pipe=True)

    def which(self, program: str) -> bool:
        c = self.run(["sh", "-c", 'command -v "$1" >/dev/null', "which", program], timeout=scaled(HOST_COMMAND_S))
        return c.rc == 0

    def close(self) -> None:
        """Stop a private master connection and remove its socket directory (a shared one stays for
        its ControlPersist, for the run's next process)."""
        with self._master_lock:
            if self.shared_master:
                self._master_up = False
                return
            if self._master_up:
                subprocess.run([self.ssh, *self._options(), "-O", "exit", *self._destination()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=15)
                self._master_up = False
            shutil.rmtree(self._control_dir, ignore_errors=True)


_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
#: A user or host name of an ssh destination. A leading '-' is refused: ssh reads such a destination
#: as an option (ssh:-oProxyCommand=... would run a command on this machine).
_SSH_WORD = r"[A-Za-z0-9_.][A-Za-z0-9_.-]*"
_SSH_IPV6 = r"[0-9A-Fa-f:.]+"
#: What an ssh destination may be, in words (the error messages' text).
SSH_NAMES = "[user@]host, the user and host each of letters, digits, '_', '.' and '-', not starting with '-'"
_TARGET_RE = re.compile(rf"(?:(?P<user>{_SSH_WORD})@)?(?P<host>{_SSH_WORD}|{_SSH_IPV6})")
_SSH_RE = re.compile(rf"(?:(?P<user>{_SSH_WORD})@)?(?P<host>{_SSH_WORD}|\[{_SSH_IPV6}\])(?::(?P<port>\d{{1,5}}))?")


def _ssh_target_problem(target: str) -> str:
    """Why ``target`` is no ssh destination, in words, with what to use instead."""
    if any(part.startswith("-") for part in target.split("@")):
        return f"{target!r} starts with '-', which ssh would take as an option, not a host; use {SSH_NAMES}"
    return f"{target!r} is not a host ssh is given here; use {SSH_NAMES}"


#: Environment variable naming the OpenSSH client config file SSH hosts use by default.
SSH_CONFIG_ENV = "PEERCACHE_SSH_CONFIG"


def _parse_spec(spec: str) -> tuple[str, str | None, int | None]:
    """``spec`` as (kind, name or ssh destination, port); HostError saying what to use when it is none."""
    if not isinstance(spec, str) or not spec.strip():
        raise HostError(f"host spec {spec!r} is empty; use local, netns:<name> or ssh:<user@host>")
    spec = spec.strip()
    kind, sep, rest = spec.partition(":")
    if spec == "local":
        return "local", None, None
    if kind == "netns" and sep:
        if not _NAME_RE.fullmatch(rest):
            raise HostError(f"host spec {spec!r}: namespace name {rest!r} must be 1-64 of "
                            "letters, digits, '_', '.', '-'")
        return "netns", rest, None
    if kind == "ssh" and sep:
        m = _SSH_RE.fullmatch(rest)
        if not m:
            raise HostError(f"host spec {spec!r}: {_ssh_target_problem(rest)}, e.g. ssh:user@host or "
                            "ssh:user@host:port (an IPv6 address in brackets)")
        target = (m["user"] + "@" if m["user"] else "") + m["host"].strip("[]")
        port = int(m["port"]) if m["port"] else None
        if port is not None and not 0 < port < 65536:
            raise HostError(f"host spec {spec!r}: port {port} outside 1..65535")
        return "ssh", target, port
    raise HostError(f"host spec {spec!r} not understood; use local, netns:<name> "
                    "or ssh:<user@host>[:port]")


#: a CPU list as taskset and the kernel write it: numbers and ranges, comma-separated
_CPU_LIST_RE = re.compile(r"[0-9]{1,4}(-[0-9]{1,4})?(,[0-9]{1,4}(-[0-9]{1,4})?)*")


def cpu_list(text: str) -> set[int]:
    """The CPUs of a CPU list (``"0-2,5"`` -> {0, 1, 2, 5}); HostError saying the form when it is none (each
    range ascending)."""
    if not isinstance(text, str) or not _CPU_LIST_RE.fullmatch(text):
        raise HostError(f"CPU list {text!r} not understood; write CPU numbers and ranges, e.g. 0, 1-3 or 0,2-3")
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if hi and int(hi) < int(lo):
            raise HostError(f"CPU list {text!r}: range {part} runs backwards; write it {hi}-{lo}")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def check_cpu_list(text: str) -> None:
    """Raise HostError unless ``text`` is a CPU list (``0``, ``0-3``, ``0,2-3``) with each range ascending."""
    cpu_list(text)


def check_spec(spec: str) -> None:
    """Raise HostError when ``spec`` is no host spec :func:`parse_host` takes; opens nothing (a
    definition check can call it before any run)."""
    _parse_spec(spec)


def parse_host(spec: str, **ssh_options) -> Host:
    """Host from ``local``, ``netns:<name>`` or ``ssh:[user@]host[:port]``; ``ssh_options`` go to SshHost.

    An SSH host's ``config`` (its ``ssh -F`` file) defaults to ``$PEERCACHE_SSH_CONFIG`` when that is
    set and not empty: a launcher that boots test machines writes a per-run ssh config and exports it
    to the pipeline it runs, whose testbed can then name the machines by that file's Host aliases.
    """
    kind, name, port = _parse_spec(spec)
    if kind == "local":
        return LocalHost()
    if kind == "netns":
        return NetnsHost(name)
    option_port = ssh_options.pop("port", None)
    port = port if port is not None else option_port
    if port is not None and not 0 < int(port) < 65536:
        raise HostError(f"host spec {spec!r}: port {port} outside 1..65535")
    if ssh_options.get("config") is None and os.environ.get(SSH_CONFIG_ENV):
        ssh_options["config"] = os.environ[SSH_CONFIG_ENV]
    if ssh_options.get("control_dir") is None and os.environ.get(SSH_CONTROL_DIR_ENV):
        ssh_options["control_dir"] = os.environ[SSH_CONTROL_DIR_ENV]
    return SshHost(name, port=port, **ssh_options)
