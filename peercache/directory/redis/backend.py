"""The Redis / Redis Cluster directory backend (``--directory redis://HOST:PORT/DB``).

Entry point: :func:`peercache.directory.client.connect_directory` (``spec`` a
redis://, rediss:// or redis+sentinel:// URL); :class:`RedisDirectory` is what it returns.

URL forms: ``redis://HOST:PORT/DB``, ``redis://[USER]:PASSWORD@HOST:PORT/DB``,
``rediss://...`` (TLS; ``?ssl_cert_reqs=none`` for a self-signed server),
``redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]`` (the master Redis
Sentinel names, followed across a failover: :mod:`.connection`; the URL: :mod:`.url`).
Without a password in the URL, ``$PEERCACHE_REDIS_PASSWORD`` is used when set.
``?prefix=NAME`` (default ``pc``) keeps several PeerCache clusters apart in one
Redis; ``?cluster=yes|no`` forces Redis Cluster mode on or off (by default the
server is asked: ``INFO cluster``). A cluster has only DB 0.

What is stored (``P`` = prefix; ``{...}`` = a Redis Cluster hash tag):

- ``P:e:<key>``: one directory entry: a fixed 56-byte record in the layout of
  ``LOC_DTYPE`` (peercache/transport/base.py): ``<IIQQQQQQ`` = (owner's member
  number, region, rkey, offset, length, capacity, generation, key_hash); entries
  spread over the cluster's slots. A lookup joins the values it gets and has the
  reply's records without a Python object per entry. A value of any other size
  (an older PeerCache stored ``len | node_id | <IQQQQQQ>``) belongs to nobody: a
  lookup reports it as an invalid entry, any publisher may overwrite or remove it.
- ``P:n:{<node_id>}``: a node's hash (``info`` msgpack, ``token``, ``num`` its
  member number) with a TTL of the node's heartbeat timeout, renewed by each
  heartbeat; ``P:o:{id}`` the set of keys it published (for clean-up); ``P:t:{id}``
  its token, kept a day so a node forgotten by Redis (a restart, an expiry) may
  register again under its id with that token, and nobody else may.
- ``P:g:{<node_id>}`` (one Redis) or ``P:g:{<tag>}:<node_id>`` (a cluster: one per master the node
  published to, in its first slot): the node's publish marks, raised to each publish's generation
  after its entries; one read lower than this client saw it raised means a failover lost some of the
  node's entries, and the node republishes (:mod:`.marks`).
- ``P:{m}:nodes`` (set of members), ``P:{m}:alive`` (zset: id -> wall-clock
  expiry, for finding expired nodes cheaply), ``P:{m}:epoch`` (INCR on each join,
  leave and expiry), ``P:{m}:num`` (id -> member number) and ``P:{m}:ids`` (number
  -> id): a number is given at join by INCR of ``P:{m}:count`` (seeded at random
  when absent, so a Redis restarted empty does not hand out the numbers of before
  again), kept while the node is a member and never given to another node; extra
  ops go through ``P:{m}:op:<op>`` lists with replies on ``P:{m}:re:<request id>``.

How a node vanishes with its entries: an entry is only valid while its
owner's node key exists. A lookup reads the entries and the epoch in one
round trip (one Redis: one MGET of the epoch key and the entries, on a plain
socket of the client's own; a cluster: one MGET per
hash slot, grouped per master and written to every master before any reply
is read, so the masters work in parallel); an owner (a member number) is
trusted for as long as its node key's TTL said it lives (a lease cached here,
dropped when the epoch moves), and is checked again with one more round trip
once that lease runs out (its node hash must still carry that number; a number
seen for the first time costs one more, to learn its node id). So an expired node's
entries read as misses from the moment its key expires, a node that leaves
deletes its entries and bumps the epoch, and reapers (every node's heartbeat,
and ``peercache-bench meta --directory redis://...``) drop expired members,
bump the epoch and delete their entries.

Ownership: publish and unpublish run as Lua scripts (EVALSHA, one per hash
slot group, all pipelined: one round trip per batch) that write or delete a
key only when it is absent or owned by the caller; a key owned by another
node stays with it unless that owner is no longer alive (checked in a
second round trip only for refused keys), exactly as the embedded
directory's ``publish_checked(takeover=False)``. Tokens: requests in a node's
name are checked against the token in its node key (cached for a fraction
of the heartbeat timeout). Redis itself is the trust boundary: whoever holds
its password can write anything, so protect it (requirepass / ACL, TLS).

The backend's parts, one module each: :mod:`.connection` (the connection, the pipelined
round trip, what a failure means), :mod:`.scripts` (the Lua scripts), :mod:`.marks` (publish marks),
:mod:`.membership` (register, heartbeat, leave, members, reaping), :mod:`.leases`
(whether an entry's owner is alive), :mod:`.lookup` (the hand-written lookup request path)
and :mod:`.remote_ops` (extra ops relayed through Redis). This module composes them and
holds publish, unpublish and lookup.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

import numpy as np
import redis
from redis.crc import key_slot

from ..ops import DirectoryOps
from ..service import DEFAULT_HEARTBEAT_TIMEOUT
from ...errors import PeerCacheError, RpcError
from ...rpc import Limits, unpack
from ...timeouts import DEFAULT
from ..location import RECORD, decode_record, encode_record
from .connection import RedisConnection
from .leases import OwnerLeases
from .lookup import LookupRequests, resp_command
from .marks import MarkBook, PublishMarks, keep_ms
from .membership import RedisMembership
from .remote_ops import RemoteOps
from .url import RedisURL, parse_url
from ..validate import Refused, check_keys, check_location, check_token, not_registered, regions_of, requester
from ...transport.base import LOC_DTYPE

REC = RECORD.size
_REC_U32 = REC // 4          # uint32 words per record (its first is the member number)
#: A Redis command of more keys than this would stall the server for others; Node splits batches to fit.
REDIS_LIMITS = Limits(max_keys_per_request=16384)
BUILTIN_OPS = ("register", "heartbeat", "leave", "members", "publish", "lookup", "unpublish")


def not_a_record(v: bytes) -> list:
    """What a lookup's ``locs`` answer holds for a value that is not a record: a one-field list
    the node refuses per key (``directory.validate.read_location``), naming the size and the likely cause."""
    return [f"<{len(v)}-byte entry, not a {REC}-byte record: older PeerCache? republish>"]


class RedisDirectory(RedisConnection, RedisMembership, OwnerLeases, LookupRequests, RemoteOps, PublishMarks,
                     DirectoryOps):
    """A directory client speaking Redis (see the module doc); ``call`` answers like the embedded one."""

    kind = "redis"

    def __init__(self, url: str, *, timeout: float = DEFAULT.directory_s,
                 heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT, limits: Limits | None = None,
                 _parsed: RedisURL | None = None, _cluster: bool | None = None):
        self.cfg = _parsed or parse_url(url)
        self.address = self.cfg.safe
        self.host = self.cfg.host
        self.timeout = timeout
        self.heartbeat_timeout = heartbeat_timeout
        self.limits = limits or REDIS_LIMITS
        p = self.cfg.prefix
        self._p = p
        self.k_nodes, self.k_alive, self.k_epoch = f"{p}:{{m}}:nodes", f"{p}:{{m}}:alive", f"{p}:{{m}}:epoch"
        self.k_num, self.k_ids, self.k_count = f"{p}:{{m}}:num", f"{p}:{{m}}:ids", f"{p}:{{m}}:count"
        self._sha: dict[str, str] = {}
        #: owner member number -> (alive until, its node id and info; None = gone)
        self._leases: dict[int, tuple[float, tuple[str, dict] | None]] = {}
        self._lease_epoch: int | None = None
        #: member number -> node id, as learnt (checked again at each lease refresh)
        self._ids: dict[int, str] = {}
        #: (node id, token) -> (trusted until, info, member number)
        self._verified: dict[tuple[str, str], tuple[float, dict, int]] = {}
        # The lookup's request parts, pre-built: each key's MGET header per key length (RESP), the
        # epoch key that one MGET reads first, and the cluster path's GET of it.
        self._get_epoch = resp_command(b"GET", self.k_epoch.encode())
        self._entry_pre = f"{p}:e:".encode()
        self._key_hdr = [b"\r\n$%d\r\n%s" % (len(self._entry_pre) + n, self._entry_pre)
                         for n in range(min(self.limits.max_key_bytes, 255) + 1)]
        self._epoch_key = self.k_epoch.encode()
        #: connections of this client's own for one-Redis lookups (no pool lock, no health probe)
        self._conns: list = []
        self._epoch = 0
        self._lock = threading.Lock()
        self._handlers: dict[str, tuple[Callable[[dict], dict], bool]] = {}
        self._op_thread: threading.Thread | None = None
        self._op_stop = threading.Event()
        self._op_conn = None
        self._reaper: threading.Thread | None = None
        #: the publish marks of the nodes publishing through this client (shared with its clones: .marks)
        self._marks = MarkBook()
        self._mark_reader: threading.Thread | None = None
        #: a cluster's slot map read again off a caller's thread (connection._refresh_slots_soon)
        self._slot_refresher: threading.Thread | None = None
        self.cluster = False
        #: redis-py's Sentinel of a redis+sentinel:// URL (made at the first connection; None otherwise)
        self._sentinels = None
        self._master_checked = 0.0      #: when _follow_master last asked the sentinels (monotonic s)
        self.r = self._connect(_cluster)

    def clone(self) -> "RedisDirectory":
        c = RedisDirectory(self.cfg.url, timeout=self.timeout, heartbeat_timeout=self.heartbeat_timeout,
                           limits=self.limits, _parsed=self.cfg, _cluster=self.cluster)
        c._marks = self._marks        # the heartbeat's clone reads the marks this client's publishes raised
        return c

    def close(self) -> None:
        self._op_stop.set()
        for t in (self._op_thread, self._reaper, self._mark_reader, self._slot_refresher):
            if t is not None and t is not threading.current_thread():
                t.join(timeout=self.timeout + 2)
        while self._conns:
            try:
                c = self._conns.pop()
                c.disconnect() if self.cfg.ssl else c.close()
            except (IndexError, OSError, redis.exceptions.RedisError):   # taken by a lookup meanwhile / broken
                pass
        for r in (self._op_conn, self.r):
            if r is not None:
                try:
                    r.close()
                except Exception:   # closing a broken connection: nothing left to release
                    pass
        self._close_sentinels()

    # -- helpers ------------------------------------------------------------------------------
    def _node_key(self, nid: str) -> str:
        return f"{self._p}:n:{{{nid}}}"

    def _owned_key(self, nid: str) -> str:
        return f"{self._p}:o:{{{nid}}}"

    def _token_key(self, nid: str) -> str:
        return f"{self._p}:t:{{{nid}}}"

    def _entry(self, k: bytes) -> bytes:
        return self._p.encode() + b":e:" + k

    def _groups(self, keys: Sequence[bytes]) -> list[list[int]]:
        """Indices of ``keys`` (stored key names) grouped by hash slot (one group without a cluster)."""
        if not self.cluster:
            return [list(range(len(keys)))] if len(keys) else []
        by: dict[int, list[int]] = {}
        for i, k in enumerate(keys):
            by.setdefault(key_slot(k), []).append(i)
        return list(by.values())

    def _refused(self, op: str, why: BaseException | str) -> RpcError:
        """A request this directory will not carry out, as the embedded one answers it, with who refused."""
        return RpcError(f"directory {self.address} refused {op!r}: {why}")

    def _check_keys(self, keys: Any, op: str, fld: str = "keys") -> list:
        try:
            return check_keys(keys, op, self.limits, fld)
        except PeerCacheError as e:
            raise self._refused(op, e) from None

    def _authorize(self, msg: dict, op: str, fresh: bool = False) -> tuple[str, dict, int]:
        """(node id, its info, its member number) when ``msg`` carries the token of a live node; else RpcError."""
        try:
            nid = requester(msg, op)
        except Refused as e:
            raise self._refused(op, e) from None
        token = msg.get("token")
        now = time.monotonic()
        if isinstance(token, str) and not fresh:
            hit = self._verified.get((nid, token))
            if hit is not None and hit[0] > now:
                return nid, hit[1], hit[2]
        try:
            stored, info, num = self.r.hmget(self._node_key(nid), ["token", "info", "num"])
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError) as e:
            raise self._unreachable(op, e) from None
        if stored is None:
            raise self._refused(op, not_registered(nid))
        try:
            check_token(nid, op, token, stored)
        except Refused as e:
            raise self._refused(op, e) from None
        if num is None or not num.isdigit():
            raise RpcError(f"directory {self.address} refused {op!r}: node {nid!r} has no member number (it "
                           "registered through an older PeerCache, or its registration did not finish); "
                           "register again")
        info_d = unpack(info) if info else {}
        if len(self._verified) > 4096:
            self._verified.clear()
        self._verified[(nid, token)] = (now + self.heartbeat_timeout / 4, info_d, int(num))
        return nid, info_d, int(num)

    # -- the RpcClient surface --------------------------------------------------------------
    def call(self, op: str, timeout: float | None = None, **fields) -> dict:
        """Answer ``op`` like the embedded directory's RPC; an extra op goes to the node serving it."""
        fn = getattr(self, f"_op_{op}", None) if op in BUILTIN_OPS else None
        if fn is None:
            return self._remote_op(op, self.timeout if timeout is None else timeout, fields)
        return fn(fields)

    # -- the directory ----------------------------------------------------------------------
    def _op_publish(self, msg: dict) -> dict:
        nid, info, num = self._authorize(msg, "publish")
        keys = self._check_keys(msg.get("keys"), "publish")
        locs = msg.get("locs")
        if not isinstance(locs, list) or len(locs) != len(keys):
            raise self._refused("publish", f"it needs a 'locs' list as long as "
                           f"'keys' ({len(keys)})")
        unpub = self._check_keys(msg.get("unpublish") or [], "publish", "unpublish")
        regions = regions_of(info)
        try:
            values = [encode_record(num, check_location(nid, i, l, regions)) for i, l in enumerate(locs)]
        except Refused as e:
            raise self._refused("publish", e) from None
        me = num.to_bytes(4, "little")          # how the scripts see the owner of a record
        ekeys = [self._entry(k) for k in keys]
        uekeys = [self._entry(k) for k in unpub]
        groups, ugroups = self._groups(ekeys), self._groups(uekeys)    # by the slots of the stored keys
        owned = self._owned_key(nid)
        # Last, on each master written to: the marks a failover that lost some of these writes leaves
        # behind (.marks). Their keys and generation are fixed here: _pipe may build the pipeline twice.
        marks = self._mark_keys(nid, [*(ekeys[g[0]] for g in groups), owned]) if keys else []
        gen = self._marks.next_gen(nid) if marks else 0
        ttl = keep_ms(self.heartbeat_timeout)

        def build(p):
            for g in groups:
                self._evalsha(p, "publish", [ekeys[i] for i in g], [me, *(values[i] for i in g)])
            if keys:
                p.sadd(owned, *keys)
            for g in ugroups:
                self._evalsha(p, "unpublish", [uekeys[i] for i in g], [me])
            if unpub:
                p.srem(owned, *unpub)
            for k in marks:
                self._evalsha(p, "mark", [k], [gen, ttl])
        res = self._pipe("publish", build)
        if marks:
            self._marks.raised(nid, marks, gen, res[len(res) - len(marks):])
        refused: dict[int, bytes] = {}           # index -> the owner's number (4 bytes, as stored)
        for g, out in zip(groups, res):
            for i, o in zip(g, out):
                if o != 0:
                    refused[i] = o
        removed = sum(res[len(groups) + (1 if keys else 0): len(groups) + (1 if keys else 0) + len(ugroups)])
        if refused:
            refused = self._take_over_dead(me, ekeys, values, refused)
        if refused:
            self._pipe("publish", lambda p: p.srem(owned, *(keys[i] for i in refused)))
        reply: dict[str, Any] = {"ok": True, "published": len(keys) - len(refused), "unpublished": removed}
        if refused:
            idx = sorted(refused)
            reply.update(refused=len(idx), refused_keys=[keys[i] for i in idx[:8]], refused_index=idx,
                         refused_reason="published by another node; only the owner of an entry may overwrite it")
        return reply

    def _take_over_dead(self, me: bytes, ekeys, values, refused: dict[int, bytes]) -> dict[int, bytes]:
        """Refused keys whose owner is no longer alive are taken over; the ones still refused."""
        owners = sorted({int.from_bytes(o, "little") for o in refused.values() if len(o) == 4})
        self._refresh_leases(owners, time.monotonic())          # fresh: never trust a lease here
        live = self._leases
        dead = [i for i, o in refused.items()
                if len(o) == 4 and (le := live.get(int.from_bytes(o, "little"))) is not None and le[1] is None]
        if not dead:
            return refused
        groups = self._groups([ekeys[i] for i in dead])
        res = self._pipe("publish", lambda p: [self._evalsha(
            p, "takeover", [ekeys[dead[j]] for j in g],
            [me, *(x for j in g for x in (refused[dead[j]], values[dead[j]]))]) for g in groups])
        left = dict(refused)
        for g, out in zip(groups, res):
            for j, ok in zip(g, out):
                if ok == 1:
                    left.pop(dead[j], None)
        return left

    def _unpublish_keys(self, nid: str, num: int, keys: list, op: str, drop_from_set: bool = True) -> int:
        ekeys = [self._entry(k) for k in keys]
        groups = self._groups(ekeys)
        if not groups:
            return 0
        me = num.to_bytes(4, "little")

        def build(p):
            for g in groups:
                self._evalsha(p, "unpublish", [ekeys[i] for i in g], [me])
            if drop_from_set:
                p.srem(self._owned_key(nid), *keys)
        return int(sum(self._pipe(op, build)[:len(groups)]))

    def _op_unpublish(self, msg: dict) -> dict:
        nid, _, num = self._authorize(msg, "unpublish")
        keys = self._check_keys(msg.get("keys"), "unpublish")
        return {"ok": True, "unpublished": self._unpublish_keys(nid, num, keys, "unpublish")}

    def _op_lookup(self, msg: dict) -> dict:
        keys = msg.get("keys")
        if type(keys) is not list or len(keys) > self.limits.max_keys_per_request:
            self._check_keys(keys, "lookup")        # raises, saying what is wrong
        # Each key's type and length are checked as the request is built (_mget): no pass of its own.
        if msg.get("recs") is True:
            return self.lookup_records(keys, msg.get("epoch"))
        return self.lookup_lists(keys)

    def lookup_records(self, keys: Sequence[bytes], epoch: int | None = None) -> dict:
        """The embedded directory's fast reply: ``{recs, nids, epoch[, missing][, nodes]}``.

        ``recs``: one LOC_DTYPE record per key found, in order (its ``node`` the owner's member
        number), simply the stored values joined; ``nids``: member number -> node id of the numbers
        present; ``missing``: little-endian uint32 indices of the keys not found (absent, or their
        owner gone), only when some are; ``nodes``: the endpoint infos of the nodes present, only
        when ``epoch`` (the caller's) is not the current one. One round trip (plus one only for an
        owner whose lease ran out). A value that is not a record makes it answer as :meth:`lookup_lists`.
        """
        cur, raw = self._fetch(keys)
        n = len(raw)
        try:
            blob = b"".join(raw)
            have = None                          # all found
        except TypeError:                        # misses (None)
            have = np.fromiter([v is not None for v in raw], bool, n)
            blob = b"".join([v for v in raw if v is not None])
        found = n if have is None else int(np.count_nonzero(have))
        if len(blob) != found * REC:
            return self._locs_reply(raw, cur)    # some value is not a record: say which, per key
        reply: dict[str, Any] = {"ok": True, "recs": blob, "nids": {}, "epoch": cur}
        if found:
            h = blob[:4]
            if (blob[0::REC] == h[0:1] * found and blob[1::REC] == h[1:2] * found
                    and blob[2::REC] == h[2:3] * found and blob[3::REC] == h[3:4] * found):
                nums = [int.from_bytes(h, "little")]     # one owner (bytes compared, no array)
                heads = None
            else:
                heads = np.frombuffer(blob, "<u4")[::_REC_U32]
                nums = np.unique(heads).tolist()
            owners = self._owners(nums, cur)
            if len(owners) < len(nums):          # entries of a node that is gone read as misses
                if heads is None:
                    heads = np.frombuffer(blob, "<u4")[::_REC_U32]
                keep = np.isin(heads, list(owners))
                blob = np.frombuffer(blob, LOC_DTYPE)[keep].tobytes()
                if have is None:
                    have = np.ones(n, bool)
                have[np.flatnonzero(have)[~keep]] = False
                reply["recs"] = blob
            reply["nids"] = {num: o[0] for num, o in owners.items()}
            if epoch != cur and owners:
                reply["nodes"] = {o[0]: o[1] for o in owners.values()}
        if have is not None and not have.all():
            reply["missing"] = np.flatnonzero(~have).astype("<u4").tobytes()
        return reply

    def lookup_lists(self, keys: Sequence[bytes]) -> dict:
        """``{locs: [8-field list | None], nodes: {node_id: info}, epoch}``: one pipelined round trip
        (the entries and the epoch), plus one more only for owners whose liveness lease ran out."""
        epoch, raw = self._fetch(keys)
        return self._locs_reply(raw, epoch)

    def _locs_reply(self, raw: list, epoch: int) -> dict:
        """The original lookup reply of fetched values: 8-field lists, None for a miss or an entry whose
        owner is gone, a one-field list naming the problem for a value that is not a record."""
        recs = [None if v is None else decode_record(v) for v in raw]
        owners = self._owners(sorted({r[0] for r in recs if r is not None}), epoch)
        locs: list = [None] * len(raw)
        for i, (v, r) in enumerate(zip(raw, recs)):
            if r is not None:
                o = owners.get(r[0])
                if o is not None:
                    locs[i] = [o[0], *r[1:]]
            elif v is not None:
                locs[i] = not_a_record(v)
        return {"ok": True, "locs": locs, "nodes": {o[0]: o[1] for o in owners.values()}, "epoch": epoch}

