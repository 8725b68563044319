"""The ``cluster`` kind: a traffic pattern of a shared KV cache over N hosts of a cluster testbed.

Each point places one pattern on the testbed's first ``hosts`` members (:func:`place`):

- **pairwise**: hosts 1, 3, 5 ... serve, hosts 2, 4, 6 ... each read from the host before them;
- **incast** (many -> one): host 1 reads batches spread over every other host's pages;
- **fanout** (one -> many, the hot prefix): every other host reads host 1's pages, the same pages;
- **shared**: every host serves its pages and reads every other host's, with Zipf popularity
  (``zipf_s``), as a shared prefix cache is read.

One ``peercache-bench meta`` on the directory host (the first member with the ``directory`` role) is
the cluster's directory; every ``serve --join`` publishes its own key prefix (its host's name) there
and every ``drive`` reads the prefixes the pattern gives it, verifying every page. All drives measure
one shared, barrier-aligned window (the group runner's start file). Beside it, in the same point,
the raw limit of the same pattern (:mod:`.cluster_raw`): one ``iperf3 -R`` flow (tcp) or one
``ib_read_bw`` pair (rdma, each side on its own host's device) per producer -> consumer link of the
pattern (shared: a ring, each host sending to the next, so every host's link carries one flow each
way), all released together and summed over one window.

Rows: per consumer host (side ``per_host``, ``devices`` = the host's name) its GB/s, batch latency,
hit rate and wrong pages; per host its CPU seconds per GiB it moved; the aggregate over the shared
window with Jain's fairness index over the consumers; and the raw pattern's ``bw`` rows.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psutil

from peercache import atomic
from peercache.bench.document import DRIVE_READY_WORDS
from peercache.lab.launch import redis as redis_launch
from peercache.lab.launch.runners import (FirstSpec, GroupRunner, GroupSpec, Readiness, SideSpec,
                                          WindowBytes)
from peercache.lab.pipeline.points import churn as churn_
from peercache.lab.pipeline.points.cluster_raw import run_raw
from peercache.lab.pipeline.points.bounds import PORT_READY_S, READY_S, SERVER_EXIT_S
from peercache.lab.system.slowness import HOST_COMMAND_S
from peercache.lab.pipeline.points.declare import (POSITIVE_INT, Point, SECONDS, Timed, one_of, parameter, sizes,
                                                   timing, variable)
from peercache.lab.pipeline.points.group import GROUP_DRIVE_READY_S, start_lead
from peercache.lab.pipeline.points.peercache import DIR_CACHE_TTL_S, READY_LINE, read_drive_document
from peercache.lab.tidy import Row

if TYPE_CHECKING:
    from peercache.lab.pipeline.runpoint import PointRun, TestbedHosts

PATTERNS = ("pairwise", "incast", "fanout", "shared", "churn")
#: The directories a cluster point can run with.
DIRECTORIES = ("embedded", "redis", "redis-cluster")
#: What the consumers do: GET pages (verified), or only ask the directory whether their keys exist
#: (``drive --op exists`` with no location cache: every key of every batch is a lookup), which measures
#: the directory's lookups/s and lookup latency against the number of clients the pattern gives it.
OPS = ("get", "exists")
#: Masters of the redis-cluster directory (all on the directory host; no replicas).
CLUSTER_MASTERS = 3
#: What meta prints once its directory listens.
META_READY = r"peercache-bench meta: ready on "
#: Bytes in a GiB (the unit of CPU seconds per GiB moved).
GIB = 1 << 30


class PlacementError(ValueError):
    """A pattern cannot be placed on the testbed's hosts (too few, or a host lacks the role it needs)."""


@dataclass(frozen=True)
class Placement:
    """Who does what in one point: the hosts used, who serves, who reads whose pages, the directory and
    the raw pattern's flows (producer, consumer)."""

    hosts: tuple[str, ...]
    producers: tuple[str, ...]
    reads: dict[str, tuple[str, ...]]        #: consumer -> the producers whose pages it reads
    directory: str
    flows: tuple[tuple[str, str], ...]
    #: the churn pattern's roles (who leaves, crashes and joins), None in the others
    churn: churn_.Roles | None = None

    @property
    def consumers(self) -> tuple[str, ...]:
        return tuple(self.reads)


def place(pattern: str, members: list[tuple[str, tuple[str, ...]]], n: int) -> Placement:
    """The placement of ``pattern`` on the first ``n`` of ``members`` ((name, roles), testbed order) (pure).

    churn: the shared pattern over the first n−1 hosts, whose last two leave and crash during the window,
    and the n-th joins, publishing the crashed host's pages (:mod:`.churn`).

    The directory is the first member (of all) with the ``directory`` role, else the first host used.
    """
    if pattern not in PATTERNS:
        raise PlacementError(f"pattern {pattern!r} is not one of {', '.join(PATTERNS)}")
    if n < 2:
        raise PlacementError(f"a cluster point needs at least 2 hosts, got {n}")
    if len(members) < n:
        raise PlacementError(f"the {pattern} point needs {n} hosts; the testbed has {len(members)}")
    used = members[:n]
    names = tuple(m[0] for m in used)
    roles = dict(used)
    if pattern == "pairwise":
        producers = names[0:2 * (n // 2):2]
        reads = {c: (p,) for p, c in zip(producers, names[1::2])}
        flows = tuple((p, c) for c, (p,) in reads.items())
    elif pattern == "incast":
        producers = names[1:]
        reads = {names[0]: producers}
        flows = tuple((p, names[0]) for p in producers)
    elif pattern == "fanout":
        producers = names[:1]
        reads = {c: producers for c in names[1:]}
        flows = tuple((names[0], c) for c in names[1:])
    elif pattern == "shared":
        producers = names
        reads = {c: tuple(p for p in names if p != c) for c in names}
        flows = tuple((names[i], names[(i + 1) % n]) for i in range(n))
    else:
        try:
            who = churn_.roles(names)
        except ValueError as e:
            raise PlacementError(str(e)) from None
        producers = names[:-1]
        reads = {c: tuple(p for p in producers if p != c) for c in producers}
        flows = ()
        if "producer" not in roles[who.joins]:
            raise PlacementError(f"host {who.joins} joins as a producer in the churn pattern but has roles "
                                 f"{', '.join(roles[who.joins])}; give it the producer role")
    for p in producers:
        if "producer" not in roles[p]:
            raise PlacementError(f"host {p} serves pages in the {pattern} pattern but has roles "
                                 f"{', '.join(roles[p])}; give it the producer role")
    for c in reads:
        if "consumer" not in roles[c]:
            raise PlacementError(f"host {c} reads pages in the {pattern} pattern but has roles "
                                 f"{', '.join(roles[c])}; give it the consumer role")
    directory = next((name for name, r in members if "directory" in r), names[0])
    return Placement(names, producers, reads, directory, flows, who if pattern == "churn" else None)


def jain(values: list[float]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 when every host got the same, 1/n when one got all."""
    sq = sum(v * v for v in values)
    return (sum(values) ** 2) / (len(values) * sq) if values and sq > 0 else None


class ClusterRun(Timed):
    """A traffic pattern of a shared KV cache over N hosts, beside the raw limit of the same pattern."""

    name = "cluster"
    metrics = {"get_throughput": "GB/s", "latency_p50": "us", "latency_p99": "us", "hit_rate": "ratio",
               "verify_failures": "count", "jain_index": "ratio", "cpu_s_per_gib": "s/GiB", "bw": "B/s",
               "hit_rate_dip": "ratio", "recovery_s": "s", "max_stall_s": "s", "errors": "count",
               "lookup_rate": "ops/s"}
    primary = "get_throughput"
    is_get = True
    tool_column = "peercache-bench"

    #: the traffic pattern (str, swept)
    pattern = parameter(one_of(*PATTERNS), doc="pairwise, incast (many->one), fanout (one->many), shared, or churn "
                                               "(shared while producers leave, crash and join)")
    #: hosts the pattern spans (int, swept): the testbed's first N members
    hosts = parameter(dict(POSITIVE_INT, minimum=2), doc="hosts the pattern spans (the testbed's first N)")
    #: Zipf exponents of the shared pattern's key popularity (list of numbers; one point each)
    zipf_s = variable({"type": "array", "minItems": 1, "items": SECONDS}, [0.8, 1.2],
                      "Zipf exponents of the shared pattern (one point each; churn reads with the first)")
    #: the cluster's directory (str, swept): peercache-bench meta (embedded), one redis-server, or a Redis
    #: Cluster of 3 masters, on the directory host
    directory = parameter(one_of(*DIRECTORIES), ["embedded"],
                          "the directory: embedded (meta), redis (one server) or redis-cluster (3 masters)")
    #: what the consumers do (str, swept): get (pages, verified) or exists (directory lookups only)
    op = parameter(one_of(*OPS), ["get"], "get: read and verify pages; exists: only look the keys up (drive --op "
                                          "exists, no location cache): the directory's lookups/s against clients")
    #: data transport (str)
    protocol = variable(one_of("rdma", "tcp"), doc="transport (--protocol)")
    #: page geometry (str)
    layout = variable(one_of("mla", "mha"), "mla", "page layout (--layout)")
    #: bytes per object (int)
    page_size = variable(POSITIVE_INT, 131072, "bytes per object (--page-size)")
    #: keys per GET batch (int)
    batch_size = variable(POSITIVE_INT, 16, "keys per batch (--batch-size)")
    #: pages each producer publishes (int)
    working_set = variable(POSITIVE_INT, 512, "pages each producer publishes (--working-set)")
    #: drive processes per consumer host (int)
    processes = variable(POSITIVE_INT, 1, "drive processes per consumer host (--processes)")
    #: threads per drive process (int)
    threads = variable(POSITIVE_INT, 1, "threads per drive process (--concurrencies)")

    @classmethod
    def expand(cls, scenario, part, devices):
        vals = cls.values(part)
        pts = []
        for directory, op in ((d, o) for d in vals["directory"] for o in vals["op"]):
            for pattern in vals["pattern"]:
                for s in (vals["zipf_s"] if pattern == "shared" else vals["zipf_s"][:1] if pattern == "churn"
                          else [None]):
                    for n in vals["hosts"]:
                        name = (f"cluster_{pattern}" + (f"_z{s:g}" if s is not None else "")
                                + f"_h{n}_{vals['protocol']}_s{sizes(vals['page_size'])}_b{vals['batch_size']}"
                                + ("" if directory == "embedded" else "_" + directory.replace("-", ""))
                                + ("" if op == "get" else f"_{op}"))
                        params = {k: vals[k] for k in ("protocol", "layout", "page_size", "batch_size",
                                                       "working_set", "processes", "threads")}
                        pts.append(Point(scenario, name, cls.name, dict(
                            params, pattern=pattern, hosts=n, directory=directory, op=op,
                            **({"zipf_s": s} if s is not None else {}), **timing(vals)),
                            loopback=part.get("place") == "loopback"))
        return pts

    @classmethod
    def hosts_needed(cls, params: dict[str, Any]) -> int:
        return int(params["hosts"])

    @classmethod
    def run(cls, pr: PointRun, th: TestbedHosts) -> None:
        p = pr.point.params
        members = {m.name: m for m in th.cluster}
        ctx = pr.ctx(tool="peercache-bench", protocol=p["protocol"], layout=p["layout"], size_bytes=p["page_size"],
                     batch=p["batch_size"], threads=p["threads"], processes=p["processes"],
                     extra={"pattern": p["pattern"], "hosts": p["hosts"], "zipf_s": p.get("zipf_s"),
                            "directory": p.get("directory", "embedded"), "op": p.get("op", "get")})
        lookups = p.get("op", "get") == "exists"
        if lookups and p["pattern"] == "churn":
            pr.fail("lookup_rate", "ops/s", "the churn pattern reads pages (op: get); give it no op: exists",
                    side="aggregate", **fail_ctx(ctx))
            return
        try:
            pl = place(p["pattern"], [(m.name, tuple(m.roles)) for m in th.cluster], p["hosts"])
        except PlacementError as e:
            pr.fail("lookup_rate" if lookups else "get_throughput", "ops/s" if lookups else "GB/s", str(e),
                    side="aggregate", **fail_ctx(ctx))
            return
        pr.notes.append(f"placement: directory on {pl.directory}; producers {', '.join(pl.producers)}; "
                        + "; ".join(f"{c} reads {'+'.join(ps)}" for c, ps in pl.reads.items()))
        if pl.flows and not lookups:
            pr.rows += run_raw(pr, th, members, pl, ctx)
        pr.rows += run_peercache(pr, th, members, pl, ctx)


def fail_ctx(ctx: dict[str, Any]) -> dict[str, Any]:
    return {k: ctx[k] for k in ("tool", "protocol", "layout", "size_bytes", "batch", "threads", "processes",
                                "extra")}


def bench_argv(th: TestbedHosts, m) -> list[str]:
    """argv that runs peercache-bench on member ``m``."""
    if th.bench_command and not m.host.on_this_machine:
        return list(th.bench_command)
    return [*m.python, "-m", "peercache.bench.cli"]


def directory_specs(pr: PointRun, th: TestbedHosts, d, kind: str, port: int,
                    workdir: str) -> tuple[list[FirstSpec], list[str], list[str]]:
    """The directory's processes on its host ``d`` (in start order), the flags every serve and drive give
    to reach it, and serve's extra flags (--join for the embedded one)."""
    node = pr.numa_member(f"{d.name}/directory", d)

    def wrapped(label: str, argv: list[str]) -> SideSpec:
        return SideSpec(d.host, pr.cpu_wrap_on(f"{d.name}/{label}", d.host, d.python, argv), node,
                        next(iter(d.devices), None))

    if kind == "embedded":
        meta = [*bench_argv(th, d), "meta", "--discovery-addr", f"{d.address}:{port}"]
        return ([FirstSpec("directory", wrapped("directory", meta),
                           Readiness(pattern=META_READY, timeout=pr.scaled(READY_S)))],
                ["--discovery-addr", f"{d.address}:{port}"], ["--join"])
    # Bound to the directory host's cluster address, so Redis's protected mode wants a password: one for
    # this point only (the stored commands and logs have it masked: peercache.redact).
    password = secrets.token_hex(16)
    url = redis_launch.url_for(port, host=d.address, password=password)
    if kind == "redis":
        server = redis_launch.server_command(port, workdir, bind=d.address, password=password)
        return ([FirstSpec("directory", wrapped("directory", server),
                           Readiness(port=port, addr=d.address, timeout=pr.scaled(PORT_READY_S)))],
                ["--directory", url], [])
    ports = [port] + [pr.ports.allocate() for _ in range(CLUSTER_MASTERS - 1)]
    firsts = [FirstSpec(f"directory{i}", wrapped(f"directory{i}", redis_launch.server_command(
                  p, workdir, bind=d.address, cluster=True, cluster_config=f"nodes-{p}.conf", password=password)),
                        Readiness(port=p, addr=d.address, timeout=pr.scaled(PORT_READY_S)))
              for i, p in enumerate(ports)]
    budget = pr.scaled(READY_S)
    firsts.append(FirstSpec("directory-create", SideSpec(d.host, redis_launch.create_cluster_command(
        d.python, d.address, ports, password, budget)), Readiness(pattern=re.escape(redis_launch.CLUSTER_READY),
                                                                  timeout=budget + 5)))
    return firsts, ["--directory", url], []


def commands(pr: PointRun, th: TestbedHosts, members: dict, pl: Placement, port: int,
             outs: dict[str, str], workdir: str) -> tuple[list[FirstSpec], list[GroupSpec], SideSpec | None]:
    """The directory, per host its serve and/or drive, and the churn pattern's joining serve (None in the
    others) of one point (each under the CPU sampler)."""
    p = pr.point.params
    first, where, join = directory_specs(pr, th, members[pl.directory], p.get("directory", "embedded"), port, workdir)
    common = [*where, "--protocol", p["protocol"], "--layout", p["layout"],
              "--page-size", str(p["page_size"]), "--working-set", str(p["working_set"])]
    def serve_argv(name: str, devs: list[str], prefix: str | None = None) -> list[str]:
        return [*bench_argv(th, members[name]), "serve", *common, *devs, *join, "--bind", members[name].address,
                "--key-prefix", prefix or name, "--readers", "0", "--max-wait", str(int(pr.timeout)), "--quiet"]

    churning = pl.churn is not None
    lookups = p.get("op", "get") == "exists"
    # exists: no location cache, so that every key of every batch asks the directory
    ttl = (0 if lookups else churn_.DIR_CACHE_TTL_S if churning
           else pr.tb.get("dir_cache_ttl", DIR_CACHE_TTL_S))
    groups = []
    for name in pl.hosts:
        m = members[name]
        if churning and name == pl.churn.joins:
            continue
        devs = ["--devices", ",".join(m.devices)] if p["protocol"] == "rdma" and m.devices else []
        server = client = None
        dev = next(iter(m.devices), None)
        if name in pl.producers:
            server = SideSpec(m.host, pr.cpu_wrap_on(f"{name}/producer", m.host, m.python, serve_argv(name, devs)),
                              pr.numa_member(f"{name}/server", m), dev)
        if name in pl.reads:
            drive = [*bench_argv(th, m), "drive", *common, *devs, "--key-prefix", ",".join(pl.reads[name]),
                     "--batch-size", str(p["batch_size"]), "--concurrencies", str(p["threads"]),
                     "--processes", str(p["processes"]), "--duration", str(pr.duration),
                     "--warmup", str(pr.warmup), "--dir-cache-ttl", str(ttl),
                     "--seed", "1", "--start-file", "{start_file}", "--out", outs[name],
                     *(["--op", "exists"] if lookups else []),
                     *(["--access", "zipf", "--zipf-s", f"{p['zipf_s']:g}"] if p.get("zipf_s") else []),
                     *(["--faults-expected", "--timeline-ms", str(churn_.TIMELINE_MS)] if churning else [])]
            if pr.slow > 1:
                drive += ["--ready-timeout", f"{pr.scaled(GROUP_DRIVE_READY_S):.0f}", "--time-scale", f"{pr.slow:.1f}"]
            client = SideSpec(m.host, pr.cpu_wrap_on(f"{name}/consumer", m.host, m.python, drive),
                              pr.numa_member(f"{name}/client", m), dev)
        groups.append(GroupSpec(name, [client] if client else [], server,
                                Readiness(pattern=READY_LINE, timeout=pr.scaled(READY_S)) if server else None))
    joiner = None
    if churning:
        j = members[pl.churn.joins]
        devs = ["--devices", ",".join(j.devices)] if p["protocol"] == "rdma" and j.devices else []
        joiner = SideSpec(j.host, pr.cpu_wrap_on(f"{j.name}/producer", j.host, j.python,
                                                 serve_argv(j.name, devs, pl.churn.prefix)),
                          pr.numa_member(f"{j.name}/server", j), next(iter(j.devices), None))
    return first, groups, joiner


def run_peercache(pr: PointRun, th: TestbedHosts, members: dict, pl: Placement, ctx: dict) -> list[Row]:
    """The pattern through PeerCache: one shared window, every page verified; its rows."""
    outs = {c: f"/tmp/pclab-drive-{uuid.uuid4().hex[:10]}.json" for c in pl.consumers}
    d = members[pl.directory]
    # redis-server's --dir on the directory host (a cluster's nodes-<port>.conf go there), removed after
    workdir = f"/tmp/pclab-directory-{uuid.uuid4().hex[:10]}"
    d.host.run(["mkdir", "-p", workdir], timeout=pr.scaled(HOST_COMMAND_S))
    try:
        return _run_peercache(pr, th, members, pl, ctx, outs, workdir)
    finally:
        d.host.run(["rm", "-rf", workdir], timeout=pr.scaled(HOST_COMMAND_S))


def _run_peercache(pr: PointRun, th: TestbedHosts, members: dict, pl: Placement, ctx: dict, outs: dict[str, str],
                   workdir: str) -> list[Row]:
    first, groups, joiner = commands(pr, th, members, pl, pr.ports.allocate(), outs, workdir)
    lookups = pr.point.params.get("op", "get") == "exists"
    docs: dict[str, dict] = {}
    ready = Readiness(pattern=READY_LINE, timeout=pr.scaled(READY_S))

    one_machine = all(members[n].host.on_this_machine for n in pl.hosts)
    machine: dict[str, Any] = {}

    def during_window(ctl, stop) -> None:
        """Over the measured window (drive's opens after its warm-up from the shared start): this machine's
        CPU time, when every host is on it (namespaces: the kernel's network work is charged to no process
        of the point), and the churn pattern's leave, crash and join at their moments."""
        w0 = ctl.barrier + pr.warmup
        if not ctl.at(w0, stop):
            return
        before = psutil.cpu_times() if one_machine else None
        for event in ("leave", "crash", "join") if pl.churn else ():
            if not ctl.at(w0 + churn_.EVENT_AT[event] * pr.duration, stop):
                return
            if event == "leave":
                ctl.leave(pl.churn.leaves)
            elif event == "crash":
                ctl.crash(pl.churn.crashes)
            else:
                ctl.join(pl.churn.joins, joiner, ready)
        if before is not None and ctl.at(w0 + pr.duration, stop):
            machine.update(busy_cores(before, psutil.cpu_times(), pr.duration))

    def measure(gr) -> WindowBytes:
        (pr.raw_dir / gr.name).mkdir(exist_ok=True)
        doc = read_drive_document(pr.fetch(members[gr.name].host, outs[gr.name]))
        atomic.write_text(pr.raw_dir / gr.name / "drive.json", json.dumps(doc, indent=1))
        docs[gr.name] = doc
        pt = doc["points"][0]
        if pt["status"] != "ok":
            raise RuntimeError(f"{gr.name}: drive failed: {pt['reason']}")
        # exists: the keys looked up stand in for bytes, so the shared window's rate is lookups/s
        return WindowBytes(pt["keys"] if lookups else pt["bytes"], pt["window_start"], pt["window_end"])

    runner = GroupRunner(groups, first=first, server_exits=False, server_timeout=pr.scaled(SERVER_EXIT_S),
                         client_timeout=pr.timeout + start_lead(pr.slow), measure=measure,
                         barrier_lead=start_lead(pr.slow),
                         client_ready=Readiness(pattern=re.escape(DRIVE_READY_WORDS),
                                                timeout=pr.scaled(GROUP_DRIVE_READY_S)),
                         log_dir=pr.raw_dir, window_tolerance_s=max(0.05, 0.02 * pr.slow),
                         events=during_window)
    res, err = pr.run_group(runner)
    for name, f in res.first.items():
        pr.commands[f"{pl.directory}/{name}"] = f.argv
        pr.numa[f"{pl.directory}/{name}"] = f.numa_binding
    pr.merge_numa_choices()
    if err:
        pr.fail("lookup_rate" if lookups else "get_throughput", "ops/s" if lookups else "GB/s", err,
                side="aggregate", **fail_ctx(ctx))
        return []
    agg = res.aggregate
    labels = [f"{h}/{r}" for h in pl.hosts for r in ("producer", "consumer")]
    labels += [f"{pl.directory}/{name}" for name in res.first]
    cpu = pr.cpu_usage({lab: lab for lab in labels}, agg.window_start, agg.window_end)
    if lookups:
        return lookup_rows(pl, docs, agg, cpu, {n: str(members[n].host) for n in pl.hosts}, ctx,
                           [f"{pl.directory}/{name}" for name in res.first],
                           os.cpu_count() if one_machine else None, machine.get("busy_cores"))
    rows = peercache_rows(pl, docs, agg, cpu, {n: str(members[n].host) for n in pl.hosts}, ctx,
                          os.cpu_count() if one_machine else None, machine.get("busy_cores"))
    if pl.churn:
        pr.notes.append("churn events: " + "; ".join(f"{e['event']} {e['group']} at +{e['t'] - agg.window_start:.2f} s"
                                                     for e in res.events))
        rows += churn_rows(pl, docs, agg, res.events, ctx, pr.duration)
    return rows


def churn_rows(pl: Placement, docs: dict[str, dict], agg, events: list[dict], ctx: dict[str, Any],
               window_s: float) -> list[Row]:
    """The churn pattern's rows (pure): each phase's settled hit rate, each event's dip and recovery, each
    consumer's longest stall against its fault bound (one GET's bound, as its drive says), and the errors
    the faults caused."""
    lines = [docs[c]["points"][0].get("timeline") for c in pl.consumers]
    base = dict(ctx, devices=",".join(pl.consumers), host="+".join(pl.consumers), peer="+".join(pl.producers))
    if not all(lines):
        return [Row(metric="hit_rate_dip", value=None, unit="ratio", status="not_measured", side="event",
                    reason="a drive wrote no timeline (is the consumer's peercache-bench older than the lab?)",
                    **base)]
    buckets = churn_.summed(lines)
    at = {e["event"]: e["t"] - agg.window_start for e in events if e["event"] in churn_.EVENT_AT}
    phases = churn_.analyse(buckets, at, window_s)
    series = [[b["t"], round(b["hits"] / b["keys"], 4) if b["keys"] else None] for b in buckets]
    rows = []
    for name, ph in phases.items():
        extra = dict(ctx["extra"], phase=name, **{k: v for k, v in ph.items() if k != "settled_hit_rate"})
        rows.append(Row(metric="hit_rate", value=ph["settled_hit_rate"], unit="ratio", **dict(
            base, side=f"phase:{name}", extra=extra)))
        if "event" in ph:
            ev = dict(base, side=f"event:{ph['event']}", extra=extra)
            rows.append(measured("hit_rate_dip", ph["dip"], "ratio", "no level before the event", **ev))
            rows.append(measured("recovery_s", ph["recovery_s"], "s",
                                 f"the hit rate did not settle within {churn_.SETTLED:g} before the phase ended", **ev))
    for c in pl.consumers:
        tl = docs[c]["points"][0]["timeline"]
        bound = tl.get("fault_bound_s")
        rows.append(Row(metric="max_stall_s", value=tl["max_stall_s"], unit="s", **dict(
            ctx, side="per_host", devices=c, host=c, peer="+".join(pl.reads[c]),
            extra=dict(ctx["extra"], bound_s=bound,
                       within_bound=None if bound is None else tl["max_stall_s"] <= bound))))
    rows.append(Row(metric="errors", value=sum(int(docs[c]["points"][0].get("errors") or 0) for c in pl.consumers),
                    unit="count", **dict(base, side="aggregate", extra=dict(
                        ctx["extra"], timeline=series, events=at, roles=vars(pl.churn),
                        first_errors=[docs[c]["points"][0].get("first_error") for c in pl.consumers
                                      if docs[c]["points"][0].get("first_error")][:3]))))
    return rows


def lookup_rows(pl: Placement, docs: dict[str, dict], agg, cpu: dict[str, Any], specs: dict[str, str],
                ctx: dict[str, Any], directory_labels: list[str], machine_cpus: int | None = None,
                machine_busy: float | None = None) -> list[Row]:
    """The rows of an ``op: exists`` point (pure): per consumer host its lookups/s (keys), batch lookup
    latency and hit rate; the aggregate lookups/s over the shared window (``agg``'s "bytes" are keys here)
    with the clients it came from, Jain's index over the clients, each directory process's CPU (cores)
    and, where every host is on this machine, its CPUs and how many were busy."""
    rows: list[Row] = []
    rates: dict[str, float] = {}
    clients = 0
    for c in pl.consumers:
        pt = docs[c]["points"][0]
        g = agg.groups[c]
        rates[c] = g["bytes"] / g["seconds"]
        clients += int(pt.get("threads") or 1)
        host = dict(ctx, side="per_host", devices=c, host=specs[c], peer="+".join(pl.reads[c]))
        rows.append(Row(metric="lookup_rate", value=rates[c], unit="ops/s", **dict(host, extra=dict(
            ctx["extra"], window_start=g["start"], window_end=g["end"], batch_size=pt.get("batch_size")))))
        lat = pt.get("latency_us") or {}
        for key, metric in (("p50", "latency_p50"), ("p99", "latency_p99")):
            rows.append(measured(metric, lat.get(key), "us", "no batch latency was kept", **host))
        rows.append(measured("hit_rate", pt.get("hit_rate"), "ratio", "drive asked for no key", **host))
    each = {lab.split("/", 1)[1]: round(u["cores"], 3) for lab in directory_labels
            if isinstance(u := cpu.get(lab), dict) and u.get("cores") is not None}
    agg_ctx = dict(ctx, side="aggregate", devices=",".join(pl.consumers), host="+".join(pl.consumers),
                   peer="+".join(pl.producers))
    rows.append(Row(metric="lookup_rate", value=agg.rate_Bps, unit="ops/s", **dict(agg_ctx, extra=dict(
        ctx["extra"], window_start=agg.window_start, window_end=agg.window_end, start_skew_s=agg.start_skew_s,
        end_skew_s=agg.end_skew_s, consumers=len(pl.consumers), clients=clients, directory_host=pl.directory,
        per_host_ops=rates, directory_cores=round(sum(each.values()), 3) if each else None,
        directory_cores_each=each, machine_cpus=machine_cpus, machine_busy_cores=machine_busy, cpu=cpu))))
    rows.append(measured("jain_index", jain(list(rates.values())), "ratio", "no client looked a key up", **agg_ctx))
    keys = sum(docs[c]["points"][0].get("keys", 0) for c in pl.consumers)
    hits = sum((docs[c]["points"][0].get("hit_rate") or 0) * docs[c]["points"][0].get("keys", 0)
               for c in pl.consumers)
    rows.append(measured("hit_rate", hits / keys if keys else None, "ratio", "no drive asked for a key", **agg_ctx))
    return rows


def busy_cores(before, after, seconds: float) -> dict[str, float]:
    """This machine's busy CPUs (everything but idle and iowait, the kernel's network work included) between
    two ``psutil.cpu_times()`` readings ``seconds`` apart."""
    def busy(t) -> float:
        return sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
    return {"busy_cores": round((busy(after) - busy(before)) / seconds, 3)}


def measured(metric: str, value: float | None, unit: str, why: str, **kw: Any) -> Row:
    """A row of ``value``, or not measured with ``why`` when there is none."""
    if value is None:
        return Row(metric=metric, value=None, unit=unit, status="not_measured", reason=why, **kw)
    return Row(metric=metric, value=value, unit=unit, **kw)


def served_bytes(pl: Placement, docs: dict[str, dict]) -> dict[str, float | None]:
    """Bytes each producer served in the window: drive's bytes per key prefix (a prefix is its producer's
    name); None for a producer no drive counted per prefix."""
    out: dict[str, float | None] = {p: 0.0 for p in pl.producers}
    for c, doc in docs.items():
        pt = doc["points"][0]
        by = pt.get("bytes_by_prefix")
        if by is None and len(pl.reads[c]) == 1:
            by = {pl.reads[c][0]: pt["bytes"]}
        for p in pl.reads[c]:
            if by is None or out[p] is None:
                out[p] = None
            else:
                out[p] += float(by.get(p, 0))
    return out


def host_cpu_seconds(cpu: dict[str, Any], host: str) -> float | None:
    """CPU seconds of every process the point ran on ``host`` over the window (None: no samples)."""
    total, seen = 0.0, False
    for label, use in cpu.items():
        if label.split("/")[0] == host and isinstance(use, dict) and use.get("cores") is not None:
            total += use["cores"] * use["seconds"]
            seen = True
    return total if seen else None


def peercache_rows(pl: Placement, docs: dict[str, dict], agg, cpu: dict[str, Any], specs: dict[str, str],
                   ctx: dict[str, Any], machine_cpus: int | None = None,
                   machine_busy: float | None = None) -> list[Row]:
    """Per consumer host and aggregate rows of one pattern run (pure); ``machine_cpus``: the logical CPUs of
    the one machine every host runs on (network namespaces), None when they are machines of their own."""
    rows: list[Row] = []
    rates: dict[str, float] = {}
    served = served_bytes(pl, docs)
    wrong = 0
    hits = keys = 0
    for c in pl.consumers:
        pt = docs[c]["points"][0]
        g = agg.groups[c]
        rates[c] = g["bytes"] / g["seconds"] / 1e9
        wrong += int(pt.get("verify_failures") or 0)
        hits += (pt.get("hit_rate") or 0) * pt.get("keys", 0)
        keys += pt.get("keys", 0)
        host = dict(ctx, side="per_host", devices=c, host=specs[c], peer="+".join(pl.reads[c]))
        extra = dict(ctx["extra"], window_start=g["start"], window_end=g["end"], verified=bool(pt.get("verified")))
        rows.append(Row(metric="get_throughput", value=rates[c], unit="GB/s", **dict(host, extra=extra)))
        lat = pt.get("latency_us") or {}
        for key, metric in (("p50", "latency_p50"), ("p99", "latency_p99")):
            rows.append(measured(metric, lat.get(key), "us", "no batch latency was kept", **host))
        rows.append(measured("hit_rate", pt.get("hit_rate"), "ratio", "drive asked for no key", **host))
        rows.append(Row(metric="verify_failures", value=int(pt.get("verify_failures") or 0), unit="count", **host))
    host_cpu = {h: host_cpu_seconds(cpu, h) for h in pl.hosts}
    for h in pl.hosts:
        moved = (docs[h]["points"][0]["bytes"] if h in docs else 0.0)
        srv = served.get(h, 0.0)
        secs = host_cpu[h]
        base = dict(ctx, side="per_host", devices=h, host=specs[h], peer="")
        if pl.churn and h == pl.churn.joins:
            rows.append(Row(metric="cpu_s_per_gib", value=None, unit="s/GiB", status="not_measured",
                            reason=f"it joined during the window; the bytes it served are counted under the "
                                   f"prefix it took over ({pl.churn.prefix})", **base))
            continue
        if srv is None or secs is None or moved + srv <= 0:
            why = ("no CPU samples in the window" if secs is None else
                   "drive did not count the bytes it read from this host" if srv is None else "the host moved nothing")
            rows.append(Row(metric="cpu_s_per_gib", value=None, unit="s/GiB", status="not_measured", reason=why, **base))
            continue
        rows.append(Row(metric="cpu_s_per_gib", value=secs / ((moved + srv) / GIB), unit="s/GiB",
                        **dict(base, extra=dict(ctx["extra"], cpu_s=secs, read_bytes=moved, served_bytes=srv))))
    agg_ctx = dict(ctx, side="aggregate", devices=",".join(pl.consumers), host="+".join(pl.consumers),
                   peer="+".join(pl.producers))
    total_cpu = sum(s for s in host_cpu.values() if s is not None)
    rows.append(Row(metric="get_throughput", value=agg.rate_Bps / 1e9, unit="GB/s", **dict(agg_ctx, extra=dict(
        ctx["extra"], window_start=agg.window_start, window_end=agg.window_end, start_skew_s=agg.start_skew_s,
        end_skew_s=agg.end_skew_s, consumers=len(pl.consumers), producers=len(pl.producers),
        directory_host=pl.directory, verified=all(d["points"][0].get("verified") for d in docs.values()),
        per_host_GBps=rates, served_bytes=served, machine_cpus=machine_cpus, machine_busy_cores=machine_busy, cpu=cpu,
        cpu_s=total_cpu))))
    rows.append(measured("jain_index", jain(list(rates.values())), "ratio", "no consumer moved a byte", **agg_ctx))
    rows.append(measured("hit_rate", hits / keys if keys else None, "ratio", "no drive asked for a key", **agg_ctx))
    rows.append(Row(metric="verify_failures", value=wrong, unit="count", **agg_ctx))
    gib = agg.total_bytes / GIB
    rows.append(measured("cpu_s_per_gib", total_cpu / gib if gib > 0 and total_cpu > 0 else None, "s/GiB",
                         "no CPU samples in the window, or nothing moved", **agg_ctx))
    return rows
