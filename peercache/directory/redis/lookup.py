"""The hand-written Redis request path for directory lookups.

redis-py costs a Python object and a poll() per reply; a lookup of 128 keys
spends most of its time there. This path writes the MGET-style requests itself
on a blocking socket whose timeouts the kernel keeps and lets hiredis parse the
replies. The directory bench showed it is needed: ``dir_lookups_redis_vs_mget_128``
(our lookup's rate against redis-benchmark's MGET of 128 keys) went from 0.27
through redis-py to 0.97 with this path (``make bench``). Nothing else goes
through it: publish, membership and clean-up use redis-py.

:class:`LookupSocket` is the connection; :class:`LookupRequests` builds the requests and
reads the replies, on one Redis and on a cluster (one MGET per hash slot, written to every
master before any reply is read).
"""
from __future__ import annotations

import socket
import struct
from typing import Any, Sequence

import hiredis
import redis
from redis.crc import key_slot
from redis.sentinel import MasterNotFoundError

from .connection import timed_out
from .url import RedisURL


def resp_command(*args: bytes) -> bytes:
    """One command in the Redis protocol (RESP2 array of bulk strings)."""
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


class LookupSocket:
    """One plain TCP connection to one Redis for lookups: a blocking socket whose timeouts the
    kernel keeps (SO_SNDTIMEO / SO_RCVTIMEO: no poll() before each send and receive, as a socket
    with a Python timeout has), the request written as given, replies parsed by hiredis. AUTH and
    SELECT as the URL says, to ``address`` (default: the URL's server; with Sentinel, the master the
    sentinels name). Any error leaves it unusable (the caller closes it)."""

    def __init__(self, cfg: RedisURL, timeout: float, address: tuple[str, int] | None = None):
        self.sock = socket.create_connection(address or (cfg.host, cfg.port), timeout=min(timeout, 2.0))
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


class LookupRequests:
    """A lookup's round trip, mixed into :class:`~.backend.RedisDirectory` (whose
    ``__init__`` pre-builds the request parts ``_key_hdr``, ``_entry_pre``, ``_epoch_key`` and
    ``_get_epoch`` and keeps the connections ``_conns``); redis-py's pipeline is the fallback that
    reports failures."""

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
                    LookupSocket(self.cfg, self.timeout, self._server_address())
            except (redis.exceptions.RedisError, OSError) as e:
                # No master named by the sentinels, or one silent through AUTH: the pipeline would
                # only wait it out once more. Anything else (refused, closed) it retries and reports.
                if isinstance(e, MasterNotFoundError) or timed_out(e):
                    raise self._unreachable("lookup", e) from None
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
            if timed_out(e):
                raise self._unreachable("lookup", e) from None
            return None
        self._conns.append(conn)
        return epoch, got

    def _fetch_per_node(self, keys: Sequence[bytes]) -> tuple[int, list] | None:
        """The cluster's fast lookup: one MGET per hash slot, grouped per master and written to
        every master before any reply is read (the masters work in parallel). None when the slot
        map moved or a connection failed: the caller then uses the cluster pipeline, which follows
        redirections and reports unreachable masters (and has redis-py read the slot map again). A
        timeout raises at once, and has the slot map read again off the caller's thread."""
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
            if timed_out(e):
                # redis-py never saw this timeout, so it asks for no new slot map: without one, every
                # lookup would go on waiting for a hung master after its replica took over its slots
                self._refresh_slots_soon()
                raise self._unreachable("lookup", e) from None
            return None
        finally:
            for client, conn, _ in held:
                client.connection_pool.release(conn)
        return epoch, raw
