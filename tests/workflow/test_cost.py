"""`linvit plan`: every job's FLOPs from its stage's config, device-hours at a stated throughput,
and tables whose rows add up to the total."""
from __future__ import annotations

import pytest
import yaml

import markdown_rows
from linvit import cli
from linvit.models import ModelSpec
from linvit.models.flops import forward_flops, train_flops_per_image
from linvit.workflow import cost

from grid_configs import ROOT, default_config


def costs_of(config: dict) -> list[cost.Cost]:
    return cost.grid_costs(config, str(ROOT / "Snakefile"))


def test_the_default_grid_s_cells_cost_what_their_config_says():
    """Recomputed from config.yaml's own numbers: each cell trains train_subset images for
    `epochs` at 3 forwards an image, and scores test_subset images after each epoch."""
    config = default_config()
    stage = config["stages"]["finetune"]
    costs = [c for c in costs_of(config) if c.job.stage == "finetune"]
    cells = ((len(config["strategies"]) * len(config["operators"])
              + len(config["reference_strategies"])) * len(config["seeds"]))
    assert len(costs) == len([c for c in costs if c.job.kind.name == "cell"]) == cells == 45
    for c in costs:
        spec = ModelSpec("cpu96", c.job.key["operator"], 10, 28, 1)
        epochs = stage["optim"]["epochs"]
        assert c.train_flops == pytest.approx(
            train_flops_per_image(spec) * stage["data"]["train_subset"] * epochs)
        assert c.eval_flops == pytest.approx(
            forward_flops(spec) * stage["data"]["test_subset"] * (epochs + 1))
        assert c.peak_bytes > 16 * 600_000                     # at least AdamW's state of cpu96


def test_a_distillation_adds_the_teacher_s_forward_and_a_linear_probe_trains_no_backbone():
    config = default_config()
    distill = next(c for c in costs_of(config) if c.job.stage == "distill")
    stage = config["stages"]["distill"]
    student = ModelSpec("cpu96", distill.job.key["operator"], 10, 28, 1)
    teacher = ModelSpec("cpu96", "softmax", 10, 28, 1)
    assert distill.train_flops == pytest.approx(
        (train_flops_per_image(student) + forward_flops(teacher))
        * stage["data"]["train_subset"] * stage["optim"]["epochs"])


def test_every_stage_the_paper_grid_runs_is_costed_or_listed_as_not_costed(monkeypatch):
    """The paper grid runs every kind of job: each stage is costed or not costed by name, and a
    stage without a cost model stops the plan instead of dropping out of its total."""
    from linvit.workflow.plan import plan

    config = cost.load_grid(str(ROOT / "config" / "paper.yaml"))
    stages = {job.stage for job in plan(config).jobs}
    costed = {c.job.stage for c in costs_of(config)}
    assert costed == {s for s in stages if not cost.not_costed(s)} and len(costed) >= 5
    assert {"segment", "detect", "import-teacher"} <= stages - costed
    real = cost.job_cost
    monkeypatch.setattr(cost, "job_cost", lambda config, job, cfg: None
                        if job.stage == "attention-maps" else real(config, job, cfg))
    with pytest.raises(ValueError, match="stage 'attention-maps' .* has no cost model"):
        costs_of(config)


@pytest.mark.parametrize("name", ["config", "paper"])
def test_the_tables_add_up_to_the_total(name, capsys):
    path = ROOT / "config" / f"{name}.yaml"
    config = cost.load_grid(str(path))
    costs = costs_of(config)
    total = sum(c.flops for c in costs)
    assert total > 0
    for axis in cost.AXES:
        values = {cost.axis_value(c.job, axis) for c in costs}
        assert sum(sum(c.flops for c in costs if cost.axis_value(c.job, axis) == v)
                   for v in values) == pytest.approx(total)
    assert cli.main(["plan", "--configfile", str(path), "--tflops", "50"]) == 0
    out = capsys.readouterr().out
    hours = total / 50e12 / 3600
    assert f"**{hours:.4g}**" in out and "Assumed: 50 effective TFLOP/s" in out


def test_a_split_it_cannot_count_is_named_and_a_bad_grid_is_refused(tmp_path, capsys):
    config = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
    del config["plan"]
    (tmp_path / "grid.yaml").write_text(yaml.safe_dump(config))
    assert cli.main(["plan", "--configfile", str(tmp_path / "grid.yaml")]) == 2
    assert "plan.images.imagenet.train: the train split's size is not known" in \
        capsys.readouterr().err
    config = {**default_config(), "operators": ["lineer"]}
    (tmp_path / "grid.yaml").write_text(yaml.safe_dump(config))
    assert cli.main(["plan", "--configfile", str(tmp_path / "grid.yaml")]) == 2
    assert "operators: ['lineer'] not in" in capsys.readouterr().err


def test_the_workflow_s_plan_line_gives_the_total_and_is_kept_per_config(tmp_path, monkeypatch):
    config = default_config()
    costs = costs_of(config)
    args = ("my grid.yaml", str(ROOT / "Snakefile"), tmp_path)
    line = cost.plan_line(config, *args)
    hours = sum(c.flops for c in costs) / 100e12 / 3600
    assert line.startswith(f"linvit plan: {len(costs)} costed jobs, ")
    assert f"{hours:.4g} device-hours at 100 effective TFLOP/s" in line
    assert "`linvit plan --configfile 'my grid.yaml'`" in line
    monkeypatch.setattr(cost, "grid_costs", lambda *a: pytest.fail("recomputed"))
    assert cost.plan_line(config, *args) == line                         # from the memo
    config["plan"] = {"tflops": 25.0}
    with pytest.raises(pytest.fail.Exception, match="recomputed"):           # another config
        cost.plan_line(config, *args)


def test_a_config_axis_is_costed_per_value_like_a_built_in_one():
    """A distillation of 3 epochs costs 3 times one of 1; the plan's table per value of the axis
    says so, and its rows add up to the total."""
    config = {**default_config(), "loss_grid": None, "dense": None, "robustness": None,
              "bench": None,
              "axes": {"d_epochs": {"stage": "distill", "field": "optim.epochs",
                                    "values": [1, 3]}}}
    costs = costs_of(config)
    distill = {c.job.key["d_epochs"]: c for c in costs
               if c.job.stage == "distill" and c.job.key["operator"] == "linear"}
    assert distill["3"].train_flops == pytest.approx(3 * distill["1"].train_flops)
    text = cost.tables(costs, 100.0, ["d_epochs"])
    section = text[text.index("d_epochs |") - 2:]
    table = section.split("\n\n")[0]
    rows = {row[0]: float(row[1]) for row in markdown_rows.rows(table)[1:]}
    assert set(rows) == {"1", "3", "none"}                # none: the jobs it does not reach
    total = sum(c.flops for c in costs) / 100e12 / 3600
    assert sum(rows.values()) == pytest.approx(total, rel=1e-3)
