"""TCP transport: a one-sided read emulated by a range server.

The producer's data server knows nothing of keys: it checks that each
requested range lies inside an exposed region with the right key and sends
the bytes. Anything else gets an error status, is logged, and the server
keeps serving. This is for functional checks across hosts, never a
performance claim for RDMA.

Wire format (little endian)::

    request : "PCRQ" u32 flags, u32 n, u64 req_id, then n x (u32 region,
              u32 pad, u64 rkey, u64 offset, u64 length)
    reply   : "PCRS" u32 code, u32 n, u64 req_id, then n x i32 status and the
              payloads of the ok ops in order; code != 0 means the whole
              request was refused and a u32-length UTF-8 reason follows.
"""
from __future__ import annotations

import logging
import queue
import socket
import struct
import threading
from typing import Any

import numpy as np

from ..errors import TransportError
from .base import OP_DTYPE, Status, Transport, native_module
from .handles import PeerHandles

log = logging.getLogger(__name__)

REQ_MAGIC = b"PCRQ"
REP_MAGIC = b"PCRS"
HEAD = struct.Struct("<4sIIQ")
WIRE_OP = np.dtype([("region", "<u4"), ("pad", "<u4"), ("rkey", "<u8"),
                    ("offset", "<u8"), ("length", "<u8")])
#: Most ops one request may carry, and most payload bytes one reply may carry.
MAX_OPS = 1 << 16
MAX_REPLY_BYTES = 1 << 31
#: Bound on every blocking socket call of the data path.
DEFAULT_IO_TIMEOUT = 5.0
_IOV_MAX = 512


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
        sent = sock.sendmsg(views[i:i + _IOV_MAX])
        while sent:
            if sent >= len(views[i]):
                sent -= len(views[i])
                i += 1
            else:
                views[i] = views[i][sent:]
                sent = 0


class _Server:
    """Accepts data connections and serves range reads, one thread per connection."""

    def __init__(self, regions: dict[int, tuple[memoryview, int]], bind_host: str, port: int,
                 native: bool | None = None):
        self.regions = regions
        mod, _ = native_module()
        #: the native per-connection loop, when built (no GIL, no Python per request)
        self._mod = mod if native is not False else None
        self._table = None if self._mod is None else self._mod.RegionTable(
            [(rid, rkey, mv) for rid, (mv, rkey) in regions.items()])
        family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
        self.lsock = socket.socket(family, socket.SOCK_STREAM)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.lsock.bind((bind_host, port))
        except OSError as e:
            self.lsock.close()
            raise TransportError(f"tcp data server cannot bind {bind_host}:{port}: {e}") from e
        self.lsock.listen(128)
        self.port = self.lsock.getsockname()[1]
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.refused = 0
        # Set before the thread starts: close() may run before it is scheduled.
        self.lsock.settimeout(0.2)
        self._thread = threading.Thread(target=self._accept, name="tcp-data-accept", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.lsock.accept()
            except socket.timeout:
                continue
            except OSError:
                return  # listening socket closed by close()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="tcp-data-conn", daemon=True).start()

    def _refuse(self, conn: socket.socket, req_id: int, reason: str) -> None:
        self.refused += 1
        log.warning("tcp data server refused a request: %s", reason)
        msg = reason.encode()
        send_iov(conn, [HEAD.pack(REP_MAGIC, 1, 0, req_id), struct.pack("<I", len(msg)), msg])

    def _serve(self, conn: socket.socket) -> None:
        if self._table is not None:
            try:
                conn.setblocking(True)
                self._mod.serve_connection(conn.fileno(), self._table, self._log_refusal)
            finally:
                with self._lock:
                    self._conns.discard(conn)
                conn.close()
            return
        try:
            while not self._stop.is_set():
                try:
                    head = recv_exact(conn, HEAD.size)
                except ConnectionError:
                    return
                magic, _flags, n, req_id = HEAD.unpack(head)
                if magic != REQ_MAGIC:
                    # Framing is lost: say why, then drop only this connection.
                    self._refuse(conn, req_id, f"bad request magic {magic!r}; not a PeerCache client?")
                    return
                if n > MAX_OPS:
                    self._refuse(conn, req_id, f"{n} ops in one request exceeds {MAX_OPS}; split the batch")
                    return
                wire = np.frombuffer(recv_exact(conn, n * WIRE_OP.itemsize), dtype=WIRE_OP)
                status, views = self.check(wire)
                total = sum(len(v) for v in views)
                if total > MAX_REPLY_BYTES:
                    self._refuse(conn, req_id, f"request asks for {total} bytes, more than "
                                 f"{MAX_REPLY_BYTES}; split the batch")
                    continue
                send_iov(conn, [HEAD.pack(REP_MAGIC, 0, n, req_id), status, *views])
        except (OSError, ConnectionError) as e:
            log.info("tcp data connection closed: %s", e)
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    @staticmethod
    def _log_refusal(reason: str) -> None:
        log.warning("tcp data server refused a request: %s", reason)

    @property
    def refused_total(self) -> int:
        """Ops refused by either serving loop."""
        return self.refused + (int(self._table.refused) if self._table is not None else 0)

    def check(self, wire: np.ndarray) -> tuple[np.ndarray, list[memoryview]]:
        """Status per op and the views of the ok ones (no per-key logic)."""
        n = len(wire)
        status = np.full(n, int(Status.BAD_REGION), dtype="<i4")
        size = np.zeros(n, dtype=np.uint64)
        known = np.zeros(n, dtype=bool)
        for rid, (mv, rkey) in self.regions.items():
            hit = (wire["region"] == rid) & (wire["rkey"] == np.uint64(rkey))
            known |= hit
            size[hit] = len(mv)
        off, ln = wire["offset"], wire["length"]
        zero = known & (ln == 0)
        # off > size first, so size - off never wraps where it decides anything.
        outside = known & ~zero & ((off > size) | (ln > size - np.minimum(off, size)))
        good = known & ~zero & ~outside
        status[zero] = Status.ZERO_LENGTH
        status[outside] = Status.OUT_OF_RANGE
        status[good] = Status.OK
        regions = self.regions
        views = [regions[r][0][o:o + k] for r, o, k in
                 zip(wire["region"][good].tolist(), off[good].tolist(), ln[good].tolist())]
        bad = n - len(views)
        if bad:
            self.refused += bad
            log.warning("tcp data server refused %d of %d ops (first status %s)", bad, n,
                        Status(int(status[~good][0])).name)
        return status, views

    def close(self) -> None:
        self._stop.set()
        self.lsock.close()
        with self._lock:
            for c in list(self._conns):
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self._thread.join(timeout=2)


class _Channels:
    """Up to ``max_channels`` connections to one peer, each used by one thread at a time."""

    def __init__(self, host: str, port: int, max_channels: int, timeout: float):
        self.addr = (host, port)
        self.timeout = timeout
        self.idle: queue.LifoQueue[socket.socket] = queue.LifoQueue()
        self.slots = threading.Semaphore(max_channels)

    def acquire(self) -> socket.socket:
        if not self.slots.acquire(timeout=self.timeout * 4):
            raise TransportError(f"no free data channel to {self.addr} within "
                                 f"{self.timeout * 4:.0f} s; raise --max-channels")
        try:
            return self.idle.get_nowait()
        except queue.Empty:
            pass
        try:
            s = socket.create_connection(self.addr, timeout=self.timeout)
        except OSError:
            self.slots.release()
            raise
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.settimeout(self.timeout)
        return s

    def release(self, s: socket.socket, healthy: bool) -> None:
        if healthy:
            self.idle.put(s)
        else:
            s.close()
        self.slots.release()

    def close(self) -> None:
        while True:
            try:
                self.idle.get_nowait().close()
            except queue.Empty:
                return


class TcpTransport(Transport):
    """The tcp transport in pure Python: the reference, and the fallback without the native module."""

    name = "tcp"

    def __init__(self, max_channels: int = 4, io_timeout: float = DEFAULT_IO_TIMEOUT, port: int = 0,
                 native_server: bool | None = None):
        #: None: the native serving loop when built; False: the Python one (the reference)
        self.native_server = native_server
        self.max_channels = max(1, int(max_channels))
        self.io_timeout = io_timeout
        self.port = port
        self._regions: dict[int, tuple[memoryview, int]] = {}
        self._server: _Server | None = None
        self._peers: dict[str, _Channels] = {}
        self._lock = threading.Lock()
        self._req = 0

    def expose(self, region_id: int, buffer, rkey: int, **info: Any) -> None:
        self._regions[region_id] = (memoryview(buffer).cast("B"), rkey)

    def start(self, bind_host: str) -> dict[str, Any]:
        self._server = _Server(self._regions, bind_host, self.port, native=self.native_server)
        return {"host": bind_host, "port": self._server.port}

    @property
    def refused(self) -> int:
        """Ops the data server refused so far."""
        return self._server.refused_total if self._server else 0

    def _channels(self, peer: str, info: dict[str, Any]) -> _Channels:
        with self._lock:
            ch = self._peers.get(peer)
            if ch is None:
                ch = self._peers[peer] = _Channels(info["host"], int(info["port"]),
                                                   self.max_channels, self.io_timeout)
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
        try:
            sock = ch.acquire()
        except OSError:
            status[send_idx] = Status.PEER_GONE
            return status
        healthy = False
        try:
            with self._lock:
                self._req += 1
                req_id = self._req
            send_iov(sock, [HEAD.pack(REQ_MAGIC, 0, len(wire), req_id), wire])
            magic, code, m, rid = HEAD.unpack(recv_exact(sock, HEAD.size))
            if magic != REP_MAGIC or rid != req_id:
                raise ConnectionError(f"unexpected reply {magic!r}/{rid} to request {req_id}")
            if code:
                (ln,) = struct.unpack("<I", recv_exact(sock, 4))
                log.warning("peer %s refused a read batch: %s", peer, recv_exact(sock, ln).decode(errors="replace"))
                status[send_idx] = Status.REFUSED
                return status
            got = np.frombuffer(recv_exact(sock, 4 * m), dtype="<i4")
            status[send_idx] = got
            for j, i in enumerate(send_idx):
                if got[j] == Status.OK:
                    lr, lo, ln = int(ops["local_region"][i]), int(ops["local_offset"][i]), int(ops["length"][i])
                    recv_into_exact(sock, views[lr][lo:lo + ln])
            healthy = True
        except (OSError, ConnectionError) as e:
            log.warning("data connection to %s failed: %s", peer, e)
            status[send_idx] = Status.CONNECTION
        finally:
            ch.release(sock, healthy)
        return status

    def forget(self, peer: str) -> None:
        with self._lock:
            ch = self._peers.pop(peer, None)
        if ch:
            ch.close()

    def close(self) -> None:
        if self._server:
            self._server.close()
            self._server = None
        with self._lock:
            peers, self._peers = list(self._peers.values()), {}
        for ch in peers:
            ch.close()


class NativeTcpTransport(TcpTransport):
    """The tcp transport with the client side in the native module.

    Requests are pipelined on each channel and payloads are received
    straight into the destination buffers without the GIL; the data server
    and the wire format are those of :class:`TcpTransport`.
    """

    native = True

    def __init__(self, max_channels: int = 4, io_timeout: float = DEFAULT_IO_TIMEOUT, port: int = 0,
                 native_server: bool | None = None):
        super().__init__(max_channels=max_channels, io_timeout=io_timeout, port=port,
                         native_server=native_server)
        mod, why = native_module()
        if mod is None:
            raise TransportError(f"native tcp client unavailable: {why}")
        self._mod = mod
        self.handles = PeerHandles(self._connect_native, "tcp")

    def native_peer(self, peer: str, info: dict[str, Any]):
        return self.handles.get(peer, info)

    def _connect_native(self, peer: str, info: dict[str, Any]):
        try:
            return self._mod.tcp_connect(str(info["host"]), int(info["port"]), self.max_channels,
                                         float(self.io_timeout))
        except (KeyError, TypeError, ValueError) as e:
            raise TransportError(f"tcp endpoint info of {peer} is incomplete ({e}); is the producer "
                                 "serving --protocol tcp?") from e
        except ConnectionError as e:
            raise TransportError(f"data endpoint of {peer} unreachable: {e}") from e

    def read_batch(self, peer: str, info: dict[str, Any], ops: np.ndarray, local: list) -> np.ndarray:
        return self.handles.read(peer, info, ops, local)

    def forget(self, peer: str) -> None:
        self.handles.drop(peer)
        super().forget(peer)

    def close(self) -> None:
        self.handles.close()
        super().close()
