"""perftest parsers and failure classification against real outputs from public sources.

Every file under tests/fixtures/lab/perftest/public is real perftest output that someone
published (GitHub issues/PRs, committed logs); public/README.md gives each file's source,
release and what was trimmed. The expected values below were read by hand from the files.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from peercache.lab.tools import perftest as pt
from peercache.lab.errors import TOOL_ERROR_KINDS, ParseError, ToolError

PUB = Path(__file__).resolve().parents[3] / "fixtures" / "lab" / "perftest" / "public"
MiB = 1 << 20


def text(name: str) -> str:
    return (PUB / name).read_text()


# --- expectations, one entry per fixture ---------------------------------------------------

#: Successful bandwidth outputs: header fields (as printed) and rows
#: (size, iterations, peak or None, average, msg rate or None) at chosen indexes.
BW = {
    "perftest273_write_postlist_d60_gbits.txt": dict(
        test="RDMA_Write Post List BW Test", tool="ib_write_bw", unit="Gb/sec", n=1,
        header={"Device": "ib0", "Number of qps": "1", "Transport type": "IB",
                "Connection type": "RC", "PCIe relax order": "Unsupported", "ibv_wr* API": "OFF",
                "TX depth": "256", "Post List": "128", "CQ Moderation": "128", "Mtu": "4096[B]",
                "Link type": "Ethernet", "GID index": "2", "rdma_cm QPs": "OFF"},
        info={"qps": 1, "mtu_bytes": 4096, "gid_index": 2, "tx_depth": 256, "cq_moderation": 128},
        rows={0: (8, 224958464, None, 0.48, 7.498617)}),
    "eugr_write_bw_q4_rdma_cm_gbits.txt": dict(
        test="RDMA_Write BW Test", tool="ib_write_bw", unit="Gb/sec", n=1,
        header={"Device": "rocep1s0f1", "Number of qps": "4", "Transport type": "IB",
                "Mtu": "1024[B]", "Link type": "IB", "rdma_cm QPs": "ON",
                "Data ex. method": "rdma_cm", "CQ Moderation": "1", "TX depth": "128"},
        info={"qps": 4, "mtu_bytes": 1024, "gid_index": None, "rdma_cm": "ON"},
        rows={0: (65536, 20000, 111.72, 111.71, 0.213070)}),
    "stm_read_bw_a_mlx4_ib.txt": dict(
        test="RDMA_Read BW Test", tool="ib_read_bw", unit="MB/sec", n=23,
        header={"Device": "mlx4_0", "Number of qps": "1", "Transport type": "IB",
                "Mtu": "2048[B]", "Link type": "IB", "Outstand reads": "16", "TX depth": "128",
                "CQ Moderation": "100"},
        info={"qps": 1, "mtu_bytes": 2048, "outstand_reads": 16, "gid_index": None},
        rows={0: (2, 20000, 9.12, 8.98, 4.710248), 15: (65536, 20000, 3670.14, 3669.96, 0.058719),
              22: (8388608, 20000, 3666.29, 3666.17, 0.000458)}),
    "stm_send_bw_a_mlx4_ib.txt": dict(
        test="Send BW Test", tool="ib_send_bw", unit="MB/sec", n=23,
        header={"Device": "mlx4_0", "Max inline data": "0[B]", "Mtu": "2048[B]", "Link type": "IB"},
        info={"qps": 1, "mtu_bytes": 2048, "max_inline_bytes": 0},
        rows={0: (2, 20000, 10.17, 9.90, 5.189724), 15: (65536, 20000, 3653.52, 3653.23, 0.058452),
              22: (8388608, 20000, 3662.23, 3661.76, 0.000458)}),
    "jebtang_send_bw_ud_a_v1.txt": dict(
        test="Send BW Test", tool="ib_send_bw", unit="MB/sec", n=11,
        header={"Connection type": "UD", "Mtu": "2048"},
        info={"connection": "UD", "mtu_bytes": 2048, "qps": None, "device": None},
        rows={0: (2, 1000, 7.51, 7.21, None), 10: (2048, 1000, 2923.29, 2919.91, None)},
        notes=["line 4: Inline data is used up to 1 bytes message"]),
    "pib4_atomic_bw_cmp_swap_client.txt": dict(
        test="Atomic CMP_AND_SWAP BW Test", tool="ib_atomic_bw", unit="MB/sec", n=1,
        header={"Device": "pib_1", "Number of qps": "1", "Connection type": "RC",
                "Outstand reads": "16", "Mtu": "4096[B]", "Link type": "IB"},
        info={"qps": 1, "using_srq": None, "outstand_reads": 16},
        rows={0: (8, 1000, 1.70, 1.67, 0.219031)},
        notes=["line 2: Device not recognized to implement inline feature. Disabling it"]),
}

#: Successful latency outputs: rows (size, iterations, t_min, t_max, t_typical, t_avg, t_stdev,
#: 99%, 99.9%) at chosen indexes, all usec.
LAT = {
    "stm_write_lat_a_mlx4_ib.txt": dict(
        test="RDMA_Write Latency Test", tool="ib_write_lat", n=23,
        header={"Device": "mlx4_0", "TX depth": "1", "Mtu": "2048[B]", "Max inline data": "220[B]"},
        rows={0: (2, 20000, 0.88, 6.84, 0.98, 1.03, 0.20, 1.21, 5.42),
              15: (65536, 20000, 19.69, 69.60, 19.97, 20.04, 0.64, 23.79, 25.30),
              22: (8388608, 20000, 2296.01, 2345.48, 2302.01, 2304.98, 6.43, 2327.01, 2335.48)}),
    "stm_read_lat_a_mlx4_ib.txt": dict(
        test="RDMA_Read Latency Test", tool="ib_read_lat", n=23,
        header={"Device": "mlx4_0", "Outstand reads": "16", "TX depth": "1"},
        rows={0: (2, 20000, 1.91, 13.87, 1.99, 2.01, 0.32, 2.13, 9.95),
              15: (65536, 20000, 19.62, 57.18, 20.00, 20.07, 0.73, 22.43, 28.74),
              22: (8388608, 20000, 2177.92, 2240.08, 2184.09, 2184.33, 2.24, 2192.22, 2202.42)}),
    "stm_send_lat_a_mlx4_ib.txt": dict(
        test="Send Latency Test", tool="ib_send_lat", n=23,
        header={"Device": "mlx4_0", "Max inline data": "236[B]"},
        rows={0: (2, 20000, 1.02, 11.76, 1.07, 1.11, 0.30, 1.68, 5.00),
              15: (65536, 20000, 19.89, 59.97, 20.08, 20.17, 0.77, 24.04, 31.27),
              22: (8388608, 20000, 2239.42, 4189.77, 2247.02, 2252.46, 65.03, 2287.38, 3761.26)}),
    "eugr_write_lat_rdma_cm.txt": dict(
        test="RDMA_Write Latency Test", tool="ib_write_lat", n=1,
        header={"Device": "rocep1s0f1", "PCIe relax order": "OFF", "rdma_cm QPs": "ON",
                "Max inline data": "220[B]", "Link type": "IB"},
        rows={0: (2, 1000, 1.42, 1.93, 1.47, 1.47, 0.00, 1.57, 1.93)}),
}

LAT_JSON = {
    "perftest216_write_lat_rxe_legacy.json": dict(
        test="RDMA_Write Latency Test", tool="ib_write_lat",
        info={"device": "rxe0", "qps": 1, "mtu_bytes": 1024, "gid_index": 1, "link_type": "Ethernet",
              "tx_depth": 1},
        row=(128, 5000, 2.37, 5.39, 2.42, 2.42, 0.05, 2.47, 4.03)),
}

#: Damaged or cut pastes: (parser, line number, reason fragment, fragment of the named line).
DAMAGED = {
    "perftest65_send_bw_markdown_bold.txt": (
        pt.parse_output, 3, "column value '**5544.28**' is not a number", "**5544.28**"),
    "ucx8852_read_bw_a_separators_stripped.txt": (
        pt.parse_output, 16, "unrecognised result table header", "#bytes     iterations"),
    "ucx8851_read_bw_a_ib_cut.txt": (
        pt.parse_output, 23, "table opened at line 19 is not closed", "38.95              2.5525"),
    "perftest234_write_bw_d10_server_cut.txt": (
        pt.parse_output, 26, "result row has 2 columns, the header at line 25 has 5", "65536      664644"),
    "perftest342_write_bw_rdma_cm_newest_cut.txt": (
        pt.parse_output, 24, "result row has 3 columns", "65536      247166           0.00"),
}

#: Failed runs: (kind, fragments of the message, the line parse_output names).
FAILED = {
    "perftest173_completion_status4_cuda.txt": (
        "completion_error", ["IBV_WC_LOC_PROT_ERR (status 4, \"local protection error\")",
                             "at the client", "wr_id 0", "syndrome 0x51", "828 posted / 700 completed",
                             "memory registration", "GPUDirect"], 4),
    "softiwarp27_completion_status12_one_line.txt": (
        "completion_error", ["IBV_WC_RETRY_EXC_ERR (status 12, \"transport retry counter exceeded\")",
                             "syndrome 0x81", "128 posted / 0 completed", "the peer stopped answering",
                             "drops packets"], 1),
    "project_softroce_completion_status5.txt": (
        "completion_error", ["IBV_WC_WR_FLUSH_ERR (status 5, \"Work Request Flushed Error\")",
                             "wr_id 6", "syndrome 0x0", "195 posted / 69 completed",
                             "already in the error state", "first non-flush error"], 4),
    "k8s112_write_bw_modify_qp_rtr.txt": (
        "cannot_connect", ["queue pairs could not be connected", "Failed to modify QP 218 to RTR",
                           "GID index (-x)", "this output shows an all-zero GID"], 20),
    "k8s72_write_bw_modify_qp_rtr_spaces.txt": (
        "cannot_connect", ["Failed to modify QP 59 to RTR", "this output shows an all-zero GID"], 19),
    "pib3_read_bw_a_server_read_keys.txt": (
        "cannot_connect", ["the peer ended the out-of-band exchange",
                           "Couldn't read remote address", "read its log"], 19),
    "sparkrdma31_read_bw_server_read_keys.txt": (
        "cannot_connect", ["the peer ended the out-of-band exchange", "read its log"], 21),
    "perftest228_write_bw_cannot_connect.txt": (
        "cannot_connect", ["Couldn't connect to 192.168.125.211:18515", "server was started first"], 2),
    "perftest54_write_bw_rdma_cm_rejected.txt": (
        "cannot_connect", ["Failed to connect RDMA CM"], 8),
    "perftest139_write_lat_irdma_create_qp.txt": (
        "resource_error", ["cannot create the queue pair", "Unable to create QP.", "inline size (-I"], 7),
    "softiwarp23_send_bw_siw_alloc_mr.txt": (
        "resource_error", ["cannot register the test buffer", "Couldn't allocate MR", "ulimit -l"], 18),
    "perftest26_send_bw_rdma_cm_alloc_mr.txt": (
        "resource_error", ["Couldn't allocate MR"], 6),
    "perftest31_write_bw_cuda_alloc_mr.txt": (
        "resource_error", ["Couldn't allocate MR", "nvidia-peermem"], 15),
    "perftest395_write_bw_hugepages.txt": (
        "resource_error", ["hugepage", "Failed to allocate hugepages. Please configure hugepages",
                           "kernel.shmmni"], 5),
    "lsgunth1_send_lat_port_down_quoted.txt": (
        "no_device", ["the RDMA port is down", "Port number 1 state is Down", "PORT_ACTIVE"], 4),
}

ALL = {**BW, **LAT, **LAT_JSON, **DAMAGED, **FAILED}


def test_every_public_fixture_is_expected_and_documented():
    files = {f.name for f in PUB.iterdir() if f.name != "README.md"}
    assert files == set(ALL), (files ^ set(ALL))
    assert len(files) >= 20
    readme = text("README.md")
    for name in files:
        assert f"`{name}`" in readme, f"{name} has no provenance entry in public/README.md"
    # every public entry names its source address (the project's own capture excepted)
    for line in readme.splitlines():
        m = re.match(r"\| `([^`]+)` \| (.*)", line)
        if m and m.group(1) in files and not m.group(1).startswith("project_"):
            assert "https://github.com/" in m.group(2) or "same file" in m.group(2) \
                or "(above)" in m.group(2), line


# --- bandwidth -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(BW))
def test_public_bandwidth_output(name):
    exp = BW[name]
    r = pt.parse_output(text(name), name)
    assert r.test == exp["test"] and r.tool == exp["tool"]
    assert r.raw_unit == exp["unit"] and len(r.rows) == exp["n"]
    for key, value in exp["header"].items():
        assert r.header[key] == value, key
    for key, value in exp["info"].items():
        assert r.info[key] == value, key
    assert r.notes == exp.get("notes", [])
    for i, (size, iters, peak, avg, rate) in exp["rows"].items():
        row = r.rows[i]
        assert (row.size_bytes, row.iterations, row.bw_peak_raw, row.bw_average_raw,
                row.msg_rate_mpps) == (size, iters, peak, avg, rate), (name, i)
        assert row.bw_average_Bps == pytest.approx(avg * pt.BW_UNITS[exp["unit"]])
    sizes = [x.size_bytes for x in r.rows]
    assert sizes == sorted(sizes)
    assert pt.classify_failure(text(name), 0, "h", exp["tool"]) is None


def test_header_with_tabs_pasted_as_spaces_is_read_pair_by_pair():
    # ucx / eugr / stm pastes carry the two-per-line header with spaces; each pair is its own key
    r = pt.parse_output(text("stm_read_bw_a_mlx4_ib.txt"))
    assert (r.header["Dual-port"], r.header["Device"]) == ("OFF", "mlx4_0")
    assert (r.header["Connection type"], r.header["Using SRQ"]) == ("RC", "OFF")
    # the newest layout: a second pair after "PCIe relax order:" with no space before its colon
    h = pt.parse_header(text("perftest342_write_bw_rdma_cm_newest_cut.txt")).header
    assert (h["PCIe relax order"], h["Lock-free"], h["ibv_wr* API"], h["Using DDP"]) == (
        "ON", "OFF", "OFF", "OFF")
    assert (h["Device"], h["GID index"], h["Data ex. method"]) == ("mlx5_0", "0", "rdma_cm")


def test_perftest_1x_table_without_msgrate():
    r = pt.parse_output(text("jebtang_send_bw_ud_a_v1.txt"))
    assert all(x.msg_rate_mpps is None for x in r.rows)
    rows = pt.to_rows(r, experiment="e", scenario="s", run_id="r")
    assert {x.metric for x in rows} == {"bw_average", "bw_peak"}  # no MsgRate column, no row
    assert len(rows) == 11 * 2
    first = [x for x in rows if x.metric == "bw_average"][0]
    assert first.value == pytest.approx(7.21 * MiB) and first.size_bytes == 2


def test_post_list_duration_peak_not_measured_rows():
    r = pt.parse_output(text("perftest273_write_postlist_d60_gbits.txt"))
    rows = pt.to_rows(r, experiment="e", scenario="s", run_id="r")
    peak = [x for x in rows if x.metric == "bw_peak"][0]
    assert peak.status == "not_measured" and peak.value is None
    rate = [x for x in rows if x.metric == "msg_rate"][0]
    assert rate.value == pytest.approx(7.498617e6) and rate.protocol == "roce"
    avg = [x for x in rows if x.metric == "bw_average"][0]
    assert avg.value == pytest.approx(0.48e9 / 8) and avg.devices == "ib0"


def test_old_gid_index_spelling_in_a_failed_run_header():
    h = pt.parse_header(text("softiwarp23_send_bw_siw_alloc_mr.txt"))
    assert h.test == "Send BW Test" and h.header["Gid index"] == "0"
    assert (h.info["gid_index"], h.info["transport"], h.info["device"]) == (0, "IW", "siw_ens33")
    h = pt.parse_header(text("k8s72_write_bw_modify_qp_rtr_spaces.txt"))
    assert (h.info["device"], h.info["gid_index"], h.info["mtu_bytes"]) == ("mlx5_2", 0, 1024)
    h = pt.parse_header(text("stm_send_lat_a_mlx4_ib.txt"))  # a latency title: a latency tool
    assert isinstance(h, pt.PerftestLatencyResult) and h.tool == "ib_send_lat" and h.rows == []
    assert pt.parse_header("Couldn't allocate MR\n").test is None


# --- latency ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(LAT))
def test_public_latency_output(name):
    exp = LAT[name]
    raw = text(name)
    r = pt.parse_latency_output(raw, name)
    assert r.test == exp["test"] and r.tool == exp["tool"] and len(r.rows) == exp["n"]
    assert r.raw_unit == "usec" and not r.bidirectional and r.notes == []
    for key, value in exp["header"].items():
        assert r.header[key] == value, key
    assert r.info["qps"] == 1 and r.info["transport"] == "IB"
    fields = ("size_bytes", "iterations", "t_min_us", "t_max_us", "t_typical_us", "t_avg_us",
              "t_stdev_us", "p99_us", "p999_us")
    for i, want in exp["rows"].items():
        assert tuple(getattr(r.rows[i], f) for f in fields) == want, (name, i)
    for x in r.rows:
        assert x.t_min_us <= x.t_typical_us <= x.t_max_us and x.p99_us <= x.p999_us <= x.t_max_us
        assert x.tps is None and x.cpu_util_pct is None
    # parse_output refuses it, by design, and names the table header
    with pytest.raises(ParseError, match="latency table") as e:
        pt.parse_output(raw, name)
    assert e.value.line.strip().startswith("#bytes #iterations    t_min[usec]")
    assert pt.classify_failure(raw, 0, "h", exp["tool"]) is None


def test_latency_rows_in_us():
    r = pt.parse_latency_output(text("stm_write_lat_a_mlx4_ib.txt"))
    rows = pt.to_rows(r, experiment="e", scenario="lat_sweep", run_id="r", side="client")
    assert len(rows) == 23 * 7
    assert {x.unit for x in rows} == {"us"} and {x.tool for x in rows} == {"ib_write_lat"}
    by = {(x.metric, x.size_bytes): x for x in rows}
    assert by[("latency_typical", 2)].value == 0.98 and by[("latency_typical", 2)].raw_unit == "usec"
    assert by[("latency_p999", 8388608)].value == 2335.48
    assert by[("latency_p99", 65536)].value == 23.79 and by[("latency_min", 65536)].value == 19.69
    assert by[("latency_avg", 2)].protocol == "ib" and by[("latency_avg", 2)].devices == "mlx4_0"
    assert by[("latency_stdev", 4096)].extra["line"] == 28


@pytest.mark.parametrize("name", sorted(LAT_JSON))
def test_public_latency_json(name):
    exp = LAT_JSON[name]
    r = pt.parse_latency_json(text(name), name)
    assert r.test == exp["test"] and r.tool == exp["tool"] and r.fmt == "json"
    for key, value in exp["info"].items():
        assert r.info[key] == value, key
    [row] = r.rows
    assert (row.size_bytes, row.iterations, row.t_min_us, row.t_max_us, row.t_typical_us,
            row.t_avg_us, row.t_stdev_us, row.p99_us, row.p999_us) == exp["row"]
    with pytest.raises(ParseError, match="latency test; use parse_latency_json"):
        pt.parse_json(text(name), "Gb/sec", source=name)
    rows = pt.to_rows(r, experiment="e", scenario="s", run_id="r")
    assert {x.metric: x.value for x in rows}["latency_p999"] == 4.03


def test_latency_layouts_from_perftest_source():
    # The duration (-D) and pre-2016 layouts, written with perftest's own formats
    # (RESULT_FMT_LAT_DUR / REPORT_FMT_LAT_DUR, and the 2013 RESULT_FMT_LAT / REPORT_FMT_LAT of
    # src/perftest_parameters.h): no public paste of these was found.
    sep = "-" * 87
    dur = (f"{sep}\n                    Send Latency Test\n Device         : mlx5_0\n{sep}\n"
           " #bytes        #iterations       t_avg[usec]    tps average\n"
           " 2             1845003            2.71           369000.56\n" f"{sep}\n")
    r = pt.parse_latency_output(dur)
    [row] = r.rows
    assert (row.size_bytes, row.iterations, row.t_avg_us, row.tps, row.t_min_us) == (
        2, 1845003, 2.71, 369000.56, None)
    assert {x.metric for x in pt.to_rows(r, experiment="e", scenario="s", run_id="r")} == {
        "latency_avg", "tps"}
    old = (f"{sep}\n                    RDMA_Write Latency Test\n{sep}\n"
           " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]\n"
           " 2       1000          0.97           5.82         1.02   \n" f"{sep}\n")
    [row] = pt.parse_latency_output(old).rows
    assert (row.t_min_us, row.t_max_us, row.t_typical_us, row.t_avg_us) == (0.97, 5.82, 1.02, None)


# --- damaged pastes --------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(DAMAGED))
def test_damaged_paste_names_the_line(name):
    parser, line_no, reason, fragment = DAMAGED[name]
    raw = text(name)
    with pytest.raises(ParseError) as e:
        parser(raw, name)
    err = e.value
    assert (err.source, err.line_no) == (name, line_no)
    assert reason in str(err) and fragment in err.line
    assert err.line == raw.splitlines()[line_no - 1]
    assert f"{name}, line {line_no}" in str(err)


def test_damaged_pastes_are_not_mistaken_for_a_known_failure():
    # a cut or mangled success is not a failed run: nothing to classify with rc 0
    for name in DAMAGED:
        assert pt.classify_failure(text(name), 0, "h", "ib_write_bw") is None, name


# --- failures --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(FAILED))
def test_public_failure_is_classified(name):
    kind, fragments, parse_line = FAILED[name]
    raw = text(name)
    assert kind in TOOL_ERROR_KINDS
    err = pt.classify_failure(raw, 1, "B", "ib_write_bw")
    assert isinstance(err, ToolError) and err.kind == kind, (name, err)
    msg = str(err)
    assert msg.startswith("ib_write_bw on host B: ") and "exit status 1" in msg
    for frag in fragments:
        assert frag in msg, (name, frag, msg)
    # the parser never takes a failed run for a result, and names the line it stopped at
    with pytest.raises(ParseError) as e:
        pt.parse_output(raw, name)
    assert e.value.line_no == parse_line, (name, e.value)
    assert err.to_dict()["kind"] == kind


def test_completion_error_records():
    [e] = pt.completion_errors(text("perftest173_completion_status4_cuda.txt"))
    assert (e.side, e.status, e.name, e.description, e.wr_id, e.syndrome, e.posted, e.completed) == (
        "client", 4, "IBV_WC_LOC_PROT_ERR", "local protection error", 0, "0x51", 828, 700)
    [e] = pt.completion_errors(text("softiwarp27_completion_status12_one_line.txt"))
    assert (e.status, e.name, e.syndrome, e.posted, e.completed) == (
        12, "IBV_WC_RETRY_EXC_ERR", "0x81", 128, 0)
    [e] = pt.completion_errors(text("project_softroce_completion_status5.txt"))
    assert (e.status, e.name, e.wr_id, e.posted, e.completed) == (5, "IBV_WC_WR_FLUSH_ERR", 6, 195, 69)
    assert pt.completion_errors(text("stm_write_lat_a_mlx4_ib.txt")) == []


def test_completion_error_newest_format_and_first_cause():
    # perftest PR #342 (2025) prints the status string: "Failed status-<str> (<n>): ...", from
    # NOTIFY_COMP_ERROR_SEND/RECV in src/perftest_resources.h; and a flush after a real error
    # is reported as the consequence of the first
    log = (" Completion with error at client\n"
           " Failed status-transport retry counter exceeded (12): wr_id 0 syndrom 0x81\n"
           " scnt=128, ccnt=0\n"
           " Completion with error at server\n"
           " Failed status-Work Request Flushed Error (5): wr_id 3 syndrom 0x0\n"
           " rcnt=17\n")
    first, second = pt.completion_errors(log)
    assert (first.status, first.description, first.posted) == (12, "transport retry counter exceeded", 128)
    assert (second.side, second.status, second.received) == ("server", 5, 17)
    err = pt.classify_failure(log, 1, "A", "ib_send_bw")
    assert err.kind == "completion_error" and "IBV_WC_RETRY_EXC_ERR" in err.detail
    assert "the first of 2 reports" in err.detail
    flush_first = log.split(" Completion with error at server\n")[1]
    flush_first = " Completion with error at server\n" + flush_first
    err = pt.classify_failure(flush_first + log, 1, "A", "ib_send_bw")
    assert "IBV_WC_RETRY_EXC_ERR" in err.detail  # the flush is not taken for the cause


@pytest.mark.parametrize("status, name, needle", [
    (2, "IBV_WC_LOC_QP_OP_ERR", "max_inline_data"),
    (10, "IBV_WC_REM_ACCESS_ERR", "rkey"),
    (13, "IBV_WC_RNR_RETRY_EXC_ERR", "receiver had no receive posted"),
    (42, "unknown ibv_wc_status 42", "ibv_poll_cq"),
])
def test_completion_error_each_status_says_what_to_check(status, name, needle):
    log = (f" Completion with error at client\n Failed status {status}: wr_id 1 syndrom 0x0\n"
           "scnt=10, ccnt=9\n")
    err = pt.classify_failure(log, 1, "A", "ib_read_bw")
    assert err.kind == "completion_error" and name in err.detail and needle in err.check


def test_resource_error_outranks_the_rdma_cm_errors_it_causes():
    # perftest#26: the rdma_cm client errors follow the failed MR registration
    raw = text("perftest26_send_bw_rdma_cm_alloc_mr.txt")
    assert "Unable to perform rdma_client function" in raw
    assert pt.classify_failure(raw, 1, "A", "ib_send_bw").kind == "resource_error"
