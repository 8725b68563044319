"""The registry of point kinds: one small declarative class per kind of measurement.

A scenario part in ``experiments/scenarios.yaml`` names its kind
(``{kind: perftest, tool: ib_read_bw, qps: [16], size: [131072]}``); the
kind declares every knob the part may set, once and typed (in the manner of
ReFrame's ``variable`` / ``parameter``):

- a :func:`variable` is one value per part (``tool: ib_read_bw``);
- a :func:`parameter` is a sweep dimension: the part gives a list and the
  grid is the product of every parameter's list, in declaration order.

A kind also says how its points are named (the names are the keys of the raw
folders, the tidy data and the charts, so they never change for a given
grid), which ``PointRun`` method runs it (:attr:`Kind.runs_with`), which tool
it wraps (the ``tool`` column of its rows) and which metrics it yields, in
which units. The JSON schema of the scenario file is generated from these
declarations (:func:`part_schema`), so a typo names the file and the field.
Nothing here starts a process.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, ClassVar

#: kind name -> kind class, filled as each Kind subclass below is defined.
KINDS: dict[str, type["Kind"]] = {}

#: A knob without a default must be given by the scenario part.
REQUIRED: Any = type("Required", (), {"__repr__": lambda self: "REQUIRED"})()

# JSON-schema fragments for knob values.
POSITIVE_INT = {"type": "integer", "minimum": 1}
BOOL = {"type": "boolean"}
SECONDS = {"type": "number", "exclusiveMinimum": 0}
NULLABLE_INT = {"type": ["integer", "null"], "minimum": 1}
NULLABLE_SECONDS = {"type": ["number", "null"], "minimum": 0}
NULLABLE_MICROSECONDS = {"type": ["integer", "null"], "minimum": 0, "maximum": 1_000_000}


def one_of(*values: Any) -> dict[str, Any]:
    """Schema of a knob that takes one of ``values``."""
    return {"enum": list(values)}


@dataclass(frozen=True)
class Knob:
    """One declared knob of a kind: its value schema, default, meaning and how it shows in a point name."""

    schema: dict[str, Any]         #: JSON schema of one value
    default: Any = REQUIRED        #: REQUIRED: the part must give it
    doc: str = ""                  #: what it means (and the tool flag it becomes)
    sweep: bool = False            #: a parameter: the part gives a list, one point per value
    tag: str | None = None         #: name suffix when a variable differs from its default ("ws{}"; "{}" = value)
    name: str = ""                 #: set from the class attribute name

    def value_schema(self) -> dict[str, Any]:
        """Schema of the knob's entry in a scenario part."""
        if self.sweep:
            return {"type": "array", "minItems": 1, "items": self.schema, "description": self.doc}
        return dict(self.schema, description=self.doc)


def variable(schema: dict[str, Any], default: Any = REQUIRED, doc: str = "", tag: str | None = None) -> Knob:
    """A knob with one value per scenario part."""
    return Knob(schema, default, doc, sweep=False, tag=tag)


def parameter(schema: dict[str, Any], default: Any = REQUIRED, doc: str = "") -> Knob:
    """A sweep dimension: the scenario part lists its values, one point per value (product with the others)."""
    return Knob(schema, default, doc, sweep=True)


def sizes(n: int) -> str:
    """Bytes as point names spell them: 131072 -> '128K', 1048576 -> '1M', 100 -> '100'."""
    for unit, div in (("M", 1 << 20), ("K", 1 << 10)):
        if n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


@dataclass
class Point:
    """One measurement to run: its kind, its parameters, and why it is skipped (None: it runs)."""

    scenario: str
    name: str
    kind: str                     #: a name in KINDS (see :func:`kind_of`)
    params: dict[str, Any] = field(default_factory=dict)
    skip_reason: str | None = None
    loopback: bool = False        #: run both sides on this host over 127.0.0.1, not on the testbed's hosts
    part: str = ""                #: the scenario part it came from (its name in the scenario file)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"point {self.scenario}/{self.name}: kind {self.kind!r} is not one of "
                             f"{sorted(KINDS)} (peercache.lab.pipeline.kinds)")

    @property
    def spec(self) -> type["Kind"]:
        """The point's kind class."""
        return KINDS[self.kind]

    @property
    def skipped(self) -> bool:
        return self.skip_reason is not None


class Kind:
    """Base of every point kind; a subclass declares knobs as class attributes (:func:`variable`, :func:`parameter`)."""

    name: ClassVar[str]                   #: the value of ``kind:`` in a scenario part
    runs_with: ClassVar[str]              #: the ``PointRun`` method that runs a point of this kind
    metrics: ClassVar[dict[str, str]]     #: metric -> unit of the rows it yields (perf counters aside)
    primary: ClassVar[str]                #: the headline metric (a failed or skipped point's row)
    is_get: ClassVar[bool] = False        #: measures PeerCache GETs (compared with a raw limit), not a raw tool
    knobs: ClassVar[dict[str, Knob]] = {}

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        knobs: dict[str, Knob] = {}
        for base in reversed(cls.__mro__[1:]):
            knobs.update(getattr(base, "knobs", {}))
        for attr, v in list(vars(cls).items()):
            if isinstance(v, Knob):
                knobs[attr] = Knob(v.schema, v.default, v.doc, v.sweep, v.tag, attr)
        cls.knobs = knobs
        if getattr(cls, "name", None):
            if cls.primary not in cls.metrics:
                raise TypeError(f"kind {cls.name}: primary metric {cls.primary!r} is not in its metrics")
            # Kind.expand names points with point_name; a kind with its own expand names them there.
            needs = ("row_tool",) if cls.expand.__func__ is not Kind.expand.__func__ else ("point_name", "row_tool")
            missing = [m for m in needs if getattr(cls, m).__func__ is getattr(Kind, m).__func__]
            if missing:
                raise TypeError(f"kind {cls.name}: define {', '.join(missing)} (every registered kind names its "
                                "points and the tool of its rows)")
            KINDS[cls.name] = cls

    # -- what a scenario part may say ---------------------------------------------------
    @classmethod
    def part_schema(cls) -> dict[str, Any]:
        """JSON schema of one scenario part of this kind."""
        return {"type": "object", "additionalProperties": False,
                "required": ["kind", *[k for k, v in cls.knobs.items() if v.default is REQUIRED]],
                "properties": {"kind": {"const": cls.name}, "place": one_of("testbed", "loopback"),
                               **{k: v.value_schema() for k, v in cls.knobs.items()}}}

    @classmethod
    def values(cls, part: dict[str, Any]) -> dict[str, Any]:
        """The part's knob values with defaults filled in (the part is already schema-valid)."""
        return {k: part.get(k, v.default) for k, v in cls.knobs.items()}

    # -- the grid ------------------------------------------------------------------
    @classmethod
    def expand(cls, scenario: str, part: dict[str, Any], devices: list[str]) -> list[Point]:
        """One point per combination of the part's parameters (declaration order), named and parametrised."""
        vals = cls.values(part)
        sweeps = [k for k, v in cls.knobs.items() if v.sweep]
        pts = []
        for combo in itertools.product(*(vals[k] for k in sweeps)):
            one = dict(vals, **dict(zip(sweeps, combo)))
            pts.append(Point(scenario, cls.point_name(one) + cls.tags(one), cls.name, cls.params(one, devices),
                             loopback=part.get("place") == "loopback"))
        return pts

    @classmethod
    def tags(cls, one: dict[str, Any]) -> str:
        """Name suffixes of the variables that differ from their defaults (none for the published grids)."""
        out = ""
        for k, v in cls.knobs.items():
            if v.tag is None or v.sweep or one[k] == v.default:
                continue
            out += "_" + (v.tag if isinstance(one[k], bool) else v.tag.format(one[k]))
        return out

    @classmethod
    def point_name(cls, one: dict[str, Any]) -> str:
        """The point's name from one combination of knob values (defined by every kind that uses Kind.expand)."""
        raise NotImplementedError(f"kind {cls.__name__} defines no point_name")

    @classmethod
    def params(cls, one: dict[str, Any], devices: list[str]) -> dict[str, Any]:
        """The point's parameters, as the runner reads them."""
        return dict(one)

    # -- what its rows say ---------------------------------------------------------
    @classmethod
    def row_tool(cls, params: dict[str, Any]) -> str:
        """The ``tool`` column of the point's rows (every registered kind defines it)."""
        raise NotImplementedError(f"kind {cls.__name__} defines no row_tool")

    @classmethod
    def unit(cls, metric: str | None = None) -> str:
        """Unit of ``metric`` (default: the primary metric)."""
        return cls.metrics[metric or cls.primary]

    @classmethod
    def port_devices(cls, params: dict[str, Any], testbed_devices: list[str]) -> list[str]:
        """RDMA devices whose port counters bound this point's figures (none for non-RDMA kinds)."""
        return []


# Knobs every timed kind shares: the testbed gives duration and warm-up unless a part overrides them.
class _Timed(Kind):
    duration = variable(NULLABLE_SECONDS, None, "measured seconds [the testbed's duration]", tag="d{}")
    warmup = variable(NULLABLE_SECONDS, None, "unmeasured seconds before [the testbed's warmup]", tag="w{}")


class PerftestRun(_Timed):
    """A perftest bandwidth run (``ib_read_bw`` / ``ib_write_bw``): server on the producer, client on the consumer."""

    name = "perftest"
    runs_with = "perftest"
    metrics = {"bw": "B/s", "bw_peak": "B/s", "msg_rate": "msg/s", "cpu_util": "%"}
    primary = "bw"

    #: the perftest binary (str)
    tool = variable(one_of("ib_read_bw", "ib_write_bw", "ib_send_bw"), doc="perftest binary")
    #: queue pairs, -q (int, swept)
    qps = parameter(POSITIVE_INT, doc="queue pairs (-q)")
    #: message size in bytes, -s (int, swept)
    size = parameter(POSITIVE_INT, doc="message size in bytes (-s)")
    #: send queue depth, -t (int or null = perftest's default)
    tx_depth = variable(NULLABLE_INT, None, "send queue depth (-t) [perftest's default]")
    #: wrap the client in perf stat (bool)
    perf_stat = variable(BOOL, False, "run the client under perf stat")
    #: iterations per QP, -n, instead of a -D duration (int or null = duration mode)
    iterations = variable(NULLABLE_INT, None,
                          "iterations per QP (-n) instead of the duration (-D): each side of a -D run stops "
                          "on its own clock, so where the two start seconds apart (emulated hosts) the server "
                          "tears its QPs down under the client; a count ends both together [duration mode]")

    @classmethod
    def point_name(cls, one):
        return f"{one['tool']}_q{one['qps']}_s{sizes(one['size'])}"

    @classmethod
    def params(cls, one, devices):
        return {"tool": one["tool"], "qps": one["qps"], "size": one["size"], "tx_depth": one["tx_depth"],
                "perf_stat": bool(one["perf_stat"]), "iterations": one["iterations"], **_timing(one)}

    @classmethod
    def row_tool(cls, params):
        return params["tool"]

    @classmethod
    def port_devices(cls, params, testbed_devices):
        return testbed_devices[:1]


class Iperf3Run(_Timed):
    """iperf3 over TCP (the raw TCP limit): N client processes, each against its own one-off server."""

    name = "iperf3"
    runs_with = "iperf3"
    metrics = {"bw": "B/s", "bw_sent": "B/s", "bytes_sent": "B", "bytes_received": "B", "cpu_local": "%",
               "cpu_remote": "%", "retransmits": "count"}
    primary = "bw"

    #: parallel client processes, each with its own server port (int, swept): one iperf3 3.x
    #: process runs all its -P streams in one thread, so one process is no limit for several readers
    processes = parameter(POSITIVE_INT, [1], "client processes, one server each")
    #: parallel streams per client, -P (int, swept)
    streams = parameter(POSITIVE_INT, doc="streams per client (-P)")
    #: write/read length in bytes, -l (int, swept)
    length = parameter(POSITIVE_INT, doc="buffer length in bytes (-l)")
    #: wrap the client in perf stat (bool)
    perf_stat = variable(BOOL, False, "run the client under perf stat")
    #: -R: the server sends, as a GET does (bool)
    reverse = variable(BOOL, False, "reverse (-R): the server sends, as a GET does", tag="R")
    #: -O: run the warm-up seconds first and leave them out of the figures (bool)
    omit_warmup = variable(BOOL, False, "omit (-O) the warm-up seconds from the figures", tag="O")

    @classmethod
    def point_name(cls, one):
        base = f"iperf3_P{one['streams']}_l{sizes(one['length'])}"
        return base if one["processes"] == 1 else base.replace("iperf3_", f"iperf3_x{one['processes']}_", 1)

    @classmethod
    def params(cls, one, devices):
        p = {"streams": one["streams"], "length": one["length"], "processes": one["processes"],
             "perf_stat": bool(one["perf_stat"])}
        p.update({k: True for k in ("reverse", "omit_warmup") if one[k]})
        return {**p, **_timing(one)}

    @classmethod
    def row_tool(cls, params):
        return "iperf3"


class SockperfRun(_Timed):
    """sockperf TCP ping-pong (the raw round trip of a path): server on the producer, client on the consumer."""

    name = "sockperf"
    runs_with = "sockperf"
    metrics = {"rtt_p50": "us", "rtt_p99": "us", "rtt_p999": "us", "rtt_avg": "us", "observations": "count"}
    primary = "rtt_p50"

    #: message size in bytes, -m, echoed back (int, swept): the page size of the GETs it is the limit for
    msg_size = parameter(POSITIVE_INT, doc="message size in bytes (-m), echoed back")
    #: the client polls its socket instead of sleeping (--nonblocked --timeout 0) (bool): the
    #: round trip without the client's wake-up, the baseline of a GET that polls for its reply
    busy_poll = variable(BOOL, False, "client polls, never sleeps (--nonblocked --timeout 0)", tag="busy")

    @classmethod
    def point_name(cls, one):
        return f"sockperf_pp_m{sizes(one['msg_size'])}"

    @classmethod
    def params(cls, one, devices):
        return {"msg_size": one["msg_size"], **({"busy_poll": True} if one["busy_poll"] else {}), **_timing(one)}

    @classmethod
    def row_tool(cls, params):
        return "sockperf"


class MemcpyRun(_Timed):
    """One-thread memcpy of pool-shaped pages into a batch buffer on the producer (the shm limit), per NUMA node."""

    name = "memcpy"
    runs_with = "memcpy"
    metrics = {"bw": "B/s"}
    primary = "bw"

    #: page size in bytes (int, swept)
    size = parameter(POSITIVE_INT, doc="page size in bytes")
    #: pages per copy batch (int): the batch of the PeerCache shm points it is the limit for
    batch = variable(POSITIVE_INT, 32, "pages per batch", tag="b{}")
    #: pages in the region (int or null = the testbed's working_set_bytes / size)
    working_set = variable(NULLABLE_INT, None, "pages in the region [testbed working_set_bytes / size]",
                           tag="ws{}")

    @classmethod
    def point_name(cls, one):
        return f"memcpy_s{sizes(one['size'])}"

    @classmethod
    def params(cls, one, devices):
        p = {"size": one["size"]}
        p.update({k: one[k] for k in ("batch", "working_set") if one[k] != cls.knobs[k].default})
        return {**p, **_timing(one)}

    @classmethod
    def row_tool(cls, params):
        return "memcpy"


class _PeerCacheKnobs(_Timed):
    #: data transport (str)
    protocol = variable(one_of("rdma", "tcp", "shm"), doc="transport (--protocol)")
    #: page geometry (str): mla one object per page, mha two (K and V)
    layout = variable(one_of("mla", "mha"), doc="page layout (--layout)")
    #: bytes per object (int, swept)
    page_size = parameter(POSITIVE_INT, doc="bytes per object (--page-size)")
    #: keys per GET batch (int, swept)
    batch_size = parameter(POSITIVE_INT, doc="keys per batch (--batch-size)")


class PeerCacheRun(_PeerCacheKnobs):
    """``peercache-bench serve`` on the producer, ``drive`` on the consumer: GET throughput of one pair."""

    name = "peercache"
    runs_with = "peercache"
    metrics = {"get_throughput": "GB/s", "pages_per_s": "pages/s", "latency_p50": "us", "latency_p99": "us",
               "latency_p999": "us", "hit_rate": "ratio", "errors": "count", "keys": "count",
               "verify_failures": "count"}
    primary = "get_throughput"
    is_get = True

    #: [drive processes, threads each] (pair of ints, swept)
    processes_x_threads = parameter({"type": "array", "items": POSITIVE_INT, "minItems": 2, "maxItems": 2},
                                    doc="[drive processes (--processes), threads each (--concurrencies)]")
    #: where GETs land (str, swept): host memory or a CUDA GPU (--gpu)
    destinations = parameter(one_of("host", "gpu"), ["host"], "GET destination: host memory or GPU (--gpu)")
    #: every testbed device as a rail (bool); false: the first one
    all_devices = variable(BOOL, False, "every device as a rail (--devices d1,..,dN); false: the first")
    #: pages serve publishes (int or null = the testbed's working_set_bytes / page_size)
    working_set = variable(NULLABLE_INT, None, "pages published [testbed working_set_bytes / page_size]",
                           tag="ws{}")
    #: channels per peer, --max-channels (int or null = drive's default)
    max_channels = variable(NULLABLE_INT, None, "channels per peer (--max-channels) [drive's default]",
                            tag="ch{}")
    #: directory cache TTL in seconds (number or null = the testbed's dir_cache_ttl)
    dir_cache_ttl = variable(NULLABLE_SECONDS, None, "--dir-cache-ttl [testbed dir_cache_ttl]", tag="ttl{}")
    #: check every page's bytes in the read pass (bool): on by default, so every figure is of bytes
    #: that were right; off (--no-verify) only where a figure must exclude the check's cost
    verify = variable(BOOL, True, "verify each page in the read pass (off: drive --no-verify)", tag="noverify")
    #: slot checksums: serve writes one per page, drive checks it before a hit (bool, --integrity)
    integrity = variable(BOOL, False, "payload checksums (serve and drive --integrity)", tag="integrity")
    #: tcp: µs drive's client polls for a reply before sleeping (int or null = drive's default; 0 sleeps)
    tcp_poll_us = variable(NULLABLE_MICROSECONDS, None, "tcp reply poll before sleeping (--tcp-poll-us) [drive's default]",
                           tag="poll{}")

    @classmethod
    def point_name(cls, one):
        procs, threads = one["processes_x_threads"]
        return (f"pc_{one['protocol']}_p{procs}x{threads}_s{sizes(one['page_size'])}_b{one['batch_size']}"
                + ("" if one["destinations"] == "host" else f"_{one['destinations']}"))

    @classmethod
    def params(cls, one, devices):
        procs, threads = one["processes_x_threads"]
        p = {"protocol": one["protocol"], "layout": one["layout"], "page_size": one["page_size"],
             "batch_size": one["batch_size"], "processes": procs, "threads": threads,
             "destination": one["destinations"], "devices": list(devices) if one["all_devices"] else devices[:1]}
        p.update({k: one[k] for k in ("working_set", "max_channels", "dir_cache_ttl", "verify", "integrity",
                                      "tcp_poll_us") if one[k] != cls.knobs[k].default})
        return {**p, **_timing(one)}

    @classmethod
    def row_tool(cls, params):
        return "peercache-bench"

    @classmethod
    def port_devices(cls, params, testbed_devices):
        return list(params.get("devices") or []) if params.get("protocol") == "rdma" else []


class HiCacheRun(PeerCacheRun):
    """``serve`` on the producer; on the consumer drive's loop with every batch read through SGLang HiCache's
    v1 path (``PeerCacheStore.batch_get_v1`` into a page_first host KV pool: peercache.bench.hicache_drive)."""

    name = "hicache"
    runs_with = "peercache"
    #: the consumer's tool: drive's flags and result document, the read through the HiCache store
    drive_module: ClassVar[str] = "peercache.bench.hicache_drive"

    @classmethod
    def point_name(cls, one):
        return PeerCacheRun.point_name(one).replace("pc_", "hc_", 1)

    @classmethod
    def row_tool(cls, params):
        return "peercache-hicache"


class PeerCacheGroupRun(_PeerCacheKnobs):
    """One serve/drive pair per NIC (or per group without NICs), all measuring one shared, barrier-aligned window."""

    name = "group"
    runs_with = "group"
    metrics = {"get_throughput": "GB/s"}
    primary = "get_throughput"
    is_get = True

    #: groups when the testbed has no devices (int); with devices: one group per device
    groups = variable(POSITIVE_INT, 2, "groups without devices (with devices: one per device)")
    #: drive processes per group (int)
    readers_per_nic = variable(POSITIVE_INT, doc="drive processes per group (--processes)")
    #: threads per drive process (int)
    threads = variable(POSITIVE_INT, doc="threads per drive process (--concurrencies)")

    @classmethod
    def expand(cls, scenario, part, devices):
        vals = cls.values(part)
        groups = list(devices) or [f"group{i}" for i in range(vals["groups"])]
        return [Point(scenario, f"group_{vals['protocol']}_n{len(groups)}_s{sizes(page)}_b{batch}", cls.name, {
            "protocol": vals["protocol"], "layout": vals["layout"], "page_size": page, "batch_size": batch,
            "groups": groups, "readers": vals["readers_per_nic"], "threads": vals["threads"],
            "per_device": bool(devices), **_timing(vals)}, loopback=part.get("place") == "loopback")
            for page, batch in itertools.product(vals["page_size"], vals["batch_size"])]

    @classmethod
    def row_tool(cls, params):
        return "peercache-bench"

    @classmethod
    def port_devices(cls, params, testbed_devices):
        return list(params["groups"]) if params.get("per_device") else []


class NodeApiRun(_Timed):
    """The engine's batch API in one consumer process (``peercache.lab.tools.nodeloop``) against a serve."""

    name = "node_api"
    runs_with = "node_api"
    metrics = {"pages_per_s": "pages/s", "verify_failures": "count", "verified_keys": "count"}
    primary = "pages_per_s"
    is_get = True

    #: transport of the reads (str)
    protocol = variable(one_of("shm"), "shm", "transport (the batch API's shm path)")
    #: bytes per page (int, swept)
    page_size = parameter(POSITIVE_INT, doc="bytes per page")
    #: keys per get_batch_into call (int, swept)
    batch_size = parameter(POSITIVE_INT, doc="keys per call")
    #: pages serve publishes (int)
    working_set = variable(POSITIVE_INT, doc="pages published")

    @classmethod
    def point_name(cls, one):
        return f"api_{one['protocol']}_s{sizes(one['page_size'])}_b{one['batch_size']}_ws{one['working_set']}"

    @classmethod
    def params(cls, one, devices):
        return {"protocol": one["protocol"], "layout": "mla", "page_size": one["page_size"],
                "batch_size": one["batch_size"], "working_set": one["working_set"], **_timing(one)}

    @classmethod
    def row_tool(cls, params):
        return "peercache-node-api"


# Directory throughput (dirbench): keys/s and batches/s are rates of ops (an op = one key, resp. one batch).
_DIR_METRICS = {"keys_per_s": "ops/s", "batches_per_s": "ops/s", "latency_p50": "us", "latency_p99": "us"}


class DirLookupRun(_Timed):
    """Directory lookups/s (``python -m peercache.bench.dirbench``) on this host: a producer node publishes
    ``keys`` keys, then ``clients`` client processes look up random batches, one batch in flight each.

    ``directory: embedded``: dirbench hosts the embedded directory itself (as serve's node does) on a free
    127.0.0.1 port. ``directory: redis``: the Redis backend on a redis-server started by launch code
    (peercache.lab.launch.redis) and emptied first; in ``make bench`` one server for the whole run (see
    runpoint.shared_redis), the one the ``redis_benchmark`` point measured just before. Equal concurrency for that
    pair: ``clients`` here is the client *processes* (each one connection, one batch in flight) and the
    redis_benchmark part's ``clients`` its connections (``-c``, no pipelining): give both the same value.
    """

    name = "dirlookup"
    runs_with = "dirlookup"
    metrics = {**_DIR_METRICS, "misses": "count", "verify_failures": "count"}
    primary = "keys_per_s"

    #: the directory backend (str): embedded (HOST:PORT) or redis (redis://127.0.0.1:PORT/0)
    directory = variable(one_of("embedded", "redis"), doc="directory backend (dirbench --directory)")
    #: keys per lookup (int, swept), --batch
    batch = parameter(POSITIVE_INT, doc="keys per lookup (--batch)")
    #: client processes, one batch in flight each (int, swept), --clients
    clients = parameter(POSITIVE_INT, [1], "client processes, one batch in flight each (--clients)")
    #: keys published before the lookups (int), --keys
    keys = variable(POSITIVE_INT, 16384, "keys published (--keys)", tag="k{}")
    #: how a client asks (str), --path: rpc = the directory's lookup op; node = as a consumer Node
    #: resolves keys (the embedded directory's one-sided table first, the lookup op for the rest)
    path = variable(one_of("rpc", "node"), "rpc", "dirbench --path: the lookup op, or a Node's resolution",
                    tag="{}")

    @classmethod
    def point_name(cls, one):
        return f"dir_{one['directory']}_b{one['batch']}_c{one['clients']}"

    @classmethod
    def params(cls, one, devices):
        return {"directory": one["directory"], "batch": one["batch"], "clients": one["clients"],
                "keys": one["keys"], **({"path": one["path"]} if one["path"] != "rpc" else {}), **_timing(one)}

    @classmethod
    def row_tool(cls, params):
        return "peercache-dirbench"


class RedisBenchmarkRun(_Timed):
    """``redis-benchmark`` MGET of ``batch`` keys (Redis's own client, the raw limit of a Redis directory) on a
    redis-server started by launch code on this host (in ``make bench``: the run's shared one), emptied first.

    The keys are those the Redis backend stores the bench's first ``batch`` entries under
    (``pc:e:pc/<i>``), each holding ``value_bytes`` bytes; with ``keyspace``, ``keyspace`` such keys
    (``pc:e:pc/<12 digits>``, redis-benchmark's ``-r`` names) and each MGET asks for a random
    ``batch`` of them, as dirlookup's clients do; ``clients`` connections (``-c``), no pipelining
    (``-P 1``): one MGET in flight per connection, as each dirlookup client process has one lookup in
    flight. A short calibration run sizes ``-n`` so the measured run lasts about the point's duration.
    """

    name = "redis_benchmark"
    runs_with = "redis_benchmark"
    metrics = dict(_DIR_METRICS)
    primary = "keys_per_s"

    #: keys per MGET (int, swept)
    batch = parameter(POSITIVE_INT, doc="keys per MGET")
    #: parallel connections, -c (int, swept): the dirlookup clients it is the limit for
    clients = parameter(POSITIVE_INT, [1], "connections (-c), one MGET in flight each")
    #: bytes of each key's value (int): one Redis backend entry is a 56-byte LOC_DTYPE record
    value_bytes = variable(POSITIVE_INT, 56, "bytes per value (a Redis backend entry's size)", tag="v{}")
    #: keys stored and drawn at random for each MGET (int or null: the same ``batch`` keys every time)
    keyspace = variable(NULLABLE_INT, None, "random batches out of this many keys (-r) [the same keys each MGET]",
                        tag="r{}")

    @classmethod
    def point_name(cls, one):
        return f"redis_mget_b{one['batch']}_c{one['clients']}"

    @classmethod
    def params(cls, one, devices):
        return {"batch": one["batch"], "clients": one["clients"], "value_bytes": one["value_bytes"],
                **({"keyspace": one["keyspace"]} if one["keyspace"] else {}), **_timing(one)}

    @classmethod
    def row_tool(cls, params):
        return "redis-benchmark"


def _timing(one: dict[str, Any]) -> dict[str, Any]:
    return {k: one[k] for k in ("duration", "warmup") if one.get(k) is not None}


def kind_of(name: str) -> type[Kind]:
    """The kind class called ``name``."""
    try:
        return KINDS[name]
    except KeyError:
        raise KeyError(f"no point kind {name!r}; known: {sorted(KINDS)}") from None


def part_schema() -> dict[str, Any]:
    """JSON schema of any scenario part: ``kind`` picks the kind, whose declared knobs are then checked."""
    return {"type": "object", "required": ["kind"],
            "properties": {"kind": {"enum": sorted(KINDS)}},
            "allOf": [{"if": {"properties": {"kind": {"const": n}}, "required": ["kind"]},
                       "then": {"$ref": f"#/$defs/kind_{n}"}} for n in sorted(KINDS)]}


def kind_defs() -> dict[str, Any]:
    """``$defs`` of every kind's part schema."""
    return {f"kind_{n}": k.part_schema() for n, k in sorted(KINDS.items())}
