# Robustness (when config has a `robustness` section): each dataset's test subset corrupted once
# (`linvit corrupt`), then every teacher and cell scored on it and on the ImageNet shift sets
# (`linvit robustness`); tables/robustness.*, figures/robustness.* and a section of report.md.
ROBUST = grid.robustness_section(config)
ROBUST_TARGETS = grid.robustness_targets(config, CELLS) if ROBUST else []


def corrupted_file(dataset):
    return f"{grid.corrupt_dir(RESULTS, dataset)}/run/corrupted.safetensors"


rule corrupt:
    input:
        code=lambda wc: code("corrupt", [], [], [registry_dataset(wc.dataset)]),
    output:
        record=f"{RESULTS}/robustness/corrupted/{{dataset}}/record.json",
    log:
        f"{RESULTS}/logs/robustness/corrupt/{{dataset}}.log",
    params:
        kind="corrupt",
        dir=lambda wc: f"{grid.corrupt_dir(RESULTS, wc.dataset)}/run",
        key=lambda wc: json.dumps({"dataset": wc.dataset}),
        args=lambda wc: grid.corrupt_args(config, wc.dataset,
                                          f"{grid.corrupt_dir(RESULTS, wc.dataset)}/run"),
    threads: 1
    resources:
        **RUN_RESOURCES,
    shell:
        RUN_AND_RECORD


def robustness_inputs(dataset, model_record):
    corrupt = grid.corrupt_datasets(config)
    return {"model": model_record,
            "corrupted": [f"{grid.corrupt_dir(RESULTS, dataset)}/record.json"]
            if dataset in corrupt else []}


def robustness_args(wc, model_dir, out_dir):
    corrupted = corrupted_file(wc.dataset) if wc.dataset in grid.corrupt_datasets(config) else None
    return grid.robustness_args(config, wc.dataset, f"{model_dir}/model.safetensors", corrupted,
                                out_dir)


def teacher_robustness_dir(wc):
    return grid.robustness_dir(RESULTS, wc.dataset, wc.teacher, wc.size)


rule robustness_teacher:
    input:
        unpack(lambda wc: robustness_inputs(wc.dataset, f"{teacher_dir(wc)}/record.json")),
        code=lambda wc: code("robustness", ["softmax"], [], [registry_dataset(wc.dataset)]),
    output:
        record=f"{RESULTS}/robustness/teachers/{{dataset}}/{{teacher}}/{{size}}/record.json",
    log:
        f"{RESULTS}/logs/robustness/teachers/{{dataset}}/{{teacher}}/{{size}}.log",
    params:
        kind="robustness",
        dir=lambda wc: f"{teacher_robustness_dir(wc)}/run",
        key=lambda wc: json.dumps({"dataset": wc.dataset, "teacher": wc.teacher,
                                   "size": wc.size, "operator": "softmax", "init": "teacher"}),
        args=lambda wc: robustness_args(wc, teacher_dir(wc), f"{teacher_robustness_dir(wc)}/run"),
    threads: 1
    resources:
        **RUN_RESOURCES,
    shell:
        RUN_AND_RECORD


def cell_robustness_dir(wc):
    return grid.robustness_dir(RESULTS, wc.dataset, wc.teacher, wc.size, cell_of(wc))


rule robustness_cell:
    input:
        unpack(lambda wc: robustness_inputs(
            wc.dataset, f"{grid.cell_dir(RESULTS, cell_of(wc))}/record.json")),
        code=lambda wc: code("robustness", [wc.operator], [], [registry_dataset(wc.dataset)]),
    output:
        record=f"{RESULTS}/robustness/cells/{{dataset}}/{{teacher}}/{{size}}/{{operator}}/{{init}}/{{loss}}/seed{{seed}}/record.json",
    log:
        f"{RESULTS}/logs/robustness/cells/{{dataset}}/{{teacher}}/{{size}}/{{operator}}/{{init}}/{{loss}}/seed{{seed}}.log",
    params:
        kind="robustness",
        dir=lambda wc: cell_robustness_dir(wc) + "/run",
        key=lambda wc: json.dumps(cell_of(wc).as_dict()),
        args=lambda wc: robustness_args(wc, grid.cell_dir(RESULTS, cell_of(wc)),
                                        cell_robustness_dir(wc) + "/run"),
    threads: 1
    resources:
        **RUN_RESOURCES,
    shell:
        RUN_AND_RECORD


def robustness_records():
    return [f"{grid.robustness_dir(RESULTS, *t)}/record.json" for t in ROBUST_TARGETS]


rule robustness_report:
    input:
        grid=f"{RESULTS}/grid.json",
        records=robustness_records(),
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
