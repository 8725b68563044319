"""perftest.results: the parsed records' units and typed views, on real captures."""
from __future__ import annotations

import pytest

from lab.tools.perftest.captures import MiB, parse_real
from peercache.lab.tools import perftest as pt


# --- units ------------------------------------------------------------------------------------

def test_mb_label_of_6_06_is_mebibytes():
    [row] = parse_real("read_s131072_q1.client.stdout").rows
    assert row.raw_unit == "MB/sec" and row.bw_average_Bps == pytest.approx(32.47 * MiB)
    # 260 messages/s of 128 KiB: 34.08 MB/s decimal, 32.5 MiB/s; the label means MiB
    assert 0.000260e6 * 131072 / MiB == pytest.approx(32.47, abs=0.05)


def test_gbits_are_decimal_and_every_view_agrees():
    # real: ib_read_bw -d rxe_b0 -x 1 -s 131072 -q 1 -n 200 --report_gbits 198.18.0.1 (softroce/manifest.tsv)
    [row] = parse_real("read_s131072_q1_gbits.client.stdout").rows
    assert (row.raw_unit, row.bw_peak_raw, row.bw_average_raw) == ("Gb/sec", 0.32, 0.31)
    assert row.bw_average_Bps == pytest.approx(0.31e9 / 8) and row.bw_peak_Bps == pytest.approx(0.32e9 / 8)
    assert (row.bw_average_gbps, row.bw_peak_gbps) == (pytest.approx(0.31), pytest.approx(0.32))
    d = row.to_dict()
    # the record keeps what was printed beside what it means
    assert (d["bw_average_raw"], d["raw_unit"], d["line_no"], d["table"]) == (0.31, "Gb/sec", 24, "main")
    assert d["bw_average_Bps"] == row.bw_average_Bps and d["bw_peak_gbps"] == row.bw_peak_gbps


def test_a_peak_not_measured_and_a_unit_not_known_give_no_bytes():
    # real: ib_read_bw -d rxe_b0 -x 1 -s 131072 -q 1 -D 2 198.18.0.1: duration mode prints peak 0.00
    [row] = parse_real("read_d2_q1.client.stdout").rows
    assert row.bw_peak_raw is None and row.bw_peak_Bps is None and row.bw_peak_gbps is None
    assert row.bw_average_Bps == pytest.approx(30.96 * MiB)
    # the same row as a --out_json file holds it before its unit is known (the file does not say)
    bare = pt.PerftestRow(**{**row.__dict__, "raw_unit": None})
    assert (bare.bw_average_Bps, bare.bw_average_gbps) == (None, None)


# --- typed views of the header and the title --------------------------------------------------

def test_typed_header_view_of_a_real_client_and_server():
    c = parse_real("read_s131072_q1.client.stdout")
    info = c.info
    assert (info["tool"], info["test"], info["device"]) == ("ib_read_bw", "RDMA_Read BW Test", "rxe_b0")
    # "1024[B]" is 1024 bytes; counts are ints; the words stay as printed
    assert (info["mtu_bytes"], info["qps"], info["gid_index"], info["tx_depth"]) == (1024, 1, 1, 128)
    assert (info["link_type"], info["rdma_cm"], info["using_srq"]) == ("Ethernet", "OFF", "OFF")
    # what the header did not print is None, not a default
    s = parse_real("read_s131072_q1.server.stdout")
    assert s.info["tx_depth"] is None and s.info["max_inline_bytes"] is None and s.info["rx_depth"] is None
    assert c.to_dict()["info"] == info and c.to_dict()["rows"][0]["bw_average_raw"] == 32.47


def test_a_header_value_that_is_not_a_count_reads_as_none():
    r = parse_real("read_s131072_q1.client.stdout")
    r.header["Number of qps"] = "many"
    r.header["Mtu"] = "1024[KB]"
    assert r.info["qps"] is None and r.info["mtu_bytes"] is None
    r.header["Gid index"] = r.header.pop("GID index")     # the spelling of releases up to ~3.0
    assert r.info["gid_index"] == 1


def test_tool_unit_and_direction_come_from_the_title_and_the_tables():
    both = parse_real("write_bidir_s65536_report_both.client.stdout")
    assert both.tool == "ib_write_bw" and both.bidirectional and both.raw_unit == "Gb/sec"
    # a table of another unit leaves the result's unit unknown rather than picking one
    both.rows[1].raw_unit = "MB/sec"
    assert both.raw_unit is None
    plain = parse_real("send_s131072_q1.server.stdout")
    assert plain.tool == "ib_send_bw" and not plain.bidirectional
    assert pt.PerftestResult(source="x", test="Frobnicate BW Test").tool is None
    assert pt.PerftestResult(source="x").tool is None


def test_latency_records_are_in_usec_never_bidirectional_and_name_their_tool():
    lat = pt.PerftestLatencyResult(source="x", test="RDMA_Read Latency Test",
                                   rows=[pt.PerftestLatencyRow(table="main", line_no=1, size_bytes=2, iterations=5)])
    assert (lat.tool, lat.raw_unit, lat.bidirectional) == ("ib_read_lat", "usec", False)
    # every latency column has its tidy metric and the column name perftest prints
    assert set(pt.LAT_COLUMNS) == {f for f in lat.rows[0].to_dict() if f.endswith("_us")}
    assert pt.LAT_COLUMNS["t_typical_us"] == ("latency_typical", "t_typical[usec]")
