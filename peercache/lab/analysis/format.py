"""How the lab shows values to people: numbers, units, sizes, throughputs, run ids and Markdown tables.

One place for every such rule; the charts, the report, compare and explore all read them from here.
Pure: values in, text out. The tidy data keeps the exact values (``value`` / ``raw_value``).
"""
from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np
import pandas as pd

from peercache.lab.analysis import markup
from peercache.lab.analysis.references import UNITS, convert

#: The one unit each dimension is shown in (tables, report, charts); tidy data keeps the tool's own.
DISPLAY_UNITS = {"bandwidth": "GB/s", "time": "us"}


def fmt_number(v: Any, digits: int = 4) -> str:
    """A number as shown to people: measured floats to ``digits`` significant figures, integers exact.

    The exact value stays in the tidy data (``value`` / ``raw_value``).
    """
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return "—"
    if isinstance(v, str):
        return v
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return str(int(v))
    return f"{float(v):.{digits}g}"


def display(value: Any, unit: str) -> tuple[Any, str]:
    """(value, unit) as shown: bandwidth in GB/s, latency in us, anything else as recorded."""
    dim = UNITS.get(unit, (None,))[0]
    want = DISPLAY_UNITS.get(dim)
    if want is None or value is None or isinstance(value, str) or pd.isna(value):
        return value, unit
    return convert(float(value), unit, want), want


def fmt_size(n: Any) -> str:
    """Byte count as KiB/MiB where exact."""
    if n is None or n is pd.NA or (isinstance(n, float) and math.isnan(n)):
        return "—"
    n = int(n)
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= f and n % f == 0:
            return f"{n // f} {unit}"
    return f"{n} B"


def rate_text(v: float) -> str:
    """A figure as shown: rates of 1000 and more as whole numbers with thousands separators (pages/s, tokens/s),
    anything else to 4 significant figures."""
    return f"{v:,.0f}" if abs(v) >= 1000 else fmt_number(v)


def throughput_text(gbs: float) -> str:
    """A throughput as the published table shows it: GB/s, then Gb/s in brackets."""
    gbit = gbs * 8
    nb = "\u00a0"     # a number and its unit stay on one line
    bits = fmt_number(gbit / 1000) + nb + "Tb/s" if gbit >= 1000 else fmt_number(gbit) + nb + "Gb/s"
    return f"{fmt_number(gbs)}{nb}GB/s ({bits})"


def short_run(run_id: str) -> str:
    """A run id as cited in tables (the full id; the tables wrap it)."""
    return str(run_id)


def present(v: Any) -> bool:
    """Whether a cell holds a value (not None, NA, NaN or empty)."""
    return not (v is None or v is pd.NA or v == "" or (isinstance(v, float) and math.isnan(v)))


def short_devices(devs: str) -> str:
    """A device list as shown: up to two names, else the first..last and how many."""
    names = [d for d in str(devs).split(",") if d]
    if len(names) <= 2:
        return ",".join(names)
    return f"{names[0]}..{names[-1]} ({len(names)})"


def point_label(r: dict, keys: Iterable[str]) -> str:
    """A point's knobs ``keys`` in a few words ("128 KiB batch 32 q4 8 thr"); absent knobs are left out."""
    bits = []
    for k in keys:
        v = r.get(k)
        if not present(v):
            continue
        if k == "size_bytes":
            bits.append(fmt_size(v))
        else:
            fmt = {"qps": "q{}", "threads": "{} thr", "processes": "{} proc", "batch": "batch {}",
                   "protocol": "over {}", "layout": "{} layout"}
            bits.append(fmt.get(k, "{}").format(v))
    return " ".join(bits)


def limit_text(g: pd.DataFrame) -> str:
    """The "limited by" of a group of rows (one sentence; the distinct ones joined if they differ)."""
    if "limited_by" not in g:
        return "—"
    said = [t for t in dict.fromkeys(g["limited_by"].dropna()) if t]
    return " / ".join(said) or "—"


def why_empty(rows: pd.DataFrame, what: str) -> str:
    """Why ``rows`` give no measured ``what`` value: none at all, or each status with its reason."""
    if rows.empty:
        return f"no {what} rows"
    parts = [f"{st}: {reason or 'no reason given'}" for (st, reason), _ in
             rows.groupby(["status", rows["reason"].fillna("")], dropna=False)]
    return f"no measured {what} value ({len(rows)} rows: " + "; ".join(parts) + ")"


def markdown_table(records: list[dict[str, Any]]) -> str:
    """A GitHub Markdown table from a list of same-keyed dicts; every cell is text (markup.md_text): a
    host's CPU model or a tool's stderr shows as written, never as Markdown or HTML."""
    if not records:
        return "_no rows_\n"
    cols = list(records[0])
    esc = lambda v: markup.md_text(v if isinstance(v, str) else fmt_number(v))  # noqa: E731
    lines = ["| " + " | ".join(esc(c) for c in cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(esc(r.get(c)) for c in cols) + " |" for r in records]
    return "\n".join(lines) + "\n"
