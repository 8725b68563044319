"""The per-testbed report: the published baseline document's shape, regenerated from one run's data.

Overview (scenario, GET throughput in GB/s and Gb/s, % of the single-NIC raw
limit, what limited it, notes), the test environment from the hostinfo
capture, one compact section per scenario with its figure and host + meta
block, key conclusions generated from the rows (each citing the runs it rests
on; one the data cannot support is not printed), and the tidy table as an
appendix and a CSV. :func:`build_report` assembles it; :func:`write_report`
writes ``report.md`` (relative image links) and ``report.html`` (the same
document, figures embedded) and the CSV; ``notebooks/report.ipynb`` calls both.
"""
from __future__ import annotations

import base64
import html as html_lib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pandas as pd

from peercache import atomic
from peercache.lab.analysis import charts, collect, environment
from peercache.lab.analysis.format import display, fmt_number, fmt_size, markdown_table, short_run
from peercache.lab.analysis.markup import markdown_html, md, md_code, md_code_block, md_text
from peercache.lab.analysis.metablock import compact_meta, meta_block
from peercache.lab.analysis.rawlimit import BW_METRICS, raw_limits
from peercache.lab.analysis.references import load_references
from peercache.lab.analysis.scenarios import report_of
from peercache.lab.analysis.scenarios.declare import OVERVIEW_COLUMNS, Chart, Conclusion, NotDrawn, Table
from peercache.lab.analysis.scenarios.draw import plt
from peercache.lab.pipeline import experiments

#: Columns of a scenario's full table (the appendix and the CSV keep every row).
SECTION_COLUMNS = ["run_id", "metric", "side", "devices", "size_bytes", "batch", "qps", "threads",
                   "processes", "value", "unit", "status", "reason", "verdict", "verdict_reason", "limited_by"]
#: The file names written beside each other under reports/<testbed>/.
REPORT_MD, REPORT_HTML, ROWS_CSV = "report.md", "report.html", "report-rows.csv"


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
    table: pd.DataFrame                         #: every row of the scenario (appendix, CSV)
    figures: list[Path]
    meta: list[str]                             #: the full host + meta block, one line per run
    notes: list[str] = field(default_factory=list)
    description: str = ""
    tables: list[Table] = field(default_factory=list)    #: (caption, compact records)
    captions: list[str] = field(default_factory=list)     #: what limited the figure's values, unverified...
    compact_meta: list[str] = field(default_factory=list)


@dataclass
class Report:
    """Everything the report shows for one testbed."""

    testbed: str
    overview: pd.DataFrame
    sections: list[Section]
    verdict_counts: dict[str, int]
    notes: list[str] = field(default_factory=list)        #: said at the top (emulation caveats first)
    environment: list[environment.Field] = field(default_factory=list)
    env_commands: list[str] = field(default_factory=list)
    env_commands_why: str = ""                              #: why env_commands is empty, where it is
    conclusions: list[Conclusion] = field(default_factory=list)
    rows: pd.DataFrame | None = None                       #: the judged tidy rows
    title: str = ""


def overview_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Scenario, GET throughput (GB/s and Gb/s), % of the single-NIC raw limit, limited by, notes, run: each
    scenario's rows of it from its report (:mod:`.scenarios`), in the scenario file's order."""
    ok = rows[(rows["status"] == "ok") & rows["value"].notna()]
    bw = ok[ok["metric"].isin(BW_METRICS)]
    limits = raw_limits(bw)
    out: list[dict[str, Any]] = []
    for sc in dict.fromkeys(list(charts.SCENARIOS) + list(rows["scenario"])):
        sub = rows[rows["scenario"] == sc]
        if not sub.empty:
            out += report_of(sc).overview(sc, sub, rows, bw, limits)
    return pd.DataFrame(out, columns=OVERVIEW_COLUMNS)


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
        out.append(md("**{}** (guest kernel {}{})", caveat, ", ".join(sorted(d["kernel"])), how))
    return out


def failed_points(sub: pd.DataFrame) -> list[str]:
    """One note per failed run of a section and its reason ("<run>: failed: <reason>"), in run order: a
    point that failed is left out of the section's tables and figures, never silently."""
    f = sub[sub["status"] == "failed"]
    reasons = f["reason"].fillna("no reason recorded") if "reason" in f else ["no reason recorded"] * len(f)
    return [f"{short_run(r)}: failed: {why}" for r, why in dict.fromkeys(zip(f["run_id"], reasons))]


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


# --- each scenario's tables and conclusions, from its report ---------------------------

def compact_tables(scenario: str, sub: pd.DataFrame, limits) -> list[Table]:
    """A scenario's compact table(s), as the published document has them (its report's, :mod:`.scenarios`)."""
    return report_of(scenario).tables(sub, limits)


def conclusions(rows: pd.DataFrame) -> list[Conclusion]:
    """Key conclusions the rows support, each with the runs it rests on; nothing where the data is silent
    (each scenario's report's, in the scenario file's order)."""
    ok = rows[(rows["status"] == "ok") & rows["value"].notna()]
    limits = raw_limits(ok[ok["metric"].isin(BW_METRICS)])
    out: list[Conclusion] = []
    for sc in dict.fromkeys(list(charts.SCENARIOS) + sorted(set(rows["scenario"]))):
        out += report_of(sc).conclusions(rows[rows["scenario"] == sc], limits)
    return out


# --- assembling -----------------------------------------------------------------------

def build_report(tidy_dir, figures_dir, testbed: str, references=None,
                 make_missing_figures: bool = True, captures_dir=None) -> Report:
    """Load one testbed, apply verdicts, and assemble the document (captures: data/raw/<tb>/testbed)."""
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
    descriptions = {k: v.get("description", "") for k, v in experiments.load_scenarios().items()}
    limits = raw_limits(rows[(rows["status"] == "ok") & rows["value"].notna()])
    sections = []
    for sc in dict.fromkeys(list(charts.SCENARIOS) + sorted(set(rows["scenario"]))):
        sub = rows[rows["scenario"] == sc]
        if sub.empty:
            continue
        built = charts.build_scenario(sc, sub, runs, refs.get(testbed))
        figs = [fig_dir / f"{c.name}.png" for c in built if isinstance(c, Chart)]
        sec_notes = [f"{c.name}: not drawn: {c.reason}" for c in built if isinstance(c, NotDrawn)]
        captions = []
        for c in built:
            if isinstance(c, Chart):
                sec_notes += c.notes
                if c.caption:
                    captions.append(c.caption)
                plt.close(c.fig)
        if figs:      # some points drew: each failed one is named (all failed: the not-drawn note says why)
            sec_notes += failed_points(sub)
        sec_notes += numa_flags(runs, dict.fromkeys(sub["run_id"]))
        missing = [f for f in figs if not f.exists()]
        if missing:
            sec_notes.append(md("figure(s) not found: {}; run {}", ", ".join(str(m) for m in missing),
                                md_code(f"python make_charts.py --testbed {testbed}")))
        table = sub[SECTION_COLUMNS].reset_index(drop=True)
        # One unit per dimension, 4 significant figures (fmt_number); the tidy data keeps the exact value.
        shown = [display(v, u) for v, u in zip(table["value"], table["unit"])]
        table["value"] = [v for v, _ in shown]
        table["unit"] = [u for _, u in shown]
        table["size_bytes"] = [fmt_size(n) for n in table["size_bytes"]]
        sections.append(Section(sc, table, [f for f in figs if f.exists()], meta_block(sub, runs),
                                list(dict.fromkeys(sec_notes)), descriptions.get(sc, ""),
                                compact_tables(sc, sub, limits), captions, compact_meta(sub, runs)))
    cap_dir = resolve(captures_dir) if captures_dir else None
    caps, why = environment.load_captures(cap_dir)
    counts = rows["verdict"].value_counts().to_dict()
    return Report(testbed, overview_table(rows), sections, {k: int(v) for k, v in counts.items()}, notes,
                  environment.environment_fields(caps, runs, why, environment.cluster_members(cap_dir)),
                  environment.capture_commands(caps),
                  environment.why_no_commands(caps, cap_dir), conclusions(rows), rows,
                  f"PeerCache performance baseline: {testbed}")


# --- rendering: one Markdown document, the HTML made from it ---------------------------

def _table_records(df: pd.DataFrame) -> list[dict[str, Any]]:
    recs = []
    for rec in df.to_dict("records"):
        recs.append({k: ("" if v is None or v is pd.NA or (isinstance(v, float) and v != v) else v)
                     for k, v in rec.items()})
    return recs


def _rel(target: Path, out_dir: Path | None) -> str:
    if out_dir is None:
        return str(target)
    return os.path.relpath(Path(target).resolve(), Path(out_dir).resolve()).replace(os.sep, "/")


#: The columns of the appendix's tidy table (the CSV keeps every column).
APPENDIX_COLUMNS = ["run_id", "metric", "side", "size_bytes", "batch", "qps", "threads", "processes", "value",
                    "unit", "status", "verdict", "limited_by"]


def appendix_rows(rep: Report) -> tuple[pd.DataFrame, dict[str, int], pd.DataFrame]:
    """(every row, shown compactly; unchecked rows counted by reason; rows with a verdict other than unchecked)."""
    rows = rep.rows if rep.rows is not None else pd.DataFrame(columns=SECTION_COLUMNS + ["scenario"])
    unchecked = rows[rows["verdict"].fillna("unchecked") == "unchecked"]
    by_reason = {str(k or "no reason given"): int(v) for k, v in
                 unchecked["verdict_reason"].fillna("").value_counts().items()}
    judged = rows[rows["verdict"].fillna("unchecked") != "unchecked"]
    full = rows[["scenario"] + APPENDIX_COLUMNS].copy()
    shown = [display(v, u) for v, u in zip(full["value"], full["unit"])]
    full["value"] = [fmt_number(v) for v, _ in shown]
    full["unit"] = [u for _, u in shown]
    full["size_bytes"] = [fmt_size(n) for n in full["size_bytes"]]
    full["verdict"] = [v if v and v != "unchecked" else "" for v in full["verdict"]]
    return full, by_reason, judged


def report_markdown(rep: Report, out_dir=None, baseline: Report | None = None, links: list[str] = ()) -> str:
    """The report as Markdown; image links relative to ``out_dir`` (where report.md is written).

    Every value is text (markup.md_text): hosts' captures, tools' reasons and run names show as written,
    never as Markdown or HTML. ``links`` are lines of :class:`markup.Markdown` (explore.explore_link); a
    plain str among them is shown as text.
    """
    table = markdown_table
    parts = [md("# {}\n", rep.title or rep.testbed)]
    parts += [md("> **Note:** {}\n", n) for n in rep.notes]
    parts.append("## Overview\n")
    parts.append(table(_table_records(rep.overview)))
    parts.append("## Test environment\n")
    parts.append(table([{"item": f.name, "value": f.value if f.value is not None else f"null: {f.reason}"}
                        for f in rep.environment]))
    if rep.env_commands:
        parts.append("Commands and files that captured it (each host):\n\n" + md_code_block(rep.env_commands))
    else:
        parts.append(md("_No commands listed: {}._\n", rep.env_commands_why or "the capture recorded none"))
    for i, sec in enumerate(rep.sections, start=1):
        parts.append(md("## {} · {}\n", i, sec.scenario.replace("_", " ")))
        if sec.description:
            parts.append(md("_{}_\n", sec.description))
        for caption, recs in sec.tables:
            if caption:
                parts.append(md("**{}**\n", caption))
            parts.append(table(recs))
        for f in sec.figures:
            # the link is percent-encoded: a folder with a space or a ")" still links (and embeds)
            parts.append(md("![{}: {}](", sec.scenario, f.stem) + quote(_rel(f, out_dir), safe="/") + ")\n")
        for c in sec.captions:
            parts.append(md("*{}*\n", c))
        if sec.notes:
            parts.append("\n".join(md("- {}", n) for n in sec.notes) + "\n")
        parts.append("Host + meta: " + " · ".join(md_text(l) for l in sec.compact_meta) + "\n")
        parts.append("<details><summary>every run of this section</summary>\n\n"
                     + "\n".join(md("- {}", l) for l in sec.meta) + "\n\n</details>\n")
    parts.append("## Key conclusions\n")
    if rep.conclusions:
        parts.append("\n".join(md("- {} (runs: {})", c.text, ", ".join(dict.fromkeys(c.runs)))
                               for c in rep.conclusions) + "\n")
    else:
        parts.append("_The data supports no conclusion here (see each section's notes)._\n")
    if baseline is not None:
        parts.append(md("## Beside the published baseline: {}\n", baseline.testbed))
        parts.append(table(_table_records(baseline.overview)))
    full, by_reason, judged = appendix_rows(rep)
    parts.append("## Appendix: the tidy table\n")
    parts.append(f"Every row of this run is in [{ROWS_CSV}]({ROWS_CSV}) (CSV, every column). Verdicts: "
                 + ", ".join(md("{} {}", k, v) for k, v in sorted(rep.verdict_counts.items())) + ".\n")
    if by_reason:
        parts.append("Unchecked rows (not listed one by one), by reason: "
                     + "; ".join(md("{} × {}", n, why) for why, n in by_reason.items()) + ".\n")
    if not judged.empty:
        parts.append("Rows with a verdict:\n")
        parts.append(table([{"run": r["run_id"], "metric": r["metric"], "value": f"{fmt_number(r['value'])} "
                             f"{r['unit']}", "verdict": r["verdict"], "why": r.get("verdict_reason") or ""}
                            for _, r in judged.iterrows()]))
    parts.append(f"<details><summary>all {len(full)} rows</summary>\n\n" + table(_table_records(full))
                 + "\n</details>\n")
    parts += [md_text(l) + "\n" for l in links]
    return "\n".join(parts)


_CSS = """
body{margin:0;font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1b1b1b;background:#fff}
main{max-width:76rem;margin:0 auto;padding:1rem 1.25rem 3rem;box-sizing:border-box}
h1{font-size:1.6rem;margin:.4rem 0 .8rem}h2{font-size:1.25rem;margin:1.8rem 0 .6rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;width:100%;margin:.4rem 0 .9rem;font-size:.8rem;line-height:1.35;table-layout:auto}
th,td{border:1px solid #d0d0d0;padding:.2rem .4rem;text-align:left;vertical-align:top;overflow-wrap:break-word}
th{background:#f3f5f7}tr:nth-child(even) td{background:#fafafa}
img{max-width:100%;height:auto;display:block;margin:.5rem 0}
pre{background:#f6f8fa;padding:.6rem;overflow-x:auto;font-size:.78rem;white-space:pre-wrap;overflow-wrap:anywhere}
code{font-size:.85em;overflow-wrap:anywhere}
blockquote{margin:.5rem 0;padding:.4rem .8rem;background:#fff6e0;border-left:4px solid #e0a400}
blockquote p{margin:0}
details{margin:.4rem 0}summary{cursor:pointer;color:#355}
.scroll{overflow-x:auto;max-width:100%}
p,li{overflow-wrap:anywhere}
"""


def report_figures(rep: Report) -> list[Path]:
    """The figure files the report links (its sections'): the only files its HTML may embed."""
    return [f for sec in rep.sections for f in sec.figures]


def render_html(markdown_text: str, out_dir, title: str, figures=()) -> str:
    """The Markdown document as one self-contained HTML page (tables wrapped), raw HTML in it escaped.

    Only ``figures`` (:func:`report_figures`) are embedded: an image link to any other file stays a link,
    so a document can never pull in a local file it was not meant to show.
    """
    body = markdown_html(markdown_text)
    own = {Path(f).resolve() for f in figures}

    def embed(m):
        src = unquote(html_lib.unescape(m.group(2)))
        p = (Path(out_dir) / src) if out_dir is not None and not Path(src).is_absolute() else Path(src)
        if p.resolve() not in own or not p.exists():
            return m.group(0)
        return f'{m.group(1)}"data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}"'

    # run ids (a/b/c/rep0) in table cells may break after their / and _ , and nowhere else: numbers keep
    # their units
    run_id = re.compile(r"(?<![\w/])[\w.-]+(?:/[\w.-]+){2,}")
    body = re.sub(r"<td>(.*?)</td>", lambda c: "<td>" + run_id.sub(
        lambda m: re.sub(r"([/_])", r"\1<wbr>", m.group(0)), c.group(1)) + "</td>", body, flags=re.S)
    # the appendix's wide table scrolls inside its own box; the main column never overflows
    body = re.sub(r"(<summary>all [^<]*</summary>\s*)(<table>.*?</table>)", r'\1<div class="scroll">\2</div>',
                  body, flags=re.S)
    body = re.sub(r'(<img[^>]*?src=)"([^"]+)"', embed, body)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{html_lib.escape(title)}</title><style>{_CSS}</style></head>\n"
            f"<body><main>\n{body}\n</main></body></html>\n")


def write_report(rep: Report, out_dir, baseline: Report | None = None, links: list[str] = ()) -> dict[str, Path]:
    """Write report.md, report.html and the tidy CSV under ``out_dir``; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md_text = report_markdown(rep, out, baseline, links)
    paths = {"md": out / REPORT_MD, "html": out / REPORT_HTML, "csv": out / ROWS_CSV}
    atomic.write_text(paths["md"], md_text)
    atomic.write_text(paths["html"], render_html(md_text, out, rep.title or rep.testbed, report_figures(rep)))
    rows = rep.rows if rep.rows is not None else pd.DataFrame()
    with atomic.replacing(paths["csv"]) as tmp:
        rows.to_csv(tmp, index=False)
    return paths


def display_report(rep: Report, out_dir=None, baseline: Report | None = None, links: list[str] = ()) -> None:
    """Show the report in a notebook: the same HTML document, figures embedded."""
    from IPython.display import HTML, display  # only to show it in a notebook: building and writing never need IPython

    md_text = report_markdown(rep, out_dir, baseline, links)
    page = render_html(md_text, out_dir, rep.title, report_figures(rep))
    display(HTML(page[page.index("<main>"):page.index("</main>") + len("</main>")]
                 .replace("<main>", f"<div class=\"pc-report\"><style>{_CSS.replace('main{', '.pc-report{')}</style>")
                 .replace("</main>", "</div>")))
