"""The native tcp client's reply poll (native/tcp.c): a bounded poll before the blocking receive.

What is checked: reads are the same bytes whichever way the client waits; with a poll budget the
replies are caught by the poll (its counters say so), with 0 every wait sleeps; a silent peer makes
the poll back off to sleeping at once; bad settings are refused naming the option."""
import threading
import time

import numpy as np
import pytest

from peercache.pool import Pool
from peercache.transport.base import Status, make_ops, native_module
from peercache.transport.tcp import DEFAULT_POLL_US, TcpTransport, TransportError

mod, why = native_module()
pytestmark = pytest.mark.skipif(mod is None, reason=str(why))
RKEY = 0x51


@pytest.fixture
def producer():
    pool = Pool(4, 4096)
    pool.bytes[:] = (np.arange(pool.size) % 253).astype(np.uint8)
    prod = TcpTransport()
    prod.expose(2, pool.mm, RKEY)
    info = prod.start("127.0.0.1")
    yield pool, info
    prod.close()
    pool.close()


def _reads(peer, pool, n: int) -> None:
    ops = make_ops(1)
    dest = np.zeros(4096, np.uint8)
    st = np.zeros(1, np.int32)
    for i in range(n):
        off = (i * 4096) % (pool.size - 4096)
        ops[0] = (2, 0, RKEY, off, 4096, 0)
        assert peer.read_batch(ops, [dest], st) is None and st[0] == Status.OK
        assert (dest == pool.bytes[off:off + 4096]).all()


def test_default_polls_and_zero_sleeps_with_the_same_bytes(producer, monkeypatch):
    pool, info = producer
    monkeypatch.delenv("PEERCACHE_TCP_POLL_US", raising=False)
    waits = {}
    for poll in (None, 200_000, 0):
        cons = TcpTransport(max_channels=1, poll_us=poll)
        assert cons.poll_us == (DEFAULT_POLL_US if poll is None else poll)
        peer = cons.native_peer("p", info)
        _reads(peer, pool, 200)
        waits[poll] = peer.wait_stats()
        cons.close()
    assert waits[0] == {"polled": 0, "slept": 200, "missed": 0}             # 0: every wait sleeps at once
    # a 200 ms budget: every loopback reply is caught by the poll
    assert waits[200_000] == {"polled": 200, "slept": 0, "missed": 0}
    assert waits[None]["polled"] + waits[None]["slept"] == 200


def test_a_slow_peer_makes_the_poll_back_off():
    """Replies that come later than the poll budget: after 8 polls in a row ran out, the client
    sleeps at once (for the next 256 waits), so a slow peer costs little CPU."""
    import socket
    import struct
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)

    def slow_server():                  # a PeerCache reply to each request, 3 ms late
        c, _ = lsock.accept()
        with c:
            while True:
                head = b""
                while len(head) < 20:
                    got = c.recv(20 - len(head))
                    if not got:
                        return
                    head += got
                (n,) = struct.unpack_from("<I", head, 8)
                body = b""
                while len(body) < 32 * n:
                    body += c.recv(32 * n - len(body))
                length = struct.unpack_from("<Q", body, 24)[0]
                time.sleep(0.003)
                c.sendall(b"PCRS" + struct.pack("<IIQ", 0, 1, struct.unpack_from("<Q", head, 12)[0])
                          + struct.pack("<i", 0) + b"\x07" * length)

    t = threading.Thread(target=slow_server, daemon=True)
    t.start()
    try:
        peer = mod.tcp_connect("127.0.0.1", lsock.getsockname()[1], 1, 5.0, None, 100)
        ops = make_ops(1)
        ops[0] = (2, 0, RKEY, 0, 64, 0)
        dest, st = np.zeros(64, np.uint8), np.zeros(1, np.int32)
        for _ in range(30):
            assert peer.read_batch(ops, [dest], st) is None and st[0] == Status.OK and (dest == 7).all()
        w = peer.wait_stats()
        assert w == {"polled": 0, "slept": 30, "missed": 8}, w
        peer.close()
    finally:
        lsock.close()


def test_bad_poll_settings_are_refused_naming_the_option(monkeypatch):
    with pytest.raises(TransportError, match="--tcp-poll-us"):
        TcpTransport(poll_us=-1)
    monkeypatch.setenv("PEERCACHE_TCP_POLL_US", "fast")
    with pytest.raises(TransportError, match="PEERCACHE_TCP_POLL_US"):
        TcpTransport()
    with pytest.raises(ValueError, match="poll_us must be 0..1000000"):
        mod.tcp_connect("127.0.0.1", 1, 1, 1.0, None, 2_000_000)


def _server(poll_us: int):
    pool = Pool(4, 4096)
    pool.bytes[:] = (np.arange(pool.size) % 251).astype(np.uint8)
    prod = TcpTransport(poll_us=poll_us)
    prod.expose(2, pool.mm, RKEY)
    return pool, prod, prod.start("127.0.0.1")


@pytest.mark.parametrize("poll_us", [200_000, 0])
def test_the_data_server_polls_for_the_next_request_only_when_asked(poll_us):
    """After serving, a worker polls for the next request (poll_caught counts the wake-ups the poll caught);
    with 0 it sleeps at once and never polls. The bytes are the same either way."""
    pool, prod, info = _server(poll_us)
    cons = TcpTransport(max_channels=1, poll_us=200_000)
    try:
        _reads(cons.native_peer("p", info), pool, 200)
        st = prod.server_stats()
        assert st["served"] >= 200
        if poll_us:   # every request after the first came while its worker polled (a 200 ms budget)
            assert st["poll_caught"] >= 190 and st["poll_missed"] == 0, st
        else:
            assert st["poll_caught"] == 0 and st["poll_missed"] == 0, st
    finally:
        cons.close()
        prod.close()
        pool.close()


def test_the_data_servers_poll_backs_off_against_a_slow_client():
    """A client slower than the poll: each poll runs out; after 8 in a row (POLL_MISSES, native/server.c) the
    next 256 wake-ups sleep at once, so a slow client costs at most 8 polls, not one per request.

    On a loaded machine the worker can lose its CPU in the middle of a poll for longer than the client's
    pause, and then that poll catches the next request and starts the count of misses again; a caught poll
    buys at most 8 more. Without the back-off every one of the 25 wake-ups would poll."""
    pool, prod, info = _server(1000)
    cons = TcpTransport(max_channels=1, poll_us=0)
    try:
        peer = cons.native_peer("p", info)
        for _ in range(24):
            _reads(peer, pool, 1)
            time.sleep(0.02)   # 20 x the server's 1 ms poll
        st = prod.server_stats()
        caught, missed = st["poll_caught"], st["poll_missed"]
        assert st["served"] >= 24 and missed >= 8 and caught <= 2, st
        assert caught + missed <= 8 * (caught + 1), st
    finally:
        cons.close()
        prod.close()
        pool.close()
