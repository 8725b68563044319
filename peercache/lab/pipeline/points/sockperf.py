"""The ``sockperf`` kind: sockperf TCP ping-pong between the point's hosts (the raw round trip of a path).

Declaration (:class:`SockperfRun`), launch (the server echoes until the pair runner ends it after the
client), read (the tool's parser: a complete report counts even when the pair then reported a failure,
which the harness notes) and rows (the tool's); the rest is the harness's pair path.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from peercache.lab.launch.runners import Readiness
from peercache.lab.pipeline.points.bounds import PORT_READY_S
from peercache.lab.pipeline.points.declare import BOOL, POSITIVE_INT, Timed, parameter, sizes, timing, variable
from peercache.lab.pipeline.points.pairkind import Launch, PairKind
from peercache.lab.tools import sockperf as sockperf_tool

if TYPE_CHECKING:
    from peercache.lab.pipeline.runpoint import PointRun, TestbedHosts


class SockperfRun(PairKind, Timed):
    """sockperf TCP ping-pong (the raw round trip of a path): server on the producer, client on the consumer."""

    name = "sockperf"
    metrics = {"rtt_p50": "us", "rtt_p99": "us", "rtt_p999": "us", "rtt_avg": "us", "observations": "count"}
    primary = "rtt_p50"
    tool_column = "sockperf"
    output = "sockperf report"

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
        return {"msg_size": one["msg_size"], **({"busy_poll": True} if one["busy_poll"] else {}), **timing(one)}

    @classmethod
    def launch(cls, pr: PointRun, th: TestbedHosts) -> Launch:
        """sockperf TCP ping-pong between the point's two hosts: the round trip a GET on that path is compared with."""
        p = pr.point.params
        port = pr.ports.allocate()
        secs = max(1, math.ceil(pr.duration))
        ctx = pr.ctx(tool="sockperf", protocol="tcp", size_bytes=p["msg_size"], host=str(th.consumer),
                     peer=str(th.producer), side="client", threads=1, processes=1)
        # The server echoes until it is ended; the pair runner ends it after the client.
        return Launch(sockperf_tool.server_command(port, bind=th.producer_addr),
                      sockperf_tool.client_command(th.producer_addr, port, p["msg_size"], secs,
                                                   busy_poll=bool(p.get("busy_poll"))),
                      Readiness(port=port, addr=th.producer_addr, timeout=pr.scaled(PORT_READY_S)), ctx,
                      failed={k: ctx[k] for k in ("tool", "protocol", "size_bytes")}, server_exits=False)

    @classmethod
    def read(cls, pr: PointRun, th: TestbedHosts, launch: Launch, res) -> sockperf_tool.SockperfResult:
        text = res.client.stdout if res is not None and res.client is not None else ""
        return sockperf_tool.parse_output(text, source=f"{pr.run_id}/client", host=str(th.consumer))

    @classmethod
    def rows(cls, pr: PointRun, launch: Launch, result):
        return sockperf_tool.to_rows(result, **launch.ctx)
