"""The consumer's TTL cache of directory lookups."""
from __future__ import annotations

import threading
import time
from typing import Iterable, Sequence

import numpy as np

from .. import tags
from ..errors import ConfigError
from .location import Location
from ..transport.base import ABSENT, LOC_DTYPE, native_module


class DirectoryCache:
    """Client-side cache of lookups with a time-to-live (0 disables it).

    Entries live in the native sharded hash map (batch lookups without the
    GIL, one short lock per key and shard). Node ids are interned to small
    integers so a cached location is a fixed-size record the native read path
    consumes directly.
    """

    def __init__(self, ttl: float, clock=time.monotonic, max_entries: int = 1 << 22):
        if ttl < 0:
            raise ValueError(f"--dir-cache-ttl must be >= 0 seconds, got {ttl}")
        mod, why = native_module()
        if mod is None:
            raise ConfigError(f"the directory cache needs the native module: {why}")
        self.ttl = ttl
        self.clock = clock
        self.max_entries = max_entries
        self._native = mod.LocCache()
        self._key_hashes = mod.key_hashes
        self._lock = threading.Lock()
        self._node_ids: list[str] = []
        self._node_index: dict[str, int] = {}
        self._misses = 0            # lookups with the cache off (ttl 0), which never reach the map

    @property
    def native_map(self):
        """The native map itself (``_native.LocCache``) for a read that looks its keys up in the same
        native call (``_native.read_cached``); None with the cache off (ttl 0)."""
        return self._native if self.ttl > 0 else None

    # -- counters ---------------------------------------------------------------------
    @property
    def hits(self) -> int:
        """Keys served from the cache so far."""
        return self._native.hits

    @property
    def misses(self) -> int:
        """Keys the cache could not serve so far."""
        return self._misses + self._native.misses

    # -- node interning ---------------------------------------------------------------
    def node_index(self, node_id: str) -> int:
        """Small integer standing for ``node_id`` in location records."""
        idx = self._node_index.get(node_id)
        if idx is None:
            with self._lock:
                idx = self._node_index.get(node_id)
                if idx is None:
                    idx = len(self._node_ids)
                    self._node_ids.append(node_id)
                    self._node_index[node_id] = idx
        return idx

    def node_id(self, index: int) -> str:
        """The node id an index stands for."""
        return self._node_ids[index]

    def rows(self, locs: Sequence[Location | None]) -> np.ndarray:
        """Location records (LOC_DTYPE) of ``locs``; node = ABSENT where None."""
        out = np.zeros(len(locs), dtype=LOC_DTYPE)
        out["node"] = ABSENT
        for i, loc in enumerate(locs):
            if loc is not None:
                out[i] = (self.node_index(loc.node_id), *loc[1:])
        return out

    def _location(self, row) -> Location:
        return Location(self._node_ids[int(row["node"])], *(int(row[f]) for f in LOC_DTYPE.names[1:]))

    # -- batch API used by the native read path -------------------------------------------
    def lookup_into(self, keys: Sequence[bytes], out: np.ndarray, want: np.ndarray | None = None) -> int:
        """Fill ``out`` (LOC_DTYPE) for ``keys``; returns how many were cached and unexpired.

        ``want`` (uint64, one per key): filled with each key's :func:`tags.key_hash`, the hash its
        slot tag must hold, computed here from the key itself (never taken from a location). The
        native map keeps it with each entry from when it took the key, so a cached read hashes
        nothing; other keys are hashed now."""
        if self.ttl == 0:
            out["node"] = ABSENT
            self._misses += len(keys)
            if want is not None:
                self.key_hashes_into(keys, want)
            return 0
        return self._native.lookup(keys, self.clock(), out, want)

    def key_hashes_into(self, keys: Sequence[bytes], want: np.ndarray) -> None:
        """``want[i]`` = :func:`tags.key_hash` of ``keys[i]`` (natively where the keys are bytes)."""
        try:
            self._key_hashes(keys, want)
        except TypeError:
            want[:] = tags.key_hashes(keys)       # keys that are not bytes: hashed in Python

    def put_rows(self, keys: Sequence[bytes], rows: np.ndarray) -> None:
        """Remember records (node != ABSENT) until now + ttl."""
        if self.ttl == 0:
            return
        self._native.put(keys, rows, self.clock() + self.ttl, self.max_entries)

    # -- the Python API -------------------------------------------------------------------
    def get_many(self, keys: Sequence[bytes]) -> list[Location | None]:
        """Cached, unexpired locations of ``keys`` (None where absent or expired)."""
        if self.ttl == 0:
            self._misses += len(keys)
            return [None] * len(keys)
        rows = np.empty(len(keys), dtype=LOC_DTYPE)
        self._native.lookup(list(keys), self.clock(), rows)
        return [None if r["node"] == ABSENT else self._location(r) for r in rows]

    def put_many(self, keys: Sequence[bytes], locs: Sequence[Location | None]) -> None:
        """Remember found locations until now + ttl."""
        if self.ttl == 0:
            return
        self._native.put(list(keys), self.rows(locs), self.clock() + self.ttl, self.max_entries)

    def invalidate(self, keys: Iterable[bytes]) -> None:
        """Forget ``keys`` (after a tag mismatch showed the location is stale)."""
        self._native.invalidate(list(keys))

    def drop_node(self, node_id: str) -> None:
        """Forget every location on ``node_id``."""
        idx = self._node_index.get(node_id)
        if idx is not None:
            self._native.drop_node(idx)

    def __len__(self) -> int:
        return len(self._native)
