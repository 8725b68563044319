"""The reader of perftest's text report (stdout): bandwidth and latency tables, the header block.

Part of :mod:`peercache.lab.tools.perftest` (its docstring says the units, sides and formats).
"""
from __future__ import annotations

import math
import re
from typing import Any

from peercache.lab.errors import ParseError
from peercache.lab.tools.perftest.results import (BW_UNITS, PerftestLatencyResult, PerftestLatencyRow,
                                                  PerftestResult, PerftestRow)

#: The perftest latency tools whose output :func:`parse_latency_output` reads.
LAT_TOOLS = ("ib_read_lat", "ib_write_lat", "ib_send_lat")

_SEPARATOR = re.compile(r"^-{20,}$")
# Bandwidth table header. perftest 1.x printed no MsgRate column (4 columns).
_TABLE_HEADER = re.compile(
    r"^#bytes\s+#iterations\s+BW peak\[(?P<u1>[^\]]+)\]\s+BW average\[(?P<u2>[^\]]+)\]"
    r"(?P<rate>\s+MsgRate\[Mpps\])?(?P<rest>.*)$")
_LAT_T = r"t_min\[usec\]\s+t_max\[usec\]\s+t_typical\[usec\]"
#: Latency table layouts, tried in this order: name, header, the row's columns after the
#: size and iteration count. "old": releases before 2016; "duration": -D (no per-iteration
#: samples, so only the average and the transaction rate).
_LAT_HEADERS: list[tuple[str, re.Pattern[str], tuple[str, ...]]] = [
    ("full", re.compile(rf"^#bytes\s+#iterations\s+{_LAT_T}\s+t_avg\[usec\]\s+t_stdev\[usec\]"
                        r"\s+99% percentile\[usec\]\s+99\.9% percentile\[usec\](?P<rest>.*)$"),
     ("t_min_us", "t_max_us", "t_typical_us", "t_avg_us", "t_stdev_us", "p99_us", "p999_us")),
    ("old", re.compile(rf"^#bytes\s+#iterations\s+{_LAT_T}(?P<rest>.*)$"),
     ("t_min_us", "t_max_us", "t_typical_us")),
    ("duration", re.compile(r"^#bytes\s+#iterations\s+t_avg\[usec\]\s+tps average(?P<rest>.*)$"),
     ("t_avg_us", "tps")),
    ("old_duration", re.compile(r"^#bytes\s+#iterations\s+t_avg\[usec\](?P<rest>.*)$"),
     ("t_avg_us",)),
]
_TITLES = {"bw": re.compile(r"^(?P<title>\S.*\bBW Test)$"),
           "lat": re.compile(r"^(?P<title>\S.*\bLatency Test)$")}
_BOTH = re.compile(r"^(Local|Remote) results:$")
# A result row with text run into its last number, e.g. "... 0.000299Error: BW result is below
# bw limit" when stderr and stdout share one file.
_GLUED = re.compile(r"^(?P<nums>[\d.\s]*\d)(?P<text>[A-Za-z].*)$")
# Lines that real runs print between or inside tables; kept as notes.
_NOISE = re.compile(
    r"^(Conflicting CPU frequency|CPU Frequency is not max|WARNING|Warning|"
    r"deallocating|destroying|initializing|allocated|cuMemAlloc|Picking device|"
    r"Requested mtu|Changing to|Perftest v|Test with events|Using )", re.IGNORECASE)
_IGNORED = re.compile(
    r"^(\*+|\* Waiting for client.*\*|Waiting for client rdma_cm QP to connect|"
    r"(local|remote) address:.*|GID:.*|Please run the same command.*)$")
_HEADER_KEYS = {
    "Dual-port", "Device", "Number of qps", "Transport type", "Connection type", "Using SRQ",
    "PCIe relax order", "ibv_wr* API", "TX depth", "RX depth", "CQ Moderation", "Mtu",
    "Link type", "GID index", "GID index2", "Max inline data", "Outstand reads", "rdma_cm QPs",
    "Data ex. method", "Post List", "Recv Post List", "Buffer size", "TOS", "Using Enhanced Reorder",
    "Use ROCm memory", "Use CUDA memory", "Block Size", "DCS num streams", "DCS active num streams",
    "Gid index",                 # perftest up to ~3.0 (2015): later "GID index"
    "Lock-free", "Using DDP",    # perftest 24.10 / 25.01 and later, second column of a line
}
# A header key where a "key : value" pair starts: at the line start, or after a tab or two
# spaces (the tab runs between the two pairs of a line are often pasted as spaces).
_KEY_AT = re.compile(
    r"(?:^|(?<=\t)|(?<=\s\s))(?P<key>"
    + "|".join(re.escape(k) for k in sorted(_HEADER_KEYS, key=len, reverse=True))
    + r")[ \t]*:")


def _header_pairs(line: str) -> list[tuple[str, str]] | None:
    """The "key : value" pairs of a header line, or None if it is not one (unknown key)."""
    s = line.strip()
    marks = list(_KEY_AT.finditer(s))
    if not marks or marks[0].start() != 0:
        return None
    pairs = []
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(s)
        pairs.append((m.group("key"), s[m.end():end].strip()))
    return pairs


def _num(tool: str, source: str, line_no: int, line: str, token: str, kind: type) -> Any:
    try:
        v = kind(token)
    except ValueError:
        raise ParseError(tool, f"column value {token!r} is not a number", source=source,
                         line_no=line_no, line=line) from None
    if isinstance(v, float) and not math.isfinite(v):
        raise ParseError(tool, f"column value {token!r} is not finite", source=source,
                         line_no=line_no, line=line)
    return v


def _open_table(kind: str, line: str, source: str, line_no: int, raw: str) -> dict[str, Any] | None:
    """The table a '#bytes ...' header line opens; None if it is not a table header at all."""
    tool = "perftest"
    bw = _TABLE_HEADER.match(line)
    lat = next(((name, m, cols) for name, rx, cols in _LAT_HEADERS for m in [rx.match(line)] if m),
               None)
    if kind == "bw":
        if lat:
            raise ParseError(tool, "this is a latency table; only the bandwidth tests "
                             "(ib_*_bw) are parsed here, use parse_latency_output",
                             source=source, line_no=line_no, line=raw)
        if not bw:
            if line.startswith("#bytes"):
                raise ParseError(tool, "unrecognised result table header (not the header of a "
                                 "perftest bandwidth table; a damaged paste or an unknown "
                                 "release)", source=source, line_no=line_no, line=raw)
            return None
        u1, u2, rest = bw.group("u1"), bw.group("u2"), bw.group("rest").strip()
        if u1 != u2 or u1 not in BW_UNITS:
            raise ParseError(tool, f"unknown bandwidth unit {u1!r}/{u2!r} "
                             f"(known: {', '.join(BW_UNITS)})", source=source,
                             line_no=line_no, line=raw)
        if rest not in ("", "CPU_Util[%]"):
            raise ParseError(tool, "unsupported result columns (per-port or QoS reports "
                             "are not read)", source=source, line_no=line_no, line=raw)
        return {"unit": u1, "rate": bw.group("rate") is not None, "cpu": rest == "CPU_Util[%]"}
    if bw:
        raise ParseError(tool, "this is a bandwidth table; parse it with parse_output",
                         source=source, line_no=line_no, line=raw)
    if not lat:
        if line.startswith("#bytes"):
            raise ParseError(tool, "unrecognised result table header (not the header of a "
                             "perftest latency table; a damaged paste or an unknown release)",
                             source=source, line_no=line_no, line=raw)
        return None
    name, m, cols = lat
    rest = m.group("rest").strip()
    if rest not in ("", "CPU_Util[%]"):
        raise ParseError(tool, f"unsupported result columns after the {name} latency columns",
                         source=source, line_no=line_no, line=raw)
    return {"layout": name, "cols": cols, "cpu": rest == "CPU_Util[%]"}


def _parse_text(text: str, source: str, kind: str) -> PerftestResult:
    """The shared reader of perftest's text report; *kind* is "bw" or "lat"."""
    tool = "perftest"
    res: PerftestResult = (PerftestResult(source=source) if kind == "bw"
                           else PerftestLatencyResult(source=source))
    title_rx = _TITLES[kind]
    table: dict[str, Any] | None = None   # open table: its spec, kind, start line, rows
    next_kind = "main"
    tables_seen = 0
    last = (0, "")
    in_header_block = False
    for line_no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        last = (line_no, raw)
        if _SEPARATOR.match(line):
            if table is not None:
                if not table["rows"]:
                    raise ParseError(tool, f"result table opened at line {table['start']} has no "
                                     "rows before its closing line; output truncated or corrupt",
                                     source=source, line_no=line_no, line=raw)
                table = None
            elif res.test is not None and not res.rows and in_header_block:
                in_header_block = False
            continue
        if line.startswith("#bytes"):
            spec = _open_table(kind, line, source, line_no, raw)
            if spec is not None:
                if table is not None and table["rows"]:
                    raise ParseError(tool, f"a new table header inside the table opened at line "
                                     f"{table['start']}; output corrupt", source=source,
                                     line_no=line_no, line=raw)
                if table is not None:
                    continue  # the same header printed twice (two writers on one log)
                table = dict(spec, kind=next_kind, start=line_no, rows=[])
                next_kind = "main"
                tables_seen += 1
                in_header_block = False
                continue
        if table is not None:
            if line[0].isdigit():
                tokens = line.split()
                if kind == "bw":
                    want = 4 + int(table["rate"]) + int(table["cpu"])
                else:
                    want = 2 + len(table["cols"]) + int(table["cpu"])
                if len(tokens) != want:
                    glued = _GLUED.match(line)
                    if glued and len(glued.group("nums").split()) == want:
                        raise ParseError(tool, f"text {glued.group('text')!r} is glued to the end of a "
                                         "result row: stdout and stderr went into one log (stderr is "
                                         "unbuffered, stdout is not); parse stdout alone",
                                         source=source, line_no=line_no, line=raw)
                    raise ParseError(tool, f"result row has {len(tokens)} columns, the header at "
                                     f"line {table['start']} has {want}; line truncated or corrupt",
                                     source=source, line_no=line_no, line=raw)
                size = _num(tool, source, line_no, raw, tokens[0], int)
                iters = _num(tool, source, line_no, raw, tokens[1], int)
                vals = [_num(tool, source, line_no, raw, t, float) for t in tokens[2:]]
                cpu = vals.pop() if table["cpu"] else None
                if kind == "bw":
                    peak, avg = vals[0], vals[1]
                    row: Any = PerftestRow(
                        table=table["kind"], line_no=line_no, size_bytes=size, iterations=iters,
                        raw_unit=table["unit"], bw_average_raw=avg,
                        bw_peak_raw=None if peak == 0.0 else peak,
                        msg_rate_mpps=vals[2] if table["rate"] else None, cpu_util_pct=cpu)
                else:
                    row = PerftestLatencyRow(table=table["kind"], line_no=line_no, size_bytes=size,
                                             iterations=iters, cpu_util_pct=cpu,
                                             **dict(zip(table["cols"], vals)))
                table["rows"].append(row)
                res.rows.append(row)
                continue
            if _NOISE.match(line):
                res.notes.append(f"line {line_no}: {line}")
                continue
            raise ParseError(tool, f"unexpected line inside the result table opened at line "
                             f"{table['start']}", source=source, line_no=line_no, line=raw)
        m = _BOTH.match(line)
        if m and kind == "bw":
            next_kind = m.group(1).lower()
            continue
        m = title_rx.match(line)
        if m and res.test is None:
            res.test = m.group("title")
            in_header_block = True
            continue
        if in_header_block:
            pairs = _header_pairs(raw)
            if pairs:
                for k, v in pairs:
                    res.header[k] = v
                continue
        if _IGNORED.match(line):
            continue
        res.notes.append(f"line {line_no}: {line}")
    what = "bandwidth" if kind == "bw" else "latency"
    if table is not None:
        raise ParseError(tool, f"result table opened at line {table['start']} is not closed "
                         "by a separator line; output truncated", source=source,
                         line_no=last[0], line=last[1])
    if tables_seen == 0 or not res.rows:
        raise ParseError(tool, f"no {what} result table found (a failed run? see "
                         "classify_failure)", source=source,
                         line_no=last[0] or None, line=last[1] if last[0] else None)
    # The header block must be well-formed where it gives numbers the rows rely on.
    for key in ("Number of qps", "Mtu", "GID index", "Gid index", "TX depth", "RX depth"):
        if key in res.header and res._header_int(key) is None:
            raise ParseError(tool, f"header field {key!r} is not a number: "
                             f"{res.header[key]!r}", source=source)
    return res


def parse_output(text: str, source: str = "<text>") -> PerftestResult:
    """Parse the stdout of a perftest bandwidth run; raises ParseError naming the bad line."""
    return _parse_text(text, source, "bw")


def parse_latency_output(text: str, source: str = "<text>") -> PerftestLatencyResult:
    """Parse the stdout of a perftest latency run (ib_*_lat); raises ParseError naming the bad line.

    Rows keep the printed usec values; layouts: the nine-column table of perftest 3.4 and
    later, the t_min/t_max/t_typical table of older releases, and duration mode (-D).
    """
    res = _parse_text(text, source, "lat")
    assert isinstance(res, PerftestLatencyResult)
    return res


def parse_header(text: str, source: str = "<text>") -> PerftestResult:
    """The title and header block of any perftest output, rows ignored; never raises.

    For failed runs (no result table), whose header still says the device, GID index,
    MTU and link type that were used. A latency title gives a PerftestLatencyResult (so
    ``tool`` is ib_*_lat).
    """
    test: str | None = None
    header: dict[str, str] = {}
    notes: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if test is None:
            m = _TITLES["bw"].match(line) or _TITLES["lat"].match(line)
            if m:
                test = m.group("title")
            continue
        if _SEPARATOR.match(line) or line.startswith("#bytes"):
            break
        pairs = _header_pairs(raw)
        if pairs:
            header.update(pairs)
        elif not _IGNORED.match(line):
            notes.append(line)
    cls = PerftestLatencyResult if test and _TITLES["lat"].match(test) else PerftestResult
    return cls(source=source, test=test, header=header, notes=notes)
