"""The grid: cells, teachers, distillations, each job's folder and CLI overrides, the report's
tables per axis."""
from __future__ import annotations

from linvit.config import load_config
from linvit.report.claims import CLAIMS, SOFTMAX
from linvit.transfer.config import FinetuneConfig
from linvit.workflow import check, grid
from linvit.workflow.plan import plan

from grid_configs import ROOT, default_config, loss_grid_config, teacher_axis_config


def test_default_grid_decides_every_claim_on_two_operator_families_with_seeds():
    """What the report's claims read: every strategy of every claim, the softmax reference, a
    feature map and a gated operator, and seeds to pair (one seed decides nothing)."""
    config = default_config()
    cells = grid.expand_grid(config)
    needed = {s for claim in CLAIMS if claim.finding != "diagnostic" for s in claim.needs
              if s != SOFTMAX}
    assert needed <= set(config["strategies"])
    assert {"linear", "gla"} <= set(config["operators"])
    assert len(config["seeds"]) >= 3
    main = [c for c in cells if c.loss in (config["main_loss"], "none") and c.operator != "softmax"]
    assert {c.init for c in main} == set(config["strategies"])
    assert len(main) == len(config["strategies"]) * len(config["operators"]) * len(config["seeds"])
    assert any(c.operator == "softmax" for c in cells)
    assert grid.teachers(config, cells) == [grid.Model("fashion_mnist", "pretrain", "cpu96")]
    # one distillation per operator, shared by every cell that needs it
    assert len(grid.distillations(config, cells)) == len(config["operators"])


def test_loss_is_none_exactly_for_strategies_without_distillation():
    for c in grid.expand_grid(default_config()):
        assert (c.loss == "none") == (c.init not in ("distill", "copy_mlp+distill",
                                                     "copy_embed+distill"))


def words(config: dict, kind: str, stand_in: str | None = None, **wildcards) -> list[str]:
    """The override words of the job of `kind` with these wildcards."""
    return plan(config).find(kind, wildcards).words(stand_in)


def test_job_arguments_are_valid_linvit_configs(tmp_path):
    config = {**loss_grid_config(), "operators": ["focused"], "seeds": [3]}
    teacher = tmp_path / "t.safetensors"
    teacher.write_bytes(b"")
    cell = dict(dataset="fashion_mnist", teacher="pretrain", size="cpu96", operator="focused",
                init="copy_mlp+distill", loss="out", seed=3)
    cfg = load_config(FinetuneConfig, None, words(config, "cell", str(teacher), **cell))
    assert (cfg.model.operator, cfg.init.strategy, cfg.run.seed) == \
        ("focused", "copy_mlp+distill", 3)
    assert cfg.data.train_subset == config["stages"]["finetune"]["data"]["train_subset"]
    distill = words(config, "distill", **{**cell, "operator": "linear", "loss": "map+out"})
    assert 'distill.losses={"attn_map_ce": 1.0, "attn_out_mse": 1.0}' in distill


def test_each_distillation_gets_exactly_its_loss_design(tmp_path):
    """A loss design's weights replace the stage default, never add to it."""
    from linvit.transfer.config import DistillConfig
    config, teacher = default_config(), str(ROOT / "Snakefile")
    for design, weights in config["losses"].items():
        overrides = words(config, "distill", teacher, dataset="fashion_mnist", teacher="pretrain",
                          size="cpu96", operator="linear", loss=design)
        assert load_config(DistillConfig, None, overrides).distill.losses == weights, design


def test_robustness_folders_mirror_the_models_they_score():
    jobs = plan(default_config())
    cell = jobs.of("cell")[0]
    scored = jobs.find("robustness_cell", cell.wildcards)
    assert scored.folder == cell.folder.replace("results/", "results/robustness/", 1)
    teacher = jobs.find("robustness_teacher", jobs.of("teacher")[0].wildcards)
    assert teacher.folder == "results/robustness/teachers/fashion_mnist/pretrain/cpu96"
    assert scored.inputs[0] == cell.output and scored.overrides["checkpoint"] == cell.model


def test_teacher_axis_makes_selects_and_probes_each_teacher(tmp_path, monkeypatch):
    import linvit.config
    config = teacher_axis_config(tmp_path)
    cells = grid.expand_grid(config)
    per_teacher = {t: [c for c in cells if c.teacher == t] for t in config["teachers"]}
    assert {t: len(c) for t, c in per_teacher.items()} == {t: len(cells) // 3 for t in per_teacher}
    assert {c.size for c in cells} == {"cpu96"}
    # the wide teacher is made at its own size, then cut down for its cpu96 students
    models = grid.teachers(config, cells)
    assert models.index(grid.Model("fashion_mnist", "wide", "cpu192")) < \
        models.index(grid.Model("fashion_mnist", "wide", "cpu96"))
    stages = {(t, s): grid.teacher_stage(config, t, s) for _, t, s, _ in models}
    assert stages == {("pretrain", "cpu96"): "pretrain", ("wide", "cpu192"): "pretrain",
                      ("wide", "cpu96"): "select", ("deit", "cpu96"): "probe"}
    assert grid.imports(config, cells) == [("fashion_mnist", "deit", "cpu96")]
    jobs = {(j.kind.name, j.wildcards["teacher"], j.wildcards["size"]): j
            for j in plan({**config, "results": "R"}).of("teacher", "import")}
    select, probe = jobs["teacher", "wide", "cpu96"], jobs["teacher", "deit", "cpu96"]
    assert select.inputs == ["R/teachers/fashion_mnist/wide/cpu192/record.json"]
    assert probe.inputs == ["R/imports/fashion_mnist/deit/cpu96/record.json"]
    assert select.stage == "select" and {'teacher="R/teachers/fashion_mnist/wide/cpu192/'
                                         'model.safetensors"', 'size="cpu96"'} <= set(
        select.words())
    assert probe.stage == "probe" and {'teacher="R/imports/fashion_mnist/deit/cpu96/'
                                       'model.safetensors"', 'mode="linear"'} <= set(
        probe.words())
    imported = jobs["import", "deit", "cpu96"].words()
    assert {"headless=true", "reset_head=false", "layout=\"mocov3\""} <= set(imported)
    # every job of the axis is built into its stage's config before any runs
    built, load = [], linvit.config.load_config
    monkeypatch.setattr(linvit.config, "load_config",
                        lambda cls, path, overrides: built.append(cls.__name__)
                        or load(cls, path, overrides))
    check.check_config(config, str(ROOT / "Snakefile"))
    assert {n: built.count(n) for n in ("PretrainConfig", "SelectConfig", "ImportConfig",
                                        "ProbeConfig")} == {"PretrainConfig": 2, "SelectConfig": 1,
                                                            "ImportConfig": 1, "ProbeConfig": 1}
    assert grid.grid_document(config, cells)["orders"]["teacher"] == ["pretrain", "wide", "deit"]


def test_an_axis_table_exists_only_where_its_axis_has_two_values(tmp_path):
    config = default_config()
    assert grid.report_tables(config, grid.expand_grid(config)) == [
        "main", "claims", "time_to_target", "distill_quality"]
    sub = loss_grid_config()
    assert grid.report_tables(sub, grid.expand_grid(sub))[3] == "loss_design"
    wide = {**config, "sizes": ["cpu96", "cpu192"], "loss_grid": None}
    assert grid.report_tables(wide, grid.expand_grid(wide)) == [
        "main", "claims", "time_to_target", "distill_quality", "by_size"]
    plain = {**config, "strategies": ["random", "copy_mlp"]}         # nothing distilled
    assert "distill_quality" not in grid.report_tables(plain, grid.expand_grid(plain))
    taught = teacher_axis_config(tmp_path)
    assert "by_teacher" in grid.report_tables(taught, grid.expand_grid(taught))
    assert grid.grid_document(taught, grid.expand_grid(taught))["tables"] == \
        grid.report_tables(taught, grid.expand_grid(taught))


def test_a_dataset_overrides_the_grids_stages_for_its_own_jobs():
    config = default_config()
    config["datasets"] = {"fashion_mnist": {"dataset": "fashion_mnist"},
                          "digits": {"dataset": "mnist5k",
                                     "stages": {"teacher": {"optim": {"epochs": 9}},
                                                "finetune": {"data": {"train_subset": 300}}}}}
    models = {"dataset": "fashion_mnist", "teacher": "pretrain", "size": "cpu96"}
    teacher = {d: words(config, "teacher", **{**models, "dataset": d}) for d in config["datasets"]}
    assert "optim.epochs=9" in teacher["digits"] and "optim.epochs=2" in teacher["fashion_mnist"]
    assert not any(w.startswith("data.stages") for w in teacher["digits"])
    cell = {**models, "operator": "linear", "init": "random", "loss": "none", "seed": 0}
    digits = words(config, "cell", **{**cell, "dataset": "digits"})
    assert "data.train_subset=300" in digits and "optim.epochs=1" in digits
    own = config["stages"]["finetune"]["data"]["train_subset"]
    assert f"data.train_subset={own}" in words(config, "cell", **cell)


def test_export_jobs_are_exactly_the_chosen_cells_each_reading_its_cell():
    import pytest

    from linvit.errors import ConfigError

    config = {**default_config(), "export": {"operators": ["gla"],
                                             "strategies": ["copy_mlp+distill", "copy_all"],
                                             "seeds": [1]}}
    jobs = plan(config)
    exports = jobs.of("export")
    chosen = {(j.made.operator, j.made.init, j.made.seed) for j in exports}
    assert chosen == {("gla", "copy_mlp+distill", 1), ("gla", "copy_all", 1)}
    for job in exports:
        cell = jobs.find("cell", job.wildcards)
        assert job.overrides["source"] == cell.run_dir and job.inputs == [cell.output]
        assert job.folder.replace("/export/", "/cells/", 1) == cell.folder
    del config["export"]["seeds"]                       # default: every seed of the grid
    assert len(plan(config).of("export")) == 2 * len(config["seeds"])
    assert plan(default_config()).of("export") == []    # no section, no export job
    config["export"]["operators"] = ["gla", "mamba2"]   # not in this grid: said, not skipped
    with pytest.raises(ConfigError, match="export.operators: 'mamba2' names no cell"):
        plan(config)
