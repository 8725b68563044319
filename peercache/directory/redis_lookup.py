"""The hand-written Redis request path for directory lookups.

redis-py costs a Python object and a poll() per reply; a lookup of 128 keys
spends most of its time there. This path writes the MGET-style requests itself
on a blocking socket whose timeouts the kernel keeps and lets hiredis parse the
replies. The directory bench showed it is needed: ``dir_lookups_redis_vs_mget_128``
(our lookup's rate against redis-benchmark's MGET of 128 keys) went from 0.27
through redis-py to 0.97 with this path (``make bench``). Nothing else goes
through it: publish, membership and clean-up use redis-py.
"""
from __future__ import annotations

import socket
import struct

import hiredis
import redis

from .redis_url import RedisURL


def resp_command(*args: bytes) -> bytes:
    """One command in the Redis protocol (RESP2 array of bulk strings)."""
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


class LookupSocket:
    """One plain TCP connection to one Redis for lookups: a blocking socket whose timeouts the
    kernel keeps (SO_SNDTIMEO / SO_RCVTIMEO: no poll() before each send and receive, as a socket
    with a Python timeout has), the request written as given, replies parsed by hiredis. AUTH and
    SELECT as the URL says. Any error leaves it unusable (the caller closes it)."""

    def __init__(self, cfg: RedisURL, timeout: float):
        self.sock = socket.create_connection((cfg.host, cfg.port), timeout=min(timeout, 2.0))
        try:
            self.sock.settimeout(None)
            sec = max(timeout, 0.001)
            tv = struct.pack("ll", int(sec), int((sec - int(sec)) * 1e6))
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.reader = hiredis.Reader()
            self.buf = bytearray(1 << 17)
            hello, n = b"", 0
            if cfg.password:
                user = [cfg.username.encode()] if cfg.username else []
                hello, n = hello + resp_command(b"AUTH", *user, cfg.password.encode()), n + 1
            if cfg.db:
                hello, n = hello + resp_command(b"SELECT", b"%d" % cfg.db), n + 1
            if n:
                self.request(hello, n)
        except BaseException:
            self.sock.close()
            raise

    def request(self, pkt: bytes, n: int) -> list:
        """Send ``pkt`` (``n`` commands) and return their ``n`` replies; a Redis error reply raises
        ResponseError, a closed connection ConnectionError, a timeout OSError."""
        self.sock.sendall(pkt)
        out: list = []
        reader, buf, sock = self.reader, self.buf, self.sock
        while True:
            x = reader.gets()
            if x is False:
                got = sock.recv_into(buf)
                if not got:
                    raise redis.exceptions.ConnectionError("Redis closed the connection")
                reader.feed(buf, 0, got)
                continue
            if isinstance(x, hiredis.ReplyError):
                raise redis.exceptions.ResponseError(str(x))
            out.append(x)
            if len(out) == n:
                return out

    def close(self) -> None:
        self.sock.close()
