# Robustness (when config has a `robustness` section): each dataset's test subset corrupted once
# (`linvit corrupt`), then every teacher and cell scored on it and on the ImageNet shift sets
# (`linvit robustness`); tables/robustness.*, figures/robustness.* and a section of report.md.
# Paths, keys and commands: the jobs of linvit.workflow.plan.


rule corrupt:
    input:
        code=job_code("corrupt"),
    output:
        record=pattern("corrupt"),
    log:
        pattern("corrupt", "log"),
    params:
        **job_params("corrupt"),
    threads: KINDS["corrupt"].threads
    resources:
        **RUN_RESOURCES,
    shell:
        RUN_AND_RECORD


rule robustness_teacher:
    input:
        job_inputs("robustness_teacher"),
        code=job_code("robustness_teacher"),
    output:
        record=pattern("robustness_teacher"),
    log:
        pattern("robustness_teacher", "log"),
    params:
        **job_params("robustness_teacher"),
    threads: KINDS["robustness_teacher"].threads
    resources:
        **RUN_RESOURCES,
    shell:
        RUN_AND_RECORD


rule robustness_cell:
    input:
        job_inputs("robustness_cell"),
        code=job_code("robustness_cell"),
    output:
        record=pattern("robustness_cell"),
    log:
        pattern("robustness_cell", "log"),
    params:
        **job_params("robustness_cell"),
    threads: KINDS["robustness_cell"].threads
    resources:
        **RUN_RESOURCES,
    shell:
        RUN_AND_RECORD


rule robustness_report:
    input:
        grid=OUT.grid,
        records=[j.output for j in PLAN.of("robustness_teacher", "robustness_cell")],
        code=code("robustness-report"),
    output:
        OUT.table("robustness", "csv"),
        in_report(OUT.table("robustness", "md"), "table", "Tables", table="robustness"),
        OUT.table("robustness", "tex"),
        in_report(OUT.figure("robustness", "png"), "figure", "Figures", figure="robustness"),
        OUT.figure("robustness", "pdf"),
        section=OUT.section("robustness"),
    log:
        OUT.log("robustness_report"),
    params:
        tables=OUT.tables,
        figures=OUT.figures,
    shell:
        "{REPORT} robustness-report --grid {input.grid:q} --tables {params.tables:q}"
        " --figures {params.figures:q} --out {output.section:q} {input.records:q} > {log:q} 2>&1"
