"""The directory's lookup replies, read and checked: nothing in a reply is trusted until it can be
a slot of a node this node knows."""
from __future__ import annotations

import logging
from typing import Sequence

import numpy as np

from .. import tags
from ..directory.cache import DirectoryCache
from ..directory.ops import LookupResult
from ..directory.location import Location
from ..directory.validate import U64, read_location
from ..errors import RpcError
from ..transport.base import ABSENT, LOC_DTYPE
from .peers import PeerInfos

log = logging.getLogger("peercache.node")

#: the largest slot offset / capacity a location may have (header + trailer must fit 64 bits)
SLOT_LIMIT = U64 - tags.HEADER_BYTES - tags.TRAILER_BYTES


class LookupReplies:
    """Reads lookup replies (:class:`~peercache.directory.ops.LookupResult`) of both shapes:
    fixed binary records ``{recs, nids, epoch[, missing][, nodes]}`` (what this node asks for)
    and the original ``{locs: [8-field list | None], nodes, epoch}``. Node numbers become the cache's node indices (``cache``), the infos a reply carries
    go to ``peers``; an entry that cannot be a slot is counted in :attr:`bad_locations` and
    appended to the caller's ``bad`` list as ``(index, why)``. ``address`` names the directory in
    messages about malformed replies."""

    _SLOT_LIMIT = np.uint64(SLOT_LIMIT)

    def __init__(self, cache: DirectoryCache, peers: PeerInfos, address: str):
        self.cache, self.peers, self.address = cache, peers, address
        #: directory entries refused by :func:`~peercache.directory.validate.read_location` so far (each read as an ERROR)
        self.bad_locations = 0

    def _malformed(self, what: str) -> RpcError:
        return RpcError(f"discovery at {self.address} sent a malformed lookup reply ({what}); is it a "
                        "PeerCache of the same version?")

    def locations(self, reply: LookupResult, keys: Sequence[bytes], bad: list | None,
                  wait: float | None = None) -> list[Location | None]:
        """Checked locations of a reply of either shape (``wait``: for a members call it needs)."""
        if reply.records:
            rows = self.rows(reply, keys, bad, wait)
            out: list[Location | None] = [None] * len(rows)
            found = np.flatnonzero(rows["node"] != ABSENT)
            ids = {int(i): self.cache.node_id(int(i)) for i in np.unique(rows["node"][found])}
            for i, r in zip(found.tolist(), rows[found].tolist()):
                out[i] = Location(ids[r[0]], *r[1:])
            return out
        return self._checked_locs(reply, keys, bad)

    def any_rows(self, reply: LookupResult, keys: Sequence[bytes], bad: list | None,
                 wait: float | None = None) -> np.ndarray:
        """Checked LOC_DTYPE rows of a reply of either shape (node = the cache's index; ABSENT for a
        miss or an invalid entry; ``wait``: for a members call it needs)."""
        if reply.records:
            return self.rows(reply, keys, bad, wait)
        return self.cache.rows(self._checked_locs(reply, keys, bad))

    def _checked_locs(self, reply: LookupResult, keys: Sequence[bytes], bad: list | None) -> list[Location | None]:
        """The locations of an original ``{locs: [8-field list | None], nodes, epoch}`` reply, checked."""
        self.peers.by_id.update(reply.nodes)
        self.peers.epoch = reply.epoch
        out: list[Location | None] = []
        for i, raw in enumerate(reply.locs):
            if raw is None:
                out.append(None)
                continue
            loc, why = read_location(raw)
            if loc is None:
                self._bad_entry(keys, i, why, bad)
            out.append(loc)
        return out

    def _bad_entry(self, keys, i: int, why: str, bad: list | None) -> None:
        self.bad_locations += 1
        if self.bad_locations == 1:
            log.warning("directory entry of %r is invalid (%s); reading it as an error", keys[i], why)
        if bad is not None:
            bad.append((i, why))

    def rows(self, reply: LookupResult, keys: Sequence[bytes], bad: list | None,
             wait: float | None = None) -> np.ndarray:
        """Rows of a ``{recs, nids, epoch[, nodes]}`` reply: the records with discovery's node numbers
        turned into the cache's indices, checked as :func:`~peercache.directory.validate.read_location` checks one entry.
        ``wait``: how long the members call for nodes it does not know may take (else the client's)."""
        blob, nids, n = reply.recs, reply.nids, len(keys)
        missing = reply.missing or b""
        m = len(missing) // 4 if type(missing) is bytes and len(missing) % 4 == 0 else -1
        if (type(blob) is not bytes or m < 0 or len(blob) != (n - m) * LOC_DTYPE.itemsize
                or not isinstance(nids, dict)):
            raise self._malformed(f"{len(blob) if isinstance(blob, bytes) else type(blob).__name__} bytes of "
                                  f"records and {m} missing for {n} keys, {LOC_DTYPE.itemsize} B each")
        if m == 0:
            rows = np.frombuffer(blob, LOC_DTYPE).copy()
        else:
            gone = np.frombuffer(missing, "<u4")
            if gone[-1] >= n or (m > 1 and not (gone[1:] > gone[:-1]).all()):
                raise self._malformed(f"missing indices not increasing below {n}")
            rows = np.zeros(n, LOC_DTYPE)
            rows["node"] = ABSENT
            have = np.ones(n, bool)
            have[gone] = False
            rows[have] = np.frombuffer(blob, LOC_DTYPE)
        nodes = reply.nodes
        epoch = reply.epoch
        if nodes:   # our epoch was stale: the infos of the nodes present, current as of ``epoch``
            self.peers.take(nodes, epoch)
        self.peers.epoch = epoch
        num = rows["node"]
        found = num != ABSENT
        if not found.any():
            return rows
        unknown = [nid for nid in nids.values() if nid not in self.peers.fresh]
        if unknown:
            self.peers.refresh(unknown, wait)
        if len(nids) == 1 and found.all():
            (number, node_id), = nids.items()
            if number != int(num[0]) or not (num == number).all():
                return self._rows_of_several_nodes(rows, keys, bad, nids)
            if not isinstance(node_id, str) or not node_id:
                return self._rows_of_several_nodes(rows, keys, bad, nids)
            rows["node"] = self.cache.node_index(node_id)
        else:
            return self._rows_of_several_nodes(rows, keys, bad, nids)
        return self._check_rows(rows, keys, bad)

    def _rows_of_several_nodes(self, rows: np.ndarray, keys, bad: list | None, nids: dict) -> np.ndarray:
        """Node numbers to indices for a reply of several nodes (or one whose numbers do not add up)."""
        num = rows["node"].copy()
        out = np.full(len(rows), ABSENT, np.uint32)
        for number, node_id in nids.items():
            sel = num == number
            if type(number) is int and isinstance(node_id, str) and node_id:
                out[sel] = self.cache.node_index(node_id)
        rows["node"] = out
        for i in np.flatnonzero((num != ABSENT) & (out == ABSENT)).tolist():
            self._bad_entry(keys, i, f"node number {int(num[i])} has no node id in the reply", bad)
        return self._check_rows(rows, keys, bad)

    def _check_rows(self, rows: np.ndarray, keys, bad: list | None) -> np.ndarray:
        """Rows that cannot be a slot become ABSENT and ``bad`` entries (as :func:`~peercache.directory.validate.read_location`)."""
        cap, lim = rows["capacity"], self._SLOT_LIMIT
        wrong = (rows["length"] > cap) | (cap > lim) | (rows["offset"] > lim - np.minimum(cap, lim))
        wrong &= rows["node"] != ABSENT
        if wrong.any():
            for i in np.flatnonzero(wrong).tolist():
                r = rows[i]
                why = (f"length {int(r['length'])} exceeds the slot capacity {int(r['capacity'])}"
                       if r["length"] > r["capacity"] else
                       f"slot at offset {int(r['offset'])} with capacity {int(r['capacity'])} overflows 64 bits")
                self._bad_entry(keys, i, why, bad)
            rows["node"][wrong] = ABSENT
        return rows

    def merge(self, parts: list, replies: list[LookupResult], epoch) -> LookupResult:
        """One reply of the replies to the ``parts`` ((start, end) slices) of a split lookup
        (``epoch``: the last one known, for a last reply that carries none)."""
        nodes: dict = {}
        for r in replies:
            nodes.update(r.nodes or {})
        if replies[-1].epoch is not None:
            epoch = replies[-1].epoch
        if all(r.records for r in replies):
            nids: dict = {}
            for r in replies:
                nids.update(r.nids or {})
            gone = []
            for (a, b), r in zip(parts, replies):
                g = np.frombuffer(r.missing or b"", "<u4")
                if len(g) and int(g.max()) >= b - a:
                    raise self._malformed(f"a missing index beyond its {b - a} keys")
                gone.append(g.astype(np.int64) + a)
            missing = np.concatenate(gone).astype("<u4").tobytes() if any(len(g) for g in gone) else None
            return LookupResult(True, epoch, nodes or None, b"".join(r.recs for r in replies), nids, missing)
        locs: list = []
        for (a, b), r in zip(parts, replies):
            locs += r.locs if not r.records else self._record_lists(r, b - a)
        return LookupResult(False, epoch, nodes, locs=locs)

    def _record_lists(self, reply: LookupResult, n: int) -> list:
        """A ``recs`` reply of ``n`` keys as ``locs`` lists (to merge it with a ``locs`` reply of a split batch)."""
        missing = set(np.frombuffer(reply.missing or b"", "<u4").tolist())
        rows = iter(np.frombuffer(reply.recs, LOC_DTYPE).tolist())
        nids = reply.nids or {}
        out: list = []
        try:
            for i in range(n):
                if i in missing:
                    out.append(None)
                    continue
                node, *fields = next(rows)
                out.append([nids.get(node, f"?{node}"), *fields])
        except StopIteration:
            raise self._malformed(f"fewer records than its {n} keys less the missing ones") from None
        return out
