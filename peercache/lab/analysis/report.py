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
from peercache.lab.analysis import charts, collect, engines, environment
from peercache.lab.analysis.format import (display, fmt_number, fmt_size, markdown_table, point_label, short_run,
                                           rate_text, throughput_text)
from peercache.lab.analysis.markup import markdown_html, md, md_code, md_code_block, md_text
from peercache.lab.analysis.metablock import compact_meta, meta_block
from peercache.lab.analysis.rawlimit import RAW_TOOLS, raw_for, raw_limits, why_none
from peercache.lab.analysis.references import convert, load_references, row_extra
from peercache.lab.pipeline import experiments

#: Columns of a scenario's full table (the appendix and the CSV keep every row).
SECTION_COLUMNS = ["run_id", "metric", "side", "devices", "size_bytes", "batch", "qps", "threads",
                   "processes", "value", "unit", "status", "reason", "verdict", "verdict_reason", "limited_by"]
#: The overview's columns, as the published document has them.
OVERVIEW_COLUMNS = ["scenario", "GET throughput", "% of single-NIC raw limit", "limited by", "notes", "run"]
#: A multi-rail series "falls beyond" its peak when its last point is this fraction below the peak.
FALLS_BEYOND = 0.05
#: A message-size sweep has "no sweet spot" when its bandwidth spread (max - min) / max is below this.
NO_SWEET_SPOT = 0.10
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
class Conclusion:
    """One key conclusion and the runs it rests on."""

    text: str
    runs: list[str]


@dataclass
class Section:
    """One scenario of the report."""

    scenario: str
    table: pd.DataFrame                         #: every row of the scenario (appendix, CSV)
    figures: list[Path]
    meta: list[str]                             #: the full host + meta block, one line per run
    notes: list[str] = field(default_factory=list)
    description: str = ""
    tables: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)  #: (caption, compact records)
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


#: Scenarios whose figures are PeerCache GETs (their kinds say so; see pipeline/kinds.py).
_GET_SCENARIOS = experiments.get_scenarios()


def _gbs(r) -> float | None:
    try:
        return convert(float(r["value"]), str(r["unit"]), "GB/s")
    except (TypeError, ValueError):
        return None


def overview_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Scenario, GET throughput (GB/s and Gb/s), % of the single-NIC raw limit, limited by, notes, run."""
    ok = rows[(rows["status"] == "ok") & rows["value"].notna()]
    bw = ok[ok["metric"].isin(charts.BW_METRICS)]
    limits = raw_limits(bw)
    out: list[dict[str, Any]] = []

    def add(scenario, label, r, note=""):
        g = _gbs(r)
        is_raw = r["tool"] in RAW_TOOLS
        comparable = scenario in _GET_SCENARIOS and not is_raw
        notes = [n for n in (note, row_extra(r).get("note")) if n]
        frac = "—"
        if is_raw and scenario == "single_nic":
            frac = "100% (the raw limit)"
        elif comparable and g is not None:
            lim = raw_for(r, limits)
            if lim is None:
                notes.append("no % of raw: " + why_none(r, limits))
            elif lim.gbs:
                pct = 100.0 * g / lim.gbs
                of = "" if lim.label == lim.tool or " x " not in lim.label else f" of {lim.label}"
                frac = f"{pct:.0f}%{of}" + (" (above raw)" if pct > 100 else "")
        elif not comparable:
            notes.append(f"{r['tool']} {r['metric']}, not a GET")
        if r["metric"] == "get_throughput" and row_extra(r).get("verified") is False:
            notes.append("unverified: page contents not checked (drive --no-verify)")
        if r.get("verdict") not in (None, "ok", "unchecked"):
            notes.append(f"verdict {r['verdict']}")
        out.append({"scenario": f"{scenario}: {label}",
                    "GET throughput": throughput_text(g) if g is not None
                    else f"{fmt_number(r['value'])} {r['unit']}",
                    "% of single-NIC raw limit": frac, "limited by": r.get("limited_by") or "—",
                    "notes": "; ".join(notes), "run": short_run(r["run_id"])})

    scenarios = list(dict.fromkeys(list(charts.SCENARIOS) + list(rows["scenario"])))
    from peercache.lab.analysis import hicache_suite
    for sc in scenarios:
        s_all = rows[rows["scenario"] == sc]
        if s_all.empty:
            continue
        suite_peaks = hicache_suite.peaks(s_all)
        if suite_peaks:
            # the HiCache suite: each layout's get PEAK (a GET through batch_get_v1), its set and exists PEAKs beside
            for pk in (p for p in suite_peaks if p["op"] == "get"):
                others = [f"{p['op']} PEAK {rate_text(p['pages/s'])} pages/s"
                          + (f" ({fmt_number(p['GB/s'])} GB/s)" if p["GB/s"] is not None else "")
                          + f" at {p['threads']} thr" for p in suite_peaks if p["run"] == pk["run"] and p["op"] != "get"]
                out.append({"scenario": f"{sc}: {pk['layout']} get PEAK (batch_get_v1, {pk['threads']} thr)",
                            "GET throughput": throughput_text(pk["GB/s"]), "% of single-NIC raw limit": "—",
                            "limited by": pk["limited by"],
                            "notes": "; ".join([f"{rate_text(pk['pages/s'])} pages/s", *others]),
                            "run": short_run(pk["run"])})
            continue
        s = bw[bw["scenario"] == sc]
        if s.empty:
            reasons = sorted({f"{st}: {rs}" for st, rs in zip(s_all["status"], s_all["reason"].fillna(""))
                              if st != "ok"})
            out.append({"scenario": sc, "GET throughput": "—", "% of single-NIC raw limit": "—",
                        "limited by": "—", "notes": "; ".join(reasons) or "no bandwidth metric in this scenario",
                        "run": ", ".join(dict.fromkeys(s_all["run_id"]))})
            continue
        if sc == "single_nic":
            # the raw rows a PeerCache row is compared with (all of them where there is no PeerCache row);
            # the section lists every raw run
            peer = s[~s["tool"].isin(RAW_TOOLS)]
            cited = {run for _, r in peer.iterrows() for run in (getattr(raw_for(r, limits), "runs", ()) or ())}
            for _, r in s.iterrows():
                if r["tool"] in RAW_TOOLS and not peer.empty and r["run_id"] not in cited:
                    continue
                add(sc, charts.measurement(r), r)
        elif sc == "whole_machine":
            for _, r in s[s["side"] == "aggregate"].iterrows():
                per = s[s["side"] == "per_device"]
                note = ""
                if not per.empty:
                    vals = [_gbs(v) for _, v in per.iterrows()]
                    note = f"per NIC {fmt_number(min(vals))}–{fmt_number(max(vals))} GB/s"
                add(sc, f"aggregate over {charts_nics(r)} NICs", r, note)
        elif sc == "gpudirect":
            for _, r in s.iterrows():
                add(sc, f"destination {row_extra(r).get('destination', '?')}", r)
        elif sc == engines.SCENARIO:
            out += engines_overview(rows)
        else:
            # Headline = the best point of the scenario; the section has them all.
            r = s.loc[s.apply(_gbs, axis=1).idxmax()]
            add(sc, "best point " + point_label(r, ["size_bytes", "batch", "qps", "threads", "processes"]), r)
    return pd.DataFrame(out, columns=OVERVIEW_COLUMNS)


def engines_overview(rows: pd.DataFrame) -> list[dict[str, Any]]:
    """The engines scenario's overview rows, from all ``rows`` (a cell's raw limit may come from
    single_nic): each engine's best cell, with its % of raw and whether its bytes were checked (the raw
    runs themselves are in the section's table)."""
    recs = [r for r in engines.table(rows) if r["engine"] != "raw limit"]
    out = []
    for name in dict.fromkeys(r["engine"] for r in recs):
        best = max((r for r in recs if r["engine"] == name), key=lambda r: r["GB/s"])
        pct = best["% of raw"]
        out.append({"scenario": f"{engines.SCENARIO}: {name}, best cell {fmt_size(best['page'])} "
                                f"{best['threads']} thr",
                    "GET throughput": throughput_text(best["GB/s"]),
                    "% of single-NIC raw limit": "—" if pct is None else
                    f"{pct:.0f}% of {best['raw limit']}" + (" (above raw)" if pct > 100 else ""),
                    "limited by": best["limited by"], "notes": best["verification"],
                    "run": short_run(best["run"])})
    return out


def charts_nics(r) -> int:
    """How many NICs an aggregate row spans."""
    from peercache.lab.analysis.rawlimit import nics_of
    return nics_of(r)


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


def collect_devices(r: pd.Series) -> list[str]:
    """Device names of a row."""
    return [d for d in str(r.get("devices") or "").split(",") if d]


# --- compact tables per scenario ------------------------------------------------

def _ok_bw(sub: pd.DataFrame) -> pd.DataFrame:
    return sub[(sub["status"] == "ok") & sub["value"].notna() & sub["metric"].isin(charts.BW_METRICS)]


def _single_nic_tables(sub, limits):
    recs = []
    for _, r in _ok_bw(sub).iterrows():
        lim = None if r["tool"] in RAW_TOOLS else raw_for(r, limits)
        g = _gbs(r)
        recs.append({"measurement": charts.measurement(r), "GET throughput": throughput_text(g),
                     "% of raw": "raw limit" if r["tool"] in RAW_TOOLS else (
                         f"{100 * g / lim.gbs:.0f}% of {lim.label}" if lim and lim.gbs else f"— ({why_none(r, limits)})"),
                     "run": short_run(r["run_id"])})
    return [("", recs)] if recs else []


def _multi_rail_tables(sub):
    ok = _ok_bw(sub)
    ok = ok[ok["threads"].notna()]
    recs = []
    for (size, batch), g in ok.groupby(["size_bytes", "batch"], dropna=False, sort=True):
        vals = [(int(t), _gbs(r), r["run_id"]) for t, r in ((r["threads"], r) for _, r in g.iterrows())]
        best = max(vals, key=lambda v: v[1])
        shares = charts.rail_shares_text(sub, [best[2]], best[0])
        recs.append({"page size": fmt_size(size), "batch": fmt_number(batch),
                     "peak": f"{fmt_number(best[1])} GB/s",
                     "best threads": f"{best[0]} (of {', '.join(str(v[0]) for v in sorted(vals))})",
                     # each rail's share of the peak's bytes (rdma with metrics scrapes; no column without rails)
                     **({"rail shares of bytes": shares} if shares else {}),
                     "run": short_run(best[2])})
    return [("", recs)] if recs else []


def _whole_machine_tables(sub):
    ok = _ok_bw(sub)
    agg, per = ok[ok["side"] == "aggregate"], ok[ok["side"] == "per_device"]
    recs = []
    for _, r in agg.iterrows():
        recs.append({"metric": "aggregate GET", "value": throughput_text(_gbs(r)), "run": short_run(r["run_id"])})
        ex = row_extra(r)
        conf = [f"{charts_nics(r)} NICs"]
        if ex.get("readers_per_nic") or r.get("processes"):
            conf.append(f"{fmt_number(ex.get('readers_per_nic') or r.get('processes'))} process(es) per NIC")
        if pd.notna(r.get("threads")):
            conf.append(f"{fmt_number(r['threads'])} thread(s) each")
        if pd.notna(r.get("size_bytes")):
            conf.append(f"{fmt_size(r['size_bytes'])} pages")
        recs.append({"metric": "configuration", "value": ", ".join(conf), "run": short_run(r["run_id"])})
        shares = charts.rail_shares_text(sub, [r["run_id"]])
        if shares:    # the metrics scrapes' rails (one per group); nothing where there are none (tcp)
            recs.append({"metric": "rail shares of bytes", "value": shares, "run": short_run(r["run_id"])})
    if not per.empty:
        vals = [_gbs(r) for _, r in per.iterrows()]
        runs = ", ".join(dict.fromkeys(per["run_id"]))
        recs.append({"metric": "per-NIC range", "value": f"{fmt_number(min(vals))} – "
                     f"{fmt_number(max(vals))} GB/s", "run": runs})
        recs.append({"metric": "per-NIC mean", "value": f"{fmt_number(sum(vals) / len(vals))} GB/s "
                     f"over {len(vals)} figure(s)", "run": runs})
    return [("", recs)] if recs else []


def _gpudirect_tables(sub):
    recs = [{"destination": row_extra(r).get("destination") or "not recorded",
             "GET throughput": throughput_text(_gbs(r)), "run": short_run(r["run_id"])}
            for _, r in _ok_bw(sub).iterrows()]
    return [("", recs)] if recs else []


#: The sweep's columns as the published table names them: metric -> (column, unit to show, digits).
SWEEP_COLUMNS = {"bw": ("BW (Gb/s)", "Gbit/s"), "msg_rate": ("MsgRate (Mpps)", "Mpps"), "ipc": ("IPC", None),
                 "l1_dcache_load_misses": ("L1 miss (count)", None), "llc_load_misses": ("LLC miss (count)", None),
                 "context_switches": ("ctx switches (count)", None), "cpu_migrations": ("cpu migrations (count)", None)}


def _cell(r) -> str:
    if r is None:
        return "—"
    if r["status"] != "ok" or pd.isna(r["value"]):
        return str(r["status"]).replace("_", " ")
    return fmt_number(r["value"])


def _sweep_value(g: pd.DataFrame, metric: str):
    m = g[g["metric"] == metric]
    if m.empty:
        return None
    r = m.iloc[0].copy()
    want = SWEEP_COLUMNS[metric][1]
    if want and r["status"] == "ok" and pd.notna(r["value"]):
        try:
            r["value"] = convert(float(r["value"]), str(r["unit"]), want)
        except ValueError:
            pass
    return r


def _msgsize_tables(sub):
    out = []
    full = []
    for (q, size), g in sub.groupby(["qps", "size_bytes"], dropna=False, sort=True):
        rec = {"QPs": fmt_number(q), "msg_size": fmt_size(size)}
        for metric, (col, _) in SWEEP_COLUMNS.items():
            rec[col] = _cell(_sweep_value(g, metric))
        rec["run"] = ", ".join(dict.fromkeys(g["run_id"]))
        full.append(rec)
    present = [c for c, _ in SWEEP_COLUMNS.values() if any(r[c] != "—" for r in full)]
    full = [{k: v for k, v in r.items() if k in ("QPs", "msg_size", "run") or k in present} for r in full]
    if full:
        out.append(("every point", full))
    bw = sub[(sub["metric"] == "bw") & (sub["status"] == "ok") & sub["value"].notna()]
    qps = sorted({int(q) for q in bw["qps"].dropna()})
    if len(qps) >= 2:
        lo, hi = qps[0], qps[-1]
        cmp = []
        for size, g in bw.groupby("size_bytes", sort=True):
            a, b = g[g["qps"] == lo], g[g["qps"] == hi]
            if a.empty or b.empty:
                continue
            va, vb = (convert(float(x.iloc[0]["value"]), str(x.iloc[0]["unit"]), "Gbit/s") for x in (a, b))
            cmp.append({"msg_size": fmt_size(size), f"QP{lo} (Gb/s)": fmt_number(va),
                        f"QP{hi} (Gb/s)": fmt_number(vb),
                        f"QP{lo} vs QP{hi}": f"{100 * (va - vb) / vb:+.1f}%" if vb else "—"})
        if cmp:
            out.append((f"QP{lo} vs QP{hi}", cmp))
    return out


def _engines_tables(sub):
    """Engines side by side: per page size and threads, each engine's GB/s, % of the cell's raw limit,
    p50/p99 where reported, what limited it and whether its bytes were checked."""
    recs = [{"page": fmt_size(r["page"]), "threads": r["threads"], "engine": r["engine"],
             "GB/s": fmt_number(r["GB/s"]),
             "% of raw": "—" if r["% of raw"] is None else f"{r['% of raw']:.0f}%",
             "p50": r["p50"], "p99": r["p99"], "limited by": r["limited by"], "verification": r["verification"],
             "run": short_run(r["run"].split(",")[0])} for r in engines.table(sub) if r["engine"] != "raw limit"]
    return [("", recs)] if recs else []


def compact_tables(scenario: str, sub: pd.DataFrame, limits) -> list[tuple[str, list[dict[str, Any]]]]:
    """A scenario's compact table(s), as the published document has them."""
    if scenario == "single_nic":
        return _single_nic_tables(sub, limits)
    if scenario == "multi_rail":
        return _multi_rail_tables(sub)
    if scenario == "whole_machine":
        return _whole_machine_tables(sub)
    if scenario == "gpudirect":
        return _gpudirect_tables(sub)
    if scenario == "msgsize_sweep":
        return _msgsize_tables(sub)
    if scenario == "engines":
        return _engines_tables(sub)
    if scenario == "hicache":
        from peercache.lab.analysis import hicache_suite
        return hicache_suite.tables(sub)
    recs = [{"metric": r["metric"], "value": f"{fmt_number(r['value'])} {r['unit']}",
             "run": short_run(r["run_id"])} for _, r in _ok_bw(sub).iterrows()]
    return [("", recs)] if recs else []


# --- key conclusions --------------------------------------------------------------

def conclusions(rows: pd.DataFrame) -> list[Conclusion]:
    """Key conclusions the rows support, each with the runs it rests on; nothing where the data is silent."""
    out: list[Conclusion] = []
    ok = rows[(rows["status"] == "ok") & rows["value"].notna()]
    bw = ok[ok["metric"].isin(charts.BW_METRICS)]
    limits = raw_limits(bw)
    single = bw[(bw["scenario"] == "single_nic") & ~bw["tool"].isin(RAW_TOOLS)]
    for _, r in single.iterrows():
        lim = raw_for(r, limits)
        if lim is None or not lim.gbs:
            continue
        g = _gbs(r)
        pct = 100 * g / lim.gbs
        verb = "reaches" if pct <= 100 else "exceeds"
        out.append(Conclusion(
            f"Single NIC: PeerCache ({charts.measurement(r).removeprefix('PeerCache GET ')}) {verb} "
            f"{pct:.0f}% of raw {lim.label}: {fmt_number(g)} vs {fmt_number(lim.gbs)} GB/s.",
            [r["run_id"], *lim.runs]))
    multi = bw[(bw["scenario"] == "multi_rail") & bw["threads"].notna()]
    for (size, batch), g in multi.groupby(["size_bytes", "batch"], dropna=False, sort=True):
        pts = sorted(((int(r["threads"]), _gbs(r), r["run_id"]) for _, r in g.iterrows()))
        if len(pts) < 3:
            continue
        best = max(pts, key=lambda p: p[1])
        last = pts[-1]
        what = f"{fmt_size(size)} pages, batch {fmt_number(batch)}"
        if best[0] < last[0] and last[1] < best[1] * (1 - FALLS_BEYOND):
            out.append(Conclusion(
                f"One process ({what}) peaks at {best[0]} threads ({fmt_number(best[1])} GB/s) and falls "
                f"beyond: {fmt_number(last[1])} GB/s at {last[0]} threads "
                f"({100 * (last[1] - best[1]) / best[1]:.0f}%).", [best[2], last[2]]))
        elif best[0] == last[0]:
            out.append(Conclusion(
                f"One process ({what}) still rises at {last[0]} threads, the most measured: "
                f"{fmt_number(pts[0][1])} GB/s at {pts[0][0]} → {fmt_number(last[1])} GB/s.",
                [pts[0][2], last[2]]))
    agg = bw[(bw["scenario"] == "whole_machine") & (bw["side"] == "aggregate")]
    for _, r in agg.iterrows():
        lb = r.get("limited_by")
        if not lb or str(lb).startswith("unknown"):
            continue
        out.append(Conclusion(f"Whole machine: the aggregate over {charts_nics(r)} NICs, "
                              f"{throughput_text(_gbs(r))}, is limited by {lb}.", [r["run_id"]]))
    sweep = ok[(ok["scenario"] == "msgsize_sweep") & (ok["metric"] == "bw")]
    for q, g in sweep.groupby("qps", sort=True):
        if len(g) < 3:
            continue
        vals = [(convert(float(r["value"]), str(r["unit"]), "Gbit/s"), r["size_bytes"], r["run_id"])
                for _, r in g.iterrows()]
        hi, lo = max(vals), min(vals)
        spread = (hi[0] - lo[0]) / hi[0] if hi[0] else None
        if spread is None:
            continue
        if spread < NO_SWEET_SPOT:
            out.append(Conclusion(
                f"Message-size sweep, QP {fmt_number(q)}: no sweet spot; bandwidth spans "
                f"{fmt_number(lo[0])}–{fmt_number(hi[0])} Gb/s over {len(vals)} sizes, "
                f"a spread of {100 * spread:.1f}%.", [hi[2], lo[2]]))
        else:
            out.append(Conclusion(
                f"Message-size sweep, QP {fmt_number(q)}: peaks at {fmt_size(hi[1])} "
                f"({fmt_number(hi[0])} Gb/s), {100 * spread:.0f}% above its lowest "
                f"({fmt_size(lo[1])}, {fmt_number(lo[0])} Gb/s).", [hi[2], lo[2]]))
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
        figs = [fig_dir / f"{c.name}.png" for c in built if isinstance(c, charts.Chart)]
        sec_notes = [f"{c.name}: not drawn: {c.reason}" for c in built if isinstance(c, charts.NotDrawn)]
        captions = []
        for c in built:
            if isinstance(c, charts.Chart):
                sec_notes += c.notes
                if c.caption:
                    captions.append(c.caption)
                charts.plt.close(c.fig)
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
                  environment.environment_fields(caps, runs, why), environment.capture_commands(caps),
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
    from IPython.display import HTML, display

    md_text = report_markdown(rep, out_dir, baseline, links)
    page = render_html(md_text, out_dir, rep.title, report_figures(rep))
    display(HTML(page[page.index("<main>"):page.index("</main>") + len("</main>")]
                 .replace("<main>", f"<div class=\"pc-report\"><style>{_CSS.replace('main{', '.pc-report{')}</style>")
                 .replace("</main>", "</div>")))
