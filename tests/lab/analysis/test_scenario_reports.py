"""The registry of scenario reports (peercache/lab/analysis/scenarios): every scenario the pipeline knows has
a report module, a scenario without one is caught, and the harnesses find each scenario's figures there."""
from pathlib import Path

import pandas as pd
import yaml

from peercache.lab.analysis import charts
from peercache.lab.analysis.scenarios import DEFAULT, REPORTS, report_of
from peercache.lab.analysis.scenarios.declare import Scenario
from peercache.lab.pipeline import experiments

ROOT = Path(__file__).resolve().parents[3]


def _without_report(names) -> list[str]:
    return [n for n in names if n not in REPORTS]


def test_every_scenario_of_the_scenario_file_has_a_report_module():
    names = experiments.scenario_names()
    missing = _without_report(names)
    assert not missing, (f"scenario(s) {missing} of experiments/scenarios.yaml have no report: add a module under "
                         "peercache/lab/analysis/scenarios/ and its line in REPORTS")
    stale = sorted(set(REPORTS) - set(names))
    assert not stale, f"REPORTS names scenario(s) {stale} that experiments/scenarios.yaml no longer has"
    assert all(isinstance(r, Scenario) and r is not DEFAULT for r in REPORTS.values())


def test_a_new_scenario_without_a_report_module_is_caught(tmp_path):
    doc = yaml.safe_load((ROOT / "experiments" / "scenarios.yaml").read_text())
    doc["warp_drive"] = dict(doc["single_nic"], description="a scenario added without its report")
    f = tmp_path / "scenarios.yaml"
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    names = experiments.scenario_names(experiments.load_scenarios(f))
    assert _without_report(names) == ["warp_drive"]
    assert report_of("warp_drive") is DEFAULT


def test_chart_names_are_unique_so_no_figure_overwrites_another():
    names = [name for r in REPORTS.values() for name in r.figures]
    assert len(names) == len(set(names)), names
    assert all(r.figures for r in REPORTS.values())      # every scenario of the file draws something


def test_a_scenario_without_a_module_gets_the_default_table_and_no_figure():
    rows = pd.DataFrame([{"scenario": "perf_stat", "metric": "bw", "value": 2.0, "unit": "GB/s", "status": "ok",
                          "run_id": "tb/perf_stat/p/rep0"}])
    assert charts.build_scenario("perf_stat", rows, pd.DataFrame(), None) == []
    assert DEFAULT.tables(rows, {}) == [("", [{"metric": "bw", "value": "2 GB/s", "run": "tb/perf_stat/p/rep0"}])]
    assert DEFAULT.conclusions(rows, {}) == []
