"""The ``mooncake_te`` kind: Mooncake Transfer Engine's ``transfer_engine_bench``, target on the producer and
initiator on the consumer, at a PeerCache point's page size, batch and threads.

Declaration (:class:`MooncakeTeRun`), launch (the target first, ready once it has logged the port its P2P
handshake picked, which the pair runner puts in the initiator's ``--segment_id``; the initiator READs for
the point's duration, rounded up to whole seconds as the tool takes them, after a discarded first run of the
warm-up's length against the same target, since the tool has no warm-up of its own; the target is stopped after it),
read and rows (:func:`peercache.lab.tools.mooncake_te.parse_log`: one result line whose
printed rate agrees with its own counts, or the failure it logged). Transport: tcp on a testbed without
RDMA, rdma with the testbed's first device and its GID index (``MC_GID_INDEX``) on one with it. The tool
never checks the bytes it reads, so its rows say ``unverified``.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from peercache.lab.launch.runners import Readiness
from peercache.lab.pipeline.points.declare import NULLABLE_INT, POSITIVE_INT, one_of, parameter, variable
from peercache.lab.pipeline.points.engines import EngineRun, engine_path, engine_sides
from peercache.lab.pipeline.points.pairkind import Launch, PairKind
from peercache.lab.tools import mooncake_te as te

if TYPE_CHECKING:
    from peercache.lab.pipeline.runpoint import PointRun, TestbedHosts

#: Seconds the target may take to log the port its P2P handshake picked (its readiness).
TARGET_READY_S = 30.0


class MooncakeTeRun(PairKind, EngineRun):
    """transfer_engine_bench READs (target on the producer, initiator on the consumer), P2P handshake, no etcd."""

    name = "mooncake_te"
    prefix = "mc"
    passed_on = ("buffer_bytes",)
    metrics = {"get_throughput": "GB/s", "batches": "count"}
    primary = "get_throughput"
    tool_column = te.TOOL
    output = "initiator report"

    #: transport (str): tcp, or rdma with the testbed's first device
    protocol = variable(one_of(*te.PROTOCOLS), doc="transport (-protocol)")
    #: bytes per READ (int, swept): the PeerCache point's page size
    page_size = parameter(POSITIVE_INT, doc="bytes per request (-block_size)")
    #: READs per batch (int, swept): the PeerCache point's batch
    batch_size = parameter(POSITIVE_INT, doc="requests per batch (-batch_size)")
    #: submitting threads of the one initiator process (int, swept): the PeerCache point's readers
    threads = parameter(POSITIVE_INT, doc="initiator threads (-threads)")
    #: bytes each side registers (int or null = the testbed's working_set_bytes); at least what the
    #: initiator's threads touch (page x batch x threads)
    buffer_bytes = variable(NULLABLE_INT, None, "bytes registered on each side (-buffer_size) "
                                                "[testbed working_set_bytes]", tag="buf{}")

    @classmethod
    def launch(cls, pr: PointRun, th: TestbedHosts) -> Launch | None:
        p = pr.point.params
        sides = engine_sides(pr, th, te.VENV, te.BINARY)
        if sides is None:
            return None
        devs, pdev, cdev = sides
        gid = pr.tb.get("gid_index")
        block, batch, threads = p["page_size"], p["batch_size"], p["threads"]
        buf = te.buffer_bytes(block, batch, threads, int(p.get("buffer_bytes") or pr.tb.get("working_set_bytes", 0)
                                                         or 0))
        secs = max(1, math.ceil(pr.duration))
        binary = engine_path(te.BINARY)
        target = te.target_command(binary, p["protocol"], th.producer_addr, block, batch, threads, buf, pdev, gid)
        initiator = te.initiator_command(binary, p["protocol"], th.consumer_addr, f"{th.producer_addr}:{{te_port}}",
                                         block, batch, threads, buf, secs, cdev, gid)
        # The tool has no warm-up: its window starts as its threads start, right after it opens the target's
        # segment. Its steady state: a first run of the warm-up's length (whole seconds, as the tool takes
        # them) against the same target, discarded, then the measured run.
        warm_s = max(1, math.ceil(pr.warmup)) if pr.warmup > 0 else 0
        warmup = te.initiator_command(binary, p["protocol"], th.consumer_addr, f"{th.producer_addr}:{{te_port}}",
                                      block, batch, threads, buf, warm_s, cdev, gid) if warm_s else None
        ctx = pr.ctx(tool=te.TOOL, side="client", host=str(th.consumer), peer=str(th.producer),
                     protocol=p["protocol"], devices=",".join(devs), numa_node=pr.numa_of(devs),
                     extra={"engine": "mooncake_te", "buffer_bytes": buf,
                            "warmup": (f"a {warm_s} s run against the same target, discarded (the tool has none)"
                                       if warm_s else "none (the testbed asks none)"),
                            "duration_asked_s": secs})
        return Launch(target, initiator, Readiness(pattern=te.TARGET_READY, timeout=pr.scaled(TARGET_READY_S)), ctx,
                      failed=dict(tool=te.TOOL, protocol=p["protocol"], size_bytes=block, batch=batch, threads=threads,
                                  processes=1),
                      devices=devs, server_exits=False, own={"device": cdev}, warmup=warmup)

    @classmethod
    def read(cls, pr: PointRun, th: TestbedHosts, launch: Launch, res) -> te.TeResult:
        p = pr.point.params
        log = "" if res is None or res.client is None else (res.client.stderr or "") + (res.client.stdout or "")
        return te.parse_log(log, p["page_size"], p["batch_size"], p["threads"], source=f"{pr.run_id}/client",
                            host=str(th.consumer), device=launch.own["device"] if p["protocol"] == "rdma" else None)

    @classmethod
    def rows(cls, pr: PointRun, launch: Launch, result):
        return te.to_rows(result, **launch.ctx)
