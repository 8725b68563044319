"""The Redis directory backend against a real redis-server on loopback (no mocks).

URL parsing and the stored location format are pure; everything else talks to
the ``redis_server`` fixture (tests/redis_fixtures.py: a fresh redis-server on
a random 127.0.0.1 port, no persistence, stopped afterwards).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import time

import numpy as np
import pytest

import peercache
from conftest import BENCH, free_port, scaled
from peercache import tags
from peercache.bench.serve import READY_LINE
from peercache.directory.client import EmbeddedDirectory, connect_directory
from peercache.errors import ConfigError, DiscoveryUnreachable, RpcError
from peercache.directory.location import decode_record, encode_record
from peercache.directory.redis.backend import REC, RedisDirectory, not_a_record
from peercache.directory.redis.url import PASSWORD_ENV, is_redis, parse_url
from peercache.rpc import Limits
from redis_fixtures import RoundTrips
from peercache.transport.base import LOC_DTYPE

SMALL = ["--working-set", "64", "--page-size", "16384"]


# -- pure parts --------------------------------------------------------------------------------
def test_url_forms_and_password_sources():
    u = parse_url("redis://127.0.0.1:6390/3", env={})
    assert (u.host, u.port, u.db, u.password, u.ssl, u.prefix, u.cluster) == ("127.0.0.1", 6390, 3, None,
                                                                              False, "pc", None)
    u = parse_url("rediss://alice:p%40ss@cache.example:7000/0?prefix=lab1&cluster=no", env={})
    assert (u.username, u.password, u.ssl, u.prefix, u.cluster) == ("alice", "p@ss", True, "lab1", False)
    assert "p@ss" not in u.safe and "***" in u.safe and u.safe.startswith("rediss://alice:***@")
    assert parse_url("redis://h:1/0", env={PASSWORD_ENV: "fromenv"}).password == "fromenv"
    assert parse_url("redis://:inurl@h:1/0", env={PASSWORD_ENV: "fromenv"}).password == "inurl"
    assert parse_url("redis://h", env={}).port == 6379
    assert is_redis("redis://x:1/0") and is_redis("REDISS://x:1/0") and not is_redis("127.0.0.1:31998")


@pytest.mark.parametrize("url, message", [
    ("redis://127.0.0.1:1/zero", "is not a number"),
    ("redis://:1/0", "names no host"),
    ("redis://h:1/0?colour=red", "unknown parameter"),
    ("redis://h:1/0?prefix=a{b}", "prefix"),
    ("redis://h:1/2?cluster=yes", "only database 0"),
    ("redis://h:99999/0", "Redis URL"),
])
def test_bad_urls_are_config_errors_that_say_what_to_write(url, message):
    with pytest.raises(ConfigError, match="--directory") as e:
        parse_url(url, env={})
    assert message in str(e.value)


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


# -- a real redis-server -------------------------------------------------------------------------
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


def _producer(url, name="p", heartbeat_timeout=5.0):
    """A registered RedisDirectory client (no heartbeats: it lives for its key's TTL) and its id/token."""
    d = RedisDirectory(url, heartbeat_timeout=heartbeat_timeout)
    r = d.call("register", info={"name": name, "regions": [[1, 1 << 30]]})
    return d, r["node_id"], r["token"]


def _publish(d, nid, tok, keys, base=0):
    locs = [[nid, 1, 7, 4096 * (base + i), 64, 64, 3, tags.key_hash(k)] for i, k in enumerate(keys)]
    r = d.call("publish", node_id=nid, token=tok, keys=keys, locs=locs)
    assert r["published"] == len(keys), r
    return locs


def test_lookup_answers_records_as_the_embedded_directory_does(redis_server):
    d, nid, tok = _producer(redis_server.url)
    cons = RedisDirectory(redis_server.url)
    try:
        keys = _keys(5)
        locs = _publish(d, nid, tok, keys)
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


def test_records_of_a_node_gone_read_as_missing_and_its_number_is_forgotten(redis_server):
    url = redis_server.url
    short, sid, stok = _producer(url, "short", heartbeat_timeout=1.0)    # never heartbeats
    stays, nid, tok = _producer(url, "stays")
    cons = RedisDirectory(url)
    try:
        _publish(short, sid, stok, [b"s0", b"s1"])
        _publish(stays, nid, tok, [b"n0"], base=10)
        r = cons.call("lookup", keys=[b"s0", b"n0", b"s1"], recs=True)
        assert len(r["recs"]) == 3 * REC and sorted(r["nids"].values()) == sorted([sid, nid])
        t = time.monotonic()
        while time.monotonic() - t < scaled(5):
            r = cons.call("lookup", keys=[b"s0", b"n0", b"s1"], recs=True)
            if "missing" in r:
                break
            time.sleep(0.1)
        assert np.frombuffer(r["missing"], "<u4").tolist() == [0, 2]     # its entries went with it
        rows = np.frombuffer(r["recs"], LOC_DTYPE)
        assert len(rows) == 1 and int(rows["offset"][0]) == 4096 * 10 and list(r["nids"].values()) == [nid]
        num = int(stays.r.hget("pc:{m}:num", nid))
        stays.call("leave", node_id=nid, token=tok)
        assert stays.r.hget("pc:{m}:ids", num) is None and stays.r.hget("pc:{m}:num", nid) is None
        assert cons.call("lookup", keys=[b"n0"], recs=True)["missing"] == bytes(4)
    finally:
        cons.close()
        short.close()
        stays.close()


def test_a_key_of_a_node_gone_is_taken_over_by_the_next_publisher(redis_server):
    url = redis_server.url
    short, sid, stok = _producer(url, "short", heartbeat_timeout=1.0)    # never heartbeats
    other, oid, otok = _producer(url, "other")
    try:
        _publish(short, sid, stok, [b"t0"])
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


def test_a_silent_node_vanishes_with_its_entries_and_the_epoch_moves(redis_server):
    url = redis_server.url
    prod = peercache.Client(directory=url, pool_bytes=1 << 20, page_size=4096)
    with peercache.connect(directory=url) as cons:
        try:
            prod.put_batch(["v1", "v2"], [b"1" * 8, b"2" * 8])
            assert cons.get("v1") == b"1" * 8
            gone_id = prod.node.node_id
            epoch0 = cons.node.discovery.call("members")["epoch"]
            prod.node.membership.stop_heartbeats()   # the producer stops heartbeating (as if it hung)
            t = time.monotonic()
            while cons.get("v1") is not None and time.monotonic() - t < scaled(15):
                time.sleep(0.1)
            waited = time.monotonic() - t
            assert cons.get("v1") is None and cons.get("v2") is None
            assert waited <= scaled(5.0 + 2.0)      # the node key's TTL is the heartbeat timeout (5 s)
            # the consumer's heartbeat reaps it: out of the members, epoch bumped, entries deleted
            t = time.monotonic()
            while cons.node.discovery.call("members")["epoch"] == epoch0 and time.monotonic() - t < scaled(5):
                time.sleep(0.1)
            m = cons.node.discovery.call("members")
            assert gone_id not in m["nodes"] and m["epoch"] > epoch0
            r = subprocess.run(["redis-cli", "-p", str(redis_server.port), "--scan", "--pattern", "pc:e:*"],
                               capture_output=True, text=True, timeout=10)
            assert r.stdout.strip() == ""
        finally:
            prod.close()


def test_join_and_leave_bump_the_epoch_and_leave_removes_entries(redis_server):
    url = redis_server.url
    with peercache.connect(directory=url) as cons:
        e0 = cons.node.discovery.call("members")["epoch"]
        prod = peercache.Client(directory=url, pool_bytes=1 << 20, page_size=4096)
        prod.put("x", b"x" * 8)
        e1 = cons.node.discovery.call("members")["epoch"]
        assert e1 == e0 + 1 and cons.get("x") == b"x" * 8
        prod.close()
        m = cons.node.discovery.call("members")
        assert m["epoch"] == e1 + 1 and prod.node.node_id not in m["nodes"]
        assert cons.get("x") is None


def test_password_from_url_or_environment(procs, tmp_path, monkeypatch):
    port = free_port()
    srv = procs.start(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                       "--appendonly", "no", "--requirepass", "s3cret", "--dir", str(tmp_path)])
    procs.wait_line(srv, "Ready to accept connections")
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    with pytest.raises(DiscoveryUnreachable, match=PASSWORD_ENV) as e:
        connect_directory(f"redis://127.0.0.1:{port}/0")
    assert f"redis://127.0.0.1:{port}/0" in str(e.value)
    with pytest.raises(DiscoveryUnreachable, match="credentials") as e:
        connect_directory(f"redis://:wrong@127.0.0.1:{port}/0")
    assert "wrong" not in str(e.value).replace("wrong or", "")   # the password is masked
    connect_directory(f"redis://:s3cret@127.0.0.1:{port}/0").close()
    monkeypatch.setenv(PASSWORD_ENV, "s3cret")
    with peercache.Client(directory=f"redis://127.0.0.1:{port}/0", pool_bytes=1 << 20, page_size=4096) as c:
        c.put("p", b"pw" * 4)
        assert c.get("p") == b"pw" * 4


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


def test_meta_with_redis_reaps_expired_nodes(procs, redis_server):
    url = redis_server.url
    meta = procs.start([*BENCH, "meta", "--directory", url, "--heartbeat-timeout", "1"])
    procs.wait_line(meta, "peercache-bench meta: ready on")
    d = RedisDirectory(url, heartbeat_timeout=1.0)
    try:
        r = d.call("register", info={"name": "short-lived"})
        e = r["epoch"]
        t = time.monotonic()
        while d.call("members")["epoch"] == e and time.monotonic() - t < scaled(10):
            time.sleep(0.1)
        m = d.call("members")
        assert r["node_id"] not in m["nodes"] and m["epoch"] == e + 1
    finally:
        d.close()


def test_rediss_tls_with_the_servers_ca(procs, tmp_path):
    """rediss:// against a redis-server with TLS only (a certificate made here for 127.0.0.1)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not found; install it (apt-get install openssl) to make the test certificate")
    key, cert = tmp_path / "k.pem", tmp_path / "c.pem"
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                        "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    port = free_port()
    srv = procs.start(["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
                       "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert),
                       "--tls-auth-clients", "no", "--save", "", "--appendonly", "no", "--dir", str(tmp_path)])
    procs.wait_line(srv, "Ready to accept connections")
    url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}"
    with peercache.Client(directory=url, pool_bytes=1 << 20, page_size=4096) as c:
        c.put("t", b"tls" * 3)
        assert c.get("t") == b"tls" * 3 and c.node.discovery.address.startswith("rediss://")
    with pytest.raises(DiscoveryUnreachable, match="unreachable"):     # plain redis:// to a TLS port
        connect_directory(f"redis://127.0.0.1:{port}/0", timeout=1.0)
