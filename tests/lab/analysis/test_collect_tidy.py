"""Raw result files into tidy tables, and the collect checks."""
import json
from pathlib import Path

import pandas as pd
import pytest

from peercache.lab.analysis import collect
from peercache.lab import tidy
from peercache.lab.analysis.references import load_references

ROOT = Path(__file__).resolve().parents[3]
FIX = ROOT / "tests" / "fixtures" / "tidy"
TB = "fixture-2x-cx7"


@pytest.fixture
def raw(tmp_path):
    rows, runs = collect.load_tidy(FIX / TB)
    collect.write_raw_from_tidy(rows, runs, tmp_path / "raw", TB)
    return tmp_path / "raw", rows, runs


def _issues(res, check):
    return res.issues[res.issues["check"] == check]


def test_collect_writes_parquet_that_round_trips(raw, tmp_path):
    raw_dir, rows, runs = raw
    refs = load_references(FIX / "references.yaml")[TB]
    res = collect.collect_testbed(raw_dir, tmp_path / "tidy", TB, refs=refs)
    assert (tmp_path / "tidy" / TB / "rows.parquet").exists()
    assert (tmp_path / "tidy" / TB / "runs.parquet").exists()
    back, back_runs = collect.load_tidy(tmp_path / "tidy" / TB)
    key = ["run_id", "metric"]
    a = rows.sort_values(key).reset_index(drop=True)
    b = back.sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b, check_dtype=False)
    assert sorted(back_runs["run_id"]) == sorted(runs["run_id"])
    assert collect.run_field(back_runs.iloc[0], "hosts")["server"]["host"] == "node-a"
    # The fixture's skipped and not_supported points are marked with reasons, not errors.
    marked = _issues(res, "marked")
    assert {"skipped", "not_supported"} == {m.split(":")[0] for m in marked["message"]}
    assert _issues(res, "no_reason").empty
    # 52.5 GB/s on a 400 Gb/s NIC is physically impossible and reported.
    above = _issues(res, "above_line_rate")
    assert len(above) == 1 and "52.5 GB/s" in above["message"].iloc[0]
    assert list(res.errors["check"]) == ["above_line_rate"]


def _plan_of(runs):
    return [f"{m['scenario']}/{m['point']}/rep{m['repetition']}" for m in runs.to_dict("records")]


def test_missing_points_are_errors(raw, tmp_path):
    raw_dir, _, runs = raw
    (raw_dir / TB / "single_nic" / "crashed_point" / "rep0").mkdir(parents=True)
    res = collect.collect_testbed(raw_dir, tmp_path / "tidy", TB, write=False,
                                  expected=_plan_of(runs) + ["single_nic/crashed_point/rep0",
                                                             "multi_rail/page131072_b32_t16"])
    missing = _issues(res, "missing_point")
    assert sorted(missing["point"]) == ["crashed_point", "page131072_b32_t16"]
    assert set(missing["severity"]) == {"error"}


def test_only_the_plans_points_are_collected_stale_ones_are_named(raw, tmp_path):
    # An earlier run with another grid left single_nic/old_grid_point and a second repetition behind.
    raw_dir, rows, runs = raw
    plan = _plan_of(runs)
    first = runs.iloc[0]
    stale_rep = raw_dir / TB / first["scenario"] / first["point"] / "rep1"
    stale_rep.mkdir()
    src = raw_dir / TB / first["scenario"] / first["point"] / "rep0" / "result.json"
    doc = json.loads(src.read_text())
    doc["meta"]["run_id"] += "-rep1"
    doc["meta"]["repetition"] = 1
    for r in doc["rows"]:
        r["run_id"] = doc["meta"]["run_id"]
    (stale_rep / "result.json").write_text(json.dumps(doc))
    _write_point(raw_dir, "single_nic", "old_grid_point",
                 [tidy.Row(metric="bw", value=9.9, unit="GB/s", experiment="x", scenario="single_nic",
                           run_id="single_nic-old_grid_point", testbed=TB, tool="iperf3")])
    (raw_dir / TB / "single_nic" / "old_crashed_point" / "rep0").mkdir(parents=True)
    res = collect.collect_testbed(raw_dir, tmp_path / "tidy", TB, expected=plan)
    assert sorted(res.runs["run_id"]) == sorted(runs["run_id"])
    assert set(res.rows["run_id"]) <= set(runs["run_id"]) and len(res.rows) == len(rows)
    stale = _issues(res, "stale_point")
    assert sorted(stale["point"]) == [first["point"], "old_grid_point"]
    assert set(stale["severity"]) == {"warning"}
    assert "not in the current plan" in stale["message"].iloc[0] and "Delete " in stale["message"].iloc[0]
    assert _issues(res, "missing_point").empty           # the old crashed point is not this plan's either
    back, _ = collect.load_tidy(tmp_path / "tidy" / TB)
    assert "single_nic-old_grid_point" not in set(back["run_id"])
    # Without a plan, every result is read (a folder collected by hand).
    everything = collect.collect_testbed(raw_dir, tmp_path / "tidy2", TB, write=False)
    assert "single_nic-old_grid_point" in set(everything.rows["run_id"])


def test_plan_names_every_repetition(tmp_path):
    from peercache.lab.pipeline.plan import Plan
    plan = Plan("experiments/testbeds/local.yaml")
    exp = plan.expected()
    assert "single_nic/iperf3_P1_l1M_w256K_R_O/rep0" in exp
    assert len(exp) == len(plan.order()) >= len(plan.points)
    assert collect.planned_points(["a/b", "a/c/rep2"]) == {("a", "b", None), ("a", "c", 2)}
    with pytest.raises(ValueError, match="rep<k>"):
        collect.planned_points(["a/b/first"])


def _write_point(raw_dir, scenario, point, rows):
    meta = tidy.RunMeta(run_id=f"{scenario}-{point}", testbed=TB, experiment="x", scenario=scenario, point=point,
                        repetition=0, hosts={}, commands={}, start="2025-01-01T00:00:00Z",
                        end="2025-01-01T00:00:10Z", git_revision=None)
    tidy.write_result(Path(raw_dir) / TB / scenario / point / "rep0" / "result.json", meta, rows)


def test_units_reasons_and_impossible_values(tmp_path):
    raw_dir = tmp_path / "raw"
    r = dict(experiment="x", scenario="single_nic", run_id="single_nic-a", testbed=TB)
    _write_point(raw_dir, "single_nic", "a", [
        tidy.Row(metric="bw", value=40.0, unit="GB/s", **r),
        tidy.Row(metric="get_throughput", value=-1.0, unit="GB/s", **r),
        tidy.Row(metric="get_throughput", value=None, unit="GB/s", status="failed", **r)])
    r2 = dict(r, run_id="single_nic-b")
    _write_point(raw_dir, "single_nic", "b", [tidy.Row(metric="bw", value=300.0, unit="Gbit/s", **r2),
                                              tidy.Row(metric="hit_rate", value=120.0, unit="%", **r2)])
    res = collect.collect_testbed(raw_dir, tmp_path / "tidy", TB)
    assert len(_issues(res, "unit_mismatch")) == 1
    assert len(_issues(res, "no_reason")) == 1
    msgs = " ".join(_issues(res, "impossible_value")["message"])
    assert "negative get_throughput" in msgs and "hit_rate 120 % above 100 %" in msgs


def test_unreadable_result_and_missing_raw_dir(tmp_path):
    bad = tmp_path / "raw" / TB / "s" / "p" / "rep0" / "result.json"
    bad.parent.mkdir(parents=True)
    bad.write_text(json.dumps({"schema_version": 99, "meta": {}, "rows": []}))
    res = collect.collect_testbed(tmp_path / "raw", tmp_path / "tidy", TB, write=False)
    assert "schema version 99" in _issues(res, "unreadable_result")["message"].iloc[0]
    with pytest.raises(FileNotFoundError, match="run the pipeline"):
        collect.read_raw(tmp_path / "raw", "nope")
