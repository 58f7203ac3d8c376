"""Config axes (linvit.workflow.axes): any stage field an axis of the grid by config alone; what
each multiplies, the values each job gets, the checks before anything runs, and one job per key."""
from __future__ import annotations

from collections import Counter

import pytest

from linvit.errors import ConfigError
from linvit.workflow import check, grid
from linvit.workflow.axes import NONE
from linvit.workflow.plan import Jobs, plan

from grid_configs import ROOT, default_config, loss_grid_config, teacher_axis_config

DISTILL = {"stage": "distill", "field": "optim.epochs", "values": [1, 3]}
FINETUNE = {"stage": "finetune", "field": "optim.lr", "values": {"low": 5.0e-4, "high": 2.0e-3}}


def with_axes(config: dict, **axes) -> dict:
    return {**config, "axes": axes}


def expected_counts(config: dict, d: int, f: int) -> dict[str, int]:
    """Jobs per kind, counted from the config as the axes' rules say: a distill axis multiplies
    the distillations and the cells that take one, a finetune axis every cell."""
    distilled = {"distill", "copy_mlp+distill", "copy_embed+distill"}
    seeds, ops = len(config["seeds"]), config["operators"]
    main = sum(d * f if s in distilled else f for s in config["strategies"]) * len(ops) * seeds
    reference = len(config["reference_strategies"]) * f * seeds
    sub = config.get("loss_grid") or {"operators": [], "strategies": [], "losses": []}
    sub_cells = (len(sub["operators"]) * len(sub["strategies"]) * len(sub["losses"]) * seeds
                 * d * f)
    dense = config["dense"]
    per_task = len(dense["seeds"]) * (1 + len(dense["operators"]) * sum(
        d * f if s in distilled else f for s in dense["strategies"]))
    cells = main + reference + sub_cells
    return {"teacher": 1, "distill": (len(ops) + len(sub["operators"]) * len(sub["losses"])) * d,
            "cell": cells, "robustness_cell": cells, "robustness_teacher": 1, "corrupt": 1,
            "maps": 1 + len(ops), "dense": len(dense["tasks"]) * per_task, "scenes": 1,
            "bench": 1}


def test_an_axis_multiplies_its_stage_and_what_takes_it():
    config = with_axes(loss_grid_config(), distill_epochs=DISTILL, ft_lr=FINETUNE)
    counts = Counter(j.kind.name for j in plan(config).jobs)
    assert counts == expected_counts(config, 2, 2)
    plain = Counter(j.kind.name for j in plan(loss_grid_config()).jobs)
    assert plain == expected_counts(loss_grid_config(), 1, 1)


def test_each_job_takes_its_values_and_reads_the_jobs_of_the_same_values():
    config = with_axes(default_config(), distill_epochs=DISTILL, ft_lr=FINETUNE)
    jobs = plan(config)
    cell = jobs.find("cell", dict(dataset="fashion_mnist", teacher="pretrain", size="cpu96",
                                  operator="gla", init="copy_mlp+distill", loss="out",
                                  distill_epochs="3", ft_lr="high", seed=1))
    assert cell.folder.endswith("/gla/copy_mlp+distill/out/distill_epochs=3/ft_lr=high/seed1")
    words = set(cell.words())
    finetune_epochs = config["stages"]["finetune"]["optim"]["epochs"]
    assert {"optim.lr=0.002", f"optim.epochs={finetune_epochs}"} <= words
    distill = jobs.find("distill", cell.wildcards)
    assert distill.key == dict(dataset="fashion_mnist", teacher="pretrain", size="cpu96",
                               operator="gla", loss="out", distill_epochs="3")
    assert "optim.epochs=3" in distill.words() and cell.inputs[1] == distill.output
    assert cell.overrides["distilled"] == distill.model
    assert cell.field == "stages.finetune / axes.ft_lr=high"
    # a strategy without distillation: none on the distill axis, once
    random = [j for j in jobs.of("cell") if j.key["init"] == "random"
              and j.key["operator"] == "gla" and j.key["seed"] == 1]
    assert [(j.key["distill_epochs"], j.key["ft_lr"]) for j in random] == [
        (NONE, "low"), (NONE, "high")]
    assert all("/random/none/distill_epochs=none/" in j.folder for j in random)
    # the teacher is reached by neither axis: its key and folder are as without axes
    teacher, = jobs.of("teacher")
    assert teacher.folder == "results/teachers/fashion_mnist/pretrain/cpu96"
    assert jobs.find("robustness_cell", cell.wildcards).key == cell.key


def test_a_teacher_axis_multiplies_the_teachers_trained_here_and_all_after(tmp_path):
    config = with_axes(teacher_axis_config(tmp_path),
                       t_epochs={"stage": "teacher", "field": "optim.epochs", "values": [1, 2]})
    jobs = plan(config)
    teachers = {(j.key["teacher"], j.key["size"], j.key["t_epochs"]): j
                for j in jobs.of("teacher")}
    assert sorted(teachers) == sorted(
        [(t, s, v) for t, s in (("pretrain", "cpu96"), ("wide", "cpu192"), ("wide", "cpu96"))
         for v in ("1", "2")] + [("deit", "cpu96", NONE)])
    assert len(jobs.of("import")) == 1                    # an import is not trained here
    assert "optim.epochs=2" in teachers["pretrain", "cpu96", "2"].words()
    selected = teachers["wide", "cpu96", "2"]            # cut out of the wide teacher of "2"
    assert selected.stage == "select" and selected.inputs == [
        teachers["wide", "cpu192", "2"].output]
    assert not any(w.startswith("optim.") for w in selected.words())
    cells = Counter((j.key["teacher"], j.key["t_epochs"]) for j in jobs.of("cell"))
    per_teacher = len(grid.expand_grid(teacher_axis_config(tmp_path))) // 3
    assert cells == {("pretrain", "1"): per_teacher, ("pretrain", "2"): per_teacher,
                     ("wide", "1"): per_teacher, ("wide", "2"): per_teacher,
                     ("deit", NONE): per_teacher}


def test_an_axis_of_several_fields_names_its_values():
    recipe = {"stage": "finetune", "values": {"short": {"optim.epochs": 1},
                                              "long": {"optim.epochs": 4, "optim.lr": 5e-4}}}
    jobs = plan(with_axes(default_config(), recipe=recipe))
    long = [j for j in jobs.of("cell") if j.key["recipe"] == "long"]
    assert long and all({"optim.epochs=4", "optim.lr=0.0005"} <= set(j.words()) for j in long)
    assert {j.key["recipe"] for j in jobs.of("cell")} == {"short", "long"}


@pytest.mark.parametrize("axis, message", [
    ({"seed": DISTILL}, "axes.seed: an axis name must be an identifier"),
    ({"lr": {**FINETUNE, "field": "init.strategy"}},
     "axes.lr: init.strategy is set by the grid in finetune jobs (strategies)"),
    ({"lr": {**FINETUNE, "field": "model"}}, "axes.lr: model is set by the grid"),
    ({"lr": {**FINETUNE, "field": "optim.lrr"}},
     "axes.lr (value low, finetune stage): optim.lrr: unknown field; allowed: opt, lr,"),
    ({"e": {**DISTILL, "values": [1, "five"]}},
     "axes.e (value five, distill stage): optim.epochs: expected int, got 'five'"),
    ({"e": {**DISTILL, "field": "optim.epochs.x"}},
     "axes.e (value 1, distill stage): optim.epochs: a int field, not a section of fields"),
    ({"e": {**DISTILL, "values": [1, 1]}}, "axes.e.values: two values with the label '1'"),
    ({"e": {**DISTILL, "values": ["none"]}}, "value label 'none' cannot name a folder"),
    ({"e": {**DISTILL, "values": [-1]}}, "value label '-1' cannot name a folder"),
    ({"e": {**DISTILL, "values": [[1, 2]]}}, "axes.e: value [1, 2] has no label of its own"),
    # what YAML makes of `values: {off: 0, kd2: 2}`
    ({"e": {**DISTILL, "values": {False: 0, "kd2": 2}}},
     "axes.e.values: the label False is a boolean (YAML reads an unquoted off"),
    ({"e": {"stage": "distill", "values": [1, 2]}},
     "axes.e: without `field`, values must map each label"),
    ({"lr": {**FINETUNE, "values": {"neg": -1.0}}},
     "stages.finetune / axes.lr=neg (job cells/fashion_mnist/pretrain/cpu96/linear/random/none"
     "/lr=neg/seed0): optim.lr: must be > 0, got -1.0"),
    ({"a": {"stage": "distill", "field": "distill.attn_init", "values": ["random", "copy"]}},
     "axes.a (value copy, distill stage): distill.attn_init: 'copy' is not one of: random,"),
])
def test_a_bad_axis_is_refused_before_anything_runs_naming_it(axis, message):
    with pytest.raises(ConfigError) as e:
        check.check_config(with_axes(default_config(), **axis), str(ROOT / "Snakefile"))
    assert message in str(e.value)


def test_two_jobs_with_one_key_are_refused_naming_both():
    jobs = Jobs(default_config(), "results", grid.grid_axes(default_config()))
    key = dict(dataset="fashion_mnist", teacher="pretrain", size="cpu96")
    jobs.add("import", key, "import-teacher", key, {}, "teachers.a", ("import-teacher",))
    with pytest.raises(ConfigError, match=r"two import jobs with one key, .*: teachers.a and "
                                          r"teachers.b both make results/imports/fashion_mnist"):
        jobs.add("import", key, "import-teacher", key, {}, "teachers.b", ("import-teacher",))


def test_the_grid_document_names_the_axes_and_their_tables():
    config = with_axes(loss_grid_config(), distill_epochs=DISTILL, ft_lr=FINETUNE,
                       one={"stage": "finetune", "field": "optim.warmup_epochs", "values": [0]})
    cells = grid.expand_grid(config)
    doc = grid.grid_document(config, cells)
    assert doc["axes"] == [{"name": "distill_epochs", "stage": "distill", "values": ["1", "3"]},
                           {"name": "ft_lr", "stage": "finetune", "values": ["low", "high"]},
                           {"name": "one", "stage": "finetune", "values": ["0"]}]
    assert doc["orders"]["ft_lr"] == ["low", "high"]
    # an axis of one value has no table of its own
    assert doc["tables"] == ["main", "claims", "time_to_target", "loss_design",
                             "distill_quality", "by_distill_epochs", "by_ft_lr"]


def test_replicated_distillations_give_each_seed_its_own():
    """replicate_distillations: the cells of seed s take the distillation made with seed s."""
    config = {**default_config(), "replicate_distillations": True}
    jobs = plan(config)
    distills = jobs.of("distill")
    assert len(distills) == len(config["operators"]) * len(config["seeds"])
    for job in distills:
        seed = job.key["seed"]
        assert job.folder.endswith(f"/out/seed{seed}") and f"run.seed={seed}" in job.words()
    for cell in jobs.of("cell"):
        if "distill" in cell.key["init"]:
            distill = jobs.find("distill", cell.wildcards)
            assert distill.key["seed"] == cell.key["seed"] and cell.inputs[1] == distill.output
    plain = plan(default_config()).of("distill")
    assert len(plain) == len(config["operators"]) and all(
        "seed" not in j.key and f"run.seed={config.get('teacher_seed', 0)}" in j.words()
        for j in plain)
