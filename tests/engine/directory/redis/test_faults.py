"""Faults of a Redis directory, on real servers: unreachable at start, killed mid-run, restarted empty.

Every wait is bounded; every process is started by the ``procs`` fixture or
the ``redis_server`` fixture, and ended by them.
"""
from __future__ import annotations

import json
import select
import subprocess
import time

import peercache
from conftest import BENCH, free_port, scaled
from peercache.bench.serve import READY_LINE

SMALL = ["--working-set", "64", "--page-size", "16384"]


def _drive(url, out, *extra):
    return [*BENCH, "drive", "--directory", url, *SMALL, "--batch-size", "8", "--warmup", "0",
            "--out", str(out), "--ready-timeout", "10", *extra]


def test_unreachable_redis_at_start_fails_serve_and_drive_within_5s(tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"       # nothing listens there
    for argv in ([*BENCH, "serve", "--directory", url, *SMALL],
                 _drive(url, tmp_path / "d.json", "--duration", "1")):
        t = time.monotonic()
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        took = time.monotonic() - t
        assert r.returncode == 1, (argv[3], r.stderr)
        assert url in r.stderr and "unreachable" in r.stderr and "redis-server is running" in r.stderr, r.stderr
        print(f"{argv[3]}: exit {r.returncode} after {took:.2f} s: {r.stderr.strip().splitlines()[-1]}")
        assert took < scaled(5.0), (argv[3], took)


def test_redis_killed_mid_run_ends_drive_with_a_clear_error_within_5s(procs, redis_server, tmp_path):
    url = redis_server.url
    serve = procs.start([*BENCH, "serve", "--directory", url, *SMALL, "--readers", "1"])
    procs.wait_line(serve, READY_LINE)
    out = tmp_path / "d.json"
    drive = procs.start(_drive(url, out, "--duration", "60"))
    deadline = time.monotonic() + scaled(30)
    while not _measuring(drive) and time.monotonic() < deadline:
        time.sleep(0.2)
    redis_server.kill()
    t = time.monotonic()
    rc = drive.wait(timeout=scaled(30))
    took = time.monotonic() - t
    print(f"drive: exit {rc} {took:.2f} s after redis-server was killed")
    assert rc == 1
    assert took < scaled(5.0), took
    doc = json.loads(out.read_text())
    assert doc["status"] == "failed"
    assert "unreachable" in doc["error"] and url in doc["error"], doc["error"]


def _measuring(proc) -> bool:
    """Whether drive's progress lines (stderr) reached the measurement phase."""
    if proc.poll() is not None:
        return True
    got = ""
    while select.select([proc.stderr], [], [], 0)[0]:
        line = proc.stderr.readline()
        if not line:
            break
        got += line
    return "measure" in got


def test_redis_restarted_empty_producers_republish_within_a_heartbeat(redis_server):
    url = redis_server.url
    keys = [f"r/{i}" for i in range(64)]
    with peercache.Client(directory=url, pool_bytes=2 << 20, page_size=4096) as prod, \
            peercache.connect(directory=url) as cons:
        prod.put_batch(keys, [bytes([i]) * 50 for i in range(64)])
        assert cons.get_batch(keys) == [bytes([i]) * 50 for i in range(64)]
        node_id = prod.node.node_id
        period = prod.node.heartbeat_interval
        redis_server.restart()                 # a new, empty server on the same port
        t = time.monotonic()
        while time.monotonic() - t < scaled(10):
            try:
                if cons.get_batch(keys) == [bytes([i]) * 50 for i in range(64)]:
                    break
            except peercache.PeerCacheError:
                pass                           # the first request after the restart may see the drop
            time.sleep(0.05)
        took = time.monotonic() - t
        assert cons.get_batch(keys) == [bytes([i]) * 50 for i in range(64)]
        # re-registered and republished by its next heartbeat (one period, plus the round trips)
        assert took <= period + scaled(1.0), took
        print(f"GETs back {took:.2f} s after the empty restart (heartbeat period {period:.1f} s)")
        assert prod.node.node_id == node_id    # same id, reclaimed with its token
        t = time.monotonic()             # the consumer registers again on its own next heartbeat
        while len(cons.node.members()) < 2 and time.monotonic() - t < period + scaled(2.0):
            time.sleep(0.05)
        assert set(cons.node.members()) == {node_id, cons.node.node_id}


def test_drive_resumes_after_redis_restarts_empty(procs, redis_server, tmp_path):
    """serve and drive keep running across an empty restart; GETs come back without restarting them."""
    url = redis_server.url
    serve = procs.start([*BENCH, "serve", "--directory", url, *SMALL, "--readers", "1"])
    procs.wait_line(serve, READY_LINE)
    out = tmp_path / "d.json"
    # a TTL longer than the gap: cached locations keep the reads going while Redis is away
    drive = procs.start(_drive(url, out, "--duration", "6", "--dir-cache-ttl", "30"))
    time.sleep(scaled(3.0))
    redis_server.restart()
    rc = drive.wait(timeout=scaled(60))
    doc = json.loads(out.read_text())
    assert rc == 0, doc["error"]
    p = doc["points"][0]
    print(f"drive across the restart: hit rate {p['hit_rate']}, errors {p['errors']}, status {doc['status']}")
    assert p["hit_rate"] == 1.0 and p["errors"] == 0 and p["verified"]
    assert serve.wait(timeout=scaled(10)) == 0


def test_entries_that_vanish_under_a_live_registration_are_published_again(redis_server):
    """What an asynchronous replica promoted by a failover can lack: the last writes of the master,
    here the second of two publishes (its entries and the publish mark it raised: a replica holds a
    prefix of its master's writes), but not their owner's registration, renewed every heartbeat. The
    producer's next heartbeat reads its mark behind and publishes its pool again. (The Sentinel
    failover that loses them for real: test_sentinel.py.)"""
    url = redis_server.url
    keys = [f"v/{i}" for i in range(32)]
    vals = [bytes([i]) * 40 for i in range(32)]
    with peercache.Client(directory=url, pool_bytes=1 << 20, page_size=4096) as prod, \
            peercache.connect(directory=url, dir_cache_ttl=0) as cons:
        prod.put_batch(keys[:24], vals[:24])
        mark = f"pc:g:{{{prod.node.node_id}}}"
        before = redis_server.cli("get", mark).stdout.strip()
        assert before.isdigit(), before
        prod.put_batch(keys[24:], vals[24:])
        assert cons.get_batch(keys) == vals
        # the second publish's writes, lost: its entries gone, its mark back where the first left it
        r = redis_server.cli("eval", "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('DEL', unpack(KEYS, 2))",
                             str(9), mark, *[f"pc:e:{k}" for k in keys[24:]], before)
        assert r.stdout.strip() == "8", r.stdout + r.stderr
        period = prod.node.heartbeat_interval
        t = time.monotonic()
        got = cons.get_batch(keys)
        while got != vals and time.monotonic() - t < period + scaled(2.0):
            assert all(g is None or g == v for g, v in zip(got, vals))     # never a wrong page
            time.sleep(0.05)
            got = cons.get_batch(keys)
        took = time.monotonic() - t
        print(f"8 entries lost under a live registration: back {took:.2f} s later (heartbeat period {period:g} s)")
        assert got == vals
        assert took <= period + scaled(1.0), took
        assert prod.node.membership.lost_reports == 1
