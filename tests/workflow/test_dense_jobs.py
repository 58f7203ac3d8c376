"""The dense sub-grid's jobs: backbones, seeds and the report's dense section."""
from __future__ import annotations

import shlex

from linvit.workflow import check, dense_jobs, grid

from grid_configs import ROOT, default_config


def test_dense_backbones_of_dotted_loss_names_round_trip():
    cell = grid.Cell("fashion_mnist", "t", "cpu96", "linear", "copy_mlp+distill", "map.v2", 1)
    job = dense_jobs.DenseJob("segment", "fashion_mnist", "t", "cpu96",
                              dense_jobs.backbone_label(cell))
    assert job.cell == cell and job.seed == 1 and job.key()["seed"] == 1
    teacher = dense_jobs.DenseJob("segment", "fashion_mnist", "t", "cpu96", "teacher.seed3")
    assert teacher.cell is None and teacher.seed == 3
    assert teacher.key() == {"task": "segment", "dataset": "fashion_mnist", "teacher": "t",
                             "size": "cpu96", "operator": "softmax", "init": "teacher",
                             "loss": "none", "seed": 3}


def test_every_dense_job_trains_its_heads_with_its_own_seed():
    """The seed axis seeds the heads of every dense job, the teacher's included (one backbone,
    a job per seed), over a seed the user's stage may set."""
    config = default_config()
    config["dense"] = {**config["dense"], "seeds": [0, 2]}
    config["dense"]["stages"] = {**config["dense"]["stages"], "detect": {
        **config["dense"]["stages"]["detect"], "run": {"seed": 7}}}
    jobs = dense_jobs.dense_jobs(config, grid.expand_grid(config))
    assert {j.backbone for j in jobs if j.cell is None} == {"teacher.seed0", "teacher.seed2"}
    for job in jobs:
        args = shlex.split(dense_jobs.dense_args(config, job, "m.safetensors", "scenes", "out"))
        assert f"run.seed={job.seed}" in args, (job, args)


def test_the_report_has_the_dense_section_when_asked_or_once_it_exists(tmp_path):
    config = default_config()
    results = str(tmp_path)
    assert dense_jobs.dense_in_report(config, results) == []
    assert dense_jobs.dense_in_report({**config, "dense": {**config["dense"], "in_all": True}},
                                results) == [f"{results}/dense.md"]
    (tmp_path / "dense.md").write_text("## Dense tasks\n")
    assert dense_jobs.dense_in_report(config, results) == [f"{results}/dense.md"]
    assert dense_jobs.dense_in_report({**config, "dense": None}, results) == []


def test_dense_seeds_beyond_the_grid_s_add_backbone_cells_for_the_dense_sub_grid_only():
    config = {**default_config(), "seeds": [0]}
    config["dense"] = {**config["dense"], "operators": ["linear"], "seeds": [0, 1]}
    cells = grid.expand_grid(config)
    extra = dense_jobs.dense_cells(config, cells)
    assert {(c.operator, c.init, c.seed) for c in extra} == {
        ("linear", init, 1) for init in config["dense"]["strategies"]}
    assert not set(extra) & set(cells)
    finetunes = {where for field, where, _ in check.job_arguments(config, str(ROOT / "Snakefile"))
                 if field == "stages.finetune"}
    assert {grid.cell_dir("", c).lstrip("/") for c in extra} <= finetunes
    backbones = {j.backbone for j in dense_jobs.dense_jobs(config, cells) if j.task == "segment"}
    assert backbones == {"teacher.seed0", "teacher.seed1"} | {
        dense_jobs.backbone_label(c) for c in extra} | {
        dense_jobs.backbone_label(c) for c in cells if c.operator == "linear" and c.seed == 0
        and c.init in config["dense"]["strategies"] and c.loss in ("none", config["main_loss"])}
