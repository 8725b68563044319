"""What every driver process is given: one typed, picklable record of the run's flags (spawned processes get a copy)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from ...config import NodeConfig
from ...directory.redis.url import is_redis, parse_url
from .. import options


@dataclass(frozen=True)
class DriveConfig:
    """A drive's settings as its driver processes read them (the flags of ``peercache-bench drive``)."""

    #: HOST:PORT of discovery (--discovery-addr)
    discovery_addr: str
    #: the directory spec: --directory, else --discovery-addr (a Redis URL keeps its password here only)
    directory: str
    #: tcp, shm or rdma
    protocol: str
    #: mla (one object per page) or mha (K and V)
    layout: str
    #: bytes per object
    page_size: int
    #: pages serve published (under each of key_prefixes)
    working_set: int
    #: pages per batch
    batch_size: int
    #: threads per process, one point each
    concurrencies: tuple
    processes: int
    #: seconds of the measurement window, and of the warmup before it
    duration: float
    warmup: float
    #: get or exists
    op: str
    verify: bool
    #: random, sequential or zipf
    access: str
    seed: int
    #: --access zipf: the exponent S (None with another access)
    zipf_s: Optional[float]
    #: the --key-prefix's whose working sets drive reads, as their union (() : the keys pc/<i>)
    key_prefixes: tuple
    #: seconds a driver waits for serve's working set
    ready_timeout: float
    gpu: bool
    gpu_device: int
    #: stretches the fault bounds (see bounds.py)
    time_scale: float
    #: whether process 0 scrapes the metrics at each window edge (--metrics-scrapes)
    metrics_scrapes: bool
    #: the driver processes' node options, the cluster secret included (never written to a document)
    node: NodeConfig
    #: the class each driver process runs: drive's Worker or a subclass (pickled by its import path)
    worker: type
    #: --timeline-ms: width of a timeline bucket (ms; 0 = no timeline)
    timeline_ms: int = 0
    #: --faults-expected: read errors are counted, and neither stop a thread nor fail the point
    faults_expected: bool = False

    @classmethod
    def from_args(cls, args, worker: type) -> "DriveConfig":
        """The settings of drive's parsed flags (checked already by options.validate)."""
        options.fill_geometry(args)
        spec = options.directory(args)
        return cls(
            discovery_addr=args.discovery_addr, directory=spec, protocol=args.protocol, layout=args.layout,
            page_size=args.page_size, working_set=args.working_set, batch_size=args.batch_size,
            concurrencies=tuple(args.concurrencies), processes=args.processes, duration=args.duration,
            warmup=args.warmup, op=args.op, verify=args.verify, access=args.access, seed=args.seed,
            zipf_s=zipf_s(args), key_prefixes=options.key_prefixes(args),
            ready_timeout=args.ready_timeout, gpu=args.gpu, gpu_device=args.gpu_device,
            time_scale=args.time_scale, metrics_scrapes=bool(getattr(args, "metrics_scrapes", False)),
            node=replace(options.node_config(args), directory=spec, auth_key=options.auth_secret(args)),
            worker=worker, timeline_ms=int(getattr(args, "timeline_ms", 0) or 0),
            faults_expected=bool(getattr(args, "faults_expected", False)))

    @property
    def pages(self) -> int:
        """Pages drive reads from: the working set, of each prefix when it reads several (their union)."""
        return self.working_set * max(1, len(self.key_prefixes))


def zipf_s(args) -> Optional[float]:
    """The Zipf exponent of a drive's flags: --zipf-s (default 1.0) with --access zipf, else None."""
    if args.access != "zipf":
        return None
    s = getattr(args, "zipf_s", None)
    return float(s if s is not None else options.FLAGS["zipf_s"].default)


def safe_directory(spec: str) -> str:
    """The directory spec for documents and messages (a Redis URL's password masked)."""
    return parse_url(spec).safe if is_redis(spec) else spec
