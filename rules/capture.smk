# Stage 0: the preflight checks every host before anything runs on it (ssh in batch
# mode, its python with PeerCache at this checkout's revision, the tools, the RDMA
# devices, ports and GIDs, reachability); a failing host stops the pipeline here
# with one line per problem. Stage 1: each host's testbed block (NICs, GID table,
# NUMA, CPU, versions): producer.json and consumer.json, and on a testbed that lists
# its hosts one <name>.json per listed host (Plan.capture_names).
#
# Every value in a shell command below is quoted (`:q`): the paths come from the
# testbed file and the folder the checkout lives in, and a space, `;` or `$(...)`
# there must stay part of the path, never become shell syntax.


rule preflight:
    output:
        f"{RAW}/testbed/preflight.json",
    params:
        py=PY,
        testbed=PLAN.testbed_path,
        # a list: `:q` quotes each word (an empty list adds nothing)
        scenarios=["--scenarios-file", PLAN.scenarios_path] if PLAN.scenarios_path else [],
    conda:
        "../envs/lab.yaml"
    log:
        f"{RAW}/testbed/preflight.log",
    shell:
        "{params.py:q} -m peercache.lab.pipeline preflight --testbed {params.testbed:q} {params.scenarios:q} "
        "--out {output:q} 2>&1 | tee {log:q}"


rule capture_host:
    input:
        rules.preflight.output,
    output:
        f"{RAW}/testbed/{{role}}.json",
    wildcard_constraints:
        role=PLAN.capture_pattern(),
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
        "{params.py:q} -m peercache.lab.pipeline capture --testbed {params.testbed:q} "
        "--role {wildcards.role:q} --out {output:q} > {log:q} 2>&1"
