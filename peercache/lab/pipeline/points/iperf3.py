"""The ``iperf3`` kind: iperf3 over TCP between the point's hosts (the raw TCP limit).

Declaration (:class:`Iperf3Run`), run (one client against its server, or N client processes each
against its own server, released together and summed over one window), and metric extraction
(:func:`extract`, :func:`processes_row`). Its sanity is the parser's: a report iperf3 marked as an
error is a ToolError.

A limit is the most the path gave, not one sample of it: with ``rounds`` > 1 the point runs that many
times back to back and keeps the best round, recording every round's figure beside it
(:func:`best_of`), so one round slowed by the shared machine does not pass for the limit.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from peercache.lab.launch.runners import GroupRunner, GroupSpec, Readiness, SideSpec, WindowBytes
from peercache.lab.pipeline.points.bounds import PORT_READY_S, SERVER_EXIT_S
from peercache.lab.pipeline.points.declare import (BOOL, NULLABLE_INT, PERF_STAT, POSITIVE_INT, Timed, parameter,
                                                   sizes, timing, variable)
from peercache.lab.system import cpusample
from peercache.lab.tidy import Row
from peercache.lab.tools import iperf3 as iperf3_tool

if TYPE_CHECKING:
    from peercache.lab.pipeline.runpoint import PointRun, TestbedHosts


class Iperf3Run(Timed):
    """iperf3 over TCP (the raw TCP limit): N client processes, each against its own one-off server."""

    name = "iperf3"
    metrics = {"bw": "B/s", "bw_sent": "B/s", "bytes_sent": "B", "bytes_received": "B", "cpu_local": "%",
               "cpu_remote": "%", "retransmits": "count"}
    primary = "bw"
    tool_column = "iperf3"

    #: parallel client processes, each with its own server port (int, swept): one iperf3 3.x
    #: process runs all its -P streams in one thread, so one process is no limit for several readers
    processes = parameter(POSITIVE_INT, [1], "client processes, one server each")
    #: parallel streams per client, -P (int, swept)
    streams = parameter(POSITIVE_INT, doc="streams per client (-P)")
    #: write/read length in bytes, -l (int, swept): a limit beside a PeerCache tcp point uses its request size;
    #: iperf3 writes at most 1 MiB at a time
    length = parameter(dict(POSITIVE_INT, maximum=iperf3_tool.MAX_LENGTH),
                       doc=f"buffer length in bytes (-l, at most {iperf3_tool.MAX_LENGTH})")
    #: socket buffer per stream in bytes, -w (int or null, swept; null = the kernel's autotuning): a limit
    #: beside a PeerCache tcp point uses the data server's send buffer, which bounds its bytes in flight
    window = parameter(NULLABLE_INT, [None], "socket buffer per stream in bytes (-w) [the kernel's autotuning]")
    #: wrap the client in perf stat (bool)
    perf_stat = PERF_STAT
    #: -R: the server sends, as a GET does (bool)
    reverse = variable(BOOL, False, "reverse (-R): the server sends, as a GET does", tag="R")
    #: -O: run the warm-up seconds first and leave them out of the figures (bool)
    omit_warmup = variable(BOOL, False, "omit (-O) the warm-up seconds from the figures", tag="O")
    #: back-to-back rounds; the point's figures are the best round's (int): a raw limit is the most
    #: the path gave, and one round slowed by a shared machine is not that
    rounds = variable(POSITIVE_INT, 1, "back-to-back rounds; the best round's figures are kept (a limit)")

    @classmethod
    def point_name(cls, one):
        base = f"iperf3_P{one['streams']}_l{sizes(one['length'])}"
        if one["window"] is not None:
            base += f"_w{sizes(one['window'])}"
        return base if one["processes"] == 1 else base.replace("iperf3_", f"iperf3_x{one['processes']}_", 1)

    @classmethod
    def params(cls, one, devices):
        p = {"streams": one["streams"], "length": one["length"], "processes": one["processes"],
             "perf_stat": bool(one["perf_stat"])}
        p.update({k: True for k in ("reverse", "omit_warmup") if one[k]})
        if one["window"] is not None:
            p["window"] = one["window"]
        if one["rounds"] > 1:
            p["rounds"] = one["rounds"]
        return {**p, **timing(one)}

    @classmethod
    def run(cls, pr: PointRun, th: TestbedHosts) -> None:
        rounds = int(pr.point.params.get("rounds", 1))
        one = run_processes if int(pr.point.params.get("processes", 1)) > 1 else run_one
        got = []
        for k in range(rounds):
            rows = one(pr, th)
            if rows is None:         # failed: pr.fail said why
                if rounds > 1:
                    pr.rows[-1].reason = f"round {k + 1} of {rounds}: {pr.rows[-1].reason}"
                return
            got.append(rows)
        pr.rows += best_of(got)
        pr.notes = list(dict.fromkeys(pr.notes))     # each round's NUMA evidence says the same


def _bw(rows: list[Row]) -> float:
    return next((float(r.value) for r in rows if r.metric == "bw" and r.value is not None), 0.0)


def best_of(rounds: list[list[Row]]) -> list[Row]:
    """The rows of the round with the highest ``bw``; its ``bw`` row records every round's figure (B/s) and
    what was done. One round: its rows unchanged."""
    if len(rounds) == 1:
        return rounds[0]
    best = max(rounds, key=_bw)
    figures = [_bw(r) for r in rounds]
    for r in best:
        if r.metric == "bw":
            r.extra = dict(r.extra, rounds_Bps=figures,
                           limit_of=f"best of {len(rounds)} back-to-back rounds "
                                    f"({min(figures) / 1e9:.4g}-{max(figures) / 1e9:.4g} GB/s)")
    return best


def run_one(pr: PointRun, th: TestbedHosts) -> list[Row] | None:
    """One client process against its server: the round's rows, or None (failed; pr.fail said why)."""
    p = pr.point.params
    port = pr.ports.allocate()
    server = iperf3_tool.server_command(port, bind=th.producer_addr)
    secs = max(1, math.ceil(pr.duration))
    omit = max(0, math.ceil(pr.warmup)) if p.get("omit_warmup") else 0
    client, perf_path = pr.perf_wrap(iperf3_tool.client_command(
        th.producer_addr, port, length=p["length"], streams=p["streams"], duration=secs + omit,
        reverse=bool(p.get("reverse")), window=p.get("window")) + (["-O", str(omit)] if omit else []))
    ctx = pr.ctx(tool="iperf3", protocol="tcp", size_bytes=p["length"], qps=p["streams"],
                 host=str(th.consumer), peer=str(th.producer), side="client")
    res, err = pr.pair(server, client, Readiness(port=port, addr=th.producer_addr, timeout=pr.scaled(PORT_READY_S)),
                       th, [])
    pr.record(res)
    if err:
        pr.fail("bw", "B/s", err, **{k: v for k, v in ctx.items() if k not in pr.ctx()})
        return None
    result = iperf3_tool.parse_json(res.client.stdout, source=f"{pr.run_id}/client", host=str(th.consumer))
    mine, pr.rows = pr.rows, []       # the harness adds CPU and perf rows to pr.rows: keep this round's apart
    pr.rows += extract(result, ctx)
    pr.attach_pair_cpu(*pr.pair_window(res))
    pr.perf_rows(th, perf_path, ctx)
    got, pr.rows = pr.rows, mine
    return got


def extract(result: iperf3_tool.Iperf3Result, ctx: dict[str, Any]) -> list[Row]:
    """The client's rows: what arrived (``bw_received``) is the point's ``bw``, the figure comparable to a READ."""
    rows = iperf3_tool.to_rows(result, **ctx)
    for r in rows:
        if r.metric == "bw_received":
            r.metric = "bw"
            # the sender's retransmits beside the figure: a stream that lost segments backed off
            r.extra = dict(r.extra, retransmits=result.retransmits)
    return rows


def run_processes(pr: PointRun, th: TestbedHosts) -> list[Row] | None:
    """N iperf3 client processes, each against its own server, released together; bytes over one window.
    The round's rows, or None (failed; pr.fail said why)."""
    p = pr.point.params
    n, secs = int(p["processes"]), max(1, math.ceil(pr.duration))
    omit = max(0, math.ceil(pr.warmup))
    specs = []
    for i in range(n):
        port = pr.ports.allocate()
        name = f"proc{i}"
        server = pr.cpu_wrap(f"{name}/producer", th, "producer", iperf3_tool.server_command(port, bind=th.producer_addr))
        client = pr.cpu_wrap(f"{name}/consumer", th, "consumer", iperf3_tool.client_command(
            th.producer_addr, port, length=p["length"], streams=p["streams"], duration=secs + omit,
            reverse=bool(p.get("reverse")), window=p.get("window"))
            + ["-O", str(omit)])
        specs.append(GroupSpec(name, [SideSpec(th.consumer, client)], SideSpec(th.producer, server),
                               Readiness(port=port, addr=th.producer_addr, timeout=pr.scaled(PORT_READY_S))))
    results: dict[str, Any] = {}

    def measure(gr) -> WindowBytes:
        c = gr.clients[0]
        r = iperf3_tool.parse_json(c.stdout, source=f"{pr.run_id}/{gr.name}", host=str(th.consumer))
        results[gr.name] = r
        start = c.start + omit            # the omitted warm-up seconds are not in the sums
        return WindowBytes(r.received_bytes, start, start + r.received_seconds)

    runner = GroupRunner(specs, client_timeout=pr.timeout, measure=measure, log_dir=pr.raw_dir,
                         server_timeout=pr.scaled(SERVER_EXIT_S),
                         window_tolerance_s=0.5)
    ctx = pr.ctx(tool="iperf3", protocol="tcp", size_bytes=p["length"], qps=p["streams"], processes=n,
                 host=str(th.consumer), peer=str(th.producer), side="client")
    res, err = pr.run_group(runner)
    if err:
        pr.fail("bw", "B/s", err, **{k: ctx[k] for k in ("tool", "protocol", "size_bytes", "qps",
                                                          "processes")})
        return None
    cpu = {g: pr.cpu_usage({"consumer": f"{g}/consumer", "producer": f"{g}/producer"},
                           w.start, w.end) for g, w in res.windows.items()}
    return [processes_row(res.aggregate, results, cpusample.combine(cpu), ctx)]


def processes_row(agg, results: dict[str, iperf3_tool.Iperf3Result], cpu: dict[str, Any],
                  ctx: dict[str, Any]) -> Row:
    """The ``bw`` row of N client processes (pure): bytes over their shared window (``agg``), each
    process's figure, and what ran as iperf3 reported it (``-R`` where it was used)."""
    reverse = sorted({r.reverse for r in results.values()})
    windows = {r.window for r in results.values()}
    retrans = [r.retransmits for r in results.values()]
    return Row(metric="bw", value=agg.rate_Bps, unit="B/s", raw_value=agg.rate_Bps * 8, raw_unit="bit/s",
               extra={"window_start": agg.window_start, "window_end": agg.window_end,
                      "start_skew_s": agg.start_skew_s, "end_skew_s": agg.end_skew_s,
                      "client_processes": len(results) or ctx.get("processes"), "cpu": cpu,
                      "reverse": reverse[0] if len(reverse) == 1 else None,
                      # -w as iperf3 reported it (None: autotuned, or the processes disagreed)
                      "window": windows.pop() if len(windows) == 1 else None,
                      "retransmits": sum(retrans) if retrans and None not in retrans else None,
                      "version": next((r.version for r in results.values()), None),
                      "per_process_Bps": {g: r.received_bps / 8 for g, r in results.items()}},
               **ctx)
