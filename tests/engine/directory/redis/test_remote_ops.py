"""Extra ops through Redis (serve's ``reader_done``) against a real redis-server on loopback:
the serving thread outlives malformed requests, and a request's expiry is on Redis's clock, so a
sender whose wall clock is off still gets its answer (issue 36, finding 5)."""
from __future__ import annotations

import json
import logging
import threading
import time

import msgpack
import pytest
import redis

import peercache
from peercache.errors import RpcError
from peercache.rpc import pack

OP = "reader_done"


def _serving(url):
    """A serving node (answers OP with how many it saw) and a peer that sends it."""
    server = peercache.Client(directory=url)
    peer = peercache.connect(directory=url)
    seen: list[str] = []
    server.node.add_handler(OP, lambda msg: seen.append(msg["node_id"]) or {"n": len(seen)})
    return server, peer, seen


def _op_thread(server) -> threading.Thread:
    return server.node.directory._op_thread


def _redis_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return sec * 1000 + usec // 1000


def _malformed(r: redis.Redis) -> list:
    """What anyone who can write to Redis may push onto an op list; none of it is a request."""
    ok_msg = {"op": OP, "node_id": "x", "token": "y"}
    future = _redis_ms(r) + 60_000
    return [
        b"garbage \xff\x00 not msgpack",
        json.dumps({"rid": "ab", "msg": ok_msg, "deadline": 1}).encode(),
        pack([1, 2, 3]),
        pack("a string"),
        pack({}),
        pack({"rid": "ab", "msg": ok_msg, "deadline": "soon"}),        # the finding's request
        pack({"rid": "ab", "msg": ok_msg, "expires_ms": "soon"}),
        pack({"rid": "ab", "msg": ok_msg, "expires_ms": True}),
        pack({"rid": "ab", "msg": ok_msg, "expires_ms": None}),
        pack({"rid": "ab", "msg": ok_msg, "expires_ms": 1.5e300}),
        pack({"rid": 7, "msg": ok_msg, "expires_ms": future}),
        pack({"rid": "../evil key", "msg": ok_msg, "expires_ms": future}),
        pack({"rid": "a" * 5000, "msg": ok_msg, "expires_ms": future}),
        pack({"rid": "ab", "msg": ["op", OP], "expires_ms": future}),
        pack({"rid": "ab", "msg": {"op": [OP]}, "expires_ms": future}),     # unhashable op
        pack({"rid": "ab", "msg": {"op": {"a": 1}}, "expires_ms": future}),
        pack({"rid": "ab", "msg": {}, "expires_ms": future}),
        pack({"rid": "ab", "expires_ms": future}),
        msgpack.packb({1: 2, b"rid": b"ab"}, use_bin_type=True),
        b"\xdd\xff\xff\xff\xff",                                        # an array claiming 4 G items
    ]


def test_malformed_op_requests_are_dropped_and_the_next_good_one_is_answered(redis_server, caplog):
    r = redis.Redis(port=redis_server.port)
    server, peer, seen = _serving(redis_server.url)
    try:
        bad = _malformed(r)
        key = f"pc:{{m}}:op:{OP}"
        with caplog.at_level(logging.WARNING, logger="peercache.directory.redis_backend"):
            r.rpush(key, *bad)
            t0 = time.monotonic()
            while r.llen(key) and time.monotonic() - t0 < 10:
                time.sleep(0.02)
            assert r.llen(key) == 0, "the serving thread stopped taking requests"
            assert peer.node.call(OP, timeout=5)["n"] == 1          # the good one after them is answered
        assert seen == [peer.node.node_id]
        assert _op_thread(server).is_alive()
        dropped = [m.getMessage() for m in caplog.records if "dropped a malformed op request" in m.getMessage()]
        assert len(dropped) == len(bad), "one log line per dropped request, each saying why"
        assert any("'expires_ms' 'soon'" in m for m in dropped)
        assert any("not msgpack" in m for m in dropped) and any("'rid'" in m for m in dropped)
        # Nothing was answered for them: no reply key but the good one's (already taken).
        assert not list(r.scan_iter("pc:{m}:re:*"))
    finally:
        peer.close()
        server.close()


@pytest.mark.parametrize("skew_s", [-60.0, 60.0])
def test_a_sender_whose_wall_clock_is_off_by_a_minute_is_still_answered(redis_server, monkeypatch, skew_s):
    server, peer, seen = _serving(redis_server.url)
    real = time.time
    try:
        # Every thread but the serving one reads a clock skew_s off: the sender is on another host.
        monkeypatch.setattr(time, "time",
                            lambda: real() + (0.0 if threading.current_thread().name == "redis-ops" else skew_s))
        assert peer.node.call(OP, timeout=5)["n"] == 1
        assert peer.node.call(OP, timeout=5)["n"] == 2
        assert seen == [peer.node.node_id] * 2
    finally:
        monkeypatch.setattr(time, "time", real)
        peer.close()
        server.close()


def test_a_request_past_its_expiry_on_redis_clock_goes_unanswered(redis_server):
    r = redis.Redis(port=redis_server.port)
    server, peer, seen = _serving(redis_server.url)
    try:
        msg = {"op": OP, "node_id": peer.node.node_id, "token": peer.node.token}
        now = _redis_ms(r)
        r.rpush(f"pc:{{m}}:op:{OP}", pack({"rid": "0a", "msg": msg, "expires_ms": now - 1000}),
                pack({"rid": "0b", "msg": msg, "expires_ms": now + 60_000}))
        t0 = time.monotonic()
        while r.llen("pc:{m}:re:0b") == 0 and time.monotonic() - t0 < 10:
            time.sleep(0.02)
        assert r.llen("pc:{m}:re:0b") == 1 and r.llen("pc:{m}:re:0a") == 0
        assert seen == [peer.node.node_id]
    finally:
        peer.close()
        server.close()


def test_on_a_cluster_the_expiry_is_read_from_the_node_that_holds_the_op_list(redis_cluster, monkeypatch):
    server, peer, seen = _serving(redis_cluster.url)
    real = time.time
    try:
        assert server.node.directory.cluster
        monkeypatch.setattr(time, "time",
                            lambda: real() + (0.0 if threading.current_thread().name == "redis-ops" else -60.0))
        assert peer.node.call(OP, timeout=5)["n"] == 1
        assert seen == [peer.node.node_id]
    finally:
        monkeypatch.setattr(time, "time", real)
        peer.close()
        server.close()


def test_reader_done_reaches_a_serving_node_through_redis(redis_server):
    url = redis_server.url
    seen = []
    with peercache.Client(directory=url) as server, peercache.connect(directory=url) as peer:
        server.node.add_handler("reader_done", lambda msg: seen.append(msg["node_id"]) or {"n": len(seen)})
        assert peer.node.call("reader_done", summary={"status": "ok"})["n"] == 1
        assert seen == [peer.node.node_id]
        with pytest.raises(RpcError, match="wrong token"):
            peer.node.discovery.call("reader_done", node_id=peer.node.node_id, token="forged")
        with pytest.raises(RpcError, match="no node answered 'nobody_serves'"):
            peer.node.call("nobody_serves", timeout=0.5)
