"""From one run's measurements to ratios, slopes and the goals of the benchmark.

Only ratios between rows measured in the same run are reported as results: absolute times depend
on the machine and on whatever else it was doing, ratios much less so. Every row is compared with
softmax's core (SDPA) at the same number of tokens; the goals are about the attention core (the
part softmax attention replaces); the `mix` rows add each operator's local conv for the full cost.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from linvit.render.tables import to_markdown

FAST_BACKEND = {"cpu": "torch", "cuda": "triton"}
KEYS = ["operator", "backend", "part"]


def speedups(ops: pd.DataFrame) -> pd.DataFrame:
    """softmax time / row time at equal tokens, one column per token count."""
    soft = ops[ops.operator == "softmax"].set_index("tokens")["ms"]
    rest = ops[ops.operator != "softmax"].copy()
    rest["speedup"] = rest["tokens"].map(soft) / rest["ms"]
    table = rest.pivot_table(index=KEYS, columns="tokens", values="speedup", sort=False)
    return table.dropna(axis=1, how="all")


def loglog_slope(x, y) -> float:
    if len(x) < 2:
        return float("nan")
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])


def slopes(ops: pd.DataFrame) -> pd.DataFrame:
    """Log-log slopes of time and peak memory against tokens, per row kind."""
    rows = []
    for key, g in ops.groupby(KEYS, sort=False):
        g = g.sort_values("tokens")
        rows.append({**dict(zip(KEYS, key)), "from": int(g.tokens.min()), "to": int(g.tokens.max()),
                     "time_slope": loglog_slope(g.tokens, g.ms),
                     "memory_slope": loglog_slope(g.tokens, g.peak_mib)})
    return pd.DataFrame(rows).set_index(KEYS)


def goals(ops: pd.DataFrame, cfg) -> list[dict]:
    """The targets for each linear operator's core on the device's fast backend."""
    fast = FAST_BACKEND[ops.device.iloc[0]]
    sp, sl, out = speedups(ops), slopes(ops), []
    for op in [o for o in ops.operator.unique() if o != "softmax"]:
        key = (op, fast, "core")
        if key not in sl.index:
            continue
        if cfg.goal_tokens in sp.columns:
            value = sp.loc[key, cfg.goal_tokens]
            out.append(_goal(f"{op}/{fast} vs softmax at N={cfg.goal_tokens}", value,
                             f">= {cfg.goal_speedup:g}x", value >= cfg.goal_speedup, "x"))
        row = sl.loc[key]
        out.append(_goal(f"{op}/{fast} memory slope, N={int(row['from'])}..{int(row['to'])}",
                         row.memory_slope, f"<= {cfg.goal_slope:g}",
                         row.memory_slope <= cfg.goal_slope, ""))
        if fast == "triton":
            out += _kernel_goals(ops, op, cfg)
    return out


def _kernel_goals(ops: pd.DataFrame, op: str, cfg) -> list[dict]:
    """On a GPU: the Triton kernel against the PyTorch reference, at N >= goal_tokens."""
    core = ops[(ops.operator == op) & (ops.part == "core") & (ops.tokens >= cfg.goal_tokens)]
    t = core.pivot_table(index="tokens", columns="backend", values="ms")
    if not {"triton", "reference"} <= set(t.columns):
        return []
    ratio = t["reference"] / t["triton"]
    return [_goal(f"{op}/triton vs reference at N={n}", ratio[n],
                  f">= {cfg.goal_kernel_speedup:g}x", ratio[n] >= cfg.goal_kernel_speedup, "x")
            for n in t.index if not np.isnan(ratio[n])]


def _goal(name: str, value: float, target: str, holds: bool, unit: str) -> dict:
    return {"goal": name, "measured": f"{value:.2f}{unit}", "target": target,
            "holds": "yes" if bool(holds) else "NO"}


def markdown(ops: pd.DataFrame, models: pd.DataFrame | None, measured: list[dict],
             cfg) -> str:
    """The ratio table, slopes, the goals as `goals` measured them, and model throughput."""
    sp = speedups(ops).map(lambda v: "" if np.isnan(v) else f"{v:.1f}x")
    sp.columns = [f"N={c}" for c in sp.columns]
    r = ops.iloc[0]
    parts = [f"## Speedup over softmax (SDPA), forward+backward, B={r.batch} H={r.heads} "
             f"d={r.head_dim}, measured in one run", "",
             "core: feature maps + global mixing (what SDPA does); mix: + the local conv.", "",
             to_markdown(sp),
             "## Log-log slopes against tokens (1 = linear, 2 = quadratic)", "",
             to_markdown(slopes(ops).round(2)),
             "## Goals (attention core, fast backend)", "",
             to_markdown(pd.DataFrame(measured).set_index("goal"))]
    if models is not None and len(models):
        parts += [f"## Whole-model inference, images/s (batch {cfg.models.batch})", "",
                  to_markdown(_model_table(models))]
    return "\n".join(parts)


def _model_table(models: pd.DataFrame) -> pd.DataFrame:
    t = models.pivot_table(index=["size", "operator"], columns="resolution", values="images_per_s",
                           sort=False)
    t.columns = [f"{c}px" for c in t.columns]
    return t.round(2)
