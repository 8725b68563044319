"""growth: how PeerCache's costs grow with keys, members, pool size and batch size.

One figure per curve (log-log: each cost the tool fitted, its points and the fitted line ``a * x^b``, the fit
in the legend, one colour per backend); a table of the fits and one of every measured value (and every size
not measured, with why); an overview row per fit; conclusions naming every cost that grows faster than
linearly (b > 1.1) and, where none does, the steepest.
"""
from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter, NullFormatter

from peercache.lab.analysis.format import fmt_number, fmt_size, short_run, why_empty
from peercache.lab.analysis.metablock import meta_block
from peercache.lab.analysis.references import TestbedRefs, row_extra
from peercache.lab.analysis.scenarios.declare import Chart, Conclusion, Limits, NotDrawn, Scenario, Table, ok_rows
from peercache.lab.analysis.scenarios.draw import MARKERS, new_fig, series_colors

CURVES = ("directory", "members", "register", "get_cpu")
TITLES = {"directory": "Directory cost against keys published",
          "members": "Membership cost against members",
          "register": "Pool registration time against pool size (tcp / shm; rdma's ibv_reg_mr not measured)",
          "get_cpu": "GET consumer CPU against keys per batch"}
#: What each fitted cost is, as people read it
COST_TEXT = {"dir_bytes": "directory memory (all keys)", "publish_all_s": "time to publish every key",
             "lookup_all_s": "time to look every key up once", "heartbeat_cpu_cores": "directory host CPU (cores)",
             "heartbeat_msgs_per_s": "heartbeats served per second", "join_seen_ms": "join seen by others",
             "members_call_ms": "members call latency", "register_s": "pool registration",
             "node_start_s": "node start with the pool", "get_cpu_us_per_batch": "consumer CPU per GET batch"}


def x_text(x: Any, unit: str | None) -> str:
    """An x value as people read it: pool bytes as a size, counts as whole numbers."""
    if x is None:
        return "?"
    if unit == "B":
        return fmt_size(int(x))
    return f"{int(x):,} {unit or ''}".strip() if float(x).is_integer() else f"{fmt_number(x)} {unit or ''}".strip()


def _tick(v: float, unit: str | None) -> str:
    """A compact x tick: sizes for bytes, 1e6 for powers of ten from 10^4, else the number."""
    if unit == "B":
        return fmt_size(int(v))
    e = np.log10(v) if v > 0 else 0
    return f"1e{int(round(e))}" if v >= 1e4 and abs(e - round(e)) < 1e-9 else f"{v:g}"


def _fits(rows: pd.DataFrame, curve: str | None = None) -> list[tuple[pd.Series, dict[str, Any]]]:
    """The measured fit rows (of ``curve``), each with its extra."""
    ok = ok_rows(rows[rows["metric"] == "fit_exponent"])
    out = [(r, row_extra(r)) for _, r in ok.iterrows()]
    return [(r, ex) for r, ex in out if curve is None or ex.get("curve") == curve]


def _fit_text(ex: dict[str, Any]) -> str:
    verdict = "faster than linear" if ex["superlinear"] else "linear" if ex["linear"] else (
        "sublinear" if ex["b"] < 1 else "above linear, within 1.1")
    return f"b = {ex['b']:.2f}, r² = {ex['r2']:.2f} ({verdict})"


def figure(curve: str, rows: pd.DataFrame, runs: pd.DataFrame, refs: TestbedRefs | None) -> Chart | NotDrawn:
    """One curve: each fitted cost on log-log axes, points and the fitted line per backend, the fit in the legend."""
    name = f"growth_{curve}"
    fits = _fits(rows, curve)
    if not fits:
        mine = rows[[row_extra(r).get("curve") == curve for _, r in rows.iterrows()]] if not rows.empty else rows
        return NotDrawn(name, why_empty(mine, f"{curve} fit"))
    costs = list(dict.fromkeys(ex["cost"] for _, ex in fits))
    backends = list(dict.fromkeys(ex["backend"] for _, ex in fits))
    colors = dict(zip(backends, series_colors(len(backends), raw=False)))
    ncols = 2 if len(costs) == 4 else min(3, len(costs))
    nrows = -(-len(costs) // ncols)
    fig, axes = new_fig(ncols=ncols, nrows=nrows, w=4.2 * ncols, h=3.4 * nrows)
    table, notes = [], []
    for i, cost in enumerate(costs):
        ax = axes[i // ncols][i % ncols]
        for j, (r, ex) in enumerate(f for f in fits if f[1]["cost"] == cost):
            xs, ys = np.asarray(ex["xs"], float), np.asarray(ex["costs"], float)
            c = colors[ex["backend"]]
            ax.loglog(xs, ys, MARKERS[backends.index(ex["backend"]) % len(MARKERS)], color=c)
            grid = np.geomspace(xs.min(), xs.max(), 50)
            ax.loglog(grid, ex["a"] * grid ** ex["b"], "-", color=c, linewidth=1,
                      label=f"{ex['backend']}: {fmt_number(ex['a'], 3)}·x^{ex['b']:.2f} (r² {ex['r2']:.2f})")
            table.append({"curve": curve, "backend": ex["backend"], "cost": COST_TEXT.get(cost, cost),
                          "unit": ex["cost_unit"], "a": fmt_number(ex["a"], 3), "b": f"{ex['b']:.3f}",
                          "r2": f"{ex['r2']:.3f}", "points": ex["n"],
                          "growth": "faster than linear" if ex["superlinear"] else "linear" if ex["linear"]
                          else "sublinear" if ex["b"] < 1 else "slightly above linear",
                          "run": short_run(r["run_id"])})
        xs_all = sorted({x for _, ex in fits if ex["cost"] == cost for x in ex["xs"]})
        unit = fits[0][1].get("x_unit")
        ax.set_xticks(xs_all)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos, u=unit: _tick(v, u)))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.tick_params(axis="x", labelsize=7)
        ax.set_title(COST_TEXT.get(cost, cost), fontsize=9)
        ax.set_xlabel(fits[0][1].get("x_unit", "x"))
        ax.set_ylabel(next(ex["cost_unit"] for _, ex in fits if ex["cost"] == cost))
        lo, hi = ax.get_ylim()
        if hi >= 10 * lo:   # a decade's major tick is in view: the minor labels would only crowd it
            ax.yaxis.set_minor_formatter(NullFormatter())
        ax.legend(fontsize=7)
    for k in range(len(costs), nrows * ncols):
        axes[k // ncols][k % ncols].set_visible(False)
    for _, r in rows[rows["status"] != "ok"].iterrows():
        ex = row_extra(r)
        if ex.get("curve") == curve:
            at = x_text(ex.get("x"), ex.get("x_unit"))
            notes.append(f"{ex.get('backend')} at {at}: {r['status']}: {r['reason']}")
    notes = list(dict.fromkeys(notes))
    fig.suptitle(TITLES[curve], fontsize=10)
    fig.tight_layout()
    ok = ok_rows(rows)
    return Chart(name, TITLES[curve], fig, table, meta_block(ok[ok["metric"] == "fit_exponent"], runs), notes)


class Growth(Scenario):
    """The growth scenario's report."""

    figures = {f"growth_{c}": partial(figure, c) for c in CURVES}

    def tables(self, sub: pd.DataFrame, limits: Limits) -> list[Table]:
        """The fits (cost ~ a x^b), then every value by curve, backend, metric and x (and what was not measured)."""
        fits = [{"curve": ex["curve"], "backend": ex["backend"], "cost": COST_TEXT.get(ex["cost"], ex["cost"]),
                 "fit": f"{fmt_number(ex['a'], 3)} · x^{ex['b']:.3f} {ex['cost_unit']}", "r²": f"{ex['r2']:.3f}",
                 "growth": "FASTER THAN LINEAR" if ex["superlinear"] else "linear" if ex["linear"] else
                 "sublinear" if ex["b"] < 1 else "slightly above linear", "run": short_run(r["run_id"])}
                for r, ex in _fits(sub)]
        vals = []
        for _, r in sub[sub["metric"] != "fit_exponent"].iterrows():
            ex = row_extra(r)
            if "x" not in ex:
                continue
            vals.append({"curve": ex.get("curve"), "backend": ex.get("backend"),
                         "x": x_text(ex["x"], ex.get("x_unit")), "metric": r["metric"],
                         "value": f"{fmt_number(r['value'])} {r['unit']}" if r["status"] == "ok" else
                         f"{r['status']}: {r['reason']}", "run": short_run(r["run_id"])})
        out: list[Table] = []
        if fits:
            out.append(("Fitted power laws (cost = a · x^b, least squares on log-log; linear: |b − 1| ≤ 0.1)",
                        fits))
        if vals:
            out.append(("Every value", vals))
        return out

    def overview(self, scenario: str, sub: pd.DataFrame, rows: pd.DataFrame, bw: pd.DataFrame,
                 limits: Limits) -> list[dict[str, Any]]:
        """One row per fitted cost (no GET throughput here: these are costs against size)."""
        out = []
        for r, ex in _fits(sub):
            out.append({"scenario": f"{scenario}: {COST_TEXT.get(ex['cost'], ex['cost'])} vs {ex.get('x_unit')} "
                                    f"({ex['backend']})",
                        "GET throughput": "—", "% of single-NIC raw limit": "—", "limited by": "—",
                        "notes": _fit_text(ex), "run": short_run(r["run_id"])})
        if not out:
            reasons = sorted({f"{st}: {rs}" for st, rs in zip(sub["status"], sub["reason"].fillna("")) if st != "ok"})
            out.append({"scenario": scenario, "GET throughput": "—", "% of single-NIC raw limit": "—",
                        "limited by": "—", "notes": "; ".join(reasons) or "no fit in this scenario",
                        "run": ", ".join(dict.fromkeys(sub["run_id"]))})
        return out

    def conclusions(self, sub: pd.DataFrame, limits: Limits) -> list[Conclusion]:
        """Every cost that grows faster than linearly, by name; where none does, the steepest one; and the
        sizes that were not measured."""
        fits = _fits(sub)
        out = []
        for r, ex in fits:
            if ex["superlinear"]:
                out.append(Conclusion(
                    f"Growth: {COST_TEXT.get(ex['cost'], ex['cost'])} ({ex['backend']}) grows faster than linearly "
                    f"with {ex.get('x_unit')}: cost ≈ {fmt_number(ex['a'], 3)} · x^{ex['b']:.2f} {ex['cost_unit']} "
                    f"(r² {ex['r2']:.2f}).", [r["run_id"]]))
        if fits and not out:
            r, ex = max(fits, key=lambda f: f[1]["b"])
            out.append(Conclusion(
                f"Growth: no cost grows faster than linearly (b > 1.1); the steepest is "
                f"{COST_TEXT.get(ex['cost'], ex['cost'])} ({ex['backend']}), b = {ex['b']:.2f}.", [r["run_id"]]))
        missing = sub[sub["status"].isin(["not_measured", "failed", "skipped"])]
        for (st, reason), g in missing.groupby(["status", "reason"], dropna=False):
            xs = sorted({row_extra(r).get("x") for _, r in g.iterrows()} - {None})
            curves = sorted({str(row_extra(r).get("curve")) + "/" + str(row_extra(r).get("backend"))
                             for _, r in g.iterrows()})
            unit = row_extra(g.iloc[0]).get("x_unit")
            out.append(Conclusion(f"Growth: {', '.join(curves)} {st}" + (f" at {', '.join(x_text(x, unit) for x in xs)}"
                                  if xs else "") + f": {reason}", list(dict.fromkeys(g["run_id"]))))
        return out
