"""What the Snakefile plans from a testbed: config -> testbed, points -> paths (pure: nothing is run).

Kept out of the Snakefile so it is importable and tested like any module. The command line
(``python -m peercache.lab.pipeline``: validate, preflight, capture, measure, kinds, schema) is
:mod:`peercache.lab.pipeline.__main__`.
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

import yaml

from peercache.lab.pipeline import experiments
from peercache.lab.system import hostinfo

DEFAULT_TESTBED = "experiments/testbeds/local.yaml"
ROLES = ("producer", "consumer")


class Plan:
    """Everything the rules need to know about one testbed's run."""

    def __init__(self, testbed_path: str, scenarios_path: str | None = None, *, allow_placeholders: bool = False):
        self.testbed_path = testbed_path
        sc = experiments.load_scenarios(scenarios_path) if scenarios_path else experiments.load_scenarios()
        self.scenarios = sc
        # allow_placeholders: an example testbed's points, planned before its hosts are filled in (never run)
        self.testbed = experiments.load_testbed(testbed_path, sc, allow_placeholders=allow_placeholders)
        self.scenarios_path = scenarios_path
        self.points = experiments.expand(self.testbed, sc)
        self.name = self.testbed.name
        self.raw = self.testbed["results"].rstrip("/")
        if Path(self.raw).name != self.name:
            raise experiments.DefinitionError(
                f"{testbed_path}: field 'results': must end in the testbed name ({self.name!r}) so the "
                f"collect stage finds it, e.g. data/raw/{self.name}")
        self.raw_root = str(Path(self.raw).parent)
        self._order = run_order(self.points, self.scenarios, int(self.testbed["repetitions"]),
                                exact=bool(self.testbed.get("repetitions_exact")))
        self._before = {(p.scenario, p.name, k): prev for (p, k), prev in
                        zip(self._order, [None, *self._order[:-1]])
                        if self.scenarios[p.scenario].get("rotate") and prev is not None
                        and prev[0].scenario == p.scenario}
        #: the capture's format: a capture rule parameter, so Snakemake captures again when it changes
        #: instead of keeping a capture an older lab wrote (one without the commands it ran)
        self.capture_schema = hostinfo.SCHEMA_VERSION
        self.guest = self.testbed.guest

    def guest_command(self) -> str:
        """The shell command that runs every measurement of the testbed inside the Soft-RoCE guest."""
        g = self.guest or {}
        scen = ["--scenarios-file", self.scenarios_path] if self.scenarios_path else []
        argv = [sys.executable, "-m", "peercache.lab.launch.guest", "--rails", str(g.get("rails", 2)),
                "--mtu", str(g.get("mtu", 1500)), "--cluster-hosts", str(g.get("cluster_hosts", 0)),
                "--cpus", str(g.get("cpus", 2)),
                "--memory", str(g.get("memory_mib", 4096)), "--timeout", str(g.get("timeout_s", 3600)), "--",
                sys.executable, "-m", "peercache.lab.pipeline", "measure", "--testbed", self.testbed_path, *scen]
        return shlex.join(argv)

    def result_path(self, p: experiments.Point, rep: int) -> str:
        return f"{self.raw}/{p.scenario}/{p.name}/rep{rep}/result.json"

    def result_paths(self) -> list[str]:
        """Every point's result.json, in run order."""
        return [self.result_path(p, k) for p, k in self._order]

    def order(self) -> list[tuple[experiments.Point, int]]:
        """Every (point, repetition) in run order (:func:`run_order`)."""
        return list(self._order)

    def before(self, scenario: str, point: str, rep: int) -> list[str]:
        """The result that must exist before this one runs: the one before it in a rotating scenario's order
        (the run_point rule's input, so Snakemake keeps the order), none elsewhere."""
        prev = self._before.get((scenario, point, int(rep)))
        return [] if prev is None else [self.result_path(*prev)]

    def capture_names(self) -> list[str]:
        """What the capture rule captures, each into ``testbed/<name>.json``: producer and consumer (the pair
        every two-host scenario runs on), then, for a testbed that lists its hosts, every listed host by name."""
        names = list(ROLES)
        if self.testbed.is_cluster:
            names += [h.name for h in self.testbed.cluster if h.name not in names]
        return names

    def capture_paths(self) -> list[str]:
        return [f"{self.raw}/testbed/{name}.json" for name in self.capture_names()]

    def capture_pattern(self) -> str:
        """Regex alternation of :meth:`capture_names` (the capture rule's wildcard constraint)."""
        return "|".join(self.capture_names())

    def expected(self) -> list[str]:
        """'scenario/point/rep<k>' of every result of the plan: what collect reads and checks (a result the
        plan does not name, left by an earlier run, stays out of the tidy tables)."""
        return [f"{p.scenario}/{p.name}/rep{k}" for p, k in self._order]

    def expected_yaml(self) -> str:
        """:meth:`expected` as one YAML flow list (a papermill -p value)."""
        return yaml.safe_dump(self.expected(), default_flow_style=True, width=1 << 20).strip()

    def scenario_names(self) -> str:
        """Regex alternation of the scenario file's scenario names (a wildcard constraint)."""
        return "|".join(experiments.scenario_names(self.scenarios))

    def point_names(self) -> str:
        """Regex alternation of point names (a wildcard constraint)."""
        return "|".join(sorted({p.name for p in self.points})) or "^$"


def repetitions(scenario: dict, testbed_reps: int, exact: bool = False) -> int:
    """How many times each point of ``scenario`` runs: the testbed's repetitions, or the scenario's own
    ``repetitions`` where it asks for more (a scenario whose figures are compared with each other), unless the
    testbed says its own are ``exact`` (a functional check of the pipeline)."""
    return testbed_reps if exact else max(testbed_reps, int(scenario.get("repetitions", 1)))


def run_order(points: list[experiments.Point], scenarios: dict, testbed_reps: int, exact: bool = False
              ) -> list[tuple[experiments.Point, int]]:
    """Every (point, repetition) in the order they run (pure).

    A scenario runs its points in file order, each point's repetitions back to back, unless it says
    ``rotate: true``: then it runs repetition by repetition, and within one its points of no cell first
    (the raw tools), then cell by cell (:meth:`Kind.cell`: page size and reader threads), the points of a
    cell back to back in the order :func:`balanced_order` gives that repetition, so no engine always runs
    after the same neighbour."""
    out: list[tuple[experiments.Point, int]] = []
    for name in dict.fromkeys(p.scenario for p in points):
        mine = [p for p in points if p.scenario == name]
        n = repetitions(scenarios[name], testbed_reps, exact)
        if not scenarios[name].get("rotate"):
            out += [(p, k) for p in mine for k in range(n)]
            continue
        cells: dict = {}
        for p in mine:
            cells.setdefault(p.spec.cell(p.params), []).append(p)
        loose = cells.pop(None, [])
        for k in range(n):
            out += [(p, k) for p in loose]
            for group in cells.values():
                out += [(group[i], k) for i in balanced_order(len(group), k)]
    return out


def balanced_order(n: int, k: int) -> list[int]:
    """The order of ``n`` points in repetition ``k`` (pure): row ``k mod n`` of a Williams square, 0, 1, n-1,
    2, n-2, ... shifted by k. Over n repetitions each point runs right after each other point exactly once
    (n even), so what one engine leaves behind (a warm cache, a busy socket) never favours the same other
    one; a plain rotation would keep every neighbour but one."""
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    return [(x + k) % n for x in first]
