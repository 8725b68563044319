"""The raw pattern of an rdma cluster point run through its group runner: one ib_read_bw pair per link, each side
given its own host's device, the client connecting to its producer; a pair whose perftest could not calibrate
its clock still counts its READs (-F); a failure fails the raw rows at once, in perftest's own words.

A stand-in ib_read_bw on PATH plays both sides on this machine, the hosts three loopback addresses
(127.0.0.1-3, no namespaces): the server listens on -p until its client connects; the client records its argv,
prints a real Soft-RoCE capture (tests/fixtures/lab/perftest/softroce/read_d2_q1.client.stdout) as perftest does:
up to its table header, then its -D seconds later the result row. Told to, it fails its clock calibration as
perftest 4.5 does: with -F the report's averages print 0.00, without it no report and exit 1 (print_report_bw);
or it fails with FAKE_FATAL's words.
The real run over rxe is tests/lab/pipeline/test_cluster_rdma.py."""
from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
import yaml

from peercache.lab.pipeline import experiments, runpoint
from peercache.lab.pipeline.points import cluster, cluster_raw

ROOT = Path(__file__).resolve().parents[4]
CAPTURE = ROOT / "tests" / "fixtures" / "lab" / "perftest" / "softroce" / "read_d2_q1.client.stdout"

FAKE = """#!{py}
import json, os, socket, sys, time
args = sys.argv[1:]
port = int(args[args.index("-p") + 1])
if "." not in args[-1]:                           # server: no address argument
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", port)); s.listen(1); s.settimeout(30)
    try:
        s.accept()[0].close()
    except OSError:
        sys.exit(1)
    sys.exit(0)
with open(os.environ["FAKE_ARGV"], "a") as f:
    f.write(json.dumps(args) + "\\n")
c = socket.create_connection((args[-1], port), timeout=10); c.close()
if os.environ.get("FAKE_FATAL"):
    print(os.environ["FAKE_FATAL"], file=sys.stderr)
    sys.exit(1)
lines = open(os.environ["FAKE_CAPTURE"]).read().splitlines(keepends=True)
header = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("#bytes"))
sys.stdout.write("".join(lines[:header + 1])); sys.stdout.flush()       # as the loop starts
time.sleep(int(args[args.index("-D") + 1]))
rest = "".join(lines[header + 1:])
if os.environ.get("FAKE_NO_CLOCK"):
    print("Correlation coefficient r^2: 0.683887 < 0.9", file=sys.stderr)
    if "-F" not in args:
        print("Can't produce a report", file=sys.stderr)
        sys.exit(1)
    rest = rest.replace("30.96", "0.00").replace("0.000248", "0.000000")
sys.stdout.write(rest)
"""


def run_raw(tmp_path, monkeypatch, **env: str) -> tuple[list, runpoint.PointRun, list]:
    """The raw pattern of an rdma incast over three loopback hosts: (its rows, the point's run, the clients' argv)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "ib_read_bw"
    fake.write_text(FAKE.format(py=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    for k, v in {"FAKE_CAPTURE": CAPTURE, "FAKE_ARGV": tmp_path / "argv.jsonl", **env}.items():
        monkeypatch.setenv(k, str(v))
    doc = {"name": "fakeclu", "hosts": [
               {"name": f"h{i}", "host": "local", "address": f"127.0.0.{i}", "devices": [f"rxe_h{i}"],
                "roles": ["producer", "consumer"] + (["directory"] if i == 1 else [])} for i in (1, 2, 3)],
           "capabilities": {"rdma": True, "gpu": False}, "devices": ["rxe_h2"], "gid_index": 1, "form": "rdma",
           "duration": 2, "warmup": 0, "repetitions": 1, "base_port": 26300,
           "results": str(tmp_path / "raw" / "fakeclu"), "scenarios": ["cluster"]}
    path = tmp_path / "fakeclu.yaml"
    path.write_text(yaml.safe_dump(doc))
    tb = experiments.load_testbed(path, experiments.load_scenarios())
    part = {"kind": "cluster", "protocol": "rdma", "pattern": ["incast"], "hosts": [3]}
    pt, = experiments.expand_part("cluster", "patterns", part, [])
    pr = runpoint.PointRun(tb, pt, 0, tmp_path)
    with runpoint.testbed_hosts(tb) as th:
        members = {m.name: m for m in th.cluster}
        pl = cluster.place("incast", [(m.name, m.roles) for m in th.cluster], 3)
        rows = cluster_raw.run_raw(pr, th, members, pl, pr.ctx(extra={"pattern": "incast", "hosts": 3}))
    argv = [json.loads(line) for line in (tmp_path / "argv.jsonl").read_text().splitlines()]
    return rows, pr, argv


def test_each_link_is_an_ib_read_bw_pair_on_its_hosts_devices_summed_over_one_window(tmp_path, monkeypatch):
    rows, pr, argv = run_raw(tmp_path, monkeypatch)
    agg = next(r for r in rows if r.side == "aggregate")
    assert (agg.status, agg.tool, agg.protocol, agg.size_bytes, agg.extra["flows"]) == (
        "ok", "ib_read_bw", "rdma", 131072, 2), agg
    # each pair moved the capture's 496 READs of 128 KiB in its 2 s sample: incast's one consumer got both
    window = agg.extra["window_end"] - agg.extra["window_start"]
    assert agg.value == pytest.approx(2 * 496 * 131072 / window) and window == pytest.approx(2.0, abs=0.5)
    assert agg.extra["start_skew_s"] < 0.5
    per, = [r for r in rows if r.side == "per_host"]
    assert (per.devices, per.peer) == ("h1", "h2+h3")
    # the server names its producer's device, the client the consumer's, connecting to the producer
    for i, prod in ((0, 2), (1, 3)):
        server = pr.commands[f"raw{i}_h{prod}_to_h1/server"]
        assert server[server.index("-d") + 1] == f"rxe_h{prod}" and "-D" in server and "-F" in server
    client = pr.commands["raw0_h2_to_h1/client"]
    assert client[client.index("--") + 1:client.index("--") + 4] == ["stdbuf", "-oL", "ib_read_bw"]
    assert sorted(a[-1] for a in argv) == ["127.0.0.2", "127.0.0.3"]
    assert {a[a.index("-d") + 1] for a in argv} == {"rxe_h1"}
    assert all(a[a.index("-D") + 1] == "2" and a[a.index("-f") + 1] == "0" for a in argv)
    assert any(n.startswith("raw pattern: ib_read_bw's own averages") and "0.032 GB/s" in n for n in pr.notes)


def test_a_pair_whose_clock_perftest_cannot_calibrate_still_counts_its_reads(tmp_path, monkeypatch):
    rows, pr, argv = run_raw(tmp_path, monkeypatch, FAKE_NO_CLOCK="1")
    agg = next(r for r in rows if r.side == "aggregate")
    assert agg.status == "ok" and agg.value == pytest.approx(
        2 * 496 * 131072 / (agg.extra["window_end"] - agg.extra["window_start"]))
    assert len(argv) == 2                                   # once: nothing was run again
    assert any("0.00 (its cycle counter could not be calibrated)" in n for n in pr.notes), pr.notes


def test_a_failure_fails_the_raw_rows_at_once_in_perftests_words(tmp_path, monkeypatch):
    rows, pr, argv = run_raw(tmp_path, monkeypatch, FAKE_FATAL="Couldn't allocate MR")
    row, = rows
    assert (row.status, row.tool, row.side) == ("failed", "ib_read_bw", "aggregate")
    assert "cannot register the test buffer" in row.reason and "'s client)" in row.reason, row.reason
    # nothing run again; the other pair's client may be stopped before it wrote its argv (the first failure
    # ends the pattern at once: under load it had not got that far)
    assert 1 <= len(argv) <= 2, argv
