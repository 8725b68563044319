"""The ``hicache_suite`` kind: ``peercache-bench serve`` on the producer, the HiCache-faithful suite
(``python -m peercache.bench.hicache_drive suite``) on the consumer: one rank's PeerCacheStore called as
SGLang's cache controller calls it (get = ``batch_get_v1``, set = ``batch_set_v1``, exists =
``batch_exists``), each op swept over the part's concurrencies inside one run, with a PEAK per op.

Declaration (:class:`HiCacheSuiteRun`), launch (serve as the ``peercache`` kind starts it; the suite's
sweep of ops x concurrencies, each point a warm-up + duration window of its own, so the harness's waits
scale with the number of windows), read, check and rows
(:func:`peercache.lab.tools.hicache_suite.parse_document`: every figure checked against its counts and
each PEAK against the point it names). Each point's pages/s row carries the CPU use of both sides over
that point's own window, which attribution reads for "limited by".
"""
from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from peercache import atomic
from peercache.lab.launch.runners import Readiness
from peercache.lab.pipeline.points.bounds import DRIVE_READY_S, READY_S
from peercache.lab.pipeline.points.declare import (BOOL, NULLABLE_INT, NULLABLE_SECONDS, POSITIVE_INT, Timed,
                                                   one_of, parameter, sizes, timing, variable)
from peercache.lab.pipeline.points.pairkind import Launch, PairKind
from peercache.lab.pipeline.points.peercache import READY_LINE, serve_side
from peercache.lab.tools import hicache_suite as suite

if TYPE_CHECKING:
    from peercache.lab.pipeline.runpoint import PointRun, TestbedHosts

#: SGLang's STORAGE_BATCH_SIZE: pages per storage call.
SGLANG_BATCH = 128


class HiCacheSuiteRun(PairKind, Timed):
    """serve on the producer; on the consumer the HiCache suite: get/set/exists sweeps over concurrency with a
    PEAK per op (pages/s, tokens/s, GB/s, p50/p99/p999 per batch call)."""

    name = "hicache_suite"
    metrics = suite.METRICS
    primary = suite.PRIMARY
    tool_column = suite.TOOL
    output = "suite"

    #: data transport (str)
    protocol = variable(one_of("rdma", "tcp", "shm"), doc="transport (--protocol)")
    #: page geometry (str, swept): mla one object per page (only rank 0 writes), mha two (K and V)
    layout = parameter(one_of("mla", "mha"), doc="page layout (--layout)")
    #: bytes per page object (int, swept)
    page_size = parameter(POSITIVE_INT, doc="bytes per page object (--page-size)")
    #: pages per storage call (int, swept)
    batch_size = parameter(POSITIVE_INT, [SGLANG_BATCH], "pages per storage call (--batch-size) [SGLang's 128]")
    #: the suite's own sweep (list of ints): the threads calling the one store, one point each
    concurrencies = variable({"type": "array", "items": POSITIVE_INT, "minItems": 1, "uniqueItems": True},
                             doc="threads calling the store, swept inside the suite (--concurrencies)")
    #: which calls to sweep (list of get, set, exists)
    ops = variable({"type": "array", "items": one_of(*suite.OPS), "minItems": 1, "uniqueItems": True},
                   list(suite.OPS), "ops, each swept over the concurrencies (--ops) [get, set, exists]")
    #: tokens per SGLang page (int): tokens/s = pages/s x this
    page_tokens = variable(POSITIVE_INT, 64, "tokens per page (--page-tokens)", tag="tok{}")
    #: tensor-parallel ranks modelled, and the rank the suite runs as (with mla only rank 0 writes)
    tp_size = variable(POSITIVE_INT, 1, "tensor-parallel ranks (--tp-size)", tag="tp{}")
    tp_rank = variable({"type": "integer", "minimum": 0}, 0, "the suite's rank (--tp-rank)", tag="rank{}")
    #: pages serve publishes (int or null = the testbed's working_set_bytes / page_size)
    working_set = variable(NULLABLE_INT, None, "pages published [testbed working_set_bytes / page_size]", tag="ws{}")
    #: directory cache TTL in seconds (number or null = the testbed's dir_cache_ttl, else the store's default)
    dir_cache_ttl = variable(NULLABLE_SECONDS, None, "--dir-cache-ttl [testbed dir_cache_ttl, else the store's]",
                             tag="ttl{}")
    #: check the bytes: every get page against serve's pattern, each set point's last batches read back
    verify = variable(BOOL, True, "verify get pages and the set round trip (off: --no-verify)", tag="noverify")
    #: slot checksums on both sides (bool, --integrity)
    integrity = variable(BOOL, False, "payload checksums (serve and suite --integrity)", tag="integrity")
    #: calls per thread per window (int or null = the suite's bound); the time bound is warm-up + duration
    max_calls = variable(NULLABLE_INT, None, "calls per thread per window (--max-calls) [the suite's]",
                         tag="calls{}")

    @classmethod
    def point_name(cls, one):
        ops = "" if list(one["ops"]) == list(suite.OPS) else "_" + "-".join(one["ops"])
        return (f"hcs_{one['protocol']}_{one['layout']}_s{sizes(one['page_size'])}_b{one['batch_size']}"
                f"_c{'-'.join(str(c) for c in one['concurrencies'])}{ops}")

    @classmethod
    def params(cls, one, devices):
        p = {"protocol": one["protocol"], "layout": one["layout"], "page_size": one["page_size"],
             "batch_size": one["batch_size"], "concurrencies": list(one["concurrencies"]), "ops": list(one["ops"]),
             "page_tokens": one["page_tokens"], "processes": 1, "threads": max(one["concurrencies"]),
             "devices": devices[:1] if one["protocol"] == "rdma" else []}
        p.update(cls.changed(one, "tp_size", "tp_rank", "working_set", "dir_cache_ttl", "verify", "integrity",
                             "max_calls"))
        return {**p, **timing(one)}

    @classmethod
    def windows(cls, params):
        return len(params["ops"]) * len(params["concurrencies"])

    @classmethod
    def port_devices(cls, params, testbed_devices):
        return list(params.get("devices") or []) if params.get("protocol") == "rdma" else []

    @classmethod
    def command(cls, pr: PointRun, th: TestbedHosts, port: int, out_path: str) -> tuple[list[str], list[str]]:
        """(serve's argv, the suite's argv) of the point: serve as every serve kind starts it, the suite with
        the same page geometry and the part's sweep."""
        p = pr.point.params
        serve, shared, drive_devs = serve_side(pr, th, port, p)
        argv = suite.suite_command(
            pr.python_tool(th, "consumer", suite.MODULE), [*shared, *drive_devs], batch=p["batch_size"],
            concurrencies=p["concurrencies"], ops=p["ops"], page_tokens=p["page_tokens"], duration=pr.duration,
            warmup=pr.warmup, out_path=out_path, verify=p.get("verify", True), integrity=p.get("integrity", False),
            dir_cache_ttl=p.get("dir_cache_ttl", pr.tb.get("dir_cache_ttl")), tp_size=p.get("tp_size", 1),
            tp_rank=p.get("tp_rank", 0), max_calls=p.get("max_calls"),
            ready_timeout=pr.scaled(DRIVE_READY_S) if pr.slow > 1 else None)
        return serve, argv

    @classmethod
    def launch(cls, pr: PointRun, th: TestbedHosts) -> Launch:
        p = pr.point.params
        out = f"/tmp/pclab-hcsuite-{uuid.uuid4().hex[:10]}.json"
        serve, argv = cls.command(pr, th, pr.ports.allocate(), out)
        devs = list(p.get("devices") or [])
        ctx = pr.ctx(tool=suite.TOOL, side="client", host=str(th.consumer), peer=str(th.producer),
                     protocol=p["protocol"], devices=",".join(devs), numa_node=pr.numa_of(devs))
        return Launch(serve, argv, Readiness(pattern=READY_LINE, timeout=pr.scaled(READY_S)), ctx,
                      failed=dict(tool=suite.TOOL, protocol=p["protocol"], layout=p["layout"],
                                  size_bytes=p["page_size"], batch=p["batch_size"], threads=p["threads"], processes=1),
                      devices=devs, out=out)

    @classmethod
    def read(cls, pr: PointRun, th: TestbedHosts, launch: Launch, res) -> suite.SuiteResult:
        text = pr.fetch(th.consumer, launch.out)
        atomic.write_text(pr.raw_dir / "suite.json", text)
        return suite.parse_document(text, source=str(pr.raw_dir / "suite.json"))

    @classmethod
    def rows(cls, pr: PointRun, launch: Launch, result):
        return suite.to_rows(result, **launch.ctx)

    @classmethod
    def check(cls, result, rows):
        """A suite that failed where none of its rows says so fails the point."""
        if result.status != "ok" and not any(r.status == "failed" for r in rows):
            return f"the suite failed: {result.error}"
        return None

    @classmethod
    def complete(cls, result):
        return result.status == "ok"

    @classmethod
    def cpu_evidence(cls, pr, res, result, rows):
        """Each point's CPU evidence over its own window, on the row attribution judges (its pages/s)."""
        usage = pr.pair_cpu_windows([(pt.window_start, pt.window_end) for pt in result.points])
        for pt, use in zip(result.points, usage):
            for r in rows:
                if r.metric == suite.PRIMARY and r.extra["op"] == pt.op and r.threads == pt.threads:
                    r.extra = dict(r.extra, cpu=use)
