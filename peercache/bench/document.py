"""The documents ``peercache-bench`` writes with ``--out``, as versioned dataclasses: the seam between the
engine and the lab.

drive (and hicache_drive's drive), serve and the HiCache suite each build their document here, and the lab
reads it back through :meth:`DriveDocument.from_dict` (or checks :meth:`SuiteDocument.check`), so both sides
name the same fields and the lab refuses a document of another schema version with what to do about it.

``to_dict()`` gives the JSON content exactly as the bench has always written it: every key, in the order
the fields are declared here. A field marked ``OMIT_IF_NONE`` is left out while it is None (keys only some
documents carry: hicache-drive's ``read_path``, a point's ``metrics_scrapes``). ``from_dict()`` checks the
schema version and the mode first, then that every field is there and nothing else is.

Change a field's name, meaning or unit and SCHEMA_VERSION goes up by one, with the lab's reader in the same
commit. A new ``OMIT_IF_NONE`` field, absent from every document that does not use it, keeps the version:
the documents of earlier runs, and of runs without it, read as before (drive's ``key_prefixes``,
``zipf_s``, ``timeline_ms`` and ``faults_expected``, a point's ``timeline`` and ``first_error``, serve's
``key_prefix``, ``joined`` and ``data_server``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Optional

#: The version of every document below (one shared number; a document carries it as ``schema_version``).
SCHEMA_VERSION = 1
#: The ``tool`` key of drive's and the suite's documents.
TOOL = "peercache-bench"
#: What drive prints once every driver process is ready (``drive: N <words> <directory>``), the line a
#: runner waits for before it writes ``--start-file``.
DRIVE_READY_WORDS = "process(es) ready against"

#: drive's mode, and hicache_drive's drive (the same document with its read path in meta).
DRIVE_MODE = "drive"
HICACHE_DRIVE_MODE = "hicache-drive"
SERVE_MODE = "serve"
SUITE_MODE = "hicache-suite"

#: The field metadata of a key a document carries only when it has a value.
OMIT_IF_NONE = {"omit_if_none": True}

_REMEDY = ("re-run the bench with a peercache-bench of the lab's revision (or read the document with the "
           "lab of the revision that wrote it)")


class DocumentError(ValueError):
    """A document this revision cannot read: another schema version or mode, or fields missing or unknown.
    Its message says which, and what to re-run."""


def _nested(cls) -> dict:
    return {"record": cls}


def _nested_list(cls) -> dict:
    return {"records": cls}


class _Record:
    """to_dict/from_dict over a dataclass's fields, in their declared order."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):      # type: ignore[arg-type]
            v = getattr(self, f.name)
            if v is None and f.metadata.get("omit_if_none"):
                continue
            if isinstance(v, _Record):
                v = v.to_dict()
            elif f.metadata.get("records") is not None:
                v = [x.to_dict() if isinstance(x, _Record) else x for x in v]
            out[f.name] = v
        return out

    @classmethod
    def _build(cls, d: Any, where: str):
        if not isinstance(d, dict):
            raise DocumentError(f"{where} is a {type(d).__name__}, not an object")
        fs = fields(cls)      # type: ignore[arg-type]
        names = {f.name for f in fs}
        missing = [f.name for f in fs if f.name not in d and not f.metadata.get("omit_if_none")]
        unknown = [k for k in d if k not in names]
        if missing or unknown:
            said = "; ".join(x for x in (f"no {', '.join(map(repr, missing))}" if missing else "",
                                         f"unknown {', '.join(map(repr, unknown))}" if unknown else "") if x)
            raise DocumentError(f"{where}: {said}: written by a peercache-bench of another revision "
                                f"under the same schema_version {SCHEMA_VERSION}? {_REMEDY}")
        kw = {}
        for f in fs:
            if f.name not in d:
                continue
            v = d[f.name]
            if f.metadata.get("record") is not None:
                v = f.metadata["record"]._build(v, f"{where}.{f.name}")
            elif f.metadata.get("records") is not None:
                if not isinstance(v, list):
                    raise DocumentError(f"{where}.{f.name} is a {type(v).__name__}, not a list")
                v = [f.metadata["records"]._build(x, f"{where}.{f.name}[{i}]") for i, x in enumerate(v)]
            kw[f.name] = v
        return cls(**kw)


class _Document(_Record):
    """A whole document: its kind in words and the modes it may carry."""

    KIND = "peercache-bench"
    MODES: tuple[str, ...] = ()

    @classmethod
    def check(cls, doc: Any) -> None:
        """Refuse what is not this kind of document at this SCHEMA_VERSION, saying what to re-run."""
        if not isinstance(doc, dict):
            raise DocumentError(f"a {cls.KIND} document is a JSON object, not a {type(doc).__name__}")
        version = doc.get("schema_version")
        if version != SCHEMA_VERSION:
            raise DocumentError(f"{cls.KIND} document of schema_version {version!r}, but this peercache "
                                f"reads schema_version {SCHEMA_VERSION}: {_REMEDY}")
        if doc.get("mode") not in cls.MODES:
            raise DocumentError(f"mode {doc.get('mode')!r}: not a {cls.KIND} document (mode "
                                f"{' or '.join(map(repr, cls.MODES))} of schema {SCHEMA_VERSION})")

    @classmethod
    def from_dict(cls, doc: Any):
        """The document read back; DocumentError on another version or mode, or fields missing or unknown."""
        cls.check(doc)
        return cls._build(doc, cls.KIND)


@dataclass
class _RunBlock(_Record):
    """Where and when a bench command ran: the first fields of every document's ``meta``
    (meta.host_block(), the command line, start and end)."""

    #: host name
    host: str
    #: kernel release (uname -r)
    kernel: str
    #: machine architecture (uname -m)
    machine: str
    #: CPU model name (None when unreadable)
    cpu: Optional[str]
    #: logical CPUs (count)
    cpus: Optional[int]
    #: the command line, its secrets masked
    command: str
    #: start time (UTC, ISO 8601)
    start: str
    #: end time (UTC, ISO 8601; None until the run ends)
    end: Optional[str]


@dataclass
class DriveMeta(_RunBlock):
    """Where and how a drive ran (the document's ``meta``)."""

    #: serve's discovery address (HOST:PORT)
    discovery_addr: str
    #: transport: tcp, shm or rdma
    protocol: str
    #: the directory spec (a Redis URL's password masked)
    directory: str
    #: rdma devices used as rails (names; [] otherwise)
    devices: list
    #: KV layout: mha or mla
    layout: str
    #: objects per page (count; 2 for mha, 1 for mla)
    objects_per_page: int
    #: bytes of one object (B)
    page_size: int
    #: pages per batch (count)
    batch_size: int
    #: threads per process of each point (counts, in order)
    concurrencies: list
    #: driver processes (count)
    processes: int
    #: pages serve published (count)
    working_set: int
    #: channels per peer (--max-channels; count)
    max_channels: int
    #: tcp: µs the client polls for a reply before sleeping (None: not tcp)
    tcp_poll_us: Optional[int]
    #: tcp: how the client moves each batch (request size, depth, socket buffer); None otherwise
    tcp_wire: Optional[dict]
    #: directory cache TTL (s)
    dir_cache_ttl: float
    #: measurement window (s)
    duration: float
    #: warm-up before the window (s)
    warmup: float
    #: get or exists
    op: str
    #: every hit's bytes checked (bool)
    verify: bool
    #: slot checksums checked before a hit (bool)
    integrity: bool
    #: key order: random, sequential or zipf (zipf_s gives the exponent)
    access: str
    #: GETs land in GPU memory (bool)
    gpu: bool
    #: how the destination buffer was registered (as the driver processes report it; None before they do)
    gpu_registration: Any
    #: rdma: the IB port (None otherwise)
    ib_port: Optional[int]
    #: rdma: the GID index (None otherwise)
    gid_index: Optional[int]
    #: metrics endpoints of the driver processes (URLs)
    metrics: list
    #: serve's and each process's metrics text read at each window edge (bool, --metrics-scrapes)
    metrics_scrapes: bool
    #: versions of python and the packages on the data and control path (name -> version)
    versions: dict
    #: git revision of the checkout the bench ran from (None outside one)
    git_revision: Optional[str]
    #: --key-prefix: the prefixes whose working sets (working_set pages each: one per producer) drive read as
    #: one union, in order (names; absent without --key-prefix: the keys pc/<i>)
    key_prefixes: Optional[list] = field(default=None, metadata=OMIT_IF_NONE)
    #: --access zipf: the exponent S (P(rank r) proportional to 1/r^S; absent with another access)
    zipf_s: Optional[float] = field(default=None, metadata=OMIT_IF_NONE)
    #: hicache-drive only: the read path its workers take (words)
    read_path: Optional[str] = field(default=None, metadata=OMIT_IF_NONE)
    #: --timeline-ms: width of a point's timeline bucket (ms; absent without a timeline)
    timeline_ms: Optional[int] = field(default=None, metadata=OMIT_IF_NONE)
    #: --faults-expected: read errors do not fail a point (true; absent without the flag)
    faults_expected: Optional[bool] = field(default=None, metadata=OMIT_IF_NONE)


@dataclass
class DrivePoint(_Record):
    """One concurrency point of a drive: every process's threads over one shared window."""

    #: threads per driver process (count)
    concurrency: int
    #: driver processes (count)
    processes: int
    #: threads in all (count)
    threads: int
    #: pages per batch (count)
    batch_size: int
    #: bytes of one object (B)
    page_size: int
    #: measurement window (s)
    duration_s: float
    #: bytes read in the window (B)
    bytes: int
    #: batches completed in the window (count)
    batches: int
    #: bytes / window (10^9 B/s; None for exists)
    gb_per_s: Optional[float]
    #: pages hit / window (pages/s)
    pages_per_s: float
    #: objects hit / window (objects/s)
    objects_per_s: float
    #: batch latency percentiles (µs: p50, p99, p999; None when nothing was measured)
    latency_us: dict
    #: latencies kept for the percentiles (count)
    latency_samples: int
    #: batches whose latency was offered to the sample (count)
    latency_batches: int
    #: hits / keys (ratio; None with no key)
    hit_rate: Optional[float]
    #: keys asked for (count)
    keys: int
    #: errors (count)
    errors: int
    #: hits whose bytes were wrong (count)
    verify_failures: int
    #: misses whose directory entry pointed at another key's slot (count)
    redirected: int
    #: every hit's bytes checked (bool)
    verified: bool
    #: per rail over the window (rdma; [] otherwise): bytes and share, READs, errors, downs and ups
    rails: list
    #: ok or failed
    status: str
    #: why the point failed (None when ok)
    reason: Optional[str]
    #: --metrics-scrapes: every process's metrics text (and serve's) at the window's edges
    metrics_scrapes: Optional[list] = field(default=None, metadata=OMIT_IF_NONE)
    #: several --key-prefix's: the bytes hit under each (B; which producer served them)
    bytes_by_prefix: Optional[dict] = field(default=None, metadata=OMIT_IF_NONE)
    #: the window's start (epoch s; set once the point is placed in time)
    window_start: Optional[float] = field(default=None, metadata=OMIT_IF_NONE)
    #: the window's end (epoch s)
    window_end: Optional[float] = field(default=None, metadata=OMIT_IF_NONE)
    #: --faults-expected: the text of the first read error, when the point counted errors (it stays ok)
    first_error: Optional[str] = field(default=None, metadata=OMIT_IF_NONE)
    #: --timeline-ms: ``bucket_ms``, ``start`` (epoch s, the window's start), ``buckets`` (one per bucket_ms
    #: of the window: ``t``, s from the start; the batches, keys, hits, misses, errors, verify_failures and
    #: bytes completed in it; with several --key-prefix's ``hits_by_prefix``, in meta.key_prefixes' order)
    #: and ``max_stall_s`` (the longest gap between two completed batches of any one driver thread, s)
    timeline: Optional[dict] = field(default=None, metadata=OMIT_IF_NONE)


@dataclass
class DriveDocument(_Document):
    """drive's result document (and hicache_drive's drive, mode ``hicache-drive``)."""

    KIND = "drive"
    MODES = (DRIVE_MODE, HICACHE_DRIVE_MODE)

    #: where and how it ran
    meta: DriveMeta = field(metadata=_nested(DriveMeta))
    #: one record per concurrency point, in order
    points: list = field(default_factory=list, metadata=_nested_list(DrivePoint))
    #: ok or failed
    status: str = "ok"
    #: why the run failed (None when ok)
    error: Optional[str] = None
    #: this document's schema version
    schema_version: int = SCHEMA_VERSION
    #: always peercache-bench
    tool: str = TOOL
    #: drive or hicache-drive
    mode: str = DRIVE_MODE

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        return {k: d[k] for k in ("schema_version", "tool", "mode", "meta", "points", "status", "error")}


@dataclass
class ServeMeta(_RunBlock):
    """Where and how serve ran (its document's ``meta``)."""

    #: transport: tcp, shm or rdma
    protocol: str
    #: KV layout: mha or mla
    layout: str
    #: bytes of one object (B)
    page_size: int
    #: objects published (count)
    objects: int
    #: slot checksums written (bool)
    integrity: bool
    #: rdma devices (names)
    devices: list
    #: versions of python and the packages on the data and control path
    versions: dict
    #: rdma: the rails and their state (None for other transports)
    rails: Optional[list]
    #: serve's metrics endpoint (URL; None without --metrics-addr)
    metrics: Optional[str]
    #: git revision of the checkout (None outside one)
    git_revision: Optional[str]
    #: --key-prefix: the prefix of the published keys (pc/<prefix>/<i>; absent without one: pc/<i>)
    key_prefix: Optional[str] = field(default=None, metadata=OMIT_IF_NONE)
    #: --join: the embedded directory serve registered with and published into, hosted by another process
    #: (HOST:PORT; absent when serve hosted it itself, or with a Redis directory)
    joined: Optional[str] = field(default=None, metadata=OMIT_IF_NONE)


@dataclass
class ServeDocument(_Document):
    """serve's summary, written when it exits (it has no ``tool`` key)."""

    KIND = "serve"
    MODES = (SERVE_MODE,)

    #: where and how it ran
    meta: ServeMeta = field(metadata=_nested(ServeMeta))
    #: each reader's summary as it said it was done ({status, points})
    readers_done: list = field(default_factory=list)
    #: ops the transport refused (its counts by reason; None when it keeps none)
    refused_ops: Any = None
    #: the data server's counters when serve exits (tcp: connections accepted, requests ``served``, refusals
    #: by kind; absent where the server sees no reads: rdma's are one-sided, shm's are memory)
    data_server: Optional[dict] = field(default=None, metadata=OMIT_IF_NONE)
    #: this document's schema version
    schema_version: int = SCHEMA_VERSION
    #: always serve
    mode: str = SERVE_MODE

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        return {k: d[k] for k in ("schema_version", "mode", "meta", "readers_done", "refused_ops", "data_server")
                if k in d}


@dataclass
class SuiteMeta(_RunBlock):
    """Where and how the HiCache suite ran (its document's ``meta``)."""

    #: serve's discovery address (HOST:PORT)
    discovery_addr: str
    #: the directory spec (a Redis URL's password masked)
    directory: str
    #: transport: tcp, shm or rdma
    protocol: str
    #: rdma devices (names)
    devices: list
    #: KV layout: mha or mla
    layout: str
    #: objects per page (count)
    objects_per_page: int
    #: bytes of one object (B)
    object_bytes: int
    #: bytes of one page (B)
    page_bytes: int
    #: tokens per page (count)
    page_tokens: int
    #: bytes per token (B)
    bytes_per_token: float
    #: pages per call (count)
    batch_size: int
    #: threads of each point (counts, in order)
    concurrencies: list
    #: the ops swept, in order (get, set, exists)
    ops: list
    #: this rank (index)
    tp_rank: int
    #: ranks in all (count)
    tp_size: int
    #: whether this rank writes to storage (bool; MLA: rank 0 only)
    is_storage_writer: bool
    #: pages serve published (count)
    working_set: int
    #: measurement window (s)
    duration: float
    #: warm-up before the window (s)
    warmup: float
    #: calls per thread at most (count; None: no bound)
    max_calls: Optional[int]
    #: every page's bytes checked (bool)
    verify: bool
    #: directory cache TTL (s)
    dir_cache_ttl: float
    #: slot checksums (bool)
    integrity: bool
    #: the host KV pool's layout (page_first)
    host_pool: str
    #: op -> the HiCacheStorage call it makes
    calls: dict
    #: the store's base class as SGLang names it
    store_base: Any
    #: versions of python and the packages on the data and control path
    versions: dict
    #: git revision of the checkout (None outside one)
    git_revision: Optional[str]


@dataclass
class SuiteDocument(_Document):
    """The HiCache suite's result document. Its points stay plain records (the lab's parser checks each)."""

    KIND = "hicache suite"
    MODES = (SUITE_MODE,)

    #: where and how it ran
    meta: SuiteMeta = field(metadata=_nested(SuiteMeta))
    #: op -> {points: that op's rows, peak: its PEAK row or None}
    ops: dict = field(default_factory=dict)
    #: every row, in the order measured (op by op, concurrency by concurrency)
    points: list = field(default_factory=list)
    #: ok or failed
    status: str = "ok"
    #: why the run failed (None when ok)
    error: Optional[str] = None
    #: this document's schema version
    schema_version: int = SCHEMA_VERSION
    #: always peercache-bench
    tool: str = TOOL
    #: always hicache-suite
    mode: str = SUITE_MODE

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        return {k: d[k] for k in ("schema_version", "tool", "mode", "meta", "ops", "points", "status", "error")}
