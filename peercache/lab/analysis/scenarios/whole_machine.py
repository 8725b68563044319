"""whole_machine: every NIC read at once, one group of pairs over one shared window.

The figure has the per-NIC bars and the aggregate, each against its line rate (a bar above it in red);
the table gives the aggregate, its configuration, each rail's share and the per-NIC range; the overview
gives the aggregate with the per-NIC range beside it; a conclusion says what limited the aggregate.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from peercache.lab.analysis.format import (display, fmt_number, fmt_size, short_devices, short_run, throughput_text,
                                           why_empty)
from peercache.lab.analysis.metablock import meta_block
from peercache.lab.analysis.rawlimit import BW_METRICS, nics_of
from peercache.lab.analysis.references import TestbedRefs, line_capacity_bps, row_extra
from peercache.lab.analysis.scenarios.declare import (Chart, Conclusion, Limits, NotDrawn, Scenario, Table, gbs,
                                                      ok_bw, ok_rows, overview_row, to_gbs)
from peercache.lab.analysis.scenarios.draw import OVER_COLOR, PEERCACHE_COLOR, new_fig
from peercache.lab.analysis.scenarios.rails import rail_shares_text, shares_column


def figure(rows: pd.DataFrame, runs: pd.DataFrame, refs: TestbedRefs | None) -> Chart | NotDrawn:
    """Whole machine: per-NIC bars, the aggregate, and each NIC's line rate (and each rail's share of the
    bytes where the metrics scrapes give it)."""
    sub = rows[rows["metric"].isin(BW_METRICS)]
    ok = ok_rows(sub)
    per = ok[ok["side"] == "per_device"]
    agg = ok[ok["side"] == "aggregate"]
    if per.empty and agg.empty:
        return NotDrawn("whole_machine", why_empty(sub, "per-NIC or aggregate bandwidth"))
    fig, axes = new_fig(ncols=2, w=9.0)
    ax, axa = axes[0][0], axes[0][1]
    table = []
    notes = []

    def draw(ax, frame, label_of):
        for i, (_, r) in enumerate(frame.iterrows()):
            value = to_gbs(r)
            cap = line_capacity_bps(r, refs) if refs is not None else None
            over = cap is not None and value * 8e9 > cap
            ax.bar(i, value, color=OVER_COLOR if over else PEERCACHE_COLOR)
            ax.annotate(f"{value:.1f}", (i, value), ha="center", va="bottom", fontsize=7)
            if cap is not None:
                ax.hlines(cap / 8e9, i - 0.45, i + 0.45, colors="black", linestyles="--", linewidth=1)
            table.append({"NIC / figure": label_of(r), **dict(zip(("value", "unit"), display(r["value"], r["unit"]))),
                          "line rate (GB/s)": "unknown" if cap is None else fmt_number(cap / 8e9),
                          "verdict": r.get("verdict") or "unchecked", "limited by": r.get("limited_by") or "—",
                          # the aggregate: every rail's share (its groups' NICs); a NIC's row: its own
                          **shares_column(rail_shares_text(rows, [r["run_id"]]),
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


class WholeMachine(Scenario):
    """The whole_machine scenario's report."""

    figures = {"whole_machine": figure}

    def tables(self, sub: pd.DataFrame, limits: Limits) -> list[Table]:
        """The aggregate, its configuration and rail shares, then the per-NIC range and mean."""
        ok = ok_bw(sub)
        agg, per = ok[ok["side"] == "aggregate"], ok[ok["side"] == "per_device"]
        recs = []
        for _, r in agg.iterrows():
            recs.append({"metric": "aggregate GET", "value": throughput_text(gbs(r)), "run": short_run(r["run_id"])})
            ex = row_extra(r)
            conf = [f"{nics_of(r)} NICs"]
            if ex.get("readers_per_nic") or r.get("processes"):
                conf.append(f"{fmt_number(ex.get('readers_per_nic') or r.get('processes'))} process(es) per NIC")
            if pd.notna(r.get("threads")):
                conf.append(f"{fmt_number(r['threads'])} thread(s) each")
            if pd.notna(r.get("size_bytes")):
                conf.append(f"{fmt_size(r['size_bytes'])} pages")
            recs.append({"metric": "configuration", "value": ", ".join(conf), "run": short_run(r["run_id"])})
            shares = rail_shares_text(sub, [r["run_id"]])
            if shares:    # the metrics scrapes' rails (one per group); nothing where there are none (tcp)
                recs.append({"metric": "rail shares of bytes", "value": shares, "run": short_run(r["run_id"])})
        if not per.empty:
            vals = [gbs(r) for _, r in per.iterrows()]
            runs = ", ".join(dict.fromkeys(per["run_id"]))
            recs.append({"metric": "per-NIC range", "value": f"{fmt_number(min(vals))} – "
                         f"{fmt_number(max(vals))} GB/s", "run": runs})
            recs.append({"metric": "per-NIC mean", "value": f"{fmt_number(sum(vals) / len(vals))} GB/s "
                         f"over {len(vals)} figure(s)", "run": runs})
        return [("", recs)] if recs else []

    def headline(self, scenario: str, s: pd.DataFrame, rows: pd.DataFrame, limits: Limits) -> list[dict[str, Any]]:
        """Each aggregate, with the per-NIC range beside it."""
        out = []
        for _, r in s[s["side"] == "aggregate"].iterrows():
            per = s[s["side"] == "per_device"]
            note = ""
            if not per.empty:
                vals = [gbs(v) for _, v in per.iterrows()]
                note = f"per NIC {fmt_number(min(vals))}–{fmt_number(max(vals))} GB/s"
            out.append(overview_row(scenario, f"aggregate over {nics_of(r)} NICs", r, limits, note))
        return out

    def conclusions(self, sub: pd.DataFrame, limits: Limits) -> list[Conclusion]:
        """What limited each aggregate, where attribution knows."""
        out = []
        bw = ok_bw(sub)
        for _, r in bw[bw["side"] == "aggregate"].iterrows():
            lb = r.get("limited_by")
            if not lb or str(lb).startswith("unknown"):
                continue
            out.append(Conclusion(f"Whole machine: the aggregate over {nics_of(r)} NICs, "
                                  f"{throughput_text(gbs(r))}, is limited by {lb}.", [r["run_id"]]))
        return out
