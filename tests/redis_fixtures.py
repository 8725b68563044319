"""Real Redis servers for tests: ``redis_server`` (one per test), ``redis_cluster`` (three masters),
``redis_cluster_replicas`` (three masters and three replicas, one per test) and ``redis_sentinel`` (a
master, its replica and three sentinels).

Loaded for every test by ``pytest_plugins`` in tests/conftest.py, so a test
just names the fixture. They start Debian's redis-server on random 127.0.0.1
ports with no persistence (peercache.lab.launch.redis) and stop it afterwards;
where redis-server is not installed they skip, saying what to install.
"""
from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass

import pytest

from peercache import tags
from peercache.lab.launch import redis as redis_launch
from peercache.directory.redis.backend import RedisDirectory


def _require_redis() -> None:
    ok, why = redis_launch.available()
    if not ok:
        pytest.skip(why)


@pytest.fixture
def redis_server():
    """A fresh, empty redis-server for this test (``.url``, ``.port``, ``kill()``, ``restart()``)."""
    _require_redis()
    with redis_launch.RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def redis_cluster_module():
    """One three-master Redis Cluster shared by a test module (it takes ~2 s to form)."""
    _require_redis()
    with redis_launch.RedisCluster(masters=3) as cluster:
        yield cluster


@pytest.fixture
def redis_cluster(redis_cluster_module):
    """The module's three-master Redis Cluster, emptied (FLUSHALL on every master) for this test."""
    for port in redis_cluster_module.ports:
        r = subprocess.run(redis_launch.cli_command(port, "flushall"), capture_output=True, text=True,
                           timeout=10)
        if r.returncode != 0 or r.stdout.strip() != "OK":
            pytest.fail(f"FLUSHALL on cluster node 127.0.0.1:{port} failed: {(r.stdout + r.stderr).strip()!r}")
    yield redis_cluster_module


@pytest.fixture
def redis_cluster_replicas():
    """A fresh Redis Cluster of three masters, each with one replica, for this test (its masters are
    killed: no sharing); ``roles()`` says which node is which now."""
    _require_redis()
    with redis_launch.RedisCluster(masters=3, replicas=1) as cluster:
        yield cluster


#: The password of the ``redis_sentinel`` set's servers (long enough to be masked wherever it is printed).
SENTINEL_PASSWORD = "sentinel-set-pw-8c1f"


@pytest.fixture
def redis_sentinel():
    """A fresh master, its replica and three sentinels watching it (``.url``: the set's
    ``redis+sentinel://`` URL, with the password ``SENTINEL_PASSWORD``; ``.servers[0]`` the master)."""
    _require_redis()
    with redis_launch.SentinelSet(password=SENTINEL_PASSWORD) as sentinel_set:
        yield sentinel_set


class RoundTrips:
    """Counts a RedisDirectory's round trips: its pipelines, and its lookups' direct reads (one
    packet to one Redis, or to every cluster master at once); the real calls still run."""

    def __init__(self, d: RedisDirectory):
        self.n = 0
        pipe, direct, per_node = d._pipe, d._fetch_direct, d._fetch_per_node

        def counted(op, build):
            self.n += 1
            return pipe(op, build)

        def wrap(fetch):
            def counted_fetch(ekeys):
                got = fetch(ekeys)
                self.n += got is not None      # None: it fell back to a pipeline (counted there)
                return got
            return counted_fetch
        d._pipe, d._fetch_direct, d._fetch_per_node = counted, wrap(direct), wrap(per_node)


def producer(url: str, name: str = "p", heartbeat_timeout: float = 5.0) -> tuple[RedisDirectory, str, str]:
    """A registered RedisDirectory client (no heartbeats: it lives for its key's TTL) and its id/token."""
    d = RedisDirectory(url, heartbeat_timeout=heartbeat_timeout)
    r = d.call("register", info={"name": name, "regions": [[1, 1 << 30]]})
    return d, r["node_id"], r["token"]


def publish(d: RedisDirectory, nid: str, tok: str, keys: list, base: int = 0) -> list:
    """Publish ``keys`` as ``nid``'s (region 1, 4 KiB apart from ``base``); the 8-field locations sent."""
    locs = [[nid, 1, 7, 4096 * (base + i), 64, 64, 3, tags.key_hash(k)] for i, k in enumerate(keys)]
    r = d.call("publish", node_id=nid, token=tok, keys=keys, locs=locs)
    assert r["published"] == len(keys), r
    return locs


@dataclass
class ReadsAcross:
    """What a consumer's reads saw across a directory fault (:func:`read_until_whole`)."""

    wrong: int = 0                  #: values that came back different from what was put
    failed: int = 0                 #: reads that raised
    longest: float = 0.0            #: the longest read, s
    back: float | None = None       #: s from ``t0`` to the first read of every value, None if none
    first_error: str | None = None


def read_until_whole(cons, keys: list, vals: list, t0: float, until_s: float, pause_s: float = 0.02) -> ReadsAcross:
    """Read ``keys`` through ``cons`` (a peercache client) back to back until every value is back, or until
    ``until_s`` after ``t0`` (time.monotonic()); bounded by that, whatever the directory does."""
    import peercache
    out = ReadsAcross()
    while time.monotonic() - t0 < until_s:
        t = time.monotonic()
        try:
            got = cons.get_batch(keys)
        except peercache.PeerCacheError as e:
            out.failed += 1
            out.first_error = out.first_error or str(e)
            got = None
        out.longest = max(out.longest, time.monotonic() - t)
        if got is not None:
            out.wrong += sum(g is not None and g != v for g, v in zip(got, vals))
            if got == vals:
                out.back = time.monotonic() - t0
                break
        time.sleep(pause_s)
    return out


def outage_s(after: list[dict], fault_t: float, bucket_s: float, failed=lambda b: b["hits"] < b["keys"]) -> float:
    """Seconds from a fault (``fault_t``, s into drive's timeline) to the end of its outage: the last bucket
    of ``after`` (the buckets from the fault on) where reads ``failed`` (by default: an error or a miss),
    and the empty buckets right after it (reads still blocked). An empty bucket after reads came back is a
    stall of a loaded machine, not the fault's: drive's ``max_stall_s`` bounds those."""
    end = None
    for i, b in enumerate(after):
        if b["keys"] and failed(b):
            end = i
    if end is None:
        return 0.0
    while end + 1 < len(after) and not after[end + 1]["keys"]:
        end += 1
    return after[end]["t"] + bucket_s - fault_t


def bucket_list(after: list[dict], fault_t: float) -> str:
    """The buckets from a fault on, as an assertion message shows them: (s after it, keys, hits, misses, errors)."""
    return " ".join(f"({b['t'] - fault_t:.1f}, {b['keys']}, {b['hits']}, {b['misses']}, {b['errors']})" for b in after)
