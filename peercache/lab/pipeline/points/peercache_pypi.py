"""The ``peercache_pypi`` kind: the published PeerCache 0.8.4's ``serve`` on the producer and ``drive`` on the
consumer, at a PeerCache point's page size, batch, threads, working set and directory-cache TTL.

Declaration (:class:`PeerCachePypiRun`), launch (serve first, ready once its node is up and waits for its
reader; drive joins, waits for the published pages, reads for the point's warm-up and duration, writes its
report; serve is stopped after it), read and rows
(:func:`peercache.lab.tools.peercache_pypi.parse_report`: one point of a drive of get, its figures
consistent; or drive's own failure message). Its drive never checks the bytes it reads, so its rows say
``unverified``.
"""
from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from peercache import atomic
from peercache.lab.errors import ParseError
from peercache.lab.launch.runners import Readiness
from peercache.lab.pipeline.points.bounds import READY_S
from peercache.lab.pipeline.points.declare import (NULLABLE_INT, NULLABLE_SECONDS, POSITIVE_INT, one_of, parameter,
                                                   variable)
from peercache.lab.pipeline.points.engines import EngineRun, engine_path, engine_sides
from peercache.lab.pipeline.points.pairkind import Launch, PairKind
from peercache.lab.system.slowness import HOST_COMMAND_S
from peercache.lab.tools import peercache_pypi as pypi

if TYPE_CHECKING:
    from peercache.lab.pipeline.runpoint import PointRun, TestbedHosts

#: --dir-cache-ttl when neither the part nor the testbed sets one (as the peercache kind's drive).
DIR_CACHE_TTL_S = 5.0
#: Seconds serve and drive each wait for their peer's connection (--connect-timeout).
CONNECT_S = 60.0


class PeerCachePypiRun(PairKind, EngineRun):
    """peercache 0.8.4 (PyPI) serve/drive: batch_get_v1 throughput of one pair."""

    name = "peercache_pypi"
    prefix = "pcpypi"
    passed_on = ("working_set", "dir_cache_ttl")
    shape = ("protocol", "layout", "page_size", "batch_size", "threads")
    metrics = {"get_throughput": "GB/s", "pages_per_s": "pages/s", "latency_p50": "us", "latency_p99": "us",
               "latency_p999": "us", "hit_rate": "ratio"}
    primary = "get_throughput"
    tool_column = pypi.TOOL
    output = "drive report"

    #: transport (str): tcp, or rdma with the testbed's first device
    protocol = variable(one_of(*pypi.PROTOCOLS), doc="transport (--protocol)")
    #: page geometry (str)
    layout = variable(one_of("mla", "mha"), doc="page layout (--layout)")
    #: bytes per object (int, swept)
    page_size = parameter(POSITIVE_INT, doc="bytes per object (--page-size)")
    #: pages per batch_get_v1 call (int, swept)
    batch_size = parameter(POSITIVE_INT, doc="pages per batch (--batch-size)")
    #: reader threads of the one drive process (int, swept)
    threads = parameter(POSITIVE_INT, doc="reader threads (--concurrencies, one value)")
    #: pages serve publishes (int or null = the testbed's working_set_bytes / page_size)
    working_set = variable(NULLABLE_INT, None, "pages published [testbed working_set_bytes / page_size]", tag="ws{}")
    #: directory cache TTL in seconds (number or null = the testbed's dir_cache_ttl)
    dir_cache_ttl = variable(NULLABLE_SECONDS, None, "--dir-cache-ttl [testbed dir_cache_ttl]", tag="ttl{}")

    @classmethod
    def launch(cls, pr: PointRun, th: TestbedHosts) -> Launch | None:
        p = pr.point.params
        sides = engine_sides(pr, th, pypi.VENV, pypi.BINARY)
        if sides is None:
            return None
        devs, pdev, cdev = sides
        gid = pr.tb.get("gid_index")
        ws = pr.working_set(p.get("working_set"), p["page_size"], p["batch_size"])
        ttl = p.get("dir_cache_ttl", pr.tb.get("dir_cache_ttl", DIR_CACHE_TTL_S))
        discovery = f"{th.producer_addr}:{pr.ports.allocate()}"
        out_dir = f"/tmp/pclab-pcpypi-{uuid.uuid4().hex[:10]}"
        binary = engine_path(pypi.BINARY)
        wait = pr.scaled(CONNECT_S)
        serve = pypi.serve_command(binary, p["protocol"], discovery, th.producer_addr, p["layout"], p["page_size"], ws,
                                   readers=1, device=pdev, gid_index=gid, connect_timeout=wait)
        drive = pypi.drive_command(binary, p["protocol"], discovery, th.consumer_addr, p["layout"], p["page_size"], ws,
                                   p["batch_size"], p["threads"], pr.duration, pr.warmup, out_dir,
                                   dir_cache_ttl=float(ttl), device=cdev, gid_index=gid, connect_timeout=wait)
        ctx = pr.ctx(tool=pypi.TOOL, side="client", host=str(th.consumer), peer=str(th.producer),
                     protocol=p["protocol"], devices=",".join(devs), numa_node=pr.numa_of(devs),
                     extra={"engine": "peercache_pypi", "working_set": ws, "dir_cache_ttl": float(ttl)})
        return Launch(serve, drive, Readiness(pattern=pypi.SERVE_READY, timeout=pr.scaled(READY_S)), ctx,
                      failed=dict(tool=pypi.TOOL, protocol=p["protocol"], layout=p["layout"], size_bytes=p["page_size"],
                                  batch=p["batch_size"], threads=p["threads"], processes=1),
                      devices=devs, server_exits=False,
                      cleanup=lambda: th.consumer.run(["rm", "-rf", out_dir], timeout=pr.scaled(HOST_COMMAND_S)))

    @classmethod
    def read(cls, pr: PointRun, th: TestbedHosts, launch: Launch, res) -> pypi.DriveResult:
        """drive's report: the path it printed, fetched from the consumer and kept as drive.json, parsed; where
        it printed none, the failure it printed instead."""
        out = "" if res is None or res.client is None else res.client.stdout or ""
        errtext = "" if res is None or res.client is None else res.client.stderr or ""
        try:
            path = pypi.report_path(out, source=f"{pr.run_id}/client")
        except ParseError:
            told = pypi.failure(out, errtext, host=str(th.consumer))
            raise told if told is not None else ParseError(
                pypi.TOOL, "drive printed no 'wrote PATH.json' line and no failure it knows; read its log",
                source=f"{pr.run_id}/client") from None
        text = pr.fetch(th.consumer, path)
        atomic.write_text(pr.raw_dir / "drive.json", text)
        return pypi.parse_report(text, source=str(pr.raw_dir / "drive.json"))

    @classmethod
    def rows(cls, pr: PointRun, launch: Launch, result):
        return pypi.to_rows(result, **launch.ctx)
