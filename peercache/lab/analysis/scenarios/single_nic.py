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
from peercache.lab.analysis.spread import (by_point, median_note, point_of, range_text, spread_of, spread_text,
                                           yerr)


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
    fig, axes = new_fig(w=max(7.0, 1.7 * len(groups)))
    ax = axes[0][0]
    table, labels, heights, colors, pcts, sps = [], [], [], [], [], []
    for r, g in groups:
        sp, mid = spread_of(g, to_gbs)
        gbs_ = sp["median"]
        is_raw = r["tool"] in RAW_TOOLS
        raw = None if is_raw else raw_for(r, limits)
        pct = None if raw is None or not raw.gbs else 100.0 * gbs_ / raw.gbs  # no (or a zero) raw figure: no %
        labels.append(bar_label(r))
        heights.append(gbs_)
        sps.append(sp)
        pcts.append(None if pct is None else (pct, 100.0 * sp["min"] / raw.gbs))
        colors.append(RAW_COLOR if is_raw else PEERCACHE_COLOR)
        value, unit = display(mid["value"], mid["unit"])
        table.append({"measurement": measurement(r), "value": value, "unit": unit, "range": range_text(sp),
                      "n": len(g),
                      "% of raw": "—" if pct is None else pct_text(pct, digits=1, lowest=100.0 * sp["min"] / raw.gbs),
                      "raw limit": "—" if is_raw else (raw.label if raw else "none: " + why_none(r, limits)),
                      "verdict": ",".join(sorted(set(g["verdict"]))) if "verdict" in g else "unchecked",
                      "limited by": limit_text(g), "run": ",".join(dict.fromkeys(g["run_id"]))})
    # medians of the repetitions, whiskers from the lowest to the highest run
    whiskers = yerr(sps)
    bars = ax.bar(range(len(heights)), heights, color=colors, yerr=whiskers, capsize=3)
    for b, p, h, up in zip(bars, pcts, heights, whiskers[1]):
        # the flag on a line of its own: "(within the spread of raw)" is wider than a bar
        label = f"{h:.3g} GB/s" if p is None else (f"{h:.3g} GB/s\n"
                                                   + pct_text(p[0], "raw", lowest=p[1]).replace(" (", "\n("))
        ax.annotate(label, (b.get_x() + b.get_width() / 2, h + up), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel("GET / read throughput (GB/s)")
    ax.set_ylim(0, max(heights) * 1.3)
    raw_legend(ax)
    notes = []
    for r, _ in groups:
        if r["tool"] not in RAW_TOOLS and raw_for(r, limits) is None:
            notes.append(f"{measurement(r)}: no percentage: {why_none(r, limits)}")
    return Chart("single_nic", "Single NIC: PeerCache vs the raw limit (medians of the repetitions, lowest to "
                 "highest run as whiskers)", fig, table,
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
        """Each measurement's GET throughput (median, min–max of its repetitions) and its % of its raw limit."""
        recs = []
        for r, sp, runs in by_point(ok_bw(sub), gbs):
            lim = None if r["tool"] in RAW_TOOLS else raw_for(r, limits)
            recs.append({"measurement": measurement(r),
                         "GET throughput": f"{throughput_text(sp['median'])}, {median_note(sp)}",
                         "% of raw": "raw limit" if r["tool"] in RAW_TOOLS else (
                             pct_text(100 * sp["median"] / lim.gbs, lim.label, lowest=100 * sp["min"] / lim.gbs)
                             if lim and lim.gbs else f"— ({why_none(r, limits)})"),
                         "run": runs_text(runs)})
        return [("", recs)] if recs else []

    def headline(self, scenario: str, s: pd.DataFrame, rows: pd.DataFrame, limits: Limits) -> list[dict[str, Any]]:
        """Every PeerCache point (its median run, with its range) and the raw points it is compared with (every
        raw point where there is no PeerCache row; the section lists every raw run)."""
        peer = s[~s["tool"].isin(RAW_TOOLS)]
        cited = {point_of(run) for _, r in peer.iterrows() for run in (getattr(raw_for(r, limits), "runs", ()) or ())}
        return [overview_row(scenario, measurement(r), r, limits, sp=sp) for r, sp, _ in by_point(s, gbs)
                if not (r["tool"] in RAW_TOOLS and not peer.empty and point_of(r["run_id"]) not in cited)]

    def conclusions(self, sub: pd.DataFrame, limits: Limits) -> list[Conclusion]:
        """What share of its raw limit each PeerCache point reaches (by its median), and whether it exceeds it:
        only where its every run is above the raw limit, else within the spread."""
        out = []
        bw = ok_bw(sub)
        for r, sp, runs in by_point(bw[~bw["tool"].isin(RAW_TOOLS)], gbs):
            lim = raw_for(r, limits)
            if lim is None or not lim.gbs:
                continue
            pct = 100 * sp["median"] / lim.gbs
            what = f"Single NIC: PeerCache ({measurement(r).removeprefix('PeerCache GET ')})"
            figures = f"{spread_text(sp)} vs {fmt_number(lim.gbs)} GB/s"
            if pct > 100 and sp["min"] <= lim.gbs:
                text = (f"{what} is within the spread of raw {lim.label}: {pct:.0f}% of it by its median, but a run "
                        f"at or below it ({figures}).")
            else:
                text = f"{what} {'exceeds' if pct > 100 else 'reaches'} {pct:.0f}% of raw {lim.label}: {figures}."
            out.append(Conclusion(text, [*runs, *lim.runs]))
        return out


def runs_text(runs: list[str]) -> str:
    """The first run of a point and how many more: "local/…/rep0 (+2)"."""
    return short_run(runs[0]) + (f" (+{len(runs) - 1})" if len(runs) > 1 else "")
