"""The repetitions of one point: their median, lowest and highest, and comparisons drawn only outside them.

A point measured several times (a scenario's ``repetitions``) is shown as its median with min–max, and a
verdict that compares two figures ("above raw", "peaks at", "falls beyond", "ahead of") is drawn only where
their ranges do not overlap; otherwise it says "within the spread". One place for that rule: every scenario's
report and the judge use these functions (pure).
"""
from __future__ import annotations

import re
from typing import Any

import pandas as pd

from peercache.lab.analysis.format import fmt_number

#: A run id's repetition suffix: ``local/single_nic/pc_tcp_p1x1_s128K_b32/rep2``.
_REP = re.compile(r"/rep\d+$")


def spread(values: list[float]) -> dict[str, Any]:
    """The median, the lowest and the highest of a point's repetitions, and how many there were (pure). The
    median is the lower middle one of an even count: always a run that was measured, so the row's other
    columns (its "limited by", its CPU) can be that run's own."""
    vals = sorted(values)
    return {"median": vals[(len(vals) - 1) // 2], "min": vals[0], "max": vals[-1], "n": len(vals)}


def spread_of(rows: pd.DataFrame, value) -> tuple[dict[str, Any], pd.Series]:
    """The :func:`spread` of ``value(row)`` over ``rows`` (one point's repetitions), and its median run's row."""
    vals = [value(r) for _, r in rows.iterrows()]
    sp = spread(vals)
    return sp, rows.iloc[vals.index(sp["median"])]


def yerr(sps: list[dict[str, Any]]) -> list[list[float]]:
    """Matplotlib's ``yerr`` of medians drawn with whiskers from each one's lowest to its highest run."""
    return [[sp["median"] - sp["min"] for sp in sps], [sp["max"] - sp["median"] for sp in sps]]


def median_note(sp: dict[str, Any], unit: str = "GB/s") -> str:
    """"median of 3 runs (1.1–1.31 GB/s)", or "measured once"."""
    if sp["n"] == 1:
        return "measured once"
    return f"median of {sp['n']} runs ({fmt_number(sp['min'])}–{fmt_number(sp['max'])} {unit})"


def range_text(sp: dict[str, Any], fmt=fmt_number) -> str:
    """"1.10–1.31, 3 runs", or "measured once"."""
    return "measured once" if sp["n"] == 1 else f"{fmt(sp['min'])}–{fmt(sp['max'])}, {sp['n']} runs"


def spread_text(sp: dict[str, Any], fmt=fmt_number) -> str:
    """"1.23 (1.10–1.31, 3 runs)", or "1.23 (measured once)"."""
    return f"{fmt(sp['median'])} ({range_text(sp, fmt)})"


def apart(high: dict[str, Any], low: dict[str, Any]) -> bool:
    """Whether ``high``'s every run is above ``low``'s every run: the ranges do not overlap."""
    return high["min"] > low["max"]


def point_of(run_id: str) -> str:
    """The point a run measured: its run id without the repetition (``…/pc_tcp_p1x1_s128K_b32``)."""
    return _REP.sub("", str(run_id))


#: Besides the point, what keeps two figures of one run apart (a per-NIC row beside the aggregate, bw beside
#: get_throughput).
FIGURE_KEYS = ("metric", "side", "devices", "threads")


def point_keys(rows: pd.DataFrame) -> list[pd.Series]:
    """What groups ``rows`` into points' figures (a ``groupby`` key): the run id less the repetition, and
    ``FIGURE_KEYS``."""
    return [rows["run_id"].map(point_of)] + [rows[k].astype(str) for k in FIGURE_KEYS if k in rows]


def by_point(rows: pd.DataFrame, value) -> list[tuple[pd.Series, dict[str, Any], list[str]]]:
    """The rows of ``rows`` grouped by point (their run ids less the repetition) and figure (``FIGURE_KEYS``),
    in first-seen order: each group's median run's row, its spread of ``value(row)`` and its run ids."""
    out = []
    if rows.empty:
        return out
    for _, g in rows.groupby(point_keys(rows), sort=False, dropna=False):
        sp, mid = spread_of(g, value)
        out.append((mid, sp, list(dict.fromkeys(g["run_id"]))))
    return out
