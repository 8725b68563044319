"""TCP transport: a one-sided read emulated by a range server.

The producer's data server knows nothing of keys: it checks that each
requested range lies inside an exposed region with the right key and sends
the bytes. Anything else gets an error status, is counted (and logged in
rate-limited summaries), and the server keeps serving. This is for
functional checks across hosts, never a performance claim for RDMA.

Wire format (little endian)::

    request : "PCRQ" u32 flags, u32 n, u64 req_id, then n x (u32 region,
              u32 pad, u64 rkey, u64 offset, u64 length)
    reply   : "PCRS" u32 code, u32 n, u64 req_id, then n x i32 status and the
              payloads of the ok ops in order; code != 0 means the whole
              request was refused and a u32-length UTF-8 reason follows.

A request without ops or one asking for more than MAX_REPLY_BYTES is refused
whole and the connection goes on; a bad magic or more than MAX_OPS ops loses
the framing, so the refusal is followed by a close. The server holds at most
``max_connections`` greeted connections (one more is told it is at its
connection limit, and closed), and apart from them at most ``max_greeting``
connections waiting for their hello (``max_greeting_per_source`` per address,
``hello_timeout`` each; past a cap the oldest is closed). It closes a
connection idle for ``idle_timeout``, and one whose request does not arrive
whole, or whose reply sends less than PROGRESS_BYTES, within
``request_timeout``; replies hold at most ``reply_memory`` bytes in all (a
request beyond waits, then is refused). The server is the native epoll loop
(native/server.c, whose header says how), and so is the client (native/tcp.c):
the native module is required. The client redials a pooled channel the server
closed while it sat idle, and reports the reason of a refusal the server sent
before closing. Refusals are counted and logged as one summary line per
``log_interval``. tests/oracles/tcp_client.py writes this wire in Python (the
header, op records, handshake and a whole client): the tests' twin of the
native code, which no production path uses.

Every connection starts in a greeting stage (``greet()`` in
native/server.c). With the cluster secret, a connection opens with a
challenge-response (hello version 2) in which each side proves it holds the
data key (peercache.auth.data_key of the secret; the MACs are
peercache.auth.DataKey's) and neither sends it::

    hello     : client -> "PCHI" u32 version (2), u32 32, u64 0, cn (its fresh nonce)
    challenge : server -> "PCHI" u32 2, u32 82, u64 0, sn (its fresh nonce), the
                          address the connection reached (18 bytes: IPv6, IPv4
                          mapped, and port), the server's proof over cn || sn || address
    proof     : client -> the client's proof over the same

The client checks the server's proof, and that the address in it is the one
it reached, before it sends its own: a server that does not hold the secret
(a listener someone registered in the directory) is told nothing more, and
the error names it ("did not prove it holds the cluster secret"); a real
one reached through something that forwards connections (a relay set up
that way, or NAT) is told nothing either, and the error names both
addresses. From then on each request is followed by its tag (32 bytes,
under the session key of the handshake, numbered per connection); the
server checks it before anything the request asks for, so nothing on the
path can add, replay or change requests. A server with a secret serves
nothing before the handshake: a request first, a hello of another version
(version 1 sent a token in the clear), a wrong proof or a wrong tag gets a
refusal (req_id 0 for the connection's) and the connection is closed. A
server without a secret serves connections that open with a request and
refuses a hello (it cannot prove a secret). Pages travel in the clear:
docs/security.md says what that leaves to an observer on the path.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

import numpy as np

from ..auth import DATA_KEY_BYTES
from ..errors import TransportError, TransportUnavailable
from ..timeouts import DEFAULT as TIMEOUTS
from .base import Transport, native_module, slot_ops
from .handles import NativeReads, PeerHandles

log = logging.getLogger(__name__)

#: Most ops one request may carry, and most payload bytes one reply may carry.
MAX_OPS = 1 << 16
MAX_REPLY_BYTES = 1 << 31


#: Limits of the data server (TcpTransport arguments). A process started by another tool can
#: change the defaults with PEERCACHE_TCP_MAX_CONNECTIONS, PEERCACHE_TCP_IDLE_TIMEOUT,
#: PEERCACHE_TCP_REQUEST_TIMEOUT, PEERCACHE_TCP_HELLO_TIMEOUT, PEERCACHE_TCP_MAX_GREETING,
#: PEERCACHE_TCP_MAX_GREETING_PER_SOURCE, PEERCACHE_TCP_REPLY_MEMORY, PEERCACHE_TCP_SEND_BUFFER,
#: PEERCACHE_TCP_SERVER_WORKERS and PEERCACHE_TCP_LOG_INTERVAL.
DEFAULT_MAX_CONNECTIONS = 1024   #: greeted connections open at once
DEFAULT_IDLE_TIMEOUT = 60.0      #: s without a request before a connection is closed
DEFAULT_REQUEST_TIMEOUT = 10.0   #: s for a request to arrive whole, and per PROGRESS_BYTES of a reply
DEFAULT_HELLO_TIMEOUT = 2.0      #: s for a new connection's handshake (or, without a secret, first request)
#: Connections waiting for their hello, in all (split between the serving threads) and from one
#: source address; past either cap the oldest waiting one (of that address, or of all) is closed.
DEFAULT_MAX_GREETING = 128
DEFAULT_MAX_GREETING_PER_SOURCE = 32
#: Bytes of memory for replies over all connections: the op buffers of requests beyond 256 ops
#: and each busy connection's socket send buffer (see native/server.c).
DEFAULT_REPLY_MEMORY = 256 << 20
#: SO_SNDBUF asked per connection (the kernel doubles it for its bookkeeping); 0 leaves it to
#: the kernel's autotuning, which lets one slow reader's queue grow to tcp_wmem's maximum (4 MiB).
DEFAULT_SEND_BUFFER = 256 << 10
#: A reply must send this many bytes (or its end) every request_timeout, or its connection is closed.
PROGRESS_BYTES = 256 << 10
DEFAULT_LOG_INTERVAL = 5.0       #: s between two refusal summaries
#: The native client polls its socket this long (µs) for a reply before it sleeps in a blocking
#: receive, and the data server's workers poll as long for the next request after serving one
#: (native/tcp.c and native/server.c say why and how each backs off); PEERCACHE_TCP_POLL_US or
#: ``poll_us`` change it, 0 sleeps at once.
DEFAULT_POLL_US = 50
MAX_POLL_US = 1_000_000
LISTEN_BACKLOG = 512
#: How long the server stops accepting after an accept error (native/server.c's BACKOFF_MIN/MAX).
_BACKOFF_MIN, _BACKOFF_MAX = 0.010, 0.100

#: The counters of the data server (RegionTable.stats(), native/server.c).
STAT_NAMES = ("accepted", "served", "ops_bad_region", "ops_out_of_range", "ops_zero_length",
              "req_bad_magic", "req_too_many_ops", "req_no_ops", "req_too_large", "conn_over_limit",
              "conn_idle", "conn_slow", "accept_errors", "nomem", "conn_no_token", "conn_bad_token",
              "conn_hello_timeout", "conn_evicted", "reply_memory_waits", "req_busy", "req_bad_tag",
              "poll_caught", "poll_missed")
#: Counters of refused ops and requests: the ``refused`` total.
_REFUSALS = ("ops_bad_region", "ops_out_of_range", "ops_zero_length", "req_bad_magic",
             "req_too_many_ops", "req_no_ops", "req_too_large", "conn_no_token", "conn_bad_token", "req_busy",
             "req_bad_tag")


def _native_or_raise():
    """``peercache._native``, or TransportUnavailable saying how to build it: the data server is
    its epoll loop (native/server.c) and the fast client its tcp backend (native/tcp.c)."""
    mod, why = native_module()
    if mod is None:
        raise TransportUnavailable(f"--protocol tcp needs the native module: {why}")
    return mod


def fds_needed() -> int:
    """Descriptors a data server started with this process's settings may hold: its greeted
    connections, those waiting for their hello, and a margin for everything else (the control
    port's connections, files, the pool)."""
    return (_env_default("PEERCACHE_TCP_MAX_CONNECTIONS", DEFAULT_MAX_CONNECTIONS, int)
            + _env_default("PEERCACHE_TCP_MAX_GREETING", DEFAULT_MAX_GREETING, int) + 256)


def _env_default(name: str, value, kind):
    raw = os.environ.get(name)
    if not raw:
        return value
    try:
        return kind(raw)
    except ValueError:
        raise TransportError(f"{name}={raw!r} is not a valid {kind.__name__}") from None


def request_window() -> tuple[int, int, int]:
    """How the native client moves one batch on its data connection: (bytes, ops, in flight):
    requests of at most ``bytes`` (or one op, when an op is larger) and ``ops`` ops, ``in flight`` of
    them sent and not yet answered. The native module's REQ_BYTES, REQ_OPS and WINDOW (native/pc.h),
    read from there: TransportUnavailable saying how to build it when it is missing."""
    mod = _native_or_raise()
    return mod.REQ_BYTES, mod.REQ_OPS, mod.WINDOW


def request_cuts(op_lengths: list[int]) -> list[tuple[int, int]]:
    """(bytes, ops) of each request the native client cuts a batch of ops of these lengths into
    (native/tcp.c's chunk_end: at most REQ_OPS ops, and REQ_BYTES unless its first op alone is more;
    see :func:`request_window`)."""
    max_bytes, max_ops, _ = request_window()
    cuts, start, n = [], 0, len(op_lengths)
    while start < n:
        end, nbytes = start, 0
        while end < n and end - start < max_ops and (end == start or nbytes + op_lengths[end] <= max_bytes):
            nbytes += op_lengths[end]
            end += 1
        cuts.append((nbytes, end - start))
        start = end
    return cuts


def batch_wire(object_bytes: int, objects: int, send_buffer: int | None = None) -> dict[str, int]:
    """How the native client moves a batch of ``objects`` slot reads of ``object_bytes`` each (their ops as
    base.slot_ops lays them out: header, payload, trailer) on its one data connection:

    - ``request_bytes``: the most one request carries: REQ_BYTES where that cut the batch (the cap, as
      iperf3's ``-l`` is: a request of 128 KiB objects carries 7 and a header, 896 KiB, as the next would
      not fit), else its largest request (cut by REQ_OPS, or the whole batch); one object when larger
      (REQ_BYTES, REQ_OPS: :func:`request_window`);
    - ``requests``: how many requests the batch is cut into; ``requests_in_flight``: sent and not yet
      answered, at most;
    - ``outstanding_bytes``: bytes asked for and not yet received, at most;
    - ``send_buffer``: SO_SNDBUF the data server asks per connection (``send_buffer``, else
      $PEERCACHE_TCP_SEND_BUFFER, else DEFAULT_SEND_BUFFER; 0: the kernel's autotuning);
    - ``in_flight_bytes``: what the connection carries at once: the outstanding bytes, bounded by the
      send buffer where one is set (asked as iperf3's ``-w`` asks it; the kernel doubles both).
    """
    if object_bytes < 1 or objects < 1:
        raise ValueError(f"a batch has at least one object of at least one byte, not {objects} of {object_bytes}")
    if send_buffer is None:
        send_buffer = _env_default("PEERCACHE_TCP_SEND_BUFFER", DEFAULT_SEND_BUFFER, int)
    zeros, size = np.zeros(objects, np.uint64), np.full(objects, object_bytes, np.uint64)
    cuts = request_cuts(slot_ops(zeros, zeros, zeros, size, size, zeros, zeros)[0]["length"].tolist())
    max_bytes, max_ops, window = request_window()
    sizes = [b for b, _ in cuts]
    by_bytes = any(n < max_ops for _, n in cuts[:-1])     # a request other than the last ended on the byte cap
    in_flight = min(window, len(cuts))
    outstanding = max(sum(sizes[i:i + in_flight]) for i in range(len(sizes) - in_flight + 1))
    return {"request_bytes": max(max_bytes, *sizes) if by_bytes else max(sizes), "requests": len(cuts),
            "requests_in_flight": in_flight, "outstanding_bytes": outstanding, "send_buffer": send_buffer,
            "in_flight_bytes": min(outstanding, send_buffer) if send_buffer > 0 else outstanding}


def poll_us_setting(poll_us: int | None = None) -> int:
    """The µs the native client polls for a reply: ``poll_us``, else $PEERCACHE_TCP_POLL_US, else
    DEFAULT_POLL_US; TransportError when it is not a whole number in 0..MAX_POLL_US."""
    value = poll_us if poll_us is not None else _env_default("PEERCACHE_TCP_POLL_US", DEFAULT_POLL_US, int)
    if not 0 <= value <= MAX_POLL_US:
        raise TransportError(f"tcp poll time {value} µs is outside 0..{MAX_POLL_US} "
                             "(--tcp-poll-us / PEERCACHE_TCP_POLL_US; 0 sleeps at once)")
    return value


class _Reporter:
    """Turns the server's counters into rate-limited log lines.

    Refusals and dropped connections: one WARNING line per interval at most,
    with the counts by kind (the first right away, within a poll period).
    Accept failures: one WARNING when they start, one INFO when accepting
    works again, whatever their number.
    """

    POLL = 0.25

    def __init__(self, stats, interval: float, limits: dict):
        self._stats = stats
        self.interval = interval
        self._limits = limits
        self._logged = dict.fromkeys(STAT_NAMES, 0)
        self._last_log = float("-inf")   # the first refusal is logged at once
        self._since = time.monotonic()   # start of the span the next summary covers
        self._accept_warned = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tcp-data-log", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(min(self.POLL, self.interval)):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - the reporter must not die
                log.exception("tcp data server: reporting failed")

    def poll(self, final: bool = False) -> None:
        s = self._stats()
        now = time.monotonic()
        d = {k: s[k] - self._logged[k] for k in STAT_NAMES}
        kinds = [("ops_bad_region", "ops with a bad region or key"),
                 ("ops_out_of_range", "ops out of range"),
                 ("ops_zero_length", "zero-length ops"),
                 ("req_no_ops", "requests without ops"),
                 ("req_too_large", f"requests for more than {MAX_REPLY_BYTES} bytes"),
                 ("req_bad_magic", "requests with a bad magic (connection closed)"),
                 ("req_too_many_ops", f"requests of more than {MAX_OPS} ops (connection closed)"),
                 ("conn_slow", f"connections closed for a request or reply slower than "
                               f"{self._limits['request_timeout']:g} s"),
                 ("conn_over_limit", f"connections over the {self._limits['max_connections']}-connection "
                                     "limit refused and closed"),
                 ("nomem", "connections closed out of memory"),
                 ("conn_no_token", "connections that did not open with the handshake (closed)"),
                 ("conn_bad_token", "connections refused at the handshake: a wrong proof, a client that left "
                                    "after our challenge (its secret is not ours), or a hello of another "
                                    "version (closed)"),
                 ("req_bad_tag", "requests whose tag did not match their connection's handshake "
                                 "(connection closed)"),
                 ("reply_memory_waits", f"requests that waited for reply memory (all replies may hold "
                                        f"{self._limits['reply_memory'] >> 20} MiB)"),
                 ("req_busy", f"requests refused after waiting {self._limits['request_timeout']:g} s for "
                              "reply memory (connection closed)")]
        if self._limits.get("key"):
            # With a secret, a client that never greets is not one of ours (without one, a pooled
            # channel that sat idle says nothing either: those are closed quietly, as idle ones).
            kinds += [("conn_hello_timeout", f"connections that did not finish their handshake within "
                                             f"{self._limits['hello_timeout']:g} s (closed)"),
                      ("conn_evicted", "connections waiting for their hello closed to make room for newer "
                                       f"ones (at most {self._limits['max_greeting']} wait, "
                                       f"{self._limits['max_greeting_per_source']} per address)")]
        parts = [f"{d[k]} {what}" for k, what in kinds if d[k]]
        if parts and (final or now - self._last_log >= self.interval):
            log.warning("tcp data server refused in the last %.1f s: %s", now - self._since, ", ".join(parts))
            for k, _ in kinds:
                self._logged[k] = s[k]
            self._last_log = self._since = now
        elif not parts:
            self._since = now
        warned = {k for k, _ in kinds}
        for k in ("conn_idle", "conn_hello_timeout", "conn_evicted"):
            if d[k] and k not in warned:           # closed quietly: no summary line
                log.debug("tcp data server closed %d connections (%s)", d[k], k)
                self._logged[k] = s[k]
        errs = d["accept_errors"]
        why = os.strerror(s["accept_errno"]) if s["accept_errno"] else "?"
        if errs and not self._accept_warned:
            if s["accept_failing"]:
                log.warning("tcp data server cannot accept connections: %s; retrying every %d-%d ms "
                            "(logged once until it recovers)", why, _BACKOFF_MIN * 1000, _BACKOFF_MAX * 1000)
                self._accept_warned = True  # the count goes with the recovery line
            else:
                log.warning("tcp data server could not accept connections %d times (%s), and accepts "
                            "again", errs, why)
                self._logged["accept_errors"] = s["accept_errors"]
        elif self._accept_warned and not s["accept_failing"]:
            log.info("tcp data server accepts connections again, after %d failed accept calls (%s)",
                     errs, why)
            self._accept_warned = False
            self._logged["accept_errors"] = s["accept_errors"]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.poll(final=True)


class _Server:
    """Accepts data connections and serves range reads without a thread per connection.

    ``workers`` threads, each running the native ``RegionTable.serve`` (epoll,
    no GIL) on the shared non-blocking listening socket. They bound the open
    connections (greeted ones, and apart from them those waiting for their
    hello, also per source address), close idle and slow ones and slow
    readers, cap the memory of replies, keep accepting after accept errors
    (backing off 10-100 ms), count what they refuse, and leave the logging to
    a :class:`_Reporter`. native/server.c's header says how each limit works.
    """

    def __init__(self, regions: dict[int, tuple[memoryview, int]], bind_host: str, port: int,
                 *, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 idle_timeout: float = DEFAULT_IDLE_TIMEOUT, request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
                 hello_timeout: float = DEFAULT_HELLO_TIMEOUT, max_greeting: int = DEFAULT_MAX_GREETING,
                 max_greeting_per_source: int = DEFAULT_MAX_GREETING_PER_SOURCE,
                 reply_memory: int = DEFAULT_REPLY_MEMORY, send_buffer: int = DEFAULT_SEND_BUFFER,
                 workers: int | None = None, log_interval: float = DEFAULT_LOG_INTERVAL,
                 key: bytes | None = None, poll_us: int = 0):
        if key is not None and len(key) != DATA_KEY_BYTES:
            raise TransportError(f"a data key is {DATA_KEY_BYTES} bytes, not {len(key)}")
        #: what a connection's handshake proves (None: connections are admitted without one)
        self.key = bytes(key) if key else None
        if max_connections < 1 or not idle_timeout > 0 or not request_timeout > 0 or not hello_timeout > 0 \
                or max_greeting < 1 or max_greeting_per_source < 1 or reply_memory < 1 or send_buffer < 0 \
                or not log_interval > 0:
            raise TransportError("tcp data server limits must be positive: max_connections="
                                 f"{max_connections}, idle_timeout={idle_timeout}, "
                                 f"request_timeout={request_timeout}, hello_timeout={hello_timeout}, "
                                 f"max_greeting={max_greeting}, max_greeting_per_source="
                                 f"{max_greeting_per_source}, reply_memory={reply_memory}, "
                                 f"log_interval={log_interval} (send_buffer={send_buffer}: 0 or more)")
        self.regions = regions
        self.max_connections = int(max_connections)
        self.idle_timeout = float(idle_timeout)
        self.request_timeout = float(request_timeout)
        self.hello_timeout = float(hello_timeout)
        self.max_greeting = int(max_greeting)
        self.max_greeting_per_source = int(max_greeting_per_source)
        self.reply_memory = int(reply_memory)
        self.send_buffer = int(send_buffer)
        #: µs a worker polls for the next request after serving one, before it sleeps (0: at once)
        self.poll_us = poll_us_setting(poll_us)
        self._table = _native_or_raise().RegionTable(
            [(rid, rkey, mv) for rid, (mv, rkey) in regions.items()], self.key)
        family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
        self.lsock = socket.socket(family, socket.SOCK_STREAM)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.lsock.bind((bind_host, port))
        except OSError as e:
            self.lsock.close()
            raise TransportError(f"tcp data server cannot bind {bind_host}:{port}: {e}") from e
        self.lsock.listen(LISTEN_BACKLOG)
        self.lsock.setblocking(False)
        self.port = self.lsock.getsockname()[1]
        # Readable once close() wrote to it: wakes every worker.
        self._stop_r, self._stop_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        n = max(1, int(workers or min(4, os.cpu_count() or 1)))
        self._threads = [threading.Thread(target=self._native_worker, args=(n,), name=f"tcp-data-{i}",
                                          daemon=True) for i in range(n)]
        self._reporter = _Reporter(self.stats, log_interval, {
            "max_connections": self.max_connections, "request_timeout": self.request_timeout,
            "hello_timeout": self.hello_timeout, "max_greeting": self.max_greeting,
            "max_greeting_per_source": self.max_greeting_per_source, "reply_memory": self.reply_memory,
            "key": self.key is not None})
        for t in self._threads:
            t.start()
        self._reporter.start()

    # ---------------------------------------------------------------- counters

    def stats(self) -> dict:
        """Counters of the serving loop (see STAT_NAMES), open connections, accept state."""
        return self._table.stats()

    @property
    def refused_total(self) -> int:
        """Ops and requests refused by the serving loop."""
        s = self.stats()
        return sum(s[k] for k in _REFUSALS)

    # ---------------------------------------------------------------- the workers

    def _native_worker(self, nworkers: int) -> None:
        # Each worker keeps its own connections, so the greeting caps are split between them.
        greet = -(-self.max_greeting // nworkers)
        per_source = -(-self.max_greeting_per_source // nworkers)
        try:
            self._table.serve(self.lsock.fileno(), self._stop_r, self.max_connections, self.idle_timeout,
                              self.request_timeout, self.hello_timeout, greet, per_source,
                              self.reply_memory, self.send_buffer, self.poll_us)
        except Exception:  # noqa: BLE001 - say why this worker is gone
            log.exception("tcp data server worker failed")

    def close(self) -> None:
        try:
            os.write(self._stop_w, b"x")
        except OSError:
            pass
        alive = False
        for t in self._threads:
            t.join(timeout=10)
            alive |= t.is_alive()
        self._reporter.close()
        if alive:  # never close fds under a loop still using them
            log.warning("tcp data server: a serving thread did not stop; leaving its sockets open")
            return
        self.lsock.close()
        os.close(self._stop_r)
        os.close(self._stop_w)


class TcpTransport(NativeReads, Transport):
    """The tcp transport: its data server (:class:`_Server`, the native epoll loop) and its client,
    the native one (native/tcp.c): requests are pipelined on each channel and payloads are received
    straight into the destination buffers without the GIL. Without the native module it raises
    TransportUnavailable saying how to build it. (tests/oracles/tcp_client.py holds a client in
    Python, the twin the tests compare this one with.)"""

    name = "tcp"
    native = True

    def __init__(self, max_channels: int = 4, io_timeout: float = TIMEOUTS.io(TIMEOUTS.directory_s), port: int = 0,
                 max_connections: int | None = None,
                 idle_timeout: float | None = None, request_timeout: float | None = None,
                 server_workers: int | None = None, log_interval: float | None = None,
                 poll_us: int | None = None, hello_timeout: float | None = None,
                 max_greeting: int | None = None, max_greeting_per_source: int | None = None,
                 reply_memory: int | None = None, send_buffer: int | None = None):
        self._mod = _native_or_raise()
        self.max_channels = max(1, int(max_channels))
        self.io_timeout = io_timeout
        self.port = port
        #: µs the native client polls for a reply before sleeping (DEFAULT_POLL_US)
        self.poll_us = poll_us_setting(poll_us)
        #: limits of the data server started by start() (see DEFAULT_MAX_CONNECTIONS...)
        self.server_limits = {
            "max_connections": max_connections if max_connections is not None else _env_default(
                "PEERCACHE_TCP_MAX_CONNECTIONS", DEFAULT_MAX_CONNECTIONS, int),
            "idle_timeout": idle_timeout if idle_timeout is not None else _env_default(
                "PEERCACHE_TCP_IDLE_TIMEOUT", DEFAULT_IDLE_TIMEOUT, float),
            "request_timeout": request_timeout if request_timeout is not None else _env_default(
                "PEERCACHE_TCP_REQUEST_TIMEOUT", DEFAULT_REQUEST_TIMEOUT, float),
            "hello_timeout": hello_timeout if hello_timeout is not None else _env_default(
                "PEERCACHE_TCP_HELLO_TIMEOUT", DEFAULT_HELLO_TIMEOUT, float),
            "max_greeting": max_greeting if max_greeting is not None else _env_default(
                "PEERCACHE_TCP_MAX_GREETING", DEFAULT_MAX_GREETING, int),
            "max_greeting_per_source": max_greeting_per_source if max_greeting_per_source is not None
            else _env_default("PEERCACHE_TCP_MAX_GREETING_PER_SOURCE", DEFAULT_MAX_GREETING_PER_SOURCE, int),
            "reply_memory": reply_memory if reply_memory is not None else _env_default(
                "PEERCACHE_TCP_REPLY_MEMORY", DEFAULT_REPLY_MEMORY, int),
            "send_buffer": send_buffer if send_buffer is not None else _env_default(
                "PEERCACHE_TCP_SEND_BUFFER", DEFAULT_SEND_BUFFER, int),
            "workers": server_workers if server_workers is not None else _env_default(
                "PEERCACHE_TCP_SERVER_WORKERS", 0, int) or None,
            "log_interval": log_interval if log_interval is not None else _env_default(
                "PEERCACHE_TCP_LOG_INTERVAL", DEFAULT_LOG_INTERVAL, float),
        }
        self._regions: dict[int, tuple[memoryview, int]] = {}
        self._server: _Server | None = None
        self.handles = PeerHandles(self._connect_native, "tcp")

    def expose(self, region_id: int, buffer, rkey: int, **info: Any) -> None:
        self._regions[region_id] = (memoryview(buffer).cast("B"), rkey)

    def start(self, bind_host: str) -> dict[str, Any]:
        data = self.credentials.data
        self._server = _Server(self._regions, bind_host, self.port, key=data.key if data else None,
                               poll_us=self.poll_us, **self.server_limits)
        return {"host": bind_host, "port": self._server.port}

    @property
    def refused(self) -> int:
        """Ops the data server refused so far."""
        return self._server.refused_total if self._server else 0

    def server_stats(self) -> dict[str, Any]:
        server = self._server
        return server.stats() if server is not None else {}

    def native_peer(self, peer: str, info: dict[str, Any]):
        return self.handles.get(peer, info)

    def _connect_native(self, peer: str, info: dict[str, Any]):
        try:
            data = self.credentials.data
            return self._mod.tcp_connect(str(info["host"]), int(info["port"]), self.max_channels,
                                         float(self.io_timeout), data.key if data else None, self.poll_us)
        except (KeyError, TypeError, ValueError) as e:
            raise TransportError(f"tcp endpoint info of {peer} is incomplete ({e}); is the producer "
                                 "serving --protocol tcp?") from e
        except ConnectionError as e:
            raise TransportError(f"cannot open a data connection to {peer}: {e}") from e

    def close(self) -> None:
        super().close()
        if self._server:
            self._server.close()
            self._server = None
