"""Flags of ``peercache-bench`` and their validation (pure: nothing starts here)."""
from __future__ import annotations

import argparse

from .. import checks, tags
from ..directory import table as _dirtable
from ..errors import ConfigError, TransportError
from ..directory.redis_url import PASSWORD_ENV as REDIS_PASSWORD_ENV, is_redis, parse_url
from ..transport import PROTOCOLS

LAYOUTS = {"mla": ("",), "mha": ("/k", "/v")}  # object suffixes per page
DEFAULT_DISCOVERY = "127.0.0.1:31998"
DEFAULT_RECV_BUFFER = 1 << 30
#: More driver processes / threads than this is a typo, not a benchmark.
MAX_PROCESSES = 1024
MAX_THREADS = 1024
#: Drivers serve waits for, pages in a working set and entries of the directory table beyond these
#: are typos (the memory checks below refuse most sizes well before them).
MAX_READERS = 65536
MAX_WORKING_SET = 1 << 40
MAX_TABLE_ENTRIES = 1 << 32
#: Rough host-memory cost of the bench's bookkeeping, for refusing sizes that cannot fit:
#: serve keeps per object a key, a pool ref, an LRU entry and its directory entry; each
#: driver process keeps per object a key, its hash and (with a TTL) a cached location.
SERVE_BYTES_PER_OBJECT = 1024
DRIVE_BYTES_PER_OBJECT = 256
DRIVE_BYTES_PER_PROCESS = 64 << 20   # an interpreter with numpy, zmq and the native module
#: Memory of one directory-table entry (a bucket line per ``ways`` entries, touched as it fills).
TABLE_BYTES_PER_ENTRY = _dirtable.LINE_BYTES * (_dirtable.DEFAULT_WAYS + 1) / _dirtable.DEFAULT_WAYS


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


def add_common(p: argparse.ArgumentParser) -> None:
    """Flags shared by serve and drive (they must agree on the working set)."""
    p.add_argument("--discovery-addr", default=DEFAULT_DISCOVERY,
                   help="HOST:PORT of discovery (serve binds it; drive connects to it) [%(default)s]")
    add_directory(p)
    p.add_argument("--protocol", default="tcp", choices=PROTOCOLS, help="data transport [%(default)s]")
    p.add_argument("--device-name", default=None, help="one RDMA device (rdma protocol)")
    p.add_argument("--devices", default=None, help="comma-separated RDMA devices, one rail each (rdma)")
    p.add_argument("--ib-port", type=int, default=1, help="RDMA port of each device (rdma) [%(default)s]")
    p.add_argument("--gid-index", type=int, default=None,
                   help="GID table index (rdma; RoCE v2 IPv4 entry found automatically when omitted)")
    p.add_argument("--layout", default="mla", choices=sorted(LAYOUTS),
                   help="mla: one object per page; mha: K and V objects [%(default)s]")
    p.add_argument("--page-size", type=int, default=131072, help="bytes per object [%(default)s]")
    p.add_argument("--working-set", type=int, default=1024, help="pages published by serve [%(default)s]")
    p.add_argument("--max-channels", type=int, default=8, help="data channels per peer [%(default)s]")
    p.add_argument("--tcp-poll-us", type=int, default=None, metavar="US",
                   help="tcp: poll the socket this long for a reply before sleeping (0: sleep at once; "
                        "backs off against slow peers) [$PEERCACHE_TCP_POLL_US, else 50]")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--integrity", action="store_true",
                   help="serve: write a checksum (XXH3-64) of each page in its slot header; drive: check it "
                        "before a read counts as a hit (a mismatch is a miss and a counter) [off]")
    add_auth(p)


def add_directory(p: argparse.ArgumentParser) -> None:
    """``--directory`` (serve, drive and meta)."""
    p.add_argument("--directory", default=None, metavar="SPEC",
                   help="where the directory lives: HOST:PORT = the embedded one (the same as "
                        "--discovery-addr), or redis://[USER:PASSWORD@]HOST:PORT/DB / rediss://... "
                        f"(Redis or Redis Cluster; the password also from ${REDIS_PASSWORD_ENV}) "
                        "[the embedded directory at --discovery-addr]")


def directory(args) -> str:
    """The directory spec of a run: --directory, else --discovery-addr."""
    return getattr(args, "directory", None) or args.discovery_addr


def check_directory(args) -> None:
    """--directory: a Redis URL that parses, or HOST:PORT (then it stands for --discovery-addr)."""
    spec = getattr(args, "directory", None)
    if not spec:
        return
    if is_redis(spec):
        parse_url(spec)
        return
    check_addr(spec, "--directory")
    args.discovery_addr = spec


def add_auth(p: argparse.ArgumentParser) -> None:
    """``--auth-key-file`` (serve, drive and meta)."""
    p.add_argument("--auth-key-file", default=None, metavar="PATH",
                   help="file holding the cluster secret: only processes with the same secret can use the "
                        "control plane [$PEERCACHE_AUTH_KEY if set, else no authentication]")


def auth_secret(args) -> bytes | None:
    """The cluster secret of --auth-key-file, else $PEERCACHE_AUTH_KEY, else None (ConfigError if unusable)."""
    from ..auth import load_secret
    return load_secret(getattr(args, "auth_key_file", None))


def serve_parser(p: argparse.ArgumentParser) -> None:
    """Flags of ``serve``."""
    add_common(p)
    p.add_argument("--readers", type=int, default=1, help="drivers to wait for before exiting [%(default)s]")
    p.add_argument("--bind", default=None,
                   help="address of the data endpoint [host of --discovery-addr]")
    p.add_argument("--max-wait", type=float, default=3600.0,
                   help="exit after this many seconds even if readers are missing [%(default)s]")
    p.add_argument("--heartbeat-timeout", type=float, default=5.0,
                   help="drop nodes silent for this long [%(default)s]")
    from ..directory.table import DEFAULT_ENTRIES, DEFAULT_WAYS, LINE_BYTES
    per_entry = LINE_BYTES * (DEFAULT_WAYS + 1) / DEFAULT_WAYS
    p.add_argument("--dir-table-entries", type=int, default=DEFAULT_ENTRIES,
                   help="entries of the directory table drivers read one-sided (embedded directory only): "
                        f"about {per_entry:.0f} B of memory each, {DEFAULT_ENTRIES * per_entry / 2**20:.0f} MiB "
                        "at the default, touched as it fills (pinned whole under rdma); keys beyond it are "
                        "answered by the lookup RPC; 0 = no table [%(default)s]")
    p.add_argument("--out", default=None, help="write serve's JSON summary here")


def drive_parser(p: argparse.ArgumentParser) -> None:
    """Flags of ``drive``."""
    add_common(p)
    p.add_argument("--batch-size", type=int, default=32, help="pages per batch [%(default)s]")
    p.add_argument("--concurrencies", type=int_list, default=[1],
                   help="threads per process, swept: e.g. 1,2,4 [%(default)s]")
    p.add_argument("--processes", type=int, default=1, help="driver processes [%(default)s]")
    p.add_argument("--dir-cache-ttl", type=float, default=0.0,
                   help="seconds a looked-up location is reused (0 = off) [%(default)s]")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per point [%(default)s]")
    p.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each point [%(default)s]")
    p.add_argument("--op", default="get", choices=("get", "exists"), help="operation [%(default)s]")
    p.add_argument("--no-verify", dest="verify", action="store_false",
                   help="skip checking page contents (pure-throughput runs)")
    p.add_argument("--recv-buffer", type=int, default=DEFAULT_RECV_BUFFER,
                   help="receive buffer bytes per process [%(default)s]")
    p.add_argument("--access", default="random", choices=("random", "sequential"),
                   help="key order within the working set [%(default)s]")
    p.add_argument("--seed", type=int, default=1, help="random seed [%(default)s]")
    p.add_argument("--ready-timeout", type=float, default=30.0,
                   help="seconds to wait for serve and the working set [%(default)s]")
    p.add_argument("--start-at", type=start_time, default=None,
                   help="EPOCH[+SECONDS] at which the first point starts (several drivers measuring "
                        "one shared window, as the lab's group runner does)")
    p.add_argument("--gpu", action="store_true",
                   help="receive into GPU memory (PyTorch or CuPy): rdma registers it for GPUDirect "
                        "(dma-buf, else nvidia-peermem); tcp and shm stage through pinned host memory")
    p.add_argument("--gpu-device", type=int, default=0, help="CUDA device of --gpu [%(default)s]")
    p.add_argument("--out", default=None, help="write the JSON result document here")


def devices(args) -> list[str]:
    """The device list named by --devices / --device-name."""
    if args.devices:
        return [d for d in args.devices.split(",") if d]
    return [args.device_name] if args.device_name else []


def transport_options(args) -> dict:
    """Options of the transport named by --protocol (rdma: devices, port, GID index)."""
    if args.protocol == "tcp":
        return {} if getattr(args, "tcp_poll_us", None) is None else {"poll_us": args.tcp_poll_us}
    if args.protocol != "rdma":
        return {}
    return {"devices": devices(args), "ib_port": args.ib_port, "gid_index": args.gid_index}


def tcp_poll_us(args, protocol_only: bool = True) -> int | None:
    """The µs the native tcp client polls for a reply before sleeping, as this run has it (None: not
    tcp, unless ``protocol_only`` is off); ConfigError for a bad --tcp-poll-us / $PEERCACHE_TCP_POLL_US."""
    if protocol_only and args.protocol != "tcp":
        return None
    from ..transport.tcp import poll_us_setting
    try:
        return poll_us_setting(getattr(args, "tcp_poll_us", None))
    except TransportError as e:
        raise ConfigError(str(e)) from None


def objects_per_page(layout: str) -> int:
    return len(LAYOUTS[layout])


def validate(args, mode: str) -> None:
    """Refuse impossible combinations and out-of-range values before anything starts (ConfigError names
    the flag)."""
    check_directory(args)
    check_addr(args.discovery_addr)
    if getattr(args, "out", None) is not None:
        checks.writable_file("--out", args.out)
    checks.integer("--page-size", args.page_size, minimum=1, maximum=checks.MAX_BYTES, least="positive")
    checks.integer("--working-set", args.working_set, minimum=1, maximum=MAX_WORKING_SET, least="positive")
    checks.integer("--max-channels", args.max_channels, minimum=1, maximum=checks.MAX_CHANNELS, least="positive")
    if getattr(args, "tcp_poll_us", None) is not None:
        tcp_poll_us(args, protocol_only=False)
    if args.device_name and args.devices:
        raise ConfigError("give either --device-name or --devices, not both")
    checks.integer("--ib-port", args.ib_port, minimum=1, maximum=255, what=" (a port of the RDMA device)")
    if args.gid_index is not None:
        checks.integer("--gid-index", args.gid_index, minimum=0, maximum=255, what=" (an entry of the GID table)")
    objs = objects_per_page(args.layout)
    if mode == "serve":
        if args.bind is not None:
            checks.host("--bind", args.bind)
        checks.integer("--readers", args.readers, minimum=0, maximum=MAX_READERS)
        checks.seconds("--max-wait", args.max_wait, allow_inf=True)
        checks.seconds("--heartbeat-timeout", args.heartbeat_timeout, positive=True)
        entries = getattr(args, "dir_table_entries", 0)
        checks.integer("--dir-table-entries", entries, minimum=0, maximum=MAX_TABLE_ENTRIES,
                       what=" (0 = no directory table)")
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
    if args.batch_size <= 0:
        raise ConfigError(f"--batch-size must be positive, got {args.batch_size}")
    if args.batch_size > args.working_set:
        raise ConfigError(f"--batch-size {args.batch_size} is larger than --working-set "
                          f"{args.working_set}; a batch would repeat keys")
    if min(args.concurrencies) <= 0:
        raise ConfigError(f"--concurrencies must all be positive, got {args.concurrencies}")
    if max(args.concurrencies) > MAX_THREADS:
        raise ConfigError(f"--concurrencies {max(args.concurrencies)} is more than {MAX_THREADS} threads "
                          "per driver process; use --processes for more load")
    if args.processes <= 0:
        raise ConfigError(f"--processes must be positive, got {args.processes}")
    if args.processes > MAX_PROCESSES:
        raise ConfigError(f"--processes {args.processes} is more than {MAX_PROCESSES} driver processes")
    checks.seconds("--duration", args.duration, positive=True)
    checks.seconds("--warmup", args.warmup)
    checks.seconds("--dir-cache-ttl", args.dir_cache_ttl)
    checks.seconds("--ready-timeout", args.ready_timeout)
    if args.start_at is not None:
        checks.epoch("--start-at", args.start_at)
    checks.integer("--seed", args.seed, minimum=0, maximum=(1 << 63) - 1)
    checks.integer("--recv-buffer", args.recv_buffer, minimum=1, maximum=checks.MAX_BYTES, least="positive")
    checks.integer("--gpu-device", args.gpu_device, minimum=0, maximum=255, what=" (a CUDA device number)")
    need = args.batch_size * objs * args.page_size * max(args.concurrencies)
    if need > args.recv_buffer:
        raise ConfigError(
            f"a batch of {args.batch_size} x {objs} x {args.page_size} B for "
            f"each of {max(args.concurrencies)} threads needs {need} B, more than the "
            f"{args.recv_buffer} B receive buffer; lower --batch-size or raise --recv-buffer")
    objects = args.working_set * objs
    _fits(args.processes * (DRIVE_BYTES_PER_PROCESS + need + objects * DRIVE_BYTES_PER_OBJECT),
          f"--processes {args.processes} x (a {human_bytes(need)} receive buffer of --batch-size "
          f"{args.batch_size} x --page-size {args.page_size} x {max(args.concurrencies)} threads "
          f"+ the {objects} keys of --working-set {args.working_set})",
          "lower --processes, --working-set, --batch-size or --page-size")


def validate_meta(args) -> None:
    """The flags of ``meta``, checked before it starts."""
    check_addr(args.discovery_addr)
    checks.seconds("--heartbeat-timeout", args.heartbeat_timeout, positive=True)


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


def page_keys(n: int, layout: str) -> list[bytes]:
    """Object keys of the bench working set: page i -> one (mla) or two (mha) keys."""
    return [f"pc/{i}{sfx}".encode() for i in range(n) for sfx in LAYOUTS[layout]]


def slot_bytes(page_size: int) -> int:
    """Pool bytes per object including the tag."""
    return tags.slot_stride(page_size)
