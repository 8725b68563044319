"""Flags of ``peercache-bench`` and their validation (pure: nothing starts here).

The node's flags are :class:`~peercache.config.NodeConfig`'s; the bench's own are declared the
same way in :class:`BenchOptions`. Each subcommand lists the flags it takes, in the order its
help shows them; :func:`validate` checks every flag a run has by its declaration, then the rules
that tie flags together (a batch within the working set, the memory a run needs).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Optional, Sequence

from .. import checks, config, tags
from ..address import host_of, is_loopback
from ..auth import load_secret
from ..config import TABLE_BYTES_PER_ENTRY, Flag, NodeConfig, option
from ..directory.redis.url import is_redis
from ..errors import ConfigError, TransportError
from ..transport.tcp import poll_us_setting

LAYOUTS = {"mla": ("",), "mha": ("/k", "/v")}  # object suffixes per page
DEFAULT_DISCOVERY = NodeConfig.options()["discovery_addr"].default
DEFAULT_RECV_BUFFER = 1 << 30
#: More driver processes / threads than this is a typo, not a benchmark.
MAX_PROCESSES = 1024
MAX_THREADS = 1024
#: Drivers serve waits for and pages in a working set beyond these are typos (the memory checks
#: below refuse most sizes well before them).
MAX_READERS = 65536
MAX_WORKING_SET = 1 << 40
#: Rough host-memory cost of the bench's bookkeeping, for refusing sizes that cannot fit:
#: serve keeps per object a key, a pool ref, an LRU entry and its directory entry; each
#: driver process keeps per object a key, its hash and (with a TTL) a cached location.
SERVE_BYTES_PER_OBJECT = 1024
DRIVE_BYTES_PER_OBJECT = 256
DRIVE_BYTES_PER_PROCESS = 64 << 20   # an interpreter with numpy, zmq and the native module
#: A working-set key prefix (--key-prefix): short, and only characters that need no quoting in a key.
KEY_PREFIX_RE = re.compile(r"[A-Za-z0-9_-]{1,32}")
#: More prefixes than this in one drive's --key-prefix is a typo, not a cluster.
MAX_KEY_PREFIXES = 64
#: --access zipf: the exponent S is positive; beyond this every draw is the hottest page anyway.
MAX_ZIPF_S = 100.0
#: --timeline-ms: the buckets of one point's timeline at most (each driver thread keeps TIMELINE_COUNTERS
#: int64 counters per bucket, plus one per --key-prefix): --timeline-ms over --duration beyond it is refused.
MAX_TIMELINE_BUCKETS = 100_000
#: --timeline-ms: counters per bucket of a thread (batches, keys, hits, misses, errors, verify failures, bytes).
TIMELINE_COUNTERS = 7


def timeline_buckets(duration_s: float, bucket_ms: int) -> int:
    """Buckets of ``bucket_ms`` that cover a window of ``duration_s`` (the last may be partial)."""
    return max(1, math.ceil(round(duration_s * 1000.0 / bucket_ms, 9)))


def int_list(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4] (argparse type)."""
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers")
    if not vals:
        raise argparse.ArgumentTypeError("empty list")
    return vals


def start_time(text: str) -> float:
    """'EPOCH' or 'EPOCH+SECONDS' -> epoch seconds (argparse type)."""
    try:
        return sum(float(x) for x in text.split("+"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not EPOCH or EPOCH+SECONDS")


def prefix_list(text: str) -> tuple:
    """'pA,pB' -> ('pA', 'pB'); '' -> () (argparse type; each prefix is checked by :func:`_key_prefixes`)."""
    return tuple(text.split(",")) if text else ()


#: What drive prints once every driver process is ready: declared in the engine/lab seam (document.py).
from .document import DRIVE_READY_WORDS  # noqa: E402,F401  (re-exported for older importers)
#: The most --time-scale stretches the fault bounds (an emulated CPU is 10-40 times slower).
MAX_TIME_SCALE = 1000.0


#: --access: the order drive's threads read pages in.
ACCESS = ("random", "sequential", "zipf")


def _time_scale(label: str, v) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not 1.0 <= v <= MAX_TIME_SCALE:
        raise ConfigError(f"{label} must be a factor from 1 to {MAX_TIME_SCALE:g} (how many times slower "
                          f"these hosts are than real ones), got {v!r}")
    return float(v)


def _concurrencies(label: str, v: list) -> list:
    if not isinstance(v, list) or not v or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise ConfigError(f"{label} must be a list of thread counts (e.g. 1,2,4), got {v!r}")
    if min(v) <= 0:
        raise ConfigError(f"{label} must all be positive, got {v}")
    if max(v) > MAX_THREADS:
        raise ConfigError(f"{label} {max(v)} is more than {MAX_THREADS} threads per driver process; "
                          "use --processes for more load")
    return v


def _key_prefixes(label: str, v) -> tuple:
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
        raise ConfigError(f"{label} must be prefixes separated by commas (e.g. pA,pB), got {v!r}")
    if len(v) > MAX_KEY_PREFIXES:
        raise ConfigError(f"{label} names {len(v)} prefixes; at most {MAX_KEY_PREFIXES} (one per producer "
                          "whose working set drive reads)")
    for x in v:
        if not KEY_PREFIX_RE.fullmatch(x):
            raise ConfigError(f"{label}: {x!r} is not a key prefix: give 1 to 32 of A-Z a-z 0-9 _ - "
                              "(several separated by commas, no spaces, none empty)")
    twice = sorted({x for x in v if v.count(x) > 1})
    if twice:
        raise ConfigError(f"{label} names {', '.join(map(repr, twice))} more than once; the union of the "
                          "prefixes' working sets would repeat pages")
    return tuple(v)


def _zipf_s(label: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or not 0 < v <= MAX_ZIPF_S:
        raise ConfigError(f"{label} must be a Zipf exponent S with 0 < S <= {MAX_ZIPF_S:g} (popularity of rank "
                          f"r proportional to 1/r^S; e.g. 0.8, 1.0, 1.2), got {v!r}")
    return float(v)


@dataclass(frozen=True)
class BenchOptions:
    """The bench's own options (the node's are NodeConfig's): flags of serve and drive."""

    device_name: Optional[str] = option(
        None, "one RDMA device (rdma protocol)", check=config.device, flag=Flag("--device-name"))
    layout: str = option(
        "mla", "mla: one object per page; mha: K and V objects", check=config.choice(*sorted(LAYOUTS)),
        flag=Flag("--layout", choices=sorted(LAYOUTS)))
    working_set: int = option(
        1024, "pages published by serve", unit="pages", check=config.whole(1, MAX_WORKING_SET, least="positive"),
        flag=Flag("--working-set"))
    quiet: bool = option(False, "no progress lines", flag=Flag("--quiet"))
    readers: int = option(
        1, "drivers to wait for before exiting; 0: serve until interrupted (Ctrl-C, SIGTERM) or --max-wait, "
           "for drivers that come and go", check=config.whole(0, MAX_READERS), flag=Flag("--readers"))
    max_wait: float = option(
        3600.0, "exit after this many seconds even if readers are missing", unit="s",
        check=config.seconds(allow_inf=True), flag=Flag("--max-wait"))
    batch_size: int = option(
        32, "pages per batch", unit="pages", check=config.whole(1, MAX_WORKING_SET, least="positive"),
        flag=Flag("--batch-size"))
    concurrencies: tuple = option(
        (1,), "threads per process, swept: e.g. 1,2,4", unit="threads", check=_concurrencies,
        flag=Flag("--concurrencies", default=[1], type=int_list))
    processes: int = option(
        1, "driver processes", check=config.whole(1, MAX_PROCESSES, least="positive"), flag=Flag("--processes"))
    duration: float = option(
        10.0, "measured seconds per point", unit="s", check=config.seconds(positive=True), flag=Flag("--duration"))
    warmup: float = option(
        2.0, "unmeasured seconds before each point", unit="s", check=config.seconds(), flag=Flag("--warmup"))
    op: str = option(
        "get", "operation", check=config.choice("get", "exists"), flag=Flag("--op", choices=("get", "exists")))
    verify: bool = option(
        True, "check the contents of every page read", check=config.boolean,
        flag=Flag("--no-verify", dest="verify", action="store_false",
                  help="skip checking page contents (pure-throughput runs)"))
    recv_buffer: int = option(
        DEFAULT_RECV_BUFFER, "receive buffer bytes per process", unit="B",
        check=config.whole(1, checks.MAX_BYTES, least="positive"), flag=Flag("--recv-buffer"))
    access: str = option(
        "random", "key order within the working set: random (uniform), sequential, or zipf (a few pages "
                  "hot: --zipf-s)", check=config.choice(*ACCESS),
        flag=Flag("--access", choices=ACCESS))
    zipf_s: float = option(
        1.0, "--access zipf: the exponent S; the page of popularity rank r (of the working set, or of the "
             "union of --key-prefix's) is drawn with probability proportional to 1/r^S; which pages are hot "
             "is fixed by --seed", check=_zipf_s, flag=Flag("--zipf-s", default=None, type=float, metavar="S",
                                                            shown="1.0"))
    key_prefix: tuple = option(
        (), "working-set key prefix: keys pc/P/<i> instead of pc/<i>", check=_key_prefixes,
        flag=Flag("--key-prefix", default=None, type=prefix_list, metavar="P", shown="none: keys pc/<i>"))
    join: bool = option(
        False, "register with and publish into the embedded directory another process hosts at "
               "--discovery-addr (or --directory HOST:PORT), e.g. `peercache-bench meta`, instead of hosting "
               "it; needs --readers 0 (drivers tell the directory's host, not this serve, they are done: serve "
               "runs until SIGTERM/SIGINT or --max-wait) and --bind unless the directory is on loopback",
        flag=Flag("--join"))
    seed: int = option(1, "random seed", check=config.whole(0, (1 << 63) - 1), flag=Flag("--seed"))
    ready_timeout: float = option(
        30.0, "seconds to wait for serve and the working set", unit="s", check=config.seconds(),
        flag=Flag("--ready-timeout"))
    start_at: Optional[float] = option(
        None, "EPOCH[+SECONDS] at which the first point starts (several drivers measuring one shared window, "
              "as the lab's group runner does)", unit="s", check=lambda label, v: checks.epoch(label, v),
        flag=Flag("--start-at", type=start_time))
    time_scale: float = option(
        1.0, "stretch drive's fault bounds (directory calls 3 s, tcp data 2 s, rdma connects 5 s, directory "
             "silence 3 s, a point's overrun 20 s) by this factor, for hosts slower than real ones: the lab "
             "passes an emulated testbed's measured slowness; 1 on real hardware", check=_time_scale,
        flag=Flag("--time-scale", type=float))
    start_file: Optional[str] = option(
        None, "FILE in which drive, once ready, waits (up to --ready-timeout) for the EPOCH its first point "
              "starts at: a runner releases several drivers on one shared window once all are ready "
              "(the lab's group runner)", check=config.path, flag=Flag("--start-file", metavar="FILE"))
    gpu: bool = option(
        False, "receive into GPU memory (PyTorch or CuPy): rdma registers it for GPUDirect (dma-buf, else "
               "nvidia-peermem); tcp and shm stage through pinned host memory", flag=Flag("--gpu"))
    gpu_device: int = option(
        0, "CUDA device of --gpu", check=config.whole(0, 255, " (a CUDA device number)"), flag=Flag("--gpu-device"))
    metrics_scrapes: bool = option(
        False, "keep each driver process's metrics text (what its --metrics-addr endpoint answers) and serve's "
               "at the start and end of every point's measured window, in the result document "
               "(points[].metrics_scrapes)", flag=Flag("--metrics-scrapes"))
    timeline_ms: int = option(
        0, "count, per bucket of N ms from the window's start, the batches, keys, hits (and hits per "
           "--key-prefix), misses, errors, verify failures and bytes every driver thread completed, and each "
           "thread's longest gap between two completed batches (points[].timeline; 0 = off)", unit="ms",
        check=config.whole(0, 3_600_000), flag=Flag("--timeline-ms", metavar="N"))
    faults_expected: bool = option(
        False, "producers, or the directory, are expected to go away during the window (membership churn, "
               "a directory restart): read errors are counted and reported (points[].errors, "
               "points[].first_error) and each driver thread goes on, but they do not fail the point, nor "
               "does the directory's silence end it; a verify failure, a redirected entry or an aborted "
               "thread still does", flag=Flag("--faults-expected"))
    out: Optional[str] = option(
        None, "write the JSON result document here", check=checks.writable_file, flag=Flag("--out"))
    trace: Optional[str] = option(
        None, "record the tcp data server's latency trace (native/trace.h) and write it here at exit "
              "(the get_trace point kind joins it with a client's)", check=checks.writable_file, flag=Flag("--trace"))


#: Every flag's declaration, by option name: the node's, then the bench's own.
FLAGS = {**{n: o for n, o in NodeConfig.options().items() if o.flag}, **config.options(BenchOptions)}


def _add(p: argparse.ArgumentParser, *names: str, help: str | None = None) -> None:
    for name in names:
        config.add_flag(p, FLAGS[name], help=help)


#: The settings serve publishes as its geometry (peercache.node.geometry): option name -> the attribute of
#: the parsed flags. drive takes each it is not given from the producer, else the option's default.
GEOMETRY = {"layout": "layout", "page_bytes": "page_size", "working_set": "working_set"}


def _flag(name: str, learned: bool = False):
    """The declaration of flag ``name``; ``learned`` (drive): a geometry flag defaults to what the producer
    publishes."""
    o = FLAGS[name]
    if learned and name in GEOMETRY:
        o = dataclasses.replace(o, flag=dataclasses.replace(
            o.flag, default=None, shown=f"the producer's, else {o.flag_default}"))
    return o


#: Flags serve and drive share (they must agree on the working set), in the order add_common adds them.
COMMON = ("discovery_addr", "directory", "protocol", "device_name", "devices", "ib_port", "gid_index", *GEOMETRY,
          "max_channels", "tcp_poll_us", "quiet", "integrity", "auth_key_file", "metrics_addr")


def add_common(p: argparse.ArgumentParser, learned: bool = False) -> None:
    """Flags shared by serve and drive (they must agree on the working set), ungrouped (the HiCache suite's
    parser); ``learned`` (drive): the geometry's flags default to what the producer publishes."""
    for name in COMMON:
        config.add_flag(p, _flag(name, learned))


# --help of serve and drive, group by group: (title, description, option names). The group titled None is
# argparse's own "options" (with -h), shown first: the everyday flags. The groups after it hold what a first
# run leaves at its default: RDMA's device flags, tuning, and the flags the lab's runners set.
RDMA_TITLE = "RDMA devices (with --protocol rdma)"
EXPERT = ("expert: tuning, security, metrics",
          "the defaults suit a first run; change these when measuring one effect")
LAB = ("lab-internal: set by the lab's runners (python -m peercache.lab.pipeline)",
       "several drivers started on one window, emulated hosts, fault scenarios, metrics and timelines kept in "
       "the result document; a drive run by hand needs none of these")
SERVE_HELP = (
    (None, None, ("discovery_addr", "directory", "protocol", *GEOMETRY, "readers", "max_wait", "bind",
                  "key_prefix", "out", "quiet")),
    (RDMA_TITLE, None, ("device_name", "devices", "ib_port", "gid_index")),
    (*EXPERT, ("max_channels", "tcp_poll_us", "integrity", "auth_key_file", "metrics_addr", "heartbeat_timeout",
               "dir_table_entries", "join")),
    (*LAB, ("trace",)),
)
DRIVE_HELP = (
    (None, None, ("discovery_addr", "directory", "protocol", *GEOMETRY, "batch_size", "concurrencies",
                  "processes", "duration", "warmup", "op", "verify", "access", "zipf_s", "key_prefix", "out",
                  "quiet")),
    (RDMA_TITLE + " and GPU memory (--gpu)", None, ("device_name", "devices", "ib_port", "gid_index", "gpu", "gpu_device")),
    (*EXPERT, ("max_channels", "tcp_poll_us", "integrity", "auth_key_file", "metrics_addr", "dir_cache_ttl",
               "recv_buffer", "seed", "ready_timeout")),
    (*LAB, ("start_at", "start_file", "time_scale", "metrics_scrapes", "timeline_ms", "faults_expected")),
)


def _add_groups(p: argparse.ArgumentParser, table: tuple, *, learned: bool = False,
                helps: dict[str, str] | None = None) -> None:
    """Add the flags of ``table`` (SERVE_HELP, DRIVE_HELP) to ``p``, group by group; ``helps``: a subcommand's
    own help text of a flag, by option name."""
    p.usage = "%(prog)s [-h] [options]"       # the groups below list every flag; a usage of all of them is noise
    for title, description, names in table:
        where = p if title is None else p.add_argument_group(title, description)
        for name in names:
            config.add_flag(where, _flag(name, learned), help=(helps or {}).get(name))


def geometry_given(args) -> dict:
    """drive's geometry flags as given: attribute -> value, None where not given."""
    return {attr: getattr(args, attr, None) for attr in GEOMETRY.values()}


def geometry_defaults() -> dict:
    """The geometry of a producer that publishes none: each flag's default (attribute -> value)."""
    return {attr: FLAGS[name].flag_default for name, attr in GEOMETRY.items()}


def fill_geometry(args) -> None:
    """drive's geometry flags left unset (not given, nor learned from a producer): their defaults."""
    for attr, value in geometry_defaults().items():
        if getattr(args, attr, None) is None:
            setattr(args, attr, value)


def geometry_flags() -> dict:
    """attribute -> the flag that sets it ('page_size' -> '--page-size')."""
    return {attr: FLAGS[name].flag.name for name, attr in GEOMETRY.items()}


def add_directory(p: argparse.ArgumentParser) -> None:
    """``--directory`` (serve, drive and meta)."""
    _add(p, "directory")


def directory(args) -> str:
    """The directory spec of a run: --directory, else --discovery-addr."""
    return getattr(args, "directory", None) or args.discovery_addr


def check_directory(args) -> None:
    """--directory: a Redis URL that parses, or HOST:PORT (then it stands for --discovery-addr)."""
    spec = getattr(args, "directory", None)
    if not spec:
        return
    NodeConfig.check("directory", spec)
    if not is_redis(spec):
        args.discovery_addr = spec


def add_auth(p: argparse.ArgumentParser) -> None:
    """``--auth-key-file`` (serve, drive and meta)."""
    _add(p, "auth_key_file")


def auth_secret(args) -> bytes | None:
    """The cluster secret of --auth-key-file, else $PEERCACHE_AUTH_KEY, else None (ConfigError if unusable)."""
    return load_secret(getattr(args, "auth_key_file", None))


def serve_parser(p: argparse.ArgumentParser) -> None:
    """Flags of ``serve``: everyday ones first, then RDMA's and the expert ones (SERVE_HELP)."""
    _add_groups(p, SERVE_HELP, helps={
        "key_prefix": "publish the working set under key prefix P: keys pc/P/<i> (mha: pc/P/<i>/k and /v) instead "
                      "of pc/<i>, so several serves can share one directory",
        "out": "write serve's JSON summary here"})


def drive_parser(p: argparse.ArgumentParser) -> None:
    """Flags of ``drive``: everyday ones first, then RDMA's and GPU's, the expert ones and the lab's (DRIVE_HELP)."""
    _add_groups(p, DRIVE_HELP, learned=True, helps={
        "key_prefix": "read the union of the working sets serves published under these key prefixes (P1,P2,...; "
                      "--working-set pages each): every batch is drawn from the union, so one batch spans several "
                      "producers"})


def meta_parser(p: argparse.ArgumentParser) -> None:
    """Flags of ``meta``."""
    _add(p, "discovery_addr", help="HOST:PORT meta binds for discovery")
    _add(p, "heartbeat_timeout", "directory", "auth_key_file", "metrics_addr")


def devices(args) -> list[str]:
    """The device list named by --devices / --device-name."""
    if args.devices:
        return [d for d in args.devices.split(",") if d]
    return [args.device_name] if args.device_name else []


def transport_options(args) -> dict:
    """Options of the transport named by --protocol (rdma: devices, port, GID index; tcp: poll time)."""
    return node_config(args).transport_options()


def tcp_poll_us(args, protocol_only: bool = True) -> int | None:
    """The µs the native tcp client polls for a reply before sleeping, as this run has it (None: not
    tcp, unless ``protocol_only`` is off); ConfigError for a bad --tcp-poll-us / $PEERCACHE_TCP_POLL_US."""
    if protocol_only and args.protocol != "tcp":
        return None
    try:
        return poll_us_setting(getattr(args, "tcp_poll_us", None))
    except TransportError as e:
        raise ConfigError(str(e)) from None


def objects_per_page(layout: str) -> int:
    return len(LAYOUTS[layout])


def node_config(args) -> NodeConfig:
    """The node options of a run's flags, each checked (ConfigError names the flag); --device-name
    stands for --devices."""
    return NodeConfig.from_args(args, devices=tuple(devices(args)))


def check_flags(args, mode: str) -> None:
    """Each flag by its declaration, --directory, and the rules between flags that do not involve the
    geometry (ConfigError names the flag): what drive checks before it asks the producer for the geometry
    it was not given."""
    check_directory(args)
    node_config(args)
    config.checked(config.options(BenchOptions), args)
    if args.device_name and args.devices:
        raise ConfigError("give either --device-name or --devices, not both")
    if mode != "drive":
        return
    if getattr(args, "metrics_scrapes", False) and not getattr(args, "metrics_addr", None):
        raise ConfigError("--metrics-scrapes keeps what each process's metrics endpoint answers; give "
                          "--metrics-addr with it (e.g. --metrics-addr 127.0.0.1:0)")
    if getattr(args, "start_at", None) is not None and getattr(args, "start_file", None):
        raise ConfigError("give either --start-at (a start time known in advance) or --start-file (a start "
                          "time written once every driver is ready), not both")
    if getattr(args, "zipf_s", None) is not None and args.access != "zipf":
        raise ConfigError(f"--zipf-s is the exponent of --access zipf, but --access is {args.access}; "
                          "give --access zipf with it, or drop --zipf-s")
    _timeline_buckets(args)


def validate(args, mode: str) -> None:
    """Refuse impossible combinations and out-of-range values before anything starts (ConfigError names
    the flag). drive's geometry flags not given, nor learned from the producer, get their defaults."""
    check_flags(args, mode)
    fill_geometry(args)
    objs = objects_per_page(args.layout)
    if mode == "serve":
        check_join(args)
        if len(key_prefixes(args)) > 1:
            raise ConfigError(f"serve publishes one working set under one prefix, but --key-prefix names "
                              f"{len(key_prefixes(args))}; give one (drive takes several, comma-separated)")
        entries = getattr(args, "dir_table_entries", 0)
        objects = args.working_set * objs
        pool = objects * slot_bytes(args.page_size)
        _fits(pool + objects * SERVE_BYTES_PER_OBJECT,
              f"--working-set {args.working_set} x --page-size {args.page_size}"
              + (f" x {objs} objects per page (--layout {args.layout})" if objs > 1 else ""),
              "lower --working-set or --page-size")
        _fits(pool + objects * SERVE_BYTES_PER_OBJECT + entries * TABLE_BYTES_PER_ENTRY,
              f"the pool and --dir-table-entries {entries} (about {TABLE_BYTES_PER_ENTRY:.0f} B each)",
              "lower --dir-table-entries (0 = no table)")
        return
    buckets = _timeline_buckets(args)
    pages = union_pages(args)
    if args.batch_size > pages:
        union = f" x {len(key_prefixes(args))} --key-prefix's" if len(key_prefixes(args)) > 1 else ""
        raise ConfigError(f"--batch-size {args.batch_size} is larger than --working-set "
                          f"{args.working_set}{union}; a batch would repeat keys")
    need = args.batch_size * objs * args.page_size * max(args.concurrencies)
    if need > args.recv_buffer:
        raise ConfigError(
            f"a batch of {args.batch_size} x {objs} x {args.page_size} B for "
            f"each of {max(args.concurrencies)} threads needs {need} B, more than the "
            f"{args.recv_buffer} B receive buffer; lower --batch-size or raise --recv-buffer")
    objects = pages * objs
    # --timeline-ms: each thread's counters, and a process's merge of them
    per_prefix = len(key_prefixes(args)) if len(key_prefixes(args)) > 1 else 0
    tl = (max(args.concurrencies) + 1) * buckets * (TIMELINE_COUNTERS + per_prefix) * 8
    _fits(args.processes * (DRIVE_BYTES_PER_PROCESS + need + objects * DRIVE_BYTES_PER_OBJECT + tl),
          f"--processes {args.processes} x (a {human_bytes(need)} receive buffer of --batch-size "
          f"{args.batch_size} x --page-size {args.page_size} x {max(args.concurrencies)} threads "
          f"+ the {objects} keys of --working-set {args.working_set}"
          + (f" x {len(key_prefixes(args))} prefixes" if len(key_prefixes(args)) > 1 else "")
          + (f" + {human_bytes(tl)} of --timeline-ms counters ({buckets} buckets per thread)" if tl else "") + ")",
          "lower --processes, --working-set, --batch-size or --page-size"
          + (", or raise --timeline-ms" if tl else ""))


def _timeline_buckets(args) -> int:
    """The buckets of drive's --timeline-ms over --duration (0 when off); ConfigError beyond
    MAX_TIMELINE_BUCKETS."""
    ms = getattr(args, "timeline_ms", 0) or 0
    if not ms:
        return 0
    n = timeline_buckets(args.duration, ms)
    if n > MAX_TIMELINE_BUCKETS:
        least = math.ceil(args.duration * 1000 / MAX_TIMELINE_BUCKETS)
        raise ConfigError(f"--timeline-ms {ms} over --duration {args.duration:g} s makes {n} buckets, more than "
                          f"{MAX_TIMELINE_BUCKETS} (each thread keeps counters for every bucket); give "
                          f"--timeline-ms {least} or more, or a shorter --duration")
    return n


def check_join(args) -> None:
    """serve --join: an embedded directory another process hosts, a data address drivers can reach, and no
    readers to wait for (ConfigError saying what to give)."""
    if not getattr(args, "join", False):
        return
    spec = directory(args)
    if is_redis(spec):
        raise ConfigError("--join joins an embedded directory another process hosts (`peercache-bench meta` at "
                          "--discovery-addr or --directory HOST:PORT); with a Redis --directory serve hosts "
                          "nothing anyway and publishes into Redis: drop --join")
    if args.readers:
        raise ConfigError(f"--join with --readers {args.readers}: drivers say they are done to the node that "
                          f"hosts the directory ({spec}), not to this serve, so it would never hear from them; "
                          "give --readers 0 (serve then serves until SIGTERM/SIGINT or --max-wait)")
    if not getattr(args, "bind", None) and not is_loopback(host_of(args.discovery_addr)):
        raise ConfigError(f"--join: the directory at {spec} is another host's address, which serve's data "
                          "server cannot bind; give --bind with an address of this host that the drivers "
                          "reach (e.g. --bind 10.0.0.2)")


def key_prefixes(args) -> tuple:
    """The --key-prefix's of a run (() when none: the keys pc/<i>)."""
    return tuple(getattr(args, "key_prefix", None) or ())


def union_pages(args) -> int:
    """Pages drive reads from: --working-set, times the number of --key-prefix's when several."""
    return args.working_set * max(1, len(key_prefixes(args)))


def validate_meta(args) -> None:
    """The flags of ``meta``, checked before it starts."""
    NodeConfig.from_args(args)


def check_addr(addr: str, option: str = "--discovery-addr") -> None:
    """HOST:PORT with a port a TCP socket can have (1..65535); zmq URLs are left to zmq."""
    checks.host_port(option, addr)


#: Physical memory of this host in bytes (None when it cannot be read).
host_memory = checks.host_memory


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            break
        n /= 1024
    if unit == "PiB" and n >= 1024:
        return f"{n:.3g} PiB"
    return f"{n:.0f} {unit}" if n >= 10 or unit == "B" else f"{n:.1f} {unit}"


def _fits(need: int, what: str, hint: str) -> None:
    """Refuse a run whose memory ``need`` is more than this host has."""
    total = host_memory()
    if total is not None and need > total:
        raise ConfigError(f"{what} needs {human_bytes(need)}; this host has {human_bytes(total)}; {hint}")


#: what every bench object key starts with (page_keys)
KEY_ROOT = "pc/"


def page_keys(n: int, layout: str, prefixes: str | Sequence[str] = "") -> list[bytes]:
    """Object keys of the bench working set: page i -> one (mla) or two (mha) keys, ``pc/<i>`` (and
    ``/k`` ``/v``), or ``pc/<P>/<i>`` under the prefix P (a string; "" or none: no prefix).

    With several prefixes, the union of their working sets of ``n`` pages each, prefix by prefix: page j
    of the union is page ``j % n`` of prefix ``prefixes[j // n]`` (its keys at ``j * objects per page``)."""
    heads = [prefixes] if isinstance(prefixes, str) else list(prefixes) or [""]
    return [(f"{KEY_ROOT}{p}/{i}{sfx}" if p else f"{KEY_ROOT}{i}{sfx}").encode()
            for p in heads for i in range(n) for sfx in LAYOUTS[layout]]


def key_scheme(layout: str, prefix: str = "") -> str:
    """How :func:`page_keys` names page i: 'pc/<i>', 'pc/<i>/k|v' (mha), 'pc/P/<i>' (prefix P)."""
    sfx = "|".join(s.lstrip("/") for s in LAYOUTS[layout] if s)
    return f"{KEY_ROOT}{prefix + '/' if prefix else ''}<i>" + (f"/{sfx}" if sfx else "")


def slot_bytes(page_size: int) -> int:
    """Pool bytes per object including the tag."""
    return tags.slot_stride(page_size)
