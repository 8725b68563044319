"""The embedded directory's store: key -> location, batched, in one process.

Publish, lookup and unpublish take whole batches so a batch costs one RPC,
never one per key (the service, :mod:`.service`, answers them over ZeroMQ).
"""
from __future__ import annotations

import struct
import threading
from collections import deque
from typing import Iterable, Sequence

import numpy as np

from .location import RECORD, Location
from .validate import Refused, not_registered
from .table import DirTable
from ..transport.base import LOC_DTYPE


class Directory:
    """In-memory directory (the embedded backend), safe to share between threads.

    Each entry is stored pre-packed as one fixed binary :data:`RECORD`, so a
    lookup of any batch is a dict get per key and one ``bytes.join``: no
    per-key tuple, list or msgpack array is built on the lookup path. (An entry
    whose fields do not fit a record -- only this class's own API can write
    one, discovery refuses it on publish -- is kept as a :class:`Location`, and
    a lookup that meets it answers with :meth:`lookup` instead.)

    With ``table_entries`` > 0 it also keeps a :class:`~peercache.directory.table.DirTable` of that
    many entries, written under the same lock on every publish, unpublish and drop: a view of
    the dict that consumers read one-sided (:attr:`table`; None without one).
    """

    def __init__(self, table_entries: int = 0) -> None:
        #: the one-sided view of the entries (None: no table)
        self.table: DirTable | None = DirTable(table_entries) if table_entries > 0 else None
        self._map: dict[bytes, bytes | Location] = {}
        self._by_node: dict[str, set[bytes]] = {}
        #: node id -> the number its records carry, and back (None: a free number). Only live
        #: members have one: a number is freed when its node is dropped, so the map is as big as
        #: the membership, not as every registration ever made (see :meth:`drop_node`).
        self._num: dict[str, int] = {}
        #: Replaced, never changed in place, when a number is given or freed: a reader that took
        #: it under the lock keeps a consistent snapshot after letting go of the lock.
        self._ids: tuple[str | None, ...] = ()
        #: freed numbers, oldest first: the one given next is the one free the longest
        self._free: deque[int] = deque()
        self._lock = threading.Lock()

    def number(self, node_id: str) -> int:
        """The member number of ``node_id`` (assigned at first sight; freed by :meth:`drop_node`)."""
        with self._lock:
            return self._number(node_id)

    def numbers(self, node_ids) -> dict[int, str]:
        """Member number -> node id of ``node_ids`` (those that have one)."""
        with self._lock:
            return {self._num[n]: n for n in node_ids if n in self._num}

    def _number(self, node_id: str) -> int:
        num = self._num.get(node_id)
        if num is None:
            ids = list(self._ids)
            if self._free:
                num = self._free.popleft()
                ids[num] = node_id
            else:
                num = len(ids)
                ids.append(node_id)
            self._num[node_id] = num
            self._ids = tuple(ids)
        return num

    def _release(self, node_id: str) -> None:
        """Free ``node_id``'s number. Only once no entry carries it (the caller deleted them under
        this lock), so a member given it later owns nothing of the old one's here or in the table.
        A consumer that still maps the number to the old node reads a slot whose tag is not the
        key's, which it treats as a stale location and asks the directory again; and the epoch
        bump of the leave makes it map the numbers anew."""
        num = self._num.pop(node_id, None)
        if num is None:
            return
        ids = list(self._ids)
        ids[num] = None
        self._ids = tuple(ids)
        self._free.append(num)

    def publish(self, node_id: str, keys: Sequence[bytes], locs: Sequence[Sequence],
                takeover: bool = True) -> int:
        """Insert or replace ``keys``; a key owned by another node moves to this one unless not ``takeover``."""
        return self.publish_checked(node_id, keys, locs, takeover)[0]

    def publish_checked(self, node_id: str, keys: Sequence[bytes], locs: Sequence[Sequence],
                        takeover: bool = False, members_only: bool = False) -> tuple[int, list[int]]:
        """Like :meth:`publish`; returns (published, indices of keys refused as another node's).

        Without ``takeover`` (what discovery uses) only the owner of an entry
        may overwrite it: the key stays with its owner until that node
        unpublishes it, leaves or is dropped.

        With ``members_only`` (discovery) a node without a number -- one dropped after its request
        was authorized -- is Refused rather than numbered again: its entries would outlive it.
        """
        if len(keys) != len(locs):
            raise ValueError(f"publish: {len(keys)} keys but {len(locs)} locations")
        refused: list[int] = []
        pack = RECORD.pack
        table = self.table
        written: list[bytes] = []
        with self._lock:
            if members_only and node_id not in self._num:
                raise Refused(not_registered(node_id))
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

    @staticmethod
    def _location(rec: bytes | Location | None, ids: tuple) -> Location | None:
        if rec is None or type(rec) is Location:
            return rec
        num, *fields = RECORD.unpack(rec)
        return Location(ids[num], *fields)

    # Each lookup takes the records and the numbers' ids under one lock: a number freed and
    # given again meanwhile must not name the new member as the owner of the old one's record.
    def lookup(self, keys: Iterable[bytes]) -> list[Location | None]:
        """Locations of ``keys`` in order; None for an unknown key (a miss, not an error)."""
        with self._lock:
            recs = [self._map.get(k) for k in keys]
            ids = self._ids
        return [self._location(r, ids) for r in recs]

    def lookup_lists(self, keys: Iterable[bytes]) -> list[list | None]:
        """Like :meth:`lookup`, as the 8-field lists of the original lookup reply (None for an unknown key)."""
        unpack = RECORD.unpack
        with self._lock:
            recs = [self._map.get(k) for k in keys]
            ids = self._ids
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
        """Forget every key of a node that left or stopped heartbeating, then its number (free
        for a later member once none of its entries is left)."""
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
            self._release(node_id)
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
