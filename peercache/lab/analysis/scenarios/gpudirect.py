"""gpudirect: GETs into GPU memory beside GETs into host memory (the ``destination`` of each row)."""
from __future__ import annotations

from typing import Any

import pandas as pd

from peercache.lab.analysis.format import display, fmt_size, point_label, short_run, throughput_text, why_empty
from peercache.lab.analysis.metablock import meta_block
from peercache.lab.analysis.rawlimit import BW_METRICS
from peercache.lab.analysis.references import TestbedRefs, row_extra
from peercache.lab.analysis.scenarios.declare import (Chart, Limits, NotDrawn, Scenario, Table, gbs, ok_bw, ok_rows,
                                                      overview_row, to_gbs)
from peercache.lab.analysis.scenarios.draw import PEERCACHE_COLOR, new_fig


def figure(rows: pd.DataFrame, runs: pd.DataFrame, refs: TestbedRefs | None) -> Chart | NotDrawn:
    """GPUDirect: GPU vs host destination."""
    sub = rows[rows["metric"].isin(BW_METRICS)]
    ok = ok_rows(sub)
    if ok.empty:
        return NotDrawn("gpudirect", why_empty(sub, "GPUDirect bandwidth"))
    fig, axes = new_fig(w=5.5)
    ax = axes[0][0]
    table, labels = [], []
    for i, (_, r) in enumerate(ok.iterrows()):
        dest = row_extra(r).get("destination") or "destination not recorded"
        value = to_gbs(r)
        ax.bar(i, value, color=PEERCACHE_COLOR, hatch="//" if dest == "gpu" else None)
        ax.annotate(f"{value:.1f} GB/s", (i, value), ha="center", va="bottom", fontsize=8)
        labels.append(f"{dest}\n{point_label(r, ['size_bytes', 'processes'])}")
        table.append({"destination": dest, **dict(zip(("value", "unit"), display(r["value"], r["unit"]))),
                      "page size": fmt_size(r["size_bytes"]), "verdict": r.get("verdict") or "unchecked",
                      "limited by": r.get("limited_by") or "—", "run": r["run_id"]})
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel("GET throughput (GB/s)")
    ax.set_ylim(bottom=0)
    return Chart("gpudirect", "GPUDirect RDMA: GPU vs host destination", fig, table, meta_block(ok, runs))


class GpuDirect(Scenario):
    """The gpudirect scenario's report."""

    figures = {"gpudirect": figure}

    def tables(self, sub: pd.DataFrame, limits: Limits) -> list[Table]:
        """Each destination's GET throughput."""
        recs = [{"destination": row_extra(r).get("destination") or "not recorded",
                 "GET throughput": throughput_text(gbs(r)), "run": short_run(r["run_id"])}
                for _, r in ok_bw(sub).iterrows()]
        return [("", recs)] if recs else []

    def headline(self, scenario: str, s: pd.DataFrame, rows: pd.DataFrame, limits: Limits) -> list[dict[str, Any]]:
        """Every destination's GET."""
        return [overview_row(scenario, f"destination {row_extra(r).get('destination', '?')}", r, limits)
                for _, r in s.iterrows()]
