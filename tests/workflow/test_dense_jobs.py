"""The dense sub-grid's jobs: backbones, seeds and the report's dense section."""
from __future__ import annotations

from linvit.workflow import dense_jobs, grid
from linvit.workflow.plan import plan

from grid_configs import default_config


def test_a_dense_job_s_key_names_its_backbone():
    cell = grid.Cell("fashion_mnist", "t", "cpu96", "linear", "copy_mlp+distill", "map.v2", 1)
    model = grid.Model("fashion_mnist", "t", "cpu96")
    run = dense_jobs.DenseRun("segment", model, cell, 1)
    assert run.backbone == "linear.copy_mlp+distill.map.v2.seed1"
    assert run.key() == {**cell.as_dict(), "task": "segment"}
    teacher = dense_jobs.DenseRun("segment", model, None, 3)
    assert teacher.backbone == "teacher.seed3"
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
    jobs = plan(config).of("dense")
    assert {j.wildcards["backbone"] for j in jobs if j.key["init"] == "teacher"} == {
        "teacher.seed0", "teacher.seed2"}
    for job in jobs:
        assert f"run.seed={job.key['seed']}" in job.words(), job.folder


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
    jobs = plan(config)
    assert {grid.Cell.of(j.key) for j in jobs.of("cell")} == set(cells) | set(extra)
    assert jobs.cells == cells                           # the tables' cells: the grid's alone
    backbones = {j.wildcards["backbone"] for j in jobs.of("dense") if j.key["task"] == "segment"}
    label = "{0.operator}.{0.init}.{0.loss}.seed{0.seed}".format
    assert backbones == {"teacher.seed0", "teacher.seed1"} | {label(c) for c in extra} | {
        label(c) for c in cells if c.operator == "linear" and c.seed == 0
        and c.init in config["dense"]["strategies"] and c.loss in ("none", config["main_loss"])}
