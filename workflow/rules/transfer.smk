# Distillation (one per dataset, teacher, size, operator and loss design) and the fine-tuned
# cells.


rule distill:
    input:
        teacher=lambda wc: f"{teacher_dir(wc)}/record.json",
        code=lambda wc: code("distill", ["softmax", wc.operator],
                             list(config["losses"][wc.loss]), [registry_dataset(wc.dataset)]),
    output:
        record=f"{RESULTS}/distill/{{dataset}}/{{teacher}}/{{size}}/{{operator}}/{{loss}}/record.json",
    log:
        f"{RESULTS}/logs/distill/{{dataset}}/{{teacher}}/{{size}}/{{operator}}/{{loss}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/distill/{{dataset}}/{{teacher}}/{{size}}/{{operator}}/{{loss}}.tsv"
    params:
        kind="distill",
        dir=distill_dir,
        key=lambda wc: json.dumps({"dataset": wc.dataset, "teacher": wc.teacher,
                                   "size": wc.size, "operator": wc.operator, "loss": wc.loss}),
        args=lambda wc: grid.distill_args(config, wc.dataset, wc.teacher, wc.size, wc.operator,
                                          wc.loss, f"{teacher_dir(wc)}/model.safetensors",
                                          distill_dir(wc)),
    threads: 1
    resources:
        **RUN_RESOURCES,
    shell:
        RUN_AND_RECORD


def distilled_input(wc):
    return [f"{distill_dir(wc)}/record.json"] if cell_of(wc).needs_distill else []


def finetune_args(wc):
    cell = cell_of(wc)
    distilled = f"{distill_dir(wc)}/model.safetensors" if cell.needs_distill else None
    return grid.finetune_args(config, cell, f"{teacher_dir(wc)}/model.safetensors", distilled,
                              grid.cell_dir(RESULTS, cell))


rule finetune:
    input:
        teacher=lambda wc: f"{teacher_dir(wc)}/record.json",
        distilled=distilled_input,
        code=lambda wc: code("finetune", ["softmax", wc.operator], [],
                             [registry_dataset(wc.dataset)]),
    output:
        record=f"{RESULTS}/cells/{{dataset}}/{{teacher}}/{{size}}/{{operator}}/{{init}}/{{loss}}/seed{{seed}}/record.json",
    log:
        f"{RESULTS}/logs/cells/{{dataset}}/{{teacher}}/{{size}}/{{operator}}/{{init}}/{{loss}}/seed{{seed}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/cells/{{dataset}}/{{teacher}}/{{size}}/{{operator}}/{{init}}/{{loss}}/seed{{seed}}.tsv"
    params:
        kind="cell",
        dir=lambda wc: grid.cell_dir(RESULTS, cell_of(wc)),
        key=lambda wc: json.dumps(cell_of(wc).as_dict()),
        args=finetune_args,
    threads: 1
    resources:
        **RUN_RESOURCES,
    shell:
        RUN_AND_RECORD
