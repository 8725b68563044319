"""perf stat parser against real `perf stat -x, -o FILE` files of perftest clients in the guest.

tests/fixtures/lab/perfstat/softroce: perf 6.1.192 (linux-perf 6.1.192-3) in the QEMU TCG guest
(kernel 6.1.0-57-amd64), wrapping the client `ib_write_bw -d rxe_b0 -x 1 ... 198.18.0.1`; the
guest has no PMU, so hardware events are `<not supported>`. Commands: perftest/softroce/manifest.tsv.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from peercache.lab.tools import perfstat as ps
from peercache.lab.tools import perftest as pt
from peercache.lab.errors import ParseError

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "lab"
PS = FIX / "perfstat" / "softroce"
SR = FIX / "perftest" / "softroce"


def manifest_cmd(name: str) -> str:
    for line in (SR / "manifest.tsv").read_text().splitlines():
        n, side, rc, cmd = line.split("\t")
        if (n, side) == (name, "client"):
            assert rc == "0"
            return cmd
    raise KeyError(name)


def test_brief_event_list_q1():
    cmd = manifest_cmd("perf_write_s131072_q1")
    assert cmd.startswith("perf stat -x, -o tests/fixtures/lab/perfstat/softroce/perf_write_s131072_q1.csv "
                          "-e task-clock,context-switches,cpu-migrations,page-faults,cycles,instructions -- "
                          "ib_write_bw -d rxe_b0 -x 1 -s 131072 -q 1 -n 200")
    text = (PS / "perf_write_s131072_q1.csv").read_text()
    assert text.startswith("# started on ")
    cs = ps.parse(text, "perf_write_s131072_q1.csv")
    assert [c.event for c in cs] == ["task-clock", "context-switches", "cpu-migrations", "page-faults",
                                     "cycles", "instructions"]
    by = {c.event: c for c in cs}
    tc = by["task-clock"]
    assert (tc.value, tc.unit, tc.status, tc.runtime_ns, tc.pcnt_running, tc.line_no) == (
        1047.45, "msec", "ok", 1047452349, 100.0, 3)
    assert (by["context-switches"].value, by["cpu-migrations"].value, by["page-faults"].value) == (180, 1, 322)
    assert by["context-switches"].unit == "" and by["page-faults"].runtime_ns == 1047452349
    for e in ("cycles", "instructions"):  # no PMU in a TCG guest
        assert by[e].value is None and by[e].status == "not_supported" and by[e].runtime_ns == 0
    ipc = ps.derived(cs)["ipc"]
    assert ipc["value"] is None and ipc["status"] == "not_supported"
    rows = {r.metric: r for r in ps.to_rows(cs, experiment="e", scenario="s", run_id="r", host="guest")}
    assert rows["task-clock"].value == 1047.45 and rows["page-faults"].unit == "count"
    assert rows["cycles"].status == "not_supported" and rows["ipc"].status == "not_supported"
    # the client's own output, which perf passed through untouched
    [row] = pt.parse_output((SR / "perf_write_s131072_q1.client.stdout").read_text()).rows
    assert (row.iterations, row.bw_peak_raw, row.bw_average_raw, row.msg_rate_mpps) == (200, 36.35, 35.73, 0.000286)


def test_lab_default_events_duration_q4():
    cmd = manifest_cmd("perf_write_d2_q4_lab_events")
    assert "-e " + ",".join(ps.DEFAULT_EVENTS) + " -- ib_write_bw -d rxe_b0 -x 1 -s 131072 -q 4 -D 2" in cmd
    # the lab's own wrapper builds the same perf part of the command
    argv = ps.wrap(["ib_write_bw"], "tests/fixtures/lab/perfstat/softroce/perf_write_d2_q4_lab_events.csv")
    assert cmd.startswith(" ".join(argv[:-1]))
    cs = ps.parse_csv((PS / "perf_write_d2_q4_lab_events.csv").read_text())
    assert [c.event for c in cs] == list(ps.DEFAULT_EVENTS)
    by = {c.event: c for c in cs}
    hw = [e for e in ps.DEFAULT_EVENTS if e not in ("context-switches", "cpu-migrations", "task-clock")]
    assert all(by[e].status == "not_supported" and by[e].value is None for e in hw)
    assert (by["context-switches"].value, by["cpu-migrations"].value) == (209, 2)
    assert (by["task-clock"].value, by["task-clock"].runtime_ns) == (2451.65, 2451649026)
    assert ps.derived(cs)["ipc"]["status"] == "not_supported"
    [row] = pt.parse_output((SR / "perf_write_d2_q4_lab_events.client.stdout").read_text()).rows
    assert (row.iterations, row.bw_peak_raw, row.bw_average_raw) == (80, None, 0.041909)


@pytest.mark.parametrize("name", ["perf_write_s131072_q1.csv", "perf_write_d2_q4_lab_events.csv"])
def test_truncated_last_line_is_an_error_naming_it(name):
    lines = (PS / name).read_text().splitlines()
    cut = "\n".join(lines[:-1] + [lines[-1].split(",")[0]]) + "\n"  # last line cut after its value
    with pytest.raises(ParseError, match=rf"{name}, line {len(lines)}"):
        ps.parse_csv(cut, source=name)
