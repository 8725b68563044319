"""The Redis / Redis Cluster directory backend (``--directory redis://HOST:PORT/DB``).

Entry point: :func:`peercache.directory.client.connect_directory` (``spec`` a
redis:// or rediss:// URL); :class:`RedisDirectory` is what it returns.

URL forms: ``redis://HOST:PORT/DB``, ``redis://[USER]:PASSWORD@HOST:PORT/DB``,
``rediss://...`` (TLS; ``?ssl_cert_reqs=none`` for a self-signed server).
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
"""
from __future__ import annotations

import logging
import re
import secrets
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np
import redis
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from .client import DirectoryOps
from .service import DEFAULT_HEARTBEAT_TIMEOUT
from ..errors import ConfigError, DiscoveryUnreachable, PeerCacheError, RpcError
from ..rpc import Limits, pack, unpack
from .location import RECORD, decode_record, encode_record
from .redis_lookup import LookupSocket, resp_command
from .redis_url import PASSWORD_ENV, RedisURL, parse_url
from .validate import (Refused, check_keys, check_location, check_regions, check_token, not_registered, regions_of,
                       requester)
from ..transport.base import LOC_DTYPE


def _once_on_a_broken_connection() -> Retry:
    """redis-py's retry policy here: a command is sent once more on a fresh connection when the pooled
    one turned out broken (a restarted Redis), never after a timeout, so each call waits at most its
    socket timeout: a stopped Redis ends a call after one timeout, not two."""
    return Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,))


def _timed_out(e: BaseException) -> bool:
    """Whether ``e`` is a socket timeout (SO_RCVTIMEO's EAGAIN, socket.timeout or redis-py's)."""
    return isinstance(e, (TimeoutError, BlockingIOError, redis.exceptions.TimeoutError))

log = logging.getLogger(__name__)

REC = RECORD.size
_REC_U32 = REC // 4          # uint32 words per record (its first is the member number)
#: How long a node's token is remembered after its node key went (it may register again with it).
TOKEN_KEEP_S = 86400
#: Expired members one heartbeat reaps at most.
REAP_BATCH = 16
#: Keys per SSCAN step when a dead or leaving node's entries are deleted; steps per clean-up at most.
CLEAN_STEP, CLEAN_STEPS = 1024, 4096
#: A Redis command of more keys than this would stall the server for others; Node splits batches to fit.
REDIS_LIMITS = Limits(max_keys_per_request=16384)
BUILTIN_OPS = ("register", "heartbeat", "leave", "members", "publish", "lookup", "unpublish")

# -- server-side scripts -----------------------------------------------------------------------
# An entry's owner: the member number (4 bytes) its record starts with; false for a value that is
# not a record (an older PeerCache's, or garbage), which belongs to nobody.
_OWNER = "local function owner(v) if #v == %d then return string.sub(v, 1, 4) end return false end\n" % REC

#: KEYS: entries of one hash slot; ARGV[1] = the publisher's number (4 bytes), ARGV[1 + i] = the
#: record of KEYS[i]. Per key: 0 = written, else the number of the other node that owns it (left alone).
PUBLISH_LUA = _OWNER + """
local me, out = ARGV[1], {}
for i, k in ipairs(KEYS) do
  local v = redis.call('GET', k)
  local o = v and owner(v)
  if o and o ~= me then out[i] = o
  else redis.call('SET', k, ARGV[i + 1]); out[i] = 0 end
end
return out
"""

#: KEYS: entries of one slot; ARGV[1] = publisher's number, then per key (its dead owner's number
#: seen, record). Per key 1 = taken over (still that dead node's, or nobody's), 0 = someone else's now.
TAKEOVER_LUA = _OWNER + """
local out = {}
for i, k in ipairs(KEYS) do
  local v = redis.call('GET', k)
  local o = v and owner(v)
  if (not o) or o == ARGV[2 * i] or o == ARGV[1] then
    redis.call('SET', k, ARGV[2 * i + 1]); out[i] = 1
  else out[i] = 0 end
end
return out
"""

#: KEYS: entries of one slot; ARGV[1] = the node's number; deletes those it owns (and values that
#: are nobody's); returns how many.
UNPUBLISH_LUA = _OWNER + """
local n = 0
for _, k in ipairs(KEYS) do
  local v = redis.call('GET', k)
  if v and (owner(v) == ARGV[1] or not owner(v)) then redis.call('DEL', k); n = n + 1 end
end
return n
"""

#: KEYS: node hash, token record. ARGV: token, info, ttl ms, token keep s.
#: 1 = registered; 0 = the id is another node's (its token differs).
REGISTER_LUA = """
local t = redis.call('GET', KEYS[2])
if t and t ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'info', ARGV[2], 'token', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[4])
return 1
"""

#: KEYS: node hash, owned set, token record. ARGV: token, ttl ms, owned-set ttl ms, token keep s.
#: 1 = renewed; 0 = unknown (register again); -1 = wrong token.
HEARTBEAT_LUA = """
local t = redis.call('HGET', KEYS[1], 'token')
if not t then
  local r = redis.call('GET', KEYS[3])
  if r and r ~= ARGV[1] then return -1 end
  return 0
end
if t ~= ARGV[1] then return -1 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('EXPIRE', KEYS[3], ARGV[4])
return 1
"""

#: KEYS: members set, alive zset, epoch, id -> number hash, number -> id hash, number counter.
#: ARGV: id, wall-clock expiry, max nodes, a random counter seed. {new epoch, the member's number}
#: (kept while it is a member, else the next of the counter); {-1, 0} when the directory already has
#: max nodes, {-2, 0} when the numbers ran out.
JOIN_LUA = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 and redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  return {-1, 0}
end
local num = redis.call('HGET', KEYS[4], ARGV[1])
if not num then
  redis.call('SET', KEYS[6], ARGV[4], 'NX')
  num = redis.call('INCR', KEYS[6])
  if num >= 4294967295 then return {-2, 0} end
  redis.call('HSET', KEYS[4], ARGV[1], num)
  redis.call('HSET', KEYS[5], num, ARGV[1])
end
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
return {redis.call('INCR', KEYS[3]), tonumber(num)}
"""

#: KEYS: id -> number hash, number -> id hash. ARGV: id, its number. Forgets the number (after the
#: node's entries were deleted); a number is never given again.
FORGET_LUA = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then redis.call('HDEL', KEYS[1], ARGV[1]) end
if redis.call('HGET', KEYS[2], ARGV[2]) == ARGV[1] then redis.call('HDEL', KEYS[2], ARGV[2]) end
return 1
"""

#: KEYS: members set, alive zset, epoch. ARGV: id. The new epoch if this call removed the
#: member (the caller then deletes its entries), else 0.
DROP_LUA = """
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('SREM', KEYS[1], ARGV[1]) == 1 then return redis.call('INCR', KEYS[3]) end
return 0
"""

_SCRIPTS = {"publish": PUBLISH_LUA, "takeover": TAKEOVER_LUA, "unpublish": UNPUBLISH_LUA,
            "register": REGISTER_LUA, "heartbeat": HEARTBEAT_LUA, "join": JOIN_LUA, "drop": DROP_LUA,
            "forget": FORGET_LUA}


def not_a_record(v: bytes) -> list:
    """What a lookup's ``locs`` answer holds for a value that is not a record: a one-field list
    the node refuses per key (``directory.validate.read_location``), naming the size and the likely cause."""
    return [f"<{len(v)}-byte entry, not a {REC}-byte record: older PeerCache? republish>"]


class RedisDirectory(DirectoryOps):
    """A directory client speaking Redis (see the module doc); ``call`` answers like the embedded one."""

    kind = "redis"

    def __init__(self, url: str, *, timeout: float = 5.0,
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
        self.cluster = False
        self.r = self._connect(_cluster)

    # -- connection -------------------------------------------------------------------------
    def _kwargs(self) -> dict:
        c = self.cfg
        kw: dict[str, Any] = dict(username=c.username, password=c.password, socket_timeout=self.timeout,
                                  socket_connect_timeout=min(self.timeout, 2.0),
                                  retry=_once_on_a_broken_connection(), health_check_interval=0)
        if c.ssl:
            kw["ssl"] = True
            kw.update(c.ssl_options)
        return kw

    def _connect(self, cluster: bool | None):
        c = self.cfg
        kw = self._kwargs()
        try:
            if cluster is None:
                cluster = c.cluster
            if cluster is None:
                probe = redis.Redis(host=c.host, port=c.port, db=c.db, **kw)
                try:
                    cluster = str(probe.info("cluster").get("cluster_enabled", 0)) == "1"
                finally:
                    probe.close()
            if cluster:
                if c.db:
                    raise ConfigError(f"directory {self.address} is a Redis Cluster, which has only database 0; "
                                      "drop the /DB from the URL")
                r = redis.RedisCluster(host=c.host, port=c.port, retry=_once_on_a_broken_connection(),
                                       require_full_coverage=True, **{k: v for k, v in kw.items()
                                                                      if k != "retry"})
            else:
                r = redis.Redis(host=c.host, port=c.port, db=c.db, **kw)
                r.ping()
            self.cluster = bool(cluster)
            for name, src in _SCRIPTS.items():
                self._sha[name] = self._load_script(r, src)
            return r
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError) as e:
            raise self._unreachable("connect", e) from None

    def _load_script(self, r, src: str) -> str:
        if self.cluster:
            # SCRIPT LOAD on every primary, so an EVALSHA routed anywhere finds it.
            sha = None
            for node in r.get_primaries():
                sha = r.get_redis_connection(node).script_load(src)
            return sha
        return r.script_load(src)

    def _unreachable(self, op: str, e: BaseException) -> PeerCacheError:
        if isinstance(e, (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError)) or \
                "NOAUTH" in str(e) or "WRONGPASS" in str(e):
            return DiscoveryUnreachable(
                f"directory {self.address} refused the credentials during {op!r} ({e}); put the password in "
                f"the URL (redis://:PASSWORD@HOST:PORT/DB) or in ${PASSWORD_ENV}")
        if isinstance(e, redis.exceptions.ResponseError) and not isinstance(e, redis.exceptions.ClusterDownError):
            return RpcError(f"directory {self.address} refused {op!r}: {e}")
        if _timed_out(e):
            return DiscoveryUnreachable(
                f"directory {self.address} unreachable during {op!r}: no answer within {self.timeout:g} s; "
                "check that redis-server is running there and not stopped or overloaded")
        return DiscoveryUnreachable(
            f"directory {self.address} unreachable during {op!r}: {type(e).__name__}: {e}; check that "
            "redis-server is running there and that the URL's host, port and password are right")

    def clone(self) -> "RedisDirectory":
        return RedisDirectory(self.cfg.url, timeout=self.timeout, heartbeat_timeout=self.heartbeat_timeout,
                              limits=self.limits, _parsed=self.cfg, _cluster=self.cluster)

    def close(self) -> None:
        self._op_stop.set()
        for t in (self._op_thread, self._reaper):
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

    def _pipe(self, op: str, build: Callable[[Any], None]) -> list:
        """Run the commands ``build`` queues as one pipelined round trip; scripts reloaded once if
        the server lost them (a restart). Raises DiscoveryUnreachable / RpcError."""
        for attempt in (0, 1):
            try:
                pipe = self.r.pipeline(transaction=False)
                build(pipe)
                res = pipe.execute(raise_on_error=False)
            except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError) as e:
                raise self._unreachable(op, e) from None
            if attempt == 0 and any(isinstance(x, redis.exceptions.NoScriptError) for x in res):
                try:
                    for name, src in _SCRIPTS.items():
                        self._sha[name] = self._load_script(self.r, src)
                except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError) as e:
                    raise self._unreachable(op, e) from None
                continue
            for x in res:
                if isinstance(x, Exception):
                    raise self._unreachable(op, x)
            return res
        raise AssertionError("unreachable")

    def _evalsha(self, pipe, name: str, keys: Sequence, args: Sequence) -> None:
        # execute_command: redis-py's cluster pipeline refuses its evalsha() method, not the command
        # (routed by the script's keys, which share one hash slot here).
        pipe.execute_command("EVALSHA", self._sha[name], len(keys), *keys, *args)

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

    # -- membership ---------------------------------------------------------------------------
    def _op_register(self, msg: dict) -> dict:
        info = msg.get("info")
        if not isinstance(info, dict):
            raise self._refused("register", "it needs an 'info' map")
        try:
            check_regions(info.get("regions"))
        except Refused as e:
            raise self._refused("register", e) from None
        info = {k: v for k, v in info.items() if k not in ("node_id", "token")}
        body = pack(info)
        if len(body) > self.limits.max_node_info_bytes:
            raise self._refused("register", self.limits.refuse(
                "max_node_info_bytes", f"registration with {len(body)} bytes of node info", " bytes of node info"))
        nid, token = msg.get("node_id"), msg.get("token")
        again = isinstance(nid, str) and isinstance(token, str) and 0 < len(nid) <= 64 and bool(token)
        ttl_ms = int(self.heartbeat_timeout * 1000)
        for _ in range(8):
            if not again:
                nid, token = secrets.token_hex(6), secrets.token_hex(16)
            full = pack(dict(info, node_id=nid))
            res = self._pipe("register", lambda p: self._evalsha(
                p, "register", [self._node_key(nid), self._token_key(nid)], [token, full, ttl_ms, TOKEN_KEEP_S]))
            if res[0] == 1:
                break
            again = False   # the id is another node's: take a fresh one
        else:
            raise RpcError(f"directory {self.address}: no free node id after 8 tries")
        if msg.get("node_id") == nid:
            self._drop_entries(nid)   # a node back after being dropped republishes all it has
        res = self._pipe("register", lambda p: self._evalsha(
            p, "join", [self.k_nodes, self.k_alive, self.k_epoch, self.k_num, self.k_ids, self.k_count],
            [nid, time.time() + self.heartbeat_timeout, self.limits.max_nodes, secrets.randbelow(1 << 31)]))
        epoch, num = (int(x) for x in res[0])
        if epoch < 0:
            self._pipe("register", lambda p: p.delete(self._node_key(nid)))
            if epoch == -2:
                raise self._refused("register", f"its member numbers ran out "
                               f"(32 bits); delete the key {self.k_count} (or empty the prefix) and restart the nodes")
            raise self._refused("register", self.limits.refuse(
                "max_nodes", "registration of one more node", " registered nodes"))
        # The number goes into the node hash: publishes stamp it on their records, lookups check it.
        self._pipe("register", lambda p: p.hset(self._node_key(nid), "num", num))
        self._epoch = epoch
        self._verified[(nid, token)] = (time.monotonic() + self.heartbeat_timeout / 4,
                                        dict(info, node_id=nid), num)
        return {"ok": True, "node_id": nid, "token": token, "epoch": self._epoch,
                "heartbeat_timeout": self.heartbeat_timeout, "limits": self.limits.as_dict()}

    def _op_heartbeat(self, msg: dict) -> dict:
        nid, token = msg.get("node_id"), msg.get("token")
        if not isinstance(nid, str) or not nid:
            raise self._refused("heartbeat", "it needs a 'node_id' string")
        token = token if isinstance(token, str) else ""
        ttl_ms = int(self.heartbeat_timeout * 1000)
        now = time.time()

        def build(p):
            self._evalsha(p, "heartbeat", [self._node_key(nid), self._owned_key(nid), self._token_key(nid)],
                          [token, ttl_ms, max(4 * ttl_ms, 60000), TOKEN_KEEP_S])
            p.zadd(self.k_alive, {nid: now + self.heartbeat_timeout}, xx=True)
            p.get(self.k_epoch)
            p.zrangebyscore(self.k_alive, "-inf", now, start=0, num=REAP_BATCH)
        res = self._pipe("heartbeat", build)
        if res[0] == -1:
            raise self._refused("heartbeat", f"missing or wrong token for node "
                           f"{nid!r}; only the node itself may heartbeat in its name")
        self._epoch = int(res[2] or 0)
        overdue = [x.decode() if isinstance(x, bytes) else x for x in res[3] or []]
        if overdue and (self._reaper is None or not self._reaper.is_alive()):
            # Off the heartbeat's thread: deleting a big dead node's entries must not delay our own
            # heartbeats past our TTL.
            self._reaper = threading.Thread(target=self._reap_quietly, args=(overdue,), name="redis-reap",
                                            daemon=True)
            self._reaper.start()
        return {"ok": True, "known": res[0] == 1, "epoch": self._epoch}

    def _reap_quietly(self, candidates: list[str]) -> None:
        try:
            self.reap(candidates)
        except PeerCacheError as e:      # the next heartbeat finds them again
            log.warning("reaping expired nodes through %s: %s", self.address, e)

    def reap(self, candidates: Sequence[str] | None = None) -> list[str]:
        """Drop members whose node key expired (bump the epoch, delete their entries); their ids."""
        if candidates is None:
            res = self._pipe("reap", lambda p: p.zrangebyscore(self.k_alive, "-inf", time.time(),
                                                               start=0, num=REAP_BATCH))
            candidates = [x.decode() if isinstance(x, bytes) else x for x in res[0] or []]
        if not candidates:
            return []
        alive = self._pipe("reap", lambda p: [p.exists(self._node_key(n)) for n in candidates])
        dead = [n for n, a in zip(candidates, alive) if not a]
        gone = []
        for n in dead:
            epoch = self._pipe("reap", lambda p: self._evalsha(
                p, "drop", [self.k_nodes, self.k_alive, self.k_epoch], [n]))[0]
            if epoch:
                self._epoch = int(epoch)
                self._drop_entries(n)
                gone.append(n)
        return gone

    def _drop_entries(self, nid: str) -> int:
        """Delete every entry ``nid`` still owns (bounded SSCAN steps), then its owned set, then
        forget its member number (entries still stamped with it read as gone from then on)."""
        num = self._pipe("clean-up", lambda p: p.hget(self.k_num, nid))[0]
        owned, cursor, n = self._owned_key(nid), 0, 0
        for _ in range(CLEAN_STEPS if num is not None else 0):
            try:
                cursor, keys = self.r.sscan(owned, cursor, count=CLEAN_STEP)
            except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError) as e:
                raise self._unreachable("clean-up", e) from None
            if keys:
                n += self._unpublish_keys(nid, int(num), list(keys), "clean-up", drop_from_set=False)
            if cursor == 0:
                break

        def build(p):
            p.delete(owned)
            if num is not None:
                self._evalsha(p, "forget", [self.k_num, self.k_ids], [nid, int(num)])
        self._pipe("clean-up", build)
        return n

    def _op_leave(self, msg: dict) -> dict:
        nid, _, _ = self._authorize(msg, "leave", fresh=True)
        self._drop_entries(nid)
        res = self._pipe("leave", lambda p: (p.delete(self._node_key(nid)), self._evalsha(
            p, "drop", [self.k_nodes, self.k_alive, self.k_epoch], [nid])))
        self._verified.clear()
        self._epoch = int(res[1]) or self._epoch
        return {"ok": True, "left": bool(res[0]), "epoch": self._epoch}

    def _op_members(self, msg: dict) -> dict:
        res = self._pipe("members", lambda p: (p.smembers(self.k_nodes), p.get(self.k_epoch)))
        ids = sorted(x.decode() if isinstance(x, bytes) else x for x in res[0])
        self._epoch = int(res[1] or 0)
        infos = self._pipe("members", lambda p: [p.hget(self._node_key(n), "info") for n in ids]) if ids else []
        return {"ok": True, "epoch": self._epoch,
                "nodes": {n: unpack(i) for n, i in zip(ids, infos) if i is not None}}

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

        def build(p):
            for g in groups:
                self._evalsha(p, "publish", [ekeys[i] for i in g], [me, *(values[i] for i in g)])
            if keys:
                p.sadd(owned, *keys)
            for g in ugroups:
                self._evalsha(p, "unpublish", [uekeys[i] for i in g], [me])
            if unpub:
                p.srem(owned, *unpub)
        res = self._pipe("publish", build)
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

    def _owners(self, nums: list[int], epoch: int) -> dict[int, tuple[str, dict]]:
        """Member number -> (node id, info) of those of ``nums`` that are alive (leases cached)."""
        now = time.monotonic()
        self._epoch = epoch
        if len(nums) == 1 and epoch == self._lease_epoch:    # the common case, without the lock
            le = self._leases.get(nums[0])
            if le is not None and le[0] > now:
                return {} if le[1] is None else {nums[0]: le[1]}
        with self._lock:
            if epoch != self._lease_epoch:
                self._leases.clear()
                self._lease_epoch = epoch
            leases = self._leases
            need = [x for x in nums if (le := leases.get(x)) is None or le[0] <= now]
        if need:
            self._refresh_leases(need, now)
        leases = self._leases
        out = {}
        for x in nums:
            le = leases.get(x)
            if le is not None and le[1] is not None:
                out[x] = le[1]
        return out

    def _fetch(self, keys: Sequence[bytes]) -> tuple[int, list]:
        """(epoch, the stored value of each key's entry or None): one round trip."""
        got = self._fetch_per_node(keys) if self.cluster else self._fetch_direct(keys)
        if got is not None:
            return got
        ekeys = [self._entry(k) for k in keys]
        groups = self._groups(ekeys)

        def build(p):
            p.get(self.k_epoch)
            for g in groups:
                p.execute_command("MGET", *(ekeys[i] for i in g))   # one hash slot per group
        res = self._pipe("lookup", build)
        raw: list = [None] * len(ekeys)
        for g, vals in zip(groups, res[1:]):
            for i, v in zip(g, vals):
                raw[i] = v
        return int(res[0] or 0), raw

    def _mget(self, keys: Sequence[bytes], first: bytes = b"") -> bytes:
        """``MGET`` of the entries of ``keys`` (after the key ``first``, when given) in the Redis
        protocol: each key's ``\\r\\n$<len>\\r\\n<prefix>`` header (pre-built per length) and the key
        interleaved by slice assignment and joined once, without a Python step per key."""
        head = b"*%d\r\n$4\r\nMGET" % (len(keys) + (2 if first else 1))
        if first:
            head += b"\r\n$%d\r\n%s" % (len(first), first)
        parts = [b""] * (2 * len(keys) + 2)
        parts[0], parts[-1] = head, b"\r\n"
        try:
            # The keys first: that slice assignment's tight C loop brings every key object into the
            # cache (its INCREF) with many misses in flight, so the per-key len() after it hits the
            # cache instead of missing once per key (the caller's keys are usually cold after the wait
            # on the previous reply: this order halves the cost of building the request then).
            parts[2:-1:2] = keys
            parts[1:-1:2] = map(self._key_hdr.__getitem__, map(len, keys))
            return b"".join(parts)
        except (IndexError, TypeError):          # not bytes, or longer than the pre-built headers
            self._check_keys(list(keys), "lookup")   # raises naming the key, unless it is a long one allowed
            pre = self._entry_pre
            return head + b"".join([b"\r\n$%d\r\n%s%s" % (len(pre) + len(k), pre, k) for k in keys]) + b"\r\n"

    def _fetch_direct(self, keys: Sequence[bytes]) -> tuple[int, list] | None:
        """One Redis's fast lookup: one MGET of the epoch and the entries, on a connection of this
        client's own (:class:`LookupSocket`; redis-py's own connection for TLS). None when the
        connection failed: the caller's pipeline then retries once and reports an unreachable Redis.
        A timeout is not retried: it raises DiscoveryUnreachable at once (a stopped Redis would only
        make the pipeline wait out a timeout of its own)."""
        pkt = self._mget(keys, self._epoch_key)
        try:
            conn = self._conns.pop()
        except IndexError:
            try:
                conn = self.r.connection_pool.make_connection() if self.cfg.ssl else \
                    LookupSocket(self.cfg, self.timeout)
            except (redis.exceptions.RedisError, OSError):
                return None
        try:
            if self.cfg.ssl:
                conn.send_packed_command([pkt], check_health=False)
                got = conn.read_response()
            else:
                got = conn.request(pkt, 1)[0]
            epoch = int(got[0] or 0)
            del got[0]                   # the reply's own list: the entries' values, without a copy
        except (redis.exceptions.RedisError, OSError, ValueError, TypeError, IndexError) as e:
            if self.cfg.ssl:
                conn.disconnect()        # reconnects at its next use
                self._conns.append(conn)
            else:
                conn.close()
            if _timed_out(e):
                raise self._unreachable("lookup", e) from None
            return None
        self._conns.append(conn)
        return epoch, got

    def _fetch_per_node(self, keys: Sequence[bytes]) -> tuple[int, list] | None:
        """The cluster's fast lookup: one MGET per hash slot, grouped per master and written to
        every master before any reply is read (the masters work in parallel). None when the slot
        map moved or a connection failed: the caller then uses the cluster pipeline, which follows
        redirections and reports unreachable masters."""
        slots = self.r.nodes_manager.slots_cache
        by_node: dict[str, tuple[Any, list]] = {}
        pre = self._entry_pre
        try:
            slot_of: dict[int, list[int]] = {}
            for i, k in enumerate(keys):
                slot_of.setdefault(key_slot(pre + k), []).append(i)
            em = slots[key_slot(self.k_epoch.encode())][0]
            by_node[em.name] = (em, [None])          # None = the epoch GET
            for sl, idx in slot_of.items():
                node = slots[sl][0]                  # the slot's primary
                by_node.setdefault(node.name, (node, []))[1].append(idx)
        except (KeyError, IndexError):   # a slot without a known master: the generic path says why
            return None
        held = []
        raw: list = [None] * len(keys)
        epoch = 0
        try:
            for node, gs in by_node.values():
                client = self.r.get_redis_connection(node)
                conn = client.connection_pool.get_connection()
                held.append((client, conn, gs))
                conn.send_packed_command([b"".join(
                    self._get_epoch if g is None else self._mget([keys[i] for i in g]) for g in gs)])
            for client, conn, gs in held:
                for g in gs:
                    r = conn.read_response()
                    if g is None:
                        epoch = int(r or 0)
                    else:
                        for i, v in zip(g, r):
                            raw[i] = v
        except (redis.exceptions.RedisError, OSError, ValueError) as e:
            for client, conn, _ in held:
                conn.disconnect()
            if _timed_out(e):
                raise self._unreachable("lookup", e) from None
            return None
        finally:
            for client, conn, _ in held:
                client.connection_pool.release(conn)
        return epoch, raw

    def _refresh_leases(self, nums: list[int], now: float) -> None:
        """Leases of the members ``nums``: the node id of a number seen for the first time (one round
        trip), then each node hash's info, number and TTL (one more). A number whose node hash is gone
        or carries another number now (a Redis restarted empty) is gone for a short while."""
        unknown = [x for x in nums if x not in self._ids]
        if unknown:
            got = self._pipe("lookup", lambda p: [p.hget(self.k_ids, x) for x in unknown])
            for x, nid in zip(unknown, got):
                if nid is not None:
                    self._ids[x] = nid.decode("utf-8", "replace")
        known = [x for x in nums if x in self._ids]
        keys = [self._node_key(self._ids[x]) for x in known]
        res = self._pipe("lookup", lambda p: [(p.hmget(k, ["info", "num"]), p.pttl(k)) for k in keys]) \
            if keys else []
        neg = min(0.25, self.heartbeat_timeout / 4)
        with self._lock:
            if len(self._leases) > 65536:
                self._leases.clear()
            if len(self._ids) > 65536:
                self._ids.clear()
            for x in nums:
                self._leases[x] = (now + neg, None)
            for j, x in enumerate(known):
                (info, num), pttl = res[2 * j], res[2 * j + 1]
                if info is None or pttl == -2 or num is None or num != str(x).encode():
                    if num is not None and num != str(x).encode():
                        self._ids.pop(x, None)      # the id holds another number now: ask again next time
                    continue
                ttl = pttl / 1000 if pttl >= 0 else self.heartbeat_timeout
                self._leases[x] = (now + ttl, (self._ids[x], unpack(info)))

    # -- extra ops (serve's reader_done) --------------------------------------------------------
    def _op_key(self, op: str) -> str:
        return f"{self._p}:{{m}}:op:{op}"

    def _reply_key(self, rid: str) -> str:
        return f"{self._p}:{{m}}:re:{rid}"

    def _remote_op(self, op: str, wait: float, fields: dict) -> dict:
        if not re.fullmatch(r"[A-Za-z_]{1,31}", op):
            raise RpcError(f"directory {self.address}: op {op!r} is not a name of 1-31 letters")
        rid = secrets.token_hex(8)
        req = pack({"rid": rid, "deadline": time.time() + wait, "msg": dict(fields, op=op)})
        self._pipe(op, lambda p: (p.rpush(self._op_key(op), req), p.expire(self._op_key(op), 60)))
        deadline = time.monotonic() + wait
        while True:
            got = self._pipe(op, lambda p: p.lpop(self._reply_key(rid)))[0]
            if got is not None:
                reply = unpack(got)
                break
            if time.monotonic() >= deadline:
                self._pipe(op, lambda p: p.lrem(self._op_key(op), 1, req))
                raise RpcError(f"no node answered {op!r} through the directory {self.address} within "
                               f"{wait:.1f} s; start the node that serves it (e.g. peercache-bench serve) "
                               "with the same --directory")
            time.sleep(0.01)
        if not isinstance(reply, dict) or not reply.get("ok"):
            raise RpcError(f"directory {self.address}: {op!r} refused: "
                           f"{reply.get('error') if isinstance(reply, dict) else reply!r}")
        return reply

    def serve_op(self, op: str, fn: Callable[[dict], dict], owner_only: bool = True) -> None:
        """Answer the extra op ``op`` with ``fn`` (from requests any node sends through this Redis);
        with ``owner_only`` a request must carry a registered node's id and token."""
        self._handlers[op] = (fn, owner_only)
        if self._op_thread is None:
            c = self.cfg
            kw = dict(self._kwargs(), socket_timeout=self.timeout + 2)
            if self.cluster:
                self._op_conn = redis.RedisCluster(host=c.host, port=c.port,
                                                   **{k: v for k, v in kw.items() if k != "retry"})
            else:
                self._op_conn = redis.Redis(host=c.host, port=c.port, db=c.db, **kw)
            self._op_thread = threading.Thread(target=self._serve_ops, name="redis-ops", daemon=True)
            self._op_thread.start()

    def _serve_ops(self) -> None:
        while not self._op_stop.is_set():
            keys = [self._op_key(op) for op in self._handlers]
            try:
                got = self._op_conn.blpop(keys, timeout=1)
            except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError) as e:
                log.warning("serving ops through %s: %s; retrying", self.address, e)
                self._op_stop.wait(0.5)
                continue
            if got is None:
                continue
            try:
                req = unpack(got[1])
                rid, msg = req["rid"], req["msg"]
                if not isinstance(rid, str) or not isinstance(msg, dict):
                    raise TypeError("request without rid/msg")
            except Exception as e:   # not a request of ours: drop it
                log.warning("dropped a malformed op request on %s: %s", got[0], e)
                continue
            if time.time() > float(req.get("deadline") or 0):
                continue   # its sender gave up waiting
            reply = self._dispatch(msg)
            try:
                self._op_conn.pipeline(transaction=False).rpush(self._reply_key(rid), pack(reply)).expire(
                    self._reply_key(rid), 30).execute()
            except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError) as e:
                log.warning("could not reply to %s through %s: %s", msg.get("op"), self.address, e)

    def _dispatch(self, msg: dict) -> dict:
        op = msg.get("op")
        entry = self._handlers.get(op)
        if entry is None:
            return {"ok": False, "error": f"unknown op {op!r}; this node serves {sorted(self._handlers)}"}
        fn, owner_only = entry
        try:
            if owner_only:
                self._authorize(msg, op, fresh=True)
            reply = fn(msg)
        except PeerCacheError as e:
            return {"ok": False, "error": str(e)}
        except Exception as e:   # keep serving; the caller gets the reason
            log.exception("op %s failed", op)
            return {"ok": False, "error": f"{op} failed on the serving node: {type(e).__name__}: {e}"}
        if not isinstance(reply, dict):
            return {"ok": False, "error": f"{op} handler returned {type(reply).__name__}, not a map"}
        reply.setdefault("ok", True)
        return reply
