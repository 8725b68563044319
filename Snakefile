# PeerCache Lab pipeline: capture -> run every point -> collect -> charts -> report.
#
#   snakemake --cores 2                                   # built-in local testbed
#   snakemake --cores 4 --config testbed=experiments/testbeds/<yours>.yaml   # a copy of roce-8x-cx7.yaml
#
# Benchmark jobs hold the `testbed` resource (1 in profiles/default), so no two
# measurements ever overlap whatever --cores says; only the analysis runs in
# parallel. Definitions are validated before any rule runs.
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

from peercache.lab.pipeline.plan import DEFAULT_TESTBED, Plan

if "testbed" in config and not config["testbed"]:
    # a profile that names no testbed (profiles/ssh-testbed) sets it to null: a real testbed is the user's file
    raise WorkflowError("no testbed given (this profile names none); pass yours: --config "
                        "testbed=experiments/testbeds/<yours>.yaml (a copy of roce-8x-cx7.yaml with your hosts in), "
                        "or run `make run TESTBED=experiments/testbeds/<yours>.yaml`")
PLAN = Plan(config.get("testbed", DEFAULT_TESTBED), config.get("scenarios"))
TB = PLAN.name
RAW = PLAN.raw
# With --sdm conda each rule runs the `python` of its own environment (envs/*.yaml); by
# default every rule runs this interpreter (the project's .venv).
from snakemake.settings.types import DeploymentMethod

PY = "python" if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method else sys.executable

wildcard_constraints:
    scenario=PLAN.scenario_names(),
    point=PLAN.point_names(),
    rep=r"\d+",


# Every result is a target too: Snakemake does not remake a missing intermediate file while what
# was built from it is up to date, so a point whose raw folder was deleted would otherwise not
# run again; named here, it runs and the collect, charts and report after it follow.
rule all:
    input:
        f"reports/{TB}/report.html",
        f"figures/{TB}/index.md",
        PLAN.result_paths(),
    localrule: True


if PLAN.guest:
    localrules: guest_measure

    include: "rules/guest.smk"
else:
    localrules: preflight, capture_host, run_point

    include: "rules/capture.smk"
    include: "rules/run.smk"

include: "rules/collect.smk"
include: "rules/report.smk"


onsuccess:
    print(f"\nPeerCache Lab: testbed {TB} done.\n  report:  reports/{TB}/report.html "
          f"(and .ipynb)\n  figures: figures/{TB}/\n  tidy:    data/tidy/{TB}/rows.parquet, runs.parquet\n"
          f"  raw:     {RAW}/")
