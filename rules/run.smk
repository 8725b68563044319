# Stage 2: one job per point and repetition; both sides' logs, the meta block
# and the parsed rows land in the point's raw folder.


rule run_point:
    input:
        PLAN.capture_paths(),
    output:
        f"{RAW}/{{scenario}}/{{point}}/rep{{rep}}/result.json",
    params:
        py=PY,
        testbed=PLAN.testbed_path,
        scenarios=f"--scenarios {PLAN.scenarios_path}" if PLAN.scenarios_path else "",
    resources:
        testbed=1,
    conda:
        "../envs/bench.yaml"
    log:
        f"{RAW}/{{scenario}}/{{point}}/rep{{rep}}/runpoint.log",
    shell:
        "{params.py} -m peercache.lab.pipeline.runpoint --testbed {params.testbed} "
        "--scenario {wildcards.scenario} --point {wildcards.point} --rep {wildcards.rep} "
        "--out {output} {params.scenarios} 2>&1 | tee {log}"
