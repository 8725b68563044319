"""The ``nixl`` kind: NIXL's ``nixl_agent`` (UCX, DRAM) through our driver, target on the producer and initiator on
the consumer, at a PeerCache point's page size, batch, threads and working set.

Declaration (:class:`NixlRun`), launch (the target first, ready once it has registered and filled its pool and
printed its agent name and pool address, which the pair runner puts in the initiator's ``{nixl_agent}`` /
``{nixl_pool}``; the initiator fetches the target's metadata from its NIXL listener, READs for the point's
warm-up and duration and prints its JSON result; the target is stopped after it), read and rows
(:func:`peercache.lab.tools.nixl.parse_output`: one result whose figures agree with each other and
with the geometry asked, every page checked unless ``verify: false``; or the driver's own error).

Transport: UCX over tcp on the interface of each side's address. Over rdma (UCX rc on the testbed's first
device) the point is skipped with :data:`RDMA_UNSHOWN` unless the part sets ``run_unshown_rdma: true``:
NIXL's UCX over Soft-RoCE has not been run in this lab, and a figure from a path never checked is not shown.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from peercache.lab.launch.runners import Readiness
from peercache.lab.pipeline.points.bounds import READY_S
from peercache.lab.pipeline.points.declare import BOOL, NULLABLE_INT, POSITIVE_INT, one_of, parameter, variable
from peercache.lab.pipeline.points.engines import EngineRun, engine_path, engine_sides, skip_for
from peercache.lab.pipeline.points.pairkind import Launch, PairKind
from peercache.lab.tools import nixl as nx

if TYPE_CHECKING:
    from peercache.lab.pipeline.runpoint import PointRun, TestbedHosts

#: Why an rdma point is skipped (the exact state of things, not a guess about the device).
RDMA_UNSHOWN = ("NIXL over rdma does not run on this lab's Soft-RoCE: tried on 2026-12-02 in the softroce guest, "
                "nixl-cu12 1.5.1's bundled libibverbs could not load the rxe provider (\"couldn't load driver "
                "'librxe-rdmav34.so'\"), so UCX found no RDMA device (\"transport 'rc' is not available\") and "
                "NIXL's UCX backend failed (NIXL_ERR_BACKEND; docs/engines.md); on another RDMA stack set "
                "run_unshown_rdma: true in the part to try it")
#: Seconds the initiator waits for the target's metadata (--connect-timeout).
CONNECT_S = 30.0
#: Seconds one transfer request may take (--batch-timeout).
BATCH_S = 10.0


class NixlRun(PairKind, EngineRun):
    """NIXL READs of page batches (our driver over nixl_agent, UCX backend, DRAM): target and initiator."""

    name = "nixl"
    prefix = "nixl"
    passed_on = ("working_set", "verify", "run_unshown_rdma")
    metrics = {"get_throughput": "GB/s", "latency_p50": "us", "latency_p99": "us", "batches": "count"}
    primary = "get_throughput"
    tool_column = nx.TOOL
    output = "initiator result"

    #: transport (str): UCX over tcp, or UCX rc over the testbed's first RDMA device
    protocol = variable(one_of(*nx.PROTOCOLS), doc="transport (UCX_TLS tcp or rc)")
    #: bytes per page (int, swept): the PeerCache point's page size
    page_size = parameter(POSITIVE_INT, doc="bytes per READ (--page-size)")
    #: pages per batch (int, swept): the PeerCache point's batch
    batch_size = parameter(POSITIVE_INT, doc="READs per transfer request (--batch)")
    #: reader threads of the one initiator process (int, swept): the PeerCache point's readers
    threads = parameter(POSITIVE_INT, doc="initiator threads sharing one agent (--threads)")
    #: pages in the target's pool (int or null = the testbed's working_set_bytes / page_size)
    working_set = variable(NULLABLE_INT, None, "pages the target registers [testbed working_set_bytes / page_size]",
                           tag="ws{}")
    #: check every page read against the target's pattern (bool, default true)
    verify = variable(BOOL, True, "check every page read (off: --no-verify)", tag="noverify")
    #: run over rdma although it has not been shown here (bool, default false: skip with RDMA_UNSHOWN)
    run_unshown_rdma = variable(BOOL, False, "run protocol rdma although NIXL over it is not shown in this lab")

    @classmethod
    def launch(cls, pr: PointRun, th: TestbedHosts) -> Launch | None:
        p = pr.point.params
        sides = engine_sides(pr, th, nx.VENV, nx.BINARY)
        if sides is None:
            return None
        if p["protocol"] == "rdma" and not p.get("run_unshown_rdma", False):
            skip_for(pr, RDMA_UNSHOWN)
            return None
        devs, pdev, cdev = sides
        gid = pr.tb.get("gid_index")
        size, batch, threads = p["page_size"], p["batch_size"], p["threads"]
        pages = pr.working_set(p.get("working_set"), size, batch)
        verify = bool(p.get("verify", True))
        python, driver = engine_path(nx.BINARY), engine_path(nx.DRIVER)
        tport, iport = pr.ports.allocate(), pr.ports.allocate()
        target = nx.target_command(python, driver, p["protocol"], th.producer_addr, tport, size, pages, pdev, gid)
        initiator = nx.initiator_command(python, driver, p["protocol"], th.consumer_addr, iport,
                                         f"{th.producer_addr}:{tport}", size, pages, batch, threads, pr.duration,
                                         pr.warmup, verify=verify, connect_timeout=pr.scaled(CONNECT_S),
                                         batch_timeout=pr.scaled(BATCH_S), device=cdev, gid_index=gid)
        ctx = pr.ctx(tool=nx.TOOL, side="client", host=str(th.consumer), peer=str(th.producer),
                     protocol=p["protocol"], devices=",".join(devs), numa_node=pr.numa_of(devs),
                     extra={"engine": "nixl", "working_set": pages})
        return Launch(target, initiator, Readiness(pattern=nx.TARGET_READY, timeout=pr.scaled(READY_S)), ctx,
                      failed=dict(tool=nx.TOOL, protocol=p["protocol"], size_bytes=size, batch=batch, threads=threads,
                                  processes=1),
                      devices=devs, server_exits=False)

    @classmethod
    def read(cls, pr: PointRun, th: TestbedHosts, launch: Launch, res) -> nx.NixlResult:
        p = pr.point.params
        out = "" if res is None or res.client is None else res.client.stdout or ""
        return nx.parse_output(out, p["page_size"], p["batch_size"], p["threads"], source=f"{pr.run_id}/client",
                               host=str(th.consumer))

    @classmethod
    def rows(cls, pr: PointRun, launch: Launch, result):
        return nx.to_rows(result, **launch.ctx)
