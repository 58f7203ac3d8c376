"""results.csv -> tables (CSV, Markdown, LaTeX): mean and 95% CI of test top-1 over seeds.

    main          rows: init strategy (+ the softmax teacher), columns: operator, per dataset/size
    loss_design   rows: init strategy x loss design, columns: operator
    by_dataset    rows: size x operator x init strategy, columns: dataset
    by_size       rows: dataset x operator x init strategy, columns: size

A grid cell that has not run reads "missing", one whose job failed "failed": never dropped.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path

import pandas as pd

from linvit.io import write_text

# Two-sided 95% Student-t quantiles by degrees of freedom; the normal quantile beyond.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042}


def t95(dof: int) -> float:
    """Conservative between table entries (the quantile of the next smaller dof)."""
    if dof > 30:
        return 1.960
    return T95[max(d for d in T95 if d <= dof)]


def summarize(values: list[float]) -> tuple[float, float | None, int]:
    """Mean, 95% CI half-width (None for a single value) and count."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None, n
    return mean, t95(n - 1) * statistics.stdev(values) / math.sqrt(n), n


def format_cell(group: pd.DataFrame) -> str:
    ok = group[group["status"] == "ok"]["top1"].dropna().astype(float).tolist()
    if not ok:
        statuses = set(group["status"])
        return "failed" if "failed" in statuses else "missing"
    mean, ci, n = summarize(ok)
    text = f"{mean:.2f}" if ci is None else f"{mean:.2f} ± {ci:.2f}"
    incomplete = len(group) - len(ok)
    return text + (f" ({len(ok)}/{len(group)} seeds)" if incomplete else "")


def pivot(frame: pd.DataFrame, index: list[str], columns: str, orders: dict) -> pd.DataFrame:
    if frame.empty:
        return pd.DataFrame(index=pd.MultiIndex.from_tuples([], names=index))
    cells = {}
    for key, group in frame.groupby(index + [columns], sort=False, dropna=False):
        cells[key] = format_cell(group)
    rows = sorted({k[:-1] for k in cells}, key=lambda r: tuple(
        _rank(orders.get(col), v) for col, v in zip(index, r)))
    cols = sorted({k[-1] for k in cells}, key=lambda v: _rank(orders.get(columns), v))
    table = pd.DataFrame([[cells.get((*r, c), "") for c in cols] for r in rows], columns=cols,
                         index=pd.MultiIndex.from_tuples(rows, names=index))
    return table


def _rank(order: list | None, value) -> tuple:
    order = order or []
    return (order.index(value), "") if value in order else (len(order), str(value))


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


def to_markdown(table: pd.DataFrame) -> str:
    names = list(table.index.names)
    head = "| " + " | ".join(names + [str(c) for c in table.columns]) + " |"
    rule = "|" + "---|" * len(names) + "---:|" * len(table.columns)
    keys = [idx if isinstance(idx, tuple) else (idx,) for idx in table.index]
    body = ["| " + " | ".join([str(v) for v in key] + [str(v) for v in row]) + " |"
            for key, row in zip(keys, table.itertuples(index=False))]
    return "\n".join([head, rule, *body]) + "\n"


def _tex(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("_", r"\_"), ("&", r"\&"), ("%", r"\%"),
                 ("#", r"\#"), ("±", r"$\pm$")):
        text = text.replace(a, b)
    return text


def to_latex(table: pd.DataFrame, caption: str) -> str:
    names = list(table.index.names)
    lines = [r"\begin{table}[t]", r"\centering", f"\\caption{{{_tex(caption)}}}",
             r"\begin{tabular}{" + "l" * len(names) + "r" * len(table.columns) + "}",
             r"\toprule",
             " & ".join(_tex(str(c)) for c in names + list(table.columns)) + r" \\",
             r"\midrule"]
    for idx, row in zip(table.index, table.itertuples(index=False)):
        lines.append(" & ".join(_tex(str(v)) for v in list(idx) + list(row)) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


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
    out_dir = Path(out_dir)
    for name, table in tables.items():
        write_text(out_dir / f"{name}.csv", table.reset_index().to_csv(index=False))
        write_text(out_dir / f"{name}.md", to_markdown(table))
        write_text(out_dir / f"{name}.tex", to_latex(table, CAPTIONS[name]))
    return tables


def run_step(a) -> None:
    from linvit.report.files import read_csv, read_grid

    grid = read_grid(a.grid)
    write_tables(read_csv(a.results), grid["orders"], grid["main_loss"], a.out)
