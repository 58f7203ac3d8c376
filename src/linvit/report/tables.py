"""results.csv -> tables (CSV, Markdown, LaTeX): mean and 95% CI of test top-1 over seeds.

    main          rows: init strategy (+ the softmax teacher), columns: operator, per
                  dataset / teacher / size
    loss_design   rows: init strategy x loss design, columns: operator
    by_dataset    rows: teacher x size x operator x init strategy, columns: dataset
    by_teacher    rows: dataset x size x operator x init strategy, columns: teacher
    by_size       rows: dataset x teacher x operator x init strategy, columns: size
    claims        the paper's claims decided from paired contrasts over seeds (report.claims)

Only the tables the grid document names are written: an axis of one value has no table.
A grid cell that has not run reads "missing", one whose job failed "failed": never dropped.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from linvit.io import write_text
from linvit.render.tables import cell_text, rank, to_latex, write_table
from linvit.report.collect import GROUP


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
    return table


# How a teacher model was made (its record's stage) -> its row's label
TEACHER_LABELS = {"pretrain": "teacher (pretrained)", "import-teacher": "teacher (imported)",
                  "probe": "teacher (imported, probed)", "select": "teacher (selected)"}


def main_table(results: pd.DataFrame, orders: dict, main_loss: str) -> pd.DataFrame:
    cells = results[(results["kind"] == "cell") & results["loss"].isin([main_loss, "none"])]
    table = pivot(cells, GROUP + ["init"], "operator", orders)
    teachers = results[results["kind"] == "teacher"]
    if len(teachers) and "softmax" not in table.columns:
        table["softmax"] = ""
    for key, group in teachers.groupby(GROUP, sort=False, dropna=False):
        stage = group["stage"].iloc[0] if "stage" in group else "pretrain"
        label = TEACHER_LABELS.get(stage, "teacher (pretrained)")
        row = pd.DataFrame([[format_cell(group) if c == "softmax" else "" for c in table.columns]],
                           columns=table.columns, index=pd.MultiIndex.from_tuples(
                               [(*key, label)], names=table.index.names))
        table = pd.concat([row, table])
    # teacher rows first within their group (a stable sort keeps them where concat put them)
    keys = sorted(range(len(table)), key=lambda i: tuple(
        rank(orders.get(name), table.index[i][j]) for j, name in enumerate(GROUP)))
    return table.iloc[keys]


def loss_table(results: pd.DataFrame, orders: dict) -> pd.DataFrame:
    cells = results[(results["kind"] == "cell") & (results["loss"] != "none")]
    return pivot(cells, GROUP + ["init", "loss"], "operator", orders)


def axis_table(results: pd.DataFrame, orders: dict, axis: str, main_loss: str) -> pd.DataFrame:
    """Cells of the main loss with `axis` (one of GROUP) as the columns."""
    others = [name for name in GROUP if name != axis]
    cells = results[(results["kind"] == "cell") & results["loss"].isin([main_loss, "none"])]
    return pivot(cells, others + ["operator", "init"], axis, orders)


CAPTIONS = {
    "main": "Test top-1 (%) by init strategy and operator; mean ± 95% CI over seeds",
    "loss_design": "Test top-1 (%) by distillation loss design",
    "by_dataset": "Test top-1 (%) by dataset",
    "by_teacher": "Test top-1 (%) by teacher",
    "by_size": "Test top-1 (%) by model size",
    "time_to_target": "Training each init strategy needs to reach 95% of its teacher's test "
                      "top-1 (distillation included; mean over seeds)",
    "claims": "The paper's claims: paired contrasts in test top-1 points, mean ± 95% CI over "
              "seeds, and their verdicts",
}


BUILDERS = {
    "main": lambda r, o, loss: main_table(r, o, loss),
    "loss_design": lambda r, o, loss: loss_table(r, o),
    "by_dataset": lambda r, o, loss: axis_table(r, o, "dataset", loss),
    "by_teacher": lambda r, o, loss: axis_table(r, o, "teacher", loss),
    "by_size": lambda r, o, loss: axis_table(r, o, "size", loss),
}


def write_claims(results: pd.DataFrame, main_loss: str, stem: Path) -> pd.DataFrame:
    from linvit.report.claims import claims_frame, claims_markdown

    frame = claims_frame(results, main_loss)
    write_text(stem.with_suffix(".csv"), frame.to_csv(index=False))
    write_text(stem.with_suffix(".md"), claims_markdown(frame))
    columns = ["operator", "n", "mean", "ci_low", "ci_high", "verdict"]
    indexed = frame.set_index(["claim", "dataset", "teacher", "size"])[columns]
    write_text(stem.with_suffix(".tex"), to_latex(indexed.round(2), CAPTIONS["claims"]))
    return frame


def write_tables(results: pd.DataFrame, curves: pd.DataFrame, orders: dict, main_loss: str,
                 out_dir: str | Path, names: list[str]) -> dict[str, pd.DataFrame]:
    """The tables `names` (the grid document's list) as CSV, Markdown and LaTeX."""
    from linvit.report.cost import time_to_target

    tables = {}
    for name in names:
        if name == "claims":
            tables[name] = write_claims(results, main_loss, Path(out_dir) / name)
            continue
        if name == "time_to_target":
            tables[name] = time_to_target(results, curves, orders, main_loss)
        else:
            tables[name] = BUILDERS[name](results, orders, main_loss)
        write_table(tables[name], Path(out_dir) / name, CAPTIONS[name])
    return tables


def run_step(a) -> None:
    from linvit.report.files import read_csv, read_grid

    grid = read_grid(a.grid)
    write_tables(read_csv(a.results), read_csv(a.curves), grid["orders"], grid["main_loss"],
                 a.out, grid["tables"])
