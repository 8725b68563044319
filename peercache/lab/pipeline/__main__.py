"""``python -m peercache.lab.pipeline``: the lab's command line (validate, preflight, capture, measure,
kinds, schema). What it plans from a testbed is :class:`peercache.lab.pipeline.plan.Plan`; the rules
(Snakefile, rules/*.smk) run these commands.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from peercache import atomic
from peercache.lab.pipeline import experiments, kinds, preflight, runpoint
from peercache.lab.pipeline.plan import ROLES, Plan
from peercache.lab.system import hostinfo
from peercache.lab.system.slowness import scaled

#: --testbed's help: a file, not the folder of them.
TESTBED_HELP = "the testbed definition, a YAML file (e.g. experiments/testbeds/local.yaml)"
#: Seconds one host's hostinfo capture may take on a plain machine.
CAPTURE_S = 120.0


def capture(testbed_path: str, role: str, out: str) -> int:
    """Capture one host's testbed block (hostinfo) into ``out``: ``role`` is producer or consumer (the pair), or
    the name of a host of a testbed that lists its hosts."""
    tb = experiments.load_testbed(testbed_path)
    known = [*ROLES, *(h.name for h in tb.cluster if tb.is_cluster)]
    if role not in known:
        print(f"capture: {role!r} is no host of testbed {tb.name}; use one of {', '.join(dict.fromkeys(known))}",
              file=sys.stderr)
        return 2
    with runpoint.testbed_hosts(tb) as th:
        names = [h.name for h in tb.cluster]
        if role in ROLES:
            host, address = th.host(role), th.producer_addr if role == "producer" else th.consumer_addr
            name = tb.pair[ROLES.index(role)].name
            roles = [role]
            argv = [*runpoint._python_tool(th, role, "peercache.lab.cli"), "hostinfo"]
        else:
            m = th.member(role)
            host, address, name, roles = m.host, m.address, m.name, list(m.roles)
            argv = [*m.python, "-m", "peercache.lab.cli", "hostinfo"]
        field = f"hosts.{names.index(name)}" if tb.is_cluster else f"hosts.{role}"
        r = host.run(argv, timeout=scaled(CAPTURE_S))
        if r.rc != 0:
            print(f"capture on {role} ({host}): `{' '.join(argv)}` exited {r.rc}: {r.stderr.strip()[-400:]}; "
                  f"check that PeerCache is installed there (the testbed's {field}.python names the "
                  "interpreter that has it)", file=sys.stderr)
            return 1
        doc = json.loads(r.stdout)
        block = {"role": role if role in ROLES else None, "name": name, "roles": roles, "host_spec": str(host),
                 "address": address, "note": th.note, "summary": hostinfo.summary(doc), "capture": doc}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(out, json.dumps(block, indent=1, default=str))
    print(f"captured {role}: {block['summary'].get('host')} ({block['summary'].get('cpu_model')}), "
          f"{len(block['summary'].get('nics') or [])} RDMA device(s)")
    return 0


def measure(testbed_path: str, scenarios_path: str | None = None) -> int:
    """Capture every host, then run every point and repetition in order (the guest's whole job)."""
    plan = Plan(testbed_path, scenarios_path)
    rc = 0
    for role, out in zip(plan.capture_names(), plan.capture_paths()):
        rc |= capture(testbed_path, role, out)
    todo = plan.order()
    for i, (pt, k) in enumerate(todo, 1):
        out = f"{plan.raw}/{pt.scenario}/{pt.name}/rep{k}/result.json"
        print(f"[{i}/{len(todo)}] {pt.scenario}/{pt.name} rep{k}", flush=True)
        rc |= runpoint.run(testbed_path, pt.scenario, pt.name, k, out, scenarios_path)
    return rc


def describe_kinds() -> str:
    """Every point kind with its knobs and metrics, as text (``python -m peercache.lab.pipeline kinds``)."""
    out = []
    for name, k in kinds.KINDS.items():
        out.append(f"{name}: {(k.__doc__ or '').strip()}")
        for knob in k.knobs.values():
            what = "parameter (list, swept)" if knob.sweep else "variable"
            default = "required" if knob.default is kinds.REQUIRED else f"default {knob.default!r}"
            out.append(f"  {knob.name}: {what}, {json.dumps(knob.schema)}, {default}: {knob.doc}")
        out.append("  metrics: " + ", ".join(f"{m} [{u}]" for m, u in k.metrics.items()))
    return "\n".join(out)


def scenario_list(text: str) -> list[str]:
    """'single_nic,engines' -> ['single_nic', 'engines'] (argparse type of --scenarios)."""
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"{text!r}: give scenario names separated by commas, none empty "
                                         "(e.g. single_nic,engines)")
    for n in names:
        if "/" in n or n.endswith((".yaml", ".yml")):
            raise argparse.ArgumentTypeError(f"{n!r} looks like a file, but --scenarios takes scenario names "
                                             "(e.g. single_nic,engines); give a scenario file with --scenarios-file")
    return names


def _scenario_flags(p: argparse.ArgumentParser) -> None:
    """--scenarios (names: which of the testbed's scenarios) and --scenarios-file (which scenario file)."""
    p.add_argument("--scenarios", action="append", type=scenario_list, metavar="NAMES",
                   help="only these of the testbed's scenarios: names separated by commas, or the flag repeated "
                        "(e.g. --scenarios single_nic,engines) [every scenario the testbed runs]")
    p.add_argument("--scenarios-file", metavar="FILE",
                   help="the scenario file the names refer to [experiments/scenarios.yaml]")


def _plan(a, allow_placeholders: bool = False) -> Plan:
    """The testbed's plan, with only the points of the scenarios --scenarios names (all when none)."""
    plan = Plan(a.testbed, a.scenarios_file, allow_placeholders=allow_placeholders)
    if a.scenarios:
        chosen = experiments.chosen_scenarios(plan.testbed, [n for names in a.scenarios for n in names],
                                              plan.scenarios)
        plan.points = [pt for pt in plan.points if pt.scenario in chosen]
    return plan


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m peercache.lab.pipeline")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("capture", help="capture a host's testbed block")
    c.add_argument("--testbed", required=True, metavar="FILE", help=TESTBED_HELP)
    c.add_argument("--role", required=True,
                   help="producer or consumer (testbed/<role>.json), or the name of a host of a testbed that "
                        "lists its hosts (testbed/<name>.json)")
    c.add_argument("--out", required=True)
    v = sub.add_parser("validate", help="validate a testbed and list its points (--connect: check its hosts too)")
    v.add_argument("--testbed", required=True, metavar="FILE", help=TESTBED_HELP)
    _scenario_flags(v)
    v.add_argument("--connect", action="store_true",
                   help="also check each host before anything runs: ssh, its python and PeerCache revision, "
                        "tools, RDMA devices, reachability (peercache.lab.pipeline.preflight)")
    v.add_argument("--out", default=None, help="with --connect: write the check's results here (JSON)")
    v.add_argument("--allow-placeholders", action="store_true",
                   help="list the points of an example testbed whose <placeholders> are not filled in yet "
                        "(each planned as placeholder-<n>); not with --connect")
    f = sub.add_parser("preflight", help="check the testbed's hosts (the pipeline's first rule); "
                                         "exit non-zero on any failure")
    f.add_argument("--testbed", required=True, metavar="FILE", help=TESTBED_HELP)
    _scenario_flags(f)
    f.add_argument("--out", default=None, help="write the check's results here (JSON)")
    sub.add_parser("kinds", help="list the point kinds, their knobs (type, default, meaning) and metrics")
    sub.add_parser("schema", help="print the JSON schema of a scenario file (generated from the kinds)")
    m = sub.add_parser("measure", help="capture every host and run every point (what the guest runs)")
    m.add_argument("--testbed", required=True, metavar="FILE", help=TESTBED_HELP)
    m.add_argument("--scenarios-file", dest="scenarios_file", metavar="FILE",
                   help="the scenario file [experiments/scenarios.yaml]")
    a = p.parse_args(argv)
    try:
        if a.cmd == "capture":
            return capture(a.testbed, a.role, a.out)
        if a.cmd == "measure":
            return measure(a.testbed, a.scenarios_file)
        if a.cmd == "kinds":
            print(describe_kinds())
            return 0
        if a.cmd == "schema":
            print(json.dumps(experiments.scenarios_schema(), indent=1))
            return 0
        if a.cmd == "preflight":
            return preflight.run(a.testbed, a.scenarios_file, a.out, plan=_plan(a))
        if a.allow_placeholders and a.connect:
            print("validate: --allow-placeholders plans an example without its hosts and --connect logs in to "
                  "them; fill the testbed's <placeholders> in, then use --connect without --allow-placeholders",
                  file=sys.stderr)
            return 2
        plan = _plan(a, allow_placeholders=a.allow_placeholders)
        for pt in plan.points:
            print(f"{pt.scenario}/{pt.name}: {pt.kind}" + (f" (skipped: {pt.skip_reason})" if pt.skip_reason else ""))
        if a.connect:
            sys.stdout.flush()
            return preflight.run(a.testbed, a.scenarios_file, a.out, plan=plan)
        return 0
    except experiments.DefinitionError as e:
        print(f"invalid definition: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
