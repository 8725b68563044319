"""What every scenario's report is made of: :class:`Chart` / :class:`NotDrawn`, :class:`Conclusion`, and the
:class:`Scenario` base each scenario module extends (in the shape of the point kinds'
:mod:`peercache.lab.pipeline.points.declare`).

A scenario's report is its figures (chart name -> builder), its compact table(s), its rows of the
overview and the key conclusions its rows support. The defaults here are what a scenario without a module
of its own gets (a scenario in the data but not in the scenario file, such as a published baseline's):
no figure, a metric/value table, its best bandwidth point in the overview and no conclusion. Nothing
here draws or writes; the registry is :mod:`peercache.lab.analysis.scenarios`, the harnesses that use
it are :mod:`peercache.lab.analysis.charts` and :mod:`peercache.lab.analysis.report`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import pandas as pd

from peercache.lab.analysis.format import fmt_number, point_label, short_run, throughput_text
from peercache.lab.analysis.rawlimit import BW_METRICS, RAW_TOOLS, RawLimit, pct_text, raw_for, why_none
from peercache.lab.analysis.references import TestbedRefs, convert, row_extra
from peercache.lab.analysis.spread import by_point, median_note
from peercache.lab.pipeline import experiments

#: Scenarios whose figures are PeerCache GETs (their kinds say so; see pipeline/kinds.py).
GET_SCENARIOS = experiments.get_scenarios()

#: The overview's columns, as the published document has them.
OVERVIEW_COLUMNS = ["scenario", "GET throughput", "% of single-NIC raw limit", "limited by", "notes", "run"]

#: A table: (caption, records); a scenario may have several.
Table = tuple[str, list[dict[str, Any]]]
#: Limits by raw shape (:func:`peercache.lab.analysis.rawlimit.raw_limits`).
Limits = dict[Any, RawLimit]


@dataclass
class Chart:
    """One drawn chart: its figure, Markdown table and the meta block beside it."""

    name: str
    title: str
    fig: Any
    table: list[dict[str, Any]]
    meta: list[str]
    notes: list[str] = field(default_factory=list)
    caption: str = ""           #: what limited the figures (attribution), shown under the plot


@dataclass
class NotDrawn:
    """A chart that was not drawn, and why."""

    name: str
    reason: str


#: A figure builder: (the scenario's rows with verdicts, the runs, the testbed's references) -> a chart.
Builder = Callable[[pd.DataFrame, pd.DataFrame, "TestbedRefs | None"], "Chart | NotDrawn"]


@dataclass
class Conclusion:
    """One key conclusion and the runs it rests on."""

    text: str
    runs: list[str]


def ok_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows with a measured value (status ok)."""
    return rows[(rows["status"] == "ok") & rows["value"].notna()]


def ok_bw(sub: pd.DataFrame) -> pd.DataFrame:
    """The measured bandwidth rows (:data:`rawlimit.BW_METRICS`)."""
    return sub[(sub["status"] == "ok") & sub["value"].notna() & sub["metric"].isin(BW_METRICS)]


def to_gbs(row: pd.Series | dict) -> float:
    """A bandwidth row's value in GB/s (ValueError for a unit that is not a bandwidth)."""
    return convert(float(row["value"]), str(row["unit"]), "GB/s")


def gbs(r) -> float | None:
    """A row's value in GB/s, or None where it has none (no number, or a unit that is not a bandwidth)."""
    try:
        return convert(float(r["value"]), str(r["unit"]), "GB/s")
    except (TypeError, ValueError):
        return None


def overview_row(scenario: str, label: str, r, limits: Limits, note: str = "",
                 sp: dict[str, Any] | None = None) -> dict[str, Any]:
    """One overview row for the measured row ``r``: its throughput, its % of the single-NIC raw limit (a GET
    of a GET scenario; the raw tool itself in single_nic), what limited it and the notes (not a GET,
    unverified, a verdict other than ok). ``sp``: the spread of the point's repetitions, ``r`` its median run."""
    g = gbs(r)
    is_raw = r["tool"] in RAW_TOOLS
    comparable = scenario in GET_SCENARIOS and not is_raw
    notes = [n for n in (note, row_extra(r).get("note")) if n]
    if sp is not None:
        notes.insert(0, median_note(sp))
    frac = "—"
    if is_raw and scenario == "single_nic":
        frac = "100% (the raw limit)"
    elif comparable and g is not None:
        lim = raw_for(r, limits)
        if lim is None:
            notes.append("no % of raw: " + why_none(r, limits))
        elif lim.gbs:
            pct = 100.0 * g / lim.gbs
            frac = pct_text(pct, "" if lim.label == lim.tool or " x " not in lim.label else lim.label,
                            lowest=None if sp is None else 100.0 * sp["min"] / lim.gbs)
    elif not comparable:
        notes.append(f"{r['tool']} {r['metric']}, not a GET")
    if r["metric"] == "get_throughput" and row_extra(r).get("verified") is False:
        notes.append("unverified: page contents not checked (drive --no-verify)")
    if r.get("verdict") not in (None, "ok", "unchecked"):
        notes.append(f"verdict {r['verdict']}")
    return {"scenario": f"{scenario}: {label}",
            "GET throughput": throughput_text(g) if g is not None else f"{fmt_number(r['value'])} {r['unit']}",
            "% of single-NIC raw limit": frac, "limited by": r.get("limited_by") or "—",
            "notes": "; ".join(notes), "run": short_run(r["run_id"])}


class Scenario:
    """One scenario's part of the report. A scenario module subclasses it and overrides what is its own;
    what it does not override is the default every scenario without a module gets."""

    #: chart name -> builder, in drawing order (the name is the files' stem under figures/<testbed>/)
    figures: ClassVar[dict[str, Builder]] = {}

    def tables(self, sub: pd.DataFrame, limits: Limits) -> list[Table]:
        """The scenario's compact table(s) from its rows ``sub`` (``limits``: every ok row's raw limits)."""
        recs = [{"metric": r["metric"], "value": f"{fmt_number(r['value'])} {r['unit']}",
                 "run": short_run(r["run_id"])} for _, r in ok_bw(sub).iterrows()]
        return [("", recs)] if recs else []

    def overview(self, scenario: str, sub: pd.DataFrame, rows: pd.DataFrame, bw: pd.DataFrame,
                 limits: Limits) -> list[dict[str, Any]]:
        """The scenario's overview rows: from its rows ``sub``, every row ``rows``, every measured bandwidth
        row ``bw`` and their raw ``limits``. Without a bandwidth row: one row saying why."""
        s = bw[bw["scenario"] == scenario]
        if s.empty:
            reasons = sorted({f"{st}: {rs}" for st, rs in zip(sub["status"], sub["reason"].fillna(""))
                              if st != "ok"})
            return [{"scenario": scenario, "GET throughput": "—", "% of single-NIC raw limit": "—",
                     "limited by": "—", "notes": "; ".join(reasons) or "no bandwidth metric in this scenario",
                     "run": ", ".join(dict.fromkeys(sub["run_id"]))}]
        return self.headline(scenario, s, rows, limits)

    def headline(self, scenario: str, s: pd.DataFrame, rows: pd.DataFrame, limits: Limits) -> list[dict[str, Any]]:
        """The overview rows of the scenario's measured bandwidth rows ``s``: by default its best point by the
        median of its repetitions, that median run's row (the section has them all)."""
        r, sp, _ = max(by_point(s, lambda r: gbs(r) or 0.0), key=lambda p: p[1]["median"])
        return [overview_row(scenario, "best point " + point_label(r, ["size_bytes", "batch", "qps", "threads",
                                                                         "processes"]), r, limits, sp=sp)]

    def conclusions(self, sub: pd.DataFrame, limits: Limits) -> list[Conclusion]:
        """The key conclusions the scenario's rows ``sub`` support (``limits``: every ok bandwidth row's raw
        limits), each citing its runs; none where the data is silent."""
        return []
