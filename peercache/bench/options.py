"""Flags of ``peercache-bench`` and their validation (pure: nothing starts here)."""
from __future__ import annotations

import argparse

from .. import tags
from ..errors import ConfigError
from ..transport import PROTOCOLS

LAYOUTS = {"mla": ("",), "mha": ("/k", "/v")}  # object suffixes per page
DEFAULT_DISCOVERY = "127.0.0.1:31998"
DEFAULT_RECV_BUFFER = 1 << 30


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
    p.add_argument("--quiet", action="store_true", help="no progress lines")


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
    if args.protocol != "rdma":
        return {}
    return {"devices": devices(args), "ib_port": args.ib_port, "gid_index": args.gid_index}


def objects_per_page(layout: str) -> int:
    return len(LAYOUTS[layout])


def validate(args, mode: str) -> None:
    """Refuse impossible combinations before anything starts."""
    if args.page_size <= 0:
        raise ConfigError(f"--page-size must be positive, got {args.page_size}")
    if args.working_set <= 0:
        raise ConfigError(f"--working-set must be positive, got {args.working_set}")
    if args.max_channels <= 0:
        raise ConfigError(f"--max-channels must be positive, got {args.max_channels}")
    if args.device_name and args.devices:
        raise ConfigError("give either --device-name or --devices, not both")
    if args.ib_port < 1:
        raise ConfigError(f"--ib-port must be >= 1, got {args.ib_port}")
    if args.gid_index is not None and args.gid_index < 0:
        raise ConfigError(f"--gid-index must be >= 0, got {args.gid_index}")
    if mode == "serve":
        if args.readers < 0:
            raise ConfigError(f"--readers must be >= 0, got {args.readers}")
        return
    if args.batch_size <= 0:
        raise ConfigError(f"--batch-size must be positive, got {args.batch_size}")
    if args.batch_size > args.working_set:
        raise ConfigError(f"--batch-size {args.batch_size} is larger than --working-set "
                          f"{args.working_set}; a batch would repeat keys")
    if min(args.concurrencies) <= 0:
        raise ConfigError(f"--concurrencies must all be positive, got {args.concurrencies}")
    if args.processes <= 0:
        raise ConfigError(f"--processes must be positive, got {args.processes}")
    if args.duration <= 0 or args.warmup < 0:
        raise ConfigError(f"--duration must be > 0 and --warmup >= 0 (got {args.duration}, {args.warmup})")
    if args.dir_cache_ttl < 0:
        raise ConfigError(f"--dir-cache-ttl must be >= 0, got {args.dir_cache_ttl}")
    need = args.batch_size * objects_per_page(args.layout) * args.page_size * max(args.concurrencies)
    if need > args.recv_buffer:
        raise ConfigError(
            f"a batch of {args.batch_size} x {objects_per_page(args.layout)} x {args.page_size} B for "
            f"each of {max(args.concurrencies)} threads needs {need} B, more than the "
            f"{args.recv_buffer} B receive buffer; lower --batch-size or raise --recv-buffer")


def page_keys(n: int, layout: str) -> list[bytes]:
    """Object keys of the bench working set: page i -> one (mla) or two (mha) keys."""
    return [f"pc/{i}{sfx}".encode() for i in range(n) for sfx in LAYOUTS[layout]]


def slot_bytes(page_size: int) -> int:
    """Pool bytes per object including the tag."""
    return tags.slot_stride(page_size)
