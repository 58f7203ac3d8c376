# One softmax teacher per (dataset, size): pretrained here, or imported from timm weights.


rule teacher:
    input:
        code=lambda wc: code(grid.teacher_stage(config, wc.size), ["softmax"], [],
                             [registry_dataset(wc.dataset)]),
    output:
        record=f"{RESULTS}/teachers/{{dataset}}/{{size}}/record.json",
    log:
        f"{RESULTS}/logs/teachers/{{dataset}}/{{size}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/teachers/{{dataset}}/{{size}}.tsv"
    params:
        kind="teacher",
        dir=teacher_dir,
        key=lambda wc: json.dumps({"dataset": wc.dataset, "size": wc.size}),
        args=lambda wc: grid.teacher_args(config, wc.dataset, wc.size, teacher_dir(wc)),
    threads: 2
    resources:
        gpu=0,
    shell:
        RUN_AND_RECORD
