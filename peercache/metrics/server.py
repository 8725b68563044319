"""A bounded HTTP server for a WSGI app (the metrics endpoint's: prometheus-client's ``make_wsgi_app``).

One thread and one ``selectors`` loop serve every connection; nothing here grows with what a client sends or
how many clients come:

- at most ``max_connections`` connections are open at once; a new one past that closes the oldest that is
  still sending its request (a scraper sends its request at once, an idle or slowloris connection never
  finishes), or, when every open one is being answered, is itself closed at once;
- a request's headers are at most ``max_header_bytes`` (past that: 431, then the connection closes) and must
  arrive, and the answer be taken, within ``timeout`` seconds of the connection's start (then it closes);
- every answer is HTTP/1.0 and closes its connection, so no connection is ever idle after an answer.

So the server holds at most ``max_connections + 5`` descriptors (the connections, the listener, one being
accepted, the wake-up pair and the selector's) and ``max_connections * (max_header_bytes + one answer)``
bytes, however many clients there are. Requests are answered one at a time on the loop's thread, which is
what a metrics endpoint is asked for (a scrape every few seconds).
"""
from __future__ import annotations

import errno
import http.client
import io
import logging
import selectors
import socket
import threading
import time
import urllib.parse
from typing import Callable, Optional
from wsgiref.handlers import SimpleHandler

from ..timeouts import DEFAULT as TIMEOUTS

log = logging.getLogger(__name__)

#: descriptors the server holds beside its connections: the listener, one just accepted (before a slot is
#: freed for it), the two ends of the wake-up pair, and the selector's own (epoll)
OVERHEAD_FDS = 5
#: how long accepting pauses when the process is out of descriptors (the listener stays readable meanwhile)
ACCEPT_PAUSE = 0.5


def _plain(status: str, text: str) -> bytes:
    """A whole HTTP/1.0 answer of ``status`` with ``text`` as its body, for a request never handed to the app."""
    body = (text + "\n").encode()
    return (f"HTTP/1.0 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body


class _Conn:
    __slots__ = ("sock", "peer", "deadline", "buf", "out", "closed")

    def __init__(self, sock: socket.socket, peer, deadline: float):
        self.sock, self.peer, self.deadline = sock, peer, deadline
        self.buf: Optional[bytearray] = bytearray()   # the request's head so far; None once it is answered
        self.out: Optional[memoryview] = None         # what is left of the answer
        self.closed = False


class BoundedWSGIServer:
    """Serve ``app`` on ``host``:``port`` (port 0: any free one) from one thread until :meth:`close`.

    OSError (socket.gaierror included) when the address cannot be listened on."""

    def __init__(self, host: str, port: int, app: Callable, *, max_connections: int, timeout: float,
                 max_header_bytes: int, name: str = "metrics-http"):
        if max_connections < 1 or timeout <= 0 or max_header_bytes < 64:
            raise ValueError(f"max_connections {max_connections} (>= 1), timeout {timeout} (> 0) and "
                             f"max_header_bytes {max_header_bytes} (>= 64) bound the server; give values in range")
        self.app, self.max_connections = app, max_connections
        self.timeout, self.max_header_bytes = timeout, max_header_bytes
        # the family of the address as given (an IPv6 host needs an AF_INET6 socket), as prometheus-client does
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                       flags=socket.AI_PASSIVE)[0]
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            # as http.server does: a port of a just-closed endpoint (TIME_WAIT) can be listened on again
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind(sockaddr)
            # a backlog well above the cap: a burst of connections waits in the kernel (no descriptor of
            # ours) until the loop takes them, instead of having SYNs dropped and retried a second later
            self._listener.listen(128)
        except OSError:
            self._listener.close()
            raise
        self._listener.setblocking(False)
        self.server_address = self._listener.getsockname()[:2]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        #: open connections, oldest first (dicts keep insertion order)
        self._conns: dict[int, _Conn] = {}
        self._accept_paused_until = 0.0
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def connections(self) -> int:
        """Connections open now (at most ``max_connections``)."""
        return len(self._conns)

    def close(self) -> None:
        """Stop serving, close every connection and the listener (the port is free on return)."""
        self._closing = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(timeout=TIMEOUTS.thread_join_s)

    # -- the loop ------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._closing:
                now = time.monotonic()
                deadlines = [c.deadline for c in self._conns.values()]
                if self._accept_paused_until:
                    deadlines.append(self._accept_paused_until)
                wait = max(0.0, min(deadlines) - now) if deadlines else None
                for key, mask in self._sel.select(wait):
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                    elif not key.data.closed:
                        if mask & selectors.EVENT_READ:
                            self._read(key.data)
                        elif mask & selectors.EVENT_WRITE:
                            self._write(key.data)
                self._expire(time.monotonic())
        except Exception:      # a bug here must not pass silently: the endpoint would just stop answering
            log.exception("the metrics endpoint's server stopped")
        finally:
            for c in list(self._conns.values()):
                self._drop(c)
            self._sel.close()
            for s in (self._listener, self._wake_r, self._wake_w):
                s.close()

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(64):
                pass
        except BlockingIOError:
            pass

    def _accept(self) -> None:
        # at most a cap's worth per round, so that reads of open connections are not starved by a flood
        for _ in range(self.max_connections):
            try:
                sock, peer = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # out of descriptors (the data path's, not ours: ours are capped): stop asking for a while
                    # instead of spinning on a listener that stays readable
                    log.warning("metrics endpoint: cannot accept a connection (%s); pausing %.1f s",
                                e.strerror or e, ACCEPT_PAUSE)
                    self._sel.unregister(self._listener)
                    self._accept_paused_until = time.monotonic() + ACCEPT_PAUSE
                return     # ECONNABORTED and the like: the client is gone already
            if len(self._conns) >= self.max_connections and not self._evict():
                sock.close()     # every slot is being answered: this one waits for no one
                continue
            sock.setblocking(False)
            c = _Conn(sock, peer, time.monotonic() + self.timeout)
            self._conns[sock.fileno()] = c
            self._sel.register(sock, selectors.EVENT_READ, c)

    def _evict(self) -> bool:
        """Close the oldest connection still sending its request; False when there is none."""
        for c in self._conns.values():
            if c.buf is not None:
                self._drop(c)
                return True
        return False

    def _expire(self, now: float) -> None:
        for c in [c for c in self._conns.values() if c.deadline <= now]:
            self._drop(c)
        if self._accept_paused_until and now >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            self._sel.register(self._listener, selectors.EVENT_READ, "accept")

    def _drop(self, c: _Conn) -> None:
        if c.closed:
            return
        c.closed = True
        self._conns.pop(c.sock.fileno(), None)
        try:
            self._sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.sock.close()

    def _read(self, c: _Conn) -> None:
        room = self.max_header_bytes - len(c.buf)
        try:
            data = c.sock.recv(max(room, 1))
        except BlockingIOError:
            return
        except OSError:
            self._drop(c)
            return
        if not data:
            self._drop(c)
            return
        start = max(0, len(c.buf) - 3)
        c.buf += data
        end = c.buf.find(b"\r\n\r\n", start)
        if end < 0:
            end = c.buf.find(b"\n\n", start)
        if end >= 0:
            self._answer(c, self._respond(bytes(c.buf[:end]), c.peer))
        elif len(c.buf) >= self.max_header_bytes:
            self._answer(c, _plain("431 Request Header Fields Too Large",
                                   f"request headers beyond {self.max_header_bytes} bytes"))

    def _answer(self, c: _Conn, response: bytes) -> None:
        c.buf, c.out = None, memoryview(response)
        self._sel.modify(c.sock, selectors.EVENT_WRITE, c)
        self._write(c)

    def _write(self, c: _Conn) -> None:
        try:
            sent = c.sock.send(c.out)
        except BlockingIOError:
            return
        except OSError:
            self._drop(c)
            return
        c.out = c.out[sent:]
        if not len(c.out):
            self._drop(c)

    # -- one request -----------------------------------------------------------------------------------
    def _respond(self, head: bytes, peer) -> bytes:
        """The whole answer to a request whose head (request line and headers, without the blank line) is
        ``head``: the app's, or 400 for what is not an HTTP request."""
        line, _, rest = head.partition(b"\n")
        parts = line.decode("iso-8859-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return _plain("400 Bad Request", "not an HTTP request line (METHOD TARGET HTTP/1.x)")
        method, target, version = parts
        try:
            headers = http.client.parse_headers(io.BytesIO(rest + b"\r\n\r\n"))
        except http.client.HTTPException as e:
            return _plain("400 Bad Request", f"bad request headers ({e})")
        path, _, query = target.partition("?")
        host, port = self.server_address[:2]
        # what wsgiref's WSGIRequestHandler.get_environ gives an app, from this request
        environ = {"REQUEST_METHOD": method, "SCRIPT_NAME": "", "PATH_INFO": urllib.parse.unquote(path, "iso-8859-1"),
                   "QUERY_STRING": query, "SERVER_NAME": str(host), "SERVER_PORT": str(port),
                   "SERVER_PROTOCOL": version, "REMOTE_ADDR": str(peer[0]), "CONTENT_LENGTH": ""}
        for name, value in headers.items():
            key = name.upper().replace("-", "_")
            if key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
                environ[key] = value.strip()
            else:
                key = "HTTP_" + key
                environ[key] = f"{environ[key]},{value.strip()}" if key in environ else value.strip()
        out, err = io.BytesIO(), io.StringIO()
        handler = SimpleHandler(io.BytesIO(), out, err, environ, multithread=False, multiprocess=False)
        handler.os_environ = {}          # the process's environment is no part of a request's
        handler.run(self.app)            # the status line, headers and body; a 500 when the app raised
        if err.getvalue():
            log.warning("metrics endpoint: %s", err.getvalue().strip())
        return out.getvalue()
