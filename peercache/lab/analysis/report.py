"""The per-testbed report: overview table, one section per scenario, verdicts.

``notebooks/report.ipynb`` only calls :func:`build_report` and
:func:`display_report`; :func:`report_markdown` renders the same content as
text (used by tests and for a plain-text copy).
"""
from __future__ import annotations

import json

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from peercache.lab.analysis import charts, collect
from peercache.lab.analysis.references import convert, load_references, row_extra
from peercache.lab.pipeline import experiments

#: Columns of a scenario's table in the report.
SECTION_COLUMNS = ["run_id", "metric", "side", "devices", "size_bytes", "batch", "qps", "threads",
                   "processes", "value", "unit", "status", "reason", "verdict", "verdict_reason", "limited_by"]


def repo_root() -> Path:
    """The checkout this package is installed from (editable install)."""
    return Path(__file__).resolve().parents[3]


def resolve(path: str | Path | None) -> Path | None:
    """``path`` as given when absolute, else relative to the repository root."""
    if path is None or str(path) == "":
        return None
    p = Path(path)
    return p if p.is_absolute() else repo_root() / p


@dataclass
class Section:
    """One scenario of the report."""

    scenario: str
    table: pd.DataFrame
    figures: list[Path]
    meta: list[str]
    notes: list[str] = field(default_factory=list)


@dataclass
class Report:
    """Everything the report notebook shows for one testbed."""

    testbed: str
    overview: pd.DataFrame
    sections: list[Section]
    verdict_counts: dict[str, int]
    notes: list[str] = field(default_factory=list)


#: Scenarios whose figures are PeerCache GETs (their kinds say so; see pipeline/kinds.py).
_GET_SCENARIOS = experiments.get_scenarios()


def _gbs(r: pd.Series) -> float | None:
    try:
        return convert(float(r["value"]), str(r["unit"]), "GB/s")
    except ValueError:
        return None


def overview_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Scenario, GET throughput, fraction of the raw single-NIC figure, notes."""
    ok = rows[(rows["status"] == "ok") & rows["value"].notna()]
    bw = ok[ok["metric"].isin(charts.BW_METRICS)]
    limits = charts.raw_limits(bw)
    out: list[dict[str, Any]] = []

    def add(scenario, label, r, note=""):
        g = _gbs(r)
        # Only PeerCache GET scenarios compare with the raw single-NIC READ figure.
        is_raw = r["tool"] in charts.RAW_TOOLS
        comparable = scenario in _GET_SCENARIOS and not is_raw
        raw = charts.raw_for(r, limits)
        raw_gbs = raw[0] if raw else None
        # A figure over n NICs is compared with n single-NIC limits (never a bare percentage above 100).
        n = int(row_extra(r).get("groups") or 0) or max(1, len(collect_devices(r)))
        frac = "—" if not raw_gbs or g is None or not comparable else (
            f"{100.0 * g / raw_gbs:.0f}%" if n == 1 else f"{100.0 * g / (n * raw_gbs):.0f}% of {n} x raw")
        if comparable and raw_gbs and g is not None and g > n * raw_gbs:
            frac = "above raw"      # never a bare percentage above its limit: the "raw" figure did not bound it
        if is_raw and scenario == "single_nic":
            frac = "raw limit (100%)"
        elif not comparable:
            note = "; ".join(n for n in (note, f"{r['tool']} {r['metric']}, not a GET") if n)
        notes = [n for n in (note, row_extra(r).get("note")) if n]
        if r["metric"] == "get_throughput" and row_extra(r).get("verified") is False:
            notes.append("unverified: page contents not checked (drive --no-verify)")
        if r.get("verdict") not in (None, "ok", "unchecked"):
            notes.append(f"verdict {r['verdict']}")
        out.append({"scenario": f"{scenario}: {label}",
                    # one unit for the whole column; the tables keep the value as measured
                    "GET throughput": f"{charts.fmt_number(r['value'])} {r['unit']}"
                    if g is None else f"{charts.fmt_number(g)} GB/s",
                    "fraction of raw single-NIC": frac, "limited by": r.get("limited_by") or "—",
                    "notes": "; ".join(notes)})

    scenarios = list(dict.fromkeys(list(charts.SCENARIOS) + list(rows["scenario"])))
    for sc in scenarios:
        s_all = rows[rows["scenario"] == sc]
        if s_all.empty:
            continue
        s = bw[bw["scenario"] == sc]
        if s.empty:
            reasons = sorted({f"{st}: {rs}" for st, rs in zip(s_all["status"], s_all["reason"].fillna(""))
                              if st != "ok"})
            out.append({"scenario": sc, "GET throughput": "—", "fraction of raw single-NIC": "—",
                        "limited by": "—", "notes": "; ".join(reasons) or "no bandwidth metric in this scenario"})
            continue
        if sc == "single_nic":
            for _, r in s.iterrows():
                add(sc, f"{r['tool']} {charts._label(r, ['protocol', 'size_bytes', 'qps', 'threads', 'processes'])}", r)
        elif sc == "whole_machine":
            for _, r in s[s["side"] == "aggregate"].iterrows():
                per = s[s["side"] == "per_device"]
                note = ""
                if not per.empty:
                    lo, hi = per["value"].min(), per["value"].max()
                    note = f"per NIC {charts.fmt_number(lo)}–{charts.fmt_number(hi)} {per['unit'].iloc[0]}"
                add(sc, f"aggregate over {len(collect_devices(r))} NICs", r, note)
        elif sc == "gpudirect":
            for _, r in s.iterrows():
                add(sc, f"destination {row_extra(r).get('destination', '?')}", r)
        else:
            # Headline = the best point of the scenario; the section has them all.
            r = s.loc[s.apply(_gbs, axis=1).idxmax()]
            add(sc, "best point " + charts._label(r, ["size_bytes", "batch", "qps", "threads", "processes"]), r)
    return pd.DataFrame(out, columns=["scenario", "GET throughput", "fraction of raw single-NIC", "limited by",
                                      "notes"])


def guest_caveats(runs: pd.DataFrame) -> list[str]:
    """The caveat of runs measured in the Soft-RoCE guest (said first in the report), once each."""
    seen: dict[str, dict[str, set]] = {}
    for text in runs.get("params", pd.Series(dtype=object)).dropna():
        params = json.loads(text) if isinstance(text, str) else text
        g = (params or {}).get("guest")
        if g and g.get("caveat"):
            d = seen.setdefault(g["caveat"], {"kernel": set(), "slowness": set()})
            d["kernel"].add(str(g.get("kernel")))
            if g.get("slowness") is not None:
                d["slowness"].add(float(g["slowness"]))
    out = []
    for caveat, d in seen.items():
        slow = sorted(d["slowness"])
        how = (f", {slow[0]:.0f}-{slow[-1]:.0f} x slower than the host" if len(slow) > 1 and
               round(slow[0]) != round(slow[-1]) else (f", {slow[0]:.0f} x slower than the host" if slow else ""))
        out.append(f"**{caveat}** (guest kernel {', '.join(sorted(d['kernel']))}{how})")
    return out


def numa_flags(runs: pd.DataFrame, run_ids) -> list[str]:
    """The NUMA flags of the runs ``run_ids`` (notes saying ``flagged numa_...``: a binding that did not
    take effect, or a process on another node than its NIC's), one line per flag."""
    ids = set(run_ids)
    out = []
    for run in runs.to_dict("records"):
        if run.get("run_id") not in ids:
            continue
        for note in (collect.run_field(run, "params") or {}).get("notes") or []:
            if "flagged numa_" in str(note):
                out.append(f"{run['run_id']}: {note}")
    return out


def collect_devices(r: pd.Series) -> list[str]:
    """Device names of a row."""
    return [d for d in str(r.get("devices") or "").split(",") if d]


def build_report(tidy_dir, figures_dir, testbed: str, references=None,
                 make_missing_figures: bool = True) -> Report:
    """Load one testbed, apply verdicts, and assemble the overview and sections."""
    tidy_dir, figures_dir = resolve(tidy_dir), resolve(figures_dir)
    path = tidy_dir / testbed
    rows, runs = collect.load_tidy(path)
    refs = load_references(resolve(references)) if references else {}
    rows = charts.judge(rows, runs, refs, testbed)
    notes = guest_caveats(runs)
    if testbed not in refs:
        notes.append("no references for this testbed: every verdict is 'unchecked' and line rates are unknown"
                     if references else "no references file given: every verdict is 'unchecked'")
    fig_dir = figures_dir / testbed
    if make_missing_figures and not any(fig_dir.glob("*.png")):
        notes.append(f"figures were missing under {fig_dir}; drawn now from {path}")
        charts.make_charts({testbed: path}, figures_dir, ("png",), refs, log=lambda m: None)
    sections = []
    for sc in dict.fromkeys(list(charts.SCENARIOS) + sorted(set(rows["scenario"]))):
        sub = rows[rows["scenario"] == sc]
        if sub.empty:
            continue
        built = charts.build_scenario(sc, sub, runs, refs.get(testbed))
        figs = [fig_dir / f"{c.name}.png" for c in built if isinstance(c, charts.Chart)]
        sec_notes = [f"{c.name}: not drawn: {c.reason}" for c in built if isinstance(c, charts.NotDrawn)]
        for c in built:
            if isinstance(c, charts.Chart):
                sec_notes += c.notes
                charts.plt.close(c.fig)
        sec_notes += numa_flags(runs, dict.fromkeys(sub["run_id"]))
        missing = [f for f in figs if not f.exists()]
        if missing:
            sec_notes.append("figure(s) not found: " + ", ".join(str(m) for m in missing)
                             + "; run `python make_charts.py --testbed " + testbed + "`")
        table = sub[SECTION_COLUMNS].reset_index(drop=True)
        # One unit per dimension, 4 significant figures (fmt_number); the tidy data keeps the exact value.
        shown = [charts.display(v, u) for v, u in zip(table["value"], table["unit"])]
        table["value"] = [v for v, _ in shown]
        table["unit"] = [u for _, u in shown]
        table["size_bytes"] = [charts.fmt_size(n) for n in table["size_bytes"]]
        sections.append(Section(sc, table, [f for f in figs if f.exists()],
                                charts.meta_block(sub, runs), sec_notes))
    counts = rows["verdict"].value_counts().to_dict()
    return Report(testbed, overview_table(rows), sections, {k: int(v) for k, v in counts.items()}, notes)


def _table_records(df: pd.DataFrame) -> list[dict[str, Any]]:
    recs = []
    for rec in df.to_dict("records"):
        recs.append({k: ("" if v is None or v is pd.NA or (isinstance(v, float) and v != v) else v)
                     for k, v in rec.items()})
    return recs


def report_markdown(rep: Report) -> str:
    """The report as Markdown text (same content the notebook displays)."""
    parts = [f"# Report: {rep.testbed}\n"]
    parts += [f"- note: {n}" for n in rep.notes]
    parts.append("\n## Overview\n")
    parts.append(charts.markdown_table(_table_records(rep.overview)))
    parts.append("Verdicts: " + ", ".join(f"{k} {v}" for k, v in sorted(rep.verdict_counts.items())) + "\n")
    for sec in rep.sections:
        parts.append(f"\n## {sec.scenario}\n")
        for f in sec.figures:
            parts.append(f"![{f.stem}]({f})\n")
        parts.append(charts.markdown_table(_table_records(sec.table)))
        parts += [f"- note: {n}" for n in sec.notes]
        parts.append("\nHost + meta block:\n\n" + "\n".join(f"- {l}" for l in sec.meta) + "\n")
    return "\n".join(parts)


def display_report(rep: Report) -> None:
    """Show the report in a notebook: Markdown tables and embedded PNG figures."""
    from IPython.display import Image, Markdown, display

    head = [f"# Report: {rep.testbed}"] + [f"- note: {n}" for n in rep.notes]
    display(Markdown("\n".join(head)))
    display(Markdown("## Overview\n\n" + charts.markdown_table(_table_records(rep.overview))
                     + "\nVerdicts: " + ", ".join(f"{k} {v}" for k, v in sorted(rep.verdict_counts.items()))))
    for sec in rep.sections:
        display(Markdown(f"## {sec.scenario}"))
        for f in sec.figures:
            display(Image(filename=str(f)))
        display(Markdown(charts.markdown_table(_table_records(sec.table))
                         + "".join(f"\n- note: {n}" for n in sec.notes)
                         + "\n\n**Host + meta block**\n\n" + "\n".join(f"- {l}" for l in sec.meta)))
