"""perf stat: wrapper, CSV / JSON / text parsers, derived IPC, a real run."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from peercache.lab.tools import perfstat as ps
from peercache.lab.errors import ParseError

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "lab" / "perfstat"


def load(name: str) -> str:
    return (FIX / name).read_text()


def test_wrap():
    argv = ps.wrap(["ib_write_bw", "-q", "4"], "/tmp/p.csv")
    assert argv[:6] == ["perf", "stat", "-x,", "-o", "/tmp/p.csv", "-e"]
    assert argv[6].split(",") == list(ps.DEFAULT_EVENTS)
    assert argv[7] == "--" and argv[8:] == ["ib_write_bw", "-q", "4"]
    assert ps.wrap(["true"], "f", events=["task-clock"], sep=";")[2] == "-x;"
    with pytest.raises(ValueError):
        ps.wrap([], "f")
    with pytest.raises(ValueError):
        ps.wrap(["true"], "f", sep="-")  # occurs in event names


def test_csv_supported_events_with_multiplexing():
    cs = ps.parse_csv(load("write_bw_q4_4k.csv"), source="write_bw_q4_4k.csv")
    by = {c.event: c for c in cs}
    assert set(by) == set(ps.DEFAULT_EVENTS)
    assert by["instructions"].value == 114879562341 and by["instructions"].pcnt_running == 83.34
    assert by["task-clock"].unit == "msec" and by["task-clock"].value == 16272.39
    assert by["context-switches"].runtime_ns == 16272389913
    ipc = ps.derived(cs)["ipc"]
    assert ipc["status"] == "ok" and ipc["value"] == pytest.approx(2.6987, abs=1e-4)


def test_csv_unsupported_events_are_none_not_zero():
    cs = ps.parse_csv(load("sleep_vm_sw_only.csv"))
    by = {c.event: c for c in cs}
    for e in ("instructions", "cycles", "LLC-load-misses", "dTLB-load-misses"):
        assert by[e].value is None and by[e].status == "not_supported"
    assert by["context-switches"].value == 1 and by["cpu-migrations"].value == 0  # a real 0
    ipc = ps.derived(cs)["ipc"]
    assert ipc["value"] is None and ipc["status"] == "not_supported"
    rows = ps.to_rows(cs, experiment="e", scenario="s", run_id="r", host="A")
    r = {x.metric: x for x in rows}
    assert r["cycles"].status == "not_supported" and r["cycles"].value is None
    assert r["ipc"].status == "not_supported" and "not supported" in r["ipc"].reason
    assert r["task-clock"].unit == "msec" and r["context-switches"].unit == "count"


def test_csv_repeat_variance_column():
    cs = ps.parse_csv(load("repeat_vm.csv"))
    tc = [c for c in cs if c.event == "task-clock"][0]
    assert tc.variance_pct is not None and tc.pcnt_running == 100.0 and tc.runtime_ns > 0


def test_not_counted():
    cs = ps.parse_csv("<not counted>,,instructions,0,0.00,,\n1000,,cycles,10,100.00,,\n")
    assert cs[0].value is None and cs[0].status == "not_counted"
    assert ps.derived(cs)["ipc"]["status"] == "not_counted"


def test_json_format():
    cs = ps.parse_json(load("sleep_vm.json"))
    by = {c.event: c for c in cs}
    assert by["cycles"].status == "not_supported" and by["cycles"].value is None
    assert by["page-faults"].value == 75.0 and by["task-clock"].unit == "msec"


def test_text_format_of_old_logs():
    cs = ps.parse_text(load("write_bw_q4_4k.txt"))
    by = {c.event: c for c in cs}
    assert by["instructions"].value == 114879562341 and by["cycles"].pcnt_running == 83.34
    assert by["context-switches"].value == 235
    assert ps.derived(cs)["ipc"]["value"] == pytest.approx(2.70, abs=0.005)
    assert [c.event for c in ps.parse(load("write_bw_q4_4k.txt"))] == [c.event for c in cs]


@pytest.mark.parametrize("text, where", [
    ("12x,,cycles,1,100.00,,\n", "line 1"),
    ("# started\n\n100,,cycles,1,100.00,,\n100,,\n", "line 4"),
    ("", "no counter lines"),
    ("CPU0,100,,cycles,1,100.00,,\n", "aggregation"),
    ("100,,cycles,1,abc,,\n", "percentage running"),
])
def test_csv_corrupt(text, where):
    with pytest.raises(ParseError, match=where):
        ps.parse_csv(text)


def test_json_corrupt_and_truncated():
    text = load("sleep_vm.json")
    with pytest.raises(ParseError, match="line 5"):
        ps.parse_json(text[: text.index("context-switches")])
    with pytest.raises(ParseError, match="missing key 'event'"):
        ps.parse_json('{"counter-value" : "1.0", "unit" : ""}\n')


def test_real_perf_stat_around_a_command(tmp_path):
    if shutil.which("perf") is None:
        pytest.skip("perf is not installed here (apt-get install linux-perf)")
    out = tmp_path / "perf.csv"
    argv = ps.wrap([sys.executable, "-c", "sum(range(100000))"], str(out))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0 and "perf_event_paranoid" in proc.stderr:
        pytest.skip(f"perf stat not permitted here: {proc.stderr.strip()[:200]}")
    assert proc.returncode == 0, proc.stderr
    cs = ps.parse_csv(out.read_text(), source=str(out))
    by = {c.event: c for c in cs}
    assert set(by) == set(ps.DEFAULT_EVENTS)
    assert by["task-clock"].status == "ok" and by["task-clock"].value > 0
    hw = ("instructions", "cycles", "cache-misses", "LLC-load-misses")
    if all(by[e].status == "ok" for e in hw):
        assert ps.derived(cs)["ipc"]["value"] > 0  # a host with a PMU
    else:
        # This VM has no PMU: hardware events must say so, never read as 0.
        for e in hw:
            assert by[e].status in ("not_supported", "not_counted") and by[e].value is None
        assert ps.derived(cs)["ipc"]["value"] is None


def test_a_testbed_without_perf_stat_runs_the_client_bare_and_says_why_each_counter_is_missing():
    """softroce-2host's no_perf_stat: a point asking for perf stat runs its client without it, and every
    counter (and the IPC) is a not_measured row carrying the testbed's reason; elsewhere perf stat wraps it."""
    from peercache.lab.pipeline import experiments, runpoint
    point = experiments.Point("msgsize_sweep", "ib_write_bw_q1_s4K", "perftest",
                              {"tool": "ib_write_bw", "perf_stat": True})
    tb = experiments.load_testbed("experiments/testbeds/softroce-2host.yaml")
    pr = runpoint.PointRun(tb, point, 0, Path("/nonexistent"))
    argv, path = pr.perf_wrap(["ib_write_bw", "-s", "4096"])
    assert argv == ["ib_write_bw", "-s", "4096"] and path is None
    pr.perf_rows(None, path, pr.ctx(tool="ib_write_bw"))
    assert {r.metric for r in pr.rows} == {runpoint.canonical_metric(e) for e in ps.DEFAULT_EVENTS} | {"ipc"}
    assert {r.status for r in pr.rows} == {"not_measured"}
    assert all(r.reason.startswith("perf stat not run on this testbed: ") and "asm_exc_int3" in r.reason
               for r in pr.rows)
    local = runpoint.PointRun(experiments.load_testbed("experiments/testbeds/local.yaml"), point, 0,
                              Path("/nonexistent"))
    argv, path = local.perf_wrap(["ib_write_bw"])
    assert argv[:2] == ["perf", "stat"] and path is not None
