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
