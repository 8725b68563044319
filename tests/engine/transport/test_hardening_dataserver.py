"""The tcp data server under hostile or careless clients: malformed requests, fd exhaustion,
idle and slow connections, floods of bad requests, too many connections.

Each server runs in its own process (``DataServer``) so that a crash, its threads, its open
files and its log are those of the server alone. Every load loop is bounded in count and time,
and only loopback is contacted.
"""
from __future__ import annotations

import json
import logging
import os
import re
import resource
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from peercache.auth import Credentials, DataKey, data_key
from peercache.transport.base import Status, make_ops, native_module
from peercache.transport.tcp import TcpTransport

from conftest import scaled
from oracles.tcp_client import (CHALLENGE_BYTES, HEAD, HELLO_MAGIC, REP_MAGIC, REQ_MAGIC, WIRE_OP, Channel,
                                PythonTcpTransport, client_handshake, hello)

REGION = 3
RKEY = 0x1234_5678_9ABC_DEF0
SIZE = 1 << 20

_SERVER = r"""
import json, logging, signal, sys, threading
import numpy as np
from peercache.transport.tcp import TcpTransport
cfg = json.loads(sys.argv[1])
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
region = (np.arange(cfg["size"]) % 251).astype(np.uint8)
t = TcpTransport(**cfg["opts"])
if cfg.get("secret"):
    from peercache.auth import Credentials
    t.use_credentials(Credentials.of(bytes.fromhex(cfg["secret"])))
t.expose(cfg["region"], region, rkey=cfg["rkey"])
info = t.start("127.0.0.1")
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
print("port", info["port"], flush=True)
stop.wait(cfg["max_s"])
t.close()
print("closed", flush=True)
"""

mod, _why = native_module()
#: The data server is the native event loop (native/server.c): without the module nothing here runs.
pytestmark = pytest.mark.skipif(mod is None, reason=str(_why))


def pattern(off: int, ln: int) -> bytes:
    """The bytes the test server holds at [off, off + ln)."""
    return ((np.arange(off, off + ln) % 251).astype(np.uint8)).tobytes()


class DataServer:
    """A TcpTransport data server in a child process; its log goes to a file."""

    def __init__(self, opts: dict | None = None, nofile: int | None = None,
                 max_s: float = 120.0, secret: bytes | None = None):
        self.log_file = tempfile.NamedTemporaryFile("w+", prefix="dataserver-", suffix=".log")
        cfg = {"opts": opts or {}, "size": SIZE, "region": REGION, "rkey": RKEY,
               "max_s": max_s, "secret": secret.hex() if secret else None}

        def limits():
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.p = subprocess.Popen([sys.executable, "-c", _SERVER, json.dumps(cfg)], stdout=subprocess.PIPE,
                                  stderr=self.log_file, text=True, start_new_session=True,
                                  preexec_fn=limits)
        ready, _, _ = select.select([self.p.stdout], [], [], scaled(20))
        line = self.p.stdout.readline() if ready else ""
        if not line.startswith("port "):
            log = self.log()
            self.kill()
            raise AssertionError(f"data server did not start: {line!r} {log!r}")
        self.port = int(line.split()[1])
        self.pid = self.p.pid

    def alive(self) -> bool:
        return self.p.poll() is None

    def threads(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            return int(next(ln for ln in f if ln.startswith("Threads:")).split()[1])

    def rss_kib(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            return int(next(ln for ln in f if ln.startswith("VmRSS:")).split()[1])

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def log(self) -> str:
        self.log_file.flush()
        with open(self.log_file.name) as f:
            return f.read()

    def stop(self) -> str:
        """SIGTERM, wait for the clean close, return the whole log."""
        if self.alive():
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.p.wait(timeout=scaled(10))
            except subprocess.TimeoutExpired:
                pass
        return self.log()

    def kill(self) -> None:
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.p.wait(timeout=5)
        self.p.stdout.close()
        self.log_file.close()


@pytest.fixture
def servers():
    """Start DataServers with ``servers(opts)``; all are killed at teardown."""
    started: list[DataServer] = []

    def start(opts: dict | None = None, **kw) -> DataServer:
        s = DataServer(opts, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        s.kill()


def wire_req(req_id: int, ops=(), n: int | None = None, magic: bytes = REQ_MAGIC) -> bytes:
    """One raw request; ``ops`` are (region, rkey, offset, length) and ``n`` may lie."""
    w = np.zeros(len(ops), dtype=WIRE_OP)
    for i, (r, k, o, ln) in enumerate(ops):
        w[i] = (r, 0, k, o, ln)
    return HEAD.pack(magic, 0, len(ops) if n is None else n, req_id) + w.tobytes()


def greet(s: socket.socket, secret: bytes) -> Channel:
    """``s`` past the handshake with ``secret``: a Channel whose tag() follows each request."""
    return Channel(s, client_handshake(s, DataKey(data_key(secret)), "the test's data server"))


def send_tagged(ch: Channel, msg: bytes) -> None:
    """One request (header and ops) on ``ch``, with its tag."""
    ch.sock.sendall(msg + ch.tag(msg))


def recv_n(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        k = s.recv(n - len(buf))
        if not k:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += k
    return bytes(buf)


def read_reply(s: socket.socket, lengths: list[int] | None = None):
    """(code, req_id, statuses, payloads) or (code, req_id, reason, None) of one reply."""
    magic, code, n, rid = HEAD.unpack(recv_n(s, HEAD.size))
    assert magic == REP_MAGIC, magic
    if code:
        (ln,) = np.frombuffer(recv_n(s, 4), "<u4")
        return code, rid, recv_n(s, int(ln)).decode(), None
    st = np.frombuffer(recv_n(s, 4 * n), "<i4").tolist()
    lengths = lengths or [0] * n
    return code, rid, st, [recv_n(s, lengths[i]) if st[i] == Status.OK else b"" for i in range(n)]


def closed_within(s: socket.socket, seconds: float) -> bool:
    """True once the server closes ``s`` (EOF or reset) within ``seconds``; data is drained."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        r, _, _ = select.select([s], [], [], max(0.0, end - time.monotonic()))
        if not r:
            return False
        try:
            if not s.recv(65536):
                return True
        except (ConnectionResetError, BrokenPipeError):
            return True
    return False


class Reader:
    """A legitimate client (the native one, or with ``native=False`` the Python one of tests/oracles)
    that checks the bytes."""

    def __init__(self, port: int, native: bool = True, channels: int = 1, io_timeout: float = 3.0,
                 secret: bytes | None = None):
        cls = TcpTransport if native else PythonTcpTransport
        self.t = cls(max_channels=channels, io_timeout=io_timeout)
        if secret:
            self.t.use_credentials(Credentials.of(secret))
        self.info = {"host": "127.0.0.1", "port": port}

    def read(self, off: int = 1000, ln: int = 5000) -> bool:
        ops = make_ops(1)
        ops[0] = (REGION, 0, RKEY, off, ln, 0)
        dest = np.zeros(ln, np.uint8)
        st = self.t.read_batch("srv", self.info, ops, [dest])
        return st.tolist() == [Status.OK] and dest.tobytes() == pattern(off, ln)

    def close(self):
        self.t.close()


def read_ok(port: int, native: bool = True, within: float = 0.0) -> bool:
    """A fresh client's read succeeds (retried until ``within`` seconds passed)."""
    end = time.monotonic() + within
    while True:
        r = Reader(port, native, io_timeout=1.0)
        try:
            if r.read():
                return True
        except Exception:
            pass
        finally:
            r.close()
        if time.monotonic() >= end:
            return False
        time.sleep(0.1)


# ------------------------------------------------------------------------------ defect 1


def test_zero_op_request_is_refused_and_the_server_lives(servers):
    srv = servers()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=scaled(3)) as s:
        s.sendall(wire_req(7, n=0))
        try:
            code, rid, reason, _ = read_reply(s)
            refused = code != 0 and rid == 7 and "no ops" in reason
        except (ConnectionError, OSError):
            refused = True  # a close is an acceptable answer too
        time.sleep(0.05)
        assert srv.alive(), f"server died: rc={srv.p.poll()} (SIGSEGV is -11)"
        assert refused
        # the connection keeps its framing: a good request on it is served
        s.sendall(wire_req(8, [(REGION, RKEY, 10, 20)]))
        code, rid, st, data = read_reply(s, [20])
        assert (code, rid, st, data) == (0, 8, [Status.OK], [pattern(10, 20)])
    assert read_ok(srv.port)
    # a zero-op request as the very first request of many connections in a row
    for i in range(20):
        with socket.create_connection(("127.0.0.1", srv.port), timeout=scaled(3)) as s:
            s.sendall(wire_req(i, n=0))
            read_reply(s)
    assert srv.alive() and read_ok(srv.port)


# ------------------------------------------------------------------------------ defect 2

#: Limits under which connections that never say hello wait as long and as many as they like.
PATIENT = {"hello_timeout": 60.0, "max_greeting": 4096, "max_greeting_per_source": 4096}


def test_accept_keeps_going_after_running_out_of_fds(servers):
    """Under RLIMIT_NOFILE 1024, 1100 connections then closing them: the server accepts again.
    (Connections that never say hello are let wait here as long and as many as they like, so that
    they run the server out of fds; by default they are few and brief: see the flood tests.)"""
    srv = servers(PATIENT, nofile=1024)
    assert read_ok(srv.port)
    socks, failures = [], 0
    deadline = time.monotonic() + scaled(30)
    for _ in range(1100):
        if failures >= 3 or time.monotonic() > deadline:
            break
        try:
            socks.append(socket.create_connection(("127.0.0.1", srv.port), timeout=0.5))
            failures = 0
        except OSError:
            failures += 1
    time.sleep(0.5)   # the server hits EMFILE meanwhile
    assert len(socks) > 900
    for s in socks:
        s.close()
    assert srv.alive()
    assert read_ok(srv.port, within=scaled(10)), "the data server no longer accepts connections"
    assert read_ok(srv.port, native=False)
    log = srv.stop()
    accept_lines = [ln for ln in log.splitlines() if "accept" in ln]
    assert 1 <= len(accept_lines) <= 2, accept_lines   # the failure once, the recovery once
    assert "Too many open files" in accept_lines[0]


# ------------------------------------------------------------------------------ defect 3


def test_idle_connections_do_not_take_a_thread_each(servers):
    srv = servers(PATIENT)
    threads0, rss0 = srv.threads(), srv.rss_kib()
    socks = []
    try:
        for _ in range(1000):
            socks.append(socket.create_connection(("127.0.0.1", srv.port), timeout=scaled(3)))
        end = time.monotonic() + scaled(10)
        while srv.fds() < 1000 and time.monotonic() < end:
            time.sleep(0.05)
        assert srv.fds() >= 1000, "the server did not accept the connections"
        threads = srv.threads()
        assert threads <= threads0 + 2, f"{threads} threads for 1000 idle connections (from {threads0})"
        assert srv.rss_kib() - rss0 < 20 * 1024, (rss0, srv.rss_kib())
        assert read_ok(srv.port)
    finally:
        for s in socks:
            s.close()


def test_idle_connection_is_closed_after_the_idle_timeout(servers):
    srv = servers({"idle_timeout": 0.5})
    with socket.create_connection(("127.0.0.1", srv.port), timeout=scaled(3)) as idle, \
            socket.create_connection(("127.0.0.1", srv.port), timeout=scaled(3)) as busy:
        t0 = time.monotonic()
        # a connection with a request every 0.2 s outlives the timeout
        for i in range(8):
            busy.sendall(wire_req(i, [(REGION, RKEY, i, 3)]))
            assert read_reply(busy, [3])[2] == [Status.OK]
            time.sleep(0.2)
        assert closed_within(idle, scaled(3))
        assert 0.4 < time.monotonic() - t0 < scaled(4)
    # clients whose pooled channel was closed while idle reconnect on their own
    for nat in (True, False):
        r = Reader(srv.port, native=nat)
        try:
            assert r.read()
            time.sleep(1.0)
            assert r.read() and r.read(0, SIZE)
        finally:
            r.close()


def test_slowloris_is_dropped_after_the_request_deadline(servers):
    srv = servers({"request_timeout": 1.0, "idle_timeout": 30.0})
    reader = Reader(srv.port)
    req = wire_req(1, [(REGION, RKEY, 0, 8)])
    try:
        # header one byte every 0.3 s (a 20-byte header would take 6 s)
        with socket.create_connection(("127.0.0.1", srv.port), timeout=scaled(3)) as s:
            t0, dropped = time.monotonic(), False
            for b in req:
                try:
                    s.send(bytes([b]))
                except OSError:
                    dropped = True
                    break
                if closed_within(s, 0.3):
                    dropped = True
                    break
                assert reader.read()   # served meanwhile
            assert dropped and time.monotonic() - t0 < scaled(3)
        # a whole header, then a body that never comes
        with socket.create_connection(("127.0.0.1", srv.port), timeout=scaled(3)) as s:
            s.sendall(req[:HEAD.size + 5])
            assert closed_within(s, scaled(3))
        # a reader that never drains a 64 MiB reply does not hold the server for ever
        with socket.create_connection(("127.0.0.1", srv.port), timeout=scaled(3)) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
            s.sendall(wire_req(2, [(REGION, RKEY, 0, SIZE)] * 64))
            time.sleep(2.5)
            got = 0
            s.settimeout(scaled(3))
            try:
                while k := s.recv(1 << 20):
                    got += len(k)
            except (ConnectionResetError, TimeoutError):
                pass
            assert got < 64 * SIZE
        assert reader.read() and srv.alive()
    finally:
        reader.close()


_COUNT = re.compile(r"(\d+) ops with a bad region or key")


def test_bad_key_flood_logs_a_few_counted_lines(servers):
    srv = servers()
    n, per = 20000, 500
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=scaled(5)) as s:
        for base in range(0, n, per):
            s.sendall(b"".join(wire_req(base + i, [(REGION, RKEY ^ 1, 0, 8)]) for i in range(per)))
            for i in range(per):
                code, rid, st, _ = read_reply(s)
                assert (code, rid, st) == (0, base + i, [Status.BAD_REGION])
            assert time.monotonic() - t0 < scaled(10)
    assert read_ok(srv.port)
    log = srv.stop()
    lines = [ln for ln in log.splitlines() if "refus" in ln]
    assert 1 <= len(lines) <= 3, f"{len(lines)} refusal lines, first: {lines[:3]}"
    assert sum(int(m) for ln in lines for m in _COUNT.findall(ln)) == n, lines


def test_connections_over_the_maximum_are_refused(servers):
    """max_connections counts greeted connections (here: those that sent a first request, the
    server having no secret); one more is told so, and closed."""
    srv = servers({"max_connections": 4})
    reader = Reader(srv.port)       # one channel
    extra = []
    try:
        assert reader.read()
        held = [socket.create_connection(("127.0.0.1", srv.port), timeout=scaled(3)) for _ in range(3)]
        for h in held:                  # the held ones are real connections
            h.sendall(wire_req(1, [(REGION, RKEY, 5, 5)]))
            assert read_reply(h, [5])[3] == [pattern(5, 5)]
        for _ in range(5):
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=scaled(3))
            extra.append(s)
            s.sendall(wire_req(2, [(REGION, RKEY, 0, 8)]))
            assert "at its connection limit (4 connections)" in refused_connection(s)
        assert reader.read()            # the client under the maximum is still served
        for h in held:
            h.sendall(wire_req(3, [(REGION, RKEY, 5, 5)]))
            assert read_reply(h, [5])[3] == [pattern(5, 5)]
        held.pop().close()
        time.sleep(0.2)
        assert read_ok(srv.port)        # a freed slot is usable again
        for h in held:
            h.close()
    finally:
        reader.close()
        for s in extra:
            s.close()
    log = srv.stop()
    lines = [ln for ln in log.splitlines() if "over the" in ln]
    assert lines and len(lines) <= 2 and "5 connections" in lines[0], lines


def test_known_refusals_still_disclose_nothing(servers):
    srv = servers()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=scaled(3)) as s:
        cases = [((REGION, RKEY ^ 2, 0, 8), Status.BAD_REGION), ((REGION + 1, RKEY, 0, 8), Status.BAD_REGION),
                 ((REGION, RKEY, SIZE - 4, 8), Status.OUT_OF_RANGE), ((REGION, RKEY, SIZE + 1, 1), Status.OUT_OF_RANGE),
                 ((REGION, RKEY, 2**64 - 1, 2), Status.OUT_OF_RANGE), ((REGION, RKEY, 8, 2**64 - 4), Status.OUT_OF_RANGE),
                 ((REGION, RKEY, 0, 0), Status.ZERO_LENGTH)]
        s.sendall(wire_req(1, [c for c, _ in cases] + [(REGION, RKEY, 100, 4)]))
        code, rid, st, data = read_reply(s, [8] * len(cases) + [4])
        assert st == [w for _, w in cases] + [Status.OK] and data[-1] == pattern(100, 4)
        assert not any(data[:-1])
        # more than 2 GiB in one request: the whole request is refused, the connection stays
        s.sendall(wire_req(2, [(REGION, RKEY, 0, SIZE)] * 2049))
        code, rid, reason, _ = read_reply(s)
        assert code != 0 and rid == 2 and "split the batch" in reason
        s.sendall(wire_req(3, [(REGION, RKEY, 0, 3)]))
        assert read_reply(s, [3])[3] == [pattern(0, 3)]
    assert srv.alive()


# ------------------------------------------------------------------------------ defect 4, data plane

SECRET = b"correct horse battery staple 42"
OTHER = b"an entirely different secret 99"
#: The clients: the native one and the pure-Python one.
CLIENTS = [pytest.param(True, id="native-client"),
           pytest.param(False, id="python-client")]


def refused_connection(s: socket.socket) -> str:
    """The reason of the connection-level refusal (req_id 0) ``s`` gets; asserts it is then closed."""
    code, rid, reason, _ = read_reply(s)
    assert code != 0 and rid == 0, (code, rid, reason)
    assert closed_within(s, scaled(3)), "the refused connection was left open"
    return reason


@pytest.mark.parametrize("client", CLIENTS)
def test_with_a_secret_only_a_client_holding_it_reads(servers, client):
    srv = servers(secret=SECRET)
    ok = Reader(srv.port, client, secret=SECRET)
    try:
        assert ok.read() and ok.read(0, 100)
    finally:
        ok.close()
    # no secret: its first request is refused; another secret: the server's proof fails, so the
    # client sends nothing and reads nothing (its connect fails: PEER_GONE)
    for secret, want in ((None, Status.REFUSED), (OTHER, Status.PEER_GONE)):
        bad = Reader(srv.port, client, secret=secret)
        try:
            ops = make_ops(1)
            ops[0] = (REGION, 0, RKEY, 0, 4096, 0)
            dest = np.zeros(4096, np.uint8)
            st = bad.t.read_batch("srv", bad.info, ops, [dest])
            assert st.tolist() == [want], (secret, st)
            assert not dest.any(), "bytes were disclosed to a client without the secret"
        finally:
            bad.close()
    assert srv.alive() and read_ok(srv.port) is False   # no secret: still refused
    log = srv.stop()
    assert "did not open with the handshake" in log and "left after our challenge" in log, log


def test_a_request_or_a_wrong_hello_first_is_refused_and_closed(servers):
    srv = servers(secret=SECRET)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=scaled(3)) as s:
        s.sendall(wire_req(7, [(REGION, RKEY, 0, 64)]))
        assert "needs the cluster secret" in refused_connection(s)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=scaled(3)) as s:
        s.sendall(HEAD.pack(HELLO_MAGIC, 1, 32, 0) + bytes(32))   # version 1: the token in the clear
        assert "hello version 1 (a token sent in the clear) is refused" in refused_connection(s)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=scaled(3)) as s:
        s.sendall(HEAD.pack(HELLO_MAGIC, 3, 32, 0) + bytes(32))
        assert "unsupported hello (version 3, 32 bytes)" in refused_connection(s)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=scaled(3)) as s:
        s.sendall(HEAD.pack(HELLO_MAGIC, 2, 1 << 30, 0))          # a huge "nonce" is never awaited
        assert "unsupported hello" in refused_connection(s)
    # a proof that is not the one of the secret (nor of the nonces): refused before any request
    with socket.create_connection(("127.0.0.1", srv.port), timeout=scaled(3)) as s:
        s.sendall(hello(os.urandom(32)))
        recv_n(s, HEAD.size + CHALLENGE_BYTES)                      # the challenge
        s.sendall(DataKey(data_key(OTHER)).proof("client", bytes(82)) + wire_req(8, [(REGION, RKEY, 0, 64)]))
        assert "wrong handshake proof" in refused_connection(s)
    # the right secret: the requests after the handshake, each with its tag, are served
    with socket.create_connection(("127.0.0.1", srv.port), timeout=scaled(3)) as s:
        ch = greet(s, SECRET)
        send_tagged(ch, wire_req(9, [(REGION, RKEY, 10, 64)]))
        assert read_reply(s, [64]) == (0, 9, [Status.OK], [pattern(10, 64)])
        send_tagged(ch, wire_req(10, n=0))                         # refused, the connection goes on
        assert read_reply(s)[2] == "request carries no ops"
        send_tagged(ch, wire_req(11, [(REGION, RKEY, 0, 8)]))
        assert read_reply(s, [8]) == (0, 11, [Status.OK], [pattern(0, 8)])
    assert srv.alive()


def test_a_hello_split_byte_by_byte_is_admitted(servers):
    srv = servers(secret=SECRET)
    key = DataKey(data_key(SECRET))
    cn = os.urandom(32)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=scaled(3)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def dribble(msg):
            for i in range(len(msg)):
                s.sendall(msg[i:i + 1])
                time.sleep(0.001)

        dribble(hello(cn))
        challenge = recv_n(s, HEAD.size + CHALLENGE_BYTES)[HEAD.size:]
        transcript = cn + challenge[:-32]                            # cn || sn || address
        assert challenge[-32:] == key.proof("server", transcript)
        ch = Channel(s, key.session(transcript))
        msg = wire_req(5, [(REGION, RKEY, 0, 16)])
        dribble(key.proof("client", transcript) + msg + ch.tag(msg))
        assert read_reply(s, [16])[2:] == ([Status.OK], [pattern(0, 16)])


@pytest.mark.parametrize("client", CLIENTS)
def test_a_server_without_a_secret_refuses_a_hello_and_the_client_says_why(servers, client, caplog):
    """A server without the secret cannot prove it: a client holding one reads nothing from it, and
    its log says why (it was the server that refused)."""
    srv = servers()
    r = Reader(srv.port, client, secret=SECRET)
    try:
        with caplog.at_level(logging.WARNING):
            assert not r.read()
    finally:
        r.close()
    assert f"127.0.0.1:{srv.port} refused the connection: this data server holds no cluster secret" in caplog.text


def test_a_node_with_a_secret_serves_its_pool_only_to_secret_holders(port):
    """End to end: the producer's data server shakes hands with the key the node derived from its secret."""
    import peercache
    addr = f"127.0.0.1:{port}"
    with peercache.Client(addr, host_discovery=True, pool_bytes=8 * 4160, page_size=4096,
                          auth_key=SECRET) as prod, \
            peercache.Client(addr, page_size=4096, auth_key=SECRET) as cons:
        page = bytes(range(256)) * 16
        prod.put(b"k", page)
        assert cons.get(b"k") == page
        node = prod.node
        info = node.info["data"]
        with socket.create_connection((info["host"], info["port"]), timeout=scaled(3)) as s:
            s.sendall(wire_req(1, [(node.pool.region_id, node.pool.rkey, 0, 4096)]))
            assert "needs the cluster secret" in refused_connection(s)


# ------------------------------------------------------------------------------ a flood without the secret
# (a probe found 1,100 idle connections without the secret kept a drive holding it out)

def _flood(port: int, n: int, seconds: float, source: str | None = None) -> list[socket.socket]:
    """Up to ``n`` connections that never send a byte, opened within ``seconds`` (bounded)."""
    socks: list[socket.socket] = []
    end = time.monotonic() + seconds
    while len(socks) < n and time.monotonic() < end:
        try:
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=0.5,
                                                  source_address=(source, 0) if source else None))
        except OSError:
            time.sleep(0.01)
    return socks


def _still_open(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the server has not closed (nothing readable, or data but no EOF)."""
    n = 0
    for s in socks:
        p = select.poll()                  # not select(): the flood's fds pass 1024
        p.register(s, select.POLLIN)
        if not p.poll(0):
            n += 1
            continue
        try:
            if s.recv(4096, socket.MSG_PEEK):
                n += 1
        except OSError:
            pass
    return n


def test_a_flood_without_the_secret_does_not_keep_a_secret_holder_out(servers):
    """1,100 connections that never say hello, held open, from the same address as the real client:
    they wait in a small budget of their own (the oldest closed first, each for 2 s at most), so a
    client holding the secret is served all through, and the server's fds stay few."""
    srv = servers(secret=SECRET)
    fds0 = srv.fds()
    flood: list[socket.socket] = []
    served = []
    try:
        t0 = time.monotonic()
        for _ in range(11):                               # 11 x 100 = 1,100, each round a new client
            flood += _flood(srv.port, 100, scaled(5))
            r = Reader(srv.port, secret=SECRET, io_timeout=scaled(3))
            try:
                served.append(r.read())
            finally:
                r.close()
        took = time.monotonic() - t0
        peak = srv.fds() - fds0
        open_now = _still_open(flood)
        print(f"{len(flood)} silent connections in {took:.1f} s; the secret holder's reads: {served}; "
              f"server fds above idle: {peak}; flood connections still open: {open_now}")
        assert len(flood) >= 1000
        assert all(served), served
        assert peak <= 128 + 16, peak                     # the greeting budget, not the flood
        assert open_now <= 128, open_now
        assert closed_within_all(flood, scaled(2.0) + 2.0), "connections without a hello were kept"
        assert srv.alive() and read_ok(srv.port) is False  # still: no secret, no bytes
        stats_log = srv.stop()
        assert "to make room for newer ones" in stats_log or "did not finish their handshake within" in stats_log, \
            stats_log
    finally:
        for s in flood:
            s.close()


def closed_within_all(socks: list[socket.socket], seconds: float) -> bool:
    """Whether the server closed every one of ``socks`` within ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if _still_open(socks) == 0:
            return True
        time.sleep(0.1)
    return _still_open(socks) == 0


def test_one_address_flooding_cannot_push_out_another_addresss_waiting_connections(servers):
    """Per source address at most max_greeting_per_source connections wait for their hello: a flood
    from 127.0.0.2 closes its own oldest, never the few that 127.0.0.3 keeps waiting."""
    srv = servers({"max_greeting": 64, "max_greeting_per_source": 8, "hello_timeout": 20.0,
                           "server_workers": 1}, secret=SECRET)
    quiet = _flood(srv.port, 6, scaled(5), source="127.0.0.3")
    loud = _flood(srv.port, 200, scaled(10), source="127.0.0.2")
    try:
        time.sleep(0.3)
        kept_loud, kept_quiet = _still_open(loud), _still_open(quiet)
        print(f"127.0.0.2 opened {len(loud)}, {kept_loud} wait; 127.0.0.3 opened {len(quiet)}, {kept_quiet} wait")
        assert len(loud) >= 150 and kept_loud <= 8, kept_loud
        assert kept_quiet == len(quiet) == 6
        # those that wait are real: one of them that shakes hands now is served
        s = next(s for s in quiet if _still_open([s]))
        send_tagged(greet(s, SECRET), wire_req(4, [(REGION, RKEY, 7, 9)]))
        assert read_reply(s, [9])[2:] == ([Status.OK], [pattern(7, 9)])
    finally:
        for s in quiet + loud:
            s.close()


def test_a_connection_without_a_hello_is_closed_after_the_hello_timeout(servers):
    srv = servers(secret=SECRET)           # the default: 2 s
    with socket.create_connection(("127.0.0.1", srv.port), timeout=scaled(3)) as s:
        t = time.monotonic()
        s.sendall(hello(bytes(32))[:10])   # part of a hello, then nothing
        assert closed_within(s, scaled(2.0) + 2.0)
        took = time.monotonic() - t
    print(f"closed {took:.2f} s after connecting")
    assert 1.5 <= took <= scaled(2.0) + 2.0, took
    assert srv.alive() and Reader(srv.port, secret=SECRET).read()
    assert "1 connections that did not finish their handshake within 2 s" in srv.stop()


@pytest.mark.parametrize("client", CLIENTS)
def test_a_client_over_the_connection_limit_is_told_so(servers, client, caplog):
    """Not 'Broken pipe', nor an auth hint: the reason the server gave."""
    srv = servers({"max_connections": 1}, secret=SECRET)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=scaled(3)) as held:
        send_tagged(greet(held, SECRET), wire_req(1, [(REGION, RKEY, 0, 4)]))
        assert read_reply(held, [4])[2] == [Status.OK]
        r = Reader(srv.port, client, secret=SECRET)
        try:
            with caplog.at_level(logging.WARNING):
                assert not r.read()
        finally:
            r.close()
    text = caplog.text
    print(text.strip().splitlines()[-1])
    assert "the data server is at its connection limit (1 connections)" in text, text
    assert "Broken pipe" not in text and "auth" not in text, text


# ------------------------------------------------------------------------------ slow readers
# (a probe found about 3.25 MiB of serve's memory per connection whose client reads a little)

def _kernel_send_queues(port: int) -> int | None:
    """Bytes the kernel holds in the send queues of the server's side of ``port``'s connections
    (``ss -tm``'s wmem_queued), or None without ``ss``."""
    try:
        out = subprocess.run(["ss", "-tmnH", "state", "established", f"sport = :{port}"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return sum(int(w) for w in re.findall(r"skmem:\(r\d+,rb\d+,t\d+,tb\d+,f\d+,w(\d+)", out))


def _server_closed(s: socket.socket) -> bool:
    """Whether the server closed ``s`` (its FIN or reset came), read from the socket's TCP state
    without reading its data (reading would make a slow reader a fast one)."""
    state = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
    return state != 1          # TCP_ESTABLISHED


def test_slow_readers_hold_a_bounded_reply_memory_and_are_dropped(servers):
    """40 clients each ask for 65,536 ops (4 MiB) and read 1 KiB every 0.5 s: the server's memory
    for their replies (its buffers and the kernel's send queues) stays within reply_memory, the
    requests beyond it wait, and within two request_timeouts (one waiting, one replying) every
    slow reader is dropped (its reply made too little progress) or refused (its request waited
    too long); a real client is served again right after."""
    cap, timeout, n = 32 << 20, 3.0, 40
    srv = servers({"reply_memory": cap, "request_timeout": timeout})
    req = wire_req(1, [(REGION, RKEY, (i * 64) % SIZE, 64) for i in range(65536)])
    time.sleep(0.3)
    rss0 = srv.rss_kib() << 10
    slow: list[socket.socket] = []
    peak_rss = peak_kernel = 0
    try:
        for _ in range(n):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", srv.port))
            s.sendall(req)
            s.setblocking(False)
            slow.append(s)
        t0 = time.monotonic()
        # a request may wait up to one timeout for memory, then its reply gets one more
        bound = scaled(2 * timeout) + 6.0
        open_ = list(slow)
        while open_ and time.monotonic() - t0 < bound:              # bounded: about 24 rounds
            for s in open_:
                try:
                    s.recv(1024)
                except OSError:
                    pass
            time.sleep(0.5)
            peak_rss = max(peak_rss, (srv.rss_kib() << 10) - rss0)
            peak_kernel = max(peak_kernel, _kernel_send_queues(srv.port) or 0)
            open_ = [s for s in open_ if not _server_closed(s)]
        took = time.monotonic() - t0
        print(f"{n} slow readers: peak server memory +{peak_rss / 2**20:.1f} MiB, kernel send queues "
              f"{peak_kernel / 2**20:.1f} MiB ({(peak_rss + peak_kernel) / 2**20 / n:.2f} MiB a connection; "
              f"cap {cap >> 20} MiB); all dropped or refused after {took:.1f} s "
              f"(still open: {len(open_)})")
        assert not open_, f"{len(open_)} slow readers still connected after {took:.1f} s"
        assert peak_rss + peak_kernel <= cap + (24 << 20), (peak_rss, peak_kernel)
        assert read_ok(srv.port, within=scaled(timeout) + 2.0)
        assert srv.alive()
        stats = srv.stop()
        assert "waited for reply memory" in stats and "slower than" in stats, stats
    finally:
        for s in slow:
            s.close()


# ------------------------------------------------------------------------------ end to end: serve and drive

def _strong_keyfile(tmp_path) -> tuple[str, bytes]:
    import secrets
    secret = secrets.token_hex(32).encode()
    p = tmp_path / "cluster.key"
    p.write_bytes(secret + b"\n")
    p.chmod(0o600)
    return str(p), secret


def test_a_drive_with_the_secret_connects_during_a_flood_without_it(procs, port, tmp_path):
    """serve with a secret; a client without it keeps 1,100 silent connections open to the data port,
    opening a new one for each the server closes, while drive (holding the secret) starts, connects
    and reads every page. Before: drive failed with 'sending a read request ... Broken pipe'."""
    import threading

    from conftest import BENCH
    from peercache.bench.serve import READY_LINE
    from peercache.node import Node

    key, secret = _strong_keyfile(tmp_path)
    addr = f"127.0.0.1:{port}"
    small = ["--working-set", "64", "--page-size", "16384"]
    serve = procs.start([*BENCH, "serve", "--discovery-addr", addr, *small, "--readers", "1",
                         "--auth-key-file", key])
    procs.wait_line(serve, READY_LINE)
    with Node(addr, auth_key=secret, name="probe") as probe:
        data_port = next(i["data"]["port"] for i in probe.members().values() if i.get("data"))
    flood: list[socket.socket] = []
    stop = threading.Event()
    opened = [0]

    def keep_flooding():
        # 1,100 held open; each one the server closes is opened again, up to 100 every 0.1 s
        # (bounded: 8,000 connections or 60 s in all)
        end = time.monotonic() + 60
        while not stop.is_set() and opened[0] < 8000 and time.monotonic() < end:
            if len(flood) >= 1100:
                time.sleep(0.1)
                gone = [s for s in flood if _server_closed(s)]
                for s in gone[:100]:
                    flood.remove(s)
                    s.close()
                continue
            try:
                flood.append(socket.create_connection(("127.0.0.1", data_port), timeout=0.5))
                opened[0] += 1
            except OSError:
                time.sleep(0.01)

    flooder = threading.Thread(target=keep_flooding, daemon=True)
    flooder.start()
    try:
        end = time.monotonic() + scaled(10)
        while opened[0] < 1100 and time.monotonic() < end:
            time.sleep(0.05)
        assert opened[0] >= 1100, opened[0]
        out = tmp_path / "d.json"
        r = subprocess.run([*BENCH, "drive", "--discovery-addr", addr, *small, "--batch-size", "8",
                            "--duration", "2", "--warmup", "0.2", "--out", str(out), "--ready-timeout", "10",
                            "--auth-key-file", key], capture_output=True, text=True, timeout=120)
        during = opened[0]
    finally:
        stop.set()
        flooder.join(timeout=10)
        for s in flood:
            s.close()
    doc = json.loads(out.read_text())
    p = doc["points"][0] if doc["points"] else {}
    print(f"drive rc {r.returncode} while the flood had opened {during} connections: hit rate "
          f"{p.get('hit_rate')}, errors {p.get('errors')}, {p.get('gb_per_s')} GB/s; {doc['error']}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert p["hit_rate"] == 1.0 and p["errors"] == 0 and p["verified"]
    assert during >= 1100
    assert serve.wait(timeout=scaled(10)) == 0


def test_serve_raises_its_open_file_limit_and_says_when_it_is_still_low(procs, port):
    """A soft limit of 256 under a hard one of 512: serve raises it to 512, and says that is below
    what its data server may need (1,024 connections + those waiting for their hello)."""
    from conftest import BENCH
    from peercache.bench.serve import READY_LINE

    def low():
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 512))

    serve = procs.start([*BENCH, "serve", "--discovery-addr", f"127.0.0.1:{port}", "--working-set", "8",
                         "--page-size", "4096", "--readers", "0"], preexec_fn=low)
    procs.wait_line(serve, READY_LINE)
    with open(f"/proc/{serve.pid}/limits") as f:
        soft = next(ln for ln in f if ln.startswith("Max open files")).split()[3]
    os.kill(serve.pid, signal.SIGTERM)
    serve.wait(timeout=scaled(10))
    err = serve.stderr.read()
    print(f"soft limit now {soft}; serve said: {err.strip().splitlines()[0] if err.strip() else ''}")
    assert soft == "512"
    assert "open-file limit is 512" in err and "raised from 256" in err and "ulimit -Hn" in err, err
