"""The raw limit of a cluster pattern, measured in the same point as PeerCache's run of it.

One process pair per (producer, consumer) link of the pattern (``Placement.flows``), all released together by
one :class:`GroupRunner` and summed over one window (:func:`run_raw`, rows by :func:`raw_rows`); the tool is
the protocol's (:data:`RAW_FORMS`):

- tcp: ``iperf3 -R``, the consumer's client receiving what the producer's server sends;
- rdma: ``ib_read_bw``, the server on the producer with its own device, the client on the consumer with its
  own, READing the producer's memory as PeerCache's GET does, one message a page.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

from peercache.lab.errors import ToolError
from peercache.lab.launch.runners import GroupResult, GroupRunner, GroupSpec, Readiness, SideSpec, WindowBytes
from peercache.lab.pipeline.points.bounds import PORT_READY_S, SERVER_EXIT_S
from peercache.lab.pipeline.points.perftest import PERFTEST_READY_S
from peercache.lab.tidy import Row
from peercache.lab.tools import iperf3 as iperf3_tool
from peercache.lab.tools import perftest as pt

if TYPE_CHECKING:
    from peercache.lab.pipeline.points.cluster import Placement
    from peercache.lab.pipeline.runpoint import ClusterMember, PointRun, TestbedHosts


@dataclass(frozen=True)
class RawForm:
    """How the raw pattern of one protocol is measured: the tool of its rows, and what was run, in words."""

    tool: str      #: the rows' tool
    how: str       #: what was run, for a report's note: "iperf3 -R, one flow per link of the pattern"


#: protocol -> how its raw pattern is measured (the one table of them: the run and the report read it).
RAW_FORMS = {"tcp": RawForm("iperf3", "iperf3 -R, one TCP flow per link of the pattern"),
             "rdma": RawForm("ib_read_bw", "ib_read_bw, one pair per link of the pattern (the consumer READs the "
                                           "producer's memory, each over its own device, one page a message)")}
#: The tools of the raw patterns' rows.
RAW_TOOLS = frozenset(f.tool for f in RAW_FORMS.values())

#: The prefix that runs a command with its stdout line-buffered (coreutils' stdbuf): into a pipe perftest's stdout
#: is block-buffered, so all its lines would arrive at its exit; line-buffered, each arrives as it is printed.
LINE_BUFFERED = ("stdbuf", "-oL")
#: Seconds the flows' windows may differ at their starts or their ends on a plain machine ...
RAW_WINDOW_TOLERANCE_S = 0.5
#: ... and, on slower hosts, per unit of slowness (the larger of the two counts).
RAW_WINDOW_TOLERANCE_PER_SLOW_S = 0.1


def raw_window_tolerance(slow: float) -> float:
    """Seconds the raw flows' windows may differ at start or end (pure): the group runner's tolerance."""
    return max(RAW_WINDOW_TOLERANCE_S, RAW_WINDOW_TOLERANCE_PER_SLOW_S * slow)


def flow_names(pl: Placement) -> dict[str, tuple[str, str]]:
    """group name -> (producer, consumer) of each flow of the pattern (pure)."""
    return {f"raw{i}_{prod}_to_{cons}": (prod, cons) for i, (prod, cons) in enumerate(pl.flows)}


def run_raw(pr: PointRun, th: TestbedHosts, members: dict, pl: Placement, ctx: dict) -> list[Row]:
    """The raw limit of the pattern: one pair of the protocol's tool per (producer, consumer) of ``pl.flows``,
    released together and summed over one window; rows ``bw`` per consumer host and aggregate."""
    p = pr.point.params
    form = RAW_FORMS[p["protocol"]]
    flows = flow_names(pl)
    rdma = p["protocol"] == "rdma"
    raw_ctx = dict(ctx, tool=form.tool, protocol=p["protocol"], size_bytes=p["page_size"] if rdma else None,
                   qps=1 if rdma else None, batch=None, threads=None, processes=None)
    agg, err = (_run_ib_read_bw if rdma else _run_iperf3)(pr, members, flows)
    if err:
        return [Row(metric="bw", value=None, unit="B/s", status="failed", reason=f"raw pattern: {err}",
                    side="aggregate", **raw_ctx)]
    return raw_rows(pl, flows, agg, {n: str(members[n].host) for n in pl.hosts}, raw_ctx)


def _run_group(pr: PointRun, flows: Mapping[str, tuple[str, str]], specs: list[GroupSpec],
               measure: Callable[[GroupResult], WindowBytes]) -> tuple[Any, str | None]:
    """Run the flows' groups once; (the run's result, None), or (what there is, why it failed). The CPU samples
    of every side are read back (and removed from their hosts) either way."""
    runner = GroupRunner(specs, client_timeout=pr.timeout, measure=measure, log_dir=pr.raw_dir / "raw",
                         server_timeout=pr.scaled(SERVER_EXIT_S), window_tolerance_s=raw_window_tolerance(pr.slow))
    res, err = pr.run_group(runner)
    cpu_labels = {f"{n}/{r}": f"{n}/{r}" for n in flows for r in ("producer", "consumer")}
    if err:
        pr.cpu_usage(cpu_labels, None, None)
    else:
        pr.cpu_usage(cpu_labels, res.aggregate.window_start, res.aggregate.window_end)
    return res, err


def _run_iperf3(pr: PointRun, members: dict[str, ClusterMember],
                flows: Mapping[str, tuple[str, str]]) -> tuple[Any, str | None]:
    """tcp: one ``iperf3 -R`` per flow; (the aggregate, None) or (None, why not)."""
    p = pr.point.params
    secs, omit = max(1, math.ceil(pr.duration)), max(0, math.ceil(pr.warmup))
    specs = []
    for name, (prod, cons) in flows.items():
        port = pr.ports.allocate()
        pm, cm = members[prod], members[cons]
        server = pr.cpu_wrap_on(f"{name}/producer", pm.host, pm.python,
                                iperf3_tool.server_command(port, bind=pm.address))
        client = pr.cpu_wrap_on(f"{name}/consumer", cm.host, cm.python, iperf3_tool.client_command(
            pm.address, port, length=min(p["page_size"] * p["batch_size"], iperf3_tool.MAX_LENGTH),
            streams=1, duration=secs + omit, reverse=True) + ["-O", str(omit)])
        specs.append(GroupSpec(name, [SideSpec(cm.host, client)], SideSpec(pm.host, server),
                               Readiness(port=port, addr=pm.address, timeout=pr.scaled(PORT_READY_S))))

    def measure(gr) -> WindowBytes:
        c = gr.clients[0]
        r = iperf3_tool.parse_json(c.stdout, source=f"{pr.run_id}/{gr.name}", host=c.host)
        start = c.start + omit
        return WindowBytes(r.received_bytes, start, start + r.received_seconds)

    res, err = _run_group(pr, flows, specs, measure)
    return (None, err) if err else (res.aggregate, None)


def raw_perftest_params(page_size: int, duration: float, warmup: float, gid_index: int | None,
                        qp_timeout: int | None) -> pt.PerftestParams:
    """The ``ib_read_bw`` every flow of an rdma point runs, its device and port set per side and flow (pure): one
    QP, a page a message, perftest's own margin the point's warm-up (whole seconds, as -f takes them) at each
    end of a -D run whose sample is the point's duration (whole seconds, at least one), and -F.

    -F: the rows never use perftest's cycle counter (:func:`perftest_window`), so a pair whose perftest cannot
    calibrate it (a loaded or emulated CPU: over rxe in the 2-CPU TCG guest a fan-out's two busy-polling
    clients failed it in eight whole-group runs in a row) still reports its READs, rather than exiting with no
    report. That is the rule for a group here, not the perftest kind's rerun: a rerun costs the whole group's
    run for a figure that does not need the clock, and its odds shrink with every pair (each must calibrate).
    """
    margin, sample = max(0, math.ceil(warmup)), max(1, math.ceil(duration))
    return pt.PerftestParams(tool="ib_read_bw", gid_index=gid_index, qp_timeout=qp_timeout, qps=1, size=page_size,
                             duration=sample + 2 * margin, margin=margin, report_gbits=True, ignore_cpu_freq=True)


def perftest_window(result: pt.PerftestResult, params: pt.PerftestParams, text: str,
                    line_at: Callable[[int], float | None], source: str) -> WindowBytes:
    """The bytes one ``ib_read_bw`` client counted and where its sample lay in wall-clock time (pure, given
    ``line_at``: when line N of its stdout ``text`` arrived, epoch s; :meth:`SideResult.stdout_line_at`).

    Bytes: the printed ``#iterations`` (completions inside the sample) x the message size, the numerator of
    perftest's own average. Length: the sample's, ``duration - 2 x margin`` s, timed by ``alarm(2)``
    (:func:`perftest.sample_window`), not perftest's cycle counter, whose calibration an emulated or loaded
    host can get wrong (-F keeps such a run going, its averages 0.00). Place: perftest prints no time, but
    it prints its result table's header right before it enters its transfer loop (read_bw.c: after the last
    QP handshake, then ``run_iter_bw`` arms the first alarm) and the result row right after the loop, so,
    line-buffered (:data:`LINE_BUFFERED`), the header's arrival is the loop's start, give or take a pipe
    read's wake-up, and the sample starts ``margin`` s later. The process's own start and end are no guide:
    before the loop come its CPU sampler's start, the device opened, the buffer registered and the QPs
    exchanged, after it the teardown; in the 2-CPU TCG guest an ``ib_read_bw -D 4`` lived 8 s (its sampler's
    record), its sampler having started it seconds after its own start.
    """
    rows = [r for r in result.rows if r.table == "main"]
    if len(rows) != 1:
        raise ValueError(f"{source}: ib_read_bw printed {len(rows)} result rows, expected one (-s, not -a)")
    row = rows[0]
    if row.iterations == 0:
        raise ValueError(f"{source}: ib_read_bw completed 0 READs in its {params.duration} s run: nothing was "
                         "measured; read its log, lengthen the testbed's duration")
    lines = text.splitlines()
    if row.line_no < 2 or not lines[row.line_no - 2].lstrip().startswith("#bytes"):
        raise ValueError(f"{source}: ib_read_bw's result row (line {row.line_no}) does not follow its table header, "
                         "so its loop cannot be placed in time; read its log")
    header_at, row_at = line_at(row.line_no - 1), line_at(row.line_no)
    if header_at is None or row_at is None or row_at - header_at < params.duration / 2:
        raise ValueError(f"{source}: ib_read_bw's table header and result row reached the pipe together, not its "
                         f"-D {params.duration} s apart, so its loop cannot be placed in time: its stdout was not "
                         f"line-buffered; check that {LINE_BUFFERED[0]} (coreutils) runs on that host")
    lead, sample = pt.sample_window(params)
    return WindowBytes(float(row.iterations) * row.size_bytes, header_at + lead, header_at + lead + sample)


def raw_failure(groups: Mapping[str, GroupResult], tool: str) -> ToolError | None:
    """What made a raw group run fail, in perftest's own classified words (pure), or None when no side says.

    The clients count first: a server's failure is then a consequence ("the peer ended the exchange"), and
    may be seen first, since each side exits through its CPU sampler, so the runner can stop a client that
    had already said why it failed. A side the runner stopped counts by what it said (a known failure), not
    by its signal; one that exited 0 did not fail. The servers count only where no client says.
    """
    def said(sides) -> ToolError | None:
        for name, role, s in sides:
            if s is None or s.rc in (None, 0):
                continue
            te = pt.classify_failure(s.stdout + s.stderr, s.rc, f"{s.host} ({name}'s {role})", tool)
            if te is not None and not (s.stopped and te.kind == "failed"):
                return te
        return None

    return (said((n, "client", c) for n, g in groups.items() for c in g.clients)
            or said((n, "server", g.server) for n, g in groups.items()))


def _run_ib_read_bw(pr: PointRun, members: dict[str, ClusterMember],
                    flows: Mapping[str, tuple[str, str]]) -> tuple[Any, str | None]:
    """rdma: one ``ib_read_bw`` pair per flow; (the aggregate, None) or (None, why not: perftest's own words
    where a side said them). Run once: a clock perftest cannot calibrate fails nothing here (-F,
    :func:`raw_perftest_params`)."""
    base = raw_perftest_params(pr.point.params["page_size"], pr.duration, pr.warmup, pr.tb.get("gid_index"),
                               pr.tb.get("qp_timeout"))
    specs, used = [], {}
    for name, (prod, cons) in flows.items():
        pm, cm = members[prod], members[cons]
        pdev, cdev = (pm.devices[0] if pm.devices else None), (cm.devices[0] if cm.devices else None)
        # each side names its own host's device (None: perftest's first one)
        used[name] = dataclasses.replace(base, tcp_port=pr.ports.allocate())
        server = pr.cpu_wrap_on(f"{name}/producer", pm.host, pm.python,
                                pt.server_command(dataclasses.replace(used[name], device=pdev)))
        client = pr.cpu_wrap_on(f"{name}/consumer", cm.host, cm.python, [
            *LINE_BUFFERED, *pt.client_command(dataclasses.replace(used[name], device=cdev), pm.address)])
        # Readiness is the server's listening exchange port (read with ss, never connected to): perftest's
        # stdout is block-buffered into a pipe, so its "Waiting for client" line shows only at its exit.
        specs.append(GroupSpec(name, [SideSpec(cm.host, client, device=cdev)], SideSpec(pm.host, server, device=pdev),
                               Readiness(port=used[name].tcp_port, addr=pm.address,
                                         timeout=pr.scaled(PERFTEST_READY_S))))
    own: dict[str, float | None] = {}

    def measure(gr) -> WindowBytes:
        c = gr.clients[0]
        source = f"{pr.run_id}/{gr.name}"
        result = pt.parse_output(c.stdout, source=source)
        window = perftest_window(result, used[gr.name], c.stdout, c.stdout_line_at, source)
        own[gr.name] = result.rows[0].bw_average_Bps
        return window

    res, err = _run_group(pr, flows, specs, measure)
    if err:
        te = raw_failure(res.groups, "ib_read_bw")
        return None, str(te) if te else err
    pr.notes.append("raw pattern: ib_read_bw's own averages (its cycle counter over its sample; the rows count its "
                    "READs over the alarm-timed sample): " + ", ".join(
                        f"{n} {b / 1e9:.3f} GB/s" if b else f"{n} 0.00 (its cycle counter could not be calibrated)"
                        for n, b in own.items()))
    return res.aggregate, None


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
