"""Two runs point by point: ratio, verdict changes, and the points that regressed beyond a tolerance.

Rows of the two runs are matched on the same key. ``match="point"`` (the
default) keys a row by scenario, point name, metric, tool, side and devices:
two runs of the same scenario file on the same testbed (last week's and
today's, two ``make bench`` runs). ``match="knobs"`` keys it by scenario,
metric, tool, side, protocol, layout and the knob values instead, so runs
whose points are named differently (a published baseline) still meet; rows
that share those values within one run are ambiguous and left out, with a note.

Repetitions of a key are summarised by their median (converted to run A's
unit). A *directional* metric (bandwidth, rates: higher is better; latencies,
errors, failures: lower is better) regressed when B is worse than A by more
than the tolerance, or when A measured it and B did not (status ok in A, not in
B). Other metrics (bytes moved, counters) get a ratio and never regress.
"""
from __future__ import annotations

import json
import math
import numbers
import re
from dataclasses import dataclass, field
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from peercache.lab.analysis.format import display, fmt_number, fmt_size, limit_text, markdown_table
from peercache.lab.analysis.explore import Run
from peercache.lab.analysis.markup import md
from peercache.lab.analysis.references import UNITS, convert, row_extra

POINT_KEY = ("scenario", "point", "metric", "tool", "side", "devices", "protocol", "layout", "size_bytes", "batch",
             "qps", "threads", "processes", "statistic")
KNOB_KEY = ("scenario", "metric", "tool", "side", "protocol", "layout", "size_bytes", "batch", "qps", "threads",
            "processes", "statistic")
MATCHES = {"point": POINT_KEY, "knobs": KNOB_KEY}
DEFAULT_TOLERANCE = 0.05

#: Unit dimensions where a larger value is better.
_HIGHER_DIMENSIONS = ("bandwidth", "rate", "pages_rate", "ops_rate")
#: Metric name parts that say smaller is better whatever the unit.
_LOWER_WORDS = ("latency", "error", "failure", "retransmit")
_HIGHER_METRICS = ("hit_rate",)


class NoCommonPoints(ValueError):
    """The two runs share no key: nothing can be compared."""


def direction(metric: str, unit: str) -> str:
    """``higher``, ``lower`` (which is better) or ``neutral`` (never a regression) for a metric in a unit."""
    m = metric.lower()
    if m in _HIGHER_METRICS:
        return "higher"
    dim = UNITS.get(unit, ("",))[0]
    if dim == "time" or any(w in m for w in _LOWER_WORDS):
        return "lower"
    if dim in _HIGHER_DIMENSIONS:
        return "higher"
    return "neutral"      # bytes moved, perf counters (cache misses depend on the workload), CPU %


def _cell(v: Any) -> str:
    """A key cell as text: missing -> "", 131072.0 -> "131072"."""
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, numbers.Number) and not isinstance(v, bool) and float(v).is_integer():
        return str(int(v))
    return str(v)


def _summarise(run: Run, key: tuple[str, ...]) -> tuple[pd.DataFrame, list[str]]:
    """One line per key of ``run``: median of ok values (its unit), n, statuses, verdicts, limited by, run ids."""
    rows = run.rows.copy()
    # A per-device statistic (min / max / mean over NICs) is its own point.
    rows["statistic"] = [str(row_extra(r).get("statistic") or "") for r in rows.to_dict("records")]
    for c in key:
        rows[c] = rows[c].map(_cell)
    notes = []
    out = []
    for k, g in rows.groupby(list(key), sort=True):
        k = k if isinstance(k, tuple) else (k,)
        if g["point"].nunique() > 1 and "point" not in key:
            notes.append(f"run {run.name}: {dict(zip(key, k))} matches {g['point'].nunique()} points "
                         f"({', '.join(sorted(set(g['point'])))}); left out (match on point names instead)")
            continue
        if g.groupby("run_id").size().max() > 1:
            notes.append(f"run {run.name}: {_key_text(dict(zip(key, k)), key)} {dict(zip(key, k))['metric']} "
                         f"has several rows in one run ({', '.join(dict.fromkeys(g['run_id']))}); left out")
            continue
        ok = g[(g["status"] == "ok") & g["value"].notna()]
        unit = str(ok["unit"].iloc[0]) if not ok.empty else str(g["unit"].iloc[0])
        try:
            vals = [convert(float(v), str(u), unit) for v, u in zip(ok["value"], ok["unit"])]
        except ValueError as e:
            notes.append(f"run {run.name}: {dict(zip(key, k))}: {e}; left out")
            continue
        out.append({**dict(zip(key, k)), "unit": unit,
                    "value": float(pd.Series(vals).median()) if vals else None, "n": len(vals),
                    "status": "/".join(sorted(set(g["status"]))),
                    "reason": "; ".join(sorted({str(r) for r in g["reason"].dropna() if r})),
                    "verdict": "/".join(sorted(set(g["verdict"].fillna("unchecked")))),
                    "limited_by": limit_text(g),
                    "run_ids": list(dict.fromkeys(g["run_id"]))})
    return pd.DataFrame(out), notes


@dataclass
class Comparison:
    """Run B against run A on their common keys."""

    a: Run
    b: Run
    tolerance: float
    match: str
    table: pd.DataFrame        #: one line per common key (see COLUMNS)
    only_a: list[dict]         #: keys only run A has
    only_b: list[dict]         #: keys only run B has
    notes: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> pd.DataFrame:
        """Common keys where B is worse than A beyond the tolerance (or lost a value A had)."""
        return self.table[self.table["regressed"]]

    @property
    def improvements(self) -> pd.DataFrame:
        """Common keys where B is better than A beyond the tolerance."""
        return self.table[self.table["improved"]]

    @property
    def verdict_changes(self) -> pd.DataFrame:
        """Common keys whose verdict differs between A and B."""
        return self.table[self.table["verdict_a"] != self.table["verdict_b"]]

    @property
    def key(self) -> tuple[str, ...]:
        return MATCHES[self.match]


def compare_runs(a: Run, b: Run, tolerance: float = DEFAULT_TOLERANCE, match: str = "point") -> Comparison:
    """Compare run ``b`` with run ``a`` (the baseline) on their common keys; NoCommonPoints when none."""
    if not (0 <= tolerance < 1) or math.isnan(tolerance):
        raise ValueError(f"tolerance {tolerance!r} must be a fraction in [0, 1), e.g. 0.05 for 5 %")
    if match not in MATCHES:
        raise ValueError(f"match {match!r}: use one of {', '.join(MATCHES)}")
    key = MATCHES[match]
    sa, notes_a = _summarise(a, key)
    sb, notes_b = _summarise(b, key)
    ka = {tuple(r[c] for c in key): {k: _num(v) for k, v in r.items()} for r in sa.to_dict("records")}
    kb = {tuple(r[c] for c in key): {k: _num(v) for k, v in r.items()} for r in sb.to_dict("records")}
    common = [k for k in ka if k in kb]
    if not common:
        raise NoCommonPoints(
            f"runs {a.name} ({a.path}) and {b.name} ({b.path}) share no point on the key "
            f"({', '.join(key)}): A has scenarios {sorted(set(sa.get('scenario', [])))} with "
            f"{len(ka)} keys, B has {sorted(set(sb.get('scenario', [])))} with {len(kb)}; compare runs of the "
            f"same scenarios" + ("" if match == "knobs" else ", or match on knob values (--match knobs) "
                                 "when the point names differ"))
    out = []
    for k in common:
        ra, rb = ka[k], kb[k]
        unit = ra["unit"]
        vb = rb["value"]
        notes_k = []
        if vb is not None and rb["unit"] != unit:
            try:
                vb = convert(vb, rb["unit"], unit)
            except ValueError as e:
                notes_k.append(str(e))
                vb = None
        va = ra["value"]
        d = direction(ra["metric"], unit)
        ratio = vb / va if va not in (None, 0) and vb is not None else None
        regressed = improved = False
        why = ""
        if va is not None and vb is None and d != "neutral":
            regressed, why = True, f"measured in A, {rb['status']} in B" + (f" ({rb['reason']})" if rb["reason"] else "")
        elif ratio is not None and d == "higher":
            regressed, improved = ratio < 1 - tolerance, ratio > 1 + tolerance
        elif ratio is not None and d == "lower":
            regressed, improved = ratio > 1 + tolerance, ratio < 1 - tolerance
        elif va == 0 and vb is not None and d == "lower" and vb > 0:
            regressed, why = True, f"0 in A, {fmt_number(vb)} {unit} in B"
        if ratio is not None and (regressed or improved):
            worse = "worse" if regressed else "better"
            why = (f"{worse} by {abs(ratio - 1) * 100:.1f} % (B/A {ratio:.3f}; {d} is better, "
                   f"tolerance {tolerance * 100:g} %)")
        out.append({**dict(zip(key, k)), "unit": unit, "value_a": va, "value_b": vb, "n_a": ra["n"], "n_b": rb["n"],
                    "ratio": ratio, "direction": d, "regressed": bool(regressed), "improved": bool(improved),
                    "why": "; ".join(x for x in [why] + notes_k if x),
                    "status_a": ra["status"], "status_b": rb["status"],
                    "verdict_a": ra["verdict"], "verdict_b": rb["verdict"],
                    "limited_by_a": ra["limited_by"], "limited_by_b": rb["limited_by"],
                    "runs_a": ra["run_ids"], "runs_b": rb["run_ids"]})
    table = pd.DataFrame(out)
    only_a = [dict(zip(key, k)) for k in ka if k not in kb]
    only_b = [dict(zip(key, k)) for k in kb if k not in ka]
    return Comparison(a, b, tolerance, match, table, only_a, only_b, notes_a + notes_b)


# --- views ---------------------------------------------------------------------

def _key_text(rec: dict, key: tuple[str, ...]) -> str:
    """A key as people read it: scenario/point, tool, side, devices, then the knobs (sizes in KiB/MiB)."""
    head = "/".join(str(rec[c]) for c in ("scenario", "point") if rec.get(c))
    bits = [head] if head else []
    fmt = {"size_bytes": lambda v: fmt_size(int(v)), "batch": "batch {}".format, "qps": "q{}".format,
           "threads": "{} thr".format, "processes": "{} proc".format, "devices": lambda v: v if len(v) < 30
           else f"{v.split(',')[0]}..({len(v.split(','))})", "statistic": "({})".format}
    for c in key:
        if c in ("scenario", "point", "metric") or rec.get(c) in (None, ""):
            continue
        bits.append(fmt.get(c, str)(rec[c]))
    return " ".join(bits)


def _vu(v, unit: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    shown, u = display(v, unit)
    return f"{fmt_number(shown)} {u}"


def _ids(ids: list[str]) -> str:
    """Run ids, repetitions of one point folded: ``x/rep{0,1,2}``."""
    m = [re.fullmatch(r"(.*rep)(\d+)", i) for i in ids]
    if len(ids) > 1 and all(m) and len({x.group(1) for x in m}) == 1:
        return f"{m[0].group(1)}{{{','.join(x.group(2) for x in m)}}}"
    return ", ".join(ids)


def _table(c: Comparison, df: pd.DataFrame) -> list[dict[str, Any]]:
    recs = []
    for r in df.to_dict("records"):
        recs.append({"point": _key_text(r, c.key), "metric": r["metric"],
                     f"A ({c.a.name})": (_vu(r["value_a"], r["unit"]) if _num(r["value_a"]) is not None else r["status_a"]) + (f" (n={r['n_a']})" if r["n_a"] > 1 else ""),
                     f"B ({c.b.name})": (_vu(r["value_b"], r["unit"]) if _num(r["value_b"]) is not None else r["status_b"])
                     + (f" (n={r['n_b']})" if r["n_b"] > 1 else ""),
                     "B/A": "—" if _num(r["ratio"]) is None else f"{r['ratio']:.3f} x",
                     "better": r["direction"],
                     "verdict A → B": r["verdict_a"] if r["verdict_a"] == r["verdict_b"]
                     else f"{r['verdict_a']} → {r['verdict_b']}",
                     "limited by (B)": r["limited_by_b"] or "—",
                     "why": r["why"] or "—",
                     "runs A": _ids(r["runs_a"]), "runs B": _ids(r["runs_b"])})
    return recs


def headline(c: Comparison) -> list[str]:
    """The lines that say what was compared with what, and the outcome."""
    reg, imp, ver = len(c.regressions), len(c.improvements), len(c.verdict_changes)
    return [f"A (baseline): {c.a.label}",
            f"B: {c.b.label}",
            f"matched on {c.match} ({', '.join(c.key)}): {len(c.table)} common keys, {len(c.only_a)} only in A, "
            f"{len(c.only_b)} only in B; tolerance {c.tolerance * 100:g} %",
            f"{reg} regressed beyond the tolerance, {imp} improved beyond it, {ver} verdict change(s)"]


def comparison_markdown(c: Comparison) -> str:
    """The comparison as Markdown: headline, regressions, verdict changes, then every common key."""
    # run names, keys and notes are text (markup.md): a tool's reason never becomes markup
    parts = ["# Run comparison\n"] + [md("- {}", l) for l in headline(c)] + [md("- note: {}", n) for n in c.notes]
    parts.append("\n## Regressed beyond the tolerance\n")
    parts.append(markdown_table(_table(c, c.regressions)) if len(c.regressions) else "_none_\n")
    parts.append("\n## Verdict changes\n")
    parts.append(markdown_table(_table(c, c.verdict_changes)) if len(c.verdict_changes) else "_none_\n")
    order = c.table.assign(_o=(~c.table["regressed"]).astype(int) + (c.table["direction"] == "neutral").astype(int))
    parts.append("\n## Every common point\n")
    parts.append(markdown_table(_table(c, order.sort_values("_o", kind="stable"))))
    for label, only in (("only in A", c.only_a), ("only in B", c.only_b)):
        if only:
            shown = "; ".join(f"{_key_text(k, c.key)} {k['metric']}" for k in only[:20])
            parts.append(md("\n{} key(s) {}: {}", len(only), label, shown) + (" ..." if len(only) > 20 else "") + "\n")
    return "\n".join(parts)


def _num(v):
    """None for a missing number (None, NaN, NA), else ``v``."""
    return None if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)) else v


def comparison_json(c: Comparison) -> dict[str, Any]:
    """The comparison as a JSON-able dict: runs, tolerance, counts, one entry per common key (values with units)."""
    def run_doc(r: Run) -> dict:
        return {"name": r.name, "path": str(r.path), "kind": r.kind, "testbed": r.testbed, "period": r.period,
                "revision": r.revision}
    points = []
    for r in c.table.to_dict("records"):
        points.append({"key": {k: r[k] for k in c.key},
                       "a": {"value": _num(r["value_a"]), "unit": r["unit"], "n": r["n_a"], "status": r["status_a"],
                             "verdict": r["verdict_a"], "limited_by": r["limited_by_a"], "runs": r["runs_a"]},
                       "b": {"value": _num(r["value_b"]), "unit": r["unit"], "n": r["n_b"], "status": r["status_b"],
                             "verdict": r["verdict_b"], "limited_by": r["limited_by_b"], "runs": r["runs_b"]},
                       "ratio": {"value": _num(r["ratio"]), "unit": "B/A"}, "better": r["direction"],
                       "regressed": r["regressed"], "improved": r["improved"], "why": r["why"]})
    return {"schema_version": 1, "a": run_doc(c.a), "b": run_doc(c.b), "match": c.match, "key": list(c.key),
            "tolerance": {"value": c.tolerance, "unit": "fraction"},
            "counts": {"common": len(c.table), "only_a": len(c.only_a), "only_b": len(c.only_b),
                       "regressed": int(len(c.regressions)), "improved": int(len(c.improvements)),
                       "verdict_changes": int(len(c.verdict_changes))},
            "regressed": [p for p in points if p["regressed"]], "points": points,
            "only_a": c.only_a, "only_b": c.only_b, "notes": c.notes}


def _chart_label(rec: dict, key: tuple[str, ...]) -> str:
    if rec.get("point"):
        bits = [f"{rec['scenario']}/{rec['point']}", rec.get("side") or "", rec.get("statistic") or ""]
        devs = rec.get("devices") or ""
        if rec.get("side") == "per_device" and devs:
            bits.append(devs)
        text = " ".join(b for b in bits if b)
    else:
        text = _key_text(rec, key)
    return f"{rec['metric']}: {text}"[:80]


def comparison_chart(c: Comparison, include_neutral: bool = False):
    """B/A per common key (directional metrics by default), the tolerance band shaded, regressions in red.

    A key A measured and B did not (failed, skipped) has no ratio: it is marked with a red x at the left.
    """
    df = c.table[c.table["ratio"].notna() | c.table["regressed"]]
    if not include_neutral:
        df = df[df["direction"] != "neutral"]
    recs = df.to_dict("records")
    fig, ax = plt.subplots(figsize=(9.5, 1.6 + 0.22 * max(1, len(recs))))
    ratios = [float(r["ratio"]) for r in recs if _num(r["ratio"]) is not None]
    lo = min([1 - 2 * c.tolerance] + ratios) - 0.05
    for i, r in enumerate(recs):
        color = "tab:red" if r["regressed"] else "tab:green" if r["improved"] else "tab:gray"
        if _num(r["ratio"]) is None:
            ax.plot([lo + 0.02], [i], marker="x", color="tab:red", markersize=8)
            ax.text(lo + 0.04, i, f"{r['status_b']} in B", va="center", fontsize=6.5, color="tab:red")
        else:
            ax.barh(i, float(r["ratio"]) - 1.0, left=1.0, color=color)
    ax.axvspan(1 - c.tolerance, 1 + c.tolerance, color="tab:blue", alpha=0.12,
               label=f"tolerance ±{c.tolerance * 100:g} %")
    ax.axvline(1.0, color="k", linewidth=0.8)
    ax.set_xlim(left=lo)
    ax.set_yticks(range(len(recs)), [_chart_label(r, c.key) for r in recs], fontsize=6.5)
    ax.invert_yaxis()
    ax.set_xlabel("B/A (red: worse beyond the tolerance, green: better)")
    ax.legend(fontsize=7, loc="lower right")
    if not recs:
        ax.text(0.5, 0.5, "no directional metric with a value in both runs", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_title(f"B = {c.b.name} against A = {c.a.name}: {len(c.regressions)} regressed beyond "
                 f"±{c.tolerance * 100:g} %", fontsize=9)
    fig.tight_layout()
    return fig


def dumps(c: Comparison) -> str:
    """:func:`comparison_json` as indented text."""
    return json.dumps(comparison_json(c), indent=1, default=str)
