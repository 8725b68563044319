"""Helpers the Snakefile uses: config -> testbed, points -> paths, host capture.

Kept out of the Snakefile so they are importable and tested like any module.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from peercache import atomic
from peercache.lab.pipeline import experiments
from peercache.lab.system import hostinfo
from peercache.lab.system.slowness import slowness

DEFAULT_TESTBED = "experiments/testbeds/local.yaml"
ROLES = ("producer", "consumer")


class Plan:
    """Everything the rules need to know about one testbed's run."""

    def __init__(self, testbed_path: str, scenarios_path: str | None = None):
        self.testbed_path = testbed_path
        sc = experiments.load_scenarios(scenarios_path) if scenarios_path else experiments.load_scenarios()
        self.scenarios = sc
        self.testbed = experiments.load_testbed(testbed_path, sc)
        self.scenarios_path = scenarios_path
        self.points = experiments.expand(self.testbed, sc)
        self.name = self.testbed.name
        self.raw = self.testbed["results"].rstrip("/")
        if Path(self.raw).name != self.name:
            raise experiments.DefinitionError(
                f"{testbed_path}: field 'results': must end in the testbed name ({self.name!r}) so the "
                f"collect stage finds it, e.g. data/raw/{self.name}")
        self.raw_root = str(Path(self.raw).parent)
        self.reps = range(int(self.testbed["repetitions"]))
        #: the capture's format: a capture rule parameter, so Snakemake captures again when it changes
        #: instead of keeping a capture an older lab wrote (one without the commands it ran)
        self.capture_schema = hostinfo.SCHEMA_VERSION
        self.guest = self.testbed.guest

    def guest_command(self) -> str:
        """The shell command that runs every measurement of the testbed inside the Soft-RoCE guest."""
        import shlex
        g = self.guest or {}
        scen = ["--scenarios", self.scenarios_path] if self.scenarios_path else []
        argv = [sys.executable, "-m", "peercache.lab.launch.guest", "--rails", str(g.get("rails", 2)),
                "--mtu", str(g.get("mtu", 1500)), "--cpus", str(g.get("cpus", 2)),
                "--memory", str(g.get("memory_mib", 4096)), "--timeout", str(g.get("timeout_s", 3600)), "--",
                sys.executable, "-m", "peercache.lab.pipeline", "measure", "--testbed", self.testbed_path, *scen]
        return shlex.join(argv)

    def result_paths(self) -> list[str]:
        """Every point's result.json, in run order."""
        return [f"{self.raw}/{p.scenario}/{p.name}/rep{k}/result.json" for p in self.points for k in self.reps]

    def capture_paths(self) -> list[str]:
        return [f"{self.raw}/testbed/{role}.json" for role in ROLES]

    def expected(self) -> list[str]:
        """'scenario/point/rep<k>' of every result of the plan: what collect reads and checks (a result the
        plan does not name, left by an earlier run, stays out of the tidy tables)."""
        return [f"{p.scenario}/{p.name}/rep{k}" for p in self.points for k in self.reps]

    def expected_yaml(self) -> str:
        """:meth:`expected` as one YAML flow list (a papermill -p value)."""
        import yaml
        return yaml.safe_dump(self.expected(), default_flow_style=True, width=1 << 20).strip()

    def scenario_names(self) -> str:
        """Regex alternation of the scenario file's scenario names (a wildcard constraint)."""
        return "|".join(experiments.scenario_names(self.scenarios))

    def point_names(self) -> str:
        """Regex alternation of point names (a wildcard constraint)."""
        return "|".join(sorted({p.name for p in self.points})) or "^$"


def capture(testbed_path: str, role: str, out: str) -> int:
    """Capture one host's testbed block (hostinfo) into ``out``."""
    from peercache.lab.pipeline.runpoint import _python_tool, testbed_hosts

    tb = experiments.load_testbed(testbed_path)
    with testbed_hosts(tb) as th:
        host = th.host(role)
        argv = [*_python_tool(th, role, "peercache.lab.cli"), "hostinfo"]
        r = host.run(argv, timeout=120 * slowness())
        if r.rc != 0:
            print(f"capture on {role} ({host}): `{' '.join(argv)}` exited {r.rc}: {r.stderr.strip()[-400:]}; "
                  f"check that PeerCache is installed there (the testbed's hosts.{role}.python names the "
                  "interpreter that has it)", file=sys.stderr)
            return 1
        doc = json.loads(r.stdout)
        block = {"role": role, "host_spec": str(host), "address": th.producer_addr if role == "producer"
                 else th.consumer_addr, "note": th.note, "summary": hostinfo.summary(doc), "capture": doc}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(out, json.dumps(block, indent=1, default=str))
    print(f"captured {role}: {block['summary'].get('host')} ({block['summary'].get('cpu_model')}), "
          f"{len(block['summary'].get('nics') or [])} RDMA device(s)")
    return 0


def measure(testbed_path: str, scenarios_path: str | None = None) -> int:
    """Capture both hosts, then run every point and repetition in order (the guest's whole job)."""
    from peercache.lab.pipeline import runpoint

    plan = Plan(testbed_path, scenarios_path)
    rc = 0
    for role, out in zip(ROLES, plan.capture_paths()):
        rc |= capture(testbed_path, role, out)
    todo = [(pt, k) for pt in plan.points for k in plan.reps]
    for i, (pt, k) in enumerate(todo, 1):
        out = f"{plan.raw}/{pt.scenario}/{pt.name}/rep{k}/result.json"
        print(f"[{i}/{len(todo)}] {pt.scenario}/{pt.name} rep{k}", flush=True)
        rc |= runpoint.run(testbed_path, pt.scenario, pt.name, k, out, scenarios_path)
    return rc


def describe_kinds() -> str:
    """Every point kind with its knobs and metrics, as text (``python -m peercache.lab.pipeline kinds``)."""
    from peercache.lab.pipeline import kinds

    out = []
    for name, k in kinds.KINDS.items():
        out.append(f"{name}: {(k.__doc__ or '').strip()}")
        for knob in k.knobs.values():
            what = "parameter (list, swept)" if knob.sweep else "variable"
            default = "required" if knob.default is kinds.REQUIRED else f"default {knob.default!r}"
            out.append(f"  {knob.name}: {what}, {json.dumps(knob.schema)}, {default}: {knob.doc}")
        out.append("  metrics: " + ", ".join(f"{m} [{u}]" for m, u in k.metrics.items()))
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m peercache.lab.pipeline")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("capture", help="capture a host's testbed block")
    c.add_argument("--testbed", required=True)
    c.add_argument("--role", choices=ROLES, required=True)
    c.add_argument("--out", required=True)
    v = sub.add_parser("validate", help="validate a testbed and list its points (--connect: check its hosts too)")
    v.add_argument("--testbed", required=True)
    v.add_argument("--scenarios", default=None)
    v.add_argument("--connect", action="store_true",
                   help="also check each host before anything runs: ssh, its python and PeerCache revision, "
                        "tools, RDMA devices, reachability (peercache.lab.pipeline.preflight)")
    v.add_argument("--out", default=None, help="with --connect: write the check's results here (JSON)")
    f = sub.add_parser("preflight", help="check the testbed's hosts (the pipeline's first rule); "
                                         "exit non-zero on any failure")
    f.add_argument("--testbed", required=True)
    f.add_argument("--scenarios", default=None)
    f.add_argument("--out", default=None, help="write the check's results here (JSON)")
    sub.add_parser("kinds", help="list the point kinds, their knobs (type, default, meaning) and metrics")
    sub.add_parser("schema", help="print the JSON schema of a scenario file (generated from the kinds)")
    m = sub.add_parser("measure", help="capture both hosts and run every point (what the guest runs)")
    m.add_argument("--testbed", required=True)
    m.add_argument("--scenarios", default=None)
    a = p.parse_args(argv)
    try:
        if a.cmd == "capture":
            return capture(a.testbed, a.role, a.out)
        if a.cmd == "measure":
            return measure(a.testbed, a.scenarios)
        if a.cmd == "kinds":
            print(describe_kinds())
            return 0
        if a.cmd == "schema":
            print(json.dumps(experiments.scenarios_schema(), indent=1))
            return 0
        if a.cmd == "preflight":
            from peercache.lab.pipeline import preflight
            return preflight.run(a.testbed, a.scenarios, a.out)
        plan = Plan(a.testbed, a.scenarios)
        for pt in plan.points:
            print(f"{pt.scenario}/{pt.name}: {pt.kind}" + (f" (skipped: {pt.skip_reason})" if pt.skip_reason else ""))
        if a.connect:
            from peercache.lab.pipeline import preflight
            sys.stdout.flush()
            return preflight.run(a.testbed, a.scenarios, a.out, plan=plan)
        return 0
    except experiments.DefinitionError as e:
        print(f"invalid definition: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
