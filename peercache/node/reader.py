"""Batch reads: keys located, their slots read one-sided into the caller's buffer, checked."""
from __future__ import annotations

import logging
import threading
import time
from time import perf_counter
from typing import Sequence

import numpy as np

from .. import tags
from ..directory.cache import DirectoryCache
from ..directory.location import Location
from ..errors import ConfigError, PeerCacheError
from ..transport.base import (ABSENT, CHECK_INTEGRITY, CHECK_PATTERN, STATUS_TEXT, Status, Transport, checksum,
                              slot_ops)
from .deadline import Deadline
from .peers import PeerInfos
from .resolver import Resolver
from .result import NO_INDICES, BatchResult, Get

log = logging.getLogger("peercache.node")

_MISS = int(Get.MISS)


class Reader:
    """:meth:`get_batch_into`: locate the keys (``resolver``), read their slots, and look up once
    more the ones whose slot's tag did not match (the stale retry), then a miss.

    Two read paths, with the same answers: the native one (``native``, the module, where the
    transport has native handles: one native batch over all nodes, tags and payload checks in the
    same pass, without the GIL), and one transport batch per node with the checks here (a
    transport without native handles; ``native`` None).

    A call has ``timeout`` seconds in all (a :class:`~.deadline.Deadline` set when it starts and
    handed to every tier): the keys it could not locate or read in that time are errors listed in
    :attr:`BatchResult.timed_out`, with a reason naming the step that used the time, never misses.
    A data read already under way is bounded by the transport's own timeout (tcp: the node sets
    it to ``timeout``; rdma: its completion timeout): the native batch takes no deadline of its
    own, so a read that hangs after earlier steps used part of the time may end the call up to
    that much later.
    """

    def __init__(self, native, transport: Transport, cache: DirectoryCache, resolver: Resolver, peers: PeerInfos,
                 integrity: bool, timeout: float):
        #: the native module when the batch reads natively, else None
        self.native = native
        self.transport, self.cache, self.resolver, self.peers = transport, cache, resolver, peers
        #: check each payload against the checksum its producer wrote before a read is a hit
        self.integrity = integrity
        #: seconds a batch read has in all, every tier included
        self.timeout = timeout
        #: the cache's native map for the one-call fast path (None with the cache off), and its clock
        self._cmap, self._clock = (cache.native_map, cache.clock) if cache is not None else (None, None)
        #: what makes a destination buffer ready for the transport (rdma: registered); None where nothing does
        self._prepare = None if transport is None or type(transport).prepare_local is Transport.prepare_local \
            else transport.prepare_local
        #: native peer handles indexed by the cache's node index (None = not connected)
        self._handles: list = []
        self._handles_lock = threading.Lock()
        #: keys whose location (cached or fresh) no longer matched the slot's tag and were looked up again
        self.stale_locations = 0
        #: with integrity on: hits refused because the payload did not match its slot checksum
        self.integrity_failures = 0
        #: with integrity on: hits refused because the producer wrote no checksum (integrity off there)
        self.integrity_missing = 0
        #: reads refused because the directory's entry (after one fresh lookup) pointed at another key's
        #: slot: the slot's tag holds another key's hash (each a miss, see BatchResult.redirected)
        self.redirected_entries = 0
        self._redirects_logged = (float("-inf"), 0)          # (when, redirected_entries) at the last log line
        self._integrity_logged = (float("-inf"), 0, 0)       # (when, failures, missing) at the last log line
        #: what records each batch call (``record(seconds, status, lengths)``: the metrics' batch
        #: stats, :class:`peercache.metrics.BatchStats`), None when nobody asks: then a call costs one test
        self.batches = None

    def get_batch_into(self, keys: Sequence[bytes], dest, offsets: Sequence[int] | np.ndarray,
                       capacities: Sequence[int] | np.ndarray | None = None, *,
                       check_pattern: bool = False, deadline: Deadline | None = None) -> BatchResult:
        """:meth:`peercache.node.Node.get_batch_into` (``dest``: one buffer, or a list of one per key)."""
        recorder = self.batches
        started = perf_counter() if recorder is not None else 0.0
        n = len(keys)
        if not isinstance(keys, list):
            keys = list(keys)
        native = self.native is not None
        offsets = np.ascontiguousarray(offsets, dtype=np.uint64)
        caps = None if capacities is None else np.ascontiguousarray(capacities, dtype=np.uint64)
        many = isinstance(dest, (list, tuple))     # one buffer per key (the caller's own): still one batch
        if len(offsets) != n or (caps is not None and len(caps) != n) or (many and len(dest) != n):
            raise ConfigError(f"get_batch_into: {n} keys but {len(offsets)} offsets"
                              + ("" if caps is None else f" and {len(caps)} capacities")
                              + (f" and {len(dest)} destination buffers" if many else ""))
        if many and not isinstance(dest, list):
            dest = list(dest)
        locate, read = ((self.resolver.lookup_rows, self.read_native) if native
                        else (self.resolver.locate, self.read_via_transport))
        if native and self._prepare is not None:
            for buf in (dest if many else (dest,)):
                self._prepare(buf)   # rdma: registered on every rail (cached)
        checks = (CHECK_PATTERN if check_pattern else 0) | (CHECK_INTEGRITY if self.integrity else 0)
        cmap = self._cmap if native and deadline is None else None
        if cmap is not None:
            # The fast path: every key cached and every key a hit, in one native call (read_cached) that
            # looks the keys up and reads their slots; anything else (a key not cached, a stale slot, a
            # node to connect, a failed check or op) is read again below by the full path.
            status = np.empty(n, dtype=np.int8)
            lengths = np.empty(n, dtype=np.uint64)
            gens = np.empty(n, dtype=np.uint64)
            if self.native.read_cached(cmap, keys, self._clock(), self._handles, dest, offsets, caps, status,
                                       lengths, gens, checks):
                if recorder is not None:
                    recorder.record(perf_counter() - started, status, lengths)
                return BatchResult(status, lengths, gens, None, frozenset(),
                                   NO_INDICES if checks & CHECK_PATTERN else None, hits=n)
        # Per call: only the arrays the result hands back (np.full's Python wrapper costs a
        # microsecond of a 4 KiB GET's ~20, so the status array is filled in place).
        status = np.empty(n, dtype=np.int8)
        status.fill(_MISS)
        lengths = np.zeros(n, dtype=np.uint64)
        gens = np.zeros(n, dtype=np.uint64)
        content = np.zeros(n, dtype=bool)
        want = np.empty(n, dtype=np.uint64)      # the hash of each key asked for (locate fills it)
        bad: list = []
        if deadline is None:
            deadline = Deadline(self.timeout)
        locs = locate(keys, bad, want, deadline=deadline)
        late = deadline.take_late()              # index arrays of keys not answered in time ([]: none)
        if deadline.over():
            # Located, but no time left: not read, rather than read past the bound.
            late.append(self._located(locs, native))
            error, stale = None, NO_INDICES
        else:
            error, stale, _ = self._read_in_time(read, deadline, late, keys, want, locs, dest, offsets, caps,
                                                 status, lengths, gens, content, checks)
        redirected, reason = None, None
        if len(stale):
            # A tag mismatch: the slot was evicted, reused or torn, or holds another key. One fresh
            # lookup (if time is left), then a miss.
            self.stale_locations += len(stale)
            skeys = [keys[i] for i in stale]
            bad2: list = []
            again = self.resolver.relocate(skeys, bad2, as_rows=native, deadline=deadline) \
                if not deadline.over() else None
            bad += [(int(stale[j]), why) for j, why in bad2]
            m = len(stale)
            s_st, s_len, s_gen = np.full(m, int(Get.MISS), np.int8), np.zeros(m, np.uint64), np.zeros(m, np.uint64)
            s_content = np.zeros(m, dtype=bool)
            err2, other = None, NO_INDICES
            if again is None or deadline.over():
                late.append(stale)
            else:
                sub_late = deadline.take_late()   # indices into skeys
                sdest = [dest[i] for i in stale] if many else dest
                err2, _, other = self._read_in_time(read, deadline, sub_late, skeys, want[stale], again, sdest,
                                                    offsets[stale], None if caps is None else caps[stale],
                                                    s_st, s_len, s_gen, s_content, checks)
                late += [stale[i] for i in sub_late]
            status[stale], lengths[stale], gens[stale], content[stale] = s_st, s_len, s_gen, s_content
            error = error or err2
            if len(other):
                redirected, reason = stale[other], self._redirected(skeys, again, other)
        # keys whose object is larger than its room: ERROR, with the object's size in lengths (never bytes)
        too_big = np.flatnonzero((status == Get.ERROR) & (lengths > caps)) \
            if error is not None and caps is not None else NO_INDICES
        timed_out = NO_INDICES
        if late:
            timed_out = np.unique(np.concatenate(late))
            if len(timed_out):
                status[timed_out] = Get.ERROR
                error = deadline.reason(len(timed_out))
        error, invalid = self._mark_invalid(keys, bad, status, error)
        if self.integrity:
            self._report_integrity()
        if recorder is not None:
            recorder.record(perf_counter() - started, status, lengths)
        return BatchResult(status, lengths, gens, error, invalid,
                           np.flatnonzero(content) if checks & CHECK_PATTERN else None, redirected, reason,
                           timed_out, too_big)

    def _read_in_time(self, read, deadline: Deadline, late: list, keys, want, locs, dest, offsets, caps,
                      status, lengths, gens, content, checks: int):
        """``read`` (one of the read paths below) of the located keys. When it failed and the call's
        time is over, its failed keys go to ``late`` and the failure is noted on ``deadline``."""
        since = time.monotonic()
        error, stale, other = read(keys, want, locs, dest, offsets, caps, status, lengths, gens, content, checks)
        if error and deadline.over():
            deadline.spent("the data read", since, error)
            late.append(np.flatnonzero(status == Get.ERROR))
        return error, stale, other

    @staticmethod
    def _located(locs, native: bool) -> np.ndarray:
        """Indices of the keys ``locs`` holds a location of (rows, or Locations / None)."""
        if native:
            return np.flatnonzero(locs["node"] != ABSENT)
        return np.flatnonzero(np.fromiter((loc is not None for loc in locs), bool, len(locs)))

    @staticmethod
    def _mark_invalid(keys, bad: list, status: np.ndarray, error: str | None) -> tuple[str | None, frozenset]:
        """Set status ERROR for the ``(index, why)`` pairs of ``bad``; (first error, their indices)."""
        if not bad:
            return error, frozenset()
        for i, _ in bad:
            status[i] = Get.ERROR
        i, why = bad[0]
        error = error or (f"directory entry of key {keys[i]!r} is invalid ({why}); it was published "
                          "with a corrupt location")
        return error, frozenset(i for i, _ in bad)

    def _redirected(self, keys: list, locs, idx: np.ndarray) -> str:
        """Count the keys ``idx`` whose (fresh) entry in ``locs`` points at another key's slot, log
        it (one WARNING line per 10 s at most), and return the reason of the first."""
        self.redirected_entries += len(idx)
        i = int(idx[0])
        loc = locs[i]
        node_id, offset = ((loc.node_id, loc.offset) if isinstance(loc, Location)
                           else (self.cache.node_id(int(loc["node"])), int(loc["offset"])))
        reason = (f"the directory's entry for {keys[i]!r} points at another key's slot "
                  f"(node {node_id}, offset {offset}); read as a miss")
        when, count = self._redirects_logged
        if time.monotonic() - when >= 10.0:
            log.warning("%d read(s) since the last report met a directory entry that points at another key's "
                        "slot (total %d), each a miss, never that key's bytes; the first: %s. Such an entry is "
                        "written by whoever can write the directory (its password, a cluster member) or by a "
                        "bug", self.redirected_entries - count, self.redirected_entries, reason)
            self._redirects_logged = (time.monotonic(), self.redirected_entries)
        return reason

    def _report_integrity(self, interval: float = 10.0) -> None:
        """One WARNING line per ``interval`` at most, with the counts since the last one."""
        when, failures, missing = self._integrity_logged
        df, dm = self.integrity_failures - failures, self.integrity_missing - missing
        if (df or dm) and time.monotonic() - when >= interval:
            log.warning("integrity: %d read(s) did not match their slot checksum and %d came from a producer "
                        "that writes none (integrity off there), since the last report; each was a miss, "
                        "no bytes returned (total %d / %d)", df, dm, self.integrity_failures,
                        self.integrity_missing)
            self._integrity_logged = (time.monotonic(), self.integrity_failures, self.integrity_missing)

    # The two read paths: ``read(keys, want, locs, ...)`` fills status/lengths/gens and returns
    # (first error, indices whose slot tag did not match, those of them whose slot holds another key).

    def read_native(self, keys, want, locs, dest, offsets, caps, status, lengths, gens, content,
                    checks: int) -> tuple[str | None, np.ndarray, np.ndarray]:
        """One native batch (all nodes, payload checks in the same pass)."""
        mod = self.native
        codes = np.empty(len(locs), dtype=np.int32)
        args = (locs, want, dest, offsets, caps, status, lengths, gens, codes, checks)
        hits, stale, need, errors, ecode, enode, etext, c_bad, k_bad, k_missing, other = mod.read_slots(
            self._handles, *args)
        error = None
        if need:
            error, made = self._connect_needed(locs, codes)
            if made:
                hits, stale, need, errors, ecode, enode, etext, c_bad, k_bad, k_missing, other = mod.read_slots(
                    self._handles, *args)
            if need:
                status[codes == mod.NEED_PEER] = Get.ERROR
        if ecode:
            node_id = self.cache.node_id(enode)
            what = STATUS_TEXT.get(ecode, f"status {ecode}")  # IntEnum keys match plain ints
            error = error or f"read from node {node_id} failed: {what}" + (f" ({etext})" if etext else "")
            if ecode in (Status.PEER_GONE, Status.CONNECTION) or not self._handle_alive(enode):
                # A dead handle (an rdma channel failed) is dropped: the next batch
                # connects again, which resets the channels on both sides.
                self._forget_node(node_id)
        if errors and caps is not None:
            big = np.flatnonzero(codes == mod.TOO_BIG)
            if len(big):
                lengths[big] = locs["length"][big]     # the object's size: see BatchResult.too_big
                error = error or self._too_big_text(keys, lengths, caps, big)
        if c_bad:
            content |= codes == mod.CONTENT_MISMATCH
        self.integrity_failures += k_bad
        self.integrity_missing += k_missing
        if not (stale or other):
            return error, NO_INDICES, NO_INDICES
        return (error, np.flatnonzero((codes == mod.TAG_MISMATCH) | (codes == mod.KEY_MISMATCH)),
                np.flatnonzero(codes == mod.KEY_MISMATCH) if other else NO_INDICES)

    @staticmethod
    def _too_big_text(keys, lengths, caps, big) -> str | None:
        """The first of ``big``: a key whose object is larger than the room the read gave it."""
        if not len(big):
            return None
        i = int(big[0])
        return (f"{keys[i]!r} is a {int(lengths[i])}-byte object, larger than the {int(caps[i])} bytes of room "
                f"the read gave it" + (f" ({len(big)} such keys in the batch)" if len(big) > 1 else ""))

    def _handle_alive(self, idx: int) -> bool:
        with self._handles_lock:
            h = self._handles[idx] if idx < len(self._handles) else None
        return h is None or h.alive()

    def _connect_needed(self, locs, codes) -> tuple[str | None, int]:
        """Open native handles for the nodes a batch needs: (first failure's text, handles made)."""
        error, made = None, 0
        for idx in np.unique(locs["node"][codes == self.native.NEED_PEER]).tolist():
            node_id = self.cache.node_id(idx)
            info = self.peers.data_endpoint(node_id)
            if info is None:
                error = error or f"no endpoint info for node {node_id}"
                continue
            try:
                h = self.transport.native_peer(node_id, info)
            except PeerCacheError as e:
                error = error or f"read from node {node_id} failed: {STATUS_TEXT[Status.PEER_GONE]} ({e})"
                self.cache.drop_node(node_id)
                continue
            with self._handles_lock:
                # Grown in place: threads in read_slots hold their own references.
                self._handles.extend([None] * (idx + 1 - len(self._handles)))
                self._handles[idx] = h
            made += 1
        return error, made

    def _forget_node(self, node_id: str) -> None:
        """Drop cached locations and the connection of a node that failed."""
        self.cache.drop_node(node_id)
        idx = self.cache.node_index(node_id)
        with self._handles_lock:
            if idx < len(self._handles):
                self._handles[idx] = None
        self.transport.forget(node_id)

    def read_via_transport(self, keys, want, locs, dest, offsets, capacities, status, lengths, gens, content,
                           checks: int) -> tuple[str | None, np.ndarray, np.ndarray]:
        """One transport batch per node, tags and payload checks here (the reference)."""
        n = len(keys)
        many = isinstance(dest, list)   # one buffer per key: key i's payload is local buffer SLOT_DEST + i
        tagbuf = np.zeros((n, tags.TAG_WORDS), dtype=np.uint64)
        refused = np.zeros(n, dtype=bool)   # misses by integrity: the bytes are wrong, not stale
        other = np.zeros(n, dtype=bool)     # misses by a slot that holds another key
        tagbytes = tagbuf.view(np.uint8).reshape(-1)
        by_node: dict[str, list[int]] = {}
        for i, loc in enumerate(locs):
            if loc is None:
                continue
            if capacities is not None and loc.length > int(capacities[i]):
                status[i], lengths[i] = Get.ERROR, loc.length     # the object's size: see BatchResult.too_big
                continue
            by_node.setdefault(loc.node_id, []).append(i)
        error = self._too_big_text(keys, lengths, capacities, np.flatnonzero(lengths > 0)) \
            if capacities is not None and (status == Get.ERROR).any() else None
        for node_id, idxs in by_node.items():
            info = self.peers.data_endpoint(node_id)
            if info is None:
                status[idxs] = Get.ERROR
                error = error or f"no endpoint info for node {node_id}"
                continue
            m = len(idxs)
            L = [locs[i] for i in idxs]
            ln = np.fromiter((l.length for l in L), np.uint64, m)
            ii = np.asarray(idxs, dtype=np.uint64)
            ops, key = slot_ops(np.fromiter((l.region for l in L), np.uint32, m),
                                np.fromiter((l.rkey for l in L), np.uint64, m),
                                np.fromiter((l.offset for l in L), np.uint64, m), ln,
                                np.fromiter((l.capacity for l in L), np.uint64, m),
                                ii * tags.TAG_BYTES, offsets[idxs], dest_local=ii.astype(np.uint32) if many else None)
            st = np.asarray(self.transport.read_batch(node_id, info, ops, [tagbytes, *dest] if many
                                                      else [tagbytes, dest]))
            failed = np.zeros(m, dtype=bool)
            np.logical_or.at(failed, key, st != Status.OK)
            ok_ops = ~failed
            idx_arr = np.asarray(idxs)
            if failed.any():
                first = int(st[st != Status.OK][0])
                error = error or f"read from node {node_id} failed: {STATUS_TEXT[Status(first)]}"
                status[idx_arr[failed]] = Get.ERROR
                if first in (Status.PEER_GONE, Status.CONNECTION):
                    self.cache.drop_node(node_id)
            if ok_ops.any():
                good = idx_arr[ok_ops]
                kh = want[good]
                gen = np.fromiter((locs[i].generation for i in good), np.uint64, len(good))
                code = tags.tag_check(tagbuf[good], kh, gen, ln[ok_ops])
                match = code == tags.TAG_OK
                other[good[code == tags.KEY_MISMATCH]] = True
                if checks:
                    keep = self._check_payloads(dest, offsets, good, kh, gen, ln[ok_ops], tagbuf, match,
                                                content, checks)
                    refused[good[match & ~keep]] = True
                    match &= keep
                status[good[match]] = Get.HIT
                lengths[good[match]] = ln[ok_ops][match]
                gens[good[match]] = gen[match]
        located = np.fromiter((loc is not None for loc in locs), bool, n)
        return error, np.flatnonzero((status == Get.MISS) & located & ~refused), np.flatnonzero(other)

    def _check_payloads(self, dest, offsets, good, kh, gen, ln, tagbuf, match, content, checks) -> np.ndarray:
        """The payload checks of :meth:`read_via_transport` on the keys ``good`` whose tags
        ``match``: False where integrity refuses the bytes (a miss); bench-pattern mismatches go
        to ``content``."""
        keep = np.ones(len(good), dtype=bool)
        views = [_bytes_view(d) for d in dest] if isinstance(dest, list) else None
        view = _bytes_view(dest) if views is None else None
        for j in np.flatnonzero(match):
            i, o, k = int(good[j]), int(offsets[good[j]]), int(ln[j])
            page = (view if views is None else views[i])[o:o + k]
            if checks & CHECK_INTEGRITY:
                want = int(tagbuf[i, tags.CHECKSUM])
                if want == 0:
                    self.integrity_missing += 1
                    keep[j] = False
                    continue
                if checksum(page, int(kh[j]), int(gen[j])) != want:
                    self.integrity_failures += 1
                    keep[j] = False
                    continue
            if checks & CHECK_PATTERN and not tags.verify_patterns(page.reshape(1, -1), kh[j:j + 1], gen[j:j + 1])[0]:
                content[i] = True
        return keep


def _bytes_view(buf) -> np.ndarray:
    """``buf`` as a flat uint8 array (no copy)."""
    return buf.reshape(-1).view(np.uint8) if isinstance(buf, np.ndarray) else np.frombuffer(buf, dtype=np.uint8)
