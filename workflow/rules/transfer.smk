# Distillation (one per dataset, teacher, size, operator and loss design) and the fine-tuned
# cells. Paths, keys and commands: the jobs of linvit.workflow.plan.


rule distill:
    input:
        job_inputs("distill"),
        code=job_code("distill"),
    output:
        record=pattern("distill"),
    log:
        pattern("distill", "log"),
    benchmark:
        pattern("distill", "benchmark")
    params:
        **job_params("distill"),
    threads: KINDS["distill"].threads
    resources:
        **RUN_RESOURCES,
    shell:
        RUN_AND_RECORD


rule finetune:
    input:
        job_inputs("cell"),
        code=job_code("cell"),
    output:
        record=pattern("cell"),
    log:
        pattern("cell", "log"),
    benchmark:
        pattern("cell", "benchmark")
    params:
        **job_params("cell"),
    threads: KINDS["cell"].threads
    resources:
        **RUN_RESOURCES,
    shell:
        RUN_AND_RECORD
