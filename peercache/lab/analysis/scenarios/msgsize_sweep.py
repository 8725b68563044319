"""msgsize_sweep: the raw tool's bandwidth, message rate and perf stat counters against the message size,
one line per QP count.

Two figures (bandwidth and message rate; the counters, a missing one drawn as missing, never as zero), the
table of every point and the lowest against the highest QP count, and a conclusion per QP count: where it
peaks, or that it has no sweet spot. Its overview row is the default (the best point).
"""
from __future__ import annotations

from typing import Any

import matplotlib.transforms as mtransforms
import pandas as pd
from matplotlib.ticker import MaxNLocator

from peercache.lab.analysis.format import display, fmt_number, fmt_size, present, why_empty
from peercache.lab.analysis.metablock import meta_block
from peercache.lab.analysis.references import TestbedRefs, convert
from peercache.lab.analysis.scenarios.declare import Chart, Conclusion, Limits, NotDrawn, Scenario, Table, ok_rows
from peercache.lab.analysis.scenarios.draw import MARKERS, new_fig, series_colors
from peercache.lab.analysis.spread import apart, by_point, range_text, spread_of, spread_text, yerr

#: perf stat counters drawn against message size: metric -> label.
COUNTERS = {"ipc": "IPC", "l1_dcache_load_misses": "L1-dcache load misses",
            "llc_load_misses": "LLC load misses", "context_switches": "context switches",
            "cpu_migrations": "CPU migrations"}
#: Counters that count whole events: their axes get integer ticks.
INTEGER_COUNTERS = ("l1_dcache_load_misses", "llc_load_misses", "context_switches", "cpu_migrations")
#: A sweep has "no sweet spot" when its bandwidth spread (max - min) / max is below this.
NO_SWEET_SPOT = 0.10


def _series(frame: pd.DataFrame, metric: str) -> dict[Any, pd.DataFrame]:
    """The rows of ``metric`` per QP count, each by size."""
    f = frame[frame["metric"] == metric]
    return {q: g.sort_values("size_bytes") for q, g in f.groupby("qps", dropna=False, sort=True)}


def _by_size(g: pd.DataFrame, value) -> tuple[list[float], list[dict]]:
    """Per size of ``g`` (ascending): the size, and the :func:`spread` of ``value(row)`` over its runs."""
    sizes, sps = [], []
    for size, rows in g.groupby("size_bytes", sort=True):
        sizes.append(float(size))
        sps.append(spread_of(rows, value)[0])
    return sizes, sps


def _size_axis(ax, sizes: pd.Series) -> None:
    """A log2 message-size axis ticked at the sizes measured."""
    sizes = [float(v) for v in sizes if present(v) and float(v) > 0]
    ax.set_xscale("log", base=2)
    if sizes:
        # Set limits from the data: an axis whose only marks are "missing" crosses has no data limits.
        ax.set_xlim(min(sizes) / 1.5, max(sizes) * 1.5)
        ticks = sorted(set(sizes))
        ax.set_xticks(ticks, [fmt_size(t).replace(" ", "") for t in ticks], fontsize=7, rotation=45)
        ax.minorticks_off()
    ax.set_xlabel("message size (bytes, log)")


def bandwidth_figure(rows: pd.DataFrame, runs: pd.DataFrame, refs: TestbedRefs | None) -> Chart | NotDrawn:
    """Message-size sweep: bandwidth and message rate vs size, one line per QP count."""
    sub = rows[rows["metric"].isin(("bw", "msg_rate"))]
    ok = ok_rows(sub)
    if ok[ok["metric"] == "bw"].empty:
        return NotDrawn("msgsize_sweep_bw", why_empty(sub[sub["metric"] == "bw"], "message-size bandwidth"))
    fig, axes = new_fig(ncols=2, w=10.0)
    table = []
    for ax, metric, ylabel in ((axes[0][0], "bw", "bandwidth"), (axes[0][1], "msg_rate", "message rate")):
        ser = _series(ok, metric)
        units = sorted(set(ok[ok["metric"] == metric]["unit"]))
        unit = units[0] if units else ""
        colors = series_colors(len(ser), raw=True)
        for k, (q, g) in enumerate(ser.items()):
            xs, sps = _by_size(g, lambda r: convert(float(r["value"]), r["unit"], unit))
            # the median of each size's repetitions, whiskers from its lowest to its highest run
            ax.errorbar(xs, [sp["median"] for sp in sps], yerr=yerr(sps), marker=MARKERS[k % len(MARKERS)],
                        color=colors[k], capsize=3, label=f"QP {fmt_number(q)}")
        _size_axis(ax, ok["size_bytes"])
        ax.set_ylabel(f"{ylabel} ({unit})" if unit else ylabel)
        if not ser:
            ax.text(0.5, 0.5, f"no {metric} rows", ha="center", va="center", transform=ax.transAxes)
        else:
            ax.legend(fontsize=8)
            ax.set_ylim(bottom=0)
    for _, r in sub.sort_values(["qps", "size_bytes", "metric"]).iterrows():
        table.append({"QPs": r["qps"], "size": fmt_size(r["size_bytes"]), "metric": r["metric"],
                      **dict(zip(("value", "unit"), display(r["value"], r["unit"]) if r["status"] == "ok"
                                 else (r["status"], r["unit"]))),
                      "verdict": r.get("verdict") or "unchecked",
                      "limited by": r.get("limited_by") or "—", "run": r["run_id"]})
    return Chart("msgsize_sweep_bw", "Message-size sweep: bandwidth and message rate, QP 1 vs QP 4 "
                 "(medians of the repetitions, lowest to highest run as whiskers)",
                 fig, table, meta_block(ok, runs))


def counters_figure(rows: pd.DataFrame, runs: pd.DataFrame, refs: TestbedRefs | None) -> Chart | NotDrawn:
    """Message-size sweep: perf stat counters vs size; missing counters drawn as missing."""
    sub = rows[rows["metric"].isin(list(COUNTERS))]
    ok = ok_rows(sub)
    if ok.empty:
        return NotDrawn("msgsize_sweep_counters", why_empty(sub, "perf stat counter"))
    fig, axes = new_fig(ncols=3, nrows=2, w=11.0, h=6.0)
    flat = [a for row in axes for a in row]
    for ax, (metric, label) in zip(flat, COUNTERS.items()):
        m = sub[sub["metric"] == metric]
        ser = _series(m, metric)
        colors = series_colors(len(ser), raw=True)
        for k, (q, g) in enumerate(ser.items()):
            good = g[(g["status"] == "ok") & g["value"].notna()]
            xs, sps = _by_size(good, lambda r: float(r["value"]))
            line = ax.plot(xs, [sp["median"] for sp in sps], marker=MARKERS[k % len(MARKERS)], color=colors[k], label=f"QP {fmt_number(q)}")
            missing = g[~g.index.isin(good.index)]
            if not missing.empty:
                # Missing is not zero: mark where a value should be, at the axis floor, hollow.
                trans = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
                color = line[0].get_color() if line else "grey"
                ax.scatter(missing["size_bytes"].astype(float), [0.04] * len(missing), transform=trans,
                           marker="x", color=color, label=f"QP {fmt_number(q)} missing")
        if m.empty:
            ax.text(0.5, 0.5, "no rows", ha="center", va="center", transform=ax.transAxes)
        elif m[(m["status"] == "ok") & m["value"].notna()].empty:
            st = sorted(set(m["status"]))
            ax.text(0.5, 0.5, f"{'/'.join(st)}\n(no values; x = missing point)", ha="center",
                    va="center", transform=ax.transAxes, fontsize=8)
            ax.set_yticks([])  # no scale to show: a 0 tick would read as a measured zero
        _size_axis(ax, sub["size_bytes"])
        if metric in INTEGER_COUNTERS:
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(label, fontsize=9)
        ax.legend(fontsize=6)
    flat[-1].axis("off")
    table = []
    for (q, size), g in sub.groupby(["qps", "size_bytes"], dropna=False, sort=True):
        rec: dict[str, Any] = {"QPs": q, "size": fmt_size(size)}
        for metric in COUNTERS:
            mm = g[g["metric"] == metric]
            if mm.empty:
                rec[metric] = "—"
            elif mm.iloc[0]["status"] != "ok":
                rec[metric] = mm.iloc[0]["status"]
            else:
                rec[metric] = mm.iloc[0]["value"]
        rec["run"] = ",".join(dict.fromkeys(g["run_id"]))
        table.append(rec)
    notes = []
    for (metric, st, reason), _ in sub[sub["status"] != "ok"].groupby(
            ["metric", "status", sub["reason"].fillna("")], dropna=False):
        notes.append(f"{metric}: {st} — {reason or 'no reason given'} (drawn as missing, not zero)")
    return Chart("msgsize_sweep_counters", "Message-size sweep: perf stat counters vs size", fig, table,
                 meta_block(ok, runs), notes)


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


class MsgsizeSweep(Scenario):
    """The msgsize_sweep scenario's report."""

    figures = {"msgsize_sweep_bw": bandwidth_figure, "msgsize_sweep_counters": counters_figure}

    def tables(self, sub: pd.DataFrame, limits: Limits) -> list[Table]:
        """Every point (the columns the sweep has), then the lowest QP count against the highest."""
        out = []
        full = []
        for (q, size), g in sub.groupby(["qps", "size_bytes"], dropna=False, sort=True):
            rec = {"QPs": fmt_number(q), "msg_size": fmt_size(size)}
            for metric, (col, _) in SWEEP_COLUMNS.items():
                rec[col] = _cell(_sweep_value(g, metric))
            rec["run"] = ", ".join(dict.fromkeys(g["run_id"]))
            full.append(rec)
        shown = [c for c, _ in SWEEP_COLUMNS.values() if any(r[c] != "—" for r in full)]
        full = [{k: v for k, v in r.items() if k in ("QPs", "msg_size", "run") or k in shown} for r in full]
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

    def conclusions(self, sub: pd.DataFrame, limits: Limits) -> list[Conclusion]:
        """Per QP count (3 sizes or more): where the bandwidth peaks (only where the peak's runs are all above
        the next size's: else within the spread), or that it has no sweet spot; medians of the repetitions."""
        out = []
        ok = ok_rows(sub)
        sweep = ok[ok["metric"] == "bw"]
        for q, g in sweep.groupby("qps", sort=True):
            pts = [(sp, r["size_bytes"], runs) for r, sp, runs in
                   by_point(g, lambda r: convert(float(r["value"]), str(r["unit"]), "Gbit/s"))]
            if len(pts) < 3:
                continue
            pts.sort(key=lambda p: p[0]["median"], reverse=True)
            hi, runner, lo = pts[0], pts[1], pts[-1]
            top, low = hi[0]["median"], lo[0]["median"]
            if not top:
                continue
            if (top - low) / top < NO_SWEET_SPOT:
                out.append(Conclusion(
                    f"Message-size sweep, QP {fmt_number(q)}: no sweet spot; bandwidth spans "
                    f"{fmt_number(low)}–{fmt_number(top)} Gb/s over {len(pts)} sizes (medians), "
                    f"a spread of {100 * (top - low) / top:.1f}%.", hi[2] + lo[2]))
                continue
            # the peak against the lowest as the ratio it is (16.34 against 0.83 Gb/s is 20 ×, not "95 %
            # above": that was the spread over the peak, read as a rise)
            times = f"{top / low:.1f} × its lowest" if low > 0 else "where nothing moved at its lowest"
            lowest = f"({fmt_size(lo[1])}, {fmt_number(low)} Gb/s)"
            if apart(hi[0], runner[0]):
                out.append(Conclusion(
                    f"Message-size sweep, QP {fmt_number(q)}: peaks at {fmt_size(hi[1])} "
                    f"({fmt_number(top)} Gb/s, {range_text(hi[0])}), {times} {lowest}.", hi[2] + lo[2]))
            else:
                out.append(Conclusion(
                    f"Message-size sweep, QP {fmt_number(q)}: highest at {fmt_size(hi[1])} "
                    f"({spread_text(hi[0])} Gb/s), within the spread of {fmt_size(runner[1])} "
                    f"({spread_text(runner[0])} Gb/s), so no one size is the peak; {times} {lowest}.",
                    hi[2] + runner[2] + lo[2]))
        return out
