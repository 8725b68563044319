# Stage 4: charts and tables regenerated from the tidy data, then the report.


rule charts:
    input:
        rules.collect.output.rows,
        rules.collect.output.runs,
    output:
        index=f"figures/{TB}/index.md",
    params:
        py=PY,
        tb=TB,
    conda:
        "../envs/analysis.yaml"
    log:
        f"reports/{TB}/charts.log",
    shell:
        "{params.py:q} make_charts.py --testbed {params.tb:q} --out figures > {log:q} 2>&1"


rule report:
    input:
        rules.collect.output.rows,
        rules.charts.output.index,
    output:
        nb=f"reports/{TB}/report.ipynb",
        html=f"reports/{TB}/report.html",
        md=f"reports/{TB}/report.md",
        csv=f"reports/{TB}/report-rows.csv",
    params:
        py=PY,
        tb=TB,
        baseline="peercache-8xcx7-roce",
        tidy_root=lambda w, input: str(Path(input[0]).parents[1].resolve()),
        figures_root=lambda w, input: str(Path(input[1]).parents[1].resolve()),
        captures=lambda w: str((Path(RAW) / "testbed").resolve()),
        out=lambda w, output: str(Path(output.html).parent.resolve()),
    conda:
        "../envs/analysis.yaml"
    log:
        f"reports/{TB}/report.log",
    shell:
        "{params.py:q} -m peercache.lab.analysis.papermill_run notebooks/report.ipynb reports/{params.tb:q} --no-html "
        "-p tidy_dir {params.tidy_root:q} -p figures_dir {params.figures_root:q} -p testbed {params.tb:q} "
        "-p baseline {params.baseline:q} -p captures_dir {params.captures:q} -p out_dir {params.out:q} > {log:q} 2>&1"
