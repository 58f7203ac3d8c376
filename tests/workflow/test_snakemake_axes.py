"""A grid with two config axes (one on distill, one on finetune), run end to end by Snakemake on a
copy of the project: the dry run's job counts against the test's own count from the config,
both axes in results.csv and in every table and figure's group, and an edit rerunning exactly
the jobs it touches, at every value of the axes."""
from __future__ import annotations

import re

import pandas as pd
import pytest
import yaml
from test_snakemake import (
    TINY,
    copy_project,
    edit_and_plan,
    short,
    small_config,
    snakemake,
)

pytestmark = pytest.mark.slow

AXES = {"d_epochs": {"stage": "distill", "field": "optim.epochs", "values": [1, 2]},
        "ft_lr": {"stage": "finetune", "field": "optim.lr",
                  "values": {"low": 5.0e-4, "high": 2.0e-3}}}
D, F = ["1", "2"], ["low", "high"]
CELL = "cells/synthetic/pretrain/cpu96"


def expected_jobs(config: dict) -> dict[str, int]:
    """Jobs per rule, counted from the config: a distill axis multiplies the distillations and
    the cells that take one, a finetune axis every cell (and what scores it)."""
    d, f = len(AXES["d_epochs"]["values"]), len(AXES["ft_lr"]["values"])
    sub = config["loss_grid"]
    distilled = [s for s in config["strategies"] if "distill" in s]
    plain = [s for s in config["strategies"] if s not in distilled]
    main = (len(plain) * f + len(distilled) * d * f) * len(config["operators"])
    cells = main + len(config["reference_strategies"]) * f + (
        len(sub["operators"]) * len(sub["strategies"]) * len(sub["losses"]) * d * f)
    cells *= len(config["seeds"])
    report = {rule: 1 for rule in ("grid_document", "collect", "tables", "figures",
                                   "attention_figure", "report", "robustness_report", "all")}
    return {"teacher": 1, "distill": (len(config["operators"]) + len(sub["losses"])) * d,
            "finetune": cells, "attention_maps": 1 + len(config["operators"]), "corrupt": 1,
            "robustness_teacher": 1, "robustness_cell": cells, **report}


def job_counts(dry_run: str) -> dict[str, int]:
    table = dry_run.split("Job stats:")[1].split("Reasons:")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)
            if m.group(1) != "total"}


@pytest.fixture(scope="module")
def axes_project(tmp_path_factory, mnist_root):
    path = copy_project(tmp_path_factory.mktemp("axes project"))
    config = small_config(str(path / "results"), mnist_root, axes=AXES,
                          loss_grid={"operators": ["linear"], "strategies": ["copy_mlp+distill"],
                                     "losses": ["map"]}, robustness=TINY["robustness"])
    (path / "config" / "tiny.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    dry = snakemake(path, "-n", "--cores", "2", "--configfile", "config/tiny.yaml")
    assert dry.returncode == 0, dry.stderr[-3000:]
    run = snakemake(path, "--cores", "2", "--configfile", "config/tiny.yaml")
    assert run.returncode == 0, run.stderr[-3000:]
    return path, config, job_counts(dry.stdout)


def test_the_dry_run_plans_the_jobs_the_config_asks_for(axes_project):
    _, config, counts = axes_project
    assert counts == expected_jobs(config)


def test_results_and_every_table_carry_both_axes(axes_project):
    path, _, _ = axes_project
    results = pd.read_csv(path / "results" / "results.csv", dtype={"d_epochs": str})
    assert not results["status"].isin(["failed", "missing"]).any()
    cells = results[results["kind"] == "cell"]
    recipe = cells[cells["init"] == "copy_mlp+distill"]
    assert set(zip(recipe["d_epochs"], recipe["ft_lr"])) == {(d, f) for d in D for f in F}
    assert set(cells[cells["init"] == "random"]["d_epochs"]) == {"none"}
    # each distillation ran for its own value's epochs, each cell at its own learning rate
    assert set(zip(recipe["d_epochs"], recipe["config.optim.lr"])) == {
        (d, lr) for d in D for lr in (5.0e-4, 2.0e-3)}
    distills = results[results["kind"] == "distill"]
    assert sorted(zip(distills["d_epochs"], distills["config.optim.epochs"])) == [
        ("1", 1), ("1", 1), ("2", 2), ("2", 2)]                  # the out and map designs
    tables = path / "results" / "tables"
    names = ["main", "claims", "time_to_target", "loss_design", "robustness"]
    for name in names:
        header = (tables / f"{name}.csv").read_text().splitlines()[0].split(",")
        assert {"d_epochs", "ft_lr"} <= set(header), (name, header)
    for axis, other, values in (("d_epochs", "ft_lr", D), ("ft_lr", "d_epochs", F)):
        header = (tables / f"by_{axis}.csv").read_text().splitlines()[0].split(",")
        assert other in header and header[-len(values):] == values, header
    report = (path / "results" / "report.md").read_text()
    assert "## By d_epochs" in report and "## By ft_lr" in report
    for figure in ("accuracy_by_init", "time_to_accuracy", "distill_layers", "claims",
                   "attention_maps", "robustness"):
        assert (path / "results" / "figures" / f"{figure}.png").stat().st_size > 0


def test_an_edit_reruns_exactly_its_jobs_at_every_value(axes_project):
    path, _, _ = axes_project
    jobs = short(path, edit_and_plan(path, "transfer/losses/attn_map_ce.py"))
    cells = {f"{CELL}/linear/copy_mlp+distill/map/d_epochs={d}/ft_lr={f}/seed0"
             for d in D for f in F}
    assert jobs == {
        "distill": {f"distill/synthetic/pretrain/cpu96/linear/map/d_epochs={d}" for d in D},
        "finetune": cells, "robustness_cell": {f"robustness/{c}" for c in cells},
        "robustness_report": {"tables/robustness.csv"}, "collect": {"results.csv"},
        "tables": {"tables/main.csv"}, "figures": {"figures/accuracy_by_init.png"},
        "report": {"report.md"}}
    again = snakemake(path, "-n", "--cores", "2", "--configfile", "config/tiny.yaml")
    assert "Nothing to be done" in again.stdout + again.stderr
