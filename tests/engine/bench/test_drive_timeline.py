"""drive --timeline-ms and --faults-expected: the flags, the timeline's merge and document, a driver thread that
loses a producer (in process, with a stand-in node), and the lab's churn measurement in small: a meta directory,
two `serve --join` producers, one drive reading both while one producer is SIGKILLed."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

from conftest import BENCH
from peercache.bench import drive, options
from peercache.bench.cli import build_parser
from peercache.bench.document import DriveDocument
from peercache.bench.drive import timeline
from peercache.bench.serve import READY_LINE
from peercache.errors import ConfigError, TransportError
from peercache.node import Get

SMALL = ["--working-set", "64", "--page-size", "16384"]


def _validate(*argv: str):
    args = build_parser().parse_args(["drive", *argv])
    options.validate(args, "drive")
    return args


# ---------------------------------------------------------------- flags

@pytest.mark.parametrize("argv, match", [
    (["--timeline-ms", "-1"], r"--timeline-ms"),
    (["--timeline-ms", "99999999"], r"--timeline-ms"),
    # 200 s in buckets of 1 ms: 200000 rows of counters per thread, beyond the cap
    (["--timeline-ms", "1", "--duration", "200"],
     r"--timeline-ms 1 over --duration 200 s makes 200000 buckets, more than 100000.*--timeline-ms 2 or more"),
])
def test_drive_refuses_a_bad_or_unbounded_timeline(argv, match):
    with pytest.raises(ConfigError, match=match):
        _validate(*argv)


def test_drive_settings_of_the_timeline_and_faults_flags():
    plain = drive.DriveConfig.from_args(_validate(), drive.Worker)
    assert (plain.timeline_ms, plain.faults_expected) == (0, False)
    cfg = drive.DriveConfig.from_args(_validate("--timeline-ms", "100", "--faults-expected", "--duration", "4"),
                                      drive.Worker)
    assert (cfg.timeline_ms, cfg.faults_expected) == (100, True)
    # exactly at the cap is accepted
    _validate("--timeline-ms", "1", "--duration", "100")
    assert timeline.bucket_count(4.0, 100) == 40 and timeline.bucket_count(0.35, 100) == 4
    assert timeline.bucket_count(0.05, 100) == 1


def test_drive_help_names_the_flags():
    r = subprocess.run([*BENCH, "drive", "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "--timeline-ms N" in r.stdout and "--faults-expected" in r.stdout


# ---------------------------------------------------------------- merge and document

def _part(start=100.0, ms=100, counts=None, by=None, stall=0.0):
    return {"start": start, "bucket_ms": ms, "counts": np.asarray(counts, np.int64),
            "by_prefix": None if by is None else np.asarray(by, np.int64), "max_stall_s": stall}


def test_timeline_merge_adds_buckets_and_keeps_the_longest_stall():
    a = _part(counts=[[1, 8, 8, 0, 0, 0, 800], [2, 16, 12, 4, 0, 0, 1200]], by=[[5, 3], [12, 0]], stall=0.2)
    b = _part(counts=[[1, 8, 6, 0, 2, 0, 600], [0, 0, 0, 0, 0, 0, 0]], by=[[6, 0], [0, 0]], stall=1.5)
    m = timeline.merge([None, a, b, None])
    assert m["counts"].tolist() == [[2, 16, 14, 0, 2, 0, 1400], [2, 16, 12, 4, 0, 0, 1200]]
    assert m["by_prefix"].tolist() == [[11, 3], [12, 0]] and m["max_stall_s"] == 1.5
    assert a["counts"].tolist()[0] == [1, 8, 8, 0, 0, 0, 800]          # the parts are left as they were
    assert timeline.merge([None, None]) is None
    with pytest.raises(ValueError, match="different windows"):
        timeline.merge([a, _part(ms=50, counts=[[0] * 7] * 2)])
    doc = timeline.document(m)
    assert doc == {"bucket_ms": 100, "start": 100.0, "max_stall_s": 1.5, "buckets": [
        {"t": 0.0, "batches": 2, "keys": 16, "hits": 14, "misses": 0, "errors": 2, "verify_failures": 0,
         "bytes": 1400, "hits_by_prefix": [11, 3]},
        {"t": 0.1, "batches": 2, "keys": 16, "hits": 12, "misses": 4, "errors": 0, "verify_failures": 0,
         "bytes": 1200, "hits_by_prefix": [12, 0]}]}
    one = timeline.document(timeline.merge([_part(counts=[[1, 2, 3, 4, 5, 6, 7]])]))
    assert "hits_by_prefix" not in one["buckets"][0]


def test_thread_stats_merge_timelines_through_add_and_a_pickled_dict():
    s1, s2 = drive.ThreadStats(), drive.ThreadStats(timeline=_part(counts=[[1, 2, 2, 0, 0, 0, 10]], stall=0.3))
    s1.add(drive.ThreadStats())                       # a lost process: no timeline
    s1.add(drive.ThreadStats(**s2.__dict__))
    s1.add(s2)
    assert s1.timeline["counts"].tolist() == [[2, 4, 4, 0, 0, 0, 20]] and s1.timeline["max_stall_s"] == 0.3


def test_thread_timeline_buckets_and_stall():
    tl = timeline.ThreadTimeline(1000.0, 100, 1.0, prefixes=2)
    assert tl.counts.shape == (10, 7) and tl.by_prefix.shape == (10, 2)
    assert [tl.bucket(t) for t in (1000.0, 1000.099, 1000.1, 1000.95, 1001.0)] == [0, 0, 1, 9, 9]
    tl.completed(999.5)                       # before the window: no gap counted
    tl.completed(1000.2)
    tl.completed(1000.3)
    tl.completed(1001.4)                      # the batch that spans the window's end
    assert tl.stall == pytest.approx(1.1)
    assert timeline.ThreadTimeline(0.0, 100, 1.0, prefixes=1).by_prefix is None
    tl.add(1000.01, 8, 6, 1, 1, 0, 600, np.array([4, 2]))
    tl.add(1000.05, 8, 8, 0, 0, 0, 800, np.array([1, 7]))
    tl.add(1000.31, 8, 0, 8, 0, 0, 0, None)
    tl.add(1001.0, 4, 4, 0, 0, 1, 400, np.array([0, 4]))         # the window's end: the last bucket
    part = tl.part()
    assert part["counts"][[0, 3, 9]].tolist() == [[2, 16, 14, 1, 1, 0, 1400], [1, 8, 0, 8, 0, 0, 0],
                                                  [1, 4, 4, 0, 0, 1, 400]]
    assert np.delete(part["counts"], [0, 3, 9], axis=0).sum() == 0
    assert part["by_prefix"][[0, 3, 9]].tolist() == [[5, 9], [0, 0], [0, 4]] and part["max_stall_s"] == tl.stall
    assert tl.part()["counts"].sum() == part["counts"].sum()      # a second part() moves nothing twice


# ---------------------------------------------------------------- the point's status

def _cfg(*argv, **kw):
    defaults = {"duration": 1.0, "layout": "mla", "op": "get", "processes": 1, "batch_size": 8,
                "page_size": 4096, "verify": True}
    cfg = drive.DriveConfig.from_args(build_parser().parse_args(["drive", *argv]), drive.Worker)
    return dataclasses.replace(cfg, **(defaults | kw))


def _result(**stats):
    base = {"batches": 10, "keys": 80, "hits": 70, "misses": 2, "errors": 8, "bytes": 70 * 4096,
            "first_error": "read from node n2 failed: connection refused"}
    return {"stats": drive.ThreadStats(**(base | stats)).__dict__, "abort": []}


def test_errors_fail_the_point_unless_faults_are_expected():
    p = drive.aggregate(1, _cfg(), [_result()])
    assert p.status == "failed" and "connection refused" in p.reason and p.first_error is None
    p = drive.aggregate(1, _cfg(faults_expected=True), [_result()])
    assert p.status == "ok" and p.reason is None and p.errors == 8
    assert p.first_error == "read from node n2 failed: connection refused"
    # a wrong page, a redirected entry or an abort still fails it
    p = drive.aggregate(1, _cfg(faults_expected=True), [_result(verify_failures=1)])
    assert p.status == "failed" and "wrong contents" in p.reason
    p = drive.aggregate(1, _cfg(faults_expected=True), [_result(redirected=1, first_redirect="points at another")])
    assert p.status == "failed" and p.reason == "points at another"
    p = drive.aggregate(1, _cfg(faults_expected=True), [{**_result(), "abort": ["driver thread 0 failed: X"]}])
    assert p.status == "failed" and p.reason == "driver thread 0 failed: X"
    # without errors nothing is added to the point; without a timeline none is written
    d = drive.aggregate(1, _cfg(faults_expected=True), [_result(errors=0, first_error=None)]).to_dict()
    assert "first_error" not in d and "timeline" not in d


# ---------------------------------------------------------------- a driver thread losing a producer

class _Result:
    def __init__(self, status, error, lengths):
        self.status, self.error = status, error
        self.redirected, self.content_mismatch, self.miss_reason = np.empty(0, np.intp), np.empty(0, np.intp), None
        self.generations = np.zeros(len(status), np.uint64)
        # every object its page's size (the room drive gave it): none too big
        self.lengths, self.too_big = np.asarray(lengths, np.uint64), np.empty(0, np.intp)


class _Node:
    """Answers every key as a hit until ``gone_at``; then pB's keys fail as a killed producer's do (per key
    ERROR with a connection text), and one batch in ``raise_every`` raises a transport error instead."""

    class transport:
        @staticmethod
        def rail_stats():
            return []

    def __init__(self, gone_at: float, raise_every: int = 0):
        self.gone_at, self.raise_every, self.calls = gone_at, raise_every, 0
        self.lock = threading.Lock()

    def directory_silence(self):
        return 0.0

    def get_batch_into(self, keys, dest, offsets, caps, check_pattern=False):
        with self.lock:
            self.calls += 1
            n = self.calls
        time.sleep(0.002)
        st = np.full(len(keys), int(Get.HIT), np.int8)
        if time.time() < self.gone_at:
            return _Result(st, None, caps)
        if self.raise_every and n % self.raise_every == 0:
            raise TransportError("connect to 127.0.0.1:9 failed: connection refused")
        gone = np.array([k.startswith(b"pc/pB/") for k in keys])
        st[gone] = int(Get.ERROR)
        return _Result(st, "read from node n2 failed: peer gone (connection reset)" if gone.any() else None, caps)


def _worker(cfg, node):
    w = drive.Worker.__new__(drive.Worker)
    w._take_settings(cfg, 0, type("V", (), {"value": 0.0})())
    w.node, w.gpu, w.fused_verify = node, None, True
    w.slice_bytes = cfg.batch_size * cfg.page_size
    w.recv = w.dest = np.zeros(w.slice_bytes * max(cfg.concurrencies), np.uint8)
    return w


@pytest.mark.parametrize("faults_expected", [True, False])
def test_a_thread_losing_a_producer_goes_on_only_when_faults_are_expected(faults_expected):
    cfg = _cfg("--key-prefix", "pA,pB", "--working-set", "16", "--timeline-ms", "50", duration=0.8, warmup=0.0,
               batch_size=4, page_size=64, concurrencies=(2,), faults_expected=faults_expected)
    t0 = time.time() + 0.05
    w = _worker(cfg, _Node(gone_at=t0 + 0.4, raise_every=7))
    res = w.run_point(2, t0)
    p = drive.aggregate(2, cfg, [res])
    assert p.errors > 0
    if not faults_expected:
        assert p.status == "failed" and ("peer gone" in p.reason or "connection refused" in p.reason)
        return
    assert p.status == "ok", p.reason
    assert p.first_error and p.verify_failures == 0
    tl = p.timeline
    assert tl["bucket_ms"] == 50 and len(tl["buckets"]) == 16 and tl["start"] == pytest.approx(t0, abs=1e-5)
    before = [b for b in tl["buckets"] if b["t"] + 0.05 <= 0.35]
    after = [b for b in tl["buckets"] if b["t"] >= 0.45]
    assert all(b["hits_by_prefix"][0] > 0 and b["hits_by_prefix"][1] > 0 for b in before), before
    assert all(b["hits_by_prefix"][1] == 0 and b["hits_by_prefix"][0] > 0 for b in after), after
    assert sum(b["errors"] for b in after) > 0 and sum(b["errors"] for b in before) == 0
    for f in ("batches", "keys", "hits", "misses", "errors", "verify_failures", "bytes"):   # the window's totals
        assert sum(b[f] for b in tl["buckets"]) == res["stats"][f], f
    assert all(b["keys"] == b["hits"] + b["misses"] + b["errors"] for b in tl["buckets"])
    assert 0 < tl["max_stall_s"] < 0.3
    assert DriveDocument.from_dict({"schema_version": 1, "tool": "peercache-bench", "mode": "drive",
                                    "meta": _meta(), "points": [p.to_dict()], "status": "ok",
                                    "error": None}).points[0].timeline == tl


def test_a_config_error_inside_a_batch_is_never_tolerated():
    class Bad(_Node):
        def get_batch_into(self, *a, **k):
            raise ConfigError("get_batch_into: 4 keys but 3 offsets")
    cfg = _cfg("--working-set", "16", duration=0.3, warmup=0.0, batch_size=4, page_size=64, faults_expected=True)
    p = drive.aggregate(1, cfg, [_worker(cfg, Bad(0.0)).run_point(1, time.time())])
    assert p.status == "failed" and "offsets" in p.reason


def _meta():
    """A drive document's meta block (the fields only; what they say does not matter here)."""
    from peercache.bench.document import DriveMeta
    import dataclasses as dc
    return {f.name: None for f in dc.fields(DriveMeta) if not f.metadata.get("omit_if_none")}


# ---------------------------------------------------------------- end to end: a producer SIGKILLed mid-window

def _cluster(procs, port, tmp_path):
    """meta on loopback and two `serve --join` producers, pA and pB; (directory address, serves by prefix)."""
    addr = f"127.0.0.1:{port}"
    # a short heartbeat timeout: the killed producer is forgotten by the directory within the window
    meta = procs.start([*BENCH, "meta", "--discovery-addr", addr, "--heartbeat-timeout", "2"])
    procs.wait_line(meta, "peercache-bench meta: ready")
    serves = {p: procs.start([*BENCH, "serve", "--join", "--bind", "127.0.0.1", "--discovery-addr", addr, *SMALL,
                              "--readers", "0", "--key-prefix", p]) for p in ("pA", "pB")}
    for p, s in serves.items():
        procs.wait_line(s, READY_LINE)
    return addr, serves


def _drive(procs, addr, out, duration, *extra):
    return procs.start([*BENCH, "drive", "--discovery-addr", addr, *SMALL, "--batch-size", "8",
                        "--key-prefix", "pA,pB", "--duration", str(duration), "--warmup", "0.3",
                        "--dir-cache-ttl", "0.5", "--timeline-ms", "100", "--ready-timeout", "10",
                        "--out", str(out), *extra])


def _kill_after(drive_proc, serve, seconds: float) -> float:
    """SIGKILL serve ``seconds`` into drive's window (placed by its progress lines); the moment (epoch s)."""
    end = time.monotonic() + 20
    for line in drive_proc.stderr:      # "drive: point 1/1 threads=1   0.7/4.3 s measure ..."
        m = re.search(r"([0-9.]+)/[0-9.]+ s measure", line)
        if m:
            break
        assert time.monotonic() < end, "drive never measured"
    else:
        raise AssertionError("drive ended before it measured")
    time.sleep(max(0.0, 0.3 + seconds - float(m.group(1))))     # --warmup 0.3: the window opens at 0.3 s
    os.killpg(serve.pid, signal.SIGKILL)
    return time.time()


def test_producer_killed_mid_window_with_faults_expected_keeps_the_point_and_shows_the_dip(procs, port, tmp_path):
    addr, serves = _cluster(procs, port, tmp_path)
    out = tmp_path / "drive.json"
    d = _drive(procs, addr, out, 4, "--faults-expected")
    killed_at = _kill_after(d, serves["pB"], 1.5)
    assert d.wait(timeout=30) == 0, d.stderr.read()
    doc = json.loads(out.read_text())
    assert doc["status"] == "ok", doc["error"]
    assert doc["meta"]["timeline_ms"] == 100 and doc["meta"]["faults_expected"] is True
    p = doc["points"][0]
    assert p["status"] == "ok" and p["verified"] and p["verify_failures"] == 0 and p["redirected"] == 0
    tl = p["timeline"]
    assert tl["bucket_ms"] == 100 and len(tl["buckets"]) == 40
    assert tl["start"] == pytest.approx(p["window_start"], abs=1e-3)
    kill_t = killed_at - tl["start"]
    before = [b for b in tl["buckets"] if b["t"] + 0.1 <= kill_t - 0.05]
    after = [b for b in tl["buckets"] if b["t"] >= kill_t + 0.3]
    assert before and after, kill_t
    # before the kill, every bucket that completed batches read both producers (a loaded machine may leave a
    # bucket without any: make test's four workers stalled one for 100 ms once)
    busy = [b for b in before if b["batches"] >= 4]
    assert len(busy) >= len(before) / 2, before
    assert all(b["hits_by_prefix"][0] > 0 and b["hits_by_prefix"][1] > 0 for b in busy), before
    assert all(b["hits_by_prefix"][1] == 0 for b in after), after
    # pA's producer goes on answering: hits of its keys in most buckets after the kill
    assert sum(b["hits_by_prefix"][0] > 0 for b in after) >= len(after) * 0.8, after
    assert sum(b["errors"] + b["misses"] for b in after) > 0
    assert p["errors"] == 0 or p["first_error"]
    # no consumer stopped longer than a GET's bound (3 s) plus a margin
    assert 0 < tl["max_stall_s"] < 3.0 + 1.0
    print(f"killed at {kill_t:.2f} s; errors {p['errors']} misses "
          f"{sum(b['misses'] for b in tl['buckets'])}; max stall {tl['max_stall_s']:.3f} s; "
          f"first error: {p.get('first_error')}; pB: "
          + " ".join(f"{b['t']:.1f}:{b['hits_by_prefix'][1]}/{b['errors']}/{b['misses']}" for b in tl["buckets"]))


def test_producer_killed_mid_window_without_faults_expected_fails_the_point(procs, port, tmp_path):
    addr, serves = _cluster(procs, port, tmp_path)
    out = tmp_path / "drive.json"
    d = _drive(procs, addr, out, 3)
    _kill_after(d, serves["pB"], 1.0)
    assert d.wait(timeout=30) == 1
    doc = json.loads(out.read_text())
    p = doc["points"][0]
    assert doc["status"] == "failed" and p["status"] == "failed"
    assert any(w in p["reason"] for w in ("connection", "peer gone", "refused", "reset")), p["reason"]
    assert "first_error" not in p and p["errors"] > 0
