"""Directory: key -> location, batched; and the consumer's TTL cache of it.

A location is the tuple ``(node_id, region, rkey, offset, length, capacity,
generation, key_hash)``: everything a consumer needs to issue a one-sided
read of the slot and check its tag afterwards. Publish, lookup and unpublish
take whole batches so a batch costs one RPC, never one per key.
"""
from __future__ import annotations

import threading
import time
from typing import Iterable, NamedTuple, Sequence


class Location(NamedTuple):
    """Where a published object lives."""

    node_id: str
    region: int
    rkey: int
    offset: int
    length: int
    capacity: int
    generation: int
    key_hash: int


class Directory:
    """In-memory directory (the embedded backend), safe to share between threads."""

    def __init__(self) -> None:
        self._map: dict[bytes, Location] = {}
        self._by_node: dict[str, set[bytes]] = {}
        self._lock = threading.Lock()

    def publish(self, node_id: str, keys: Sequence[bytes], locs: Sequence[Sequence]) -> int:
        """Insert or replace ``keys``; a key owned by another node moves to this one."""
        if len(keys) != len(locs):
            raise ValueError(f"publish: {len(keys)} keys but {len(locs)} locations")
        with self._lock:
            owned = self._by_node.setdefault(node_id, set())
            for k, loc in zip(keys, locs):
                loc = Location(node_id, *loc[1:]) if len(loc) == 8 else Location(node_id, *loc)
                old = self._map.get(k)
                if old is not None and old.node_id != node_id:
                    self._by_node.get(old.node_id, set()).discard(k)
                self._map[k] = loc
                owned.add(k)
        return len(keys)

    def lookup(self, keys: Iterable[bytes]) -> list[Location | None]:
        """Locations of ``keys`` in order; None for an unknown key (a miss, not an error)."""
        with self._lock:
            return [self._map.get(k) for k in keys]

    def unpublish(self, node_id: str, keys: Iterable[bytes]) -> int:
        """Remove ``keys`` that ``node_id`` owns; returns how many were removed."""
        n = 0
        with self._lock:
            owned = self._by_node.get(node_id, set())
            for k in keys:
                loc = self._map.get(k)
                if loc is not None and loc.node_id == node_id:
                    del self._map[k]
                    owned.discard(k)
                    n += 1
        return n

    def drop_node(self, node_id: str) -> int:
        """Forget every key of a node that left or stopped heartbeating."""
        with self._lock:
            keys = self._by_node.pop(node_id, set())
            for k in keys:
                loc = self._map.get(k)
                if loc is not None and loc.node_id == node_id:
                    del self._map[k]
        return len(keys)

    def __len__(self) -> int:
        return len(self._map)


class DirectoryCache:
    """Client-side cache of lookups with a time-to-live (0 disables it)."""

    def __init__(self, ttl: float, clock=time.monotonic, max_entries: int = 1 << 22):
        if ttl < 0:
            raise ValueError(f"--dir-cache-ttl must be >= 0 seconds, got {ttl}")
        self.ttl = ttl
        self.clock = clock
        self.max_entries = max_entries
        self._map: dict[bytes, tuple[float, Location]] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get_many(self, keys: Sequence[bytes]) -> list[Location | None]:
        """Cached, unexpired locations of ``keys`` (None where absent or expired)."""
        if self.ttl == 0:
            self.misses += len(keys)
            return [None] * len(keys)
        now = self.clock()
        out: list[Location | None] = []
        with self._lock:
            for k in keys:
                e = self._map.get(k)
                if e is not None and e[0] > now:
                    out.append(e[1])
                    self.hits += 1
                else:
                    if e is not None:
                        del self._map[k]
                    out.append(None)
                    self.misses += 1
        return out

    def put_many(self, keys: Sequence[bytes], locs: Sequence[Location | None]) -> None:
        """Remember found locations until now + ttl."""
        if self.ttl == 0:
            return
        expiry = self.clock() + self.ttl
        with self._lock:
            if len(self._map) + len(keys) > self.max_entries:
                self._map.clear()  # bounded memory; a refill costs one lookup per batch
            for k, loc in zip(keys, locs):
                if loc is not None:
                    self._map[k] = (expiry, loc)

    def invalidate(self, keys: Iterable[bytes]) -> None:
        """Forget ``keys`` (after a tag mismatch showed the location is stale)."""
        with self._lock:
            for k in keys:
                self._map.pop(k, None)

    def drop_node(self, node_id: str) -> None:
        """Forget every location on ``node_id``."""
        with self._lock:
            for k in [k for k, (_, loc) in self._map.items() if loc.node_id == node_id]:
                del self._map[k]
