"""Tables for every reporting user (report/, bench/): a mean and its 95% CI over seeds, ranking by
a declared axis order, and one table written as CSV, Markdown and LaTeX."""
from __future__ import annotations

import math
import statistics
from pathlib import Path

import pandas as pd

from linvit.io import write_text

# LaTeX's ten special characters, for the caption (the cells go through pandas' own escape)
_LATEX_SPECIALS = str.maketrans({
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"})


def t95(dof: int) -> float:
    """The two-sided 95% Student-t quantile for `dof` degrees of freedom."""
    from scipy.stats import t
    return float(t.ppf(0.975, dof))


def summarize(values: list[float]) -> tuple[float, float | None, int]:
    """Mean, 95% CI half-width (None for a single value) and count."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None, n
    return mean, t95(n - 1) * statistics.stdev(values) / math.sqrt(n), n


def mean_ci(values: list[float], signed: bool = False) -> str:
    """"mean" for one value, "mean ± half-width" (95% CI) for more; `signed`: "+" on gains."""
    mean, ci, _ = summarize(values)
    head = f"{mean:+.2f}" if signed else f"{mean:.2f}"
    return head if ci is None else f"{head} ± {ci:.2f}"


def cell_text(group: pd.DataFrame, metric: str, count_seeds: bool = True) -> str:
    """`metric` over the group's jobs with status ok as mean ± CI; "failed" or "missing" when
    there are none (never a blank), and "(k/n seeds)" when only some are ok (count_seeds)."""
    ok = group[group["status"] == "ok"][metric].dropna().astype(float).tolist() \
        if metric in group else []
    if not ok:
        return "failed" if "failed" in set(group["status"]) else "missing"
    incomplete = count_seeds and len(ok) < len(group)
    return mean_ci(ok) + (f" ({len(ok)}/{len(group)} seeds)" if incomplete else "")


def rows_where(frame: pd.DataFrame, names, values) -> pd.DataFrame:
    """The rows whose columns `names` equal `values`, a missing value matching only missing ones
    (records made before a key existed leave it empty)."""
    mask = pd.Series(True, index=frame.index)
    for name, value in zip(names, values):
        mask &= frame[name].isna() if pd.isna(value) else frame[name] == value
    return frame[mask]


def rank(order: list | None, value) -> tuple:
    order = order or []
    return (order.index(value), "") if value in order else (len(order), str(value))


def flat(table: pd.DataFrame) -> pd.DataFrame:
    """The table with its index as leading columns; a value column named like an index level
    (the attn_start axis' "teacher" beside the teacher axis) is named by its axis, "axis=value"."""
    names = set(table.index.names)
    axis = table.columns.name
    clash = {c: f"{axis}={c}" if axis else f"{c} (value)" for c in table.columns if c in names}
    return table.rename(columns=clash).reset_index()


def to_markdown(table: pd.DataFrame) -> str:
    """A GitHub table: the index columns left-aligned, the value columns right-aligned."""
    flat_table = flat(table).map(lambda v: str(v).replace("|", r"\|"))
    align = ["left"] * table.index.nlevels + ["right"] * len(table.columns)
    # cells as written (no re-formatting of numbers by tabulate)
    return flat_table.to_markdown(index=False, colalign=align, disable_numparse=True) + "\n"


def _tex_cell(text: str) -> str:
    # after pandas' escape: ± as math, so that the .tex needs no textcomp
    return str(text).replace("±", r"$\pm$")


def to_latex(table: pd.DataFrame, caption: str) -> str:
    """A booktabs table inside a float, every cell and header escaped by pandas' Styler."""
    flat_table = flat(table)
    flat_table.columns = [str(c) for c in flat_table.columns]
    styler = flat_table.astype(str).style.hide(axis="index") \
        .format(_tex_cell, escape="latex").format_index(escape="latex", axis=1)
    columns = "l" * table.index.nlevels + "r" * len(table.columns)
    return styler.to_latex(caption=caption.translate(_LATEX_SPECIALS), position="t",
                           position_float="centering", hrules=True, column_format=columns)


def write_table(table: pd.DataFrame, stem: str | Path, caption: str) -> None:
    """stem.csv, stem.md and stem.tex."""
    stem = Path(stem)
    write_text(stem.with_name(stem.name + ".csv"), flat(table).to_csv(index=False))
    write_text(stem.with_name(stem.name + ".md"), to_markdown(table))
    write_text(stem.with_name(stem.name + ".tex"), to_latex(table, caption))
