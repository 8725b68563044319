"""The report's content, and both notebooks executed with papermill on the fixture data."""
import json
from pathlib import Path

import pytest

from peercache.lab.analysis import collect, papermill_run, report

ROOT = Path(__file__).resolve().parents[3]
FIX = ROOT / "tests" / "fixtures" / "tidy"
TB = "fixture-2x-cx7"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    base = tmp_path_factory.mktemp("lab")
    rows, runs = collect.load_tidy(FIX / TB)
    collect.write_raw_from_tidy(rows, runs, base / "raw", TB)
    return base


@pytest.mark.parametrize("name", ["collect", "report"])
def test_source_notebooks_have_parameters_cell_and_no_outputs(name):
    nb = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert any("parameters" in c["metadata"].get("tags", []) for c in code)
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in code)


def test_notebooks_execute_with_papermill(lab):
    params = dict(raw_dir=str(lab / "raw"), tidy_dir=str(lab / "tidy"), testbed=TB,
                  references=str(FIX / "references.yaml"))
    ipynb, html = papermill_run.run_notebook(ROOT / "notebooks" / "collect.ipynb", lab / "reports", params)
    assert (lab / "tidy" / TB / "rows.parquet").exists()
    text = html.read_text()
    assert "above_line_rate" in text and "no GPU on node-b" in text
    assert "collect_testbed(" not in text          # code cells are not shown
    assert "collect_testbed(" in ipynb.read_text()  # ...but kept in the executed notebook

    params = dict(tidy_dir=str(lab / "tidy"), figures_dir=str(lab / "figures"), testbed=TB,
                  references=str(FIX / "references.yaml"), baseline="peercache-8xcx7-roce",
                  out_dir=str(lab / "reports"))
    ipynb, html = papermill_run.run_notebook(ROOT / "notebooks" / "report.ipynb", lab / "reports", params,
                                             html=False)
    text = html.read_text().replace("\u00a0", " ")   # written by the notebook itself: the document, not a dump
    assert "build_report(" not in text and "jp-Notebook" not in text
    for needle in ("Overview", "% of single-NIC raw limit", "whole machine", "above_line_rate", "Test environment",
                   "Key conclusions", "Host + meta", "revision 0123abcd", "Beside the published baseline",
                   "413.1 GB/s", "report-rows.csv", "Explore this run"):
        assert needle in text, needle
    assert text.count("<h1") == 1
    assert text.count("data:image/png;base64") >= 5
    assert (lab / "figures" / TB / "single_nic.png").exists()
    md = (lab / "reports" / "report.md").read_text()
    assert "](../figures/fixture-2x-cx7/single_nic.png)" in md          # relative: reads on a forge
    assert (lab / "reports" / "report-rows.csv").read_text().startswith("experiment,")


def test_overview_and_sections(lab, tmp_path):
    collect.collect_testbed(lab / "raw", tmp_path / "tidy", TB)
    rep = report.build_report(tmp_path / "tidy", tmp_path / "fig", TB, FIX / "references.yaml")
    ov = {r["scenario"]: r for r in rep.overview.to_dict("records")}
    peer = ov["single_nic: PeerCache over rdma, 128 KiB, batch 32, 8 proc × 4 thr"]
    assert peer["GET throughput"] == "45.3\u00a0GB/s (362.4\u00a0Gb/s)" and peer["% of single-NIC raw limit"] == "94%"
    assert peer["run"] == "single_nic-peercache_p8_t4-rep0"
    assert ov["gpudirect"]["GET throughput"] == "—" and "skipped" in ov["gpudirect"]["notes"]
    assert ov["whole_machine: aggregate over 2 NICs"]["notes"] == "per NIC 47.5–52.5 GB/s"
    assert rep.verdict_counts["above_line_rate"] == 1 and rep.verdict_counts["low"] == 1
    assert [s.scenario for s in rep.sections] == ["single_nic", "multi_rail", "whole_machine", "gpudirect",
                                                  "msgsize_sweep"]
    md = report.report_markdown(rep)
    assert "gpudirect: not drawn:" in md and "## Appendix: the tidy table" in md
    # unchecked rows are counted by reason, not listed with their reason one by one
    assert md.count("no reference for this") <= 2
    secs = {s.scenario: s for s in rep.sections}
    assert [c for c, _ in secs["msgsize_sweep"].tables] == ["every point", "QP1 vs QP4"]
    assert list(secs["multi_rail"].tables[0][1][0]) == ["page size", "batch", "peak", "best threads", "run"]


def test_a_failed_point_is_named_with_its_reason_once():
    import pandas as pd
    sub = pd.DataFrame({"run_id": ["mr/p1x1/rep0", "mr/p1x2/rep0", "mr/p1x2/rep0", "mr/p1x4/rep0"],
                        "status": ["ok", "failed", "failed", "failed"],
                        "reason": [None, "the directory is unreachable", "the directory is unreachable", None]})
    assert report.failed_points(sub) == ["mr/p1x2/rep0: failed: the directory is unreachable",
                                         "mr/p1x4/rep0: failed: no reason recorded"]
    assert report.failed_points(sub[sub["status"] == "ok"]) == []


def test_conclusions_cite_their_runs_and_are_left_out_when_unsupported(lab, tmp_path):
    collect.collect_testbed(lab / "raw", tmp_path / "tidy", TB)
    rep = report.build_report(tmp_path / "tidy", tmp_path / "fig", TB, FIX / "references.yaml")
    texts = [c.text for c in rep.conclusions]
    single = [c for c in rep.conclusions if c.text.startswith("Single NIC")]
    assert single and "94% of raw ib_read_bw" in single[0].text
    assert set(single[0].runs) == {"single_nic-peercache_p8_t4-rep0", "single_nic-ib_read_bw_q16_s131072-rep0"}
    assert any("peaks at 4 threads" in t and "falls beyond" in t for t in texts), texts
    # without the raw row there is no percentage and no single-NIC conclusion
    rows, runs = collect.load_tidy(tmp_path / "tidy" / TB)
    collect.write_tidy(tmp_path / "t2", TB, rows[rows["tool"] != "ib_read_bw"], runs)
    rep2 = report.build_report(tmp_path / "t2", tmp_path / "fig", TB, FIX / "references.yaml")
    assert not [c for c in rep2.conclusions if c.text.startswith("Single NIC")]
    ov = {r["scenario"]: r for r in rep2.overview.to_dict("records")}
    peer = ov["single_nic: PeerCache over rdma, 128 KiB, batch 32, 8 proc × 4 thr"]
    assert peer["% of single-NIC raw limit"] == "—" and "no % of raw" in peer["notes"]


def _sig_figs(token: str) -> int:
    mant = token.lower().split("e")[0].lstrip("-").replace(".", "").lstrip("0")
    return len(mant.rstrip("0")) if "." not in token.lower().split("e")[0] else len(mant)


def test_no_number_in_the_report_has_more_than_4_significant_figures(lab, tmp_path):
    import re
    collect.collect_testbed(lab / "raw", tmp_path / "tidy", TB)
    text = report.report_markdown(report.build_report(tmp_path / "tidy", tmp_path / "fig", TB,
                                                      FIX / "references.yaml"))
    cells = [c.strip() for line in text.splitlines() if line.startswith("|") for c in line.strip("|").split("|")]
    numbers = [m.group(1) for c in cells for m in [re.fullmatch(r"(-?[\d.]+(?:e[+-]?\d+)?)(?: \S+)?", c)] if m]
    assert len(numbers) > 50
    wide = [n for n in numbers if _sig_figs(n) > 4]
    assert not wide, wide[:10]
