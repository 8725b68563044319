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


def by_point(rows: pd.DataFrame, value) -> list[tuple[pd.Series, dict[str, Any], list[str]]]:
    """The rows of ``rows`` grouped by point (their run ids less the repetition) and figure (``FIGURE_KEYS``),
    in first-seen order: each group's median run's row, its spread of ``value(row)`` and its run ids."""
    out = []
    if rows.empty:
        return out
    keys = [rows["run_id"].map(point_of)] + [rows[k].astype(str) for k in FIGURE_KEYS if k in rows]
    for _, g in rows.groupby(keys, sort=False, dropna=False):
        vals = [value(r) for _, r in g.iterrows()]
        sp = spread(vals)
        out.append((g.iloc[vals.index(sp["median"])], sp, list(dict.fromkeys(g["run_id"]))))
    return out
