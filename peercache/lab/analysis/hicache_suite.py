"""The HiCache suite's section: per run (one layout), each op's sweep over concurrency and its PEAK.

A run of the ``hicache_suite`` kind is one suite: get, set and exists, each swept over the threads
calling the store, and the point the suite named each op's PEAK (``extra.peak``: the parser checked it is
the ok point with the most pages/s). A record per point gives pages/s, tokens/s, GB/s (none for exists:
no page bytes move), p50/p99/p999 of one batch call in ms, how its bytes were checked, and what limited
it: attribution's sentence on the point's pages/s row (from that point's own CPU window), never a number
made here. Pure: rows in, records out.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from peercache.lab.analysis.format import fmt_size, rate_text
from peercache.lab.analysis.references import convert, row_extra
from peercache.lab.tools.hicache_suite import CALLS, OPS, PRIMARY, TOOL

#: The figures of a record: metric -> (column, unit shown).
COLUMNS = {"store_pages_per_s": ("pages/s", "pages/s"), "store_tokens_per_s": ("tokens/s", "tokens/s"),
           "store_throughput": ("GB/s", "GB/s"), "latency_p50": ("p50 (ms)", "ms"),
           "latency_p99": ("p99 (ms)", "ms"), "latency_p999": ("p999 (ms)", "ms")}

#: Runs in this order of their layout (mla, then mha), each layout's runs by run id.
LAYOUT_ORDER = {"mla": 0, "mha": 1}


def _cores(r: pd.Series) -> str:
    """The point's CPU evidence: CPU s per s of each side's process tree over its window (attribution's input)."""
    cpu = row_extra(r).get("cpu") or {}
    got = [f"{side} {cpu[side]['cores']:.2f}" for side in ("consumer", "producer")
           if isinstance(cpu.get(side), dict) and cpu[side].get("cores") is not None]
    return ", ".join(got) or "not recorded"


def suite_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The suite's rows, each with its op and PEAK flag as columns (from ``extra``)."""
    sub = rows[rows["tool"] == TOOL].copy()
    ex = [row_extra(r) for _, r in sub.iterrows()]
    sub["op"] = [e.get("op") for e in ex]
    sub["peak"] = [bool(e.get("peak")) for e in ex]
    return sub


def _cell(g: pd.DataFrame, metric: str) -> str:
    m = g[g["metric"] == metric]
    if m.empty:
        return "—"
    r = m.iloc[0]
    if r["status"] != "ok" or pd.isna(r["value"]):
        return "—" if r["status"] == "not_measured" else str(r["status"])
    return rate_text(convert(float(r["value"]), str(r["unit"]), COLUMNS[metric][1]))


def _checked(r: pd.Series, op: str) -> str:
    ex = row_extra(r)
    if op == "exists":
        return "— (no bytes)"
    if not ex.get("verified"):
        return "unverified (--no-verify)" if r["status"] == "ok" else "—"
    rt = ex.get("roundtrip")
    if op == "set" and rt:
        return f"round trip {rt['arrived']}/{rt['pages']} pages, {rt['mismatched']} wrong"
    return "every page verified" if op == "get" else "verified"


def run_caption(g: pd.DataFrame) -> str:
    """What one run's table is: its layout, page geometry, batch, transport and run id."""
    r = g.iloc[0]
    ex = row_extra(r)
    objs = ex.get("objects_per_page")
    return (f"{r['layout']}: pages of {ex.get('page_tokens')} tokens = {objs} x {fmt_size(r['size_bytes'])}, "
            f"batch {int(r['batch'])} pages per call, over {r['protocol']}, rank {ex.get('tp_rank')} of "
            f"{ex.get('tp_size')}{'' if ex.get('is_storage_writer', True) else ' (not the storage writer)'}; "
            f"run {r['run_id']}")


def run_table(g: pd.DataFrame) -> list[dict[str, Any]]:
    """One run's records: each op's points in thread order, then its PEAK (the point the suite named)."""
    recs = []
    for op in [o for o in OPS if (g["op"] == o).any()]:
        pts = g[g["op"] == op]
        peak = None
        for threads, pt in sorted(pts.groupby("threads"), key=lambda kv: kv[0]):
            head = pt[pt["metric"] == PRIMARY]
            if head.empty:
                continue
            h = head.iloc[0]
            lb = h.get("limited_by")
            rec = {"op": f"{op} ({CALLS[op]})", "threads": str(int(threads)),
                   **{col: _cell(pt, m) for m, (col, _) in COLUMNS.items()},
                   "checked": _checked(h, op), "CPU (cores)": _cores(h),
                   "limited by": lb if isinstance(lb, str) and lb
                   else ("—" if h["status"] == "ok" else f"{h['status']}: {h['reason']}")}
            recs.append(rec)
            if bool(pt["peak"].any()):
                peak = dict(rec, threads=f"PEAK ({int(threads)} thr)")
        if peak is not None:
            recs.append(peak)
    return recs


def sweeps(rows: pd.DataFrame) -> list[tuple[str, str, list[dict[str, Any]]]]:
    """(run id, caption, records) per run of the suite, in run order (each run is one layout's suite)."""
    sub = suite_rows(rows)
    out = []
    order = sorted(dict.fromkeys(zip(sub["run_id"], sub["layout"])),
                   key=lambda rl: (LAYOUT_ORDER.get(rl[1], len(LAYOUT_ORDER)), rl[0]))
    for run_id, _ in order:
        g = sub[sub["run_id"] == run_id]
        recs = run_table(g)
        if recs:
            out.append((run_id, run_caption(g), recs))
    return out


def tables(rows: pd.DataFrame) -> list[tuple[str, list[dict[str, Any]]]]:
    """The report's tables: (caption, records) per run of the suite (:func:`sweeps`)."""
    return [(caption, recs) for _, caption, recs in sweeps(rows)]


def peaks(rows: pd.DataFrame) -> list[dict[str, Any]]:
    """Each run's PEAK per op (the point the suite named): run, layout, op, threads, pages/s, GB/s (None for
    exists) and attribution's "limited by" of that point."""
    sub = suite_rows(rows)
    head = sub[(sub["metric"] == PRIMARY) & sub["peak"] & (sub["status"] == "ok")]
    out = []
    for _, h in head.iterrows():
        gbs = sub[(sub["run_id"] == h["run_id"]) & (sub["op"] == h["op"]) & (sub["threads"] == h["threads"])
                  & (sub["metric"] == "store_throughput") & (sub["status"] == "ok")]
        lb = h.get("limited_by")
        out.append({"run": h["run_id"], "layout": h["layout"], "op": h["op"], "threads": int(h["threads"]),
                    "pages/s": float(h["value"]),
                    "GB/s": None if gbs.empty else convert(float(gbs.iloc[0]["value"]), str(gbs.iloc[0]["unit"]), "GB/s"),
                    "limited by": lb if isinstance(lb, str) and lb else "—"})
    return sorted(out, key=lambda p: (LAYOUT_ORDER.get(p["layout"], len(LAYOUT_ORDER)), p["run"], OPS.index(p["op"])))


def not_measured(rows: pd.DataFrame) -> list[str]:
    """The suite's points (or whole runs) that failed or were skipped, with why."""
    sub = suite_rows(rows)
    bad = sub[(sub["metric"] == PRIMARY) & sub["status"].isin(("failed", "skipped"))]
    return list(dict.fromkeys(f"{r['run_id']} {r['op'] or 'suite'} threads={r['threads']}: {r['status']}: "
                              f"{r['reason']}" for _, r in bad.iterrows()))
