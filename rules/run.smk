# Stage 2: one job per point and repetition; both sides' logs, the meta block
# and the parsed rows land in the point's raw folder.


rule run_point:
    input:
        PLAN.capture_paths(),
        # a rotating scenario's order (engines): the result before this one; ancient, so a point run
        # again does not make every point after it out of date
        lambda wc: [ancient(p) for p in PLAN.before(wc.scenario, wc.point, wc.rep)],
    output:
        f"{RAW}/{{scenario}}/{{point}}/rep{{rep}}/result.json",
    params:
        py=PY,
        testbed=PLAN.testbed_path,
        # a list: `:q` quotes each word (an empty list adds nothing)
        scenarios=["--scenarios", PLAN.scenarios_path] if PLAN.scenarios_path else [],
    resources:
        testbed=1,
    conda:
        "../envs/bench.yaml"
    log:
        f"{RAW}/{{scenario}}/{{point}}/rep{{rep}}/runpoint.log",
    shell:
        "{params.py:q} -m peercache.lab.pipeline.runpoint --testbed {params.testbed:q} "
        "--scenario {wildcards.scenario:q} --point {wildcards.point:q} --rep {wildcards.rep:q} "
        "--out {output:q} {params.scenarios:q} 2>&1 | tee {log:q}"
