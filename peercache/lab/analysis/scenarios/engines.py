"""The ``engines`` scenario side by side: PeerCache, the other engines and the raw limit, cell by cell.

A cell is one page size and one number of reader threads. Every engine in a cell is compared with the
same raw limit: the iperf3 run of the engines scenario (or, where it has none of that shape and the rows
given hold the same run's single_nic scenario, of that one) whose shape is the PeerCache point's of that
cell (:mod:`peercache.lab.analysis.rawlimit`: connections, request size and bytes in flight, from drive's
``tcp_wire``), i.e. what the path gives when it is driven the way PeerCache drives it. The other engines
say nothing of how they move a batch, so the cell's limit is theirs too; where the cell has no PeerCache
point or no raw run of its shape there is no percentage, and the table says why. :func:`table` and
:func:`skipped` are pure (rows in, records out); the figure, the report's table and the overview rows
are drawn from them.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from peercache.lab.analysis import collect
from peercache.lab.analysis.format import fmt_number, fmt_size, short_run, throughput_text, why_empty
from peercache.lab.analysis.metablock import meta_block
from peercache.lab.analysis.rawlimit import (BW_METRICS, RAW_TOOLS, RawLimit, pct_text, raw_for, scenario_limits,
                                             why_none)
from peercache.lab.analysis.references import TestbedRefs, convert, row_extra
from peercache.lab.analysis.scenarios.declare import Chart, Conclusion, Limits, NotDrawn, Scenario, Table
from peercache.lab.analysis.scenarios.draw import PEERCACHE_COLOR, RAW_COLOR, new_fig
from peercache.lab.analysis.spread import apart, range_text, spread, spread_text, yerr

SCENARIO = "engines"
#: The ``tool`` column of each engine's rows -> its name in the table, in table order.
ENGINES = {"peercache-bench": "PeerCache", "transfer_engine_bench": "Mooncake TE", "nixl_driver": "NIXL (UCX)",
           "peercache-bench==0.8.4": "PeerCache 0.8.4 (PyPI)"}
OURS = "peercache-bench"


def _ok(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[(rows["scenario"] == SCENARIO) & (rows["status"] == "ok") & rows["value"].notna()]


def _int(v: Any) -> int | None:
    return None if v is None or pd.isna(v) else int(v)


def cell_limits(rows: pd.DataFrame) -> dict[tuple[int, int], tuple[RawLimit | None, str]]:
    """(page size, threads) -> (the cell's raw limit, or None and why) from the PeerCache rows of the cell."""
    ok = _ok(rows)
    limits = scenario_limits(rows, SCENARIO)       # the attribution's rule too: one % of raw, not two
    out: dict[tuple[int, int], tuple[RawLimit | None, str]] = {}
    ours = ok[(ok["tool"] == OURS) & (ok["metric"] == "get_throughput")]
    for _, r in ours.iterrows():
        key = (_int(r["size_bytes"]), (_int(r["processes"]) or 1) * (_int(r["threads"]) or 1))
        lim = raw_for(r, limits)
        if key not in out or (lim is not None and out[key][0] is None):
            out[key] = (lim, "" if lim is not None else why_none(r, limits))
    return out


def verification(r) -> str:
    """Whether the row's bytes were checked ("verified", or "unverified" and why)."""
    ex = row_extra(r)
    if ex.get("verified") is True:
        return "verified (every page checked)"
    return ex.get("verification") or "unverified"


def _latency(ok: pd.DataFrame, run_ids, metric: str) -> str:
    lat = ok[(ok["metric"] == metric) & ok["run_id"].isin(list(run_ids))]
    if lat.empty:
        return "not reported"
    return f"{convert(float(lat['value'].mean()), str(lat['unit'].iloc[0]), 'us'):.4g} µs"


#: bytes in a GiB (CPU-seconds per GiB moved)
GIB = float(1 << 30)


def cpu_s_per_gib(r) -> dict[str, float]:
    """Each side's CPU-seconds per GiB the row moved: its CPU (cores busy over the client's middle window) over
    the row's GiB/s (pure); a side without CPU samples is left out."""
    gbs = convert(float(r["value"]), str(r["unit"]), "GB/s")
    if not gbs or gbs <= 0:
        return {}
    cpu = row_extra(r).get("cpu") or {}
    return {side: u["cores"] / (gbs * 1e9 / GIB) for side, u in cpu.items()
            if isinstance(u, dict) and u.get("cores") is not None}


def table(rows: pd.DataFrame) -> list[dict[str, Any]]:
    """One record per cell and engine (and the cell's raw limit): GB/s over the repetitions (median, min–max,
    how many), % of the cell's raw limit (of the median), and the median run's CPU-seconds per GiB on each side
    and what limited it; p50/p99 per batch call where the engine reports them, verification."""
    ok = _ok(rows)
    limits = cell_limits(rows)
    recs = []
    bw = ok[ok["metric"].isin(("get_throughput", "bw"))]
    cells = sorted({(_int(r["size_bytes"]), (_int(r["processes"]) or 1) * (_int(r["threads"]) or 1))
                    for _, r in bw[bw["tool"].isin(list(ENGINES))].iterrows()})
    for size, conns in cells:
        lim, why = limits.get((size, conns), (None, "no PeerCache point in this cell"))
        for tool, name in ENGINES.items():
            g = bw[(bw["tool"] == tool) & (bw["size_bytes"] == size)
                   & ((bw["processes"].fillna(1) * bw["threads"].fillna(1)) == conns)]
            if g.empty:
                continue
            gbs = [convert(float(v), str(u), "GB/s") for v, u in zip(g["value"], g["unit"])]
            sp = spread(gbs)
            # the median run's own row: its "limited by" was judged against the same raw limit, so its
            # percentage is the table's
            mid = g.iloc[gbs.index(sp["median"])]
            said = str(mid["limited_by"]) if "limited_by" in g and pd.notna(mid["limited_by"]) else ""
            recs.append({"page": size, "threads": conns, "engine": name, "GB/s": sp["median"], "spread": sp,
                         "% of raw": None if lim is None or not lim.gbs else 100.0 * sp["median"] / lim.gbs,
                         "lowest % of raw": None if lim is None or not lim.gbs else 100.0 * sp["min"] / lim.gbs,
                         "raw limit": lim.label if lim is not None else f"none: {why}",
                         "cpu_s_per_gib": cpu_s_per_gib(mid),
                         "p50": _latency(ok, g["run_id"], "latency_p50"),
                         "p99": _latency(ok, g["run_id"], "latency_p99"),
                         "limited by": said or "—", "verification": verification(g.iloc[0]),
                         "run": ",".join(dict.fromkeys(g["run_id"]))})
        if lim is not None:
            recs.append({"page": size, "threads": conns, "engine": "raw limit", "GB/s": lim.gbs, "% of raw": 100.0,
                         "spread": None, "cpu_s_per_gib": {},
                         "raw limit": lim.label, "p50": "—", "p99": "—", "limited by": "—", "verification": "—",
                         "run": ",".join(lim.runs)})
    return recs


def cpu_text(cpu: dict[str, float]) -> str:
    """"consumer 0.41, producer 0.22 s/GiB", or "—" without CPU samples."""
    if not cpu:
        return "—"
    return ", ".join(f"{side} {v:.3g}" for side, v in cpu.items()) + " s/GiB"


def shown(r: dict[str, Any]) -> dict[str, Any]:
    """One record as the section's table and the figure's Markdown show it."""
    return {"page": fmt_size(r["page"]), "threads": r["threads"], "engine": r["engine"],
            "GB/s": spread_text(r["spread"]) if r.get("spread") else fmt_number(r["GB/s"]),
            "% of raw": "—" if r["% of raw"] is None else pct_text(r["% of raw"], lowest=r.get("lowest % of raw")),
            "CPU per GiB": cpu_text(r.get("cpu_s_per_gib") or {}),
            "p50": r["p50"], "p99": r["p99"], "limited by": r["limited by"], "verification": r["verification"],
            "run": runs_text(r["run"])}


def runs_text(runs: str) -> str:
    """A cell's runs as cited: the first, and how many more ("local/engines/pc_…/rep0 (+2)")."""
    return short_run(runs.split(",")[0]) + (f" (+{runs.count(',')})" if "," in runs else "")


def window_method(rows: pd.DataFrame, runs: pd.DataFrame) -> str:
    """How each engine's figure was windowed, from its runs' own parameters and rows (pure): "windows: PeerCache,
    NIXL (UCX), PeerCache 0.8.4 (PyPI) 2 s after 0.5 s of warm-up; Mooncake TE 2 s, warm-up none (the tool has
    none)": the caption's statement of the method."""
    if runs is None or runs.empty or "run_id" not in runs:
        return ""
    params = {r["run_id"]: collect.run_field(r, "params") or {} for r in runs.to_dict("records")}
    ok = _ok(rows)
    said: dict[str, list[str]] = {}
    for tool, name in ENGINES.items():
        mine = ok[(ok["tool"] == tool) & ok["metric"].isin(BW_METRICS)]
        ways = set()
        for _, r in mine.iterrows():
            p = params.get(r["run_id"]) or {}
            if p.get("duration") is None:
                continue
            own = row_extra(r).get("warmup")
            warm = (f", warm-up {own}" if isinstance(own, str)
                    else f" after {fmt_number(float(p.get('warmup') or 0))} s of warm-up")
            ways.add(f"{fmt_number(float(p['duration']))} s{warm}")
        for way in sorted(ways):
            said.setdefault(way, []).append(name)
    return ("windows: " + "; ".join(f"{', '.join(names)} {way}" for way, names in said.items())) if said else ""


def skipped(rows: pd.DataFrame) -> list[str]:
    """The engines points that did not run, with why ("Mooncake TE mc_tcp_...: engine venv ... missing")."""
    sub = rows[(rows["scenario"] == SCENARIO) & rows["status"].isin(("skipped", "failed"))
               & rows["tool"].isin(list(ENGINES) + list(RAW_TOOLS))]
    out = []
    for _, r in sub.iterrows():
        name = ENGINES.get(r["tool"], r["tool"])
        out.append(f"{name} {str(r['run_id']).split('/')[-2] if '/' in str(r['run_id']) else r['run_id']}: "
                   f"{r['status']}: {r['reason']}")
    return list(dict.fromkeys(out))


def figure(rows: pd.DataFrame, runs: pd.DataFrame, refs: TestbedRefs | None) -> Chart | NotDrawn:
    """Engines side by side: GB/s of PeerCache, the other engines and the cell's raw limit, per page size and
    threads (the table: % of raw, p50/p99, limited by, verification: :func:`table`)."""
    recs = table(rows)
    if not recs:
        return NotDrawn("engines", why_empty(rows[rows["metric"].isin(BW_METRICS)], "engine throughput"))
    cells = list(dict.fromkeys((r["page"], r["threads"]) for r in recs))
    names = [*ENGINES.values(), "raw limit"]
    names = [n for n in names if any(r["engine"] == n for r in recs)]
    fig, axes = new_fig(w=max(7.0, 1.2 * len(cells) * len(names) / 2))
    ax = axes[0][0]
    width = 0.8 / len(names)
    # PeerCache in its colour everywhere, each other engine in one of its own, the limit grey
    colors = dict(zip(ENGINES.values(), (PEERCACHE_COLOR, "#ff7f0e", "#9467bd", "#2ca02c"), strict=True),
                  **{"raw limit": RAW_COLOR})
    for k, n in enumerate(names):
        xs, ys, sps = [], [], []
        for i, cell in enumerate(cells):
            got = [r for r in recs if (r["page"], r["threads"]) == cell and r["engine"] == n]
            if got:
                sp = got[0].get("spread") or {"median": got[0]["GB/s"], "min": got[0]["GB/s"], "max": got[0]["GB/s"]}
                xs.append(i + (k - (len(names) - 1) / 2) * width)
                ys.append(got[0]["GB/s"])
                sps.append(sp)
        # the bars are medians; their whiskers the lowest and highest repetition
        err = yerr(sps)
        ax.bar(xs, ys, width, label=n, color=colors[n], yerr=err if any(err[0] + err[1]) else None,
               error_kw={"elinewidth": 0.8, "capsize": 2})
        for x, y, sp in zip(xs, ys, sps):
            ax.annotate(f"{y:.3g}", (x, sp["max"]), ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(cells)), [f"{fmt_size(p)}\n{t} thr" for p, t in cells], fontsize=8)
    ax.set_ylabel("read throughput (GB/s)")
    ax.legend(fontsize=7, loc="upper left")
    table_md = [dict(shown(r), **{"raw limit": r["raw limit"], "run": r["run"]}) for r in recs]
    method = window_method(rows, runs)
    ok = rows[(rows["status"] == "ok") & rows["value"].notna()]
    return Chart("engines", "Engines side by side: PeerCache, Mooncake TE, NIXL, PeerCache 0.8.4 and the raw limit "
                 "(medians; whiskers: the lowest and highest repetition)",
                 fig, table_md, meta_block(ok, runs), ([method] if method else []) + skipped(rows))


class Engines(Scenario):
    """The engines scenario's report."""

    figures = {"engines": figure}

    def tables(self, sub: pd.DataFrame, limits: Limits) -> list[Table]:
        """Engines side by side: per page size and threads, each engine's GB/s, % of the cell's raw limit,
        p50/p99 where reported, what limited it and whether its bytes were checked."""
        recs = [shown(r) for r in table(sub) if r["engine"] != "raw limit"]
        return [("", recs)] if recs else []

    def headline(self, scenario: str, s: pd.DataFrame, rows: pd.DataFrame, limits: Limits) -> list[dict[str, Any]]:
        """The engines scenario's overview rows, from all ``rows`` (a cell's raw limit may come from
        single_nic): each engine's best cell, with its % of raw and whether its bytes were checked (the raw
        runs themselves are in the section's table)."""
        recs = [r for r in table(rows) if r["engine"] != "raw limit"]
        out = []
        for name in dict.fromkeys(r["engine"] for r in recs):
            best = max((r for r in recs if r["engine"] == name), key=lambda r: r["GB/s"])
            pct = best["% of raw"]
            cell = [r for r in recs if (r["page"], r["threads"]) == (best["page"], best["threads"])]
            cheapest = lowest_cpu(cell)
            notes = [best["verification"],
                     range_text(best["spread"]) if best.get("spread") else "",
                     f"CPU {cpu_total(best):.3g} s/GiB, both sides" if cpu_total(best) is not None else "",
                     ("the lowest CPU per GiB of this cell's engines" if cheapest is best else
                      f"{cheapest['engine']} the lowest CPU per GiB of this cell ({cpu_total(cheapest):.3g})"
                      if cheapest is not None else "")]
            out.append({"scenario": f"{SCENARIO}: {name}, best cell {fmt_size(best['page'])} "
                                    f"{best['threads']} thr",
                        "GET throughput": throughput_text(best["GB/s"]),
                        "% of single-NIC raw limit": "—" if pct is None else
                        pct_text(pct, best["raw limit"], lowest=best.get("lowest % of raw")),
                        "limited by": best["limited by"], "notes": "; ".join(n for n in notes if n),
                        "run": runs_text(best["run"])})
        return out

    def conclusions(self, sub: pd.DataFrame, limits: Limits) -> list[Conclusion]:
        """Per cell: PeerCache against each other engine, "ahead of" or "behind" only where their ranges over
        the repetitions do not overlap, else "within the spread"; and the engine with the lowest CPU per GiB."""
        recs = [r for r in table(sub) if r["engine"] != "raw limit"]
        out = []
        for cell in dict.fromkeys((r["page"], r["threads"]) for r in recs):
            mine = [r for r in recs if (r["page"], r["threads"]) == cell]
            ours = next((r for r in mine if r["engine"] == ENGINES[OURS]), None)
            if ours is None or len(mine) < 2:
                continue
            parts = [compare(ours, r) for r in mine if r is not ours]
            cheapest = lowest_cpu(mine)
            text = (f"Engines at {fmt_size(cell[0])}, {cell[1]} thread(s): {ours['engine']} "
                    f"{spread_text(ours['spread'])} GB/s is " + "; ".join(parts) + ".")
            if cheapest is not None:
                others = [r for r in mine if r is not cheapest and cpu_total(r) is not None]
                text += (f" The lowest CPU per GiB moved: {cheapest['engine']}, {cpu_total(cheapest):.3g} s/GiB on "
                         "both sides together" + (" (" + ", ".join(f"{r['engine']} {cpu_total(r):.3g}" for r in others)
                                                  + ")" if others else "") + ".")
            out.append(Conclusion(text, [run for r in mine for run in r["run"].split(",")]))
        return out


def compare(ours: dict[str, Any], other: dict[str, Any]) -> str:
    """Ours against another engine of the cell: "ahead of X: 2.5 × by medians" where our lowest run beat its
    highest, "behind X: ..." the other way, else "within the spread of X" (pure)."""
    a, b = ours["spread"], other["spread"]
    times = f"{a['median'] / b['median']:.3g} × by medians" if b["median"] > 0 else "it moved nothing"
    if apart(a, b):
        return f"ahead of {other['engine']}: {times}"
    if apart(b, a):
        return f"behind {other['engine']}: {times}"
    return f"within the spread of {other['engine']}: {times}, the ranges overlap"


def cpu_total(r: dict[str, Any]) -> float | None:
    """Both sides' CPU-seconds per GiB together (None unless both were measured)."""
    cpu = r.get("cpu_s_per_gib") or {}
    return cpu["consumer"] + cpu["producer"] if "consumer" in cpu and "producer" in cpu else None


def lowest_cpu(recs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The engine record with the lowest CPU per GiB (both sides), or None when none has both measured."""
    have = [r for r in recs if cpu_total(r) is not None]
    return min(have, key=cpu_total) if have else None
