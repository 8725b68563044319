"""perftest.rows: tidy rows of a parsed result (bandwidth in B/s, latency in us), on real captures."""
from __future__ import annotations

import pytest

from lab.tools.perftest.captures import MiB, public, real
from peercache.lab.tools import perftest as pt


# --- bandwidth --------------------------------------------------------------------------------

def test_perftest_1x_table_without_msgrate():
    r = pt.parse_output(public("jebtang_send_bw_ud_a_v1.txt"))
    assert all(x.msg_rate_mpps is None for x in r.rows)
    rows = pt.to_rows(r, experiment="e", scenario="s", run_id="r")
    assert {x.metric for x in rows} == {"bw_average", "bw_peak"}  # no MsgRate column, no row
    assert len(rows) == 11 * 2
    first = [x for x in rows if x.metric == "bw_average"][0]
    assert first.value == pytest.approx(7.21 * MiB) and first.size_bytes == 2


def test_post_list_duration_peak_not_measured_rows():
    r = pt.parse_output(public("perftest273_write_postlist_d60_gbits.txt"))
    rows = pt.to_rows(r, experiment="e", scenario="s", run_id="r")
    peak = [x for x in rows if x.metric == "bw_peak"][0]
    assert peak.status == "not_measured" and peak.value is None
    rate = [x for x in rows if x.metric == "msg_rate"][0]
    assert rate.value == pytest.approx(7.498617e6) and rate.protocol == "roce"
    avg = [x for x in rows if x.metric == "bw_average"][0]
    assert avg.value == pytest.approx(0.48e9 / 8) and avg.devices == "ib0"


# --- latency ----------------------------------------------------------------------------------

def test_latency_rows_in_us():
    r = pt.parse_latency_output(public("stm_write_lat_a_mlx4_ib.txt"))
    rows = pt.to_rows(r, experiment="e", scenario="lat_sweep", run_id="r", side="client")
    assert len(rows) == 23 * 7
    assert {x.unit for x in rows} == {"us"} and {x.tool for x in rows} == {"ib_write_lat"}
    by = {(x.metric, x.size_bytes): x for x in rows}
    assert by[("latency_typical", 2)].value == 0.98 and by[("latency_typical", 2)].raw_unit == "usec"
    assert by[("latency_p999", 8388608)].value == 2335.48
    assert by[("latency_p99", 65536)].value == 23.79 and by[("latency_min", 65536)].value == 19.69
    assert by[("latency_avg", 2)].protocol == "ib" and by[("latency_avg", 2)].devices == "mlx4_0"
    assert by[("latency_stdev", 4096)].extra["line"] == 28


# --- a real capture's rows and the caller's context -------------------------------------------

def test_a_real_capture_gives_one_row_per_printed_figure_with_its_context():
    # real: ib_write_bw -d rxe_b0 -x 1 -s 131072 -q 4 -D 2 --report_gbits --cpu_util 198.18.0.1
    r = pt.parse_output(real("write_d2_q4_gbits_cpu.client.stdout"), "w.stdout")
    rows = pt.to_rows(r, experiment="e", scenario="s", run_id="r", side="client", host="B")
    by = {x.metric: x for x in rows}
    assert set(by) == {"bw_average", "bw_peak", "msg_rate", "cpu_util"}
    avg = by["bw_average"]
    assert (avg.value, avg.unit, avg.raw_value, avg.raw_unit) == (pytest.approx(0.050243e9 / 8), "B/s",
                                                                  0.050243, "Gb/sec")
    assert avg.extra["gbit_per_s"] == pytest.approx(0.050243) and avg.extra["line"] == 35  # its line in the file
    assert (by["msg_rate"].value, by["msg_rate"].unit) == (pytest.approx(48.0), "msg/s")
    # what the header says fills what the caller left out: tool, device, QPs, protocol
    for x in rows:
        assert (x.tool, x.devices, x.qps, x.protocol) == ("ib_write_bw", "rxe_b0", 4, "roce")
        assert (x.side, x.host, x.size_bytes, x.extra["source"]) == ("client", "B", 131072, "w.stdout")


def test_the_callers_context_wins_over_the_header():
    r = pt.parse_output(real("read_s131072_q1.client.stdout"))
    rows = pt.to_rows(r, experiment="e", scenario="s", run_id="r", qps=8, devices="mlx5_0",
                      extra={"attempt": 2})
    assert {x.qps for x in rows} == {8} and {x.devices for x in rows} == {"mlx5_0"}
    assert all(x.extra["attempt"] == 2 and x.extra["table"] == "main" for x in rows)


@pytest.mark.parametrize("context, message", [
    ({"colour": "blue"}, "unknown Row fields in context: \\['colour'\\]"),
    ({"metric": "bw"}, "context may not set \\['metric'\\]: the parser sets them"),
    ({"value": 1.0, "unit": "B/s"}, "context may not set \\['unit', 'value'\\]"),
], ids=["unknown-field", "metric", "value-and-unit"])
def test_a_context_that_is_not_a_row_field_or_sets_a_figure_is_refused(context, message):
    r = pt.parse_output(real("read_s131072_q1.client.stdout"))
    with pytest.raises(TypeError, match=message):
        pt.to_rows(r, **context)
