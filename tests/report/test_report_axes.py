"""The report on a grid with config axes: each axis a column of results.csv, a grouping of every
table and figure and a by_<axis> table; claims within each combination of the axes' values; a
row an axis does not reach standing in each of its values; two records with one key refused."""
from __future__ import annotations

import pandas as pd
import pytest

import linvit.report.figures as figures
from linvit.errors import ResultsError
from linvit.report.claims import claims_frame, verdicts
from linvit.report.collect import curves_frame, results_frame
from linvit.report.dense import dense_table
from linvit.report.grid import Grid
from linvit.report.robustness import robustness_frame, robustness_table
from linvit.report.tables import axis_table, main_table

D, F = ["5", "20"], ["low", "high"]
AXES = [{"name": "d_epochs", "stage": "distill", "values": D},
        {"name": "ft_lr", "stage": "finetune", "values": F}]
SEEDS = (0, 1, 2)
MODEL = {"dataset": "fm", "teacher": "t", "size": "s"}
ORDERS = {"init": ["random", "copy_mlp", "copy_all", "copy_mlp+distill"],
          "operator": ["linear", "softmax"], "d_epochs": D, "ft_lr": F}


def top1(init: str, d: str, f: str, seed: int) -> float:
    """A value per cell: each strategy its base, the recipe better with the longer distillation,
    every cell better at the high learning rate, and a seed's own offset."""
    base = {"random": 40.0, "copy_mlp": 60.0, "copy_all": 70.0, "copy_mlp+distill": 66.0,
            "softmax": 71.0}[init]
    longer = 6.0 if (init == "copy_mlp+distill" and d == "20") else 0.0
    return base + longer + (3.0 if f == "high" else 0.0) + 0.25 * seed * (init == "random")


def key(op, init, d, f, seed):
    loss = "out" if init == "copy_mlp+distill" else "none"
    return {**MODEL, "operator": op, "init": init, "loss": loss, "d_epochs": d, "ft_lr": f,
            "seed": seed}


def record(kind, k, value, run_dir=None):
    return {"kind": kind, "key": k, "status": "ok", "metrics": {"top1": value},
            "run_dir": run_dir or "/".join(map(str, k.values())), "config": {}}


def records() -> list[dict]:
    out = [record("teacher", {**MODEL, "stage": "pretrain"}, 80.0)]
    for f in F:
        for seed in SEEDS:
            for init in ("random", "copy_mlp", "copy_all"):
                out.append(record("cell", key("linear", init, "none", f, seed),
                                  top1(init, "none", f, seed)))
            out.append(record("cell", key("softmax", "copy_all", "none", f, seed),
                              top1("softmax", "none", f, seed)))
            for d in D:
                out.append(record("cell", key("linear", "copy_mlp+distill", d, f, seed),
                                  top1("copy_mlp+distill", d, f, seed)))
    return out


GRID = Grid(cells=[], main_loss="out", orders=ORDERS, tables=[], axes=AXES)


def results() -> pd.DataFrame:
    return results_frame(records(), GRID)


def test_each_axis_is_a_column_and_a_row_it_does_not_reach_stands_in_each_value():
    frame = results()
    assert {"d_epochs", "ft_lr"} <= set(frame.columns)
    assert list(frame.columns[:len(GRID.key)]) == GRID.key
    random = frame[(frame["init"] == "random") & (frame["seed"] == 0)]
    assert sorted(zip(random["d_epochs"], random["ft_lr"])) == [("none", "high"),
                                                                 ("none", "low")]
    done = GRID.complete(random)
    assert sorted(zip(done["d_epochs"], done["ft_lr"])) == [
        (d, f) for d in sorted(D) for f in sorted(F)]
    teacher = GRID.complete(frame[frame["kind"] == "teacher"])      # no axis in its key
    assert len(teacher) == len(D) * len(F) and set(teacher["top1"]) == {80.0}


def test_the_main_table_has_a_block_per_combination_of_the_axes():
    table = main_table(results(), GRID)
    assert list(table.index.names) == ["dataset", "teacher", "size", "d_epochs", "ft_lr", "init"]
    rows = dict(zip(table.index, table.to_dict("records")))
    for d in D:
        for f in F:
            assert rows["fm", "t", "s", d, f, "teacher (pretrained)"]["softmax"] == "80.00"
            control = f"{top1('copy_mlp', d, f, 0):.2f} ± 0.00"
            assert rows["fm", "t", "s", d, f, "copy_mlp"]["linear"] == control
            recipe = top1("copy_mlp+distill", d, f, 0)
            assert rows["fm", "t", "s", d, f, "copy_mlp+distill"]["linear"] == \
                f"{recipe:.2f} ± 0.00"


def test_a_by_axis_table_puts_the_axis_values_side_by_side():
    by_d = axis_table(results(), GRID, "d_epochs")
    assert list(by_d.columns) == D
    assert list(by_d.index.names) == ["dataset", "teacher", "size", "ft_lr", "operator", "init"]
    row = by_d.loc[("fm", "t", "s", "low", "linear", "copy_mlp+distill")]
    assert (row["5"], row["20"]) == ("66.00 ± 0.00", "72.00 ± 0.00")
    control = by_d.loc[("fm", "t", "s", "low", "linear", "copy_mlp")]
    assert control["5"] == control["20"] == "60.00 ± 0.00"       # one result, in each column
    by_f = axis_table(results(), GRID, "ft_lr")
    assert list(by_f.columns) == F


def test_claims_are_decided_within_each_combination_of_the_axes():
    found = [v for v in verdicts(results(), GRID) if v.claim.name == "recipe_closes_gap"
             and not v.is_pooled]
    assert {(v.where["d_epochs"], v.where["ft_lr"]) for v in found} == {
        (d, f) for d in D for f in F}
    for v in found:
        d, f = v.where["d_epochs"], v.where["ft_lr"]
        expected = top1("copy_mlp+distill", d, f, 0) - top1("copy_all", "none", f, 0)
        assert v.per_seed == {s: pytest.approx(expected) for s in SEEDS}
        assert v.estimate.verdict == ("holds" if d == "20" else "does not hold")
    frame = claims_frame(results(), GRID)
    assert {"d_epochs", "ft_lr"} <= set(frame.columns)


def test_two_records_with_one_key_are_refused_naming_both():
    twice = records() + [record("cell", key("linear", "copy_mlp", "none", "low", 0), 1.0,
                                "elsewhere/cell")]
    with pytest.raises(ResultsError, match=r"two records with one key .*'ft_lr': 'low'.*: "
                                           r"fm/t/s/linear/copy_mlp/none/none/low/0 and "
                                           r"elsewhere/cell"):
        results_frame(twice, GRID)
    # without the axis in the key the four distillations' cells would collide
    with pytest.raises(ResultsError, match="two records with one key"):
        results_frame(records(), Grid([], "out", ORDERS, []))


def test_a_cell_s_curve_starts_at_its_own_distillation_s_cost():
    distill = [{"kind": "distill", "status": "ok", "run_dir": f"distill/{d}",
                "key": {**MODEL, "operator": "linear", "loss": "out", "d_epochs": d},
                "metrics": {"train_images": int(d) * 100, "train_flops_per_image": 1.0,
                            "train_time_s": 1.0}, "config": {}} for d in D]
    cells = [{**record("cell", key("linear", "copy_mlp+distill", d, "low", 0), 50.0),
              "metrics": {"top1": 50.0, "init": {"top1": 10.0}, "train_flops_per_image": 1.0}}
             for d in D]
    curves = curves_frame(distill + cells, GRID)
    start = curves[curves["epoch"] == 0].set_index("d_epochs")["images"]
    assert start.to_dict() == {"5": 500, "20": 2000}


def test_robustness_and_dense_tables_carry_the_axes():
    scored = [{**r, "metrics": {"top1": r["metrics"]["top1"]}} for r in records()
              if r["kind"] == "cell"]
    teacher = {"kind": "robustness", "status": "ok", "run_dir": "rt", "metrics": {"top1": 79.0},
               "key": {**MODEL, "operator": "softmax", "init": "teacher", "loss": "none",
                       "seed": None}}
    frame = robustness_frame(scored + [teacher], GRID)
    table = robustness_table(frame, GRID)
    assert list(table.index.names) == ["dataset", "teacher", "size", "d_epochs", "ft_lr", "model"]
    assert table.loc[("fm", "t", "s", "20", "high", "softmax teacher"), "clean"] == "79.00"
    dense = results().assign(kind="dense", task="segment", mIoU=lambda f: f["top1"])
    grid = Grid([], "out", ORDERS, [], AXES, [["segment", "mIoU"]])
    table = dense_table(dense[dense["operator"].notna()], grid, [("segment", "mIoU")])
    assert table.loc[("fm", "t", "s", "5", "low", "linear copy_mlp+distill"), "mIoU"] == \
        "66.00 ± 0.00"


def texts(draw) -> str:
    """Every text a figure shows (titles, tick labels, legend entries), drawn by `draw`."""
    shown = []

    def keep(fig, out):
        shown.extend(t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text")))
    original = figures.save
    figures.save = keep
    try:
        draw()
    finally:
        figures.save = original
    return "\n".join(shown)


def test_every_figure_shows_both_axes_values(tmp_path):
    frame = results()
    curve = pd.DataFrame([{**{k: r[k] for k in GRID.key}, "epoch": 1, "images": 1,
                           "flops": 1e9, "compute_s": 1.0, "test_top1": r["top1"]}
                          for r in frame.to_dict("records")])
    layers = pd.DataFrame([{"kind": "distill", **MODEL, "operator": "linear", "loss": "out",
                            "d_epochs": d, "ft_lr": None, "phase": phase, "epoch": 1,
                            "metric": "rel_err", "layer": layer, "value": 0.1}
                           for d in D for phase in ("epoch", "end", "random", "copied")
                           for layer in (0, 1)])
    drawn = {"accuracy_by_init": lambda: figures.accuracy_by_init(frame, GRID, tmp_path / "a"),
             "time_to_accuracy": lambda: figures.time_to_accuracy(curve, GRID, tmp_path / "t"),
             "claims": lambda: figures.claims_figure(frame, GRID, tmp_path / "c")}
    for name, draw in drawn.items():
        shown = texts(draw)
        assert all(f"d_epochs={d}" in shown for d in D), name
        assert all(f"ft_lr={f}" in shown for f in F), name
    shown = texts(lambda: figures.distill_layers(layers, GRID, tmp_path / "l"))
    assert all(f"d_epochs={d}" in shown for d in D) and "ft_lr" not in shown


def test_claims_refuse_two_results_for_one_student_strategy_and_seed():
    frame = results()
    twice = pd.concat([frame, frame[(frame["init"] == "copy_mlp") & (frame["seed"] == 0)]
                       .assign(run_dir="again")])
    with pytest.raises(ResultsError, match=r"two results for .*copy_mlp, seed 0: .* and again"):
        verdicts(twice, GRID)
