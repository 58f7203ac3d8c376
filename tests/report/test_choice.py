"""The choice of fine-tuning settings on the validation split (linvit.report.selection): the
complete candidate with the best mean validation top-1, the first on a tie, never one that did
not finish; the YAML the cells read; the report's table."""
from __future__ import annotations

import pandas as pd
import pytest
import yaml

from linvit.errors import ResultsError
from linvit.report.grid import Grid
from linvit.report.selection import choose, selection_table

CANDIDATES = [["c0", {"optim.lr": 0.0005}], ["c1", {"optim.lr": 0.001}],
              ["c2", {"optim.lr": 0.002}]]
GRID = Grid([], "out", {}, [], selection={"candidates": CANDIDATES})


def record(candidate, operator, top1, status="ok"):
    key = {"dataset": "d", "teacher": "t", "size": "s", "operator": operator, "init": "random",
           "loss": "none", "candidate": candidate, "seed": 0}
    return {"kind": "selection", "key": key, "status": status, "run_dir": f"{candidate}/{operator}",
            "metrics": {"top1": top1, "train_time_s": 10.0, "train_images": 100,
                        "train_flops_per_image": 1e7} if status == "ok" else {}}


def test_the_best_mean_over_operators_is_chosen_and_written(tmp_path):
    # c1: (60 + 50) / 2 = 55 beats c0's 52.5 and c2's 54, though c2 wins on linear alone
    records = [record("c0", "linear", 55.0), record("c0", "gla", 50.0),
               record("c1", "linear", 60.0), record("c1", "gla", 50.0),
               record("c2", "linear", 62.0), record("c2", "gla", 46.0)]
    assert choose(records, GRID, tmp_path / "chosen.yaml") == "c1"
    assert yaml.safe_load((tmp_path / "chosen.yaml").read_text()) == {"optim": {"lr": 0.001}}


def test_a_tie_goes_to_the_first_candidate_and_an_unfinished_one_is_never_chosen(tmp_path):
    tie = [record("c0", "linear", 50.0), record("c1", "linear", 50.0)]
    assert choose(tie, GRID, tmp_path / "a.yaml") == "c0"
    half = [record("c0", "linear", 40.0), record("c2", "linear", 90.0),
            record("c2", "gla", 0.0, status="failed")]
    assert choose(half, GRID, tmp_path / "b.yaml") == "c0"      # c2 did not finish on gla
    with pytest.raises(ResultsError, match="no candidate setting finished .* c0/linear"):
        choose([record("c0", "linear", 0.0, status="failed")], GRID, tmp_path / "c.yaml")
    assert not (tmp_path / "c.yaml").exists()


def test_the_table_shows_every_candidate_the_choice_and_the_cost():
    records = [record("c0", "linear", 55.0), record("c1", "linear", 60.0),
               record("c2", "linear", 0.0, status="failed")]
    results = pd.DataFrame([{**r["key"], "kind": "selection", "status": r["status"],
                             "top1": r["metrics"].get("top1"),
                             "train_time_s": r["metrics"].get("train_time_s", 0.0),
                             "train_flops": 1e9 if r["status"] == "ok" else None}
                            for r in records])
    table = selection_table(results, GRID)
    row = table.iloc[0].to_dict()
    assert table.index[0] == ("d", "t", "s", "random", "students")
    assert row == {"c0 (optim.lr=0.0005)": "55.00", "c1 (optim.lr=0.001)": "60.00",
                   "c2 (optim.lr=0.002)": "failed", "chosen": "c1", "training GFLOPs": "2",
                   "seconds": "20"}
