"""Testbed and scenario definitions: load, validate, expand into points.

A testbed (``experiments/testbeds/*.yaml``) names the two hosts, their
devices and what hardware they have; ``experiments/scenarios.yaml`` holds
each scenario's parameter grid in an ``rdma`` form and a ``local`` form.
:func:`expand` turns the pair into :class:`Point` s, one per measurement,
and marks the points whose hardware the testbed lacks as skipped with the
reason. Nothing here starts a process.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import yaml

EXPERIMENTS_DIR = Path(__file__).resolve().parents[3] / "experiments"
SCHEMA_FILE = EXPERIMENTS_DIR / "testbed.schema.yaml"
SCENARIOS_FILE = EXPERIMENTS_DIR / "scenarios.yaml"
SCENARIOS = ("single_nic", "multi_rail", "whole_machine", "gpudirect", "msgsize_sweep")


class DefinitionError(ValueError):
    """A testbed or scenario file is invalid; the message names file and field."""


@dataclass
class Testbed:
    """A validated testbed definition."""

    path: Path
    doc: dict[str, Any]

    @property
    def name(self) -> str:
        return self.doc["name"]

    @property
    def form(self) -> str:
        return self.doc["form"]

    @property
    def devices(self) -> list[str]:
        """The RDMA devices, as the consumer names them (port counters are read there)."""
        return list(self.doc.get("devices") or [])

    def role_devices(self, role: str, devices: list[str]) -> list[str]:
        """``devices`` (consumer names) as host ``role`` names them (``hosts.<role>.devices``)."""
        own = self.doc["hosts"][role].get("devices")
        if not own:
            return list(devices)
        return [own[self.devices.index(d)] for d in devices]

    @property
    def guest(self) -> dict[str, Any] | None:
        """The Soft-RoCE guest the measurements run in, or None (they run on the hosts)."""
        return self.doc.get("guest")

    def __getitem__(self, key: str) -> Any:
        return self.doc[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.doc.get(key, default)


@dataclass
class Point:
    """One measurement to run: what, with which parameters, or why it is skipped."""

    scenario: str
    name: str
    kind: str                     #: iperf3 | perftest | peercache | group | memcpy | skip
    params: dict[str, Any] = field(default_factory=dict)
    skip_reason: str | None = None


def _load_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise DefinitionError(f"{path}: no such file; testbeds live in {EXPERIMENTS_DIR / 'testbeds'}")
    except yaml.YAMLError as e:
        raise DefinitionError(f"{path}: not valid YAML: {e}")


def _field(err: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in err.absolute_path) or "(top level)"


def load_testbed(path: str | Path) -> Testbed:
    """Read and validate a testbed file; DefinitionError names the bad field."""
    path = Path(path)
    doc = _load_yaml(path)
    schema = _load_yaml(SCHEMA_FILE)
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(doc),
                    key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"  field '{_field(e)}': {e.message}" for e in errors[:10]]
        raise DefinitionError(f"{path}: invalid testbed definition\n" + "\n".join(lines)
                              + f"\n(see {SCHEMA_FILE.relative_to(EXPERIMENTS_DIR.parent)})")
    if doc["form"] == "rdma" and not doc.get("devices"):
        raise DefinitionError(f"{path}: field 'devices': an rdma testbed needs at least one RDMA device")
    if doc["form"] == "rdma" and not doc["capabilities"]["rdma"]:
        raise DefinitionError(f"{path}: field 'form': rdma form on a testbed whose "
                              "capabilities.rdma is false; use form: local")
    for role in ("producer", "consumer"):
        own = doc["hosts"][role].get("devices")
        if own is not None and len(own) != len(doc.get("devices") or []):
            raise DefinitionError(f"{path}: field 'hosts.{role}.devices': {len(own)} names for the "
                                  f"{len(doc.get('devices') or [])} devices of field 'devices' (one each, same order)")
    return Testbed(path, doc)


def load_scenarios(path: str | Path = SCENARIOS_FILE) -> dict[str, Any]:
    """Read the scenario grids and check every scenario has both forms."""
    path = Path(path)
    doc = _load_yaml(path)
    if not isinstance(doc, dict):
        raise DefinitionError(f"{path}: expected a map of scenario name -> definition")
    for name in SCENARIOS:
        sc = doc.get(name)
        if not isinstance(sc, dict) or not isinstance(sc.get("rdma"), dict) or not isinstance(sc.get("local"), dict):
            raise DefinitionError(f"{path}: field '{name}': each scenario needs 'rdma' and 'local' grids")
    unknown = set(doc) - set(SCENARIOS)
    if unknown:
        raise DefinitionError(f"{path}: unknown scenario(s) {sorted(unknown)}; known: {SCENARIOS}")
    return doc


def _sizes(n: int) -> str:
    for unit, div in (("M", 1 << 20), ("K", 1 << 10)):
        if n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def _raw_points(scenario: str, grid: dict) -> list[Point]:
    tool = grid["tool"]
    pts = []
    if tool == "iperf3":
        # processes: parallel client processes, each with its own server port (iperf3 3.x runs all
        # -P streams of one process in one thread, so one process is no limit for several readers).
        for procs, streams, length in itertools.product(grid.get("processes", [1]), grid["streams"],
                                                        grid["length"]):
            name = f"iperf3_P{streams}_l{_sizes(length)}" if procs == 1 else \
                f"iperf3_x{procs}_P{streams}_l{_sizes(length)}"
            pts.append(Point(scenario, name, "iperf3", {"streams": streams, "length": length, "processes": procs,
                                                        "perf_stat": bool(grid.get("perf_stat"))}))
    elif tool == "memcpy":
        for size in grid["size"]:
            pts.append(Point(scenario, f"memcpy_s{_sizes(size)}", "memcpy", {"size": size}))
    else:
        for qps, size in itertools.product(grid["qps"], grid["size"]):
            pts.append(Point(scenario, f"{tool}_q{qps}_s{_sizes(size)}", "perftest",
                             {"tool": tool, "qps": qps, "size": size, "tx_depth": grid.get("tx_depth"),
                              "perf_stat": bool(grid.get("perf_stat"))}))
    return pts


def _peercache_points(scenario: str, grid: dict, devices: list[str]) -> list[Point]:
    pts = []
    dests = grid.get("destinations", ["host"])
    for page, batch, (procs, threads), dest in itertools.product(
            grid["page_size"], grid["batch_size"], grid["processes_x_threads"], dests):
        name = f"pc_{grid['protocol']}_p{procs}x{threads}_s{_sizes(page)}_b{batch}" + \
               ("" if dest == "host" else f"_{dest}")
        pts.append(Point(scenario, name, "peercache", {
            "protocol": grid["protocol"], "layout": grid["layout"], "page_size": page,
            "batch_size": batch, "processes": procs, "threads": threads, "destination": dest,
            "devices": devices if grid.get("all_devices") else devices[:1]}))
    return pts


def _group_points(scenario: str, grid: dict, devices: list[str]) -> list[Point]:
    groups = devices or [f"group{i}" for i in range(grid.get("groups", 2))]
    return [Point(scenario, f"group_{grid['protocol']}_n{len(groups)}_s{_sizes(page)}_b{batch}", "group", {
        "protocol": grid["protocol"], "layout": grid["layout"], "page_size": page, "batch_size": batch,
        "groups": groups, "readers": grid["readers_per_nic"], "threads": grid["threads"],
        "per_device": bool(devices)})
        for page, batch in itertools.product(grid["page_size"], grid["batch_size"])]


def missing_hardware(testbed: Testbed, scenario: dict) -> str | None:
    """Why the testbed cannot run this scenario (None when it can)."""
    caps = testbed["capabilities"]
    for need in scenario.get("requires", []):
        if not caps.get(need):
            what = {"gpu": "a CUDA GPU on the consumer", "rdma": "an RDMA NIC on both hosts"}[need]
            return (f"testbed {testbed.name!r} has no {need.upper()} (capabilities.{need}: false); "
                    f"this scenario needs {what}")
    return None


def expand(testbed: Testbed, scenarios: dict[str, Any] | None = None) -> list[Point]:
    """Every point of every scenario the testbed runs, in run order."""
    scenarios = scenarios or load_scenarios()
    points: list[Point] = []
    overrides = testbed.get("grid_overrides") or {}
    for name in testbed["scenarios"]:
        sc = scenarios[name]
        grid = sc[testbed.form]
        for part, changes in (overrides.get(name) or {}).items():
            if part not in grid:
                raise DefinitionError(f"{testbed.path}: field 'grid_overrides.{name}.{part}': the "
                                      f"{testbed.form} form of {name} has no part {part!r} "
                                      f"(it has {', '.join(grid)})")
        grid = {part: {**g, **(overrides.get(name) or {}).get(part, {})} for part, g in grid.items()}
        pts: list[Point] = []
        for part, g in grid.items():
            if part in ("raw", "shm_limit"):
                pts += _raw_points(name, g)
            elif part in ("peercache", "peercache_shm"):
                pts += _peercache_points(name, g, testbed.devices)
            elif part == "group":
                pts += _group_points(name, g, testbed.devices)
            else:
                raise DefinitionError(f"{SCENARIOS_FILE}: field '{name}.{testbed.form}.{part}': unknown "
                                      "part (raw, shm_limit, peercache, peercache_shm, group)")
        why = missing_hardware(testbed, sc)
        if why:
            pts = [Point(p.scenario, p.name, "skip", p.params, why) for p in pts]
        points += pts
    names = [(p.scenario, p.name) for p in points]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise DefinitionError(f"two points share a name: {sorted(dup)}")
    return points


def find_point(points: list[Point], scenario: str, name: str) -> Point:
    """The point called ``name`` in ``scenario``, or a clear error."""
    for p in points:
        if p.scenario == scenario and p.name == name:
            return p
    raise DefinitionError(f"no point {scenario}/{name}; known: "
                          f"{[p.name for p in points if p.scenario == scenario]}")
