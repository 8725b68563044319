"""Raw limits that are limits: the best of the runs of a point's shape, and a label that says what ran.

The iperf3 documents are real captures (tests/fixtures/lab/PROVENANCE.md: loopback runs of iperf3 3.12
on this repository's CI host); the rows around them are built the way the iperf3 kind builds them.
"""
import copy
import json
from pathlib import Path

import pandas as pd

from peercache.lab.analysis import charts
from peercache.lab.analysis.collect import rows_frame
from peercache.lab.analysis.rawlimit import percent_of_raw, raw_for, raw_limits, why_none
from peercache.lab.launch.runners import WindowBytes, aggregate_window
from peercache.lab.pipeline.points import iperf3 as kind
from peercache.lab.tidy import Row
from peercache.lab.tools import iperf3 as tool

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "lab" / "iperf3"
CTX = dict(experiment="local", testbed="local", scenario="single_nic", repetition=0, tool="iperf3",
           protocol="tcp", side="client")


def _result(name):
    return tool.parse_json((FIX / name).read_text(), source=name)


def _get(gbs, run_id="local/single_nic/pc_tcp_p1x1_s128K_b32/rep0", procs=1, threads=1, size=131072):
    return Row(metric="get_throughput", value=gbs, unit="GB/s", tool="peercache-bench", protocol="tcp",
               processes=procs, threads=threads, size_bytes=size, run_id=run_id,
               **{k: v for k, v in CTX.items() if k not in ("tool", "protocol")})


def _rounds_of(result, figures_Bps, run_id):
    """One round's rows per figure: the real capture's rows with their ``bw`` set to that figure."""
    base = kind.extract(result, dict(CTX, run_id=run_id, qps=1, size_bytes=131072))
    out = []
    for bps in figures_Bps:
        rows = copy.deepcopy(base)
        next(r for r in rows if r.metric == "bw").value = bps
        out.append(rows)
    return out


def test_best_of_rounds_keeps_the_best_round_and_records_every_figure():
    rounds = _rounds_of(_result("client_loopback_p2_reverse.json"), [1.9e9, 2.6e9, 2.2e9], "r")
    best = kind.best_of(rounds)
    bw = next(r for r in best if r.metric == "bw")
    assert bw.value == 2.6e9
    assert bw.extra["rounds_Bps"] == [1.9e9, 2.6e9, 2.2e9]
    assert bw.extra["limit_of"] == "best of 3 back-to-back rounds (1.9-2.6 GB/s)"
    assert bw.extra["reverse"] is True          # what ran, from iperf3's own report
    assert bw.extra["retransmits"] == _result("client_loopback_p2_reverse.json").retransmits
    # one round: its rows as they were
    one = _rounds_of(_result("client_loopback_p1.json"), [2.0e9], "r")
    assert "rounds_Bps" not in next(r for r in kind.best_of(one) if r.metric == "bw").extra


def test_the_limit_is_the_best_run_not_the_mean_so_a_slow_sample_puts_no_point_above_raw():
    # Two repetitions of the same shape, 3 rounds each: one slowed (2.0 GB/s), one not (2.6 GB/s).
    res = _result("client_loopback_p2_reverse.json")
    raw = []
    for k, figs in enumerate(([1.8e9, 2.0e9, 1.9e9], [2.4e9, 2.6e9, 2.5e9])):
        raw += kind.best_of(_rounds_of(res, figs, f"local/single_nic/iperf3_P1_l128K_R_O/rep{k}"))
    point = _get(2.4)     # 2.4 GB/s: above the mean of the two (2.3 GB/s), below the best
    df = rows_frame(raw + [point])
    limits = raw_limits(df)
    lim = limits[("tcp", 1, 131072)]
    assert lim.gbs == 2.6
    assert lim.label == "iperf3 -R, 1 connection(s), 128 KiB requests, best of 6 runs"
    assert set(lim.runs) == {"local/single_nic/iperf3_P1_l128K_R_O/rep0", "local/single_nic/iperf3_P1_l128K_R_O/rep1"}
    pct = percent_of_raw(df.iloc[-1], limits)
    assert round(pct, 1) == 92.3


def test_no_raw_run_of_the_points_shape_means_no_percentage():
    raw = kind.best_of(_rounds_of(_result("client_loopback_p1.json"), [2.0e9], "local/single_nic/iperf3/rep0"))
    df = rows_frame(raw + [_get(1.0, procs=2, threads=2)])
    limits = raw_limits(df)
    r = df.iloc[-1]
    assert raw_for(r, limits) is None and percent_of_raw(r, limits) is None
    assert why_none(r, limits) == ("no iperf3 run with 4 connection(s) and 128 KiB requests "
                                   "(measured: 1 conn. x 128 KiB)")


def test_multi_process_rows_say_reverse_where_it_ran():
    # Four client processes of the real -R capture, released together over one window.
    res = _result("client_loopback_p2_reverse.json")
    results = {f"proc{i}": res for i in range(4)}
    agg = aggregate_window({g: WindowBytes(r.received_bytes, 100.0, 100.0 + r.received_seconds)
                            for g, r in results.items()})
    ctx = dict(CTX, run_id="local/single_nic/iperf3_x4_P1_l128K_R_O/rep0", qps=1, size_bytes=131072, processes=4)
    row = kind.processes_row(agg, results, {"consumer": {"cores": 1.9, "busiest_thread": 0.97}}, ctx)
    assert row.extra["reverse"] is True and row.extra["client_processes"] == 4
    assert row.value == agg.rate_Bps and row.unit == "B/s"
    df = rows_frame([row])
    assert charts.measurement(df.iloc[0]).startswith("iperf3 -R, 4 conn.")
    lim = raw_limits(df)[("tcp", 4, 131072)]
    assert lim.label.startswith("iperf3 -R, 4 connection(s)")
    assert lim.busiest_thread == 0.97
    assert lim.retransmits == row.extra["retransmits"] == 4 * res.retransmits
    # a forward capture reads forward
    fwd = kind.processes_row(agg, {"proc0": _result("client_loopback_p1.json")}, {}, ctx)
    assert fwd.extra["reverse"] is False
    assert not charts.measurement(rows_frame([fwd]).iloc[0]).startswith("iperf3 -R")


def test_rows_frame_keeps_the_round_figures():
    rows = kind.best_of(_rounds_of(_result("client_loopback_p1.json"), [1e9, 2e9], "r"))
    df = rows_frame(rows)
    ex = json.loads(df[df["metric"] == "bw"].iloc[0]["extra"])
    assert ex["rounds_Bps"] == [1e9, 2e9]
    assert isinstance(df, pd.DataFrame)
