"""Tidy rows of a parsed perftest result (bandwidth in B/s, latency in us).

Part of :mod:`peercache.lab.tools.perftest` (its docstring says the units, sides and formats).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from peercache.lab.tidy import Row
from peercache.lab.tools.perftest.results import LAT_COLUMNS, PerftestLatencyResult, PerftestResult

_ROW_FIELDS = {f.name for f in dataclasses.fields(Row)}


def _context_fields(context: dict[str, Any]) -> dict[str, Any]:
    bad = set(context) - _ROW_FIELDS
    if bad:
        raise TypeError(f"unknown Row fields in context: {sorted(bad)}")
    clash = set(context) & {"metric", "value", "unit", "status", "reason", "raw_value", "raw_unit"}
    if clash:
        raise TypeError(f"context may not set {sorted(clash)}: the parser sets them")
    out = {"experiment": "", "scenario": "", "run_id": ""}
    out.update(context)
    return out


def to_rows(result: PerftestResult, **context: Any) -> list[Row]:
    """Tidy rows of a result: bw_average / bw_peak in B/s, msg_rate in msg/s, cpu_util in %;
    for a latency result (:func:`parse_latency_output`) latency_* in us and tps in 1/s.

    A column the table did not print (MsgRate of perftest 1.x, the percentiles of old
    latency tables) gives no row.
    """
    if isinstance(result, PerftestLatencyResult):
        return _latency_rows(result, **context)
    base = _result_context(result, context)
    rows: list[Row] = []
    for r in result.rows:
        if r.raw_unit is None:
            raise ValueError(f"{result.source}: bandwidth unit unknown; pass bw_unit to "
                             "parse_json or cross_check it against the text output first")
        common = dict(base, size_bytes=r.size_bytes)
        extra = {"table": r.table, "iterations": r.iterations, "bidirectional": result.bidirectional,
                 "source": result.source, "line": r.line_no, **dict(base.get("extra", {}))}
        common.pop("extra", None)
        rows.append(Row(metric="bw_average", value=r.bw_average_Bps, unit="B/s",
                        raw_value=r.bw_average_raw, raw_unit=r.raw_unit,
                        extra=dict(extra, gbit_per_s=r.bw_average_gbps), **common))
        if r.bw_peak_raw is None:
            rows.append(Row(metric="bw_peak", value=None, unit="B/s", status="not_measured",
                            reason="perftest printed peak 0.00 (duration mode, -N, or the "
                                   "receiving side of ib_send_bw): peak not measured",
                            raw_value=0.0, raw_unit=r.raw_unit, extra=dict(extra), **common))
        else:
            rows.append(Row(metric="bw_peak", value=r.bw_peak_Bps, unit="B/s",
                            raw_value=r.bw_peak_raw, raw_unit=r.raw_unit,
                            extra=dict(extra, gbit_per_s=r.bw_peak_gbps), **common))
        if r.msg_rate_mpps is not None:
            rows.append(Row(metric="msg_rate", value=r.msg_rate_mpps * 1e6, unit="msg/s",
                            raw_value=r.msg_rate_mpps, raw_unit="Mpps", extra=dict(extra),
                            **common))
        if r.cpu_util_pct is not None:
            rows.append(Row(metric="cpu_util", value=r.cpu_util_pct, unit="%",
                            raw_value=r.cpu_util_pct, raw_unit="%", extra=dict(extra), **common))
    return rows


def _result_context(result, context: dict[str, Any]) -> dict[str, Any]:
    """Row fields every row of a result shares: the caller's context, then what the header says."""
    base = _context_fields(context)
    info = result.info
    base.setdefault("tool", result.tool or "")
    base.setdefault("devices", info["device"] or "")
    if info["qps"] is not None:
        base.setdefault("qps", info["qps"])
    if info["link_type"]:
        base.setdefault("protocol", "roce" if info["link_type"] == "Ethernet" else "ib")
    return base


def _latency_rows(result: PerftestLatencyResult, **context: Any) -> list[Row]:
    base = _result_context(result, context)
    rows: list[Row] = []
    for r in result.rows:
        common = dict(base, size_bytes=r.size_bytes)
        extra = {"table": r.table, "iterations": r.iterations, "source": result.source,
                 "line": r.line_no, **dict(base.get("extra", {}))}
        common.pop("extra", None)
        for fname, (metric, _) in LAT_COLUMNS.items():
            v = getattr(r, fname)
            if v is not None:
                rows.append(Row(metric=metric, value=v, unit="us", raw_value=v, raw_unit="usec",
                                extra=dict(extra), **common))
        if r.tps is not None:
            rows.append(Row(metric="tps", value=r.tps, unit="1/s", raw_value=r.tps,
                            raw_unit="tps", extra=dict(extra), **common))
        if r.cpu_util_pct is not None:
            rows.append(Row(metric="cpu_util", value=r.cpu_util_pct, unit="%",
                            raw_value=r.cpu_util_pct, raw_unit="%", extra=dict(extra), **common))
    return rows
