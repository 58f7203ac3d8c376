"""Benchmark plots: time and memory against tokens, each core's speedup beside its FLOP bound
and share of it, model throughput against resolution."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from linvit.render.plotting import new_figure, plt, save


def _line_style(operator: str, backend: str, part: str, colour) -> dict:
    """Colour: operator; line: backend (dotted reference, dashed SDPA); marker: part."""
    styles = {"reference": ":", "sdpa": "--"}
    label = operator if backend in ("torch", "sdpa", "triton") else f"{operator} ({backend})"
    return {"marker": "o" if part == "core" else "x", "ms": 3, "color": colour,
            "linestyle": styles.get(backend, "-"),
            "label": label if part == "core" else f"{label} + local"}


def operator_scaling(ops: pd.DataFrame, stem: Path) -> None:
    fig, (ax_t, ax_m) = new_figure(2, width=4.6)
    colours = dict(zip(dict.fromkeys(ops.operator), plt.get_cmap("tab10").colors))
    for (op, be, part), g in ops.groupby(["operator", "backend", "part"], sort=False):
        g = g.sort_values("tokens")
        style = _line_style(op, be, part, colours[op])
        ax_t.plot(g.tokens, g.ms, **style)
        ax_m.plot(g.tokens, g.peak_mib, **style)
    for ax, label in ((ax_t, "forward+backward time (ms)"), (ax_m, "peak memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens N")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend(fontsize=7)
    fig.suptitle(f"token mixing, B={ops.batch.iloc[0]} H={ops.heads.iloc[0]} "
                 f"d={ops.head_dim.iloc[0]} ({ops.device.iloc[0]})", fontsize=9)
    save(fig, stem)


def share_of_bound(ops: pd.DataFrame, cfg, stem: Path) -> None:
    """At goal_tokens, per operator: the core's speedup over softmax (median over passes, bars
    from the lowest to the highest pass) beside its FLOP-ratio bound, and the share of the bound
    it reaches against its goal."""
    from linvit.bench.ratios import core_shares, flop_bound

    names = [o for o in dict.fromkeys(ops.operator) if o != "softmax"]
    head_dim = int(ops.head_dim.iloc[0])
    fig, (ax_s, ax_f) = new_figure(2, width=max(4.0, 0.6 * len(names) + 1.5))
    for i, op in enumerate(names):
        shares = core_shares(ops, op, cfg.goal_tokens)
        bound = flop_bound(op, cfg.goal_tokens, head_dim)
        if not len(shares):
            continue
        for ax, values in ((ax_s, shares * bound), (ax_f, shares)):
            mid = values.median()
            ax.bar(i, mid, color="tab:blue", alpha=0.7,
                   yerr=[[mid - values.min()], [values.max() - mid]], capsize=3)
        ax_s.plot(i, bound, "k_", ms=14, mew=2, label="FLOP bound" if i == 0 else None)
        ax_f.plot(i, cfg.share_goal(op), "r_", ms=14, mew=2, label="goal" if i == 0 else None)
    for ax, label in ((ax_s, f"speedup over softmax at N={cfg.goal_tokens}"),
                      (ax_f, "share of the FLOP bound")):
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    ax_s.set_yscale("log")
    save(fig, stem)


def model_throughput(models: pd.DataFrame, stem: Path) -> None:
    sizes = list(dict.fromkeys(models["size"]))
    fig, axes = new_figure(len(sizes))
    for ax, size in zip(axes, sizes):
        for op, g in models[models["size"] == size].groupby("operator", sort=False):
            g = g.sort_values("resolution")
            ax.plot(g.resolution, g.images_per_s, marker="o", ms=3, label=op)
        ax.set_yscale("log")
        ax.set_xlabel("image side (px)")
        ax.set_ylabel("images / s (inference)")
        ax.set_title(size, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    save(fig, stem)
