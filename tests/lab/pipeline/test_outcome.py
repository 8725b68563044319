"""The harness's one pair path (pipeline/outcome.py, PointRun.run_pair): a pair kind declares its launch, its
parser call and its rows; failing with the reason, noting a failure after a complete output, adding the rows
and the CPU evidence happen once, in the harness. The pair itself is stood in for here (its runner has tests
of its own); the kind's command builders and the real sockperf output are used as they are."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from peercache.lab.errors import ParseError
from peercache.lab.launch.hosts import LocalHost
from peercache.lab.launch.runners import PairResult, SideResult
from peercache.lab.pipeline import experiments, runpoint
from peercache.lab.pipeline.points.declare import Point
from peercache.lab.pipeline.points.hicache_suite import HiCacheSuiteRun
from peercache.lab.pipeline.points.sockperf import SockperfRun

ROOT = Path(__file__).resolve().parents[3]
REPORT = (ROOT / "tests" / "fixtures" / "lab" / "sockperf" / "pingpong_tcp_m4096_full_rtt.stdout").read_text()
FAILED_AFTER = "server exited 1 after the client"


def _sockperf_point():
    tb = experiments.load_testbed(ROOT / "experiments" / "testbeds" / "local.yaml")
    return tb, Point("raw_limits", "sockperf_pp_m4K", "sockperf", {"msg_size": 4096})


def _side(role: str, stdout: str = "") -> SideResult:
    now = time.time()
    return SideResult(role=role, host="local", command=[role], argv=[role], numa_binding={"node": None},
                      stdout=stdout, rc=0, start=now - 2, end=now)


def _stand_in_pair(monkeypatch, client_stdout: str, err: str | None) -> list:
    """PointRun.pair replaced by one that returns a pair whose client printed ``client_stdout`` and the pair's
    failure ``err``; the calls it got are returned (server, client, readiness, ...)."""
    calls = []

    def pair(self, server, client, ready, th, devices, server_exits=True, warmup=None):
        calls.append((server, client, ready, devices, server_exits))
        now = time.time()
        res = PairResult("p", _side("server"), _side("client", client_stdout), ok=err is None, error=err,
                         start=now - 2, end=now)
        return res, err
    monkeypatch.setattr(runpoint.PointRun, "pair", pair)
    return calls


def _hosts():
    return runpoint.TestbedHosts(LocalHost(), LocalHost(), "127.0.0.1", "127.0.0.1", None)


def test_a_kind_whose_read_raises_gets_one_failed_row_with_the_reason(tmp_path, monkeypatch):
    calls = _stand_in_pair(monkeypatch, "", FAILED_AFTER)
    read_calls = []

    def read(cls, pr, th, launch, res):
        read_calls.append(res)
        raise ParseError("sockperf", "no summary line", source=f"{pr.run_id}/client")
    monkeypatch.setattr(SockperfRun, "read", classmethod(read))
    tb, pt = _sockperf_point()
    rows = runpoint.run_point(tb, pt, 0, tmp_path / "result.json", hosts=_hosts(), quiet=True)
    assert len(calls) == 1 and len(read_calls) == 1
    assert [(r.metric, r.status) for r in rows] == [("rtt_p50", "failed")]     # exactly one row: the failed one
    (row,) = rows
    assert row.reason == (f"{FAILED_AFTER}: sockperf output ({tb.name}/raw_limits/sockperf_pp_m4K/rep0/client): "
                          "no summary line")
    assert (row.unit, row.tool, row.protocol, row.size_bytes) == ("us", "sockperf", "tcp", 4096)
    doc = json.loads((tmp_path / "result.json").read_text())
    assert [r["status"] for r in doc["rows"]] == ["failed"]
    assert not [n for n in doc["meta"]["params"]["notes"] if "after a complete" in n]


def test_a_complete_report_after_a_pair_failure_is_kept_and_noted_once(tmp_path, monkeypatch):
    calls = _stand_in_pair(monkeypatch, REPORT, FAILED_AFTER)
    tb, pt = _sockperf_point()
    rows = runpoint.run_point(tb, pt, 0, tmp_path / "result.json", hosts=_hosts(), quiet=True)
    (server, client, ready, devices, server_exits) = calls[0]
    assert server[0] == "sockperf" and client[0] == "sockperf" and not server_exits and devices == []
    assert {r.status for r in rows} == {"ok"} and "rtt_p50" in {r.metric for r in rows}
    notes = json.loads((tmp_path / "result.json").read_text())["meta"]["params"]["notes"]
    assert [n for n in notes if "after a complete" in n] == [
        f"pair reported a failure after a complete sockperf report: {FAILED_AFTER}"]


class _Suite:
    """A parsed suite result as the check sees it: it failed, with or without a failed row of its own."""

    def __init__(self, status: str):
        self.status, self.error, self.points = status, "set: store refused the batch", []


@pytest.mark.parametrize("rows_fail, expected", [(False, ["ok", "failed"]), (True, ["failed"])])
def test_a_result_that_failed_where_no_row_says_so_fails_the_point_once(tmp_path, monkeypatch, rows_fail, expected):
    from peercache.lab.tidy import Row
    _stand_in_pair(monkeypatch, "", None)
    monkeypatch.setattr(HiCacheSuiteRun, "read", classmethod(lambda cls, pr, th, launch, res: _Suite("failed")))
    monkeypatch.setattr(HiCacheSuiteRun, "rows", classmethod(lambda cls, pr, launch, result: [
        Row(metric="pages_per_s", value=None if rows_fail else 1.0, unit="pages/s",
            status="failed" if rows_fail else "ok", reason="set failed" if rows_fail else None,
            **pr.ctx(extra={"op": "set"}))]))
    tb = experiments.load_testbed(ROOT / "experiments" / "testbeds" / "local.yaml")
    pt = next(p for p in experiments.expand(tb) if p.kind == "hicache_suite")
    pr = runpoint.PointRun(tb, pt, 0, tmp_path)
    pr.run_pair(HiCacheSuiteRun, _hosts())
    assert [r.status for r in pr.rows] == expected
    if not rows_fail:
        assert pr.rows[-1].reason == "the suite failed: set: store refused the batch"
        assert pr.rows[-1].layout == pt.params["layout"] and pr.rows[-1].batch == pt.params["batch_size"]
    assert pr.notes == []
