"""The Redis directory through Redis Sentinel (``redis+sentinel://``), on real servers on loopback: a
master, its replica and three sentinels (peercache.lab.launch.redis.SentinelSet, the ``redis_sentinel``
fixture), with failure detection short enough for a test (SENTINEL_DOWN_AFTER_MS).

The failover tests SIGKILL the master while a consumer reads with verification, and measure how long
the sentinels took to promote the replica, how long reads failed, the entries lost and the wrong
pages (printed: ``pytest -s``, or the captured output of a failure). Every entry is on the replica
before the kill (``WAIT``): Redis replicates asynchronously, and what a producer published in the
last moments before a crash can be lost (see docs/directory.md). Every wait is bounded; every
process is started by the fixtures and ended by them.
"""
from __future__ import annotations

import json
import threading
import time

import pytest

import peercache
from conftest import BENCH, free_port, scaled
from peercache.bench.drive.bounds import IO_TIMEOUT_S
from peercache.bench.serve import READY_LINE
from peercache.directory.client import connect_directory
from peercache.errors import DiscoveryUnreachable
from peercache.lab.launch import redis as redis_launch
from redis_fixtures import SENTINEL_PASSWORD, bucket_list, outage_s, read_until_whole

SMALL = ["--working-set", "64", "--page-size", "16384"]
#: The sentinels promote the replica within this (down-after-milliseconds, 1 s, plus their agreement
#: and election; about 2-3 s measured on loopback).
PROMOTE_BOUND_S = 15.0
#: Reads resume within this after the sentinels name the new master.
RESUME_AFTER_PROMOTION_S = 2.0
#: drive's window: about 1 s before the kill, the failover, and reads after it.
DRIVE_S = 12.0
#: drive's timeline bucket (ms): the resolution of the unavailability it measures.
BUCKET_MS = 100


def _replicated(master: redis_launch.RedisServer) -> None:
    """Wait until the replica acknowledged everything written to ``master`` (a probe write, then WAIT 1
    in its connection: WAIT alone, on a connection of its own, answers at once; bounded)."""
    master.replicated(1, timeout=scaled(5.0))


def _entries(server: redis_launch.RedisServer) -> int:
    """How many directory entries (``pc:e:*``) ``server`` holds."""
    r = server.cli("eval", "return #redis.call('KEYS', ARGV[1])", "0", "pc:e:*")
    assert r.returncode == 0 and r.stdout.strip().isdigit(), r.stdout + r.stderr
    return int(r.stdout)


class _Promotion:
    """When the sentinels name a new master after ``old`` died, measured in a thread from ``t0``."""

    def __init__(self, sentinel_set: redis_launch.SentinelSet, old: int, t0: float):
        self.port: int | None = None
        self.seconds: float | None = None
        self.error: Exception | None = None

        def watch():
            try:
                self.port = sentinel_set.wait_master(other_than=old, timeout=scaled(PROMOTE_BOUND_S))
                self.seconds = time.monotonic() - t0
            except redis_launch.RedisLaunchError as e:
                self.error = e
        self._t = threading.Thread(target=watch, daemon=True)
        self._t.start()

    def result(self) -> tuple[int, float]:
        self._t.join(timeout=scaled(PROMOTE_BOUND_S) + 10)
        assert self.error is None and self.port is not None, self.error
        return self.port, self.seconds


def test_serve_and_drive_ride_out_a_sigkilled_master(procs, redis_sentinel, tmp_path, monkeypatch):
    """serve publishes, drive reads with verification (--faults-expected, no directory cache, a
    timeline), the master is SIGKILLed: the replica is promoted, reads resume, nothing is lost or
    wrong, serve still hears drive's end through the new master, and no document holds the password."""
    monkeypatch.delenv("PEERCACHE_REDIS_PASSWORD", raising=False)
    ss, url = redis_sentinel, redis_sentinel.url
    where = ["--directory", url, "--discovery-addr", f"127.0.0.1:{free_port()}"]
    serve_out, out = tmp_path / "serve.json", tmp_path / "drive.json"
    serve = procs.start([*BENCH, "serve", *where, *SMALL, "--readers", "1", "--out", str(serve_out)])
    procs.wait_line(serve, READY_LINE)
    old = ss.servers[0]
    _replicated(old)
    published = _entries(old)
    drive = procs.start([*BENCH, "drive", *where, *SMALL, "--batch-size", "8", "--warmup", "0",
                         "--duration", f"{scaled(DRIVE_S):g}", "--faults-expected", "--timeline-ms", str(BUCKET_MS),
                         "--dir-cache-ttl", "0", "--ready-timeout", "10",
                         "--out", str(out)])
    err: list[str] = []
    threading.Thread(target=lambda: err.extend(drive.stderr), daemon=True).start()
    deadline = time.monotonic() + scaled(30)
    while not any("measure" in ln for ln in list(err)) and drive.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any("measure" in ln for ln in list(err)), f"drive did not reach its window (rc {drive.poll()}): {err}"
    time.sleep(1.0)                                  # reads in the window before the fault
    t_kill, wall_kill = time.monotonic(), time.time()
    old.kill()
    promotion = _Promotion(ss, old.port, t_kill)
    new, promoted_s = promotion.result()
    lost = published - _entries(ss.server(new))      # now: serve unpublishes its entries when drive is done
    rc = drive.wait(timeout=scaled(DRIVE_S) + scaled(30))
    text = out.read_text()
    doc = json.loads(text)
    assert rc == 0, (doc.get("error"), "".join(err)[-2000:])
    p = doc["points"][0]
    tl = p["timeline"]
    kill_t = wall_kill - tl["start"]
    bucket_s = tl["bucket_ms"] / 1000
    after = [b for b in tl["buckets"] if b["t"] + bucket_s > kill_t]
    unavailable_s = outage_s(after, kill_t, bucket_s)
    print(f"sentinel failover under drive: promoted in {promoted_s:.2f} s; reads failing or missing for "
          f"{unavailable_s:.2f} s ({p['errors']} keys errored, {sum(b['misses'] for b in after)} missed, "
          f"longest stall {tl['max_stall_s']:.2f} s); entries lost {lost} of {published}; wrong pages "
          f"{p['verify_failures']}; first error: {p.get('first_error')}")
    assert after and after[-1]["hits"] == after[-1]["keys"] > 0, "reads did not resume before drive's end"
    assert promoted_s <= scaled(PROMOTE_BOUND_S)
    assert unavailable_s <= promoted_s + scaled(RESUME_AFTER_PROMOTION_S), (
        f"reads failing or missing for {unavailable_s:.2f} s, promoted in {promoted_s:.2f} s; the buckets after "
        f"the kill (s after it, keys, hits, misses, errors): {bucket_list(after, kill_t)}")
    assert tl["max_stall_s"] <= IO_TIMEOUT_S + scaled(1.0)   # no call waited past its bound
    assert p["verify_failures"] == 0 and p["verified"] and p["redirected"] == 0
    assert lost == 0
    assert p["errors"] == 0 or ":***@" in p["first_error"]
    assert serve.wait(timeout=scaled(30)) == 0       # drive's reader_done reached it through the new master
    for doc_text in (text, serve_out.read_text()):
        assert SENTINEL_PASSWORD not in doc_text
        assert "redis+sentinel://:***@127.0.0.1:" in json.loads(doc_text)["meta"]["command"]
    assert SENTINEL_PASSWORD not in "".join(err)


def test_library_nodes_follow_a_failover_and_publish_to_the_new_master(redis_sentinel):
    """peercache.connect / Client over redis+sentinel://: reads across a SIGKILLed master (each call
    ends within its bound, none returns a wrong page), then new pages published on the new master."""
    ss, url = redis_sentinel, redis_sentinel.url
    keys = [f"s/{i}" for i in range(128)]
    vals = [i.to_bytes(2, "little") * 100 for i in range(128)]
    timeout = 2.0
    with peercache.Client(directory=url, pool_bytes=4 << 20, page_size=4096, timeout=timeout) as prod, \
            peercache.connect(directory=url, dir_cache_ttl=0, timeout=timeout) as cons:
        prod.put_batch(keys, vals)
        assert cons.get_batch(keys) == vals
        old = ss.servers[0]
        _replicated(old)
        t0 = time.monotonic()
        old.kill()
        promotion = _Promotion(ss, old.port, t0)
        r = read_until_whole(cons, keys, vals, t0, scaled(PROMOTE_BOUND_S + RESUME_AFTER_PROMOTION_S))
        wrong, failed, longest, resumed, first_error = r.wrong, r.failed, r.longest, r.back, r.first_error
        new, promoted_s = promotion.result()
        print(f"sentinel failover, library nodes: promoted in {promoted_s:.2f} s, reads back after "
              f"{'never' if resumed is None else f'{resumed:.2f}'} s ({failed} calls failed, the longest call {longest:.2f} s), wrong pages {wrong}; "
              f"first error: {first_error}")
        assert resumed is not None and resumed <= promoted_s + scaled(RESUME_AFTER_PROMOTION_S)
        assert wrong == 0
        assert longest <= timeout + scaled(1.0)
        assert first_error is None or (SENTINEL_PASSWORD not in first_error and ":***@" in first_error)
        more = [f"after/{i}" for i in range(32)]
        prod.put_batch(more, [b"n" * 64] * 32)           # scripts loaded again on the new master
        assert cons.get_batch(more) == [b"n" * 64] * 32
        assert _entries(ss.server(new)) == len(keys) + len(more)
        assert set(cons.node.members()) >= {prod.node.node_id}


#: The producer's registration TTL in the lost-writes test: longer than the failover, so that what the
#: new master lacks is entries alone (a lost registration: test_faults.py's empty restart).
LOST_WRITES_HEARTBEAT_TIMEOUT_S = 20.0


def test_entries_a_failover_lost_are_published_again_within_a_heartbeat(redis_sentinel):
    """The master acknowledges a publish its replica never receives (the replica's link cut just
    before: launch.redis.cut_replica), then is SIGKILLed: the sentinels promote a replica that lacks
    those entries while the producer's registration survives on it. The producer's first heartbeat to
    the new master reads its publish mark behind and publishes its pool again; the consumer's reads all
    hit again, none wrong."""
    ss, url = redis_sentinel, redis_sentinel.url
    keys = [f"w/{i}" for i in range(128)]
    vals = [i.to_bytes(2, "little") * 100 for i in range(128)]
    timeout = 2.0
    with peercache.Client(directory=url, pool_bytes=4 << 20, page_size=4096, timeout=timeout,
                          heartbeat_timeout=LOST_WRITES_HEARTBEAT_TIMEOUT_S) as prod, \
            peercache.connect(directory=url, dir_cache_ttl=0, timeout=timeout) as cons:
        prod.put_batch(keys[:64], vals[:64])
        old, replica = ss.servers[0], ss.servers[1]
        _replicated(old)
        redis_launch.cut_replica(old, replica, timeout=scaled(5.0))
        prod.put_batch(keys[64:], vals[64:])              # acknowledged by the master alone
        assert cons.get_batch(keys) == vals
        assert _entries(old) == 128 and _entries(replica) == 64
        node_id, period = prod.node.node_id, prod.node.heartbeat_interval
        t0 = time.monotonic()
        old.kill()
        redis_launch.reconnect_replica(replica)          # the master is gone: nothing left to resync from
        promotion = _Promotion(ss, old.port, t0)
        r = read_until_whole(cons, keys, vals, t0, scaled(PROMOTE_BOUND_S) + period + scaled(RESUME_AFTER_PROMOTION_S))
        wrong, failed, back, first_error = r.wrong, r.failed, r.back, r.first_error
        new, promoted_s = promotion.result()
        found = prod.node.membership.lost_reported_at
        print(f"sentinel failover that lost the last publish: entries lost 64 of 128 (on the master, not on "
              f"the promoted replica); promoted {promoted_s:.2f} s after the kill; the loss reported to the "
              f"producer {'never' if found is None else f'{found - t0:.2f} s after the kill'}; every read a "
              f"hit again {'never' if back is None else f'{back:.2f} s after the kill, {back - promoted_s:.2f} s after the promotion'} "
              f"(heartbeat period {period:g} s); {failed} reads failed meanwhile; wrong pages {wrong}; "
              f"first error: {first_error}")
        assert new == replica.port
        assert wrong == 0
        assert back is not None and back - promoted_s <= period + scaled(RESUME_AFTER_PROMOTION_S)
        assert prod.node.node_id == node_id and prod.node.membership.lost_reports == 1   # entries alone were lost
        assert _entries(ss.server(new)) == 128


def test_no_sentinel_answering_is_a_clear_error_within_the_bound():
    url = f"redis+sentinel://127.0.0.1:{free_port()},127.0.0.1:{free_port()}/peercache/0"
    t = time.monotonic()
    with pytest.raises(DiscoveryUnreachable, match="no sentinel named a master of service 'peercache'") as e:
        connect_directory(url, timeout=1.0)
    assert time.monotonic() - t <= scaled(2.0)
    assert "get-master-addr-by-name peercache" in str(e.value)


def test_unknown_service_and_sentinel_passwords(redis_sentinel, monkeypatch):
    """A service the sentinels do not monitor names itself; the sentinels take the password only with
    ?sentinel_auth=yes, and refusing it says so."""
    monkeypatch.delenv("PEERCACHE_REDIS_PASSWORD", raising=False)
    hosts = ",".join(f"127.0.0.1:{p}" for p in redis_sentinel.sentinel_ports)
    with pytest.raises(DiscoveryUnreachable, match="'nosuch'") as e:
        connect_directory(f"redis+sentinel://:{SENTINEL_PASSWORD}@{hosts}/nosuch/0", timeout=1.0)
    assert SENTINEL_PASSWORD not in str(e.value)
    with pytest.raises(DiscoveryUnreachable, match="credentials") as e:    # the master wants a password
        connect_directory(f"redis+sentinel://{hosts}/{redis_launch.SENTINEL_SERVICE}/0", timeout=1.0)
    with redis_launch.SentinelSet(1, replicas=0, password=SENTINEL_PASSWORD, sentinel_auth=True) as locked:
        plain = locked.url.replace("?sentinel_auth=yes", "")
        with pytest.raises(DiscoveryUnreachable, match="sentinel_auth=yes") as e:
            connect_directory(plain, timeout=1.0)
        assert SENTINEL_PASSWORD not in str(e.value)
        d = connect_directory(locked.url, timeout=1.0)
        try:
            assert d.members().nodes == {} and d.address.startswith("redis+sentinel://:***@")
        finally:
            d.close()


def test_meta_checks_the_directory_through_the_sentinels(procs, redis_sentinel):
    meta = procs.start([*BENCH, "meta", "--directory", redis_sentinel.url])
    line = procs.wait_line(meta, "peercache-bench meta: ready on")
    assert "redis+sentinel://:***@127.0.0.1:" in line and "(Redis through Sentinel;" in line, line
    assert SENTINEL_PASSWORD not in line


def test_silent_sentinels_end_a_call_within_its_bound(redis_sentinel):
    """Sentinels that hang (SIGSTOP: their ports still accept, nothing answers) are each given a share of
    the call's bound (connection.sentinel_timeout), so asking them all, twice, still ends within it."""
    timeout = 1.0
    connect_directory(redis_sentinel.url, timeout=timeout).close()
    for s in redis_sentinel.sentinels:
        s.pause()
    t = time.monotonic()
    with pytest.raises(DiscoveryUnreachable, match="no sentinel named a master") as e:
        connect_directory(redis_sentinel.url, timeout=timeout)
    took = time.monotonic() - t
    print(f"three silent sentinels: the call failed after {took:.2f} s (its bound {timeout:g} s)")
    assert took <= timeout + scaled(0.5), took
    assert "Timeout" in str(e.value)


#: How long reads must stay whole once a stopped master is continued: past the producers' registration
#: TTL (5 s) and until Sentinel makes the old master a replica (about 10 s after its SIGCONT).
STAYS_WHOLE_S = 12.0


def test_a_master_stopped_past_its_failover_and_continued_takes_no_renewal(redis_sentinel):
    """SIGSTOP the master past the failover timeout, SIGCONT it once the replica is promoted: the continued
    old master still answers as a master on the connections opened to it, until Sentinel makes it a replica
    about 10 s later. The nodes must renew and publish on the master the sentinels name, so reads come
    back after the promotion and stay whole (they were all misses for ~10 s when the nodes kept using
    their old connections: the directory_faults scenario's sentinel/stop point)."""
    ss, url = redis_sentinel, redis_sentinel.url
    keys = [f"c/{i}" for i in range(64)]
    vals = [i.to_bytes(2, "little") * 100 for i in range(64)]
    with peercache.Client(directory=url, pool_bytes=4 << 20, page_size=4096, timeout=2.0) as prod, \
            peercache.connect(directory=url, dir_cache_ttl=0, timeout=2.0) as cons:
        prod.put_batch(keys, vals)
        assert cons.get_batch(keys) == vals
        old = ss.servers[0]
        _replicated(old)
        t0 = time.monotonic()
        old.pause()
        try:
            new, promoted_s = _Promotion(ss, old.port, t0).result()
        finally:
            old.resume()
        t_cont = time.monotonic()
        resumed, broken, wrong = None, [], 0
        while time.monotonic() - t_cont < scaled(STAYS_WHOLE_S):
            try:
                got = cons.get_batch(keys)
            except peercache.PeerCacheError:
                got = None
            if got is not None:
                wrong += sum(g is not None and g != v for g, v in zip(got, vals))
            if got == vals and resumed is None:
                resumed = time.monotonic() - t_cont
            elif got != vals and resumed is not None:
                broken.append(round(time.monotonic() - t_cont, 2))
            time.sleep(0.05)
        print(f"sentinel, master stopped and continued: promoted {promoted_s:.2f} s after the SIGSTOP; reads whole "
              f"{'never' if resumed is None else f'{resumed:.2f} s'} after the SIGCONT; broken again at {broken[:5]} "
              f"({len(broken)} reads); wrong pages {wrong}")
        assert wrong == 0
        assert resumed is not None and resumed <= scaled(RESUME_AFTER_PROMOTION_S)
        assert not broken, broken
        assert _entries(ss.server(new)) == len(keys)


def test_an_outage_ends_with_its_last_failing_bucket_and_the_empty_ones_right_after_it():
    """outage_s (pure): errors, then reads blocked (empty buckets), then hits: the outage runs to the end of the
    blocked stretch; a later empty bucket (a stall of a loaded machine, among hits) is not part of it."""
    def b(t, keys, hits, errors=0):
        return {"t": t, "keys": keys, "hits": hits, "misses": keys - hits - errors, "errors": errors}
    after = [b(1.0, 8, 0, 8), b(1.1, 8, 0, 8), b(1.2, 0, 0), b(1.3, 0, 0), b(1.4, 8, 8), b(1.5, 0, 0), b(1.6, 8, 8)]
    assert outage_s(after, 0.95, 0.1) == pytest.approx(0.45)
    assert outage_s(after, 0.95, 0.1, failed=lambda x: x["errors"] > 0) == pytest.approx(0.45)
    after[4] = b(1.4, 8, 6)          # two misses after the blocked stretch: the outage lasts through them,
    assert outage_s(after, 0.95, 0.1) == pytest.approx(0.65)      # and through the empty bucket after them
    assert outage_s(after, 0.95, 0.1, failed=lambda x: x["errors"] > 0) == pytest.approx(0.45)
    assert outage_s([b(1.0, 8, 8), b(1.1, 0, 0)], 0.95, 0.1) == 0.0
