"""peercache.directory.redis.membership: register, heartbeat, leave, members and reaping, with
member numbers, against a real redis-server on loopback."""
from __future__ import annotations

import subprocess
import time

import numpy as np

import peercache
from conftest import BENCH, scaled
from peercache.directory.redis.backend import REC, RedisDirectory
from peercache.transport.base import LOC_DTYPE
from redis_fixtures import producer, publish

def test_records_of_a_node_gone_read_as_missing_and_its_number_is_forgotten(redis_server):
    url = redis_server.url
    short, sid, stok = producer(url, "short", heartbeat_timeout=1.0)    # never heartbeats
    stays, nid, tok = producer(url, "stays")
    cons = RedisDirectory(url)
    try:
        publish(short, sid, stok, [b"s0", b"s1"])
        publish(stays, nid, tok, [b"n0"], base=10)
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
