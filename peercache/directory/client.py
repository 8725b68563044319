"""Directory clients: one interface to the embedded directory and to Redis / Redis Cluster.

Public entry point (used by :class:`~peercache.node.Node` and by the directory bench)::

    connect_directory(spec: str, *, timeout: float = DEFAULT.directory_s, auth=None,
                      heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT) -> DirectoryClient

``spec`` picks the backend: ``HOST:PORT`` (or a zmq URL) is the embedded
directory hosted by the discovery node / ``peercache-bench meta`` at that
address; ``redis://[USER:PASSWORD@]HOST:PORT/DB``, ``rediss://...`` (TLS) and
``redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]`` (the master Redis
Sentinel names) are the Redis backend (:mod:`peercache.directory.redis.backend`; a Redis
Cluster is found by asking the server, or forced with ``?cluster=yes|no``).

Every client answers the directory's ops as typed methods (:class:`~.ops.DirectoryOps`):
``register``, ``heartbeat`` (``renew``: its whole reply, a :class:`Heartbeat`), ``leave``,
``members``, ``publish``, ``lookup`` (a :class:`LookupResult`), ``unpublish``; each sends the
message it always did through the surface both backends share with :class:`~peercache.rpc.RpcClient`,
``call(op, timeout=None, **fields) -> dict`` (the same request and reply fields whichever
backend answers them: ``lookup`` with ``recs=True`` answers fixed LOC_DTYPE records
``{recs, nids, epoch[, missing][, nodes]}`` on both, without it the 8-field ``locs``
lists), which also carries any extra op a node serves (serve's ``reader_done``); a
directory that cannot be reached raises :class:`~peercache.errors.DiscoveryUnreachable`,
a refused request :class:`~peercache.errors.RpcError`. Besides those:

- ``clone()``: a second client to the same directory with its own connection
  (the heartbeat thread's, so a heartbeat never waits behind a big request);
- ``serve_op(op, fn, owner_only=True)``: answer an extra op (Redis only; the
  embedded directory serves extra ops on the discovery node's own RPC server);
- ``host``: the host a producer bound to a wildcard address is reached at;
- ``address``: the spec as given, with any password masked (for messages);
- ``close()``.
"""
from __future__ import annotations

from typing import Callable, Protocol, Sequence

from .service import DEFAULT_HEARTBEAT_TIMEOUT
from ..address import host_of
from ..errors import ConfigError
from ..redact import redact
from ..rpc import RpcClient
from ..timeouts import DEFAULT
from .ops import DirectoryOps, Heartbeat, LookupResult, Members, Published, Registration
from .redis.url import FORMS, is_redis


class DirectoryClient(Protocol):
    """What :class:`~peercache.node.Node` needs of a directory backend (see the module doc)."""

    kind: str
    address: str
    host: str
    timeout: float

    def call(self, op: str, timeout: float | None = None, **fields) -> dict: ...

    def register(self, info: dict, node_id: str | None = None, token: str | None = None) -> Registration: ...

    def heartbeat(self, node_id: str, token: str | None) -> bool: ...

    def renew(self, node_id: str, token: str | None) -> Heartbeat: ...

    def leave(self, node_id: str, token: str | None, timeout: float | None = None) -> None: ...

    def members(self, timeout: float | None = None) -> Members: ...

    def publish(self, node_id: str, token: str | None, keys: list, locs: list,
                unpublish: list | None = None) -> Published: ...

    def unpublish(self, node_id: str, token: str | None, keys: list) -> int: ...

    def lookup(self, keys: Sequence[bytes], *, recs: bool = True, epoch: int | None = None,
               timeout: float | None = None) -> LookupResult: ...

    def clone(self) -> "DirectoryClient": ...

    def serve_op(self, op: str, fn: Callable[[dict], dict], owner_only: bool = True) -> None: ...

    def close(self) -> None: ...


class EmbeddedDirectory(DirectoryOps):
    """The embedded directory: requests over :class:`RpcClient` to the discovery node at ``addr``."""

    kind = "embedded"

    def __init__(self, addr: str, *, timeout: float = DEFAULT.directory_s, auth=None):
        self.address = addr
        self.auth = auth
        self.rpc = RpcClient(addr, timeout=timeout, what="discovery", auth=auth)
        self.host = host_of(addr)

    @property
    def timeout(self) -> float:
        return self.rpc.timeout

    def call(self, op: str, timeout: float | None = None, **fields) -> dict:
        return self.rpc.call(op, timeout=timeout, **fields)

    def clone(self) -> "EmbeddedDirectory":
        return EmbeddedDirectory(self.address, timeout=self.rpc.timeout, auth=self.auth)

    def serve_op(self, op: str, fn, owner_only: bool = True) -> None:
        raise ConfigError(f"the embedded directory at {self.address} serves extra ops on the node that "
                          "hosts discovery (Node.add_handler there), not through a client")

    def close(self) -> None:
        self.rpc.close()


def connect_directory(spec: str, *, timeout: float = DEFAULT.directory_s, auth=None,
                      heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT) -> DirectoryClient:
    """A client of the directory named by ``spec`` (see the module doc).

    ``auth``: the cluster's CURVE keys (embedded directory only; a Redis
    directory is protected by its password / ACL). ``heartbeat_timeout``:
    with Redis, the TTL of this node's membership key (renewed by each
    heartbeat); the embedded directory uses its host's own timeout.
    Raises DiscoveryUnreachable naming ``spec`` when a Redis directory does
    not answer, ConfigError for a spec that is neither form.
    """
    if not isinstance(spec, str) or not spec:
        raise ConfigError(f"directory {redact(spec)!r} is neither HOST:PORT (the embedded directory) nor {FORMS}")
    if is_redis(spec):
        # here, not at the top: the Redis backend brings redis-py and hiredis, which a node on the
        # embedded directory never loads
        from .redis.backend import RedisDirectory
        return RedisDirectory(spec, timeout=timeout, heartbeat_timeout=heartbeat_timeout)
    if "://" in spec and not spec.startswith(("tcp://", "ipc://", "inproc://")):
        raise ConfigError(f"directory {redact(spec)!r}: unknown scheme; use HOST:PORT (embedded) or {FORMS}")
    return EmbeddedDirectory(spec, timeout=timeout, auth=auth)
