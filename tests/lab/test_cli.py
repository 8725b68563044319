"""peercache-lab command line, run as a subprocess."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "lab"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "peercache.lab.cli", *args], capture_output=True,
                          text=True, timeout=120)


def rows(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


def test_parse_perftest_rows():
    p = run("parse", "perftest", str(FIX / "perftest" / "softroce" / "write_d2_q4_gbits_cpu.client.stdout"),
            "--host", "A", "--side", "client")
    assert p.returncode == 0, p.stderr
    rs = rows(p.stdout)
    by = {r["metric"]: r for r in rs}
    assert by["bw_average"]["unit"] == "B/s" and by["bw_average"]["raw_unit"] == "Gb/sec"
    assert by["bw_average"]["value"] == pytest.approx(0.050243e9 / 8)
    assert by["bw_peak"]["status"] == "not_measured" and by["bw_peak"]["value"] is None
    assert {r["host"] for r in rs} == {"A"}


def test_parse_perftest_json_needs_unit():
    f = str(FIX / "perftest" / "softroce" / "read_s131072_q1_json.client.json")
    assert run("parse", "perftest", f, "--json").returncode == 2
    p = run("parse", "perftest", f, "--json", "--bw-unit", "MB/sec")
    assert p.returncode == 0, p.stderr
    assert rows(p.stdout)[0]["value"] == pytest.approx(39.38 * 2 ** 20)


def test_parse_perfstat_and_iperf3():
    p = run("parse", "perfstat", str(FIX / "perfstat" / "sleep_vm_sw_only.csv"))
    assert p.returncode == 0, p.stderr
    by = {r["metric"]: r for r in rows(p.stdout)}
    assert by["cycles"]["status"] == "not_supported" and by["cycles"]["value"] is None
    p = run("parse", "iperf3", str(FIX / "iperf3" / "client_loopback_p1.json"))
    assert p.returncode == 0, p.stderr
    assert {r["metric"] for r in rows(p.stdout)} >= {"bw_sent", "bw_received", "retransmits"}


@pytest.mark.parametrize("tool", ["perftest", "perfstat", "iperf3"])
def test_parse_garbage_exits_2(tool, tmp_path):
    f = tmp_path / "garbage.txt"
    f.write_text("this is not\nany tool's output 12x\n")
    p = run("parse", tool, str(f))
    assert p.returncode == 2 and p.stdout == ""
    assert "garbage.txt" in p.stderr and "line" in p.stderr


def test_parse_failed_run_exits_3():
    p = run("parse", "perftest", str(FIX / "perftest" / "no_device.txt"), "--host", "B",
            "--tool-name", "ib_read_bw")
    assert p.returncode == 3 and "no RDMA device" in p.stderr and "host B" in p.stderr
    p = run("parse", "iperf3", str(FIX / "iperf3" / "error_refused.json"))
    assert p.returncode == 3 and "cannot connect" in p.stderr


def test_missing_file_exits_1(tmp_path):
    p = run("parse", "iperf3", str(tmp_path / "nope.json"))
    assert p.returncode == 1 and "cannot read" in p.stderr


def test_hostinfo_fixture_and_live(tmp_path):
    out = tmp_path / "h.json"
    p = run("hostinfo", "--root", str(FIX / "hosts" / "cx7-8bond"), "--out", str(out))
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    assert len(doc["rdma"]["devices"]) == 8
    p = run("hostinfo", "--summary")
    assert p.returncode == 0, p.stderr
    assert "kernel" in json.loads(p.stdout)


def test_console_script_is_installed():
    exe = Path(sys.executable).parent / "peercache-lab"
    if not exe.exists():
        pytest.skip("peercache-lab console script not installed in this environment (pip install -e .)")
    p = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "hostinfo" in p.stdout and "parse" in p.stdout
