# Fine-tuning settings chosen on a validation split (when config has a `selection` section):
# every candidate on each strategy's cells of one seed, scored on the validation images, then
# the choice (`choose`: the chosen setting's YAML, which the grid's cells of that strategy read
# first). Paths, keys and commands: the jobs of linvit.workflow.plan.


rule select_cell:
    input:
        job_inputs("select_cell"),
        code=job_code("select_cell"),
    output:
        record=pattern("select_cell"),
    log:
        pattern("select_cell", "log"),
    benchmark:
        pattern("select_cell", "benchmark")
    params:
        **job_params("select_cell"),
    threads: KINDS["select_cell"].threads
    resources:
        **RUN_RESOURCES,
    shell:
        RUN_AND_RECORD


rule choose:
    input:
        job_inputs("choose"),
        grid=OUT.grid,
        code=job_code("choose"),
    output:
        pattern("choose"),
    log:
        pattern("choose", "log"),
    params:
        records=lambda wc: PLAN.find("choose", wc).inputs,
    shell:
        "{REPORT} choose --grid {input.grid:q} --out {output:q} {params.records:q} > {log:q} 2>&1"
