"""Time to accuracy in portable units: the training each init strategy needs to reach a target.

The target of a student (dataset, teacher, size, operator) is TARGET of its teacher's test top-1.
Per seed, a strategy's cost is that of the first evaluation at or above the target on its curve
(curves.csv: images seen, FLOPs and seconds, distillation included); the table gives the mean over
seeds where every seed got there, and says "not reached within the budget" otherwise. The last
column answers the paper's practical question: the strategy's FLOPs as a share of what `random`
needed, or an upper bound on it where random did not get there on every seed (a seed that never
got there counts with its whole training, less than it would need). Failed or missing seeds
count in "reached" as seeds that did not get there. "Last gain" says whether the curves had
levelled off: the mean over seeds of the top-1 gained between the last two evaluations, and the
epochs between them.
"""
from __future__ import annotations

import pandas as pd

from linvit.render.tables import rank
from linvit.report.grid import Grid

TARGET = 0.95                # of the teacher's test top-1
BASELINE = "random"
METHOD = (
    "Each student's training cost is counted in images seen and in FLOPs (matrix products of "
    "the model, each operator's core from its `core_flops`, a training step as 3 forwards; "
    "distillation included for distilled students), with the local seconds beside them. The "
    f"target is {TARGET:.0%} of the teacher's test top-1; a strategy's cost is that of its first "
    "evaluation at or above it, averaged over seeds where every seed reached it. \"FLOPs vs "
    "random\" is the strategy's cost as a share of what random init needed (an upper bound "
    "where random did not get there within its training). \"Last gain\" is the top-1 the "
    "curves gained between their last two evaluations (mean over seeds): near 0, more training "
    "of this kind would change little.\n")
COLUMNS = ["target", "reached", "images", "FLOPs", "seconds", "best top-1", "FLOPs vs random",
           "last gain"]


def teacher_top1(results: pd.DataFrame, group: list[str]) -> dict[tuple, float]:
    teachers = results[(results["kind"] == "teacher") & (results["status"] == "ok")]
    return {key: float(rows["top1"].mean())
            for key, rows in teachers.groupby(group, dropna=False)}


def first_reached(run: pd.DataFrame, target: float) -> pd.Series | None:
    """The first evaluation of one job's curve at or above the target."""
    hits = run[run["test_top1"] >= target].sort_values("epoch")
    return None if hits.empty else hits.iloc[0]


def strategy_cost(runs: pd.DataFrame, target: float, jobs: int) -> dict:
    """Mean cost over seeds to reach the target, or why there is none. `jobs`: the grid's seeds
    of this strategy, failed and missing ones included (they have no curve). `floor`: the mean
    over seeds of the cost to the target or, where a seed never got there, its whole training:
    what the strategy needs at least."""
    seeds = list(runs.groupby("seed"))
    hits = [first_reached(run, target) for _, run in seeds]
    last = [run.sort_values("epoch").iloc[-1] for _, run in seeds]
    out = {"n": max(jobs, len(seeds)), "ran": len(seeds),
           "reached": sum(h is not None for h in hits),
           "best": sum(run["test_top1"].max() for _, run in seeds) / max(len(seeds), 1),
           "floor": sum((h if h is not None else r)["flops"]
                        for h, r in zip(hits, last)) / max(len(seeds), 1),
           "last_gain": last_gain([run for _, run in seeds])}
    if out["reached"] == out["n"]:
        for unit in ("images", "flops", "compute_s"):
            out[unit] = sum(h[unit] for h in hits) / len(hits)
    return out


def last_gain(runs: list[pd.DataFrame]) -> str:
    """The mean over runs of the top-1 gained between each run's last two evaluations, with the
    epochs between them ("" where a run has fewer than 2)."""
    tails = [run.sort_values("epoch").tail(2) for run in runs]
    if not tails or any(len(t) < 2 for t in tails):
        return ""
    gain = sum(t["test_top1"].iloc[1] - t["test_top1"].iloc[0] for t in tails) / len(tails)
    spans = sorted({(int(t["epoch"].iloc[0]), int(t["epoch"].iloc[1])) for t in tails})
    return f"{gain:+.2f} (epochs {', '.join(f'{a}-{b}' for a, b in spans)})"


def time_to_target(results: pd.DataFrame, curves: pd.DataFrame, grid: Grid) -> pd.DataFrame:
    """Rows: student (grid.student) x init strategy of the main loss; columns: COLUMNS."""
    results, curves = grid.complete(results), grid.complete(curves)
    student, group = grid.student, grid.group
    targets = teacher_top1(results, group)
    main = grid.main(results)
    jobs = main.groupby(student + ["init"], dropna=False).size()    # seeds, with failed ones
    cells = grid.main(curves)
    cells = cells[cells["operator"] != "softmax"]
    rows, index = [], []
    for key, part in cells.groupby(student, sort=False, dropna=False):
        teacher = targets.get(tuple(key[:len(group)]))
        if teacher is None:
            continue
        target = TARGET * teacher
        costs = {init: strategy_cost(runs, target, int(jobs.get((*key, init), 0)))
                 for init, runs in part.groupby("init", sort=False)}
        base = costs.get(BASELINE)
        for init in sorted(costs, key=lambda i: rank(grid.orders.get("init"), i)):
            index.append((*key, init))
            rows.append(_row(costs[init], base, target, init == BASELINE))
    return pd.DataFrame(rows, columns=COLUMNS, index=pd.MultiIndex.from_tuples(
        index, names=student + ["init"]))


def _row(cost: dict, base: dict | None, target: float, is_base: bool) -> list:
    reached = cost["reached"] == cost["n"]
    head = [f"{target:.2f}", f"{cost['reached']}/{cost['n']} seeds"]
    if not reached:
        why = ("not reached within the budget" if cost["ran"] == cost["n"] else
               f"{cost['n'] - cost['ran']} of {cost['n']} seeds failed or missing")
        return head + [why, "", "", f"{cost['best']:.2f}", "", cost["last_gain"]]
    share = ""
    if not is_base and base is not None:
        if base["reached"] == base["n"] and base["flops"] == 0:
            share = "random: at the target untrained"
        elif base["reached"] == base["n"]:
            share = f"{cost['flops'] / base['flops']:.2f}"
        elif base["floor"]:
            share = f"< {cost['flops'] / base['floor']:.2f} (random: not reached)"
    return head + [f"{cost['images']:.0f}", f"{cost['flops']:.3g}", f"{cost['compute_s']:.1f}",
                   f"{cost['best']:.2f}", share, cost["last_gain"]]
