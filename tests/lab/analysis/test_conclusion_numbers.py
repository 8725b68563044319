"""A conclusion's numbers are the rows' numbers: each is recomputed here from the rows the conclusion cites
(issue 40: "peaks at 128 KiB (16.34 Gb/s), 95 % above its lowest (1 KiB, 0.83 Gb/s)", when 16.34 is 20 × 0.83)."""
import re

import pandas as pd
import pytest

from peercache.lab.analysis import spread
from peercache.lab.analysis.scenarios.msgsize_sweep import MsgsizeSweep

#: A sweep's bandwidth in Gb/s by message size: the figures of the local report that said "95 % above".
SWEEP = {1024: 0.83, 4096: 3.1, 16384: 9.7, 131072: 16.34, 1048576: 15.9}


def _rows(sweep: dict[int, float]) -> pd.DataFrame:
    return pd.DataFrame([{"status": "ok", "metric": "bw", "value": gbps * 1e9 / 8, "unit": "B/s", "size_bytes": size,
                          "qps": 1, "run_id": f"local/msgsize_sweep/q1_s{size}/rep0"} for size, gbps in sweep.items()])


def test_a_sweeps_peak_is_stated_as_the_multiple_of_its_lowest_that_the_rows_give():
    rows = _rows(SWEEP)
    c, = MsgsizeSweep().conclusions(rows, {})
    m = re.search(r"peaks at (\S+ \S+) \(([\d.]+) Gb/s, measured once\), ([\d.]+) × its lowest \((\S+ \S+), ([\d.]+) Gb/s\)",
                  c.text)
    assert m, c.text
    peak, low, times = float(m[2]), float(m[5]), float(m[3])
    by_run = rows.set_index("run_id")
    cited = sorted(by_run.loc[c.runs, "value"] * 8 / 1e9)
    assert cited == pytest.approx([low, peak], rel=0.01)
    assert times == pytest.approx(peak / low, abs=0.05)
    assert "%" not in c.text


def test_a_sweeps_peak_within_the_spread_of_the_next_size_is_not_called_a_peak():
    """Issue 40: "peaks at" only where the peak's lowest run is above the next size's highest."""
    rows = pd.concat([_rows({s: v * f for s, v in SWEEP.items()}).assign(
        run_id=lambda d, k=k: d["run_id"].str.replace("rep0", f"rep{k}")) for k, f in enumerate((1.0, 0.9, 1.04))])
    c, = MsgsizeSweep().conclusions(rows, {})
    # 128 KiB: 14.7–17.0 Gb/s; 1 MiB: 14.3–16.5: the ranges overlap
    assert "peaks at" not in c.text and "highest at 128 KiB (16.34 (14.71–16.99, 3 runs) Gb/s)" in c.text, c.text
    assert "within the spread of 1 MiB (15.9 (14.31–16.54, 3 runs) Gb/s)" in c.text, c.text
    apart = _rows({**SWEEP, 1048576: 12.0})
    c, = MsgsizeSweep().conclusions(apart, {})
    assert "peaks at 128 KiB" in c.text


def test_an_engines_rows_percentage_and_its_limited_by_come_from_one_raw_limit():
    """Issue 40: an engines row showed "109 %" in its "% of raw" column and "above raw (115 % of iperf3 …)" in
    its "limited by": the table took the engines scenario's own raw run, the attribution single_nic's."""
    from peercache.lab.analysis import charts, collect
    from peercache.lab.analysis.scenarios import engines
    from peercache.lab.tidy import Row
    wire = {"request_bytes": 1 << 20, "in_flight_bytes": 256 << 10}

    def row(scenario, tool, value, run, **kw):
        return Row(experiment="local", scenario=scenario, run_id=f"local/{scenario}/{run}/rep0", metric=kw.pop(
            "metric", "get_throughput"), value=value, unit="GB/s", tool=tool, protocol="tcp", **kw)
    rows = collect.rows_frame([
        row("single_nic", "iperf3", 2.0, "iperf3_P1", metric="bw", size_bytes=1 << 20, qps=1, processes=1,
            extra={"reverse": True, "window": 256 << 10}),
        row("engines", "iperf3", 1.0, "iperf3_P1", metric="bw", size_bytes=1 << 20, qps=1, processes=1,
            extra={"reverse": True, "window": 256 << 10}),
        row("engines", "peercache-bench", 1.1, "pc1", size_bytes=131072, batch=32, threads=1, processes=1,
            extra={"tcp_wire": wire, "verified": True}),
    ])
    judged = charts.judge(rows, pd.DataFrame(columns=["run_id"]), {}, "local")
    rec = next(r for r in engines.table(judged) if r["engine"] == "PeerCache")
    said = re.search(r"(\d+)% of iperf3", rec["limited by"])
    assert said, rec["limited by"]
    assert int(said[1]) == round(rec["% of raw"]) == 110


def test_a_figure_above_its_raw_limit_is_flagged_in_the_section_as_in_the_overview():
    """Issue 40: the single-NIC section showed shm at "109% of memcpy" without the "(above raw)" its overview
    row gave; every place writes the percentage by one rule (rawlimit.pct_text)."""
    from peercache.lab.analysis import collect, report
    from peercache.lab.analysis.scenarios import REPORTS
    from peercache.lab.tidy import Row

    def row(tool, metric, value, run, **kw):
        return Row(experiment="local", scenario="single_nic", run_id=f"local/single_nic/{run}/rep0", metric=metric,
                   value=value, unit="GB/s", tool=tool, protocol="shm", size_bytes=131072, **kw)
    rows = collect.rows_frame([row("memcpy", "bw", 10.0, "memcpy_s128K", threads=1),
                               row("peercache-bench", "get_throughput", 10.9, "pc_shm", threads=1, processes=1,
                                   batch=32, extra={"verified": True})])
    from peercache.lab.analysis.rawlimit import raw_limits
    [(_, recs)] = report.compact_tables("single_nic", rows, raw_limits(rows))
    ours = next(r for r in recs if r["% of raw"] != "raw limit")
    assert ours["% of raw"] == "109% of memcpy, 1 thread(s), 128 KiB requests (above raw)", ours
    chart = REPORTS["single_nic"].figures["single_nic"](rows, pd.DataFrame(columns=["run_id"]), None)
    mine = next(t for t in chart.table if t["% of raw"] != "—")
    assert mine["% of raw"] == "109.0% (above raw)"
    ov = report.overview_table(rows)
    assert ov["% of single-NIC raw limit"].str.contains("109% (above raw)", regex=False).any()


def _engine(name, gbs, cpu=(1.0, 0.5)):
    sp = spread.spread(gbs)
    return {"engine": name, "page": 131072, "threads": 1, "spread": sp, "GB/s": sp["median"],
            "cpu_s_per_gib": {"consumer": cpu[0], "producer": cpu[1]},
            "run": ",".join(f"{name}{i}" for i in range(len(gbs)))}


def test_ahead_of_is_said_only_where_the_ranges_do_not_overlap_and_its_ratio_is_the_medians():
    """Issue 40: a comparison is drawn only when the repetitions' ranges do not overlap; otherwise "within the
    spread", and the ratio printed is the medians' ratio."""
    from peercache.lab.analysis.scenarios import engines
    ours = _engine("PeerCache", [2.45, 2.55, 2.69])
    mc = engines.compare(ours, _engine("Mooncake TE", [0.31, 0.39, 1.27]))
    assert mc == "ahead of Mooncake TE: 6.54 × by medians"      # its best, 1.27, is below our lowest, 2.45
    assert engines.compare(ours, _engine("NIXL", [0.5, 0.51, 0.55])) == "ahead of NIXL: 5 × by medians"
    near = engines.compare(ours, _engine("NIXL (UCX)", [2.0, 2.3, 2.5]))
    assert near.startswith("within the spread of NIXL (UCX): 1.11 × by medians")
    assert engines.compare(ours, _engine("X", [2.8, 3.0, 3.1])) == "behind X: 0.85 × by medians"
    m = re.search(r"([\d.]+) × by medians", engines.compare(ours, _engine("Y", [0.5, 0.6, 0.7])))
    assert float(m[1]) == pytest.approx(2.55 / 0.6, rel=0.01)
    cheap = engines.lowest_cpu([ours, _engine("Z", [1.0], cpu=(0.1, 0.1))])
    assert cheap["engine"] == "Z" and engines.cpu_total(cheap) == pytest.approx(0.2)


def _reps(gbs, point="local/single_nic/pc_tcp_p1x1_s128K_b32"):
    return pd.DataFrame([{"run_id": f"{point}/rep{k}", "metric": "get_throughput", "side": "client", "devices": "",
                          "status": "ok", "value": v, "unit": "GB/s", "limit": "above_raw",
                          "limited_by": "above raw (...)"} for k, v in enumerate(gbs)])


def test_above_raw_is_said_only_where_every_run_of_the_point_is_above_the_raw_limit():
    """Issue 40: "above raw" only where the ranges do not overlap; a point with a run at or below the raw limit
    is within its spread (the path itself), and one measured once keeps its rule's verdict."""
    from peercache.lab.analysis import attribution
    from peercache.lab.analysis.rawlimit import RawLimit, pct_text
    lim = RawLimit(3.2, "iperf3", "iperf3 -R, best of 3 runs", ("raw",))
    got = attribution.within_spread(_reps([3.0, 3.5, 3.8]), lambda r: lim)
    assert set(got["limit"]) == {"raw_spread"}
    assert got.iloc[0]["limited_by"] == ("the path itself, within the spread of raw: its 3 runs 3–3.8 GB/s against "
                                         "iperf3 -R, best of 3 runs at 3.2 GB/s")
    assert set(attribution.within_spread(_reps([3.3, 3.5, 3.8]), lambda r: lim)["limit"]) == {"above_raw"}
    assert set(attribution.within_spread(_reps([3.0]), lambda r: lim)["limit"]) == {"above_raw"}
    # and the percentage's flag follows the same rule
    assert pct_text(109.4, lowest=93.8) == "109% (within the spread of raw)"
    assert pct_text(109.4, lowest=103.1) == "109% (above raw)" and pct_text(109.4) == "109% (above raw)"
