"""What this node knows of the cluster's other nodes: their infos, as the directory sent them."""
from __future__ import annotations

from typing import Any

from ..address import split
from ..directory.ops import Members

#: hosts a server binds to when it listens on every interface
WILDCARDS = ("0.0.0.0", "::", "")


def same_endpoint(a: str, b: str) -> bool:
    """Whether HOST:PORT ``a`` (as its server bound it, maybe a wildcard host) is ``b``."""
    (ha, pa), (hb, pb) = split(a), split(b)
    return bool(pa) and pa == pb and (ha == hb or ha in WILDCARDS)


class PeerInfos:
    """The infos of the nodes this node reads from (their data endpoints), kept current from the
    directory's replies: a lookup reply carries them when this node's are stale, a members call
    sends them all.

    ``directory``: the directory client (its ``members``); ``directory_host``: where a node
    whose server listens on every interface is reached (where the directory is).
    """

    def __init__(self, directory, directory_host: str):
        self.directory = directory
        self.directory_host = directory_host
        #: node id -> its info (``data``: the endpoint its pages are read at)
        self.by_id: dict[str, dict[str, Any]] = {}
        #: the directory's epoch as of its last reply to this node (registration, a lookup)
        self.epoch = 0
        #: the epoch of the infos held (sent with each lookup: the directory then sends infos only
        #: when they are stale), and the nodes whose info came at that epoch
        self.infos_epoch: int | None = None
        self.fresh: frozenset = frozenset()

    def take(self, nodes: dict, epoch) -> None:
        """The infos of a reply whose ``nodes`` are every node present as of ``epoch``."""
        self.by_id.update(nodes)
        self.fresh, self.infos_epoch = frozenset(nodes), epoch

    def members(self, timeout: float | None = None) -> Members:
        """One members call (``timeout``: its wait, else the directory client's); its infos are
        taken (see :meth:`take`), its reply returned."""
        members = self.directory.members(timeout=timeout)
        self.take(members.nodes or {}, members.epoch)
        return members

    def refresh(self, unknown: list, timeout: float | None = None) -> None:
        """Infos of nodes a reply named that this node has none of (current as of its epoch): one
        members call (``timeout``: its wait, else the directory client's)."""
        members = self.directory.members(timeout=timeout)
        self.by_id.update(members.nodes)
        self.fresh = frozenset(members.nodes) | frozenset(unknown)
        self.infos_epoch = members.epoch

    def data_endpoint(self, node_id: str) -> dict[str, Any] | None:
        """Where ``node_id``'s pages are read (None: no info of it)."""
        peer = self.by_id.get(node_id)
        if peer is None:
            return None
        data = dict(peer.get("data") or {})
        if data.get("host") in WILDCARDS:
            # A producer listening on all interfaces is reached where discovery is.
            data["host"] = self.directory_host
        return data
