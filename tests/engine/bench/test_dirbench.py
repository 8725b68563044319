"""peercache.bench.dirbench: directory lookups/s against the embedded directory and a real redis-server,
its checks, and its place in `make bench` (the dirlookup / redis_benchmark kinds, run by the point runner)."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from peercache import tags
from peercache.bench import dirbench, options
from peercache.errors import ConfigError
from peercache.lab.launch import redis as rl

from conftest import free_port, scaled

DIRBENCH = [sys.executable, "-m", "peercache.bench.dirbench"]
needs_redis = pytest.mark.skipif(not rl.available()[0], reason=rl.available()[1] or "redis ok")


def run_dirbench(*args: str, timeout: float = 90) -> tuple[int, dict | None, str]:
    r = subprocess.run([*DIRBENCH, *args], capture_output=True, text=True, timeout=scaled(timeout))
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    return r.returncode, (json.loads(lines[-1]) if lines else None), r.stderr


# --- pure parts ---------------------------------------------------------------------

def test_backend_of_and_redact():
    assert dirbench.backend_of("127.0.0.1:31990") == "embedded"
    assert dirbench.backend_of("redis://127.0.0.1:6379/0") == dirbench.backend_of("rediss://h:1/0") == "redis"
    with pytest.raises(ConfigError, match="unknown scheme"):
        dirbench.backend_of("etcd://h:1")
    with pytest.raises(ConfigError, match="HOST:PORT"):
        dirbench.backend_of("nohost")
    assert dirbench.redact("redis://:s3cret@h:1/0") == "redis://:***@h:1/0"
    assert dirbench.redact("redis://user:s3cret@h:1/0") == "redis://user:***@h:1/0"
    assert dirbench.redact("rediss://tok@h:1/0") == "rediss://***@h:1/0"
    assert dirbench.redact("redis://h:1/0") == "redis://h:1/0"


def test_draw_batches_are_distinct_keys_and_reproducible():
    a = dirbench.draw_batches(1000, 128, 8, seed=3)
    assert a.shape == (8, 128) and all(len(set(row)) == 128 for row in a.tolist())
    assert a.min() >= 0 and a.max() < 1000
    assert np.array_equal(a, dirbench.draw_batches(1000, 128, 8, seed=3))
    assert not np.array_equal(a, dirbench.draw_batches(1000, 128, 8, seed=4))


def test_check_locations_names_each_wrong_entry():
    k = [b"pc/0", b"pc/1", b"pc/2", b"pc/3"]
    good = ["n1", 1, 0, 0, 64, 64, 1, tags.key_hash(k[0])]
    locs = [good, None, ["n2", *good[1:]], ["n1", *good[1:7], tags.key_hash(k[0])]]
    bad = dirbench.check_locations(k, locs, "n1")
    assert len(bad) == 3
    assert "not found" in bad[0] and "node 'n2'" in bad[1] and "key hash" in bad[2]
    assert dirbench.check_locations(k[:1], [good], "n1") == []


def test_summarise_over_one_window():
    cfg = {"duration": 2.0, "batch": 128}
    res = dirbench.summarise([{"batches": 10, "keys": 1280, "misses": 0, "latencies": [1e-4] * 10},
                              {"batches": 30, "keys": 3840, "misses": 1, "latencies": [3e-4] * 30}], cfg)
    assert res["keys_per_s"] == 2560.0 and res["batches_per_s"] == 20.0
    assert res["latency_us"]["p50"] == pytest.approx(300.0) and res["misses"] == 1
    assert res["per_client_batches"] == [10, 30]
    assert dirbench.percentiles_us([]) == {"p50": None, "p99": None, "p999": None}


@pytest.mark.parametrize("args, match", [
    (["--batch", "0"], "--batch must be >= 1"),
    (["--batch", "256", "--keys", "128"], "larger than --keys"),
    (["--clients", "65"], "at most 64"),
    (["--duration", "0"], "--duration must be in"),
    (["--directory", "memcached://h:1"], "unknown scheme"),
])
def test_invalid_options_exit_2_saying_what_to_fix(args, match):
    rc, doc, err = run_dirbench(*args, timeout=30)
    assert rc == 2 and doc is None and match in err, err


# --- real runs ------------------------------------------------------------------------

def test_embedded_directory_throughput_real_run():
    addr = f"127.0.0.1:{free_port()}"
    rc, doc, err = run_dirbench("--directory", addr, "--keys", "2048", "--batch", "128", "--clients", "2",
                                "--duration", "1", "--warmup", "0.3")
    assert rc == 0, err
    assert doc["status"] == "ok" and doc["error"] is None and doc["tool"] == "peercache-dirbench"
    m, r = doc["meta"], doc["result"]
    assert m["backend"] == "embedded" and m["directory"] == addr and m["clients"] == 2 and m["batch"] == 128
    assert m["git_revision"] and m["host"] and m["versions"]["pyzmq"]
    assert r["batches"] > 0 and r["keys"] == r["batches"] * 128 and r["misses"] == 0
    assert r["keys_per_s"] == pytest.approx(r["keys"] / 1.0) and r["batches_per_s"] == pytest.approx(r["batches"])
    assert len(r["per_client_batches"]) == 2 and all(b > 0 for b in r["per_client_batches"])
    assert 0 < r["latency_us"]["p50"] <= r["latency_us"]["p99"]
    assert r["verified_keys"] == 2048 and r["verify_failures"] == 0
    assert r["window_end"] - r["window_start"] == pytest.approx(1.0)
    assert "published 2048 keys to the embedded directory" in err


def test_a_lookup_of_unpublished_keys_counts_them_missing():
    """The sanity check that fails a run: keys the directory does not hold are counted, not hidden."""
    addr = f"127.0.0.1:{free_port()}"
    keys = options.page_keys(256, "mla")
    prod = dirbench.Producer(addr, keys[:100])
    try:
        cli = dirbench.LookupClient(addr)
        try:
            assert cli.lookup(keys[:100]) == 0
            assert cli.lookup(keys[50:178]) == 78
        finally:
            cli.close()
        assert prod.verify(keys[:100], 32) == []
        bad = prod.verify(keys[90:110], 32)
        assert len(bad) == 10 and all("not found" in b for b in bad)
    finally:
        prod.close()


@needs_redis
def test_redis_backend_throughput_real_run(redis_server):
    rc, doc, err = run_dirbench("--directory", redis_server.url, "--keys", "2048", "--batch", "128",
                                "--clients", "1", "--duration", "1", "--warmup", "0.3")
    assert rc == 0, err
    assert doc["status"] == "ok" and doc["meta"]["backend"] == "redis"
    assert doc["meta"]["versions"]["redis"] and "hiredis" in doc["meta"]["versions"]
    r = doc["result"]
    assert r["batches"] > 0 and r["misses"] == 0 and r["verified_keys"] == 2048 and r["verify_failures"] == 0


@needs_redis
def test_redis_unreachable_fails_fast_naming_the_url():
    url = f"redis://127.0.0.1:{free_port()}/0"
    t0 = time.monotonic()
    rc, doc, err = run_dirbench("--directory", url, "--keys", "256", "--duration", "1", timeout=30)
    assert rc == 1 and doc["status"] == "failed" and f"127.0.0.1:{url.split(':')[2].split('/')[0]}" in doc["error"]
    assert time.monotonic() - t0 < scaled(15)


# --- the bench's directory parts ----------------------------------------------------------

def test_bench_pairs_redis_backend_with_mget_on_equal_concurrency():
    from peercache.lab import ratios
    bp = ratios.plan(2, 1.0, 0.5)
    emb, mget, red = (bp.points[p] for p in ("dirlookup_embedded_128", "redis_mget_128", "dirlookup_redis_128"))
    assert (emb.kind, mget.kind, red.kind) == ("dirlookup", "redis_benchmark", "dirlookup")
    assert emb.params["directory"] == "embedded" and red.params["directory"] == "redis"
    # the target's figure asks as a consumer Node does (the table first); the lookup op alone beside it
    assert emb.params["path"] == "node" and "path" not in bp.points["dirlookup_embedded_rpc_128"].params
    assert emb.params["batch"] == mget.params["batch"] == red.params["batch"] == 128
    assert mget.params["clients"] == red.params["clients"]          # equal concurrency for the pair
    assert mget.params["keyspace"] == red.params["keys"] == 16384      # random batches out of as many keys
    assert "keyspace" not in bp.points["redis_mget_128_fixed"].params
    assert all(p.loopback for p in (emb, mget, red))
    assert ratios.RATIOS["dir_lookups_redis_vs_mget_128"] == ("dirlookup_redis_128", "redis_mget_128")
    assert ratios.RATIOS["dir_lookups_embedded_128"] == ("dirlookup_embedded_128", None)
    order = [(p.part, k) for p, k in bp.schedule]
    for k in range(2):   # the MGET limit just before the backend, in every round
        assert order.index(("dirlookup_redis_128", k)) == order.index(("redis_mget_128", k)) + 1


@needs_redis
def test_point_runner_measures_the_pair_on_one_shared_redis_server(tmp_path):
    """Both Redis points of a bench round run on the same redis-server, which is stopped afterwards."""
    from peercache.lab import ratios, tidy
    from peercache.lab.pipeline import runpoint
    bp = ratios.plan(1, 0.5, 0.2)
    servers = []
    with runpoint.testbed_hosts(bp.testbed, loopback=True) as lo, runpoint.shared_redis():
        out = {}
        for part in ("redis_mget_128", "dirlookup_redis_128"):
            pt = bp.points[part]
            rows = runpoint.run_point(bp.testbed, pt, 0, tmp_path / pt.name / tidy.RESULT_FILE, hosts=lo, quiet=True)
            out[part] = ratios.figure(rows, part)
            servers.append(runpoint._SHARED_REDIS["server"])
            meta, saved = tidy.read_result(tmp_path / pt.name / tidy.RESULT_FILE)
            assert any("redis-server" in n for n in meta.params["notes"])
            (fig,) = [r for r in saved if r.metric == "keys_per_s"]
            assert fig.status == "ok" and fig.unit == "ops/s" and "consumer" in fig.extra["cpu"]
        assert servers[0] is servers[1] and servers[0].running
        port = servers[0].port
    assert not servers[0].running and runpoint._SHARED_REDIS is None
    assert all(v > 0 for v in out.values())
    cmd = json.loads((tmp_path / "redis_mget_b128_c2_r16384" / tidy.RESULT_FILE).read_text())["meta"]["commands"]["client"]
    assert cmd[:5] == ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port)] and cmd[cmd.index("-c") + 1] == "2"
    # random batches out of as many stored keys as dirbench publishes, every one of them read from the store
    assert cmd[cmd.index("-r") + 1] == "16384" and cmd.count("pc:e:pc/__rand_int__") == 128
    _, saved = tidy.read_result(tmp_path / "redis_mget_b128_c2_r16384" / tidy.RESULT_FILE)
    (fig,) = [r for r in saved if r.metric == "keys_per_s"]
    assert fig.extra["keyspace_misses"] == 0 and fig.extra["keyspace_hits"] >= fig.extra["requests"] * 128
    d = json.loads((tmp_path / "dir_redis_b128_c2" / "dirbench.json").read_text())
    assert d["meta"]["directory"] == f"redis://127.0.0.1:{port}/0" and d["meta"]["clients"] == 2
    assert d["status"] == "ok"


def test_bench_only_runs_the_parts_behind_the_ratios_asked_for():
    from peercache.lab import ratios
    from peercache.lab.pipeline import experiments
    names = ["dir_lookups_embedded_128", "dir_lookups_redis_vs_mget_128"]
    bp = ratios.plan(2, 1.0, 0.5, only=names)
    assert [(p.part, k) for p, k in bp.schedule] == [
        (part, k) for k in range(2) for part in ("dirlookup_embedded_128", "redis_mget_128", "dirlookup_redis_128")]
    with pytest.raises(experiments.DefinitionError, match=r"--only: no ratio\(s\) \['nope'\]"):
        ratios.plan(1, 1.0, 0.5, only=["nope"])


def test_bench_summary_of_the_directory_parts_only():
    """The ratio lines come from the figures of each round, paired with the MGET run just before."""
    from peercache.lab import ratios, tidy
    figs = {"dirlookup_embedded_128": [5e5, 7e5], "redis_mget_128": [2e6, 1e6], "dirlookup_redis_128": [4e5, 5e5]}
    rows = {(part, k): [tidy.Row(experiment="bench", testbed="bench", scenario="bench", run_id=f"{part}/{k}",
                                 metric="keys_per_s", value=v, unit="ops/s")]
            for part, vals in figs.items() for k, v in enumerate(vals)}
    res = {"ratios": {}, "raw": {}, "rounds": {}, "checks": [], "notes": []}
    only = ["dir_lookups_embedded_128", "dir_lookups_redis_vs_mget_128"]
    ratios.summarise(res, rows, 2, only)
    assert set(res["ratios"]) == set(only) and res["checks"] == []
    assert res["ratios"]["dir_lookups_embedded_128"]["median"] == 6e5
    paired = res["ratios"]["dir_lookups_redis_vs_mget_128"]
    assert paired["each"] == [0.2, 0.5] and paired["median"] == pytest.approx(0.35)
    assert set(res["rounds"]) == set(figs)
