"""perftest: command builder, text/JSON parsers, failure classification, tidy rows."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from peercache.lab.tools import perftest as pt
from peercache.lab.errors import ParseError, ToolError

FIX = Path(__file__).resolve().parents[3] / "fixtures" / "lab" / "perftest"
#: Real captures (perftest 6.06 on Soft-RoCE in the QEMU guest); see softroce/README.md.
SR = FIX / "softroce"


def load(name: str) -> str:
    return (FIX / name).read_text()


def real(name: str) -> str:
    """A real capture: NAME.SIDE.stdout, or NAME.SIDE.stdout + .stderr for "NAME.SIDE+err"."""
    if name.endswith("+err"):
        stem = name[: -len("+err")]
        return (SR / f"{stem}.stdout").read_text() + (SR / f"{stem}.stderr").read_text()
    return (SR / name).read_text()


# --- builder -----------------------------------------------------------------

def test_server_and_client_share_symmetric_flags():
    p = pt.PerftestParams(tool="ib_read_bw", device="mlx5_bond_1", gid_index=3, qps=16,
                          size=131072, duration=10, tx_depth=128, qp_timeout=20, cpu_util=True, tcp_port=18600)
    srv = pt.server_command(p)
    cli = pt.client_command(p, "10.0.1.12")
    assert srv[0] == cli[0] == "ib_read_bw"
    assert cli[-1] == "10.0.1.12" and cli[:-1] == srv
    for flag in (["-q", "16"], ["-s", "131072"], ["-D", "10"], ["-t", "128"], ["-u", "20"], ["-p", "18600"],
                 ["-d", "mlx5_bond_1"], ["-x", "3"]):
        i = srv.index(flag[0])
        assert srv[i:i + 2] == flag
    assert "--report_gbits" in srv and "--cpu_util" in srv
    # the symmetric part is the same list on both sides, whatever the local device
    other = pt.client_command(pt.PerftestParams(**{**p.__dict__, "device": "mlx5_bond_5"}), "h")
    assert pt.symmetric_args(p) == [a for a in other if a not in ("-d", "mlx5_bond_5", "-x", "3", "h")][1:]


def test_builder_all_sizes_bidir_cuda_json():
    p = pt.PerftestParams(tool="ib_write_bw", size=None, all_sizes=True, bidirectional=True,
                          report_both=True, report_gbits=False, use_cuda=0, out_json="/tmp/x.json")
    argv = pt.server_command(p)
    assert "-a" in argv and "-s" not in argv
    assert "-b" in argv and "--report-both" in argv and "--report_gbits" not in argv
    assert "--use_cuda=0" in argv and "--out_json" in argv and "--out_json_file=/tmp/x.json" in argv
    assert p.bw_unit == "MiB/sec"


@pytest.mark.parametrize("kwargs, msg", [
    (dict(tool="ib_atomic_bw"), "not one of"),
    (dict(qp_timeout=32), "5-bit exponent"),
    (dict(size=4096, all_sizes=True), "not both"),
    (dict(duration=5, iterations=1000), "not both"),
    (dict(cpu_util=True), "duration"),
    (dict(report_both=True), "bidirectional"),
    (dict(tool="ib_write_bw", outs=16), "ib_read_bw only"),
    (dict(iterations=2), "at least 5"),
    (dict(size=None, all_sizes=True, duration=2), "duration mode"),  # perftest exits 1 on it
])
def test_builder_rejects_inconsistent_params(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        pt.PerftestParams(**kwargs)


def test_client_needs_an_address():
    with pytest.raises(ValueError):
        pt.client_command(pt.PerftestParams(), "-x")


def test_server_ready_pattern():
    assert pt.SERVER_READY_PATTERN.search(real("write_s131072_q1.server.stdout"))
    assert pt.SERVER_READY_PATTERN.search(real("write_rdma_cm_s131072.server.stdout"))
    assert not pt.SERVER_READY_PATTERN.search(real("write_s131072_q1.client.stdout"))
    assert not pt.SERVER_READY_PATTERN.search(load("read_bw_q16_mib.txt"))


# --- text parser: golden files -----------------------------------------------

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


# --- JSON file -----------------------------------------------------------------

@pytest.mark.parametrize("json_text, report, unit, qps, gid", [
    # real perftest 6.06: the pre-standard dialect (unquoted keys, trailing commas)
    (lambda: real("read_s131072_q1_json.client.json"),
     lambda: real("read_s131072_q1_json.client.stdout"), "MB/sec", 1, 1),
    # reconstructed: the standard JSON of later releases
    (lambda: load("read_bw_q16.json"), lambda: load("read_bw_q16_mib.txt"), "MiB/sec", 16, 3),
], ids=["legacy-real", "standard"])
def test_json_file_both_dialects_cross_check(json_text, report, unit, qps, gid):
    j = pt.parse_json(json_text())
    assert j.rows[0].raw_unit is None and j.rows[0].bw_average_Bps is None  # unit not in file
    with pytest.raises(ValueError, match="unit unknown"):
        pt.to_rows(j)
    t = pt.parse_output(report())
    assert pt.cross_check(t, j) == []
    assert j.rows[0].raw_unit == unit  # taken from the text of the same run
    assert j.info["qps"] == qps and j.info["gid_index"] == gid and j.info["tool"] == "ib_read_bw"


def test_json_cross_check_reports_mismatch():
    j = pt.parse_json(load("read_bw_q16.json").replace('"n_iterations": 1000', '"n_iterations": 999'),
                      "MiB/sec")
    t = pt.parse_output(load("read_bw_q16_mib.txt"))
    assert any("iterations" in p for p in pt.cross_check(t, j))


@pytest.mark.parametrize("mutate, where", [
    (lambda s: s.replace("BW_average: ", "BW_avg: "), "BW_average"),
    (lambda s: s.replace("MsgRate: 0.000315,", "MsgRate: fast,"), "MsgRate"),
    (lambda s: s[: s.index("results")], "truncated"),
    (lambda s: s.replace("Mtu: 1024,", "Mtu 1024"), "line 14"),
])
def test_json_corrupt(mutate, where):
    text = real("read_s131072_q1_json.client.json")
    assert mutate(text) != text
    with pytest.raises(ParseError, match=where):
        pt.parse_json(mutate(text), "Gb/sec", source="x.json")


# --- corrupt / truncated text ----------------------------------------------------

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


# --- failure classification --------------------------------------------------

@pytest.mark.parametrize("text, kind, needle", [
    (lambda: load("no_device.txt"), "no_device", "ibv_devices"),
    (lambda: load("unknown_option.txt"), "unknown_option", "--help"),
    # real captures in the Soft-RoCE guest, stdout + stderr as runpoint joins them
    (lambda: real("err_no_device_server.server+err"), "no_device", "ibv_devices"),
    (lambda: real("err_no_server.client+err"), "cannot_connect", "server was started"),
    (lambda: real("err_port_in_use.server+err"), "port_in_use", "-p port"),
    (lambda: real("read_below_limit.client+err"), "below_limit", "limit"),
], ids=["no_device", "unknown_option", "no_device_rxe", "cannot_connect", "port_in_use", "below_limit"])
def test_classify_failure(text, kind, needle):
    err = pt.classify_failure(text(), 1, "B", "ib_read_bw")
    assert isinstance(err, ToolError) and err.kind == kind and err.host == "B"
    assert str(err).startswith("ib_read_bw on host B: ") and needle in str(err)


def test_classify_success_and_unknown():
    assert pt.classify_failure(load("read_bw_q16_mib.txt"), 0, "A", "ib_read_bw") is None
    err = pt.classify_failure("something odd happened\n", 3, "A", "ib_read_bw")
    assert err.kind == "failed" and "something odd happened" in str(err)
    assert pt.classify_failure("", 127, "A", "ib_read_bw").kind == "not_installed"


# --- real run on this machine -----------------------------------------------

def test_real_ib_read_bw_without_device_is_classified():
    exe = shutil.which("ib_read_bw")
    if exe is None:
        pytest.skip("perftest is not installed here (apt-get install perftest)")
    ib = Path("/sys/class/infiniband")
    if ib.is_dir() and any(ib.iterdir()):
        pytest.skip("this host has RDMA devices; the no-device path cannot be exercised")
    argv = pt.server_command(pt.PerftestParams(tool="ib_read_bw", size=4096, iterations=5,
                                               tcp_port=18599))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    err = pt.classify_failure(out, proc.returncode, "localhost", "ib_read_bw")
    assert err is not None and err.kind == "no_device", out
    assert "ibv_devices" in str(err)
    with pytest.raises(ParseError):
        pt.parse_output(out)


def test_work_completion_statuses_are_the_engines_table():
    # Codes and IBV_WC_ names exist once, in the engine's WC enum; the lab adds only the text and the advice.
    from peercache.rdma.completion import WC
    assert set(pt.WC_TEXT) == {wc.name for wc in WC if wc is not WC.SUCCESS}
    table = pt.wc_status_table()
    assert table[12][0] == "IBV_WC_RETRY_EXC_ERR" and table[12][1] == "transport retry counter exceeded"
    assert set(table) == {int(wc) for wc in WC} - {0}


def test_reading_perftest_output_does_not_import_the_engines_rdma_path():
    import sys
    code = ("import sys; from peercache.lab.tools import perftest as pt; "
            "pt.classify_failure('Couldn\\'t allocate MR', 1, 'h', 'ib_read_bw'); "
            "print(sorted(m for m in ('numpy', 'peercache.rdma.completion') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
