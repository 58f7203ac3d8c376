# Dense tasks (target `dense`): embedded scenes, then UperNet and Mask R-CNN fine-tuned on the
# backbones of the teacher and of chosen cells; their own table, figure and dense.md. Paths, keys
# and commands: the jobs of linvit.workflow.plan.
from linvit.dense.tasks import TASKS  # noqa: E402


rule scenes:
    input:
        code=job_code("scenes"),
    output:
        pattern("scenes"),
    log:
        pattern("scenes", "log"),
    params:
        args=lambda wc: PLAN.find("scenes", wc).command(),
    shell:
        "{LINVIT} {params.args} > {log:q} 2>&1"


rule dense_job:
    input:
        job_inputs("dense"),
        code=job_code("dense"),
    output:
        record=pattern("dense"),
    log:
        pattern("dense", "log"),
    benchmark:
        pattern("dense", "benchmark")
    wildcard_constraints:
        task="|".join(TASKS),
    params:
        **job_params("dense"),
    threads: KINDS["dense"].threads
    resources:
        **RUN_RESOURCES,
    shell:
        RUN_AND_RECORD


rule dense_collect:
    input:
        records=[j.output for j in PLAN.of("dense")],
        code=code("collect"),
    output:
        f"{RESULTS}/dense/results.csv",
        f"{RESULTS}/dense/curves.csv",
        f"{RESULTS}/dense/distill_layers.csv",
    log:
        f"{RESULTS}/logs/dense_collect.log",
    params:
        out=f"{RESULTS}/dense",
    shell:
        "{REPORT} collect --out {params.out:q} {input.records:q} > {log:q} 2>&1"


rule dense:
    input:
        grid=f"{RESULTS}/grid.json",
        results=f"{RESULTS}/dense/results.csv",
        code=code("dense"),
    output:
        f"{RESULTS}/dense.md",
        f"{RESULTS}/tables/dense.csv",
        report(f"{RESULTS}/tables/dense.md", caption="../report/dense.rst", category="Dense tasks",
               labels={"table": "dense"}),
        f"{RESULTS}/tables/dense.tex",
        report(f"{RESULTS}/figures/dense.png", caption="../report/dense.rst",
               category="Dense tasks", labels={"figure": "dense"}),
        f"{RESULTS}/figures/dense.pdf",
        multiext(f"{RESULTS}/tables/dense_gaps", ".csv", ".md", ".tex"),
    log:
        f"{RESULTS}/logs/dense_report.log",
    params:
        tables=f"{RESULTS}/tables",
        figures=f"{RESULTS}/figures",
        out=f"{RESULTS}/dense.md",
    shell:
        "{REPORT} dense --grid {input.grid:q} --results {input.results:q}"
        " --tables {params.tables:q} --figures {params.figures:q} --out {params.out:q}"
        " > {log:q} 2>&1"
