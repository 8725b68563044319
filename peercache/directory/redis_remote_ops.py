"""Extra ops through the Redis directory (serve's ``reader_done``): a request any node pushes
onto ``P:{m}:op:<op>`` is answered by the node that serves that op, on ``P:{m}:re:<request id>``."""
from __future__ import annotations

import re
import secrets
import threading
import time
from typing import Callable

import redis

from ..errors import PeerCacheError, RpcError
from ..rpc import pack, unpack
from .redis_connection import log


class RemoteOps:
    """Sending an extra op and serving one, mixed into :class:`~.redis_backend.RedisDirectory`
    (whose ``__init__`` sets the state used here: ``_handlers``, ``_op_thread``, ``_op_stop``, ``_op_conn``)."""

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
