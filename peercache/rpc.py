"""Control-plane RPC: ZeroMQ transport, msgpack bodies, error replies.

A request is a msgpack map with an ``op`` field; the reply is a map with
``ok`` (bool) and either the result fields or ``error`` (a sentence). The
server answers malformed or oversized requests with an error reply and keeps
serving; the client bounds every wait and says which address did not answer.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Any, Callable

import msgpack
import zmq

from .errors import DiscoveryUnreachable, PeerCacheError, RpcError

log = logging.getLogger(__name__)

#: Largest request body the server will decode; larger ones get an error reply.
MAX_REQUEST_BYTES = 16 << 20
#: Hard cap at the socket: ZeroMQ drops peers that send more than this.
SOCKET_MAX_BYTES = 64 << 20

Handler = Callable[[dict], dict]


def endpoint(addr: str) -> str:
    """``host:port`` (or a full zmq URL) -> zmq TCP endpoint."""
    if "://" in addr:
        return addr
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise PeerCacheError(f"address {addr!r} is not HOST:PORT (for example 127.0.0.1:31998)")
    return f"tcp://{host}:{port}"


def pack(obj: Any) -> bytes:
    """msgpack with bin/str kept apart."""
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data: bytes) -> Any:
    """Inverse of :func:`pack`."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


class RpcServer:
    """ROUTER socket served by one thread; ``handlers`` maps op name -> function."""

    def __init__(self, bind: str, handlers: dict[str, Handler] | None = None,
                 ctx: zmq.Context | None = None):
        self.ctx = ctx or zmq.Context.instance()
        self.handlers: dict[str, Handler] = dict(handlers or {})
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, SOCKET_MAX_BYTES)
        try:
            self.sock.bind(endpoint(bind))
        except zmq.ZMQError as e:
            self.sock.close()
            raise PeerCacheError(f"cannot listen on {bind}: {e}; pick another port or "
                                 "stop the process that holds it") from e
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"rpc-{bind}", daemon=True)

    @property
    def port(self) -> int:
        """The TCP port actually bound (useful with port 0)."""
        return int(self.address.rsplit(":", 1)[1])

    def start(self) -> "RpcServer":
        self._thread.start()
        return self

    def handle(self, body: bytes) -> dict:
        """Decode, dispatch and always return a reply map (never raises)."""
        if len(body) > MAX_REQUEST_BYTES:
            return {"ok": False, "error": f"request of {len(body)} bytes exceeds the "
                    f"{MAX_REQUEST_BYTES} byte limit; split the batch"}
        try:
            msg = unpack(body)
        except Exception as e:  # any msgpack decode failure
            return {"ok": False, "error": f"malformed request (not msgpack: {e})"}
        if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
            return {"ok": False, "error": "malformed request: expected a map with an 'op' string"}
        fn = self.handlers.get(msg["op"])
        if fn is None:
            return {"ok": False, "error": f"unknown op {msg['op']!r}; this node serves "
                    f"{sorted(self.handlers)}"}
        try:
            reply = fn(msg)
        except PeerCacheError as e:
            return {"ok": False, "error": str(e)}
        except (KeyError, TypeError, ValueError) as e:
            return {"ok": False, "error": f"bad {msg['op']!r} request: {type(e).__name__}: {e}"}
        except Exception as e:  # keep serving; the caller gets the reason
            log.exception("rpc handler %s failed", msg["op"])
            return {"ok": False, "error": f"{msg['op']} failed on the server: {type(e).__name__}: {e}"}
        reply.setdefault("ok", True)
        return reply

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            frames = self.sock.recv_multipart()
            if len(frames) < 2:
                continue
            ident, body = frames[0], frames[-1]
            reply = self.handle(body)
            if not reply["ok"]:
                log.warning("rpc error reply: %s", reply["error"])
            # DEALER clients send [b"", req_id, body]; echo the id back.
            self.sock.send_multipart([ident, *frames[1:-1], pack(reply)])
        self.sock.close(0)

    def stop(self) -> None:
        """Stop the serving thread and close the socket."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        else:
            self.sock.close(0)


class RpcClient:
    """Thread-safe request/reply client with a bounded wait per call."""

    def __init__(self, addr: str, timeout: float = 5.0, ctx: zmq.Context | None = None,
                 what: str = "node"):
        self.addr = addr
        self.url = endpoint(addr)
        self.timeout = timeout
        self.what = what
        self.ctx = ctx or zmq.Context.instance()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._sock = self._connect()

    def _connect(self) -> zmq.Socket:
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(self.url)
        return s

    def call(self, op: str, timeout: float | None = None, **fields) -> dict:
        """Send ``op`` with ``fields``; return the reply map or raise."""
        fields["op"] = op
        body = pack(fields)
        wait = self.timeout if timeout is None else timeout
        with self._lock:
            rid = next(self._ids).to_bytes(8, "little")
            self._sock.send_multipart([b"", rid, body])
            deadline = time.monotonic() + wait
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not self._sock.poll(int(left * 1000) + 1):
                    # Drop the socket so a late reply cannot be taken for the next call.
                    self._sock.close(0)
                    self._sock = self._connect()
                    cls = DiscoveryUnreachable if self.what == "discovery" else RpcError
                    raise cls(f"no reply from {self.what} at {self.addr} to {op!r} within "
                              f"{wait:.1f} s; check that it is running and that the address "
                              "and port are right")
                frames = self._sock.recv_multipart()
                if len(frames) >= 3 and frames[1] == rid:
                    break
        reply = unpack(frames[-1])
        if not reply.get("ok"):
            raise RpcError(f"{self.what} at {self.addr} refused {op!r}: {reply.get('error')}")
        return reply

    def close(self) -> None:
        """Close the socket."""
        with self._lock:
            self._sock.close(0)
