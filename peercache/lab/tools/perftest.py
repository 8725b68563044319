"""perftest (``ib_read_bw`` / ``ib_write_bw`` / ``ib_send_bw``): command builder and strict parsers.

Units. perftest prints bandwidth in one of three labels. ``MB/sec`` (older
releases, Debian 12's perftest 4.5+0.17 "Version: 6.06" among them) and
``MiB/sec`` (newer releases) are the same unit: perftest divides by 0x100000
for both, the label was corrected later. ``Gb/sec``
(``--report_gbits``) divides by 125000000, i.e. 10^9 bit/s. Every value is
kept as printed (``raw_*`` plus the label) and normalised to bytes/s and
Gbit/s.

Peak. In duration mode (``-D``), with ``-N``, and on the receiving (server)
side of ``ib_send_bw`` perftest does not measure the peak and prints ``0.00``
(``0.000000`` with ``--report_gbits``); that is recorded as *not measured*
(``None``), never as a zero bandwidth.

Sides. The server of ``ib_write_bw -a`` / ``ib_read_bw -a`` prints one row,
the last size only; the client prints one row per size. With ``--report-both``
the server's "Local" and "Remote" tables are the client's swapped.

The ``--out_json`` file exists in two dialects: perftest up to 6.x writes
unquoted keys and trailing commas (not JSON; linux-rdma/perftest#216; the real
6.06 captures in tests/fixtures/lab/perftest/softroce are of this kind), later
releases write standard JSON. :func:`parse_json` reads both. The file does not
say its unit, so the caller passes it (or :func:`cross_check` takes it from
the text output of the same run).

Latency tests (``ib_read_lat`` / ``ib_write_lat`` / ``ib_send_lat``) are read by
:func:`parse_latency_output` and :func:`parse_latency_json`, never by
:func:`parse_output` (which refuses a latency table). Their columns are in usec;
releases before 2016 print only t_min/t_max/t_typical, duration mode (``-D``)
prints t_avg and the transaction rate. Tidy rows of a latency result are in us.

Formats seen in public outputs (tests/fixtures/lab/perftest/public): perftest 1.x
printed no MsgRate column; releases up to ~3.0 spell the header field
``Gid index``; pasted outputs often carry the header's tab runs as spaces. All of
these are read; a damaged paste (markdown markup in a number, separator lines
and ``#`` stripped, a cut row) is a ParseError naming the damaged line.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from peercache.lab.errors import ParseError, ToolError
from peercache.lab.tidy import Row

#: The perftest bandwidth tools this module drives.
TOOLS = ("ib_read_bw", "ib_write_bw", "ib_send_bw")

#: The perftest latency tools whose output :func:`parse_latency_output` reads.
LAT_TOOLS = ("ib_read_lat", "ib_write_lat", "ib_send_lat")

#: Bytes per second of one printed unit (see the module docstring).
BW_UNITS = {"MB/sec": 1048576.0, "MiB/sec": 1048576.0, "Gb/sec": 125_000_000.0}

#: What the server prints once it listens. Only for a server whose stdout is a terminal: into a
#: pipe or a file perftest's stdout is block-buffered and this line shows only at its exit (real
#: capture softroce/ready_probe.*), so a launcher waits for the listening TCP port instead.
SERVER_READY_PATTERN = re.compile(
    r"Waiting for client to connect|Waiting for client rdma_cm QP to connect")

#: Title line of the header block -> tool.
_TITLE_TOOL = {"RDMA_Read": "ib_read_bw", "RDMA_Write": "ib_write_bw", "Send": "ib_send_bw",
               "Atomic": "ib_atomic_bw"}
_LAT_TITLE_TOOL = {"RDMA_Read": "ib_read_lat", "RDMA_Write": "ib_write_lat", "Send": "ib_send_lat",
                   "Atomic": "ib_atomic_lat"}


# --- command builder --------------------------------------------------------

@dataclass(frozen=True)
class PerftestParams:
    """One perftest bandwidth run; server and client commands are both built from it."""

    tool: str = "ib_read_bw"          #: ib_read_bw | ib_write_bw | ib_send_bw
    device: str | None = None         #: -d, RDMA device (local to each side); None: perftest's first device
    ib_port: int | None = None        #: -i, device port (local); None: 1
    gid_index: int | None = None      #: -x, GID index (local); RoCE v2 IPv4 index from hostinfo
    qps: int = 1                      #: -q, number of QPs
    size: int | None = 65536          #: -s, message size in bytes; None together with all_sizes
    all_sizes: bool = False           #: -a, sweep 2 .. 2^23 bytes, one result row per size
    duration: int | None = None       #: -D seconds; exclusive with iterations
    iterations: int | None = None     #: -n iterations; None and no duration: perftest's default
    tx_depth: int | None = None       #: -t, send queue depth
    report_gbits: bool = True         #: --report_gbits, print Gb/sec instead of MiB/sec
    cpu_util: bool = False            #: --cpu_util, CPU_Util[%] column (duration mode only)
    bidirectional: bool = False       #: -b
    report_both: bool = False         #: --report-both, local and remote tables (needs bidirectional)
    tcp_port: int | None = None       #: -p, TCP port of the out-of-band exchange; None: 18515
    mtu: int | None = None            #: -m, 256..4096
    connection: str | None = None     #: -c, RC | UC | UD | XRC | DC
    rdma_cm: bool = False             #: -R, connect QPs with rdma_cm
    outs: int | None = None           #: -o, outstanding reads (ib_read_bw only)
    no_peak: bool = False             #: -N, skip the peak calculation
    limit_bw: float | None = None     #: -w, fail (exit 1) below this average, in the report unit
    use_cuda: int | None = None       #: --use_cuda=<gpu index> (local; needs a CUDA build of perftest)
    use_cuda_dmabuf: bool = False     #: --use_cuda_dmabuf (local)
    out_json: str | None = None       #: --out_json --out_json_file=<path> (local; newer releases)

    def __post_init__(self) -> None:
        if self.tool not in TOOLS:
            raise ValueError(f"perftest tool {self.tool!r} is not one of {TOOLS}")
        if self.all_sizes and self.size is not None:
            raise ValueError("give either size or all_sizes=True (-a), not both")
        if not self.all_sizes and self.size is None:
            raise ValueError("give a message size or all_sizes=True (-a)")
        if self.size is not None and self.size < 1:
            raise ValueError(f"message size must be >= 1 byte, got {self.size}")
        if self.duration is not None and self.iterations is not None:
            raise ValueError("give either duration (-D) or iterations (-n), not both")
        if self.all_sizes and self.duration is not None:
            # perftest: "Duration mode currently doesn't support running on all sizes." (exit 1)
            raise ValueError("perftest does not run all sizes (-a) in duration mode (-D)")
        if self.duration is not None and self.duration < 1:
            raise ValueError(f"duration must be >= 1 s, got {self.duration}")
        if self.iterations is not None and self.iterations < 5:
            raise ValueError(f"perftest needs at least 5 iterations, got {self.iterations}")
        if self.qps < 1:
            raise ValueError(f"qps must be >= 1, got {self.qps}")
        if self.cpu_util and self.duration is None:
            raise ValueError("--cpu_util is valid only in duration mode: set duration")
        if self.report_both and not self.bidirectional:
            raise ValueError("--report-both needs bidirectional=True (-b)")
        if self.outs is not None and self.tool != "ib_read_bw":
            raise ValueError("outs (-o) applies to ib_read_bw only")
        if self.tcp_port is not None and not 1 <= self.tcp_port <= 65535:
            raise ValueError(f"tcp_port {self.tcp_port} is not a TCP port")
        if self.use_cuda_dmabuf and self.use_cuda is None:
            raise ValueError("use_cuda_dmabuf needs use_cuda=<gpu index>")

    @property
    def bw_unit(self) -> str:
        """The bandwidth label perftest will print for these parameters."""
        return "Gb/sec" if self.report_gbits else "MiB/sec"


def symmetric_args(params: PerftestParams) -> list[str]:
    """Flags that must be identical on server and client (size, QPs, mode, report unit ...)."""
    a: list[str] = []
    if params.all_sizes:
        a.append("-a")
    else:
        a += ["-s", str(params.size)]
    a += ["-q", str(params.qps)]
    if params.duration is not None:
        a += ["-D", str(params.duration)]
    if params.iterations is not None:
        a += ["-n", str(params.iterations)]
    if params.tx_depth is not None:
        a += ["-t", str(params.tx_depth)]
    if params.connection is not None:
        a += ["-c", params.connection]
    if params.mtu is not None:
        a += ["-m", str(params.mtu)]
    if params.outs is not None:
        a += ["-o", str(params.outs)]
    if params.bidirectional:
        a.append("-b")
    if params.report_both:
        a.append("--report-both")
    if params.report_gbits:
        a.append("--report_gbits")
    if params.cpu_util:
        a.append("--cpu_util")
    if params.no_peak:
        a.append("-N")
    if params.rdma_cm:
        a.append("-R")
    if params.limit_bw is not None:
        a += ["-w", repr(float(params.limit_bw))]
    if params.tcp_port is not None:
        a += ["-p", str(params.tcp_port)]
    return a


def _local_args(params: PerftestParams) -> list[str]:
    # Per-host flags: each side names its own device, port, GID and GPU.
    a: list[str] = []
    if params.device is not None:
        a += ["-d", params.device]
    if params.ib_port is not None:
        a += ["-i", str(params.ib_port)]
    if params.gid_index is not None:
        a += ["-x", str(params.gid_index)]
    if params.use_cuda is not None:
        a.append(f"--use_cuda={params.use_cuda}")
    if params.use_cuda_dmabuf:
        a.append("--use_cuda_dmabuf")
    if params.out_json is not None:
        a += ["--out_json", f"--out_json_file={params.out_json}"]
    return a


def server_command(params: PerftestParams) -> list[str]:
    """argv of the perftest server (no peer address: it listens on the TCP port)."""
    return [params.tool, *_local_args(params), *symmetric_args(params)]


def client_command(params: PerftestParams, server_addr: str) -> list[str]:
    """argv of the perftest client that connects to *server_addr*."""
    if not server_addr or server_addr.startswith("-") or any(c.isspace() for c in server_addr):
        raise ValueError(f"server address {server_addr!r} is not a host name or IP address")
    return [params.tool, *_local_args(params), *symmetric_args(params), server_addr]


# --- result records ---------------------------------------------------------

@dataclass
class PerftestRow:
    """One printed result line, as printed and normalised."""

    table: str                   #: "main", or "local" / "remote" (--report-both)
    line_no: int                 #: 1-based line of the source it was read from
    size_bytes: int
    iterations: int
    raw_unit: str | None         #: "MB/sec", "MiB/sec", "Gb/sec"; None if the source did not say
    bw_average_raw: float
    bw_peak_raw: float | None    #: None: not measured (printed 0.00: duration mode or -N)
    msg_rate_mpps: float | None  #: None when the table has no MsgRate column (perftest 1.x)
    cpu_util_pct: float | None = None  #: None when the CPU_Util[%] column was not printed

    def _bytes_per_s(self, raw: float | None) -> float | None:
        if raw is None or self.raw_unit is None:
            return None
        return raw * BW_UNITS[self.raw_unit]

    @property
    def bw_average_Bps(self) -> float | None:
        """Average bandwidth in bytes/s (None when the unit is unknown)."""
        return self._bytes_per_s(self.bw_average_raw)

    @property
    def bw_peak_Bps(self) -> float | None:
        """Peak bandwidth in bytes/s (None when not measured or unit unknown)."""
        return self._bytes_per_s(self.bw_peak_raw)

    @property
    def bw_average_gbps(self) -> float | None:
        """Average bandwidth in Gbit/s."""
        b = self.bw_average_Bps
        return None if b is None else b * 8 / 1e9

    @property
    def bw_peak_gbps(self) -> float | None:
        """Peak bandwidth in Gbit/s."""
        b = self.bw_peak_Bps
        return None if b is None else b * 8 / 1e9

    def to_dict(self) -> dict[str, Any]:
        """Plain dict with raw and normalised values."""
        d = dataclasses.asdict(self)
        d.update(bw_average_Bps=self.bw_average_Bps, bw_peak_Bps=self.bw_peak_Bps,
                 bw_average_gbps=self.bw_average_gbps, bw_peak_gbps=self.bw_peak_gbps)
        return d


@dataclass
class PerftestResult:
    """A parsed perftest bandwidth report: header block, result rows, and notes."""

    source: str
    test: str | None = None                          #: title, e.g. "RDMA_Read BW Test"
    header: dict[str, str] = field(default_factory=dict)  #: header block as printed
    rows: list[PerftestRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   #: warnings and lines kept but not parsed
    fmt: str = "text"                                #: "text" or "json"

    @property
    def tool(self) -> str | None:
        """ib_read_bw / ib_write_bw / ib_send_bw, from the title (None if not printed)."""
        if self.test:
            return _TITLE_TOOL.get(self.test.split()[0])
        return None

    @property
    def raw_unit(self) -> str | None:
        """The bandwidth label of the tables (None if unknown)."""
        units = {r.raw_unit for r in self.rows}
        return units.pop() if len(units) == 1 else None

    @property
    def bidirectional(self) -> bool:
        """True for a -b run (title says so, or --report-both tables are present)."""
        return bool(self.test and "Bidirectional" in self.test) or any(
            r.table != "main" for r in self.rows)

    def _header_int(self, key: str) -> int | None:
        v = self.header.get(key)
        if v is None:
            return None
        m = re.fullmatch(r"(-?\d+)(?:\[B\])?", v.strip())
        return int(m.group(1)) if m else None

    @property
    def info(self) -> dict[str, Any]:
        """Typed view of the header block (absent keys are None)."""
        h = self.header
        return {
            "test": self.test, "tool": self.tool,
            "device": h.get("Device"), "qps": self._header_int("Number of qps"),
            "transport": h.get("Transport type"), "connection": h.get("Connection type"),
            "using_srq": h.get("Using SRQ"), "dual_port": h.get("Dual-port"),
            "tx_depth": self._header_int("TX depth"), "rx_depth": self._header_int("RX depth"),
            "cq_moderation": self._header_int("CQ Moderation"),
            "mtu_bytes": self._header_int("Mtu"), "link_type": h.get("Link type"),
            "gid_index": self._header_int("GID index" if "GID index" in h else "Gid index"),
            "max_inline_bytes": self._header_int("Max inline data"),
            "outstand_reads": self._header_int("Outstand reads"),
            "rdma_cm": h.get("rdma_cm QPs"), "data_exchange": h.get("Data ex. method"),
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (header, info, rows with normalised values, notes)."""
        return {"source": self.source, "fmt": self.fmt, "info": self.info, "header": self.header,
                "rows": [r.to_dict() for r in self.rows], "notes": self.notes}


#: Latency columns -> (tidy metric, the column's printed name).
LAT_COLUMNS = {
    "t_min_us": ("latency_min", "t_min[usec]"), "t_max_us": ("latency_max", "t_max[usec]"),
    "t_typical_us": ("latency_typical", "t_typical[usec]"),  # the median
    "t_avg_us": ("latency_avg", "t_avg[usec]"), "t_stdev_us": ("latency_stdev", "t_stdev[usec]"),
    "p99_us": ("latency_p99", "99% percentile[usec]"),
    "p999_us": ("latency_p999", "99.9% percentile[usec]"),
}


@dataclass
class PerftestLatencyRow:
    """One printed latency result line (usec, as printed); None: the layout has no such column."""

    table: str
    line_no: int                 #: 1-based line of the source (0: from a JSON file)
    size_bytes: int
    iterations: int
    t_min_us: float | None = None
    t_max_us: float | None = None
    t_typical_us: float | None = None   #: the median
    t_avg_us: float | None = None
    t_stdev_us: float | None = None
    p99_us: float | None = None
    p999_us: float | None = None
    tps: float | None = None            #: "tps average" (transactions/s), duration mode only
    cpu_util_pct: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the row."""
        return dataclasses.asdict(self)


@dataclass
class PerftestLatencyResult(PerftestResult):
    """A parsed perftest latency report: header block, result rows (usec), and notes."""

    rows: list[PerftestLatencyRow] = field(default_factory=list)  # type: ignore[assignment]

    @property
    def tool(self) -> str | None:
        """ib_read_lat / ib_write_lat / ib_send_lat, from the title (None if not printed)."""
        if self.test:
            return _LAT_TITLE_TOOL.get(self.test.split()[0])
        return None

    @property
    def raw_unit(self) -> str | None:
        """Latency tables are printed in usec."""
        return "usec"

    @property
    def bidirectional(self) -> bool:
        """Latency tests have no bidirectional mode."""
        return False


# --- text parser ------------------------------------------------------------

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


# --- --out_json file --------------------------------------------------------

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


# --- failure classification -------------------------------------------------

#: ibv_wc_status (rdma-core libibverbs/verbs.h) -> enum name, ibv_wc_status_str() text, what to
#: check. perftest prints "Failed status N: ..." (up to 25.07) or "Failed status-TEXT (N): ..."
#: (perftest PR #342, 2025).
WC_STATUS: dict[int, tuple[str, str, str]] = {
    1: ("IBV_WC_LOC_LEN_ERR", "local length error",
        "a message was longer than the buffer posted for it: run both sides with the same -s "
        "size (and the same test)"),
    2: ("IBV_WC_LOC_QP_OP_ERR", "local QP operation error",
        "the work request does not fit this QP (too many SGEs, inline data above the QP's "
        "max_inline_data, or a message above the port's max_msg_sz): check -I, -s and -t against "
        "`ibv_devinfo -v` limits"),
    3: ("IBV_WC_LOC_EEC_OP_ERR", "local EE context operation error",
        "an EE context error (RD transport); not expected with RC/UC/UD"),
    4: ("IBV_WC_LOC_PROT_ERR", "local protection error",
        "the local buffer is not covered by a valid memory registration (lkey or access): with "
        "--use_cuda / --use_rocm check GPUDirect RDMA (nvidia-peermem or dmabuf loaded, the "
        "GPU's BAR/MMIO setup under a hypervisor), otherwise the registered size"),
    5: ("IBV_WC_WR_FLUSH_ERR", "Work Request Flushed Error",
        "the QP was already in the error state, so outstanding work was flushed: this is a "
        "consequence, not the cause; look for the first non-flush error on this side and on the "
        "peer (the peer exiting, or a retry-exceeded error before it)"),
    6: ("IBV_WC_MW_BIND_ERR", "memory management operation error",
        "a memory window bind failed: check the MR access flags"),
    7: ("IBV_WC_BAD_RESP_ERR", "bad response error",
        "the responder sent an unexpected transport response: check the peer's device and "
        "firmware logs (dmesg)"),
    8: ("IBV_WC_LOC_ACCESS_ERR", "local access error",
        "a protection error on a local buffer written by an RDMA read response or atomic: check "
        "the local MR access flags"),
    9: ("IBV_WC_REM_INV_REQ_ERR", "remote invalid request error",
        "the peer rejected the request as invalid: an opcode its QP does not allow (server and "
        "client running different tests), no room for the message, or a message too long: run "
        "the same tool with the same flags on both sides"),
    10: ("IBV_WC_REM_ACCESS_ERR", "remote access error",
         "the peer refused the rkey/address: wrong rkey or address, a remote buffer smaller than "
         "the message, or a remote MR without that access right (e.g. a write into an "
         "ib_read_bw server's buffer): run the same test with the same -s on both sides"),
    11: ("IBV_WC_REM_OP_ERR", "remote operation error",
         "the responder could not complete the operation (its QP failed or its receive WQE was "
         "malformed): read the peer's log; a server running another test gives this too"),
    12: ("IBV_WC_RETRY_EXC_ERR", "transport retry counter exceeded",
         "the peer stopped answering (no ACK or NAK within the retries): the peer process exited "
         "or its QP is in error (read its log), or the path drops packets (link or port down, "
         "wrong GID index or route, MTU mismatch, no lossless/ECN setup for RoCE); on emulated "
         "devices (Soft-RoCE, siw) under CPU load ACKs can come too late; check `ibv_devinfo` "
         "port state and the port error counters on both hosts"),
    13: ("IBV_WC_RNR_RETRY_EXC_ERR", "RNR retry counter exceeded",
         "the receiver had no receive posted (receiver not ready): the server posts receives "
         "too slowly or ran out (ib_send_*), or it is not running the same test; raise the "
         "server's RX depth (-r) or the RNR timer"),
    14: ("IBV_WC_LOC_RDD_VIOL_ERR", "local RDD violation error",
         "an RD domain violation (RD transport); not expected with RC/UC/UD"),
    15: ("IBV_WC_REM_INV_RD_REQ_ERR", "remote invalid RD request",
         "an RD request error (RD transport); not expected with RC/UC/UD"),
    16: ("IBV_WC_REM_ABORT_ERR", "aborted error",
         "the responder aborted the operation: read the peer's log"),
    17: ("IBV_WC_INV_EECN_ERR", "invalid EE context number",
         "an EE context error (RD transport); not expected with RC/UC/UD"),
    18: ("IBV_WC_INV_EEC_STATE_ERR", "invalid EE context state",
         "an EE context error (RD transport); not expected with RC/UC/UD"),
    19: ("IBV_WC_FATAL_ERR", "fatal error",
         "the device reported a fatal error: check dmesg and the device's health on this host"),
    20: ("IBV_WC_RESP_TIMEOUT_ERR", "response timeout error",
         "the responder did not answer in time: check the peer and the path as for a retry "
         "exceeded error"),
    21: ("IBV_WC_GENERAL_ERR", "general error",
         "the device reported an error it does not classify: check dmesg on both hosts"),
}

_COMPLETION = re.compile(r"Completion with error at (?P<side>client|server)")
_FAILED_STATUS = re.compile(
    r"Failed status(?: (?P<code>\d+)|-(?P<text>[^\n]*?) \((?P<code2>\d+)\)): wr_id (?P<wr_id>-?\d+)"
    r" syndrom (?P<syndrome>0x[0-9a-fA-F]+)")
_COUNTS = re.compile(r"scnt=(?P<scnt>\d+), ccnt=(?P<ccnt>\d+)|rcnt=(?P<rcnt>\d+)")


@dataclass(frozen=True)
class CompletionError:
    """One "Completion with error" report of perftest, as printed."""

    side: str                     #: "client" (send side) or "server" (receive side), as printed
    status: int | None            #: the ibv_wc_status code; None when the line was not printed
    name: str | None              #: IBV_WC_... (None for an unknown code)
    description: str | None       #: ibv_wc_status_str() text (as printed by newer releases)
    wr_id: int | None
    syndrome: str | None          #: vendor syndrome, e.g. "0x81"
    posted: int | None = None     #: scnt
    completed: int | None = None  #: ccnt
    received: int | None = None   #: rcnt (receive side)


def completion_errors(text: str) -> list[CompletionError]:
    """Every "Completion with error" report in a perftest log, in order."""
    out: list[CompletionError] = []
    marks = list(_COMPLETION.finditer(text))
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        chunk = text[m.end():end]
        st = _FAILED_STATUS.search(chunk)
        code = name = desc = wr_id = syndrome = None
        counts = None
        if st:
            code = int(st.group("code") or st.group("code2"))
            known = WC_STATUS.get(code)
            name = known[0] if known else None
            desc = st.group("text") or (known[1] if known else None)
            wr_id, syndrome = int(st.group("wr_id")), st.group("syndrome")
            counts = _COUNTS.search(chunk, st.end())
        else:
            counts = _COUNTS.search(chunk)

        def num(group: str) -> int | None:
            return int(counts.group(group)) if counts and counts.group(group) else None

        out.append(CompletionError(side=m.group("side"), status=code, name=name, description=desc,
                                   wr_id=wr_id, syndrome=syndrome, posted=num("scnt"),
                                   completed=num("ccnt"), received=num("rcnt")))
    return out


def _completion_failure(text: str, returncode: int | None, host: str,
                        tool: str) -> ToolError | None:
    errs = completion_errors(text)
    if not errs:
        return None
    # The first error is the cause; flush errors after it are its consequence.
    first = next((e for e in errs if e.status not in (None, 5)), errs[0])
    more = f" (the first of {len(errs)} reports)" if len(errs) > 1 else ""
    if first.status is None:
        detail = (f"a work completion failed at the {first.side}, status not printed{more}")
        check = ("perftest stops at the first failed completion; read the full log of both "
                 "sides for the 'Failed status' line")
    else:
        known = WC_STATUS.get(first.status)
        name = first.name or f"unknown ibv_wc_status {first.status}"
        desc = f', "{first.description}"' if first.description else ""
        counts = ""
        if first.posted is not None:
            counts = f", after {first.posted} posted / {first.completed} completed"
        elif first.received is not None:
            counts = f", after {first.received} received"
        detail = (f"a work completion failed at the {first.side}: {name} (status {first.status}"
                  f"{desc}), wr_id {first.wr_id}, vendor syndrome {first.syndrome}{counts}{more}")
        check = (known[2] if known else "look the status up in ibv_poll_cq(3)") + (
            "; perftest stops at the first failed completion, the peer's log shows its side")
    return ToolError(host=host, tool=tool, kind="completion_error", returncode=returncode,
                     detail=detail, check=check)


#: perftest's failure to calibrate its cycle counter (its timestamp samples fit a line with r^2 below
#: 0.9, so it knows no CPU frequency and prints "Can't produce a report"): a property of a loaded or
#: emulated clock, not of the transfer; a rerun may pass (the point runner retries these).
CLOCK_CALIBRATION = "clock_calibration"

_FAILURES: list[tuple[str, re.Pattern[str], str, str]] = [
    (CLOCK_CALIBRATION, re.compile(r"Correlation coefficient r\^2: [0-9.eE+-]+ < 0\.9"),
     "could not calibrate its cycle counter (perftest said '{said}'), so it printed no report",
     "perftest measures the CPU frequency from timestamp samples and gives up when they scatter: "
     "a loaded or emulated CPU; rerun it on a quiet host (the point runner retries it twice)"),
    ("resource_error", re.compile(r"Failed to allocate hugepages[^\n]*|Failed to allocate hugepage region"),
     "cannot allocate the hugepage buffer (perftest said '{said}')",
     "--use_hugepages needs free hugepages (HugePages_Free in /proc/meminfo) and, one SysV "
     "segment per buffer, kernel.shmmni above the number of buffers (--mr_per_qp: one per QP)"),
    ("resource_error", re.compile(r"Couldn't allocate MR[^\n]*|[Ff]ailed to create MR|"
                                  r"Couldn't allocate PD|Couldn't create CQ"),
     "cannot register the test buffer (perftest said '{said}')",
     "memory registration failed: check the locked-memory limit (`ulimit -l`, unlimited for "
     "RDMA; containers need IPC_LOCK), and with --use_cuda that GPUDirect RDMA is available "
     "(nvidia-peermem loaded, or --use_cuda_dmabuf); very large -s / -a sizes need as much "
     "pinnable memory"),
    ("resource_error", re.compile(r"Unable to create QP\.?|Failed to create QP\.?|"
                                  r"Couldn't create IB resources"),
     "cannot create the queue pair (perftest said '{said}')",
     "ibv_create_qp rejected the QP attributes: the inline size (-I, default 220 for writes "
     "and sends; some devices allow less), the queue depths (-t / -r) or the connection type "
     "(-c) may exceed what the device supports: compare with `ibv_devinfo -v` (max_qp_wr, "
     "max_sge) and retry with -I 0 or smaller depths"),
    ("unknown_option", re.compile(r"unrecognized option '?([^'\n]*)'?|invalid option -- '?(\w)'?|"
                                  r"Invalid Command or flag|"
                                  r"Duration mode currently doesn't support running on all sizes|"
                                  r"please check that DURATION > 2\*MARGIN"),
     "perftest rejected its command line ({said})",
     "the option, or this combination of options, may not exist in this perftest release: "
     "compare `{tool} --help` on that host with the command, and keep both sides on the same "
     "perftest version"),
    ("no_device", re.compile(r"Port number \d+ state is Down"),
     "the RDMA port is down (perftest said '{said}')",
     "check `ibv_devinfo -d <dev>` there: the port must be PORT_ACTIVE (cable and link up; on "
     "InfiniBand a subnet manager must be running), or pick the active port with -i"),
    ("no_device", re.compile(r"Did not detect devices|No IB devices found|IB device \S+ not found|"
                             r"Unable to find the Infiniband/RoCE device|"
                             r"Couldn't get context for the device"),
     "no RDMA device (perftest said '{said}')",
     "check `ibv_devices` and `ibv_devinfo -d <dev>` there, the -d device name, and that the "
     "driver (e.g. mlx5_ib) is loaded"),
    ("port_in_use", re.compile(r"Address already in use|Failed to bind socket|"
                               r"Couldn't listen to port \d+|rdma_bind_addr failed"),
     "cannot listen on the TCP port (perftest said '{said}')",
     "another perftest server may still hold it: `ss -ltnp` there, end the stale process or "
     "use another -p port on both sides"),
    ("cannot_connect", re.compile(r"Couldn't connect to \S+|Unable to connect \(retries|"
                                  r"Failed to connect RDMA CM|Problem in resolving basic address|"
                                  r"Unable to perform rdma_client function"),
     "cannot connect to the server (perftest said '{said}')",
     "check that the server was started first and is still listening, that both sides use "
     "the same -p port, and that the address is reachable from this host"),
    ("cannot_connect", re.compile(r"Failed to modify QP[^\n]*?to RT[RS]|"
                                  r"Unable to Connect the HCA's through the link"),
     "the queue pairs could not be connected (perftest said '{said}')",
     "moving the QP to RTR/RTS failed on the exchanged address: for RoCE check the GID index "
     "(-x) on both sides (an all-zero GID in the printed local/remote address means that "
     "index holds no address), the RoCE version, and the MTU (-m) against the port's active "
     "MTU; for InfiniBand check that the port is ACTIVE with a LID (subnet manager)"),
    ("cannot_connect", re.compile(r"Couldn't read remote address|"
                                  r"Failed to exchange data between server and clients|"
                                  r"Unable to read to socket/rdam?_cm"),
     "the peer ended the out-of-band exchange (perftest said '{said}')",
     "the other side failed or exited first: read its log for its error (a client-side "
     "completion or resource error shows up on the server as this), and check that both "
     "sides run the same test with the same options"),
    ("below_limit", re.compile(r"BW result is below bw limit|Msg rate\s+is below msg_rate limit"),
     "the result is below the -w/-y verifier limit ({said})",
     "compare the printed average with the limit and with the testbed reference; check link "
     "rate, MTU and NUMA binding"),
]

_ZERO_GID = re.compile(r"^\s*GID: 00(?::00){15}\s*$", re.MULTILINE)


def classify_failure(text: str, returncode: int | None, host: str, tool: str) -> ToolError | None:
    """The ToolError a perftest run's output and exit status show, or None when it succeeded."""
    if returncode == 127 or re.search(rf"{re.escape(tool)}: (command )?not found", text):
        return ToolError(host=host, tool=tool, kind="not_installed",
                         detail=f"{tool} is not installed", returncode=returncode,
                         check="install perftest there (Debian/Ubuntu: apt-get install perftest; "
                               "RHEL: dnf install perftest)")
    err = _completion_failure(text, returncode, host, tool)
    if err is not None:
        return err
    for kind, pattern, detail, check in _FAILURES:
        m = pattern.search(text)
        if m:
            check = check.format(tool=tool)
            if "GID index (-x)" in check and _ZERO_GID.search(text):
                check += "; this output shows an all-zero GID"
            return ToolError(host=host, tool=tool, kind=kind, returncode=returncode,
                             detail=detail.format(said=m.group(0).strip()), check=check)
    if returncode in (0, None):
        return None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    said = lines[-1] if lines else "(no output)"
    return ToolError(host=host, tool=tool, kind="failed", returncode=returncode,
                     detail=f"exited with an unrecognised failure (last line: '{said}')",
                     check="read the full server and client logs of this run")


# --- tidy rows --------------------------------------------------------------

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
