# Stage 3: raw results -> tidy tables, through the papermill-executed collect notebook.


rule collect:
    input:
        PLAN.result_paths(),
    output:
        rows=f"data/tidy/{TB}/rows.parquet",
        runs=f"data/tidy/{TB}/runs.parquet",
        nb=f"reports/{TB}/collect.ipynb",
        html=f"reports/{TB}/collect.html",
    params:
        py=PY,
        tb=TB,
        # data/raw/<tb>/<scenario>/<point>/rep<k>/result.json -> data/raw
        # (absolute: the notebook resolves relative paths from the package's checkout)
        raw_root=lambda w, input: str(Path(input[0]).parents[4].resolve()),
        tidy_root=lambda w, output: str(Path(output.rows).parents[1].resolve()),
        expected=PLAN.expected_yaml(),
    conda:
        "../envs/analysis.yaml"
    log:
        f"reports/{TB}/collect.log",
    shell:
        "{params.py:q} -m peercache.lab.analysis.papermill_run notebooks/collect.ipynb reports/{params.tb:q} "
        "-p raw_dir {params.raw_root:q} -p tidy_dir {params.tidy_root:q} -p testbed {params.tb:q} "
        "-p expected {params.expected:q} > {log:q} 2>&1"
