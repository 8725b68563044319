"""The host + meta block: which hosts, runs and knobs a figure, table or report section rests on.

Two forms, both from the tidy runs table: :func:`meta_block` (one line per run, beside every chart and
in the report's "every run" list) and :func:`compact_meta` (a section's block in three lines).
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from peercache.lab.analysis import collect
from peercache.lab.analysis.format import fmt_number, fmt_size, present, short_devices


def host_summary(hosts: dict[str, Any]) -> list[str]:
    """One line per host role with its name, NIC, CPU and kernel where recorded."""
    out = []
    for role, h in (hosts or {}).items():
        if not isinstance(h, dict):
            out.append(f"{role}: {h if h is not None else 'not recorded'}")
            continue
        parts = []
        for key in ("host", "hostname"):
            if h.get(key):
                parts.append(str(h[key]))
        nic = h.get("nic") or h.get("nics")
        if isinstance(nic, dict):
            bits = [str(nic[k]) for k in ("count", "model") if nic.get(k) is not None]
            bits += [f"{k} {nic[k]}" for k in ("firmware", "mtu", "gid_index", "link") if nic.get(k) is not None]
            parts.append("NIC " + " ".join(bits))
        elif isinstance(nic, list) and nic:
            parts.append(f"{len(nic)} NICs")
        cpu = h.get("cpu")
        if isinstance(cpu, dict) and cpu.get("model"):
            parts.append(f"CPU {cpu.get('sockets', '') and str(cpu['sockets']) + ' x '}{cpu['model']}")
        elif isinstance(cpu, str):
            parts.append(f"CPU {cpu}")
        for key in ("kernel", "ofed"):
            if h.get(key):
                parts.append(f"{key} {h[key]}")
        out.append(f"{role}: " + ("; ".join(parts) if parts else "not recorded"))
    return out or ["hosts: not recorded"]


def meta_block(rows: pd.DataFrame, runs: pd.DataFrame) -> list[str]:
    """The host + meta block of the runs behind ``rows``, as text lines."""
    lines: list[str] = []
    run_ids = list(dict.fromkeys(rows["run_id"]))
    by_id = {r["run_id"]: r for r in runs.to_dict("records")}
    first = by_id.get(run_ids[0]) if run_ids else None
    src = collect.run_field(first, "source") if first else None
    if src:
        lines.append(f"source: {src.get('title', '')} ({src.get('file', '')})")
    if first:
        lines += host_summary(collect.run_field(first, "hosts"))
    for rid in run_ids:
        sub = rows[rows["run_id"] == rid]
        run = by_id.get(rid)
        params = []
        for col, label in (("devices", "devices"), ("layout", "layout"), ("size_bytes", "size"),
                           ("batch", "batch"), ("qps", "QPs"), ("threads", "concurrency"),
                           ("processes", "processes")):
            vals = [v for v in dict.fromkeys(sub[col]) if present(v)]
            if col == "size_bytes":
                vals = [fmt_size(v) for v in vals]
            if col == "devices":
                vals = [short_devices(v) for v in vals]
            if vals:
                params.append(f"{label} {','.join(str(v) for v in vals)}")
        if run is None:
            lines.append(f"run {rid}: no meta block")
            continue
        date = run.get("start") or "not recorded"
        rev = run.get("git_revision") or "not recorded"
        lines.append(f"run {rid} (point {run.get('point')}): " + "; ".join(params)
                     + f"; date {date}; revision {rev}")
    return lines


def compact_meta(sub: pd.DataFrame, runs: pd.DataFrame) -> list[str]:
    """The section's host + meta block in three lines: hosts, runs (dates, revision), parameters."""
    ids = list(dict.fromkeys(sub["run_id"]))
    mine = runs[runs["run_id"].isin(ids)]
    lines = []
    if not mine.empty:
        hosts = collect.run_field(mine.iloc[0], "hosts")
        lines.append("hosts: " + " / ".join(_host_line(role, h) for role, h in (hosts or {}).items())
                     if hosts else "hosts: not recorded")
        starts = sorted(s for s in mine["start"].dropna())
        ends = sorted(s for s in mine["end"].dropna())
        revs = list(dict.fromkeys(r for r in mine["git_revision"].dropna() if r))
        lines.append(f"{len(ids)} run(s) {ids[0]}" + (f" … {ids[-1]}" if len(ids) > 1 else "")
                     + (f"; {starts[0]} – {ends[-1]}" if starts and ends else "; dates not recorded")
                     + f"; revision {', '.join(revs) or 'not recorded'}")
    params = []
    for col, label in (("layout", "layout"), ("protocol", "protocol"), ("devices", "devices"),
                       ("size_bytes", "size"), ("batch", "batch"), ("qps", "QPs/streams"),
                       ("threads", "threads"), ("processes", "processes")):
        vals = [v for v in dict.fromkeys(sub[col]) if present(v)]
        if col == "size_bytes":
            vals = [fmt_size(v) for v in vals]
        if vals:
            params.append(f"{label} {', '.join(str(fmt_number(v)) for v in vals)}")
    if params:
        lines.append("parameters: " + "; ".join(params))
    return lines


def _host_line(role: str, h: Any) -> str:
    if not isinstance(h, dict):
        return f"{role} {h}"
    bits = [str(h.get("host") or "?")]
    if h.get("kernel"):
        bits.append(f"Linux {h['kernel']}")
    cpu = h.get("cpu_model") or (h["cpu"].get("model") if isinstance(h.get("cpu"), dict) else h.get("cpu"))
    if cpu:
        bits.append(str(cpu) + (f", {h['threads']} CPUs" if h.get("threads") else ""))
    nics = h.get("nics") or h.get("nic")
    if isinstance(nics, list):
        bits.append(f"{len(nics)} RDMA NIC(s)" if nics else "no RDMA NIC")
    elif isinstance(nics, dict):
        bits.append(" ".join(str(nics[k]) for k in ("count", "model") if nics.get(k)) + " NICs")
    return f"{role} " + ", ".join(bits)
