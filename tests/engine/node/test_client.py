import threading
import time

import numpy as np
import pytest

import peercache
from peercache.errors import ConfigError, DiscoveryUnreachable
from peercache.node import Get


@pytest.fixture
def cluster(port):
    addr = f"127.0.0.1:{port}"
    producer = peercache.Client(addr, host_discovery=True, pool_bytes=64 * 4160, page_size=4096)
    consumer = peercache.Client(addr, dir_cache_ttl=30.0, page_size=4096)
    yield addr, producer, consumer
    consumer.close()
    producer.close()


def test_put_get_exists_and_miss(cluster):
    _, prod, cons = cluster
    prod.put_batch(["a", b"b"], [b"alpha", bytearray(b"beta")])
    assert cons.get("a") == b"alpha" and cons.get(b"b") == b"beta"
    assert cons.get("unknown") is None                      # a miss, not an error
    assert cons.exists_batch(["a", "nope", "b"]) == [True, False, True]
    assert cons.get_batch(["b", "zz", "a"]) == [b"beta", None, b"alpha"]


def test_get_into_caller_buffer(cluster):
    _, prod, cons = cluster
    prod.put("k", bytes(range(200)))
    buf = np.zeros(256, dtype=np.uint8)
    assert cons.get("k", out=buf) == 200
    assert bytes(buf[:200]) == bytes(range(200))
    small = bytearray(100)
    with pytest.raises(ConfigError, match="larger than the output buffer"):
        cons.get("k", out=small)
    with pytest.raises(ConfigError, match="read-only"):
        cons.get("k", out=b"\0" * 300)


def test_stale_cached_location_never_yields_wrong_bytes(cluster):
    _, prod, cons = cluster
    prod.put("old", b"O" * 100)
    assert cons.get("old") == b"O" * 100         # location now cached for 30 s
    for i in range(64):                          # evict "old" and reuse its slot
        prod.put(f"fill{i}", bytes([i]) * 100)
    assert prod.node.pool.ref(b"old") is None
    assert cons.get("old") is None               # tag mismatch -> fresh lookup -> miss
    prod.put("old", b"N" * 50)                   # republished elsewhere
    assert cons.get("old") == b"N" * 50


def test_reads_during_rewrites_are_hits_with_right_bytes_or_misses(cluster):
    _, prod, cons = cluster
    stop = threading.Event()
    writes = [0]

    def writer():
        i = 0
        while not stop.is_set() and i < 20000:
            i += 1
            prod.put("hot", bytes([i % 251]) * 4096)
            writes[0] = i

    prod.put("hot", bytes([0]) * 4096)
    t = threading.Thread(target=writer)
    t.start()
    hits = 0
    try:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            v = cons.get("hot")
            if v is not None:
                hits += 1
                assert v == v[:1] * 4096, "torn page returned as a hit"
    finally:
        stop.set()
        t.join(10)
    assert hits > 0 and writes[0] > 0


def test_put_without_pool_is_explained(cluster):
    _, _, cons = cluster
    with pytest.raises(ConfigError, match="no pool"):
        cons.put("x", b"1")


def test_unreachable_discovery_fails_fast(port):
    t = time.monotonic()
    with pytest.raises(DiscoveryUnreachable, match="check that it is running"):
        peercache.Client(f"127.0.0.1:{port}", timeout=0.5)
    assert time.monotonic() - t < 5


def test_node_that_stops_heartbeating_is_dropped(port):
    from peercache.node import Node
    addr = f"127.0.0.1:{port}"
    hub = Node(addr, host_discovery=True, heartbeat_interval=0.1, heartbeat_timeout=0.5)
    prod = Node(addr, pool_slots=4, slot_capacity=64, heartbeat_interval=0.1, heartbeat_timeout=0.5)
    try:
        prod.put_batch([b"k"], [b"v"])
        assert hub.exists_batch([b"k"]) == [True]
        prod.membership.stop_heartbeats()             # heartbeats stop, process stays
        deadline = time.monotonic() + 5
        while hub.exists_batch([b"k"]) == [True] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert hub.exists_batch([b"k"]) == [False]
        assert prod.node_id not in hub.members()
    finally:
        prod.close(leave=False)
        hub.close()


def test_mha_batch_into_offsets(cluster):
    _, prod, cons = cluster
    keys = [b"p/k", b"p/v", b"q/k"]
    prod.put_batch(keys, [b"K" * 10, b"V" * 20, b"Q" * 30])
    dest = np.zeros(3 * 4096, dtype=np.uint8)
    r = cons.node.get_batch_into(keys + [b"none"], dest, [0, 4096, 8192, 0])
    assert r.status.tolist() == [Get.HIT, Get.HIT, Get.HIT, Get.MISS]
    assert r.lengths.tolist()[:3] == [10, 20, 30] and r.generations.tolist()[:3] == [1, 1, 1]
    assert bytes(dest[4096:4116]) == b"V" * 20 and bytes(dest[8192:8222]) == b"Q" * 30


def test_standalone_meta_process(procs, port):
    from conftest import BENCH
    addr = f"127.0.0.1:{port}"
    meta = procs.start([*BENCH, "meta", "--discovery-addr", addr])
    procs.wait_line(meta, "ready")
    with peercache.Client(addr, pool_bytes=8 * 4160, page_size=4096) as prod, \
            peercache.Client(addr, page_size=4096) as cons:
        prod.put("m", b"from a producer that does not host discovery")
        assert cons.get("m") == b"from a producer that does not host discovery"
        assert len(cons.node.members()) == 2
