# Teacher models, one per (dataset, teacher, size): made at the teacher's own size (pretrained
# here, or imported from timm weights, then given a head by `linvit probe` where the teacher
# names one), and cut down by weight selection (`linvit select`) to each smaller student size.


def teacher_inputs(wc):
    source = grid.teacher_source(RESULTS, config, wc.dataset, wc.teacher, wc.size)
    return [f"{source}/record.json"] if source else []


def teacher_args(wc):
    source = grid.teacher_source(RESULTS, config, wc.dataset, wc.teacher, wc.size)
    return grid.teacher_args(config, wc.dataset, wc.teacher, wc.size,
                             f"{source}/model.safetensors" if source else None, teacher_dir(wc))


rule teacher:
    input:
        source=teacher_inputs,
        code=lambda wc: code(grid.teacher_stage(config, wc.teacher, wc.size), ["softmax"], [],
                             [registry_dataset(wc.dataset)]),
    output:
        record=f"{RESULTS}/teachers/{{dataset}}/{{teacher}}/{{size}}/record.json",
    log:
        f"{RESULTS}/logs/teachers/{{dataset}}/{{teacher}}/{{size}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/teachers/{{dataset}}/{{teacher}}/{{size}}.tsv"
    params:
        kind="teacher",
        dir=teacher_dir,
        key=lambda wc: json.dumps({"dataset": wc.dataset, "teacher": wc.teacher,
                                   "size": wc.size,
                                   "stage": grid.teacher_stage(config, wc.teacher, wc.size)}),
        args=teacher_args,
    threads: 2
    resources:
        **RUN_RESOURCES,
    shell:
        RUN_AND_RECORD


rule import_teacher:
    input:
        code=lambda wc: code("import-teacher", ["softmax"], [], [registry_dataset(wc.dataset)]),
    output:
        record=f"{RESULTS}/imports/{{dataset}}/{{teacher}}/{{size}}/record.json",
    log:
        f"{RESULTS}/logs/imports/{{dataset}}/{{teacher}}/{{size}}.log",
    params:
        kind="import",
        dir=lambda wc: grid.import_dir(RESULTS, wc.dataset, wc.teacher, wc.size),
        key=lambda wc: json.dumps({"dataset": wc.dataset, "teacher": wc.teacher,
                                   "size": wc.size}),
        args=lambda wc: grid.import_args(config, wc.dataset, wc.teacher,
                                         grid.import_dir(RESULTS, wc.dataset, wc.teacher,
                                                         wc.size)),
    threads: 1
    resources:
        **RUN_RESOURCES,
    shell:
        RUN_AND_RECORD
