"""Where keys are: the client cache, then the directory's table, then the lookup RPC."""
from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np

from ..directory.cache import DirectoryCache
from ..directory.ops import LookupResult
from ..directory.location import Location
from ..errors import DiscoveryUnreachable
from ..transport.base import ABSENT, LOC_DTYPE
from .deadline import Deadline
from .lookup_replies import LookupReplies
from .membership import Membership
from .peers import PeerInfos
from .table_reader import TableReader


class Resolver:
    """Locations of keys, each asked of the cheapest tier that can answer it: the client cache
    (``cache``, with a TTL), then the directory's table (``table``, one one-sided read), then
    one directory RPC (``directory``, split to fit its limits) for the rest. What the table and
    the RPC answer is cached.

    A location whose slot did not hold the key when read (evicted, reused, torn, or another
    key's slot) is looked up once more by :meth:`relocate`: forgotten by the cache and asked of
    the directory itself (no cache, no table), so a retry can never loop.

    Locations come as :class:`Location` lists (:meth:`lookup`) or as LOC_DTYPE rows, node = the
    cache's index, ABSENT for a miss or an invalid entry (:meth:`lookup_rows`); an invalid entry
    is appended to the caller's ``bad`` list as ``(index, why)`` and never cached.

    With a read's :class:`~.deadline.Deadline` the tiers share its one bound: a tier starts only
    while time is left, the lookup RPC (and a members call) waits only what is left, and the keys
    no tier answered in time are given up on the deadline (:meth:`Deadline.give_up`, indices into
    the keys asked) and left ABSENT for the caller to report as timed out, never as misses.

    Each tier counts what it answered (the cache: ``cache.hits`` / ``cache.misses``; the table:
    ``table.resolved`` / ``table.forwarded``); the last tier, the lookup RPC or Redis (``tier``),
    counts the keys it was asked (:attr:`directory_asked`) and those the directory holds
    (:attr:`directory_found`).
    """

    def __init__(self, cache: DirectoryCache, table: TableReader, directory, membership: Membership,
                 peers: PeerInfos, replies: LookupReplies, tier: str = "rpc"):
        self.cache, self.table, self.directory = cache, table, directory
        self.membership, self.peers, self.replies = membership, peers, replies
        #: what the last tier is: "rpc" (the embedded directory's lookup op) or "redis"
        self.tier = tier
        #: keys asked of the directory itself (the last tier), and of them the ones it holds
        self.directory_asked = 0
        self.directory_found = 0

    # -- Location lists ---------------------------------------------------------------
    def lookup(self, keys: Sequence[bytes], use_cache: bool = True,
               bad: list | None = None, deadline: Deadline | None = None) -> list[Location | None]:
        """Locations of ``keys``: cached ones, then what one read of the directory's table
        answers, the rest with one directory RPC (``use_cache`` False: the RPC alone)."""
        locs = self.cache.get_many(keys) if use_cache else [None] * len(keys)
        missing = [i for i, l in enumerate(locs) if l is None]
        if missing and use_cache and self.table.view is not None:
            if _out_of_time(deadline, missing):
                return locs
            mkeys = [keys[i] for i in missing]
            got = self.table.lookup(mkeys, deadline)
            if got is not None:
                rows, resolved = got
                node_id = self.cache.node_id
                for j in np.flatnonzero(resolved & (rows["node"] != ABSENT)).tolist():
                    r = rows[j].tolist()
                    locs[missing[j]] = Location(node_id(r[0]), *r[1:])
                self.cache.put_rows(mkeys, rows)
                missing = [missing[j] for j in np.flatnonzero(~resolved).tolist()]
        if missing:
            if _out_of_time(deadline, missing):
                return locs
            sub_bad: list = []
            mkeys = [keys[i] for i in missing]
            fresh = self.rpc_locations(mkeys, sub_bad, deadline)
            if fresh is None:
                deadline.give_up(missing)
                return locs
            for i, l in zip(missing, fresh):
                locs[i] = l
            self.cache.put_many(mkeys, fresh)
            if bad is not None:
                bad.extend((missing[j], why) for j, why in sub_bad)
        return locs

    def locate(self, keys: list, bad: list, want: np.ndarray | None = None,
               deadline: Deadline | None = None) -> list:
        """:meth:`lookup` of a batch read (the Python read path); ``want`` is filled with the
        hash of each key asked for."""
        if want is not None:
            self.cache.key_hashes_into(keys, want)
        return self.lookup(keys, use_cache=True, bad=bad, deadline=deadline)

    # -- LOC_DTYPE rows ---------------------------------------------------------------
    def lookup_rows(self, keys: list, bad: list, want: np.ndarray | None = None,
                    use_cache: bool = True, deadline: Deadline | None = None) -> np.ndarray:
        """Locations of ``keys`` as rows (``want``: filled with the hash of each key asked for).
        Without the cache the table is skipped too: the directory itself answers."""
        locs = np.empty(len(keys), dtype=LOC_DTYPE)
        if use_cache:
            cached = self.cache.lookup_into(keys, locs, want)
            if cached == len(keys):
                return locs
        else:
            if want is not None:
                self.cache.key_hashes_into(keys, want)
            locs["node"] = ABSENT
            cached = 0
        self._fill_from_directory(keys, locs, bad, use_table=use_cache, none_cached=cached == 0,
                                  deadline=deadline)
        return locs

    def relocate(self, keys: list, bad: list, as_rows: bool, deadline: Deadline | None = None):
        """Fresh locations of ``keys``, whose location did not match their slot's tag: forgotten
        by the cache, then asked of the directory itself (rows with ``as_rows``, else Locations)."""
        self.cache.invalidate(keys)
        if as_rows:
            return self.lookup_rows(keys, bad, use_cache=False, deadline=deadline)
        return self.lookup(keys, use_cache=False, bad=bad, deadline=deadline)

    def _fill_from_directory(self, keys: list, locs: np.ndarray, bad: list | None = None,
                             use_table: bool = True, none_cached: bool = False,
                             deadline: Deadline | None = None) -> None:
        """Look up the rows of ``locs`` that are ABSENT (``none_cached``: all of them): in the
        directory's table (one one-sided read, ``use_table``), the ones it cannot answer with one
        directory RPC.

        Invalid entries stay ABSENT and go to ``bad`` as ``(index into keys, why)``.
        """
        if none_cached or len(locs) == 1:
            todo = None
        else:
            node = locs["node"]
            todo = None if not (node != ABSENT).any() else np.flatnonzero(node == ABSENT)
        if use_table and self.table.view is not None:
            if _out_of_time(deadline, todo, len(keys)):
                return
            tkeys = keys if todo is None else [keys[i] for i in todo]
            if len(tkeys) == 1:                # the latency path
                row = self.table.one(tkeys[0], deadline)
                if row is not None:
                    locs[0 if todo is None else int(todo[0])] = row[0]
                    self.cache.put_rows(tkeys, row)
                    return
                got = None
            else:
                # the whole batch: the table's rows land in locs itself
                got = self.table.rows(tkeys, locs if todo is None else None, deadline)
            if got is not None:
                rows, resolved, r = got
                if todo is not None:
                    locs[todo] = rows
                self.cache.put_rows(tkeys, rows)
                if r == len(tkeys):
                    return
                left = np.flatnonzero(~resolved)
                todo = left if todo is None else todo[left]
        if _out_of_time(deadline, todo, len(keys)):
            locs["node"][slice(None) if todo is None else todo] = ABSENT
            return
        if todo is None:
            mkeys, sub_bad = keys, (bad if bad is not None else [])
            rows = self.rpc_rows(mkeys, sub_bad, deadline)
            if rows is None:
                locs["node"] = ABSENT
                deadline.give_up(np.arange(len(keys)))
                return
            locs[:] = rows
            self.cache.put_rows(mkeys, rows)
            return
        miss = todo
        mkeys = [keys[i] for i in miss]
        sub_bad = []
        rows = self.rpc_rows(mkeys, sub_bad, deadline)
        if rows is None:
            locs["node"][miss] = ABSENT
            deadline.give_up(miss)
            return
        locs[miss] = rows
        self.cache.put_rows(mkeys, rows)
        if bad is not None:
            bad.extend((int(miss[j]), why) for j, why in sub_bad)

    # -- the lookup RPC -----------------------------------------------------------------
    def rpc_locations(self, keys: Sequence[bytes], bad: list | None = None,
                      deadline: Deadline | None = None) -> list[Location | None] | None:
        """One lookup RPC (no cache) as Locations; None when it ran out of ``deadline``'s time."""
        return self._rpc(keys, deadline, lambda result, wait: self.replies.locations(result, keys, bad, wait))

    def rpc_rows(self, keys: Sequence[bytes], bad: list | None = None,
                 deadline: Deadline | None = None) -> np.ndarray | None:
        """One lookup RPC (no cache) as rows; None when it ran out of ``deadline``'s time."""
        return self._rpc(keys, deadline, lambda result, wait: self.replies.any_rows(result, keys, bad, wait))

    def _rpc(self, keys: Sequence[bytes], deadline: Deadline | None, read: Callable):
        """``read(reply, wait)`` of the lookup reply for ``keys``; None (noted on ``deadline``) when
        the directory did not answer before the deadline, DiscoveryUnreachable otherwise."""
        since = time.monotonic()
        try:
            result = self.lookup_rpc(keys, deadline)
            return read(result, None if deadline is None else deadline.left())
        except DiscoveryUnreachable as e:
            if deadline is None or not deadline.rpc_failed(
                    f"the lookup RPC to the directory at {self.directory.address}", since, e):
                raise
            return None

    def lookup_rpc(self, keys: Sequence[bytes], deadline: Deadline | None = None) -> LookupResult:
        """The lookup reply for ``keys``: one RPC, or as many as discovery's limits need, merged,
        each waiting at most what ``deadline`` leaves.

        It asks for fixed binary records (``recs``) and sends the epoch of the node infos it
        holds; a directory that answers with the original ``locs`` lists is read as before.
        """
        parts = list(self.membership.slices(keys, 8))
        epoch = self.peers.infos_epoch
        if len(parts) == 1:
            result = self.directory.lookup(keys, recs=True, epoch=epoch,
                                           timeout=None if deadline is None else deadline.left())
        else:
            results = [self.directory.lookup(list(keys[a:b]), recs=True, epoch=epoch,
                                             timeout=None if deadline is None else deadline.left())
                       for a, b in parts]
            result = self.replies.merge(parts, results, self.peers.epoch)
        self.directory_asked += len(keys)
        self.directory_found += _found(result, len(keys))
        return result


def _out_of_time(deadline: Deadline | None, todo, n: int = 0) -> bool:
    """Whether ``deadline`` is over before a tier starts; then the keys ``todo`` (indices; None:
    all ``n``) are given up on it."""
    if deadline is None or not deadline.over():
        return False
    deadline.give_up(np.arange(n) if todo is None else todo)
    return True


def _found(result: LookupResult, n: int) -> int:
    """How many of the ``n`` keys of a lookup reply the directory holds (as the reply says; it is
    checked when read: this only counts)."""
    if result.records:
        missing = result.missing
        return max(0, n - (len(missing) // 4 if isinstance(missing, bytes) else 0))
    locs = result.locs
    return sum(1 for loc in locs if loc is not None) if isinstance(locs, list) else 0
