"""results.csv -> tables (CSV, Markdown, LaTeX): mean and 95% CI of test top-1 over seeds.

    main          rows: init strategy (+ the softmax teacher), columns: operator, per dataset/size
    loss_design   rows: init strategy x loss design, columns: operator
    by_dataset    rows: size x operator x init strategy, columns: dataset
    by_size       rows: dataset x operator x init strategy, columns: size

A grid cell that has not run reads "missing", one whose job failed "failed": never dropped.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from linvit.render.tables import cell_text, rank, write_table


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


def main_table(results: pd.DataFrame, orders: dict, main_loss: str) -> pd.DataFrame:
    cells = results[(results["kind"] == "cell") & results["loss"].isin([main_loss, "none"])]
    table = pivot(cells, ["dataset", "size", "init"], "operator", orders)
    teachers = results[results["kind"] == "teacher"]
    if len(teachers) and "softmax" not in table.columns:
        table["softmax"] = ""
    for (dataset, size), group in teachers.groupby(["dataset", "size"], sort=False):
        row = pd.DataFrame([[format_cell(group) if c == "softmax" else "" for c in table.columns]],
                           columns=table.columns, index=pd.MultiIndex.from_tuples(
                               [(dataset, size, "teacher (pretrained)")], names=table.index.names))
        table = pd.concat([row, table])
    return table.sort_index(level=[0, 1], sort_remaining=False)


def loss_table(results: pd.DataFrame, orders: dict) -> pd.DataFrame:
    cells = results[(results["kind"] == "cell") & (results["loss"] != "none")]
    return pivot(cells, ["dataset", "size", "init", "loss"], "operator", orders)


def axis_table(results: pd.DataFrame, orders: dict, axis: str, main_loss: str) -> pd.DataFrame:
    other = "size" if axis == "dataset" else "dataset"
    cells = results[(results["kind"] == "cell") & results["loss"].isin([main_loss, "none"])]
    return pivot(cells, [other, "operator", "init"], axis, orders)


CAPTIONS = {
    "main": "Test top-1 (%) by init strategy and operator; mean ± 95% CI over seeds",
    "loss_design": "Test top-1 (%) by distillation loss design",
    "by_dataset": "Test top-1 (%) by dataset",
    "by_size": "Test top-1 (%) by model size",
}


def write_tables(results: pd.DataFrame, orders: dict, main_loss: str,
                 out_dir: str | Path) -> dict[str, pd.DataFrame]:
    tables = {"main": main_table(results, orders, main_loss),
              "loss_design": loss_table(results, orders),
              "by_dataset": axis_table(results, orders, "dataset", main_loss),
              "by_size": axis_table(results, orders, "size", main_loss)}
    for name, table in tables.items():
        write_table(table, Path(out_dir) / name, CAPTIONS[name])
    return tables


def run_step(a) -> None:
    from linvit.report.files import read_csv, read_grid

    grid = read_grid(a.grid)
    write_tables(read_csv(a.results), grid["orders"], grid["main_loss"], a.out)
