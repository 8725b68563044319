"""Real Redis servers for tests: ``redis_server`` (one per test) and ``redis_cluster`` (three masters).

Loaded for every test by ``pytest_plugins`` in tests/conftest.py, so a test
just names the fixture. Both start Debian's redis-server on random 127.0.0.1
ports with no persistence (peercache.lab.launch.redis) and stop it afterwards;
where redis-server is not installed they skip, saying what to install.
"""
from __future__ import annotations

import subprocess

import pytest

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
