"""Charts and Markdown tables per testbed, drawn only from tidy (or reference) data.

The harness: each scenario's figure builders are in its module of :mod:`peercache.lab.analysis.scenarios`
(each takes the scenario's rows, with verdicts, and the runs and returns a :class:`Chart` (figure + table +
meta block) or the reason it is not drawn, :class:`NotDrawn`). Here: the verdicts and attribution every
view shares (:func:`judge`), the caption and notes every chart gets, the stamping of title, caption and
meta block into the image, and :func:`make_charts`, which writes them under ``<out>/<testbed>/``.
No measured number lives here: every value comes from the rows.
"""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Callable, Iterable

import pandas as pd

from peercache import atomic
from peercache.lab.analysis import attribution, collect, markup
from peercache.lab.analysis.format import markdown_table
from peercache.lab.analysis.rawlimit import limits_by_scenario
from peercache.lab.analysis.references import TestbedRefs, apply_verdicts, line_capacity_bps, row_extra
from peercache.lab.analysis.scenarios import report_of
from peercache.lab.analysis.scenarios.declare import Chart, NotDrawn
from peercache.lab.analysis.scenarios.draw import plt
from peercache.lab.pipeline import experiments

#: Scenarios in drawing order: the scenario file's order (experiments/scenarios.yaml), read once.
SCENARIOS = experiments.scenario_names()
FORMATS = ("png", "svg")
_OWNED_SUFFIXES = (".png", ".svg", ".md")


def unverified_note(rows: pd.DataFrame) -> str | None:
    """What a chart or table says when some of its GET figures ran without checking page contents."""
    get = rows[(rows["metric"] == "get_throughput") & (rows["status"] == "ok")]
    n = sum(1 for _, r in get.iterrows() if row_extra(r).get("verified") is False)
    if not n:
        return None
    # another engine's rows say why they are unverified ("verification"): the tool checks nothing
    others = sum(1 for _, r in get.iterrows() if row_extra(r).get("verified") is False
                 and row_extra(r).get("verification"))
    why = "; ".join(w for w, k in (("drive --no-verify", n - others),
                                  ("other engines, which never check the bytes they read", others)) if k)
    return f"unverified: {n} of {len(get)} GET figure(s) ran without checking page contents ({why})"


def judge(rows: pd.DataFrame, runs: pd.DataFrame, refs: dict[str, TestbedRefs], testbed: str) -> pd.DataFrame:
    """Rows with their verdict (references) and what limited them (attribution rules), for every view."""
    rows = apply_verdicts(rows, refs)
    tb = refs.get(testbed)
    raw_of = limits_by_scenario(rows)
    rows = attribution.attribute(rows, runs, raw_of, line_rate_of=(lambda r: line_capacity_bps(r, tb)) if tb
                                 else (lambda r: None))
    # "above raw" only where every run of a point is: else within the spread
    rows = attribution.within_spread(rows, raw_of)
    # A value above the line rate is a measurement error first: that verdict stays.
    above = (rows["limit"] == "above_raw") & (rows["verdict"] != "above_line_rate")
    rows.loc[above, "verdict"] = "above_raw"
    rows.loc[above, "verdict_reason"] = rows.loc[above, "limited_by"]
    return rows


def _stamp(fig, title: str, meta: list[str]) -> None:
    """Title on top, the caption and host + meta block under the plot, wrapped to the image's width."""
    w, h = fig.get_size_inches()
    # parse_math off: the title and the meta block carry hosts' text (CPU model, NIC firmware), shown as
    # written; with it on, matplotlib would typeset a "$1$" in one as math
    fig.suptitle("\n".join(textwrap.wrap(_drawable(title), int(w * 72 / (11 * 0.6)))), fontsize=11,
                 parse_math=False)
    # monospace 6.5 pt: a character is 0.6 of the size wide; keep 4 % of the width as margin
    width = int(0.96 * w * 72 / (6.5 * 0.6))
    lines = [part for l in meta for part in textwrap.wrap(_drawable(l), width, subsequent_indent="  ")]
    extra = 0.115 * len(lines) + 0.25
    fig.set_size_inches(w, h + extra)
    fig.tight_layout(rect=(0, extra / (h + extra), 1, 0.95))
    fig.text(0.01, 0.01, "\n".join(lines), fontsize=6.5, family="monospace", va="bottom", ha="left",
             parse_math=False)


def _drawable(line: str) -> str:
    # The default fonts have no CJK glyphs; the published titles are Chinese.
    # The image keeps the ASCII part; the .md beside it keeps the full text.
    out = "".join(c if ord(c) < 0x2E80 else " " for c in line)
    return " ".join(out.split())


def _extra_notes(rows: pd.DataFrame) -> list[str]:
    """Notes the data itself carries (published remarks, inferred values), once each."""
    notes: dict[str, None] = {}
    for _, r in rows.iterrows():
        ex = row_extra(r)
        for key, prefix in (("note", "data note"), ("split_inferred", "inferred")):
            if ex.get(key):
                notes[f"{prefix} ({r['metric']}): {ex[key]}"] = None
    return list(notes)


def build_scenario(scenario: str, rows: pd.DataFrame, runs: pd.DataFrame,
                   refs: TestbedRefs | None) -> list[Chart | NotDrawn]:
    """The charts of one scenario from that scenario's rows (its module's builders, :mod:`.scenarios`), each with
    the caption (what limited it, unverified GETs) and the notes the data carries."""
    out: list[Chart | NotDrawn] = []
    for name, builder in report_of(scenario).figures.items():
        if rows.empty:
            out.append(NotDrawn(name, f"no rows for scenario {scenario}"))
            continue
        chart = builder(rows, runs, refs)
        if isinstance(chart, Chart):
            chart.notes += _extra_notes(rows)
            limits = limit_summary([t["limited by"] for t in chart.table
                                    if t.get("limited by") not in (None, "", "—")])
            caption = []
            if limits:
                # the caption (in the image, above the meta block, and in the .md) says what limited the figures
                caption.append("limited by: " + "; ".join(limits))
            unverified = unverified_note(rows)
            if unverified:
                caption.append(unverified)
            chart.caption = " · ".join(caption)
        out.append(chart)
    return out


def limit_summary(limits: list[str]) -> list[str]:
    """What limited a figure's points, once per cause (the text before a limit's first colon): a cause
    several points share with different figures is given once, with its count and the first point's figure
    (the table row of each point has its own)."""
    causes: dict[str, list[str]] = {}
    for text in limits:
        causes.setdefault(text.split(":", 1)[0] if ":" in text else text, []).append(text)
    return [texts[0] if len(set(texts)) == 1 else
            f"{cause} ({len(texts)} points; e.g. {texts[0].split(':', 1)[1].strip()})"
            for cause, texts in causes.items()]


def build_charts(rows: pd.DataFrame, runs: pd.DataFrame, refs: TestbedRefs | None) -> list[Chart | NotDrawn]:
    """Every chart of one testbed (rows should already carry verdicts)."""
    out: list[Chart | NotDrawn] = []
    for scenario in SCENARIOS:
        out += build_scenario(scenario, rows[rows["scenario"] == scenario], runs, refs)
    return out


def finish(chart: Chart, testbed: str) -> Any:
    """Stamp a drawn chart for saving: title, caption and host + meta block, all inside the canvas."""
    _stamp(chart.fig, f"{testbed} · {chart.title}", ([chart.caption] if chart.caption else []) + chart.meta)
    return chart.fig


def chart_markdown(testbed: str, chart: Chart, formats: Iterable[str]) -> str:
    """The Markdown file written beside a chart: image, table, notes, meta block."""
    img = "png" if "png" in formats else next(iter(formats))
    # the names, caption, notes and meta lines carry hosts' and tools' text (NIC firmware, reasons): escaped
    parts = [markup.md("# {} · {}\n", testbed, chart.title),
             markup.md("![{}](", chart.name) + f"{chart.name}.{img})\n",
             *([markup.md("*{}*\n", chart.caption)] if chart.caption else []), markdown_table(chart.table)]
    if chart.notes:
        parts.append("\n".join(markup.md("- note: {}", n) for n in chart.notes) + "\n")
    parts.append("\nHost + meta block:\n\n" + "\n".join(markup.md("- {}", l) for l in chart.meta) + "\n")
    return "\n".join(parts)


def _shown_path(path) -> str:
    """``path`` relative to the checkout when it lies inside it (committed files must not name a machine)."""
    root = Path(__file__).resolve().parents[3]
    try:
        return str(Path(path).resolve().relative_to(root))
    except ValueError:
        return str(path)


def _clean(dir_: Path) -> None:
    """Remove what an earlier run wrote here (only chart files), so output is from scratch."""
    if not dir_.is_dir():
        return
    for p in dir_.iterdir():
        if p.is_file() and p.suffix in _OWNED_SUFFIXES:
            p.unlink()


def make_charts(testbeds: dict[str, Path], out_dir, formats: Iterable[str] = FORMATS,
                refs: dict[str, TestbedRefs] | None = None,
                log: Callable[[str], None] = print) -> dict[str, list[Path]]:
    """Write every chart of each testbed under ``out_dir/<testbed>/``; returns files per testbed."""
    formats = tuple(formats)
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise ValueError(f"unsupported format(s) {bad or formats}; use a comma list of {', '.join(FORMATS)}")
    refs = refs or {}
    written: dict[str, list[Path]] = {}
    for i, (name, path) in enumerate(sorted(testbeds.items()), start=1):
        log(f"[{i}/{len(testbeds)}] {name}: reading {path}")
        try:
            rows, runs = collect.load_tidy(path)
        except (ValueError, KeyError) as e:
            raise ValueError(f"testbed {name}: cannot read {path}: {e}") from e
        tb_refs = refs.get(name)
        rows = judge(rows, runs, refs, name)
        dest = Path(out_dir) / name
        _clean(dest)
        files: list[Path] = []
        index = [markup.md("# {}: charts\n", name),
                 markup.md("Regenerated from {} by make_charts.py.\n", markup.md_code(_shown_path(path)))]
        for chart in build_charts(rows, runs, tb_refs):
            if isinstance(chart, NotDrawn):
                log(f"  {chart.name}: not drawn: {chart.reason}")
                index.append(markup.md("- {}: not drawn: {}", chart.name, chart.reason))    # a reason may be a tool's
                continue
            index.append(markup.md("- [{}](", chart.title) + f"{chart.name}.md)")
            dest.mkdir(parents=True, exist_ok=True)
            finish(chart, name)
            for fmt in formats:
                p = dest / f"{chart.name}.{fmt}"
                # Fixed metadata keeps files byte-stable across runs (no timestamps).
                md = {"Date": None} if fmt == "svg" else {"Software": None}
                with atomic.replacing(p) as tmp:
                    chart.fig.savefig(tmp, format=fmt, dpi=110, metadata=md)
                files.append(p)
            plt.close(chart.fig)
            md_path = dest / f"{chart.name}.md"
            atomic.write_text(md_path, chart_markdown(name, chart, formats))
            files.append(md_path)
            log(f"  {chart.name}: wrote " + ", ".join(p.name for p in files if p.stem == chart.name))
        # The index is written even when nothing could be drawn: it says why.
        dest.mkdir(parents=True, exist_ok=True)
        atomic.write_text(dest / "index.md", "\n".join(index) + "\n")
        files.append(dest / "index.md")
        written[name] = files
    return written
