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


def _passes(ops: pd.DataFrame) -> pd.DataFrame:
    """The measurements with their pass number (`repeat`; a file without one is one pass)."""
    return ops if "repeat" in ops.columns else ops.assign(repeat=0)


def speedup_samples(ops: pd.DataFrame) -> pd.DataFrame:
    """Every non-softmax row with its speedup: softmax's time at the same tokens in the same pass
    over its own (NaN where that pass has no softmax row)."""
    ops = _passes(ops)
    soft = ops[ops.operator == "softmax"].set_index(["tokens", "repeat"])["ms"]
    rest = ops[ops.operator != "softmax"].copy()
    rest["speedup"] = [soft.get((n, r), np.nan) / ms
                       for n, r, ms in zip(rest.tokens, rest.repeat, rest.ms)]
    return rest


def speedups(ops: pd.DataFrame) -> pd.DataFrame:
    """The median over passes of each row's speedup, one column per token count."""
    table = speedup_samples(ops).pivot_table(index=KEYS, columns="tokens", values="speedup",
                                             aggfunc="median", sort=False)
    return table.dropna(axis=1, how="all")


def medians(ops: pd.DataFrame) -> pd.DataFrame:
    """One row per point: the median time over passes and the (exact) peak memory."""
    return _passes(ops).groupby(KEYS + ["tokens"], sort=False, as_index=False).agg(
        ms=("ms", "median"), peak_mib=("peak_mib", "max"))


def loglog_slope(x, y) -> float:
    if len(x) < 2:
        return float("nan")
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])


def slopes(ops: pd.DataFrame) -> pd.DataFrame:
    """Log-log slopes of time and peak memory against tokens, per row kind."""
    rows = []
    for key, g in medians(ops).groupby(KEYS, sort=False):
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


def share_backends(ops: pd.DataFrame) -> list[str]:
    """The backends whose cores have share goals: the device's fast one, and `compiled` where
    the run timed it."""
    fast = FAST_BACKEND[ops.device.iloc[0]]
    return [fast, *(["compiled"] if (ops.backend == "compiled").any() else [])]


def core_shares(ops: pd.DataFrame, operator: str, tokens: int,
                backend: str | None = None) -> pd.Series:
    """The operator's core on `backend` (default: the device's fast one) at `tokens`: its
    speedup in each pass over its FLOP bound."""
    backend = backend or FAST_BACKEND[ops.device.iloc[0]]
    rows = speedup_samples(ops)
    rows = rows[(rows.operator == operator) & (rows.backend == backend) & (rows.part == "core")
                & (rows.tokens == tokens)]
    return rows["speedup"].dropna() / flop_bound(operator, tokens, int(ops.head_dim.iloc[0]))


def flop_table(ops: pd.DataFrame, cfg) -> pd.DataFrame:
    """Per operator at goal_tokens: FLOP-ratio bound, the core's speedup on the fast backend
    (median over passes), the share of the bound it reaches (median, and its range over the
    passes) and the share it should reach; the same for the compiled core where it was timed."""
    rows, fast = [], FAST_BACKEND[ops.device.iloc[0]]
    for op in [o for o in ops.operator.unique() if o != "softmax"]:
        bound = flop_bound(op, cfg.goal_tokens, int(ops.head_dim.iloc[0]))
        row = {"operator": op, "FLOP bound": bound}
        for be in share_backends(ops):
            shares = core_shares(ops, op, cfg.goal_tokens, be)
            prefix = "" if be == fast else f"{be} "
            row.update({f"{prefix}speedup": shares.median() * bound if len(shares) else np.nan,
                        f"{prefix}share": shares.median() if len(shares) else np.nan,
                        f"{prefix}share range": _range(shares)})
        rows.append({**row, "goal": cfg.share_goal(op)})
    return _table(rows, "operator")


def _table(rows: list[dict], key: str) -> pd.DataFrame:
    """`rows` indexed by `key`; without rows (a softmax-only run) an empty table, not an error."""
    return (pd.DataFrame(rows) if rows else pd.DataFrame(columns=[key])).set_index(key)


def _range(values: pd.Series) -> str:
    return f"{values.min():.2f}-{values.max():.2f} ({len(values)})" if len(values) else ""


def goals(ops: pd.DataFrame, cfg) -> list[dict]:
    """The targets for each linear operator's core on the device's fast backend: its share of
    the FLOP bound at goal_tokens (median over passes), its memory slope, and on a GPU the
    Triton kernel against the PyTorch reference. A compiled core, where timed, has a share goal
    of its own (the same share)."""
    fast = FAST_BACKEND[ops.device.iloc[0]]
    sl, out = slopes(ops), []
    for op in [o for o in ops.operator.unique() if o != "softmax"]:
        key = (op, fast, "core")
        if key not in sl.index:
            continue
        bound, goal = (flop_bound(op, cfg.goal_tokens, int(ops.head_dim.iloc[0])),
                       cfg.share_goal(op))
        for be in share_backends(ops):
            shares = core_shares(ops, op, cfg.goal_tokens, be)
            if len(shares):
                out.append(_goal(f"{op}/{be} share of its FLOP bound ({bound:.1f}x) at "
                                 f"N={cfg.goal_tokens}", shares.median(), f">= {goal:g}",
                                 shares.median() >= goal, "", shares))
        row = sl.loc[key]
        out.append(_goal(f"{op}/{fast} memory slope, N={int(row['from'])}..{int(row['to'])}",
                         row.memory_slope, f"<= {cfg.goal_slope:g}",
                         row.memory_slope <= cfg.goal_slope, ""))
        if fast == "triton":
            out += _kernel_goals(ops, op, cfg)
    return out


def _kernel_goals(ops: pd.DataFrame, op: str, cfg) -> list[dict]:
    """On a GPU: the Triton kernel against the PyTorch reference, at N >= goal_tokens."""
    core = _passes(ops)
    core = core[(core.operator == op) & (core.part == "core") & (core.tokens >= cfg.goal_tokens)]
    t = core.pivot_table(index="tokens", columns="backend", values="ms", aggfunc="median")
    if not {"triton", "reference"} <= set(t.columns):
        return []
    ratio = t["reference"] / t["triton"]
    return [_goal(f"{op}/triton vs reference at N={n}", ratio[n],
                  f">= {cfg.goal_kernel_speedup:g}x", ratio[n] >= cfg.goal_kernel_speedup, "x")
            for n in t.index if not np.isnan(ratio[n])]


def _goal(name: str, value: float, target: str, holds: bool, unit: str,
          passes: pd.Series | None = None) -> dict:
    """A goal's row; `passes`: the values of each pass, whose median `value` is (their range is
    shown beside it when there are several)."""
    spread = (f" (range {passes.min():.2f}-{passes.max():.2f} over {len(passes)} passes)"
              if passes is not None and len(passes) > 1 else "")
    return {"goal": name, "measured": f"{value:.2f}{unit}{spread}", "target": target,
            "holds": "yes" if bool(holds) else "NO"}


def markdown(ops: pd.DataFrame, models: pd.DataFrame | None, measured: list[dict],
             cfg) -> str:
    """The ratio table, slopes, the goals as `goals` measured them, and model throughput."""
    sp = speedups(ops).map(lambda v: "" if np.isnan(v) else f"{v:.1f}x")
    sp.columns = [f"N={c}" for c in sp.columns]
    r = ops.iloc[0]
    passes = _passes(ops).repeat.nunique()
    parts = [f"## Speedup over softmax (SDPA), forward+backward, B={r.batch} H={r.heads} "
             f"d={r.head_dim}, measured in one run: the median of {passes} interleaved "
             "passes", "",
             "core: feature maps + global mixing (what SDPA does); mix: + the local conv.", "",
             to_markdown(sp),
             f"## FLOP-ratio bound and measured speedup at N={cfg.goal_tokens} (attention core, "
             "fast backend, and compiled where timed)", "",
             "FLOP bound: softmax's forward FLOPs over the operator's (see each operator's "
             "core_flops); share: speedup / bound, how efficiently the operator's FLOPs run "
             "compared with SDPA's (median over the passes; range: lowest-highest, and how "
             "many passes); goal: the share it should reach.", "",
             to_markdown(flop_table(ops, cfg).round(2)),
             "## Log-log slopes against tokens (1 = linear, 2 = quadratic)", "",
             to_markdown(slopes(ops).round(2)),
             "## Goals (attention core, fast backend, and compiled where timed)", "",
             to_markdown(_table(measured, "goal"))]
    if models is not None and len(models):
        parts += [f"## Whole-model inference, images/s (batch {cfg.models.batch})", "",
                  to_markdown(_model_table(models))]
    return "\n".join(parts)


def _model_table(models: pd.DataFrame) -> pd.DataFrame:
    t = models.pivot_table(index=["size", "operator"], columns="resolution", values="images_per_s",
                           sort=False)
    t.columns = [f"{c}px" for c in t.columns]
    return t.round(2)
