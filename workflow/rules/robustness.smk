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
        grid=f"{RESULTS}/grid.json",
        records=[j.output for j in PLAN.of("robustness_teacher", "robustness_cell")],
        code=code("robustness-report"),
    output:
        f"{RESULTS}/tables/robustness.csv",
        in_report(f"{RESULTS}/tables/robustness.md", "table", "Tables", table="robustness"),
        f"{RESULTS}/tables/robustness.tex",
        in_report(f"{RESULTS}/figures/robustness.png", "figure", "Figures", figure="robustness"),
        f"{RESULTS}/figures/robustness.pdf",
        section=f"{RESULTS}/robustness.md",
    log:
        f"{RESULTS}/logs/robustness_report.log",
    params:
        tables=f"{RESULTS}/tables",
        figures=f"{RESULTS}/figures",
    shell:
        "{REPORT} robustness-report --grid {input.grid:q} --tables {params.tables:q}"
        " --figures {params.figures:q} --out {output.section:q} {input.records:q} > {log:q} 2>&1"
