"""perftest.text: the text report's parser over real captures (Soft-RoCE, public outputs) and the
folder's composed files, and every way a report can be damaged (captures.py says where each came from)."""
from __future__ import annotations

import re
import shlex

import pytest

from lab.tools.perftest.captures import (ALL, BW, DAMAGED, LAT, MANIFEST, PUB, SR, SUCCESS, load, parse_real, public,
                                         real)
from peercache.lab.errors import ParseError
from peercache.lab.tools import perftest as pt


# --- the captures themselves ------------------------------------------------------------------

def test_manifest_covers_the_captures():
    assert len(SUCCESS) == 42  # 20 pairs (one client failed -w), port-in-use first+client, ready probe
    # every capture file belongs to a manifest entry (or is the script / a json / a note)
    names = {n for n, _ in MANIFEST}
    for f in SR.iterdir():
        if f.name in ("capture.sh", "manifest.tsv", "README.md", "versions.txt"):
            continue
        stem = f.name.split(".")[0]
        assert stem in names, f"{f.name} is not in manifest.tsv"
    # failures ran too, with their real exit codes
    assert MANIFEST[("err_no_device_server", "server")][0] == 7
    for name in ("err_no_device_client", "err_no_server", "err_no_server_rdma_cm",
                 "err_all_sizes_duration", "err_margin", "read_below_limit_merged"):
        assert MANIFEST[(name, "client")][0] == 1, name
    assert MANIFEST[("err_port_in_use", "server")][0] == 1
    assert MANIFEST[("read_below_limit", "client")][0] == 1


def test_version_and_devices():
    v = real("versions.txt")
    assert "Version: 6.06" in v and "perftest\t4.5+0.17-1" in v and "6.1.0-57-amd64" in v
    assert "(exit 1)" in v  # perftest --version exits 1 while printing its version
    assert [ln.split()[0] for ln in real("ibv_devices.txt").splitlines()[2:]] == [
        "rxe_a0", "rxe_b0", "rxe_a1", "rxe_b1"]
    dv = real("ibv_devinfo_v_rxe_b0.txt")
    assert "hca_id:\trxe_b0" in dv and re.search(r"active_mtu:\s+1024 \(3\)", dv)
    assert re.search(r"GID\[  1\]:\s+::ffff:198\.18\.0\.2, RoCE v2", dv)


def test_every_public_fixture_is_expected_and_documented():
    files = {f.name for f in PUB.iterdir() if f.name != "README.md"}
    assert files == set(ALL), (files ^ set(ALL))
    assert len(files) >= 20
    readme = public("README.md")
    for name in files:
        assert f"`{name}`" in readme, f"{name} has no provenance entry in public/README.md"
    # every public entry names its source address (the project's own capture excepted)
    for line in readme.splitlines():
        m = re.match(r"\| `([^`]+)` \| (.*)", line)
        if m and m.group(1) in files and not m.group(1).startswith("project_"):
            assert "https://github.com/" in m.group(2) or "same file" in m.group(2) \
                or "(above)" in m.group(2), line


# --- bandwidth tables -------------------------------------------------------------------------

def test_mib_table_and_header():
    r = pt.parse_output(load("read_bw_q16_mib.txt"), "read_bw_q16_mib.txt")
    info = r.info
    assert info["tool"] == "ib_read_bw" and info["device"] == "mlx5_bond_1"
    assert (info["qps"], info["gid_index"], info["mtu_bytes"]) == (16, 3, 4096)
    assert info["link_type"] == "Ethernet" and info["transport"] == "IB"
    assert info["outstand_reads"] == 16 and info["rdma_cm"] == "OFF"
    [row] = r.rows
    assert row.raw_unit == "MiB/sec" and row.size_bytes == 131072 and row.iterations == 1000
    assert row.bw_average_raw == 46730.04
    assert row.bw_average_Bps == pytest.approx(46730.04 * 1048576)
    assert row.bw_average_gbps == pytest.approx(392.0, abs=0.01)
    assert row.msg_rate_mpps == 0.37384 and row.cpu_util_pct is None


def test_old_mb_label_is_the_same_binary_unit():
    r = pt.parse_output(load("write_bw_mb_old.txt"))
    [row] = r.rows
    assert row.raw_unit == "MB/sec"
    assert row.bw_average_Bps == pytest.approx(11030.45 * 2 ** 20)
    assert r.info["gid_index"] is None  # IB run: no GID index line printed, not invented


def test_gbits_duration_mode_cpu_util():
    # real: ib_write_bw -d rxe_b0 -x 1 -s 131072 -q 4 -D 2 --report_gbits --cpu_util 198.18.0.1
    r = pt.parse_output(real("write_d2_q4_gbits_cpu.client.stdout"))
    [row] = r.rows
    assert row.raw_unit == "Gb/sec" and row.bw_average_raw == 0.050243
    assert row.bw_average_Bps == pytest.approx(0.050243e9 / 8)
    assert row.bw_peak_raw is None and row.bw_peak_Bps is None  # printed 0.000000: not measured
    assert row.cpu_util_pct == 0.0 and row.iterations == 96 and row.msg_rate_mpps == 0.000048
    rows = pt.to_rows(r, experiment="e", scenario="msgsize_sweep", run_id="r1", side="client")
    peak = [x for x in rows if x.metric == "bw_peak"][0]
    assert peak.status == "not_measured" and peak.value is None and "0.00" in peak.reason
    cpu = [x for x in rows if x.metric == "cpu_util"][0]
    assert (cpu.value, cpu.unit) == (0.0, "%")
    assert {x.qps for x in rows} == {4} and {x.tool for x in rows} == {"ib_write_bw"}


def test_all_sizes_sweep_one_row_per_size():
    # real: ib_write_bw -d rxe_b0 -x 1 -a -q 1 -n 5 --report_gbits 198.18.0.1
    r = pt.parse_output(real("write_all_gbits.client.stdout"))
    assert [x.size_bytes for x in r.rows] == [1 << i for i in range(1, 24)]
    assert r.rows[0].bw_average_raw == 0.000081  # printed with 6 decimals below 0.1 Gb/s
    assert r.rows[11].bw_average_raw == 0.17 and r.rows[11].size_bytes == 4096  # 2 decimals
    assert all(x.table == "main" for x in r.rows)
    rows = pt.to_rows(r, experiment="e", scenario="s", run_id="r")
    assert len(rows) == 23 * 3 and {x.size_bytes for x in rows} == {1 << i for i in range(1, 24)}


def test_bidirectional_report_both_tables():
    # real: ib_write_bw -d rxe_b0 -x 1 -s 65536 -q 1 -n 200 -b --report-both --report_gbits 198.18.0.1
    r = pt.parse_output(real("write_bidir_s65536_report_both.client.stdout"))
    assert r.bidirectional
    assert [x.table for x in r.rows] == ["main", "local", "remote"]
    main, local, remote = r.rows
    assert main.bw_average_raw == 0.57
    assert (local.bw_average_raw, remote.bw_average_raw) == (0.30, 0.27)
    assert local.bw_average_raw + remote.bw_average_raw == pytest.approx(0.57)
    rows = pt.to_rows(r, experiment="e", scenario="s", run_id="r")
    assert {x.extra["table"] for x in rows} == {"main", "local", "remote"}


# --- every Soft-RoCE success capture, checked against its own command and its own text --------

def _header_lines(raw: str) -> list[str]:
    """The lines between the title and the next separator, read independently of the parser."""
    lines = raw.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip().endswith("BW Test"))
    out = []
    for ln in lines[start + 1:]:
        if ln.startswith("-----"):
            break
        out.append(ln)
    return out


@pytest.mark.parametrize("name, side", SUCCESS, ids=[f"{n}.{s}" for n, s in SUCCESS])
def test_every_success_capture(name, side):
    fname = f"{name}.{side}.stdout"
    raw = real(fname)
    r = pt.parse_output(raw, fname)
    _, cmd = MANIFEST[(name, side)]
    argv = shlex.split(cmd)
    if argv[0] == "perf":
        argv = argv[argv.index("--") + 1:]
    opt = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("-d", "-x", "-q", "-s", "-n", "-D")}

    # every "key : value" of the header block is read, two per line included
    pairs = 0
    for ln in _header_lines(raw):
        for part in re.split(r"\t\t+", ln.strip()):
            key, _, value = part.partition(":")
            assert r.header[key.strip()] == value.strip(), (fname, ln)
            pairs += 1
    assert pairs == len(r.header) >= 15
    assert r.notes == []  # stdout alone: nothing unplaced

    info = r.info
    assert info["tool"] == argv[0]
    assert info["device"] == opt["-d"] == ("rxe_b0" if side == "client" else "rxe_a0")
    assert info["gid_index"] == int(opt["-x"]) == 1
    assert info["qps"] == int(opt["-q"])
    assert (info["transport"], info["connection"], info["link_type"]) == ("IB", "RC", "Ethernet")
    # rxe: active MTU 1024 (netdev MTU 1500); perftest moderates completions per 1 here, per
    # -n with -a -n 5
    assert info["mtu_bytes"] == 1024 and info["cq_moderation"] == (5 if "-a" in argv else 1)
    assert info["rdma_cm"] == ("ON" if "-R" in argv else "OFF")
    assert info["data_exchange"] == ("rdma_cm" if "-R" in argv else "Ethernet")
    # the sending side prints TX depth: the client, and with -b the server too (perftest lowers
    # the default 128 to the iteration count of -a -n 5)
    sends = side == "client" or "-b" in argv
    assert info["tx_depth"] == ((5 if "-a" in argv else 128) if sends else None)
    if argv[0] == "ib_read_bw":
        assert info["outstand_reads"] == 128 and info["max_inline_bytes"] is None
    else:
        assert info["outstand_reads"] is None and info["max_inline_bytes"] == 0
    assert r.bidirectional == ("-b" in argv)
    assert r.test == {"ib_read_bw": "RDMA_Read", "ib_write_bw": "RDMA_Write",
                      "ib_send_bw": "Send"}[argv[0]] + (" Bidirectional" if "-b" in argv else "") + " BW Test"

    unit = "Gb/sec" if "--report_gbits" in argv else "MB/sec"
    assert r.raw_unit == unit
    main = [x for x in r.rows if x.table == "main"]
    if "-a" in argv:
        # the client prints 2 .. 2^23; the server only the last size
        want = [1 << i for i in range(1, 24)] if side == "client" else [1 << 23]
        assert [x.size_bytes for x in main] == want
    else:
        assert [x.size_bytes for x in main] == [int(opt["-s"])]
    for x in r.rows:
        if "-n" in opt:
            assert x.iterations == int(opt["-n"]) * int(opt["-q"])
        assert x.bw_average_raw > 0
        # MsgRate is the average bandwidth over the message size: the unit conversion checks out
        # within the printed precision (2 or 6 decimals of the bandwidth, 6 of the rate)
        bw_step = 0.005 if x.bw_average_raw >= 0.1 or unit == "MB/sec" else 0.0000005
        tol = bw_step * pt.BW_UNITS[unit] + 0.0000005e6 * x.size_bytes
        assert abs(x.bw_average_Bps - x.msg_rate_mpps * 1e6 * x.size_bytes) <= tol, (fname, x)
        measured_peak = "-D" not in opt and not (argv[0] == "ib_send_bw" and side == "server")
        if measured_peak:
            assert x.bw_peak_raw is not None and x.bw_peak_raw >= x.bw_average_raw
        else:
            assert x.bw_peak_raw is None  # printed 0.00 / 0.000000: not measured
        assert (x.cpu_util_pct is not None) == ("--cpu_util" in argv)
    rows = pt.to_rows(r, experiment="softroce", scenario="fixtures", run_id=name, side=side)
    assert {x.tool for x in rows} == {argv[0]} and {x.protocol for x in rows} == {"roce"}


# --- Soft-RoCE captures: concrete values, read off the files by hand --------------------------

@pytest.mark.parametrize("fname, line_no, size, iters, peak, avg, rate", [
    ("read_s131072_q1.client.stdout", 24, 131072, 200, 35.97, 32.47, 0.000260),
    ("read_s131072_q1.server.stdout", 27, 131072, 200, 35.97, 32.47, 0.000260),
    ("read_s131072_q4.client.stdout", 36, 131072, 800, 39.94, 35.02, 0.000280),
    ("write_s131072_q1.client.stdout", 23, 131072, 200, 37.15, 34.53, 0.000276),
    ("write_s131072_q4.server.stdout", 38, 131072, 800, 37.18, 36.76, 0.000294),
    ("send_s131072_q1.client.stdout", 23, 131072, 200, 37.67, 36.62, 0.000293),
    ("send_s131072_q1.server.stdout", 27, 131072, 200, None, 36.84, 0.000295),
    ("read_s131072_q1_gbits.client.stdout", 24, 131072, 200, 0.32, 0.31, 0.000297),
    ("write_s131072_q4_gbits.client.stdout", 35, 131072, 800, 0.29, 0.28, 0.000264),
    ("read_d2_q1.client.stdout", 24, 131072, 496, None, 30.96, 0.000248),
    ("write_rdma_cm_s131072.server.stdout", 29, 131072, 200, 51.23, 49.78, 0.000398),
    ("read_bidir_s65536.client.stdout", 24, 65536, 200, 79.76, 73.49, 0.001176),
    ("write_bidir_s65536.client.stdout", 23, 65536, 200, 0.59, 0.54, 0.001036),
])
def test_fixed_size_rows(fname, line_no, size, iters, peak, avg, rate):
    [row] = parse_real(fname).rows
    assert (row.line_no, row.size_bytes, row.iterations) == (line_no, size, iters)
    assert (row.bw_peak_raw, row.bw_average_raw, row.msg_rate_mpps) == (peak, avg, rate)


def test_read_header_of_client_and_server():
    c = parse_real("read_s131072_q1.client.stdout")
    assert c.header == {
        "Dual-port": "OFF", "Device": "rxe_b0", "Number of qps": "1", "Transport type": "IB",
        "Connection type": "RC", "Using SRQ": "OFF", "PCIe relax order": "ON", "ibv_wr* API": "OFF",
        "TX depth": "128", "CQ Moderation": "1", "Mtu": "1024[B]", "Link type": "Ethernet",
        "GID index": "1", "Outstand reads": "128", "rdma_cm QPs": "OFF", "Data ex. method": "Ethernet"}
    s = parse_real("read_s131072_q1.server.stdout")
    assert s.header["Device"] == "rxe_a0" and "TX depth" not in s.header
    assert {k: v for k, v in s.header.items() if k != "Device"} == {
        k: v for k, v in c.header.items() if k not in ("Device", "TX depth")}
    q4 = parse_real("write_s131072_q4.client.stdout")
    assert q4.info["qps"] == 4 and q4.header["Number of qps"] == "4"
    assert q4.header["Max inline data"] == "0[B]" and q4.info["max_inline_bytes"] == 0
    srv = parse_real("send_s131072_q1.server.stdout")
    assert srv.header["RX depth"] == "200" and srv.info["rx_depth"] == 200
    assert srv.info["tool"] == "ib_send_bw" and srv.test == "Send BW Test"


def test_all_sizes_sweeps():
    w = parse_real("write_all_gbits.client.stdout")
    assert len(w.rows) == 23 and w.raw_unit == "Gb/sec"
    first, r2048, r4096, last = w.rows[0], w.rows[10], w.rows[11], w.rows[-1]
    # below 0.1 Gb/s perftest prints 6 decimals, from 0.1 on 2
    assert (first.size_bytes, first.bw_peak_raw, first.bw_average_raw, first.msg_rate_mpps) == (
        2, 0.000193, 0.000081, 0.005054)
    assert (r2048.size_bytes, r2048.bw_average_raw) == (2048, 0.079531)
    assert (r4096.size_bytes, r4096.bw_peak_raw, r4096.bw_average_raw) == (4096, 0.24, 0.17)
    assert (last.size_bytes, last.iterations, last.bw_average_raw, last.msg_rate_mpps) == (
        8388608, 5, 0.28, 0.000004)
    assert last.bw_average_Bps == pytest.approx(0.28e9 / 8)
    assert [x.line_no for x in w.rows] == list(range(23, 46))
    rd = parse_real("read_all.client.stdout")
    assert rd.raw_unit == "MB/sec" and [x.size_bytes for x in rd.rows] == [1 << i for i in range(1, 24)]
    by = {x.size_bytes: x for x in rd.rows}
    assert (by[2].bw_average_raw, by[65536].bw_average_raw, by[8388608].bw_average_raw) == (0.01, 36.84, 9.87)
    assert by[16384].bw_peak_raw == 24.54 and by[8388608].msg_rate_mpps == 0.000001
    [srv] = parse_real("read_all.server.stdout").rows
    assert (srv.size_bytes, srv.bw_average_raw) == (8388608, 9.87)
    rows = pt.to_rows(w, experiment="e", scenario="s", run_id="r")
    assert len(rows) == 23 * 3 and {x.size_bytes for x in rows} == {1 << i for i in range(1, 24)}


def test_duration_mode_cpu_util():
    r = parse_real("write_d2_q4_gbits_cpu.client.stdout")
    [row] = r.rows
    assert r.info["qps"] == 4 and row.raw_unit == "Gb/sec"
    assert (row.size_bytes, row.iterations, row.bw_average_raw, row.msg_rate_mpps) == (
        131072, 96, 0.050243, 0.000048)
    assert row.bw_peak_raw is None  # printed 0.000000 in duration mode: not measured
    assert row.cpu_util_pct == 0.0  # printed 0.00 (as printed; the TCG guest's /proc/stat)
    rows = pt.to_rows(r, experiment="e", scenario="s", run_id="r")
    peak = [x for x in rows if x.metric == "bw_peak"][0]
    assert peak.status == "not_measured" and peak.value is None
    assert [x.value for x in rows if x.metric == "cpu_util"] == [0.0]
    [srow] = parse_real("write_d2_q4_gbits_cpu.server.stdout").rows
    assert (srow.iterations, srow.bw_average_raw, srow.cpu_util_pct) == (96, 0.050243, 0.0)
    [d] = parse_real("read_d2_q1.client.stdout").rows
    assert d.raw_unit == "MB/sec" and d.bw_peak_raw is None and d.cpu_util_pct is None


def test_bidirectional_report_both():
    c = parse_real("write_bidir_s65536_report_both.client.stdout")
    assert c.bidirectional and [x.table for x in c.rows] == ["main", "local", "remote"]
    main, local, remote = c.rows
    assert (main.bw_peak_raw, main.bw_average_raw, main.msg_rate_mpps) == (0.62, 0.57, 0.001090)
    assert (local.bw_average_raw, local.msg_rate_mpps) == (0.30, 0.000571)
    assert (remote.bw_peak_raw, remote.bw_average_raw, remote.msg_rate_mpps) == (0.32, 0.27, 0.000520)
    assert local.bw_average_raw + remote.bw_average_raw == pytest.approx(main.bw_average_raw)
    assert [x.line_no for x in c.rows] == [23, 29, 35]
    s = parse_real("write_bidir_s65536_report_both.server.stdout")
    # the server's local is the client's remote and the other way round
    assert [(x.table, x.bw_average_raw) for x in s.rows] == [
        ("main", 0.57), ("local", 0.27), ("remote", 0.30)]
    rows = pt.to_rows(c, experiment="e", scenario="s", run_id="r")
    assert {x.extra["table"] for x in rows} == {"main", "local", "remote"}
    assert all(x.extra["bidirectional"] for x in rows)
    plain = parse_real("read_bidir_s65536.server.stdout")
    assert plain.test == "RDMA_Read Bidirectional BW Test" and plain.bidirectional
    assert [x.table for x in plain.rows] == ["main"]


def test_rdma_cm_server_lines_are_known():
    s = parse_real("write_rdma_cm_s131072.server.stdout")
    raw = real("write_rdma_cm_s131072.server.stdout")
    assert "Waiting for client rdma_cm QP to connect" in raw and s.notes == []
    assert s.info["rdma_cm"] == "ON" and s.info["data_exchange"] == "rdma_cm"


# --- public outputs ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(BW))
def test_public_bandwidth_output(name):
    exp = BW[name]
    r = pt.parse_output(public(name), name)
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
    assert pt.classify_failure(public(name), 0, "h", exp["tool"]) is None


def test_header_with_tabs_pasted_as_spaces_is_read_pair_by_pair():
    # ucx / eugr / stm pastes carry the two-per-line header with spaces; each pair is its own key
    r = pt.parse_output(public("stm_read_bw_a_mlx4_ib.txt"))
    assert (r.header["Dual-port"], r.header["Device"]) == ("OFF", "mlx4_0")
    assert (r.header["Connection type"], r.header["Using SRQ"]) == ("RC", "OFF")
    # the newest layout: a second pair after "PCIe relax order:" with no space before its colon
    h = pt.parse_header(public("perftest342_write_bw_rdma_cm_newest_cut.txt")).header
    assert (h["PCIe relax order"], h["Lock-free"], h["ibv_wr* API"], h["Using DDP"]) == (
        "ON", "OFF", "OFF", "OFF")
    assert (h["Device"], h["GID index"], h["Data ex. method"]) == ("mlx5_0", "0", "rdma_cm")


def test_old_gid_index_spelling_in_a_failed_run_header():
    h = pt.parse_header(public("softiwarp23_send_bw_siw_alloc_mr.txt"))
    assert h.test == "Send BW Test" and h.header["Gid index"] == "0"
    assert (h.info["gid_index"], h.info["transport"], h.info["device"]) == (0, "IW", "siw_ens33")
    h = pt.parse_header(public("k8s72_write_bw_modify_qp_rtr_spaces.txt"))
    assert (h.info["device"], h.info["gid_index"], h.info["mtu_bytes"]) == ("mlx5_2", 0, 1024)
    h = pt.parse_header(public("stm_send_lat_a_mlx4_ib.txt"))  # a latency title: a latency tool
    assert isinstance(h, pt.PerftestLatencyResult) and h.tool == "ib_send_lat" and h.rows == []
    assert pt.parse_header("Couldn't allocate MR\n").test is None


# --- latency tables ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(LAT))
def test_public_latency_output(name):
    exp = LAT[name]
    raw = public(name)
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


# --- corrupt, truncated and damaged text ------------------------------------------------------

def _cut_after(text: str, marker: str) -> str:
    i = text.index(marker)
    return text[: i + len(marker)]


def test_truncated_row_names_the_line():
    text = load("read_bw_q16_mib.txt")
    bad = _cut_after(text, " 131072     1000             46758")
    with pytest.raises(ParseError) as e:
        pt.parse_output(bad, "cut.txt")
    assert "cut.txt, line" in str(e.value) and "46758" in str(e.value)


def test_table_without_closing_line_is_truncated():
    text = real("write_all_gbits.client.stdout")
    bad = _cut_after(text, " 65536      5                0.31               0.29   \t\t   0.000562\n")
    with pytest.raises(ParseError, match="not closed"):
        pt.parse_output(bad)


def test_garbage_number_and_garbage_line_in_table():
    text = load("write_bw_mb_old.txt")
    with pytest.raises(ParseError, match="not a number"):
        pt.parse_output(text.replace("11030.45", "11O30.45"))
    with pytest.raises(ParseError, match="unexpected line inside"):
        pt.parse_output(text.replace(" 65536      5000", "garbage here\n 65536      5000"))


def test_header_only_is_an_error():
    text = load("read_bw_q16_mib.txt")
    with pytest.raises(ParseError, match="no bandwidth result table"):
        pt.parse_output(text.split(" #bytes")[0])
    with pytest.raises(ParseError):
        pt.parse_output("")


def test_noise_inside_table_is_kept_as_note():
    text = load("read_bw_q16_mib.txt").replace(
        "MsgRate[Mpps]\n", "MsgRate[Mpps]\nConflicting CPU frequency values detected: 1846.55 != "
        "2596.39. CPU Frequency is not max.\n")
    r = pt.parse_output(text)
    assert len(r.rows) == 1 and "Conflicting CPU frequency" in r.notes[0]


def test_unknown_unit_is_an_error():
    with pytest.raises(ParseError, match="unknown bandwidth unit"):
        pt.parse_output(load("write_bw_mb_old.txt").replace("MB/sec", "KB/sec"))


@pytest.mark.parametrize("name", sorted(DAMAGED))
def test_damaged_paste_names_the_line(name):
    parser, line_no, reason, fragment = DAMAGED[name]
    raw = public(name)
    with pytest.raises(ParseError) as e:
        parser(raw, name)
    err = e.value
    assert (err.source, err.line_no) == (name, line_no)
    assert reason in str(err) and fragment in err.line
    assert err.line == raw.splitlines()[line_no - 1]
    assert f"{name}, line {line_no}" in str(err)


def test_empty_stdout_of_failures_is_a_parse_error():
    for name in ("err_no_device_server.server", "err_no_server_rdma_cm.client"):
        assert real(f"{name}.stdout") == ""
        with pytest.raises(ParseError, match="no bandwidth result table"):
            pt.parse_output(real(f"{name}.stdout"), name)
    with pytest.raises(ParseError, match="no bandwidth result table") as e:
        pt.parse_output(real("err_port_in_use.server.stdout"), "err_port_in_use.server.stdout")
    assert "line 5" in str(e.value)


# --- stdout and stderr in one file ------------------------------------------------------------

def test_merged_log_success_keeps_stderr_line_as_note():
    r = parse_real("read_s131072_q1_merged.client.merged")
    [row] = r.rows
    assert (row.line_no, row.bw_peak_raw, row.bw_average_raw, row.msg_rate_mpps) == (25, 36.90, 20.84, 0.000167)
    assert r.notes == ["line 1: Device not recognized to implement inline feature. Disabling it"]
    assert r.info["device"] == "rxe_b0" and r.info["outstand_reads"] == 128
    s = parse_real("read_s131072_q1_merged.server.merged")
    assert s.rows[0].bw_average_raw == 20.84 and len(s.notes) == 1


def test_merged_log_with_glued_error_is_a_parse_error_naming_the_line():
    raw = real("read_below_limit_merged.client.merged")
    with pytest.raises(ParseError) as e:
        pt.parse_output(raw, "m.merged")
    msg = str(e.value)
    assert "m.merged, line 25" in msg and "glued" in msg
    assert "'Error: BW result is below bw limit'" in msg
    assert "0.000299Error" in msg  # the line itself
    err = pt.classify_failure(raw, MANIFEST[("read_below_limit_merged", "client")][0], "B", "ib_read_bw")
    assert err.kind == "below_limit"
