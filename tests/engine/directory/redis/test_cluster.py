"""The Redis directory on a real three-master Redis Cluster on loopback.

The ``redis_cluster`` fixture (tests/redis_fixtures.py) starts three
``redis-server --cluster-enabled yes`` on random ports, joins them with
``redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes`` (no
persistence), empties it for each test and stops it after the module.
"""
from __future__ import annotations

import json
import subprocess
import time

import peercache
from conftest import BENCH, scaled
from peercache.bench.serve import READY_LINE
from peercache.lab.launch import redis as redis_launch
from redis_fixtures import RoundTrips

SMALL = ["--working-set", "256", "--page-size", "16384"]


def _dbsizes(cluster) -> list[int]:
    out = []
    for port in cluster.ports:
        r = subprocess.run(redis_launch.cli_command(port, "dbsize"), capture_output=True, text=True, timeout=10)
        out.append(int(r.stdout.strip()))
    return out


def test_cluster_is_detected_and_keys_spread_over_every_master(redis_cluster):
    url = redis_cluster.url
    with peercache.Client(directory=url, pool_bytes=8 << 20, page_size=4096) as prod, \
            peercache.connect(directory=url) as cons:
        assert prod.node.discovery.cluster and cons.node.discovery.cluster
        keys = [f"layer/{i}" for i in range(600)]
        prod.put_batch(keys, [bytes([i % 256]) * 200 for i in range(600)])
        sizes = _dbsizes(redis_cluster)
        assert all(n > 50 for n in sizes), sizes         # entries live on all three masters
        trips = RoundTrips(cons.node.discovery)
        got = cons.get_batch(keys)
        assert all(g == bytes([i % 256]) * 200 for i, g in enumerate(got))
        # one round for 600 keys over ~600 slots (every master at once), one for the owner's node id
        # (its member number's, learnt once), one for its lease
        assert trips.n == 3
        trips.n = 0
        assert cons.get_batch(keys[:128]) == got[:128]
        assert trips.n == 1


def test_cluster_owner_only_and_a_silent_node_vanishes(redis_cluster):
    url = redis_cluster.url
    owner = peercache.Client(directory=url, pool_bytes=1 << 20, page_size=4096)
    try:
        with peercache.Client(directory=url, pool_bytes=1 << 20, page_size=4096) as other:
            owner.put_batch(["s1", "s2", "s3"], [b"O" * 8] * 3)
            other.put_batch(["s1", "mine"], [b"X" * 8, b"M" * 8])
            assert other.node.publish_refused == 1
            assert other.get("s1") == b"O" * 8 and other.get("mine") == b"M" * 8
            epoch0 = other.node.discovery.call("members")["epoch"]
            owner.node.membership.stop_heartbeats()   # stops heartbeating
            t = time.monotonic()
            while other.get("s2") is not None and time.monotonic() - t < scaled(15):
                time.sleep(0.1)
            assert other.get("s2") is None and time.monotonic() - t <= scaled(7)
            # the refused key is retried on heartbeats and taken over once its owner is gone
            t = time.monotonic()
            while other.get("s1") != b"X" * 8 and time.monotonic() - t < scaled(5):
                time.sleep(0.1)
            assert other.get("s1") == b"X" * 8
            t = time.monotonic()
            while other.node.discovery.call("members")["epoch"] == epoch0 and time.monotonic() - t < scaled(5):
                time.sleep(0.1)
            assert set(other.node.members()) == {other.node.node_id}
    finally:
        owner.close()


def test_serve_drive_on_a_three_master_cluster(procs, redis_cluster, tmp_path):
    url = redis_cluster.url
    serve = procs.start([*BENCH, "serve", "--directory", url, *SMALL, "--readers", "1"])
    procs.wait_line(serve, READY_LINE)
    assert all(n > 0 for n in _dbsizes(redis_cluster))     # the working set spread over the masters
    out = tmp_path / "drive.json"
    r = subprocess.run([*BENCH, "drive", "--directory", url, *SMALL, "--batch-size", "32", "--duration", "1",
                        "--warmup", "0.3", "--concurrencies", "1,2", "--out", str(out), "--ready-timeout", "10"],
                       capture_output=True, text=True, timeout=90)
    print(r.stdout)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["status"] == "ok"
    for p in doc["points"]:
        assert p["verified"] and p["hit_rate"] == 1.0 and p["errors"] == 0 and p["verify_failures"] == 0
    assert serve.wait(timeout=scaled(10)) == 0


def test_batches_group_by_the_stored_keys_slots(redis_cluster):
    """Keys whose own names share a slot but whose stored entries do not (different lengths) go in
    one batch: each script gets only keys of one slot (else Redis refuses it, CROSSSLOT)."""
    from redis.crc import key_slot

    base = b"x"
    target = key_slot(base)
    twin = next(k for k in (f"long-key-{i}".encode() for i in range(200000)) if key_slot(k) == target)
    assert key_slot(b"pc:e:" + base) != key_slot(b"pc:e:" + twin)
    with peercache.Client(directory=redis_cluster.url, pool_bytes=1 << 20, page_size=4096) as c:
        c.put_batch([base, twin], [b"1" * 8, b"2" * 8])
        assert c.get_batch([base, twin]) == [b"1" * 8, b"2" * 8]
        assert c.node.remove_batch([base, twin]) == 2
        assert c.get_batch([base, twin]) == [None, None]
