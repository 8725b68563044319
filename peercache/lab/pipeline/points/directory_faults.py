"""The ``directory_faults`` kind: the directory's own failure under load, one point per form and fault.

Forms and their faults (:data:`FAULTS`):

- **embedded** (``peercache-bench meta`` as the directory): ``restart``: SIGKILL it, wait :data:`DOWN_S`,
  start the same command again at the same address;
- **redis** (one redis-server without persistence): ``restart``: SIGKILL it and start it again at once,
  empty;
- **sentinel** (a master, its replica and three sentinels, ``--directory redis+sentinel://...``; failure
  detection and failover timeout from :mod:`peercache.lab.launch.redis`): ``kill`` (SIGKILL the master),
  ``stop`` (SIGSTOP the master for longer than the failover timeout, then SIGCONT: it must come back as a
  replica of the new master; its role is polled and recorded) and ``failover`` (``SENTINEL FAILOVER``);
- **redis-cluster** (3 masters and 3 replicas): ``kill`` (SIGKILL the master holding the most keys) and
  ``failover`` (``CLUSTER FAILOVER`` on that master's replica).

On a pair testbed the directory's processes and two producers (``serve --key-prefix pA`` / ``pB``,
``--readers 0``) run on the producer host; the consumers (``drive --key-prefix pA,pB --faults-expected
--timeline-ms 100 --dir-cache-ttl 0``, every page verified) and the directory watcher
(:mod:`peercache.lab.tools.dirwatch`: how many of the producers' entries the directory resolves, every
100 ms) on the consumer host. The directory's processes start first (:class:`FirstSpec`), every drive
measures one shared window (the group runner) and the fault is an event (:class:`EventControl`) at
:attr:`DirectoryFaultsRun.fault_at` of that window.

Rows (:func:`fault_rows`): from the consumers' summed timeline the hit rate before the fault, the time
reads were failing or missing after it (``unavailable_s``) and the time until the hit rate was back within
:data:`RATE_TOLERANCE` of its level before the fault and stayed there (``recovery_s``); from the watcher
the entries lost (before the fault minus the fewest resolved after it, per producer; all of a producer's
when the directory told it that it had forgotten it) and republished (the last count minus what
survived), the time until the directory answered again and until every entry was back, and how often each
producer registered again (it says so in its log: the directory had forgotten it); the wrong
pages, errors, each consumer's longest stall against its drive's fault bound; for ``stop`` the time the
old master took to report itself a replica after SIGCONT. The aggregate ``unavailable_s`` row keeps the
hit rate, GB/s and errors per bucket, the fault's moment and the watcher's counts for the report.
"""
from __future__ import annotations

import json
import re
import secrets
import signal
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from peercache import atomic
from peercache.bench.document import DRIVE_READY_WORDS
from peercache.lab.launch import redis as redis_launch
from peercache.lab.launch.runners import FirstSpec, GroupRunner, GroupSpec, Readiness, SideSpec, WindowBytes
from peercache.lab.pipeline.points import churn as churn_
from peercache.lab.pipeline.points.cluster import CLUSTER_MASTERS, META_READY, bench_argv, fail_ctx, measured
from peercache.lab.pipeline.points.bounds import PORT_READY_S, READY_S, SERVER_EXIT_S
from peercache.lab.pipeline.points.declare import (POSITIVE_INT, SECONDS, Point, Timed, one_of, parameter, sizes,
                                                   timing, variable)
from peercache.lab.pipeline.points.group import GROUP_DRIVE_READY_S, start_lead
from peercache.lab.pipeline.points.peercache import READY_LINE, read_drive_document
from peercache.lab.system.slowness import HOST_COMMAND_S
from peercache.lab.tidy import Row
from peercache.lab.tools import dirwatch

if TYPE_CHECKING:
    from peercache.lab.pipeline.runpoint import PointRun, TestbedHosts

#: Each form of the directory and the faults it is put through.
FAULTS: dict[str, tuple[str, ...]] = {
    "embedded": ("restart",),
    "redis": ("restart",),
    "sentinel": ("kill", "stop", "failover"),
    "redis-cluster": ("kill", "failover"),
}
FORMS = tuple(FAULTS)
ALL_FAULTS = ("restart", "kill", "stop", "failover")
#: What each fault does, in words (the report's tables and figures say it).
FAULT_TEXT = {
    ("embedded", "restart"): "meta SIGKILLed, started again at the same address",
    ("redis", "restart"): "redis-server SIGKILLed, started again empty",
    ("sentinel", "kill"): "master SIGKILLed",
    ("sentinel", "stop"): "master SIGSTOPped past the failover timeout, then SIGCONT",
    ("sentinel", "failover"): "SENTINEL FAILOVER",
    ("redis-cluster", "kill"): "the master with the most keys SIGKILLed",
    ("redis-cluster", "failover"): "CLUSTER FAILOVER on that master's replica",
}
#: The producers' --heartbeat-timeout (s, before the machine's slowness) on a Redis Cluster: above its takeover
#: (node timeout 2 s, the replica's election and the clients' new slot map: 4.1-5.1 s measured here), as
#: docs/directory.md advises operators. With the default 5 s, registrations whose keys lived on the dead
#: master expired during the takeover and, on a loaded machine, were not all back within the window.
CLUSTER_HEARTBEAT_TIMEOUT_S = 10.0
#: The producers' key prefixes (one serve each, on the producer host).
PREFIXES = ("pA", "pB")
#: Seconds the embedded directory stays dead before it is started again.
DOWN_S = 1.0
#: A SIGSTOPped master stays stopped this long beyond the sentinels' failover timeout.
STOP_BEYOND_S = 0.5
#: Seconds (on a plain machine) a SIGCONTed old master may take to report itself a replica: Sentinel
#: reconfigures a returning old master once it has reported the wrong role for 4 x its 2 s publish period
#: (about 10 s measured here), polled from its SIGCONT.
DEMOTE_S = 25.0
#: How often the old master's role is asked.
ROLE_POLL_S = 0.2
#: A bucket is back when its hit rate is within this of the level before the fault.
RATE_TOLERANCE = 0.02
#: Buckets from the recovery to the window's end, at least, for the recovery to count.
MIN_RECOVERED_BUCKETS = 3
#: drive's timeline bucket (ms), and the watcher's interval.
TIMELINE_MS = churn_.TIMELINE_MS
#: The sentinel service's name.
SERVICE = redis_launch.SENTINEL_SERVICE
#: Sentinels, and the quorum that must deem the master down.
SENTINELS = redis_launch.SENTINELS


@dataclass
class Directory:
    """One form's directory on its host: its processes (in start order), how serve and drive reach it, and
    what its faults need to find their targets."""

    form: str
    firsts: list[FirstSpec]
    flags: list[str]                 #: serve's and drive's --discovery-addr / --directory
    serve_flags: list[str]           #: serve's own extra flags (--join for the embedded directory, a cluster's
    #: longer --heartbeat-timeout)
    spec: str                        #: the watcher's --directory
    #: redis-server process name -> its port (sentinel: master, replica; redis-cluster: redis1 ... redis6)
    ports: dict[str, int] = field(default_factory=dict)
    sentinel_ports: list[int] = field(default_factory=list)
    password: str | None = None


class DirectoryFaultsRun(Timed):
    """A directory's failure under a verifying read, for each form of the directory."""

    name = "directory_faults"
    metrics = {"unavailable_s": "s", "recovery_s": "s", "entries_lost": "count", "entries_republished": "count",
               "directory_back_s": "s", "republished_s": "s", "verify_failures": "count", "errors": "count",
               "hit_rate": "ratio", "get_throughput": "GB/s", "max_stall_s": "s", "old_master_demoted_s": "s"}
    primary = "unavailable_s"
    is_get = False
    tool_column = "peercache-bench"

    #: the directory (str, swept): embedded (meta), redis (one server), sentinel (master, replica and three
    #: sentinels) or redis-cluster (3 masters, 3 replicas)
    form = parameter(one_of(*FORMS), doc="the directory: embedded, redis, sentinel or redis-cluster")
    #: the faults (str, swept; each form runs those of FAULTS it has)
    fault = parameter(one_of(*ALL_FAULTS), list(ALL_FAULTS),
                      "restart (embedded, redis), kill, stop, failover (sentinel; kill and failover for "
                      "redis-cluster); a form runs those it has")
    #: data transport (str)
    protocol = variable(one_of("rdma", "tcp", "shm"), "tcp", "transport (--protocol)")
    #: page geometry (str)
    layout = variable(one_of("mla", "mha"), "mla", "page layout (--layout)")
    #: bytes per object (int)
    page_size = variable(POSITIVE_INT, 16384, "bytes per object (--page-size)")
    #: keys per GET batch (int)
    batch_size = variable(POSITIVE_INT, 8, "keys per batch (--batch-size)")
    #: pages each of the two producers publishes (int)
    working_set = variable(POSITIVE_INT, 256, "pages each producer publishes (--working-set)")
    #: verifying drives on the consumer host (int, 1 or 2)
    consumers = variable(dict(POSITIVE_INT, maximum=2), 2, "verifying drives on the consumer host (1 or 2)")
    #: when the fault happens (fraction of the measured window)
    fault_at = variable({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}, 0.25,
                        "when the fault happens, as a fraction of the measured window")
    #: seconds the embedded directory stays dead before it is started again
    down_s = variable(SECONDS, DOWN_S, "seconds the embedded directory is dead before its restart")

    @classmethod
    def expand(cls, scenario, part, devices):
        vals = cls.values(part)
        pts = []
        for form in vals["form"]:
            for fault in (f for f in vals["fault"] if f in FAULTS[form]):
                name = (f"dirfault_{form.replace('-', '')}_{fault}_{vals['protocol']}_s{sizes(vals['page_size'])}"
                        f"_b{vals['batch_size']}")
                params = {k: vals[k] for k in ("protocol", "layout", "page_size", "batch_size", "working_set",
                                               "consumers", "fault_at", "down_s")}
                pts.append(Point(scenario, name, cls.name, dict(params, form=form, fault=fault, **timing(vals)),
                                 loopback=part.get("place") == "loopback"))
        return pts

    @classmethod
    def run(cls, pr: PointRun, th: TestbedHosts) -> None:
        p = pr.point.params
        ctx = pr.ctx(tool="peercache-bench", protocol=p["protocol"], layout=p["layout"], size_bytes=p["page_size"],
                     batch=p["batch_size"], threads=1, processes=1,
                     extra={"form": p["form"], "fault": p["fault"], "what": FAULT_TEXT[(p["form"], p["fault"])]})
        if p["fault"] not in FAULTS[p["form"]]:
            pr.fail(cls.primary, "s", f"the {p['form']} directory has no fault {p['fault']!r}; give one of "
                                      f"{', '.join(FAULTS[p['form']])}", side="aggregate", **fail_ctx(ctx))
            return
        prod, cons = _pair_members(th)
        if p["form"] != "embedded" and not all(prod.host.which(b) for b in ("redis-server", "redis-cli")):
            pr.fail(cls.primary, "s", f"redis-server or redis-cli is not on {prod.host.spec}'s PATH; "
                                      f"{redis_launch.INSTALL_HINT}", side="aggregate", **fail_ctx(ctx))
            return
        workdir = f"/tmp/pclab-directory-{uuid.uuid4().hex[:10]}"
        prod.host.run(["mkdir", "-p", workdir], timeout=pr.scaled(HOST_COMMAND_S))
        try:
            pr.rows += run_point(pr, th, prod, cons, ctx, workdir)
        finally:
            prod.host.run(["rm", "-rf", workdir], timeout=pr.scaled(HOST_COMMAND_S))


def _pair_members(th: TestbedHosts):
    """The producer and consumer hosts of the testbed (its pair: a cluster testbed's first two of each role)."""
    prod = next((m for m in th.cluster if "producer" in m.roles), th.cluster[0])
    cons = next((m for m in th.cluster if "consumer" in m.roles and m is not prod), th.cluster[-1])
    return prod, cons


def directory_for(pr: PointRun, th: TestbedHosts, d, form: str, workdir: str) -> Directory:
    """The ``form`` directory's processes on member ``d`` (in start order) and how to reach it; makes each
    redis-server's folder under ``workdir`` and writes the sentinels' config files there."""
    node = pr.numa_member(f"{d.name}/directory", d)      # the choice, once for all its processes
    addr = d.address

    def side(argv: list[str]) -> SideSpec:
        return SideSpec(d.host, argv, node, next(iter(d.devices), None))

    def port_ready(port: int) -> Readiness:
        return Readiness(port=port, addr=addr, timeout=pr.scaled(PORT_READY_S))

    if form == "embedded":
        port = pr.ports.allocate()
        meta = [*bench_argv(th, d), "meta", "--discovery-addr", f"{addr}:{port}"]
        return Directory(form, [FirstSpec("directory", side(meta), Readiness(pattern=META_READY,
                                                                              timeout=pr.scaled(READY_S)))],
                         ["--discovery-addr", f"{addr}:{port}"], ["--join"], f"{addr}:{port}")
    # Bound to the host's testbed address, so Redis's protected mode wants a password: one for this point
    # only (masked in the stored commands and logs: peercache.redact)
    password = secrets.token_hex(16)
    if form == "redis":
        port = pr.ports.allocate()
        _mkdirs(pr, d, workdir, ["directory"])
        server = redis_launch.server_command(port, f"{workdir}/directory", bind=addr, password=password)
        url = redis_launch.url_for(port, host=addr, password=password)
        return Directory(form, [FirstSpec("directory", side(server), port_ready(port))], ["--directory", url], [],
                         url, {"directory": port}, password=password)
    budget = pr.scaled(READY_S)
    if form == "sentinel":
        mport, rport = pr.ports.allocate(), pr.ports.allocate()
        sports = [pr.ports.allocate() for _ in range(SENTINELS)]
        _mkdirs(pr, d, workdir, ["master", "replica", "sentinels"])
        firsts = [FirstSpec("master", side(redis_launch.server_command(mport, f"{workdir}/master", bind=addr,
                                                                       password=password)), port_ready(mport)),
                  FirstSpec("replica", side(redis_launch.server_command(
                      rport, f"{workdir}/replica", bind=addr, replicaof=(addr, mport), password=password)),
                      port_ready(rport))]
        for i, sp in enumerate(sports, 1):
            conf = f"{workdir}/sentinels/sentinel-{sp}.conf"
            _write(pr, d, conf, redis_launch.sentinel_config(
                sp, mport, f"{workdir}/sentinels", quorum=SENTINELS // 2 + 1, service=SERVICE, bind=addr,
                master_host=addr, password=password))
            firsts.append(FirstSpec(f"sentinel{i}", side(redis_launch.sentinel_command(conf)), port_ready(sp)))
        firsts.append(FirstSpec("sentinels-ready", SideSpec(d.host, redis_launch.wait_sentinels_command(
            d.python, addr, sports, mport, budget, service=SERVICE, replicas=1, password=password)),
            Readiness(pattern=re.escape(redis_launch.SENTINELS_SEE_ALL), timeout=budget + 5)))
        url = redis_launch.sentinel_url_for(sports, SERVICE, host=addr, password=password)
        return Directory(form, firsts, ["--directory", url], [], url, {"master": mport, "replica": rport}, sports,
                         password)
    ports = [pr.ports.allocate() for _ in range(2 * CLUSTER_MASTERS)]
    names = [f"redis{i}" for i in range(1, len(ports) + 1)]
    _mkdirs(pr, d, workdir, names)
    firsts = [FirstSpec(n, side(redis_launch.server_command(p, f"{workdir}/{n}", bind=addr, cluster=True,
                                                            cluster_config=f"nodes-{p}.conf", password=password)),
                        port_ready(p)) for n, p in zip(names, ports)]
    firsts.append(FirstSpec("cluster-create", SideSpec(d.host, redis_launch.create_cluster_command(
        d.python, addr, ports, password, budget, replicas=1)),
        Readiness(pattern=re.escape(redis_launch.CLUSTER_READY), timeout=budget + 5)))
    url = redis_launch.url_for(ports[0], host=addr, password=password)
    serve_flags = ["--heartbeat-timeout", f"{pr.scaled(CLUSTER_HEARTBEAT_TIMEOUT_S):g}"]
    return Directory(form, firsts, ["--directory", url], serve_flags, url, dict(zip(names, ports)),
                     password=password)


def _mkdirs(pr: PointRun, d, workdir: str, names: list[str]) -> None:
    d.host.run(["mkdir", "-p", *[f"{workdir}/{n}" for n in names]], timeout=pr.scaled(HOST_COMMAND_S))


def _write(pr: PointRun, d, path: str, text: str) -> None:
    """``text`` into ``path`` on ``d``'s host, readable by its owner only (a sentinel's config holds the password)."""
    r = d.host.run(["sh", "-c", 'umask 077 && printf "%s" "$1" > "$2"', "sh", text, path],
                   timeout=pr.scaled(HOST_COMMAND_S))
    if r.rc != 0:
        raise RuntimeError(f"could not write {path} on {d.host.spec}: {r.stderr.strip()}; is the folder writable?")


# --- the directory's state, asked on its host (Redis forms) ----------------------------------------------

def parse_replicas(info: dict[str, str]) -> list[int]:
    """The ports of the replicas an ``INFO replication`` of a master lists (``slaveN:ip=..,port=P,..``)."""
    out = []
    for k, v in info.items():
        if k.startswith("slave") and k[5:].isdigit():
            fields = dict(f.split("=", 1) for f in v.split(",") if "=" in f)
            if fields.get("port", "").isdigit():
                out.append(int(fields["port"]))
    return out


def busiest_master(roles: dict[str, str], keys: dict[str, int]) -> str | None:
    """The master (process name) holding the most keys (pure): ``roles`` name -> role, ``keys`` name -> DBSIZE."""
    masters = [n for n, r in roles.items() if r == "master" and n in keys]
    return max(masters, key=lambda n: (keys[n], n)) if masters else None


class RedisProbe:
    """redis-cli on the directory's host against its servers (their roles, key counts and replicas)."""

    def __init__(self, pr: PointRun, d, ds: Directory):
        self.pr, self.d, self.ds = pr, d, ds

    def cli(self, port: int, *args: str) -> str:
        r = self.d.host.run(redis_launch.cli_command(port, *redis_launch.auth_args(self.ds.password), *args,
                                                     host=self.d.address), timeout=self.pr.scaled(HOST_COMMAND_S))
        return r.stdout if r.rc == 0 else ""

    def replication(self, name: str) -> dict[str, str]:
        return redis_launch.parse_info(self.cli(self.ds.ports[name], "info", "replication"))

    def dbsize(self, name: str) -> int | None:
        out = self.cli(self.ds.ports[name], "dbsize").strip()
        return int(out) if out.isdigit() else None

    def target(self) -> dict[str, Any]:
        """The master with the most keys and its replica (redis-cluster): names, ports and key counts."""
        infos = {n: self.replication(n) for n in self.ds.ports}
        roles = {n: i.get("role", "?") for n, i in infos.items()}
        keys = {n: k for n in self.ds.ports if roles[n] == "master" and (k := self.dbsize(n)) is not None}
        master = busiest_master(roles, keys)
        if master is None:
            raise RuntimeError(f"no master of the Redis Cluster answered (roles {roles}); read the redis logs "
                               "beside the result")
        by_port = {p: n for n, p in self.ds.ports.items()}
        replica = next((by_port[p] for p in parse_replicas(infos[master]) if p in by_port), None)
        return {"master": master, "master_keys": keys[master], "keys_per_master": keys, "replica": replica}


# --- the run ------------------------------------------------------------------------------------------------

def run_point(pr: PointRun, th: TestbedHosts, prod, cons, ctx: dict, workdir: str) -> list[Row]:
    """The directory, the producers, the consumers and the watcher over one shared window, the fault at its
    moment; the point's rows."""
    p = pr.point.params
    form, fault = p["form"], p["fault"]
    ds = directory_for(pr, th, prod, form, workdir)
    common = [*ds.flags, "--protocol", p["protocol"], "--layout", p["layout"], "--page-size", str(p["page_size"]),
              "--working-set", str(p["working_set"])]
    pdevs = ["--devices", ",".join(prod.devices)] if p["protocol"] == "rdma" and prod.devices else []
    cdevs = ["--devices", ",".join(cons.devices)] if p["protocol"] == "rdma" and cons.devices else []
    groups = []
    for prefix in PREFIXES:
        serve = [*bench_argv(th, prod), "serve", *common, *pdevs, *ds.serve_flags, "--bind", prod.address,
                 "--key-prefix", prefix, "--readers", "0", "--max-wait", str(int(pr.timeout)), "--quiet"]
        groups.append(GroupSpec(prefix, [], SideSpec(prod.host, serve, pr.numa_member(f"{prefix}/server", prod),
                                                     next(iter(prod.devices), None)),
                                Readiness(pattern=READY_LINE, timeout=pr.scaled(READY_S))))
    outs = {}
    for i in range(1, int(p["consumers"]) + 1):
        name = f"consumer{i}"
        outs[name] = f"/tmp/pclab-drive-{uuid.uuid4().hex[:10]}.json"
        drive = [*bench_argv(th, cons), "drive", *common, *cdevs, "--key-prefix", ",".join(PREFIXES),
                 "--batch-size", str(p["batch_size"]), "--concurrencies", "1", "--processes", "1",
                 "--duration", str(pr.duration), "--warmup", str(pr.warmup), "--dir-cache-ttl", "0",
                 "--faults-expected", "--timeline-ms", str(TIMELINE_MS), "--seed", str(i),
                 "--start-file", "{start_file}", "--out", outs[name]]
        if pr.slow > 1:
            drive += ["--ready-timeout", f"{pr.scaled(GROUP_DRIVE_READY_S):.0f}", "--time-scale", f"{pr.slow:.1f}"]
        groups.append(GroupSpec(name, [SideSpec(cons.host, drive, pr.numa_member(f"{name}/client", cons),
                                                next(iter(cons.devices), None))]))
    watch = FirstSpec("watch", SideSpec(cons.host, dirwatch.command(cons.python, ds.spec, list(PREFIXES),
                                                                     p["working_set"], p["layout"],
                                                                     TIMELINE_MS / 1000)),
                      Readiness(pattern=re.escape(dirwatch.READY), timeout=pr.scaled(READY_S)))
    docs: dict[str, dict] = {}
    probe = RedisProbe(pr, prod, ds)
    fault_log: dict[str, Any] = {}

    def events(ctl, stop) -> None:
        at = ctl.barrier + pr.warmup + float(p["fault_at"]) * pr.duration
        # the Redis Cluster's target is found before the fault's moment (a dozen redis-cli calls on the
        # directory's host take a second here): the keys stay where they are once the producers published
        target = probe.target() if form == "redis-cluster" else None
        if ctl.at(at, stop):
            fault_log.update(play(pr, ctl, stop, form, fault, ds, probe, prod, float(p["down_s"]), target))

    def measure(gr) -> WindowBytes:
        (pr.raw_dir / gr.name).mkdir(exist_ok=True)
        doc = read_drive_document(pr.fetch(cons.host, outs[gr.name]))
        atomic.write_text(pr.raw_dir / gr.name / "drive.json", json.dumps(doc, indent=1))
        docs[gr.name] = doc
        pt = doc["points"][0]
        if pt["status"] != "ok":
            raise RuntimeError(f"{gr.name}: drive failed: {pt['reason']}")
        return WindowBytes(pt["bytes"], pt["window_start"], pt["window_end"])

    runner = GroupRunner(groups, first=[*ds.firsts, watch], server_exits=False,
                         server_timeout=pr.scaled(SERVER_EXIT_S), client_timeout=pr.timeout + start_lead(pr.slow),
                         measure=measure, barrier_lead=start_lead(pr.slow),
                         client_ready=Readiness(pattern=re.escape(DRIVE_READY_WORDS),
                                                timeout=pr.scaled(GROUP_DRIVE_READY_S)),
                         log_dir=pr.raw_dir, window_tolerance_s=max(0.05, 0.02 * pr.slow), events=events)
    res, err = pr.run_group(runner)
    for name, f in res.first.items():
        side = f"{prod.name if name != 'watch' else cons.name}/{name}"
        pr.commands[side], pr.numa[side] = f.argv, f.numa_binding
    samples = dirwatch.parse(res.first["watch"].stdout) if "watch" in res.first else []
    atomic.write_text(pr.raw_dir / "dirwatch.json", json.dumps(samples))
    if res.events:
        atomic.write_text(pr.raw_dir / "events.json", json.dumps(res.events, indent=1))
    if err:
        pr.fail("unavailable_s", "s", err, side="aggregate", **fail_ctx(ctx))
        return []
    if "t" not in fault_log:
        pr.fail("unavailable_s", "s", "the fault did not happen (the window ended before its moment)",
                side="aggregate", **fail_ctx(ctx))
        return []
    pr.notes.append(f"fault: {FAULT_TEXT[(form, fault)]} at +{fault_log['t'] - res.aggregate.window_start:.2f} s "
                    f"of the window; events: " + "; ".join(f"{e['event']} {e['group']} at "
                                                         f"+{e['t'] - res.aggregate.window_start:.2f} s"
                                                         for e in res.events))
    again = {g: registered_again(res.groups[g].server.stderr) for g in PREFIXES
             if g in res.groups and res.groups[g].server is not None}
    return fault_rows(docs, res.aggregate, fault_log, res.events, samples, ctx, cons.name, prod.name, pr.duration,
                      again)


def play(pr: PointRun, ctl, stop, form: str, fault: str, ds: Directory, probe: RedisProbe, d,
         down_s: float, target: dict[str, Any] | None = None) -> dict[str, Any]:
    """The fault, now: what was done to whom, when (``t``, epoch s), and what was found out on the way
    (``target``: the Redis Cluster's master with the most keys and its replica, :meth:`RedisProbe.target`)."""
    if form == "embedded":
        return {"t": ctl.restart("directory", down_s), "target": "directory"}
    if form == "redis":
        return {"t": ctl.restart("directory", 0.0), "target": "directory"}
    if form == "sentinel":
        if fault == "kill":
            return {"t": ctl.signal("master", signal.SIGKILL), "target": "master"}
        if fault == "failover":
            t = time.time()
            done = ctl.command("sentinel failover", d.host, redis_launch.cli_command(
                ds.sentinel_ports[0], "sentinel", "failover", SERVICE, host=d.address), pr.scaled(HOST_COMMAND_S))
            return {"t": t, "target": "master", "reply": (done.stdout + done.stderr).strip()[:200]}
        stop_s = redis_launch.SENTINEL_FAILOVER_TIMEOUT_MS / 1000 + STOP_BEYOND_S
        t = ctl.signal("master", signal.SIGSTOP)
        ctl.at(t + stop_s, stop)
        cont = ctl.signal("master", signal.SIGCONT)       # always: a stopped server would outlive the point
        role, demoted = "?", None
        deadline = time.monotonic() + pr.scaled(DEMOTE_S)
        while time.monotonic() < deadline:
            role = probe.replication("master").get("role", "?")
            if role == "slave":
                demoted = time.time() - cont
                break
            time.sleep(ROLE_POLL_S)
        return {"t": t, "target": "master", "stopped_s": round(cont - t, 3), "role": role,
                "demoted_s": None if demoted is None else round(demoted, 3)}
    target = target or probe.target()
    if fault == "kill":
        return dict(target, t=ctl.signal(target["master"], signal.SIGKILL), target=target["master"])
    if target["replica"] is None:
        raise RuntimeError(f"the master {target['master']} of the Redis Cluster lists no replica to fail over to")
    t = time.time()
    done = ctl.command("cluster failover", d.host, redis_launch.cli_command(
        ds.ports[target["replica"]], *redis_launch.auth_args(ds.password), "cluster", "failover", host=d.address),
        pr.scaled(HOST_COMMAND_S))
    return dict(target, t=t, target=target["replica"], reply=(done.stdout + done.stderr).strip()[:200])


# --- the rows (pure) ----------------------------------------------------------------------------------------

def level_before(buckets: list[dict[str, float]], fault_s: float, width: float) -> float | None:
    """The hit rate over the buckets wholly before the fault (None: none read anything)."""
    before = [b for b in buckets if b["t"] + width <= fault_s + 1e-9 and b["keys"]]
    keys = sum(b["keys"] for b in before)
    return sum(b["hits"] for b in before) / keys if keys else None


def judge(buckets: list[dict[str, float]], fault_s: float, width: float, level: float,
          tolerance: float = RATE_TOLERANCE) -> dict[str, Any]:
    """After the fault (from the bucket it falls in): the seconds of buckets whose reads were failing or
    missing (nothing completed, or a hit rate below ``level`` - ``tolerance``), and the seconds from the
    fault until the first bucket from which none is, for at least MIN_RECOVERED_BUCKETS buckets (None:
    never), and the stretches of such buckets (``outages``: [from, to] s into the window). The last bucket,
    when empty, is left out (the window's end may cut it short)."""
    after = [b for b in buckets if b["t"] + width > fault_s + 1e-9]
    if after and not after[-1]["keys"]:
        after.pop()
    bad = [not b["keys"] or b["hits"] / b["keys"] < level - tolerance for b in after]
    outages: list[list[float]] = []
    for b, is_bad in zip(after, bad):
        if not is_bad:
            continue
        if outages and abs(outages[-1][1] - b["t"]) < width / 2:
            outages[-1][1] = round(b["t"] + width, 3)
        else:
            outages.append([round(b["t"], 3), round(b["t"] + width, 3)])
    recovered = None
    for i in range(len(after) - MIN_RECOVERED_BUCKETS + 1):
        if not any(bad[i:]):
            recovered = max(0.0, after[i]["t"] - fault_s)
            break
    return {"unavailable_s": round(width * sum(bad), 3), "recovery_s": None if recovered is None else round(recovered, 3),
            "bad_buckets": sum(bad), "buckets_after": len(after), "outages": outages}


def entries(samples: list[dict[str, Any]], fault_t: float, end_t: float,
            forgotten: set[str] | frozenset[str] = frozenset()) -> dict[str, Any]:
    """What the watcher saw of the directory around the fault (``fault_t``, epoch s) until the window's end
    (``end_t``; then the producers leave): the entries resolved just before the fault, how many of them
    survived it, at the end, how many were lost and republished, the seconds until the directory answered
    again and until every entry it held before was back.

    Counted per producer (the samples' ``by``, key prefix -> resolved): what survived is the fewest the
    watcher saw after the fault, except for a producer in ``forgotten`` (the directory told it that it did
    not know it, so it resolved none of its entries: :func:`registered_again`), whose entries all count as
    lost. A watcher samples every 100 ms and a forgotten producer republishes at its next heartbeat, which
    can come before the watcher's first answer from the restarted directory: the producer's own word is
    what makes that loss seen. Samples without ``by`` count the whole directory as one."""
    samples = [s for s in samples if s["t"] <= end_t]
    ok = [s for s in samples if "found" in s]
    before = [s for s in ok if s["t"] < fault_t]
    after = [s for s in ok if s["t"] >= fault_t]
    out: dict[str, Any] = {"keys": ok[-1]["keys"] if ok else None, "samples": len(samples),
                           "errors_after": sum(1 for s in samples if "error" in s and s["t"] >= fault_t)}
    if not before or not after:
        return dict(out, why="the watcher has no answer " + ("before" if not before else "after") + " the fault")

    def count(s: dict[str, Any]) -> dict[str, int]:
        return s.get("by") or {"": s["found"]}
    held_by = count(before[-1])
    survived_by = {p: 0 if p in forgotten else min(count(s).get(p, 0) for s in after) for p in held_by}
    end_by = count(after[-1])
    held, survived, end = sum(held_by.values()), sum(survived_by.values()), sum(end_by.values())
    trough = min(after, key=lambda s: s["found"])
    back_all = next((s for s in after if s["t"] >= trough["t"] and s["found"] >= held), None)
    lost_by = {p: max(0, held_by[p] - survived_by[p]) for p in held_by if p}
    return dict(out, before=held, trough=trough["found"], survived=survived, end=end,
                lost=max(0, held - survived), republished=max(0, end - survived),
                **({"lost_by": lost_by} if lost_by else {}),
                back_s=round(after[0]["t"] - fault_t, 3),
                republished_s=(round(back_all["t"] - fault_t, 3) if back_all is not None else None))


def registered_again(stderr: str) -> int:
    """How many times a producer said it registered again (the directory had forgotten it) (pure)."""
    return len(re.findall(r"registered again as node", stderr))


def fault_rows(docs: dict[str, dict], agg, fault: dict[str, Any], events: list[dict], samples: list[dict],
               ctx: dict[str, Any], consumer_host: str, producer_host: str, window_s: float,
               again: dict[str, int] | None = None) -> list[Row]:
    """The rows of one fault point (pure): see the module doc. ``docs``: each consumer's drive document;
    ``agg``: the shared window (its start is the window's); ``fault``: :func:`play`'s record; ``again``: per
    producer, the times it registered again (:func:`registered_again`)."""
    consumers = sorted(docs)
    lines = [docs[c]["points"][0].get("timeline") for c in consumers]
    base = dict(ctx, side="aggregate", devices=",".join(consumers), host=consumer_host, peer=producer_host)
    rows: list[Row] = []
    wrong = sum(int(docs[c]["points"][0].get("verify_failures") or 0) for c in consumers)
    errors = sum(int(docs[c]["points"][0].get("errors") or 0) for c in consumers)
    rows.append(Row(metric="verify_failures", value=wrong, unit="count", **base))
    first_errors = [docs[c]["points"][0].get("first_error") for c in consumers if docs[c]["points"][0].get("first_error")]
    rows.append(Row(metric="errors", value=errors, unit="count", **dict(base, extra=dict(
        ctx["extra"], first_errors=first_errors[:3]))))
    keys = sum(docs[c]["points"][0].get("keys", 0) for c in consumers)
    hits = sum((docs[c]["points"][0].get("hit_rate") or 0) * docs[c]["points"][0].get("keys", 0) for c in consumers)
    rows.append(measured("hit_rate", hits / keys if keys else None, "ratio", "no drive asked for a key", **base))
    rows.append(Row(metric="get_throughput", value=agg.rate_Bps / 1e9, unit="GB/s", **dict(base, extra=dict(
        ctx["extra"], window_start=agg.window_start, window_end=agg.window_end, start_skew_s=agg.start_skew_s,
        consumers=len(consumers), verified=all(docs[c]["points"][0].get("verified") for c in consumers)))))
    for c in consumers:
        tl = docs[c]["points"][0].get("timeline") or {}
        bound = tl.get("fault_bound_s")
        stall = tl.get("max_stall_s")
        rows.append(measured("max_stall_s", stall, "s", "drive wrote no timeline", **dict(
            ctx, side="per_host", devices=c, host=consumer_host, peer=producer_host,
            extra=dict(ctx["extra"], bound_s=bound,
                       within_bound=None if bound is None or stall is None else stall <= bound))))
    seen = entries(samples, fault["t"], agg.window_end, {p for p, n in (again or {}).items() if n})
    watch_series = [[round(s["t"] - agg.window_start, 3), s.get("found")] for s in samples]
    ev = dict(base, extra=dict(ctx["extra"], registered_again=again or {},
                               **{k: v for k, v in seen.items() if k not in ("lost", "republished")}))
    why = seen.get("why") or "not measured"
    rows.append(measured("entries_lost", seen.get("lost"), "count", why, **ev))
    rows.append(measured("entries_republished", seen.get("republished"), "count", why, **ev))
    rows.append(measured("directory_back_s", seen.get("back_s"), "s", why, **ev))
    rows.append(measured("republished_s", seen.get("republished_s"), "s",
                          why or f"the directory did not resolve all {seen.get('before')} entries again by the "
                                 "window's end", **ev))
    if fault.get("role") is not None:
        rows.append(measured("old_master_demoted_s", fault.get("demoted_s"), "s",
                              f"the old master still reported role {fault['role']!r} after its bound", **dict(
                                  base, extra=dict(ctx["extra"], role=fault["role"],
                                                   stopped_s=fault.get("stopped_s")))))
    if not all(lines):
        rows.append(Row(metric="unavailable_s", value=None, unit="s", status="not_measured",
                        reason="a drive wrote no timeline (is the consumer's peercache-bench older than the lab?)",
                        **base))
        return rows
    buckets = churn_.summed(lines)
    width = lines[0]["bucket_ms"] / 1000.0
    fault_s = fault["t"] - lines[0]["start"]
    level = level_before(buckets, fault_s, width)
    series = [[b["t"], round(b["hits"] / b["keys"], 4) if b["keys"] else None, round(b["bytes"] / width / 1e9, 4),
               b["errors"]] for b in buckets]
    detail = dict(ctx["extra"], fault_s=round(fault_s, 3), level_before=level, tolerance=RATE_TOLERANCE,
                  bucket_s=width, window_s=window_s,
                  target=fault.get("target"), **{k: fault[k] for k in ("master_keys", "keys_per_master", "reply",
                                                                       "stopped_s", "role") if k in fault},
                  events=[dict(e, t=round(e["t"] - lines[0]["start"], 3)) for e in events])
    if level is None:
        rows.append(Row(metric="unavailable_s", value=None, unit="s", status="not_measured",
                        reason="no read completed before the fault: move fault_at later or lengthen the window",
                        **dict(base, extra=dict(detail, timeline=series, watch=watch_series))))
        return rows
    j = judge(buckets, fault_s, width, level)
    rows.append(Row(metric="unavailable_s", value=j["unavailable_s"], unit="s", **dict(base, extra=dict(
        detail, timeline=series, watch=watch_series, bad_buckets=j["bad_buckets"], outages=j["outages"]))))
    rows.append(measured("recovery_s", j["recovery_s"], "s",
                          f"the hit rate did not come back within {RATE_TOLERANCE:g} of its level before the fault "
                          f"({level:.3f}) and stay there by the window's end", **dict(base, extra=detail)))
    return rows
