"""The directory's ops as typed methods (:class:`DirectoryOps`) and their replies.

Each op is one ``call(op, timeout=None, **fields) -> dict`` of the message it names, whichever
backend answers it: the embedded directory's client (:mod:`.client`) and the Redis backend
(:mod:`.redis.backend`) both inherit these methods and give only ``call``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence


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
class Heartbeat:
    """A ``heartbeat`` reply: whether the directory still knows the node (else it registers again),
    and how many of the marks its publishes left were found behind since its last heartbeat (Redis:
    entries a failover lost, see :mod:`.redis.marks`; the node publishes its pool again). The embedded
    directory loses nothing short of a restart, which forgets the node: its ``lost`` is always 0."""

    known: bool
    lost: int = 0


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
        return self.renew(node_id, token).known

    def renew(self, node_id: str, token: str | None) -> Heartbeat:
        """Heartbeat in ``node_id``'s name: whether the directory still knows it, and whether it lost
        entries the node published (a :class:`Heartbeat`)."""
        reply = self.call("heartbeat", node_id=node_id, token=token)
        return Heartbeat(bool(reply["known"]), int(reply.get("lost") or 0))

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
