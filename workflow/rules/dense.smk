# Dense tasks (target `dense`): embedded scenes, then UperNet and Mask R-CNN fine-tuned on the
# backbones of the teacher and of chosen cells; their own table, figure and dense.md.
from linvit.dense.tasks import TASKS  # noqa: E402

DENSE = dense_jobs.dense_jobs(config, CELLS)
DENSE_OF = {j.backbone: j for j in DENSE}
SCENES = f"{RESULTS}/scenes"


def dense_job(wc):
    return dense_jobs.DenseJob(wc.task, wc.dataset, wc.teacher, wc.size, wc.backbone)


def backbone_dir(wc):
    cell = dense_job(wc).cell
    return grid.cell_dir(RESULTS, cell) if cell else teacher_dir(wc)


rule scenes:
    input:
        code=code("make-scenes", [], [], ["fashion_mnist"]),
    output:
        f"{SCENES}/MANIFEST.json",
    log:
        f"{RESULTS}/logs/scenes.log",
    params:
        args=lambda wc: dense_jobs.scenes_args(config, SCENES),
    shell:
        "{LINVIT} {params.args} > {log:q} 2>&1"


rule dense_job:
    input:
        backbone=lambda wc: f"{backbone_dir(wc)}/record.json",
        scenes=lambda wc: [f"{SCENES}/MANIFEST.json"]
        if dense_jobs.dense_uses_scenes(config, wc.task) else [],
        code=lambda wc: code(wc.task, ["softmax", dense_job(wc).key()["operator"]], [],
                             [registry_dataset(wc.dataset)]),
    output:
        record=f"{RESULTS}/dense/{{task}}/{{dataset}}/{{teacher}}/{{size}}/{{backbone}}/record.json",
    log:
        f"{RESULTS}/logs/dense/{{task}}/{{dataset}}/{{teacher}}/{{size}}/{{backbone}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/dense/{{task}}/{{dataset}}/{{teacher}}/{{size}}/{{backbone}}.tsv"
    wildcard_constraints:
        task="|".join(TASKS),
    params:
        kind="dense",
        dir=lambda wc: dense_jobs.dense_dir(RESULTS, dense_job(wc)),
        key=lambda wc: json.dumps(dense_job(wc).key()),
        args=lambda wc: dense_jobs.dense_args(config, dense_job(wc),
                                        f"{backbone_dir(wc)}/model.safetensors", SCENES,
                                        dense_jobs.dense_dir(RESULTS, dense_job(wc))),
    threads: 1
    resources:
        **RUN_RESOURCES,
    shell:
        RUN_AND_RECORD


rule dense_collect:
    input:
        records=[f"{dense_jobs.dense_dir(RESULTS, j)}/record.json" for j in DENSE],
        code=code("collect"),
    output:
        f"{RESULTS}/dense/results.csv",
        f"{RESULTS}/dense/curves.csv",
        f"{RESULTS}/dense/distill_layers.csv",
    log:
        f"{RESULTS}/logs/dense_collect.log",
    params:
        out=f"{RESULTS}/dense",
    shell:
        "{REPORT} collect --out {params.out:q} {input.records:q} > {log:q} 2>&1"


rule dense:
    input:
        grid=f"{RESULTS}/grid.json",
        results=f"{RESULTS}/dense/results.csv",
        code=code("dense"),
    output:
        f"{RESULTS}/dense.md",
        f"{RESULTS}/tables/dense.csv",
        report(f"{RESULTS}/tables/dense.md", caption="../report/dense.rst", category="Dense tasks",
               labels={"table": "dense"}),
        f"{RESULTS}/tables/dense.tex",
        report(f"{RESULTS}/figures/dense.png", caption="../report/dense.rst",
               category="Dense tasks", labels={"figure": "dense"}),
        f"{RESULTS}/figures/dense.pdf",
        multiext(f"{RESULTS}/tables/dense_gaps", ".csv", ".md", ".tex"),
    log:
        f"{RESULTS}/logs/dense_report.log",
    params:
        tables=f"{RESULTS}/tables",
        figures=f"{RESULTS}/figures",
        out=f"{RESULTS}/dense.md",
    shell:
        "{REPORT} dense --grid {input.grid:q} --results {input.results:q}"
        " --tables {params.tables:q} --figures {params.figures:q} --out {params.out:q}"
        " > {log:q} 2>&1"
