"""The distillation-quality table: how far each distillation brought its student's attention to
the teacher's (linvit.transfer.quality), against the two references in its operator, and what
the distilled model does on its own and after fine-tuning.

Rows: one per distillation (dataset, teacher, size, the varying teacher and distill axes,
operator, loss design). Columns: the relative attention-output error, mean over distilled
layers, before the first step, at the end, and for the references (the operator's attention new;
the teacher's Q/K/V/proj copied into it); the map KL at the end (operators with row-stochastic
maps); the distilled model run free against the teacher (logit KL, top-1 agreement, its top-1);
and how far the fine-tuned students' attention moved from it (mean over layers, seeds and the
cells that take it). Where a grid replicates its distillations per seed, each number is the
mean over the seeds.
"""
from __future__ import annotations

import pandas as pd

from linvit.render.tables import rank
from linvit.report.grid import Grid

PHASES = {"before": "rel. error before", "end": "rel. error after",
          "random": "ref.: new attention", "copied": "ref.: copied softmax"}
CAPTION = ("Distillation quality: teacher-forced relative attention-output error (mean over "
           "layers) before and after distillation and of the two references in the student's "
           "operator; map KL after; the distilled model run free against the teacher; how far "
           "fine-tuning moved its attention")


def distill_key(grid: Grid) -> list[str]:
    """What names one distillation in the report's groupings."""
    return ["dataset", "teacher", "size", *grid.varying(("teacher", "distill")), "operator",
            "loss"]


def _fmt(value, digits: int = 3) -> str:
    return "" if value is None or pd.isna(value) else f"{value:.{digits}g}"


def quality_table(results: pd.DataFrame, layers: pd.DataFrame, grid: Grid) -> pd.DataFrame:
    key = distill_key(grid)
    distills = results[results["kind"] == "distill"]
    cells = results[(results["kind"] == "cell") & (results["status"] == "ok")]
    rows, index = [], []
    ordered = sorted({tuple(k) for k in distills[key].itertuples(index=False)},
                     key=lambda k: tuple(rank(grid.orders.get(c), v) for c, v in zip(key, k)))
    for values in ordered:
        index.append(values)
        replicas = _where(distills, key, values)          # one per seed, where replicated
        if (replicas["status"] != "ok").any():   # failed (or missing): said in every column
            rows.append([replicas["status"][replicas["status"] != "ok"].iloc[0]]
                        * (len(PHASES) + 5))
            continue
        mine = _where(layers, key, values)
        error = mine[mine["metric"] == "rel_err"].groupby("phase")["value"].mean()
        kl = mine[(mine["metric"] == "map_kl") & (mine["phase"] == "end")]["value"]
        free = replicas.mean(numeric_only=True)
        moved = _where(cells, key, values)["attn_moved"].dropna() \
            if "attn_moved" in cells else pd.Series(dtype=float)
        rows.append([_fmt(error.get(p)) for p in PHASES]
                    + [_fmt(kl.mean() if len(kl) else None), _fmt(free.get("free_logit_kl")),
                       _fmt(free.get("free_agreement"), 4), _fmt(free.get("free_top1"), 4),
                       _fmt(moved.mean() if len(moved) else None)])
    columns = [*PHASES.values(), "map KL after", "logit KL (free)", "top-1 agreement (free)",
               "top-1 (free)", "attn moved in fine-tuning"]
    return pd.DataFrame(rows, columns=columns,
                        index=pd.MultiIndex.from_tuples(index, names=key) if index
                        else pd.MultiIndex.from_arrays([[]] * len(key), names=key))


def _where(frame: pd.DataFrame, names: list[str], values) -> pd.DataFrame:
    mask = pd.Series(True, index=frame.index)
    for name, value in zip(names, values):
        mask &= frame[name].astype(str) == str(value)
    return frame[mask]
