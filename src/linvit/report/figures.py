"""Result figures, each a pure function of a data frame (PNG and PDF).

    accuracy_by_init     test top-1 by init strategy, one bar per operator (the paper's main figure)
    time_to_accuracy     test top-1 against training compute of the student (distillation included)
    distill_layers       per-layer distillation losses and relative attention error, after
                         distillation, teacher-forced on held-out images
    claims               each claim's paired contrast per student with its 95% CI, the pooled
                         estimate and the threshold (linvit.report.claims)
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from linvit.render.plotting import new_figure, save
from linvit.render.tables import rows_where, summarize
from linvit.report.grid import Grid


def _ok(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["status"] == "ok"] if "status" in frame else frame


def _panels(frame: pd.DataFrame, group: list[str]) -> list[tuple]:
    return list(dict.fromkeys(zip(*(frame[k] for k in group))))


def _title(names: list[str], values, builtin: int = 3) -> str:
    """"dataset / teacher / size" and then "axis=value" for each config axis of the group."""
    parts = [str(v) for v in values[:builtin] if not pd.isna(v)]
    return " / ".join(parts + [f"{n}={v}" for n, v in zip(names[builtin:], values[builtin:])])


def accuracy_by_init(results: pd.DataFrame, grid: Grid, out: Path) -> None:
    results, group = grid.complete(results), grid.group
    cells = _ok(grid.main(results))
    panels = _panels(cells, group)
    fig, axes = new_figure(len(panels), width=7.5)
    for ax, panel in zip(axes, panels):
        part = rows_where(cells, group, panel)
        inits = [i for i in grid.orders["init"] if i in set(part["init"])]
        ops = [o for o in grid.orders["operator"] if o in set(part["operator"])]
        width = 0.8 / max(len(ops), 1)
        for j, op in enumerate(ops):
            stats = [summarize(part[(part["operator"] == op) & (part["init"] == i)]["top1"]
                               .astype(float).tolist() or [float("nan")]) for i in inits]
            xs = [k + (j - (len(ops) - 1) / 2) * width for k in range(len(inits))]
            ax.bar(xs, [s[0] for s in stats], width, label=op,
                   yerr=[s[1] or 0 for s in stats], capsize=2)
        teacher = _ok(rows_where(results[results["kind"] == "teacher"], group, panel))["top1"]
        if len(teacher):
            ax.axhline(float(teacher.mean()), color="k", ls="--", lw=1, label="softmax teacher")
        ax.set_xticks(range(len(inits)), inits, rotation=30, ha="right")
        ax.set_ylabel("test top-1 (%)")
        ax.set_title(_title(group, panel))
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    save(fig, out)


def time_to_accuracy(curves: pd.DataFrame, grid: Grid, out: Path) -> None:
    """Test top-1 against training FLOPs (distillation included), one panel per operator: the
    mean over seeds at each evaluation, with its 95% CI as a band."""
    from linvit.report.cost import TARGET

    curves, group = grid.complete(curves), grid.group
    cells = curves[curves["kind"] == "cell"]
    ops = [o for o in grid.orders["operator"] if o in set(cells["operator"])]
    teachers = curves[curves["kind"] == "teacher"].sort_values("epoch").groupby(group).last()
    fig, axes = new_figure(len(ops), width=4.4)
    for ax, op in zip(axes, ops):
        part = cells[cells["operator"] == op]
        groups = list(dict.fromkeys(zip(*(part[k] for k in group))))
        if len(groups) == 1 and groups[0] in teachers.index:     # one teacher: its target
            ax.axhline(TARGET * teachers.loc[groups[0], "test_top1"], color="grey", ls=":",
                       lw=1, label=f"{TARGET:.0%} of the teacher")
        several = len(groups) > 1
        for i, (key, run) in enumerate(part.groupby(group + ["init", "loss"], sort=False,
                                                    dropna=False)):
            *panel, init, loss = key
            points = [(g["flops"].mean() / 1e9,
                       *summarize(g["test_top1"].astype(float).tolist()))
                      for _, g in run.groupby("epoch")]
            xs, means, cis = ([p[0] for p in points], [p[1] for p in points],
                              [p[2] or 0.0 for p in points])
            label = (init if loss == "none" else f"{init} [{loss}]") + (
                f" ({_title(group, panel).replace(' / ', '/')})" if several else "")
            ax.plot(xs, means, marker="o", ms=3, color=f"C{i % 10}", label=label)
            ax.fill_between(xs, [m - c for m, c in zip(means, cis)],
                            [m + c for m, c in zip(means, cis)], color=f"C{i % 10}", alpha=0.15)
        ax.set_xlabel("student training GFLOPs (distillation included)")
        ax.set_ylabel("test top-1 (%)")
        ax.set_title(op)
        ax.legend(fontsize=6)
    save(fig, out)


def distill_layers(layers: pd.DataFrame, grid: Grid, out: Path) -> None:
    """One panel per quantity: the relative attention-output error (comparable across designs),
    then each distillation loss, per layer, on held-out images, teacher-forced; a line per
    distillation (its teacher model, teacher and distill axes, operator and loss design)."""
    group = ["dataset", "teacher", "size", *grid.varying(("teacher", "distill"))]
    metrics = ["rel_err"] + sorted(set(layers["metric"]) - {"rel_err"})
    fig, axes = new_figure(len(metrics), width=4.2)
    for ax, metric in zip(axes, metrics):
        part = layers[layers["metric"] == metric]
        for key, run in part.groupby(group + ["operator", "loss"], sort=False, dropna=False):
            *panel, op, loss = key
            run = run.sort_values("layer")
            where = _title(group, panel).replace(" / ", "/")
            ax.plot(run["layer"], run["value"], marker="o", ms=3,
                    label=f"{op} [{loss}] {where}")
        ax.set_xlabel("layer")
        ax.set_yscale("log")
        ax.set_title("relative attention-output error" if metric == "rel_err" else metric)
        ax.legend(fontsize=6)
    save(fig, out)


VERDICT_COLOURS = {"holds": "tab:green", "does not hold": "tab:red", "undecided": "tab:gray",
                   "no benefit to carry": "tab:olive"}


def _claim_rows(found: list, grid: Grid) -> list[str]:
    """(the forest plot's rows, each verdict's row): each student (operator, then its group's
    values), then each group's pooled estimate, in the order the verdicts came."""
    labels, axes = [], set(grid.varying())
    for v in found:
        where = ", ".join(f"{k}={v.where[k]}" if k in axes else str(v.where[k])
                          for k in grid.group if k in v.where)
        labels.append(f"{v.where['operator']} ({where})" if not v.is_pooled
                      else f"pooled ({where})")
    return list(dict.fromkeys(labels)), labels


def claims_figure(results: pd.DataFrame, grid: Grid, out: Path) -> None:
    """A forest plot: students as rows (each group's pooled estimate last), one panel per claim,
    each contrast's mean and 95% CI coloured by its verdict, the threshold dashed and the side
    on which the claim holds shaded; one legend, outside the panels."""
    import textwrap

    from linvit.report.claims import CLAIMS, margins_of, verdicts

    found = verdicts(results, grid)
    claims = [c for c in CLAIMS if any(v.claim is c for v in found)] or CLAIMS[:1]
    rows, labels = _claim_rows(found, grid)
    fig, axes = new_figure(len(claims), width=2.4, height=0.32 * len(rows) + 1.6)
    for ax, claim in zip(axes, claims):
        threshold = claim.threshold(margins_of(grid))
        for v, label in zip(found, labels):
            if v.claim is not claim or v.estimate is None:
                continue
            e, y = v.estimate, rows.index(label)
            err = None if e.half_width is None else [[e.half_width], [e.half_width]]
            ax.errorbar([e.mean], [y], xerr=err, fmt="D" if v.is_pooled else "o", ms=4,
                        color=VERDICT_COLOURS.get(v.verdict, "k"), capsize=2)
        ax.axvline(threshold, color="k", ls="--", lw=0.8)
        low, high = ax.get_xlim()
        span = (threshold, max(high, threshold + 1)) if claim.side == "above" else (
            min(low, threshold - 1), threshold)
        ax.axvspan(*span, color="tab:green", alpha=0.07, lw=0)
        ax.set_xlim(min(low, span[0]), max(high, span[1]))
        ax.set_yticks(range(len(rows)), rows if ax is axes[0] else [""] * len(rows), fontsize=7)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_title("\n".join(textwrap.wrap(f"{claim.finding} {claim.condition(margins_of(grid))}",
                                             28)), fontsize=7)
        ax.tick_params(axis="x", labelsize=7)
    handles = [plt_line(colour, verdict) for verdict, colour in VERDICT_COLOURS.items()]
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=4,
               fontsize=7, title="verdict (top-1 points; shaded: where the claim holds)",
               title_fontsize=7)
    save(fig, out)


def plt_line(colour: str, label: str):
    from matplotlib.lines import Line2D

    return Line2D([], [], color=colour, marker="o", ls="-", label=label)


def write_figures(results, curves, layers, grid: Grid, out_dir: str | Path) -> list[Path]:
    from linvit.report.paths import FIGURE_FORMATS, FIGURES  # what the workflow expects

    out_dir = Path(out_dir)
    drawn = {"accuracy_by_init": lambda path: accuracy_by_init(results, grid, path),
             "time_to_accuracy": lambda path: time_to_accuracy(curves, grid, path),
             "distill_layers": lambda path: distill_layers(layers, grid, path),
             "claims": lambda path: claims_figure(results, grid, path)}
    for name in FIGURES:
        drawn[name](out_dir / name)
    return [out_dir / f"{n}.{ext}" for n in FIGURES for ext in FIGURE_FORMATS]


def run_step(a) -> None:
    from linvit.report.files import read_csv
    from linvit.report.grid import read_grid

    grid = read_grid(a.grid)
    write_figures(read_csv(a.results, grid), read_csv(a.curves, grid), read_csv(a.layers, grid),
                  grid, a.out)
