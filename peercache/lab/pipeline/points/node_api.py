"""The ``node_api`` kind: the engine's batch API in one consumer process (``peercache.lab.tools.nodeloop``)
against a serve: ``Node.get_batch_into``, or the library's ``Client.get_batch`` in its copying or its
zero-copy form (``api``).

Declaration (:class:`NodeApiRun`), run (serve on the producer, nodeloop on the consumer: pages/s, then
a verified pass), sanity (every key of the published working set must hit) and metric extraction
(:func:`extract`).
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from peercache import atomic
from peercache.lab.errors import ParseError
from peercache.lab.launch.runners import Readiness
from peercache.lab.pipeline.points.bounds import READY_S
from peercache.lab.pipeline.points.declare import POSITIVE_INT, Timed, one_of, parameter, sizes, timing, variable
from peercache.lab.pipeline.points.peercache import READY_LINE
from peercache.lab.tidy import Row
from peercache.lab.tools import nodeloop

if TYPE_CHECKING:
    from peercache.lab.pipeline.runpoint import PointRun, TestbedHosts


class NodeApiRun(Timed):
    """The engine's batch API in one consumer process (``peercache.lab.tools.nodeloop``) against a serve."""

    name = "node_api"
    metrics = {"pages_per_s": "pages/s", "cpu_ns_per_page": "ns", "verify_failures": "count", "verified_keys": "count"}
    primary = "pages_per_s"
    is_get = True
    tool_column = "peercache-node-api"

    #: transport of the reads (str)
    protocol = variable(one_of("shm"), "shm", "transport (the batch API's shm path)")
    #: bytes per page (int, swept)
    page_size = parameter(POSITIVE_INT, doc="bytes per page")
    #: keys per get_batch_into call (int, swept)
    batch_size = parameter(POSITIVE_INT, doc="keys per call")
    #: pages serve publishes (int)
    working_set = variable(POSITIVE_INT, doc="pages published")
    #: the batch read measured (str): node (Node.get_batch_into), client (Client.get_batch(keys)),
    #: client_outs (Client.get_batch(keys, outs)); see peercache.lab.tools.nodeloop
    api = variable(one_of(*nodeloop.APIS), "node", "the batch read measured (nodeloop --api)")

    @classmethod
    def point_name(cls, one):
        api = one.get("api", "node")
        return (f"api_{one['protocol']}{'' if api == 'node' else '_' + api}_s{sizes(one['page_size'])}"
                f"_b{one['batch_size']}_ws{one['working_set']}")

    @classmethod
    def params(cls, one, devices):
        return {"protocol": one["protocol"], "layout": "mla", "page_size": one["page_size"],
                "batch_size": one["batch_size"], "working_set": one["working_set"], "api": one.get("api", "node"),
                **timing(one)}

    @classmethod
    def run(cls, pr: PointRun, th: TestbedHosts) -> None:
        """The batch API in one consumer process (tools/nodeloop) against a serve: pages/s, then a verified pass."""
        p = pr.point.params
        port = pr.ports.allocate()
        addr = f"{th.producer_addr}:{port}"
        serve = one_reader_serve(pr, th, addr, p)
        client = [*pr.python_tool(th, "consumer", "peercache.lab.tools.nodeloop"), "--discovery-addr", addr,
                  "--page-size", str(p["page_size"]), "--working-set", str(p["working_set"]),
                  "--batch", str(p["batch_size"]), "--duration", str(pr.duration), "--api", p.get("api", "node")]
        ctx = pr.ctx(tool="peercache-node-api", side="client", host=str(th.consumer), peer=str(th.producer),
                     protocol=p["protocol"], layout=p["layout"], size_bytes=p["page_size"], batch=p["batch_size"],
                     threads=1, processes=1)
        res, err = pr.pair(serve, client, Readiness(pattern=READY_LINE, timeout=pr.scaled(READY_S)), th, [])
        pr.record(res)
        if err:
            pr.fail("pages_per_s", "pages/s", err, **{k: ctx[k] for k in ("tool", "protocol", "size_bytes", "batch")})
            return
        lines = [ln for ln in res.client.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            raise ParseError("nodeloop", "no JSON result line; read its log beside the result",
                             source=f"{pr.run_id}/client")
        doc = json.loads(lines[-1])
        atomic.write_text(pr.raw_dir / "nodeloop.json", json.dumps(doc, indent=1))
        why = sanity(doc)
        if why:
            pr.fail("pages_per_s", "pages/s", why, **{k: ctx[k] for k in ("tool", "protocol", "size_bytes", "batch")})
        pr.rows += extract(doc, ctx, measured=why is None)
        pr.attach_pair_cpu(*pr.pair_window(res))


def one_reader_serve(pr: PointRun, th: TestbedHosts, addr: str, p: dict[str, Any], *extra: str) -> list[str]:
    """argv of a serve on the producer at ``addr`` publishing the point's working set for one reader (a kind
    whose consumer is one tool process of its own), with ``extra`` flags."""
    return [*pr.python_tool(th, "producer", "peercache.bench.cli"), "serve", "--discovery-addr", addr,
            "--protocol", p["protocol"], "--layout", p["layout"], "--page-size", str(p["page_size"]),
            "--working-set", str(p["working_set"]), "--readers", "1", "--max-wait", str(int(pr.timeout)),
            *extra, "--quiet"]


def sanity(doc: dict[str, Any]) -> str | None:
    """Why the figure is not of the published working set (None: it is): every key must hit; a miss means it
    measured something else."""
    if doc["hits"] != doc["gets"]:
        return (f"{doc['gets'] - doc['hits']} of {doc['gets']} GETs were not hits "
                "(the working set is not all published, or serve evicted)")
    return None


def extract(doc: dict[str, Any], ctx: dict[str, Any], measured: bool) -> list[Row]:
    """The pages/s row (when ``measured``), then the verified pass's counts."""
    extra = {"gets": doc["gets"], "hits": doc["hits"], "seconds": doc["seconds"],
             "working_set": doc["working_set"], "api": doc.get("api", "node")}
    rows = []
    if measured:
        rows.append(Row(metric="pages_per_s", value=doc["pages_per_s"], unit="pages/s",
                        raw_value=doc["pages_per_s"], raw_unit="pages/s", extra=extra, **ctx))
        # the loop thread's CPU clock over the pages it read; instructions per page are not measured (perf stat
        # around nodeloop would count its set-up and verified pass too, and this VM's counters read
        # <not supported>)
        rows.append(Row(metric="cpu_ns_per_page", value=doc["cpu_ns_per_page"], unit="ns", extra=extra, **ctx))
    rows.append(Row(metric="verified_keys", value=float(doc["verified_keys"]), unit="count", **ctx))
    rows.append(Row(metric="verify_failures", value=float(doc["verify_failures"]), unit="count", **ctx))
    return rows
