"""multi_rail: one process reading over every rail, GB/s against its threads, one line per page size and batch.

The table gives each series' peak and the threads it was reached at (with each rail's share of the bytes
where the metrics scrapes have them); a conclusion says whether a series peaks and falls beyond or still
rises at the most threads measured.
"""
from __future__ import annotations

import pandas as pd

from peercache.lab.analysis.format import display, fmt_number, fmt_size, limit_text, short_run, why_empty
from peercache.lab.analysis.metablock import meta_block
from peercache.lab.analysis.rawlimit import BW_METRICS
from peercache.lab.analysis.references import TestbedRefs, row_extra
from peercache.lab.analysis.scenarios.declare import (Chart, Conclusion, Limits, NotDrawn, Scenario, Table, gbs,
                                                      ok_bw, ok_rows, to_gbs)
from peercache.lab.analysis.scenarios.draw import MARKERS, new_fig, series_colors
from peercache.lab.analysis.scenarios.rails import rail_shares_text, shares_column
from peercache.lab.analysis.spread import apart, by_point, range_text, spread_of, spread_text, yerr

#: A series "falls beyond" its peak when its last point is this fraction below the peak.
FALLS_BEYOND = 0.05


def figure(rows: pd.DataFrame, runs: pd.DataFrame, refs: TestbedRefs | None) -> Chart | NotDrawn:
    """Multi-rail: GB/s vs threads, one line per page size and batch."""
    sub = rows[rows["metric"].isin(BW_METRICS)]
    ok = ok_rows(sub)
    ok = ok[ok["threads"].notna()]
    if ok.empty:
        return NotDrawn("multi_rail", why_empty(sub, "multi-rail bandwidth (with threads)"))
    fig, axes = new_fig()
    ax = axes[0][0]
    table = []
    series = list(ok.groupby(["size_bytes", "batch"], dropna=False, sort=True))
    colors = series_colors(len(series), raw=False)
    for k, ((size, batch), g) in enumerate(series):
        pts = g.groupby("threads", sort=True)
        xs, sps = [], []
        for thr, gg in pts:
            sp, mid = spread_of(gg, to_gbs)
            xs.append(int(thr))
            sps.append(sp)
            stat = {row_extra(v).get("statistic") for _, v in gg.iterrows()} - {None}
            table.append({"page size": fmt_size(size), "batch": batch, "threads": int(thr),
                          **dict(zip(("value", "unit"), display(mid["value"], mid["unit"]))),
                          "range": range_text(sp), "n": len(gg),
                          "statistic": ",".join(sorted(stat)) or "—",
                          "verdict": ",".join(sorted(set(gg["verdict"]))) if "verdict" in gg else "unchecked",
                          "limited by": limit_text(gg),
                          # rails only where rows have them (rdma with metrics scrapes)
                          **shares_column(rail_shares_text(rows, gg["run_id"], thr)),
                          "run": ",".join(dict.fromkeys(gg["run_id"]))})
        peak_only = all(row_extra(v).get("statistic") == "peak" for _, v in g.iterrows())
        label = f"{fmt_size(size)}, batch {fmt_number(batch)}" + (" (peak only)" if peak_only else "")
        # medians of the repetitions, whiskers from the lowest to the highest run
        ax.errorbar(xs, [sp["median"] for sp in sps], yerr=yerr(sps), marker=MARKERS[k % len(MARKERS)], color=colors[k],
                    capsize=3, label=label)
    threads = sorted({int(t) for t in ok["threads"]})
    ax.set_xticks(threads, [str(t) for t in threads])   # threads are whole: no 1.5-thread ticks
    ax.set_xlabel("threads (concurrency)")
    ax.set_ylabel("GET throughput (GB/s)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    return Chart("multi_rail", "Multi-rail, one process: GB/s vs threads (medians of the repetitions, lowest to "
                 "highest run as whiskers)", fig, table, meta_block(ok, runs))


class MultiRail(Scenario):
    """The multi_rail scenario's report."""

    figures = {"multi_rail": figure}

    def tables(self, sub: pd.DataFrame, limits: Limits) -> list[Table]:
        """Each page size and batch: its peak, the threads it was reached at, each rail's share there."""
        ok = ok_bw(sub)
        ok = ok[ok["threads"].notna()]
        recs = []
        for (size, batch), g in ok.groupby(["size_bytes", "batch"], dropna=False, sort=True):
            vals = [(int(r["threads"]), sp["median"], r["run_id"], sp) for r, sp, _ in by_point(g, gbs)]
            best = max(vals, key=lambda v: v[1])
            recs.append({"page size": fmt_size(size), "batch": fmt_number(batch),
                         "peak": f"{spread_text(best[3])} GB/s",
                         "best threads": f"{best[0]} (of {', '.join(str(v[0]) for v in sorted(vals))})",
                         # each rail's share of the peak's bytes (rdma with metrics scrapes; no column without rails)
                         **shares_column(rail_shares_text(sub, [best[2]], best[0])),
                         "run": short_run(best[2])})
        return [("", recs)] if recs else []

    def conclusions(self, sub: pd.DataFrame, limits: Limits) -> list[Conclusion]:
        """Per page size and batch (3 thread counts or more), by the medians of the repetitions: peaks and falls
        beyond (only where the last point's runs are all below the peak's), or still rises."""
        out = []
        bw = ok_bw(sub)
        multi = bw[bw["threads"].notna()]
        for (size, batch), g in multi.groupby(["size_bytes", "batch"], dropna=False, sort=True):
            pts = sorted(((int(r["threads"]), sp, runs) for r, sp, runs in by_point(g, gbs)), key=lambda p: p[0])
            if len(pts) < 3:
                continue
            best = max(pts, key=lambda p: p[1]["median"])
            last = pts[-1]
            what = f"{fmt_size(size)} pages, batch {fmt_number(batch)}"
            top, end = best[1]["median"], last[1]["median"]
            if best[0] < last[0] and end < top * (1 - FALLS_BEYOND):
                if apart(best[1], last[1]):
                    out.append(Conclusion(
                        f"One process ({what}) peaks at {best[0]} threads ({spread_text(best[1])} GB/s) and falls "
                        f"beyond: {spread_text(last[1])} GB/s at {last[0]} threads "
                        f"({100 * (end - top) / top:.0f}% by medians).", best[2] + last[2]))
                else:
                    out.append(Conclusion(
                        f"One process ({what}) is highest at {best[0]} threads ({spread_text(best[1])} GB/s); at "
                        f"{last[0]} threads, {spread_text(last[1])} GB/s, it is within the spread of that, so it "
                        "does not fall beyond it measurably.", best[2] + last[2]))
            elif best[0] == last[0]:
                out.append(Conclusion(
                    f"One process ({what}) still rises at {last[0]} threads, the most measured: "
                    f"{spread_text(pts[0][1])} GB/s at {pts[0][0]} → {spread_text(last[1])} GB/s"
                    + ("." if apart(last[1], pts[0][1]) else ", within the spread of each other."),
                    pts[0][2] + last[2]))
        return out
