"""The directory's table as this node reads it: keys resolved with one one-sided read."""
from __future__ import annotations

import logging
import threading
import time

import numpy as np

from .. import tags
from ..directory.cache import DirectoryCache
from ..directory.service import MetaService
from ..directory.table import LINE_BYTES, TableView
from ..directory.validate import U32
from ..errors import DiscoveryUnreachable, PeerCacheError
from ..transport.base import ABSENT, LOC_DTYPE, OP_DTYPE, STATUS_TEXT, Status, Transport
from .deadline import Deadline
from .lookup_replies import SLOT_LIMIT
from .membership import Membership
from .peers import WILDCARDS, PeerInfos, same_endpoint

log = logging.getLogger("peercache.node")


class TableReader:
    """Resolves keys in the directory's table (:mod:`peercache.directory.table`) with one
    one-sided read of their buckets (and its header, in the same batch). Nothing doubtful is
    trusted: a line that fails its check, an overflowed bucket, a node number this node cannot
    map, a record that cannot be a slot leave the key unresolved (for the lookup RPC).

    Two reads, both checked and mapped by the native module (native/dirtable.c):

    - one native call (``table_lookup``) from the table itself on its host (``hosted``), else
      through the table node's native handle, which lands the read in scratch of its own;
    - through the transport's ``read_batch`` where its handles cannot do that (a transport
      without native handles, or one whose reads land only in registered memory: then into a
      per-thread scratch buffer that stays registered), parsed by :class:`TableView`.

    Member numbers in the table's records are mapped to the cache's node indices as of the
    table's epoch, with one members call (:meth:`PeerInfos.members`) when the epoch moved or a
    number is new.

    With a read's :class:`~.deadline.Deadline` the members call waits at most what the read has
    left, and a failed read or members call is noted on it (what, how long, why), so a read that
    runs out of time names this step. The read itself is bounded by the transport's timeout.
    """

    def __init__(self, native, transport: Transport, cache: DirectoryCache, peers: PeerInfos,
                 membership: Membership, hosted: MetaService | None, directory_addr: str):
        self.native = native
        self.transport = transport
        self.cache = cache
        self.peers = peers
        self.membership = membership
        #: the directory this process hosts (its table is read in place), or None
        self.hosted = hosted
        self.directory_addr = directory_addr
        #: the table as this node reads it (None: lookups go through the RPC alone)
        self.view: TableView | None = None
        #: keys the table answered (found, or definitively absent)
        self.resolved = 0
        #: keys the table could not answer (doubtful line, overflowed bucket, unknown node, failed
        #: read) and that went on to the lookup RPC
        self.forwarded = 0
        #: member number -> the cache's node index, as of the epoch :attr:`epoch` (ABSENT: unknown)
        self.nums = np.full(0, ABSENT, np.uint32)
        self.epoch: int | None = None
        #: per-thread landing buffer of reads that need registered memory (registered once, reused)
        self._scratch = threading.local()
        self._warned = False

    def use(self, info) -> None:
        """Read the directory's table as ``info`` (a register / members reply's ``table``) says;
        None, or an announcement this version cannot read, means no table."""
        if not info:
            self.view = None
            return
        if not same_endpoint(str(info.get("directory") or ""), self.directory_addr):
            # The table is a view of the directory at that address; this node asks another
            # endpoint (a relay, a proxy), whose answers the table need not mirror.
            self.view = None
            return
        view = self.view
        if view is not None and view.node_id == info.get("node_id") \
                and view.rkey == info.get("rkey") and view.seal == info.get("seal"):
            return
        try:
            view = TableView(info)
        except ValueError as e:
            log.warning("%s; lookups use the directory RPC alone", e)
            self.view = None
            return
        if view.data.get("host") in WILDCARDS:
            view.data["host"] = self.peers.directory_host
        self.epoch = None   # numbers are mapped again at the first read
        self.view = view

    def lookup(self, keys: list, deadline: Deadline | None = None) -> tuple[np.ndarray, np.ndarray] | None:
        """``keys`` in the table: ``(rows, resolved)``, rows as LOC_DTYPE with the cache's node
        indices (ABSENT where not found), ``resolved`` where the table answered (found, or
        definitively absent). None when the read itself failed."""
        got = self.rows(keys, deadline=deadline)
        if got is None:
            return None
        rows, resolved, r = got
        return rows, np.ones(len(keys), np.bool_) if resolved is None else resolved

    def rows(self, keys: list, out: np.ndarray | None = None, deadline: Deadline | None = None):
        """:meth:`lookup` as ``(rows, resolved, how many resolved)``, the rows in ``out``
        (LOC_DTYPE, one per key) when given; ``resolved`` is None when every key was."""
        view = self.view
        if view is None:          # withdrawn since the caller looked
            return None
        n = len(keys)
        rows = np.empty(n, LOC_DTYPE) if out is None else out
        state = np.empty(n, np.int8)
        try:
            if self.reads_natively(view):
                r = self._native_read(view, keys, rows, state, deadline)
            else:
                r = self._transport_read(view, keys, rows, state, deadline)
        except DiscoveryUnreachable:     # the members call of _map, its failure noted on the deadline
            if deadline is None or not deadline.over():
                raise
            r = None
        if r is None:
            self.forwarded += n
            if out is not None:
                out["node"] = ABSENT
            return None
        self.resolved += r
        self.forwarded += n - r
        return rows, None if r == n else state != 0, r

    def one(self, key: bytes, deadline: Deadline | None = None) -> np.ndarray | None:
        """One key in the table (the uncached single-key GET's path): its row (node ABSENT:
        definitively absent), or None when the table could not answer."""
        view = self.view
        if view is None:          # withdrawn since the caller looked
            return None
        try:
            if self.reads_natively(view):
                row = np.empty(1, LOC_DTYPE)
                r = self._native_read(view, [key], row, bytearray(1), deadline)
            else:
                row = self._transport_read_one(view, key, deadline)
                r = row is not None
        except DiscoveryUnreachable:     # the members call of _map, its failure noted on the deadline
            if deadline is None or not deadline.over():
                raise
            r = None
        if not r:
            self.forwarded += 1
            return None
        self.resolved += 1
        return row

    def reads_natively(self, view: TableView) -> bool:
        """Whether ``view`` is read with one native call: it is this process's own table, or the
        table node's handle lands reads in scratch of its own."""
        tr = self.transport
        return self._own(view) or (tr.native and not tr.needs_registered_memory)

    def _own(self, view: TableView) -> bool:
        return self.hosted is not None and view.node_id == self.membership.node_id

    def _native_read(self, view: TableView, keys: list, rows: np.ndarray, state,
                     deadline: Deadline | None = None) -> int | None:
        """Resolve ``keys`` with one native call: fills ``rows`` (LOC_DTYPE, node indices, ABSENT
        where not found) and ``state`` (int8: TABLE_FOUND / TABLE_ABSENT, 0 where doubtful);
        returns the keys resolved, or None when the read failed (logged once) or the header was
        doubtful (nothing resolved)."""
        mod = self.native
        own = self._own(view)
        since = time.monotonic()
        if own:
            table = self.hosted.directory.table
            if table is None:
                return None
            src = table.mm
        else:
            try:
                src = self.transport.native_peer(view.node_id, view.data)
            except PeerCacheError as e:
                self._failed(view, f"{STATUS_TEXT[Status.PEER_GONE]}: {e}", deadline, since)
                return None
        args = (view.native_spec, self.nums, SLOT_LIMIT, self.epoch, rows, state)
        try:
            code, epoch, resolved, first, err = mod.table_lookup(src, keys, *args)
        except TypeError as e:
            if "not bytes" not in str(e):
                raise
            # keys that are bytes-like but not bytes (bytearray, memoryview): their bytes
            code, epoch, resolved, first, err = mod.table_lookup(src, [bytes(k) for k in keys], *args)
        if code == mod.TABLE_DONE:         # the numbers were current
            return resolved
        if code == mod.TABLE_READ_FAILED:
            if not own and not src.alive():
                self.transport.forget(view.node_id)
            self._failed(view, STATUS_TEXT.get(first, f"status {first}") + (f" ({err})" if err else ""),
                         deadline, since)
            return None
        if code != mod.TABLE_REMAP:        # TABLE_BAD_HEADER: every key doubtful
            return None
        return self._map(rows, state, epoch, deadline)

    def _transport_read(self, view: TableView, keys: list, rows: np.ndarray, state: np.ndarray,
                        deadline: Deadline | None = None) -> int | None:
        """:meth:`_native_read` through the transport: the plan and the parse of :class:`TableView`,
        the numbers mapped natively."""
        n = len(keys)
        kh = tags.key_hashes(keys)
        ub, inv, remote, length, local, nbytes = view.plan(kh)
        buf = np.empty(nbytes, np.uint8)
        if not self._read(view, remote, length, local, buf, deadline):
            return None
        epoch, recs, found, absent = view.parse(buf, ub, inv, kh)
        if epoch is None:
            return None
        rows[:] = np.ascontiguousarray(recs).view(LOC_DTYPE).reshape(n)
        rows[~found] = 0
        rows["node"][~found] = ABSENT
        mod = self.native
        state[:] = np.where(found, mod.TABLE_FOUND, np.where(absent, mod.TABLE_ABSENT, mod.TABLE_DOUBT))
        return self._map(rows, state, epoch, deadline)

    def _transport_read_one(self, view: TableView, key: bytes, deadline: Deadline | None = None) -> np.ndarray | None:
        """:meth:`one` through the transport (header and one bucket), parsed without NumPy passes."""
        khash = tags.key_hash(key)
        bucket, remote = view.plan_one(khash)
        buf = bytearray(LINE_BYTES + view.bucket_bytes)
        if not self._read(view, np.array([0, remote], np.uint64),
                          np.array([LINE_BYTES, view.bucket_bytes], np.uint64),
                          np.array([0, LINE_BYTES], np.uint64), np.frombuffer(buf, np.uint8), deadline):
            return None
        epoch, rec, absent = view.parse_one(bytes(buf), bucket, khash)
        if epoch is None or (rec is None and not absent):
            return None
        row = np.zeros(1, LOC_DTYPE)
        if rec is None:
            if epoch != self.epoch:
                self.sync(epoch, deadline)
            row["node"] = ABSENT
            return row
        row.view(np.uint8)[:] = np.frombuffer(rec, np.uint8)
        return row if self._map(row, np.full(1, self.native.TABLE_FOUND, np.int8), epoch, deadline) else None

    def _map(self, rows: np.ndarray, state: np.ndarray, epoch: int, deadline: Deadline | None = None) -> int:
        """Member numbers of found ``rows`` to node indices (natively), the numbers synced first
        when ``epoch`` is not theirs or a number is new; returns the keys resolved."""
        if epoch != self.epoch:
            self.sync(epoch, deadline)
        unknown, resolved = self.native.table_map(rows, state, self.nums, SLOT_LIMIT, False)
        if unknown:
            self.sync(epoch, deadline)     # a member this node has not mapped yet
            unknown, resolved = self.native.table_map(rows, state, self.nums, SLOT_LIMIT, True)
        return resolved

    def _failed(self, view: TableView, why: str, deadline: Deadline | None = None, since: float = 0.0) -> bool:
        if deadline is not None:
            deadline.spent(f"the directory table read from node {view.node_id}", since, why)
        if not self._warned:
            self._warned = True
            log.warning("directory table read from node %s failed (%s); those lookups go through the "
                        "directory RPC", view.node_id, why)
        return False

    def _read(self, view: TableView, remote, length, local, buf: np.ndarray, deadline: Deadline | None = None) -> bool:
        """Land the table ranges in ``buf`` with one batch through the data transport. False
        (logged once, noted on ``deadline``) when a read failed."""
        since = time.monotonic()
        ops = np.zeros(len(remote), dtype=OP_DTYPE)
        ops["region"], ops["rkey"] = view.region, view.rkey
        ops["remote_offset"], ops["length"], ops["local_offset"] = remote, length, local
        land = buf
        if self.transport.needs_registered_memory:
            # A buffer of this thread's that stays registered (the transport keeps its
            # registration), not a new one per lookup.
            land = getattr(self._scratch, "buf", None)
            if land is None or len(land) < len(buf):
                land = self._scratch.buf = np.empty(max(len(buf), 1 << 16), np.uint8)
        st = self.transport.read_batch(view.node_id, view.data, ops, [land])
        if land is not buf and not st.any():
            buf[:] = land[:len(buf)]
        if st.any():
            first = int(st[st != Status.OK][0])
            return self._failed(view, STATUS_TEXT.get(first, f"status {first}"), deadline, since)
        return True

    def sync(self, epoch: int, deadline: Deadline | None = None) -> None:
        """Map member numbers to node ids (and refresh the peers' infos) with one members call
        (waiting at most what ``deadline`` leaves; its failure noted there)."""
        since = time.monotonic()
        try:
            members = self.peers.members(None if deadline is None else deadline.left())
        except DiscoveryUnreachable as e:
            if deadline is not None:
                deadline.spent(f"the members call to the directory at {self.directory_addr} (to map the "
                               "table's member numbers)", since, str(e))
            raise
        self.use(members.table)
        nums = members.nums or {}
        arr = np.full(max([k for k in nums if type(k) is int and 0 <= k < U32] or [-1]) + 1, ABSENT, np.uint32)
        for number, node_id in nums.items():
            if type(number) is int and 0 <= number < len(arr) and isinstance(node_id, str) and node_id:
                arr[number] = self.cache.node_index(node_id)
        self.nums = arr
        self.epoch = epoch
