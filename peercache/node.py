"""A PeerCache node: pool + data endpoint + control endpoint + discovery client.

A node may produce (it has a pool that peers read one-sided), consume (it
looks keys up and reads them into its own buffers), or both. The node named
by ``--discovery-addr`` also hosts discovery and the directory.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from enum import IntEnum
from typing import Any, Callable, Sequence

import numpy as np

from . import auth as _auth
from . import tags
from .directory import DirectoryCache, Location
from .discovery import DEFAULT_HEARTBEAT_TIMEOUT, MetaService
from .errors import ConfigError, DiscoveryUnreachable, PeerCacheError, RpcError
from .pool import Pool, SlotRef
from .rpc import DEFAULT_LIMITS, Limits, RpcClient, RpcServer
from .transport import make_transport
from .transport.base import (ABSENT, CHECK_INTEGRITY, CHECK_PATTERN, LOC_DTYPE, STATUS_TEXT, Status,
                             native_module, slot_ops)

log = logging.getLogger(__name__)

POOL_REGION = 1
WILDCARDS = ("0.0.0.0", "::", "")
_U32, _U64 = (1 << 32) - 1, (1 << 64) - 1


def checked_location(raw) -> tuple[Location | None, str | None]:
    """``(Location, None)`` from a directory reply's entry, or ``(None, why)`` when it cannot be a slot.

    The directory stores what producers publish; a corrupt or hostile publish
    (a negative offset, a length beyond the slot, a string where a number
    belongs) must become a per-key error, never a raw exception in the reader.
    """
    fields = Location._fields
    if not isinstance(raw, (list, tuple)) or len(raw) != len(fields):
        return None, f"expected {len(fields)} fields, got {str(raw)[:80]}"
    node_id, *nums = raw
    if not isinstance(node_id, str) or not node_id:
        return None, f"node id {str(node_id)[:40]!r} is not a string"
    for name, v in zip(fields[1:], nums):
        if type(v) is not int:
            return None, f"{name} {str(v)[:40]!r} is not an integer"
        if not 0 <= v <= (_U32 if name == "region" else _U64):
            return None, f"{name} {v} is out of range"
    loc = Location(node_id, *nums)
    if loc.length > loc.capacity:
        return None, f"length {loc.length} exceeds the slot capacity {loc.capacity}"
    if loc.offset + tags.HEADER_BYTES + loc.capacity + tags.TRAILER_BYTES > _U64:
        return None, f"slot at offset {loc.offset} with capacity {loc.capacity} overflows 64 bits"
    return loc, None


class Get(IntEnum):
    """Outcome of one key in a batch read."""

    HIT = 0
    MISS = 1
    ERROR = 2


class BatchResult:
    """Per-key outcome of a batch read plus the first error's reason."""

    __slots__ = ("status", "lengths", "generations", "error", "invalid", "content_mismatch")

    def __init__(self, status: np.ndarray, lengths: np.ndarray, generations: np.ndarray,
                 error: str | None, invalid: frozenset = frozenset(),
                 content_mismatch: np.ndarray | None = None):
        self.status, self.lengths, self.generations, self.error = status, lengths, generations, error
        #: indices whose directory entry was invalid (status ERROR; see :func:`checked_location`)
        self.invalid = invalid
        #: with ``check_pattern``: indices of hits whose bytes are not the bench pattern
        self.content_mismatch = np.empty(0, np.intp) if content_mismatch is None else content_mismatch

    @property
    def hits(self) -> int:
        return int((self.status == Get.HIT).sum())

    @property
    def errors(self) -> int:
        return int((self.status == Get.ERROR).sum())


class Node:
    """One process's membership in a PeerCache cluster."""

    #: directory entries refused by :func:`checked_location` so far (each read as an ERROR)
    bad_locations = 0
    #: keys whose location (cached or fresh) no longer matched the slot's tag and were looked up again
    stale_locations = 0
    #: with integrity on: hits refused because the payload did not match its slot checksum
    integrity_failures = 0
    #: with integrity on: hits refused because the producer wrote no checksum (integrity off there)
    integrity_missing = 0

    def __init__(self, discovery_addr: str, *, protocol: str = "tcp", bind_host: str = "127.0.0.1",
                 host_discovery: bool = False, pool_slots: int = 0, slot_capacity: int = 0,
                 max_channels: int = 4, dir_cache_ttl: float = 0.0,
                 heartbeat_interval: float = 1.0, heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT,
                 rpc_timeout: float = 5.0, name: str | None = None, transport_options: dict | None = None,
                 auth_key: bytes | str | None = None, integrity: bool = False):
        if heartbeat_interval <= 0 or heartbeat_interval >= heartbeat_timeout:
            raise ConfigError(f"heartbeat interval {heartbeat_interval}s must be positive and below "
                              f"the timeout {heartbeat_timeout}s")
        self.discovery_addr = discovery_addr
        self.protocol = protocol
        self.bind_host = bind_host
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.heartbeat_interval = heartbeat_interval
        #: write a checksum of each payload at put, and check it before a read is a hit
        self.integrity = bool(integrity)
        self._integrity_logged = (float("-inf"), 0, 0)   # (when, failures, missing) at the last log line
        self.cache = DirectoryCache(dir_cache_ttl)
        self.peers: dict[str, dict[str, Any]] = {}
        self.node_id: str | None = None
        #: issued by discovery at registration; proves requests in this node's name
        self.token: str | None = None
        #: discovery's request limits (from its register reply); batches are split to fit
        self.limits: Limits = DEFAULT_LIMITS
        #: keys this node published that stayed with another node (their owner)
        self.publish_refused = 0
        #: Keys whose publish was refused (another node still owns the entry, e.g. a producer that
        #: vanished without leaving): retried on every heartbeat until that owner is gone.
        self._refused: set[bytes] = set()
        self.epoch = 0
        self.meta: MetaService | None = None
        self.server: RpcServer | None = None
        self.control: RpcServer | None = None
        self.pool: Pool | None = None
        #: native peer handles indexed by the cache's node index (None = not connected)
        self._handles: list = []
        self._handles_lock = threading.Lock()
        #: held across "which keys are still in the pool" + their publish RPC (see put_batch)
        self._publish_lock = threading.Lock()
        self._native = None
        self._stop = threading.Event()
        self._hb: threading.Thread | None = None
        #: CURVE keys from the cluster secret (auth_key=, else $PEERCACHE_AUTH_KEY); None = no auth
        #: what this node holds of the cluster secret: the CURVE keys of the control plane and
        #: the token of the data servers' handshake (empty without a secret)
        self.credentials = _auth.Credentials.of(_auth.resolve(auth_key))
        self.auth = self.credentials.curve
        try:
            self.transport = make_transport(protocol, max_channels=max_channels, **(transport_options or {}))
            self.transport.use_credentials(self.credentials)
            mod, _ = native_module()
            if mod is not None and self.transport.native and self.cache.native:
                self._native = mod
            if host_discovery:
                self.meta = MetaService(heartbeat_timeout)
                self.server = RpcServer(discovery_addr, self.meta.handlers(), auth=self.auth,
                                        limits=self.meta.limits, deferred_ops=("members",),
                                        warn_open=True).start()
            self.discovery = RpcClient(discovery_addr, timeout=rpc_timeout, what="discovery", auth=self.auth)
            data_info: dict[str, Any] = {}
            if pool_slots:
                self.pool = Pool(pool_slots, slot_capacity, region_id=POOL_REGION, integrity=self.integrity)
                self.transport.expose(POOL_REGION, self.pool.mm, self.pool.rkey,
                                      fd=self.pool.fd, size=self.pool.size)
                data_info = self.transport.start(bind_host)
                handlers = self.transport.control_handlers()
                if handlers is not None:
                    # A producer whose transport needs set-up per consumer (rdma: QP
                    # exchange) serves it on its own control endpoint on the bind host.
                    self.control = RpcServer(f"{bind_host}:0", handlers, auth=self.auth).start()
                    data_info["control_port"] = self.control.port
            control = self.control or self.server
            self.info = {"name": self.name, "host": socket.gethostname(), "pid": os.getpid(),
                         "protocol": protocol, "data": data_info,
                         "control": control.address if control else None}
            if self.pool is not None:
                # discovery refuses locations outside the regions a node registered
                self.info["regions"] = [[POOL_REGION, self.pool.size]]
            self._register()
        except BaseException:
            self.close(leave=False)
            raise
        self._hb = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        self._hb.start()

    # -- membership -------------------------------------------------------------
    def _register(self) -> None:
        again = {"node_id": self.node_id, "token": self.token} if self.node_id and self.token else {}
        reply = self.discovery.call("register", info=self.info, **again)
        self.node_id, self.epoch = reply["node_id"], reply["epoch"]
        self.token = reply.get("token")
        self.limits = Limits.from_dict(reply.get("limits"))

    def _heartbeat_loop(self) -> None:
        # A socket of its own: a heartbeat never waits for this node's other requests (a big
        # lookup in flight, or one waiting out its timeout) to release the shared client.
        hb = RpcClient(self.discovery_addr, timeout=self.discovery.timeout, what="discovery", auth=self.auth)
        try:
            self._heartbeats(hb)
        finally:
            hb.close()

    def _heartbeats(self, hb: RpcClient) -> None:
        while not self._stop.wait(self.heartbeat_interval):
            try:
                reply = hb.call("heartbeat", node_id=self.node_id, token=self.token)
                if not reply["known"]:
                    log.warning("discovery forgot node %s; registering again", self.node_id)
                    self._register()
                    self._republish()
                elif self._refused and self.pool is not None:
                    with self._publish_lock:      # as put_batch: never republish a key just evicted
                        retry = [r for k in list(self._refused) if (r := self.pool.ref(k)) is not None]
                        self._refused &= {r.key for r in retry}   # evicted meanwhile: nothing to retry
                        if retry:
                            self._publish(retry, [])
            except PeerCacheError as e:
                log.warning("heartbeat failed: %s", e)

    def _republish(self) -> None:
        if self.pool is None:
            return
        self._publish(self.pool.refs(), [])

    # -- producing ------------------------------------------------------------------
    def _loc(self, ref: SlotRef) -> list:
        return [self.node_id, POOL_REGION, self.pool.rkey, ref.offset, ref.length,
                ref.capacity, ref.generation, ref.key_hash]

    def _publish(self, refs: Sequence[SlotRef], evicted: Sequence[bytes]) -> None:
        """Publish ``refs`` and unpublish ``evicted``: one RPC, or as many as discovery's limits need."""
        keys = [r.key for r in refs]
        locs = [self._loc(r) for r in refs]
        evicted = list(evicted)
        parts = list(self._chunks(keys, 100 + len(self.node_id or "")))
        together = len(parts) == 1 and len(list(self._chunks(evicted, 8))) == 1
        refused, example = 0, None
        self._refused.difference_update(keys)
        for a, b in parts:
            reply = self.discovery.call("publish", node_id=self.node_id, token=self.token, keys=keys[a:b],
                                        locs=locs[a:b], unpublish=evicted if together else [])
            if reply.get("refused"):
                refused += reply["refused"]
                example = example or (reply.get("refused_keys") or [None])[0]
                self._refused.update(keys[a + i] for i in reply.get("refused_index") or [])
        if evicted and not together:
            self._unpublish(evicted)
        if refused:
            self.publish_refused += refused
            log.warning("%d key(s) (e.g. %r) were already published by another node and stay with it: "
                        "only the owner of a directory entry may overwrite it", refused, example)

    def _unpublish(self, keys: Sequence[bytes]) -> int:
        n = 0
        for a, b in self._chunks(keys, 8):
            n += self.discovery.call("unpublish", node_id=self.node_id, token=self.token,
                                     keys=list(keys[a:b]))["unpublished"]
        return n

    def _chunks(self, keys: Sequence[bytes], per_key: int):
        """(start, end) slices of ``keys`` that fit one request under discovery's limits.

        ``per_key`` is what each key adds to a request beyond its own bytes.
        One slice (maybe empty) when everything fits, the common case.
        """
        lim = self.limits
        budget = lim.max_message_bytes - (64 << 10)
        n = len(keys)
        if n <= lim.max_keys_per_request and sum(map(len, keys)) + per_key * n <= budget:
            yield 0, n
            return
        ends = np.cumsum(np.fromiter(map(len, keys), np.int64, n) + per_key)   # bytes up to each key
        start, before = 0, 0
        while start < n:
            fit = int(np.searchsorted(ends, before + budget, side="right"))
            end = min(n, start + lim.max_keys_per_request, max(fit, start + 1))
            yield start, end
            start, before = end, int(ends[end - 1])

    def put_batch(self, keys: Sequence[bytes], values: Sequence | None = None,
                  fill: Callable[[np.ndarray, SlotRef], None] | None = None) -> list[SlotRef]:
        """Write objects into the pool and publish them with one directory RPC."""
        if self.pool is None:
            raise ConfigError("this node has no pool to put into; create it with a pool "
                              "(Client(pool_bytes=...) or peercache-bench serve)")
        refs, evicted = [], {}
        for i, k in enumerate(keys):
            ref, old = self.pool.put(k, None if values is None else values[i], fill)
            refs.append(ref)
            if old is not None:
                evicted[old.key] = None
        # A batch larger than the free slots evicts its own earlier keys, and a
        # repeated key leaves an older ref behind: publish exactly the refs that
        # are still current and unpublish every evicted key no longer in the
        # pool. The check and the RPC are one step under the lock, so a
        # concurrent put_batch/remove_batch cannot publish a key after its
        # eviction was unpublished.
        with self._publish_lock:
            live = [r for r in refs if self.pool.ref(r.key) == r]
            gone = [k for k in evicted if self.pool.ref(k) is None]
            self._publish(live, gone)
        return refs

    def remove_batch(self, keys: Sequence[bytes]) -> int:
        """Remove objects from the pool and the directory."""
        removed = [k for k in keys if self.pool is not None and self.pool.remove(k) is not None]
        if removed:
            with self._publish_lock:
                self._unpublish(removed)
        return len(removed)

    # -- consuming ------------------------------------------------------------------
    def lookup(self, keys: Sequence[bytes], use_cache: bool = True,
               bad: list | None = None) -> list[Location | None]:
        """Locations of ``keys``: cached ones, the rest with one directory RPC.

        An invalid directory entry reads as None; with ``bad`` its
        ``(index, why)`` is appended there. Invalid entries are never cached.
        """
        locs = self.cache.get_many(keys) if use_cache else [None] * len(keys)
        missing = [i for i, l in enumerate(locs) if l is None]
        if missing:
            sub_bad: list = []
            fresh = self._directory_lookup([keys[i] for i in missing], sub_bad)
            for i, l in zip(missing, fresh):
                locs[i] = l
            self.cache.put_many([keys[i] for i in missing], fresh)
            if bad is not None:
                bad.extend((missing[j], why) for j, why in sub_bad)
        return locs

    def _directory_lookup(self, keys: Sequence[bytes], bad: list | None = None) -> list[Location | None]:
        """One lookup RPC (no cache); remembers the endpoints and epoch the reply carries.

        Entries that cannot be a slot become None, counted in ``bad_locations``
        and appended to ``bad`` as ``(index, why)``.
        """
        reply = self._lookup_rpc(keys)
        self.peers.update(reply["nodes"])
        self.epoch = reply["epoch"]
        out: list[Location | None] = []
        for i, raw in enumerate(reply["locs"]):
            if raw is None:
                out.append(None)
                continue
            loc, why = checked_location(raw)
            if loc is None:
                self.bad_locations += 1
                if self.bad_locations == 1:
                    log.warning("directory entry of %r is invalid (%s); reading it as an error", keys[i], why)
                if bad is not None:
                    bad.append((i, why))
            out.append(loc)
        return out

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

    def get_batch_into(self, keys: Sequence[bytes], dest, offsets: Sequence[int] | np.ndarray,
                       capacities: Sequence[int] | np.ndarray | None = None, *,
                       check_pattern: bool = False) -> BatchResult:
        """Read ``keys`` into ``dest`` at ``offsets``; per-key HIT / MISS / ERROR.

        A location whose slot tag does not match (evicted, reused, torn) is
        looked up once more without the cache; if it still does not match it
        is a miss. Bytes of a miss or an error in ``dest`` are unspecified.
        With integrity on, a hit's payload must match the checksum its producer
        wrote (else it is a miss, counted in :attr:`integrity_failures`).
        ``check_pattern`` (the bench): each hit is compared with the bench content
        of its (key, generation) in the same native pass; the ones that differ
        are listed in :attr:`BatchResult.content_mismatch`.
        """
        n = len(keys)
        if not isinstance(keys, list):
            keys = list(keys)
        native = self._native is not None
        offsets = np.ascontiguousarray(offsets, dtype=np.uint64)
        caps = None if capacities is None else np.ascontiguousarray(capacities, dtype=np.uint64)
        if len(offsets) != n or (caps is not None and len(caps) != n):
            raise ConfigError(f"get_batch_into: {n} keys but {len(offsets)} offsets"
                              + ("" if caps is None else f" and {len(caps)} capacities"))
        locate, read = (self._locate_native, self._read_native) if native else (self._locate, self._read)
        if native:
            self.transport.prepare_local(dest)   # rdma: registered on every rail (cached)
        checks = (CHECK_PATTERN if check_pattern else 0) | (CHECK_INTEGRITY if self.integrity else 0)
        status = np.full(n, int(Get.MISS), dtype=np.int8)
        lengths = np.zeros(n, dtype=np.uint64)
        gens = np.zeros(n, dtype=np.uint64)
        content = np.zeros(n, dtype=bool)
        bad: list = []
        locs = locate(keys, bad, True)
        error, stale = read(keys, locs, dest, offsets, caps, status, lengths, gens, content, checks)
        if len(stale):
            # A tag mismatch: the slot was evicted, reused or torn. One fresh lookup, then a miss.
            self.stale_locations += len(stale)
            skeys = [keys[i] for i in stale]
            self.cache.invalidate(skeys)
            bad2: list = []
            again = locate(skeys, bad2, False)
            bad += [(int(stale[j]), why) for j, why in bad2]
            m = len(stale)
            s_st, s_len, s_gen = np.full(m, int(Get.MISS), np.int8), np.zeros(m, np.uint64), np.zeros(m, np.uint64)
            s_content = np.zeros(m, dtype=bool)
            err2, _ = read(skeys, again, dest, offsets[stale], None if caps is None else caps[stale],
                           s_st, s_len, s_gen, s_content, checks)
            status[stale], lengths[stale], gens[stale], content[stale] = s_st, s_len, s_gen, s_content
            error = error or err2
        error, invalid = self._mark_invalid(keys, bad, status, error)
        if self.integrity:
            self._report_integrity()
        return BatchResult(status, lengths, gens, error, invalid, np.flatnonzero(content))

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

    # The two read paths of get_batch_into: ``locate(keys, bad, use_cache)`` gives the locations
    # (invalid entries go to ``bad``), ``read(...)`` fills status/lengths/gens and returns (first
    # error, indices whose slot tag did not match). The stale retry above is shared.

    def _locate(self, keys: list, bad: list, use_cache: bool) -> list:
        return self.lookup(keys, use_cache=use_cache, bad=bad)

    def _locate_native(self, keys: list, bad: list, use_cache: bool) -> np.ndarray:
        locs = np.empty(len(keys), dtype=LOC_DTYPE)
        if use_cache:
            if self.cache.lookup_into(keys, locs) == len(keys):
                return locs
        else:
            locs["node"] = ABSENT
        self._fill_from_directory(keys, locs, bad)
        return locs

    def _fill_from_directory(self, keys: list, locs: np.ndarray, bad: list | None = None) -> None:
        """Look up the rows of ``locs`` that are ABSENT with one directory RPC.

        Invalid entries stay ABSENT and go to ``bad`` as ``(index into keys, why)``.
        """
        miss = np.flatnonzero(locs["node"] == ABSENT)
        mkeys = [keys[i] for i in miss]
        sub_bad: list = []
        rows = self.cache.rows(self._directory_lookup(mkeys, sub_bad))
        locs[miss] = rows
        self.cache.put_rows(mkeys, rows)
        if bad is not None:
            bad.extend((int(miss[j]), why) for j, why in sub_bad)

    def _read_native(self, keys, locs, dest, offsets, caps, status, lengths, gens, content,
                     checks: int) -> tuple[str | None, np.ndarray]:
        """One native batch (all nodes, payload checks in the same pass); returns (first error,
        indices of stale tags)."""
        mod = self._native
        codes = np.empty(len(locs), dtype=np.int32)
        args = (locs, dest, offsets, caps, status, lengths, gens, codes, checks)
        hits, stale, need, errors, ecode, enode, etext, c_bad, k_bad, k_missing = mod.read_slots(self._handles, *args)
        error = None
        if need:
            error, made = self._connect_needed(locs, codes)
            if made:
                hits, stale, need, errors, ecode, enode, etext, c_bad, k_bad, k_missing = mod.read_slots(
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
        if c_bad:
            content |= codes == mod.CONTENT_MISMATCH
        self.integrity_failures += k_bad
        self.integrity_missing += k_missing
        return error, (np.flatnonzero(codes == mod.TAG_MISMATCH) if stale else np.empty(0, np.intp))

    def _handle_alive(self, idx: int) -> bool:
        with self._handles_lock:
            h = self._handles[idx] if idx < len(self._handles) else None
        return h is None or h.alive()

    def _connect_needed(self, locs, codes) -> tuple[str | None, int]:
        """Open native handles for the nodes a batch needs: (first failure's text, handles made)."""
        error, made = None, 0
        for idx in np.unique(locs["node"][codes == self._native.NEED_PEER]).tolist():
            node_id = self.cache.node_id(idx)
            info = self._data_endpoint(node_id)
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

    def _read(self, keys, locs, dest, offsets, capacities, status, lengths, gens, content,
              checks: int) -> tuple[str | None, np.ndarray]:
        """The Python batch path (the reference): one transport batch per node, tags and payload
        checks here."""
        n = len(keys)
        tagbuf = np.zeros((n, tags.TAG_WORDS), dtype=np.uint64)
        refused = np.zeros(n, dtype=bool)   # misses by integrity: the bytes are wrong, not stale
        tagbytes = tagbuf.view(np.uint8).reshape(-1)
        by_node: dict[str, list[int]] = {}
        for i, loc in enumerate(locs):
            if loc is None:
                continue
            if capacities is not None and loc.length > int(capacities[i]):
                status[i] = Get.ERROR
                continue
            by_node.setdefault(loc.node_id, []).append(i)
        error = None
        for node_id, idxs in by_node.items():
            info = self._data_endpoint(node_id)
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
                                ii * tags.TAG_BYTES, offsets[idxs])
            st = np.asarray(self.transport.read_batch(node_id, info, ops, [tagbytes, dest]))
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
                kh = np.fromiter((locs[i].key_hash for i in good), np.uint64, len(good))
                gen = np.fromiter((locs[i].generation for i in good), np.uint64, len(good))
                match = tags.check_tags(tagbuf[good], kh, gen, ln[ok_ops])
                if checks:
                    keep = self._check_payloads(dest, offsets, good, kh, gen, ln[ok_ops], tagbuf, match,
                                                content, checks)
                    refused[good[match & ~keep]] = True
                    match &= keep
                status[good[match]] = Get.HIT
                lengths[good[match]] = ln[ok_ops][match]
                gens[good[match]] = gen[match]
        located = np.fromiter((loc is not None for loc in locs), bool, n)
        return error, np.flatnonzero((status == Get.MISS) & located & ~refused)

    def _check_payloads(self, dest, offsets, good, kh, gen, ln, tagbuf, match, content, checks) -> np.ndarray:
        """The payload checks of the Python path on the keys ``good`` whose tags ``match``: False
        where integrity refuses the bytes (a miss); bench-pattern mismatches go to ``content``."""
        keep = np.ones(len(good), dtype=bool)
        view = np.frombuffer(dest, dtype=np.uint8) if not isinstance(dest, np.ndarray) else dest.reshape(-1).view(np.uint8)
        for j in np.flatnonzero(match):
            i, o, k = int(good[j]), int(offsets[good[j]]), int(ln[j])
            page = view[o:o + k]
            if checks & CHECK_INTEGRITY:
                want = int(tagbuf[i, tags.CHECKSUM])
                if want == 0:
                    self.integrity_missing += 1
                    keep[j] = False
                    continue
                if tags.checksum(page, int(kh[j]), int(gen[j])) != want:
                    self.integrity_failures += 1
                    keep[j] = False
                    continue
            if checks & CHECK_PATTERN and not tags.verify_patterns(page.reshape(1, -1), kh[j:j + 1], gen[j:j + 1])[0]:
                content[i] = True
        return keep

    def _data_endpoint(self, node_id: str) -> dict[str, Any] | None:
        peer = self.peers.get(node_id)
        if peer is None:
            return None
        data = dict(peer.get("data") or {})
        if data.get("host") in WILDCARDS:
            # A producer listening on all interfaces is reached where discovery is.
            data["host"] = self.discovery_addr.rpartition(":")[0].strip("[]")
        return data

    def exists_batch(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether the directory knows each key (no data is read).

        A key whose entry is invalid is known (a read of it is an error, not a miss).
        """
        bad: list = []
        present = [l is not None for l in self.lookup(keys, bad=bad)]
        for i, _ in bad:
            present[i] = True
        return present

    def members(self) -> dict[str, dict[str, Any]]:
        """Current membership as discovery sees it."""
        return self.discovery.call("members")["nodes"]

    # -- lifecycle ------------------------------------------------------------------
    def add_handler(self, op: str, fn, owner_only: bool = True) -> None:
        """Serve an extra control op (only on the discovery-hosting node).

        With ``owner_only`` a request must come from a registered node, with
        the token discovery issued it (a peer's :meth:`call`); others are refused.
        """
        if self.server is None or self.meta is None:
            raise ConfigError("only the node that hosts discovery serves extra ops")
        self.server.handlers[op] = self.meta.owner_only(op, fn) if owner_only else fn

    def call(self, op: str, timeout: float | None = None, **fields) -> dict:
        """Send ``op`` to discovery in this node's name (its id and token), e.g. serve's reader_done."""
        return self.discovery.call(op, timeout=timeout, node_id=self.node_id, token=self.token, **fields)

    def _lookup_rpc(self, keys: Sequence[bytes]) -> dict:
        """The lookup reply for ``keys``: one RPC, or as many as discovery's limits need, merged."""
        parts = list(self._chunks(keys, 8))
        if len(parts) == 1:
            return self.discovery.call("lookup", keys=list(keys))
        locs: list = []
        nodes: dict = {}
        epoch = self.epoch
        for a, b in parts:
            r = self.discovery.call("lookup", keys=list(keys[a:b]))
            locs += r["locs"]
            nodes.update(r["nodes"])
            epoch = r["epoch"]
        return {"locs": locs, "nodes": nodes, "epoch": epoch}

    def close(self, leave: bool = True) -> None:
        """Leave the cluster and release every resource (idempotent)."""
        self._stop.set()
        if self._hb is not None and self._hb is not threading.current_thread():
            self._hb.join(timeout=5)
        disc = getattr(self, "discovery", None)
        if leave and disc is not None and self.node_id:
            try:
                disc.call("leave", node_id=self.node_id, token=self.token, timeout=1.0)
            except (RpcError, DiscoveryUnreachable):
                pass
        if disc is not None:
            disc.close()
            self.discovery = None
        tr = getattr(self, "transport", None)
        if tr is not None:
            tr.close()
            self.transport = None
        if self.control is not None:
            self.control.stop()
            self.control = None
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.meta is not None:
            self.meta.stop()
            self.meta = None
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def __enter__(self) -> "Node":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
