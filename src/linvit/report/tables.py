"""results.csv -> tables (CSV, Markdown, LaTeX): mean and 95% CI of test top-1 over seeds.

    main          rows: init strategy (+ the softmax teacher), columns: operator, per
                  dataset / teacher / size / value of each varying config axis
    loss_design   rows: init strategy x loss design, columns: operator
    by_<axis>     rows: every other grouping x operator x init strategy, columns: the axis's
                  values (dataset, teacher, size, and each config axis)
    claims        the paper's claims decided from paired contrasts over seeds (report.claims)
    distill_quality  each distillation's quality against its references (report.distillation)

Only the tables the grid document names are written: an axis of one value has no table.
A grid cell that has not run reads "missing", one whose job failed "failed": never dropped.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from linvit.errors import ResultsError
from linvit.io import write_text
from linvit.render.tables import cell_text, rank, to_latex, write_table
from linvit.report import distillation, selection
from linvit.report.grid import Grid


def format_cell(group: pd.DataFrame) -> str:
    return cell_text(group, "top1")


def pivot(frame: pd.DataFrame, index: list[str], columns: str, orders: dict) -> pd.DataFrame:
    if frame.empty:
        return pd.DataFrame(index=pd.MultiIndex.from_tuples([], names=index))
    cells = {}
    for key, group in frame.groupby(index + [columns], sort=False, dropna=False):
        cells[key] = format_cell(group)
    rows = sorted({k[:-1] for k in cells}, key=lambda r: tuple(
        rank(orders.get(col), v) for col, v in zip(index, r)))
    cols = sorted({k[-1] for k in cells}, key=lambda v: rank(orders.get(columns), v))
    table = pd.DataFrame([[cells.get((*r, c), "") for c in cols] for r in rows], columns=cols,
                         index=pd.MultiIndex.from_tuples(rows, names=index))
    table.columns.name = columns   # so that a value named like an index level reads axis=value
    return table


# How a teacher model was made (its record's stage) -> its row's label
TEACHER_LABELS = {"pretrain": "teacher (pretrained)", "import-teacher": "teacher (imported)",
                  "probe": "teacher (imported, probed)", "select": "teacher (selected)"}


def main_table(results: pd.DataFrame, grid: Grid) -> pd.DataFrame:
    """Rows: each group's teacher, then its init strategies; columns: operators."""
    results, group, orders = grid.complete(results), grid.group, grid.orders
    table = pivot(grid.main(results), group + ["init"], "operator", orders)
    teachers = results[results["kind"] == "teacher"]
    if len(teachers) and "softmax" not in table.columns:
        table["softmax"] = ""
    for key, rows in teachers.groupby(group, sort=False, dropna=False):
        stage = rows["stage"].iloc[0] if "stage" in rows else "pretrain"
        label = TEACHER_LABELS.get(stage, "teacher (pretrained)")
        row = pd.DataFrame([[format_cell(rows) if c == "softmax" else "" for c in table.columns]],
                           columns=table.columns, index=pd.MultiIndex.from_tuples(
                               [(*key, label)], names=table.index.names))
        table = pd.concat([row, table])
    # teacher rows first within their group (a stable sort keeps them where concat put them)
    keys = sorted(range(len(table)), key=lambda i: tuple(
        rank(orders.get(name), table.index[i][j]) for j, name in enumerate(group)))
    return table.iloc[keys]


def loss_table(results: pd.DataFrame, grid: Grid) -> pd.DataFrame:
    cells = grid.complete(results[(results["kind"] == "cell") & (results["loss"] != "none")])
    return pivot(cells, grid.group + ["init", "loss"], "operator", grid.orders)


def axis_table(results: pd.DataFrame, grid: Grid, axis: str) -> pd.DataFrame:
    """Cells of the main loss with `axis` (dataset, teacher, size or a config axis) as the
    columns; a cell the axis does not reach shows its one result in each."""
    cells = grid.main(grid.complete(results))
    others = [name for name in grid.group if name != axis]
    return pivot(cells, others + ["operator", "init"], axis, grid.orders)


CAPTIONS = {
    "main": "Test top-1 (%) by init strategy and operator; mean ± 95% CI over seeds",
    "loss_design": "Test top-1 (%) by distillation loss design",
    "time_to_target": "Training each init strategy needs to reach 95% of its teacher's test "
                      "top-1 (distillation included; mean over seeds)",
    "claims": "The paper's claims: paired contrasts in test top-1 points, mean ± 95% CI over "
              "seeds, and their verdicts",
    "distill_quality": distillation.CAPTION,
    "selection": selection.CAPTION,
}
AXIS_CAPTIONS = {"dataset": "dataset", "teacher": "teacher", "size": "model size"}


def caption(name: str) -> str:
    if name.startswith("by_") and name not in CAPTIONS:
        axis = name.removeprefix("by_")
        return (f"Test top-1 (%) by {AXIS_CAPTIONS.get(axis, axis)}" +
                ("" if axis in AXIS_CAPTIONS else " (a cell it does not reach: its one result "
                 "in each column)"))
    return CAPTIONS[name]


def build_table(name: str, results: pd.DataFrame, grid: Grid) -> pd.DataFrame:
    if name == "main":
        return main_table(results, grid)
    if name == "loss_design":
        return loss_table(results, grid)
    if name.startswith("by_"):
        return axis_table(results, grid, name.removeprefix("by_"))
    raise ValueError(f"no table {name!r}")


def write_claims(results: pd.DataFrame, grid: Grid, stem: Path) -> pd.DataFrame:
    from linvit.report.claims import claims_frame, claims_markdown

    frame = claims_frame(results, grid)
    write_text(stem.with_suffix(".csv"), frame.to_csv(index=False))
    write_text(stem.with_suffix(".md"), claims_markdown(frame, grid))
    columns = ["operator", "n", "mean", "ci_low", "ci_high", "verdict", "holm"]
    indexed = frame.set_index(["claim", *grid.group])[columns]
    write_text(stem.with_suffix(".tex"), to_latex(indexed.round(2), CAPTIONS["claims"]))
    return frame


def write_tables(results: pd.DataFrame, curves: pd.DataFrame, grid: Grid,
                 out_dir: str | Path, layers: pd.DataFrame | None = None) -> dict:
    """The grid document's tables as CSV, Markdown and LaTeX."""
    from linvit.report.cost import time_to_target

    tables = {}
    for name in grid.tables:
        if name == "claims":
            tables[name] = write_claims(results, grid, Path(out_dir) / name)
            continue
        if name == "time_to_target":
            tables[name] = time_to_target(results, curves, grid)
        elif name == "selection":
            tables[name] = selection.selection_table(results, grid)
        elif name == "distill_quality":
            if layers is None:
                raise ResultsError("the distill_quality table reads distill_layers.csv: give "
                                   "--layers")
            tables[name] = distillation.quality_table(results, layers, grid)
        else:
            tables[name] = build_table(name, results, grid)
        write_table(tables[name], Path(out_dir) / name, caption(name))
    return tables


def run_step(a) -> None:
    from linvit.report.files import read_csv
    from linvit.report.grid import read_grid

    grid = read_grid(a.grid)
    write_tables(read_csv(a.results, grid), read_csv(a.curves, grid), grid, a.out,
                 read_csv(a.layers, grid) if a.layers else None)
