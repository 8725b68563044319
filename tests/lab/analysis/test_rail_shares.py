"""The lab reads the metrics around each window: the runner keeps the scrapes, collect makes per-rail rows,
attribution names a rail that carried too little, and the multi_rail / whole_machine tables show the shares."""
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from peercache.lab import tidy
from peercache.lab.analysis import attribution, charts, collect, report
from peercache.lab.analysis.format import short_run
from peercache.lab.analysis.scenarios import multi_rail, whole_machine
from peercache.lab.analysis.rawlimit import raw_limits
from peercache.lab.pipeline import experiments, runpoint
from peercache.lab.tools import promscrape

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "lab" / "promscrape"
RDMA = FIX / "softroce_multi_rail"           # a real multi_rail point's raw folder (Soft-RoCE guest, 2 rails)
POINT = "multi_rail/pc_rdma_p1x2_s128K_b32/rep0"


def raw_tree(tmp_path: Path, low_share: float | None = None) -> Path:
    """data/raw/softroce with the real point; ``low_share``: its end scrape edited so rxe_b1 carried that share."""
    dest = tmp_path / "raw" / "softroce" / POINT
    shutil.copytree(RDMA, dest)
    if low_share is not None:
        start, end = (promscrape.parse((dest / "metrics" / f"consumer-p0-t2.{e}.prom").read_text())
                      for e in ("start", "end"))
        b0 = promscrape.rail_window(start, end)["rxe_b0"].bytes
        b1_start = start.series(promscrape.READ_BYTES)[(("rail", "rxe_b1"),)]
        b1_end = b1_start + b0 * low_share / (1 - low_share)
        f = dest / "metrics" / "consumer-p0-t2.end.prom"
        lines = [f'peercache_read_bytes_total{{rail="rxe_b1"}} {b1_end!r}' if line.startswith(
            'peercache_read_bytes_total{rail="rxe_b1"}') else line for line in f.read_text().splitlines()]
        f.write_text("\n".join(lines) + "\n")
    return tmp_path / "raw"


def collected(tmp_path: Path, low_share: float | None = None) -> collect.CollectResult:
    return collect.collect_testbed(raw_tree(tmp_path, low_share), tmp_path / "tidy", "softroce", write=False)


def judged(res: collect.CollectResult) -> pd.DataFrame:
    return charts.judge(res.rows, res.runs, {}, "softroce")


def test_collect_makes_each_rails_bytes_and_share_of_the_window(tmp_path):
    res = collected(tmp_path)
    assert res.issues[res.issues["check"].isin(["unreadable_scrape", "missing_scrape"])].empty
    rails = res.rows[res.rows["metric"].isin(["rail_bytes", "rail_share"])]
    by = {(r["metric"], r["devices"]): r for _, r in rails.iterrows()}
    assert sorted(by) == [("rail_bytes", "rxe_b0"), ("rail_bytes", "rxe_b1"), ("rail_share", "rxe_b0"),
                          ("rail_share", "rxe_b1")]
    # drive counted the same bytes itself (its document's rails), from the same counters
    drive = {r["rail"]: r for r in json.loads((RDMA / "drive.json").read_text())["points"][0]["rails"]}
    for rail in ("rxe_b0", "rxe_b1"):
        assert by[("rail_bytes", rail)]["value"] == drive[rail]["bytes_read"]
        assert by[("rail_bytes", rail)]["unit"] == "B" and by[("rail_share", rail)]["unit"] == "ratio"
        assert by[("rail_share", rail)]["value"] == pytest.approx(drive[rail]["share"], abs=1e-4)
    r = by[("rail_share", "rxe_b0")]
    assert (r["scenario"], r["threads"], r["processes"], r["side"], r["protocol"], r["status"]) == \
        ("multi_rail", 2, 1, "client", "rdma", "ok")
    assert json.loads(r["extra"])["rails"] == 2 and json.loads(r["extra"])["reads"] == drive["rxe_b0"]["reads"]


def test_an_unreadable_scrape_is_an_error_and_gives_no_rail_rows(tmp_path):
    raw = raw_tree(tmp_path)
    f = raw / "softroce" / POINT / "metrics" / "consumer-p0-t2.end.prom"
    f.write_text(f.read_text().replace("# TYPE peercache_reads_total counter\n", ""))
    res = collect.collect_testbed(raw, tmp_path / "tidy", "softroce", write=False)
    (issue,) = res.issues[res.issues["check"] == "unreadable_scrape"].to_dict("records")
    assert issue["severity"] == "error" and "consumer-p0-t2.end.prom, line" in issue["message"]
    assert "outside its family" in issue["message"] and issue["point"] == "pc_rdma_p1x2_s128K_b32"
    assert not res.rows["metric"].isin(["rail_bytes", "rail_share"]).any()
    assert (res.rows["metric"] == "get_throughput").any()        # the point's own rows stay


def test_even_rails_are_not_called_an_imbalance(tmp_path):
    rows = judged(collected(tmp_path))
    head = rows[rows["metric"] == "get_throughput"].iloc[0]
    assert head["limit"] != "rail_imbalance" and "rail" not in str(head["limited_by"])


def test_a_rail_under_half_its_even_share_is_named_with_its_figure(tmp_path):
    rows = judged(collected(tmp_path, low_share=0.09))
    head = rows[rows["metric"] == "get_throughput"].iloc[0]
    assert head["limit"] == "rail_imbalance"
    assert head["limited_by"] == "rail imbalance: rxe_b1 carried 9% of bytes (an even split over 2 rails is 50%)"


def test_a_rail_above_half_its_even_share_is_no_imbalance(tmp_path):
    rows = judged(collected(tmp_path, low_share=0.3))
    head = rows[rows["metric"] == "get_throughput"].iloc[0]
    assert head["limit"] != "rail_imbalance"


@pytest.mark.parametrize("shares, fires", [
    ({"a": 0.24, "b": 0.76}, True), ({"a": 0.26, "b": 0.74}, False),
    ({"a": 0.12, "b": 0.3, "c": 0.3, "d": 0.28}, True), ({"a": 0.13, "b": 0.3, "c": 0.3, "d": 0.27}, False),
    ({"a": 0.0, "b": 1.0}, True), ({"a": 1.0}, False),
])
def test_the_imbalance_threshold_is_half_an_even_share(shares, fires):
    ev = attribution.evidence({"value": 1.0, "unit": "GB/s", "extra": "{}"}, rail_shares=shares)
    rule, says = attribution.limited_by(ev, attribution.load_rules())
    assert (rule == "rail_imbalance") is fires
    if fires:
        low = min(shares, key=shares.get)
        assert says.startswith(f"rail imbalance: {low} carried {shares[low]:.0%} of bytes")


def test_a_groups_own_row_is_not_judged_by_the_machines_rails():
    rows = pd.DataFrame([
        {"run_id": "r", "metric": "get_throughput", "value": 1.0, "unit": "GB/s", "status": "ok", "side": "per_device",
         "devices": "rxe_b1", "threads": 1, "extra": "{}"},
        {"run_id": "r", "metric": "get_throughput", "value": 2.0, "unit": "GB/s", "status": "ok", "side": "aggregate",
         "devices": "rxe_b0,rxe_b1", "threads": 1, "extra": "{}"},
        *({"run_id": "r", "metric": "rail_share", "value": v, "unit": "ratio", "status": "ok", "side": "aggregate",
           "devices": d, "threads": 1, "extra": "{}"} for d, v in (("rxe_b0", 0.95), ("rxe_b1", 0.05)))])
    out = attribution.attribute(rows, pd.DataFrame(columns=["run_id", "hosts"]), lambda r: None)
    assert list(out["limit"][:2]) == ["unknown", "rail_imbalance"]


def test_the_multi_rail_tables_show_each_rails_share(tmp_path):
    rows = judged(collected(tmp_path, low_share=0.09))
    sub = rows[rows["scenario"] == "multi_rail"]
    ((_, recs),) = report.compact_tables("multi_rail", sub, raw_limits(rows))
    assert recs[0]["rail shares of bytes"] == "rxe_b0 91 %, rxe_b1 9 %"
    chart = multi_rail.figure(sub, pd.DataFrame(), None)
    assert chart.table[0]["rail shares of bytes"] == "rxe_b0 91 %, rxe_b1 9 %"
    assert chart.table[0]["limited by"].startswith("rail imbalance: rxe_b1 carried 9%")
    charts.plt.close(chart.fig)


def whole_machine_rows(tcp: bool = False) -> pd.DataFrame:
    base = {"run_id": "tb/whole_machine/g/rep0", "scenario": "whole_machine", "tool": "peercache-bench", "status": "ok",
            "threads": 1, "processes": 1, "size_bytes": 131072, "protocol": "tcp" if tcp else "rdma", "extra": "{}"}
    rows = [dict(base, metric="get_throughput", value=v, unit="GB/s", side="per_device", devices=d)
            for d, v in (("rxe_b0", 0.6), ("rxe_b1", 0.4))]
    rows.append(dict(base, metric="get_throughput", value=1.0, unit="GB/s", side="aggregate", devices="rxe_b0,rxe_b1"))
    if not tcp:
        rows += [dict(base, metric="rail_share", value=v, unit="ratio", side="aggregate", devices=d)
                 for d, v in (("rxe_b0", 0.6), ("rxe_b1", 0.4))]
    return collect.normalize_rows(pd.DataFrame(rows))


def test_the_whole_machine_tables_show_each_rails_share():
    rows = whole_machine_rows()
    ((_, recs),) = report.compact_tables("whole_machine", rows, raw_limits(rows))
    assert {"metric": "rail shares of bytes", "value": "rxe_b0 60 %, rxe_b1 40 %",
            "run": short_run("tb/whole_machine/g/rep0")} in recs
    chart = whole_machine.figure(rows, pd.DataFrame(), None)
    shown = {t["NIC / figure"]: t["rail shares of bytes"] for t in chart.table}
    assert shown == {"rxe_b0": "rxe_b0 60 %", "rxe_b1": "rxe_b1 40 %", "aggregate rxe_b0,rxe_b1": "rxe_b0 60 %, rxe_b1 40 %"}
    charts.plt.close(chart.fig)


def test_without_rails_the_tables_say_nothing_of_them():
    rows = whole_machine_rows(tcp=True)
    ((_, recs),) = report.compact_tables("whole_machine", rows, raw_limits(rows))
    assert not any("rail" in r["metric"] for r in recs)
    chart = whole_machine.figure(rows, pd.DataFrame(), None)
    assert all("rail shares of bytes" not in t for t in chart.table)
    charts.plt.close(chart.fig)


@pytest.fixture(scope="module")
def tcp_point(tmp_path_factory):
    """A local tcp multi_rail point with metrics_scrape on (two driver processes, 1 s), run by the point runner."""
    tmp = tmp_path_factory.mktemp("scrape")
    doc = {"name": "scrapetest", "hosts": {"producer": {"host": "local", "address": "127.0.0.1"},
                                           "consumer": {"host": "local", "address": "127.0.0.1"}},
           "capabilities": {"rdma": False, "gpu": False}, "devices": [], "gid_index": None, "form": "local",
           "duration": 1, "warmup": 0.3, "repetitions": 1, "base_port": 26300,
           "results": str(tmp / "raw" / "scrapetest"), "scenarios": ["multi_rail"],
           "grid_overrides": {"multi_rail": {"peercache": {"page_size": [131072], "batch_size": [8],
                                                           "processes_x_threads": [[2, 1]], "metrics_scrape": True}}}}
    path = tmp / "scrapetest.yaml"
    path.write_text(yaml.safe_dump(doc))
    tb = experiments.load_testbed(path)
    (pt,) = experiments.expand(tb)
    out = tmp / "raw" / "scrapetest" / "multi_rail" / pt.name / "rep0" / tidy.RESULT_FILE
    rows = runpoint.run_point(tb, pt, 0, out, quiet=True)
    return tmp, pt, out.parent, rows


def test_the_runner_keeps_both_sides_scrapes_of_the_window(tcp_point):
    tmp, pt, folder, rows = tcp_point
    assert pt.name == "pc_tcp_p2x1_s128K_b8" and pt.params["metrics_scrape"] is True   # no name tag: evidence
    assert [r.status for r in rows if r.metric == "get_throughput"] == ["ok"], [r.reason for r in rows]
    index = promscrape.read_index(folder / "metrics" / promscrape.INDEX)
    got = sorted((e["role"], e["process"] if e["process"] is not None else -1, e["edge"]) for e in index["scrapes"])
    assert got == sorted([("consumer", p, e) for p in (0, 1) for e in ("start", "end")]
                         + [("producer", -1, e) for e in ("start", "end")]), index
    for e in index["scrapes"]:
        s = promscrape.parse((folder / "metrics" / e["file"]).read_text(), e["file"])
        assert promscrape.node_of(s) == ("serve" if e["role"] == "producer" else f"drive-{e['process']}")
    drive = json.loads((folder / "drive.json").read_text())
    assert "# TYPE" not in json.dumps(drive)                     # the texts live in their files, once
    assert drive["points"][0]["metrics_scrapes"] == index["scrapes"]
    meta, _ = tidy.read_result(folder / tidy.RESULT_FILE)
    assert not [n for n in meta.params["notes"] if "metrics scrapes" in n]
    assert "--metrics-scrapes" in meta.commands["client"] and "--metrics-addr" in meta.commands["server"]


def test_a_tcp_point_has_no_rail_rows_and_no_scrape_issue(tcp_point):
    tmp, pt, folder, rows = tcp_point
    res = collect.collect_testbed(tmp / "raw", tmp / "tidy", "scrapetest", write=False)
    assert not res.rows["metric"].isin(["rail_bytes", "rail_share"]).any()
    assert res.issues[res.issues["check"].isin(["unreadable_scrape", "missing_scrape"])].empty
    (w,) = promscrape.consumer_window(folder / "metrics" / promscrape.INDEX)
    assert (w.processes, w.rails) == (2, {})
    rows_j = judged(res)
    ((_, recs),) = report.compact_tables("multi_rail", rows_j[rows_j["scenario"] == "multi_rail"], raw_limits(rows_j))
    assert "rail shares of bytes" not in recs[0]


def test_a_rail_that_went_down_late_in_the_window_is_no_imbalance(tmp_path):
    """The real point whose rxe_b1 went down at the window's end: 38 % of the bytes is above half an even split."""
    dest = tmp_path / "raw" / "softroce" / POINT
    shutil.copytree(FIX / "softroce_multi_rail_down", dest)
    res = collect.collect_testbed(tmp_path / "raw", tmp_path / "tidy", "softroce", write=False)
    rows = judged(res)
    share = rows[(rows["metric"] == "rail_share") & (rows["devices"] == "rxe_b1")].iloc[0]
    assert share["value"] == pytest.approx(0.3753, abs=1e-4)
    assert json.loads(share["extra"])["downs"] == 1 and json.loads(share["extra"])["up"] is False
    assert rows[rows["metric"] == "get_throughput"].iloc[0]["limit"] != "rail_imbalance"
    ((_, recs),) = report.compact_tables("multi_rail", rows, raw_limits(rows))
    assert recs[0]["rail shares of bytes"] == "rxe_b0 62 %, rxe_b1 38 %"
