"""Fine-tuning settings chosen on a validation split (linvit.workflow.selection): the candidates'
jobs, the choice each strategy's cells read, the validation images held out of every training,
and the checks before anything runs."""
from __future__ import annotations

from collections import Counter

import pytest

from linvit.errors import ConfigError
from linvit.workflow import check, grid
from linvit.workflow.plan import plan

from grid_configs import ROOT, default_config

CANDIDATES = {"optim.lr": [5.0e-4, 1.0e-3], "optim.label_smoothing": [0.0, 0.1]}


def selected(**extra) -> dict:
    return {**default_config(), "dense": None,
            "selection": {"val_size": 500, "seed": 1, "candidates": CANDIDATES, **extra}}


def test_every_strategy_runs_every_candidate_on_one_seed_and_its_cells_read_the_choice():
    config = selected()
    jobs = plan(config)
    counts = Counter(j.kind.name for j in jobs.jobs)
    strategies, ops = len(config["strategies"]), len(config["operators"])
    choices = strategies + len(config["reference_strategies"])      # students, softmax reference
    assert counts["choose"] == choices
    assert counts["select_cell"] == 4 * (strategies * ops + len(config["reference_strategies"]))
    assert counts["cell"] == len(grid.expand_grid(config))
    for job in jobs.of("select_cell"):
        assert job.key["seed"] == 1 and job.folder.startswith("results/selection/cells/")
        words = set(job.words())
        assert {'data.evaluate_on="val"', "data.val_size=500", "data.test_subset=null"} <= words
    c0 = next(j for j in jobs.of("select_cell") if j.key["candidate"] == "c3")
    assert {"optim.lr=0.001", "optim.label_smoothing=0.1"} <= set(c0.words())
    for cell in jobs.of("cell"):
        family = "reference" if cell.key["operator"] == "softmax" else "students"
        choice = jobs.find("choose", {**cell.key, "family": family})
        assert cell.config_file == choice.output and choice.output in cell.inputs
        assert cell.command().startswith(f"finetune -c {choice.output} -o ")
        words = set(cell.words())
        assert "data.val_size=500" in words and not any(
            w.startswith(("optim.lr=", "optim.label_smoothing=")) for w in words)
        assert 'data.evaluate_on="val"' not in words          # the test split: final numbers
    random = jobs.find("choose", {"dataset": "fashion_mnist", "teacher": "pretrain",
                                  "size": "cpu96", "init": "random", "family": "students"})
    assert len(random.inputs) == 4 * ops                       # every candidate on each operator
    assert grid.grid_document(config, jobs.cells)["selection"]["candidates"][3] == [
        "c3", {"optim.lr": 1.0e-3, "optim.label_smoothing": 0.1}]


def test_candidates_run_on_the_named_operators_and_the_choice_serves_every_operator():
    config = selected(operators=[default_config()["operators"][-1]])
    jobs, full = plan(config), plan(selected())
    op = config["selection"]["operators"][0]
    assert {j.key["operator"] for j in jobs.of("select_cell")} == {op, "softmax"}
    assert {j.key["operator"] for j in full.of("select_cell")} == {*config["operators"],
                                                                    "softmax"}
    strategies = len(config["strategies"])
    assert len(jobs.of("select_cell")) == 4 * (strategies + len(config["reference_strategies"]))
    assert len(jobs.of("choose")) == len(full.of("choose"))
    for cell in jobs.of("cell"):                  # every operator's cells read a choice
        assert cell.config_file is not None and cell.config_file in cell.inputs
    with pytest.raises(ConfigError, match="selection.operators: 'softmax' is not one of"):
        check.check_config(selected(operators=["softmax"]), str(ROOT / "Snakefile"))


def test_without_selection_nothing_is_held_out_and_no_cell_reads_a_choice():
    jobs = plan(default_config())
    assert not jobs.of("select_cell", "choose")
    assert all(j.config_file is None and not any(w.startswith("data.val_size")
                                                 for w in j.words()) for j in jobs.of("cell"))


@pytest.mark.parametrize("change, message", [
    ({"candidates": {"init.strategy": ["random"]}}, "selection.candidates.init.strategy: set by "
                                                    "the grid"),
    ({"candidates": {"data.train_subset": [100]}}, "the data fields stay the same"),
    ({"candidates": {"optim.warmup_epochs": [0, 3]}},
     "selection.candidates (job selection/cells/fashion_mnist/pretrain/cpu96/linear/random/none"
     "/c1/seed1): optim.warmup_epochs: 3 leaves no epoch after warm-up"),
])
def test_a_bad_selection_is_refused_before_anything_runs(change, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check.check_config(selected(**change), str(ROOT / "Snakefile"))


def test_a_candidate_field_an_axis_also_varies_is_refused():
    config = {**selected(), "axes": {"lr": {"stage": "finetune", "field": "optim.lr",
                                            "values": [1.0e-3]}}}
    with pytest.raises(ConfigError, match="also varied by axes.lr"):
        check.check_config(config, str(ROOT / "Snakefile"))
