# Stage 1: each host's testbed block (NICs, GID table, NUMA, CPU, versions).


rule capture_host:
    output:
        f"{RAW}/testbed/{{role}}.json",
    wildcard_constraints:
        role="producer|consumer",
    params:
        py=PY,
        testbed=PLAN.testbed_path,
    resources:
        testbed=1,
    conda:
        "../envs/lab.yaml"
    log:
        f"{RAW}/testbed/{{role}}.log",
    shell:
        "{params.py} -m peercache.lab.pipeline capture --testbed {params.testbed} "
        "--role {wildcards.role} --out {output} > {log} 2>&1"
