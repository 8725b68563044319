"""A PeerCache node: pool + data endpoint + control endpoint + discovery client.

A node may produce (it has a pool that peers read one-sided), consume (it
looks keys up and reads them into its own buffers), or both. The node named
by ``--discovery-addr`` also hosts discovery and the directory, unless the
directory is on Redis (``directory="redis://..."``, :mod:`peercache.directory.redis_backend`):
then no node hosts anything and every node talks to Redis. Either way the
node reaches its directory through one client (:mod:`peercache.directory.client`).
"""
from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time
from enum import IntEnum
from typing import Any, Callable, Sequence

import numpy as np

from . import auth as _auth
from . import tags
from .directory.cache import DirectoryCache
from .directory.client import connect_directory, is_redis
from .directory.location import Location
from .directory.service import DEFAULT_HEARTBEAT_TIMEOUT, MetaService
from .directory.table import DEFAULT_ENTRIES as DEFAULT_TABLE_ENTRIES
from .directory.table import LINE_BYTES, TABLE_REGION, TableView
from .directory.validate import U32 as _U32, U64 as _U64, read_location
from .errors import ConfigError, DiscoveryUnreachable, PeerCacheError, RpcError
from .pool import Pool, SlotRef
from .rpc import DEFAULT_LIMITS, Limits, RpcServer
from .transport import make_transport
from .transport.base import (ABSENT, CHECK_INTEGRITY, CHECK_PATTERN, LOC_DTYPE, OP_DTYPE, STATUS_TEXT,
                             Status, native_module, slot_ops)

log = logging.getLogger(__name__)

POOL_REGION = 1
#: region, rkey, offset, length, capacity of a LOC record (after its node number)
_REC_FIELDS = struct.Struct("<IQQQQ")
_U64_AT = struct.Struct("<Q")
#: where the second op's remote offset sits in a one-key table read (header op, bucket op)
_REMOTE_AT = OP_DTYPE.itemsize + OP_DTYPE.fields["remote_offset"][1]
_NO_STATUS = bytes(8)
WILDCARDS = ("0.0.0.0", "::", "")
#: the largest slot offset / capacity a location may have (header + trailer must fit 64 bits)
_SLOT_LIMIT = _U64 - tags.HEADER_BYTES - tags.TRAILER_BYTES
#: Node._table_native's answer for keys the native read does not take (not bytes)
_PY_KEYS = object()


def _same_endpoint(a: str, b: str) -> bool:
    """Whether HOST:PORT ``a`` (as its server bound it, maybe a wildcard host) is ``b``."""
    ha, _, pa = a.rpartition(":")
    hb, _, pb = b.rpartition(":")
    ha, hb = ha.strip("[]"), hb.strip("[]")
    return bool(pa) and pa == pb and (ha == hb or ha in WILDCARDS)


class Get(IntEnum):
    """Outcome of one key in a batch read."""

    HIT = 0
    MISS = 1
    ERROR = 2


_MISS = int(Get.MISS)
_NONE = np.empty(0, np.intp)
_NONE.flags.writeable = False


class BatchResult:
    """Per-key outcome of a batch read plus the first error's reason."""

    __slots__ = ("status", "lengths", "generations", "error", "invalid", "content_mismatch", "redirected",
                 "miss_reason")

    def __init__(self, status: np.ndarray, lengths: np.ndarray, generations: np.ndarray,
                 error: str | None, invalid: frozenset = frozenset(),
                 content_mismatch: np.ndarray | None = None, redirected: np.ndarray | None = None,
                 miss_reason: str | None = None):
        self.status, self.lengths, self.generations, self.error = status, lengths, generations, error
        #: indices whose directory entry was invalid (status ERROR; see :func:`~peercache.directory.validate.read_location`)
        self.invalid = invalid
        #: with ``check_pattern``: indices of hits whose bytes are not the bench pattern
        self.content_mismatch = np.empty(0, np.intp) if content_mismatch is None else content_mismatch
        #: indices of misses whose directory entry points at another key's slot (the slot is the
        #: one the entry describes, and holds another key): never a hit, never those bytes
        self.redirected = _NONE if redirected is None else redirected
        #: why the first of :attr:`redirected` was a miss ("the directory's entry for K points at
        #: another key's slot (node N, offset O); read as a miss"); None when there is none
        self.miss_reason = miss_reason

    @property
    def hits(self) -> int:
        return int((self.status == Get.HIT).sum())

    @property
    def errors(self) -> int:
        return int((self.status == Get.ERROR).sum())


class Node:
    """One process's membership in a PeerCache cluster."""

    #: directory entries refused by :func:`~peercache.directory.validate.read_location` so far (each read as an ERROR)
    bad_locations = 0
    #: keys whose location (cached or fresh) no longer matched the slot's tag and were looked up again
    stale_locations = 0
    #: with integrity on: hits refused because the payload did not match its slot checksum
    integrity_failures = 0
    #: with integrity on: hits refused because the producer wrote no checksum (integrity off there)
    integrity_missing = 0
    #: reads refused because the directory's entry (after one fresh lookup) pointed at another key's
    #: slot: the slot's tag holds another key's hash (each a miss, see BatchResult.redirected)
    redirected_entries = 0
    _redirects_logged = (float("-inf"), 0)   # (when, redirected_entries) at the last log line
    #: keys the directory table answered with one one-sided read (found, or definitively absent)
    table_resolved = 0
    #: keys the table could not answer (doubtful line, overflowed bucket, unknown node, failed read)
    #: and that went on to the lookup RPC
    table_forwarded = 0

    def __init__(self, discovery_addr: str, *, protocol: str = "tcp", bind_host: str = "127.0.0.1",
                 host_discovery: bool = False, pool_slots: int = 0, slot_capacity: int = 0,
                 max_channels: int = 4, dir_cache_ttl: float = 0.0,
                 heartbeat_interval: float = 1.0, heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT,
                 rpc_timeout: float = 5.0, name: str | None = None, transport_options: dict | None = None,
                 auth_key: bytes | str | None = None, integrity: bool = False,
                 directory: str | None = None, dir_table_entries: int | None = None):
        """``directory``: where the directory lives: None or HOST:PORT for the embedded one (hosted by
        the node at ``discovery_addr``, this one with ``host_discovery``), or a redis:// / rediss:// URL
        (then ``discovery_addr`` may be that URL too, and ``host_discovery`` hosts nothing).

        ``dir_table_entries`` (hosting the embedded directory only): entries of the directory table
        that consumers read one-sided through this node's data transport (:mod:`peercache.directory.table`;
        None: :data:`~peercache.directory.table.DEFAULT_ENTRIES`, about 73 bytes of region each; 0: none)."""
        if heartbeat_interval <= 0 or heartbeat_interval >= heartbeat_timeout:
            raise ConfigError(f"heartbeat interval {heartbeat_interval}s must be positive and below "
                              f"the timeout {heartbeat_timeout}s")
        self.discovery_addr = discovery_addr
        #: the directory spec: HOST:PORT (embedded) or a redis:// URL
        self.directory = directory or discovery_addr
        if is_redis(self.directory):
            host_discovery = False    # Redis is the directory: nothing to host
        elif directory and host_discovery and directory != discovery_addr:
            raise ConfigError(f"directory {directory!r} and discovery_addr {discovery_addr!r} differ: the "
                              "node that hosts the embedded directory hosts it at one address")
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
        #: the directory's table as this node reads it (None: lookups go through the RPC alone)
        self._table: TableView | None = None
        #: per-thread landing buffer of table reads over rdma (registered once, reused)
        self._table_tls = threading.local()
        #: member number -> the cache's node index, as of the epoch ``_table_epoch`` (ABSENT: unknown)
        self._table_nums = np.full(0, ABSENT, np.uint32)
        self._table_numl: list[int] = []
        self._table_epoch: int | None = None
        self._table_mod = None
        self._table_native_peer = False
        self._stop = threading.Event()
        self._hb: threading.Thread | None = None
        #: when the directory last answered this node (registration, then each heartbeat; monotonic s)
        self.directory_answered = time.monotonic()
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
            # The directory table read in one native call (native/dirtable.c): from the table
            # itself on its host, else through the table node's native handle, which it lands in
            # scratch of its own; rdma reads beyond 64 B only into registered memory, so there
            # the Python read (through the transport, which registers) stays.
            self._table_mod = mod
            self._table_native_peer = self.transport.native and self.transport.name in ("tcp", "shm")
            if host_discovery:
                entries = DEFAULT_TABLE_ENTRIES if dir_table_entries is None else int(dir_table_entries)
                if entries < 0:
                    raise ConfigError(f"--dir-table-entries must be >= 0 (0 disables the table), got {entries}")
                self.meta = MetaService(heartbeat_timeout, table_entries=entries)
                self.server = RpcServer(self.directory, self.meta.handlers(), auth=self.auth,
                                        limits=self.meta.limits, deferred_ops=("members",),
                                        warn_open=True).start()
            #: the directory client (embedded: an RpcClient to discovery; Redis: Redis itself), one
            #: ``call(op, **fields)`` surface either way
            self.discovery = connect_directory(self.directory, timeout=rpc_timeout, auth=self.auth,
                                               heartbeat_timeout=heartbeat_timeout)
            data_info: dict[str, Any] = {}
            if pool_slots:
                self.pool = Pool(pool_slots, slot_capacity, region_id=POOL_REGION, integrity=self.integrity)
                self.transport.expose(POOL_REGION, self.pool.mm, self.pool.rkey,
                                      fd=self.pool.fd, size=self.pool.size)
            table = self.meta.directory.table if self.meta is not None else None
            if table is not None:
                try:
                    # The directory's table is one more region of this node's data server, read
                    # (token-checked, with a secret) as the pages are.
                    self.transport.expose(TABLE_REGION, table.mm, table.rkey, fd=table.fd, size=table.size)
                except PeerCacheError as e:
                    log.warning("directory table not exposed (%s); consumers will use the lookup RPC", e)
                    self.meta.withdraw_table()
                    table = None
            if pool_slots or table is not None:
                data_info = self.transport.start(bind_host)
                handlers = self.transport.control_handlers()
                if handlers is not None:
                    # A producer whose transport needs set-up per consumer (rdma: QP
                    # exchange) serves it on its own control endpoint on the bind host.
                    self.control = RpcServer(f"{bind_host}:0", handlers, auth=self.auth).start()
                    data_info["control_port"] = self.control.port
                if "host" in data_info:   # listening on the network (shm maps memory, listens nowhere)
                    port = data_info.get("port", data_info.get("control_port"))
                    _auth.warn_if_open(f"{bind_host}:{port}", self.auth, what="data")
            control = self.control or self.server
            self.info = {"name": self.name, "host": socket.gethostname(), "pid": os.getpid(),
                         "protocol": protocol, "data": data_info,
                         "control": control.address if control else None}
            if self.pool is not None:
                # discovery refuses locations outside the regions a node registered
                self.info["regions"] = [[POOL_REGION, self.pool.size]]
            self._register()
            if table is not None:
                # after registering: the table is served by this node, under its id
                self.meta.announce_table(self.node_id, data_info, self.directory)
                self._use_table(self.meta.table_info())
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
        self._use_table(reply.get("table"))

    def _use_table(self, info) -> None:
        """Read the directory's table as ``info`` (a register / members reply's ``table``) says;
        None, or an announcement this version cannot read, means no table."""
        if not info:
            self._table = None
            return
        if not _same_endpoint(str(info.get("directory") or ""), self.directory):
            # The table is a view of the directory at that address; this node asks another
            # endpoint (a relay, a proxy), whose answers the table need not mirror.
            self._table = None
            return
        if self._table is not None and self._table.node_id == info.get("node_id") \
                and self._table.rkey == info.get("rkey") and self._table.seal == info.get("seal"):
            return
        try:
            view = TableView(info)
        except ValueError as e:
            log.warning("%s; lookups use the directory RPC alone", e)
            self._table = None
            return
        if view.data.get("host") in WILDCARDS:
            view.data["host"] = self.discovery.host
        self._table_epoch = None   # numbers are mapped again at the first read
        self._table = view

    def _heartbeat_loop(self) -> None:
        # A socket of its own: a heartbeat never waits for this node's other requests (a big
        # lookup in flight, or one waiting out its timeout) to release the shared client.
        hb = None
        while hb is None:
            disc = self.discovery
            if disc is None:
                return
            try:
                hb = disc.clone()
            except PeerCacheError as e:
                log.warning("heartbeat: cannot reach the directory (%s); trying again", e)
                if self._stop.wait(self.heartbeat_interval):
                    return
        try:
            self._heartbeats(hb)
        finally:
            hb.close()

    def _heartbeats(self, hb) -> None:
        while not self._stop.wait(self.heartbeat_interval):
            try:
                reply = hb.call("heartbeat", node_id=self.node_id, token=self.token)
                self.directory_answered = time.monotonic()
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

    def directory_silence(self) -> float:
        """Seconds since the directory last answered this node (its registration or a heartbeat,
        one every ``heartbeat_interval``): a few intervals mean the directory, or the node hosting
        it, is stopped, hung or out of reach, even while one-sided reads still succeed."""
        return time.monotonic() - self.directory_answered

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
        """Locations of ``keys``: cached ones, then what one read of the directory's table
        answers, the rest with one directory RPC (``use_cache`` False: the RPC alone).

        An invalid directory entry reads as None; with ``bad`` its
        ``(index, why)`` is appended there. Invalid entries are never cached.
        """
        locs = self.cache.get_many(keys) if use_cache else [None] * len(keys)
        missing = [i for i, l in enumerate(locs) if l is None]
        if missing and use_cache and self._table is not None:
            mkeys = [keys[i] for i in missing]
            got = self._table_lookup(mkeys)
            if got is not None:
                rows, resolved = got
                node_id = self.cache.node_id
                for j in np.flatnonzero(resolved & (rows["node"] != ABSENT)).tolist():
                    r = rows[j].tolist()
                    locs[missing[j]] = Location(node_id(r[0]), *r[1:])
                self.cache.put_rows(mkeys, rows)
                missing = [missing[j] for j in np.flatnonzero(~resolved).tolist()]
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
        if "recs" in reply:
            rows = self._record_rows(reply, keys, bad)
            out: list[Location | None] = [None] * len(rows)
            found = np.flatnonzero(rows["node"] != ABSENT)
            ids = {int(i): self.cache.node_id(int(i)) for i in np.unique(rows["node"][found])}
            for i, r in zip(found.tolist(), rows[found].tolist()):
                out[i] = Location(ids[r[0]], *r[1:])
            return out
        return self._checked_locs(reply, keys, bad)

    def _lookup_rows(self, keys: Sequence[bytes], bad: list | None = None) -> np.ndarray:
        """One lookup RPC as LOC_DTYPE rows (node = the cache's index; ABSENT for a miss or an invalid entry)."""
        reply = self._lookup_rpc(keys)
        if "recs" in reply:
            return self._record_rows(reply, keys, bad)
        return self.cache.rows(self._checked_locs(reply, keys, bad))

    def _checked_locs(self, reply: dict, keys: Sequence[bytes], bad: list | None) -> list[Location | None]:
        """The locations of an original ``{locs: [8-field list | None], nodes, epoch}`` reply, checked."""
        self.peers.update(reply["nodes"])
        self.epoch = reply["epoch"]
        out: list[Location | None] = []
        for i, raw in enumerate(reply["locs"]):
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

    #: epoch of the node infos this node holds (sent with each lookup: discovery then sends
    #: infos only when it is stale) and the nodes whose info it received at that epoch
    _peers_epoch: int | None = None
    _fresh_peers: frozenset = frozenset()

    def _record_rows(self, reply: dict, keys: Sequence[bytes], bad: list | None) -> np.ndarray:
        """Rows of a ``{recs, nids, epoch[, nodes]}`` reply: the records with discovery's node numbers
        turned into the cache's indices, checked as :func:`~peercache.directory.validate.read_location` checks one entry."""
        blob, nids, n = reply.get("recs"), reply.get("nids"), len(keys)
        missing = reply.get("missing") or b""
        m = len(missing) // 4 if type(missing) is bytes and len(missing) % 4 == 0 else -1
        if (type(blob) is not bytes or m < 0 or len(blob) != (n - m) * LOC_DTYPE.itemsize
                or not isinstance(nids, dict)):
            raise RpcError(f"discovery at {self.discovery_addr} sent a malformed lookup reply "
                           f"({len(blob) if isinstance(blob, bytes) else type(blob).__name__} bytes of records "
                           f"and {m} missing for {n} keys, {LOC_DTYPE.itemsize} B each); is it a PeerCache "
                           "of the same version?")
        if m == 0:
            rows = np.frombuffer(blob, LOC_DTYPE).copy()
        else:
            gone = np.frombuffer(missing, "<u4")
            if gone[-1] >= n or (m > 1 and not (gone[1:] > gone[:-1]).all()):
                raise RpcError(f"discovery at {self.discovery_addr} sent a malformed lookup reply (missing "
                               f"indices not increasing below {n}); is it a PeerCache of the same version?")
            rows = np.zeros(n, LOC_DTYPE)
            rows["node"] = ABSENT
            have = np.ones(n, bool)
            have[gone] = False
            rows[have] = np.frombuffer(blob, LOC_DTYPE)
        nodes = reply.get("nodes")
        epoch = reply.get("epoch")
        if nodes:   # our epoch was stale: the infos of the nodes present, current as of ``epoch``
            self.peers.update(nodes)
            self._fresh_peers, self._peers_epoch = frozenset(nodes), epoch
        self.epoch = epoch
        num = rows["node"]
        found = num != ABSENT
        if not found.any():
            return rows
        unknown = [nid for nid in nids.values() if nid not in self._fresh_peers]
        if unknown:
            self._refresh_peers(unknown)
        if len(nids) == 1 and found.all():
            (number, node_id), = nids.items()
            if number != int(num[0]) or not (num == number).all():
                return self._record_errors(rows, keys, bad, nids)
            if not isinstance(node_id, str) or not node_id:
                return self._record_errors(rows, keys, bad, nids)
            rows["node"] = self.cache.node_index(node_id)
        else:
            return self._record_errors(rows, keys, bad, nids)
        return self._check_rows(rows, keys, bad)

    def _record_errors(self, rows: np.ndarray, keys, bad: list | None, nids: dict) -> np.ndarray:
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

    _SLOT_LIMIT = np.uint64(_U64 - tags.HEADER_BYTES - tags.TRAILER_BYTES)

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

    _table_warned = False

    def _table_lookup(self, keys: list) -> tuple[np.ndarray, np.ndarray] | None:
        """``keys`` in the directory's table with one one-sided read of their buckets (and its
        header, in the same batch): ``(rows, resolved)``, rows as LOC_DTYPE with the cache's node
        indices (ABSENT where not found), ``resolved`` where the table answered (found, or
        definitively absent). Nothing doubtful is trusted: a line that fails its check, an
        overflowed bucket, a node number this node cannot map, a record that cannot be a slot
        leave the key unresolved (for the lookup RPC). None when the read itself failed.

        One native call where it can (:meth:`_table_native`), else :meth:`_table_lookup_py`."""
        got = self._table_rows(keys)
        if got is None:
            return None
        rows, resolved, r = got
        return rows, np.ones(len(keys), np.bool_) if resolved is None else resolved

    def _table_rows(self, keys: list, out: np.ndarray | None = None):
        """:meth:`_table_lookup` as ``(rows, resolved, how many resolved)``, the rows in ``out``
        (LOC_DTYPE, one per key) when given; ``resolved`` is None when every key was."""
        view = self._table
        if view is None:          # withdrawn since the caller looked
            return None
        n = len(keys)
        if not self._table_native_ok(view):
            return self._table_rows_py(keys, out)
        rows = np.empty(n, LOC_DTYPE) if out is None else out
        state = np.empty(n, np.int8)
        r = self._table_native(view, keys, rows, state)
        if r is _PY_KEYS:
            return self._table_rows_py(keys, out)
        if r is None:
            self.table_forwarded += n
            if out is not None:
                out["node"] = ABSENT
            return None
        self.table_resolved += r
        self.table_forwarded += n - r
        return rows, None if r == n else state != 0, r

    def _table_rows_py(self, keys: list, out: np.ndarray | None):
        """:meth:`_table_rows` through :meth:`_table_lookup_py`."""
        got = self._table_lookup_py(keys)
        if got is None:
            if out is not None:
                out["node"] = ABSENT
            return None
        rows, resolved = got
        if out is not None:
            out[:] = rows
        r = int(resolved.sum())
        return rows if out is None else out, None if r == len(keys) else resolved, r

    def _table_native_ok(self, view: TableView) -> bool:
        """Whether :meth:`_table_native` can read ``view`` (the module is built; the table is this
        node's own, or its node's handle takes reads into any memory)."""
        return self._table_mod is not None and (
            self._table_native_peer or (self.meta is not None and view.node_id == self.node_id))

    def _table_native(self, view: TableView, keys: list, rows: np.ndarray, state) -> int | None:
        """Resolve ``keys`` in the table with one native call: fills ``rows`` (LOC_DTYPE, node
        indices, ABSENT where not found) and ``state`` (int8: TABLE_FOUND / TABLE_ABSENT, 0 where
        doubtful) with the rules of :meth:`_table_lookup_py`; returns the keys resolved, or None
        when the read failed (logged once) or the header was doubtful (nothing resolved)."""
        mod = self._table_mod
        own = self.meta is not None and view.node_id == self.node_id
        if own:
            table = self.meta.directory.table
            if table is None:
                return None
            src = table.mm
        else:
            try:
                src = self.transport.native_peer(view.node_id, view.data)
            except PeerCacheError as e:
                self._table_failed(view, f"{STATUS_TEXT[Status.PEER_GONE]}: {e}")
                return None
        try:
            code, epoch, resolved, first, err = mod.table_lookup(
                src, keys, view.native_spec, self._table_nums, _SLOT_LIMIT, self._table_epoch, rows, state)
        except TypeError as e:
            if "not bytes" not in str(e):
                raise
            return _PY_KEYS                # keys that are not bytes (bytearray, memoryview): the Python read
        if code == mod.TABLE_DONE:         # the numbers were current
            return resolved
        if code == mod.TABLE_READ_FAILED:
            if not own and not src.alive():
                self.transport.forget(view.node_id)
            self._table_failed(view, STATUS_TEXT.get(first, f"status {first}") + (f" ({err})" if err else ""))
            return None
        if code != mod.TABLE_REMAP:        # TABLE_BAD_HEADER: every key doubtful
            return None
        if epoch != self._table_epoch:
            self._sync_table(epoch)
        unknown, resolved = mod.table_map(rows, state, self._table_nums, _SLOT_LIMIT, False)
        if unknown:
            self._sync_table(epoch)        # a member this node has not mapped yet
            unknown, resolved = mod.table_map(rows, state, self._table_nums, _SLOT_LIMIT, True)
        return resolved

    def _table_lookup_py(self, keys: list) -> tuple[np.ndarray, np.ndarray] | None:
        """:meth:`_table_lookup` in Python (NumPy): the reference the native read is tested
        against, and the read of transports without a native handle."""
        view = self._table
        n = len(keys)
        if view is None:          # withdrawn since the caller looked
            return None
        kh = tags.key_hashes(keys)
        ub, inv, remote, length, local, nbytes = view.plan(kh)
        buf = np.empty(nbytes, np.uint8)
        if not self._table_read(view, remote, length, local, buf):
            self.table_forwarded += n
            return None
        epoch, recs, found, absent = view.parse(buf, ub, inv, kh)
        if epoch is None:
            self.table_forwarded += n
            return None
        rows = np.ascontiguousarray(recs).view(LOC_DTYPE).reshape(n)
        num = rows["node"]
        if epoch != self._table_epoch:
            self._sync_table(epoch)
        nums = self._table_nums
        known = num < len(nums)
        if found.any() and not known[found].all() or (known & found).any() \
                and (nums[num[known & found]] == ABSENT).any():
            self._sync_table(epoch)      # a member this node has not mapped yet
            nums = self._table_nums
            known = num < len(nums)
        idx = np.full(n, ABSENT, np.uint32)
        idx[known] = nums[num[known]]
        found &= idx != ABSENT
        cap, lim = rows["capacity"], self._SLOT_LIMIT
        found &= ~((rows["length"] > cap) | (cap > lim) | (rows["offset"] > lim - np.minimum(cap, lim)))
        rows["node"] = np.where(found, idx, ABSENT)
        resolved = found | absent
        r = int(resolved.sum())
        self.table_resolved += r
        self.table_forwarded += n - r
        return rows, resolved

    def _table_one(self, key: bytes) -> np.ndarray | None:
        """One key in the directory table (as :meth:`_table_lookup`; the uncached single-key
        GET's path): its row (node ABSENT: definitively absent), or None when the table could
        not answer."""
        view = self._table
        if view is None:          # withdrawn since the caller looked
            return None
        if not self._table_native_ok(view):
            return self._table_one_py(key)
        row = np.empty(1, LOC_DTYPE)
        r = self._table_native(view, [key], row, bytearray(1))
        if r is _PY_KEYS:
            return self._table_one_py(key)
        if not r:
            self.table_forwarded += 1
            return None
        self.table_resolved += 1
        return row

    def _table_one_py(self, key: bytes) -> np.ndarray | None:
        """:meth:`_table_one` in Python, without NumPy passes (transports without a native handle)."""
        view = self._table
        if view is None:
            return None
        khash = tags.key_hash(key)
        bucket, remote = view.plan_one(khash)
        buf = bytearray(LINE_BYTES + view.bucket_bytes)
        if not self._table_read_one(view, remote, buf):
            self.table_forwarded += 1
            return None
        epoch, rec, absent = view.parse_one(bytes(buf), bucket, khash)
        if epoch is None or (rec is None and not absent):
            self.table_forwarded += 1
            return None
        if epoch != self._table_epoch:
            self._sync_table(epoch)
        if rec is None:
            row = np.zeros(1, LOC_DTYPE)
            row["node"] = ABSENT
            self.table_resolved += 1
            return row
        num = int.from_bytes(rec[:4], "little")
        nums = self._table_numl
        if num >= len(nums) or nums[num] == ABSENT:
            self._sync_table(epoch)      # a member this node has not mapped yet
            nums = self._table_numl
            if num >= len(nums) or nums[num] == ABSENT:
                self.table_forwarded += 1
                return None
        _region, _rkey, offset, length, cap = _REC_FIELDS.unpack_from(rec, 4)
        lim = _SLOT_LIMIT
        if length > cap or cap > lim or offset > lim - cap:
            self.table_forwarded += 1      # the RPC reports it as an invalid entry
            return None
        row = np.frombuffer(nums[num].to_bytes(4, "little") + rec[4:], LOC_DTYPE)
        self.table_resolved += 1
        return row

    def _table_read_one(self, view: TableView, remote: int, buf: bytearray) -> bool:
        """:meth:`_table_read` of the header and one bucket (at ``remote``), straight through the
        native handle where it takes reads into any memory (tcp, shm)."""
        if not self._table_native_peer or (self.meta is not None and view.node_id == self.node_id):
            return self._table_read(view, np.array([0, remote], np.uint64),
                                    np.array([LINE_BYTES, view.bucket_bytes], np.uint64),
                                    np.array([0, LINE_BYTES], np.uint64), np.frombuffer(buf, np.uint8))
        ops = bytearray(view.ops_one)      # bytes, patched: a NumPy field store costs ~2 us
        _U64_AT.pack_into(ops, _REMOTE_AT, remote)
        st = bytearray(8)
        try:
            h = self.transport.native_peer(view.node_id, view.data)
        except PeerCacheError as e:
            return self._table_failed(view, f"{STATUS_TEXT[Status.PEER_GONE]}: {e}")
        err = h.read_batch(ops, [buf], st)
        if err or st != _NO_STATUS:
            if not h.alive():
                self.transport.forget(view.node_id)
            codes = [c for c in np.frombuffer(st, np.int32).tolist() if c]
            first = codes[0] if codes else int(Status.CONNECTION)
            return self._table_failed(view, STATUS_TEXT.get(first, f"status {first}") + (f" ({err})" if err else ""))
        return True

    def _table_failed(self, view: TableView, why: str) -> bool:
        if not self._table_warned:
            self._table_warned = True
            log.warning("directory table read from node %s failed (%s); those lookups go through the "
                        "directory RPC", view.node_id, why)
        return False

    def _table_read(self, view: TableView, remote, length, local, buf: np.ndarray) -> bool:
        """Land the table ranges in ``buf``: from this process's own table when it hosts it, else
        with one batch through the data transport. False (logged once) when a read failed."""
        if self.meta is not None and view.node_id == self.node_id:
            table = self.meta.directory.table
            if table is None:
                return False
            mem = np.frombuffer(table.mm, np.uint8)
            for r, ln, lo in zip(remote.tolist(), length.tolist(), local.tolist()):
                buf[lo:lo + ln] = mem[r:r + ln]
            return True
        ops = np.zeros(len(remote), dtype=OP_DTYPE)
        ops["region"], ops["rkey"] = view.region, view.rkey
        ops["remote_offset"], ops["length"], ops["local_offset"] = remote, length, local
        land = buf
        if self.transport.name == "rdma":
            # An rdma READ over 64 B lands only in registered memory: a buffer of this thread's that
            # stays registered (the transport keeps its registration), not a new one per lookup.
            land = getattr(self._table_tls, "buf", None)
            if land is None or len(land) < len(buf):
                land = self._table_tls.buf = np.empty(max(len(buf), 1 << 16), np.uint8)
        st = self.transport.read_batch(view.node_id, view.data, ops, [land])
        if land is not buf and not st.any():
            buf[:] = land[:len(buf)]
        if st.any():
            first = int(st[st != Status.OK][0])
            return self._table_failed(view, STATUS_TEXT.get(first, f"status {first}"))
        return True

    def _sync_table(self, epoch: int) -> None:
        """Map member numbers to node ids (and refresh the peers' infos) with one members call."""
        reply = self.discovery.call("members")
        nodes = reply.get("nodes") or {}
        self.peers.update(nodes)
        self._fresh_peers, self._peers_epoch = frozenset(nodes), reply.get("epoch")
        self._use_table(reply.get("table"))
        nums = reply.get("nums") or {}
        arr = np.full(max([k for k in nums if type(k) is int and 0 <= k < _U32] or [-1]) + 1, ABSENT, np.uint32)
        for number, node_id in nums.items():
            if type(number) is int and 0 <= number < len(arr) and isinstance(node_id, str) and node_id:
                arr[number] = self.cache.node_index(node_id)
        self._table_nums, self._table_numl = arr, arr.tolist()
        self._table_epoch = epoch

    def _refresh_peers(self, unknown: list) -> None:
        """Infos of nodes a reply named that this node has none of (current as of its epoch): one members call."""
        reply = self.discovery.call("members")
        self.peers.update(reply["nodes"])
        self._fresh_peers = frozenset(reply["nodes"]) | frozenset(unknown)
        self._peers_epoch = reply["epoch"]

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

        Each slot's tag is checked against the hash of the key asked for, which
        this node computes itself (:meth:`DirectoryCache.lookup_into` keeps it with
        a cached key), never against the hash its directory entry carries.
        A location whose slot tag does not match (evicted, reused, torn, or
        another key's slot) is looked up once more without the cache; if it
        still does not match it is a miss. One whose fresh entry points at
        another key's slot is listed in :attr:`BatchResult.redirected` with the
        reason in :attr:`BatchResult.miss_reason`, and counted in
        :attr:`redirected_entries`. Bytes of a miss or an error in ``dest`` are
        unspecified.
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
        # Per call: only the arrays the result hands back (np.full's Python wrapper costs a
        # microsecond of a 4 KiB GET's ~20, so the status array is filled in place).
        status = np.empty(n, dtype=np.int8)
        status.fill(_MISS)
        lengths = np.zeros(n, dtype=np.uint64)
        gens = np.zeros(n, dtype=np.uint64)
        content = np.zeros(n, dtype=bool)
        want = np.empty(n, dtype=np.uint64)      # the hash of each key asked for (locate fills it)
        bad: list = []
        locs = locate(keys, bad, True, want)
        error, stale, _ = read(keys, want, locs, dest, offsets, caps, status, lengths, gens, content, checks)
        redirected, reason = None, None
        if len(stale):
            # A tag mismatch: the slot was evicted, reused or torn, or holds another key. One fresh
            # lookup, then a miss.
            self.stale_locations += len(stale)
            skeys = [keys[i] for i in stale]
            self.cache.invalidate(skeys)
            bad2: list = []
            again = locate(skeys, bad2, False)
            bad += [(int(stale[j]), why) for j, why in bad2]
            m = len(stale)
            s_st, s_len, s_gen = np.full(m, int(Get.MISS), np.int8), np.zeros(m, np.uint64), np.zeros(m, np.uint64)
            s_content = np.zeros(m, dtype=bool)
            err2, _, other = read(skeys, want[stale], again, dest, offsets[stale],
                                  None if caps is None else caps[stale], s_st, s_len, s_gen, s_content, checks)
            status[stale], lengths[stale], gens[stale], content[stale] = s_st, s_len, s_gen, s_content
            error = error or err2
            if len(other):
                redirected, reason = stale[other], self._redirected(skeys, again, other)
        error, invalid = self._mark_invalid(keys, bad, status, error)
        if self.integrity:
            self._report_integrity()
        return BatchResult(status, lengths, gens, error, invalid,
                           np.flatnonzero(content) if checks & CHECK_PATTERN else None, redirected, reason)

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

    # The two read paths of get_batch_into: ``locate(keys, bad, use_cache[, want])`` gives the
    # locations (invalid entries go to ``bad``) and fills ``want`` with the hash of each key
    # asked for; ``read(keys, want, ...)`` fills status/lengths/gens and returns (first error,
    # indices whose slot tag did not match, those of them whose slot holds another key). The
    # stale retry above is shared.

    def _locate(self, keys: list, bad: list, use_cache: bool, want: np.ndarray | None = None) -> list:
        if want is not None:
            self.cache.key_hashes_into(keys, want)
        return self.lookup(keys, use_cache=use_cache, bad=bad)

    def _locate_native(self, keys: list, bad: list, use_cache: bool, want: np.ndarray | None = None) -> np.ndarray:
        # Without the cache (the stale retry) the table is skipped too: a location that did
        # not match its slot's tag is asked of the directory itself, so it can never loop.
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
        self._fill_from_directory(keys, locs, bad, use_table=use_cache, none_cached=cached == 0)
        return locs

    def lookup_rows(self, keys: Sequence[bytes], bad: list | None = None) -> np.ndarray:
        """Locations of ``keys`` as LOC_DTYPE rows (node = the cache's index, see
        ``cache.node_id``; ABSENT for a miss or an invalid entry), resolved as a batch read
        resolves them: the cache, the directory's table, then the lookup RPC."""
        return self._locate_native(keys if isinstance(keys, list) else list(keys),
                                   [] if bad is None else bad, True)

    def _fill_from_directory(self, keys: list, locs: np.ndarray, bad: list | None = None,
                             use_table: bool = True, none_cached: bool = False) -> None:
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
        if use_table and self._table is not None:
            tkeys = keys if todo is None else [keys[i] for i in todo]
            if len(tkeys) == 1:                # the latency path
                row = self._table_one(tkeys[0])
                if row is not None:
                    locs[0 if todo is None else int(todo[0])] = row[0]
                    self.cache.put_rows(tkeys, row)
                    return
                got = None
            else:
                # the whole batch: the table's rows land in locs itself
                got = self._table_rows(tkeys, locs if todo is None else None)
            if got is not None:
                rows, resolved, r = got
                if todo is not None:
                    locs[todo] = rows
                self.cache.put_rows(tkeys, rows)
                if r == len(tkeys):
                    return
                left = np.flatnonzero(~resolved)
                todo = left if todo is None else todo[left]
        if todo is None:
            mkeys, sub_bad = keys, (bad if bad is not None else [])
            rows = self._lookup_rows(mkeys, sub_bad)
            locs[:] = rows
            self.cache.put_rows(mkeys, rows)
            return
        miss = todo
        mkeys = [keys[i] for i in miss]
        sub_bad = []
        rows = self._lookup_rows(mkeys, sub_bad)
        locs[miss] = rows
        self.cache.put_rows(mkeys, rows)
        if bad is not None:
            bad.extend((int(miss[j]), why) for j, why in sub_bad)

    def _read_native(self, keys, want, locs, dest, offsets, caps, status, lengths, gens, content,
                     checks: int) -> tuple[str | None, np.ndarray, np.ndarray]:
        """One native batch (all nodes, payload checks in the same pass); returns (first error,
        indices of stale tags, those of them that hold another key)."""
        mod = self._native
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
        if c_bad:
            content |= codes == mod.CONTENT_MISMATCH
        self.integrity_failures += k_bad
        self.integrity_missing += k_missing
        if not (stale or other):
            return error, _NONE, _NONE
        return (error, np.flatnonzero((codes == mod.TAG_MISMATCH) | (codes == mod.KEY_MISMATCH)),
                np.flatnonzero(codes == mod.KEY_MISMATCH) if other else _NONE)

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

    def _read(self, keys, want, locs, dest, offsets, capacities, status, lengths, gens, content,
              checks: int) -> tuple[str | None, np.ndarray, np.ndarray]:
        """The Python batch path (the reference): one transport batch per node, tags and payload
        checks here."""
        n = len(keys)
        tagbuf = np.zeros((n, tags.TAG_WORDS), dtype=np.uint64)
        refused = np.zeros(n, dtype=bool)   # misses by integrity: the bytes are wrong, not stale
        other = np.zeros(n, dtype=bool)     # misses by a slot that holds another key
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
            data["host"] = self.discovery.host
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
        """Serve an extra control op (only on the discovery-hosting node, or any node with Redis).

        With ``owner_only`` a request must come from a registered node, with
        the token discovery issued it (a peer's :meth:`call`); others are refused.
        With a Redis directory the requests come through Redis lists (see
        :meth:`peercache.directory.redis_backend.RedisDirectory.serve_op`).
        """
        if is_redis(self.directory):
            self.discovery.serve_op(op, fn, owner_only)
            return
        if self.server is None or self.meta is None:
            raise ConfigError("only the node that hosts discovery serves extra ops")
        self.server.handlers[op] = self.meta.owner_only(op, fn) if owner_only else fn

    def call(self, op: str, timeout: float | None = None, **fields) -> dict:
        """Send ``op`` to discovery in this node's name (its id and token), e.g. serve's reader_done."""
        return self.discovery.call(op, timeout=timeout, node_id=self.node_id, token=self.token, **fields)

    def _lookup_rpc(self, keys: Sequence[bytes]) -> dict:
        """The lookup reply for ``keys``: one RPC, or as many as discovery's limits need, merged.

        It asks for fixed binary records (``recs``) and sends the epoch of the node infos it
        holds; a directory that answers with the original ``locs`` lists is read as before.
        """
        parts = list(self._chunks(keys, 8))
        ask = {"recs": True, "epoch": self._peers_epoch}
        if len(parts) == 1:
            return self.discovery.call("lookup", keys=keys if isinstance(keys, list) else list(keys), **ask)
        replies = [self.discovery.call("lookup", keys=list(keys[a:b]), **ask) for a, b in parts]
        nodes: dict = {}
        for r in replies:
            nodes.update(r.get("nodes") or {})
        epoch = replies[-1].get("epoch", self.epoch)
        if all("recs" in r for r in replies):
            nids: dict = {}
            for r in replies:
                nids.update(r.get("nids") or {})
            merged = {"recs": b"".join(r["recs"] for r in replies), "nids": nids, "epoch": epoch}
            gone = []
            for (a, b), r in zip(parts, replies):
                g = np.frombuffer(r.get("missing") or b"", "<u4")
                if len(g) and int(g.max()) >= b - a:
                    raise RpcError(f"discovery at {self.discovery_addr} sent a malformed lookup reply (a missing "
                                   f"index beyond its {b - a} keys); is it a PeerCache of the same version?")
                gone.append(g.astype(np.int64) + a)
            if any(len(g) for g in gone):
                merged["missing"] = np.concatenate(gone).astype("<u4").tobytes()
            if nodes:
                merged["nodes"] = nodes
            return merged
        locs: list = []
        for (a, b), r in zip(parts, replies):
            locs += r["locs"] if "recs" not in r else self._record_lists(r, b - a)
        return {"locs": locs, "nodes": nodes, "epoch": epoch}

    def _record_lists(self, reply: dict, n: int) -> list:
        """A ``recs`` reply of ``n`` keys as ``locs`` lists (to merge it with a ``locs`` reply of a split batch)."""
        missing = set(np.frombuffer(reply.get("missing") or b"", "<u4").tolist())
        rows = iter(np.frombuffer(reply["recs"], LOC_DTYPE).tolist())
        nids = reply.get("nids") or {}
        out: list = []
        try:
            for i in range(n):
                if i in missing:
                    out.append(None)
                    continue
                node, *fields = next(rows)
                out.append([nids.get(node, f"?{node}"), *fields])
        except StopIteration:
            raise RpcError(f"discovery at {self.discovery_addr} sent a malformed lookup reply (fewer records "
                           f"than its {n} keys less the missing ones); is it a PeerCache of the same version?") from None
        return out

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
