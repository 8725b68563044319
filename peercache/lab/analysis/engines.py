"""The ``engines`` scenario side by side: PeerCache, the other engines and the raw limit, cell by cell.

A cell is one page size and one number of reader threads. Every engine in a cell is compared with the
same raw limit: the iperf3 run of the engines scenario (or, where it has none of that shape and the rows
given hold the same run's single_nic scenario, of that one) whose shape is the PeerCache point's of that
cell (:mod:`peercache.lab.analysis.rawlimit`: connections, request size and bytes in flight, from drive's
``tcp_wire``), i.e. what the path gives when it is driven the way PeerCache drives it. The other engines
say nothing of how they move a batch, so the cell's limit is theirs too; where the cell has no PeerCache
point or no raw run of its shape there is no percentage, and the table says why. Pure: rows in, records out.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from peercache.lab.analysis.rawlimit import RAW_TOOLS, RawLimit, raw_for, raw_limits, why_none
from peercache.lab.analysis.references import convert, row_extra

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
    good = rows[(rows["status"] == "ok") & rows["value"].notna()]
    limits = {**raw_limits(good), **raw_limits(good, scenario=SCENARIO)}
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


def table(rows: pd.DataFrame) -> list[dict[str, Any]]:
    """One record per cell and engine (and the cell's raw limit): GB/s (mean over repetitions), % of the
    cell's raw limit, p50/p99 per batch call where the engine reports them, limited by, verification."""
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
            gbs = sum(convert(float(v), str(u), "GB/s") for v, u in zip(g["value"], g["unit"])) / len(g)
            said = [t for t in dict.fromkeys(g["limited_by"].dropna()) if t] if "limited_by" in g else []
            recs.append({"page": size, "threads": conns, "engine": name, "GB/s": gbs,
                         "% of raw": None if lim is None or not lim.gbs else 100.0 * gbs / lim.gbs,
                         "raw limit": lim.label if lim is not None else f"none: {why}",
                         "p50": _latency(ok, g["run_id"], "latency_p50"),
                         "p99": _latency(ok, g["run_id"], "latency_p99"),
                         "limited by": " / ".join(said) or "—", "verification": verification(g.iloc[0]),
                         "run": ",".join(dict.fromkeys(g["run_id"]))})
        if lim is not None:
            recs.append({"page": size, "threads": conns, "engine": "raw limit", "GB/s": lim.gbs, "% of raw": 100.0,
                         "raw limit": lim.label, "p50": "—", "p99": "—", "limited by": "—", "verification": "—",
                         "run": ",".join(lim.runs)})
    return recs


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
