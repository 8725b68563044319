"""The reader of perftest's ``--out_json`` file (both dialects), and its cross-check against the text report.

Part of :mod:`peercache.lab.tools.perftest` (its docstring says the units, sides and formats).
"""
from __future__ import annotations

import json
import re
from typing import Any

from peercache.lab.errors import ParseError
from peercache.lab.tools.perftest.results import (BW_UNITS, PerftestLatencyResult, PerftestLatencyRow,
                                                  PerftestResult, PerftestRow)

_LEGACY_OPEN = re.compile(r'^"?(?P<key>[A-Za-z_][\w.]*)"?\s*:\s*\{$')
_LEGACY_KV = re.compile(r'^"?(?P<key>[A-Za-z_][\w. ]*?)"?\s*:\s*(?P<val>.*?),?$')


# test_info keys of the JSON file -> the header keys of the text report.
_JSON_HEADER_KEYS = {
    "Dual_port": "Dual-port", "Number_of_qps": "Number of qps", "Transport_type": "Transport type",
    "Connection_type": "Connection type", "Using_SRQ": "Using SRQ",
    "PCIe_relax_order": "PCIe relax order", "ibv_wr_API": "ibv_wr* API", "TX_depth": "TX depth",
    "RX_depth": "RX depth", "CQ_Moderation": "CQ Moderation", "Link_type": "Link type",
    "GID_index": "GID index", "GID_index2": "GID index2", "Max_inline_data": "Max inline data",
    "Outstand_reads": "Outstand reads", "rdma_cm_QPs": "rdma_cm QPs",
    "Data_ex_method": "Data ex. method", "Buffer_size": "Buffer size",
    "Use_ROCm_memory": "Use ROCm memory", "Use_CUDA_memory": "Use CUDA memory",
}


def _legacy_value(tok: str) -> Any:
    tok = tok.strip()
    if len(tok) >= 2 and tok[0] == tok[-1] == '"':
        return tok[1:-1]
    try:
        return int(tok)
    except ValueError:
        pass
    try:
        return float(tok)
    except ValueError:
        return tok  # bare words such as OFF, IB, RDMA_Write_BW_Test


def _parse_legacy_json(text: str, source: str) -> list[tuple[str, Any]]:
    """Parse perftest's pre-standard JSON: returns top-level (key, value) pairs in order."""
    stack: list[list[tuple[str, Any]]] = []
    keys: list[str] = []
    top: list[tuple[str, Any]] | None = None
    for line_no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line == "{" and not stack and top is None:
            stack.append([])
            continue
        if not stack:
            raise ParseError("perftest-json", "text outside the top-level object",
                             source=source, line_no=line_no, line=raw)
        if line in ("}", "},"):
            done = stack.pop()
            if stack:
                stack[-1].append((keys.pop(), dict(done)))
            else:
                top = done
            continue
        m = _LEGACY_OPEN.match(line)
        if m:
            keys.append(m.group("key"))
            stack.append([])
            continue
        m = _LEGACY_KV.match(line)
        if m and m.group("val"):
            stack[-1].append((m.group("key").strip(), _legacy_value(m.group("val"))))
            continue
        raise ParseError("perftest-json", "line is neither 'key: value,' nor a brace",
                         source=source, line_no=line_no, line=raw)
    if stack or top is None:
        raise ParseError("perftest-json", "object not closed; file truncated", source=source)
    return top


def _json_row(section: str, d: dict[str, Any], unit: str | None, source: str) -> PerftestRow:
    def need(key: str, kind: type) -> Any:
        if key not in d:
            raise ParseError("perftest-json", f"missing key {section}.{key}", source=source)
        v = d[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ParseError("perftest-json", f"{section}.{key} is not a number: {v!r}",
                             source=source)
        return kind(v)

    peak = need("BW_peak", float)
    cpu = None
    if "CPU_util" in d:
        cpu = need("CPU_util", float)
    table = {"results": "main", "results_local": "local", "results_remote": "remote"}[section]
    return PerftestRow(table=table, line_no=0, size_bytes=need("MsgSize", int),
                       iterations=need("n_iterations", int), raw_unit=unit,
                       bw_average_raw=need("BW_average", float),
                       bw_peak_raw=None if peak == 0.0 else peak,
                       msg_rate_mpps=need("MsgRate", float), cpu_util_pct=cpu)


def _json_pairs(text: str, source: str) -> list[tuple[str, Any]]:
    """Top-level (key, value) pairs of a --out_json file, in either dialect."""
    try:
        pairs = json.loads(text, object_pairs_hook=list)
        if not isinstance(pairs, list):
            raise ParseError("perftest-json", "top level is not an object", source=source)
        return pairs
    except json.JSONDecodeError:
        return _parse_legacy_json(text, source)


def _json_test_info(res: PerftestResult, value: Any, source: str) -> None:
    as_dict = dict(value) if isinstance(value, list) else value
    if not isinstance(as_dict, dict):
        raise ParseError("perftest-json", "test_info is not an object", source=source)
    test = str(as_dict.get("test", "")).strip()
    # "RDMA_Read_BW_Test" -> "RDMA_Read BW Test", the title the text prints.
    res.test = (test.replace("_Bidirectional", " Bidirectional").replace("_BW_Test", " BW Test")
                .replace("_Latency_Test", " Latency Test") or None)
    for k, v in as_dict.items():
        k = k.strip()
        if k != "test":
            res.header[_JSON_HEADER_KEYS.get(k, k)] = str(v)


def parse_json(text: str, bw_unit: str | None = None, source: str = "<json>") -> PerftestResult:
    """Parse a perftest --out_json file of a bandwidth run (standard or pre-standard dialect).

    *bw_unit* is the label the run printed ("Gb/sec" with --report_gbits, else
    "MiB/sec"); the file does not record it, so without it values stay raw.
    """
    if bw_unit is not None and bw_unit not in BW_UNITS:
        raise ValueError(f"bw_unit {bw_unit!r} is not one of {list(BW_UNITS)}")
    pairs = _json_pairs(text, source)
    res = PerftestResult(source=source, fmt="json")
    for key, value in pairs:
        as_dict = dict(value) if isinstance(value, list) else value
        if key == "test_info":
            _json_test_info(res, value, source)
        elif key in ("results", "results_local", "results_remote"):
            if not isinstance(as_dict, dict):
                raise ParseError("perftest-json", f"{key} is not an object", source=source)
            if "BW_average" not in as_dict and ("t_avg" in as_dict or "t_min" in as_dict):
                raise ParseError("perftest-json", "this is the file of a latency test; "
                                 "use parse_latency_json", source=source)
            res.rows.append(_json_row(key, as_dict, bw_unit, source))
        else:
            res.notes.append(f"unread key {key!r}")
    if not res.rows:
        raise ParseError("perftest-json", "no 'results' object in the file", source=source)
    return res


#: --out_json keys of a latency run -> PerftestLatencyRow fields, per layout.
_LAT_JSON_KEYS = {
    "full": {"t_min": "t_min_us", "t_max": "t_max_us", "t_typical": "t_typical_us",
             "t_avg": "t_avg_us", "t_stdev": "t_stdev_us", "percentile_99": "p99_us",
             "percentile_99.9": "p999_us"},
    "duration": {"t_avg": "t_avg_us", "tps_average": "tps"},
}


def parse_latency_json(text: str, source: str = "<json>") -> PerftestLatencyResult:
    """Parse the --out_json file of a latency run (ib_*_lat); values in usec as in the file."""
    res = PerftestLatencyResult(source=source, fmt="json")
    for key, value in _json_pairs(text, source):
        as_dict = dict(value) if isinstance(value, list) else value
        if key == "test_info":
            _json_test_info(res, value, source)
        elif key == "results":
            if not isinstance(as_dict, dict):
                raise ParseError("perftest-json", "results is not an object", source=source)
            if "BW_average" in as_dict:
                raise ParseError("perftest-json", "this is the file of a bandwidth test; "
                                 "use parse_json", source=source)
            layout = "full" if "t_min" in as_dict else "duration"
            vals: dict[str, Any] = {}
            for jkey, fname in [("MsgSize", "size_bytes"), ("n_iterations", "iterations"),
                                *_LAT_JSON_KEYS[layout].items(), ("CPU_util", "cpu_util_pct")]:
                if jkey not in as_dict:
                    if jkey == "CPU_util":
                        continue
                    raise ParseError("perftest-json", f"missing key results.{jkey} ({layout} "
                                     "latency layout)", source=source)
                v = as_dict[jkey]
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise ParseError("perftest-json", f"results.{jkey} is not a number: {v!r}",
                                     source=source)
                vals[fname] = int(v) if fname in ("size_bytes", "iterations") else float(v)
            res.rows.append(PerftestLatencyRow(table="main", line_no=0, **vals))
        else:
            res.notes.append(f"unread key {key!r}")
    if not res.rows:
        raise ParseError("perftest-json", "no 'results' object in the file", source=source)
    return res


def cross_check(text_result: PerftestResult, json_result: PerftestResult) -> list[str]:
    """Differences between the text report and the JSON file of one run ([] when they agree)."""
    problems: list[str] = []
    by_key = {(r.table, r.size_bytes): r for r in text_result.rows}
    for j in json_result.rows:
        t = by_key.get((j.table, j.size_bytes))
        if t is None:
            problems.append(f"JSON row {j.table} size {j.size_bytes} has no text row")
            continue
        if t.iterations != j.iterations:
            problems.append(f"size {j.size_bytes}: iterations {t.iterations} (text) vs "
                            f"{j.iterations} (json)")
        # The text prints 2 decimals; allow that rounding and nothing more.
        for name in ("bw_average_raw", "bw_peak_raw", "msg_rate_mpps"):
            a, b = getattr(t, name), getattr(j, name)
            if (a is None) != (b is None) or (a is not None and abs(a - b) > 0.0051 + 1e-9 * abs(b)):
                problems.append(f"size {j.size_bytes}: {name} {a} (text) vs {b} (json)")
        if j.raw_unit is None:
            j.raw_unit = t.raw_unit  # the text names the unit the file leaves out
    return problems
