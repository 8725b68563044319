"""The exploration notebook's library: list runs, load one, its overview, one-call plots, ad-hoc reads.

A *run* is one folder of tidy rows: ``data/tidy/<testbed>`` (the pipeline's
last run of a testbed; copy the folder to keep it beside the next one),
``data/reference/<name>`` (a published baseline) or ``results/bench/<run>``
(one ``make bench``). :func:`load_run` reads it with the verdicts of the
references and the "limited by" of the attribution rules, so every view of
the notebook (and ``peercache-lab compare``) shows the same judged rows.

Nothing here holds a measured number; everything shown comes from the rows,
or, for :func:`adhoc_reads`, from reads timed now against a running serve.
"""
from __future__ import annotations

import io
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import matplotlib

matplotlib.use("Agg")  # the notebook shows figures inline; files never need a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import yaml  # noqa: E402

from peercache.lab.analysis import charts, collect, report  # noqa: E402
from peercache.lab.analysis.format import (display, fmt_number, fmt_size, limit_text, markdown_table,  # noqa: E402
                                           point_label, why_empty)
from peercache.lab.analysis.metablock import host_summary  # noqa: E402
from peercache.lab.analysis.rawlimit import BW_METRICS  # noqa: E402
from peercache.lab.analysis.markup import Markdown, md, md_code  # noqa: E402
from peercache.lab.analysis.references import line_capacity_bps, load_references, row_extra  # noqa: E402
from peercache.lab.tidy import convert  # noqa: E402

#: Where runs are looked for, relative to the repository root (absolute paths work too).
DEFAULT_ROOTS = ("data/tidy", "data/reference", "results/bench")
DEFAULT_REFERENCES = "data/reference/references.yaml"
#: The published baselines the notebook shows side by side when nothing else is asked (data/reference/).
DEFAULT_BASELINES = ("peercache-8xcx7-roce", "ib-write-bw-200gbe-qp-sweep")

#: Knobs a metric can be plotted against: the name a person types -> the tidy column.
KNOBS = {"size": "size_bytes", "size_bytes": "size_bytes", "page_size": "size_bytes", "message_size": "size_bytes",
         "qps": "qps", "QPs": "qps", "channels": "qps", "streams": "qps",
         "threads": "threads", "concurrency": "threads", "processes": "processes", "batch": "batch"}
#: Columns a plot is faceted by, or its series told apart by.
FACETS = ("protocol", "scenario", "tool", "side", "layout")
_SERIES_COLUMNS = ("scenario", "tool", "side", "protocol", "layout", "size_bytes", "batch", "qps", "threads",
                   "processes")
_KNOB_LABELS = {"size_bytes": "size", "qps": "QPs / channels / streams", "threads": "threads (concurrency)",
                "processes": "processes", "batch": "batch"}


# --- parameters ------------------------------------------------------------------
# papermill hands a list parameter over as a list with -y "roots: [a, b]", but as a string with
# -p roots "[a, b]" or -p roots a,b; every function here takes any of those forms.

def as_list(value: Any, name: str = "value") -> list[str]:
    """A list parameter as a list of strings: a list, a YAML list string ("[a, b]"), "a,b", "a", or empty."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value if str(v).strip()]
    if not isinstance(value, str):
        raise TypeError(f"{name}: {value!r} is a {type(value).__name__}; give a list, e.g. -y \"{name}: [a, b]\" "
                        f"or -p {name} a,b")
    text = value.strip()
    if text.startswith("["):
        try:
            parsed = yaml.safe_load(text)
        except yaml.YAMLError:
            raise ValueError(f"{name}: {value!r} is not a list (unbalanced brackets or quotes?); give "
                             f"-y \"{name}: [a, b]\" or -p {name} a,b") from None
        return as_list(parsed, name)
    return [part.strip() for part in text.split(",") if part.strip()]


def as_mapping(value: Any, name: str = "where") -> dict[str, Any]:
    """A mapping parameter as a dict: a dict, a YAML mapping string ("{scenario: multi_rail}"), or empty."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return {}
    if isinstance(value, str):
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError:
            raise ValueError(f"{name}: {value!r} is not a mapping (unbalanced braces or quotes?); give "
                             f"-y \"{name}: {{scenario: multi_rail}}\"") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name}: {value!r} is not a mapping; give -y \"{name}: {{scenario: multi_rail}}\"")
    return value


# --- runs ------------------------------------------------------------------------

def _kind(path: Path) -> str:
    if (path / collect.REF_ROWS_FILE).exists() and not (path / collect.ROWS_FILE).exists():
        return "reference"
    return "bench" if (path / "bench.json").exists() else "tidy"


def _run_dirs(roots) -> list[Path]:
    out = []
    for root in as_list(roots, "roots"):
        root = report.resolve(root)
        if root is None or not root.is_dir():
            continue
        for d in sorted(p for p in root.iterdir() if p.is_dir()):
            if (d / collect.ROWS_FILE).exists() or (d / collect.REF_ROWS_FILE).exists():
                out.append(d)
    return out


def list_runs(roots=DEFAULT_ROOTS) -> pd.DataFrame:
    """One line per run folder under ``roots``: name, kind, path, testbed, size, period, revision."""
    recs = []
    for d in _run_dirs(roots):
        rows, runs = collect.load_tidy(d)
        starts = sorted(str(s) for s in runs["start"].dropna()) if "start" in runs else []
        ends = sorted(str(s) for s in runs["end"].dropna()) if "end" in runs else []
        recs.append({"name": d.name, "kind": _kind(d), "testbed": ",".join(sorted(set(rows["testbed"]) - {""})),
                     "scenarios": ",".join(dict.fromkeys(rows["scenario"])),
                     "points": int(runs["point"].nunique()), "rows": len(rows),
                     "ok rows": int((rows["status"] == "ok").sum()),
                     "start": starts[0] if starts else "not recorded", "end": ends[-1] if ends else "not recorded",
                     "revision": ",".join(sorted({str(r) for r in runs["git_revision"].dropna()})) or "not recorded",
                     "path": str(d)})
    cols = ["name", "kind", "testbed", "scenarios", "points", "rows", "ok rows", "start", "end", "revision", "path"]
    return pd.DataFrame(recs, columns=cols)


def looked_in(roots=DEFAULT_ROOTS) -> list[str]:
    """What each root of ``roots`` holds: its runs, or why it holds none (said beside the listing)."""
    lines = []
    for root in as_list(roots, "roots"):
        where = report.resolve(root)
        if where is None or not where.is_dir():
            lines.append(f"{root}: no such folder ({where})")
            continue
        names = [d.name for d in _run_dirs([str(where)])]
        lines.append(f"{root}: {len(names)} run(s)" + (f" ({', '.join(names)})" if names else
                     f": no folder in {where} holds rows.parquet or rows.csv"))
    return lines


def runs_markdown(listing: pd.DataFrame, roots=DEFAULT_ROOTS) -> str:
    """The listing as Markdown, with what each root held; no run at all is an error naming where it looked."""
    if listing.empty:
        raise LookupError("no runs under `roots` (" + "; ".join(looked_in(roots)) + "); run the pipeline "
                          "(`make run`) or `make bench` first, or point `roots` at a folder of runs "
                          "(-y \"roots: [data/reference, my/runs]\")")
    return ("## Runs\n\n" + markdown_table(records(listing)) + "\nLooked in:\n\n"
            + "\n".join(md("- {}", l) for l in looked_in(roots)) + "\n")


def default_run(listing: pd.DataFrame) -> str:
    """The run the notebook opens when none is named: the newest with recorded dates, else the first listed."""
    if listing.empty:
        raise LookupError("no runs found (no rows.parquet / rows.csv under the roots); run the pipeline "
                          "(`make run`) or `make bench` first, or point `roots` at a folder of runs")
    dated = listing[listing["end"] != "not recorded"]
    return str((dated.sort_values("end").iloc[-1] if not dated.empty else listing.iloc[0])["name"])


def find_run(name: str | Path, roots=DEFAULT_ROOTS) -> Path:
    """The folder of run ``name``: a path to a run folder, or a run's name under ``roots``."""
    p = Path(name)
    for cand in (p, report.resolve(p)):
        if cand is not None and cand.is_dir() and ((cand / collect.ROWS_FILE).exists()
                                                   or (cand / collect.REF_ROWS_FILE).exists()):
            return cand
    hits = [d for d in _run_dirs(roots) if d.name == str(name)]
    if len(hits) == 1:
        return hits[0]
    where = ", ".join(str(report.resolve(r)) for r in as_list(roots, "roots"))
    if len(hits) > 1:
        raise LookupError(f"run {name!r} is in several places ({', '.join(map(str, hits))}); pass its path")
    known = ", ".join(d.name for d in _run_dirs(roots)) or "none"
    raise LookupError(f"no run {name!r}: not a run folder (rows.parquet or rows.csv), and no run of that name "
                      f"under {where} (runs there: {known}); pass a run folder's path or one of those names")


@dataclass
class Run:
    """One run's judged rows (verdict, verdict_reason, limited_by, limit added) and meta blocks."""

    name: str
    path: Path
    kind: str                  #: tidy, reference or bench
    rows: pd.DataFrame
    runs: pd.DataFrame
    notes: list[str] = field(default_factory=list)

    @property
    def testbed(self) -> str:
        """The testbed(s) its rows were measured on."""
        return ",".join(sorted(set(self.rows["testbed"]) - {""})) or self.name

    @property
    def period(self) -> str:
        """First start .. last end of its meta blocks."""
        s = sorted(str(v) for v in self.runs["start"].dropna())
        e = sorted(str(v) for v in self.runs["end"].dropna())
        return f"{s[0]} .. {e[-1]}" if s and e else "dates not recorded"

    @property
    def revision(self) -> str:
        """The git revision(s) it ran at."""
        return ",".join(sorted({str(r) for r in self.runs["git_revision"].dropna()})) or "not recorded"

    @property
    def label(self) -> str:
        """Name, kind, folder, testbed, dates and revision: what names this run under every table and chart."""
        return (f"{self.name} ({self.kind}, {_shown(self.path)}; testbed {self.testbed}; {self.period}; "
                f"revision {self.revision})")

    def meta_lines(self) -> list[str]:
        """The run's label and its first meta block's hosts."""
        lines = [f"run {self.label}"]
        if not self.runs.empty:
            first = self.runs.iloc[0]
            src = collect.run_field(first, "source")
            if src:
                lines.append(f"source: {src.get('title', '')} ({src.get('file', '')})")
            lines += host_summary(collect.run_field(first, "hosts"))
        return lines


def _shown(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(report.repo_root()))
    except ValueError:
        return str(path)


def load_run(name: str | Path, roots=DEFAULT_ROOTS, references: str | Path | None = DEFAULT_REFERENCES) -> Run:
    """Run ``name`` (a path, or a name under ``roots``) with verdicts and "limited by" on its rows."""
    path = find_run(name, roots)
    rows, runs = collect.load_tidy(path)
    refs = load_references(report.resolve(references)) if references else {}
    notes = []
    testbeds = sorted(set(rows["testbed"]) - {""})
    if not references:
        notes.append("no references file given: every verdict is 'unchecked'")
    elif not any(t in refs for t in testbeds):
        notes.append(f"no references for testbed {', '.join(testbeds) or '?'} in {references}: "
                     "every verdict is 'unchecked' and line rates are unknown")
    judged = charts.judge(rows, runs, refs, testbeds[0] if len(testbeds) == 1 else "")
    point_of = dict(zip(runs["run_id"], runs["point"]))
    judged["point"] = [str(point_of.get(r, "") or "") for r in judged["run_id"]]
    return Run(path.name, path, _kind(path), judged.reset_index(drop=True), runs, notes)


# --- overview --------------------------------------------------------------------

#: Columns of the overview's per-point table.
POINT_COLUMNS = ["scenario", "point", "metric", "side", "size", "batch", "qps", "threads", "processes",
                 "value", "unit", "status", "verdict", "limited by", "run"]


@dataclass
class Overview:
    """What the notebook shows first for a run."""

    run: Run
    headline: pd.DataFrame         #: the report's overview (scenario, GET throughput, fraction of raw, limited by)
    points: pd.DataFrame           #: every throughput row with its verdict and "limited by"
    verdict_counts: dict[str, int]


def overview(run: Run) -> Overview:
    """The report's overview table, verdict counts, and each throughput row with verdict and "limited by"."""
    rows = run.rows
    bw = rows[rows["metric"].isin(BW_METRICS)]
    recs = []
    for r in bw.to_dict("records"):
        v, u = display(r["value"], r["unit"]) if r["status"] == "ok" else (None, r["unit"])
        recs.append({"scenario": r["scenario"], "point": r["point"], "metric": r["metric"], "side": r["side"],
                     "size": fmt_size(r["size_bytes"]), "batch": r["batch"], "qps": r["qps"],
                     "threads": r["threads"], "processes": r["processes"],
                     "value": fmt_number(v), "unit": u, "status": r["status"],
                     "verdict": r.get("verdict") or "unchecked", "limited by": r.get("limited_by") or "—",
                     "run": r["run_id"]})
    counts = {k: int(v) for k, v in rows["verdict"].value_counts().items()}
    return Overview(run, report.overview_table(rows), pd.DataFrame(recs, columns=POINT_COLUMNS), counts)


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """DataFrame records with missing values as empty cells (for Markdown tables)."""
    out = []
    for rec in df.to_dict("records"):
        out.append({k: ("" if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)) else v)
                    for k, v in rec.items()})
    return out


def overview_markdown(ov: Overview) -> str:
    """The overview as Markdown: run label, notes, headline table, verdict counts, throughput points."""
    # the run's name, hosts and notes are text (markup.md): a host's CPU model never becomes markup
    parts = [md("## Run {}\n", ov.run.name), "\n".join(md("- {}", l) for l in ov.run.meta_lines()) + "\n"]
    parts += [md("- note: {}", n) for n in ov.run.notes]
    parts.append("\n### Overview\n")
    parts.append(markdown_table(records(ov.headline)))
    parts.append("Verdicts: " + (", ".join(md("{} {}", k, v) for k, v in sorted(ov.verdict_counts.items())) or "none")
                 + "\n")
    parts.append("\n### Throughput points: verdict and what limited each\n")
    parts.append(markdown_table(records(ov.points)))
    return "\n".join(parts)


# --- one-call plots --------------------------------------------------------------

@dataclass
class Plot:
    """A metric against a knob: the figure, the table behind it, and what to know about it."""

    fig: Any
    table: pd.DataFrame
    notes: list[str] = field(default_factory=list)


def knob_column(knob: str) -> str:
    """The tidy column of ``knob`` (size, QPs, threads, processes, batch, or the column's own name)."""
    col = KNOBS.get(knob) or KNOBS.get(str(knob).lower())
    if col is None:
        raise ValueError(f"unknown knob {knob!r}; use one of size, qps, threads, processes, batch "
                         f"(or {', '.join(sorted(KNOBS))})")
    return col


def _axis(ax, col: str, xs) -> None:
    xs = sorted({float(x) for x in xs if x is not None and not pd.isna(x) and float(x) > 0})
    if not xs:
        return
    if col == "size_bytes" or xs[-1] / xs[0] >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [fmt_size(x).replace(" ", "") if col == "size_bytes" else fmt_number(int(x))
                       for x in xs], fontsize=7, rotation=45 if len(xs) > 6 else 0)
    ax.minorticks_off()
    ax.set_xlabel(_KNOB_LABELS.get(col, col) + (" (log)" if ax.get_xscale() == "log" else ""))


def _series_label(rec: dict, cols: list[str]) -> str:
    bits = []
    for c in cols:
        v = rec.get(c)
        if v is None or v is pd.NA or v == "" or (isinstance(v, float) and math.isnan(v)):
            continue
        bits.append(fmt_size(v) if c == "size_bytes" else
                    {"qps": "q{}", "threads": "{} thr", "processes": "{} proc", "batch": "batch {}"}
                    .get(c, "{}").format(v))
    return " ".join(bits) or "all"


def plot_metric(run: Run, metric: str, knob: str, facet: str | None = "protocol",
                where: dict[str, Any] | None = None) -> Plot:
    """``metric`` against ``knob``, one panel per value of ``facet``, one line per other varying knob.

    Repetitions of a point are drawn as their median, the table keeps how many
    there were, their spread, their verdicts and the run ids. ``where``: equality
    filters on row columns (``{"scenario": "multi_rail", "tool": "peercache-bench"}``).
    """
    picked = []
    if not metric:
        metric = next((m for m in BW_METRICS if ((run.rows["metric"] == m) & (run.rows["status"] == "ok")).any()), "")
        if not metric:
            raise ValueError(f"run {run.name} has no measured {' or '.join(BW_METRICS)} row to pick as the metric; "
                             f"name one of its metrics: {', '.join(sorted(set(run.rows['metric'])))}")
        picked.append(f"metric {metric} (parameter `metric` was empty: the run's throughput)")
    if not knob:
        ok_rows = run.rows[(run.rows["metric"] == metric) & (run.rows["status"] == "ok")]
        spread = {c: ok_rows[c].dropna().nunique() for c in dict.fromkeys(KNOBS.values()) if c in ok_rows}
        knob = max(spread, key=lambda c: spread[c]) if spread else "size_bytes"
        picked.append(f"knob {_KNOB_LABELS.get(knob, knob)} (parameter `knob` was empty: the knob with the most "
                      f"values, {spread.get(knob, 0)})")
    where = as_mapping(where)
    col = knob_column(knob)
    if facet is not None and facet not in run.rows.columns:
        raise ValueError(f"cannot facet by {facet!r}: not a row column; use one of {', '.join(FACETS)} or None")
    rows = run.rows
    if metric not in set(rows["metric"]):
        raise ValueError(f"run {run.name} has no metric {metric!r}; its metrics: "
                         f"{', '.join(sorted(set(rows['metric'])))}")
    sub = rows[rows["metric"] == metric]
    for k, v in (where or {}).items():
        if k not in sub.columns:
            raise ValueError(f"where: {k!r} is not a row column ({', '.join(sub.columns)})")
        sub = sub[sub[k].astype(str) == str(v)]
    ok = sub[(sub["status"] == "ok") & sub["value"].notna() & sub[col].notna()]
    if ok.empty:
        why = why_empty(sub, f"{metric}") if not sub.empty else f"no {metric} rows match {where}"
        raise ValueError(f"run {run.name}: nothing to plot for {metric} against {knob}: {why}; "
                         f"with a value for {col} in {len(sub[sub[col].notna()])} of {len(sub)} rows")
    shown = [display(v, u) for v, u in zip(ok["value"], ok["unit"])]
    ok = ok.assign(shown=[v for v, _ in shown], shown_unit=[u for _, u in shown])
    units = sorted(set(ok["shown_unit"]))
    if len(units) > 1:
        raise ValueError(f"{metric} rows of run {run.name} are in units of several dimensions {units}; "
                         "pick one with where={'unit': ...}")
    unit = units[0]
    facets = list(dict.fromkeys(ok[facet])) if facet else [None]
    ncols = min(3, len(facets))
    nrows = math.ceil(len(facets) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.0 * ncols, 3.6 * nrows), squeeze=False)
    table, notes = [], []
    for i, fv in enumerate(facets):
        ax = axes[i // ncols][i % ncols]
        part = ok if facet is None else ok[ok[facet] == fv]
        series_cols = [c for c in _SERIES_COLUMNS if c not in (col, facet)
                       and part[c].astype(str).nunique() > 1]
        grouped = part.groupby([part[c].astype(str) for c in series_cols], sort=True) if series_cols \
            else [((), part)]
        for _, g in grouped:
            first = g.iloc[0].to_dict()
            label = _series_label(first, series_cols)
            pts = []
            for x, gx in g.groupby(col, sort=True):
                vals = gx["shown"].astype(float)
                if gx["point"].nunique() > 1:
                    notes.append(f"{fv or 'all'} / {label} at {col}={x}: {gx['point'].nunique()} points share "
                                 f"these knobs ({', '.join(sorted(set(gx['point'])))}); drawn as their median, "
                                 "pick one with where={'point': ...}")
                per_run = gx.groupby("run_id").size()
                if per_run.max() > 1:
                    notes.append(f"{fv or 'all'} / {label} at {col}={x}: {int(per_run.max())} rows of one run "
                                 f"({per_run.idxmax()}: sides/devices {', '.join(sorted(set(gx['devices'])))}); "
                                 "drawn as their median, pick one with where={'devices': ...}")
                pts.append((float(x), float(vals.median())))
                table.append({"facet": fv if facet else "", "series": label, col: x,
                              "value": float(vals.median()), "unit": unit, "n": len(vals),
                              "min": float(vals.min()), "max": float(vals.max()),
                              "verdicts": "/".join(sorted(set(gx["verdict"].fillna("unchecked")))),
                              "limited by": limit_text(gx),
                              "runs": ", ".join(dict.fromkeys(gx["run_id"]))})
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        _axis(ax, col, part[col])
        ax.set_title(f"{facet} = {fv}" if facet else "all rows", fontsize=9)
        ax.set_ylabel(f"{metric} ({unit})")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if len(ax.get_lines()) > 1:
            ax.legend(fontsize=7)
    for j in range(len(facets), nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)
    fig.suptitle(f"{metric} vs {_KNOB_LABELS.get(col, col)}, run {run.name}", fontsize=11)
    meta = run.meta_lines()
    extra = 0.15 * len(meta) + 0.25
    w, h = fig.get_size_inches()
    fig.set_size_inches(w, h + extra)
    fig.tight_layout(rect=(0, extra / (h + extra), 1, 0.95))
    fig.text(0.01, 0.01, "\n".join(l[:160] for l in meta), fontsize=6.5, family="monospace", va="bottom")
    return Plot(fig, pd.DataFrame(table), picked + list(dict.fromkeys(notes)))


# --- baselines side by side ------------------------------------------------------

#: Columns of the side-by-side table.
BASELINE_COLUMNS = ["baseline", "scenario", "tool", "side", "knobs", "value", "unit", "Gb/s", "% of line rate",
                    "verdict", "limited by"]


@dataclass
class SideBySide:
    """Runs shown side by side: each throughput row in one table (Gb/s, share of line rate), one panel each."""

    runs: list[Run]
    fig: Any
    table: pd.DataFrame
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        """The table, then each run's label and source, then the notes."""
        parts = [md("### {}\n", " | ".join(r.name for r in self.runs)),
                 markdown_table(records(self.table)), ""]
        for r in self.runs:
            parts += [md("- {}", line) for line in r.meta_lines()[:2]]
        parts += [md("- note: {}", n) for n in self.notes]
        return "\n".join(parts) + "\n"


def _short(text: str, most: int = 72) -> str:
    """A long "limited by" cut for a wide table (the overview and the rows keep it whole)."""
    return text if len(text) <= most else text[:most - 1].rstrip() + "…"


def _knobs(r: dict) -> str:
    """A row's knobs, and what tells published rows of one point apart (min/max/mean, GPU/host memory)."""
    extra = row_extra(pd.Series(r))
    told = " ".join(str(extra[k]) for k in ("statistic", "destination") if extra.get(k))
    return f"{point_label(r, ('size_bytes', 'batch', 'qps', 'threads', 'processes'))} {told}".strip()


def _bar_label(r: dict) -> str:
    side = "" if r.get("side") in ("client", "", None) else f" {r['side']}"
    return f"{r['scenario']}: {r['tool']}{side} {_knobs(r)}"


def side_by_side(names=DEFAULT_BASELINES, roots=DEFAULT_ROOTS,
                 references: str | Path | None = DEFAULT_REFERENCES) -> SideBySide:
    """The throughput rows of runs ``names`` (the two published baselines by default) in one table and one
    figure of a panel per run: each row in Gb/s beside its testbed's line rate, with its verdict.

    A name is looked up under ``roots`` and then under data/reference/, where the published baselines live.
    """
    names = as_list(names, "baselines")
    roots = list(dict.fromkeys([*as_list(roots, "roots"), "data/reference"]))
    if not names:
        raise ValueError("no baselines named (parameter `baselines` is empty); name runs listed above, e.g. "
                         f"-y \"baselines: [{', '.join(DEFAULT_BASELINES)}]\"")
    runs = [load_run(n, roots, references) for n in names]
    refs = load_references(report.resolve(references)) if references else {}
    table, notes = [], []
    fig, axes = plt.subplots(1, len(runs), figsize=(6.5 * len(runs), 5.2), squeeze=False)
    for run, ax in zip(runs, axes[0]):
        bw = run.rows[run.rows["metric"].isin(BW_METRICS) & (run.rows["status"] == "ok") & run.rows["value"].notna()]
        if bw.empty:
            raise ValueError(f"run {run.name} has no measured throughput ({' or '.join(BW_METRICS)}) row to show: "
                             f"{why_empty(run.rows[run.rows['metric'].isin(BW_METRICS)], 'throughput')}; "
                             "name another run in `baselines`")
        bw = bw.sort_values(["scenario", "size_bytes", "qps", "threads", "side"], kind="stable", na_position="first")
        tb_refs = refs.get(run.testbed)
        labels, gbits, colours = [], [], []
        for r in bw.to_dict("records"):
            gbit = convert(float(r["value"]), r["unit"], "Gbit/s")
            cap = line_capacity_bps(pd.Series(r), tb_refs) if tb_refs else None
            verdict = r.get("verdict") or "unchecked"
            table.append({"baseline": run.name, "scenario": r["scenario"], "tool": r["tool"], "side": r["side"],
                          "knobs": _knobs(r),
                          "value": fmt_number(r["value"]), "unit": r["unit"], "Gb/s": fmt_number(gbit),
                          "% of line rate": fmt_number(100 * gbit * 1e9 / cap, 3) if cap else "—",
                          "verdict": verdict, "limited by": _short(r.get("limited_by") or "—")})
            labels.append(_bar_label(r))
            gbits.append(gbit)
            colours.append({"ok": "tab:blue", "above_line_rate": "tab:red", "low": "tab:orange"}.get(verdict,
                                                                                                      "tab:gray"))
        ys = np.arange(len(labels))
        ax.barh(ys, gbits, color=colours)
        for y, v in zip(ys, gbits):
            ax.text(v, y, " " + fmt_number(v), va="center", fontsize=7)
        ax.set_yticks(ys, labels, fontsize=7)
        ax.invert_yaxis()
        one = tb_refs.line_rate_bps("") if tb_refs else None
        if one:
            ax.axvline(one / 1e9, color="k", linestyle="--", linewidth=1,
                       label=f"line rate of one NIC, {fmt_number(one / 1e9)} Gb/s")
            ax.legend(fontsize=7, loc="lower right")
        else:
            notes.append(f"{run.name}: no line rate for testbed {run.testbed} in {references}; none drawn")
        if max(gbits) / max(min(gbits), 1e-9) >= 20:
            ax.set_xscale("log")
        ax.set_xlabel("throughput (Gb/s" + (", log" if ax.get_xscale() == "log" else "") + ")")
        ax.set_title(f"{run.name}\n({run.kind}; testbed {run.testbed})", fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle("Baselines side by side: every throughput row (blue ok, red above line rate, orange low, "
                 "grey unchecked)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return SideBySide(runs, fig, pd.DataFrame(table, columns=BASELINE_COLUMNS), notes)


# --- ad-hoc reads against a running serve ------------------------------------------

@dataclass
class Reads:
    """Batches timed against a serve: one latency per batch, and what the first page held."""

    addr: str
    protocol: str
    page_size: int
    batch: int
    first_key: str
    first_len: int | None          #: bytes of the single page got first (None: a miss)
    latencies_us: np.ndarray       #: one per timed batch, in microseconds
    hits: int
    misses: int
    elapsed_s: float
    stopped_by: str                #: "count" or "time" (which bound ended the loop)

    def summary(self) -> dict[str, Any]:
        """Counts, percentiles (us) and throughput of the timed batches, each with its unit."""
        lat = self.latencies_us
        n = len(lat)
        got = self.hits * self.page_size
        out = {"serve": self.addr, "protocol": self.protocol, "page_size_B": self.page_size,
               "batch": self.batch, "batches": n, "hits": self.hits, "misses": self.misses,
               "stopped_by": self.stopped_by, "elapsed_s": round(self.elapsed_s, 3)}
        if n:
            for p in (50, 90, 99):
                out[f"p{p}_us"] = float(np.percentile(lat, p))
            out["max_us"] = float(lat.max())
            busy = float(lat.sum()) / 1e6
            out["GB_per_s"] = got / busy / 1e9 if busy > 0 else None
        return out


def adhoc_reads(addr: str, *, page_size: int = 131072, layout: str = "mla", working_set: int = 64,
                batch: int = 32, batches: int = 200, max_seconds: float = 10.0, protocol: str = "tcp",
                timeout: float = 5.0) -> Reads:
    """Connect to the serve at ``addr`` with ``import peercache``, get one page, time up to ``batches`` batches.

    The keys are serve's (``pc/<i>`` per page, ``pc/<i>/k|v`` for mha); the loop
    stops after ``batches`` batches or ``max_seconds``, whichever comes first.
    """
    # the engine: only ad-hoc reads need it; the reports that import this module read results, never a serve
    import peercache
    from peercache.bench import options  # config, zmq and the directory's URL rules (~0.15 s)

    if batch <= 0 or batches <= 0 or max_seconds <= 0:
        raise ValueError(f"batch ({batch}), batches ({batches}) and max_seconds ({max_seconds}) must be positive")
    keys = options.page_keys(working_set, layout)
    lat = []
    hits = misses = 0
    with peercache.connect(addr, protocol=protocol, page_size=page_size, timeout=timeout) as pc:
        first = pc.get(keys[0])
        t_end = time.monotonic() + max_seconds
        t0 = time.monotonic()
        stopped = "count"
        for i in range(batches):
            if time.monotonic() >= t_end:
                stopped = "time"
                break
            chunk = [keys[(i * batch + j) % len(keys)] for j in range(batch)]
            t = time.perf_counter()
            got = pc.get_batch(chunk)
            lat.append((time.perf_counter() - t) * 1e6)
            n_hit = sum(1 for g in got if g is not None)
            hits += n_hit
            misses += len(got) - n_hit
        elapsed = time.monotonic() - t0
    return Reads(addr, protocol, page_size, batch, keys[0].decode(), None if first is None else len(first),
                 np.array(lat, dtype=float), hits, misses, elapsed, stopped)


def latency_figure(reads: Reads):
    """Histogram of batch latencies with p50/p99 marked, titled with the serve it came from."""
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    lat = reads.latencies_us
    if len(lat):
        ax.hist(lat, bins=min(50, max(5, len(lat) // 4)), color="tab:blue", alpha=0.8)
        for p, style in ((50, "--"), (99, ":")):
            v = float(np.percentile(lat, p))
            ax.axvline(v, color="k", linestyle=style, label=f"p{p} {fmt_number(v)} us")
        ax.legend(fontsize=8)
    ax.set_xlabel(f"latency of one get_batch of {reads.batch} x {fmt_size(reads.page_size)} (us)")
    ax.set_ylabel("batches")
    ax.set_title(f"ad-hoc reads from serve {reads.addr} ({reads.protocol}), {len(lat)} batches", fontsize=10)
    fig.tight_layout()
    return fig


def png(fig) -> bytes:
    """A figure as PNG bytes (for ``IPython.display.Image``; the kernel's backend need not be inline); closes it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


#: What the ad-hoc reads cell says when the notebook's parameters name no serve.
NO_SERVE = ("No serve named (parameter `serve` is empty): the ad-hoc reads are skipped. Start one, e.g. "
            "`peercache-bench serve --discovery-addr 127.0.0.1:31998 --readers 0 --working-set 64`, "
            "and set `serve = \"127.0.0.1:31998\"` (and `serve_page_size` to its `--page-size`).")


def reads_markdown(reads: Reads) -> str:
    """The ad-hoc reads as Markdown: the single get, then the batch summary with units."""
    s = reads.summary()
    first = (f"`get({reads.first_key!r})` returned {reads.first_len} B" if reads.first_len is not None
             else f"`get({reads.first_key!r})` was a miss (is serve's working set published under these keys?)")
    rows = [{"quantity": k, "value": fmt_number(v) if not isinstance(v, str) else v}
            for k, v in s.items()]
    return (f"### Ad-hoc reads from serve {reads.addr}\n\n{first}\n\n" + markdown_table(rows)
            + f"\nTimed {s['batches']} batches of {reads.batch} pages (stopped by {reads.stopped_by}); "
            "units in the names (_us microseconds, _B bytes, _s seconds, GB_per_s 1e9 bytes per second of "
            "time inside get_batch).")


# --- the report's link -----------------------------------------------------------

def explore_link(run: str, tidy_dir: str | Path = "data/tidy", notebook: str = "notebooks/explore.ipynb") -> Markdown:
    """Markdown pointing a report at the exploration notebook for its run (path, parameter, command).

    The run's name and path are the testbed's: they go in as text and code spans (markup), never as markup.
    """
    path = _shown(Path(str(tidy_dir)) / str(run))     # repository-relative when it lies inside the checkout
    nb = report.resolve(notebook)
    target = quote(nb.as_uri(), safe=":/%") if nb else quote(notebook, safe="/")
    return md("### Explore this run\n\nOpen [{}](" + target + ") ({}) and set its parameter {}, or run it "
              "headless:\n\n{}\n\nCompare with another run from the shell: {}.",
              notebook, md_code("make lab"), md_code(f"run = {json.dumps(str(path))}"),
              md_code(f"python -m peercache.lab.analysis.papermill_run {notebook} reports/{run} --name explore "
                      f"-p run {path}"),
              md_code(f"peercache-lab compare {path} OTHER_RUN"))
