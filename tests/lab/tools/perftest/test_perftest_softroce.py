"""perftest parser against real captures: perftest 6.06 (Debian 4.5+0.17) on Soft-RoCE.

The files under tests/fixtures/lab/perftest/softroce were captured in the QEMU
guest (kernel 6.1.0-57-amd64, rxe_a0 on pcg0a 198.18.0.1 = server, rxe_b0 on
pcg0b 198.18.0.2 = client) by capture.sh in that folder; manifest.tsv holds the
exact command and exit status of every process. These tests need no device.
"""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from peercache.lab.tools import perftest as pt
from peercache.lab.errors import ParseError, ToolError

SR = Path(__file__).resolve().parents[3] / "fixtures" / "lab" / "perftest" / "softroce"
MiB = 1 << 20


def _manifest() -> dict[tuple[str, str], tuple[int, str]]:
    out = {}
    for line in (SR / "manifest.tsv").read_text().splitlines():
        name, side, rc, cmd = line.split("\t")
        out[(name, side)] = (int(rc), cmd)
    return out


MANIFEST = _manifest()


def text(name: str) -> str:
    return (SR / name).read_text()


def parse(name: str) -> pt.PerftestResult:
    return pt.parse_output(text(name), name)


#: Every perftest process that exited 0 and printed a result table (name, side).
SUCCESS = sorted(k for k, (rc, cmd) in MANIFEST.items()
                 if rc == 0 and k[1] in ("server", "client", "first")
                 and (SR / f"{k[0]}.{k[1]}.stdout").exists()
                 and "#bytes" in (SR / f"{k[0]}.{k[1]}.stdout").read_text())


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
    v = text("versions.txt")
    assert "Version: 6.06" in v and "perftest\t4.5+0.17-1" in v and "6.1.0-57-amd64" in v
    assert "(exit 1)" in v  # perftest --version exits 1 while printing its version
    assert [ln.split()[0] for ln in text("ibv_devices.txt").splitlines()[2:]] == [
        "rxe_a0", "rxe_b0", "rxe_a1", "rxe_b1"]
    dv = text("ibv_devinfo_v_rxe_b0.txt")
    assert "hca_id:\trxe_b0" in dv and re.search(r"active_mtu:\s+1024 \(3\)", dv)
    assert re.search(r"GID\[  1\]:\s+::ffff:198\.18\.0\.2, RoCE v2", dv)


# --- every success output, checked against its own command and its own text ---------

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
    raw = text(fname)
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


# --- concrete values, read off the files by hand --------------------------------------

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
    [row] = parse(fname).rows
    assert (row.line_no, row.size_bytes, row.iterations) == (line_no, size, iters)
    assert (row.bw_peak_raw, row.bw_average_raw, row.msg_rate_mpps) == (peak, avg, rate)


def test_mb_label_of_6_06_is_mebibytes():
    [row] = parse("read_s131072_q1.client.stdout").rows
    assert row.raw_unit == "MB/sec" and row.bw_average_Bps == pytest.approx(32.47 * MiB)
    # 260 messages/s of 128 KiB: 34.08 MB/s decimal, 32.5 MiB/s; the label means MiB
    assert 0.000260e6 * 131072 / MiB == pytest.approx(32.47, abs=0.05)


def test_read_header_of_client_and_server():
    c = parse("read_s131072_q1.client.stdout")
    assert c.header == {
        "Dual-port": "OFF", "Device": "rxe_b0", "Number of qps": "1", "Transport type": "IB",
        "Connection type": "RC", "Using SRQ": "OFF", "PCIe relax order": "ON", "ibv_wr* API": "OFF",
        "TX depth": "128", "CQ Moderation": "1", "Mtu": "1024[B]", "Link type": "Ethernet",
        "GID index": "1", "Outstand reads": "128", "rdma_cm QPs": "OFF", "Data ex. method": "Ethernet"}
    s = parse("read_s131072_q1.server.stdout")
    assert s.header["Device"] == "rxe_a0" and "TX depth" not in s.header
    assert {k: v for k, v in s.header.items() if k != "Device"} == {
        k: v for k, v in c.header.items() if k not in ("Device", "TX depth")}
    q4 = parse("write_s131072_q4.client.stdout")
    assert q4.info["qps"] == 4 and q4.header["Number of qps"] == "4"
    assert q4.header["Max inline data"] == "0[B]" and q4.info["max_inline_bytes"] == 0
    srv = parse("send_s131072_q1.server.stdout")
    assert srv.header["RX depth"] == "200" and srv.info["rx_depth"] == 200
    assert srv.info["tool"] == "ib_send_bw" and srv.test == "Send BW Test"


def test_all_sizes_sweeps():
    w = parse("write_all_gbits.client.stdout")
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
    rd = parse("read_all.client.stdout")
    assert rd.raw_unit == "MB/sec" and [x.size_bytes for x in rd.rows] == [1 << i for i in range(1, 24)]
    by = {x.size_bytes: x for x in rd.rows}
    assert (by[2].bw_average_raw, by[65536].bw_average_raw, by[8388608].bw_average_raw) == (0.01, 36.84, 9.87)
    assert by[16384].bw_peak_raw == 24.54 and by[8388608].msg_rate_mpps == 0.000001
    [srv] = parse("read_all.server.stdout").rows
    assert (srv.size_bytes, srv.bw_average_raw) == (8388608, 9.87)
    rows = pt.to_rows(w, experiment="e", scenario="s", run_id="r")
    assert len(rows) == 23 * 3 and {x.size_bytes for x in rows} == {1 << i for i in range(1, 24)}


def test_duration_mode_cpu_util():
    r = parse("write_d2_q4_gbits_cpu.client.stdout")
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
    [srow] = parse("write_d2_q4_gbits_cpu.server.stdout").rows
    assert (srow.iterations, srow.bw_average_raw, srow.cpu_util_pct) == (96, 0.050243, 0.0)
    [d] = parse("read_d2_q1.client.stdout").rows
    assert d.raw_unit == "MB/sec" and d.bw_peak_raw is None and d.cpu_util_pct is None


def test_bidirectional_report_both():
    c = parse("write_bidir_s65536_report_both.client.stdout")
    assert c.bidirectional and [x.table for x in c.rows] == ["main", "local", "remote"]
    main, local, remote = c.rows
    assert (main.bw_peak_raw, main.bw_average_raw, main.msg_rate_mpps) == (0.62, 0.57, 0.001090)
    assert (local.bw_average_raw, local.msg_rate_mpps) == (0.30, 0.000571)
    assert (remote.bw_peak_raw, remote.bw_average_raw, remote.msg_rate_mpps) == (0.32, 0.27, 0.000520)
    assert local.bw_average_raw + remote.bw_average_raw == pytest.approx(main.bw_average_raw)
    assert [x.line_no for x in c.rows] == [23, 29, 35]
    s = parse("write_bidir_s65536_report_both.server.stdout")
    # the server's local is the client's remote and the other way round
    assert [(x.table, x.bw_average_raw) for x in s.rows] == [
        ("main", 0.57), ("local", 0.27), ("remote", 0.30)]
    rows = pt.to_rows(c, experiment="e", scenario="s", run_id="r")
    assert {x.extra["table"] for x in rows} == {"main", "local", "remote"}
    assert all(x.extra["bidirectional"] for x in rows)
    plain = parse("read_bidir_s65536.server.stdout")
    assert plain.test == "RDMA_Read Bidirectional BW Test" and plain.bidirectional
    assert [x.table for x in plain.rows] == ["main"]


def test_rdma_cm_server_lines_are_known():
    s = parse("write_rdma_cm_s131072.server.stdout")
    raw = text("write_rdma_cm_s131072.server.stdout")
    assert "Waiting for client rdma_cm QP to connect" in raw and s.notes == []
    assert s.info["rdma_cm"] == "ON" and s.info["data_exchange"] == "rdma_cm"


# --- --out_json: the pre-standard dialect, both sides ---------------------------------

@pytest.mark.parametrize("stem, side, device, unit", [
    ("read_s131072_q1_json", "client", "rxe_b0", "MB/sec"),
    ("read_s131072_q1_json", "server", "rxe_a0", "MB/sec"),
    ("write_d2_q4_gbits_cpu_json", "client", "rxe_b0", "Gb/sec"),
    ("write_d2_q4_gbits_cpu_json", "server", "rxe_a0", "Gb/sec"),
])
def test_out_json_real_files(stem, side, device, unit):
    raw = text(f"{stem}.{side}.json")
    with pytest.raises(json.JSONDecodeError):
        json.loads(raw)  # perftest 6.06 writes unquoted keys and trailing commas
    j = pt.parse_json(raw, source=f"{stem}.{side}.json")
    assert j.rows[0].raw_unit is None  # the file does not say
    t = parse(f"{stem}.{side}.stdout")
    assert pt.cross_check(t, j) == []
    assert j.rows[0].raw_unit == unit  # taken from the text of the same run
    assert j.info["device"] == device and j.info["gid_index"] == 1 and j.info["mtu_bytes"] == 1024
    assert j.info["tx_depth"] == (128 if side == "client" else None)
    assert j.notes == []
    [row] = j.rows
    if stem.startswith("read"):
        assert j.info["tool"] == "ib_read_bw" and j.info["qps"] == 1 and j.info["outstand_reads"] == 128
        assert (row.size_bytes, row.iterations, row.bw_peak_raw, row.bw_average_raw, row.msg_rate_mpps) == (
            131072, 200, 39.51, 39.38, 0.000315)
        assert row.cpu_util_pct is None
    else:
        assert j.info["tool"] == "ib_write_bw" and j.info["qps"] == 4 and j.info["max_inline_bytes"] == 0
        assert (row.size_bytes, row.iterations, row.bw_peak_raw, row.bw_average_raw, row.msg_rate_mpps) == (
            131072, 64, None, 0.033497, 0.000032)
        assert row.cpu_util_pct == 0.0


# --- failures: classified from stdout + stderr, as runpoint does ---------------------

@pytest.mark.parametrize("name, side, kind, said", [
    ("err_no_device_server", "server", "no_device", "IB device nosuchdev not found"),
    ("err_no_device_client", "client", "no_device", "IB device nosuchdev not found"),
    ("err_no_server", "client", "cannot_connect", "Couldn't connect to 198.18.0.1:18591"),
    ("err_no_server_rdma_cm", "client", "cannot_connect", "Unable to perform rdma_client function"),
    ("err_port_in_use", "server", "port_in_use", "Couldn't listen to port 18594"),
    ("err_all_sizes_duration", "client", "unknown_option",
     "Duration mode currently doesn't support running on all sizes"),
    ("err_margin", "client", "unknown_option", "please check that DURATION > 2*MARGIN"),
    ("read_below_limit", "client", "below_limit", "BW result is below bw limit"),
])
def test_real_failures_are_classified(name, side, kind, said):
    rc, cmd = MANIFEST[(name, side)]
    out = text(f"{name}.{side}.stdout") + text(f"{name}.{side}.stderr")
    tool = shlex.split(cmd)[0]
    err = pt.classify_failure(out, rc, "B", tool)
    assert isinstance(err, ToolError) and err.kind == kind, (err, out)
    assert said in err.detail and err.returncode == rc and str(err).startswith(f"{tool} on host B: ")
    if kind != "below_limit":
        with pytest.raises(ParseError):
            pt.parse_output(text(f"{name}.{side}.stdout"), name)


def test_below_limit_stdout_alone_still_has_the_numbers():
    # the -w verifier fails the run (exit 1) after printing a complete, real result
    [row] = parse("read_below_limit.client.stdout").rows
    assert (row.bw_average_raw, row.msg_rate_mpps) == (39.43, 0.000315)
    assert "Error: BW result is below bw limit" in text("read_below_limit.client.stderr")
    assert pt.classify_failure(text("read_below_limit.server.stdout")
                               + text("read_below_limit.server.stderr"), 0, "A", "ib_read_bw") is None


def test_successes_classify_as_none():
    for name, side in SUCCESS:
        rc, cmd = MANIFEST[(name, side)]
        out = text(f"{name}.{side}.stdout") + text(f"{name}.{side}.stderr")
        assert pt.classify_failure(out, rc, "A", shlex.split(cmd)[0]) is None, name


def test_empty_stdout_of_failures_is_a_parse_error():
    for name in ("err_no_device_server.server", "err_no_server_rdma_cm.client"):
        assert text(f"{name}.stdout") == ""
        with pytest.raises(ParseError, match="no bandwidth result table"):
            pt.parse_output(text(f"{name}.stdout"), name)
    with pytest.raises(ParseError, match="no bandwidth result table") as e:
        pt.parse_output(text("err_port_in_use.server.stdout"), "err_port_in_use.server.stdout")
    assert "line 5" in str(e.value)


# --- stdout and stderr in one file -------------------------------------------------------

def test_merged_log_success_keeps_stderr_line_as_note():
    r = parse("read_s131072_q1_merged.client.merged")
    [row] = r.rows
    assert (row.line_no, row.bw_peak_raw, row.bw_average_raw, row.msg_rate_mpps) == (25, 36.90, 20.84, 0.000167)
    assert r.notes == ["line 1: Device not recognized to implement inline feature. Disabling it"]
    assert r.info["device"] == "rxe_b0" and r.info["outstand_reads"] == 128
    s = parse("read_s131072_q1_merged.server.merged")
    assert s.rows[0].bw_average_raw == 20.84 and len(s.notes) == 1


def test_merged_log_with_glued_error_is_a_parse_error_naming_the_line():
    raw = text("read_below_limit_merged.client.merged")
    with pytest.raises(ParseError) as e:
        pt.parse_output(raw, "m.merged")
    msg = str(e.value)
    assert "m.merged, line 25" in msg and "glued" in msg
    assert "'Error: BW result is below bw limit'" in msg
    assert "0.000299Error" in msg  # the line itself
    err = pt.classify_failure(raw, MANIFEST[("read_below_limit_merged", "client")][0], "B", "ib_read_bw")
    assert err.kind == "below_limit"


# --- server readiness -----------------------------------------------------------------

def test_server_stdout_is_empty_while_it_listens():
    at_listen = text("ready_probe.server.stdout_at_listen")
    assert at_listen == ""  # block-buffered: nothing yet, 2 s after the port listened
    final = text("ready_probe.server.stdout")
    assert pt.SERVER_READY_PATTERN.search(final)
    assert not pt.SERVER_READY_PATTERN.search(at_listen)
    assert parse("ready_probe.server.stdout").rows[0].bw_average_raw == 19.90
