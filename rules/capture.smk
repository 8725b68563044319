# Stage 0: the preflight checks every host before anything runs on it (ssh in batch
# mode, its python with PeerCache at this checkout's revision, the tools, the RDMA
# devices, ports and GIDs, reachability); a failing host stops the pipeline here
# with one line per problem. Stage 1: each host's testbed block (NICs, GID table,
# NUMA, CPU, versions).


rule preflight:
    output:
        f"{RAW}/testbed/preflight.json",
    params:
        py=PY,
        testbed=PLAN.testbed_path,
        scenarios=f"--scenarios {PLAN.scenarios_path}" if PLAN.scenarios_path else "",
    conda:
        "../envs/lab.yaml"
    log:
        f"{RAW}/testbed/preflight.log",
    shell:
        "{params.py} -m peercache.lab.pipeline preflight --testbed {params.testbed} {params.scenarios} "
        "--out {output} 2>&1 | tee {log}"


rule capture_host:
    input:
        rules.preflight.output,
    output:
        f"{RAW}/testbed/{{role}}.json",
    wildcard_constraints:
        role="producer|consumer",
    params:
        py=PY,
        testbed=PLAN.testbed_path,
        # a new capture format captures again (Snakemake re-runs a rule whose params changed)
        capture_schema=PLAN.capture_schema,
    resources:
        testbed=1,
    conda:
        "../envs/lab.yaml"
    log:
        f"{RAW}/testbed/{{role}}.log",
    shell:
        "{params.py} -m peercache.lab.pipeline capture --testbed {params.testbed} "
        "--role {wildcards.role} --out {output} > {log} 2>&1"
