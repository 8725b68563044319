"""sockperf (the raw TCP round trip): command builder and a strict parser of its ping-pong report.

What sockperf 3.7 (Debian 12's ``sockperf``) prints, and what it means:

- ``sockperf server -i HOST -p PORT --tcp`` echoes every message back.
- ``sockperf ping-pong -i HOST -p PORT --tcp -m SIZE -t SECONDS`` sends one message
  of SIZE bytes, waits for its echo, and repeats. Without ``--full-rtt`` every
  figure it prints is the *latency*: half the measured round trip ("Summary:
  Latency is X usec", ``avg-latency=``). With ``--full-rtt`` (what
  :func:`client_command` always passes) the figures are the whole round trip
  ("Summary: Round trip is X usec", ``avg-rtt=``). The parser reads which one it
  got from that summary line and reports round-trip microseconds either way
  (a latency report is doubled, and says so in ``one_way``).
- It has no machine-readable output: the report is parsed line by line, and a
  report without the summary, the observation count or the 50th percentile is
  a :class:`~peercache.lab.errors.ParseError` naming what is missing.
- It exits 0 even when it failed (connection refused, an unknown option): an
  ``ERROR:`` line or its usage text instead of a report is a
  :class:`~peercache.lab.errors.ToolError` with the kind classified.

The server prints nothing useful when ready; the pair runner waits for its
listening port (never by connecting to it).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from peercache.lab.errors import ParseError, ToolError
from peercache.lab.tidy import Row

TOOL = "sockperf"

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_VERSION = re.compile(r"== version #(\S+) ==")
_SUMMARY = re.compile(r"Summary: (Round trip|Latency) is\s+([0-9.]+) usec")
_AVG = re.compile(r"avg-(rtt|latency)=([0-9.]+) \(std-dev=([0-9.]+)\)")
_OBS = re.compile(r"Total (\d+) observations")
_PCT = re.compile(r"---> percentile\s+([0-9.]+) =\s+([0-9.]+)")
_MINMAX = re.compile(r"---> <(MIN|MAX)> observation =\s+([0-9.]+)")
_VALID = re.compile(r"\[Valid Duration\] RunTime=([0-9.]+) sec; SentMessages=(\d+); ReceivedMessages=(\d+)")
_ENDPOINT = re.compile(r"IP = (\S+)\s+PORT =\s*(\d+) # (TCP|UDP)")
_ERROR = re.compile(r"sockperf: ERROR: (.*)")


def server_command(port: int, bind: str = "127.0.0.1") -> list[str]:
    """argv of a sockperf TCP echo server on *bind*:*port*."""
    _check_port(port)
    _check_host(bind)
    return ["sockperf", "server", "-i", bind, "-p", str(port), "--tcp"]


def client_command(server: str, port: int, msg_size: int = 4096, duration: int = 3,
                   busy_poll: bool = False) -> list[str]:
    """argv of a sockperf TCP ping-pong client reporting round trips (``--full-rtt``).

    ``busy_poll``: the client polls its socket and never sleeps (``--nonblocked --timeout 0``: a
    non-blocking socket and epoll_wait with a zero timeout, so its wait is a loop), the round trip
    without the client's own wake-up; by default it sleeps in epoll_wait until the echo comes."""
    _check_port(port)
    _check_host(server)
    if not 14 <= msg_size <= 65000:
        raise ValueError(f"message size {msg_size} is outside sockperf's 14..65000 bytes")
    if not isinstance(duration, int) or duration < 1:
        raise ValueError(f"duration {duration!r} must be a whole number of seconds >= 1 (sockperf -t)")
    return ["sockperf", "ping-pong", "-i", server, "-p", str(port), "--tcp", "-m", str(msg_size),
            "-t", str(duration), "--full-rtt"] + (["--nonblocked", "--timeout", "0"] if busy_poll else [])


def _check_port(port: int) -> None:
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"{port!r} is not a TCP port")


def _check_host(host: str) -> None:
    if not host or host.startswith("-") or any(c.isspace() for c in host):
        raise ValueError(f"address {host!r} is not a host name or IP address")


@dataclass
class SockperfResult:
    """One ping-pong run's report, in round-trip microseconds."""

    version: str
    protocol: str                      #: TCP or UDP, as the client printed it
    server: str                        #: the address it pinged
    port: int
    one_way: bool                      #: True: sockperf printed latency (RTT/2); the figures here are doubled
    rtt_avg_us: float
    rtt_std_us: float
    observations: int
    run_seconds: float                 #: the valid duration (after sockperf's own warm-up)
    sent: int
    received: int
    percentiles_us: dict[float, float] #: percentile -> round trip (us)
    rtt_min_us: float
    rtt_max_us: float
    source: str = "<text>"
    extra: dict[str, Any] = field(default_factory=dict)

    def rtt_us(self, pct: float) -> float:
        """The round trip at percentile ``pct`` (one sockperf printed)."""
        try:
            return self.percentiles_us[pct]
        except KeyError:
            raise KeyError(f"sockperf printed no percentile {pct} (it printed "
                           f"{sorted(self.percentiles_us)})") from None

    def to_dict(self) -> dict[str, Any]:
        """Plain dict."""
        return dataclasses.asdict(self)


def classify_failure(text: str, host: str = "") -> ToolError | None:
    """The ToolError for a run that printed an error or its usage instead of a report (None: no failure seen)."""
    clean = _ANSI.sub("", text)
    m = _ERROR.search(clean)
    if m:
        msg = m.group(1).strip()
        low = msg.lower()
        if "connect" in low or "refused" in low:
            return ToolError(host=host, tool=TOOL, kind="cannot_connect",
                             detail=f"cannot connect (sockperf said '{msg}')",
                             check="start `sockperf server` first on the same -i address and -p port, "
                                   "both with --tcp")
        if "bind" in low or "in use" in low:
            return ToolError(host=host, tool=TOOL, kind="port_in_use",
                             detail=f"cannot listen (sockperf said '{msg}')",
                             check="another process holds the port: `ss -ltnp`, or use another -p")
        return ToolError(host=host, tool=TOOL, kind="failed", detail=f"sockperf said '{msg}'",
                         check="read both sides' logs")
    if "Usage: sockperf" in clean and not _SUMMARY.search(clean):
        return ToolError(host=host, tool=TOOL, kind="unknown_option",
                         detail="sockperf printed its usage instead of a report (it rejected its command line)",
                         check="compare the command with `sockperf ping-pong --help` of that host's version")
    return None


def parse_output(text: str, source: str = "<text>", host: str = "") -> SockperfResult:
    """Parse a ``sockperf ping-pong`` report; ToolError for a failed run, ParseError for an unreadable one."""
    failure = classify_failure(text, host)
    if failure is not None:
        raise failure
    lines = [_ANSI.sub("", ln) for ln in text.splitlines()]
    found: dict[str, Any] = {}
    pcts: dict[float, float] = {}
    for no, ln in enumerate(lines, 1):
        if (m := _VERSION.search(ln)) and "version" not in found:
            found["version"] = m.group(1)
        elif m := _ENDPOINT.search(ln):
            found["endpoint"] = (m.group(1), int(m.group(2)), m.group(3))
        elif m := _VALID.search(ln):
            found["valid"] = (float(m.group(1)), int(m.group(2)), int(m.group(3)))
        elif m := _AVG.search(ln):
            found["avg"] = (m.group(1), float(m.group(2)), float(m.group(3)))
        elif m := _SUMMARY.search(ln):
            found["summary"] = (m.group(1), float(m.group(2)), no, ln)
        elif m := _OBS.search(ln):
            found["observations"] = int(m.group(1))
        elif m := _PCT.search(ln):
            pcts[float(m.group(1))] = float(m.group(2))
        elif m := _MINMAX.search(ln):
            found[m.group(1).lower()] = float(m.group(2))
        elif "percentile" in ln and "--->" in ln:
            raise ParseError(TOOL, "a percentile line not in the form '---> percentile P = VALUE'",
                             source=source, line_no=no, line=ln)
    for key, what in (("summary", "the 'Summary: Round trip is' / 'Latency is' line"),
                      ("avg", "the avg-rtt / avg-latency line"),
                      ("observations", "the 'Total N observations' line"),
                      ("valid", "the '[Valid Duration]' line"),
                      ("endpoint", "the 'IP = ... PORT = ...' line"),
                      ("min", "the <MIN> observation"), ("max", "the <MAX> observation")):
        if key not in found:
            raise ParseError(TOOL, f"no {what} (a truncated report, or not a ping-pong run?)", source=source)
    if 50.0 not in pcts:
        raise ParseError(TOOL, "no 'percentile 50.000' line (a truncated report?)", source=source)
    kind, summary_value, no, ln = found["summary"]
    avg_kind, avg, std = found["avg"]
    one_way = kind == "Latency"
    if (avg_kind == "latency") != one_way:
        raise ParseError(TOOL, f"the summary says {kind.lower()} but the average is avg-{avg_kind}",
                         source=source, line_no=no, line=ln)
    if found["observations"] < 1:
        raise ParseError(TOOL, "0 observations: the run measured nothing", source=source)
    scale = 2.0 if one_way else 1.0
    server, port, proto = found["endpoint"]
    secs, sent, received = found["valid"]
    return SockperfResult(
        version=found.get("version", "unknown"), protocol=proto, server=server, port=port, one_way=one_way,
        rtt_avg_us=avg * scale, rtt_std_us=std * scale, observations=found["observations"],
        run_seconds=secs, sent=sent, received=received,
        percentiles_us={p: v * scale for p, v in sorted(pcts.items())},
        rtt_min_us=found["min"] * scale, rtt_max_us=found["max"] * scale, source=source,
        extra={"printed": "latency (RTT/2), doubled here" if one_way else "round trip (--full-rtt)"})


_ROW_FIELDS = {f.name for f in dataclasses.fields(Row)}

#: tidy metric -> percentile of the report
PERCENTILE_METRICS = {"rtt_p50": 50.0, "rtt_p99": 99.0, "rtt_p999": 99.9}


def to_rows(result: SockperfResult, **context: Any) -> list[Row]:
    """Tidy rows: round-trip p50 / p99 / p99.9 and average (us), and the observation count."""
    bad = set(context) - _ROW_FIELDS
    if bad:
        raise TypeError(f"unknown Row fields in context: {sorted(bad)}")
    base = {"experiment": "", "scenario": "", "run_id": "", "tool": TOOL, "protocol": result.protocol.lower(),
            "side": "client"}
    base.update(context)
    extra = dict(base.pop("extra", {}) or {}, version=result.version, one_way_printed=result.one_way,
                 source=result.source, observations=result.observations)
    raw = 0.5 if result.one_way else 1.0    # the number exactly as sockperf printed it
    rows = []
    for metric, pct in PERCENTILE_METRICS.items():
        v = result.percentiles_us.get(pct)
        if v is None:
            rows.append(Row(metric=metric, value=None, unit="us", status="not_measured",
                            reason=f"sockperf printed no percentile {pct}", extra=dict(extra), **base))
        else:
            rows.append(Row(metric=metric, value=v, unit="us", raw_value=v * raw, raw_unit="us",
                            extra=dict(extra), **base))
    rows.append(Row(metric="rtt_avg", value=result.rtt_avg_us, unit="us", raw_value=result.rtt_avg_us * raw,
                    raw_unit="us", extra=dict(extra, std_dev_us=result.rtt_std_us), **base))
    rows.append(Row(metric="observations", value=float(result.observations), unit="count", extra=dict(extra),
                    **base))
    return rows
