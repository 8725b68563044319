"""A PeerCache node: pool + data endpoint + control endpoint + directory client.

A node may produce (it has a pool that peers read one-sided), consume (it
looks keys up and reads them into its own buffers), or both. The node named
by ``--discovery-addr`` also hosts discovery and the directory, unless the
directory is on Redis (``directory="redis://..."``, :mod:`peercache.directory.redis.backend`):
then no node hosts anything and every node talks to Redis. Either way the
node reaches its directory through one client (:mod:`peercache.directory.client`).

:class:`Node` is composed of parts, one module each:

- :mod:`.membership` (:class:`Membership`): registration, heartbeats, leaving;
- :mod:`.publisher` (:class:`Publisher`): the pool's pages in the directory;
- :mod:`.resolver` (:class:`Resolver`): where keys are: the cache, then the directory's table
  (:mod:`.table_reader`), then the lookup RPC (its replies read by :mod:`.lookup_replies`);
- :mod:`.reader` (:class:`Reader`): batch reads of slots, native or through the transport;
- :mod:`.peers` (:class:`PeerInfos`): the other nodes' infos; :mod:`.result`: :class:`Get`,
  :class:`BatchResult`.
"""
from __future__ import annotations

import logging
import os
import socket
from typing import Any, Callable, Sequence

import numpy as np

from .. import auth as _auth
from ..directory.cache import DirectoryCache
from ..directory.client import DirectoryClient, connect_directory
from ..directory.ops import Registration
from ..directory.redis.url import is_redis
from ..directory.location import Location
from ..directory.service import MetaService
from ..directory.table import TABLE_REGION
from ..errors import ConfigError, DeadlineExceeded, PeerCacheError
from ..pool import Pool, SlotRef
from ..config import NodeConfig
from ..rpc import RpcServer
from ..timeouts import Timeouts
from ..transport import make_transport
from ..transport.base import native_module
from .deadline import Deadline
from .geometry import INFO_KEY as GEOMETRY_KEY, Geometry
from .lookup_replies import LookupReplies
from .membership import Membership
from .peers import WILDCARDS, PeerInfos
from .publisher import POOL_REGION, Publisher
from .reader import Reader
from .resolver import Resolver
from .result import BatchResult, Get
from .table_reader import TableReader

__all__ = ["BatchResult", "Geometry", "Get", "Node", "POOL_REGION", "WILDCARDS"]

log = logging.getLogger(__name__)


#: Node's own spellings of NodeConfig fields (its keyword API since before NodeConfig); each field's
#: own name is taken too.
KEYWORDS = {"bind_host": "bind", "slot_capacity": "page_bytes", "rpc_timeout": "timeout"}


def _bounds(protocol: str, timeout: float, timeouts: Timeouts, options: dict | None) -> dict:
    """``options`` with the transport's time bounds from ``timeouts`` unless they set them: tcp's
    bound on one blocking call (``timeouts.io(timeout)``: a batch read has ``timeout`` in all, and the
    native read takes no per-call deadline), rdma's connection set-up and completion bounds (a READ
    without a completion is a path fault that fails over to another rail: a bound of its own, not
    the read's); shm reads memory."""
    out = dict(options or {})
    if protocol == "tcp":
        out.setdefault("io_timeout", timeouts.io(timeout))
    elif protocol == "rdma":
        out.setdefault("connect_timeout", timeouts.rdma_connect_s)
        out.setdefault("timeout_s", timeouts.rdma_completion_s)
    return out


def _held(part: str, name: str, doc: str) -> property:
    """A read-only attribute of the node that is ``name`` of its part ``part`` (None before it exists)."""
    def get(self):
        holder = getattr(self, part)
        return None if holder is None else getattr(holder, name)
    return property(get, doc=doc)


class Node:
    """One process's membership in a PeerCache cluster."""

    def __init__(self, config: NodeConfig | str | None = None, *, name: str | None = None,
                 pool_slots: int | None = None, transport_options: dict | None = None,
                 geometry: Geometry | None = None, **options: Any):
        """A node with the options of ``config`` (a :class:`~peercache.config.NodeConfig`), or of the
        keywords ``options`` over its defaults: ``Node("127.0.0.1:31998", protocol="tcp", ...)``. The
        keywords are NodeConfig's fields, three of them also spelled as Node always took them
        (:data:`KEYWORDS`: ``bind_host``, ``slot_capacity``, ``rpc_timeout``); the defaults are
        NodeConfig's alone.

        ``name``: the node's (default: host:pid); ``pool_slots``: slots of the pool (default: as many
        as ``pool_bytes`` holds of ``page_bytes``); ``transport_options``: added to the config's own
        (:meth:`~peercache.config.NodeConfig.transport_options`; a bench's bounds); ``geometry``: what this
        producer serves (:class:`~.geometry.Geometry`), registered with it so consumers read it (serve's).

        ``directory``: where the directory lives: None or HOST:PORT for the embedded one (hosted by
        the node at ``discovery_addr``, this one with ``host_discovery``), or a redis:// / rediss:// URL
        (then ``discovery_addr`` may be that URL too, and ``host_discovery`` hosts nothing).

        ``dir_table_entries`` (hosting the embedded directory only): entries of the directory table
        that consumers read one-sided through this node's data transport (:mod:`peercache.directory.table`;
        about 73 bytes of region each; 0: none)."""
        #: this node's options
        self.config = c = NodeConfig.of(config, options, who="Node", spellings=KEYWORDS)
        discovery_addr, directory, protocol, bind_host = c.discovery_addr, c.directory, c.protocol, c.bind
        host_discovery, max_channels, dir_cache_ttl = c.host_discovery, c.max_channels, c.dir_cache_ttl
        heartbeat_interval, heartbeat_timeout = c.heartbeat_interval, c.heartbeat_timeout
        rpc_timeout, timeouts, integrity = c.timeout, c.timeouts, c.integrity
        dir_table_entries, auth_key = c.dir_table_entries, c.secret()
        slot_capacity = c.page_bytes or 0
        pool_slots = c.pool_slots(slot_capacity) if pool_slots is None else pool_slots
        transport_options = {**c.transport_options(), **(transport_options or {})}
        if heartbeat_interval <= 0 or heartbeat_interval >= heartbeat_timeout:
            raise ConfigError(f"heartbeat interval {heartbeat_interval}s must be positive and below "
                              f"the timeout {heartbeat_timeout}s")
        self.discovery_addr = discovery_addr
        #: where the directory is: HOST:PORT (embedded) or a redis:// URL
        self.directory_addr = directory or discovery_addr
        if is_redis(self.directory_addr):
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
        self.cache = DirectoryCache(dir_cache_ttl)
        #: the embedded directory this node hosts (``host_discovery``) and its RPC server
        self.hosted_directory: MetaService | None = None
        self.directory_server: RpcServer | None = None
        #: the endpoint of a transport that needs set-up per consumer (rdma: the QP exchange)
        self.control: RpcServer | None = None
        self.pool: Pool | None = None
        #: the directory client (embedded: an RpcClient to discovery; Redis: Redis itself), the
        #: same typed ops either way (:class:`~peercache.directory.ops.DirectoryOps`); None once closed
        self.directory: DirectoryClient | None = None
        self.transport = None
        self.info: dict[str, Any] = {}
        self.membership: Membership | None = None
        self.publisher: Publisher | None = None
        self.peer_infos: PeerInfos | None = None
        self.table_reader: TableReader | None = None
        self.resolver: Resolver | None = None
        self.reader: Reader | None = None
        #: what this node holds of the cluster secret (auth_key=, else $PEERCACHE_AUTH_KEY): the
        #: CURVE keys of the control plane and the token of the data servers' handshake (empty
        #: without a secret); ``auth``: the CURVE keys (None = no auth)
        self.credentials = _auth.Credentials.of(_auth.resolve(auth_key))
        self.auth = self.credentials.curve
        try:
            self.transport = make_transport(protocol, max_channels=max_channels,
                                            **_bounds(protocol, rpc_timeout, timeouts, transport_options))
            self.transport.use_credentials(self.credentials)
            native, _ = native_module()        # built (the cache above needs it)
            if host_discovery:
                entries = int(dir_table_entries)
                if entries < 0:
                    raise ConfigError(f"--dir-table-entries must be >= 0 (0 disables the table), got {entries}")
                self.hosted_directory = MetaService(heartbeat_timeout, table_entries=entries)
                self.directory_server = RpcServer(self.directory_addr, self.hosted_directory.handlers(),
                                                  auth=self.auth, limits=self.hosted_directory.limits,
                                                  deferred_ops=("members",), warn_open=True).start()
            self.directory = connect_directory(self.directory_addr, timeout=rpc_timeout, auth=self.auth,
                                               heartbeat_timeout=heartbeat_timeout)
            table = self._serve_data(pool_slots, slot_capacity, bind_host)
            if geometry is not None:
                self.info[GEOMETRY_KEY] = geometry.to_info()
            self.peer_infos = PeerInfos(self.directory, self.directory.host)
            self.membership = Membership(self.directory, self.info, heartbeat_interval,
                                         on_registered=self._registered, timeouts=timeouts)
            self.publisher = Publisher(self.pool, self.directory, self.membership)
            self.membership.on_forgotten = self.publisher.republish
            self.membership.on_heartbeat = self.publisher.retry_refused
            self.table_reader = TableReader(native, self.transport, self.cache, self.peer_infos, self.membership,
                                            self.hosted_directory, self.directory_addr)
            self.resolver = Resolver(self.cache, self.table_reader, self.directory, self.membership,
                                     self.peer_infos, LookupReplies(self.cache, self.peer_infos, discovery_addr),
                                     tier="redis" if is_redis(self.directory_addr) else "rpc")
            self.reader = Reader(native if self.transport.native else None, self.transport, self.cache,
                                 self.resolver, self.peer_infos, self.integrity, timeout=rpc_timeout)
            self.membership.register()
            if table is not None:
                # after registering: the table is served by this node, under its id
                self.hosted_directory.announce_table(self.node_id, self.info["data"], self.directory_addr)
                self.table_reader.use(self.hosted_directory.table_info())
        except BaseException:
            self.close(leave=False)
            raise
        self.membership.start_heartbeats()

    def _serve_data(self, pool_slots: int, slot_capacity: int, bind_host: str):
        """Expose the pool (``pool_slots``) and the hosted directory's table on the data transport,
        start serving them, and describe this node in :attr:`info`; returns the table served."""
        data_info: dict[str, Any] = {}
        if pool_slots:
            self.pool = Pool(pool_slots, slot_capacity, region_id=POOL_REGION, integrity=self.integrity)
            self.transport.expose(POOL_REGION, self.pool.mm, self.pool.rkey,
                                  fd=self.pool.fd, size=self.pool.size)
        hosted = self.hosted_directory
        table = hosted.directory.table if hosted is not None else None
        if table is not None:
            try:
                # The directory's table is one more region of this node's data server, read
                # (token-checked, with a secret) as the pages are.
                self.transport.expose(TABLE_REGION, table.mm, table.rkey, fd=table.fd, size=table.size)
            except PeerCacheError as e:
                log.warning("directory table not exposed (%s); consumers will use the lookup RPC", e)
                hosted.withdraw_table()
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
        control = self.control or self.directory_server
        self.info.update({"name": self.name, "host": socket.gethostname(), "pid": os.getpid(),
                          "protocol": self.protocol, "data": data_info,
                          "control": control.address if control else None})
        if self.pool is not None:
            # discovery refuses locations outside the regions a node registered
            self.info["regions"] = [[POOL_REGION, self.pool.size]]
        return table

    def _registered(self, registration: Registration) -> None:
        self.peer_infos.epoch = registration.epoch
        self.table_reader.use(registration.table)

    # -- what the parts hold, by the names callers use ------------------------------------
    node_id = _held("membership", "node_id", "This node's id, from its registration.")
    token = _held("membership", "token", "Issued by discovery at registration; proves requests in this node's name.")
    limits = _held("membership", "limits", "Discovery's request limits (from its register reply); batches are split "
                                           "to fit.")
    directory_answered = _held("membership", "answered", "When the directory last answered this node "
                                                         "(registration, then each heartbeat; monotonic s).")
    peers = _held("peer_infos", "by_id", "The infos of the nodes this node knows, by node id.")
    epoch = _held("peer_infos", "epoch", "The directory's epoch as of its last reply to this node.")
    publish_refused = _held("publisher", "refused_total", "Keys this node published that stayed with another "
                                                          "node (their owner).")
    stale_locations = _held("reader", "stale_locations", "Keys whose location (cached or fresh) no longer "
                                                         "matched the slot's tag and were looked up again.")
    integrity_failures = _held("reader", "integrity_failures", "With integrity on: hits refused because the "
                                                               "payload did not match its slot checksum.")
    integrity_missing = _held("reader", "integrity_missing", "With integrity on: hits refused because the "
                                                             "producer wrote no checksum (integrity off there).")
    redirected_entries = _held("reader", "redirected_entries", "Reads refused because the directory's entry (after "
                               "one fresh lookup) pointed at another key's slot (each a miss, see "
                               "BatchResult.redirected).")
    table_resolved = _held("table_reader", "resolved", "Keys the directory table answered with one one-sided "
                                                       "read (found, or definitively absent).")
    table_forwarded = _held("table_reader", "forwarded", "Keys the table could not answer and that went on to "
                                                         "the lookup RPC.")

    @property
    def bad_locations(self) -> int:
        """Directory entries refused by :func:`~peercache.directory.validate.read_location` so far (each read as an ERROR)."""
        return self.resolver.replies.bad_locations

    # the old names of what :attr:`directory`, :attr:`hosted_directory` and :attr:`directory_server` are
    discovery = property(lambda self: self.directory, doc="The directory client (:attr:`directory`).")
    meta = property(lambda self: self.hosted_directory, doc="The hosted directory (:attr:`hosted_directory`).")
    server = property(lambda self: self.directory_server,
                      doc="The hosted directory's RPC server (:attr:`directory_server`).")

    # -- membership -------------------------------------------------------------------
    def directory_silence(self) -> float:
        """Seconds since the directory last answered this node (its registration or a heartbeat,
        one every ``heartbeat_interval``): a few intervals mean the directory, or the node hosting
        it, is stopped, hung or out of reach, even while one-sided reads still succeed."""
        return self.membership.silence()

    def members(self) -> dict[str, dict[str, Any]]:
        """Current membership as discovery sees it."""
        return self.directory.members().nodes

    # -- producing ----------------------------------------------------------------------
    def put_batch(self, keys: Sequence[bytes], values: Sequence | None = None,
                  fill: Callable[[np.ndarray, SlotRef], None] | None = None) -> list[SlotRef]:
        """Write objects into the pool and publish them with one directory RPC."""
        return self.publisher.put_batch(keys, values, fill)

    def remove_batch(self, keys: Sequence[bytes]) -> int:
        """Remove objects from the pool and the directory."""
        return self.publisher.remove_batch(keys)

    # -- consuming ----------------------------------------------------------------------
    def lookup(self, keys: Sequence[bytes], use_cache: bool = True,
               bad: list | None = None) -> list[Location | None]:
        """Locations of ``keys``: cached ones, then what one read of the directory's table
        answers, the rest with one directory RPC (``use_cache`` False: the RPC alone).

        An invalid directory entry reads as None; with ``bad`` its
        ``(index, why)`` is appended there. Invalid entries are never cached.
        """
        return self.resolver.lookup(keys, use_cache, bad)

    def lookup_rows(self, keys: Sequence[bytes], bad: list | None = None) -> np.ndarray:
        """Locations of ``keys`` as LOC_DTYPE rows (node = the cache's index, see
        ``cache.node_id``; ABSENT for a miss or an invalid entry), resolved as a batch read
        resolves them: the cache, the directory's table, then the lookup RPC."""
        return self.resolver.lookup_rows(keys if isinstance(keys, list) else list(keys),
                                         [] if bad is None else bad)

    def get_batch_into(self, keys: Sequence[bytes], dest, offsets: Sequence[int] | np.ndarray,
                       capacities: Sequence[int] | np.ndarray | None = None, *,
                       check_pattern: bool = False, deadline: Deadline | None = None) -> BatchResult:
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
        The call has ``rpc_timeout`` seconds in all, every step included (the
        table read, the lookup RPC, the data read): keys it could not locate or
        read in that time are ERROR and listed in :attr:`BatchResult.timed_out`,
        and :attr:`BatchResult.error` names the step that used the time.
        ``deadline`` (a :class:`~.deadline.Deadline`): a bound shared with other
        calls instead (one read split over several calls).
        ``check_pattern`` (the bench): each hit is compared with the bench content
        of its (key, generation) in the same native pass; the ones that differ
        are listed in :attr:`BatchResult.content_mismatch`.
        """
        return self.reader.get_batch_into(keys, dest, offsets, capacities, check_pattern=check_pattern,
                                          deadline=deadline)

    def exists_batch(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether the directory knows each key (no data is read).

        A key whose entry is invalid is known (a read of it is an error, not a miss). The call has
        ``rpc_timeout`` in all, as a read has: DeadlineExceeded when a key was not answered in time.
        """
        bad: list = []
        deadline = Deadline(self.reader.timeout)
        present = [l is not None for l in self.resolver.lookup(keys, bad=bad, deadline=deadline)]
        late = deadline.take_late()
        if late:
            n = len(np.unique(np.concatenate(late)))
            raise DeadlineExceeded(f"exists_batch {deadline.reason(n, 'none of them known or unknown')}")
        for i, _ in bad:
            present[i] = True
        return present

    # -- lifecycle ------------------------------------------------------------------
    def add_handler(self, op: str, fn, owner_only: bool = True) -> None:
        """Serve an extra control op (only on the discovery-hosting node, or any node with Redis).

        With ``owner_only`` a request must come from a registered node, with
        the token discovery issued it (a peer's :meth:`call`); others are refused.
        With a Redis directory the requests come through Redis lists (see
        :meth:`peercache.directory.redis.backend.RedisDirectory.serve_op`).
        """
        if is_redis(self.directory_addr):
            self.directory.serve_op(op, fn, owner_only)
            return
        if self.directory_server is None or self.hosted_directory is None:
            raise ConfigError("only the node that hosts discovery serves extra ops")
        self.directory_server.handlers[op] = self.hosted_directory.owner_only(op, fn) if owner_only else fn

    def call(self, op: str, timeout: float | None = None, **fields) -> dict:
        """Send ``op`` to discovery in this node's name (its id and token), e.g. serve's reader_done."""
        return self.directory.call(op, timeout=timeout, node_id=self.node_id, token=self.token, **fields)

    def close(self, leave: bool = True) -> None:
        """Leave the cluster and release every resource (idempotent)."""
        if self.membership is not None:
            self.membership.close(leave)
        if self.directory is not None:
            self.directory.close()
            self.directory = None
        if self.transport is not None:
            self.transport.close()
            self.transport = None
        if self.control is not None:
            self.control.stop()
            self.control = None
        if self.directory_server is not None:
            self.directory_server.stop()
            self.directory_server = None
        if self.hosted_directory is not None:
            self.hosted_directory.stop()
            self.hosted_directory = None
            if self.table_reader is not None:
                self.table_reader.hosted = None
        if self.pool is not None:
            self.pool.close()
            self.pool = None
            if self.publisher is not None:
                self.publisher.pool = None

    def __enter__(self) -> "Node":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
