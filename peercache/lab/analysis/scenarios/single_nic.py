"""single_nic: PeerCache over one NIC beside the raw tool's figure of the same shape, with the percentage.

The figure is one bar per measurement (raw grey, PeerCache blue); the table gives each figure's % of its raw
limit (:mod:`peercache.lab.analysis.rawlimit`); the overview cites the raw runs a PeerCache row is compared
with; a conclusion says what share of raw each PeerCache point reaches.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from peercache.lab.analysis.format import (display, fmt_number, fmt_size, limit_text, point_label, present,
                                           short_run, throughput_text, why_empty)
from peercache.lab.analysis.metablock import meta_block
from peercache.lab.analysis.rawlimit import (BW_METRICS, RAW_TOOLS, pct_text, point_shape, raw_for, raw_limits,
                                             raw_shape, why_none)
from peercache.lab.analysis.references import TestbedRefs, row_extra
from peercache.lab.analysis.scenarios.declare import (Chart, Conclusion, Limits, NotDrawn, Scenario, Table, gbs,
                                                      ok_bw, ok_rows, overview_row, to_gbs)
from peercache.lab.analysis.scenarios.draw import PEERCACHE_COLOR, RAW_COLOR, new_fig, raw_legend


def figure(rows: pd.DataFrame, runs: pd.DataFrame, refs: TestbedRefs | None) -> Chart | NotDrawn:
    """Single NIC: PeerCache vs the raw perftest figure, with the percentage."""
    sub = rows[rows["metric"].isin(BW_METRICS)]
    ok = ok_rows(sub)
    if ok.empty:
        return NotDrawn("single_nic", why_empty(sub, "single-NIC bandwidth"))
    # protocol keeps PeerCache over tcp and over shm apart (each has its own raw limit)
    keys = ["tool", "protocol", "size_bytes", "qps", "threads", "processes", "layout"]
    groups = []
    for _, g in ok.groupby(keys, dropna=False, sort=False):
        r = g.iloc[0].to_dict()
        groups.append((r, g))
    limits = raw_limits(ok)
    fig, axes = new_fig(w=max(7.0, 1.3 * len(groups)))
    ax = axes[0][0]
    table, labels, heights, colors, pcts = [], [], [], [], []
    for r, g in groups:
        gbs_ = sum(to_gbs(v) for _, v in g.iterrows()) / len(g)
        is_raw = r["tool"] in RAW_TOOLS
        raw = None if is_raw else raw_for(r, limits)
        pct = None if raw is None or not raw.gbs else 100.0 * gbs_ / raw.gbs  # no (or a zero) raw figure: no %
        labels.append(bar_label(r))
        heights.append(gbs_)
        pcts.append(pct)
        colors.append(RAW_COLOR if is_raw else PEERCACHE_COLOR)
        value, unit = display(g["value"].mean(), r["unit"])
        table.append({"measurement": measurement(r), "value": value, "unit": unit, "n": len(g),
                      "% of raw": "—" if pct is None else pct_text(pct, digits=1),
                      "raw limit": "—" if is_raw else (raw.label if raw else "none: " + why_none(r, limits)),
                      "verdict": ",".join(sorted(set(g["verdict"]))) if "verdict" in g else "unchecked",
                      "limited by": limit_text(g), "run": ",".join(dict.fromkeys(g["run_id"]))})
    bars = ax.bar(range(len(heights)), heights, color=colors)
    for b, p, h in zip(bars, pcts, heights):
        ax.annotate(f"{h:.3g} GB/s\n{pct_text(p, 'raw')}" if p is not None else f"{h:.3g} GB/s",
                    (b.get_x() + b.get_width() / 2, h), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel("GET / read throughput (GB/s)")
    ax.set_ylim(0, max(heights) * 1.3)
    raw_legend(ax)
    notes = []
    for r, _ in groups:
        if r["tool"] not in RAW_TOOLS and raw_for(r, limits) is None:
            notes.append(f"{measurement(r)}: no percentage: {why_none(r, limits)}")
    return Chart("single_nic", "Single NIC: PeerCache vs the raw limit", fig, table,
                 meta_block(ok, runs), list(dict.fromkeys(notes)))


def bar_label(r) -> str:
    """A short bar label: the tool (or PeerCache and its transport) and the connections; knobs go in the table."""
    if r["tool"] in RAW_TOOLS:
        conns = raw_shape(r)[1]
        return r["tool"] + (f"\n{conns} conn." if r["tool"] == "iperf3" else
                            f"\n{conns} thr" if conns and r["tool"] == "memcpy" else "")
    conns = point_shape(r)[1]
    return f"PeerCache\n{r.get('protocol') or '?'}" + (f", {conns} conn." if conns and r.get("protocol") == "tcp" else "")


def measurement(r) -> str:
    """What a single-NIC bar measured, with every knob (the table's first column)."""
    size = fmt_size(r.get("size_bytes")) if present(r.get("size_bytes")) else "size ?"
    if r["tool"] == "iperf3":
        window = raw_shape(r)[3]
        return (f"iperf3{' -R' if row_extra(r).get('reverse') else ''}, {raw_shape(r)[1]} conn., {size}"
                + (f", -w {fmt_size(window)}" if window else ""))
    if r["tool"] == "memcpy":
        return f"memcpy, {raw_shape(r)[1]} thr, {size}"
    if r["tool"] in RAW_TOOLS:
        return f"{r['tool']} " + point_label(r, ["qps", "size_bytes"])
    shape = (f", {fmt_number(r['processes'])} proc × {fmt_number(r['threads'])} thr"
             if present(r.get("processes")) and present(r.get("threads")) else "")
    batch = f", batch {fmt_number(r['batch'])}" if present(r.get("batch")) else ""
    return f"PeerCache over {r.get('protocol') or '?'}, {size}{batch}{shape}"


class SingleNic(Scenario):
    """The single_nic scenario's report."""

    figures = {"single_nic": figure}

    def tables(self, sub: pd.DataFrame, limits: Limits) -> list[Table]:
        """Each measurement's GET throughput and its % of its raw limit."""
        recs = []
        for _, r in ok_bw(sub).iterrows():
            lim = None if r["tool"] in RAW_TOOLS else raw_for(r, limits)
            g = gbs(r)
            recs.append({"measurement": measurement(r), "GET throughput": throughput_text(g),
                         "% of raw": "raw limit" if r["tool"] in RAW_TOOLS else (
                             pct_text(100 * g / lim.gbs, lim.label) if lim and lim.gbs
                             else f"— ({why_none(r, limits)})"),
                         "run": short_run(r["run_id"])})
        return [("", recs)] if recs else []

    def headline(self, scenario: str, s: pd.DataFrame, rows: pd.DataFrame, limits: Limits) -> list[dict[str, Any]]:
        """Every PeerCache row and the raw rows it is compared with (every raw row where there is no
        PeerCache row; the section lists every raw run)."""
        peer = s[~s["tool"].isin(RAW_TOOLS)]
        cited = {run for _, r in peer.iterrows() for run in (getattr(raw_for(r, limits), "runs", ()) or ())}
        return [overview_row(scenario, measurement(r), r, limits) for _, r in s.iterrows()
                if not (r["tool"] in RAW_TOOLS and not peer.empty and r["run_id"] not in cited)]

    def conclusions(self, sub: pd.DataFrame, limits: Limits) -> list[Conclusion]:
        """What share of its raw limit each PeerCache point reaches (or exceeds)."""
        out = []
        bw = ok_bw(sub)
        for _, r in bw[~bw["tool"].isin(RAW_TOOLS)].iterrows():
            lim = raw_for(r, limits)
            if lim is None or not lim.gbs:
                continue
            g = gbs(r)
            pct = 100 * g / lim.gbs
            verb = "reaches" if pct <= 100 else "exceeds"
            out.append(Conclusion(
                f"Single NIC: PeerCache ({measurement(r).removeprefix('PeerCache GET ')}) {verb} "
                f"{pct:.0f}% of raw {lim.label}: {fmt_number(g)} vs {fmt_number(lim.gbs)} GB/s.",
                [r["run_id"], *lim.runs]))
        return out
