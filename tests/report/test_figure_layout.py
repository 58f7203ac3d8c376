"""Every report figure, drawn from the golden results and from a grid of many students: no text
overlaps another (titles, tick labels, axis labels, legend entries) and every legend lies outside
the panels (matplotlib's bounding boxes, as the figure is saved)."""
from __future__ import annotations

import itertools
from pathlib import Path

import matplotlib
import pandas as pd
import pytest
from test_claims import grid as claims_grid

import linvit.report.figures as figures
import linvit.report.robustness as robustness
from linvit.render.plotting import lay_out
from linvit.report.files import read_csv
from linvit.report.grid import Grid, read_grid

GOLDEN = Path(__file__).resolve().parent / "golden"


def drawn(module, draw) -> list:
    """The figures `draw` makes, laid out as `save` lays them out, instead of being saved."""
    figs = []
    original = module.save
    module.save = lambda fig, out: (lay_out(fig), figs.append(fig))
    try:
        draw()
    finally:
        module.save = original
    return figs


def problems(fig) -> list[str]:
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = [(t.get_text(), t.get_window_extent(renderer))
             for t in fig.findobj(matplotlib.text.Text)
             if t.get_visible() and t.get_text().strip() and t.figure is fig]
    out = []
    for (a, box_a), (b, box_b) in itertools.combinations(texts, 2):
        width = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
        height = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
        if width > 0.5 and height > 0.5:
            out.append(f"{a!r} overlaps {b!r}")
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    for legend in legends:
        box = legend.get_window_extent(renderer)
        out += [f"a legend lies over the panel {ax.get_title()!r}" for ax in fig.axes
                if box.overlaps(ax.get_window_extent(renderer))]
    return out


def golden() -> tuple:
    grid = read_grid(GOLDEN / "fixture" / "grid.json")
    expected = GOLDEN / "expected"
    return (grid, read_csv(expected / "results.csv", grid), read_csv(expected / "curves.csv", grid),
            read_csv(expected / "distill_layers.csv", grid))


def many_students() -> tuple:
    """Three operators on two datasets: 6 students, 2 pooled rows per claim."""
    results = pd.concat([claims_grid({}, dataset="fashion_mnist"),
                         claims_grid({}, dataset="mnist5k")], ignore_index=True)
    orders = {"init": ["random", "copy_embed", "copy_attn", "copy_mlp", "copy_all", "distill",
                       "copy_embed+distill", "copy_mlp+distill"],
              "operator": ["linear", "gla", "ttt", "softmax"]}
    curves = results.assign(epoch=1, images=100, flops=1e9, compute_s=1.0,
                            test_top1=results["top1"])
    return Grid([], "out", orders, []), results, curves


@pytest.mark.parametrize("data", ["golden", "many students"])
def test_every_figure_has_no_overlapping_text_and_its_legends_outside_the_panels(data, tmp_path):
    if data == "golden":
        grid, results, curves, layers = golden()
    else:
        (grid, results, curves), layers = many_students(), None
    draws = {"accuracy_by_init": lambda: figures.accuracy_by_init(results, grid, tmp_path / "a"),
             "time_to_accuracy": lambda: figures.time_to_accuracy(curves, grid, tmp_path / "t"),
             "claims": lambda: figures.claims_figure(results, grid, tmp_path / "c")}
    if layers is not None:
        draws["distill_layers"] = lambda: figures.distill_layers(layers, grid, tmp_path / "l")
    for name, draw in draws.items():
        fig, = drawn(figures, draw)
        assert not problems(fig), (name, problems(fig))


def test_the_robustness_figure_keeps_its_legend_outside_too(tmp_path):
    sets = {"contrast": {"1": 70.0, "5": 40.0}, "gaussian_noise": {"1": 60.0, "5": 30.0}}
    metrics = {"top1": 80.0, "corruptions": {"clean": 82.0, "sets": sets, "samples": 40,
                                             "mean": 50.0}}
    key = {"dataset": "d", "teacher": "t", "size": "s", "loss": "none"}
    records = [{"kind": "robustness", "status": "ok", "metrics": metrics, "run_dir": str(i),
                "key": {**key, "operator": op, "init": init, "seed": seed}}
               for i, (op, init, seed) in enumerate(
                   [("softmax", "teacher", None)] + [(op, init, s) for op in ("linear", "gla")
                                                     for init in ("random", "copy_mlp")
                                                     for s in (0, 1)])]
    grid = Grid([], "out", {"init": ["random", "copy_mlp"], "operator": ["linear", "gla"]}, [])
    frame = robustness.robustness_frame(records, grid)
    fig, = drawn(robustness, lambda: robustness.robustness_figure(frame, grid, tmp_path / "r"))
    assert not problems(fig)


def test_the_check_finds_what_it_looks_for():
    """A figure with its legend over the curves and two titles on one spot fails the check."""
    from linvit.render.plotting import new_figure

    fig, (ax,) = new_figure(1)
    ax.plot([0, 1], [0, 1], label="a line")
    ax.legend(loc="center")
    ax.text(0.5, 1.02, "one title", transform=ax.transAxes)
    ax.set_title("one title")
    fig.tight_layout()
    found = problems(fig)
    assert any("legend lies over" in p for p in found)
    assert any("overlaps" in p for p in found)
