"""Run one point of a testbed's scenarios and write its raw result folder.

``python -m peercache.lab.pipeline.runpoint --testbed T.yaml --scenario S --point P
--rep K --out data/raw/<tb>/<S>/<P>/rep<K>/result.json`` starts the pair (or
the per-NIC groups) on the testbed's hosts, keeps both sides' logs beside
the result, parses the tools' output into tidy rows and writes
``result.json`` with the run's meta block. A point whose hardware the
testbed lacks is written as skipped with the reason; a point that fails is
written as failed with the reason and its logs, so the report shows it
instead of silently dropping it.

What a point of each kind launches, checks and extracts is its kind's module
(:mod:`peercache.lab.pipeline.points`); this module is what they share: the
hosts, the :class:`PointRun` harness a kind's ``run`` is given (pairs, CPU
and NUMA evidence, port counters, perf stat, cleanup) and the result's meta.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import sys
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from peercache import atomic
from peercache.lab.system import cpusample, crosscheck
from peercache.lab.pipeline import experiments, outcome
from peercache.lab.pipeline.points.bounds import SERVER_EXIT_S, point_bound
from peercache.lab.pipeline.points.memcpy import parse_nodelist  # noqa: F401 (its home was here)
from peercache.lab.tools import perfstat
from peercache.lab.launch import netns
from peercache.lab.launch import redis as redis_launch
from peercache.lab.system import hostinfo, numa
from peercache.lab.errors import ParseError, ToolError
from peercache.lab.launch.hosts import Host, cpu_list, parse_host
from peercache.lab.system.slowness import HOST_COMMAND_S, scaled, slowness
from peercache.lab.launch.runners import (GroupFailed, GroupRunner, PairFailed, PairRunner, PortAllocator, Readiness,
                                          SideSpec)
from peercache.lab.tidy import Row, RunMeta, convert, redact_folder, write_result
from peercache.bench import meta as bench_meta

#: Labels of the CPU evidence of a pair -> the role whose process tree was sampled.
PAIR_SIDES = {"consumer": "consumer", "producer": "producer"}
#: Bytes of the region a point's pages fill when it names no working set (memcpy, serve).
WORKING_SET_BYTES = 256 << 20

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
class ClusterMember:
    """One host of a point's testbed, opened: its name, :class:`Host`, address, roles and Python."""

    name: str
    host: Host
    address: str
    roles: tuple[str, ...]
    #: the argv prefix that runs Python with PeerCache there (:func:`host_python`)
    python: list[str]
    #: its RDMA devices, as it names them (a host list's ``devices``; the pair's: the testbed's for its role)
    devices: tuple[str, ...] = ()


@dataclass
class TestbedHosts:
    """The hosts of a point: the producer/consumer pair, their addresses, why they differ from the definition,
    and every host of the testbed (``cluster``: a host list's hosts, or the pair)."""

    producer: Host
    consumer: Host
    producer_addr: str
    consumer_addr: str
    note: str | None
    #: role -> the argv prefix that runs Python with PeerCache there (:func:`host_python`); absent: as it says
    python: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    #: the testbed's ``bench_command`` (runs peercache-bench on remote hosts instead of python -m)
    bench_command: list[str] | None = None
    #: every host, in definition order (the pair's Host objects are among them)
    cluster: list[ClusterMember] = dataclasses.field(default_factory=list)

    def host(self, role: str) -> Host:
        """The host of ``role`` (producer or consumer)."""
        if role not in ROLES:
            raise ValueError(f"role {role!r} is not producer or consumer")
        return self.producer if role == "producer" else self.consumer

    def python_of(self, role: str) -> list[str]:
        """The argv prefix that runs Python with PeerCache on the ``role`` host."""
        return list(self.python.get(role) or host_python(self.host(role)))

    def members(self, role: str) -> list[ClusterMember]:
        """The hosts with ``role`` (producer, consumer or directory), in definition order."""
        if role not in experiments.CLUSTER_ROLES:
            raise ValueError(f"role {role!r} is not one of {', '.join(experiments.CLUSTER_ROLES)}")
        return [m for m in self.cluster if role in m.roles]

    def member(self, name: str) -> ClusterMember:
        """The host called ``name``."""
        for m in self.cluster:
            if m.name == name:
                return m
        raise ValueError(f"no host {name!r}; the testbed's hosts: {', '.join(m.name for m in self.cluster)}")


#: Both sides on this host over 127.0.0.1 (a part with ``place: loopback``: same-host shm figures).
LOOPBACK_HOSTS = {"producer": {"host": "local", "address": "127.0.0.1"},
                  "consumer": {"host": "local", "address": "127.0.0.1"}}


def _on_loopback(cluster: list[experiments.ClusterHost]) -> list[experiments.ClusterHost]:
    """``cluster`` with every host on this machine's loopback (names and roles kept)."""
    return [dataclasses.replace(h, **LOOPBACK_HOSTS["producer"], python=None) for h in cluster]


@contextlib.contextmanager
def testbed_hosts(tb: experiments.Testbed, loopback: bool = False) -> Iterator[TestbedHosts]:
    """Hosts of ``tb`` (or this host for every one, ``loopback``); creates and always removes its netns pair or
    bridge if it has one, and closes the hosts (an ssh host's master connection) on leaving.

    Without namespaces (no root) a pair falls back to ``fallback_hosts``, and a host list to this machine's
    loopback for every host; ``note`` says so."""
    hosts, pair, bridge, note = (LOOPBACK_HOSTS if loopback else tb["hosts"]), None, None, None
    cluster = tb.cluster
    if loopback:
        cluster = _on_loopback(cluster)
    elif tb.get("netns_pair"):
        ok, why = netns.available()
        if ok:
            pair = netns.NetnsPair(tb["netns_pair"]["tag"], tb["netns_pair"]["index"]).create()
        else:
            hosts = tb.get("fallback_hosts") or hosts
            cluster = [experiments.ClusterHost.from_def(r, hosts[r], (r,)) for r in ROLES]
            note = f"network namespaces unavailable ({why}); producer and consumer share loopback"
    elif tb.get("netns_bridge"):
        ok, why = netns.available()
        if ok:
            bridge = tb.netns_bridge()
            bridge.create()
        else:
            cluster = _on_loopback(cluster)
            note = (f"network namespaces unavailable ({why}); all {len(cluster)} hosts of the testbed run on this "
                    "machine's loopback 127.0.0.1, so nothing crosses a network between them")
    if tb.is_cluster:
        prod_name, cons_name = (h.name for h in tb.pair)
        hosts = {"producer": next(h for h in cluster if h.name == prod_name).as_host_def(),
                 "consumer": next(h for h in cluster if h.name == cons_name).as_host_def()}
    opened: list[Host] = []
    notes: list[str] = []
    try:
        if tb.is_cluster:
            members = []
            for h in cluster:
                d = h.as_host_def()
                opened.append(open_host(d, notes))
                members.append(ClusterMember(h.name, opened[-1], h.address, h.roles,
                                             host_python(opened[-1], d), tuple(h.devices or ())))
            by_name = {m.name: m for m in members}
            prod, cons = (by_name[h.name].host for h in tb.pair)
        else:
            for role in ROLES:
                opened.append(open_host(hosts[role], notes))
            prod, cons = opened
            members = [ClusterMember(role, h, hosts[role]["address"], (role,), host_python(h, hosts[role]),
                                     tuple(tb.role_devices(role, tb.devices)))
                       for role, h in zip(ROLES, opened)]
        note = "; ".join(n for n in (note, *notes) if n) or None
        yield TestbedHosts(prod, cons, hosts["producer"]["address"], hosts["consumer"]["address"], note,
                           python={"producer": host_python(prod, hosts["producer"]),
                                   "consumer": host_python(cons, hosts["consumer"])},
                           bench_command=list(tb.get("bench_command") or []) or None, cluster=members)
    finally:
        for h in opened:
            try:
                h.close()
            except Exception as e:  # a master that will not exit times out on its own (ControlPersist)
                print(f"{h}: closing the connection failed: {e}", file=sys.stderr)
        if pair is not None:
            pair.remove()
        if bridge is not None:
            bridge.remove()


def open_host(host_def: dict[str, Any], notes: list[str]) -> Host:
    """The host of a definition's host block, pinned to its ``cpus``. A host of this machine whose CPUs this
    process may not use (a machine with fewer) runs unpinned, and ``notes`` gets a line saying so."""
    host = parse_host(host_def["host"])
    cpus = host_def.get("cpus")
    if cpus is None:
        return host
    if host.on_this_machine:
        allowed = os.sched_getaffinity(0)
        missing = cpu_list(cpus) - allowed
        if missing:
            usable = ",".join(str(c) for c in sorted(allowed))
            notes.append(f"{host}: CPUs {cpus} asked for, but this machine lets us run on {usable} only "
                         f"(CPU {min(missing)} missing); its processes run unpinned")
            return host
    return host.pin(cpus)


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
    return _node_of_devices(tb.get("numa") or {}, tb.role_devices(role, devices), *_captured_nics(tb, role))


def member_numa_choice(tb: experiments.Testbed, member: ClusterMember) -> tuple[int | None, str]:
    """(NUMA node, its source or why none) of the processes a cluster point runs on ``member``: the node its
    devices share (the testbed's ``numa:`` map, else its own capture ``testbed/<name>.json``)."""
    if not member.devices:
        return None, f"host {member.name} lists no devices"
    return _node_of_devices(tb.get("numa") or {}, list(member.devices), *_captured_nics(tb, member.name))


def _node_of_devices(static: dict[str, int], names: list[str], nics: dict[str, dict],
                     path: str) -> tuple[int | None, str]:
    """The node devices ``names`` share: the static map first, else their capture ``nics`` (read from ``path``)."""
    nodes, sources = set(), []
    for name in names:
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
    r = host.run(["cat", path], timeout=scaled(HOST_COMMAND_S))
    host.run(["rm", "-f", path], timeout=scaled(HOST_COMMAND_S))
    if r.rc != 0:
        raise ToolError(host=str(host), tool="cat", kind="failed", returncode=r.rc,
                        detail=f"could not read {path}: {r.stderr.strip()}",
                        check="the tool did not write its output file; read its log")
    return r.stdout


def canonical_metric(name: str) -> str:
    """perf event names as tidy metric names: 'L1-dcache-load-misses' -> 'l1_dcache_load_misses'."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


class PointRun:
    """The harness one point runs in: its kind's ``run`` (:meth:`Kind.run`) launches through it and adds its rows;
    it collects rows, commands, bindings and notes for the meta block, and keeps what every kind shares (the
    pair, CPU and NUMA evidence, port counters, perf stat, cleanup)."""

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
        base = int(tb.get("base_port", experiments.DEFAULT_BASE_PORT))
        self.ports = PortAllocator(base, base + experiments.POINT_PORTS - 1)
        # A part may set its own duration and warm-up (the bench's short verification runs).
        dur = float(point.params.get("duration", tb["duration"]))
        self.duration, self.warmup = dur, float(point.params.get("warmup", tb["warmup"]))
        #: Waits (never the measured window) stretch by the machine's slowness: a guest is slow, not hung.
        self.slow = slowness()
        self.timeout = point_bound(point.spec.windows(point.params), dur, self.warmup, self.slow)

    def scaled(self, seconds: float) -> float:
        """``seconds``, a bound on a plain machine, stretched by this point's slowness (every wait a kind sets)."""
        return scaled(seconds, self.slow)

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
        return self.cpu_wrap_on(label, th.host(role), th.python_of(role), argv)

    def cpu_wrap_on(self, label: str, host: Host, python: list[str], argv: list[str]) -> list[str]:
        """``argv`` under the CPU sampler on ``host``, whose Python (with PeerCache) ``python`` runs; its
        samples (kept under ``label``) are read back by :meth:`cpu_usage` (a cluster's hosts)."""
        path = f"/tmp/pclab-cpu-{uuid.uuid4().hex[:10]}.jsonl"
        self.cpu_files[label] = (host, path)
        return cpusample.wrap(argv, path, [*python, "-m", "peercache.lab.system.cpusample"])

    def cpu_usage(self, roles: dict[str, str], start: float | None, end: float | None) -> dict[str, Any]:
        """{label: usage over [start, end]} for the wrapped ``roles`` ({label: role}); files kept in raw_dir."""
        return self.cpu_usage_windows(roles, [(start, end)])[0]

    def cpu_usage_windows(self, roles: dict[str, str],
                          windows: list[tuple[float | None, float | None]]) -> list[dict[str, Any]]:
        """:meth:`cpu_usage` over each of ``windows`` from the one set of samples per role (a tool that sweeps
        inside one run: one window per sweep point)."""
        out: list[dict[str, Any]] = [{} for _ in windows]
        for label, role in roles.items():
            if role not in self.cpu_files:
                continue
            host, path = self.cpu_files.pop(role)
            try:
                text = _fetch(host, path)
            except ToolError as e:
                for o in out:
                    o[label] = {"reason": f"no CPU samples: {e}"}
                continue
            atomic.write_text(self.raw_dir / f"{role.replace('/', '_')}.cpu.jsonl", text)
            samples = cpusample.read_samples(text)
            for o, (start, end) in zip(out, windows):
                use = cpusample.window_usage(samples, start, end) if start and end else None
                o[label] = use.as_dict() if use else {"reason": "fewer than two CPU samples inside the window"}
            self.numa_evidence(role, host, text)
        return out

    # -- NUMA binding evidence ----------------------------------------------------------
    def merge_numa_choices(self) -> None:
        """Beside each side's binding record: the NIC's node and where it came from (even when not bound)."""
        for side, (node, source) in self._numa_choices.items():
            if side in self.numa:
                self.numa[side] = dict(self.numa[side], nic_node=node, node_source=source)

    def _host_nodes(self, host: Host, samples: list[dict]) -> tuple[dict, str]:
        """The NUMA nodes' CPU lists of the host a process ran on: its hostinfo capture, else the sampler's reading."""
        spec = getattr(host, "spec", str(host))
        if self._captures is None:
            self._captures = []
            # the pair's producer.json and consumer.json, and a cluster testbed's <name>.json per host
            order = {"producer.json": 0, "consumer.json": 1}
            for path in sorted((Path(self.tb["results"]) / "testbed").glob("*.json"),
                               key=lambda f: (order.get(f.name, 2), f.name)):
                try:
                    self._captures.append(json.loads(path.read_text()) | {"_file": path.name})
                except (OSError, ValueError, TypeError):
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

    def attach_cpu_to(self, metric: str, usage: dict[str, Any]) -> None:
        """The CPU evidence in the ``extra`` of the point's ``metric`` rows (kinds whose figure is not a bandwidth)."""
        for r in self.rows:
            if r.metric == metric:
                r.extra = dict(r.extra, cpu=usage)

    def attach_pair_cpu(self, start: float | None, end: float | None) -> None:
        """The pair's CPU evidence (both sides, :data:`PAIR_SIDES`) over [start, end] in its throughput rows."""
        self.attach_cpu(self.cpu_usage(PAIR_SIDES, start, end))

    def pair_cpu_windows(self, windows: list[tuple[float | None, float | None]]) -> list[dict[str, Any]]:
        """The pair's CPU evidence (both sides) over each of ``windows`` (a tool that sweeps inside one run)."""
        return self.cpu_usage_windows(PAIR_SIDES, windows)

    def pair_window(self, res) -> tuple[float | None, float | None]:
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
            pc = crosscheck.check({d: before[d] for d in devs if d in before},
                                  {d: after[d] for d in devs if d in after},
                                  {d: rates.get(d) for d in devs}, bps, self.figure_window(r, bps),
                                  direction=self.point.spec.counter_direction(r))
            r.extra = dict(r.extra, **pc.as_extra())
            bad = [f for f in pc.flags if f in ("above_line_rate", "counter_disagreement")]
            if bad:
                self.notes.append(f"{r.metric} {r.side} {r.devices}: flagged {', '.join(bad)}: "
                                  + "; ".join(pc.messages))

    def figure_window(self, r: Row, bps: float) -> float:
        """The seconds a bandwidth figure covers: the point's duration unless its kind says otherwise
        (perftest run by count: the time its bytes took at that rate)."""
        return self.point.spec.figure_window(self.point.params, r, bps, self.duration)

    # -- what every kind's run uses ------------------------------------------------------
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

    def python_tool(self, th: TestbedHosts, role: str, module: str) -> list[str]:
        """argv that runs ``python -m module`` on the ``role`` host (:func:`_python_tool`)."""
        return _python_tool(th, role, module)

    def fetch(self, host: Host, path: str) -> str:
        """The text of the file a tool wrote at ``path`` on ``host``, which is then removed."""
        return _fetch(host, path)

    def numa_of(self, devices: list[str], role: str = "consumer") -> int | None:
        """The NUMA node of the ``role`` side of this point using ``devices`` (:func:`numa_choice`), or None."""
        return _numa_of(self.tb, devices, role)

    def numa_side(self, side: str, devices: list[str], role: str) -> int | None:
        """The node the binding ``side`` (server, client, g/server ...) of this point is for, on the ``role``
        host using ``devices``; the choice and its source go beside that side's numa_binding record."""
        node, source = numa_choice(self.tb, devices, role)
        self._numa_choices[side] = (node, source)
        return node

    def numa_member(self, side: str, member: ClusterMember) -> int | None:
        """The node the binding ``side`` (h1/server, h1/client, h1/directory ...) of a cluster point is for, on
        ``member`` (:func:`member_numa_choice`); the choice and its source go beside that side's record."""
        node, source = member_numa_choice(self.tb, member)
        self._numa_choices[side] = (node, source)
        return node

    def redis_server(self):
        """The point's redis-server on 127.0.0.1, emptied (:func:`redis_server`)."""
        return redis_server()

    def working_set(self, pages: int | None, size: int, batch: int) -> int:
        """Pages in a point's region: ``pages`` when the point names them, else the testbed's
        ``working_set_bytes`` / ``size`` (at least four batches)."""
        return pages or max(4 * batch, int(self.tb.get("working_set_bytes", WORKING_SET_BYTES)) // size)

    def local_only(self, th: TestbedHosts, what: str) -> str | None:
        """Why ``what`` cannot run on ``th`` (None: it can): its servers run here, on 127.0.0.1."""
        # The redis-server (and the embedded directory dirbench hosts) run here, on 127.0.0.1.
        if not th.producer.shares_our_loopback:
            return (f"{what} runs on this host over 127.0.0.1 (its redis-server is started here); "
                    f"give the part place: loopback (its producer host is {th.producer})")
        return None

    def perf_wrap(self, argv: list[str]) -> tuple[list[str], str | None]:
        """``argv`` under perf stat when the point asks for it and the testbed allows it (its ``no_perf_stat``
        says why not), and where its counters are written."""
        if not self.point.params.get("perf_stat") or self.tb.get("no_perf_stat"):
            return argv, None
        path = f"/tmp/pclab-perf-{uuid.uuid4().hex[:10]}.csv"
        return perfstat.wrap(argv, path), path

    def perf_rows(self, th: TestbedHosts, path: str | None, ctx: dict) -> None:
        """The client's perf stat counters (written at ``path`` on the consumer) as rows; where the testbed
        did not let perf stat run, each counter as not measured, with the testbed's reason."""
        why = self.tb.get("no_perf_stat")
        if path is None and self.point.params.get("perf_stat") and why:
            self.rows += [Row(metric=m, value=None, unit=u, status="not_measured",
                              reason=f"perf stat not run on this testbed: {why}", **{"tool": "perf", **ctx})
                          for m, u in [*((canonical_metric(e), "count") for e in perfstat.DEFAULT_EVENTS),
                                       ("ipc", "ratio")]]
            return
        if path is None:
            return
        text = _fetch(th.consumer, path)
        atomic.write_text(self.raw_dir / "client.perf.csv", text)
        for r in perfstat.to_rows(perfstat.parse_csv(text, source=str(self.raw_dir / "client.perf.csv")),
                                  **ctx):
            r.metric = canonical_metric(r.metric)
            self.rows.append(r)

    def pair(self, server: list[str], client: list[str], ready: Readiness, th: TestbedHosts,
             devices: list[str], server_exits: bool = True, warmup: list[str] | None = None):
        """Run ``server`` on the producer and ``client`` on the consumer, each bound to its NIC's node and
        under the CPU sampler (``warmup``: a client run before the measured one, bound alike, not sampled, its
        figure discarded); (result, None), or (what there is, why) when the pair failed."""
        pnode = self.numa_side("server", devices, "producer")
        cnode = self.numa_side("client", devices, "consumer")
        pdev = (self.tb.role_devices("producer", devices) or [None])[0]
        dev = devices[0] if devices else None
        server = self.cpu_wrap("producer", th, "producer", server)
        client = self.cpu_wrap("consumer", th, "consumer", client)
        runner = PairRunner(SideSpec(th.producer, server, pnode, pdev), SideSpec(th.consumer, client, cnode, dev),
                            ready, client_timeout=self.timeout, server_exits=server_exits,
                            server_timeout=self.scaled(SERVER_EXIT_S),
                            log_dir=self.raw_dir, name=self.point.name,
                            warmup=SideSpec(th.consumer, warmup, cnode, dev) if warmup else None)
        try:
            return runner.run(), None
        except PairFailed as e:
            return e.result, str(e)

    def run_group(self, runner: GroupRunner) -> tuple[Any, str | None]:
        """Run ``runner``: (its result, None), or (what there is, why it failed); every group's commands are
        kept for the meta block either way."""
        try:
            res, err = runner.run(), None
        except GroupFailed as e:
            res, err = e.result, str(e)
        for name, gr in res.groups.items():
            self.commands.update({f"{name}/{k}": v for k, v in gr.commands().items()})
            self.numa.update({f"{name}/{k}": v for k, v in gr.numa_bindings().items()})
        self.merge_numa_choices()
        return res, err

    def run_pair(self, kind, th: TestbedHosts) -> None:
        """Run this point of the pair kind ``kind`` (its launch, read and rows) on ``th`` through the one path
        every pair kind shares (:func:`peercache.lab.pipeline.outcome.run_pair`)."""
        outcome.run_pair(self, kind, th)

    def record(self, res) -> None:
        """The commands and NUMA bindings of a pair's result, for the meta block."""
        if res is None:
            return
        self.commands.update(res.commands())
        self.numa.update(res.numa_bindings())
        self.merge_numa_choices()

    def drop_samples(self, th: TestbedHosts, perf_path: str | None) -> None:
        """Remove the CPU-sample and perf files of a failed attempt from their hosts (it is run again)."""
        for role in list(PAIR_SIDES.values()):
            if role in self.cpu_files:
                host, path = self.cpu_files.pop(role)
                host.run(["rm", "-f", path], timeout=self.scaled(HOST_COMMAND_S))
        if perf_path:
            th.consumer.run(["rm", "-f", perf_path], timeout=self.scaled(HOST_COMMAND_S))


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
                    point.spec.run(pr, th)
                    if devices:
                        pr.check_counters(before, crosscheck.sample_ports(th.consumer, devices, port),
                                          crosscheck.line_rates(th.consumer, devices, port))
                finally:
                    for host, path in pr.cpu_files.values():   # a failed point leaves its samples unread
                        host.run(["rm", "-f", path], timeout=pr.scaled(HOST_COMMAND_S))
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
