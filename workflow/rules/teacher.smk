# Teacher models, one per (dataset, teacher, size): made at the teacher's own size (pretrained
# here, or imported from timm weights, then given a head by `linvit probe` where the teacher
# names one), and cut down by weight selection (`linvit select`) to each smaller student size.
# Paths, keys and commands: the jobs of linvit.workflow.plan.


rule teacher:
    input:
        job_inputs("teacher"),
        code=job_code("teacher"),
    output:
        record=pattern("teacher"),
    log:
        pattern("teacher", "log"),
    benchmark:
        pattern("teacher", "benchmark")
    params:
        **job_params("teacher"),
    threads: KINDS["teacher"].threads
    resources:
        **RUN_RESOURCES,
    shell:
        RUN_AND_RECORD


rule import_teacher:
    input:
        code=job_code("import"),
    output:
        record=pattern("import"),
    log:
        pattern("import", "log"),
    params:
        **job_params("import"),
    threads: KINDS["import"].threads
    resources:
        **RUN_RESOURCES,
    shell:
        RUN_AND_RECORD
