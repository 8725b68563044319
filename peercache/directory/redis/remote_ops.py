"""Extra ops through the Redis directory (serve's ``reader_done``): a request any node pushes
onto ``P:{m}:op:<op>`` is answered by the node that serves that op, on ``P:{m}:re:<request id>``.

A request expires at a time on Redis's clock (``TIME``, read by the sender and by the serving node
from the same server), so two hosts whose wall clocks disagree still agree on whether the sender
is still waiting. Anyone who can write to Redis can push anything onto an op list, so the serving
thread drops whatever is not a well-formed request with one log line and goes on serving.
"""
from __future__ import annotations

import math
import re
import secrets
import threading
import time
from typing import Any, Callable

import redis

from ...errors import PeerCacheError, RpcError
from ...rpc import MAX_REQUEST_BYTES, pack, unpack
from .connection import log
from .scripts import NOW_MS_LUA

#: What a request id looks like (the sender's ``secrets.token_hex(8)``); it names the reply key,
#: so anything longer or stranger is refused rather than written into a key name.
_RID = re.compile(r"[0-9a-f]{1,32}")
_OP = re.compile(r"[A-Za-z_]{1,31}")


class MalformedOp(ValueError):
    """A pushed op request that is not one a sender of this PeerCache builds (said why)."""


def parse_request(raw: Any) -> tuple[str, dict, int]:
    """(request id, message, expiry in Redis milliseconds) of a pushed request; MalformedOp saying
    what is wrong otherwise."""
    if not isinstance(raw, (bytes, bytearray)):
        raise MalformedOp(f"a {type(raw).__name__}, not bytes")
    if len(raw) > MAX_REQUEST_BYTES:
        raise MalformedOp(f"{len(raw)} bytes, over the {MAX_REQUEST_BYTES}-byte limit of a request")
    try:
        req = unpack(raw)
    except Exception as e:   # msgpack raises several types for garbage; all mean the same here
        raise MalformedOp(f"not msgpack ({type(e).__name__}: {e})") from None
    if not isinstance(req, dict):
        raise MalformedOp(f"a msgpack {type(req).__name__}, not a map")
    rid, msg, expires = req.get("rid"), req.get("msg"), req.get("expires_ms")
    if not isinstance(rid, str) or not _RID.fullmatch(rid):
        raise MalformedOp(f"'rid' {rid!r:.40} is not 1-32 lowercase hex digits")
    if not isinstance(msg, dict) or not isinstance(msg.get("op"), str) or not _OP.fullmatch(msg["op"]):
        raise MalformedOp("'msg' is not a map whose 'op' is a name of 1-31 letters")
    if type(expires) is not int:   # bool is an int subclass, and no expiry
        hint = " (a sender older than this PeerCache, which sent its wall clock)" if "deadline" in req else ""
        raise MalformedOp(f"'expires_ms' {expires!r:.40} is not an integer of Redis's clock{hint}")
    return rid, msg, expires


class RemoteOps:
    """Sending an extra op and serving one, mixed into :class:`~.backend.RedisDirectory`
    (whose ``__init__`` sets the state used here: ``_handlers``, ``_op_thread``, ``_op_stop``, ``_op_conn``)."""

    def _op_key(self, op: str) -> str:
        return f"{self._p}:{{m}}:op:{op}"

    def _reply_key(self, rid: str) -> str:
        return f"{self._p}:{{m}}:re:{rid}"

    def _remote_op(self, op: str, wait: float, fields: dict) -> dict:
        if not _OP.fullmatch(op):
            raise RpcError(f"directory {self.address}: op {op!r} is not a name of 1-31 letters")
        rid = secrets.token_hex(8)
        now_ms = self._pipe(op, lambda p: self._evalsha(p, "now_ms", [self._op_key(op)], []))[0]
        req = pack({"rid": rid, "expires_ms": int(now_ms) + math.ceil(wait * 1000), "msg": dict(fields, op=op)})
        self._pipe(op, lambda p: (p.rpush(self._op_key(op), req), p.expire(self._op_key(op), 60)))
        deadline = time.monotonic() + wait
        while True:
            got = self._pipe(op, lambda p: p.lpop(self._reply_key(rid)))[0]
            if got is not None:
                try:
                    reply = unpack(got)
                except Exception as e:   # whoever wrote it was not a serving node of this PeerCache
                    raise RpcError(f"directory {self.address}: the reply to {op!r} is not msgpack "
                                   f"({type(e).__name__}); something else writes to {self._reply_key(rid)}") from None
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
            # BLPOP waits up to 1 s for a request: its socket waits longer than that
            kw = dict(self._kwargs(), socket_timeout=self.timeout + 2)
            if self.cluster:
                self._op_conn = redis.RedisCluster(host=c.host, port=c.port,
                                                   **{k: v for k, v in kw.items() if k != "retry"})
            else:
                self._op_conn = self._client(socket_timeout=kw["socket_timeout"])
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
                self._serve_one(got[0], got[1])
            except Exception:   # a bug here must not end the thread: every later op would go unanswered
                log.exception("serving an op request on %s through %s failed; dropped it, still serving",
                              got[0], self.address)

    def _serve_one(self, key: bytes, raw: Any) -> None:
        try:
            rid, msg, expires_ms = parse_request(raw)
        except MalformedOp as e:
            log.warning("dropped a malformed op request on %s through %s: %s", key, self.address, e)
            return
        try:
            now_ms = int(self._op_conn.eval(NOW_MS_LUA, 1, key))
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError, ValueError) as e:
            # No clock to tell: answer; a reply nobody waits for only expires (30 s below).
            log.warning("could not read Redis's clock at %s (%s); answering %s without checking its expiry",
                        self.address, e, msg["op"])
            now_ms = expires_ms
        if now_ms > expires_ms:
            return   # its sender gave up waiting
        reply = self._dispatch(msg)
        try:
            self._op_conn.pipeline(transaction=False).rpush(self._reply_key(rid), pack(reply)).expire(
                self._reply_key(rid), 30).execute()
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError) as e:
            log.warning("could not reply to %s through %s: %s", msg["op"], self.address, e)

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
