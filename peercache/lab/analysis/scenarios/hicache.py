"""hicache: the HiCache suite's section: per run (one layout), each op's sweep over concurrency and its PEAK.

A run of the ``hicache_suite`` kind is one suite: get, set and exists, each swept over the threads
calling the store, and the point the suite named each op's PEAK (``extra.peak``: the parser checked it is
the ok point with the most pages/s). A record per point gives pages/s, tokens/s, GB/s (none for exists:
no page bytes move), p50/p99/p999 of one batch call in ms, how its bytes were checked, and what limited
it: attribution's sentence on the point's pages/s row (from that point's own CPU window), never a number
made here. The records (:func:`sweeps`, :func:`peaks`) are pure: rows in, records out; the figure (pages/s
against threads, one panel per op), the report's tables and the overview rows (each layout's get PEAK)
are drawn from them.
"""
from __future__ import annotations

from typing import Any

import pandas as pd
from matplotlib.ticker import FuncFormatter, MaxNLocator

from peercache.lab.analysis.format import fmt_number, fmt_size, rate_text, short_run, throughput_text, why_empty
from peercache.lab.analysis.metablock import meta_block
from peercache.lab.analysis.references import TestbedRefs, convert, row_extra
from peercache.lab.analysis.scenarios.declare import Chart, Limits, NotDrawn, Scenario, Table, ok_rows
from peercache.lab.analysis.scenarios.draw import MARKERS, new_fig, series_colors
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


def figure(rows: pd.DataFrame, runs: pd.DataFrame, refs: TestbedRefs | None) -> Chart | NotDrawn:
    """The HiCache suite: pages/s against the threads calling the store, one panel per op (get, set, exists),
    one line per run (layout), its PEAK starred (the table: tokens/s, GB/s, p50/p99/p999, limited by;
    :func:`sweeps`)."""
    sub = suite_rows(rows)
    head = ok_rows(sub[sub["metric"] == PRIMARY])
    if head.empty:
        return NotDrawn("hicache_suite", why_empty(sub[sub["metric"] == PRIMARY], "HiCache suite pages/s"))
    ops = [o for o in OPS if (head["op"] == o).any()]
    fig, axes = new_fig(ncols=len(ops), w=3.2 * len(ops) + 0.6, h=3.6)
    run_ids = list(dict.fromkeys(head["run_id"]))
    colors = series_colors(len(run_ids), raw=False)
    for ax, op in zip(axes[0], ops):
        for k, rid in enumerate(run_ids):
            g = head[(head["op"] == op) & (head["run_id"] == rid)].sort_values("threads")
            if g.empty:
                continue
            ax.plot(g["threads"], g["value"], marker=MARKERS[k % len(MARKERS)], color=colors[k],
                    label=f"{g['layout'].iloc[0]}")
            # each line labelled at its last point (no legend to cover a point or a PEAK label)
            ax.annotate(g["layout"].iloc[0], (g["threads"].iloc[-1], g["value"].iloc[-1]), textcoords="offset points",
                        xytext=(10, -3), ha="left", fontsize=8, color=colors[k], fontweight="bold")
            pk = g[g["peak"]]
            ax.plot(pk["threads"], pk["value"], marker="*", markersize=13, color=colors[k], linestyle="none")
            for t, v in zip(pk["threads"], pk["value"]):
                ax.annotate(f"PEAK {rate_text(v)}", (t, v), textcoords="offset points", xytext=(0, 7),
                            ha="center", fontsize=7, color=colors[k])
        ax.set_title(f"{op} ({CALLS[op]})", fontsize=9)
        ax.set_xlabel("threads calling the store")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        lo, hi = head["threads"].min(), head["threads"].max()
        ax.set_xlim(lo - 0.35 * max(1, hi - lo), hi + 0.35 * max(1, hi - lo))
        ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.18)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: rate_text(v)))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("pages/s (one SGLang page each)")
    layout = dict(zip(head["run_id"], head["layout"]))
    table = [{"layout": layout.get(rid, "—"), **rec, "run": rid} for rid, _, recs in sweeps(rows) for rec in recs]
    return Chart("hicache_suite", "HiCache suite: PeerCacheStore as SGLang's cache controller calls it, pages/s by op "
                 "and threads, per layout (★ = the op's PEAK)", fig, table, meta_block(ok_rows(sub), runs),
                 not_measured(rows))


class HiCache(Scenario):
    """The hicache scenario's report."""

    figures = {"hicache_suite": figure}

    def tables(self, sub: pd.DataFrame, limits: Limits) -> list[Table]:
        """The report's tables: (caption, records) per run of the suite (:func:`sweeps`)."""
        return [(caption, recs) for _, caption, recs in sweeps(sub)]

    def overview(self, scenario: str, sub: pd.DataFrame, rows: pd.DataFrame, bw: pd.DataFrame,
                 limits: Limits) -> list[dict[str, Any]]:
        """Each layout's get PEAK (a GET through batch_get_v1) with its set and exists PEAKs beside; without a
        suite PEAK, the default."""
        suite_peaks = peaks(sub)
        if not suite_peaks:
            return super().overview(scenario, sub, rows, bw, limits)
        out = []
        for pk in (p for p in suite_peaks if p["op"] == "get"):
            others = [f"{p['op']} PEAK {rate_text(p['pages/s'])} pages/s"
                      + (f" ({fmt_number(p['GB/s'])} GB/s)" if p["GB/s"] is not None else "")
                      + f" at {p['threads']} thr" for p in suite_peaks if p["run"] == pk["run"] and p["op"] != "get"]
            out.append({"scenario": f"{scenario}: {pk['layout']} get PEAK (batch_get_v1, {pk['threads']} thr)",
                        "GET throughput": throughput_text(pk["GB/s"]), "% of single-NIC raw limit": "—",
                        "limited by": pk["limited by"],
                        "notes": "; ".join([f"{rate_text(pk['pages/s'])} pages/s", *others]),
                        "run": short_run(pk["run"])})
        return out
