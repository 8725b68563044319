"""Control-plane RPC: ZeroMQ transport, msgpack bodies, error replies.

A request is a msgpack map with an ``op`` field; the reply is a map with
``ok`` (bool) and either the result fields or ``error`` (a sentence). The
server answers malformed or oversized requests with an error reply and keeps
serving; the client bounds every wait and says which address did not answer.

No request can hold the control plane up. One I/O thread owns the socket:
it answers every small request itself, in the order ZeroMQ fair-queues them
across clients, so heartbeats, registrations and small lookups are served
within milliseconds. Large requests (and the ops named ``deferred_ops``) go to
a worker thread that takes one request per client in turn, at most
``max_pending_per_client`` queued per client and ``max_queued_bytes`` in all;
beyond that a request is refused at once. Every request is bounded by
:class:`Limits` (bytes per message, keys per request, key length, ...), and a
refusal names the limit and its value; clients split big batches to fit.

With an auth key (:mod:`peercache.auth`) the server is a CURVE server that
accepts only clients holding the cluster secret; a client without it gets no
answer at all, so :class:`RpcClient` watches its connection's handshake and
says "wrong or missing auth key?" instead of only "no reply". A connection
that never finishes its handshake (a client that connects and says nothing)
is dropped after Timeouts.handshake_s, so such connections cannot hold the server's
file descriptors for ZeroMQ's default 30 s; a client whose handshake gets no
answer at all is told the server is stopped, overloaded or out of fds.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import re
import threading
import time
from typing import Any, Callable

import msgpack
import zmq
from zmq.utils.monitor import recv_monitor_message

from . import auth as _auth
from .address import Address, split
from .errors import DiscoveryUnreachable, PeerCacheError, RpcError
# The control plane's bounds: the handshake (ZMQ_HANDSHAKE_IVL; ZeroMQ's default is 30 s, during which a
# client that connects and never speaks holds an fd), the events read, a call's default.
from .timeouts import DEFAULT as TIMEOUTS

log = logging.getLogger(__name__)

#: Largest request body the server will decode; larger ones get an error reply.
MAX_REQUEST_BYTES = 8 << 20
#: Hard cap at the socket (ZMQ_MAXMSGSIZE), as a multiple of the message limit: up to it an
#: oversized request gets an error reply naming the limit; beyond it ZeroMQ drops the peer.
SOCKET_MAX_FACTOR = 4
SOCKET_MAX_BYTES = SOCKET_MAX_FACTOR * MAX_REQUEST_BYTES
#: Largest reply a client accepts (members and lookups of many nodes can exceed a request).
MAX_REPLY_BYTES = 64 << 20
#: Requests up to this size are decoded and answered by the I/O thread itself.
INLINE_BYTES = 64 << 10

Handler = Callable[[dict], dict]
_SERIAL = itertools.count(1)


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one control request may carry; the server refuses more, naming the limit."""

    max_message_bytes: int = MAX_REQUEST_BYTES
    max_keys_per_request: int = 65536
    max_key_bytes: int = 4096
    max_node_info_bytes: int = 8192
    max_nodes: int = 1024
    max_directory_entries: int = 1 << 24
    max_map_entries: int = 1024
    max_containers_per_request: int = 2 * 65536 + 1024
    max_pending_per_client: int = 8
    max_queued_bytes: int = 64 << 20

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> "Limits":
        """The limits a server announced (its register reply); defaults for what it did not say."""
        if not isinstance(d, dict):
            return DEFAULT_LIMITS
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names and type(v) is int and v > 0})

    def refuse(self, name: str, what: str, unit: str = "", hint: str = "") -> "LimitExceeded":
        """The error for ``what`` going over the limit ``name``."""
        return LimitExceeded(f"{what} refused: at most {getattr(self, name)}{unit} (limit {name}){hint}",
                             name)


DEFAULT_LIMITS = Limits()


class LimitExceeded(PeerCacheError):
    """A request over one of the server's :class:`Limits`."""

    def __init__(self, message: str, limit: str):
        super().__init__(message)
        self.limit = limit


def endpoint(addr: str) -> str:
    """``host:port`` (or a full zmq URL) -> zmq TCP endpoint."""
    if "://" in addr:
        return addr
    try:
        Address.parse(addr)
    except ValueError:
        raise PeerCacheError(f"address {addr!r} is not HOST:PORT (for example 127.0.0.1:31998)") from None
    return f"tcp://{addr}"


def pack(obj: Any) -> bytes:
    """msgpack with bin/str kept apart."""
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data: bytes) -> Any:
    """Inverse of :func:`pack`."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


_OP_NAME = re.compile(rb"[A-Za-z_]{1,31}")
_ARRAY_TOO_LONG = re.compile(r"(\d+) exceeds max_array_len\((\d+)\)")
_MAP_TOO_LONG = re.compile(r"(\d+) exceeds max_map_len\((\d+)\)")


def _op_hint(body) -> str:
    """The op of a request that was not decoded, best effort (clients pack ``op`` last)."""
    tail = bytes(body[-40:])
    i = tail.rfind(b"\xa2op")
    if i < 0 or i + 4 > len(tail):
        return "request"
    n = tail[i + 3] - 0xa0
    op = tail[i + 4:i + 4 + n]
    if not 1 <= n <= 31 or len(op) != n or not _OP_NAME.fullmatch(op):
        return "request"
    return op.decode()


def _peek_keys(body) -> int | None:
    """Length of the ``keys`` array when it is the request's first field, read from the header only."""
    try:
        u = msgpack.Unpacker(raw=False, max_buffer_size=1 << 10)
        u.feed(bytes(body[:64]))
        if u.read_map_header() < 1 or u.unpack() != "keys":
            return None
        return u.read_array_header()
    except Exception:
        return None


class _Budget:
    """Counts arrays and maps while a large request decodes; stops it past the limit."""

    __slots__ = ("left", "limits")

    def __init__(self, limits: Limits):
        self.limits = limits
        self.left = limits.max_containers_per_request

    def list_hook(self, obj):
        self.left -= 1
        if self.left < 0:
            raise self.limits.refuse("max_containers_per_request", "request with more arrays and maps",
                                     " arrays and maps per request")
        return obj

    def object_hook(self, obj):
        return self.list_hook(obj)


class _LogLimiter:
    """At most ``burst`` warnings per ``period`` seconds, then one line saying how many were dropped."""

    def __init__(self, burst: int = 5, period: float = 10.0):
        self.burst, self.period = burst, period
        self.start, self.count, self.dropped = 0.0, 0, 0

    def warn(self, fmt: str, *args) -> None:
        now = time.monotonic()
        if now - self.start > self.period:
            if self.dropped:
                log.warning("rpc: %d more error replies in the last %.0f s were not logged",
                            self.dropped, self.period)
            self.start, self.count, self.dropped = now, 0, 0
        if self.count < self.burst:
            self.count += 1
            log.warning(fmt, *args)
        else:
            self.dropped += 1


class RpcServer:
    """ROUTER socket with an I/O thread and a worker thread; ``handlers`` maps op name -> function.

    Handlers run on either thread (small requests on the I/O thread, large
    ones on the worker), so they must be thread-safe.
    """

    def __init__(self, bind: str, handlers: dict[str, Handler] | None = None,
                 ctx: zmq.Context | None = None, *, auth: _auth.CurveKeys | None = None,
                 limits: Limits | None = None, inline_bytes: int = INLINE_BYTES,
                 deferred_ops: tuple[str, ...] = (), warn_open: bool = False):
        self.limits = limits or DEFAULT_LIMITS
        self.handlers: dict[str, Handler] = dict(handlers or {})
        self.auth = auth
        self.inline_bytes = inline_bytes
        self.deferred_ops = frozenset(deferred_ops)
        # A ZAP handler is per context: a server with a secret gets a context of its own.
        self._own_ctx = auth is not None
        self.ctx = zmq.Context() if self._own_ctx else (ctx or zmq.Context.instance())
        self._zap: zmq.Socket | None = None
        self._pipe = f"inproc://peercache-rpc-replies-{next(_SERIAL)}-{id(self):x}"
        self._replies: zmq.Socket | None = None
        self.sock: zmq.Socket | None = None
        try:
            if auth is not None:
                # Bound before the ROUTER: a CURVE server without a ZAP handler would accept anyone.
                self._zap = self.ctx.socket(zmq.REP)
                self._zap.setsockopt(zmq.LINGER, 0)
                self._zap.bind("inproc://zeromq.zap.01")
            self._replies = self.ctx.socket(zmq.PULL)
            self._replies.setsockopt(zmq.LINGER, 0)
            self._replies.bind(self._pipe)
            self.sock = self.ctx.socket(zmq.ROUTER)
            self.sock.setsockopt(zmq.LINGER, 0)
            self.sock.setsockopt(zmq.MAXMSGSIZE, SOCKET_MAX_FACTOR * self.limits.max_message_bytes)
            self.sock.setsockopt(zmq.RCVHWM, 64)
            self.sock.setsockopt(zmq.SNDHWM, 256)
            self.sock.setsockopt(zmq.HANDSHAKE_IVL, int(TIMEOUTS.handshake_s * 1000))
            if auth is not None:
                auth.server(self.sock)
            self.sock.bind(endpoint(bind))
        except zmq.ZMQError as e:
            self._close_sockets()
            raise PeerCacheError(f"cannot listen on {bind}: {e}; pick another port or "
                                 "stop the process that holds it") from e
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        if warn_open:
            _auth.warn_if_open(bind, auth)
        self._stop = threading.Event()
        self._cv = threading.Condition()
        self._queues: dict[bytes, collections.deque] = {}
        self._order: collections.deque[bytes] = collections.deque()
        self._queued_bytes = 0
        self._logs = _LogLimiter()
        #: requests, errors, dropped, busy, auth_refused (ZAP: a client key not derived from the secret)
        self.stats = collections.Counter()
        self._thread = threading.Thread(target=self._loop, name=f"rpc-{bind}", daemon=True)
        self._worker = threading.Thread(target=self._work, name=f"rpc-worker-{bind}", daemon=True)

    @property
    def port(self) -> int:
        """The TCP port actually bound (useful with port 0)."""
        return int(split(self.address)[1])

    def start(self) -> "RpcServer":
        self._worker.start()
        self._thread.start()
        return self

    # -- decoding and dispatch ------------------------------------------------------
    def _decode(self, body, large: bool) -> tuple[dict | None, dict | None]:
        """(request map, None) or (None, error reply)."""
        n = len(body)
        lim = self.limits
        if n > lim.max_message_bytes:
            count = _peek_keys(body)
            if count is not None and count > lim.max_keys_per_request:
                e = lim.refuse("max_keys_per_request", f"{_op_hint(body)} of {count} keys", " keys per request")
            else:
                e = lim.refuse("max_message_bytes", f"{_op_hint(body)} of {n} bytes (exceeds the size limit)",
                               " bytes per message", "; split the batch")
            return None, self._error(e)
        try:
            kw: dict[str, Any] = {}
            if large:
                budget = _Budget(lim)
                kw = {"list_hook": budget.list_hook, "object_hook": budget.object_hook}
            msg = msgpack.unpackb(body, raw=False, strict_map_key=False,
                                  max_array_len=lim.max_keys_per_request,
                                  max_map_len=lim.max_map_entries, **kw)
        except LimitExceeded as e:
            return None, self._error(e)
        except ValueError as e:
            m = _ARRAY_TOO_LONG.search(str(e))
            if m:
                return None, self._error(lim.refuse(
                    "max_keys_per_request", f"{_op_hint(body)} of {m.group(1)} keys", " keys per request"))
            m = _MAP_TOO_LONG.search(str(e))
            if m:
                return None, self._error(lim.refuse(
                    "max_map_entries", f"{_op_hint(body)} with a map of {m.group(1)} entries",
                    " entries per map"))
            return None, {"ok": False, "error": f"malformed request (not msgpack: {e})"}
        except Exception as e:  # any other msgpack decode failure (unhashable keys, depth, ...)
            return None, {"ok": False, "error": f"malformed request (not msgpack: {type(e).__name__}: {e})"}
        if not isinstance(msg, dict) or not isinstance(msg.get("op"), str) or len(msg["op"]) > 64:
            return None, {"ok": False, "error": "malformed request: expected a map with an 'op' string"}
        return msg, None

    @staticmethod
    def _error(e: PeerCacheError) -> dict:
        reply = {"ok": False, "error": str(e)}
        if isinstance(e, LimitExceeded):
            reply["limit"] = e.limit
        return reply

    def _dispatch(self, msg: dict) -> dict:
        op = msg["op"]
        fn = self.handlers.get(op)
        if fn is None:
            return {"ok": False, "error": f"unknown op {op!r}; this node serves {sorted(self.handlers)}"}
        try:
            reply = fn(msg)
        except PeerCacheError as e:
            return self._error(e)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as e:
            return {"ok": False, "error": f"bad {op!r} request: {type(e).__name__}: {e}"}
        except Exception as e:  # keep serving; the caller gets the reason
            log.exception("rpc handler %s failed", op)
            return {"ok": False, "error": f"{op} failed on the server: {type(e).__name__}: {e}"}
        if not isinstance(reply, dict):
            return {"ok": False, "error": f"{op} failed on the server: handler returned "
                    f"{type(reply).__name__}, not a map"}
        reply.setdefault("ok", True)
        return reply

    def handle(self, body, large: bool | None = None) -> dict:
        """Decode, dispatch and always return a reply map (never raises)."""
        msg, err = self._decode(body, len(body) > self.inline_bytes if large is None else large)
        return err if msg is None else self._dispatch(msg)

    def _pack_reply(self, reply: dict) -> bytes:
        if not reply.get("ok"):
            self.stats["errors"] += 1
            self._logs.warn("rpc error reply: %s", reply.get("error"))
        try:
            return pack(reply)
        except Exception as e:
            return pack({"ok": False, "error": f"reply could not be encoded: {type(e).__name__}: {e}"})

    # -- the I/O thread -------------------------------------------------------------
    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self._replies, zmq.POLLIN)
        if self._zap is not None:
            poller.register(self._zap, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(100))
                if not ready:
                    continue
                # Each socket is drained while ZMQ_EVENTS says a message waits: no receive that
                # fails with Again (an exception per wakeup), at most a bounded batch per socket.
                if self._zap is not None and self._zap in ready:
                    for _ in range(64):
                        if not self._zap.get(zmq.EVENTS) & zmq.POLLIN:
                            break
                        frames = self._zap.recv_multipart(zmq.NOBLOCK)
                        reply = _auth.zap_reply(frames, self.auth)
                        if reply[2] != b"200":
                            self.stats["auth_refused"] += 1   # a peer without the cluster secret
                        self._zap.send_multipart(reply)
                if self._replies in ready:
                    for _ in range(256):
                        if not self._replies.get(zmq.EVENTS) & zmq.POLLIN:
                            break
                        self.sock.send_multipart(self._replies.recv_multipart(zmq.NOBLOCK))
                if self.sock in ready:
                    for _ in range(64):
                        if not self.sock.get(zmq.EVENTS) & zmq.POLLIN:
                            break
                        self._on_request(self.sock.recv_multipart(zmq.NOBLOCK))
        except Exception:  # never let the control plane die silently
            log.exception("rpc server on %s stopped on an unexpected error", self.address)
            raise
        finally:
            for s in (self.sock, self._replies, self._zap):
                if s is not None:
                    s.close(0)

    def _on_request(self, frames: list) -> None:
        self.stats["requests"] += 1
        if len(frames) < 2:
            self.stats["dropped"] += 1
            return
        ident = frames[0]
        envelope = frames[1:-1]
        if len(envelope) > 4 or any(len(e) > 255 for e in envelope):
            # Not a client of ours (DEALER clients send [b"", request id, body]): nothing to answer to.
            self.stats["dropped"] += 1
            return
        body = frames[-1]
        n = len(body)
        if n <= self.inline_bytes:
            msg, err = self._decode(body, large=False)
            if msg is not None and msg["op"] in self.deferred_ops:
                self._enqueue(ident, envelope, msg, n)
                return
            reply = err if msg is None else self._dispatch(msg)
        elif n > self.limits.max_message_bytes:
            reply = self.handle(body, large=True)   # refused on size before decoding
        else:
            self._enqueue(ident, envelope, body, n)
            return
        self.sock.send_multipart([ident, *envelope, self._pack_reply(reply)])

    def _enqueue(self, ident: bytes, envelope: list, payload, n: int) -> None:
        lim = self.limits
        with self._cv:
            q = self._queues.get(ident)
            refused = None
            if q is not None and len(q) >= lim.max_pending_per_client:
                refused = lim.refuse("max_pending_per_client", f"request ({len(q)} already queued from "
                                     "this client)", " queued large requests per client", "; wait for replies")
            elif self._queued_bytes + n > lim.max_queued_bytes:
                refused = lim.refuse("max_queued_bytes", f"request of {n} bytes (server busy: "
                                     f"{self._queued_bytes} bytes queued)", " bytes queued", "; retry later")
            if refused is None:
                if q is None:
                    q = self._queues[ident] = collections.deque()
                    self._order.append(ident)
                q.append((envelope, payload, n))
                self._queued_bytes += n
                self._cv.notify()
                return
        self.stats["busy"] += 1
        self.sock.send_multipart([ident, *envelope, self._pack_reply(self._error(refused))])

    # -- the worker thread ----------------------------------------------------------
    def _work(self) -> None:
        push = self.ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(self._pipe)
        try:
            while True:
                with self._cv:
                    while not self._order and not self._stop.is_set():
                        self._cv.wait(0.5)
                    if self._stop.is_set():
                        return
                    ident = self._order.popleft()
                    q = self._queues[ident]
                    envelope, payload, n = q.popleft()
                    self._queued_bytes -= n
                    if q:
                        self._order.append(ident)   # round robin: one request per client in turn
                    else:
                        del self._queues[ident]
                if isinstance(payload, dict):
                    reply = self._dispatch(payload)
                else:
                    reply = self.handle(payload, large=True)
                del payload
                push.send_multipart([ident, *envelope, self._pack_reply(reply)])
        finally:
            push.close(0)

    # -- lifecycle ------------------------------------------------------------------
    def _close_sockets(self) -> None:
        for s in (self.sock, self._replies, self._zap):
            if s is not None and not s.closed:
                s.close(0)
        if self._own_ctx:
            self.ctx.destroy(linger=0)

    def stop(self) -> None:
        """Stop both threads, close the socket (and the server's own context)."""
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        started = self._thread.is_alive() or self._worker.is_alive()
        for t in (self._worker, self._thread):
            if t.is_alive():
                t.join(timeout=TIMEOUTS.thread_join_s)
        if not started:
            self._close_sockets()
        elif self._own_ctx and not (self._thread.is_alive() or self._worker.is_alive()):
            # Both threads are gone: close whatever socket of ours is still open with linger 0
            # (a reply the worker queued as the I/O thread stopped would make term() wait for
            # ever), then end the context.
            self.ctx.destroy(linger=0)


_HANDSHAKE_EVENTS = (zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
                     | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                     | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                     # a connection attempt begun, and one that failed and will be retried (refused)
                     | zmq.EVENT_CONNECT_DELAYED | zmq.EVENT_CONNECT_RETRIED)
#: What the client knows of its connection (:attr:`RpcClient.link`): none yet, a handshake done and
#: not lost since, lost after its handshake (the server stopped or restarted), or an attempt refused
#: without connecting (nothing listens there now).
LINK_UNKNOWN, LINK_UP, LINK_LOST, LINK_REFUSED = None, "up", "lost", "refused"
#: How long a call waits on a server found down before it fails: ZeroMQ tries again after the
#: reconnect interval plus up to as much at random, so by then a try was made during the call.
DOWN_FOR_S = 2 * TIMEOUTS.reconnect_s


class RpcClient:
    """Thread-safe request/reply client with a bounded wait per call.

    A call waits for its reply at most its bound, and less when the connection says the reply cannot
    come: every ``link_check_s`` of waiting the client reads its connection's events, and fails the
    call at once when the connection was lost (the server stopped or restarted: a reply to a request
    sent on it never comes) or when a server this client has reached before now refuses connections
    (it is down; its next incarnation is reached by a later call). A server never reached yet may
    still be starting, so a refused attempt before the first handshake waits the bound as before.
    """

    def __init__(self, addr: str, timeout: float = TIMEOUTS.directory_s, ctx: zmq.Context | None = None,
                 what: str = "node", auth: _auth.CurveKeys | None = None):
        self.addr = addr
        self.url = endpoint(addr)
        self.timeout = timeout
        self.what = what
        self.auth = auth
        self.ctx = ctx or zmq.Context.instance()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        #: whether a handshake with the server ever succeeded (on any of this client's connections)
        self.reached = False
        self._sock, self._mon = self._connect()

    def _connect(self) -> tuple[zmq.Socket, zmq.Socket | None]:
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.MAXMSGSIZE, MAX_REPLY_BYTES)
        s.setsockopt(zmq.RECONNECT_IVL, int(TIMEOUTS.reconnect_s * 1000))
        if self.auth is not None:
            self.auth.client(s)
        try:
            mon = s.get_monitor_socket(_HANDSHAKE_EVENTS)
        except zmq.ZMQError:
            mon = None
        self._seen = {"connected": False, "handshake": False, "failed": None}
        #: the connection's state as of its events read so far (LINK_*); ``_attempt_connected``: whether
        #: the current connection attempt connected; ``_lost``: a connection lost since it was cleared
        self.link, self._attempt_connected, self._lost = LINK_UNKNOWN, False, False
        self._rcvtimeo = -2              # what RCVTIMEO is set to (set before the first wait)
        self._drained = time.monotonic()
        s.connect(self.url)
        return s, mon

    def _close(self) -> None:
        if self._mon is not None:
            try:
                self._sock.disable_monitor()
            except zmq.ZMQError:
                pass
            self._mon.close(0)
            self._mon = None
        self._sock.close(0)

    def _drain_monitor(self) -> None:
        if self._mon is None:
            return
        while True:
            try:
                ev = recv_monitor_message(self._mon, zmq.NOBLOCK)
            except (zmq.Again, zmq.ZMQError):
                return
            e = ev.get("event")
            if e == zmq.EVENT_CONNECT_DELAYED:
                self._attempt_connected = False
            elif e == zmq.EVENT_CONNECT_RETRIED:
                if not self._attempt_connected:
                    self.link = LINK_REFUSED
            elif e == zmq.EVENT_CONNECTED:
                self._seen["connected"] = self._attempt_connected = True
                if self.link in (LINK_LOST, LINK_REFUSED):
                    self.link = LINK_UNKNOWN          # connected again, its handshake under way
            elif e == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._seen["handshake"], self._seen["failed"] = True, None
                self.link, self.reached = LINK_UP, True
            elif e == zmq.EVENT_DISCONNECTED and self.link == LINK_UP:
                self.link, self._lost, self._attempt_connected = LINK_LOST, True, False
            elif e in (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                       zmq.EVENT_HANDSHAKE_FAILED_AUTH):
                self._seen["handshake"] = False
                self._seen["failed"] = {zmq.EVENT_HANDSHAKE_FAILED_AUTH: "the server refused this side's key",
                                        zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "security mechanisms differ"
                                        }.get(e, "no detail")
            elif e == zmq.EVENT_DISCONNECTED and not self._seen["handshake"] and self._seen["connected"]:
                self._seen["failed"] = self._seen["failed"] or "the server closed the connection"

    def _timeout_error(self, op: str, wait: float) -> PeerCacheError:
        self._drain_monitor()
        cls = DiscoveryUnreachable if self.what == "discovery" else RpcError
        seen = self._seen
        mine = "uses an auth key" if self.auth is not None else "has no auth key"
        fix = (f"give every process the same secret (--auth-key-file PATH or ${_auth.ENV_VAR}, "
               "or auth_key= in the library)")
        if seen["connected"] and not seen["handshake"]:
            if seen["failed"]:
                return cls(f"no answer from {self.what} at {self.addr}: wrong or missing auth key? The "
                           f"connection was made but the secure handshake failed ({seen['failed']}); "
                           f"this side {mine}; {fix}")
            # A secret that differs ends the handshake with a failure (above); one that never ends is
            # a server that accepted the connection in its kernel but does not run its side: stopped,
            # overloaded, or out of file descriptors.
            return cls(f"no answer from {self.what} at {self.addr} to {op!r} within {wait:.1f} s: the "
                       "connection was made but the server never answered the ZeroMQ handshake; it is "
                       "stopped, overloaded or out of file descriptors (check that its process runs and "
                       "its open-file limit, ulimit -n)")
        return cls(f"no reply from {self.what} at {self.addr} to {op!r} within {wait:.1f} s; check that "
                   "it is running and that the address and port are right")

    def _down(self) -> bool:
        """Whether the server this client reached before is not connected now (the connection was lost,
        or the last attempt to connect again was refused)."""
        return self.reached and self.link in (LINK_LOST, LINK_REFUSED)

    def _gone_error(self, op: str, waited: float, wait: float) -> PeerCacheError:
        cls = DiscoveryUnreachable if self.what == "discovery" else RpcError
        why = ("closed the connection this call's request went on (it stopped or restarted), so no reply "
               "can come" if self._lost else
               f"refuses connections (nothing listened there for {DOWN_FOR_S:g} s of tries: it is down or "
               "restarting)")
        return cls(f"{self.what} at {self.addr} {why}; {op!r} failed after {waited:.2f} s instead of waiting "
                   f"out its {wait:.1f} s bound; a later call connects again (check that {self.what} is "
                   "running if this lasts)")

    def call(self, op: str, timeout: float | None = None, **fields) -> dict:
        """Send ``op`` with ``fields``; return the reply map or raise. ``timeout`` (else the client's)
        bounds the whole call, the wait for a connection another thread's call holds included."""
        fields["op"] = op
        body = pack(fields)
        wait = self.timeout if timeout is None else max(0.0, timeout)
        start = time.monotonic()
        # The wait behind another call counts against this call's bound: a call queued behind one
        # that waits out its own timeout (a stopped server) must not wait twice.
        if not self._lock.acquire(timeout=wait):
            cls = DiscoveryUnreachable if self.what == "discovery" else RpcError
            raise cls(f"no reply from {self.what} at {self.addr} to {op!r} within {wait:.1f} s: another "
                      "call on this connection waited all that time for its own reply; check that "
                      f"{self.what} is running and not stopped or overloaded")
        try:
            frames = self._exchange(op, body, wait, start)
        finally:
            self._lock.release()
        try:
            reply = unpack(frames[-1])
        except Exception as e:
            raise RpcError(f"{self.what} at {self.addr} sent an undecodable reply to {op!r}: {e}") from e
        if not isinstance(reply, dict):
            raise RpcError(f"{self.what} at {self.addr} sent a malformed reply to {op!r}")
        if not reply.get("ok"):
            raise RpcError(f"{self.what} at {self.addr} refused {op!r}: {reply.get('error')}")
        return reply

    def _exchange(self, op: str, body: bytes, wait: float, start: float) -> list:
        """Send one request and receive its reply's frames by ``start + wait`` (the lock held)."""
        now = time.monotonic()
        if now - self._drained > TIMEOUTS.monitor_drain_s:
            # The handshake events only explain a timeout: read them now and then (and at a
            # timeout), not on every call, so a call costs one send and one blocking receive.
            self._drained = now
            self._drain_monitor()
        self._lost = False         # a loss read before this call's request concerns no request of its
        rid = next(self._ids).to_bytes(8, "little")
        sock = self._sock
        deadline = start + wait
        # A DEALER's send blocks while it has no connection to queue on: after a secure handshake that
        # failed, ZeroMQ drops the connection and tries again, and a send in between waited forever (a
        # client with a secret against a server without one hung in test_auth). The send is bounded too.
        sock.setsockopt(zmq.SNDTIMEO, max(1, int((deadline - time.monotonic()) * 1000)))
        try:
            sock.send_multipart([b"", rid, body])
        except zmq.Again:
            self._drain_monitor()
            err = self._timeout_error(op, wait)
            self._close()
            self._sock, self._mon = self._connect()
            raise err from None
        # The reply is waited for in slices of link_check_s: a reply within the first (the common
        # case) costs one blocking receive; a longer wait reads the connection's events after each.
        check_ms = max(1, int(TIMEOUTS.link_check_s * 1000))
        down_since = None          # when this call first found its server down (monotonic s)
        while True:
            left_ms = max(0, int((deadline - time.monotonic()) * 1000) + 1)
            ms = min(left_ms, check_ms)
            if ms != self._rcvtimeo:
                sock.setsockopt(zmq.RCVTIMEO, ms)
                self._rcvtimeo = ms
            try:
                # A receive that blocks in ZeroMQ with the GIL released (no poll, then recv).
                frames = sock.recv_multipart() if ms > 0 else None
            except zmq.Again:
                frames = None
            if frames is not None:
                if len(frames) >= 3 and frames[1] == rid:
                    return frames
                continue                                  # a late reply of an old call
            self._drain_monitor()
            self._drained = now = time.monotonic()
            down_since = (down_since or now) if self._down() else None
            # A lost connection took the request with it (if it went on it); a server down for
            # DOWN_FOR_S of this call refused a try made while it waited (a refusal read now may be
            # older than the call: the server may be back, and the next try succeed).
            gone = self._lost or (down_since is not None and now - down_since >= DOWN_FOR_S)
            if ms < left_ms and not gone:
                continue                                  # time left, and the reply may still come
            if ms < left_ms:
                err = self._gone_error(op, time.monotonic() - start, wait)
            else:
                err = self._timeout_error(op, wait)
            # Drop the socket so a late reply cannot be taken for the next call, nor a request
            # queued for a server that is gone reach its next incarnation.
            self._close()
            self._sock, self._mon = self._connect()
            raise err

    def close(self) -> None:
        """Close the socket."""
        with self._lock:
            self._close()
