"""Real Redis servers on loopback for tests and the bench: one server, a Redis Cluster, or a
master with replicas watched by Redis Sentinel.

:class:`RedisServer` runs Debian's ``redis-server`` on a random free
127.0.0.1 port with no persistence (``--save '' --appendonly no``) in a
private temporary directory, and waits (bounded) until it answers PING; with
``replicaof`` it is a replica of the server on that port.
:class:`RedisCluster` runs ``masters`` servers (and ``replicas`` per master) with
``--cluster-enabled yes``, joins them with ``redis-cli --cluster create ...
--cluster-replicas N --cluster-yes`` and waits until every node reports
``cluster_state:ok`` with all 16384 slots assigned and every replica in sync.
:class:`SentinelSet` runs a master, its replicas and ``sentinels`` Redis
Sentinels (``redis-server <conf> --sentinel``, each with a config file of its own
in its private directory, which Sentinel rewrites), with failure detection short
enough for tests (:data:`SENTINEL_DOWN_AFTER_MS`, :data:`SENTINEL_FAILOVER_TIMEOUT_MS`),
and waits until every sentinel names the master and knows the others and the replicas.

Command lines and config files come from pure functions (:func:`server_command`,
:func:`sentinel_command`, :func:`sentinel_config`, :func:`cli_command`,
:func:`cluster_create_command`); only the classes start processes, each in its
own process group, and ``stop()`` (also on a failed start and on leaving a
``with`` block) ends every one of them and removes the temporary directories.

``python -m peercache.lab.launch.redis sentinel`` starts a Sentinel set for trying
``--directory redis+sentinel://...`` by hand; ``create-cluster`` and ``wait-sentinels`` are the lab's
readiness for a cluster or a Sentinel set it started process by process on a host (see :func:`main`).
"""
from __future__ import annotations

import argparse
import binascii
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

#: What to install when the binaries are missing (``make setup`` installs them).
INSTALL_HINT = "install Debian's redis-server: apt-get install redis-server redis-tools"

#: Redis Cluster has this many hash slots; a healthy cluster assigns them all.
CLUSTER_SLOTS = 16384

#: Loopback only: nothing here is meant to be reachable from another machine.
LOOPBACK = "127.0.0.1"

#: Poll period while waiting for a server or a cluster.
_POLL_S = 0.05

#: The name a :class:`SentinelSet`'s sentinels monitor its master under (the URL's SERVICE).
SENTINEL_SERVICE = "peercache"
#: Sentinels in a set: three, so that two (the quorum, a majority) still agree with one lost.
SENTINELS = 3
#: ``down-after-milliseconds``: how long a master may not answer before a sentinel deems it down.
#: Short, for tests (a production set uses 5000-30000 ms); sentinels ping every min(this, 1000) ms.
SENTINEL_DOWN_AFTER_MS = 1000
#: ``failover-timeout``: a failover that did not finish in this time is given up and tried again
#: after twice this; also how long the other replicas may take to follow the new master. Short, for
#: tests (Sentinel's own default is 180000 ms).
SENTINEL_FAILOVER_TIMEOUT_MS = 3000
#: Default bound on starting a whole Sentinel set (servers, sync, sentinels seeing each other:
#: they announce themselves every 2 s).
SENTINEL_START_S = 30.0
#: Default bound on starting a Redis Cluster (servers, create, every node ok, replicas in sync).
CLUSTER_START_S = 20.0


class RedisUnavailable(RuntimeError):
    """redis-server / redis-cli is not installed here."""


class RedisLaunchError(RuntimeError):
    """A server or cluster did not start, or did not become ready in time."""


# --- pure command builders --------------------------------------------------

def server_command(port: int, workdir: str | os.PathLike, *, bind: str = LOOPBACK,
                   cluster: bool = False, cluster_port: int | None = None,
                   node_timeout_ms: int = 2000, binary: str = "redis-server",
                   cluster_config: str = "nodes.conf", replicaof: tuple[str, int] | None = None,
                   password: str | None = None) -> list[str]:
    """argv of one redis-server: ``port`` on ``bind``, no RDB/AOF, files under ``workdir``.

    With ``cluster`` the node keeps its cluster state in ``workdir/<cluster_config>``
    and its cluster bus on ``cluster_port`` (default ``port + 10000``, which
    must itself be a valid, free port). With ``replicaof`` (host, port) it replicates that
    master. With ``password`` clients must give it (``requirepass``), and it gives it to
    its master (``masterauth``: a master demoted by a failover replicates the new one).
    """
    # A replica's full sync starts at once (Redis waits 5 s for more replicas to share it by default).
    argv = [binary, "--port", str(port), "--bind", bind, "--dir", str(workdir),
            "--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", "",
            "--protected-mode", "yes", "--repl-diskless-sync-delay", "0"]
    if cluster:
        argv += ["--cluster-enabled", "yes", "--cluster-config-file", cluster_config,
                 "--cluster-node-timeout", str(node_timeout_ms)]
        if cluster_port is not None:
            argv += ["--cluster-port", str(cluster_port)]
    if replicaof is not None:
        argv += ["--replicaof", replicaof[0], str(replicaof[1])]
    if password:
        argv += ["--requirepass", password, "--masterauth", password]
    return argv


def sentinel_command(config: str | os.PathLike, *, binary: str = "redis-server") -> list[str]:
    """argv of one Redis Sentinel reading (and rewriting: it must be writable) ``config``."""
    return [binary, str(config), "--sentinel"]


def sentinel_config(port: int, master_port: int, workdir: str | os.PathLike, *, quorum: int,
                    service: str = SENTINEL_SERVICE, bind: str = LOOPBACK, master_host: str = LOOPBACK,
                    down_after_ms: int = SENTINEL_DOWN_AFTER_MS,
                    failover_timeout_ms: int = SENTINEL_FAILOVER_TIMEOUT_MS,
                    password: str | None = None, sentinel_password: str | None = None) -> str:
    """The config file of one sentinel on ``port`` watching the master ``master_host:master_port`` as
    ``service`` (``quorum`` sentinels must deem it down). ``password``: the master's and replicas'
    (``auth-pass``); ``sentinel_password``: the sentinels' own (``requirepass``, and ``sentinel-pass``
    for speaking to each other)."""
    lines = [f"port {port}", f"bind {bind}", "daemonize no", 'logfile ""', f"dir {workdir}",
             f"sentinel monitor {service} {master_host} {master_port} {quorum}",
             f"sentinel down-after-milliseconds {service} {down_after_ms}",
             f"sentinel failover-timeout {service} {failover_timeout_ms}",
             f"sentinel parallel-syncs {service} 1"]
    if password:
        lines.append(f"sentinel auth-pass {service} {password}")
    if sentinel_password:
        lines += [f"requirepass {sentinel_password}", f"sentinel sentinel-pass {sentinel_password}"]
    return "\n".join(lines) + "\n"


def cli_command(port: int, *args: str, host: str = LOOPBACK, binary: str = "redis-cli") -> list[str]:
    """argv of ``redis-cli -h host -p port args...`` (output not a TTY, so replies come raw)."""
    return [binary, "-h", host, "-p", str(port), *args]


def cluster_create_command(ports: list[int], *, host: str = LOOPBACK, replicas: int = 0,
                           binary: str = "redis-cli") -> list[str]:
    """argv that joins the servers on ``ports`` into a cluster, without asking: ``replicas`` replicas
    per master (0: masters only; the masters are then len(ports) / (1 + replicas) of them)."""
    return [binary, "--cluster", "create", *[f"{host}:{p}" for p in ports],
            "--cluster-replicas", str(replicas), "--cluster-yes"]


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


def url_for(port: int, db: int = 0, host: str = LOOPBACK, password: str | None = None) -> str:
    """``redis://[:password@]host:port/db`` (the password as given: mask it before printing)."""
    auth = f":{urllib.parse.quote(password, safe='')}@" if password else ""
    return f"redis://{auth}{host}:{port}/{db}"


def sentinel_url_for(ports: list[int], service: str = SENTINEL_SERVICE, db: int = 0, host: str = LOOPBACK,
                     password: str | None = None) -> str:
    """``redis+sentinel://[:password@]host:p1,host:p2,.../service/db`` (the password as given: mask it
    before printing, as :func:`main` does)."""
    auth = f":{urllib.parse.quote(password, safe='')}@" if password else ""
    return f"redis+sentinel://{auth}{','.join(f'{host}:{p}' for p in ports)}/{service}/{db}"


def parse_pairs(text: str) -> dict[str, str]:
    """redis-cli's raw reply of a flat field/value list (``SENTINEL MASTER``) -> {field: value}."""
    lines = text.splitlines()
    return dict(zip(lines[0::2], lines[1::2]))


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


def _cli(port: int, *args: str, timeout: float = 5.0, password: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cli_command(port, *_auth(password), *args), capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout)


def replication(port: int, *, host: str = LOOPBACK, password: str | None = None) -> dict[str, str]:
    """``INFO replication`` of the server on ``host``:``port`` (empty when it does not answer)."""
    try:
        r = subprocess.run(cli_command(port, *_auth(password), "info", "replication", host=host),
                           capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=5.0)
    except subprocess.TimeoutExpired:
        return {}
    return parse_info(r.stdout)


def in_sync(info: dict[str, str]) -> bool:
    """Whether an ``INFO replication`` is a replica's whose link to its master is up."""
    return info.get("role") == "slave" and info.get("master_link_status") == "up"


#: The key a replication probe (:func:`replicated`) sets and deletes at once; on a cluster a hash tag follows.
_PROBE = "peercache:launch:probe"


def slot_of(key: str) -> int:
    """Redis Cluster's hash slot of ``key``: CRC16 (XMODEM) of the key, or of its ``{hash tag}``, mod 16384."""
    k = key.encode()
    start = k.find(b"{")
    if start >= 0:
        end = k.find(b"}", start + 1)
        if end > start + 1:
            k = k[start + 1:end]
    return binascii.crc_hqx(k, 0) % CLUSTER_SLOTS


def probe_key(slot: int | None = None) -> str:
    """The replication probe's key: in hash slot ``slot`` (a cluster master's own), or anywhere (None)."""
    if slot is None:
        return _PROBE
    for i in range(1 << 22):
        if slot_of(f"{{{i:x}}}") == slot:
            return f"{_PROBE}:{{{i:x}}}"
    raise ValueError(f"slot {slot} is not a Redis Cluster hash slot (0-{CLUSTER_SLOTS - 1})")


def first_own_slot(port: int, *, host: str = LOOPBACK, password: str | None = None) -> int | None:
    """The first hash slot the cluster node on ``host``:``port`` serves (``CLUSTER NODES``'s ``myself``
    line), None when it serves none (a replica, or slots not assigned yet)."""
    r = subprocess.run(cli_command(port, *_auth(password), "cluster", "nodes", host=host), capture_output=True,
                       text=True, stdin=subprocess.DEVNULL, timeout=5.0)
    for line in r.stdout.splitlines():
        fields = line.split()
        if len(fields) > 2 and "myself" in fields[2].split(","):
            for rng in fields[8:]:
                first = rng.split("-")[0]
                if first.isdigit():
                    return int(first)
    return None


def replicated(port: int, replicas: int, *, timeout: float, host: str = LOOPBACK, password: str | None = None,
               cluster: bool = False) -> None:
    """Return once ``replicas`` replicas of the master on ``host``:``port`` acknowledged every write it
    took so far; RedisLaunchError after ``timeout`` s.

    ``WAIT`` counts acknowledgements of its own connection's writes only (asked on a fresh connection it
    answers at once), and a replica just through its first sync is sent nothing until its first
    acknowledgement, up to a second later, while it already says its link is up: so the probe writes (a
    key set and deleted at once, in a slot of the master's own on a ``cluster``) and waits in one
    connection."""
    key = probe_key(first_own_slot(port, host=host, password=password) if cluster else None)
    ms = max(1, int(timeout * 1000))
    try:
        r = subprocess.run(cli_command(port, *_auth(password), host=host), capture_output=True, text=True,
                           input=f"SET {key} 1\nDEL {key}\nWAIT {replicas} {ms}\n", timeout=timeout + 5.0)
    except subprocess.TimeoutExpired:
        raise RedisLaunchError(f"the master on {host}:{port} did not answer a replication probe within "
                               f"{timeout + 5.0:g} s") from None
    got = r.stdout.split()
    if r.returncode != 0 or not got or not got[-1].isdigit() or int(got[-1]) < replicas:
        raise RedisLaunchError(f"{got[-1] if got else 'no'} of {replicas} replicas of {host}:{port} acknowledged its "
                               f"writes within {timeout:g} s (redis-cli said {(r.stdout + r.stderr).strip()[-300:]!r}); "
                               "check that they are running and replicating it")


#: The ``masterauth`` :func:`cut_replica` gives a replica: no master of ours has it, so every resync fails.
_NOT_THE_MASTERAUTH = "peercache-cut-replica"


def cut_replica(master: "RedisServer", replica: "RedisServer", *, timeout: float = 5.0) -> None:
    """Make ``replica`` miss every write ``master`` takes from now on, both still running: the lag that
    Redis's asynchronous replication has when a master dies, which a failover then loses.

    The replica is given a wrong ``masterauth`` (each resync it tries fails AUTH) and its link is closed
    (``CLIENT KILL TYPE replica`` on the master: every replica of it is cut, the others reconnect within
    a second). Returns once the replica says its link is down; RedisLaunchError after ``timeout`` s.
    :func:`reconnect_replica` undoes it."""
    for srv, args in ((replica, ("config", "set", "masterauth", _NOT_THE_MASTERAUTH)),
                      (master, ("client", "kill", "type", "replica"))):
        r = srv.cli(*args)
        if r.returncode != 0 or r.stdout.strip().startswith("ERR"):
            raise RedisLaunchError(f"{' '.join(args[:2])} on {LOOPBACK}:{srv.port} failed: "
                                   f"{(r.stdout + r.stderr).strip()!r}; is it running?")
    deadline = time.monotonic() + timeout
    info: dict[str, str] = {}
    while time.monotonic() < deadline:
        info = replication(replica.port, password=replica.password)
        if info.get("role") == "slave" and info.get("master_link_status") == "down":
            return
        time.sleep(_POLL_S)
    raise RedisLaunchError(f"the replica on {LOOPBACK}:{replica.port} still replicates {LOOPBACK}:{master.port} "
                           f"{timeout:g} s after its link was cut (role {info.get('role')}, link "
                           f"{info.get('master_link_status')}); its log ends: {replica.log_tail(400)!r}")


def reconnect_replica(replica: "RedisServer") -> None:
    """Undo :func:`cut_replica`: ``replica`` may resync again (its own masterauth back: its password, or none)."""
    r = replica.cli("config", "set", "masterauth", replica.password or "")
    if r.returncode != 0 or r.stdout.strip() != "OK":
        raise RedisLaunchError(f"config set masterauth on {LOOPBACK}:{replica.port} failed: "
                               f"{(r.stdout + r.stderr).strip()!r}; is it running?")


# --- one server -------------------------------------------------------------

class RedisServer:
    """One redis-server on a random loopback port; use as a context manager or call start/stop.

    ``kill()`` ends it with SIGKILL (fault tests); ``pause()`` / ``resume()`` stop and continue it
    (SIGSTOP / SIGCONT: a server that hangs); ``restart()`` starts a new, empty server on the same
    port; ``stop()`` ends it and removes its files.
    """

    def __init__(self, *, port: int | None = None, start_timeout: float = 10.0,
                 cluster: bool = False, cluster_port: int | None = None,
                 workdir: str | os.PathLike | None = None, replicaof: int | None = None,
                 password: str | None = None):
        self.port = port
        self.start_timeout = start_timeout
        self.cluster = cluster
        self.cluster_port = cluster_port
        #: the port of the loopback master this server replicates (None: a master)
        self.replicaof = replicaof
        #: its requirepass (and masterauth), or None
        self.password = password
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
        self.argv = self._command()
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(die_with_parent(self.argv), stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    def _command(self) -> list[str]:
        """The argv this server runs (a subclass runs another)."""
        return server_command(self.port, self.workdir, cluster=self.cluster, cluster_port=self.cluster_port,
                              replicaof=None if self.replicaof is None else (LOOPBACK, self.replicaof),
                              password=self.password)

    def cli(self, *args: str, timeout: float = 5.0) -> subprocess.CompletedProcess:
        """``redis-cli`` ``args`` against this server (with its password)."""
        return _cli(self.port, *args, timeout=timeout, password=self.password)

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
                r = self.cli("info", "server", timeout=max(0.5, min(3.0, deadline - time.monotonic())))
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

    def replicated(self, replicas: int = 1, *, timeout: float = 5.0) -> None:
        """Return once ``replicas`` replicas of this master acknowledged every write it took so far
        (:func:`replicated`); RedisLaunchError after ``timeout`` s."""
        replicated(self.port, replicas, timeout=timeout, password=self.password, cluster=self.cluster)

    def ping(self, timeout: float = 2.0) -> bool:
        """True when the server answers PING now."""
        if self.port is None:
            return False
        try:
            r = self.cli("ping", timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return r.returncode == 0 and r.stdout.strip() == "PONG"

    def flush(self) -> None:
        """Empty the server (FLUSHALL): each bench point starts from nothing on a shared server."""
        r = self.cli("flushall", timeout=10)
        if r.returncode != 0 or r.stdout.strip() != "OK":
            raise RedisLaunchError(f"FLUSHALL on {LOOPBACK}:{self.port} failed: {(r.stdout + r.stderr).strip()!r}; "
                                   f"is the server still running? its log ends: {self.log_tail(400)!r}")

    def seed(self, keys: list[str], value: str) -> None:
        """Store ``value`` under each of ``keys`` (one MSET), e.g. the keys a redis-benchmark MGET reads."""
        if not keys:
            raise ValueError("seed() needs at least one key")
        r = self.cli("mset", *[x for k in keys for x in (k, value)], timeout=30)
        if r.returncode != 0 or r.stdout.strip() != "OK":
            raise RedisLaunchError(f"MSET of {len(keys)} keys on {LOOPBACK}:{self.port} failed: "
                                   f"{(r.stdout + r.stderr).strip()[:300]!r}")

    def keyspace_stats(self, reset: bool = False) -> dict[str, int]:
        """``keyspace_hits`` / ``keyspace_misses`` of INFO stats (keys read that existed / did not),
        then zeroed with CONFIG RESETSTAT when ``reset``."""
        r = self.cli("info", "stats", timeout=10)
        got = dict(line.split(":", 1) for line in r.stdout.splitlines() if line.startswith("keyspace_"))
        try:
            out = {k: int(got[k]) for k in ("keyspace_hits", "keyspace_misses")}
        except (KeyError, ValueError):
            raise RedisLaunchError(f"INFO stats on {LOOPBACK}:{self.port} has no keyspace_hits/misses: "
                                   f"{(r.stdout + r.stderr).strip()[:300]!r}") from None
        if reset and self.cli("config", "resetstat", timeout=10).stdout.strip() != "OK":
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
                    if sig != signal.SIGKILL:
                        os.killpg(p.pid, signal.SIGCONT)    # a paused server acts on SIGTERM only once continued
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

    def pause(self) -> None:
        """Stop the server with SIGSTOP (a hang: its port still accepts connections, nothing answers);
        ``resume()`` continues it, ``stop()`` and ``kill()`` end it even while stopped."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Continue a server ``pause()`` stopped (SIGCONT)."""
        self._signal(signal.SIGCONT)

    def _signal(self, sig: int) -> None:
        if not self.running:
            raise RedisLaunchError(f"redis-server on port {self.port} is not running; nothing to send "
                                   f"{signal.Signals(sig).name} to (start() it first)")
        os.killpg(self.proc.pid, sig)

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
    """``masters`` cluster-enabled redis-servers on loopback joined into one cluster, each master with
    ``replicas`` replicas (``nodes`` holds them all; which is a master is :meth:`roles`'s to say,
    since redis-cli picks)."""

    def __init__(self, masters: int = 3, *, replicas: int = 0, start_timeout: float = CLUSTER_START_S):
        if masters < 3:
            raise ValueError(f"RedisCluster(masters={masters}): redis-cli --cluster create needs at "
                             "least 3 masters; ask for 3 or more")
        if replicas < 0:
            raise ValueError(f"RedisCluster(replicas={replicas}): give 0 (masters only) or more replicas per master")
        self.masters = masters
        self.replicas = replicas
        self.start_timeout = start_timeout
        self.nodes: list[RedisServer] = []
        self.workdir: Path | None = None
        self.create_argv: list[str] = []

    @property
    def ports(self) -> list[int]:
        return [n.port for n in self.nodes]

    @property
    def urls(self) -> list[str]:
        """One ``redis://127.0.0.1:PORT/0`` per node (masters and replicas)."""
        return [n.url for n in self.nodes]

    @property
    def url(self) -> str:
        """The first node's URL (a cluster client discovers the others from it)."""
        return self.urls[0]

    def roles(self) -> dict[int, str]:
        """Each node's role now, by port: ``master``, ``slave``, or ``?`` for one that does not answer."""
        return {n.port: replication(n.port).get("role", "?") for n in self.nodes}

    def node(self, port: int) -> RedisServer:
        """The node of this cluster on ``port`` (RedisLaunchError naming the ports when none is)."""
        for n in self.nodes:
            if n.port == port:
                return n
        raise RedisLaunchError(f"no node of this cluster on port {port}; its nodes are on {self.ports}")

    def replicas_of(self) -> dict[int, list[int]]:
        """Master port -> the ports of the replicas that name it as their master now (a replica whose link
        is down included)."""
        out: dict[int, list[int]] = {}
        for n in self.nodes:
            info = replication(n.port)
            if info.get("role") == "slave" and info.get("master_port", "").isdigit():
                out.setdefault(int(info["master_port"]), []).append(n.port)
        return out

    def start(self) -> "RedisCluster":
        """Start the servers, create the cluster and wait for ``cluster_state:ok`` on every node."""
        require()
        self.workdir = Path(tempfile.mkdtemp(prefix="pcrediscluster-"))
        try:
            deadline = time.monotonic() + self.start_timeout
            for i in range(self.masters * (1 + self.replicas)):
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
        self.create_argv = create_cluster(self.ports, deadline, replicas=self.replicas)

    def cluster_info(self, port: int) -> dict[str, str]:
        """``CLUSTER INFO`` of the node on ``port``."""
        return cluster_info(port)

    def _wait_ok(self, deadline: float) -> None:
        wait_cluster_ok(self.ports, deadline, replicas=self.masters * self.replicas)

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


# --- Redis Sentinel -----------------------------------------------------------

class RedisSentinel(RedisServer):
    """One Redis Sentinel on a random loopback port watching the loopback master on ``master_port`` as
    ``service``; its config file (:func:`sentinel_config`, which Sentinel rewrites as it learns) is kept
    in its private directory (mode 0700: the file holds the master's password), removed by ``stop()``. ``password``: the master's; ``sentinel_password``:
    its own (None: none)."""

    def __init__(self, master_port: int, *, quorum: int, service: str = SENTINEL_SERVICE,
                 password: str | None = None, sentinel_password: str | None = None,
                 down_after_ms: int = SENTINEL_DOWN_AFTER_MS,
                 failover_timeout_ms: int = SENTINEL_FAILOVER_TIMEOUT_MS, start_timeout: float = 10.0):
        super().__init__(start_timeout=start_timeout, password=sentinel_password)
        self.master_port = master_port
        self.quorum = quorum
        self.service = service
        self.master_password = password
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self._config_port: int | None = None

    @property
    def config_path(self) -> Path:
        return self.workdir / "sentinel.conf"

    def _command(self) -> list[str]:
        # Written for each port a start tries; a restart() on the same port keeps what Sentinel rewrote.
        if self._config_port != self.port:
            self.config_path.write_text(sentinel_config(
                self.port, self.master_port, self.workdir, quorum=self.quorum, service=self.service,
                down_after_ms=self.down_after_ms, failover_timeout_ms=self.failover_timeout_ms,
                password=self.master_password, sentinel_password=self.password))
            self._config_port = self.port
        return sentinel_command(self.config_path)

    def master_addr(self) -> tuple[str, int] | None:
        """``SENTINEL GET-MASTER-ADDR-BY-NAME``: where this sentinel says the master is now (None: it
        does not answer, or knows no such master)."""
        try:
            r = self.cli("sentinel", "get-master-addr-by-name", self.service, timeout=2.0)
        except subprocess.TimeoutExpired:
            return None
        got = r.stdout.split()
        return (got[0], int(got[1])) if r.returncode == 0 and len(got) == 2 and got[1].isdigit() else None

    def master_state(self) -> dict[str, str]:
        """``SENTINEL MASTER``: this sentinel's view of the master (flags, num-slaves, num-other-sentinels ...)."""
        try:
            return parse_pairs(self.cli("sentinel", "master", self.service, timeout=2.0).stdout)
        except subprocess.TimeoutExpired:
            return {}


class SentinelSet:
    """A master, ``replicas`` replicas of it and ``sentinels`` Redis Sentinels watching it, all on
    loopback; use as a context manager or call start/stop.

    ``start()`` returns once every replica is in sync and every sentinel names the master, knows the
    other sentinels and the replicas (so a failover can be agreed on at once). ``url`` is the
    ``redis+sentinel://`` URL of the set (with ``password``, if given). ``servers[0]`` is the server
    started as master; after a failover :meth:`wait_master` says which one is. With ``sentinel_auth``
    the sentinels require the same password (the URL's ``?sentinel_auth=yes``). ``stop()`` ends the
    sentinels first (so that none fails over while the servers end), then the servers, and removes
    every private directory.
    """

    def __init__(self, sentinels: int = SENTINELS, *, replicas: int = 1, service: str = SENTINEL_SERVICE,
                 password: str | None = None, sentinel_auth: bool = False,
                 down_after_ms: int = SENTINEL_DOWN_AFTER_MS,
                 failover_timeout_ms: int = SENTINEL_FAILOVER_TIMEOUT_MS,
                 start_timeout: float = SENTINEL_START_S):
        if sentinels < 1 or replicas < 0:
            raise ValueError(f"SentinelSet(sentinels={sentinels}, replicas={replicas}): give 1 or more sentinels "
                             f"(3 for a quorum that survives one lost) and 0 or more replicas")
        if sentinel_auth and not password:
            raise ValueError("SentinelSet(sentinel_auth=True) gives the sentinels the servers' password: give password")
        self.n_sentinels = sentinels
        self.replicas = replicas
        self.service = service
        self.password = password
        self.sentinel_auth = sentinel_auth
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.start_timeout = start_timeout
        #: the servers, the one started as master first
        self.servers: list[RedisServer] = []
        self.sentinels: list[RedisSentinel] = []

    @property
    def quorum(self) -> int:
        """Sentinels that must deem the master down before a failover: a majority."""
        return self.n_sentinels // 2 + 1

    @property
    def sentinel_ports(self) -> list[int]:
        return [s.port for s in self.sentinels]

    @property
    def url(self) -> str:
        """``redis+sentinel://[:PASSWORD@]127.0.0.1:P1,.../SERVICE/0`` (the password in it: mask it to print)."""
        auth = "?sentinel_auth=yes" if self.sentinel_auth else ""
        return sentinel_url_for(self.sentinel_ports, self.service, password=self.password) + auth

    def server(self, port: int) -> RedisServer:
        """The server of this set on ``port`` (RedisLaunchError naming the ports when none is)."""
        for srv in self.servers:
            if srv.port == port:
                return srv
        raise RedisLaunchError(f"no server of this Sentinel set on port {port}; its servers are on "
                               f"{[s.port for s in self.servers]}")

    def master_addrs(self) -> dict[int, tuple[str, int] | None]:
        """Where each running sentinel says the master is, by sentinel port."""
        return {s.port: s.master_addr() for s in self.sentinels if s.running}

    def wait_master(self, *, other_than: int | None = None, timeout: float) -> int:
        """The master's port once every running sentinel names the same one (not ``other_than``: the one
        killed), and it says it is a master; RedisLaunchError with their answers after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        addrs: dict = {}
        role = None
        while time.monotonic() < deadline:
            addrs = self.master_addrs()
            named = set(addrs.values())
            if len(named) == 1 and None not in named:
                port = next(iter(named))[1]
                if port != other_than:
                    role = replication(port, password=self.password).get("role")
                    if role == "master":
                        return port
            time.sleep(_POLL_S)
        raise RedisLaunchError(f"the sentinels of {self.service!r} did not agree on a master "
                               f"{'other than port ' + str(other_than) + ' ' if other_than else ''}within "
                               f"{timeout:g} s (sentinel port: master named = {addrs}; its role: {role}); "
                               f"the first sentinel's log ends: {self._sentinel_log()!r}")

    def _sentinel_log(self) -> str:
        return self.sentinels[0].log_tail(600) if self.sentinels else ""

    def start(self) -> "SentinelSet":
        """Start the master, its replicas, wait for them to sync, start the sentinels and wait until each
        knows the whole set (bounded by ``start_timeout``); on failure nothing is left running."""
        require()
        deadline = time.monotonic() + self.start_timeout

        def left() -> float:
            return max(1.0, deadline - time.monotonic())
        try:
            master = RedisServer(password=self.password, start_timeout=left()).start()
            self.servers.append(master)
            for _ in range(self.replicas):
                self.servers.append(RedisServer(replicaof=master.port, password=self.password,
                                                start_timeout=left()).start())
            self._wait_synced(deadline)
            for _ in range(self.n_sentinels):
                self.sentinels.append(RedisSentinel(
                    master.port, quorum=self.quorum, service=self.service, password=self.password,
                    sentinel_password=self.password if self.sentinel_auth else None,
                    down_after_ms=self.down_after_ms, failover_timeout_ms=self.failover_timeout_ms,
                    start_timeout=left()).start())
            self._wait_sentinels(master.port, deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_synced(self, deadline: float) -> None:
        infos: dict[int, dict] = {}
        while time.monotonic() < deadline:
            infos = {s.port: replication(s.port, password=self.password) for s in self.servers[1:]}
            if all(in_sync(i) for i in infos.values()):
                if self.replicas:
                    self.servers[0].replicated(self.replicas, timeout=max(0.5, deadline - time.monotonic()))
                return
            time.sleep(_POLL_S)
        raise RedisLaunchError(f"the replicas of 127.0.0.1:{self.servers[0].port} did not sync in the start budget "
                               f"(port: master_link_status = {({p: i.get('master_link_status') for p, i in infos.items()})}); "
                               f"the first replica's log ends: {self.servers[1].log_tail(600)!r}")

    def _wait_sentinels(self, master_port: int, deadline: float) -> None:
        try:
            wait_sentinels(self.sentinel_ports, master_port, deadline, service=self.service,
                           replicas=self.replicas, password=self.password if self.sentinel_auth else None)
        except RedisLaunchError as e:
            raise RedisLaunchError(f"{e}; the first sentinel's log ends: {self._sentinel_log()!r}") from None

    def stop(self) -> None:
        """End the sentinels, then the servers, and remove their directories."""
        for s in self.sentinels + self.servers:
            s.stop()

    def __enter__(self) -> "SentinelSet":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (f"SentinelSet(servers={[s.port for s in self.servers]}, sentinels={self.sentinel_ports}, "
                f"service={self.service!r})")


# --- a cluster on another host (a cluster testbed's directory host) ------------------------------------

#: What ``create-cluster`` prints once every node says its cluster is ok (the lab's readiness pattern).
CLUSTER_READY = "peercache redis cluster: ready"
#: What ``sentinel`` prints once its set is ready, before the URL to use.
SENTINEL_READY = "peercache redis sentinel: ready"
#: What ``wait-sentinels`` prints once the replicas are in sync and every sentinel sees the whole set.
SENTINELS_SEE_ALL = "peercache redis sentinels: ready"


def auth_args(password: str | None) -> list[str]:
    """redis-cli's arguments that give it ``password`` (none without one); put them before the command."""
    return ["-a", password, "--no-auth-warning"] if password else []


_auth = auth_args


def create_cluster(ports: list[int], deadline: float, *, host: str = LOOPBACK,
                   password: str | None = None, replicas: int = 0) -> list[str]:
    """Join the cluster-enabled servers on ``host``:``ports`` into a cluster, ``replicas`` per master (the
    argv it ran; RedisLaunchError, with redis-cli's words, when it did not finish in time or failed)."""
    argv = cluster_create_command(ports, host=host, replicas=replicas)
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


def wait_cluster_ok(ports: list[int], deadline: float, *, host: str = LOOPBACK, password: str | None = None,
                    replicas: int = 0) -> None:
    """Wait until every node says ``cluster_state:ok`` with every slot assigned and every node known,
    and ``replicas`` of them are replicas in sync with their masters, each sent its master's writes
    (:func:`replicated`)."""
    last: dict[int, dict[str, str]] = {}
    synced = 0
    while time.monotonic() < deadline:
        last = {p: cluster_info(p, host=host, password=password) for p in ports}
        if all(i.get("cluster_state") == "ok" and i.get("cluster_slots_assigned") == str(CLUSTER_SLOTS)
               and i.get("cluster_known_nodes") == str(len(ports)) for i in last.values()):
            synced = sum(in_sync(replication(p, host=host, password=password)) for p in ports) if replicas else 0
            if synced >= replicas:
                for p in ports:
                    info = replication(p, host=host, password=password)
                    n = info.get("connected_slaves", "0")
                    if info.get("role") == "master" and n.isdigit() and int(n):
                        replicated(p, int(n), timeout=max(0.5, deadline - time.monotonic()), host=host,
                                   password=password, cluster=True)
                return
        time.sleep(_POLL_S * 2)
    states = {p: (i.get("cluster_state"), i.get("cluster_slots_assigned"), i.get("cluster_known_nodes"))
              for p, i in last.items()}
    raise RedisLaunchError(f"Redis Cluster on {host} ports {ports} not ok in its start budget "
                           f"(port: (state, slots assigned, known nodes) = {states}; replicas in sync: "
                           f"{synced} of {replicas})")


def create_cluster_command(python: list[str], host: str, ports: list[int], password: str | None,
                           timeout: float, replicas: int = 0) -> list[str]:
    """argv of :func:`main`'s ``create-cluster`` run with ``python`` (the lab starts it on the directory host)."""
    return [*python, "-m", "peercache.lab.launch.redis", "create-cluster", "--host", host,
            "--ports", ",".join(map(str, ports)), "--timeout", f"{timeout:g}",
            *(["--replicas", str(replicas)] if replicas else []),
            *(["--password", password] if password else [])]


def sentinel_state(port: int, service: str, *, host: str = LOOPBACK, password: str | None = None) -> dict[str, str]:
    """``SENTINEL MASTER service`` of the sentinel on ``host``:``port`` (empty when it does not answer)."""
    try:
        r = subprocess.run(cli_command(port, *_auth(password), "sentinel", "master", service, host=host),
                           capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=2.0)
    except subprocess.TimeoutExpired:
        return {}
    return parse_pairs(r.stdout) if r.returncode == 0 else {}


def wait_sentinels(sentinel_ports: list[int], master_port: int, deadline: float, *, host: str = LOOPBACK,
                   service: str = SENTINEL_SERVICE, replicas: int = 1, password: str | None = None) -> None:
    """Wait until every sentinel on ``host``:``sentinel_ports`` names ``master_port`` as ``service``'s master
    and knows the other sentinels and ``replicas`` replicas, so that a failover can be agreed on at once
    (sentinels announce themselves every 2 s); ``password``: the sentinels' own, if they have one."""
    want = {"flags": "master", "num-other-sentinels": str(len(sentinel_ports) - 1),
            "num-slaves": str(replicas), "port": str(master_port)}
    seen: dict[int, dict] = {}
    while time.monotonic() < deadline:
        seen = {p: sentinel_state(p, service, host=host, password=password) for p in sentinel_ports}
        if all(all(st.get(k) == v for k, v in want.items()) for st in seen.values()):
            return
        time.sleep(_POLL_S * 2)
    got = {p: {k: st.get(k) for k in want} for p, st in seen.items()}
    raise RedisLaunchError(f"the sentinels did not all see the master, each other and the replicas in the "
                           f"start budget (want {want}; sentinel port: what it sees = {got})")


def wait_replicas_online(master_port: int, replicas: int, deadline: float, *, host: str = LOOPBACK,
                         password: str | None = None) -> None:
    """Wait until the master on ``host``:``master_port`` has ``replicas`` replicas online (in sync)."""
    info: dict[str, str] = {}
    while time.monotonic() < deadline:
        info = replication(master_port, host=host, password=password)
        online = sum("state=online" in v for k, v in info.items() if k.startswith("slave") and k[5:].isdigit())
        if online >= replicas:
            return
        time.sleep(_POLL_S)
    raise RedisLaunchError(f"the master {host}:{master_port} has not {replicas} replicas online in the start "
                           f"budget (its INFO replication: {info})")


def wait_sentinels_command(python: list[str], host: str, sentinel_ports: list[int], master_port: int,
                           timeout: float, *, service: str = SENTINEL_SERVICE, replicas: int = 1,
                           password: str | None = None) -> list[str]:
    """argv of :func:`main`'s ``wait-sentinels`` run with ``python`` (the lab starts it on the directory host
    once the master, its replicas and the sentinels listen)."""
    return [*python, "-m", "peercache.lab.launch.redis", "wait-sentinels", "--host", host,
            "--sentinels", ",".join(map(str, sentinel_ports)), "--master-port", str(master_port),
            "--service", service, "--replicas", str(replicas), "--timeout", f"{timeout:g}",
            *(["--password", password] if password else [])]


def main(argv: list[str] | None = None) -> int:
    """``python -m peercache.lab.launch.redis create-cluster --host H --ports P1,P2,P3 [--replicas N]
    [--password PW]``: join the cluster-enabled servers the lab started on a cluster testbed's directory
    host, wait until every node is ok, print CLUSTER_READY, then hold until SIGTERM or SIGINT (the group
    runner stops it with the servers).

    ``python -m peercache.lab.launch.redis sentinel [--sentinels 3] [--replicas 1] [--service NAME]
    [--password PW]``: start a master, its replicas and the sentinels on loopback (:class:`SentinelSet`),
    print SENTINEL_READY with the ``--directory redis+sentinel://...`` to give serve and drive (the
    password masked), hold until SIGTERM or SIGINT (Ctrl-C), then stop them all.

    ``python -m peercache.lab.launch.redis wait-sentinels --host H --sentinels S1,S2,S3 --master-port M
    [--replicas 1] [--service NAME] [--password PW]``: wait until the master the lab started on a host has its
    replicas in sync and every sentinel sees the master, the replicas and the others, print SENTINELS_SEE_ALL,
    then hold until SIGTERM or SIGINT (the lab's directory_faults points start it after the processes)."""
    p = argparse.ArgumentParser(prog="python -m peercache.lab.launch.redis")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("create-cluster", help="join cluster-enabled servers into one cluster, then hold")
    c.add_argument("--host", required=True, help="the servers' address")
    c.add_argument("--ports", required=True, help="P1,P2,P3: the servers' ports (3 or more masters)")
    c.add_argument("--replicas", type=int, default=0, help="replicas per master [%(default)s]")
    c.add_argument("--password", default=None, help="their requirepass")
    c.add_argument("--timeout", type=float, default=30.0, help="seconds to create and see it ok [%(default)s]")
    s = sub.add_parser("sentinel", help="start a master, replicas and sentinels on loopback, print the "
                                        "redis+sentinel:// URL, hold until Ctrl-C, then stop them")
    s.add_argument("--sentinels", type=int, default=SENTINELS, help="sentinels [%(default)s]")
    s.add_argument("--replicas", type=int, default=1, help="replicas of the master [%(default)s]")
    s.add_argument("--service", default=SENTINEL_SERVICE, help="the master's name at the sentinels [%(default)s]")
    s.add_argument("--password", default=None, help="the servers' requirepass (default: none)")
    s.add_argument("--sentinel-auth", action="store_true", help="the sentinels require the password too")
    s.add_argument("--timeout", type=float, default=SENTINEL_START_S, help="seconds to start it [%(default)s]")
    w = sub.add_parser("wait-sentinels", help="wait until a master's replicas are in sync and every sentinel "
                                              "sees the master, the replicas and each other, then hold")
    w.add_argument("--host", required=True, help="the servers' and sentinels' address")
    w.add_argument("--sentinels", required=True, help="S1,S2,S3: the sentinels' ports")
    w.add_argument("--master-port", type=int, required=True, help="the master's port")
    w.add_argument("--service", default=SENTINEL_SERVICE, help="the master's name at the sentinels [%(default)s]")
    w.add_argument("--replicas", type=int, default=1, help="replicas of the master [%(default)s]")
    w.add_argument("--password", default=None, help="the master's and replicas' requirepass")
    w.add_argument("--timeout", type=float, default=SENTINEL_START_S, help="seconds to see it ready [%(default)s]")
    a = p.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if a.cmd == "sentinel":
        return _hold_sentinel_set(a, stop)
    if a.cmd == "wait-sentinels":
        return _hold_sentinels_seen(a, stop)
    ports = [int(x) for x in a.ports.split(",") if x]
    deadline = time.monotonic() + a.timeout
    try:
        create_cluster(ports, deadline, host=a.host, password=a.password, replicas=a.replicas)
        wait_cluster_ok(ports, deadline, host=a.host, password=a.password, replicas=a.replicas * len(ports)
                        // (1 + a.replicas))
    except (RedisLaunchError, OSError, subprocess.SubprocessError) as e:
        print(f"create-cluster: {e}", file=sys.stderr, flush=True)
        return 1
    print(f"{CLUSTER_READY} on {a.host} ports {','.join(map(str, ports))}", flush=True)
    stop.wait()
    return 0


def _hold_sentinels_seen(a, stop: threading.Event) -> int:
    """``wait-sentinels``: the replicas in sync, then every sentinel seeing the whole set; say so, hold until
    ``stop`` (the processes are the lab's to stop)."""
    sentinels = [int(x) for x in a.sentinels.split(",") if x]
    deadline = time.monotonic() + a.timeout
    try:
        wait_replicas_online(a.master_port, a.replicas, deadline, host=a.host, password=a.password)
        wait_sentinels(sentinels, a.master_port, deadline, host=a.host, service=a.service, replicas=a.replicas)
    except (RedisLaunchError, OSError, subprocess.SubprocessError) as e:
        print(f"wait-sentinels: {e}", file=sys.stderr, flush=True)
        return 1
    print(f"{SENTINELS_SEE_ALL}: master {a.host}:{a.master_port}, sentinels {a.sentinels} (service {a.service})",
          flush=True)
    stop.wait()
    return 0


def _hold_sentinel_set(a, stop: threading.Event) -> int:
    """``sentinel``: start the set, say how to use it, hold until ``stop``, stop it (on every path)."""
    # Here, not at the top: this module imports only the standard library (create-cluster runs on a
    # testbed's directory host), and importing the peercache package loads the engine.
    from peercache.redact import redact
    try:
        ss = SentinelSet(a.sentinels, replicas=a.replicas, service=a.service, password=a.password,
                         sentinel_auth=a.sentinel_auth, start_timeout=a.timeout)
    except ValueError as e:
        print(f"sentinel: {e}", file=sys.stderr, flush=True)
        return 2
    try:
        ss.start()
    except (RedisLaunchError, RedisUnavailable, OSError, subprocess.SubprocessError) as e:
        print(f"sentinel: {e}", file=sys.stderr, flush=True)
        return 1
    try:
        url = redact(ss.url)
        print(f"{SENTINEL_READY}: master 127.0.0.1:{ss.servers[0].port}, replicas "
              f"{','.join(str(x.port) for x in ss.servers[1:]) or 'none'}, sentinels "
              f"{','.join(map(str, ss.sentinel_ports))} (down-after {ss.down_after_ms} ms, failover-timeout "
              f"{ss.failover_timeout_ms} ms)", flush=True)
        if a.password:
            print("  (*** is the --password given: put it in the URL, or in $PEERCACHE_REDIS_PASSWORD and "
                  "drop ':***@' from it)", flush=True)
        print(f"  peercache-bench serve --directory '{url}' --readers 1", flush=True)
        print(f"  peercache-bench drive --directory '{url}'", flush=True)
        print(f"  kill the master to see a failover: kill -KILL {ss.servers[0].pid}; Ctrl-C ends them all",
              flush=True)
        stop.wait()
    finally:
        ss.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
