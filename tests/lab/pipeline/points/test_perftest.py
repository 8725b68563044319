"""A perftest point whose tool could not calibrate its clock (seen on the two-machine Soft-RoCE
testbed: "Correlation coefficient r^2: 0.807725 < 0.9", then "Can't produce a report") is run
again, up to PERFTEST_ATTEMPTS times, and says so; any other failure is recorded at once.

A stand-in ib_write_bw on PATH plays both sides on this machine: the server listens on -p until
the client connects; the client fails its clock calibration for the first ``FAILS`` runs (a
counter file), then prints a real capture from the pair (tests/fixtures/lab/twohost/)."""
from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
import yaml

from peercache.lab.pipeline import experiments, runpoint
from peercache.lab.pipeline.points.perftest import PERFTEST_ATTEMPTS

ROOT = Path(__file__).resolve().parents[4]
CAPTURE = ROOT / "tests" / "fixtures" / "lab" / "twohost" / "ib_write_bw_q1_s128K.client.log"

FAKE = """#!{py}
import os, socket, sys, time
args = sys.argv[1:]
port = int(args[args.index("-p") + 1])
if "." not in args[-1]:                           # server: no address argument
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port)); s.listen(1); s.settimeout(30)
    try:
        s.accept()[0].close()
    except OSError:
        sys.exit(1)
    sys.exit(0)
c = socket.create_connection(("127.0.0.1", port), timeout=10); c.close()
counter = os.environ["FAKE_COUNTER"]
n = int(open(counter).read() or 0) if os.path.exists(counter) else 0
open(counter, "w").write(str(n + 1))
if n < int(os.environ["FAKE_FAILS"]):
    print(os.environ.get("FAKE_SAYS", "Correlation coefficient r^2: 0.807725 < 0.9"), file=sys.stderr)
    print(" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]")
    print("Can't produce a report")
    sys.exit(1)
sys.stdout.write(open(os.environ["FAKE_CAPTURE"]).read().replace("@@PCLAB-PGID", "#"))
"""


def run_point(tmp_path, monkeypatch, fails: int, says: str | None = None) -> tuple[dict, int]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "ib_write_bw"
    fake.write_text(FAKE.format(py=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_COUNTER", str(tmp_path / "count"))
    monkeypatch.setenv("FAKE_FAILS", str(fails))
    monkeypatch.setenv("FAKE_CAPTURE", str(CAPTURE))
    if says:
        monkeypatch.setenv("FAKE_SAYS", says)
    doc = {"name": "fakeperf", "hosts": {"producer": {"host": "local", "address": "127.0.0.1"},
                                         "consumer": {"host": "local", "address": "127.0.0.1"}},
           "capabilities": {"rdma": True, "gpu": False}, "devices": ["rxe0"], "gid_index": 1, "form": "rdma",
           "duration": 1, "warmup": 0, "repetitions": 1, "base_port": 26200,
           "results": str(tmp_path / "raw" / "fakeperf"), "scenarios": ["msgsize_sweep"],
           "grid_overrides": {"msgsize_sweep": {"raw": {"size": [131072], "qps": [1], "perf_stat": False,
                                                        "iterations": 100}}}}
    path = tmp_path / "fakeperf.yaml"
    path.write_text(yaml.safe_dump(doc))
    tb = experiments.load_testbed(path)
    (pt,) = experiments.expand(tb)
    out = tmp_path / "result.json"
    runpoint.run_point(tb, pt, 0, out, quiet=True)
    return json.loads(out.read_text()), int((tmp_path / "count").read_text())


def test_a_clock_calibration_failure_is_run_again_and_noted(tmp_path, monkeypatch):
    doc, runs = run_point(tmp_path, monkeypatch, fails=2)
    assert runs == 3
    bw = [r for r in doc["rows"] if r["metric"] == "bw"]
    assert bw[0]["status"] == "ok" and bw[0]["raw_value"] == pytest.approx(0.066057)
    notes = doc["meta"]["params"]["notes"]
    assert [n[:14] for n in notes if "calibrate" in n] == ["attempt 1 of 3", "attempt 2 of 3"], notes
    assert "-n 100" in " ".join(doc["meta"]["commands"]["client"])          # the count, not -D


def test_it_gives_up_after_the_last_attempt(tmp_path, monkeypatch):
    doc, runs = run_point(tmp_path, monkeypatch, fails=5)
    assert runs == PERFTEST_ATTEMPTS
    bw = [r for r in doc["rows"] if r["metric"] == "bw"]
    assert bw[0]["status"] == "failed" and "could not calibrate its cycle counter" in bw[0]["reason"]


def test_emulated_hosts_get_more_attempts(tmp_path, monkeypatch):
    monkeypatch.setenv("PEERCACHE_SLOWNESS", "30")
    doc, runs = run_point(tmp_path, monkeypatch, fails=5)
    assert runs == 6
    bw = [r for r in doc["rows"] if r["metric"] == "bw"]
    assert bw[0]["status"] == "ok", bw
    notes = doc["meta"]["params"]["notes"]
    assert [n[:14] for n in notes if "calibrate" in n][-1] == "attempt 5 of 8", notes


def test_another_failure_is_not_retried(tmp_path, monkeypatch):
    doc, runs = run_point(tmp_path, monkeypatch, fails=5, says="Couldn't allocate MR")
    assert runs == 1
    bw = [r for r in doc["rows"] if r["metric"] == "bw"]
    assert bw[0]["status"] == "failed" and "cannot register the test buffer" in bw[0]["reason"]


def test_a_figure_by_count_is_checked_against_the_bytes_of_its_count():
    from peercache.lab.tidy import Row
    tb = experiments.load_testbed("experiments/testbeds/softroce-2host.yaml")
    (pt,) = [p for p in experiments.expand(tb) if p.name == "ib_read_bw_q4_s128K"]
    pr = runpoint.PointRun(tb, pt, 0, Path("/nonexistent"))
    row = Row(metric="bw", value=15e6, unit="B/s", qps=4, size_bytes=131072, experiment="x", scenario="s", run_id="r")
    # the two-machine run's ib_read_bw -n 100 -q 4 -s 131072 at 15 MB/s: 52.4 MB in 3.5 s, not 5 s x 15 MB/s
    assert pr.figure_window(row, 15e6) == pytest.approx(100 * 4 * 131072 / 15e6)
    (mp,) = [p for p in experiments.expand(tb) if p.name == "ib_write_bw_q1_s4K"]
    assert runpoint.PointRun(tb, mp, 0, Path("/nonexistent")).figure_window(row, 15e6) == tb["duration"]
