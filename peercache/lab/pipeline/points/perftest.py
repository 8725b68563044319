"""The ``perftest`` kind: an ``ib_read_bw`` / ``ib_write_bw`` / ``ib_send_bw`` run between the point's hosts.

Declaration (:class:`PerftestRun`), run (server on the producer, client on the consumer; a run whose
tool could not calibrate its clock is run again), sanity (:func:`sanity`) and metric extraction
(:func:`extract`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from peercache.lab.launch.runners import Readiness
from peercache.lab.pipeline.points.declare import (NULLABLE_INT, PERF_STAT, POSITIVE_INT, Timed, one_of, parameter,
                                                   sizes, timing, variable)
from peercache.lab.tidy import Row
from peercache.lab.tools import perftest as pt

if TYPE_CHECKING:
    from peercache.lab.pipeline.runpoint import PointRun, TestbedHosts

#: Runs of a perftest point whose tool could not calibrate its clock (perftest.CLOCK_CALIBRATION).
PERFTEST_ATTEMPTS = 3
#: The same on emulated hosts (slowness > 1): two TCG guests sharing two cores scatter perftest's
#: timestamp samples often enough that three runs in a row failed on the two-machine testbed.
PERFTEST_ATTEMPTS_EMULATED = 8
#: Seconds the server may take to open its device and listen on its exchange port.
PERFTEST_READY_S = 20.0


def perftest_attempts(slow: float) -> int:
    """How often a perftest point is run while its tool fails to calibrate its clock."""
    return PERFTEST_ATTEMPTS_EMULATED if slow > 1 else PERFTEST_ATTEMPTS


class PerftestRun(Timed):
    """A perftest bandwidth run (``ib_read_bw`` / ``ib_write_bw``): server on the producer, client on the consumer."""

    name = "perftest"
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
    perf_stat = PERF_STAT
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
                "perf_stat": bool(one["perf_stat"]), "iterations": one["iterations"], **timing(one)}

    @classmethod
    def row_tool(cls, params):
        return params["tool"]

    @classmethod
    def port_devices(cls, params, testbed_devices):
        return testbed_devices[:1]

    @classmethod
    def figure_window(cls, params, row, bps, duration):
        """Run by count (-n per QP), a figure covers the time its bytes took at that rate (iterations x QPs x
        size / rate), not the testbed's duration."""
        its = params.get("iterations")
        if its and row.qps and row.size_bytes and bps > 0:
            return its * row.qps * row.size_bytes / bps
        return duration

    @classmethod
    def counter_direction(cls, row):
        # The consumer (client) receives what a READ moves, and sends what a WRITE moves.
        return "xmit" if row.tool == "ib_write_bw" else "rcv"

    @classmethod
    def run(cls, pr: PointRun, th: TestbedHosts) -> None:
        p = pr.point.params
        devices = pr.tb.devices[:1]
        port = pr.ports.allocate()
        params = pt.PerftestParams(tool=p["tool"], device=devices[0] if devices else None,
                                   gid_index=pr.tb.get("gid_index"), qp_timeout=pr.tb.get("qp_timeout"),
                                   qps=p["qps"], size=p["size"],
                                   duration=None if p.get("iterations") else max(1, math.ceil(pr.duration)),
                                   iterations=p.get("iterations"), tx_depth=p.get("tx_depth"),
                                   report_gbits=True, tcp_port=port)
        ctx = pr.ctx(host=str(th.consumer), peer=str(th.producer), side="client",
                     devices=",".join(devices), numa_node=pr.numa_of(devices))
        server_params = dataclasses.replace(params, device=(pr.tb.role_devices("producer", devices) or [None])[0])
        attempts = perftest_attempts(pr.slow)
        for attempt in range(1, attempts + 1):
            client, perf_path = pr.perf_wrap(pt.client_command(params, th.producer_addr))
            # Readiness is the server's listening exchange port (read with ss, never connected to): perftest's
            # stdout is block-buffered into a pipe, so its "Waiting for client" line shows only at its exit.
            res, err = pr.pair(pt.server_command(server_params), client,
                               Readiness(port=port, timeout=pr.scaled(PERFTEST_READY_S)), th, devices)
            pr.record(res)
            if not err:
                break
            text = (res.client.stdout + res.client.stderr) if res and res.client else ""
            te = pt.classify_failure(text, res.client.rc if res and res.client else None,
                                     str(th.consumer), p["tool"])
            if te is not None and te.kind == pt.CLOCK_CALIBRATION and attempt < attempts:
                # The tool's own clock calibration failed, not the transfer: run it again, and say so.
                pr.notes.append(f"attempt {attempt} of {attempts}: {te}")
                pr.drop_samples(th, perf_path)
                continue
            pr.fail("bw", "B/s", str(te) if te else err, tool=p["tool"], size_bytes=p["size"], qps=p["qps"])
            return
        result = pt.parse_output(res.client.stdout, source=f"{pr.run_id}/client")
        pr.rows += sanity(extract(result, ctx), p, params)
        pr.attach_pair_cpu(*pr.pair_window(res))
        pr.perf_rows(th, perf_path, dict(ctx, tool=p["tool"], size_bytes=p["size"], qps=p["qps"]))


def extract(result: pt.PerftestResult, ctx: dict[str, Any]) -> list[Row]:
    """The client's rows: perftest's average bandwidth is the point's ``bw``."""
    rows = pt.to_rows(result, **ctx)
    for r in rows:
        if r.metric == "bw_average":
            r.metric = "bw"
    return rows


def sanity(rows: list[Row], p: dict[str, Any], params: pt.PerftestParams) -> list[Row]:
    """A run that completed nothing in its window measured nothing (it is not 0 B/s): its rows fail."""
    for r in rows:
        if r.extra.get("iterations") == 0 and r.status == "ok":
            r.status, r.value = "failed", None
            r.reason = (f"{p['tool']} completed 0 iterations in its {params.duration} s window: filling "
                        f"{p['qps']} QPs x tx_depth {params.tx_depth or 'default'} x {p['size']} B takes "
                        "longer than that here; lengthen the testbed's duration or lower tx_depth")
    return rows
