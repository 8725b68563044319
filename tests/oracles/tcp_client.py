"""Test oracle of the tcp data path's client: the wire of peercache.transport.tcp written in
Python (header, op records, magics), the handshake of a client that holds the cluster secret, and a
whole client (:class:`PythonTcpTransport`).

The engine's client is native (native/tcp.c, through peercache.transport.tcp.TcpTransport); this
is its twin in Python, kept only for the tests: they compare the native client's statuses and bytes
with this one's, and drive the native data server with hand-made requests and handshakes
(tests/engine/transport/test_hardening_dataserver.py, test_data_handshake.py,
test_fuzz_dataserver.py). No production path imports it.
"""
from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import queue
import socket
import struct
import threading
from typing import Any

import numpy as np

from peercache.address import join
from peercache.auth import ADDR_BYTES, MAC_BYTES, NONCE_BYTES, DataKey
from peercache.errors import TransportError
from peercache.transport.base import OP_DTYPE, Status
from peercache.transport.tcp import TcpTransport

# The engine's logger: the lines this client logs read as the tcp transport's always did.
log = logging.getLogger("peercache.transport.tcp")

REQ_MAGIC = b"PCRQ"
REP_MAGIC = b"PCRS"
HELLO_MAGIC = b"PCHI"
#: The hello's version: 2, the challenge-response (version 1 sent a token in the clear: refused).
HELLO_VERSION = 2
#: Bytes of the challenge after its header: the server's nonce, its address and its proof.
CHALLENGE_BYTES = NONCE_BYTES + ADDR_BYTES + MAC_BYTES
#: Bytes of the tag after each request's ops on a connection that shook hands.
TAG_BYTES = MAC_BYTES
HEAD = struct.Struct("<4sIIQ")
WIRE_OP = np.dtype([("region", "<u4"), ("pad", "<u4"), ("rkey", "<u8"),
                    ("offset", "<u8"), ("length", "<u8")])
IOV_MAX = 512


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Read exactly ``n`` bytes or raise ConnectionError."""
    buf = bytearray(n)
    recv_into_exact(sock, memoryview(buf))
    return bytes(buf)


def recv_into_exact(sock: socket.socket, mv: memoryview) -> None:
    """Fill ``mv`` from ``sock`` or raise ConnectionError."""
    got, n = 0, len(mv)
    while got < n:
        k = sock.recv_into(mv[got:], n - got)
        if k == 0:
            raise ConnectionError("peer closed the data connection")
        got += k


def send_iov(sock: socket.socket, bufs: list) -> None:
    """sendmsg the whole buffer list, coping with partial sends and IOV_MAX."""
    views = [memoryview(b).cast("B") for b in bufs if len(b)]
    i = 0
    while i < len(views):
        sent = sock.sendmsg(views[i:i + IOV_MAX])
        while sent:
            if sent >= len(views[i]):
                sent -= len(views[i])
                i += 1
            else:
                views[i] = views[i][sent:]
                sent = 0


def pending_refusal(sock: socket.socket) -> str | None:
    """After a send failed because the server closed the connection: the reason of the refusal it
    sent first (at its connection limit, a wrong proof...), if one waits in the socket."""
    try:
        head = sock.recv(HEAD.size + 4, socket.MSG_DONTWAIT)
        if len(head) != HEAD.size + 4:
            return None
        magic, code, _, _ = HEAD.unpack(head[:HEAD.size])
        if magic != REP_MAGIC or not code:
            return None
        (ln,) = struct.unpack("<I", head[HEAD.size:])
        return sock.recv(min(ln, 255), socket.MSG_DONTWAIT).decode(errors="replace")
    except OSError:
        return None


def hello(cn: bytes) -> bytes:
    """The hello a client holding the secret sends first on each data connection: its nonce ``cn``."""
    if len(cn) != NONCE_BYTES:
        raise TransportError(f"a hello's nonce is {NONCE_BYTES} bytes, not {len(cn)}")
    return HEAD.pack(HELLO_MAGIC, HELLO_VERSION, NONCE_BYTES, 0) + bytes(cn)


def not_proved(where: str, what: str) -> TransportError:
    """The error of a client whose data server at ``where`` did not prove the secret (``what``: how)."""
    return TransportError(
        f"the data server at {where} did not prove it holds the cluster secret ({what}), so nothing was sent "
        "to it; check that the producer runs with this consumer's secret (--auth-key-file / "
        "$PEERCACHE_AUTH_KEY) and that the directory's record of this node is a member's (whoever can write "
        "to the directory can point it elsewhere)")


def wire_address(sockaddr: tuple) -> bytes:
    """A socket address (getsockname / getpeername) as the handshake binds it (auth.ADDR_BYTES)."""
    ip = ipaddress.ip_address(sockaddr[0].split("%", 1)[0])
    if ip.version == 4:
        ip = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + ip.packed)
    return ip.packed + int(sockaddr[1]).to_bytes(2, "big")


def address_text(addr: bytes) -> str:
    """A handshake address as text, as native/handshake.c writes it."""
    ip, port = ipaddress.IPv6Address(addr[:16]), int.from_bytes(addr[16:], "big")
    return join(str(ip.ipv4_mapped or ip), port)


def relayed(where: str, at: bytes, reached: bytes) -> TransportError:
    """The error of a client whose data server at ``where`` proved the secret from the address ``at``
    while the client reached ``reached``."""
    return TransportError(
        f"the data server at {where} proved the cluster secret from {address_text(at)}, but we reached "
        f"{address_text(reached)}: something forwards our connections to it (NAT, a port mapping, a proxy, or "
        "a relay of whoever rewrote the directory's record of this node), so nothing was sent to it; the "
        "handshake binds the address: let consumers reach the producer directly")


def recv_refusal_or(sock: socket.socket, head: bytes, where: str) -> None:
    """Raise the server's refusal of the connection if ``head`` starts one."""
    magic, code, _, _ = HEAD.unpack(head)
    if magic == REP_MAGIC and code:
        (ln,) = struct.unpack("<I", recv_exact(sock, 4))
        raise TransportError(f"{where} refused the connection: "
                             f"{recv_exact(sock, min(ln, 4096)).decode(errors='replace')}")


def client_handshake(sock: socket.socket, key: DataKey, where: str) -> bytes:
    """Hello, the server's challenge and our proof on the new connection ``sock`` to ``where``
    (HOST:PORT): the session key of its request tags. TransportError when the server refused us, did
    not prove the secret (:func:`not_proved`) or proved it from another address than the one we
    reached (:func:`relayed`), before we proved anything."""
    cn = os.urandom(NONCE_BYTES)
    sock.sendall(hello(cn))
    try:
        head = recv_exact(sock, HEAD.size)
    except TimeoutError:
        raise not_proved(where, f"no answer to our hello within {sock.gettimeout():g} s") from None
    except OSError:   # ConnectionError included: closed or reset
        raise not_proved(where, "it closed the connection after our hello") from None
    recv_refusal_or(sock, head, where)
    if head != HEAD.pack(HELLO_MAGIC, HELLO_VERSION, CHALLENGE_BYTES, 0):
        raise not_proved(where, "its answer is not a challenge")
    try:
        body = recv_exact(sock, CHALLENGE_BYTES)
    except OSError:
        raise not_proved(where, "its challenge was cut short") from None
    transcript, proof = cn + body[:NONCE_BYTES + ADDR_BYTES], body[NONCE_BYTES + ADDR_BYTES:]
    if not hmac.compare_digest(proof, key.proof("server", transcript)):
        raise not_proved(where, "its proof is wrong")
    at, reached = body[NONCE_BYTES:NONCE_BYTES + ADDR_BYTES], wire_address(sock.getpeername())
    if at != reached:
        raise relayed(where, at, reached)
    sock.sendall(key.proof("client", transcript))
    return key.session(transcript)


class Channel:
    """One data connection: its socket, and after the handshake the session that tags its requests."""

    def __init__(self, sock: socket.socket, session: bytes | None = None):
        self.sock = sock
        self.session = session
        self.seq = 0   #: requests tagged so far: the next one's number

    @classmethod
    def open(cls, host: str, port: int, key: DataKey | None, timeout: float) -> "Channel":
        """A connection to ``host:port``, past the handshake when ``key`` is given (TransportError when
        the server did not prove the secret or refused us, OSError when it is unreachable)."""
        s = socket.create_connection((host, port), timeout=timeout)
        try:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.settimeout(timeout)
            return cls(s, client_handshake(s, key, f"{host}:{port}") if key is not None else None)
        except BaseException:
            s.close()
            raise

    def tag(self, *request) -> bytes:
        """The tag that follows the request made of the buffers ``request`` (its header and ops), and
        counts it; b"" on a connection without a handshake."""
        if self.session is None:
            return b""
        tag = DataKey.tag(self.session, self.seq, b"".join(bytes(memoryview(b).cast("B")) for b in request))
        self.seq += 1
        return tag

    def close(self) -> None:
        self.sock.close()


class _Channels:
    """Up to ``max_channels`` connections to one peer, each used by one thread at a time."""

    def __init__(self, host: str, port: int, max_channels: int, timeout: float, key: DataKey | None = None):
        self.addr = (host, port)
        self.timeout = timeout
        self.key = key
        self.idle: queue.LifoQueue[Channel] = queue.LifoQueue()
        self.slots = threading.Semaphore(max_channels)

    def acquire(self, fresh: bool = False) -> tuple[Channel, bool]:
        """A channel and whether it was pooled (the server may have closed it while idle); a new one
        has shaken hands when there is a key (TransportError when that failed, OSError when the
        peer is unreachable)."""
        if not self.slots.acquire(timeout=self.timeout * 4):
            raise TransportError(f"no free data channel to {self.addr} within "
                                 f"{self.timeout * 4:.0f} s; raise --max-channels")
        if not fresh:
            try:
                return self.idle.get_nowait(), True
            except queue.Empty:
                pass
        try:
            return Channel.open(*self.addr, self.key, self.timeout), False
        except BaseException:
            self.slots.release()
            raise

    def release(self, ch: Channel, healthy: bool) -> None:
        if healthy:
            self.idle.put(ch)
        else:
            ch.close()
        self.slots.release()

    def close(self) -> None:
        while True:
            try:
                self.idle.get_nowait().close()
            except queue.Empty:
                return


class PythonTcpTransport(TcpTransport):
    """The tcp transport with the client side in Python (``native`` False: a node reads through
    :meth:`read_batch`, one request per batch and one channel at a time, always sleeping for the
    reply); its data server is the engine's, the native one."""

    native = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._peers: dict[str, _Channels] = {}
        self._lock = threading.Lock()
        self._req = 0

    def _channels(self, peer: str, info: dict[str, Any]) -> _Channels:
        with self._lock:
            ch = self._peers.get(peer)
            if ch is None:
                ch = self._peers[peer] = _Channels(info["host"], int(info["port"]),
                                                   self.max_channels, self.io_timeout,
                                                   self.credentials.data)
            return ch

    def read_batch(self, peer: str, info: dict[str, Any], ops: np.ndarray, local: list) -> np.ndarray:
        ops = np.asarray(ops, dtype=OP_DTYPE)
        n = len(ops)
        status = np.zeros(n, dtype="<i4")
        views = [memoryview(b).cast("B") for b in local]
        # Refuse locally what could never land: bad local region/range, zero length.
        send_idx = []
        for i in range(n):
            lr, lo, ln = int(ops["local_region"][i]), int(ops["local_offset"][i]), int(ops["length"][i])
            if ln == 0:
                status[i] = Status.ZERO_LENGTH
            elif lr >= len(views) or lo + ln > len(views[lr]):
                status[i] = Status.LOCAL_RANGE
            else:
                send_idx.append(i)
        if not send_idx:
            return status
        sel = ops[send_idx]
        wire = np.zeros(len(sel), dtype=WIRE_OP)
        wire["region"], wire["rkey"] = sel["region"], sel["rkey"]
        wire["offset"], wire["length"] = sel["remote_offset"], sel["length"]
        ch = self._channels(peer, info)
        for attempt in range(2):
            try:
                chan, pooled = ch.acquire(fresh=attempt > 0)
            except TransportError as e:          # its handshake failed: the native client's connect error
                log.warning("%s", e)
                status[send_idx] = Status.PEER_GONE
                return status
            except OSError:
                status[send_idx] = Status.PEER_GONE
                return status
            sock = chan.sock
            healthy, replied = False, False
            try:
                with self._lock:
                    self._req += 1
                    req_id = self._req
                req_head = HEAD.pack(REQ_MAGIC, 0, len(wire), req_id)
                send_iov(sock, [req_head, wire, chan.tag(req_head, wire)])
                first = sock.recv(HEAD.size)
                if not first:
                    raise ConnectionError("peer closed the data connection")
                replied = True
                head = first + recv_exact(sock, HEAD.size - len(first)) if len(first) < HEAD.size else first
                magic, code, m, rid = HEAD.unpack(head)
                # req_id 0: the server refused the connection itself (its hello)
                if magic != REP_MAGIC or (rid != req_id and not (code and rid == 0)):
                    raise ConnectionError(f"unexpected reply {magic!r}/{rid} to request {req_id}")
                if code:
                    (ln,) = struct.unpack("<I", recv_exact(sock, 4))
                    log.warning("peer %s refused a read batch: %s", peer,
                                recv_exact(sock, ln).decode(errors="replace"))
                    status[send_idx] = Status.REFUSED
                    healthy = True
                    return status
                got = np.frombuffer(recv_exact(sock, 4 * m), dtype="<i4")
                status[send_idx] = got
                for j, i in enumerate(send_idx):
                    if got[j] == Status.OK:
                        lr, lo, ln = int(ops["local_region"][i]), int(ops["local_offset"][i]), int(ops["length"][i])
                        recv_into_exact(sock, views[lr][lo:lo + ln])
                healthy = True
                return status
            except (OSError, ConnectionError) as e:
                if pooled and not replied and not isinstance(e, TimeoutError) and attempt == 0:
                    # A pooled channel the server closed while it sat idle: once more on a new one.
                    log.debug("pooled data connection to %s was closed (%s); reconnecting", peer, e)
                    continue
                why = None if replied else pending_refusal(sock)
                if why is not None:             # the server said why it closed the connection
                    log.warning("peer %s refused the connection: %s", peer, why)
                    status[send_idx] = Status.REFUSED
                    return status
                log.warning("data connection to %s failed: %s", peer, e)
                status[send_idx] = Status.CONNECTION
                return status
            finally:
                ch.release(chan, healthy)
        return status

    def forget(self, peer: str) -> None:
        with self._lock:
            ch = self._peers.pop(peer, None)
        if ch:
            ch.close()
        super().forget(peer)

    def close(self) -> None:
        super().close()
        with self._lock:
            peers, self._peers = list(self._peers.values()), {}
        for ch in peers:
            ch.close()
