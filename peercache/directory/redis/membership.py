"""The Redis directory's membership: a node registers (and gets its member number), keeps its
node key alive by heartbeats, and leaves; expired members are reaped and every entry a gone
node owned is deleted (see :mod:`.backend` for what is stored where)."""
from __future__ import annotations

import secrets
import threading
import time
from typing import Sequence

import redis

from ...errors import PeerCacheError, RpcError
from ...rpc import pack, unpack
from .connection import log
from .marks import keep_ms
from ..validate import Refused, check_regions

#: How long a node's token is remembered after its node key went (it may register again with it).
TOKEN_KEEP_S = 86400
#: Expired members one heartbeat reaps at most.
REAP_BATCH = 16
#: Keys per SSCAN step when a dead or leaving node's entries are deleted; steps per clean-up at most.
CLEAN_STEP, CLEAN_STEPS = 1024, 4096


class RedisMembership:
    """The ops ``register``, ``heartbeat``, ``leave`` and ``members`` and the reaping of expired
    members, mixed into :class:`~.backend.RedisDirectory` (whose connection, keys and
    authorization they use)."""

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
        self._follow_master()      # Sentinel: never renew on a master the sentinels no longer name
        ttl_ms = int(self.heartbeat_timeout * 1000)
        now = time.time()
        # The node's publish marks (.marks): on one Redis read in this round trip; a cluster reads them
        # in one of their own, off this thread (a master failing over must not fail the heartbeat).
        want = {} if self.cluster else self._marks.expected(nid)

        def build(p):
            self._evalsha(p, "heartbeat", [self._node_key(nid), self._owned_key(nid), self._token_key(nid)],
                          [token, ttl_ms, keep_ms(self.heartbeat_timeout), TOKEN_KEEP_S])
            p.zadd(self.k_alive, {nid: now + self.heartbeat_timeout}, xx=True)
            p.get(self.k_epoch)
            p.zrangebyscore(self.k_alive, "-inf", now, start=0, num=REAP_BATCH)
            self._queue_mark_reads(p, want)
        res = self._pipe("heartbeat", build)
        if res[0] == -1:
            raise self._refused("heartbeat", f"missing or wrong token for node "
                           f"{nid!r}; only the node itself may heartbeat in its name")
        if want:
            self._marks.read(nid, want, res[4:])
        elif self.cluster and res[0] == 1:
            self._read_marks_soon(nid)
        self._epoch = int(res[2] or 0)
        overdue = [x.decode() if isinstance(x, bytes) else x for x in res[3] or []]
        if overdue and (self._reaper is None or not self._reaper.is_alive()):
            # Off the heartbeat's thread: deleting a big dead node's entries must not delay our own
            # heartbeats past our TTL.
            self._reaper = threading.Thread(target=self._reap_quietly, args=(overdue,), name="redis-reap",
                                            daemon=True)
            self._reaper.start()
        # lost: marks found behind since the last heartbeat: entries of this node's a failover lost
        return {"ok": True, "known": res[0] == 1, "epoch": self._epoch, "lost": self._marks.take_lost(nid)}

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
        marks = self._marks.forget(nid)
        res = self._pipe("leave", lambda p: (p.delete(self._node_key(nid)), self._evalsha(
            p, "drop", [self.k_nodes, self.k_alive, self.k_epoch], [nid]), *(p.delete(k) for k in marks)))
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
