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
from enum import IntEnum
from typing import Any, Callable, Sequence

import numpy as np

from . import tags
from .directory import DirectoryCache, Location
from .discovery import DEFAULT_HEARTBEAT_TIMEOUT, MetaService
from .errors import ConfigError, DiscoveryUnreachable, PeerCacheError, RpcError
from .pool import Pool, SlotRef
from .rpc import RpcClient, RpcServer
from .transport import make_transport
from .transport.base import ABSENT, LOC_DTYPE, OP_DTYPE, STATUS_TEXT, Status, native_module

log = logging.getLogger(__name__)

POOL_REGION = 1
WILDCARDS = ("0.0.0.0", "::", "")


class Get(IntEnum):
    """Outcome of one key in a batch read."""

    HIT = 0
    MISS = 1
    ERROR = 2


class BatchResult:
    """Per-key outcome of a batch read plus the first error's reason."""

    __slots__ = ("status", "lengths", "generations", "error")

    def __init__(self, status: np.ndarray, lengths: np.ndarray, generations: np.ndarray,
                 error: str | None):
        self.status, self.lengths, self.generations, self.error = status, lengths, generations, error

    @property
    def hits(self) -> int:
        return int((self.status == Get.HIT).sum())

    @property
    def errors(self) -> int:
        return int((self.status == Get.ERROR).sum())


class Node:
    """One process's membership in a PeerCache cluster."""

    def __init__(self, discovery_addr: str, *, protocol: str = "tcp", bind_host: str = "127.0.0.1",
                 host_discovery: bool = False, pool_slots: int = 0, slot_capacity: int = 0,
                 max_channels: int = 4, dir_cache_ttl: float = 0.0,
                 heartbeat_interval: float = 1.0, heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT,
                 rpc_timeout: float = 5.0, name: str | None = None, transport_options: dict | None = None):
        if heartbeat_interval <= 0 or heartbeat_interval >= heartbeat_timeout:
            raise ConfigError(f"heartbeat interval {heartbeat_interval}s must be positive and below "
                              f"the timeout {heartbeat_timeout}s")
        self.discovery_addr = discovery_addr
        self.protocol = protocol
        self.bind_host = bind_host
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.heartbeat_interval = heartbeat_interval
        self.cache = DirectoryCache(dir_cache_ttl)
        self.peers: dict[str, dict[str, Any]] = {}
        self.node_id: str | None = None
        self.epoch = 0
        self.meta: MetaService | None = None
        self.server: RpcServer | None = None
        self.control: RpcServer | None = None
        self.pool: Pool | None = None
        #: native peer handles indexed by the cache's node index (None = not connected)
        self._handles: list = []
        self._handles_lock = threading.Lock()
        self._native = None
        self._stop = threading.Event()
        self._hb: threading.Thread | None = None
        try:
            self.transport = make_transport(protocol, max_channels=max_channels, **(transport_options or {}))
            mod, _ = native_module()
            if mod is not None and self.transport.native and self.cache.native:
                self._native = mod
            if host_discovery:
                self.meta = MetaService(heartbeat_timeout)
                self.server = RpcServer(discovery_addr, self.meta.handlers()).start()
            self.discovery = RpcClient(discovery_addr, timeout=rpc_timeout, what="discovery")
            data_info: dict[str, Any] = {}
            if pool_slots:
                self.pool = Pool(pool_slots, slot_capacity, region_id=POOL_REGION)
                self.transport.expose(POOL_REGION, self.pool.mm, self.pool.rkey,
                                      fd=self.pool.fd, size=self.pool.size)
                data_info = self.transport.start(bind_host)
                handlers = getattr(self.transport, "control_handlers", None)
                if handlers is not None:
                    # A producer whose transport needs set-up per consumer (rdma: QP
                    # exchange) serves it on its own control endpoint on the bind host.
                    self.control = RpcServer(f"{bind_host}:0", handlers()).start()
                    data_info["control_port"] = self.control.port
            control = self.control or self.server
            self.info = {"name": self.name, "host": socket.gethostname(), "pid": os.getpid(),
                         "protocol": protocol, "data": data_info,
                         "control": control.address if control else None}
            self._register()
        except BaseException:
            self.close(leave=False)
            raise
        self._hb = threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True)
        self._hb.start()

    # -- membership -------------------------------------------------------------
    def _register(self) -> None:
        if self.node_id:
            self.info["node_id"] = self.node_id
        reply = self.discovery.call("register", info=self.info)
        self.node_id, self.epoch = reply["node_id"], reply["epoch"]

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_interval):
            try:
                reply = self.discovery.call("heartbeat", node_id=self.node_id)
                if not reply["known"]:
                    log.warning("discovery forgot node %s; registering again", self.node_id)
                    self._register()
                    self._republish()
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
        self.discovery.call("publish", node_id=self.node_id, keys=[r.key for r in refs],
                            locs=[self._loc(r) for r in refs], unpublish=list(evicted))

    def put_batch(self, keys: Sequence[bytes], values: Sequence | None = None,
                  fill: Callable[[np.ndarray, SlotRef], None] | None = None) -> list[SlotRef]:
        """Write objects into the pool and publish them with one directory RPC."""
        if self.pool is None:
            raise ConfigError("this node has no pool to put into; create it with a pool "
                              "(Client(pool_bytes=...) or peercache-bench serve)")
        refs, evicted = [], []
        for i, k in enumerate(keys):
            ref, old = self.pool.put(k, None if values is None else values[i], fill)
            refs.append(ref)
            if old is not None and old.key not in keys:
                evicted.append(old.key)
        self._publish(refs, evicted)
        return refs

    def remove_batch(self, keys: Sequence[bytes]) -> int:
        """Remove objects from the pool and the directory."""
        removed = [k for k in keys if self.pool is not None and self.pool.remove(k) is not None]
        if removed:
            self.discovery.call("unpublish", node_id=self.node_id, keys=removed)
        return len(removed)

    # -- consuming ------------------------------------------------------------------
    def lookup(self, keys: Sequence[bytes], use_cache: bool = True) -> list[Location | None]:
        """Locations of ``keys``: cached ones, the rest with one directory RPC."""
        locs = self.cache.get_many(keys) if use_cache else [None] * len(keys)
        missing = [i for i, l in enumerate(locs) if l is None]
        if missing:
            fresh = self._directory_lookup([keys[i] for i in missing])
            for i, l in zip(missing, fresh):
                locs[i] = l
            self.cache.put_many([keys[i] for i in missing], fresh)
        return locs

    def _directory_lookup(self, keys: Sequence[bytes]) -> list[Location | None]:
        """One lookup RPC (no cache); remembers the endpoints and epoch the reply carries."""
        reply = self.discovery.call("lookup", keys=list(keys))
        self.peers.update(reply["nodes"])
        self.epoch = reply["epoch"]
        return [None if l is None else Location(*l) for l in reply["locs"]]

    def get_batch_into(self, keys: Sequence[bytes], dest, offsets: Sequence[int] | np.ndarray,
                       capacities: Sequence[int] | np.ndarray | None = None) -> BatchResult:
        """Read ``keys`` into ``dest`` at ``offsets``; per-key HIT / MISS / ERROR.

        A location whose slot tag does not match (evicted, reused, torn) is
        looked up once more without the cache; if it still does not match it
        is a miss. Bytes of a miss or an error in ``dest`` are unspecified.
        """
        if self._native is not None:
            return self._get_native(keys, dest, offsets, capacities)
        n = len(keys)
        offsets = np.asarray(offsets, dtype=np.uint64)
        status = np.full(n, int(Get.MISS), dtype=np.int8)
        lengths = np.zeros(n, dtype=np.uint64)
        gens = np.zeros(n, dtype=np.uint64)
        locs = self.lookup(keys)
        error = self._read(keys, locs, dest, offsets, capacities, status, lengths, gens)
        stale = [i for i in range(n) if status[i] == Get.MISS and locs[i] is not None]
        if stale:
            skeys = [keys[i] for i in stale]
            self.cache.invalidate(skeys)
            again = self.lookup(skeys, use_cache=False)
            idx = np.asarray(stale)
            sub_status = np.full(len(stale), int(Get.MISS), dtype=np.int8)
            sub_len = np.zeros(len(stale), dtype=np.uint64)
            sub_gen = np.zeros(len(stale), dtype=np.uint64)
            sub_cap = None if capacities is None else np.asarray(capacities)[idx]
            err2 = self._read(skeys, again, dest, offsets[idx], sub_cap, sub_status, sub_len, sub_gen)
            status[idx], lengths[idx], gens[idx] = sub_status, sub_len, sub_gen
            error = error or err2
        return BatchResult(status, lengths, gens, error)

    # -- the native batch path ---------------------------------------------------------
    def _get_native(self, keys, dest, offsets, capacities) -> BatchResult:
        n = len(keys)
        offsets = np.ascontiguousarray(offsets, dtype=np.uint64)
        caps = None if capacities is None else np.ascontiguousarray(capacities, dtype=np.uint64)
        if len(offsets) != n or (caps is not None and len(caps) != n):
            raise ConfigError(f"get_batch_into: {n} keys but {len(offsets)} offsets"
                              + ("" if caps is None else f" and {len(caps)} capacities"))
        if not isinstance(keys, list):
            keys = list(keys)
        prepare = getattr(self.transport, "prepare_local", None)
        if prepare is not None:
            prepare(dest)   # rdma: the destination must be registered on every rail (cached)
        locs = np.empty(n, dtype=LOC_DTYPE)
        if self.cache.lookup_into(keys, locs) < n:
            self._fill_from_directory(keys, locs)
        status = np.empty(n, dtype=np.int8)
        lengths = np.empty(n, dtype=np.uint64)
        gens = np.empty(n, dtype=np.uint64)
        codes = np.empty(n, dtype=np.int32)
        error, stale = self._read_native(locs, dest, offsets, caps, status, lengths, gens, codes)
        if stale:
            # A tag mismatch: the slot was evicted, reused or torn. One fresh lookup, then a miss.
            idx = np.flatnonzero(codes == self._native.TAG_MISMATCH)
            skeys = [keys[i] for i in idx]
            self.cache.invalidate(skeys)
            sub = np.empty(len(idx), dtype=LOC_DTYPE)
            sub["node"] = ABSENT
            self._fill_from_directory(skeys, sub)
            s_st, s_len = np.empty(len(idx), np.int8), np.empty(len(idx), np.uint64)
            s_gen, s_code = np.empty(len(idx), np.uint64), np.empty(len(idx), np.int32)
            err2, _ = self._read_native(sub, dest, offsets[idx], None if caps is None else caps[idx],
                                        s_st, s_len, s_gen, s_code)
            status[idx], lengths[idx], gens[idx] = s_st, s_len, s_gen
            error = error or err2
        return BatchResult(status, lengths, gens, error)

    def _fill_from_directory(self, keys: list, locs: np.ndarray) -> None:
        """Look up the rows of ``locs`` that are ABSENT with one directory RPC."""
        miss = np.flatnonzero(locs["node"] == ABSENT)
        mkeys = [keys[i] for i in miss]
        rows = self.cache.rows(self._directory_lookup(mkeys))
        locs[miss] = rows
        self.cache.put_rows(mkeys, rows)

    def _read_native(self, locs, dest, offsets, caps, status, lengths, gens, codes) -> tuple[str | None, int]:
        """One native batch (all nodes); returns (first error, number of stale tags)."""
        mod = self._native
        args = (locs, dest, offsets, caps, status, lengths, gens, codes)
        hits, stale, need, errors, ecode, enode, etext = mod.read_slots(self._handles, *args)
        error = None
        if need:
            error, made = self._connect_needed(locs, codes)
            if made:
                hits, stale, need, errors, ecode, enode, etext = mod.read_slots(self._handles, *args)
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
        return error, stale

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

    def _read(self, keys, locs, dest, offsets, capacities, status, lengths, gens) -> str | None:
        n = len(keys)
        tagbuf = np.zeros((n, 5), dtype=np.uint64)
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
            ops = np.zeros(3 * m, dtype=OP_DTYPE)
            L = [locs[i] for i in idxs]
            off = np.fromiter((l.offset for l in L), np.uint64, m)
            ln = np.fromiter((l.length for l in L), np.uint64, m)
            cap = np.fromiter((l.capacity for l in L), np.uint64, m)
            ii = np.asarray(idxs, dtype=np.uint64)
            ops["region"] = np.repeat(np.fromiter((l.region for l in L), np.uint32, m), 3)
            ops["rkey"] = np.repeat(np.fromiter((l.rkey for l in L), np.uint64, m), 3)
            h, p, t = ops[0::3], ops[1::3], ops[2::3]
            h["remote_offset"], h["length"], h["local_region"], h["local_offset"] = off, tags.HEADER_BYTES, 0, ii * tags.TAG_BYTES
            p["remote_offset"], p["length"], p["local_region"], p["local_offset"] = off + tags.HEADER_BYTES, ln, 1, offsets[idxs]
            t["remote_offset"], t["length"], t["local_region"] = off + tags.HEADER_BYTES + cap, tags.TRAILER_BYTES, 0
            t["local_offset"] = ii * tags.TAG_BYTES + tags.HEADER_BYTES
            empty = ln == 0
            if empty.any():  # an empty object has no payload op to issue
                keep = np.ones(3 * m, dtype=bool)
                keep[1::3] = ~empty
                st_full = np.zeros(3 * m, dtype=np.int32)
                st_full[keep] = self.transport.read_batch(node_id, info, ops[keep], [tagbytes, dest])
                st = st_full
            else:
                st = self.transport.read_batch(node_id, info, ops, [tagbytes, dest])
            st = np.asarray(st).reshape(m, 3)
            ok_ops = (st == Status.OK).all(axis=1)
            idx_arr = np.asarray(idxs)
            if not ok_ops.all():
                bad = st[~ok_ops]
                first = int(bad[bad != Status.OK][0])
                error = error or f"read from node {node_id} failed: {STATUS_TEXT[Status(first)]}"
                status[idx_arr[~ok_ops]] = Get.ERROR
                if first in (Status.PEER_GONE, Status.CONNECTION):
                    self.cache.drop_node(node_id)
            if ok_ops.any():
                good = idx_arr[ok_ops]
                kh = np.fromiter((locs[i].key_hash for i in good), np.uint64, len(good))
                gen = np.fromiter((locs[i].generation for i in good), np.uint64, len(good))
                match = tags.check_tags(tagbuf[good], kh, gen, ln[ok_ops])
                status[good[match]] = Get.HIT
                lengths[good[match]] = ln[ok_ops][match]
                gens[good[match]] = gen[match]
        return error

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
        """Whether the directory knows each key (no data is read)."""
        return [l is not None for l in self.lookup(keys)]

    def members(self) -> dict[str, dict[str, Any]]:
        """Current membership as discovery sees it."""
        return self.discovery.call("members")["nodes"]

    # -- lifecycle ------------------------------------------------------------------
    def add_handler(self, op: str, fn) -> None:
        """Serve an extra control op (only on the discovery-hosting node)."""
        if self.server is None:
            raise ConfigError("only the node that hosts discovery serves extra ops")
        self.server.handlers[op] = fn

    def close(self, leave: bool = True) -> None:
        """Leave the cluster and release every resource (idempotent)."""
        self._stop.set()
        if self._hb is not None and self._hb is not threading.current_thread():
            self._hb.join(timeout=5)
        disc = getattr(self, "discovery", None)
        if leave and disc is not None and self.node_id:
            try:
                disc.call("leave", node_id=self.node_id, timeout=1.0)
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
