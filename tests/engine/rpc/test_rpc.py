import threading
import time

import pytest
import zmq

from peercache.errors import DiscoveryUnreachable, RpcError
from peercache.rpc import MAX_REQUEST_BYTES, RpcClient, RpcServer, pack, unpack


@pytest.fixture
def server(port):
    srv = RpcServer(f"127.0.0.1:{port}", {"echo": lambda m: {"v": m["v"]},
                                          "boom": lambda m: 1 / 0}).start()
    yield srv
    srv.stop()


def raw_request(addr, body: bytes, timeout=3.0):
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(f"tcp://{addr}")
    try:
        s.send_multipart([b"", b"id", body])
        assert s.poll(int(timeout * 1000)), "server did not answer"
        return unpack(s.recv_multipart()[-1])
    finally:
        s.close()


def test_roundtrip_and_unknown_op(server, port):
    c = RpcClient(f"127.0.0.1:{port}")
    assert c.call("echo", v=[1, b"x"])["v"] == [1, b"x"]
    with pytest.raises(RpcError, match="unknown op 'nope'"):
        c.call("nope")
    with pytest.raises(RpcError, match="ZeroDivisionError"):
        c.call("boom")
    assert c.call("echo", v=2)["v"] == 2   # still serving after the failure
    c.close()


def test_malformed_and_oversized_get_error_replies(server, port):
    addr = f"127.0.0.1:{port}"
    assert "not msgpack" in raw_request(addr, b"\xc1\xc1garbage")["error"]
    assert "expected a map" in raw_request(addr, pack([1, 2]))["error"]
    big = raw_request(addr, pack({"op": "echo", "v": b"x" * (MAX_REQUEST_BYTES + 10)}))
    assert not big["ok"] and "exceeds" in big["error"]
    assert raw_request(addr, pack({"op": "echo", "v": 7})) == {"ok": True, "v": 7}


def test_unreachable_discovery_fails_within_bound(port):
    c = RpcClient(f"127.0.0.1:{port}", timeout=0.5, what="discovery")
    t = time.monotonic()
    with pytest.raises(DiscoveryUnreachable, match="no reply from discovery"):
        c.call("lookup", keys=[])
    assert time.monotonic() - t < 3
    c.close()


def test_bad_address_is_explained():
    with pytest.raises(Exception, match="HOST:PORT"):
        RpcClient("localhost")


def _swallowing_server(addr: str):
    """A ROUTER at ``addr`` that answers the first request (so the client has reached it) and takes the
    second without answering; returns (socket, thread), the thread ending once the second came."""
    ctx = zmq.Context.instance()
    r = ctx.socket(zmq.ROUTER)
    r.setsockopt(zmq.LINGER, 0)
    r.bind(f"tcp://{addr}")

    def serve():
        for answer in (True, False):
            assert r.poll(5000), "the client sent nothing"
            ident, empty, rid, body = r.recv_multipart()
            if answer:
                r.send_multipart([ident, empty, rid, pack({"ok": True, "v": unpack(body)["v"]})])
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return r, t


def test_a_call_fails_at_once_when_its_server_goes_away_and_a_later_one_reaches_its_next_incarnation(port):
    """A directory killed while a call waits, then started again at the same address: the call fails as
    soon as the connection is lost, calls while nothing listens fail as soon as a connection is refused
    (not at their 5 s bound), and the first call after the restart is answered."""
    addr = f"127.0.0.1:{port}"
    r, t = _swallowing_server(addr)
    c = RpcClient(addr, timeout=5.0, what="discovery")
    try:
        assert c.call("echo", v=1)["v"] == 1
        got: list = []

        def waiting_call():
            t0 = time.monotonic()
            try:
                c.call("echo", v=2)
            except DiscoveryUnreachable as e:
                got.append((time.monotonic() - t0, str(e)))
        w = threading.Thread(target=waiting_call)
        w.start()
        t.join(5)                         # the request arrived and was not answered
        r.close()                         # the server dies
        w.join(5)
        assert got, "the call waiting on the lost connection did not fail"
        took, why = got[0]
        assert took < 1.0 and "closed the connection" in why and "instead of waiting out its 5.0 s" in why, got
        t0 = time.monotonic()
        with pytest.raises(DiscoveryUnreachable, match="refuses connections .*down or restarting"):
            c.call("echo", v=3)
        assert time.monotonic() - t0 < 1.0
        srv = RpcServer(addr, {"echo": lambda m: {"v": m["v"]}}).start()     # its next incarnation
        try:
            assert c.call("echo", v=4)["v"] == 4
        finally:
            srv.stop()
    finally:
        c.close()


def test_a_server_never_reached_is_waited_for_until_it_starts(port):
    """Refused connections fail a call at once only once the client has reached its server: one not
    reached yet may be starting (a node started beside its directory), and is waited for."""
    addr = f"127.0.0.1:{port}"
    c = RpcClient(addr, timeout=5.0, what="discovery")
    srv = None
    try:
        timer = threading.Timer(0.5, lambda: got.append(RpcServer(addr, {"echo": lambda m: {"v": m["v"]}}).start()))
        got: list = []
        timer.start()
        assert c.call("echo", v=1)["v"] == 1
        timer.join()
        srv = got[0]
    finally:
        c.close()
        if srv is not None:
            srv.stop()
