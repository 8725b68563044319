"""Real Redis servers on loopback for tests and the bench: one server, or a Redis Cluster.

:class:`RedisServer` runs Debian's ``redis-server`` on a random free
127.0.0.1 port with no persistence (``--save '' --appendonly no``) in a
private temporary directory, and waits (bounded) until it answers PING.
:class:`RedisCluster` runs ``masters`` servers with ``--cluster-enabled
yes``, joins them with ``redis-cli --cluster create ... --cluster-replicas 0
--cluster-yes`` and waits until every node reports ``cluster_state:ok`` with
all 16384 slots assigned.

Command lines come from pure functions (:func:`server_command`,
:func:`cli_command`, :func:`cluster_create_command`); only the classes start
processes, each in its own process group, and ``stop()`` (also on a failed
start and on leaving a ``with`` block) ends every one of them and removes the
temporary directory.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

#: What to install when the binaries are missing (``make setup`` installs them).
INSTALL_HINT = "install Debian's redis-server: apt-get install redis-server redis-tools"

#: Redis Cluster has this many hash slots; a healthy cluster assigns them all.
CLUSTER_SLOTS = 16384

#: Loopback only: nothing here is meant to be reachable from another machine.
LOOPBACK = "127.0.0.1"

#: Poll period while waiting for a server or a cluster.
_POLL_S = 0.05


class RedisUnavailable(RuntimeError):
    """redis-server / redis-cli is not installed here."""


class RedisLaunchError(RuntimeError):
    """A server or cluster did not start, or did not become ready in time."""


# --- pure command builders --------------------------------------------------

def server_command(port: int, workdir: str | os.PathLike, *, bind: str = LOOPBACK,
                   cluster: bool = False, cluster_port: int | None = None,
                   node_timeout_ms: int = 2000, binary: str = "redis-server",
                   cluster_config: str = "nodes.conf") -> list[str]:
    """argv of one redis-server: ``port`` on ``bind``, no RDB/AOF, files under ``workdir``.

    With ``cluster`` the node keeps its cluster state in ``workdir/<cluster_config>``
    and its cluster bus on ``cluster_port`` (default ``port + 10000``, which
    must itself be a valid, free port).
    """
    argv = [binary, "--port", str(port), "--bind", bind, "--dir", str(workdir),
            "--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", "",
            "--protected-mode", "yes"]
    if cluster:
        argv += ["--cluster-enabled", "yes", "--cluster-config-file", cluster_config,
                 "--cluster-node-timeout", str(node_timeout_ms)]
        if cluster_port is not None:
            argv += ["--cluster-port", str(cluster_port)]
    return argv


def cli_command(port: int, *args: str, host: str = LOOPBACK, binary: str = "redis-cli") -> list[str]:
    """argv of ``redis-cli -h host -p port args...`` (output not a TTY, so replies come raw)."""
    return [binary, "-h", host, "-p", str(port), *args]


def cluster_create_command(ports: list[int], *, host: str = LOOPBACK,
                           binary: str = "redis-cli") -> list[str]:
    """argv that joins the servers on ``ports`` into a cluster of masters only, without asking."""
    return [binary, "--cluster", "create", *[f"{host}:{p}" for p in ports],
            "--cluster-replicas", "0", "--cluster-yes"]


def die_with_parent(argv: list[str]) -> list[str]:
    """``argv`` run so that the kernel kills it (SIGKILL) when the thread that started it dies.

    ``stop()`` ends a server on every normal path; this covers the others (a test runner or bench
    killed by SIGKILL), so no redis-server outlives its launcher. Uses util-linux ``setpriv
    --pdeathsig``, which then execs the command (same pid); without setpriv, ``argv`` unchanged.
    Start servers from a thread that lives as long as they should (the main thread).
    """
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--", *argv] if setpriv else list(argv)


def parse_info(text: str) -> dict[str, str]:
    """``INFO`` / ``CLUSTER INFO`` reply text -> {field: value} (comments and blank lines skipped)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or ":" not in line:
            continue
        k, v = line.split(":", 1)
        out[k] = v
    return out


def url_for(port: int, db: int = 0, host: str = LOOPBACK) -> str:
    """``redis://host:port/db``."""
    return f"redis://{host}:{port}/{db}"


# --- environment ------------------------------------------------------------

def available() -> tuple[bool, str]:
    """(True, "") when redis-server and redis-cli are installed, else (False, what to install)."""
    missing = [b for b in ("redis-server", "redis-cli") if shutil.which(b) is None]
    if missing:
        return False, f"{' and '.join(missing)} not found on PATH; {INSTALL_HINT}"
    return True, ""


def require() -> None:
    """Raise :class:`RedisUnavailable` naming what to install when the binaries are missing."""
    ok, why = available()
    if not ok:
        raise RedisUnavailable(why)


def server_version() -> str:
    """``redis-server --version``'s ``v=`` field (e.g. ``7.0.15``)."""
    require()
    r = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, timeout=10)
    for tok in r.stdout.split():
        if tok.startswith("v="):
            return tok[2:]
    raise RedisLaunchError(f"redis-server --version printed no v= field: {r.stdout.strip()!r}; "
                           f"reinstall it ({INSTALL_HINT})")


def free_port(host: str = LOOPBACK, below: int = 65536) -> int:
    """A TCP port free on ``host`` right now, smaller than ``below`` (bounded tries)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port < below:
            return port
    raise RedisLaunchError(f"no free port below {below} on {host} after 200 tries; "
                           "free some ephemeral ports or widen net.ipv4.ip_local_port_range")


def _cli(port: int, *args: str, timeout: float = 5.0) -> subprocess.CompletedProcess:
    return subprocess.run(cli_command(port, *args), capture_output=True, text=True, timeout=timeout)


# --- one server -------------------------------------------------------------

class RedisServer:
    """One redis-server on a random loopback port; use as a context manager or call start/stop.

    ``kill()`` ends it with SIGKILL (fault tests); ``restart()`` starts a new,
    empty server on the same port; ``stop()`` ends it and removes its files.
    """

    def __init__(self, *, port: int | None = None, start_timeout: float = 10.0,
                 cluster: bool = False, cluster_port: int | None = None,
                 workdir: str | os.PathLike | None = None):
        self.port = port
        self.start_timeout = start_timeout
        self.cluster = cluster
        self.cluster_port = cluster_port
        self._own_dir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else None
        self.proc: subprocess.Popen | None = None
        self._log = None
        self.argv: list[str] = []

    # -- addresses
    @property
    def host(self) -> str:
        return LOOPBACK

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        if self.port is None:
            raise RedisLaunchError("RedisServer.url asked before start(); start the server first")
        return url_for(self.port)

    @property
    def log_path(self) -> Path | None:
        return self.workdir / "redis.log" if self.workdir is not None else None

    def log_tail(self, n: int = 1200) -> str:
        """The last ``n`` characters of the server's log (its stdout and stderr)."""
        p = self.log_path
        if p is None or not p.exists():
            return ""
        return p.read_text(errors="replace")[-n:]

    # -- life cycle
    def start(self) -> "RedisServer":
        """Start the server and wait until it answers PING; on failure nothing is left running."""
        require()
        if self.proc is not None and self.proc.poll() is None:
            raise RedisLaunchError(f"redis-server on port {self.port} is already running; stop() it first")
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="pcredis-"))
        fixed_port = self.port is not None
        # A port picked free can be taken before redis binds it: try another (bounded).
        for attempt in range(1 if fixed_port else 5):
            if not fixed_port:
                self.port = free_port(below=55536 if self.cluster and self.cluster_port is None else 65536)
            try:
                self._launch()
                self._wait_ready()
                return self
            except RedisLaunchError:
                in_use = "Address already in use" in self.log_tail()
                self._end(signal.SIGKILL)
                if fixed_port or not in_use or attempt == 4:
                    self._cleanup_dir()
                    raise
        raise AssertionError("unreachable")

    def _launch(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for stale in ("nodes.conf", "dump.rdb"):
            (self.workdir / stale).unlink(missing_ok=True)
        self.argv = server_command(self.port, self.workdir, cluster=self.cluster,
                                   cluster_port=self.cluster_port)
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(die_with_parent(self.argv), stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RedisLaunchError(
                    f"redis-server on {LOOPBACK}:{self.port} exited with status {self.proc.returncode} "
                    f"before answering PING; its log ends: {self.log_tail()!r}; command: {self.argv}")
            try:
                # INFO, not just PING: the server answering must be ours (its process_id), not
                # another one that already held the port while ours failed to bind it.
                r = _cli(self.port, "info", "server", timeout=max(0.5, min(3.0, deadline - time.monotonic())))
                last = (r.stdout + r.stderr).strip()[-200:]
                pid = parse_info(r.stdout).get("process_id")
                if r.returncode == 0 and pid == str(self.proc.pid) and self.ping():
                    return
                if r.returncode == 0 and pid is not None:
                    last = f"port answered by another redis-server (process_id {pid})"
            except subprocess.TimeoutExpired:
                last = "redis-cli info timed out"
            time.sleep(_POLL_S)
        raise RedisLaunchError(
            f"redis-server on {LOOPBACK}:{self.port} did not answer PING within {self.start_timeout:.0f}s "
            f"(last reply {last!r}); its log ends: {self.log_tail()!r}")

    def ping(self, timeout: float = 2.0) -> bool:
        """True when the server answers PING now."""
        if self.port is None:
            return False
        try:
            r = _cli(self.port, "ping", timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return r.returncode == 0 and r.stdout.strip() == "PONG"

    def flush(self) -> None:
        """Empty the server (FLUSHALL): each bench point starts from nothing on a shared server."""
        r = _cli(self.port, "flushall", timeout=10)
        if r.returncode != 0 or r.stdout.strip() != "OK":
            raise RedisLaunchError(f"FLUSHALL on {LOOPBACK}:{self.port} failed: {(r.stdout + r.stderr).strip()!r}; "
                                   f"is the server still running? its log ends: {self.log_tail(400)!r}")

    def seed(self, keys: list[str], value: str) -> None:
        """Store ``value`` under each of ``keys`` (one MSET), e.g. the keys a redis-benchmark MGET reads."""
        if not keys:
            raise ValueError("seed() needs at least one key")
        r = _cli(self.port, "mset", *[x for k in keys for x in (k, value)], timeout=30)
        if r.returncode != 0 or r.stdout.strip() != "OK":
            raise RedisLaunchError(f"MSET of {len(keys)} keys on {LOOPBACK}:{self.port} failed: "
                                   f"{(r.stdout + r.stderr).strip()[:300]!r}")

    def keyspace_stats(self, reset: bool = False) -> dict[str, int]:
        """``keyspace_hits`` / ``keyspace_misses`` of INFO stats (keys read that existed / did not),
        then zeroed with CONFIG RESETSTAT when ``reset``."""
        r = _cli(self.port, "info", "stats", timeout=10)
        got = dict(line.split(":", 1) for line in r.stdout.splitlines() if line.startswith("keyspace_"))
        try:
            out = {k: int(got[k]) for k in ("keyspace_hits", "keyspace_misses")}
        except (KeyError, ValueError):
            raise RedisLaunchError(f"INFO stats on {LOOPBACK}:{self.port} has no keyspace_hits/misses: "
                                   f"{(r.stdout + r.stderr).strip()[:300]!r}") from None
        if reset and _cli(self.port, "config", "resetstat", timeout=10).stdout.strip() != "OK":
            raise RedisLaunchError(f"CONFIG RESETSTAT on {LOOPBACK}:{self.port} failed")
        return out

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def _end(self, sig: int, grace: float = 5.0) -> None:
        p = self.proc
        if p is not None:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass
                try:
                    p.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    p.wait(timeout=5)
            else:
                p.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def kill(self) -> None:
        """End the server with SIGKILL (a crash: no shutdown, clients see the connection drop)."""
        self._end(signal.SIGKILL)

    def restart(self) -> "RedisServer":
        """Start a new, empty server on the same port (after kill() or while running)."""
        self._end(signal.SIGKILL)
        if self.port is None:
            raise RedisLaunchError("restart() before start(): there is no port to reuse; call start()")
        self._launch()
        try:
            self._wait_ready()
        except RedisLaunchError:
            self._end(signal.SIGKILL)
            raise
        return self

    def stop(self) -> None:
        """End the server (SIGTERM, then SIGKILL after 5 s) and remove its private directory."""
        self._end(signal.SIGTERM)
        self._cleanup_dir()

    def _cleanup_dir(self) -> None:
        if self._own_dir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"RedisServer(port={self.port}, running={self.running})"


# --- a cluster --------------------------------------------------------------

class RedisCluster:
    """``masters`` cluster-enabled redis-servers on loopback joined into one cluster (no replicas)."""

    def __init__(self, masters: int = 3, *, start_timeout: float = 20.0):
        if masters < 3:
            raise ValueError(f"RedisCluster(masters={masters}): redis-cli --cluster create needs at "
                             "least 3 masters; ask for 3 or more")
        self.masters = masters
        self.start_timeout = start_timeout
        self.nodes: list[RedisServer] = []
        self.workdir: Path | None = None
        self.create_argv: list[str] = []

    @property
    def ports(self) -> list[int]:
        return [n.port for n in self.nodes]

    @property
    def urls(self) -> list[str]:
        """One ``redis://127.0.0.1:PORT/0`` per master."""
        return [n.url for n in self.nodes]

    @property
    def url(self) -> str:
        """The first master's URL (a cluster client discovers the others from it)."""
        return self.urls[0]

    def start(self) -> "RedisCluster":
        """Start the servers, create the cluster and wait for ``cluster_state:ok`` on every node."""
        require()
        self.workdir = Path(tempfile.mkdtemp(prefix="pcrediscluster-"))
        try:
            deadline = time.monotonic() + self.start_timeout
            for i in range(self.masters):
                node = RedisServer(cluster=True, cluster_port=free_port(),
                                   workdir=self.workdir / f"node{i}",
                                   start_timeout=max(1.0, deadline - time.monotonic()))
                self.nodes.append(node)
                node.start()
            self._create(deadline)
            self._wait_ok(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _create(self, deadline: float) -> None:
        self.create_argv = create_cluster(self.ports, deadline)

    def cluster_info(self, port: int) -> dict[str, str]:
        """``CLUSTER INFO`` of the node on ``port``."""
        return cluster_info(port)

    def _wait_ok(self, deadline: float) -> None:
        wait_cluster_ok(self.ports, deadline)

    def stop(self) -> None:
        """End every node and remove the cluster's directory."""
        for n in self.nodes:
            n.stop()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> "RedisCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"RedisCluster(ports={self.ports})"


# --- a cluster on another host (a cluster testbed's directory host) ------------------------------------

#: What ``create-cluster`` prints once every node says its cluster is ok (the lab's readiness pattern).
CLUSTER_READY = "peercache redis cluster: ready"


def _auth(password: str | None) -> list[str]:
    return ["-a", password, "--no-auth-warning"] if password else []


def create_cluster(ports: list[int], deadline: float, *, host: str = LOOPBACK,
                   password: str | None = None) -> list[str]:
    """Join the cluster-enabled servers on ``host``:``ports`` into a cluster of masters (the argv it ran;
    RedisLaunchError, with redis-cli's words, when it did not finish in time or failed)."""
    argv = cluster_create_command(ports, host=host)
    shown = " ".join(argv)
    try:
        r = subprocess.run(argv + _auth(password), capture_output=True, text=True, stdin=subprocess.DEVNULL,
                           timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired as e:
        raise RedisLaunchError(f"`{shown}` did not finish in its start budget") from e
    if r.returncode != 0 or "[OK] All 16384 slots covered" not in r.stdout:
        raise RedisLaunchError(f"`{shown}` failed (status {r.returncode}): {(r.stdout + r.stderr)[-1200:]!r}")
    return argv


def cluster_info(port: int, *, host: str = LOOPBACK, password: str | None = None) -> dict[str, str]:
    """``CLUSTER INFO`` of the node on ``host``:``port`` (empty when it does not answer)."""
    r = subprocess.run(cli_command(port, *_auth(password), "cluster", "info", host=host), capture_output=True,
                       text=True, stdin=subprocess.DEVNULL, timeout=5.0)
    return parse_info(r.stdout)


def wait_cluster_ok(ports: list[int], deadline: float, *, host: str = LOOPBACK, password: str | None = None) -> None:
    """Wait until every node says ``cluster_state:ok`` with every slot assigned and every master known."""
    last: dict[int, dict[str, str]] = {}
    while time.monotonic() < deadline:
        last = {p: cluster_info(p, host=host, password=password) for p in ports}
        if all(i.get("cluster_state") == "ok" and i.get("cluster_slots_assigned") == str(CLUSTER_SLOTS)
               and i.get("cluster_known_nodes") == str(len(ports)) for i in last.values()):
            return
        time.sleep(_POLL_S * 2)
    states = {p: (i.get("cluster_state"), i.get("cluster_slots_assigned"), i.get("cluster_known_nodes"))
              for p, i in last.items()}
    raise RedisLaunchError(f"Redis Cluster on {host} ports {ports} not ok in its start budget "
                           f"(port: (state, slots assigned, known nodes) = {states})")


def create_cluster_command(python: list[str], host: str, ports: list[int], password: str | None,
                           timeout: float) -> list[str]:
    """argv of :func:`main`'s ``create-cluster`` run with ``python`` (the lab starts it on the directory host)."""
    return [*python, "-m", "peercache.lab.launch.redis", "create-cluster", "--host", host,
            "--ports", ",".join(map(str, ports)), "--timeout", f"{timeout:g}",
            *(["--password", password] if password else [])]


def main(argv: list[str] | None = None) -> int:
    """``python -m peercache.lab.launch.redis create-cluster --host H --ports P1,P2,P3 [--password PW]``: join
    the cluster-enabled servers the lab started on a cluster testbed's directory host, wait until every node
    is ok, print CLUSTER_READY, then hold until SIGTERM or SIGINT (the group runner stops it with the servers)."""
    p = argparse.ArgumentParser(prog="python -m peercache.lab.launch.redis")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("create-cluster", help="join cluster-enabled servers into one cluster, then hold")
    c.add_argument("--host", required=True, help="the servers' address")
    c.add_argument("--ports", required=True, help="P1,P2,P3: the servers' ports (3 or more)")
    c.add_argument("--password", default=None, help="their requirepass")
    c.add_argument("--timeout", type=float, default=30.0, help="seconds to create and see it ok [%(default)s]")
    a = p.parse_args(argv)
    ports = [int(x) for x in a.ports.split(",") if x]
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    deadline = time.monotonic() + a.timeout
    try:
        create_cluster(ports, deadline, host=a.host, password=a.password)
        wait_cluster_ok(ports, deadline, host=a.host, password=a.password)
    except (RedisLaunchError, OSError, subprocess.SubprocessError) as e:
        print(f"create-cluster: {e}", file=sys.stderr, flush=True)
        return 1
    print(f"{CLUSTER_READY} on {a.host} ports {','.join(map(str, ports))}", flush=True)
    stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
