"""perftest's command lines: one :class:`PerftestParams` per run, the server's and the client's argv.

Part of :mod:`peercache.lab.tools.perftest` (its docstring says the units, sides and formats).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

#: The perftest bandwidth tools this module drives.
TOOLS = ("ib_read_bw", "ib_write_bw", "ib_send_bw")

#: What the server prints once it listens. Only for a server whose stdout is a terminal: into a
#: pipe or a file perftest's stdout is block-buffered and this line shows only at its exit (real
#: capture softroce/ready_probe.*), so a launcher waits for the listening TCP port instead.
SERVER_READY_PATTERN = re.compile(
    r"Waiting for client to connect|Waiting for client rdma_cm QP to connect")


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
    margin: int | None = None         #: -f, seconds of a -D run left out at each end; None: perftest's duration // 4
    iterations: int | None = None     #: -n iterations; None and no duration: perftest's default
    tx_depth: int | None = None       #: -t, send queue depth
    qp_timeout: int | None = None     #: -u, the QPs' ACK timeout exponent (4.096 us x 2^N); None: perftest's 14
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
    #: -F (--CPU-freq): no warning about the CPU's frequency, and a report even where perftest cannot calibrate its
    #: cycle counter (its averages then print 0.00; without -F it exits 1, "Can't produce a report": print_report_bw)
    ignore_cpu_freq: bool = False
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
        if self.margin is not None and (self.duration is None or self.margin < 0
                                        or not self.duration > 2 * self.margin):
            # perftest: "please check that DURATION > 2*MARGIN" (exit 1)
            raise ValueError(f"margin (-f) {self.margin} s needs a duration (-D) above twice it, got "
                             f"{self.duration}")
        if self.iterations is not None and self.iterations < 5:
            raise ValueError(f"perftest needs at least 5 iterations, got {self.iterations}")
        if self.qp_timeout is not None and not 0 <= self.qp_timeout <= 31:
            raise ValueError(f"qp_timeout is a 5-bit exponent (0..31), got {self.qp_timeout}")
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


def sample_window(params: PerftestParams) -> tuple[int, int]:
    """(lead, seconds) of a duration-mode run (pure): its sample starts ``lead`` s after its transfer loop does
    and lasts ``seconds``; the loop runs ``params.duration`` s in all.

    perftest 4.5 (src/perftest_resources.c, ``catch_alarm``; unchanged up to 26.04): on entering the loop
    (``run_iter_bw``, after the QP exchange) it arms ``alarm(margin)``; at that alarm it takes the first
    timestamp, counts completions from then on (the printed ``#iterations``) and arms ``alarm(duration -
    2 * margin)``; at that one it takes the last timestamp and arms ``alarm(margin)``, after which the loop
    ends. The printed average is ``#iterations x size`` over the two timestamps (its cycle counter); the
    margin defaults to ``duration / 4`` (integer division, perftest_parameters.c) unless ``-f`` sets it.
    """
    if params.duration is None:
        raise ValueError("a sample window exists only in duration mode (-D): set duration")
    lead = params.margin if params.margin is not None else params.duration // 4
    return lead, params.duration - 2 * lead


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
    if params.margin is not None:
        a += ["-f", str(params.margin)]
    if params.iterations is not None:
        a += ["-n", str(params.iterations)]
    if params.tx_depth is not None:
        a += ["-t", str(params.tx_depth)]
    if params.qp_timeout is not None:
        a += ["-u", str(params.qp_timeout)]
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
    if params.ignore_cpu_freq:
        a.append("-F")
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
