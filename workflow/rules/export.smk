# Chosen cells as Hugging Face Hub-style folders in timm's conventions (target `export`; the
# config's `export` section chooses them): `linvit export` on each cell's run folder, into
# <results>/export/<the cell's levels>/, which timm loads as `local-dir:<that folder>`.


rule export_cell:
    input:
        job_inputs("export"),
        code=job_code("export"),
    output:
        pattern("export"),
    log:
        pattern("export", "log"),
    params:
        args=lambda wc: PLAN.find("export", wc).command(),
    shell:
        "{LINVIT} --code-stamp {input.code:q} {params.args} > {log:q} 2>&1"


rule export:
    input:
        [j.output for j in PLAN.of("export")],
