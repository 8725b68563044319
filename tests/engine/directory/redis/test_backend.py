"""peercache.directory.redis.backend (RedisDirectory: publish, unpublish, lookup, and the parts it
composes) against a real redis-server on loopback (no mocks).

The stored record format is pure; everything else talks to the ``redis_server`` fixture
(tests/redis_fixtures.py: a fresh redis-server on a random 127.0.0.1 port, no persistence,
stopped afterwards).
"""
from __future__ import annotations

import json
import subprocess
import time

import numpy as np
import pytest

import peercache
from peercache import tags
from conftest import BENCH, scaled
from peercache.bench.serve import READY_LINE
from peercache.directory.client import EmbeddedDirectory, connect_directory
from peercache.directory.location import decode_record, encode_record
from peercache.directory.redis.backend import REC, RedisDirectory, not_a_record
from peercache.errors import ConfigError, RpcError
from peercache.rpc import Limits
from peercache.transport.base import LOC_DTYPE
from redis_fixtures import RoundTrips, producer, publish

SMALL = ["--working-set", "64", "--page-size", "16384"]


def test_entries_are_fixed_loc_dtype_records():
    loc = ["0123456789ab", 1, 77, 4096, 100, 4096, 9, (1 << 64) - 1]
    v = encode_record(7, loc)
    assert len(v) == REC == LOC_DTYPE.itemsize and encode_record(7, loc[1:]) == v
    assert decode_record(v) == (7, *loc[1:])
    row = np.frombuffer(v, LOC_DTYPE)[0]          # the stored value is the record the node reads
    assert (int(row["node"]), int(row["offset"]), int(row["key_hash"])) == (7, 4096, (1 << 64) - 1)
    assert decode_record(v[:-1]) is None
    old = bytes((12,)) + b"0123456789ab" + bytes(52)     # what an older PeerCache stored
    marker = not_a_record(old)
    assert len(marker) == 1 and "65-byte entry" in marker[0] and "older PeerCache" in marker[0]


def test_factory_picks_the_backend_and_refuses_unknown_schemes(port):
    d = connect_directory(f"127.0.0.1:{port}")
    assert isinstance(d, EmbeddedDirectory) and d.host == "127.0.0.1"
    d.close()
    with pytest.raises(ConfigError, match="unknown scheme"):
        connect_directory("etcd://127.0.0.1:2379")


def _keys(n, tag="k"):
    return [f"{tag}{i}".encode() for i in range(n)]


def test_put_get_and_lookup_reply_shape(redis_server):
    url = redis_server.url
    with peercache.Client(directory=url, pool_bytes=4 << 20, page_size=4096) as prod, \
            peercache.connect(url) as cons:                 # the URL in discovery_addr's place works too
        keys = [f"page/{i}" for i in range(200)]
        prod.put_batch(keys, [bytes([i % 251]) * (100 + i) for i in range(200)])
        got = cons.get_batch(keys + ["absent"])
        assert got[-1] is None
        assert all(g == bytes([i % 251]) * (100 + i) for i, g in enumerate(got[:-1]))
        reply = cons.node.discovery.call("lookup", keys=[b"page/3", b"absent"])
        assert set(reply) >= {"locs", "nodes", "epoch"} and reply["locs"][1] is None
        loc = reply["locs"][0]
        assert len(loc) == 8 and loc[0] == prod.node.node_id and all(type(x) is int for x in loc[1:])
        assert reply["nodes"][prod.node.node_id]["name"] == prod.node.name
        assert set(cons.node.members()) == {prod.node.node_id, cons.node.node_id}
        assert cons.exists_batch(["page/0", "nope"]) == [True, False]


def test_lookup_answers_records_as_the_embedded_directory_does(redis_server):
    d, nid, tok = producer(redis_server.url)
    cons = RedisDirectory(redis_server.url)
    try:
        keys = _keys(5)
        locs = publish(d, nid, tok, keys)
        r = cons.call("lookup", keys=[keys[0], b"absent", *keys[1:]], recs=True, epoch=None)
        assert set(r) == {"ok", "recs", "nids", "epoch", "missing", "nodes"}
        assert np.frombuffer(r["missing"], "<u4").tolist() == [1]
        (num, owner), = r["nids"].items()
        assert owner == nid and r["nodes"][nid]["name"] == "p"
        rows = np.frombuffer(r["recs"], LOC_DTYPE)
        assert len(r["recs"]) == 5 * REC and (rows["node"] == num).all()
        assert [list(map(int, row))[1:] for row in rows] == [loc[1:] for loc in locs]
        # the caller's epoch is current: no node infos again; all found: no missing
        r2 = cons.call("lookup", keys=keys, recs=True, epoch=r["epoch"])
        assert set(r2) == {"ok", "recs", "nids", "epoch"} and r2["recs"] == r["recs"]
        # the locs form for callers that do not ask for records, from the same values
        old = cons.call("lookup", keys=[keys[0], b"absent"])
        assert old["locs"] == [locs[0], None] and set(old["nodes"]) == {nid}
        # the member number is the node's, kept in its node hash and mapped back to its id
        assert d.r.hget(f"pc:n:{{{nid}}}", "num") == str(num).encode()
        assert d.r.hget("pc:{m}:ids", num) == nid.encode()
    finally:
        cons.close()
        d.close()


def test_a_key_of_a_node_gone_is_taken_over_by_the_next_publisher(redis_server):
    url = redis_server.url
    short, sid, stok = producer(url, "short", heartbeat_timeout=1.0)    # never heartbeats
    other, oid, otok = producer(url, "other")
    try:
        publish(short, sid, stok, [b"t0"])
        loc = [oid, 1, 7, 8192, 64, 64, 3, tags.key_hash(b"t0")]
        r = other.call("publish", node_id=oid, token=otok, keys=[b"t0"], locs=[loc])
        assert r["published"] == 0 and r["refused_index"] == [0]          # its owner is alive
        t = time.monotonic()
        while other.r.exists(f"pc:n:{{{sid}}}") and time.monotonic() - t < scaled(5):
            time.sleep(0.05)
        r = other.call("publish", node_id=oid, token=otok, keys=[b"t0"], locs=[loc])
        assert r["published"] == 1 and "refused" not in r                  # now it is gone: taken over
        got = other.call("lookup", keys=[b"t0"], recs=True)
        assert list(got["nids"].values()) == [oid] and int(np.frombuffer(got["recs"], LOC_DTYPE)["offset"][0]) == 8192
    finally:
        short.close()
        other.close()


def test_a_value_in_the_old_format_is_refused_per_key_and_belongs_to_nobody(redis_server):
    with peercache.Client(directory=redis_server.url, pool_bytes=1 << 20, page_size=4096) as prod, \
            peercache.connect(directory=redis_server.url) as cons:
        prod.put("good", b"g" * 8)
        d = cons.node.discovery
        d.r.set(b"pc:e:legacy", bytes((12,)) + prod.node.node_id.encode() + bytes(52))   # len | id | fields
        bad: list = []
        locs = cons.node.lookup([b"good", b"legacy"], use_cache=False, bad=bad)
        assert locs[0] is not None and locs[0].node_id == prod.node.node_id and locs[1] is None
        assert len(bad) == 1 and bad[0][0] == 1 and "65-byte entry" in bad[0][1] and "older PeerCache" in bad[0][1]
        prod.put("legacy", b"new" * 3)                  # any publisher may overwrite it
        assert cons.get("legacy") == b"new" * 3 and len(d.r.get(b"pc:e:legacy")) == REC


def test_batched_publish_lookup_unpublish_are_one_round_trip_each(redis_server):
    with peercache.Client(directory=redis_server.url, pool_bytes=4 << 20, page_size=4096) as prod, \
            peercache.connect(directory=redis_server.url) as cons:
        trips_p = RoundTrips(prod.node.discovery)
        prod.node.discovery._verified.clear()
        prod.put_batch([k.decode() for k in _keys(128)], [b"x" * 64] * 128)
        assert trips_p.n == 1           # the token check is one HMGET outside the pipeline, then cached
        trips_c = RoundTrips(cons.node.discovery)
        cons.node.lookup(_keys(128), use_cache=False)
        assert trips_c.n == 3       # the first also learns the owner's node id (its number's) and its lease
        trips_c.n = 0
        cons.node.lookup(_keys(128), use_cache=False)
        assert trips_c.n == 1
        trips_p.n = 0
        assert prod.node.remove_batch(_keys(128)) == 128
        assert trips_p.n == 1
        assert cons.get_batch([k.decode() for k in _keys(4)]) == [None] * 4


def test_client_ttl_cache_serves_without_redis_round_trips(redis_server):
    with peercache.Client(directory=redis_server.url, pool_bytes=1 << 20, page_size=4096) as prod, \
            peercache.connect(directory=redis_server.url, dir_cache_ttl=30) as cons:
        prod.put_batch(["a", "b"], [b"A" * 10, b"B" * 10])
        assert cons.get_batch(["a", "b"]) == [b"A" * 10, b"B" * 10]
        trips = RoundTrips(cons.node.discovery)
        for _ in range(5):
            assert cons.get_batch(["a", "b"]) == [b"A" * 10, b"B" * 10]
        assert trips.n == 0


def test_only_the_owner_overwrites_or_unpublishes_and_tokens_are_checked(redis_server):
    url = redis_server.url
    with peercache.Client(directory=url, pool_bytes=1 << 20, page_size=4096) as owner, \
            peercache.Client(directory=url, pool_bytes=1 << 20, page_size=4096) as other:
        owner.put("shared", b"mine" * 4)
        d = other.node.discovery
        loc = [other.node.node_id, 1, other.node.pool.rkey, 0, 4, 4096, 1, 1]
        r = d.call("publish", node_id=other.node.node_id, token=other.node.token, keys=[b"shared", b"free"],
                   locs=[loc, loc], unpublish=[])
        assert r["published"] == 1 and r["refused"] == 1 and r["refused_index"] == [0]
        assert r["refused_keys"] == [b"shared"] and "only the owner" in r["refused_reason"]
        r = d.call("unpublish", node_id=other.node.node_id, token=other.node.token, keys=[b"shared"])
        assert r["unpublished"] == 0
        assert other.get("shared") == b"mine" * 4
        victim = owner.node.node_id
        for op, extra in (("publish", {"keys": [b"shared"], "locs": [loc], "unpublish": []}),
                          ("unpublish", {"keys": [b"shared"]}), ("leave", {}), ("heartbeat", {})):
            with pytest.raises(RpcError, match="wrong token"):
                d.call(op, node_id=victim, token="forged", **extra)
        with pytest.raises(RpcError, match="not the publisher"):
            d.call("publish", node_id=other.node.node_id, token=other.node.token, keys=[b"x"],
                   locs=[[victim, 1, 0, 0, 1, 4096, 1, 1]], unpublish=[])
        with pytest.raises(RpcError, match="lies outside region 1 of"):
            d.call("publish", node_id=other.node.node_id, token=other.node.token, keys=[b"x"],
                   locs=[[other.node.node_id, 1, 0, 1 << 40, 1, 4096, 1, 1]], unpublish=[])
        # a node cannot take over another's id by registering with it
        r = d.call("register", info={"name": "impostor"}, node_id=victim, token="0" * 32)
        assert r["node_id"] != victim
        assert other.get("shared") == b"mine" * 4


def test_limits_are_enforced_and_named(redis_server):
    d = RedisDirectory(redis_server.url, limits=Limits(max_keys_per_request=4, max_key_bytes=8))
    try:
        with pytest.raises(RpcError, match="max_keys_per_request"):
            d.call("lookup", keys=_keys(5))
        with pytest.raises(RpcError, match="max_key_bytes"):
            d.call("lookup", keys=[b"x" * 9])
        with pytest.raises(RpcError, match="byte strings"):
            d.call("lookup", keys=["text"])
        with pytest.raises(RpcError, match="max_node_info_bytes"):
            d.call("register", info={"blob": "x" * 10000})
    finally:
        d.close()


def _drive(url, out, *extra):
    return [*BENCH, "drive", "--directory", url, *SMALL, "--batch-size", "8", "--duration", "1",
            "--warmup", "0.3", "--out", str(out), "--ready-timeout", "10", *extra]


def test_serve_drive_on_redis_verified_full_hits(procs, redis_server, tmp_path):
    url = redis_server.url
    serve = procs.start([*BENCH, "serve", "--directory", url, *SMALL, "--readers", "1", "--layout", "mha"])
    assert url in procs.wait_line(serve, READY_LINE)
    out = tmp_path / "drive.json"
    r = subprocess.run(_drive(url, out, "--layout", "mha", "--concurrencies", "1,2", "--processes", "2"),
                       capture_output=True, text=True, timeout=90)
    print(r.stdout)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["status"] == "ok" and doc["meta"]["directory"] == url
    for p in doc["points"]:
        assert p["verified"] and p["hit_rate"] == 1.0 and p["errors"] == 0 and p["verify_failures"] == 0
    assert "100.00" in r.stdout
    assert serve.wait(timeout=scaled(10)) == 0        # its reader's reader_done came through Redis
