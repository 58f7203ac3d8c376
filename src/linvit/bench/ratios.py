"""From one run's measurements to ratios, slopes and the goals of the benchmark.

Only ratios between rows measured in the same run are reported as results: absolute times depend
on the machine and on whatever else it was doing, ratios much less so.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from linvit.report.tables import to_markdown

FAST_BACKEND = {"cpu": "torch", "cuda": "triton"}


def speedups(ops: pd.DataFrame) -> pd.DataFrame:
    """softmax time / operator time at equal tokens, one column per token count."""
    soft = ops[ops.operator == "softmax"].set_index("tokens")["ms"]
    rest = ops[ops.operator != "softmax"].copy()
    rest["speedup"] = rest["tokens"].map(soft) / rest["ms"]
    table = rest.pivot_table(index=["operator", "backend"], columns="tokens", values="speedup")
    return table.dropna(axis=1, how="all")


def loglog_slope(x, y) -> float:
    if len(x) < 2:
        return float("nan")
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])


def slopes(ops: pd.DataFrame) -> pd.DataFrame:
    """Log-log slopes of time and peak memory against tokens, per operator and backend."""
    rows = []
    for (op, be), g in ops.groupby(["operator", "backend"], sort=False):
        g = g.sort_values("tokens")
        rows.append({"operator": op, "backend": be, "from": int(g.tokens.min()),
                     "to": int(g.tokens.max()), "time_slope": loglog_slope(g.tokens, g.ms),
                     "memory_slope": loglog_slope(g.tokens, g.peak_mib)})
    return pd.DataFrame(rows).set_index(["operator", "backend"])


def goals(ops: pd.DataFrame, cfg) -> list[dict]:
    """The targets, each with the measured value and whether it holds."""
    device = ops.device.iloc[0]
    fast = FAST_BACKEND[device]
    sp, sl, out = speedups(ops), slopes(ops), []
    for op in [o for o in ops.operator.unique() if o != "softmax"]:
        if (op, fast) not in sl.index:
            continue
        if cfg.goal_tokens in sp.columns:
            value = sp.loc[(op, fast), cfg.goal_tokens]
            out.append(_goal(f"{op}/{fast} vs softmax at N={cfg.goal_tokens}", value,
                             f">= {cfg.goal_speedup:g}x", value >= cfg.goal_speedup, "x"))
        row = sl.loc[(op, fast)]
        out.append(_goal(f"{op}/{fast} memory slope, N={int(row['from'])}..{int(row['to'])}",
                         row.memory_slope, f"<= {cfg.goal_slope:g}",
                         row.memory_slope <= cfg.goal_slope, ""))
        if fast == "triton":
            out += _kernel_goals(ops, op, cfg)
    return out


def _kernel_goals(ops: pd.DataFrame, op: str, cfg) -> list[dict]:
    """On a GPU: the Triton kernel against the PyTorch reference, at N >= goal_tokens."""
    t = ops[(ops.operator == op) & (ops.tokens >= cfg.goal_tokens)].pivot_table(
        index="tokens", columns="backend", values="ms")
    if not {"triton", "reference"} <= set(t.columns):
        return []
    return [_goal(f"{op}/triton vs reference at N={n}", t.loc[n, "reference"] / t.loc[n, "triton"],
                  f">= {cfg.goal_kernel_speedup:g}x",
                  t.loc[n, "reference"] / t.loc[n, "triton"] >= cfg.goal_kernel_speedup, "x")
            for n in t.index if not np.isnan(t.loc[n, "triton"])]


def _goal(name: str, value: float, target: str, holds: bool, unit: str) -> dict:
    return {"goal": name, "measured": f"{value:.2f}{unit}", "target": target,
            "holds": "yes" if bool(holds) else "NO"}


def markdown(ops: pd.DataFrame, models: pd.DataFrame | None, cfg) -> str:
    sp = speedups(ops).map(lambda v: f"{v:.1f}x")
    sp.columns = [f"N={c}" for c in sp.columns]
    parts = ["## Speedup over softmax (SDPA), forward+backward, same run", "", to_markdown(sp),
             "## Log-log slopes against tokens (1 = linear, 2 = quadratic)", "",
             to_markdown(slopes(ops).round(2)),
             "## Goals", "", to_markdown(pd.DataFrame(goals(ops, cfg)).set_index("goal"))]
    if models is not None and len(models):
        parts += [f"## Whole-model inference, images/s (batch {cfg.models.batch})", "",
                  to_markdown(_model_table(models))]
    return "\n".join(parts)


def _model_table(models: pd.DataFrame) -> pd.DataFrame:
    t = models.pivot_table(index=["size", "operator"], columns="resolution", values="images_per_s")
    t.columns = [f"{c}px" for c in t.columns]
    return t.round(2)
