"""Directory clients: one interface to the embedded directory and to Redis / Redis Cluster.

Public entry point (used by :class:`~peercache.node.Node` and by the directory bench)::

    connect_directory(spec: str, *, timeout: float = 5.0, auth=None,
                      heartbeat_timeout: float = 5.0) -> DirectoryClient

``spec`` picks the backend: ``HOST:PORT`` (or a zmq URL) is the embedded
directory hosted by the discovery node / ``peercache-bench meta`` at that
address; ``redis://[USER:PASSWORD@]HOST:PORT/DB`` and ``rediss://...`` (TLS)
are the Redis backend (:mod:`peercache.directory.redis_backend`; a Redis Cluster is found
by asking the server, or forced with ``?cluster=yes|no``).

Every client answers the directory's ops as typed methods (:class:`DirectoryOps`):
``register``, ``heartbeat``, ``leave``, ``members``, ``publish``, ``lookup`` (a
:class:`LookupResult`), ``unpublish``; each sends the message it always did through the
surface both backends share with :class:`~peercache.rpc.RpcClient`,
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

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from .service import DEFAULT_HEARTBEAT_TIMEOUT
from ..address import host_of
from ..errors import ConfigError
from ..rpc import RpcClient
from .redis_url import is_redis


@dataclass
class Registration:
    """A ``register`` reply: the node's id and token, the directory's epoch, its request limits
    (a map, see :meth:`peercache.rpc.Limits.from_dict`) and its table's announcement (or None)."""

    node_id: str
    epoch: int
    token: str | None = None
    limits: dict | None = None
    table: dict | None = None


@dataclass
class Published:
    """A ``publish`` reply: how many keys another node still owns, their indices in the request
    and the first few of them."""

    refused: int = 0
    refused_index: list = None
    refused_keys: list = None


@dataclass
class Members:
    """A ``members`` reply: node id -> info of the nodes present, as of ``epoch``; the embedded
    directory adds its table's announcement and member number -> node id (``nums``)."""

    nodes: dict | None
    epoch: int | None
    table: dict | None = None
    nums: dict | None = None


@dataclass
class LookupResult:
    """A ``lookup`` reply as it came (the node checks every field of it before trusting one).

    With ``records`` (asked with ``recs=True``): ``recs``, the LOC_DTYPE records of the keys
    found, in order, each ``node`` a member number; ``nids``, member number -> node id;
    ``missing``, the little-endian uint32 indices of the keys not found (None when none);
    ``nodes``, the infos of the nodes present, sent only when the caller's epoch was not the
    current one; ``epoch``. Without (a directory that answers the original form): ``locs``, an
    8-field list or None per key; ``nodes``; ``epoch``.
    """

    records: bool
    epoch: Any = None
    nodes: Any = None
    recs: Any = None
    nids: Any = None
    missing: Any = None
    locs: Any = None

    @classmethod
    def of(cls, reply: dict) -> "LookupResult":
        if "recs" in reply:
            return cls(True, reply.get("epoch"), reply.get("nodes"), reply["recs"], reply.get("nids"),
                       reply.get("missing"))
        return cls(False, reply["epoch"], reply["nodes"], locs=reply["locs"])


class DirectoryOps:
    """The directory's ops as methods: each is one ``call`` of the message it names, whichever
    backend answers it."""

    def call(self, op: str, timeout: float | None = None, **fields) -> dict:
        raise NotImplementedError

    def register(self, info: dict, node_id: str | None = None, token: str | None = None) -> Registration:
        """Register a node described by ``info`` (again, with the id and token it holds)."""
        again = {"node_id": node_id, "token": token} if node_id and token else {}
        reply = self.call("register", info=info, **again)
        return Registration(reply["node_id"], reply["epoch"], reply.get("token"), reply.get("limits"),
                            reply.get("table"))

    def heartbeat(self, node_id: str, token: str | None) -> bool:
        """Whether the directory still knows ``node_id`` (False: register again)."""
        return bool(self.call("heartbeat", node_id=node_id, token=token)["known"])

    def leave(self, node_id: str, token: str | None, timeout: float | None = None) -> None:
        self.call("leave", node_id=node_id, token=token, timeout=timeout)

    def members(self, timeout: float | None = None) -> Members:
        """The nodes present; ``timeout``: the wait (else the client's), e.g. what a read has left."""
        reply = self.call("members", timeout=timeout)
        return Members(reply.get("nodes"), reply.get("epoch"), reply.get("table"), reply.get("nums"))

    def publish(self, node_id: str, token: str | None, keys: list, locs: list,
                unpublish: list | None = None) -> Published:
        """Publish ``locs`` (8-field lists) of ``keys`` and unpublish the keys ``unpublish``."""
        reply = self.call("publish", node_id=node_id, token=token, keys=keys, locs=locs,
                          unpublish=[] if unpublish is None else unpublish)
        return Published(reply.get("refused") or 0, reply.get("refused_index") or [],
                         reply.get("refused_keys") or [])

    def unpublish(self, node_id: str, token: str | None, keys: list) -> int:
        """Unpublish ``keys``; how many were this node's."""
        return self.call("unpublish", node_id=node_id, token=token, keys=keys)["unpublished"]

    def lookup(self, keys: Sequence[bytes], *, recs: bool = True, epoch: int | None = None,
               timeout: float | None = None) -> LookupResult:
        """The locations of ``keys``: records (``recs``), with the nodes' infos when ``epoch`` (that
        of the infos the caller holds) is not the directory's. ``timeout``: the wait (else the
        client's), e.g. what a read has left; Redis bounds it by its socket timeout instead."""
        return LookupResult.of(self.call("lookup", keys=keys if isinstance(keys, list) else list(keys),
                                         recs=recs, epoch=epoch, timeout=timeout))


class DirectoryClient(Protocol):
    """What :class:`~peercache.node.Node` needs of a directory backend (see the module doc)."""

    kind: str
    address: str
    host: str
    timeout: float

    def call(self, op: str, timeout: float | None = None, **fields) -> dict: ...

    def register(self, info: dict, node_id: str | None = None, token: str | None = None) -> Registration: ...

    def heartbeat(self, node_id: str, token: str | None) -> bool: ...

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

    def __init__(self, addr: str, *, timeout: float = 5.0, auth=None):
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


def connect_directory(spec: str, *, timeout: float = 5.0, auth=None,
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
        raise ConfigError(f"directory {spec!r} is neither HOST:PORT (the embedded directory) nor "
                          "redis://HOST:PORT/DB / rediss://HOST:PORT/DB")
    if is_redis(spec):
        from .redis_backend import RedisDirectory
        return RedisDirectory(spec, timeout=timeout, heartbeat_timeout=heartbeat_timeout)
    if "://" in spec and not spec.startswith(("tcp://", "ipc://", "inproc://")):
        raise ConfigError(f"directory {spec!r}: unknown scheme; use HOST:PORT (embedded) or "
                          "redis://HOST:PORT/DB / rediss://HOST:PORT/DB")
    return EmbeddedDirectory(spec, timeout=timeout, auth=auth)
