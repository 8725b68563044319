"""How the Redis directory talks to Redis: its connection (one Redis, a cluster found by asking
the server, or the master Redis Sentinel names), one pipelined round trip per request with the
scripts loaded again after a Redis restart or a failover, and what a failure means to the caller
(:class:`DiscoveryUnreachable` or :class:`RpcError`, each saying what to check).

With Sentinel (``redis+sentinel://``) every new connection asks the sentinels where the master is
(redis-py's ``Sentinel.master_for``), so a failover is followed: a call on a connection to the old
master fails (refused, closed, or READONLY once it is a replica: redis-py then drops the connection),
is sent once more on a fresh connection to whatever master the sentinels name by then, and otherwise
raises :class:`DiscoveryUnreachable` saying so. Nothing waits for the failover: each call ends
within its bounds (see :func:`sentinel_timeout`), and the caller's next call finds the new master.
A master stopped past its failover and then continued still answers as a master, on the connections
opened to it before, until Sentinel makes it a replica (about 10 s later): so each heartbeat, and
any other call at most every ``MASTER_CHECK_S``, first asks the sentinels which server is the master
and drops the idle connections to any other (:meth:`RedisConnection._follow_master`).

A Redis Cluster is followed by redis-py's RedisCluster: a command that fails on a connection error
or a timeout asks for a topology refresh (CLUSTER SLOTS from another node, the failed one last) and
is sent once more on the slot map it brings, so once a replica has taken over a dead master's slots
the next call reaches it. Each socket wait is a third of the call's bound (:func:`cluster_socket_timeout`).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Sequence

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel

from ...errors import ConfigError, DiscoveryUnreachable, PeerCacheError, RpcError
from .scripts import SCRIPTS, load_script
from .url import PASSWORD_ENV, SENTINEL_FORM

#: One logger for the whole Redis backend, whichever of its modules logs.
# The logger keeps the name it had before the backend became a subpackage: log filters and
# handlers set up for it go on working.
log = logging.getLogger("peercache.directory.redis_backend")

#: Seconds between two checks, by one client's calls other than heartbeats, that its connections reach the
#: master the sentinels name (a heartbeat checks every time): one sentinel round trip at most this often.
MASTER_CHECK_S = 1.0


def once_on_a_broken_connection() -> Retry:
    """redis-py's retry policy here: a command is sent once more on a fresh connection when the pooled
    one turned out broken (a restarted Redis), never after a timeout, so each call waits at most its
    socket timeout: a stopped Redis ends a call after one timeout, not two."""
    return Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,))


def sentinel_timeout(directory_s: float, sentinels: int) -> float:
    """One sentinel's bound on connecting and answering, so that asking every sentinel where the master
    is, twice (a connection's one retry), ends within one directory request's bound ``directory_s``
    even when every sentinel is silent (stopped, or cut off); an answering sentinel takes a millisecond."""
    return directory_s / (2 * max(1, sentinels))


#: Socket waits one call on a Redis Cluster may make in turn when a master hangs: its first attempt,
#: the topology refresh's query of a node that may hang too, and its one retry.
CLUSTER_WAITS = 3


def cluster_socket_timeout(directory_s: float) -> float:
    """One socket wait's bound (connecting, or a reply) on a Redis Cluster, so that a call's
    :data:`CLUSTER_WAITS` waits end within one directory request's bound ``directory_s``: redis-py's
    cluster client retries a timeout too (its retry count is all it takes from a Retry), unlike a
    Redis client given :func:`once_on_a_broken_connection`."""
    return directory_s / CLUSTER_WAITS


def timed_out(e: BaseException) -> bool:
    """Whether ``e`` is a socket timeout (SO_RCVTIMEO's EAGAIN, socket.timeout or redis-py's)."""
    return isinstance(e, (TimeoutError, BlockingIOError, redis.exceptions.TimeoutError))


class RedisConnection:
    """The connection part of :class:`~.backend.RedisDirectory`, which it is mixed into
    (it uses the directory's ``cfg``, ``address``, ``timeout``, ``cluster``, ``r``, ``_sha`` and
    ``_slot_refresher``)."""

    def _kwargs(self, cluster: bool = False) -> dict:
        """redis-py's keyword arguments for a connection to a Redis server (the master with Sentinel), or
        to the nodes of a Redis Cluster (``cluster``: shorter socket waits, :func:`cluster_socket_timeout`)."""
        c = self.cfg
        wait = cluster_socket_timeout(self.timeout) if cluster else self.timeout
        kw: dict[str, Any] = dict(username=c.username, password=c.password, socket_timeout=wait,
                                  socket_connect_timeout=min(wait, 2.0),
                                  retry=once_on_a_broken_connection(), health_check_interval=0)
        if c.ssl:
            kw["ssl"] = True
            kw.update(c.ssl_options)
        return kw

    def _connect(self, cluster: bool | None):
        """A redis-py client of the URL's server (a cluster when ``cluster``, or when the server says
        so), with the scripts loaded."""
        c = self.cfg
        kw = self._kwargs()
        try:
            if cluster is None:
                cluster = c.cluster
            if c.sentinels:
                cluster = False       # the sentinels name one master (the URL refuses ?cluster)
            elif cluster is None:
                probe = redis.Redis(host=c.host, port=c.port, db=c.db, **kw)
                try:
                    cluster = str(probe.info("cluster").get("cluster_enabled", 0)) == "1"
                finally:
                    probe.close()
            if cluster:
                if c.db:
                    raise ConfigError(f"directory {self.address} is a Redis Cluster, which has only database 0; "
                                      "drop the /DB from the URL")
                r = redis.RedisCluster(host=c.host, port=c.port, retry=once_on_a_broken_connection(),
                                       require_full_coverage=True, **{k: v for k, v in self._kwargs(True).items()
                                                                      if k != "retry"})
            else:
                r = self._client()
                r.ping()
                if c.sentinels:       # where a producer listening on every interface is reached
                    self.host = r.connection_pool.master_address[0]
            self.cluster = bool(cluster)
            self._load_scripts(r)
            return r
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError) as e:
            raise self._unreachable("connect", e) from None

    def _refresh_slots_soon(self) -> None:
        """Have redis-py read the cluster's slot map again (CLUSTER SLOTS), on a helper thread, one at a
        time: for failures redis-py did not see (the lookup's own connections), so that the next call
        finds a replica that took over; the caller's call stays within its bound."""
        t = self._slot_refresher
        if self.cluster and (t is None or not t.is_alive()):
            self._slot_refresher = threading.Thread(target=self._refresh_slots_quietly, name="redis-slots",
                                                    daemon=True)
            self._slot_refresher.start()

    def _refresh_slots_quietly(self) -> None:
        try:
            self.r.nodes_manager.initialize()
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError) as e:
            # the next failure asks again; the calls themselves say what is wrong
            log.debug("reading the slot map of %s again: %s", self.address, e)

    def _sentinel(self) -> Sentinel:
        """The redis-py Sentinel of a ``redis+sentinel://`` URL, made once and shared by this client's
        connections: each sentinel asked within :func:`sentinel_timeout`, with the password only when
        the URL says ``?sentinel_auth=yes``."""
        if self._sentinels is None:
            c = self.cfg
            per = sentinel_timeout(self.timeout, len(c.sentinels))
            skw: dict[str, Any] = dict(socket_timeout=per, socket_connect_timeout=per)
            if c.sentinel_auth:
                skw.update(username=c.username, password=c.password)
            self._sentinels = Sentinel(list(c.sentinels), sentinel_kwargs=skw)
        return self._sentinels

    def _client(self, **overrides) -> redis.Redis:
        """A redis-py client of the URL's one Redis (not a cluster), with :meth:`_kwargs` and
        ``overrides``: the server the URL names, or the master of its sentinels (asked again by each
        new connection, so the client follows a failover)."""
        c = self.cfg
        kw = dict(self._kwargs(), **overrides)
        if c.sentinels:
            return self._sentinel().master_for(c.service, db=c.db, **kw)
        return redis.Redis(host=c.host, port=c.port, db=c.db, **kw)

    def _server_address(self) -> tuple[str, int]:
        """(host, port) of the one Redis to open a connection to now: the URL's, or the master the
        sentinels name (MasterNotFoundError when none does)."""
        c = self.cfg
        if c.sentinels:
            return self.r.connection_pool.get_master_address()
        return c.host, c.port

    def _follow_master(self, every: float = 0.0) -> None:
        """With Sentinel: ask the sentinels which server is the master now (one round trip to the first
        that answers) and close this client's idle connections to any other server, so the next call
        opens one to the master they name. Without it, a master that was stopped past its failover and
        continued took the producers' heartbeats on their old connections (as a master still) while
        their registrations expired on the new one: every entry read as a miss for about 10 s, until
        Sentinel made the old master a replica (the directory_faults scenario's sentinel/stop point).
        A node's calls go through more than one client (its heartbeats have their own), so every call
        checks, at most once every ``every`` seconds (0: now)."""
        if not self.cfg.sentinels:
            return
        now = time.monotonic()
        if every and now - self._master_checked < every:
            return
        self._master_checked = now
        pool = self.r.connection_pool
        try:
            master = tuple(pool.get_master_address())
        except (MasterNotFoundError, redis.RedisError) as e:
            raise self._unreachable("heartbeat", e) from None
        # redis-py keeps no public list of a pool's idle connections; each knows the server it reached
        stale = [c for c in list(getattr(pool, "_available_connections", []))
                 if getattr(c, "_sock", None) is not None and (c.host, c.port) != master]
        if stale:
            log.warning("directory %s: %d connection(s) to %s:%s, which is no longer the master the sentinels "
                     "name (%s:%s): closed", self.address, len(stale), stale[0].host, stale[0].port, *master)
            pool.disconnect(inuse_connections=False)

    def _close_sentinels(self) -> None:
        if self._sentinels is not None:
            try:
                self._sentinels.close()
            except Exception:   # closing broken connections: nothing left to release
                pass

    def _load_scripts(self, r) -> None:
        """Load every script into ``r`` (on each primary of a cluster) and remember their SHAs."""
        for name, src in SCRIPTS.items():
            self._sha[name] = load_script(r, src, self.cluster)

    def _unreachable(self, op: str, e: BaseException) -> PeerCacheError:
        """The error to raise for ``e`` during ``op``: no master named by the sentinels, refused
        credentials, a refused command, or no answer."""
        c = self.cfg
        if isinstance(e, MasterNotFoundError):
            if "NOAUTH" in str(e) or "WRONGPASS" in str(e) or "Authentication" in str(e):
                return DiscoveryUnreachable(
                    f"directory {self.address}: the sentinels refused the credentials during {op!r} ({e}); "
                    "sentinels with a requirepass are sent the URL's password with ?sentinel_auth=yes, "
                    "and it must be theirs too")
            return DiscoveryUnreachable(
                f"directory {self.address} unreachable during {op!r}: no sentinel named a master of service "
                f"{c.service!r} ({e}); they are failing over (call again shortly), none of them answers, or "
                f"none monitors {c.service!r}: check `redis-cli -h HOST -p PORT sentinel "
                f"get-master-addr-by-name {c.service}` on each sentinel")
        if isinstance(e, (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError)) or \
                "NOAUTH" in str(e) or "WRONGPASS" in str(e):
            return DiscoveryUnreachable(
                f"directory {self.address} refused the credentials during {op!r} ({e}); put the password in "
                f"the URL ({SENTINEL_FORM if c.sentinels else 'redis://:PASSWORD@HOST:PORT/DB'}) or in "
                f"${PASSWORD_ENV}")
        if isinstance(e, redis.exceptions.ResponseError) and not isinstance(e, redis.exceptions.ClusterDownError):
            return RpcError(f"directory {self.address} refused {op!r}: {e}")
        where = ("at the master the sentinels name (a failover may be under way: call again shortly)"
                 if c.sentinels else "there")
        if timed_out(e):
            wait = (f"{cluster_socket_timeout(self.timeout):.3g} s (a cluster node's share of the {self.timeout:g} s "
                    "bound)") if self.cluster else f"{self.timeout:g} s"
            return DiscoveryUnreachable(
                f"directory {self.address} unreachable during {op!r}: no answer within {wait}; "
                f"check that redis-server is running {where} and not stopped or overloaded")
        return DiscoveryUnreachable(
            f"directory {self.address} unreachable during {op!r}: {type(e).__name__}: {e}; check that "
            f"redis-server is running {where} and that the URL's host, port and password are right")

    def _pipe(self, op: str, build: Callable[[Any], None]) -> list:
        """Run the commands ``build`` queues as one pipelined round trip; scripts reloaded once if
        the server lost them (a restart). Raises DiscoveryUnreachable / RpcError."""
        self._follow_master(every=MASTER_CHECK_S)
        for attempt in (0, 1):
            try:
                pipe = self.r.pipeline(transaction=False)
                build(pipe)
                res = pipe.execute(raise_on_error=False)
            except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError) as e:
                raise self._unreachable(op, e) from None
            if attempt == 0 and any(isinstance(x, redis.exceptions.NoScriptError) for x in res):
                try:
                    self._load_scripts(self.r)
                except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError) as e:
                    raise self._unreachable(op, e) from None
                continue
            for x in res:
                if isinstance(x, Exception):
                    raise self._unreachable(op, x)
            return res
        raise AssertionError("unreachable")

    def _evalsha(self, pipe, name: str, keys: Sequence, args: Sequence) -> None:
        # execute_command: redis-py's cluster pipeline refuses its evalsha() method, not the command
        # (routed by the script's keys, which share one hash slot here).
        pipe.execute_command("EVALSHA", self._sha[name], len(keys), *keys, *args)

