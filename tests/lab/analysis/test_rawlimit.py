"""Raw limits that are limits: the best of the runs of a point's shape, and a label that says what ran.

The iperf3 documents are real captures (tests/fixtures/lab/PROVENANCE.md: loopback runs of iperf3 3.12
on this repository's CI host); the rows around them are built the way the iperf3 kind builds them.
"""
import copy
import json
from pathlib import Path

import pandas as pd

from peercache.lab.analysis.scenarios import REPORTS, single_nic
from peercache.lab.analysis.collect import rows_frame
from peercache.lab.analysis.rawlimit import percent_of_raw, raw_for, raw_limits, why_none
from peercache.lab.launch.runners import WindowBytes, aggregate_window
from peercache.lab.pipeline.points import iperf3 as kind
from peercache.lab.tidy import Row
from peercache.lab.tools import iperf3 as tool
from peercache.transport.tcp import batch_wire

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "lab" / "iperf3"
CTX = dict(experiment="local", testbed="local", scenario="single_nic", repetition=0, tool="iperf3",
           protocol="tcp", side="client")


def _result(name):
    return tool.parse_json((FIX / name).read_text(), source=name)


#: How drive's tcp client moves a batch of 32 pages of 128 KiB with the data server's default send buffer
#: (256 KiB): requests of 1 MiB, 4 of them in flight, 256 KiB on the connection at once.
WIRE = batch_wire(131072, 32, send_buffer=262144)


def _get(gbs, run_id="local/single_nic/pc_tcp_p1x1_s128K_b32/rep0", procs=1, threads=1, size=131072, wire=WIRE):
    """A PeerCache tcp row as the peercache kind writes it (drive's tcp_wire in its extra; None: an older row)."""
    return Row(metric="get_throughput", value=gbs, unit="GB/s", tool="peercache-bench", protocol="tcp",
               processes=procs, threads=threads, size_bytes=size, batch=32, run_id=run_id,
               extra={} if wire is None else {"tcp_wire": wire},
               **{k: v for k, v in CTX.items() if k not in ("tool", "protocol")})


def _rounds_of(result, figures_Bps, run_id):
    """One round's rows per figure: the real capture's rows with their ``bw`` set to that figure."""
    base = kind.extract(result, dict(CTX, run_id=run_id, qps=1, size_bytes=result.length))
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
    # Two repetitions of the point's shape, 3 rounds each: one slowed (2.0 GB/s), one not (2.6 GB/s).
    res = _result("client_loopback_p1_reverse_l1M_w256K.json")
    raw = []
    for k, figs in enumerate(([1.8e9, 2.0e9, 1.9e9], [2.4e9, 2.6e9, 2.5e9])):
        raw += kind.best_of(_rounds_of(res, figs, f"local/single_nic/iperf3_P1_l1M_w256K_R_O/rep{k}"))
    point = _get(2.4)     # 2.4 GB/s: above the mean of the two (2.3 GB/s), below the best
    df = rows_frame(raw + [point])
    limits = raw_limits(df)
    lim = limits[("tcp", 1, 1048576, 262144)]
    assert lim.gbs == 2.6
    assert lim.label == "iperf3 -R, 1 connection(s), 1 MiB requests, 256 KiB in flight, best of 6 runs"
    assert set(lim.runs) == {"local/single_nic/iperf3_P1_l1M_w256K_R_O/rep0",
                             "local/single_nic/iperf3_P1_l1M_w256K_R_O/rep1"}
    pct = percent_of_raw(df.iloc[-1], limits)
    assert round(pct, 1) == 92.3


def test_a_point_is_paired_with_the_raw_run_of_its_request_size_and_depth_not_its_page_size():
    # One connection each: iperf3 with 128 KiB blocks (the page size) and autotuned buffers, iperf3 with
    # 1 MiB blocks and autotuned buffers, and iperf3 as the point moves its bytes (1 MiB, -w 256 KiB).
    page = kind.best_of(_rounds_of(_result("client_loopback_p1.json"), [3.0e9], "local/single_nic/iperf3_P1_l128K/rep0"))
    autotuned = kind.best_of(_rounds_of(_result("client_loopback_p2_reverse.json"), [3.5e9], "a"))
    next(r for r in autotuned if r.metric == "bw").size_bytes = 1048576      # as an -l 1M run without -w reads
    matched = kind.best_of(_rounds_of(_result("client_loopback_p1_reverse_l1M_w256K.json"), [2.0e9],
                                      "local/single_nic/iperf3_P1_l1M_w256K_R_O/rep0"))
    df = rows_frame(page + autotuned + matched + [_get(1.5)])
    limits = raw_limits(df)
    r = df.iloc[-1]
    lim = raw_for(r, limits)
    assert lim is not None and lim.runs == ("local/single_nic/iperf3_P1_l1M_w256K_R_O/rep0",)
    assert percent_of_raw(r, limits) == 75.0
    # The shape drive recorded: 32 x 128 KiB (and their tags) is cut into 5 requests of at most 1 MiB, all in
    # flight, of which the data server's 256 KiB send buffer is on the connection at once.
    assert (WIRE["request_bytes"], WIRE["requests_in_flight"], WIRE["in_flight_bytes"]) == (1048576, 5, 262144)


def test_a_raw_run_of_another_depth_or_connection_count_is_refused_and_the_row_says_why():
    matched = kind.best_of(_rounds_of(_result("client_loopback_p1_reverse_l1M_w256K.json"), [2.0e9],
                                      "local/single_nic/iperf3_P1_l1M_w256K_R_O/rep0"))
    # a server with kernel-autotuned send buffers: the connection carries the 4 MiB it asked for
    deep = _get(1.0, wire=batch_wire(131072, 32, send_buffer=0))
    four = _get(1.0, procs=2, threads=2)
    df = rows_frame(matched + [deep, four])
    limits = raw_limits(df)
    for i, shape in ((-2, "1 connection(s), 1 MiB requests, 4196608 B (~4.0 MiB) in flight"),
                     (-1, "4 connection(s), 1 MiB requests, 256 KiB in flight")):
        r = df.iloc[i]
        assert raw_for(r, limits) is None and percent_of_raw(r, limits) is None
        assert why_none(r, limits) == (f"no iperf3 run with {shape} (measured: 1 connection(s), 1 MiB requests, "
                                       "256 KiB in flight)")
    # the report's single-NIC table and overview: no percentage, and why
    from peercache.lab.analysis import report
    table = REPORTS["single_nic"].tables(df, limits)[0][1]
    assert [t["% of raw"] for t in table][-2:] == [f"— ({why_none(df.iloc[i], limits)})" for i in (-2, -1)]
    over = report.overview_table(df)
    pc = over[over["scenario"].str.contains("PeerCache")]
    assert (pc["% of single-NIC raw limit"] == "—").all()
    assert pc["notes"].str.contains("no % of raw: no iperf3 run with ", regex=False).all()
    assert pc["notes"].str.startswith("measured once; ").all()      # one run each: said so


def test_a_row_without_the_wire_shape_is_not_matched_to_the_page_size():
    # A row from before drive recorded tcp_wire: its page size alone says nothing of its requests.
    raw = kind.best_of(_rounds_of(_result("client_loopback_p1.json"), [2.0e9], "local/single_nic/iperf3/rep0"))
    df = rows_frame(raw + [_get(1.0, wire=None)])
    limits = raw_limits(df)
    r = df.iloc[-1]
    assert raw_for(r, limits) is None and percent_of_raw(r, limits) is None
    assert "no tcp_wire in its drive document" in why_none(r, limits)


def test_a_request_larger_than_iperf3_can_write_says_so():
    raw = kind.best_of(_rounds_of(_result("client_loopback_p1_reverse_l1M_w256K.json"), [2.0e9], "r"))
    big = _get(1.0, size=4 << 20, wire=batch_wire(4 << 20, 8, send_buffer=262144))   # one 4 MiB object per request
    df = rows_frame(raw + [big])
    why = why_none(df.iloc[-1], raw_limits(df))
    assert why.startswith("no iperf3 run with 1 connection(s), 4 MiB requests, 256 KiB in flight")
    assert why.endswith("iperf3 writes at most 1 MiB at a time, so none can be")


def test_multi_process_rows_say_reverse_where_it_ran():
    # Four client processes of the real -R -w 256K capture, released together over one window.
    res = _result("client_loopback_p1_reverse_l1M_w256K.json")
    results = {f"proc{i}": res for i in range(4)}
    agg = aggregate_window({g: WindowBytes(r.received_bytes, 100.0, 100.0 + r.received_seconds)
                            for g, r in results.items()})
    ctx = dict(CTX, run_id="local/single_nic/iperf3_x4_P1_l1M_w256K_R_O/rep0", qps=1, size_bytes=1048576, processes=4)
    row = kind.processes_row(agg, results, {"consumer": {"cores": 1.9, "busiest_thread": 0.97}}, ctx)
    assert row.extra["reverse"] is True and row.extra["client_processes"] == 4
    assert row.extra["window"] == 262144            # -w as iperf3 reported it
    assert row.value == agg.rate_Bps and row.unit == "B/s"
    df = rows_frame([row])
    assert single_nic.measurement(df.iloc[0]) == "iperf3 -R, 4 conn., 1 MiB, -w 256 KiB"
    lim = raw_limits(df)[("tcp", 4, 1048576, 262144)]
    assert lim.label.startswith("iperf3 -R, 4 connection(s), 1 MiB requests, 256 KiB in flight")
    assert lim.busiest_thread == 0.97
    assert lim.retransmits == row.extra["retransmits"] == 4 * res.retransmits
    # a forward capture reads forward
    fwd = kind.processes_row(agg, {"proc0": _result("client_loopback_p1.json")}, {}, ctx)
    assert fwd.extra["reverse"] is False
    assert not single_nic.measurement(rows_frame([fwd]).iloc[0]).startswith("iperf3 -R")


def test_rows_frame_keeps_the_round_figures():
    rows = kind.best_of(_rounds_of(_result("client_loopback_p1.json"), [1e9, 2e9], "r"))
    df = rows_frame(rows)
    ex = json.loads(df[df["metric"] == "bw"].iloc[0]["extra"])
    assert ex["rounds_Bps"] == [1e9, 2e9]
    assert isinstance(df, pd.DataFrame)


def _rdma(tool, metric, value, unit, run, **kw):
    return Row(experiment="softroce", testbed="softroce", scenario="engines", repetition=0, side="client",
               tool=tool, protocol="rdma", metric=metric, value=value, unit=unit,
               run_id=f"softroce/engines/{run}/rep0", **kw)


def test_a_one_nic_rdma_point_is_held_to_the_ib_read_bw_of_its_own_qps_and_size():
    # The engines scenario measures ib_read_bw at each cell's QPs and page size: a 4 KiB point is held to the
    # 4 KiB figure, not to the best of every size; a point over two NICs still gets two NICs' best.
    raw = [_rdma("ib_read_bw", "bw", 5e7, "B/s", "ib_read_bw_q1_s4K", qps=1, size_bytes=4096, devices="rxe_b0"),
           _rdma("ib_read_bw", "bw", 2e8, "B/s", "ib_read_bw_q1_s128K", qps=1, size_bytes=131072, devices="rxe_b0")]
    pts = [_rdma("peercache-bench", "get_throughput", 0.04, "GB/s", f"pc_{s}", processes=1, threads=1,
                 size_bytes=size, batch=32, devices=devs)
           for s, size, devs in (("4K", 4096, "rxe_b0"), ("128K", 131072, "rxe_b0"), ("2nics", 131072, "rxe_b0,rxe_b1"),
                                 ("1M", 1 << 20, "rxe_b0"))]
    df = rows_frame(raw + pts)
    limits = raw_limits(df, scenario="engines")
    four, big, two, mib = (raw_for(df.iloc[i], limits) for i in (2, 3, 4, 5))
    assert (four.gbs, four.runs, four.label) == (0.05, ("softroce/engines/ib_read_bw_q1_s4K/rep0",),
                                                  "ib_read_bw, 1 QP(s), 4 KiB requests")
    assert (big.gbs, big.label) == (0.2, "ib_read_bw, 1 QP(s), 128 KiB requests")
    assert percent_of_raw(df.iloc[2], limits) == 80.0
    # two NICs: the per-NIC convention (the best single-NIC figure, twice), not a one-NIC shape
    assert (two.gbs, two.label) == (0.4, "2 x ib_read_bw")
    # no ib_read_bw of its shape: the per-NIC figure, as on every rdma testbed
    assert (mib.gbs, mib.label) == (0.2, "ib_read_bw, best of 2 runs")
