"""Fine-tuning settings chosen on the validation split (linvit.workflow.selection): the choice,
which the workflow's `choose` step writes as the YAML its cells read first, and the report's
selection table.

A candidate is complete when every one of its jobs (one per operator of the choice) finished;
the chosen one is the complete candidate with the best mean validation top-1, the first in the
grid's order on a tie. A choice with no complete candidate is an error naming the failed jobs:
its cells cannot run on a setting nobody measured.
"""
from __future__ import annotations

import math

import pandas as pd

from linvit.errors import ResultsError
from linvit.io import write_yaml
from linvit.report.grid import Grid
from linvit.trees import unflatten

CAPTION = ("Fine-tuning settings chosen on the validation split: each candidate's validation "
           "top-1 (mean over the operators of the choice, one seed), the chosen one, and what "
           "the selection cost in training (all its candidates)")


def scores(records: list[dict]) -> dict[str, float | None]:
    """candidate -> mean validation top-1 over its jobs (None: one of them did not finish)."""
    by: dict[str, list] = {}
    for r in records:
        value = (r.get("metrics") or {}).get("top1") if r["status"] == "ok" else None
        by.setdefault(r["key"]["candidate"], []).append(value)
    return {c: (None if any(v is None or not math.isfinite(v) for v in values)
                else sum(values) / len(values)) for c, values in by.items()}


def best(measured: dict[str, float | None], order: list[str]) -> str | None:
    complete = [c for c in order if measured.get(c) is not None]
    return max(complete, key=lambda c: measured[c], default=None)   # max keeps the first tie


def choose(records: list[dict], grid: Grid, out) -> str:
    """Write the chosen candidate's settings to `out` (YAML); its label."""
    order = [label for label, _ in grid.selection.get("candidates", [])]
    measured = scores(records)
    chosen = best(measured, order)
    if chosen is None:
        failed = [r["run_dir"] for r in records if r["status"] != "ok"]
        raise ResultsError(f"no candidate setting finished on every operator of this choice "
                           f"(failed: {', '.join(failed) or 'none recorded'}); fix them and rerun")
    settings = dict(grid.selection["candidates"])[chosen]
    write_yaml(out, unflatten(settings))
    return chosen


def selection_table(results: pd.DataFrame, grid: Grid) -> pd.DataFrame:
    runs = results[results["kind"] == "selection"]
    runs = runs.assign(family=["reference" if op == "softmax" else "students"
                               for op in runs["operator"]])
    candidates = grid.selection.get("candidates", [])
    choice = ["dataset", "teacher", "size", *grid.varying(), "init"]
    columns = [f"{label} ({', '.join(f'{k}={v}' for k, v in settings.items())})"
               for label, settings in candidates] + ["chosen", "training GFLOPs", "seconds"]
    rows, index = [], []
    for key, part in runs.groupby(choice + ["family"], sort=False, dropna=False):
        records = [{"key": {"candidate": r["candidate"]}, "status": r["status"],
                    "metrics": {"top1": r["top1"]}} for r in part.to_dict("records")]
        measured = scores(records)
        label = best(measured, [c for c, _ in candidates])
        flops = part["train_flops"].sum() / 1e9 if "train_flops" in part else float("nan")
        rows.append([("failed" if measured.get(c, 0) is None else "missing" if c not in measured
                      else f"{measured[c]:.2f}") for c, _ in candidates]
                    + [label or "none (no candidate finished)", f"{flops:.4g}",
                       f"{part['train_time_s'].sum():.0f}"])
        index.append(key)
    return pd.DataFrame(rows, columns=columns, index=pd.MultiIndex.from_tuples(
        index, names=choice + ["family"]) if index else pd.MultiIndex.from_arrays(
        [[]] * (len(choice) + 1), names=choice + ["family"]))


def run_step(a) -> None:
    from linvit.report.grid import read_grid
    from linvit.report.record import read_records

    choose(read_records(a.records), read_grid(a.grid), a.out)
