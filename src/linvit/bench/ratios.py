"""From one run's measurements to ratios, slopes and the goals of the benchmark.

Only ratios between rows measured in the same run are reported as results: absolute times depend
on the machine and on whatever else it was doing, ratios much less so. Every row is compared with
softmax's core (SDPA) at the same number of tokens; the goals are about the attention core (the
part softmax attention replaces); the `mix` rows add each operator's local conv for the full cost.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from linvit.attention import OPERATORS
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


def flop_bound(operator: str, tokens: int, head_dim: int) -> float:
    """Softmax's FLOPs over the operator's (each one head's global_mix forward, by the operators'
    own counts): the speedup the operator would reach if both ran equally efficiently. NaN for
    an operator that counts none."""
    own = OPERATORS[operator].core_flops(tokens, head_dim)
    return OPERATORS["softmax"].core_flops(tokens, head_dim) / own if own else float("nan")


def flop_table(ops: pd.DataFrame, tokens: int) -> pd.DataFrame:
    """Per operator at `tokens`: FLOP-ratio bound, measured speedup of the core on the fast
    backend, and the share of the bound it reaches."""
    fast = FAST_BACKEND[ops.device.iloc[0]]
    sp = speedups(ops)
    rows = []
    for op in [o for o in ops.operator.unique() if o != "softmax"]:
        key = (op, fast, "core")
        measured = sp.loc[key, tokens] if key in sp.index and tokens in sp.columns else np.nan
        bound = flop_bound(op, tokens, int(ops.head_dim.iloc[0]))
        rows.append({"operator": op, "FLOP bound": bound, "measured": measured,
                     "share": measured / bound})
    return pd.DataFrame(rows).set_index("operator")


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
            if op in cfg.goal_flop_share:
                bound = flop_bound(op, cfg.goal_tokens, int(ops.head_dim.iloc[0]))
                share = cfg.goal_flop_share[op]
                out.append(_goal(f"{op}/{fast} share of its FLOP bound ({bound:.1f}x) at "
                                 f"N={cfg.goal_tokens}", value / bound, f">= {share:g}",
                                 value / bound >= share, ""))
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
             f"## FLOP-ratio bound and measured speedup at N={cfg.goal_tokens} (attention core, "
             "fast backend)", "",
             "FLOP bound: softmax's forward FLOPs over the operator's (see each operator's "
             "core_flops); share: measured / bound, how efficiently the operator's FLOPs run "
             "compared with SDPA's.", "",
             to_markdown(flop_table(ops, cfg.goal_tokens).round(2)),
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
