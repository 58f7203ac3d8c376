"""Claim verdicts from paired contrasts over seeds, time to a target accuracy, and the FLOP counts
behind it, on results built with known contrasts."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from linvit.models.spec import ModelSpec
from linvit.render.tables import t95
from linvit.report.claims import CLAIMS, claims_frame, claims_markdown, estimate, verdicts
from linvit.report.collect import results_frame
from linvit.report.cost import time_to_target
from linvit.report.grid import Grid

GRID = Grid(cells=[], main_loss="out", orders={}, tables=[])
BASE = {"random": 40.0, "copy_embed": 45.0, "copy_attn": 46.0, "copy_mlp": 60.0,
        "copy_all": 70.0, "distill": 50.0, "copy_mlp+distill": 72.0}


def cell(operator, init, seed, top1, dataset="d"):
    key = {"dataset": dataset, "teacher": "t", "size": "s", "operator": operator, "init": init,
           "loss": "none", "seed": seed}
    return {"kind": "cell", "key": key, "run_dir": "x", "status": "ok",
            "metrics": {"top1": top1}, "config": {}}


def grid(offsets: dict, seeds, softmax: float = 71.0) -> pd.DataFrame:
    """Every strategy's BASE value for each operator and seed, plus offsets[(op, init)][seed]."""
    records = []
    for op in ("linear", "gla", "ttt"):
        for seed in seeds:
            for init, value in BASE.items():
                records.append(cell(op, init, seed,
                                    value + offsets.get((op, init), {}).get(seed, 0.0)))
    records += [cell("softmax", "copy_all", s, softmax) for s in seeds]
    return results_frame(records)


def verdict_of(results, claim: str, operator: str):
    return next(v for v in verdicts(results, GRID)
                if v.claim.name == claim and v.where["operator"] == operator)


def test_one_seed_is_undecided_however_large_the_contrast():
    v = verdict_of(grid({}, [0]), "distill_beats_random", "linear")
    assert v.estimate.verdict == "undecided" and v.estimate.mean == 10.0
    assert v.estimate.half_width is None and "cannot decide" in v.estimate.seeds_needed


def test_three_seeds_well_on_each_side_hold_and_do_not_hold():
    # distill - random: +10 +- 0.5 on linear; on gla distill falls 20 below: -10 +- 0.5
    noise = {0: 0.5, 1: -0.5, 2: 0.0}
    offsets = {("linear", "distill"): noise,
               ("gla", "distill"): {s: v - 20.0 for s, v in noise.items()}}
    results = grid(offsets, [0, 1, 2])
    holds = verdict_of(results, "distill_beats_random", "linear").estimate
    fails = verdict_of(results, "distill_beats_random", "gla").estimate
    assert holds.verdict == "holds" and holds.mean == pytest.approx(10.0)
    assert holds.half_width == pytest.approx(t95(2) * 0.5 / math.sqrt(3))
    assert fails.verdict == "does not hold" and fails.mean == pytest.approx(-10.0)
    assert holds.seeds_needed == fails.seeds_needed == ""


def test_a_spread_across_the_threshold_is_undecided_with_a_seed_estimate():
    # distill - random: +1, -0.5, +2 -> mean 0.83, spread 1.26: spans 0
    offsets = {("linear", "distill"): {0: -9.0, 1: -10.5, 2: -8.0}}
    e = verdict_of(grid(offsets, [0, 1, 2]), "distill_beats_random", "linear").estimate
    assert e.verdict == "undecided" and e.mean == pytest.approx(0.8333, abs=1e-4)
    k = int(e.seeds_needed.split()[0])
    sd = pd.Series([1.0, -0.5, 2.0]).std()
    assert t95(k - 1) * sd / math.sqrt(k) < e.mean <= t95(k - 2) * sd / math.sqrt(k - 1)


def test_a_match_holds_within_the_margin_and_not_beyond_it():
    # copy_mlp+distill - softmax: BASE 72 - 71 = +1; -0.5 +- 0.1 holds a match, -2 +- 0.1 not
    near = {0: -1.5, 1: -1.4, 2: -1.6}
    far = {s: v - 1.5 for s, v in near.items()}
    results = grid({("linear", "copy_mlp+distill"): near, ("gla", "copy_mlp+distill"): far},
                   [0, 1, 2])
    assert verdict_of(results, "recipe_matches_softmax", "linear").estimate.verdict == "holds"
    assert verdict_of(results, "recipe_matches_softmax", "gla").estimate.verdict == \
        "does not hold"


def test_a_claim_no_student_can_be_tested_on_says_so():
    results = grid({}, [0, 1])
    results = results[results["operator"] != "softmax"]          # no softmax reference
    frame = claims_frame(results, GRID)
    row = frame[frame["claim"] == "recipe_matches_softmax"].iloc[0]
    assert row["verdict"] == "not tested" and "softmax" in row["to_decide"]
    assert "| **not tested** |" in claims_markdown(frame, GRID)


def test_a_score_that_is_not_a_number_is_left_out_not_paired():
    results = grid({}, [0, 1, 2])
    results.loc[(results["operator"] == "linear") & (results["init"] == "distill")
                & (results["seed"] == 2), "top1"] = float("nan")
    assert verdict_of(results, "distill_beats_random", "linear").per_seed == {0: 10.0, 1: 10.0}


def test_pooled_row_counts_the_students_and_averages_their_means():
    noise = {0: 0.5, 1: -0.5, 2: 0.0}
    offsets = {("gla", "distill"): {s: v - 20.0 for s, v in noise.items()},   # -10: not hold
               ("ttt", "distill"): {0: -12.0, 1: 0.0, 2: 3.0}}                 # -13..+13: spans
    frame = claims_frame(grid(offsets, [0, 1, 2]), GRID)
    rows = frame[frame["claim"] == "distill_beats_random"]
    pooled = rows[rows["operator"].str.startswith("pooled")].iloc[0]
    assert pooled["operator"] == "pooled (3 students)" and pooled["n"] == 3
    assert (pooled["holds"], pooled["does_not_hold"], pooled["undecided"]) == (1, 1, 1)
    means = rows[~rows["operator"].str.startswith("pooled")]["mean"]
    assert pooled["mean"] == pytest.approx(means.mean(), abs=1e-3)
    assert pooled["verdict"] == "undecided"            # +10, -10, -3: the students disagree
    assert "students: 1 hold, 1 do not, 1 undecided" in claims_markdown(frame, GRID)


def test_every_claim_is_decided_on_a_grid_that_has_its_strategies():
    frame = claims_frame(grid({}, [0, 1]), GRID)
    assert set(frame["claim"]) == {c.name for c in CLAIMS}
    # a contrast with no spread at all is decided by 2 seeds
    assert set(frame["verdict"]) <= {"holds", "does not hold"}


def test_estimate_needs_a_clear_side():
    assert estimate([1.0, 1.0, 1.0], 1.0).verdict == "undecided"
    assert "threshold" in estimate([1.0, 1.0, 1.0], 1.0).seeds_needed


def curve_rows(init, seed, points, offset=0.0):
    return [{"kind": "cell", "dataset": "d", "teacher": "t", "size": "s", "operator": "linear",
             "init": init, "loss": "none", "seed": seed, "epoch": e, "images": 100 * e,
             "flops": offset + 1e9 * e, "compute_s": 2.0 * e, "test_top1": acc}
            for e, acc in enumerate(points)]


def test_time_to_target_takes_the_first_evaluation_at_the_target():
    results = results_frame([{"kind": "teacher", "key": {"dataset": "d", "teacher": "t",
                                                         "size": "s"}, "run_dir": "x",
                              "status": "ok", "metrics": {"top1": 80.0}, "config": {}}])
    # target 76: random gets there at epoch 4 and 3; copy_mlp at 1 and 2; copy_attn never
    curves = pd.DataFrame(
        curve_rows("random", 0, [10, 50, 70, 75, 77]) + curve_rows("random", 1, [10, 60, 72, 76])
        + curve_rows("copy_mlp", 0, [60, 76.5, 78], 5e8) + curve_rows("copy_mlp", 1,
                                                                       [60, 70, 79], 5e8)
        + curve_rows("copy_attn", 0, [10, 40, 60]) + curve_rows("copy_attn", 1, [10, 45, 61]))
    table = time_to_target(results, curves,
                           Grid([], "out", {"init": ["random", "copy_attn", "copy_mlp"]}, []))
    rows = {idx[-1]: row for idx, row in zip(table.index, table.to_dict("records"))}
    assert list(rows) == ["random", "copy_attn", "copy_mlp"]
    assert rows["random"]["reached"] == "2/2 seeds" and rows["random"]["FLOPs"] == "3.5e+09"
    assert rows["copy_mlp"]["FLOPs"] == "2e+09"                 # 0.5e9 + (1e9, 2e9) mean
    assert rows["copy_mlp"]["FLOPs vs random"] == f"{2.0 / 3.5:.2f}"
    assert rows["copy_attn"]["reached"] == "0/2 seeds"
    assert rows["copy_attn"]["images"] == "not reached within the budget"
    assert rows["random"]["last gain"] == "+3.00 (epochs 2-3, 3-4)"     # mean of +2 and +4
    assert rows["copy_attn"]["last gain"] == "+18.00 (epochs 1-2)"


def test_flops_count_the_products_of_the_vit():
    from linvit.models import flops

    spec = ModelSpec("cpu96", "softmax", num_classes=10, img_size=28, in_chans=1)
    n, c = 50, 96                         # 7 x 7 patches + cls, width 96, 3 heads of 32, depth 6
    block = 2 * n * c * 3 * c + 3 * 4 * n * n * 32 + 2 * n * c * c + 2 * 2 * n * c * 4 * c
    expected = 2 * 49 * 16 * c + 6 * block + 2 * c * 10
    assert flops.forward_flops(spec) == expected
    assert flops.train_flops_per_image(spec) == 3 * expected
    linear = spec.with_operator("linear")
    assert flops.forward_flops(linear) < flops.forward_flops(spec)   # its core is O(N)
    # ttt's conv branch adds its own projections: q2, k2, v2 of the 49 patches and P, per block
    ttt = spec.with_operator("ttt")
    core = 3 * 12 * n * 32 ** 2
    assert flops.forward_flops(ttt) - flops.forward_flops(spec) == 6 * (
        core - 3 * 4 * n * n * 32 + 2 * 49 * c * 32 * 3 + 2 * n * 32 * c)


def test_a_random_init_already_at_the_target_is_not_a_ratio_of_zero():
    results = results_frame([{"kind": "teacher", "key": {"dataset": "d", "teacher": "t",
                                                         "size": "s"}, "run_dir": "x",
                              "status": "ok", "metrics": {"top1": 20.0}, "config": {}}])
    curves = pd.DataFrame(curve_rows("random", 0, [20, 30]) + curve_rows("copy_mlp", 0, [10, 25]))
    table = time_to_target(results, curves, Grid([], "out", {"init": ["random", "copy_mlp"]}, []))
    assert table.loc[("d", "t", "s", "linear", "copy_mlp"), "FLOPs vs random"] == \
        "random: at the target untrained"
