"""The ``get_trace`` kind: where a 4 KiB GET's microseconds go. serve (``--trace``) on the producer and
``peercache.lab.tools.gettrace`` on the consumer, over tcp; both record the native points of
``native/trace.h`` and :func:`peercache.lab.tools.gettrace.breakdown` joins them into one timeline per GET.

Rows: ``latency_p50`` (the untraced GET, as the bench's latency points measure it), ``traced_p50``
(the same GETs traced: what the stamps cost) and one ``part_p50`` per segment of the timeline
(``extra.segment``, ``extra.label``); beside the result, ``breakdown.json`` holds the table and
``trace.client.json`` / ``trace.server.json`` the two traces it was made from.
"""
from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING

from peercache import atomic
from peercache.lab.errors import ParseError
from peercache.lab.launch.runners import Readiness
from peercache.lab.pipeline.points.bounds import READY_S
from peercache.lab.pipeline.points.declare import (NULLABLE_MICROSECONDS, POSITIVE_INT, Timed, one_of, parameter,
                                                   sizes, timing, variable)
from peercache.lab.pipeline.points.node_api import one_reader_serve
from peercache.lab.pipeline.points.peercache import READY_LINE
from peercache.lab.tidy import Row
from peercache.lab.tools import gettrace

if TYPE_CHECKING:
    from peercache.lab.pipeline.runpoint import PointRun, TestbedHosts


class GetTraceRun(Timed):
    """One-key GETs over tcp, traced on both sides: the latency breakdown."""

    name = "get_trace"
    metrics = {"latency_p50": "us", "traced_p50": "us", "part_p50": "us"}
    primary = "latency_p50"
    is_get = True
    tool_column = "peercache-gettrace"

    #: transport of the reads (str)
    protocol = variable(one_of("tcp"), "tcp", "transport (the traced points are tcp's)")
    #: bytes per page (int, swept)
    page_size = parameter(POSITIVE_INT, doc="bytes per page")
    #: pages serve publishes (int)
    working_set = variable(POSITIVE_INT, doc="pages published")
    #: GETs per pass (int)
    gets = variable({"type": "integer", "minimum": 1, "maximum": 40_000}, 2000, "GETs per pass (untraced, then traced)")
    #: seconds a location stays cached (0: every GET reads the directory's table)
    dir_cache_ttl = variable({"type": "number", "minimum": 0}, 3600, "--dir-cache-ttl of the consumer")
    #: the consumer's reply poll (µs; null: the node's default)
    tcp_poll_us = variable(NULLABLE_MICROSECONDS, None, "the consumer's tcp reply poll [the node's default]")

    @classmethod
    def point_name(cls, one):
        return (f"trace_{one['protocol']}_s{sizes(one['page_size'])}_ttl{one['dir_cache_ttl']:g}"
                f"_ws{one['working_set']}")

    @classmethod
    def params(cls, one, devices):
        return {"protocol": one["protocol"], "layout": "mla", "page_size": one["page_size"],
                "working_set": one["working_set"], "gets": one["gets"], "dir_cache_ttl": one["dir_cache_ttl"],
                "tcp_poll_us": one.get("tcp_poll_us"), **timing(one)}

    @classmethod
    def run(cls, pr: PointRun, th: TestbedHosts) -> None:
        """serve --trace and gettrace; the two traces joined into the breakdown."""
        p = pr.point.params
        port = pr.ports.allocate()
        addr = f"{th.producer_addr}:{port}"
        server_trace = f"/tmp/pclab-trace-{uuid.uuid4().hex[:10]}.json"
        serve = one_reader_serve(pr, th, addr, p, "--trace", server_trace)
        client = [*pr.python_tool(th, "consumer", "peercache.lab.tools.gettrace"), "--discovery-addr", addr,
                  "--page-size", str(p["page_size"]), "--working-set", str(p["working_set"]),
                  "--gets", str(p["gets"]), "--dir-cache-ttl", str(p["dir_cache_ttl"]),
                  *(["--tcp-poll-us", str(p["tcp_poll_us"])] if p.get("tcp_poll_us") is not None else [])]
        ctx = pr.ctx(tool="peercache-gettrace", side="client", host=str(th.consumer), peer=str(th.producer),
                     protocol=p["protocol"], layout=p["layout"], size_bytes=p["page_size"], batch=1,
                     threads=1, processes=1)
        res, err = pr.pair(serve, client, Readiness(pattern=READY_LINE, timeout=pr.scaled(READY_S)), th, [])
        pr.record(res)
        if err:
            pr.fail("latency_p50", "us", err, **{k: ctx[k] for k in ("tool", "protocol", "size_bytes")})
            return
        lines = [ln for ln in res.client.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            raise ParseError("gettrace", "no JSON result line; read its log beside the result",
                             source=f"{pr.run_id}/client")
        doc = json.loads(lines[-1])
        server_text = pr.fetch(th.producer, server_trace)
        server = json.loads(server_text)
        table = gettrace.breakdown(doc, server)
        # both traces as they came (to join again, or differently), and the table
        atomic.write_text(pr.raw_dir / "trace.client.json", lines[-1])
        atomic.write_text(pr.raw_dir / "trace.server.json", server_text)
        atomic.write_text(pr.raw_dir / "breakdown.json", json.dumps(table, indent=1))
        if doc["misses"]:
            pr.fail("latency_p50", "us", f"{doc['misses']} of {2 * doc['gets']} GETs were not hits (the working "
                    "set is not all published, or serve evicted)", **{k: ctx[k] for k in ("tool", "protocol",
                                                                                          "size_bytes")})
            return
        pr.rows += rows(doc, table, ctx)


def rows(doc: dict, table: dict, ctx: dict) -> list[Row]:
    """latency_p50 (untraced), traced_p50, and one part_p50 per segment of the breakdown."""
    extra = {"gets": doc["gets"], "dir_cache_ttl": doc["dir_cache_ttl"], "joined": table["joined"]}
    out = [Row(metric="latency_p50", value=doc["p50_us"], unit="us", extra=extra, **ctx),
           Row(metric="traced_p50", value=table["total_p50_us"], unit="us", extra=extra, **ctx)]
    for seg in table["segments"]:
        out.append(Row(metric="part_p50", value=seg["p50_us"], unit="us",
                       extra={"segment": seg["segment"], "label": seg["label"], "share": seg["share"]}, **ctx))
    return out
