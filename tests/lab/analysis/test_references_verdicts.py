"""Verdict logic, the references file, and the published reference data."""
from pathlib import Path

import pandas as pd
import pytest

from peercache.lab.analysis import collect
from peercache.lab.analysis.references import Check, apply_verdicts, convert, load_references
from peercache.lab.analysis.references import TestbedRefs as Refs  # "Test*" names would be collected

ROOT = Path(__file__).resolve().parents[3]
REF_DIR = ROOT / "data" / "reference"


def _rows(**over):
    base = dict(experiment="e", scenario="single_nic", run_id="r", metric="get_throughput", value=45.0,
                unit="GB/s", status="ok", testbed="tb", devices="mlx5_0", side="client", tool="peercache-bench")
    recs = over.pop("recs", [{}])
    return collect.normalize_rows(pd.DataFrame([{**base, **over, **r} for r in recs]))


def _refs(**kw):
    return {"tb": Refs(line_rate={"default": (400.0, "Gbit/s")},
                              checks=[Check("single_nic", "get_throughput", target=46.0, unit="GB/s",
                                            lower=10, upper=5, **kw)])}


@pytest.mark.parametrize("value,unit,want", [
    (46.0, "GB/s", "ok"), (41.5, "GB/s", "ok"), (41.3, "GB/s", "low"), (48.2, "GB/s", "ok"),
    (48.4, "GB/s", "high"), (368.0, "Gbit/s", "ok"), (300.0, "Gbit/s", "low"),
    (50.1, "GB/s", "above_line_rate"), (401.0, "Gbit/s", "above_line_rate")])
def test_verdict_against_target_and_line_rate(value, unit, want):
    out = apply_verdicts(_rows(value=value, unit=unit), _refs())
    assert out["verdict"].tolist() == [want]
    assert out["verdict_reason"].iloc[0]


def test_unchecked_without_value_check_or_testbed():
    df = _rows(recs=[{"status": "skipped", "value": None, "reason": "no GPU"},
                     {"metric": "latency_p99", "unit": "us", "value": 3.0},
                     {"testbed": "other"}])
    assert apply_verdicts(df, _refs())["verdict"].tolist() == ["unchecked"] * 3


def test_where_filters_columns_and_extra():
    df = _rows(recs=[{"extra": '{"destination": "gpu"}', "size_bytes": 131072},
                     {"extra": '{"destination": "host"}', "size_bytes": 131072},
                     {"extra": '{"destination": "gpu"}', "size_bytes": 4096}])
    out = apply_verdicts(df, _refs(where={"extra.destination": "gpu", "size_bytes": 131072}))
    assert out["verdict"].tolist() == ["ok", "unchecked", "unchecked"]


def test_aggregate_line_rate_is_sum_of_devices():
    df = _rows(recs=[{"side": "aggregate", "devices": "a,b", "value": 99.0},
                     {"side": "aggregate", "devices": "a,b", "value": 101.0}])
    refs = {"tb": Refs(line_rate={"default": (400.0, "Gbit/s")})}
    assert apply_verdicts(df, refs)["verdict"].tolist() == ["unchecked", "above_line_rate"]


def test_convert_and_unit_errors():
    assert convert(49.0, "GB/s", "Gbit/s") == pytest.approx(392.0)
    assert convert(1.0, "Mpps", "pps") == 1e6
    with pytest.raises(ValueError, match="cannot convert"):
        convert(1.0, "GB/s", "Mpps")
    with pytest.raises(ValueError, match="unknown unit"):
        convert(1.0, "furlongs", "GB/s")


def test_references_file_extends_and_errors(tmp_path):
    p = tmp_path / "refs.yaml"
    p.write_text("schema_version: 1\ntestbeds:\n"
                 "  base:\n    line_rate: {default: {value: 200, unit: Gbit/s}}\n"
                 "    checks: [{scenario: s, metric: bw, target: 50, unit: Gbit/s}]\n"
                 "  mine:\n    extends: base\n    line_rate: {mlx5_3: {value: 100, unit: Gbit/s}}\n")
    refs = load_references(p)
    assert refs["mine"].line_rate_bps("mlx5_3") == 100e9
    assert refs["mine"].line_rate_bps("mlx5_0") == 200e9
    assert len(refs["mine"].checks) == 1
    p.write_text("schema_version: 1\ntestbeds:\n  x: {extends: nope}\n")
    with pytest.raises(ValueError, match="extends 'nope'"):
        load_references(p)
    p.write_text("schema_version: 1\ntestbeds:\n  x: {checks: [{scenario: s, metric: m}]}\n")
    with pytest.raises(ValueError, match="needs scenario, metric, target, unit"):
        load_references(p)


def test_reference_data_loads_as_published():
    rows, runs = collect.load_tidy(REF_DIR / "peercache-8xcx7-roce")
    assert set(rows["run_id"]) <= set(runs["run_id"])
    get = lambda **k: rows.loc[(rows[list(k)] == pd.Series(k)).all(axis=1), "value"].tolist()  # noqa: E731
    assert get(scenario="single_nic", tool="ib_read_bw") == [49.0]
    assert get(scenario="single_nic", tool="peercache-bench") == [46.0]
    assert sorted(get(scenario="multi_rail")) == [40.4, 147.6]
    assert sorted(get(scenario="whole_machine")) == [25.1, 51.6, 89.4, 413.1]
    assert sorted(get(scenario="gpudirect", metric="get_throughput")) == [49.5, 140.0]
    hosts = collect.run_field(runs.iloc[0], "hosts")
    block = next(iter(hosts.values()))
    assert block["nic"]["firmware"] == "28.39.1002" and block["nic"]["gid_index"] == 3
    assert block["kernel"] == "5.4.241-1-tlinux4-0017.7" and block["rdma_core"] is None
    # The published documents are named by their titles; no path outside this repository.
    source = collect.run_field(runs.iloc[0], "source")
    assert source["title"] == "PeerCache performance baseline, 8 × ConnectX-7 RoCE"
    assert source["original_title"] == "性能基线" and "seeds/" not in str(source)

    sweep, sweep_runs = collect.load_tidy(REF_DIR / "ib-write-bw-200gbe-qp-sweep")
    source = collect.run_field(sweep_runs.iloc[0], "source")
    assert source["title"] == "200GbE RDMA fine sweep, QP 4, msg_size 1K–1M" and "seeds/" not in str(source)
    bw = sweep[(sweep["metric"] == "bw") & (sweep["scenario"] == "msgsize_sweep")]
    assert bw[bw["qps"] == 1].set_index("size_bytes")["value"][4096] == 77.68
    assert bw[bw["qps"] == 4].set_index("size_bytes")["value"][16384] == 50.05
    llc = sweep[(sweep["metric"] == "llc_load_misses") & (sweep["scenario"] == "msgsize_sweep")]
    assert len(llc) == 8 and set(llc["status"]) == {"not_measured"} and llc["value"].isna().all()
    appendix = sweep[sweep["scenario"] == "perf_stat"].set_index("metric")["value"]
    assert appendix["context_switches"] == 235 and appendix["instructions"] == 114879562341


def test_published_per_nic_values_above_line_rate_are_flagged():
    refs = load_references(REF_DIR / "references.yaml")
    rows, _ = collect.load_tidy(REF_DIR / "peercache-8xcx7-roce")
    out = apply_verdicts(rows, refs)
    wm = out[out["scenario"] == "whole_machine"].set_index("value")["verdict"]
    assert wm[89.4] == "above_line_rate"      # 715 Gb/s on a 400 Gb/s NIC
    assert wm[51.6] == "above_line_rate"      # even the mean is 412.8 Gb/s
    assert wm[413.1] == "above_line_rate"     # 3.3 Tb/s over 8 x 400 Gb/s
    assert wm[25.1] != "above_line_rate"
    single = out[out["scenario"] == "single_nic"]
    assert set(single["verdict"]) == {"ok"}
