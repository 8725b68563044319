"""Charts and Markdown tables per testbed, drawn only from tidy (or reference) data.

One function per chart; each takes the testbed's rows (with verdicts) and runs
and returns either a :class:`Chart` (figure + table + meta block) or the reason
it is not drawn. :func:`make_charts` writes them under ``<out>/<testbed>/``.
No measured number lives here: every value comes from the rows.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.transforms as mtransforms  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
import pandas as pd  # noqa: E402

from peercache import atomic
from peercache.lab.analysis import collect  # noqa: E402
from peercache.lab.analysis import markup  # noqa: E402
from peercache.lab.analysis.format import (display, fmt_number, fmt_size, limit_text, markdown_table,  # noqa: E402
                                           point_label, present, rate_text, short_devices, why_empty)
from peercache.lab.analysis.metablock import meta_block  # noqa: E402
from peercache.lab.analysis.rawlimit import (BW_METRICS, RAW_TOOLS, raw_for,  # noqa: E402
                                             raw_limits, why_none)
from peercache.lab.pipeline import experiments  # noqa: E402
from peercache.lab.analysis.references import (TestbedRefs, apply_verdicts, convert, line_capacity_bps,  # noqa: E402
                                               row_extra)

#: Scenarios in drawing order: the scenario file's order (experiments/scenarios.yaml), read once.
SCENARIOS = experiments.scenario_names()
#: Raw is grey and PeerCache blue in every figure (and the report's tables say which is which).
RAW_COLOR, PEERCACHE_COLOR, OVER_COLOR = "#7f7f7f", "#1f77b4", "#d62728"
#: perf stat counters drawn against message size: metric -> label.
COUNTERS = {"ipc": "IPC", "l1_dcache_load_misses": "L1-dcache load misses",
            "llc_load_misses": "LLC load misses", "context_switches": "context switches",
            "cpu_migrations": "CPU migrations"}
#: Counters that count whole events: their axes get integer ticks.
INTEGER_COUNTERS = ("l1_dcache_load_misses", "llc_load_misses", "context_switches", "cpu_migrations")
FORMATS = ("png", "svg")
_OWNED_SUFFIXES = (".png", ".svg", ".md")


@dataclass
class Chart:
    """One drawn chart: its figure, Markdown table and the meta block beside it."""

    name: str
    title: str
    fig: Any
    table: list[dict[str, Any]]
    meta: list[str]
    notes: list[str] = field(default_factory=list)
    caption: str = ""           #: what limited the figures (attribution), shown under the plot


@dataclass
class NotDrawn:
    """A chart that was not drawn, and why."""

    name: str
    reason: str


# --- chart builders -------------------------------------------------------------

def _ok(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[(rows["status"] == "ok") & rows["value"].notna()]


def _to_gbs(row: pd.Series | dict) -> float:
    return convert(float(row["value"]), str(row["unit"]), "GB/s")


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


def _verdict(r: dict) -> str:
    return r.get("verdict") or "unchecked"


def _new_fig(ncols: int = 1, nrows: int = 1, w: float = 7.0, h: float = 4.2):
    fig, axes = plt.subplots(nrows, ncols, figsize=(w, h), squeeze=False)
    return fig, axes


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


def series_colors(n: int, raw: bool) -> list:
    """n colours for the lines of one figure: shades of grey for raw tools, of blue for PeerCache."""
    cmap = plt.get_cmap("Greys" if raw else "Blues")
    return [cmap(0.45 + 0.5 * i / max(1, n - 1)) for i in range(n)] if n > 1 else [RAW_COLOR if raw
                                                                                  else PEERCACHE_COLOR]


MARKERS = ("o", "s", "^", "D", "v", "P")


def _drawable(line: str) -> str:
    # The default fonts have no CJK glyphs; the published titles are Chinese.
    # The image keeps the ASCII part; the .md beside it keeps the full text.
    out = "".join(c if ord(c) < 0x2E80 else " " for c in line)
    return " ".join(out.split())


def judge(rows: pd.DataFrame, runs: pd.DataFrame, refs: dict[str, TestbedRefs], testbed: str) -> pd.DataFrame:
    """Rows with their verdict (references) and what limited them (attribution rules), for every view."""
    from peercache.lab.analysis import attribution

    rows = apply_verdicts(rows, refs)
    tb = refs.get(testbed)
    limits = raw_limits(rows)

    rows = attribution.attribute(rows, runs, lambda r: raw_for(r, limits),
                                 line_rate_of=(lambda r: line_capacity_bps(r, tb)) if tb
                                 else (lambda r: None))
    # A value above the line rate is a measurement error first: that verdict stays.
    above = (rows["limit"] == "above_raw") & (rows["verdict"] != "above_line_rate")
    rows.loc[above, "verdict"] = "above_raw"
    rows.loc[above, "verdict_reason"] = rows.loc[above, "limited_by"]
    return rows


def rail_shares_text(rows: pd.DataFrame, run_ids, threads: Any = None) -> str | None:
    """Each rail's share of the bytes ("rxe_b0 52 %, rxe_b1 48 %": collect's ok ``rail_share`` rows of
    ``run_ids``, at ``threads`` when given; the mean where several runs have it), or None where there are
    none (no rails: tcp and shm; or no metrics scrapes), so a table says nothing of rails rather than 0 %."""
    if "metric" not in rows:
        return None
    sub = rows[(rows["metric"] == "rail_share") & (rows["status"] == "ok") & rows["value"].notna()
               & rows["run_id"].isin(list(run_ids))]
    if threads is not None and not pd.isna(threads):
        sub = sub[sub["threads"] == threads]
    if sub.empty:
        return None
    means = sub.groupby("devices", sort=True)["value"].mean()
    return ", ".join(f"{rail} {100 * v:.0f} %" for rail, v in means.items())


def chart_single_nic(rows: pd.DataFrame, runs: pd.DataFrame, refs: TestbedRefs | None) -> Chart | NotDrawn:
    """Single NIC: PeerCache vs the raw perftest figure, with the percentage."""
    sub = rows[rows["metric"].isin(BW_METRICS)]
    ok = _ok(sub)
    if ok.empty:
        return NotDrawn("single_nic", why_empty(sub, "single-NIC bandwidth"))
    # protocol keeps PeerCache over tcp and over shm apart (each has its own raw limit)
    keys = ["tool", "protocol", "size_bytes", "qps", "threads", "processes", "layout"]
    groups = []
    for _, g in ok.groupby(keys, dropna=False, sort=False):
        r = g.iloc[0].to_dict()
        groups.append((r, g))
    limits = raw_limits(ok)
    fig, axes = _new_fig(w=max(7.0, 1.3 * len(groups)))
    ax = axes[0][0]
    table, labels, heights, colors = [], [], [], []
    for r, g in groups:
        gbs = sum(_to_gbs(v) for _, v in g.iterrows()) / len(g)
        is_raw = r["tool"] in RAW_TOOLS
        raw = None if is_raw else raw_for(r, limits)
        pct = None if raw is None or not raw.gbs else 100.0 * gbs / raw.gbs  # no (or a zero) raw figure: no %
        labels.append(bar_label(r))
        heights.append(gbs)
        colors.append(RAW_COLOR if is_raw else PEERCACHE_COLOR)
        value, unit = display(g["value"].mean(), r["unit"])
        table.append({"measurement": measurement(r), "value": value, "unit": unit, "n": len(g),
                      "% of raw": "—" if pct is None else f"{pct:.1f}%",
                      "raw limit": "—" if is_raw else (raw.label if raw else "none: " + why_none(r, limits)),
                      "verdict": ",".join(sorted(set(g["verdict"]))) if "verdict" in g else "unchecked",
                      "limited by": limit_text(g), "run": ",".join(dict.fromkeys(g["run_id"]))})
    bars = ax.bar(range(len(heights)), heights, color=colors)
    for b, t, h in zip(bars, table, heights):
        ax.annotate(f"{h:.3g} GB/s\n{t['% of raw'].replace('.0%', '%')} of raw" if t["% of raw"] != "—"
                    else f"{h:.3g} GB/s", (b.get_x() + b.get_width() / 2, h), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel("GET / read throughput (GB/s)")
    ax.set_ylim(0, max(heights) * 1.3)
    _raw_legend(ax)
    notes = []
    for r, _ in groups:
        if r["tool"] not in RAW_TOOLS and raw_for(r, limits) is None:
            notes.append(f"{measurement(r)}: no percentage: {why_none(r, limits)}")
    return Chart("single_nic", "Single NIC: PeerCache vs the raw limit", fig, table,
                 meta_block(ok, runs), list(dict.fromkeys(notes)))


def _raw_legend(ax) -> None:
    """The legend saying which colour is raw and which PeerCache (every figure uses the same two)."""
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color=RAW_COLOR, label="raw tool"), Patch(color=PEERCACHE_COLOR, label="PeerCache")],
              fontsize=7, loc="upper right")


def bar_label(r) -> str:
    """A short bar label: the tool (or PeerCache and its transport) and the connections; knobs go in the table."""
    from peercache.lab.analysis.rawlimit import point_shape, raw_shape
    if r["tool"] in RAW_TOOLS:
        conns = raw_shape(r)[1]
        return r["tool"] + (f"\n{conns} conn." if r["tool"] == "iperf3" else
                            f"\n{conns} thr" if conns and r["tool"] == "memcpy" else "")
    conns = point_shape(r)[1]
    return f"PeerCache\n{r.get('protocol') or '?'}" + (f", {conns} conn." if conns and r.get("protocol") == "tcp" else "")


def measurement(r) -> str:
    """What a single-NIC bar measured, with every knob (the table's first column)."""
    from peercache.lab.analysis.rawlimit import raw_shape
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


def chart_multi_rail(rows: pd.DataFrame, runs: pd.DataFrame, refs: TestbedRefs | None) -> Chart | NotDrawn:
    """Multi-rail: GB/s vs threads, one line per page size and batch."""
    sub = rows[rows["metric"].isin(BW_METRICS)]
    ok = _ok(sub)
    ok = ok[ok["threads"].notna()]
    if ok.empty:
        return NotDrawn("multi_rail", why_empty(sub, "multi-rail bandwidth (with threads)"))
    fig, axes = _new_fig()
    ax = axes[0][0]
    table = []
    series = list(ok.groupby(["size_bytes", "batch"], dropna=False, sort=True))
    colors = series_colors(len(series), raw=False)
    for k, ((size, batch), g) in enumerate(series):
        pts = g.groupby("threads", sort=True)
        xs, ys = [], []
        for thr, gg in pts:
            gbs = sum(_to_gbs(v) for _, v in gg.iterrows()) / len(gg)
            xs.append(int(thr))
            ys.append(gbs)
            stat = {row_extra(v).get("statistic") for _, v in gg.iterrows()} - {None}
            table.append({"page size": fmt_size(size), "batch": batch, "threads": int(thr),
                          **dict(zip(("value", "unit"), display(gg["value"].mean(), gg["unit"].iloc[0]))),
                          "n": len(gg),
                          "statistic": ",".join(sorted(stat)) or "—",
                          "verdict": ",".join(sorted(set(gg["verdict"]))) if "verdict" in gg else "unchecked",
                          "limited by": limit_text(gg),
                          # rails only where rows have them (rdma with metrics scrapes)
                          **_shares_column(rail_shares_text(rows, gg["run_id"], thr)),
                          "run": ",".join(dict.fromkeys(gg["run_id"]))})
        peak_only = all(row_extra(v).get("statistic") == "peak" for _, v in g.iterrows())
        label = f"{fmt_size(size)}, batch {fmt_number(batch)}" + (" (peak only)" if peak_only else "")
        ax.plot(xs, ys, marker=MARKERS[k % len(MARKERS)], color=colors[k], label=label)
    threads = sorted({int(t) for t in ok["threads"]})
    ax.set_xticks(threads, [str(t) for t in threads])   # threads are whole: no 1.5-thread ticks
    ax.set_xlabel("threads (concurrency)")
    ax.set_ylabel("GET throughput (GB/s)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    return Chart("multi_rail", "Multi-rail, one process: GB/s vs threads", fig, table, meta_block(ok, runs))


def chart_whole_machine(rows: pd.DataFrame, runs: pd.DataFrame, refs: TestbedRefs | None) -> Chart | NotDrawn:
    """Whole machine: per-NIC bars, the aggregate, and each NIC's line rate (and each rail's share of the
    bytes where the metrics scrapes give it)."""
    sub = rows[rows["metric"].isin(BW_METRICS)]
    ok = _ok(sub)
    per = ok[ok["side"] == "per_device"]
    agg = ok[ok["side"] == "aggregate"]
    if per.empty and agg.empty:
        return NotDrawn("whole_machine", why_empty(sub, "per-NIC or aggregate bandwidth"))
    fig, axes = _new_fig(ncols=2, w=9.0)
    ax, axa = axes[0][0], axes[0][1]
    table = []
    notes = []

    def draw(ax, frame, label_of):
        for i, (_, r) in enumerate(frame.iterrows()):
            gbs = _to_gbs(r)
            cap = line_capacity_bps(r, refs) if refs is not None else None
            over = cap is not None and gbs * 8e9 > cap
            ax.bar(i, gbs, color=OVER_COLOR if over else PEERCACHE_COLOR)
            ax.annotate(f"{gbs:.1f}", (i, gbs), ha="center", va="bottom", fontsize=7)
            if cap is not None:
                ax.hlines(cap / 8e9, i - 0.45, i + 0.45, colors="black", linestyles="--", linewidth=1)
            table.append({"NIC / figure": label_of(r), **dict(zip(("value", "unit"), display(r["value"], r["unit"]))),
                          "line rate (GB/s)": "unknown" if cap is None else fmt_number(cap / 8e9),
                          "verdict": r.get("verdict") or "unchecked", "limited by": r.get("limited_by") or "—",
                          # the aggregate: every rail's share (its groups' NICs); a NIC's row: its own
                          **_shares_column(rail_shares_text(rows, [r["run_id"]]),
                                           None if r["side"] == "aggregate" else str(r["devices"])),
                          "run": r["run_id"]})
        ax.set_xticks(range(len(frame)), [label_of(r) for _, r in frame.iterrows()], fontsize=7,
                      rotation=30, ha="right")
        ax.set_ylim(bottom=0)

    def per_label(r):
        st = row_extra(r).get("statistic")
        n = len([d for d in str(r["devices"]).split(",") if d])
        return f"{st} of {n} NICs" if st else (r["devices"] or "NIC ?")

    if not per.empty:
        draw(ax, per, per_label)
        ax.set_title("per NIC (dashed: NIC line rate)", fontsize=9)
        ax.set_ylabel("GET throughput (GB/s)")
        if all(row_extra(r).get("statistic") for _, r in per.iterrows()):
            notes.append("only summary statistics of the per-NIC figures are in the data; "
                         "bars are those statistics, not individual NICs")
    else:
        ax.text(0.5, 0.5, "no per-NIC rows", ha="center", va="center", transform=ax.transAxes)
    if not agg.empty:
        draw(axa, agg, lambda r: f"aggregate {short_devices(r['devices'])}")
        axa.set_title("aggregate (dashed: sum of line rates)", fontsize=9)
    else:
        axa.text(0.5, 0.5, "no aggregate row", ha="center", va="center", transform=axa.transAxes)
    if refs is None or not refs.line_rate:
        notes.append("line rate unknown (no references for this testbed): not marked")
    if any(t["verdict"] == "above_line_rate" for t in table):
        notes.append("red bars exceed the physical line rate of their NICs (verdict above_line_rate)")
    return Chart("whole_machine", "Whole machine: per-NIC and aggregate GET throughput", fig, table,
                 meta_block(ok, runs), notes)


def _shares_column(shares: str | None, device: str | None = None) -> dict[str, str]:
    """A table's "rail shares of bytes" cell ({} without rails): every rail's, or ``device``'s own part
    ("rxe_b0 52 %") of :func:`rail_shares_text`'s list."""
    if not shares:
        return {}
    if device is not None:
        shares = next((p for p in shares.split(", ") if p.rsplit(" ", 2)[0] == device), "—")
    return {"rail shares of bytes": shares}


def chart_gpudirect(rows: pd.DataFrame, runs: pd.DataFrame, refs: TestbedRefs | None) -> Chart | NotDrawn:
    """GPUDirect: GPU vs host destination."""
    sub = rows[rows["metric"].isin(BW_METRICS)]
    ok = _ok(sub)
    if ok.empty:
        return NotDrawn("gpudirect", why_empty(sub, "GPUDirect bandwidth"))
    fig, axes = _new_fig(w=5.5)
    ax = axes[0][0]
    table, labels = [], []
    for i, (_, r) in enumerate(ok.iterrows()):
        dest = row_extra(r).get("destination") or "destination not recorded"
        gbs = _to_gbs(r)
        ax.bar(i, gbs, color=PEERCACHE_COLOR, hatch="//" if dest == "gpu" else None)
        ax.annotate(f"{gbs:.1f} GB/s", (i, gbs), ha="center", va="bottom", fontsize=8)
        labels.append(f"{dest}\n{point_label(r, ['size_bytes', 'processes'])}")
        table.append({"destination": dest, **dict(zip(("value", "unit"), display(r["value"], r["unit"]))),
                      "page size": fmt_size(r["size_bytes"]), "verdict": r.get("verdict") or "unchecked",
                      "limited by": r.get("limited_by") or "—", "run": r["run_id"]})
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel("GET throughput (GB/s)")
    ax.set_ylim(bottom=0)
    return Chart("gpudirect", "GPUDirect RDMA: GPU vs host destination", fig, table, meta_block(ok, runs))


def _series(frame: pd.DataFrame, metric: str) -> dict[Any, pd.DataFrame]:
    f = frame[frame["metric"] == metric]
    return {q: g.sort_values("size_bytes") for q, g in f.groupby("qps", dropna=False, sort=True)}


def _size_axis(ax, sizes: pd.Series) -> None:
    sizes = [float(v) for v in sizes if present(v) and float(v) > 0]
    ax.set_xscale("log", base=2)
    if sizes:
        # Set limits from the data: an axis whose only marks are "missing" crosses has no data limits.
        ax.set_xlim(min(sizes) / 1.5, max(sizes) * 1.5)
        ticks = sorted(set(sizes))
        ax.set_xticks(ticks, [fmt_size(t).replace(" ", "") for t in ticks], fontsize=7, rotation=45)
        ax.minorticks_off()
    ax.set_xlabel("message size (bytes, log)")


def chart_msgsize_bw(rows: pd.DataFrame, runs: pd.DataFrame, refs: TestbedRefs | None) -> Chart | NotDrawn:
    """Message-size sweep: bandwidth and message rate vs size, one line per QP count."""
    sub = rows[rows["metric"].isin(("bw", "msg_rate"))]
    ok = _ok(sub)
    if ok[ok["metric"] == "bw"].empty:
        return NotDrawn("msgsize_sweep_bw", why_empty(sub[sub["metric"] == "bw"], "message-size bandwidth"))
    fig, axes = _new_fig(ncols=2, w=10.0)
    table = []
    for ax, metric, ylabel in ((axes[0][0], "bw", "bandwidth"), (axes[0][1], "msg_rate", "message rate")):
        ser = _series(ok, metric)
        units = sorted(set(ok[ok["metric"] == metric]["unit"]))
        unit = units[0] if units else ""
        colors = series_colors(len(ser), raw=True)
        for k, (q, g) in enumerate(ser.items()):
            ys = [convert(float(v), u, unit) for v, u in zip(g["value"], g["unit"])]
            ax.plot(g["size_bytes"].astype(float), ys, marker=MARKERS[k % len(MARKERS)], color=colors[k],
                    label=f"QP {fmt_number(q)}")
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
    return Chart("msgsize_sweep_bw", "Message-size sweep: bandwidth and message rate, QP 1 vs QP 4",
                 fig, table, meta_block(ok, runs))


def chart_msgsize_counters(rows: pd.DataFrame, runs: pd.DataFrame, refs: TestbedRefs | None) -> Chart | NotDrawn:
    """Message-size sweep: perf stat counters vs size; missing counters drawn as missing."""
    sub = rows[rows["metric"].isin(list(COUNTERS))]
    ok = _ok(sub)
    if ok.empty:
        return NotDrawn("msgsize_sweep_counters", why_empty(sub, "perf stat counter"))
    fig, axes = _new_fig(ncols=3, nrows=2, w=11.0, h=6.0)
    flat = [a for row in axes for a in row]
    for ax, (metric, label) in zip(flat, COUNTERS.items()):
        m = sub[sub["metric"] == metric]
        ser = _series(m, metric)
        colors = series_colors(len(ser), raw=True)
        for k, (q, g) in enumerate(ser.items()):
            good = g[(g["status"] == "ok") & g["value"].notna()]
            line = ax.plot(good["size_bytes"].astype(float), good["value"], marker=MARKERS[k % len(MARKERS)],
                           color=colors[k], label=f"QP {fmt_number(q)}")
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


#: scenario -> chart builders for that scenario's rows (a scenario without builders draws nothing;
#: tests check every key is a scenario of the scenario file).
def chart_engines(rows: pd.DataFrame, runs: pd.DataFrame, refs: TestbedRefs | None) -> Chart | NotDrawn:
    """Engines side by side: GB/s of PeerCache, the other engines and the cell's raw limit, per page size and
    threads (the table: % of raw, p50/p99, limited by, verification; :mod:`peercache.lab.analysis.engines`)."""
    from peercache.lab.analysis import engines
    recs = engines.table(rows)
    if not recs:
        return NotDrawn("engines", why_empty(rows[rows["metric"].isin(BW_METRICS)], "engine throughput"))
    cells = list(dict.fromkeys((r["page"], r["threads"]) for r in recs))
    names = [*engines.ENGINES.values(), "raw limit"]
    names = [n for n in names if any(r["engine"] == n for r in recs)]
    fig, axes = _new_fig(w=max(7.0, 1.2 * len(cells) * len(names) / 2))
    ax = axes[0][0]
    width = 0.8 / len(names)
    # PeerCache in its colour everywhere, each other engine in one of its own, the limit grey
    colors = dict(zip(engines.ENGINES.values(), (PEERCACHE_COLOR, "#ff7f0e", "#9467bd", "#2ca02c"), strict=True),
                  **{"raw limit": RAW_COLOR})
    for k, n in enumerate(names):
        xs, ys = [], []
        for i, cell in enumerate(cells):
            got = [r for r in recs if (r["page"], r["threads"]) == cell and r["engine"] == n]
            if got:
                xs.append(i + (k - (len(names) - 1) / 2) * width)
                ys.append(got[0]["GB/s"])
        ax.bar(xs, ys, width, label=n, color=colors[n])
        for x, y in zip(xs, ys):
            ax.annotate(f"{y:.3g}", (x, y), ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(cells)), [f"{fmt_size(p)}\n{t} thr" for p, t in cells], fontsize=8)
    ax.set_ylabel("read throughput (GB/s)")
    ax.legend(fontsize=7, loc="upper left")
    table = [{"page": fmt_size(r["page"]), "threads": r["threads"], "engine": r["engine"],
              "GB/s": fmt_number(r["GB/s"]), "% of raw": "—" if r["% of raw"] is None else f"{r['% of raw']:.0f}%",
              "p50": r["p50"], "p99": r["p99"], "limited by": r["limited by"], "verification": r["verification"],
              "raw limit": r["raw limit"], "run": r["run"]} for r in recs]
    ok = rows[(rows["status"] == "ok") & rows["value"].notna()]
    return Chart("engines", "Engines side by side: PeerCache, Mooncake TE, NIXL, PeerCache 0.8.4 and the raw limit",
                 fig, table, meta_block(ok, runs), engines.skipped(rows))


def chart_hicache_suite(rows: pd.DataFrame, runs: pd.DataFrame, refs: TestbedRefs | None) -> Chart | NotDrawn:
    """The HiCache suite: pages/s against the threads calling the store, one panel per op (get, set, exists),
    one line per run (layout), its PEAK starred (the table: tokens/s, GB/s, p50/p99/p999, limited by;
    :mod:`peercache.lab.analysis.hicache_suite`)."""
    from peercache.lab.analysis import hicache_suite as hs
    sub = hs.suite_rows(rows)
    head = _ok(sub[sub["metric"] == hs.PRIMARY])
    if head.empty:
        return NotDrawn("hicache_suite", why_empty(sub[sub["metric"] == hs.PRIMARY], "HiCache suite pages/s"))
    ops = [o for o in hs.OPS if (head["op"] == o).any()]
    fig, axes = _new_fig(ncols=len(ops), w=3.2 * len(ops) + 0.6, h=3.6)
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
        ax.set_title(f"{op} ({hs.CALLS[op]})", fontsize=9)
        ax.set_xlabel("threads calling the store")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        lo, hi = head["threads"].min(), head["threads"].max()
        ax.set_xlim(lo - 0.35 * max(1, hi - lo), hi + 0.35 * max(1, hi - lo))
        ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.18)
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: rate_text(v)))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("pages/s (one SGLang page each)")
    layout = dict(zip(head["run_id"], head["layout"]))
    table = [{"layout": layout.get(rid, "—"), **rec, "run": rid} for rid, _, recs in hs.sweeps(rows) for rec in recs]
    return Chart("hicache_suite", "HiCache suite: PeerCacheStore as SGLang's cache controller calls it, pages/s by op "
                 "and threads, per layout (★ = the op's PEAK)", fig, table, meta_block(_ok(sub), runs), hs.not_measured(rows))


BUILDERS: dict[str, tuple[Callable, ...]] = {
    "single_nic": (chart_single_nic,),
    "multi_rail": (chart_multi_rail,),
    "whole_machine": (chart_whole_machine,),
    "gpudirect": (chart_gpudirect,),
    "msgsize_sweep": (chart_msgsize_bw, chart_msgsize_counters),
    "engines": (chart_engines,),
    "hicache": (chart_hicache_suite,),
}


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
    """The charts of one scenario from that scenario's rows."""
    out: list[Chart | NotDrawn] = []
    for builder in BUILDERS.get(scenario, ()):
        name = builder.__name__.removeprefix("chart_").replace("msgsize_", "msgsize_sweep_")
        if rows.empty:
            out.append(NotDrawn(name, f"no rows for scenario {scenario}"))
            continue
        chart = builder(rows, runs, refs)
        if isinstance(chart, Chart):
            chart.notes += _extra_notes(rows)
            limits = list(dict.fromkeys(t["limited by"] for t in chart.table
                                        if t.get("limited by") not in (None, "", "—")))
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
