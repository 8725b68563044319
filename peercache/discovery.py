"""Discovery: membership with heartbeats and an epoch, plus the directory.

The service runs inside the node that owns ``--discovery-addr`` (or a
standalone meta process). Nodes register their endpoint info, heartbeat,
and are dropped with all their directory entries when they stop. Every
change of membership bumps the epoch, so clients can tell when to refresh
what they cached about peers.
"""
from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from .directory import Directory

#: A node that has not heartbeated for this long is dropped.
DEFAULT_HEARTBEAT_TIMEOUT = 5.0


class Membership:
    """Registered nodes and the membership epoch."""

    def __init__(self, heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT, clock=time.monotonic):
        self.heartbeat_timeout = heartbeat_timeout
        self.clock = clock
        self.epoch = 0
        self._nodes: dict[str, dict[str, Any]] = {}
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def register(self, info: dict[str, Any]) -> tuple[str, int]:
        """Add a node (its endpoint info); returns (node_id, epoch)."""
        node_id = info.get("node_id") or uuid.uuid4().hex[:12]
        with self._lock:
            self._nodes[node_id] = dict(info, node_id=node_id)
            self._seen[node_id] = self.clock()
            self.epoch += 1
            return node_id, self.epoch

    def heartbeat(self, node_id: str) -> bool:
        """Refresh a node; False when it is unknown (it must register again)."""
        with self._lock:
            if node_id not in self._nodes:
                return False
            self._seen[node_id] = self.clock()
            return True

    def leave(self, node_id: str) -> bool:
        """Remove a node that is shutting down."""
        with self._lock:
            if self._nodes.pop(node_id, None) is None:
                return False
            self._seen.pop(node_id, None)
            self.epoch += 1
            return True

    def expire(self) -> list[str]:
        """Drop nodes whose heartbeat is overdue; returns their ids."""
        now = self.clock()
        with self._lock:
            dead = [n for n, t in self._seen.items() if now - t > self.heartbeat_timeout]
            for n in dead:
                self._nodes.pop(n, None)
                self._seen.pop(n, None)
            if dead:
                self.epoch += 1
            return dead

    def get(self, node_id: str) -> dict[str, Any] | None:
        with self._lock:
            return self._nodes.get(node_id)

    def members(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return dict(self._nodes)


class MetaService:
    """Discovery + directory as RPC handlers, with a reaper for dead nodes."""

    def __init__(self, heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT):
        self.membership = Membership(heartbeat_timeout)
        self.directory = Directory()
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="discovery-reaper", daemon=True)
        self._reaper.start()

    def _reap(self) -> None:
        period = max(0.05, min(1.0, self.membership.heartbeat_timeout / 4))
        while not self._stop.wait(period):
            self.reap_once()

    def reap_once(self) -> list[str]:
        """Expire overdue nodes and drop their directory entries."""
        dead = self.membership.expire()
        for n in dead:
            self.directory.drop_node(n)
        return dead

    def stop(self) -> None:
        self._stop.set()

    def handlers(self) -> dict:
        """The RPC ops this service answers."""
        return {
            "register": self._register,
            "heartbeat": self._heartbeat,
            "leave": self._leave,
            "members": self._members,
            "publish": self._publish,
            "lookup": self._lookup,
            "unpublish": self._unpublish,
        }

    def _known(self, node_id: str) -> None:
        if self.membership.get(node_id) is None:
            raise KeyError(f"node {node_id!r} is not registered (it may have been dropped "
                           "after missing heartbeats); register again")

    def _register(self, msg: dict) -> dict:
        node_id, epoch = self.membership.register(msg["info"])
        return {"node_id": node_id, "epoch": epoch,
                "heartbeat_timeout": self.membership.heartbeat_timeout}

    def _heartbeat(self, msg: dict) -> dict:
        return {"known": self.membership.heartbeat(msg["node_id"]), "epoch": self.membership.epoch}

    def _leave(self, msg: dict) -> dict:
        self.directory.drop_node(msg["node_id"])
        return {"left": self.membership.leave(msg["node_id"]), "epoch": self.membership.epoch}

    def _members(self, msg: dict) -> dict:
        return {"epoch": self.membership.epoch, "nodes": self.membership.members()}

    def _publish(self, msg: dict) -> dict:
        node_id = msg["node_id"]
        self._known(node_id)
        keys, locs = msg["keys"], msg["locs"]
        if not isinstance(keys, list) or not isinstance(locs, list):
            raise TypeError("publish needs 'keys' and 'locs' lists")
        n = self.directory.publish(node_id, keys, locs)
        removed = self.directory.unpublish(node_id, msg.get("unpublish") or [])
        return {"published": n, "unpublished": removed}

    def _lookup(self, msg: dict) -> dict:
        keys = msg["keys"]
        if not isinstance(keys, list):
            raise TypeError("lookup needs a 'keys' list")
        locs = self.directory.lookup(keys)
        nodes = {}
        for loc in locs:
            if loc is not None and loc.node_id not in nodes:
                nodes[loc.node_id] = self.membership.get(loc.node_id)
        return {"locs": [None if l is None else list(l) for l in locs], "nodes": nodes,
                "epoch": self.membership.epoch}

    def _unpublish(self, msg: dict) -> dict:
        return {"unpublished": self.directory.unpublish(msg["node_id"], msg["keys"])}
