"""Tables for every reporting user (report/, bench/): a mean and its 95% CI over seeds, ranking by
a declared axis order, and one table written as CSV, Markdown and LaTeX."""
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


def write_table(table: pd.DataFrame, stem: str | Path, caption: str) -> None:
    """stem.csv, stem.md and stem.tex."""
    stem = Path(stem)
    write_text(stem.with_name(stem.name + ".csv"), table.reset_index().to_csv(index=False))
    write_text(stem.with_name(stem.name + ".md"), to_markdown(table))
    write_text(stem.with_name(stem.name + ".tex"), to_latex(table, caption))
