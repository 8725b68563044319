"""The ``memcpy`` kind: the memory-copy ceiling of the producer (the shm limit), measured on each NUMA node.

Declaration (:class:`MemcpyRun`), run (``peercache.lab.tools.memcpy`` once per node of the producer,
bound there with numactl when it is installed), sanity (a run that exited non-zero is a failed row)
and metric extraction (:func:`extract`: one ``bw`` row per node).
"""
from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from peercache import atomic, sysfs
from peercache.lab.pipeline.points.declare import NULLABLE_INT, POSITIVE_INT, Timed, parameter, sizes, timing, variable
from peercache.lab.system import numa
from peercache.lab.system.slowness import HOST_COMMAND_S
from peercache.lab.tidy import Row

if TYPE_CHECKING:
    from peercache.lab.pipeline.runpoint import PointRun, TestbedHosts

#: Batch of the memcpy limit: the batch of the PeerCache shm points it is compared with.
MEMCPY_BATCH = 32


class MemcpyRun(Timed):
    """One-thread memcpy of pool-shaped pages into a batch buffer on the producer (the shm limit), per NUMA node."""

    name = "memcpy"
    metrics = {"bw": "B/s"}
    primary = "bw"
    tool_column = "memcpy"

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
        p.update(cls.changed(one, "batch", "working_set"))
        return {**p, **timing(one)}

    @classmethod
    def run(cls, pr: PointRun, th: TestbedHosts) -> None:
        """The memory-copy ceiling of the producer, measured on each of its NUMA nodes (one row per node)."""
        p = pr.point.params
        # Same region size and batch as the PeerCache points it is the limit for.
        batch = int(p.get("batch", MEMCPY_BATCH))
        ws = pr.working_set(p.get("working_set"), p["size"], batch)
        base = [*pr.python_tool(th, "producer", "peercache.lab.tools.memcpy"), "--size", str(p["size"]),
                "--working-set", str(ws), "--batch", str(batch), "--duration", str(pr.duration)]
        r = th.producer.run(["cat", "/sys/devices/system/node/online"], timeout=pr.scaled(HOST_COMMAND_S))
        nodes = parse_nodelist(r.stdout) if r.rc == 0 else []
        has_numactl = th.producer.run(["sh", "-c", "command -v numactl"], timeout=pr.scaled(HOST_COMMAND_S)).rc == 0
        ctx = pr.ctx(tool="memcpy", protocol="shm", side="producer", host=str(th.producer),
                     size_bytes=p["size"], threads=1, processes=1)
        for node in nodes or [None]:
            argv, record = numa.bind(base, node, has_numactl and node is not None)
            role = "producer" if node is None else f"producer/node{node}"
            pr.commands[role], pr.numa[role] = argv, record
            wrapped = pr.cpu_wrap(role, th, "producer", argv)
            t0 = time.time()
            r = th.producer.run(wrapped, timeout=pr.timeout)
            t1 = time.time()
            atomic.write_text(pr.raw_dir / f"memcpy{'' if node is None else f'.node{node}'}.log", r.stdout + r.stderr)
            if r.rc != 0:
                pr.fail("bw", "B/s", f"memcpy measurement on node {node} exited {r.rc}: {r.stderr.strip()[-300:]}",
                        tool="memcpy", protocol="shm", size_bytes=p["size"], numa_node=node)
                continue
            span = t1 - t0
            pr.rows.append(extract(json.loads(r.stdout.strip().splitlines()[-1]), node, record,
                                   pr.cpu_usage({"producer": role}, t0 + 0.2 * span, t1 - 0.2 * span), ctx))


def extract(doc: dict[str, Any], node: int | None, record: dict[str, Any], cpu: dict[str, Any],
            ctx: dict[str, Any]) -> Row:
    """The ``bw`` row of one node's run from the tool's result line."""
    return Row(metric="bw", value=doc["bytes_per_s"], unit="B/s", raw_value=doc["bytes_per_s"],
               raw_unit="B/s", numa_node=node,
               extra={"seconds": doc["seconds"], "pages": doc["pages"],
                      "working_set": doc["working_set"], "numa_binding": record, "cpu": cpu},
               **ctx)


def parse_nodelist(text: str) -> list[int]:
    """A sysfs node list ("0", "0-1", "0,2-3") as node numbers; [] when it cannot be read."""
    try:
        return sysfs.parse_list(text)
    except ValueError:
        return []
