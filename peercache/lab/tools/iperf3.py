"""iperf3 (the raw TCP baseline): command builder and a strict parser of its ``-J`` JSON.

Both sides always run with ``-J``. A JSON document with an ``"error"`` key is
a failed run and raises :class:`ToolError` with its kind classified; a document
without the keys a TCP result must have raises :class:`ParseError` naming the
missing path. Numbers iperf3 does not actually report (the client's CPU as
seen from the server, retransmits on the receiving side) are None, not 0.
"""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Any

from peercache.lab.errors import ParseError, ToolError
from peercache.lab.tidy import Row

TOOL = "iperf3"

#: What an iperf3 server prints when it listens -- but only without -J. With -J
#: (as built here) it prints nothing until the test ends, so wait for the
#: listening socket instead (see :func:`is_listening`); never probe by
#: connecting: a one-off server takes the probe as its one test.
SERVER_READY_PATTERN = re.compile(r"Server listening on \d+")


def server_command(port: int, bind: str = "127.0.0.1", one_off: bool = True) -> list[str]:
    """argv of an iperf3 server on *bind*:*port* with JSON output (-1: exit after one test)."""
    _check_port(port)
    argv = ["iperf3", "-s", "-J", "-B", bind, "-p", str(port)]
    if one_off:
        argv.append("-1")
    return argv


#: The largest TCP block iperf3 writes or reads at a time (-l); iperf3 3.x refuses more
#: ("block size too large (maximum = 1048576 bytes)").
MAX_LENGTH = 1 << 20


def client_command(server: str, port: int, length: int = 131072, streams: int = 1,
                   duration: int = 5, bind: str | None = None, reverse: bool = False,
                   window: int | None = None) -> list[str]:
    """argv of an iperf3 TCP client with JSON output; ``window``: -w, the socket buffer each side asks
    per stream (SO_SNDBUF and SO_RCVBUF; None leaves them to the kernel's autotuning)."""
    _check_port(port)
    if not server or server.startswith("-"):
        raise ValueError(f"server address {server!r} is not a host name or IP address")
    if length < 1 or streams < 1 or duration < 1:
        raise ValueError(f"length ({length}), streams ({streams}) and duration ({duration}) "
                         "must be >= 1")
    if length > MAX_LENGTH:
        raise ValueError(f"length {length} is over iperf3's largest TCP block ({MAX_LENGTH} bytes, -l); "
                         "a larger request has no iperf3 counterpart")
    if window is not None and window < 1:
        raise ValueError(f"window {window} must be >= 1 byte (or None: the kernel's autotuning)")
    argv = ["iperf3", "-c", server, "-p", str(port), "-J", "-l", str(length),
            "-P", str(streams), "-t", str(duration)]
    if window is not None:
        argv += ["-w", str(window)]
    if bind is not None:
        argv += ["-B", bind]
    if reverse:
        argv.append("-R")
    return argv


def _check_port(port: int) -> None:
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"{port!r} is not a TCP port")


def is_listening(proc_net_tcp: str, port: int, addr: str = "127.0.0.1") -> bool:
    """True when /proc/net/tcp text shows a LISTEN socket on *addr*:*port* (or on 0.0.0.0)."""
    def hex_addr(a: str) -> str:
        return "".join(f"{int(o):02X}" for o in reversed(a.split(".")))
    wanted = {f"{hex_addr(addr)}:{port:04X}", f"00000000:{port:04X}"}
    for line in proc_net_tcp.splitlines()[1:]:
        f = line.split()
        if len(f) > 3 and f[1] in wanted and f[3] == "0A":  # 0A = TCP_LISTEN
            return True
    return False


@dataclass
class Iperf3Result:
    """The totals of one iperf3 TCP test as one side saw them."""

    role: str                         #: "client" or "server"
    version: str
    protocol: str
    num_streams: int
    length: int                       #: -l block size, bytes
    duration: int                     #: -t seconds requested
    reverse: bool
    sent_bytes: int
    sent_seconds: float
    sent_bps: float                   #: bits/s
    received_bytes: int
    received_seconds: float
    received_bps: float
    retransmits: int | None           #: None when iperf3 did not report it (receiver side)
    cpu_local_pct: float
    cpu_remote_pct: float | None      #: None on the server: iperf3 prints 0 there, not a measurement
    window: int | None = None         #: -w bytes asked per socket (start.sock_bufsize); None: not set (autotuned)
    sndbuf_actual: int | None = None  #: SO_SNDBUF / SO_RCVBUF as the kernel set them on this side, bytes
    rcvbuf_actual: int | None = None
    missing: dict[str, str] = field(default_factory=dict)  #: field -> why it is None
    streams: list[dict[str, Any]] = field(default_factory=list)
    source: str = "<json>"

    def to_dict(self) -> dict[str, Any]:
        """Plain dict."""
        return dataclasses.asdict(self)


def _get(doc: Any, path: str, kind: type | tuple[type, ...], source: str) -> Any:
    cur = doc
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise ParseError(TOOL, f"missing key {path} (a truncated or non-TCP result?)",
                             source=source)
        cur = cur[part]
    if isinstance(cur, bool) and kind is not bool:
        raise ParseError(TOOL, f"{path} is {cur!r}, expected {kind}", source=source)
    if not isinstance(cur, kind):
        raise ParseError(TOOL, f"{path} is {cur!r}, expected {kind}", source=source)
    return cur


_NUM = (int, float)


def classify_error(message: str, host: str = "") -> ToolError:
    """The ToolError for the text of an iperf3 ``"error"`` key."""
    low = message.lower()
    if "unable to connect" in low or "connection refused" in low or "no route" in low:
        return ToolError(host=host, tool=TOOL, kind="cannot_connect",
                         detail=f"cannot connect (iperf3 said '{message}')",
                         check="start the server first, check the -p port and that the address "
                               "is reachable; a one-off (-1) server serves one test only")
    if "address already in use" in low or "unable to start listener" in low:
        return ToolError(host=host, tool=TOOL, kind="port_in_use",
                         detail=f"cannot listen (iperf3 said '{message}')",
                         check="another iperf3 server holds the port: `ss -ltnp`, or use another -p")
    if "unrecognized option" in low or "invalid option" in low or "parameter" in low:
        return ToolError(host=host, tool=TOOL, kind="unknown_option",
                         detail=f"iperf3 rejected its command line ('{message}')",
                         check="compare with `iperf3 --help` of that host's version")
    return ToolError(host=host, tool=TOOL, kind="failed", detail=f"iperf3 said '{message}'",
                     check="read the iperf3 logs of both sides")


def parse_json(text: str, source: str = "<json>", host: str = "") -> Iperf3Result:
    """Parse iperf3 -J output; ToolError for an error document, ParseError for a bad one."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        lines = text.splitlines()
        bad = lines[e.lineno - 1] if 0 < e.lineno <= len(lines) else None
        raise ParseError(TOOL, f"not valid JSON ({e.msg}, column {e.colno}); truncated?",
                         source=source, line_no=e.lineno, line=bad) from None
    if not isinstance(doc, dict):
        raise ParseError(TOOL, "top level is not a JSON object", source=source)
    if "error" in doc:
        raise classify_error(str(doc["error"]), host)
    start = _get(doc, "start", dict, source)
    ts = "start.test_start"
    protocol = _get(doc, f"{ts}.protocol", str, source)
    if protocol != "TCP":
        raise ParseError(TOOL, f"protocol {protocol!r}: only TCP results are read", source=source)
    role = "server" if "accepted_connection" in start else "client"
    if role == "client" and "connecting_to" not in start:
        raise ParseError(TOOL, "start has neither connecting_to nor accepted_connection",
                         source=source)
    missing: dict[str, str] = {}
    retrans = _get(doc, "end.sum_sent", dict, source).get("retransmits")
    if retrans is None:
        missing["retransmits"] = "iperf3 reports retransmits only on the sending side"
    elif isinstance(retrans, bool) or not isinstance(retrans, int):
        raise ParseError(TOOL, f"end.sum_sent.retransmits is {retrans!r}", source=source)
    cpu = "end.cpu_utilization_percent"
    remote = float(_get(doc, f"{cpu}.remote_total", _NUM, source))
    if role == "server" and remote == 0 and not _get(doc, f"{cpu}.remote_user", _NUM, source) \
            and not _get(doc, f"{cpu}.remote_system", _NUM, source):
        remote_val: float | None = None
        missing["cpu_remote_pct"] = "the iperf3 server does not receive the client's CPU use (printed 0)"
    else:
        remote_val = remote
    streams = []
    for i, s in enumerate(_get(doc, "end.streams", list, source)):
        entry: dict[str, Any] = {}
        for side in ("sender", "receiver"):
            d = _get(s, side, dict, f"{source} end.streams[{i}]")
            entry[side] = {"bytes": _get(d, "bytes", int, f"{source} end.streams[{i}].{side}"),
                           "bits_per_second": float(_get(d, "bits_per_second", _NUM,
                                                         f"{source} end.streams[{i}].{side}"))}
        streams.append(entry)
    num_streams = _get(doc, f"{ts}.num_streams", int, source)
    if len(streams) != num_streams:
        raise ParseError(TOOL, f"end.streams has {len(streams)} entries, test_start.num_streams "
                         f"says {num_streams}", source=source)
    return Iperf3Result(
        role=role, version=_get(doc, "start.version", str, source), protocol=protocol,
        num_streams=num_streams, length=_get(doc, f"{ts}.blksize", int, source),
        duration=_get(doc, f"{ts}.duration", int, source),
        reverse=bool(_get(doc, f"{ts}.reverse", int, source)),
        sent_bytes=_get(doc, "end.sum_sent.bytes", int, source),
        sent_seconds=float(_get(doc, "end.sum_sent.seconds", _NUM, source)),
        sent_bps=float(_get(doc, "end.sum_sent.bits_per_second", _NUM, source)),
        received_bytes=_get(doc, "end.sum_received.bytes", int, source),
        received_seconds=float(_get(doc, "end.sum_received.seconds", _NUM, source)),
        received_bps=float(_get(doc, "end.sum_received.bits_per_second", _NUM, source)),
        retransmits=retrans, cpu_local_pct=float(_get(doc, f"{cpu}.host_total", _NUM, source)),
        cpu_remote_pct=remote_val, window=_bufsize(start, "sock_bufsize", source) or None,
        sndbuf_actual=_bufsize(start, "sndbuf_actual", source),
        rcvbuf_actual=_bufsize(start, "rcvbuf_actual", source), missing=missing, streams=streams, source=source)


def _bufsize(start: dict, key: str, source: str) -> int | None:
    """A socket-buffer field of ``start`` (bytes; 0 for sock_bufsize means -w was not given), None where this
    iperf3 does not report it."""
    if key not in start:
        return None
    return _get(start, key, int, f"{source} start")


_ROW_FIELDS = {f.name for f in dataclasses.fields(Row)}


def to_rows(result: Iperf3Result, **context: Any) -> list[Row]:
    """Tidy rows: bw_sent / bw_received (B/s), bytes, retransmits, CPU use."""
    bad = set(context) - _ROW_FIELDS
    if bad:
        raise TypeError(f"unknown Row fields in context: {sorted(bad)}")
    base = {"experiment": "", "scenario": "", "run_id": "", "tool": TOOL, "protocol": "tcp",
            "side": result.role, "qps": result.num_streams, "size_bytes": result.length}
    base.update(context)
    extra = dict(base.pop("extra", {}) or {}, reverse=result.reverse, window=result.window,
                 sndbuf_actual=result.sndbuf_actual, rcvbuf_actual=result.rcvbuf_actual,
                 version=result.version, source=result.source)
    rows = [
        Row(metric="bw_sent", value=result.sent_bps / 8, unit="B/s", raw_value=result.sent_bps,
            raw_unit="bit/s", extra=dict(extra, gbit_per_s=result.sent_bps / 1e9,
                                         seconds=result.sent_seconds), **base),
        Row(metric="bw_received", value=result.received_bps / 8, unit="B/s",
            raw_value=result.received_bps, raw_unit="bit/s",
            extra=dict(extra, gbit_per_s=result.received_bps / 1e9,
                       seconds=result.received_seconds), **base),
        Row(metric="bytes_sent", value=float(result.sent_bytes), unit="B",
            raw_value=float(result.sent_bytes), raw_unit="B", extra=dict(extra), **base),
        Row(metric="bytes_received", value=float(result.received_bytes), unit="B",
            raw_value=float(result.received_bytes), raw_unit="B", extra=dict(extra), **base),
        Row(metric="cpu_local", value=result.cpu_local_pct, unit="%",
            raw_value=result.cpu_local_pct, raw_unit="%", extra=dict(extra), **base),
    ]
    for metric, value, unit in (("retransmits", result.retransmits, "count"),
                                ("cpu_remote", result.cpu_remote_pct, "%")):
        key = "retransmits" if metric == "retransmits" else "cpu_remote_pct"
        if value is None:
            rows.append(Row(metric=metric, value=None, unit=unit, status="not_measured",
                            reason=result.missing[key], extra=dict(extra), **base))
        else:
            rows.append(Row(metric=metric, value=float(value), unit=unit, raw_value=float(value),
                            raw_unit=unit, extra=dict(extra), **base))
    return rows
