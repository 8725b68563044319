"""Testbed and scenario definitions: load, validate, expand into points.

A testbed (``experiments/testbeds/*.yaml``) names its hosts (two by role, or a
list of named hosts with roles: a cluster, :class:`ClusterHost`), their
devices and what hardware they have; ``experiments/scenarios.yaml`` holds
each scenario's parameter grid in an ``rdma`` form and a ``local`` form.
:func:`expand` turns the pair into :class:`Point` s, one per measurement,
and marks the points whose hardware the testbed lacks as skipped with the
reason. Nothing here starts a process.
"""
from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from peercache.lab.launch import hosts, netns
from peercache.lab.pipeline import kinds
from peercache.lab.pipeline.kinds import Point  # noqa: F401 (the point type, re-exported)

#: Root of the checkout this package runs from (relative host ``python`` paths are resolved against it).
CHECKOUT_ROOT = Path(__file__).resolve().parents[3]
EXPERIMENTS_DIR = CHECKOUT_ROOT / "experiments"
SCHEMA_FILE = EXPERIMENTS_DIR / "testbed.schema.yaml"
SCENARIOS_FILE = EXPERIMENTS_DIR / "scenarios.yaml"
#: The forms every scenario has: ``rdma`` on a real RDMA testbed, ``local`` its non-RDMA counterpart.
FORMS = ("rdma", "local")
#: capabilities a scenario may require -> what the testbed then needs.
HARDWARE = {"gpu": "a CUDA GPU on the consumer", "rdma": "an RDMA NIC on both hosts"}
#: The roles a host of a host list may have.
CLUSTER_ROLES = ("producer", "consumer", "directory")
#: Names a listed host may not have: its capture (testbed/<name>.json) would be another file's.
RESERVED_HOST_NAMES = ("preflight",)
#: The TCP ports one point's listeners take: base_port and the POINT_PORTS after it.
POINT_PORTS = 500
DEFAULT_BASE_PORT = 22000
#: Linux's default net.ipv4.ip_local_port_range: the local ports outgoing connections are given. A listener
#: in it fails to bind ("address in use") whenever a connection on its host holds that port, which a cluster
#: point's hundreds of connections make likely; so a testbed's ports lie below it.
EPHEMERAL_PORTS = (32768, 60999)


class DefinitionError(ValueError):
    """A testbed or scenario file is invalid; the message names file and field."""


# --- placeholders ------------------------------------------------------------------
# An example testbed (roce-8x-cx7.yaml) marks what a user must fill in as ``<what to put here>``,
# alone or inside a value (``ssh:<user@producer-host>``). This is the one rule that tells a
# placeholder: no host spec, address, device, path or interpreter of a real testbed holds '<' ... '>',
# so a value with one is never mistaken for a real one, and the words inside are the instruction.

#: A placeholder inside a testbed's string value: ``<`` what to put there ``>``.
PLACEHOLDER = re.compile(r"<([^<>\n]+)>")
#: What the loader puts in place of the placeholders when asked to plan an example anyway
#: (``validate --allow-placeholders``): a name every host, address and path field accepts.
PLACEHOLDER_STAND_IN = "placeholder-{}"


def placeholders(doc: Any, where: str = "") -> list[tuple[str, str, str]]:
    """Every placeholder of ``doc`` as (field, the value holding it, what to put there), in document order."""
    if isinstance(doc, dict):
        return [hit for k, v in doc.items() for hit in placeholders(v, f"{where}.{k}" if where else str(k))]
    if isinstance(doc, list):
        return [hit for i, v in enumerate(doc) for hit in placeholders(v, f"{where}.{i}" if where else str(i))]
    if isinstance(doc, str):
        return [(where or "(top level)", doc, m.group(1).strip()) for m in PLACEHOLDER.finditer(doc)]
    return []


def fill_placeholders(doc: Any) -> Any:
    """A copy of ``doc`` with each placeholder replaced by ``placeholder-<n>`` (planning only: no host has that name)."""
    count = itertools.count(1)

    def fill(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: fill(x) for k, x in v.items()}
        if isinstance(v, list):
            return [fill(x) for x in v]
        if isinstance(v, str):
            return PLACEHOLDER.sub(lambda _: PLACEHOLDER_STAND_IN.format(next(count)), v)
        return v

    return fill(doc)


def placeholder_error(path: Path, found: list[tuple[str, str, str]]) -> DefinitionError:
    """The error for a testbed that still holds placeholders: one line per placeholder, saying what to put there."""
    # the value with each placeholder's words elided (ssh:<...>): the words follow, as what to put there
    lines = [f"  field '{where}': {PLACEHOLDER.sub('<...>', value)} is a placeholder: put {what}"
             for where, value, what in found]
    return DefinitionError(
        f"{path}: {len(found)} placeholder(s) left to fill in (an example testbed: copy it and put your own "
        "hosts in)\n" + "\n".join(lines)
        + f"\n(to list the points it plans before filling it in: python -m peercache.lab.pipeline validate "
          f"--testbed {path} --allow-placeholders)")


@dataclass(frozen=True)
class ClusterHost:
    """One host of a testbed as its definition names it (a host of the list, or producer/consumer of a pair)."""

    name: str
    host: str                          #: host spec: local, netns:<name>, ssh:[user@]host[:port]
    address: str
    roles: tuple[str, ...]
    python: str | None = None          #: the definition's ``python`` field
    devices: tuple[str, ...] | None = None   #: the definition's ``devices`` field (this host's device names)
    cpus: str | None = None            #: the definition's ``cpus`` field (the CPUs its processes run on)

    @classmethod
    def from_def(cls, name: str, d: dict[str, Any], roles: tuple[str, ...] | None = None) -> "ClusterHost":
        own = d.get("devices")
        return cls(name, d["host"], d["address"], tuple(roles if roles is not None else d["roles"]),
                   d.get("python"), tuple(own) if own is not None else None, d.get("cpus"))

    def as_host_def(self) -> dict[str, Any]:
        """The host's fields as a ``#/$defs/host`` block (what ``hosts.<role>`` holds)."""
        d: dict[str, Any] = {"host": self.host, "address": self.address}
        if self.python is not None:
            d["python"] = self.python
        if self.devices is not None:
            d["devices"] = list(self.devices)
        if self.cpus is not None:
            d["cpus"] = self.cpus
        return d


def _pick_pair(cluster: list[ClusterHost]) -> tuple[ClusterHost | None, ClusterHost | None]:
    """(the first host with role producer, the first other host with role consumer); None where there is none."""
    prod = next((h for h in cluster if "producer" in h.roles), None)
    cons = next((h for h in cluster if "consumer" in h.roles and h is not prod), None)
    return prod, cons


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

    def host_devices(self, host: ClusterHost, devices: list[str]) -> list[str]:
        """``devices`` (consumer names) as the listed ``host`` names them (its ``devices`` field)."""
        if not host.devices:
            return list(devices)
        return [host.devices[self.devices.index(d)] for d in devices]

    @property
    def is_cluster(self) -> bool:
        """True when the definition lists its hosts (``hosts`` was a list)."""
        return "cluster" in self.doc

    @property
    def cluster(self) -> list[ClusterHost]:
        """Every host, in definition order: the listed hosts, or producer and consumer of a two-host testbed
        (named by their role, one role each)."""
        if self.is_cluster:
            return [ClusterHost.from_def(d["name"], d) for d in self.doc["cluster"]]
        return [ClusterHost.from_def(role, self.doc["hosts"][role], (role,)) for role in ("producer", "consumer")]

    @property
    def pair(self) -> tuple[ClusterHost, ClusterHost]:
        """(producer, consumer): the hosts every two-host scenario runs on (``hosts.producer``/``consumer``)."""
        if not self.is_cluster:
            prod, cons = self.cluster
            return prod, cons
        prod, cons = _pick_pair(self.cluster)
        assert prod is not None and cons is not None, "load_testbed checks the pair"
        return prod, cons

    def netns_bridge(self) -> netns.NetnsBridge | None:
        """The namespace set of ``netns_bridge`` (not created), or None when the testbed has none."""
        return bridge_of(self.doc, self.cluster) if self.doc.get("netns_bridge") else None

    @property
    def guest(self) -> dict[str, Any] | None:
        """The Soft-RoCE guest the measurements run in, or None (they run on the hosts)."""
        return self.doc.get("guest")

    def __getitem__(self, key: str) -> Any:
        return self.doc[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.doc.get(key, default)


#: Where each kind of definition file lives: what a missing or mistaken path's error points to.
WHERE = {"testbed": f"testbeds live in {EXPERIMENTS_DIR / 'testbeds'}",
         "scenario": f"the scenario file is {SCENARIOS_FILE}",
         "schema": f"the testbed schema is {SCHEMA_FILE}"}


def _load_yaml(path: Path, what: str = "testbed") -> Any:
    """The YAML document of ``path``, a ``what`` (a key of WHERE); DefinitionError saying what to give instead."""
    if path.is_dir():
        files = sorted(f.name for f in path.glob("*.y*ml"))
        inside = f" (it holds {', '.join(files[:8])}{', ...' if len(files) > 8 else ''})" if files else ""
        raise DefinitionError(f"{path} is a folder, not a {what} file; give one YAML file{inside}, "
                              f"e.g. {path / files[0] if files else path / 'NAME.yaml'}")
    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise DefinitionError(f"{path}: no such {what} file; {WHERE[what]}")
    except yaml.YAMLError as e:
        raise DefinitionError(f"{path}: not valid YAML: {e}")


def _field(err: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in err.absolute_path) or "(top level)"


def testbed_schema(scenarios: dict[str, Any] | None = None) -> dict[str, Any]:
    """The testbed schema (experiments/testbed.schema.yaml) with the scenario names filled in from the scenarios."""
    schema = _load_yaml(SCHEMA_FILE, "schema")
    names = list(scenario_names(scenarios))
    props = schema["properties"]
    props["scenarios"]["items"] = {"enum": names}
    props["grid_overrides"]["properties"] = {n: {"$ref": "#/$defs/override"} for n in names}
    return schema


def load_testbed(path: str | Path, scenarios: dict[str, Any] | None = None, *,
                 allow_placeholders: bool = False) -> Testbed:
    """Read and validate a testbed file (its scenario names against ``scenarios``); DefinitionError names the field.

    A file that still holds ``<placeholders>`` (an example) is refused, one line per placeholder;
    ``allow_placeholders`` loads it with each replaced by ``placeholder-<n>``, to plan it without hosts.
    """
    path = Path(path)
    doc = _load_yaml(path)
    found = placeholders(doc)
    if found and not allow_placeholders:
        raise placeholder_error(path, found)
    doc = fill_placeholders(doc)
    lines = _schema_errors(testbed_schema(scenarios), doc)
    if lines:
        lines = lines[:10]
        raise DefinitionError(f"{path}: invalid testbed definition\n" + "\n".join(lines)
                              + f"\n(see {SCHEMA_FILE.relative_to(EXPERIMENTS_DIR.parent)})")
    if doc["form"] == "rdma" and not doc.get("devices"):
        raise DefinitionError(f"{path}: field 'devices': an rdma testbed needs at least one RDMA device")
    if doc["form"] == "rdma" and not doc["capabilities"]["rdma"]:
        raise DefinitionError(f"{path}: field 'form': rdma form on a testbed whose "
                              "capabilities.rdma is false; use form: local")
    first = doc.get("base_port", DEFAULT_BASE_PORT)
    if first + POINT_PORTS - 1 >= EPHEMERAL_PORTS[0]:
        raise DefinitionError(
            f"{path}: field 'base_port': a point listens on ports {first}..{first + POINT_PORTS - 1}, inside Linux's "
            f"ephemeral range {EPHEMERAL_PORTS[0]}..{EPHEMERAL_PORTS[1]} (net.ipv4.ip_local_port_range), where the "
            f"hosts' outgoing connections take their local ports and a listener can find its port held; choose a "
            f"base_port from 1024 to {EPHEMERAL_PORTS[0] - POINT_PORTS}")
    if isinstance(doc["hosts"], list):
        _normalise_cluster(path, doc)
    elif doc.get("netns_bridge"):
        raise DefinitionError(f"{path}: field 'netns_bridge': a bridge joins the hosts of a host list; this "
                              "testbed's hosts are a producer/consumer pair (use netns_pair, or list the hosts)")
    # The host specs by the rule the runs open them with, so a bad one (ssh:-oProxyCommand=...) stops
    # the plan before any rule runs, naming its field.
    for block in ("hosts", "fallback_hosts"):
        for role, h in (doc.get(block) or {}).items():
            _check_host(path, f"{block}.{role}", h)
    for role in ("producer", "consumer"):
        own = doc["hosts"][role].get("devices")
        if own is not None and len(own) != len(doc.get("devices") or []):
            raise DefinitionError(f"{path}: field 'hosts.{role}.devices': {len(own)} names for the "
                                  f"{len(doc.get('devices') or [])} devices of field 'devices' (one each, same order)")
    return Testbed(path, doc)


def _check_host(path: Path, where: str, h: dict[str, Any]) -> None:
    """A host block's spec and CPU list by the rules the runs open them with, so a bad one (ssh:-oProxyCommand=...)
    stops the plan before any rule runs; DefinitionError names the field."""
    for key, check in (("host", hosts.check_spec), ("cpus", hosts.check_cpu_list)):
        if key in h:
            try:
                check(h[key])
            except hosts.HostError as e:
                raise DefinitionError(f"{path}: field '{where}.{key}': {e}") from None


def _normalise_cluster(path: Path, doc: dict[str, Any]) -> None:
    """Check a host list (names, addresses, specs, devices, roles, its bridge) and normalise the document: the
    list moves to ``doc["cluster"]``, ``doc["hosts"]`` becomes the producer/consumer pair; DefinitionError
    names the field."""
    listed = doc["hosts"]

    def fail(where: str, msg: str) -> None:
        raise DefinitionError(f"{path}: field '{where}': {msg}")

    for key in ("name", "address"):
        first: dict[str, int] = {}
        for i, h in enumerate(listed):
            if h[key] in first:
                fail(f"hosts.{i}.{key}", f"{h[key]!r} is the {key} of hosts.{first[h[key]]} too; each host's "
                     f"{key} must be unique")
            first[h[key]] = i
    n_devices = len(doc.get("devices") or [])
    for i, h in enumerate(listed):
        if h["name"] in RESERVED_HOST_NAMES:
            fail(f"hosts.{i}.name", f"{h['name']!r} is reserved (testbed/{h['name']}.json is another file); "
                 "choose another name")
        _check_host(path, f"hosts.{i}", h)
        own = h.get("devices")
        if own is not None and len(own) != n_devices:
            fail(f"hosts.{i}.devices", f"{len(own)} names for the {n_devices} devices of field 'devices' "
                 "(one each, same order)")
    for key in ("netns_pair", "fallback_hosts"):
        if doc.get(key):
            fail(key, "applies to a producer/consumer pair of hosts; a host list uses netns_bridge for namespace "
                 "hosts, and falls back to every host on this machine's loopback without root")
    cluster = [ClusterHost.from_def(h["name"], h) for h in listed]
    prod, cons = _pick_pair(cluster)
    if prod is None:
        fail("hosts", "no host has role producer; give one the role (roles: [producer, ...])")
    if cons is None:
        fail("hosts", f"no host other than {prod.name} (the producer) has role consumer; give another host the "
             "role consumer")
    for i, h in enumerate(cluster):
        picked = {"producer": prod, "consumer": cons}.get(h.name)
        if picked is not None and picked is not h:
            fail(f"hosts.{i}.name", f"a host named {h.name!r} must be the testbed's {h.name} (the first host with "
                 f"that role{', other than the producer' if h.name == 'consumer' else ''}: here "
                 f"{picked.name}); rename it")
    _check_bridge(path, doc, cluster)
    doc["cluster"] = listed
    doc["hosts"] = {"producer": prod.as_host_def(), "consumer": cons.as_host_def()}


def _check_bridge(path: Path, doc: dict[str, Any], cluster: list[ClusterHost]) -> None:
    """The namespace hosts of a host list against its ``netns_bridge`` (there must be one when there are any)."""
    br = doc.get("netns_bridge")
    ns = [(i, h) for i, h in enumerate(cluster) if h.host.startswith("netns:")]
    if ns and not br:
        i, h = ns[0]
        raise DefinitionError(f"{path}: field 'hosts.{i}.host': {h.host} is a network-namespace host; a host "
                              "list creates its namespaces on a bridge: add netns_bridge: {tag, index}")
    if not br:
        return
    if not ns:
        raise DefinitionError(f"{path}: field 'netns_bridge': no host of the list is a netns:<name> host, so the "
                              "bridge would join nothing; drop it or name namespace hosts")
    for i, h in ns:
        name = h.host.partition(":")[2]
        if not name.startswith(br["tag"]):
            raise DefinitionError(f"{path}: field 'hosts.{i}.host': namespace {name!r} must start with the "
                                  f"netns_bridge tag {br['tag']!r} (the tag's lock guards what the bridge removes)")
        try:
            netns.check_bench_address(h.address, br["index"])
        except netns.NetnsError as e:
            raise DefinitionError(f"{path}: field 'hosts.{i}.address': {e} (netns_bridge.index)") from None
    try:
        bridge_of(doc, cluster).check()
    except netns.NetnsError as e:
        raise DefinitionError(f"{path}: field 'netns_bridge': {e}") from None


def bridge_of(doc: dict[str, Any], cluster: list[ClusterHost]) -> netns.NetnsBridge:
    """The :class:`netns.NetnsBridge` of a host list's ``netns_bridge``: one member per netns:<name> host."""
    br = doc["netns_bridge"]
    members = [(h.host.partition(":")[2], h.address) for h in cluster if h.host.startswith("netns:")]
    return netns.NetnsBridge(br["tag"], br["index"], members)


def _schema_errors(schema: dict[str, Any], doc: Any) -> list[str]:
    """Every schema violation of ``doc`` as "field 'a.b': message", sorted by field, one per extra key."""
    lines = []
    for e in sorted(jsonschema.Draft202012Validator(schema).iter_errors(doc), key=lambda e: list(e.absolute_path)):
        if e.validator == "additionalProperties" and isinstance(e.instance, dict):
            known = set((e.schema.get("properties") or {}))
            for extra in sorted(set(e.instance) - known):
                where = ".".join(map(str, [*e.absolute_path, extra]))
                lines.append(f"  field '{where}': not a known field here; known: {', '.join(sorted(known))}")
            continue
        if e.validator == "pattern":
            # the schema's own words for what the pattern admits (`allowed`, beside every pattern): a raw
            # regex tells a reader little
            allowed = e.schema.get("allowed") or "a value of the form the schema's description of this field gives"
            lines.append(f"  field '{_field(e)}': {e.instance!r} is not allowed here; use {allowed}")
            continue
        lines.append(f"  field '{_field(e)}': {e.message}")
    return lines


#: What a scenario's and a part's name may be, in words (the `allowed` of their pattern).
SNAKE_NAME = "a name of lowercase letters, digits and _, starting with a letter (e.g. single_nic)"


def scenarios_schema(forms: tuple[str, ...] = FORMS) -> dict[str, Any]:
    """JSON schema of a scenario file, generated from the kinds registry (each part's knobs, typed);
    every scenario must have each of ``forms``."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "PeerCache Lab scenarios (generated from peercache.lab.pipeline.kinds)",
        "type": "object", "minProperties": 1,
        "propertyNames": {"pattern": "^[a-z][a-z0-9_]*$", "allowed": SNAKE_NAME},
        "additionalProperties": {"$ref": "#/$defs/scenario"},
        "$defs": {
            "scenario": {"type": "object", "additionalProperties": False,
                         "required": ["description", *forms],
                         "properties": {"description": {"type": "string", "minLength": 1},
                                        "requires": {"type": "array", "items": {"enum": sorted(HARDWARE)}},
                                        # at least this many repetitions of each point, whatever the
                                        # testbed's: a scenario whose figures are compared (plan.repetitions)
                                        "repetitions": {"type": "integer", "minimum": 1, "maximum": 100},
                                        # repetition by repetition, each cell's points rotated (plan.run_order)
                                        "rotate": {"type": "boolean"},
                                        **{f: {"$ref": "#/$defs/form"} for f in FORMS}}},
            "form": {"type": "object", "minProperties": 1,
                     "propertyNames": {"pattern": "^[a-z][a-z0-9_]*$", "allowed": SNAKE_NAME},
                     "additionalProperties": {"$ref": "#/$defs/part"}},
            "part": kinds.part_schema(),
            **kinds.kind_defs(),
        },
    }


def load_scenarios(path: str | Path = SCENARIOS_FILE, forms: tuple[str, ...] = FORMS) -> dict[str, Any]:
    """Read a scenario file and validate it against :func:`scenarios_schema`; DefinitionError names the field."""
    path = Path(path)
    doc = _load_yaml(path, "scenario")
    lines = _schema_errors(scenarios_schema(forms), doc)
    if lines:
        raise DefinitionError(f"{path}: invalid scenario definition\n" + "\n".join(lines[:10])
                              + "\n(each part names its kind; the kinds and their knobs: "
                              "python -m peercache.lab.pipeline kinds)")
    return doc


def scenario_names(scenarios: dict[str, Any] | None = None) -> tuple[str, ...]:
    """The scenario names, in file order (the one list every other place reads)."""
    return tuple(scenarios if scenarios is not None else load_scenarios())


def chosen_scenarios(testbed: Testbed, names: list[str], scenarios: dict[str, Any] | None = None) -> tuple[str, ...]:
    """The scenarios of ``names`` (validate/preflight --scenarios), each one ``testbed`` runs, in the testbed's
    order; DefinitionError naming the scenarios it runs."""
    runs = list(testbed["scenarios"])
    for name in names:
        if name in runs:
            continue
        if name in scenario_names(scenarios):
            raise DefinitionError(f"--scenarios: {name!r} is a scenario, but testbed {testbed.name} does not run it; "
                                  f"add it to the testbed's field 'scenarios', or name one it runs: {', '.join(runs)}")
        raise DefinitionError(f"--scenarios: {name!r} is no scenario; testbed {testbed.name} runs {', '.join(runs)} "
                              f"(every scenario: {', '.join(scenario_names(scenarios))})")
    return tuple(n for n in runs if n in names)


def get_scenarios(scenarios: dict[str, Any] | None = None) -> tuple[str, ...]:
    """The scenarios that measure PeerCache GETs (a part of a kind with ``is_get``, in some form)."""
    sc = scenarios if scenarios is not None else load_scenarios()
    return tuple(n for n, d in sc.items()
                 if any(kinds.kind_of(part["kind"]).is_get for f in FORMS if f in d for part in d[f].values()))


def expand_part(scenario: str, part_name: str, part: dict[str, Any], devices: list[str]) -> list[Point]:
    """The points of one scenario part, as its kind expands them."""
    return [dataclasses.replace(p, part=part_name)
            for p in kinds.kind_of(part["kind"]).expand(scenario, part, devices)]



def missing_hardware(testbed: Testbed, scenario: dict) -> str | None:
    """Why the testbed cannot run this scenario (None when it can)."""
    caps = testbed["capabilities"]
    for need in scenario.get("requires", []):
        if not caps.get(need):
            what = HARDWARE[need]
            return (f"testbed {testbed.name!r} has no {need.upper()} (capabilities.{need}: false); "
                    f"this scenario needs {what}")
    return None


def too_few_hosts(testbed: Testbed, point: Point) -> str | None:
    """Why the testbed has too few hosts for ``point`` (None when it has enough; see Kind.hosts_needed)."""
    need, have = point.spec.hosts_needed(point.params), len(testbed.cluster)
    if need <= have:
        return None
    return (f"testbed {testbed.name!r} has {have} hosts; this point spans {need} "
            "(a cluster testbed names them as a list under hosts:, e.g. experiments/testbeds/local-cluster.yaml)")


def expand(testbed: Testbed, scenarios: dict[str, Any] | None = None) -> list[Point]:
    """Every point of every scenario the testbed runs, in run order."""
    scenarios = scenarios or load_scenarios()
    points: list[Point] = []
    overrides = testbed.get("grid_overrides") or {}
    for name in testbed["scenarios"]:
        if name not in scenarios:
            raise DefinitionError(f"{testbed.path}: field 'scenarios': {name!r} is not a scenario of the scenario "
                                  f"file (it has {', '.join(scenarios)}); add it there or drop it here")
        sc = scenarios[name]
        grid = sc[testbed.form]
        for part, changes in (overrides.get(name) or {}).items():
            if part not in grid:
                raise DefinitionError(f"{testbed.path}: field 'grid_overrides.{name}.{part}': the "
                                      f"{testbed.form} form of {name} has no part {part!r} "
                                      f"(it has {', '.join(grid)})")
        grid = {part: {**g, **(overrides.get(name) or {}).get(part, {})} for part, g in grid.items()}
        part_schema = {"$defs": kinds.kind_defs(), **kinds.part_schema()}
        pts: list[Point] = []
        for part, g in grid.items():
            if part in (overrides.get(name) or {}):
                bad = _schema_errors(part_schema, g)
                if bad:
                    raise DefinitionError(f"{testbed.path}: field 'grid_overrides.{name}.{part}': the merged "
                                          f"part is not a valid {g.get('kind')} part:\n" + "\n".join(bad))
            pts += expand_part(name, part, g, testbed.devices)
        why = missing_hardware(testbed, sc)
        if why:
            pts = [dataclasses.replace(p, skip_reason=why) for p in pts]
        pts = [dataclasses.replace(p, skip_reason=too_few_hosts(testbed, p)) if too_few_hosts(testbed, p)
               and not p.skipped else p for p in pts]
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
