"""perftest: command builder, text/JSON parsers, failure classification, tidy rows."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from peercache.lab import perftest as pt
from peercache.lab.errors import ParseError, ToolError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "lab" / "perftest"


def load(name: str) -> str:
    return (FIX / name).read_text()


# --- builder -----------------------------------------------------------------

def test_server_and_client_share_symmetric_flags():
    p = pt.PerftestParams(tool="ib_read_bw", device="mlx5_bond_1", gid_index=3, qps=16,
                          size=131072, duration=10, tx_depth=128, cpu_util=True, tcp_port=18600)
    srv = pt.server_command(p)
    cli = pt.client_command(p, "10.0.1.12")
    assert srv[0] == cli[0] == "ib_read_bw"
    assert cli[-1] == "10.0.1.12" and cli[:-1] == srv
    for flag in (["-q", "16"], ["-s", "131072"], ["-D", "10"], ["-t", "128"], ["-p", "18600"],
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
    (dict(size=4096, all_sizes=True), "not both"),
    (dict(duration=5, iterations=1000), "not both"),
    (dict(cpu_util=True), "duration"),
    (dict(report_both=True), "bidirectional"),
    (dict(tool="ib_write_bw", outs=16), "ib_read_bw only"),
    (dict(iterations=2), "at least 5"),
])
def test_builder_rejects_inconsistent_params(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        pt.PerftestParams(**kwargs)


def test_client_needs_an_address():
    with pytest.raises(ValueError):
        pt.client_command(pt.PerftestParams(), "-x")


def test_server_ready_pattern():
    assert pt.SERVER_READY_PATTERN.search(load("write_bw_mb_old.txt"))
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
    r = pt.parse_output(load("write_bw_d15_q4_gbits_cpu.txt"))
    [row] = r.rows
    assert row.raw_unit == "Gb/sec" and row.bw_average_raw == 52.39
    assert row.bw_average_Bps == pytest.approx(52.39e9 / 8)
    assert row.bw_peak_raw is None and row.bw_peak_Bps is None  # printed 0.00: not measured
    assert row.cpu_util_pct == 31.87 and row.iterations == 23988452
    rows = pt.to_rows(r, experiment="e", scenario="msgsize_sweep", run_id="r1", side="client")
    peak = [x for x in rows if x.metric == "bw_peak"][0]
    assert peak.status == "not_measured" and peak.value is None and "0.00" in peak.reason
    cpu = [x for x in rows if x.metric == "cpu_util"][0]
    assert (cpu.value, cpu.unit) == (31.87, "%")
    assert {x.qps for x in rows} == {4} and {x.tool for x in rows} == {"ib_write_bw"}


def test_all_sizes_sweep_one_row_per_size():
    r = pt.parse_output(load("write_bw_all_gbits.txt"))
    assert [x.size_bytes for x in r.rows] == [1 << i for i in range(1, 24)]
    assert r.rows[0].bw_average_raw == 0.09  # printed with 6 decimals below 0.1 Gb/s
    assert all(x.table == "main" for x in r.rows)
    rows = pt.to_rows(r, experiment="e", scenario="s", run_id="r")
    assert len(rows) == 23 * 3 and {x.size_bytes for x in rows} == {1 << i for i in range(1, 24)}


def test_bidirectional_report_both_tables():
    r = pt.parse_output(load("write_bw_bidir_report_both.txt"))
    assert r.bidirectional
    assert [x.table for x in r.rows] == ["main", "local", "remote"]
    main, local, remote = r.rows
    assert main.bw_average_raw == 784.71
    assert local.bw_average_raw + remote.bw_average_raw == pytest.approx(784.71)
    rows = pt.to_rows(r, experiment="e", scenario="s", run_id="r")
    assert {x.extra["table"] for x in rows} == {"main", "local", "remote"}


# --- JSON file -----------------------------------------------------------------

@pytest.mark.parametrize("name", ["read_bw_q16.legacy.json", "read_bw_q16.json"])
def test_json_file_both_dialects_cross_check(name):
    j = pt.parse_json(load(name))
    assert j.rows[0].raw_unit is None and j.rows[0].bw_average_Bps is None  # unit not in file
    with pytest.raises(ValueError, match="unit unknown"):
        pt.to_rows(j)
    t = pt.parse_output(load("read_bw_q16_mib.txt"))
    assert pt.cross_check(t, j) == []
    assert j.rows[0].raw_unit == "MiB/sec"  # taken from the text of the same run
    assert j.info["qps"] == 16 and j.info["gid_index"] == 3 and j.info["tool"] == "ib_read_bw"


def test_json_cross_check_reports_mismatch():
    j = pt.parse_json(load("read_bw_q16.json").replace('"n_iterations": 1000', '"n_iterations": 999'),
                      "MiB/sec")
    t = pt.parse_output(load("read_bw_q16_mib.txt"))
    assert any("iterations" in p for p in pt.cross_check(t, j))


@pytest.mark.parametrize("mutate, where", [
    (lambda s: s.replace("BW_average: ", "BW_avg: "), "BW_average"),
    (lambda s: s.replace("MsgRate: 0.373840,", "MsgRate: fast,"), "MsgRate"),
    (lambda s: s[: s.index("results")], "truncated"),
    (lambda s: s.replace("Mtu: 4096,", "Mtu 4096"), "line 14"),
])
def test_json_corrupt(mutate, where):
    with pytest.raises(ParseError, match=where):
        pt.parse_json(mutate(load("read_bw_q16.legacy.json")), "Gb/sec", source="x.json")


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
    text = load("write_bw_all_gbits.txt")
    bad = _cut_after(text, " 65536      5000             395.73             391.81 \t\t   0.747323\n")
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

@pytest.mark.parametrize("name, kind, needle", [
    ("no_device.txt", "no_device", "ibv_devices"),
    ("unknown_option.txt", "unknown_option", "--help"),
    ("cannot_connect.txt", "cannot_connect", "server was started"),
    ("port_in_use.txt", "port_in_use", "-p port"),
    ("below_limit.txt", "below_limit", "limit"),
])
def test_classify_failure(name, kind, needle):
    err = pt.classify_failure(load(name), 1, "B", "ib_read_bw")
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
