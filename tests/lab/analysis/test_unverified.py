"""An unverified GET figure says so: in the chart caption (image and .md) and in the report's overview."""
from __future__ import annotations

from peercache.lab.analysis import charts, collect, report
from peercache.lab.tidy import Row


def _rows(verified: list[bool]):
    rows = [Row(experiment="e", testbed="t", scenario="single_nic", run_id=f"r{i}", metric="get_throughput",
                value=2.0, unit="GB/s", tool="peercache-bench", side="client", protocol="tcp",
                size_bytes=131072, threads=1, processes=1, extra={"verified": v})
            for i, v in enumerate(verified)]
    return collect.rows_frame(rows)


def test_the_note_counts_the_unverified_get_figures():
    assert charts.unverified_note(_rows([True, True])) is None
    note = charts.unverified_note(_rows([True, False, False]))
    assert note.startswith("unverified: 2 of 3 GET figure(s)") and "--no-verify" in note


def test_the_overview_marks_an_unverified_figure():
    rows = _rows([False]).assign(verdict="unchecked", verdict_reason="", limited_by="")
    tab = report.overview_table(rows)
    assert tab["notes"].str.contains("unverified: page contents not checked").any()
    rows = _rows([True]).assign(verdict="unchecked", verdict_reason="", limited_by="")
    assert not report.overview_table(rows)["notes"].str.contains("unverified").any()
