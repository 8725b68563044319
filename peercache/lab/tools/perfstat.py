"""``perf stat``: wrap a command, parse its CSV (-x), JSON (-j) or default text output.

A counter perf could not read is kept as such: ``<not supported>`` (no such
hardware event here, e.g. in a VM) and ``<not counted>`` (event never
scheduled) give ``value=None`` with that status, never 0. The percentage of
time the event was running is kept: below 100 perf scaled the count up from a
multiplexed sample. IPC is derived only when both instructions and cycles were
counted.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

from peercache.lab.errors import ParseError
from peercache.lab.tidy import Row

#: The event set of the published message-size sweep (QP=4, 1K..1M).
DEFAULT_EVENTS: tuple[str, ...] = (
    "instructions", "cycles", "L1-dcache-load-misses", "LLC-load-misses", "LLC-store-misses",
    "cache-misses", "cache-references", "dTLB-load-misses", "iTLB-load-misses",
    "context-switches", "cpu-migrations", "task-clock",
)

_STATUS = {"<not supported>": "not_supported", "<not counted>": "not_counted"}
TOOL = "perf stat"


@dataclass
class Counter:
    """One perf counter as read: value (None when perf could not count it), unit, status."""

    event: str                    #: event name as printed (may carry :u / cpu_core/.../)
    value: float | None           #: None when status is not ok
    unit: str                     #: "" for plain counts, "msec" for task-clock, ...
    status: str                   #: "ok", "not_supported", "not_counted"
    pcnt_running: float | None = None  #: % of the run the event was on the PMU (None: not printed)
    runtime_ns: int | None = None
    variance_pct: float | None = None  #: with -r: run-to-run variation
    line_no: int = 0

    @property
    def base_event(self) -> str:
        """Event name without PMU prefix and modifiers (cpu_core/cycles/u -> cycles)."""
        e = self.event
        m = re.fullmatch(r"[\w.-]+/([^/]+)/\w*", e)
        if m:
            e = m.group(1)
        return e.split(":")[0]

    def to_dict(self) -> dict[str, Any]:
        """Plain dict."""
        return dataclasses.asdict(self)


def wrap(argv: Sequence[str], out_file: str, events: Sequence[str] = DEFAULT_EVENTS,
         sep: str = ",") -> list[str]:
    """argv that runs *argv* under ``perf stat -x<sep> -o <out_file> -e <events>``."""
    if not argv:
        raise ValueError("nothing to wrap: argv is empty")
    if not events:
        raise ValueError("give at least one perf event")
    if not sep or any(c.isspace() for c in sep) or any(sep in e for e in events):
        raise ValueError(f"separator {sep!r} is empty, whitespace, or occurs in an event name")
    return ["perf", "stat", f"-x{sep}", "-o", str(out_file), "-e", ",".join(events), "--",
            *map(str, argv)]


def _value(token: str, source: str, line_no: int, line: str) -> tuple[float | None, str]:
    token = token.strip()
    if token in _STATUS:
        return None, _STATUS[token]
    try:
        v = float(token)
    except ValueError:
        raise ParseError(TOOL, f"counter value {token!r} is not a number", source=source,
                         line_no=line_no, line=line) from None
    if not math.isfinite(v):
        raise ParseError(TOOL, f"counter value {token!r} is not finite", source=source,
                         line_no=line_no, line=line)
    return v, "ok"


def _opt_float(token: str, source: str, line_no: int, line: str, what: str) -> float | None:
    token = token.strip().rstrip("%")
    if token == "":
        return None
    try:
        return float(token)
    except ValueError:
        raise ParseError(TOOL, f"{what} {token!r} is not a number", source=source,
                         line_no=line_no, line=line) from None


def _finish(counters: list[Counter], source: str, last: tuple[int, str]) -> list[Counter]:
    if not counters:
        raise ParseError(TOOL, "no counter lines found (did perf stat run? empty -o file?)",
                         source=source, line_no=last[0] or None, line=last[1] if last[0] else None)
    return counters


def parse_csv(text: str, sep: str = ",", source: str = "<csv>") -> list[Counter]:
    """Parse ``perf stat -x<sep>`` output into counters; raises ParseError naming the line."""
    counters: list[Counter] = []
    last = (0, "")
    for line_no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # "# started on ..." header of -o files, blank separators
        last = (line_no, raw)
        f = line.split(sep)
        if len(f) < 3:
            raise ParseError(TOOL, f"a counter line has at least 3 {sep!r}-separated fields "
                             "(value, unit, event)", source=source, line_no=line_no, line=raw)
        if f[0] == "" and f[2] == "":
            continue  # metric-only continuation line (perf's own derived metric); we derive ours
        if re.fullmatch(r"(CPU\d+|S\d+(-D\d+)?(-C\d+)?|N\d+)", f[0]):
            raise ParseError(TOOL, "per-CPU/socket/node aggregation (-A, --per-*) is not "
                             "supported; run perf stat without it", source=source,
                             line_no=line_no, line=raw)
        value, status = _value(f[0], source, line_no, raw)
        event = f[2].strip()
        if not event:
            raise ParseError(TOOL, "counter line without an event name", source=source,
                             line_no=line_no, line=raw)
        rest = f[3:]
        variance = None
        if rest and rest[0].strip().endswith("%"):
            variance = _opt_float(rest[0], source, line_no, raw, "variance")
            rest = rest[1:]
        runtime = _opt_float(rest[0], source, line_no, raw, "run time") if len(rest) > 0 else None
        pcnt = _opt_float(rest[1], source, line_no, raw, "percentage running") if len(rest) > 1 else None
        counters.append(Counter(event=event, value=value, unit=f[1].strip(), status=status,
                                pcnt_running=pcnt, variance_pct=variance,
                                runtime_ns=None if runtime is None else int(runtime),
                                line_no=line_no))
    return _finish(counters, source, last)


def parse_json(text: str, source: str = "<json>") -> list[Counter]:
    """Parse ``perf stat -j`` output (one JSON object per line) into counters."""
    counters: list[Counter] = []
    last = (0, "")
    for line_no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        last = (line_no, raw)
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ParseError(TOOL, f"not a JSON object ({e.msg})", source=source,
                             line_no=line_no, line=raw) from None
        if not isinstance(obj, dict):
            raise ParseError(TOOL, "not a JSON object", source=source, line_no=line_no, line=raw)
        if "event" not in obj and "counter-value" not in obj:
            continue  # metric-only line
        for key in ("counter-value", "event"):
            if key not in obj:
                raise ParseError(TOOL, f"missing key {key!r}", source=source,
                                 line_no=line_no, line=raw)
        value, status = _value(str(obj["counter-value"]), source, line_no, raw)
        runtime = obj.get("event-runtime")
        pcnt = obj.get("pcnt-running")
        var = obj.get("variance")
        for name, v in (("event-runtime", runtime), ("pcnt-running", pcnt), ("variance", var)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise ParseError(TOOL, f"{name} is not a number: {v!r}", source=source,
                                 line_no=line_no, line=raw)
        counters.append(Counter(event=str(obj["event"]), value=value, unit=str(obj.get("unit", "")),
                                status=status, pcnt_running=None if pcnt is None else float(pcnt),
                                runtime_ns=None if runtime is None else int(runtime),
                                variance_pct=None if var is None else float(var), line_no=line_no))
    return _finish(counters, source, last)


_TEXT_LINE = re.compile(
    r"^\s*(?P<val><not supported>|<not counted>|\d[\d,]*(?:\.\d+)?)\s+"
    r"(?:(?P<unit>msec|usec|nsec|ns|sec|MiB|Joules|W)\s+)?(?P<event>[^\s#(]+)(?P<rest>.*)$")


def parse_text(text: str, source: str = "<text>") -> list[Counter]:
    """Parse perf stat's default human-readable report (old logs) into counters."""
    counters: list[Counter] = []
    started = False
    last = (0, "")
    for line_no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("Performance counter stats for"):
            started = True
            continue
        if not started or line.startswith("#"):
            continue
        last = (line_no, raw)
        if re.search(r"seconds (time elapsed|user|sys)$", line):
            continue
        m = _TEXT_LINE.match(raw)
        if not m:
            raise ParseError(TOOL, "not a counter line of perf stat's report", source=source,
                             line_no=line_no, line=raw)
        value, status = _value(m.group("val").replace(",", ""), source, line_no, raw)
        pm = re.search(r"\((\d+(?:\.\d+)?)%\)\s*$", m.group("rest"))
        counters.append(Counter(event=m.group("event"), value=value, unit=m.group("unit") or "",
                                status=status, line_no=line_no,
                                pcnt_running=float(pm.group(1)) if pm else (100.0 if value is not None else None)))
    if not started:
        raise ParseError(TOOL, "no 'Performance counter stats for' line", source=source)
    return _finish(counters, source, last)


def parse(text: str, source: str = "<perf>", sep: str = ",") -> list[Counter]:
    """Parse any of the three formats, chosen from the content."""
    body = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    if any(ln.startswith("Performance counter stats for") for ln in body):
        return parse_text(text, source)
    if body and body[0].startswith("{"):
        return parse_json(text, source)
    return parse_csv(text, sep, source)


def derived(counters: Sequence[Counter]) -> dict[str, dict[str, Any]]:
    """Derived metrics; today IPC = instructions / cycles, only when both were counted."""
    by = {c.base_event: c for c in counters}
    ins, cyc = by.get("instructions"), by.get("cycles")
    if ins is None or cyc is None:
        missing = [n for n, c in (("instructions", ins), ("cycles", cyc)) if c is None]
        return {"ipc": {"value": None, "status": "not_measured",
                        "reason": f"{' and '.join(missing)} not in the event list"}}
    for c in (ins, cyc):
        if c.status != "ok":
            return {"ipc": {"value": None, "status": c.status,
                            "reason": f"{c.event}: {c.status.replace('_', ' ')}"}}
    if cyc.value == 0:
        return {"ipc": {"value": None, "status": "not_measured", "reason": "cycles counted 0"}}
    return {"ipc": {"value": ins.value / cyc.value, "status": "ok", "reason": None}}


_ROW_FIELDS = {f.name for f in dataclasses.fields(Row)}


def to_rows(counters: Sequence[Counter], **context: Any) -> list[Row]:
    """Tidy rows: one per counter (metric = event name) plus the derived IPC."""
    bad = set(context) - _ROW_FIELDS
    if bad:
        raise TypeError(f"unknown Row fields in context: {sorted(bad)}")
    base = {"experiment": "", "scenario": "", "run_id": "", "tool": "perf"}
    base.update(context)
    extra0 = dict(base.pop("extra", {}) or {})
    rows: list[Row] = []
    for c in counters:
        unit = c.unit or "count"
        extra = dict(extra0, pcnt_running=c.pcnt_running, runtime_ns=c.runtime_ns,
                     variance_pct=c.variance_pct, line=c.line_no)
        if c.status == "ok":
            rows.append(Row(metric=c.event, value=c.value, unit=unit, raw_value=c.value,
                            raw_unit=c.unit, extra=extra, **base))
        else:
            rows.append(Row(metric=c.event, value=None, unit=unit, status=c.status,
                            reason=f"perf stat printed <{c.status.replace('_', ' ')}>",
                            raw_unit=c.unit, extra=extra, **base))
    ipc = derived(counters)["ipc"]
    rows.append(Row(metric="ipc", value=ipc["value"], unit="ratio", status=ipc["status"],
                    reason=ipc["reason"], extra=dict(extra0, derived_from="instructions/cycles"),
                    **base))
    return rows
