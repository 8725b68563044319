"""The ``peercache`` kind: ``peercache-bench serve`` on the producer, ``drive`` on the consumer (GET throughput).

Declaration (:class:`PeerCacheRun`, on the knobs every serve/drive kind shares: :class:`PeerCacheKnobs`),
launch, read (drive's result document, checked at the engine's seam), sanity (:func:`sanity`: drive's
status, and a window without a completed batch measured nothing) and metric extraction (:func:`extract`:
the rows of drive's result document); the rest is the harness's pair path. The serve and drive command
lines (:func:`serve_drive`) are shared with the ``hicache`` and ``group`` kinds.
"""
from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any, ClassVar, Iterator

from peercache import atomic
from peercache.bench.document import DocumentError, DriveDocument
from peercache.lab.errors import ToolError
from peercache.lab.launch.runners import Readiness
from peercache.lab.pipeline.points.bounds import DRIVE_READY_S, READY_S
from peercache.lab.pipeline.points.declare import (BOOL, NULLABLE_INT, NULLABLE_MICROSECONDS, NULLABLE_SECONDS,
                                                   POSITIVE_INT, Timed, one_of, parameter, sizes, timing, variable)
from peercache.lab.pipeline.points.pairkind import Launch, PairKind
from peercache.lab.tidy import Row
from peercache.lab.tools import promscrape

if TYPE_CHECKING:
    from peercache.lab.pipeline.runpoint import PointRun, TestbedHosts

#: What serve prints once it has published its pages and listens.
READY_LINE = "peercache-bench serve: ready"
#: --dir-cache-ttl of every drive, as in the published reproduction commands.
DIR_CACHE_TTL_S = 5.0


class PeerCacheKnobs(Timed):
    """Knobs of every kind that runs serve and drive."""

    #: the consumer's tool (drive's flags and result document); a kind may read with its own (hicache)
    drive_module: ClassVar[str] = "peercache.bench.cli"

    #: data transport (str)
    protocol = variable(one_of("rdma", "tcp", "shm"), doc="transport (--protocol)")
    #: page geometry (str): mla one object per page, mha two (K and V)
    layout = variable(one_of("mla", "mha"), doc="page layout (--layout)")
    #: bytes per object (int, swept)
    page_size = parameter(POSITIVE_INT, doc="bytes per object (--page-size)")
    #: keys per GET batch (int, swept)
    batch_size = parameter(POSITIVE_INT, doc="keys per batch (--batch-size)")
    #: read serve's and drive's metrics at the start and end of the measured window (bool): their endpoints
    #: on (--metrics-addr 127.0.0.1:0) and drive --metrics-scrapes; the texts are kept under the raw folder's
    #: metrics/ and collect makes per-rail rows of them. Evidence, like perf stat: no name tag
    metrics_scrape = variable(BOOL, False, "keep serve's and drive's metrics at the window's start and end "
                                           "(--metrics-addr 127.0.0.1:0 and drive --metrics-scrapes)")


class PeerCacheRun(PairKind, PeerCacheKnobs):
    """``peercache-bench serve`` on the producer, ``drive`` on the consumer: GET throughput of one pair."""

    name = "peercache"
    metrics = {"get_throughput": "GB/s", "pages_per_s": "pages/s", "latency_p50": "us", "latency_p99": "us",
               "latency_p999": "us", "hit_rate": "ratio", "errors": "count", "keys": "count",
               "verify_failures": "count"}
    primary = "get_throughput"
    is_get = True
    tool_column = "peercache-bench"
    output = "drive"

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
    #: serve and drive each serve their Prometheus metrics on a free loopback port (bool, --metrics-addr
    #: 127.0.0.1:0): what the endpoint costs when it is on; nothing scrapes it during the point
    metrics_endpoint = variable(BOOL, False, "serve and drive with --metrics-addr 127.0.0.1:0", tag="metrics")
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
        p.update(cls.changed(one, "working_set", "max_channels", "dir_cache_ttl", "verify", "integrity",
                             "tcp_poll_us", "metrics_endpoint", "metrics_scrape"))
        return {**p, **timing(one)}

    @classmethod
    def port_devices(cls, params, testbed_devices):
        return list(params.get("devices") or []) if params.get("protocol") == "rdma" else []

    @classmethod
    def launch(cls, pr: PointRun, th: TestbedHosts) -> Launch:
        p = pr.point.params
        port = pr.ports.allocate()
        out = f"/tmp/pclab-drive-{uuid.uuid4().hex[:10]}.json"
        serve, drive = serve_drive(pr, th, port, p, p["processes"], p["threads"], out)
        ctx = pr.ctx(tool=cls.row_tool(p), side="client", host=str(th.consumer), peer=str(th.producer),
                     protocol=p["protocol"], layout=p["layout"], devices=",".join(p.get("devices") or []),
                     numa_node=pr.numa_of(p.get("devices") or []),
                     extra={"destination": p.get("destination", "host")})
        return Launch(serve, drive, Readiness(pattern=READY_LINE, timeout=pr.scaled(READY_S)), ctx,
                      failed=dict({k: ctx[k] for k in ("tool", "protocol", "layout")}, size_bytes=p["page_size"],
                                  batch=p["batch_size"], threads=p["threads"], processes=p["processes"]),
                      devices=p.get("devices") or [], out=out)

    #: no document, not JSON, or another revision's drive wrote it: what it measured is not read
    read_errors = (DocumentError, ToolError, json.JSONDecodeError)

    @classmethod
    def read(cls, pr: PointRun, th: TestbedHosts, launch: Launch, res) -> dict[str, Any]:
        """drive's result document, checked at the engine's seam, its scrapes kept, written as drive.json."""
        doc = keep_scrapes(pr, read_drive_document(pr.fetch(th.consumer, launch.out)), pr.raw_dir)
        atomic.write_text(pr.raw_dir / "drive.json", json.dumps(doc, indent=1))
        return doc

    @classmethod
    def failed_reason(cls, err, e):
        if isinstance(e, DocumentError):
            return f"drive's result document: {e}"
        return err or f"drive wrote no result document: {e}"

    @classmethod
    def rows(cls, pr: PointRun, launch: Launch, result):
        return extract(result, launch.ctx, pr.duration)

    @classmethod
    def complete(cls, result):
        return result.get("status") == "ok"

    @classmethod
    def cpu_evidence(cls, pr, res, result, rows):
        """Both sides' CPU use over drive's first measured window."""
        first = (result.get("points") or [{}])[0]
        pr.attach_pair_cpu(first.get("window_start"), first.get("window_end"))


def serve_side(pr: PointRun, th: TestbedHosts, port: int, p: dict) -> tuple[list[str], list[str], list[str]]:
    """(serve's argv on the producer, the flags both sides share, the consumer's --devices flags) of a point
    of any kind that runs serve (the serve/drive kinds and hicache_suite)."""
    bench_p = pr.python_tool(th, "producer", "peercache.bench.cli")
    ws = pr.working_set(p.get("working_set"), p["page_size"], p["batch_size"])
    common = ["--discovery-addr", f"{th.producer_addr}:{port}", "--protocol", p["protocol"],
              "--layout", p["layout"], "--page-size", str(p["page_size"]), "--working-set", str(ws)]
    if p.get("metrics_endpoint") or p.get("metrics_scrape"):
        common += ["--metrics-addr", "127.0.0.1:0"]
    serve_devs, drive_devs = [], []
    if p.get("devices"):
        serve_devs = ["--devices", ",".join(pr.tb.role_devices("producer", p["devices"]))]
        drive_devs = ["--devices", ",".join(pr.tb.role_devices("consumer", p["devices"]))]
    serve = [*bench_p, "serve", *common, *serve_devs, "--readers", "1", "--max-wait", str(int(pr.timeout)),
             "--quiet", *(["--integrity"] if p.get("integrity") else [])]
    return serve, common, drive_devs


def serve_drive(pr: PointRun, th: TestbedHosts, port: int, p: dict, processes: int, threads: int,
                out_path: str) -> tuple[list[str], list[str]]:
    """The serve (producer) and drive (consumer) argv of one pair of a serve/drive kind's point."""
    serve, common, drive_devs = serve_side(pr, th, port, p)
    # A kind may read with its own drive tool (same flags and document): hicache's batch_get_v1 loop.
    bench_c = pr.python_tool(th, "consumer", pr.point.spec.drive_module)
    drive = [*bench_c, "drive", *common, *drive_devs, "--batch-size", str(p["batch_size"]),
             "--concurrencies", str(threads), "--processes", str(processes),
             "--duration", str(pr.duration), "--warmup", str(pr.warmup),
             *([] if p.get("verify", True) else ["--no-verify"]),
             *(["--integrity"] if p.get("integrity") else []),
             *(["--max-channels", str(p["max_channels"])] if p.get("max_channels") else []),
             *(["--tcp-poll-us", str(p["tcp_poll_us"])] if p.get("tcp_poll_us") is not None else []),
             "--dir-cache-ttl", str(p.get("dir_cache_ttl", pr.tb.get("dir_cache_ttl", DIR_CACHE_TTL_S))),
             "--out", out_path]
    if pr.slow > 1:
        # an emulated host: its waits and its fault bounds stretch with its measured slowness
        drive += ["--ready-timeout", f"{pr.scaled(DRIVE_READY_S):.0f}", "--time-scale", f"{pr.slow:.1f}"]
    if p.get("metrics_scrape"):
        drive.append("--metrics-scrapes")
    if p.get("destination") == "gpu":
        drive.append("--gpu")
    return serve, drive


def read_drive_document(text: str) -> dict[str, Any]:
    """drive's (or hicache_drive's) ``--out`` document, read through the engine's seam: its schema version,
    mode and fields are checked (:class:`peercache.bench.document.DriveDocument`), and the document is
    returned as written. json.JSONDecodeError when it is not JSON; DocumentError, saying what to re-run, when
    another revision's drive wrote it."""
    doc = json.loads(text)
    DriveDocument.from_dict(doc)
    return doc


def keep_scrapes(pr: PointRun, doc: dict[str, Any], folder) -> dict[str, Any]:
    """drive's document with its metrics scrapes moved to ``folder``/metrics (files and their index); a point
    that asked for them and has none gets a note saying so."""
    out, index = promscrape.keep(doc, folder / "metrics")
    if pr.point.params.get("metrics_scrape"):
        failed = [f"{e['role']} {e['edge']}: {e['error']}" for e in (index or {}).get("scrapes", []) if e.get("error")]
        if index is None and doc.get("points"):
            pr.notes.append(f"metrics scrapes: drive's document ({folder.name}) holds none although asked for "
                            "(drive --metrics-scrapes); is the consumer's peercache-bench older than the lab?")
        elif failed:
            pr.notes.append("metrics scrapes missing: " + "; ".join(failed))
    return out


def sanity(pt: dict[str, Any], duration: float) -> tuple[str, str | None]:
    """(status, reason) of one drive point: drive's own, except that a point that completed no batch in its
    window measured nothing (it is not 0 GB/s)."""
    status = "ok" if pt["status"] == "ok" else "failed"
    reason = pt["reason"]
    if status == "ok" and pt.get("batches") == 0:
        status, reason = "failed", (f"drive completed no batch in its {duration} s window (one batch "
                                    "takes longer than that here); lengthen the testbed's duration")
    return status, reason


def extract(doc: dict[str, Any], ctx: dict[str, Any], duration: float) -> Iterator[Row]:
    """The rows of drive's result document, each point judged by :func:`sanity`."""
    for pt in doc["points"]:
        c = dict(ctx, threads=pt["concurrency"], processes=pt["processes"], batch=pt["batch_size"],
                 size_bytes=pt["page_size"])
        extra = {"verified": pt["verified"], "integrity": bool(doc["meta"].get("integrity")),
                 "window_start": pt.get("window_start"),
                 "window_end": pt.get("window_end"), "destination": ctx.get("extra", {}).get("destination"),
                 # tcp: how drive's client moved each batch (the shape its raw limit must have)
                 "tcp_wire": doc["meta"].get("tcp_wire")}
        c.pop("extra", None)
        status, reason = sanity(pt, duration)

        def row(metric, value, unit, raw_unit=None):
            if status == "ok" and value is None:
                return Row(metric=metric, value=None, unit=unit, status="not_measured",
                           reason="not reported for this op", extra=extra, **c)
            return Row(metric=metric, value=value if status == "ok" else None, unit=unit,
                       status=status, reason=reason, raw_value=value,
                       raw_unit=raw_unit or unit, extra=extra, **c)
        yield row("get_throughput", pt["gb_per_s"], "GB/s")
        yield row("pages_per_s", pt["pages_per_s"], "pages/s")
        for q in ("p50", "p99", "p999"):
            yield row(f"latency_{q}", pt["latency_us"][q], "us")
        yield row("hit_rate", pt["hit_rate"], "ratio")
        yield Row(metric="errors", value=float(pt["errors"]), unit="count", extra=extra, **c)
        if pt["verified"]:
            # A verified run's evidence: how many GETs were checked, and how many failed the check.
            yield Row(metric="keys", value=float(pt["keys"]), unit="count", extra=extra, **c)
            yield Row(metric="verify_failures", value=float(pt["verify_failures"]), unit="count",
                      extra=extra, **c)
