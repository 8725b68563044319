"""The raw limit of a cluster pattern, measured in the same point as PeerCache's run of it.

tcp: one ``iperf3 -R`` flow per (producer, consumer) link of the pattern, released together and summed
over one window (:func:`run_raw`, rows by :func:`raw_rows`).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from peercache.lab.launch.runners import GroupRunner, GroupSpec, Readiness, SideSpec, WindowBytes
from peercache.lab.pipeline.points.bounds import PORT_READY_S, SERVER_EXIT_S
from peercache.lab.tidy import Row
from peercache.lab.tools import iperf3 as iperf3_tool

if TYPE_CHECKING:
    from peercache.lab.pipeline.points.cluster import Placement
    from peercache.lab.pipeline.runpoint import PointRun, TestbedHosts


def run_raw(pr: PointRun, th: TestbedHosts, members: dict, pl: Placement, ctx: dict) -> list[Row]:
    """The raw limit of the pattern: one ``iperf3 -R`` flow per (producer, consumer) of ``pl.flows``,
    released together and summed over one window; rows ``bw`` per consumer host and aggregate."""
    p = pr.point.params
    if p["protocol"] != "tcp":
        return [Row(metric="bw", value=None, unit="B/s", status="not_measured", side="aggregate",
                    reason="the raw pattern of an rdma cluster point (ib_read_bw pairs) is not built yet; "
                           "run the tcp form for a raw limit beside PeerCache",
                    **dict(ctx, tool="ib_read_bw"))]
    secs, omit = max(1, math.ceil(pr.duration)), max(0, math.ceil(pr.warmup))
    specs, flows = [], {}
    for i, (prod, cons) in enumerate(pl.flows):
        port = pr.ports.allocate()
        name = f"raw{i}_{prod}_to_{cons}"
        pm, cm = members[prod], members[cons]
        flows[name] = (prod, cons)
        server = pr.cpu_wrap_on(f"{name}/producer", pm.host, pm.python,
                                iperf3_tool.server_command(port, bind=pm.address))
        client = pr.cpu_wrap_on(f"{name}/consumer", cm.host, cm.python, iperf3_tool.client_command(
            pm.address, port, length=min(p["page_size"] * p["batch_size"], iperf3_tool.MAX_LENGTH),
            streams=1, duration=secs + omit, reverse=True) + ["-O", str(omit)])
        specs.append(GroupSpec(name, [SideSpec(cm.host, client)], SideSpec(pm.host, server),
                               Readiness(port=port, addr=pm.address, timeout=pr.scaled(PORT_READY_S))))
    results: dict[str, Any] = {}

    def measure(gr) -> WindowBytes:
        c = gr.clients[0]
        r = iperf3_tool.parse_json(c.stdout, source=f"{pr.run_id}/{gr.name}", host=c.host)
        results[gr.name] = r
        start = c.start + omit
        return WindowBytes(r.received_bytes, start, start + r.received_seconds)

    runner = GroupRunner(specs, client_timeout=pr.timeout, measure=measure, log_dir=pr.raw_dir / "raw",
                         server_timeout=pr.scaled(SERVER_EXIT_S),
                         window_tolerance_s=max(0.5, 0.1 * pr.slow))
    raw_ctx = dict(ctx, tool="iperf3", protocol="tcp", size_bytes=None, batch=None, threads=None, processes=None)
    res, err = pr.run_group(runner)
    cpu_labels = {f"{n}/{r}": f"{n}/{r}" for n in flows for r in ("producer", "consumer")}
    if err:
        pr.cpu_usage(cpu_labels, None, None)      # read back (and remove) the samples of the failed run
        return [Row(metric="bw", value=None, unit="B/s", status="failed", reason=f"raw pattern: {err}",
                    side="aggregate", **raw_ctx)]
    agg = res.aggregate
    pr.cpu_usage(cpu_labels, agg.window_start, agg.window_end)
    return raw_rows(pl, flows, agg, {n: str(members[n].host) for n in pl.hosts}, raw_ctx)


def raw_rows(pl: Placement, flows: dict[str, tuple[str, str]], agg, specs: dict[str, str],
             ctx: dict[str, Any]) -> list[Row]:
    """The raw pattern's rows (pure): each consumer host's bytes over the shared window, and the aggregate."""
    per: dict[str, float] = {}
    for name, (_, cons) in flows.items():
        per[cons] = per.get(cons, 0.0) + agg.groups[name]["bytes"]
    rows = [Row(metric="bw", value=b / agg.window_s, unit="B/s", side="per_host", devices=c, host=specs[c],
                peer="+".join(p for p, cc in flows.values() if cc == c), **ctx)
            for c, b in per.items()]
    rows.append(Row(metric="bw", value=agg.rate_Bps, unit="B/s", side="aggregate", devices=",".join(per),
                    host="+".join(per), peer="+".join(pl.producers),
                    **dict(ctx, extra=dict(ctx["extra"], window_start=agg.window_start, window_end=agg.window_end,
                                           flows=len(flows), start_skew_s=agg.start_skew_s,
                                           end_skew_s=agg.end_skew_s,
                                           shape="ring" if pl.reads and len(pl.flows) == len(pl.hosts)
                                           and len(pl.producers) == len(pl.hosts) else "the pattern's links"))))
    return rows
