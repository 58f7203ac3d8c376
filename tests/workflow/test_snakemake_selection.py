"""Fine-tuning settings chosen on a validation split, run by Snakemake on a copy of the project:
the candidates run on the held-out images, the choice is written, each cell fine-tunes with its
strategy's choice (recorded in its resolved config) on the training images without the held-out
ones, and the report names what each strategy got."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml
from test_snakemake import copy_project, small_config, snakemake

pytestmark = pytest.mark.slow

SELECTION = {"val_size": 96, "seed": 0,
             "candidates": {"optim.lr": [5.0e-4, 2.0e-3]}}


def test_each_strategy_fine_tunes_with_the_setting_it_chose_on_validation(tmp_path, mnist_root):
    path = copy_project(tmp_path)
    config = small_config(str(path / "results"), mnist_root, selection=SELECTION)
    (path / "config" / "tiny.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    run = snakemake(path, "--cores", "2", "--configfile", "config/tiny.yaml")
    assert run.returncode == 0, run.stderr[-3000:]
    results = pd.read_csv(path / "results" / "results.csv")
    cells, runs = results[results["kind"] == "cell"], results[results["kind"] == "selection"]
    assert len(runs) == 2 * len(cells) and set(runs["candidate"]) == {"c0", "c1"}
    assert set(runs["config.data.evaluate_on"]) == {"val"}
    assert set(cells["config.data.evaluate_on"]) == {"test"}
    assert set(results["config.data.val_size"].dropna()) == {96}     # held out everywhere
    chosen = path / "results" / "selection" / "chosen" / "synthetic" / "pretrain" / "cpu96"
    for cell in cells.to_dict("records"):
        family = "reference" if cell["operator"] == "softmax" else "students"
        want = yaml.safe_load((chosen / cell["init"] / family / "chosen.yaml").read_text())
        assert cell["config.optim.lr"] == want["optim"]["lr"], cell["run_dir"]
        mine = runs[(runs["init"] == cell["init"]) & (runs["operator"] == cell["operator"])]
        best = mine.sort_values(["top1", "candidate"], ascending=[False, True]).iloc[0]
        assert want["optim"]["lr"] == best["config.optim.lr"]        # one operator per choice
    table = (path / "results" / "tables" / "selection.md").read_text()
    assert "c0 (optim.lr=0.0005)" in table and "chosen" in table
    assert "## Fine-tuning settings chosen on validation" in (
        path / "results" / "report.md").read_text()
    grid = json.loads((path / "results" / "grid.json").read_text())
    assert grid["selection"]["candidates"] == [["c0", {"optim.lr": 0.0005}],
                                               ["c1", {"optim.lr": 0.002}]]
