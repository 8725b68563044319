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

#: Bytes per second of one printed unit (see the module docstring).
BW_UNITS = {"MB/sec": 1048576.0, "MiB/sec": 1048576.0, "Gb/sec": 125_000_000.0}

#: What the server prints once it listens. Only for a server whose stdout is a terminal: into a
#: pipe or a file perftest's stdout is block-buffered and this line shows only at its exit (real
#: capture softroce/ready_probe.*), so a launcher waits for the listening TCP port instead.
SERVER_READY_PATTERN = re.compile(
    r"Waiting for client to connect|Waiting for client rdma_cm QP to connect")

#: Title line of the header block -> tool.
_TITLE_TOOL = {"RDMA_Read": "ib_read_bw", "RDMA_Write": "ib_write_bw", "Send": "ib_send_bw"}


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
    msg_rate_mpps: float
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
            "gid_index": self._header_int("GID index"),
            "max_inline_bytes": self._header_int("Max inline data"),
            "outstand_reads": self._header_int("Outstand reads"),
            "rdma_cm": h.get("rdma_cm QPs"), "data_exchange": h.get("Data ex. method"),
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (header, info, rows with normalised values, notes)."""
        return {"source": self.source, "fmt": self.fmt, "info": self.info, "header": self.header,
                "rows": [r.to_dict() for r in self.rows], "notes": self.notes}


# --- text parser ------------------------------------------------------------

_SEPARATOR = re.compile(r"^-{20,}$")
_TABLE_HEADER = re.compile(
    r"^#bytes\s+#iterations\s+BW peak\[(?P<u1>[^\]]+)\]\s+BW average\[(?P<u2>[^\]]+)\]"
    r"\s+MsgRate\[Mpps\](?P<rest>.*)$")
_LAT_HEADER = re.compile(r"^#bytes\s+#iterations\s+t_(min|avg)")
_KV_PAIR = re.compile(r"([A-Za-z][^:\t]*?)\s*:\s*(.*?)\s*(?=\t+[A-Za-z]|$)")
_TITLE = re.compile(r"^(?P<title>\S.*\bBW Test)$")
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
}


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


def parse_output(text: str, source: str = "<text>") -> PerftestResult:
    """Parse the stdout of a perftest bandwidth run; raises ParseError naming the bad line."""
    tool = "perftest"
    res = PerftestResult(source=source)
    table: dict[str, Any] | None = None   # open table: kind, unit, cpu, start line, rows
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
        m = _TABLE_HEADER.match(line)
        if m:
            if table is not None and table["rows"]:
                raise ParseError(tool, f"a new table header inside the table opened at line "
                                 f"{table['start']}; output corrupt", source=source,
                                 line_no=line_no, line=raw)
            if table is not None:
                continue  # the same header printed twice (two writers on one log)
            u1, u2, rest = m.group("u1"), m.group("u2"), m.group("rest").strip()
            if u1 != u2 or u1 not in BW_UNITS:
                raise ParseError(tool, f"unknown bandwidth unit {u1!r}/{u2!r} "
                                 f"(known: {', '.join(BW_UNITS)})", source=source,
                                 line_no=line_no, line=raw)
            if rest not in ("", "CPU_Util[%]"):
                raise ParseError(tool, "unsupported result columns (per-port or QoS reports "
                                 "are not read)", source=source, line_no=line_no, line=raw)
            table = {"kind": next_kind, "unit": u1, "cpu": rest == "CPU_Util[%]",
                     "start": line_no, "rows": []}
            next_kind = "main"
            tables_seen += 1
            in_header_block = False
            continue
        if _LAT_HEADER.match(line):
            raise ParseError(tool, "this is a latency table; only the bandwidth tests "
                             "(ib_*_bw) are parsed", source=source, line_no=line_no, line=raw)
        if table is not None:
            if line[0].isdigit():
                tokens = line.split()
                want = 6 if table["cpu"] else 5
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
                peak = _num(tool, source, line_no, raw, tokens[2], float)
                avg = _num(tool, source, line_no, raw, tokens[3], float)
                rate = _num(tool, source, line_no, raw, tokens[4], float)
                cpu = _num(tool, source, line_no, raw, tokens[5], float) if table["cpu"] else None
                row = PerftestRow(table=table["kind"], line_no=line_no, size_bytes=size,
                                  iterations=iters, raw_unit=table["unit"], bw_average_raw=avg,
                                  bw_peak_raw=None if peak == 0.0 else peak,
                                  msg_rate_mpps=rate, cpu_util_pct=cpu)
                table["rows"].append(row)
                res.rows.append(row)
                continue
            if _NOISE.match(line):
                res.notes.append(f"line {line_no}: {line}")
                continue
            raise ParseError(tool, f"unexpected line inside the result table opened at line "
                             f"{table['start']}", source=source, line_no=line_no, line=raw)
        m = _BOTH.match(line)
        if m:
            next_kind = m.group(1).lower()
            continue
        m = _TITLE.match(line)
        if m and res.test is None:
            res.test = m.group("title")
            in_header_block = True
            continue
        if in_header_block:
            pairs = _KV_PAIR.findall(raw.strip(" "))
            if pairs and all(k.strip() in _HEADER_KEYS for k, _ in pairs):
                for k, v in pairs:
                    res.header[k.strip()] = v.strip()
                continue
        if _IGNORED.match(line):
            continue
        res.notes.append(f"line {line_no}: {line}")
    if table is not None:
        raise ParseError(tool, f"result table opened at line {table['start']} is not closed "
                         "by a separator line; output truncated", source=source,
                         line_no=last[0], line=last[1])
    if tables_seen == 0 or not res.rows:
        raise ParseError(tool, "no bandwidth result table found (a failed run? see "
                         "classify_failure)", source=source,
                         line_no=last[0] or None, line=last[1] if last[0] else None)
    # The header block must be well-formed where it gives numbers the rows rely on.
    for key in ("Number of qps", "Mtu", "GID index", "TX depth", "RX depth"):
        if key in res.header and res._header_int(key) is None:
            raise ParseError(tool, f"header field {key!r} is not a number: "
                             f"{res.header[key]!r}", source=source)
    return res


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


def parse_json(text: str, bw_unit: str | None = None, source: str = "<json>") -> PerftestResult:
    """Parse a perftest --out_json file (standard or pre-standard dialect).

    *bw_unit* is the label the run printed ("Gb/sec" with --report_gbits, else
    "MiB/sec"); the file does not record it, so without it values stay raw.
    """
    if bw_unit is not None and bw_unit not in BW_UNITS:
        raise ValueError(f"bw_unit {bw_unit!r} is not one of {list(BW_UNITS)}")
    try:
        pairs = json.loads(text, object_pairs_hook=list)
        if not isinstance(pairs, list):
            raise ParseError("perftest-json", "top level is not an object", source=source)
    except json.JSONDecodeError:
        pairs = _parse_legacy_json(text, source)
    res = PerftestResult(source=source, fmt="json")
    for key, value in pairs:
        as_dict = dict(value) if isinstance(value, list) else value
        if key == "test_info":
            if not isinstance(as_dict, dict):
                raise ParseError("perftest-json", "test_info is not an object", source=source)
            test = str(as_dict.get("test", "")).strip()
            # "RDMA_Read_BW_Test" -> "RDMA_Read BW Test", the title the text prints.
            res.test = (test.replace("_Bidirectional", " Bidirectional")
                        .replace("_BW_Test", " BW Test") or None)
            for k, v in as_dict.items():
                k = k.strip()
                if k != "test":
                    res.header[_JSON_HEADER_KEYS.get(k, k)] = str(v)
        elif key in ("results", "results_local", "results_remote"):
            if not isinstance(as_dict, dict):
                raise ParseError("perftest-json", f"{key} is not an object", source=source)
            res.rows.append(_json_row(key, as_dict, bw_unit, source))
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

_FAILURES: list[tuple[str, re.Pattern[str], str, str]] = [
    ("unknown_option", re.compile(r"unrecognized option '?([^'\n]*)'?|invalid option -- '?(\w)'?|"
                                  r"Invalid Command or flag|"
                                  r"Duration mode currently doesn't support running on all sizes|"
                                  r"please check that DURATION > 2\*MARGIN"),
     "perftest rejected its command line ({said})",
     "the option, or this combination of options, may not exist in this perftest release: "
     "compare `{tool} --help` on that host with the command, and keep both sides on the same "
     "perftest version"),
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
    ("below_limit", re.compile(r"BW result is below bw limit|Msg rate\s+is below msg_rate limit"),
     "the result is below the -w/-y verifier limit ({said})",
     "compare the printed average with the limit and with the testbed reference; check link "
     "rate, MTU and NUMA binding"),
]


def classify_failure(text: str, returncode: int | None, host: str, tool: str) -> ToolError | None:
    """The ToolError a perftest run's output and exit status show, or None when it succeeded."""
    if returncode == 127 or re.search(rf"{re.escape(tool)}: (command )?not found", text):
        return ToolError(host=host, tool=tool, kind="not_installed",
                         detail=f"{tool} is not installed", returncode=returncode,
                         check="install perftest there (Debian/Ubuntu: apt-get install perftest; "
                               "RHEL: dnf install perftest)")
    for kind, pattern, detail, check in _FAILURES:
        m = pattern.search(text)
        if m:
            return ToolError(host=host, tool=tool, kind=kind, returncode=returncode,
                             detail=detail.format(said=m.group(0).strip()),
                             check=check.format(tool=tool))
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
    """Tidy rows (bw_average / bw_peak in B/s, msg_rate in msg/s, cpu_util in %) of a result."""
    base = _context_fields(context)
    info = result.info
    base.setdefault("tool", result.tool or "")
    base.setdefault("devices", info["device"] or "")
    if info["qps"] is not None:
        base.setdefault("qps", info["qps"])
    if info["link_type"]:
        base.setdefault("protocol", "roce" if info["link_type"] == "Ethernet" else "ib")
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
        rows.append(Row(metric="msg_rate", value=r.msg_rate_mpps * 1e6, unit="msg/s",
                        raw_value=r.msg_rate_mpps, raw_unit="Mpps", extra=dict(extra), **common))
        if r.cpu_util_pct is not None:
            rows.append(Row(metric="cpu_util", value=r.cpu_util_pct, unit="%",
                            raw_value=r.cpu_util_pct, raw_unit="%", extra=dict(extra), **common))
    return rows
