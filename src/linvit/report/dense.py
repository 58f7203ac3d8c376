"""The dense results: table (each task's headline metrics by backbone: grid.json's
dense_columns, from the dense-task registry), figure, dense.md.

Rows are backbones (the softmax teacher, then each operator x init strategy); a job that failed
or has not run reads "failed" / "missing" like every other table. A second table gives each
strategy's gain over the random-init student of the same operator, paired by seed.
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from linvit.io import write_text
from linvit.render.plotting import new_figure, save
from linvit.render.tables import (
    cell_text,
    mean_ci,
    rank,
    rows_where,
    to_markdown,
    write_table,
)
from linvit.report.grid import Grid

CAPTION = "Dense tasks: each task's headline metrics (%) by backbone"
REFERENCE = "random"
TEACHER = "teacher"            # the init of the teacher's own rows (dense_jobs.TEACHER_BACKBONE)
GAP_CAPTION = ("Dense tasks: gain of each student and of the softmax teacher over the random-init "
               "student of the same operator (points), paired by seed (the heads' seed; a "
               "student's is also its backbone's): mean ± 95% CI, then each seed's gain")


def dense_table(results: pd.DataFrame, grid: Grid, columns: list) -> pd.DataFrame:
    dense = grid.complete(results[results["kind"] == "dense"])
    rows, index = [], []
    orders, group = grid.orders, grid.group
    order = {"init": [TEACHER] + orders.get("init", []), "operator": orders.get("operator", [])}
    names = [*group, "operator", "init"]
    keys = sorted({tuple(k) for k in dense[names].itertuples(index=False)},
                  key=lambda k: (*(rank(orders.get(n), v) for n, v in zip(group, k)),
                                 rank(order["init"], k[-1]), rank(order["operator"], k[-2])))
    for key in keys:
        part, (*where, op, init) = rows_where(dense, names, key), key
        rows.append([cell_text(part[part["task"] == task], metric, count_seeds=False)
                     for task, metric in columns])
        index.append((*where, "softmax teacher" if init == TEACHER else f"{op} {init}"))
    return pd.DataFrame(rows, columns=[m.replace("_", " ") for _, m in columns],
                        index=pd.MultiIndex.from_tuples(index, names=[*group, "backbone"]))


def gap_text(gains: pd.Series) -> str:
    """"mean ± CI (seed s: gain, ...)"; the seeds are shown because 2 seeds make a wide CI."""
    if gains.empty:
        return "missing"
    seeds = ", ".join(f"seed {s}: {g:+.2f}" for s, g in gains.items())
    return f"{mean_ci(gains.tolist(), signed=True)} ({seeds})"


def dense_gaps(results: pd.DataFrame, grid: Grid, columns: list) -> pd.DataFrame:
    """Each strategy, and the softmax teacher, minus the random-init student, per operator, task
    metric and seed (only seeds where both jobs are ok count; a teacher's seeds are its heads').
    Empty when no random-init student ran."""
    ok = grid.complete(results[(results["kind"] == "dense") & (results["status"] == "ok")])
    orders, group = grid.orders, grid.group
    names = [*group, "operator"]
    teachers = ok[ok["init"] == TEACHER]
    rows, index = [], []
    for key, part in ok[ok["init"] != TEACHER].groupby(names, sort=False):
        if REFERENCE not in set(part["init"]):
            continue
        part = pd.concat([part, rows_where(teachers, group, key[:len(group)])])
        others = [i for i in orders.get("init", []) if i != REFERENCE and i in set(part["init"])]
        for init in others + ([TEACHER] if TEACHER in set(part["init"]) else []):
            row = []
            for task, metric in columns:
                by_seed = {i: part[(part["init"] == i) & (part["task"] == task)]
                           .set_index("seed")[metric].dropna().astype(float)
                           for i in (init, REFERENCE)}
                row.append(gap_text((by_seed[init] - by_seed[REFERENCE]).dropna().sort_index()))
            rows.append(row)
            index.append((*key, f"{'softmax teacher' if init == TEACHER else init} - {REFERENCE}"))
    return pd.DataFrame(rows, columns=[m.replace("_", " ") for _, m in columns],
                        index=pd.MultiIndex.from_tuples(index, names=[*names, "gain"])
                        if index else pd.MultiIndex.from_arrays([[]] * (len(names) + 1),
                                                                names=[*names, "gain"]))


def dense_figure(table: pd.DataFrame, out: Path) -> None:
    fig, axes = new_figure(len(table.columns), width=3.6)
    labels = [idx[-1] for idx in table.index]
    for ax, column in zip(axes, table.columns):
        values = [float(v.split()[0]) if v and v[0].isdigit() else float("nan")
                  for v in table[column]]
        ax.barh(range(len(values)), values)
        ax.set_yticks(range(len(values)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_title(column)
    save(fig, out)


def write_dense(results: pd.DataFrame, grid: Grid, tables_dir: Path, figures_dir: Path,
                out: Path) -> None:
    """The table's columns: (task, metric) pairs, grid.json's dense_columns."""
    columns = [tuple(c) for c in grid.dense_columns]
    table = dense_table(results, grid, columns)
    write_table(table, Path(tables_dir) / "dense", CAPTION)
    dense_figure(table, Path(figures_dir) / "dense")
    gaps = dense_gaps(results, grid, columns)
    steps = results[(results["kind"] == "dense") & (results["status"] == "ok")]
    lines = ["## Dense tasks\n", CAPTION + ".\n", to_markdown(table)]
    write_table(gaps, Path(tables_dir) / "dense_gaps", GAP_CAPTION)
    if len(gaps):
        lines += ["", GAP_CAPTION + ".\n", to_markdown(gaps)]
    if "step_s" in steps and len(steps):
        for task, group in steps.groupby("task"):
            lines.append(f"- {task}: {group['step_s'].mean():.2f} s per training step on average")
    rel = os.path.relpath(Path(figures_dir) / "dense.png", Path(out).parent)
    lines.append(f"\n![dense]({rel})\n")
    write_text(out, "\n".join(lines) + "\n")


def run_step(a) -> None:
    from linvit.report.files import read_csv
    from linvit.report.grid import read_grid

    grid = read_grid(a.grid)
    write_dense(read_csv(a.results, grid), grid, Path(a.tables), Path(a.figures), Path(a.out))
