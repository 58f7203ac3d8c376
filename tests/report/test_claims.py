"""Claim verdicts from paired contrasts over seeds (the paper's claims as it states them, Holm's
step, the random-effects pooled row), time to a target accuracy, and the FLOP counts behind it,
on results built with known contrasts: every expected number is computed here, from formulas
written here, not read from linvit.report.claims."""
from __future__ import annotations

import math

import pandas as pd
import pytest
from scipy import stats

from linvit.models.spec import ModelSpec
from linvit.report.claims import CLAIMS, claims_frame, claims_markdown, verdicts
from linvit.report.collect import results_frame
from linvit.report.cost import time_to_target
from linvit.report.estimates import Estimate, estimate, holm, pooled
from linvit.report.grid import Grid
from markdown_rows import has_row

GRID = Grid(cells=[], main_loss="out", orders={}, tables=[])
BASE = {"random": 40.0, "copy_embed": 45.0, "copy_attn": 45.5, "copy_mlp": 60.0,
        "copy_all": 60.4, "distill": 50.0, "copy_mlp+distill": 64.0, "copy_embed+distill": 52.0}
SOFTMAX = 62.0
# The paper's contrasts, written out here: (formula, side, threshold at the default margins)
PAPER = {
    "attn_copy_barely_helps": (lambda m: m["copy_attn"] - m["copy_embed"], "below", 1.0),
    "attn_copy_barely_helps_with_mlps": (lambda m: m["copy_all"] - m["copy_mlp"], "below", 1.0),
    "mlp_carries_most": (lambda m: (m["copy_mlp"] - m["copy_embed"])
                         - (m["copy_all"] - m["copy_embed"]) / 2, "above", 0.0),
    "distill_recovers_beside_mlps": (lambda m: m["copy_mlp+distill"] - m["copy_mlp"], "above",
                                     0.0),
    "distill_recovers_without_mlps": (lambda m: m["copy_embed+distill"] - m["copy_embed"],
                                      "above", 0.0),
    "recipe_closes_gap": (lambda m: m["copy_mlp+distill"] - m["copy_all"], "above", -1.0),
    "recipe_matches_softmax": (lambda m: m["copy_mlp+distill"] - m["softmax"], "above", -1.0),
    "recipe_surpasses_softmax": (lambda m: m["copy_mlp+distill"] - m["softmax"], "above", 0.0),
    "distill_vs_random": (lambda m: m["distill"] - m["random"], "above", 0.0),
}
NOISE = {0: 0.3, 1: -0.2, 2: 0.5}           # per seed and strategy, scaled by the strategy's rank


def cell(operator, init, seed, top1, dataset="d"):
    key = {"dataset": dataset, "teacher": "t", "size": "s", "operator": operator, "init": init,
           "loss": "none", "seed": seed}
    return {"kind": "cell", "key": key, "run_dir": f"{dataset}/{operator}/{init}/{seed}",
            "status": "ok", "metrics": {"top1": top1}, "config": {}}


def values(offsets: dict, op: str, seed: int) -> dict[str, float]:
    """Every strategy's top-1 for one operator and seed: BASE, a different small noise per
    strategy, plus offsets[(op, init)][seed]."""
    out = {init: v + NOISE[seed] * (i % 3 - 1) * 0.5 + offsets.get((op, init), {}).get(seed, 0.0)
           for i, (init, v) in enumerate({**BASE, "softmax": SOFTMAX}.items())}
    return out


def grid(offsets: dict, seeds=(0, 1, 2), ops=("linear", "gla", "ttt"), dataset="d"):
    records = []
    for op in ops:
        for seed in seeds:
            for init, value in values(offsets, op, seed).items():
                if init != "softmax":
                    records.append(cell(op, init, seed, value, dataset))
    ref = values(offsets, "softmax", 0)
    records += [cell("softmax", "copy_all", s, values(offsets, "softmax", s)["softmax"], dataset)
                for s in seeds] if ref else []
    return results_frame(records)


def verdict_of(results, claim: str, operator: str, g: Grid = GRID):
    return next(v for v in verdicts(results, g)
                if v.claim.name == claim and v.where["operator"] == operator)


def test_every_claim_is_the_papers_contrast_on_the_control_that_isolates_it():
    offsets = {("gla", "copy_attn"): {0: 1.0, 1: 2.0, 2: 3.0}}
    results = grid(offsets)
    assert {c.name for c in CLAIMS} == set(PAPER)
    for claim in CLAIMS:
        formula, side, threshold = PAPER[claim.name]
        for op in ("linear", "gla", "ttt"):
            v = verdict_of(results, claim.name, op)
            expected = {s: formula(values(offsets, op, s) | {"softmax": values(offsets,
                                                                               "softmax", s)
                                                                        ["softmax"]})
                        for s in (0, 1, 2)}
            assert v.per_seed == pytest.approx(expected), (claim.name, op)
            assert (v.estimate.side, v.estimate.threshold) == (side, threshold), claim.name
            low, high = v.estimate.interval
            mean = sum(expected.values()) / 3
            half = stats.t.ppf(0.975, 2) * pd.Series(list(expected.values())).std() / 3 ** 0.5
            assert (low, high) == pytest.approx((mean - half, mean + half))


def one_sided(mean: float, spread: float):
    """copy_attn - copy_embed over 3 seeds: mean + spread * (-1, 0, 1)."""
    def plain(s):
        m = values({}, "linear", s)
        return m["copy_attn"] - m["copy_embed"]
    return grid({("linear", "copy_attn"): {s: mean + spread * (s - 1) - plain(s)
                                           for s in (0, 1, 2)}}, ops=("linear",))


@pytest.mark.parametrize("mean, spread, verdict, note", [
    (0.2, 0.05, "holds", ""),                 # under +1 throughout: barely helps
    (3.0, 0.05, "does not hold", ""),         # over +1 throughout: it helps
    (-3.0, 0.05, "holds", "hurts"),           # under 0: barely helps, and hurts
    (1.0, 2.0, "undecided", ""),              # spans +1
])
def test_copying_attention_barely_helps_is_one_sided_and_says_when_it_hurts(
        mean, spread, verdict, note):
    v = verdict_of(one_sided(mean, spread), "attn_copy_barely_helps", "linear")
    assert v.per_seed == pytest.approx({0: mean - spread, 1: mean, 2: mean + spread}, abs=1e-9)
    assert (v.verdict, v.note) == (verdict, note)


def test_the_margins_are_the_grid_s_and_one_point_by_default():
    results = one_sided(1.5, 0.05)
    assert verdict_of(results, "attn_copy_barely_helps", "linear").verdict == "does not hold"
    wider = Grid([], "out", {}, [], margins={"barely_helps": 2.0})
    assert verdict_of(results, "attn_copy_barely_helps", "linear", wider).verdict == "holds"
    frame = claims_frame(results, GRID)
    conditions = dict(zip(frame["claim"], frame["contrast"]))
    assert conditions["attn_copy_barely_helps"] == "copy_attn - copy_embed < +1"
    assert conditions["recipe_closes_gap"] == "copy_mlp+distill - copy_all > -1"
    assert conditions["recipe_matches_softmax"] == "copy_mlp+distill - softmax > -1"
    assert conditions["recipe_surpasses_softmax"] == "copy_mlp+distill - softmax > +0"


def test_the_mlps_carry_most_only_where_there_is_a_benefit_to_carry():
    # linear: copy_all - copy_embed = +15.4, copy_mlp - copy_embed = +15: 15 - 7.7 > 0 holds;
    # gla: copy_mlp gains 4 of copy_all's 15.4 (4 - 7.7 < 0); ttt: copying everything hurts
    # (copy_all 5 below copy_embed), so nothing is judged, whatever the formula says
    offsets = {("gla", "copy_mlp"): {s: -11.0 for s in (0, 1, 2)},
               ("ttt", "copy_all"): {s: -20.4 for s in (0, 1, 2)},
               ("ttt", "copy_mlp"): {s: -10.0 for s in (0, 1, 2)}}
    results = grid(offsets)
    holds, fails, gated = (verdict_of(results, "mlp_carries_most", op)
                           for op in ("linear", "gla", "ttt"))
    assert holds.verdict == "holds" and holds.estimate.mean == pytest.approx(15 - 15.4 / 2,
                                                                             abs=0.2)
    assert fails.verdict == "does not hold"
    assert gated.verdict == "no benefit to carry" and gated.holm == ""
    assert gated.estimate.mean > 0                      # the formula alone would have held
    pooled_row = next(v for v in verdicts(results, GRID)
                      if v.claim.name == "mlp_carries_most" and v.is_pooled)
    assert pooled_row.counts["no benefit to carry"] == 1 and pooled_row.across == "no"
    # every judged student holds, but one is not judged: not "across variants" either
    del offsets["gla", "copy_mlp"]
    pooled_row = next(v for v in verdicts(grid(offsets), GRID)
                      if v.claim.name == "mlp_carries_most" and v.is_pooled)
    assert (pooled_row.counts["holds"], pooled_row.across) == (2, "no")


def t_estimate(p: float, dof: int = 30) -> Estimate:
    """An estimate whose one-sided p of holding (side above, threshold 0) is exactly p."""
    return Estimate((0.0,) * (dof + 1), float(stats.t.isf(p, dof)), 1.0, dof, 0.0, "above")


def test_holm_steps_down_the_students_of_a_claim():
    # alpha 2.5% per side over 3 students: thresholds 0.0083, 0.0125, 0.025
    assert holm([t_estimate(p) for p in (0.001, 0.012, 0.02)]) == ["holds"] * 3  # Bonferroni: 1
    assert holm([t_estimate(p) for p in (0.02, 0.001, 0.024)]) == [
        "undecided", "holds", "undecided"]                                      # uncorrected: 3
    assert holm([t_estimate(0.02)]) == ["holds"]             # one student: its own verdict
    assert holm([t_estimate(0.99)]) == ["does not hold"]


def test_a_student_s_verdict_after_holm_is_its_own_where_it_is_alone():
    results = grid({}, ops=("linear",))
    for v in verdicts(results, GRID):
        if not v.is_pooled and v.verdict != "no benefit to carry":
            assert v.holm == v.verdict, v.claim.name


def test_the_pooled_row_carries_each_student_s_seed_variance_and_the_spread_between_them():
    # two students with equal means: the spread between them is 0, their seeds' is not
    same = [estimate([1.0, 2.0, 3.0], 0.0), estimate([3.0, 2.0, 1.0], 0.0)]
    e = pooled(same)
    assert e.mean == pytest.approx(2.0) and e.se == pytest.approx(math.sqrt(1 / (2 / (1 / 3))))
    # unequal means: DerSimonian-Laird's tau^2 and Hartung-Knapp's variance, written out
    students = [estimate([1.0, 1.5, 2.0], 0.0), estimate([4.0, 5.0, 6.0], 0.0),
                estimate([2.0, 2.2, 2.4], 0.0)]
    v = [s.se ** 2 for s in students]
    m = [s.mean for s in students]
    w = [1 / x for x in v]
    fixed = sum(a * b for a, b in zip(w, m)) / sum(w)
    q = sum(a * (b - fixed) ** 2 for a, b in zip(w, m))
    tau2 = max(0.0, (q - 2) / (sum(w) - sum(a * a for a in w) / sum(w)))
    ws = [1 / (x + tau2) for x in v]
    mean = sum(a * b for a, b in zip(ws, m)) / sum(ws)
    var = max(1.0, sum(a * (b - mean) ** 2 for a, b in zip(ws, m)) / 2) / sum(ws)
    e = pooled(students)
    assert (e.mean, e.se, e.dof) == (pytest.approx(mean), pytest.approx(math.sqrt(var)), 2)
    assert e.half_width == pytest.approx(stats.t.ppf(0.975, 2) * math.sqrt(var))


def test_pooled_rows_are_per_dataset_and_hold_across_variants_only_when_every_student_holds():
    offsets = {("gla", "distill"): {s: -20.0 for s in (0, 1, 2)}}
    results = pd.concat([grid({}, dataset="a"), grid(offsets, dataset="b")], ignore_index=True)
    rows = [v for v in verdicts(results, GRID)
            if v.claim.name == "distill_vs_random" and v.is_pooled]
    assert [(v.where["dataset"], v.across) for v in rows] == [("a", "holds"), ("b", "no")]
    assert rows[1].counts == {"holds": 2, "does not hold": 1, "undecided": 0,
                              "no benefit to carry": 0}


def test_a_claim_no_student_can_be_tested_on_says_so():
    results = grid({})
    results = results[results["operator"] != "softmax"]          # no softmax reference
    frame = claims_frame(results, GRID)
    row = frame[frame["claim"] == "recipe_matches_softmax"].iloc[0]
    assert row["verdict"] == "not tested" and "softmax" in row["to_decide"]
    assert has_row(claims_markdown(frame, GRID), "**not tested**")


def test_a_score_that_is_not_a_number_is_left_out_not_paired():
    results = grid({})
    results.loc[(results["operator"] == "linear") & (results["init"] == "distill")
                & (results["seed"] == 2), "top1"] = float("nan")
    assert set(verdict_of(results, "distill_vs_random", "linear").per_seed) == {0, 1}


def test_one_seed_is_undecided_however_large_the_contrast():
    v = verdict_of(grid({}, seeds=(0,)), "distill_vs_random", "linear")
    assert v.verdict == "undecided" and v.estimate.half_width is None
    assert "cannot decide" in v.estimate.seeds_needed


def test_a_spread_across_the_threshold_is_undecided_with_a_seed_estimate():
    e = estimate([1.0, -0.5, 2.0], 0.0)
    assert e.verdict == "undecided" and e.mean == pytest.approx(0.8333, abs=1e-4)
    k, sd = int(e.seeds_needed.split()[0]), pd.Series([1.0, -0.5, 2.0]).std()
    t = lambda dof: stats.t.ppf(0.975, dof)   # noqa: E731
    assert t(k - 1) * sd / math.sqrt(k) < e.mean <= t(k - 2) * sd / math.sqrt(k - 1)


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
