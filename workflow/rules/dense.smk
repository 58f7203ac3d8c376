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
        grid=OUT.grid,
        records=[j.output for j in PLAN.of("dense")],
        code=code("collect"),
    output:
        [OUT.collected(name, sub="dense") for name in COLLECTED],
    log:
        OUT.log("dense_collect"),
    params:
        out=OUT.at("dense"),
    shell:
        "{REPORT} collect --grid {input.grid:q} --key-only --out {params.out:q}"
        " {input.records:q} > {log:q} 2>&1"


rule dense:
    input:
        grid=OUT.grid,
        results=OUT.collected("results", sub="dense"),
        code=code("dense"),
    output:
        OUT.section("dense"),
        OUT.table("dense", "csv"),
        report(OUT.table("dense", "md"), caption="../report/dense.rst", category="Dense tasks",
               labels={"table": "dense"}),
        OUT.table("dense", "tex"),
        report(OUT.figure("dense", "png"), caption="../report/dense.rst",
               category="Dense tasks", labels={"figure": "dense"}),
        OUT.figure("dense", "pdf"),
        [OUT.table("dense_gaps", fmt) for fmt in TABLE_FORMATS],
    log:
        OUT.log("dense_report"),
    params:
        tables=OUT.tables,
        figures=OUT.figures,
        out=OUT.section("dense"),
    shell:
        "{REPORT} dense --grid {input.grid:q} --results {input.results:q}"
        " --tables {params.tables:q} --figures {params.figures:q} --out {params.out:q}"
        " > {log:q} 2>&1"
