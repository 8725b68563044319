"""Run one point of a testbed's scenarios and write its raw result folder.

``python -m peercache.lab.pipeline.runpoint --testbed T.yaml --scenario S --point P
--rep K --out data/raw/<tb>/<S>/<P>/rep<K>/result.json`` starts the pair (or
the per-NIC groups) on the testbed's hosts, keeps both sides' logs beside
the result, parses the tools' output into tidy rows and writes
``result.json`` with the run's meta block. A point whose hardware the
testbed lacks is written as skipped with the reason; a point that fails is
written as failed with the reason and its logs, so the report shows it
instead of silently dropping it.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import sys
import time
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from peercache.lab.system import cpusample, crosscheck
from peercache.lab.pipeline import experiments
from peercache.lab.tools import iperf3, perfstat, perftest, sockperf
from peercache.lab.launch import netns
from peercache.lab.launch import redis as redis_launch
from peercache.lab.tools import redis_benchmark
from peercache.lab.system import hostinfo, numa
from peercache.lab.errors import ParseError, ToolError
from peercache.lab.launch.hosts import CommandTimeout, Host, LocalHost, parse_host
from peercache.lab.system.slowness import slowness
from peercache.lab.launch.runners import (GroupFailed, GroupRunner, GroupSpec, PairFailed, PairRunner, PortAllocator,
                     Readiness, SideSpec, WindowBytes)
from peercache.lab.tidy import Row, RunMeta, convert, redact_folder, write_result
from peercache.bench import meta as bench_meta

READY_LINE = "peercache-bench serve: ready"
#: Labels of the CPU evidence of a pair -> the role whose process tree was sampled.
PAIR_SIDES = {"consumer": "consumer", "producer": "producer"}
#: Seconds from the group barrier to the shared measurement start (drivers need to spawn).
GROUP_START_LEAD_S = 6.0
WORKING_SET_BYTES = 256 << 20
#: --dir-cache-ttl of every drive, as in the published reproduction commands.
DIR_CACHE_TTL_S = 5.0
#: Batch of the memcpy limit: the batch of the PeerCache shm points it is compared with.
MEMCPY_BATCH = 32
#: Runs of a perftest point whose tool could not calibrate its clock (perftest.CLOCK_CALIBRATION).
PERFTEST_ATTEMPTS = 3




#: The interpreter of an ssh host whose definition names none.
DEFAULT_REMOTE_PYTHON = "python3"
ROLES = ("producer", "consumer")


def host_python(host: Host, host_def: dict[str, Any] | None = None) -> list[str]:
    """The argv prefix that runs Python with PeerCache on ``host`` (its definition's ``python`` field).

    Hosts on this machine run this interpreter (``sys.executable``). On a remote host: an absolute
    ``python`` is used as is; a path with a '/' that is not absolute (``.venv/bin/python``) is resolved
    against this checkout's root, i.e. the same path there (a shared install, as over NFS); a bare name
    is looked up on the host's PATH; none given: ``python3``.
    """
    if host.on_this_machine:
        return [sys.executable]
    py = (host_def or {}).get("python") or DEFAULT_REMOTE_PYTHON
    if "/" in py and not os.path.isabs(py):
        py = str(experiments.CHECKOUT_ROOT / py)
    return [py]


@dataclass
class TestbedHosts:
    """The two hosts of a point, their addresses, and why they differ from the definition."""

    producer: Host
    consumer: Host
    producer_addr: str
    consumer_addr: str
    note: str | None
    #: role -> the argv prefix that runs Python with PeerCache there (:func:`host_python`); absent: as it says
    python: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    #: the testbed's ``bench_command`` (runs peercache-bench on remote hosts instead of python -m)
    bench_command: list[str] | None = None

    def host(self, role: str) -> Host:
        """The host of ``role`` (producer or consumer)."""
        if role not in ROLES:
            raise ValueError(f"role {role!r} is not producer or consumer")
        return self.producer if role == "producer" else self.consumer

    def python_of(self, role: str) -> list[str]:
        """The argv prefix that runs Python with PeerCache on the ``role`` host."""
        return list(self.python.get(role) or host_python(self.host(role)))


#: Both sides on this host over 127.0.0.1 (a part with ``place: loopback``: same-host shm figures).
LOOPBACK_HOSTS = {"producer": {"host": "local", "address": "127.0.0.1"},
                  "consumer": {"host": "local", "address": "127.0.0.1"}}


@contextlib.contextmanager
def testbed_hosts(tb: experiments.Testbed, loopback: bool = False) -> Iterator[TestbedHosts]:
    """Hosts of ``tb`` (or this host twice, ``loopback``); creates and always removes its netns pair if it has one,
    and closes the hosts (an ssh host's master connection) on leaving."""
    hosts, pair, note = (LOOPBACK_HOSTS if loopback else tb["hosts"]), None, None
    if tb.get("netns_pair") and not loopback:
        ok, why = netns.available()
        if ok:
            pair = netns.NetnsPair(tb["netns_pair"]["tag"], tb["netns_pair"]["index"]).create()
        else:
            hosts = tb.get("fallback_hosts") or hosts
            note = f"network namespaces unavailable ({why}); producer and consumer share loopback"
    opened: list[Host] = []
    try:
        for role in ROLES:
            opened.append(parse_host(hosts[role]["host"]))
        prod, cons = opened
        yield TestbedHosts(prod, cons, hosts["producer"]["address"], hosts["consumer"]["address"], note,
                           python={"producer": host_python(prod, hosts["producer"]),
                                   "consumer": host_python(cons, hosts["consumer"])},
                           bench_command=list(tb.get("bench_command") or []) or None)
    finally:
        for h in opened:
            try:
                h.close()
            except Exception as e:  # a master that will not exit times out on its own (ControlPersist)
                print(f"{h}: closing the connection failed: {e}", file=sys.stderr)
        if pair is not None:
            pair.remove()


#: The redis-server the Redis points of one bench run share (see :func:`shared_redis`); None outside one.
_SHARED_REDIS: dict[str, Any] | None = None


@contextlib.contextmanager
def shared_redis() -> Iterator[None]:
    """Inside it, every Redis point (dirlookup with redis, redis_benchmark) uses one redis-server, started
    at the first such point and stopped on leaving; outside it, each point starts and stops its own."""
    global _SHARED_REDIS
    if _SHARED_REDIS is not None:
        yield
        return
    _SHARED_REDIS = {}
    try:
        yield
    finally:
        srv, _SHARED_REDIS = _SHARED_REDIS.get("server"), None
        if srv is not None:
            srv.stop()


@contextlib.contextmanager
def redis_server() -> Iterator[redis_launch.RedisServer]:
    """The point's redis-server on 127.0.0.1, emptied: the shared one inside :func:`shared_redis`, else its own."""
    if _SHARED_REDIS is None:
        with redis_launch.RedisServer() as srv:
            yield srv
        return
    srv = _SHARED_REDIS.get("server")
    if srv is None or not srv.running:
        srv = _SHARED_REDIS["server"] = redis_launch.RedisServer().start()
    srv.flush()
    yield srv


def guest_block() -> dict[str, Any] | None:
    """Where the run happened when it ran in the Soft-RoCE guest (None elsewhere): for the report's caveat."""
    if os.environ.get("PEERCACHE_MACHINES_KERNEL"):   # the two-machine testbed (guest.machines) ran it
        return {"kind": "qemu-softroce-2host", "kernel": os.environ["PEERCACHE_MACHINES_KERNEL"],
                "slowness": slowness(), "caveat": GUEST_CAVEAT}
    if not os.environ.get("PEERCACHE_GUEST"):
        return None
    return {"kind": "qemu-softroce", "kernel": os.uname().release, "slowness": slowness(),
            "caveat": GUEST_CAVEAT}


#: What every figure measured in the guest means, said at the top of its report.
GUEST_CAVEAT = ("Soft-RoCE (rdma_rxe) in a QEMU guest with an emulated CPU: a functional check of the rdma "
                "path, not a fabric figure; the numbers are CPU-bound MB/s and say nothing about a NIC")


def _python_tool(th: TestbedHosts, role: str, module: str) -> list[str]:
    """argv that runs ``python -m module`` on the ``role`` host: this interpreter on this machine, the
    host's ``python`` (:func:`host_python`) on a remote one, where the testbed's ``bench_command``
    (when set) runs peercache-bench instead."""
    if module == "peercache.bench.cli" and th.bench_command and not th.host(role).on_this_machine:
        return list(th.bench_command)
    return [*th.python_of(role), "-m", module]


def _captured_nics(tb: experiments.Testbed, role: str) -> tuple[dict[str, dict], str]:
    """The ``role`` host's NICs by name from its hostinfo capture (``{results}/testbed/{role}.json``), and its path."""
    path = Path(tb["results"]) / "testbed" / f"{role}.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}, str(path)
    nics = (doc.get("summary") or hostinfo.summary(doc.get("capture") or doc)).get("nics") or []
    return {n.get("name"): n for n in nics if isinstance(n, dict)}, str(path)


def numa_choice(tb: experiments.Testbed, devices: list[str], role: str = "consumer") -> tuple[int | None, str]:
    """(NUMA node, where it came from or why there is none) of the ``role`` side of a point using ``devices``.

    ``devices`` are consumer names; the ``role`` host's own names (``Testbed.role_devices``) are looked up
    in the testbed's ``numa:`` map, and a device it has no entry for in that host's hostinfo capture (its
    ``numa_node``, read from sysfs before any point). The side's node is the one all its devices share.
    """
    if not devices:
        return None, "the point uses no NIC"
    static = tb.get("numa") or {}
    nics, path = _captured_nics(tb, role)
    nodes, sources = set(), []
    for name in tb.role_devices(role, devices):
        if name in static:
            nodes.add(static[name])
            sources.append(f"{name}: testbed numa map")
        elif name in nics:
            nodes.add(nics[name].get("numa_node"))
            sources.append(f"{name}: capture {path}" + (f" ({nics[name]['numa_source']})"
                                                         if nics[name].get("numa_source") else ""))
        else:
            nodes.add(None)
            sources.append(f"{name}: not in the testbed's numa map nor in {path}")
    if len(nodes) > 1 and None not in nodes:
        return None, "devices on different nodes: " + "; ".join(sources)
    node = nodes.pop() if len(nodes) == 1 else None
    if node is None or isinstance(node, bool) or not isinstance(node, int) or node < 0:
        return None, "node unknown: " + "; ".join(sources)
    return node, "; ".join(sources)


def _numa_of(tb: experiments.Testbed, devices: list[str], role: str = "consumer") -> int | None:
    """The NUMA node of the ``role`` side of a point using ``devices`` (:func:`numa_choice`), or None."""
    return numa_choice(tb, devices, role)[0]


def _fetch(host: Host, path: str) -> str:
    r = host.run(["cat", path], timeout=30 * slowness())
    host.run(["rm", "-f", path], timeout=30 * slowness())
    if r.rc != 0:
        raise ToolError(host=str(host), tool="cat", kind="failed", returncode=r.rc,
                        detail=f"could not read {path}: {r.stderr.strip()}",
                        check="the tool did not write its output file; read its log")
    return r.stdout


def canonical_metric(name: str) -> str:
    """perf event names as tidy metric names: 'L1-dcache-load-misses' -> 'l1_dcache_load_misses'."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


class PointRun:
    """Executes one point; collects rows, commands, bindings and notes for the meta block."""

    def __init__(self, tb: experiments.Testbed, point: experiments.Point, rep: int, raw_dir: Path):
        self.tb, self.point, self.rep, self.raw_dir = tb, point, rep, raw_dir
        self.run_id = f"{tb.name}/{point.scenario}/{point.name}/rep{rep}"
        self.rows: list[Row] = []
        self.cpu_files: dict[str, tuple[Host, str]] = {}   #: role -> where its CPU samples are written
        self.commands: dict[str, Any] = {}
        self.numa: dict[str, Any] = {}
        self._numa_choices: dict[str, tuple[int | None, str]] = {}   #: binding side -> (NIC node, its source)
        self._captures: list[dict] | None = None
        self.notes: list[str] = []
        base = int(tb.get("base_port", 42000))
        self.ports = PortAllocator(base, base + 499)
        # A part may set its own duration and warm-up (the bench's short verification runs).
        dur = float(point.params.get("duration", tb["duration"]))
        self.duration, self.warmup = dur, float(point.params.get("warmup", tb["warmup"]))
        #: Waits (never the measured window) stretch by the machine's slowness: a guest is slow, not hung.
        self.slow = slowness()
        self.timeout = (60.0 + 4 * (dur + self.warmup)) * self.slow

    def ctx(self, **kw: Any) -> dict[str, Any]:
        """Row context common to every row of this point."""
        base = {"experiment": self.tb.name, "testbed": self.tb.name, "scenario": self.point.scenario,
                "run_id": self.run_id, "repetition": self.rep}
        base.update(kw)
        return base

    def fail(self, metric: str, unit: str, reason: str, **kw: Any) -> None:
        self.rows.append(Row(metric=metric, value=None, unit=unit, status="failed", reason=reason,
                             **self.ctx(**kw)))

    # -- CPU evidence -------------------------------------------------------------------
    def cpu_wrap(self, label: str, th: TestbedHosts, role: str, argv: list[str]) -> list[str]:
        """``argv`` under the CPU sampler on the ``role`` host of ``th``; its samples (kept under ``label``)
        are read back by :meth:`cpu_usage`."""
        path = f"/tmp/pclab-cpu-{uuid.uuid4().hex[:10]}.jsonl"
        self.cpu_files[label] = (th.host(role), path)
        return cpusample.wrap(argv, path, _python_tool(th, role, "peercache.lab.system.cpusample"))

    def cpu_usage(self, roles: dict[str, str], start: float | None, end: float | None) -> dict[str, Any]:
        """{label: usage over [start, end]} for the wrapped ``roles`` ({label: role}); files kept in raw_dir."""
        out: dict[str, Any] = {}
        for label, role in roles.items():
            if role not in self.cpu_files:
                continue
            host, path = self.cpu_files.pop(role)
            try:
                text = _fetch(host, path)
            except ToolError as e:
                out[label] = {"reason": f"no CPU samples: {e}"}
                continue
            (self.raw_dir / f"{role.replace('/', '_')}.cpu.jsonl").write_text(text)
            use = cpusample.window_usage(cpusample.read_samples(text), start, end) if start and end else None
            out[label] = use.as_dict() if use else {"reason": "fewer than two CPU samples inside the window"}
            self.numa_evidence(role, host, text)
        return out

    # -- NUMA binding evidence ----------------------------------------------------------
    def _merge_numa_choices(self) -> None:
        """Beside each side's binding record: the NIC's node and where it came from (even when not bound)."""
        for side, (node, source) in self._numa_choices.items():
            if side in self.numa:
                self.numa[side] = dict(self.numa[side], nic_node=node, node_source=source)

    def _host_nodes(self, host: Host, samples: list[dict]) -> tuple[dict, str]:
        """The NUMA nodes' CPU lists of the host a process ran on: its hostinfo capture, else the sampler's reading."""
        spec = getattr(host, "spec", str(host))
        if self._captures is None:
            self._captures = []
            for role in ("producer", "consumer"):
                try:
                    self._captures.append(json.loads((Path(self.tb["results"]) / "testbed" / f"{role}.json")
                                                     .read_text()) | {"_file": f"{role}.json"})
                except (OSError, ValueError):
                    continue
        for cap in self._captures:
            nodes = ((cap.get("capture") or {}).get("numa") or {}).get("nodes")
            if cap.get("host_spec") in (str(host), spec) and nodes:
                return ({str(n["node"]): n.get("cpulist") for n in nodes},
                        f"hostinfo capture {cap['_file']} of {spec}")
        rec = cpusample.host_record(samples)
        if rec and rec.get("nodes"):
            return rec["nodes"], f"the sampler's reading of {spec}'s sysfs (no hostinfo capture of {spec})"
        return {}, f"no NUMA node list of {spec}"

    def numa_evidence(self, role: str, host: Host, text: str) -> None:
        """Attach what the processes of ``role`` show of their binding to its ``numa_binding`` side, judged;
        note a side that a binding did not reach (``numa_unbound``) or that sits on another node
        (``numa_wrong_node``)."""
        samples = cpusample.read_samples(text)
        readings = cpusample.bindings(samples)
        head, _, last = role.rpartition("/")
        side = role if role in self.numa else (
            (f"{head}/" if head else "") + {"producer": "server", "consumer": "client"}.get(last, last))
        rec = self.numa.setdefault(side, {"node": None, "reason": "this kind binds none of its processes"})
        nic_node = self._numa_choices.get(side, (None, ""))[0]
        asked = rec.get("node") if rec.get("node") is not None else nic_node
        node_cpus, cpus_source = self._host_nodes(host, samples)
        judged = numa.judge(readings, asked, node_cpus)
        latest = {r.get("pid"): r for r in readings}    # each process's last reading (settled when no later one)
        rec["evidence"] = {"processes": list(latest.values()), "node_cpus_source": cpus_source,
                           "judged": judged}
        where = f"numa_binding {side} ({getattr(host, 'spec', host)})"
        if judged["verdict"] == "wrong_node":
            self.notes.append(f"{where}: flagged numa_wrong_node: meant for node {asked}, found on node "
                              f"{judged.get('found_node')}: " + "; ".join(judged["why"]))
        elif judged["verdict"] == "unbound" and rec.get("node") is not None:
            self.notes.append(f"{where}: flagged numa_unbound: {' '.join(rec.get('prefix') or [])} did not take "
                              "effect: " + "; ".join(judged["why"]))

    def attach_cpu(self, usage: dict[str, Any]) -> None:
        """Put the CPU evidence in the ``extra`` of the point's throughput rows."""
        for r in self.rows:
            if r.metric in ("bw", "get_throughput"):
                r.extra = dict(r.extra, cpu=usage)

    def _side_window(self, res) -> tuple[float | None, float | None]:
        """The middle of the client's run (tools that report no window of their own)."""
        c = getattr(res, "client", None)
        if c is None or c.start is None or c.end is None:
            return None, None
        span = c.end - c.start
        return c.start + 0.2 * span, c.end - 0.2 * span

    # -- port counters ------------------------------------------------------------------
    def port_devices(self) -> list[str]:
        """RDMA devices whose counters bound this point's figures (the kind says; none for non-RDMA kinds)."""
        return self.point.spec.port_devices(self.point.params, self.tb.devices)

    def check_counters(self, before, after, rates) -> None:
        """Attach the counter cross-check to every measured bandwidth row; note what is flagged."""
        for r in self.rows:
            if r.metric not in ("bw", "get_throughput") or r.status != "ok" or r.value is None:
                continue
            devs = [r.devices] if r.side == "per_device" else list(before)
            bps = convert(r.value, r.unit, "B/s")
            # The consumer (client) receives what a READ or a GET moves, and sends what a WRITE moves.
            direction = "xmit" if r.tool == "ib_write_bw" else "rcv"
            pc = crosscheck.check({d: before[d] for d in devs if d in before},
                                  {d: after[d] for d in devs if d in after},
                                  {d: rates.get(d) for d in devs}, bps, self.figure_window(r, bps),
                                  direction=direction)
            r.extra = dict(r.extra, **pc.as_extra())
            bad = [f for f in pc.flags if f in ("above_line_rate", "counter_disagreement")]
            if bad:
                self.notes.append(f"{r.metric} {r.side} {r.devices}: flagged {', '.join(bad)}: "
                                  + "; ".join(pc.messages))

    def figure_window(self, r: Row, bps: float) -> float:
        """The seconds a bandwidth figure covers: the point's duration, or for perftest run by count
        (-n per QP) the time its bytes took at that rate (iterations x QPs x size / rate)."""
        its = self.point.params.get("iterations")
        if its and r.qps and r.size_bytes and bps > 0:
            return its * r.qps * r.size_bytes / bps
        return self.duration

    # -- kinds ----------------------------------------------------------------------
    def skip(self) -> None:
        """The point's headline row, skipped with the reason (tool, metric and unit from its kind)."""
        p, spec = self.point.params, self.point.spec
        self.rows.append(Row(metric=spec.primary, value=None, unit=spec.unit(), status="skipped",
                             reason=self.point.skip_reason,
                             **self.ctx(tool=spec.row_tool(p), protocol=p.get("protocol", ""), layout=p.get("layout", ""),
                                        size_bytes=p.get("page_size") or p.get("size"),
                                        batch=p.get("batch_size"), threads=p.get("threads"),
                                        processes=p.get("processes"),
                                        extra={"destination": p.get("destination")})))

    def _perf_wrap(self, argv: list[str]) -> tuple[list[str], str | None]:
        if not self.point.params.get("perf_stat"):
            return argv, None
        path = f"/tmp/pclab-perf-{uuid.uuid4().hex[:10]}.csv"
        return perfstat.wrap(argv, path), path

    def _perf_rows(self, th: TestbedHosts, path: str | None, ctx: dict) -> None:
        if path is None:
            return
        text = _fetch(th.consumer, path)
        (self.raw_dir / "client.perf.csv").write_text(text)
        for r in perfstat.to_rows(perfstat.parse_csv(text, source=str(self.raw_dir / "client.perf.csv")),
                                  **ctx):
            r.metric = canonical_metric(r.metric)
            self.rows.append(r)

    def _pair(self, server: list[str], client: list[str], ready: Readiness, th: TestbedHosts,
              devices: list[str], server_exits: bool = True):
        pnode, psrc = numa_choice(self.tb, devices, "producer")
        cnode, csrc = numa_choice(self.tb, devices, "consumer")
        self._numa_choices.update(server=(pnode, psrc), client=(cnode, csrc))
        pdev = (self.tb.role_devices("producer", devices) or [None])[0]
        dev = devices[0] if devices else None
        server = self.cpu_wrap("producer", th, "producer", server)
        client = self.cpu_wrap("consumer", th, "consumer", client)
        runner = PairRunner(SideSpec(th.producer, server, pnode, pdev), SideSpec(th.consumer, client, cnode, dev),
                            ready, client_timeout=self.timeout, server_exits=server_exits,
                            log_dir=self.raw_dir, name=self.point.name)
        try:
            return runner.run(), None
        except PairFailed as e:
            return e.result, str(e)

    def _record(self, res) -> None:
        if res is None:
            return
        self.commands.update(res.commands())
        self.numa.update(res.numa_bindings())
        self._merge_numa_choices()

    def iperf3(self, th: TestbedHosts) -> None:
        p = self.point.params
        if int(p.get("processes", 1)) > 1:
            return self.iperf3_processes(th)
        port = self.ports.allocate()
        server = iperf3.server_command(port, bind=th.producer_addr)
        secs = max(1, math.ceil(self.duration))
        omit = max(0, math.ceil(self.warmup)) if p.get("omit_warmup") else 0
        client, perf_path = self._perf_wrap(iperf3.client_command(
            th.producer_addr, port, length=p["length"], streams=p["streams"], duration=secs + omit,
            reverse=bool(p.get("reverse"))) + (["-O", str(omit)] if omit else []))
        ctx = self.ctx(tool="iperf3", protocol="tcp", size_bytes=p["length"], qps=p["streams"],
                       host=str(th.consumer), peer=str(th.producer), side="client")
        res, err = self._pair(server, client, Readiness(port=port, addr=th.producer_addr, timeout=15 * self.slow), th, [])
        self._record(res)
        if err:
            self.fail("bw", "B/s", err, **{k: v for k, v in ctx.items() if k not in self.ctx()})
            return
        result = iperf3.parse_json(res.client.stdout, source=f"{self.run_id}/client", host=str(th.consumer))
        for r in iperf3.to_rows(result, **ctx):
            if r.metric == "bw_received":
                r.metric = "bw"   # what arrived is the figure comparable to a READ
            self.rows.append(r)
        self.attach_cpu(self.cpu_usage(PAIR_SIDES, *self._side_window(res)))
        self._perf_rows(th, perf_path, ctx)

    def iperf3_processes(self, th: TestbedHosts) -> None:
        """N iperf3 client processes, each against its own server, released together; bytes over one window."""
        p = self.point.params
        n, secs = int(p["processes"]), max(1, math.ceil(self.duration))
        omit = max(0, math.ceil(self.warmup))
        specs = []
        for i in range(n):
            port = self.ports.allocate()
            name = f"proc{i}"
            server = self.cpu_wrap(f"{name}/producer", th, "producer", iperf3.server_command(port, bind=th.producer_addr))
            client = self.cpu_wrap(f"{name}/consumer", th, "consumer", iperf3.client_command(
                th.producer_addr, port, length=p["length"], streams=p["streams"], duration=secs + omit,
                reverse=bool(p.get("reverse")))
                + ["-O", str(omit)])
            specs.append(GroupSpec(name, [SideSpec(th.consumer, client)], SideSpec(th.producer, server),
                                   Readiness(port=port, addr=th.producer_addr, timeout=15 * self.slow)))
        results: dict[str, Any] = {}

        def measure(gr) -> WindowBytes:
            c = gr.clients[0]
            r = iperf3.parse_json(c.stdout, source=f"{self.run_id}/{gr.name}", host=str(th.consumer))
            results[gr.name] = r
            start = c.start + omit            # the omitted warm-up seconds are not in the sums
            return WindowBytes(r.received_bytes, start, start + r.received_seconds)

        runner = GroupRunner(specs, client_timeout=self.timeout, measure=measure, log_dir=self.raw_dir,
                             window_tolerance_s=0.5)
        ctx = self.ctx(tool="iperf3", protocol="tcp", size_bytes=p["length"], qps=p["streams"], processes=n,
                       host=str(th.consumer), peer=str(th.producer), side="client")
        try:
            res, err = runner.run(), None
        except GroupFailed as e:
            res, err = e.result, str(e)
        for name, gr in res.groups.items():
            self.commands.update({f"{name}/{k}": v for k, v in gr.commands().items()})
        if err:
            self.fail("bw", "B/s", err, **{k: ctx[k] for k in ("tool", "protocol", "size_bytes", "qps",
                                                                "processes")})
            return
        agg = res.aggregate
        cpu = {g: self.cpu_usage({"consumer": f"{g}/consumer", "producer": f"{g}/producer"},
                                 w.start, w.end) for g, w in res.windows.items()}
        self.rows.append(Row(metric="bw", value=agg.rate_Bps, unit="B/s", raw_value=agg.rate_Bps * 8,
                             raw_unit="bit/s",
                             extra={"window_start": agg.window_start, "window_end": agg.window_end,
                                    "start_skew_s": agg.start_skew_s, "end_skew_s": agg.end_skew_s,
                                    "client_processes": n, "cpu": cpusample.combine(cpu),
                                    "per_process_Bps": {g: r.received_bps / 8 for g, r in results.items()}},
                             **ctx))

    def sockperf(self, th: TestbedHosts) -> None:
        """sockperf TCP ping-pong between the point's two hosts: the round trip a GET on that path is compared with."""
        p = self.point.params
        port = self.ports.allocate()
        secs = max(1, math.ceil(self.duration))
        ctx = self.ctx(tool="sockperf", protocol="tcp", size_bytes=p["msg_size"], host=str(th.consumer),
                       peer=str(th.producer), side="client", threads=1, processes=1)
        # The server echoes until it is ended; the pair runner ends it after the client.
        res, err = self._pair(sockperf.server_command(port, bind=th.producer_addr),
                              sockperf.client_command(th.producer_addr, port, p["msg_size"], secs,
                                                      busy_poll=bool(p.get("busy_poll"))),
                              Readiness(port=port, addr=th.producer_addr, timeout=15 * self.slow), th, [],
                              server_exits=False)
        self._record(res)
        text = res.client.stdout if res is not None and res.client is not None else ""
        try:
            result = sockperf.parse_output(text, source=f"{self.run_id}/client", host=str(th.consumer))
        except (ParseError, ToolError) as e:
            self.fail("rtt_p50", "us", f"{err}: {e}" if err else str(e),
                      **{k: ctx[k] for k in ("tool", "protocol", "size_bytes")})
            return
        if err:
            self.notes.append(f"pair reported a failure after a complete sockperf report: {err}")
        self.rows += sockperf.to_rows(result, **ctx)
        self.attach_cpu(self.cpu_usage(PAIR_SIDES, *self._side_window(res)))

    def perftest(self, th: TestbedHosts) -> None:
        p = self.point.params
        devices = self.tb.devices[:1]
        port = self.ports.allocate()
        params = perftest.PerftestParams(tool=p["tool"], device=devices[0] if devices else None,
                                         gid_index=self.tb.get("gid_index"), qps=p["qps"], size=p["size"],
                                         duration=None if p.get("iterations") else max(1, math.ceil(self.duration)),
                                         iterations=p.get("iterations"), tx_depth=p.get("tx_depth"),
                                         report_gbits=True, tcp_port=port)
        ctx = self.ctx(host=str(th.consumer), peer=str(th.producer), side="client",
                       devices=",".join(devices), numa_node=_numa_of(self.tb, devices))
        server_params = dataclasses.replace(params, device=(self.tb.role_devices("producer", devices) or [None])[0])
        for attempt in range(1, PERFTEST_ATTEMPTS + 1):
            client, perf_path = self._perf_wrap(perftest.client_command(params, th.producer_addr))
            # Readiness is the server's listening exchange port (read with ss, never connected to): perftest's
            # stdout is block-buffered into a pipe, so its "Waiting for client" line shows only at its exit.
            res, err = self._pair(perftest.server_command(server_params), client,
                                  Readiness(port=port, timeout=20 * self.slow), th, devices)
            self._record(res)
            if not err:
                break
            text = (res.client.stdout + res.client.stderr) if res and res.client else ""
            te = perftest.classify_failure(text, res.client.rc if res and res.client else None,
                                           str(th.consumer), p["tool"])
            if te is not None and te.kind == perftest.CLOCK_CALIBRATION and attempt < PERFTEST_ATTEMPTS:
                # The tool's own clock calibration failed, not the transfer: run it again, and say so.
                self.notes.append(f"attempt {attempt} of {PERFTEST_ATTEMPTS}: {te}")
                self._drop_samples(th, perf_path)
                continue
            self.fail("bw", "B/s", str(te) if te else err, tool=p["tool"], size_bytes=p["size"], qps=p["qps"])
            return
        result = perftest.parse_output(res.client.stdout, source=f"{self.run_id}/client")
        for r in perftest.to_rows(result, **ctx):
            if r.metric == "bw_average":
                r.metric = "bw"
            if r.extra.get("iterations") == 0 and r.status == "ok":
                # Sanity: a run that completed nothing in its window measured nothing (it is not 0 B/s).
                r.status, r.value = "failed", None
                r.reason = (f"{p['tool']} completed 0 iterations in its {params.duration} s window: filling "
                            f"{p['qps']} QPs x tx_depth {params.tx_depth or 'default'} x {p['size']} B takes "
                            "longer than that here; lengthen the testbed's duration or lower tx_depth")
            self.rows.append(r)
        self.attach_cpu(self.cpu_usage(PAIR_SIDES, *self._side_window(res)))
        self._perf_rows(th, perf_path, dict(ctx, tool=p["tool"], size_bytes=p["size"], qps=p["qps"]))

    def _drop_samples(self, th: TestbedHosts, perf_path: str | None) -> None:
        """Remove the CPU-sample and perf files of a failed attempt from their hosts (it is run again)."""
        for role in list(PAIR_SIDES.values()):
            if role in self.cpu_files:
                host, path = self.cpu_files.pop(role)
                host.run(["rm", "-f", path], timeout=30 * self.slow)
        if perf_path:
            th.consumer.run(["rm", "-f", perf_path], timeout=30 * self.slow)

    def _serve_drive(self, th: TestbedHosts, port: int, p: dict, processes: int, threads: int,
                     out_path: str, start_at: str | None = None) -> tuple[list[str], list[str]]:
        bench_p = _python_tool(th, "producer", "peercache.bench.cli")
        # A kind may read with its own drive tool (same flags and document): hicache's batch_get_v1 loop.
        bench_c = _python_tool(th, "consumer", getattr(self.point.spec, "drive_module", "peercache.bench.cli"))
        ws = p.get("working_set") or max(4 * p["batch_size"],
                                         int(self.tb.get("working_set_bytes", WORKING_SET_BYTES)) // p["page_size"])
        common = ["--discovery-addr", f"{th.producer_addr}:{port}", "--protocol", p["protocol"],
                  "--layout", p["layout"], "--page-size", str(p["page_size"]), "--working-set", str(ws)]
        serve_devs, drive_devs = [], []
        if p.get("devices"):
            serve_devs = ["--devices", ",".join(self.tb.role_devices("producer", p["devices"]))]
            drive_devs = ["--devices", ",".join(self.tb.role_devices("consumer", p["devices"]))]
        serve = [*bench_p, "serve", *common, *serve_devs, "--readers", "1", "--max-wait", str(int(self.timeout)),
                 "--quiet", *(["--integrity"] if p.get("integrity") else [])]
        drive = [*bench_c, "drive", *common, *drive_devs, "--batch-size", str(p["batch_size"]),
                 "--concurrencies", str(threads), "--processes", str(processes),
                 "--duration", str(self.duration), "--warmup", str(self.warmup),
                 *([] if p.get("verify", True) else ["--no-verify"]),
                 *(["--integrity"] if p.get("integrity") else []),
                 *(["--max-channels", str(p["max_channels"])] if p.get("max_channels") else []),
                 *(["--tcp-poll-us", str(p["tcp_poll_us"])] if p.get("tcp_poll_us") is not None else []),
                 "--dir-cache-ttl", str(p.get("dir_cache_ttl", self.tb.get("dir_cache_ttl", DIR_CACHE_TTL_S))),
                 "--out", out_path]
        if self.slow > 1:
            drive += ["--ready-timeout", f"{30 * self.slow:.0f}"]
        if start_at:
            drive += ["--start-at", start_at]
        if p.get("destination") == "gpu":
            drive.append("--gpu")
        return serve, drive

    def _drive_rows(self, doc: dict, ctx: dict) -> None:
        for pt in doc["points"]:
            c = dict(ctx, threads=pt["concurrency"], processes=pt["processes"], batch=pt["batch_size"],
                     size_bytes=pt["page_size"])
            extra = {"verified": pt["verified"], "integrity": bool(doc["meta"].get("integrity")),
                     "window_start": pt.get("window_start"),
                     "window_end": pt.get("window_end"), "destination": ctx.get("extra", {}).get("destination")}
            c.pop("extra", None)
            status = "ok" if pt["status"] == "ok" else "failed"
            reason = pt["reason"]
            if status == "ok" and pt.get("batches") == 0:
                # Sanity: a point that completed no batch in its window measured nothing (not 0 GB/s).
                status, reason = "failed", (f"drive completed no batch in its {self.duration} s window (one batch "
                                            "takes longer than that here); lengthen the testbed's duration")
            def add(metric, value, unit, raw_unit=None):
                if status == "ok" and value is None:
                    self.rows.append(Row(metric=metric, value=None, unit=unit, status="not_measured",
                                         reason="not reported for this op", extra=extra, **c))
                else:
                    self.rows.append(Row(metric=metric, value=value if status == "ok" else None, unit=unit,
                                         status=status, reason=reason, raw_value=value,
                                         raw_unit=raw_unit or unit, extra=extra, **c))
            add("get_throughput", pt["gb_per_s"], "GB/s")
            add("pages_per_s", pt["pages_per_s"], "pages/s")
            for q in ("p50", "p99", "p999"):
                add(f"latency_{q}", pt["latency_us"][q], "us")
            add("hit_rate", pt["hit_rate"], "ratio")
            self.rows.append(Row(metric="errors", value=float(pt["errors"]), unit="count", extra=extra, **c))
            if pt["verified"]:
                # A verified run's evidence: how many GETs were checked, and how many failed the check.
                self.rows.append(Row(metric="keys", value=float(pt["keys"]), unit="count", extra=extra, **c))
                self.rows.append(Row(metric="verify_failures", value=float(pt["verify_failures"]), unit="count",
                                     extra=extra, **c))

    def peercache(self, th: TestbedHosts) -> None:
        p = self.point.params
        port = self.ports.allocate()
        out = f"/tmp/pclab-drive-{uuid.uuid4().hex[:10]}.json"
        serve, drive = self._serve_drive(th, port, p, p["processes"], p["threads"], out)
        ctx = self.ctx(tool=self.point.spec.row_tool(p), side="client", host=str(th.consumer), peer=str(th.producer),
                       protocol=p["protocol"], layout=p["layout"], devices=",".join(p.get("devices") or []),
                       numa_node=_numa_of(self.tb, p.get("devices") or []),
                       extra={"destination": p.get("destination", "host")})
        res, err = self._pair(serve, drive, Readiness(pattern=READY_LINE, timeout=60 * self.slow), th, p.get("devices") or [])
        self._record(res)
        try:
            doc = json.loads(_fetch(th.consumer, out))
            (self.raw_dir / "drive.json").write_text(json.dumps(doc, indent=1))
        except (ToolError, json.JSONDecodeError) as e:
            self.fail("get_throughput", "GB/s", err or f"drive wrote no result document: {e}",
                      **{k: ctx[k] for k in ("tool", "protocol", "layout")}, size_bytes=p["page_size"],
                      batch=p["batch_size"], threads=p["threads"], processes=p["processes"])
            return
        self._drive_rows(doc, ctx)
        first = (doc.get("points") or [{}])[0]
        self.attach_cpu(self.cpu_usage(PAIR_SIDES, first.get("window_start"), first.get("window_end")))
        if err and doc.get("status") == "ok":
            self.notes.append(f"pair reported a failure after a complete drive: {err}")

    def group(self, th: TestbedHosts) -> None:
        p = self.point.params
        specs, outs = [], {}
        for i, g in enumerate(p["groups"]):
            port = self.ports.allocate()
            outs[g] = f"/tmp/pclab-drive-{uuid.uuid4().hex[:10]}.json"
            gp = dict(p, devices=[g] if p["per_device"] else [])
            serve, drive = self._serve_drive(th, port, gp, p["readers"], p["threads"], outs[g],
                                             start_at=f"{{start_at}}+{GROUP_START_LEAD_S * self.slow}")
            pnode, psrc = numa_choice(self.tb, gp["devices"], "producer")
            cnode, csrc = numa_choice(self.tb, gp["devices"], "consumer")
            self._numa_choices.update({f"{g}/server": (pnode, psrc), f"{g}/client": (cnode, csrc)})
            dev = g if p["per_device"] else None
            pdev = (self.tb.role_devices("producer", [g]) or [None])[0] if dev else None
            drive = self.cpu_wrap(f"{g}/consumer", th, "consumer", drive)
            serve = self.cpu_wrap(f"{g}/producer", th, "producer", serve)
            specs.append(GroupSpec(g, [SideSpec(th.consumer, drive, cnode, dev)],
                                   SideSpec(th.producer, serve, pnode, pdev), Readiness(pattern=READY_LINE, timeout=60 * self.slow)))
        docs: dict[str, dict] = {}

        def measure(gr) -> WindowBytes:
            doc = json.loads(_fetch(th.consumer, outs[gr.name]))
            (self.raw_dir / gr.name).mkdir(exist_ok=True)
            (self.raw_dir / gr.name / "drive.json").write_text(json.dumps(doc, indent=1))
            docs[gr.name] = doc
            pt = doc["points"][0]
            if pt["status"] != "ok":
                raise RuntimeError(f"group {gr.name}: drive failed: {pt['reason']}")
            return WindowBytes(pt["bytes"], pt["window_start"], pt["window_end"])

        runner = GroupRunner(specs, client_timeout=self.timeout + GROUP_START_LEAD_S * self.slow, measure=measure,
                             log_dir=self.raw_dir, window_tolerance_s=0.05)
        ctx = self.ctx(tool="peercache-bench", host=str(th.consumer), peer=str(th.producer),
                       protocol=p["protocol"], layout=p["layout"], size_bytes=p["page_size"],
                       batch=p["batch_size"], threads=p["threads"], processes=p["readers"])
        try:
            res = runner.run()
            err = None
        except GroupFailed as e:
            res, err = e.result, str(e)
        for name, gr in res.groups.items():
            self.commands.update({f"{name}/{k}": v for k, v in gr.commands().items()})
            self.numa.update({f"{name}/{k}": v for k, v in gr.numa_bindings().items()})
        self._merge_numa_choices()
        if err:
            self.fail("get_throughput", "GB/s", err, side="aggregate", **{k: ctx[k] for k in (
                "tool", "protocol", "layout", "size_bytes", "batch", "threads", "processes")})
            return
        agg = res.aggregate
        cpu: dict[str, Any] = {}
        for name, g in agg.groups.items():
            cpu[name] = self.cpu_usage({"consumer": f"{name}/consumer", "producer": f"{name}/producer"},
                                       g["start"], g["end"])
            self.rows.append(Row(metric="get_throughput", value=g["bytes"] / g["seconds"] / 1e9, unit="GB/s",
                                 extra={"window_start": g["start"], "window_end": g["end"], "cpu": cpu[name],
                                        "verified": bool(docs[name]["points"][0].get("verified"))},
                                 **dict(ctx, side="per_device", devices=name)))
        self.rows.append(Row(metric="get_throughput", value=agg.rate_Bps / 1e9, unit="GB/s",
                             extra={"window_start": agg.window_start, "window_end": agg.window_end,
                                    "verified": all(d["points"][0].get("verified") for d in docs.values()),
                                    "start_skew_s": agg.start_skew_s, "end_skew_s": agg.end_skew_s,
                                    "groups": len(agg.groups), "cpu": cpusample.combine(cpu)},
                             **dict(ctx, side="aggregate", devices=",".join(agg.groups))))

    def node_api(self, th: TestbedHosts) -> None:
        """The batch API in one consumer process (tools/nodeloop) against a serve: pages/s, then a verified pass."""
        p = self.point.params
        port = self.ports.allocate()
        addr = f"{th.producer_addr}:{port}"
        serve = [*_python_tool(th, "producer", "peercache.bench.cli"), "serve", "--discovery-addr", addr,
                 "--protocol", p["protocol"], "--layout", p["layout"], "--page-size", str(p["page_size"]),
                 "--working-set", str(p["working_set"]), "--readers", "1", "--max-wait", str(int(self.timeout)),
                 "--quiet"]
        client = [*_python_tool(th, "consumer", "peercache.lab.tools.nodeloop"), "--discovery-addr", addr,
                  "--page-size", str(p["page_size"]), "--working-set", str(p["working_set"]),
                  "--batch", str(p["batch_size"]), "--duration", str(self.duration)]
        ctx = self.ctx(tool="peercache-node-api", side="client", host=str(th.consumer), peer=str(th.producer),
                       protocol=p["protocol"], layout=p["layout"], size_bytes=p["page_size"], batch=p["batch_size"],
                       threads=1, processes=1)
        res, err = self._pair(serve, client, Readiness(pattern=READY_LINE, timeout=60 * self.slow), th, [])
        self._record(res)
        if err:
            self.fail("pages_per_s", "pages/s", err, **{k: ctx[k] for k in ("tool", "protocol", "size_bytes", "batch")})
            return
        lines = [ln for ln in res.client.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            raise ParseError("nodeloop", "no JSON result line; read its log beside the result",
                             source=f"{self.run_id}/client")
        doc = json.loads(lines[-1])
        (self.raw_dir / "nodeloop.json").write_text(json.dumps(doc, indent=1))
        extra = {"gets": doc["gets"], "hits": doc["hits"], "seconds": doc["seconds"],
                 "working_set": doc["working_set"]}
        if doc["hits"] != doc["gets"]:
            # Sanity: every key of the published working set must hit; a miss means it measured something else.
            self.fail("pages_per_s", "pages/s", f"{doc['gets'] - doc['hits']} of {doc['gets']} GETs were not hits "
                      "(the working set is not all published, or serve evicted)",
                      **{k: ctx[k] for k in ("tool", "protocol", "size_bytes", "batch")})
        else:
            self.rows.append(Row(metric="pages_per_s", value=doc["pages_per_s"], unit="pages/s",
                                 raw_value=doc["pages_per_s"], raw_unit="pages/s", extra=extra, **ctx))
        self.rows.append(Row(metric="verified_keys", value=float(doc["verified_keys"]), unit="count", **ctx))
        self.rows.append(Row(metric="verify_failures", value=float(doc["verify_failures"]), unit="count", **ctx))
        self.attach_cpu(self.cpu_usage(PAIR_SIDES, *self._side_window(res)))

    def _local_only(self, th: TestbedHosts, what: str) -> str | None:
        # The redis-server (and the embedded directory dirbench hosts) run here, on 127.0.0.1.
        if not isinstance(th.producer, LocalHost):
            return (f"{what} runs on this host over 127.0.0.1 (its redis-server is started here); "
                    f"give the part place: loopback (its producer host is {th.producer})")
        return None

    def dirlookup(self, th: TestbedHosts) -> None:
        """Directory lookups/s at one batch size: dirbench against the embedded directory or a redis-server."""
        p = self.point.params
        ctx = self.ctx(tool="peercache-dirbench", side="client", host=str(th.producer), protocol="tcp",
                       batch=p["batch"], processes=p["clients"], threads=1)
        where = {k: ctx[k] for k in ("tool", "protocol", "batch", "processes")}
        why = self._local_only(th, "a dirlookup point")
        if why:
            self.fail("keys_per_s", "ops/s", why, **where)
            return
        with contextlib.ExitStack() as stack:
            if p["directory"] == "redis":
                srv = stack.enter_context(redis_server())
                spec, shown = srv.url, srv.url
                self.notes.append(f"redis-server {redis_launch.server_version()} on {srv.url} (no persistence)")
            else:
                spec = shown = f"127.0.0.1:{self.ports.allocate()}"
            argv = [*_python_tool(th, "producer", "peercache.bench.dirbench"), "--directory", spec,
                    "--batch", str(p["batch"]), "--keys", str(p["keys"]), "--clients", str(p["clients"]),
                    "--duration", str(self.duration), "--warmup", str(self.warmup),
                    *(["--path", p["path"]] if p.get("path") else [])]
            if self.slow > 1:
                argv += ["--ready-timeout", f"{60 * self.slow:.0f}"]
            self.commands["client"] = argv
            wrapped = self.cpu_wrap("consumer", th, "producer", argv)
            t0 = time.time()
            r = th.producer.run(wrapped, timeout=self.timeout)
            t1 = time.time()
        (self.raw_dir / "dirbench.log").write_text(r.stdout + r.stderr)
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            self.fail("keys_per_s", "ops/s", f"dirbench --directory {shown} exited {r.rc} without a result: "
                      f"{r.stderr.strip()[-300:]}", **where)
            return
        doc = json.loads(lines[-1])
        (self.raw_dir / "dirbench.json").write_text(json.dumps(doc, indent=1))
        res = doc.get("result") or {}
        extra = {"directory": p["directory"], "keys_published": p["keys"], "window_start": res.get("window_start"),
                 "window_end": res.get("window_end"), "verified_keys": res.get("verified_keys")}
        if doc["status"] != "ok":
            self.fail("keys_per_s", "ops/s", f"dirbench: {doc['error']}", **where)
        else:
            for metric, value in (("keys_per_s", res["keys_per_s"]), ("batches_per_s", res["batches_per_s"]),
                                  ("latency_p50", res["latency_us"]["p50"]),
                                  ("latency_p99", res["latency_us"]["p99"])):
                unit = "us" if metric.startswith("latency") else "ops/s"
                self.rows.append(Row(metric=metric, value=value, unit=unit, raw_value=value, raw_unit=unit,
                                     extra=extra, **ctx))
        for metric in ("misses", "verify_failures"):
            if metric in res:
                self.rows.append(Row(metric=metric, value=float(res[metric]), unit="count", extra=extra, **ctx))
        span = t1 - t0   # the clients' window is the end of the run (after spawn, publish and warm-up)
        self._attach_cpu_to("keys_per_s", self.cpu_usage({"consumer": "consumer"}, t0 + 0.4 * span, t1 - 0.1 * span))

    def _attach_cpu_to(self, metric: str, usage: dict[str, Any]) -> None:
        """The CPU evidence in the ``extra`` of the point's ``metric`` rows (kinds whose figure is not a bandwidth)."""
        for r in self.rows:
            if r.metric == metric:
                r.extra = dict(r.extra, cpu=usage)

    def redis_benchmark(self, th: TestbedHosts) -> None:
        """redis-benchmark's MGET of ``batch`` keys on a redis-server here: the raw limit of the Redis directory."""
        p = self.point.params
        ctx = self.ctx(tool="redis-benchmark", side="client", host=str(th.producer), protocol="tcp",
                       batch=p["batch"], processes=1, threads=p["clients"])
        where = {k: ctx[k] for k in ("tool", "protocol", "batch")}
        why = self._local_only(th, "a redis_benchmark point")
        if why:
            self.fail("keys_per_s", "ops/s", why, **where)
            return
        # The keys under which the Redis backend (prefix "pc") stores the bench's entries: its first
        # `batch` ones, or (keyspace) `keyspace` of them as redis-benchmark -r names them, a random
        # batch of which each MGET asks for.
        space = p.get("keyspace")
        if space:
            keys = [f"pc:e:pc/{redis_benchmark.RAND}"] * p["batch"]
            stored = [redis_benchmark.random_key("pc:e:pc/", i) for i in range(space)]
        else:
            keys = stored = [f"pc:e:pc/{i}" for i in range(p["batch"])]
        with redis_server() as srv:
            self.notes.append(f"redis-server {redis_launch.server_version()} on {srv.url} (no persistence)")
            for i in range(0, len(stored), 4096):
                srv.seed(stored[i:i + 4096], "v" * p["value_bytes"])
            # Calibration (also the warm-up): a short run, then -n sized to last about the duration.
            calib = redis_benchmark.mget_command(srv.port, keys, requests=max(200, 1000 * p["clients"]),
                                                 clients=p["clients"], keyspace=space)
            first = self._redis_benchmark_run(th, calib, "calibration", p["batch"])
            n = int(min(50_000_000, max(1000, first.rps * self.duration)))
            argv = redis_benchmark.mget_command(srv.port, keys, requests=n, clients=p["clients"], keyspace=space)
            self.commands["client"] = argv
            wrapped = self.cpu_wrap("consumer", th, "producer", argv)
            srv.keyspace_stats(reset=True)
            t0 = time.time()
            result = self._redis_benchmark_run(th, wrapped, "measured", p["batch"])
            t1 = time.time()
            read = srv.keyspace_stats()
        if read["keyspace_misses"] or read["keyspace_hits"] < n * p["batch"]:
            # redis-benchmark cannot tell a nil from a value: the server's counters say what was read
            self.fail("keys_per_s", "ops/s", f"redis-benchmark's MGETs read {read['keyspace_misses']} keys that "
                      f"were not stored ({read['keyspace_hits']} that were): the figure would not be of "
                      "stored entries; check the stored key names against the MGET's", **where)
            return
        extra = {"requests": n, "seconds": round(t1 - t0, 3), "value_bytes": p["value_bytes"],
                 "calibration_rps": first.rps, "keyspace": space, **read}
        self.rows += redis_benchmark.to_rows(result, extra=extra, **ctx)
        span = t1 - t0
        self._attach_cpu_to("keys_per_s", self.cpu_usage({"consumer": "consumer"}, t0 + 0.2 * span,
                                                         t1 - 0.2 * span))

    def _redis_benchmark_run(self, th: TestbedHosts, argv: list[str], label: str, batch: int):
        """One redis-benchmark run (bounded: it retries forever when it cannot connect), parsed and checked."""
        try:
            r = th.producer.run(argv, timeout=self.timeout)
            out, err, rc = r.stdout, r.stderr, r.rc
        except CommandTimeout as e:
            out, err, rc = e.completed.stdout, e.completed.stderr, None
        (self.raw_dir / f"redis-benchmark.{label}.csv").write_text(out)
        (self.raw_dir / f"redis-benchmark.{label}.stderr").write_text(err)
        te = redis_benchmark.classify_failure(out, err, rc, host=str(th.producer))
        if te is not None:
            raise te
        if rc is None:
            raise ToolError(host=str(th.producer), tool="redis-benchmark", kind="failed",
                            detail=f"the {label} run did not finish within {self.timeout:.0f} s",
                            check="read redis-benchmark.*.stderr beside the result")
        return redis_benchmark.mget_result(redis_benchmark.parse_csv(out, source=f"{self.run_id}/{label}"),
                                           batch, source=f"{self.run_id}/{label}")

    def memcpy(self, th: TestbedHosts) -> None:
        """The memory-copy ceiling of the producer, measured on each of its NUMA nodes (one row per node)."""
        p = self.point.params
        # Same region size and batch as the PeerCache points it is the limit for.
        batch = int(p.get("batch", MEMCPY_BATCH))
        ws = p.get("working_set") or max(4 * batch,
                                         int(self.tb.get("working_set_bytes", WORKING_SET_BYTES)) // p["size"])
        base = [*_python_tool(th, "producer", "peercache.lab.tools.memcpy"), "--size", str(p["size"]),
                "--working-set", str(ws), "--batch", str(batch), "--duration", str(self.duration)]
        r = th.producer.run(["cat", "/sys/devices/system/node/online"], timeout=30 * self.slow)
        nodes = parse_nodelist(r.stdout) if r.rc == 0 else []
        has_numactl = th.producer.run(["sh", "-c", "command -v numactl"], timeout=30 * self.slow).rc == 0
        ctx = self.ctx(tool="memcpy", protocol="shm", side="producer", host=str(th.producer),
                       size_bytes=p["size"], threads=1, processes=1)
        for node in nodes or [None]:
            argv, record = numa.bind(base, node, has_numactl and node is not None)
            role = "producer" if node is None else f"producer/node{node}"
            self.commands[role], self.numa[role] = argv, record
            wrapped = self.cpu_wrap(role, th, "producer", argv)
            t0 = time.time()
            r = th.producer.run(wrapped, timeout=self.timeout)
            t1 = time.time()
            (self.raw_dir / f"memcpy{'' if node is None else f'.node{node}'}.log").write_text(r.stdout + r.stderr)
            if r.rc != 0:
                self.fail("bw", "B/s", f"memcpy measurement on node {node} exited {r.rc}: {r.stderr.strip()[-300:]}",
                          tool="memcpy", protocol="shm", size_bytes=p["size"], numa_node=node)
                continue
            doc = json.loads(r.stdout.strip().splitlines()[-1])
            span = t1 - t0
            self.rows.append(Row(metric="bw", value=doc["bytes_per_s"], unit="B/s", raw_value=doc["bytes_per_s"],
                                 raw_unit="B/s", numa_node=node,
                                 extra={"seconds": doc["seconds"], "pages": doc["pages"],
                                        "working_set": doc["working_set"], "numa_binding": record,
                                        "cpu": self.cpu_usage({"producer": role}, t0 + 0.2 * span,
                                                              t1 - 0.2 * span)},
                                 **ctx))


def parse_nodelist(text: str) -> list[int]:
    """A sysfs node list ("0", "0-1", "0,2-3") as node numbers; [] when it cannot be read."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        a, _, b = part.partition("-")
        if not a.isdigit() or (b and not b.isdigit()):
            return []
        out += list(range(int(a), int(b or a) + 1))
    return out


def run(testbed_path: str, scenario: str, point_name: str, rep: int, out: str,
        scenarios_path: str | None = None) -> int:
    """Run one point and write its result; returns 0 when the result was written."""
    grids = experiments.load_scenarios(scenarios_path) if scenarios_path else experiments.load_scenarios()
    tb = experiments.load_testbed(testbed_path, grids)
    point = experiments.find_point(experiments.expand(tb, grids), scenario, point_name)
    run_point(tb, point, rep, out)
    return 0


def run_point(tb: experiments.Testbed, point: experiments.Point, rep: int, out: str | Path,
              hosts: TestbedHosts | None = None, quiet: bool = False) -> list[Row]:
    """Run one point on ``hosts`` (default: the testbed's, set up and torn down around it); write its result.

    Returns the point's rows (also written to ``out``); a failure is a failed row with the reason, never raised.
    """
    scenario, point_name = point.scenario, point.name
    out_path = Path(out)
    raw_dir = out_path.parent
    raw_dir.mkdir(parents=True, exist_ok=True)
    pr = PointRun(tb, point, rep, raw_dir)
    start = bench_meta.now_iso()
    host_note = None
    try:
        if point.skipped:
            pr.skip()
        else:
            with (contextlib.nullcontext(hosts) if hosts is not None
                  else testbed_hosts(tb, loopback=point.loopback)) as th:
                host_note = th.note
                devices = pr.port_devices()
                port = int(tb.get("ib_port", 1))
                before = crosscheck.sample_ports(th.consumer, devices, port) if devices else {}
                try:
                    getattr(pr, point.spec.runs_with)(th)
                    if devices:
                        pr.check_counters(before, crosscheck.sample_ports(th.consumer, devices, port),
                                          crosscheck.line_rates(th.consumer, devices, port))
                finally:
                    for host, path in pr.cpu_files.values():   # a failed point leaves its samples unread
                        host.run(["rm", "-f", path], timeout=30 * slowness())
    except Exception as e:  # recorded as a failed point (with its logs); the pipeline goes on
        if not isinstance(e, (ParseError, ToolError)):
            traceback.print_exc()
        pr.fail(point.spec.primary, point.spec.unit(),
                str(e) if isinstance(e, (ParseError, ToolError)) else f"{type(e).__name__}: {e}")
    if host_note:
        pr.notes.append(host_note)
    captures = {}
    for role in ("producer", "consumer"):
        cap = Path(tb["results"]) / "testbed" / f"{role}.json"
        if cap.exists():
            doc = json.loads(cap.read_text())
            captures[role] = doc.get("summary", doc)
    meta = RunMeta(run_id=pr.run_id, testbed=tb.name, experiment=tb.name, scenario=scenario, point=point_name,
                   repetition=rep, hosts=captures, commands=pr.commands, start=start, end=bench_meta.now_iso(),
                   git_revision=bench_meta.git_revision(), versions=bench_meta.versions(),
                   numa_binding=pr.numa, params=dict(point.params, kind=point.kind, skip_reason=point.skip_reason,
                                                     duration=pr.duration,
                                                     warmup=pr.warmup, notes=pr.notes, guest=guest_block()))
    redact_folder(raw_dir)   # its logs and documents: no secret leaves a point's raw folder
    write_result(out_path, meta, pr.rows)
    bad = [r for r in pr.rows if r.status == "failed"]
    state = "skipped" if point.skipped else ("FAILED" if bad else "ok")
    flagged = [n for n in pr.notes if "flagged" in n]
    if not quiet or bad:
        print(f"{pr.run_id}: {state}" + (f" ({bad[0].reason})" if bad else "")
              + (f" [{'; '.join(flagged)}]" if flagged else ""), flush=True, file=sys.stderr if quiet else sys.stdout)
    return pr.rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m peercache.lab.pipeline.runpoint", description=__doc__)
    p.add_argument("--testbed", required=True)
    p.add_argument("--scenario", required=True)
    p.add_argument("--point", required=True)
    p.add_argument("--rep", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("--scenarios", default=None, help="scenario grids [experiments/scenarios.yaml]")
    a = p.parse_args(argv)
    try:
        return run(a.testbed, a.scenario, a.point, a.rep, a.out, a.scenarios)
    except experiments.DefinitionError as e:
        print(f"runpoint: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
