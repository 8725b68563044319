"""Each rail's share of the bytes (collect's ``rail_share`` rows from the metrics scrapes), as the
multi_rail and whole_machine tables show it; nothing where there are no rails (tcp, shm) or no scrapes."""
from __future__ import annotations

from typing import Any

import pandas as pd


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


def shares_column(shares: str | None, device: str | None = None) -> dict[str, str]:
    """A table's "rail shares of bytes" cell ({} without rails): every rail's, or ``device``'s own part
    ("rxe_b0 52 %") of :func:`rail_shares_text`'s list."""
    if not shares:
        return {}
    if device is not None:
        shares = next((p for p in shares.split(", ") if p.rsplit(" ", 2)[0] == device), "—")
    return {"rail shares of bytes": shares}
