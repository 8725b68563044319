"""``python -m peercache.bench.hicache_drive suite``: get/set/exists sweeps through PeerCacheStore as SGLang's
cache controller calls it, against a real ``peercache-bench serve`` on loopback (tcp)."""
import json
import subprocess
import sys
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import BENCH, scaled
from peercache import hicache
from peercache.bench.hicache import suite as hicache_suite
from peercache.bench.hicache.store import HostPagePool
from peercache.bench.serve import READY_LINE

HC = [sys.executable, "-m", "peercache.bench.hicache_drive", "suite"]
OBJ = 16384
TOKENS = 16
BATCH = 32


def common(port: int, layout: str) -> list[str]:
    return ["--discovery-addr", f"127.0.0.1:{port}", "--protocol", "tcp", "--layout", layout,
            "--page-size", str(OBJ), "--working-set", "128"]


def run_suite(procs, port, tmp_path, layout: str, *extra: str) -> tuple[dict, subprocess.CompletedProcess]:
    """serve (one reader) and the suite against it; the suite's document and its completed process."""
    serve = procs.start([*BENCH, "serve", *common(port, layout), "--readers", "1", "--max-wait", "120"])
    procs.wait_line(serve, READY_LINE)
    out = tmp_path / "suite.json"
    r = subprocess.run([*HC, *common(port, layout), "--batch-size", str(BATCH), "--page-tokens", str(TOKENS),
                        "--duration", "0.6", "--warmup", "0.2", "--ready-timeout", "10", "--out", str(out), *extra],
                       capture_output=True, text=True, timeout=scaled(120))
    assert out.exists(), r.stderr
    doc = json.loads(out.read_text())
    assert serve.wait(timeout=scaled(15)) == 0, "the suite did not tell serve it was done"
    return doc, r


@pytest.mark.parametrize("layout", ["mla", "mha"])
def test_get_set_exists_sweeps_with_peak_rows(procs, port, tmp_path, layout):
    doc, r = run_suite(procs, port, tmp_path, layout, "--concurrencies", "1,2")
    assert r.returncode == 0 and doc["status"] == "ok", r.stderr
    assert doc["mode"] == "hicache-suite" and doc["meta"]["is_storage_writer"]
    assert doc["meta"]["store_base"].startswith("sglang") == (hicache.SGLANG_MISSING is None)
    objs = 1 if layout == "mla" else 2
    assert list(doc["ops"]) == ["get", "set", "exists"]
    for op, block in doc["ops"].items():
        pts = block["points"]
        assert [p["threads"] for p in pts] == [1, 2]
        for p in pts:
            assert p["status"] == "ok" and p["call"] == hicache_suite.CALL_OF[op]
            assert p["calls"] > 0 and p["pages"] == p["calls"] * BATCH      # every page of every call done
            assert p["misses"] == 0 and p["errors"] == 0
            assert p["pages_per_s"] == pytest.approx(p["pages"] / p["seconds"], rel=1e-3)
            assert p["tokens_per_s"] == pytest.approx(p["pages_per_s"] * TOKENS, rel=1e-3)
            lat = p["latency_us"]
            assert 0 < lat["p50"] <= lat["p99"] <= lat["p999"]
            if op == "exists":
                assert p["gb_per_s"] is None and p["bytes"] == 0
            else:
                assert p["bytes"] == p["pages"] * objs * OBJ
                assert p["gb_per_s"] == pytest.approx(p["bytes"] / p["seconds"] / 1e9, rel=1e-2)
        best = max(pts, key=lambda p: p["pages_per_s"])
        assert block["peak"]["peak"] and block["peak"]["pages_per_s"] == best["pages_per_s"]
        assert block["peak"]["threads"] == best["threads"]
    for p in doc["ops"]["get"]["points"]:
        assert p["verified"] and p["verify_failures"] == 0
    for p in doc["ops"]["set"]["points"]:      # set then get: the bytes written are the bytes read back
        rt = p["roundtrip"]
        assert rt["pages"] == p["threads"] * BATCH and rt["arrived"] == rt["pages"] and rt["mismatched"] == 0, \
            (rt, p.get("reason"))
    table = r.stdout
    assert "pages/s" in table and "tokens/s" in table and "GB/s" in table and "p999 us" in table
    for op, block in doc["ops"].items():        # one PEAK row per op, with the peak's pages/s
        rows = [line.split() for line in table.splitlines() if line.startswith(op) and " PEAK " in line]
        assert len(rows) == 1 and rows[0][2] == "PEAK" and rows[0][4] == f"{block['peak']['pages_per_s']:.0f}"


def test_mla_non_writer_rank_writes_nothing_and_loops_are_count_bounded(procs, port, tmp_path):
    doc, r = run_suite(procs, port, tmp_path, "mla", "--tp-size", "2", "--tp-rank", "1", "--ops", "set,get",
                       "--concurrencies", "1,2", "--max-calls", "3")
    assert r.returncode == 0 and doc["status"] == "ok", r.stderr
    assert doc["meta"]["is_storage_writer"] is False
    for p in doc["ops"]["set"]["points"]:
        assert p["status"] == "skipped" and "not the storage writer" in p["reason"]
        assert p["calls"] == 0 and p["pages"] == 0 and p["bytes"] == 0
        probe = p["writer_probe"]
        # the store, called anyway, said True for every page but stored and published none of them
        assert probe["store_returned_true"] == BATCH and probe["published"] == 0 and probe["pages_written"] == 0
    assert doc["ops"]["set"]["peak"] is None
    for p in doc["ops"]["get"]["points"]:        # reads are every rank's: measured, at most --max-calls each
        assert p["status"] == "ok" and 0 < p["calls"] <= 3 * p["threads"] and p["calls_total"] <= 6 * p["threads"]
    assert "not the storage writer" in r.stdout


@pytest.mark.parametrize("mla,rank,writer", [(True, 0, True), (True, 1, False), (True, 3, False),
                                             (False, 0, True), (False, 1, True)])
def test_storage_writer_is_sglangs_rule(mla, rank, writer):
    assert hicache_suite.is_storage_writer(mla, rank) is writer


@pytest.mark.parametrize("flags,message", [
    (["--concurrencies", "0"], "--concurrencies must all be positive"),
    (["--concurrencies", "1,0"], "--concurrencies must all be positive"),
    (["--ops", "get,put"], "'put' is not an op"),
    (["--ops", "get,get"], "names an op twice"),
    (["--tp-size", "2", "--tp-rank", "2"], "--tp-rank 2 is not a rank of --tp-size 2"),
    (["--page-tokens", "0"], "--page-tokens"),
    (["--max-calls", "0"], "--max-calls"),
    (["--batch-size", "300"], "larger than --working-set"),
])
def test_bad_input_is_refused_before_anything_starts(port, flags, message):
    r = subprocess.run([*HC, *common(port, "mla"), "--ready-timeout", "1", *flags],
                       capture_output=True, text=True, timeout=scaled(60))
    assert r.returncode == 2 and "invalid options" in r.stderr and message in r.stderr, r.stderr


def test_unknown_subcommand_op_is_an_argparse_error():
    r = subprocess.run([sys.executable, "-m", "peercache.bench.hicache_drive", "sweep"],
                       capture_output=True, text=True, timeout=scaled(60))
    assert r.returncode == 2 and "invalid choice: 'sweep'" in r.stderr


def test_peak_is_the_max_of_the_ok_points():
    def pt(threads, pps, status="ok"):
        return {"op": "get", "call": "batch_get_v1", "threads": threads, "pages_per_s": pps, "tokens_per_s": pps * 64,
                "gb_per_s": pps / 1e4, "latency_us": {"p50": 1.0, "p99": 2.0, "p999": 3.0}, "status": status}
    p = hicache_suite.peak([pt(1, 10.0), pt(2, 30.0), pt(4, 50.0, "failed"), pt(8, 20.0)])
    assert p["peak"] and p["threads"] == 2 and p["pages_per_s"] == 30.0
    assert hicache_suite.peak([pt(1, 5.0, "failed")]) is None


class _EchoStore:
    """batch_get_v1 that lands thread 0's host pages in the pages asked for, one of them altered or missing."""

    def __init__(self, host, alter: int | None = None, miss: int | None = None):
        self.host, self.alter, self.miss = host, alter, miss

    def batch_set_v1(self, hashes, tokens):
        return [True] * len(hashes)

    def read_v1(self, hashes, tokens):
        rows = self.host.kv_buffer.reshape(self.host.pages, self.host.obj_bytes)
        dst = tokens[:: self.host.page_size] // self.host.page_size
        rows[dst] = rows[: len(hashes)]
        if self.alter is not None:
            rows[dst[self.alter], 7] ^= 0xFF
        result = SimpleNamespace(error=None, miss_reason=None if self.miss is None else f"page {self.miss} missed")
        return [i != self.miss for i in range(len(hashes))], result


def _rank(store_args) -> hicache_suite.Rank:
    rank = hicache_suite.Rank.__new__(hicache_suite.Rank)
    rank.batch, rank.page_tokens, rank.objs, rank.slices = 4, 2, 1, 2
    rank.host = HostPagePool(8, 64, True, 2)
    rank.host.kv_buffer[:] = np.random.default_rng(5).integers(0, 256, rank.host.kv_buffer.size, dtype=np.uint8)
    rank.store = _EchoStore(rank.host, **store_args)
    rank.roundtrip_why = {}
    rank.serial, rank.serial_lock, rank.args = 0, threading.Lock(), SimpleNamespace(tp_rank=0)
    return rank


@pytest.mark.parametrize("store_args,arrived,mismatched", [({}, 4, 0), ({"alter": 2}, 4, 1), ({"miss": 3}, 3, 0)])
def test_set_round_trip_compares_every_byte(store_args, arrived, mismatched):
    rank = _rank(store_args)
    rt = rank.roundtrip([(0, ["a", "b", "c", "d"])])
    assert rt == {"pages": 4, "arrived": arrived, "mismatched": mismatched}
    # a page that did not arrive keeps the node's reason for the point's
    assert rank.roundtrip_why == ({"why": "page 3 missed"} if arrived < 4 else {})


def test_a_non_writer_rank_whose_store_published_fails_its_row():
    rank = _rank({})
    rank.args = type("A", (), {"tp_rank": 1, "tp_size": 2})()
    rank.obj = 64
    probe = {"is_storage_writer": False, "probe_pages": 4, "store_returned_true": 4, "published": 4,
             "pages_written": 4}
    row = hicache_suite.skipped_row(rank, 1, probe)
    assert row["status"] == "failed" and "stored 4 page(s) and published 4" in row["reason"]
    assert hicache_suite.skipped_row(rank, 1, {**probe, "published": 0, "pages_written": 0})["status"] == "skipped"
