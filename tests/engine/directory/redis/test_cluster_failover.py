"""The Redis directory on a Redis Cluster with replicas (three masters, one replica each: the
``redis_cluster_replicas`` fixture) when a master dies under load.

Two serves publish, a drive reads both working sets with verification, and the master owning the
most entries is SIGKILLed: its replica takes over its slots (cluster-node-timeout 2000 ms,
peercache.lab.launch.redis), redis-py's cluster client follows the new slot map, reads resume, no
page is wrong, and the entries the dead master had not replicated (the second serve published them
while every replica was cut off: launch.redis.cut_replica) are published again by their producer.
A master that hangs instead (SIGSTOP) ends every call within its bound, and comes back a replica once
continued. The promotion, the time reads failed, the time until every read hit again, the entries
lost and the wrong pages are printed (``pytest -s``). Every wait is bounded; every process is started
by the fixtures and ended by them.
"""
from __future__ import annotations

import json
import subprocess
import threading
import time

import peercache
from conftest import BENCH, scaled
from redis_fixtures import bucket_list, outage_s, read_until_whole
from peercache.bench.drive.bounds import IO_TIMEOUT_S
from peercache.bench.serve import READY_LINE
from peercache.directory.service import DEFAULT_HEARTBEAT_TIMEOUT as HEARTBEAT_TIMEOUT_S
from peercache.lab.launch import redis as redis_launch

PAGES = 128
SMALL = ["--working-set", str(PAGES), "--page-size", "16384"]
#: The replica takes over within this of the kill (cluster-node-timeout 2 s, then its election; about
#: 3-4 s measured on loopback).
TAKEOVER_BOUND_S = 10.0
#: Every read hits again within this of the takeover: the first heartbeats after it report the
#: producer's lost publish marks (a cluster reads them off the heartbeat, reported by the next: up to
#: two heartbeat periods of 1 s) or its lost registration, and the republish takes milliseconds.
RECOVER_AFTER_TAKEOVER_S = 3.0
#: drive's window: about 1 s before the kill, the takeover, and reads after it.
DRIVE_S = 10.0
#: drive's timeline bucket (ms): the resolution of what it measures.
BUCKET_MS = 100


def _entries(port: int) -> int:
    """Directory entries (``pc:e:*``) on the cluster node at ``port``, a master or a replica (SCAN names
    no key, so a replica answers it rather than redirecting)."""
    r = subprocess.run(redis_launch.cli_command(port, "--scan", "--pattern", "pc:e:*"),
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    return len(r.stdout.split())


def _replicated(port: int) -> None:
    """Wait until the replica of the master on ``port`` acknowledged everything it took (bounded)."""
    redis_launch.replicated(port, 1, timeout=scaled(5.0), cluster=True)


def _in_sync(port: int) -> None:
    deadline = time.monotonic() + scaled(10.0)
    while not redis_launch.in_sync(redis_launch.replication(port)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert redis_launch.in_sync(redis_launch.replication(port)), f"replica {port} did not resync"


class _Takeover:
    """When the replica on ``port`` says it is a master, with its cluster ok, measured in a thread from ``t0``."""

    def __init__(self, port: int, t0: float):
        self.seconds: float | None = None

        def watch():
            deadline = t0 + scaled(TAKEOVER_BOUND_S)
            while time.monotonic() < deadline:
                if redis_launch.replication(port).get("role") == "master" and \
                        redis_launch.cluster_info(port).get("cluster_state") == "ok":
                    self.seconds = time.monotonic() - t0
                    return
                time.sleep(0.02)
        self._t = threading.Thread(target=watch, daemon=True)
        self._t.start()

    def result(self) -> float:
        self._t.join(timeout=scaled(TAKEOVER_BOUND_S) + 10)
        assert self.seconds is not None, f"the replica did not take over within {scaled(TAKEOVER_BOUND_S):g} s"
        return self.seconds


def _drain(proc, into: list[str]) -> None:
    """Keep reading ``proc``'s stderr into ``into`` (its log lines), so that it never blocks on a full pipe."""
    threading.Thread(target=lambda: into.extend(proc.stderr), daemon=True).start()


def test_serve_and_drive_ride_out_a_sigkilled_cluster_master(procs, redis_cluster_replicas, tmp_path):
    c = redis_cluster_replicas
    url = c.url
    replicas = {m: rs[0] for m, rs in c.replicas_of().items()}
    assert len(replicas) == 3, c.roles()
    serve = [*BENCH, "serve", "--directory", url, *SMALL, "--readers", "0"]
    logs: dict[str, list[str]] = {"a": [], "b": []}
    first = procs.start([*serve, "--key-prefix", "a"])
    procs.wait_line(first, READY_LINE)
    _drain(first, logs["a"])
    for m in replicas:
        _replicated(m)
    for m, r in replicas.items():       # what the second serve publishes reaches the masters alone
        redis_launch.cut_replica(c.node(m), c.node(r), timeout=scaled(5.0))
    second = procs.start([*serve, "--key-prefix", "b"])
    procs.wait_line(second, READY_LINE)
    _drain(second, logs["b"])
    counts = {m: _entries(m) for m in replicas}
    victim = max(counts, key=counts.get)
    heir = replicas[victim]
    for m, r in replicas.items():       # the other masters' replicas catch up
        if m != victim:
            redis_launch.reconnect_replica(c.node(r))
            _in_sync(r)
            _replicated(m)
    lost = counts[victim] - _entries(heir)
    assert sum(counts.values()) == 2 * PAGES and 0 < lost < counts[victim], (counts, lost)
    out = tmp_path / "drive.json"
    drive = procs.start([*BENCH, "drive", "--directory", url, *SMALL, "--key-prefix", "a,b", "--batch-size", "8",
                         "--warmup", "0", "--duration", f"{scaled(DRIVE_S):g}", "--faults-expected",
                         "--timeline-ms", str(BUCKET_MS), "--dir-cache-ttl", "0", "--ready-timeout", "10",
                         "--out", str(out)])
    err: list[str] = []
    _drain(drive, err)
    deadline = time.monotonic() + scaled(30)
    while not any("measure" in ln for ln in list(err)) and drive.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any("measure" in ln for ln in list(err)), f"drive did not reach its window (rc {drive.poll()}): {err}"
    time.sleep(1.0)                                  # reads in the window before the fault
    t_kill, wall_kill = time.monotonic(), time.time()
    c.node(victim).kill()
    redis_launch.reconnect_replica(c.node(heir))    # its master is gone: nothing left to resync from
    takeover_s = _Takeover(heir, t_kill).result()
    rc = drive.wait(timeout=scaled(DRIVE_S) + scaled(30))
    doc = json.loads(out.read_text())
    assert rc == 0, (doc.get("error"), "".join(err)[-2000:])
    p = doc["points"][0]
    tl = p["timeline"]
    kill_t = wall_kill - tl["start"]
    bucket_s = tl["bucket_ms"] / 1000
    after = [b for b in tl["buckets"] if b["t"] + bucket_s > kill_t]

    failing_s = outage_s(after, kill_t, bucket_s, failed=lambda b: b["errors"] > 0)
    recovered_s = outage_s(after, kill_t, bucket_s)
    paths = {k: " and ".join(why for why, said in (("lost entries reported", "lost entries"),
                                                    ("registration lost", "forgot node"))
                             if any(said in ln for ln in v)) or "nothing lost"
             for k, v in logs.items()}
    print(f"cluster failover under drive: master {victim} (entries per master {counts}) SIGKILLed, replica "
          f"{heir} took over {takeover_s:.2f} s later; reads failing for {failing_s:.2f} s, every read a hit "
          f"again {recovered_s:.2f} s after the kill ({recovered_s - takeover_s:.2f} s after the takeover); "
          f"entries lost {lost} of {2 * PAGES} (serve b's on the dead master), republished (serve a: {paths['a']}; "
          f"serve b: {paths['b']}); {p['errors']} keys errored, {sum(b['misses'] for b in after)} missed; longest "
          f"stall {tl['max_stall_s']:.2f} s; wrong pages {p['verify_failures']}; first error: {p.get('first_error')}")
    assert after and after[-1]["hits"] == after[-1]["keys"] > 0, "reads did not resume before drive's end"
    assert all(n > 0 for n in after[-1]["hits_by_prefix"]), after[-1]        # both producers' pages hit
    assert recovered_s <= takeover_s + scaled(RECOVER_AFTER_TAKEOVER_S), (
        f"every read a hit again {recovered_s:.2f} s after the kill, takeover {takeover_s:.2f} s; the buckets after "
        f"the kill (s after it, keys, hits, misses, errors): {bucket_list(after, kill_t)}")
    assert tl["max_stall_s"] <= IO_TIMEOUT_S + scaled(1.0)      # no call waited past its bound
    assert p["verify_failures"] == 0 and p["verified"] and p["redirected"] == 0
    assert paths["b"] != "nothing lost"
    assert first.poll() is None and second.poll() is None      # both producers rode it out


def test_a_stopped_master_ends_every_call_within_its_bound_and_comes_back_a_replica(redis_cluster_replicas, caplog):
    """The master owning the most entries hangs (SIGSTOP: its port still accepts, nothing answers)
    for longer than cluster-node-timeout: every library call ends within its bound (each socket wait
    is a third of it: redis-py's cluster client retries a timeout once, after a topology refresh),
    reads resume once its replica took over, none wrong, and once continued (SIGCONT) the old master
    rejoins as a replica of the new one."""

    c = redis_cluster_replicas
    replicas = {m: rs[0] for m, rs in c.replicas_of().items()}
    keys = [f"s/{i}" for i in range(256)]
    vals = [i.to_bytes(2, "little") * 64 for i in range(256)]
    timeout = 1.5
    with peercache.Client(directory=c.url, pool_bytes=4 << 20, page_size=4096, timeout=timeout) as prod, \
            peercache.connect(directory=c.url, dir_cache_ttl=0, timeout=timeout) as cons:
        prod.put_batch(keys, vals)
        for m in replicas:
            _replicated(m)
        counts = {m: _entries(m) for m in replicas}
        victim = max(counts, key=counts.get)
        heir, old = replicas[victim], c.node(victim)
        t0 = time.monotonic()
        old.pause()
        try:
            takeover = _Takeover(heir, t0)
            r = read_until_whole(cons, keys, vals, t0, scaled(TAKEOVER_BOUND_S + RECOVER_AFTER_TAKEOVER_S))
            wrong, failed, longest, back, first_error = r.wrong, r.failed, r.longest, r.back, r.first_error
            takeover_s = takeover.result()
        finally:
            old.resume()
        deadline = time.monotonic() + scaled(15.0)
        info: dict = {}
        while time.monotonic() < deadline:
            info = redis_launch.replication(victim)
            if info.get("role") == "slave" and info.get("master_port") == str(heir):
                break
            time.sleep(0.05)
        # New pages go to the new master (its scripts loaded there) once the producer is registered there: its
        # registration may have expired meanwhile (its heartbeats waited on the hung master, and the replica
        # holds the last renewal replicated before the stop); its next heartbeat registers it again.
        more, fresh = [f"after/{i}" for i in range(32)], None
        deadline = time.monotonic() + HEARTBEAT_TIMEOUT_S + scaled(2.0)
        while fresh != [b"n" * 64] * 32 and time.monotonic() < deadline:
            try:
                prod.put_batch(more, [b"n" * 64] * 32)
                fresh = cons.get_batch(more)
            except peercache.PeerCacheError as e:     # "not registered; register again", until it has
                first_error = first_error or str(e)
                time.sleep(0.1)
        forgotten = any("forgot node" in r.getMessage() for r in caplog.records)
        print(f"cluster master {victim} stopped: replica {heir} took over {takeover_s:.2f} s later; reads back "
              f"{'never' if back is None else f'{back:.2f} s'} after the stop ({failed} calls failed, the longest "
              f"call {longest:.2f} s, bound {timeout:g} s); wrong pages {wrong}; the producer's registration "
              f"{'expired meanwhile (registered again, republished)' if forgotten else 'kept'}; continued, the old "
              f"master is a {info.get('role')} of port {info.get('master_port')}; first error: {first_error}")
        assert fresh == [b"n" * 64] * 32
        assert wrong == 0
        assert longest <= timeout + scaled(0.5), longest
        # Back once the replica took over and the producer is current there (or, its registration expired
        # meanwhile, once its next heartbeat registered it again and republished its pool).
        assert back is not None and back <= max(takeover_s, HEARTBEAT_TIMEOUT_S) + scaled(RECOVER_AFTER_TAKEOVER_S)
        assert info.get("role") == "slave" and info.get("master_port") == str(heir), info
