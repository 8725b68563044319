"""How the Redis directory talks to Redis: its connection (one Redis or a cluster, found by
asking the server), one pipelined round trip per request with the scripts loaded again after a
Redis restart, and what a failure means to the caller (:class:`DiscoveryUnreachable` or
:class:`RpcError`, each saying what to check)."""
from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ...errors import ConfigError, DiscoveryUnreachable, PeerCacheError, RpcError
from .scripts import SCRIPTS, load_script
from .url import PASSWORD_ENV

#: One logger for the whole Redis backend, whichever of its modules logs.
# The logger keeps the name it had before the backend became a subpackage: log filters and
# handlers set up for it go on working.
log = logging.getLogger("peercache.directory.redis_backend")


def once_on_a_broken_connection() -> Retry:
    """redis-py's retry policy here: a command is sent once more on a fresh connection when the pooled
    one turned out broken (a restarted Redis), never after a timeout, so each call waits at most its
    socket timeout: a stopped Redis ends a call after one timeout, not two."""
    return Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,))


def timed_out(e: BaseException) -> bool:
    """Whether ``e`` is a socket timeout (SO_RCVTIMEO's EAGAIN, socket.timeout or redis-py's)."""
    return isinstance(e, (TimeoutError, BlockingIOError, redis.exceptions.TimeoutError))


class RedisConnection:
    """The connection part of :class:`~.backend.RedisDirectory`, which it is mixed into
    (it uses the directory's ``cfg``, ``address``, ``timeout``, ``cluster``, ``r`` and ``_sha``)."""

    def _kwargs(self) -> dict:
        c = self.cfg
        kw: dict[str, Any] = dict(username=c.username, password=c.password, socket_timeout=self.timeout,
                                  socket_connect_timeout=min(self.timeout, 2.0),
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
            if cluster is None:
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
                                       require_full_coverage=True, **{k: v for k, v in kw.items()
                                                                      if k != "retry"})
            else:
                r = redis.Redis(host=c.host, port=c.port, db=c.db, **kw)
                r.ping()
            self.cluster = bool(cluster)
            self._load_scripts(r)
            return r
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError) as e:
            raise self._unreachable("connect", e) from None

    def _load_scripts(self, r) -> None:
        """Load every script into ``r`` (on each primary of a cluster) and remember their SHAs."""
        for name, src in SCRIPTS.items():
            self._sha[name] = load_script(r, src, self.cluster)

    def _unreachable(self, op: str, e: BaseException) -> PeerCacheError:
        """The error to raise for ``e`` during ``op``: refused credentials, a refused command, or no answer."""
        if isinstance(e, (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError)) or \
                "NOAUTH" in str(e) or "WRONGPASS" in str(e):
            return DiscoveryUnreachable(
                f"directory {self.address} refused the credentials during {op!r} ({e}); put the password in "
                f"the URL (redis://:PASSWORD@HOST:PORT/DB) or in ${PASSWORD_ENV}")
        if isinstance(e, redis.exceptions.ResponseError) and not isinstance(e, redis.exceptions.ClusterDownError):
            return RpcError(f"directory {self.address} refused {op!r}: {e}")
        if timed_out(e):
            return DiscoveryUnreachable(
                f"directory {self.address} unreachable during {op!r}: no answer within {self.timeout:g} s; "
                "check that redis-server is running there and not stopped or overloaded")
        return DiscoveryUnreachable(
            f"directory {self.address} unreachable during {op!r}: {type(e).__name__}: {e}; check that "
            "redis-server is running there and that the URL's host, port and password are right")

    def _pipe(self, op: str, build: Callable[[Any], None]) -> list:
        """Run the commands ``build`` queues as one pipelined round trip; scripts reloaded once if
        the server lost them (a restart). Raises DiscoveryUnreachable / RpcError."""
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

