"""Directory: key -> location, batched; and the consumer's TTL cache of it.

A location is the tuple ``(node_id, region, rkey, offset, length, capacity,
generation, key_hash)``: everything a consumer needs to issue a one-sided
read of the slot and check its tag afterwards. Publish, lookup and unpublish
take whole batches so a batch costs one RPC, never one per key.
"""
from __future__ import annotations

import struct
import threading
import time
from typing import Iterable, NamedTuple, Sequence

import numpy as np

from . import tags
from .dirtable import DirTable
from .transport.base import ABSENT, LOC_DTYPE, native_module


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


#: One location as the directory stores it and a fast lookup reply carries it: a LOC_DTYPE
#: record whose ``node`` is the directory's own number for the node (see :meth:`Directory.node_ids`).
RECORD = struct.Struct("<IIQQQQQQ")
assert RECORD.size == LOC_DTYPE.itemsize


class Directory:
    """In-memory directory (the embedded backend), safe to share between threads.

    Each entry is stored pre-packed as one fixed binary :data:`RECORD`, so a
    lookup of any batch is a dict get per key and one ``bytes.join``: no
    per-key tuple, list or msgpack array is built on the lookup path. (An entry
    whose fields do not fit a record -- only this class's own API can write
    one, discovery refuses it on publish -- is kept as a :class:`Location`, and
    a lookup that meets it answers with :meth:`lookup` instead.)

    With ``table_entries`` > 0 it also keeps a :class:`~peercache.dirtable.DirTable` of that
    many entries, written under the same lock on every publish, unpublish and drop: a view of
    the dict that consumers read one-sided (:attr:`table`; None without one).
    """

    def __init__(self, table_entries: int = 0) -> None:
        #: the one-sided view of the entries (None: no table)
        self.table: DirTable | None = DirTable(table_entries) if table_entries > 0 else None
        self._map: dict[bytes, bytes | Location] = {}
        self._by_node: dict[str, set[bytes]] = {}
        #: node id -> the number its records carry, and back (numbers are never reused)
        self._num: dict[str, int] = {}
        self._ids: list[str] = []
        self._lock = threading.Lock()

    def number(self, node_id: str) -> int:
        """The member number of ``node_id`` (assigned at first sight, never reused)."""
        with self._lock:
            return self._number(node_id)

    def numbers(self, node_ids) -> dict[int, str]:
        """Member number -> node id of ``node_ids`` (those that have one)."""
        with self._lock:
            return {self._num[n]: n for n in node_ids if n in self._num}

    def _number(self, node_id: str) -> int:
        num = self._num.get(node_id)
        if num is None:
            num = self._num[node_id] = len(self._ids)
            self._ids.append(node_id)
        return num

    def publish(self, node_id: str, keys: Sequence[bytes], locs: Sequence[Sequence],
                takeover: bool = True) -> int:
        """Insert or replace ``keys``; a key owned by another node moves to this one unless not ``takeover``."""
        return self.publish_checked(node_id, keys, locs, takeover)[0]

    def publish_checked(self, node_id: str, keys: Sequence[bytes], locs: Sequence[Sequence],
                        takeover: bool = False) -> tuple[int, list[int]]:
        """Like :meth:`publish`; returns (published, indices of keys refused as another node's).

        Without ``takeover`` (what discovery uses) only the owner of an entry
        may overwrite it: the key stays with its owner until that node
        unpublishes it, leaves or is dropped.
        """
        if len(keys) != len(locs):
            raise ValueError(f"publish: {len(keys)} keys but {len(locs)} locations")
        refused: list[int] = []
        pack = RECORD.pack
        table = self.table
        written: list[bytes] = []
        with self._lock:
            num = self._number(node_id)
            owned = self._by_node.setdefault(node_id, set())
            for i, (k, loc) in enumerate(zip(keys, locs)):
                fields = loc[1:] if len(loc) == 8 else loc
                old = self._map.get(k)
                if old is not None and self._owner(old) != num:
                    if not takeover:
                        refused.append(i)
                        continue
                    self._by_node.get(self._ids[self._owner(old)], set()).discard(k)
                try:
                    self._map[k] = pack(num, *fields)
                except struct.error:
                    self._map[k] = Location(node_id, *fields)
                owned.add(k)
                if table is not None:
                    written.append(k)
            if not owned:
                self._by_node.pop(node_id, None)
            if written:
                get = self._map.get
                table.put_many(written, [get(k) for k in written])   # a Location (fits no record) stays out
        return len(keys) - len(refused), refused

    def _owner(self, entry: bytes | Location) -> int:
        return int.from_bytes(entry[:4], "little") if type(entry) is bytes else self._num[entry.node_id]

    def _location(self, rec: bytes | Location | None) -> Location | None:
        if rec is None or type(rec) is Location:
            return rec
        num, *fields = RECORD.unpack(rec)
        return Location(self._ids[num], *fields)

    def lookup(self, keys: Iterable[bytes]) -> list[Location | None]:
        """Locations of ``keys`` in order; None for an unknown key (a miss, not an error)."""
        with self._lock:
            recs = [self._map.get(k) for k in keys]
        return [self._location(r) for r in recs]

    def lookup_lists(self, keys: Iterable[bytes]) -> list[list | None]:
        """Like :meth:`lookup`, as the 8-field lists of the original lookup reply (None for an unknown key)."""
        unpack, ids = RECORD.unpack, self._ids
        with self._lock:
            recs = [self._map.get(k) for k in keys]
        out: list[list | None] = []
        for r in recs:
            if r is None:
                out.append(None)
            elif type(r) is bytes:
                t = unpack(r)
                out.append([ids[t[0]], *t[1:]])
            else:
                out.append(list(r))
        return out

    def lookup_records(self, keys: Sequence[bytes]) -> tuple[bytes, bytes, dict[int, str]] | None:
        """The records of the keys found, joined in order; the indices of the others (little-endian
        uint32, empty when all were found); the node ids of the records' numbers. None when one of
        the entries fits no record (then only :meth:`lookup` can answer)."""
        get = self._map.get
        with self._lock:
            recs = [get(k) for k in keys]
            ids = self._ids
        missing = b""
        try:
            blob = b"".join(recs)
        except TypeError:   # a miss (None), or an entry kept as a Location
            if any(type(r) is Location for r in recs):
                return None
            missing = np.flatnonzero(np.fromiter((r is None for r in recs), bool, len(recs))).astype("<u4").tobytes()
            blob = b"".join([r for r in recs if r is not None])
        if len(blob) <= 64 * RECORD.size:
            heads = {blob[i:i + 4] for i in range(0, len(blob), RECORD.size)}
            return blob, missing, {(n := int.from_bytes(h, "little")): ids[n] for h in heads}
        nums = np.unique(np.frombuffer(blob, LOC_DTYPE)["node"]).tolist()
        return blob, missing, {n: ids[n] for n in nums}

    def unpublish(self, node_id: str, keys: Iterable[bytes]) -> int:
        """Remove ``keys`` that ``node_id`` owns; returns how many were removed."""
        n = 0
        gone: list[bytes] = []
        with self._lock:
            num = self._num.get(node_id)
            if num is None:
                return 0
            mine = num.to_bytes(4, "little")
            owned = self._by_node.get(node_id, set())
            for k in keys:
                rec = self._map.get(k)
                if rec is not None and (rec[:4] == mine if type(rec) is bytes else rec.node_id == node_id):
                    del self._map[k]
                    owned.discard(k)
                    n += 1
                    if self.table is not None:
                        gone.append(k)
            if not owned:
                self._by_node.pop(node_id, None)
            if gone:
                self.table.remove_many(gone)
        return n

    def drop_node(self, node_id: str) -> int:
        """Forget every key of a node that left or stopped heartbeating."""
        with self._lock:
            keys = self._by_node.pop(node_id, set())
            num = self._num.get(node_id)
            mine = None if num is None else num.to_bytes(4, "little")
            gone = []
            for k in keys:
                rec = self._map.get(k)
                if rec is not None and (rec[:4] == mine if type(rec) is bytes else rec.node_id == node_id):
                    del self._map[k]
                    gone.append(k)
            if self.table is not None and gone:
                self.table.remove_many(gone)
        return len(keys)

    def set_table_epoch(self, epoch: int) -> None:
        """Write the membership epoch into the table's header (no table, or an older epoch: nothing)."""
        with self._lock:
            if self.table is not None and epoch > self.table.epoch:
                self.table.set_epoch(epoch)

    def close(self) -> None:
        """Release the table's region (the dict stays usable)."""
        with self._lock:
            table, self.table = self.table, None
        if table is not None:
            table.close()

    def __len__(self) -> int:
        return len(self._map)


class DirectoryCache:
    """Client-side cache of lookups with a time-to-live (0 disables it).

    Entries live in a native sharded hash map when the extension is built
    (batch lookups without the GIL, one short lock per key and shard), else
    in a dict. Node ids are interned to small integers so a cached location
    is a fixed-size record the native read path consumes directly.
    """

    def __init__(self, ttl: float, clock=time.monotonic, max_entries: int = 1 << 22):
        if ttl < 0:
            raise ValueError(f"--dir-cache-ttl must be >= 0 seconds, got {ttl}")
        self.ttl = ttl
        self.clock = clock
        self.max_entries = max_entries
        mod, _ = native_module()
        self._native = mod.LocCache() if mod is not None else None
        self._map: dict[bytes, tuple[float, Location]] = {}
        self._lock = threading.Lock()
        self._node_ids: list[str] = []
        self._node_index: dict[str, int] = {}
        self._hits = 0
        self._misses = 0

    # -- counters ---------------------------------------------------------------------
    @property
    def hits(self) -> int:
        """Keys served from the cache so far."""
        return self._hits + (self._native.hits if self._native is not None else 0)

    @property
    def misses(self) -> int:
        """Keys the cache could not serve so far."""
        return self._misses + (self._native.misses if self._native is not None else 0)

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
    @property
    def native(self) -> bool:
        """Whether records live in the native map (lookup_into/put_rows are fast)."""
        return self._native is not None

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
        if self._native is not None:
            return self._native.lookup(keys, self.clock(), out, want)
        locs = self.get_many(keys)
        out[:] = self.rows(locs)
        if want is not None:
            self.key_hashes_into(keys, want)
        return sum(l is not None for l in locs)

    def key_hashes_into(self, keys: Sequence[bytes], want: np.ndarray) -> None:
        """``want[i]`` = :func:`tags.key_hash` of ``keys[i]`` (natively where the keys are bytes)."""
        mod, _ = native_module()
        if mod is not None:
            try:
                mod.key_hashes(keys, want)
                return
            except TypeError:
                pass               # keys that are not bytes: hashed in Python
        want[:] = tags.key_hashes(keys)

    def put_rows(self, keys: Sequence[bytes], rows: np.ndarray) -> None:
        """Remember records (node != ABSENT) until now + ttl."""
        if self.ttl == 0:
            return
        if self._native is not None:
            self._native.put(keys, rows, self.clock() + self.ttl, self.max_entries)
            return
        self.put_many(keys, [None if r["node"] == ABSENT else self._location(r) for r in rows])

    # -- the Python API -------------------------------------------------------------------
    def get_many(self, keys: Sequence[bytes]) -> list[Location | None]:
        """Cached, unexpired locations of ``keys`` (None where absent or expired)."""
        if self.ttl == 0:
            self._misses += len(keys)
            return [None] * len(keys)
        if self._native is not None:
            rows = np.empty(len(keys), dtype=LOC_DTYPE)
            self._native.lookup(list(keys), self.clock(), rows)
            return [None if r["node"] == ABSENT else self._location(r) for r in rows]
        now = self.clock()
        out: list[Location | None] = []
        with self._lock:
            for k in keys:
                e = self._map.get(k)
                if e is not None and e[0] > now:
                    out.append(e[1])
                    self._hits += 1
                else:
                    if e is not None:
                        del self._map[k]
                    out.append(None)
                    self._misses += 1
        return out

    def put_many(self, keys: Sequence[bytes], locs: Sequence[Location | None]) -> None:
        """Remember found locations until now + ttl."""
        if self.ttl == 0:
            return
        if self._native is not None:
            self._native.put(list(keys), self.rows(locs), self.clock() + self.ttl, self.max_entries)
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
        if self._native is not None:
            self._native.invalidate(list(keys))
            return
        with self._lock:
            for k in keys:
                self._map.pop(k, None)

    def drop_node(self, node_id: str) -> None:
        """Forget every location on ``node_id``."""
        if self._native is not None:
            idx = self._node_index.get(node_id)
            if idx is not None:
                self._native.drop_node(idx)
            return
        with self._lock:
            for k in [k for k, (_, loc) in self._map.items() if loc.node_id == node_id]:
                del self._map[k]

    def __len__(self) -> int:
        return len(self._native) if self._native is not None else len(self._map)
