"""Result figures, each a pure function of a data frame (PNG and PDF).

    accuracy_by_init     test top-1 by init strategy, a panel per student (the paper's main figure)
    time_to_accuracy     test top-1 against training compute, a panel per student (distillation
                         included)
    distill_layers       per-layer relative attention error over the distillation's epochs, a
                         panel per distillation, the references in its operator as lines
    claims               a forest plot: each claim's paired contrast per student with its 95% CI,
                         the pooled estimates and the threshold (linvit.report.claims)

One colour per init strategy in every figure (render.plotting.colours), one legend per figure,
outside its panels; PNG and PDF.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.ticker import MaxNLocator, NullFormatter

from linvit.render.plotting import colours, legend_below, new_figure, new_grid, save
from linvit.render.tables import rank, rows_where, summarize
from linvit.report.grid import Grid


def _ok(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["status"] == "ok"] if "status" in frame else frame


def _title(names: list[str], values, builtin: int = 3) -> str:
    """"dataset / teacher / size" and then "axis=value" for each config axis of the group."""
    parts = [str(v) for v in values[:builtin] if not pd.isna(v)]
    return " / ".join(parts + [f"{n}={v}" for n, v in zip(names[builtin:], values[builtin:])])


def _student_panels(frame: pd.DataFrame, grid: Grid) -> list[tuple]:
    """(group values, operator) of each panel: one per student, the softmax reference not one
    of them (it is a line in its group's panels)."""
    keys = [k for k in dict.fromkeys(zip(*(frame[c] for c in grid.student)))
            if k[-1] != "softmax"]
    return sorted(keys, key=lambda k: tuple(rank(grid.orders.get(c), v)
                                            for c, v in zip(grid.student, k)))


def _student_figure(cells: pd.DataFrame, grid: Grid):
    """A panel per student and the grid's colour per strategy: (panels, fig, axes, colour)."""
    panels = _student_panels(cells, grid)
    fig, axes = new_grid(len(panels))
    return panels, fig, axes, colours(grid.orders.get("init", []))


def accuracy_by_init(results: pd.DataFrame, grid: Grid, out: Path) -> None:
    """Test top-1 by init strategy, one panel per (dataset, teacher, size, axes, operator): a
    horizontal bar per strategy (its colour the same in every figure) with its 95% CI, the
    teacher dashed and the softmax reference dotted."""
    results, group = grid.complete(results), grid.group
    cells = _ok(grid.main(results))
    panels, fig, axes, colour = _student_figure(cells, grid)
    handles, labels = [], []
    for ax, panel in zip(axes, panels):
        part = rows_where(cells, grid.student, panel)
        inits = [i for i in grid.orders["init"] if i in set(part["init"])]
        stats = [summarize(part[part["init"] == i]["top1"].astype(float).tolist()) for i in inits]
        ax.barh(range(len(inits)), [s[0] for s in stats], 0.75, xerr=[s[1] or 0 for s in stats],
                capsize=2, color=[colour.get(i, "grey") for i in inits])
        where = rows_where(results, group, panel[:-1])
        reference = _ok(grid.main(where))
        lines = {"softmax teacher": (_ok(where[where["kind"] == "teacher"])["top1"], "--"),
                 "softmax reference (copy_all)": (
                     reference[reference["operator"] == "softmax"]["top1"], ":")}
        for label, (values, style) in lines.items():
            if len(values):
                handles.append(ax.axvline(float(values.astype(float).mean()), color="k",
                                          ls=style, lw=1))
                labels.append(label)
        ax.set_yticks(range(len(inits)), inits, fontsize=7)
        ax.set_ylim(len(inits) - 0.5, -0.5)
        ax.set_xlabel("test top-1 (%)", fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_title(f"{panel[-1]}\n{_title(group, panel[:-1])}", fontsize=8)
    legend_below(fig, handles, labels)
    save(fig, out)


def time_to_accuracy(curves: pd.DataFrame, grid: Grid, out: Path) -> None:
    """Test top-1 against training FLOPs (distillation included), one panel per (dataset,
    teacher, size, axes, operator): a line per strategy (its colour the same in every figure;
    a loss design of the sub-grid dashed), the mean over seeds at each evaluation with its 95%
    CI as a band, and the target (95% of the teacher) dotted."""
    from linvit.report.cost import TARGET

    curves, group = grid.complete(curves), grid.group
    cells = curves[curves["kind"] == "cell"]
    teachers = curves[curves["kind"] == "teacher"]
    panels, fig, axes, colour = _student_figure(cells, grid)
    handles, labels = [], []
    for ax, panel in zip(axes, panels):
        part = rows_where(cells, grid.student, panel)
        teacher = rows_where(teachers, group, panel[:-1]).sort_values("epoch")
        if len(teacher):
            handles.append(ax.axhline(TARGET * float(teacher["test_top1"].iloc[-1]), color="grey",
                                      ls=":", lw=1))
            labels.append(f"{TARGET:.0%} of the teacher")
        for (init, loss), run in part.groupby(["init", "loss"], sort=False, dropna=False):
            points = [(g["flops"].mean() / 1e9, *summarize(g["test_top1"].astype(float).tolist()))
                      for _, g in run.groupby("epoch")]
            xs, means = [p[0] for p in points], [p[1] for p in points]
            cis = [p[2] or 0.0 for p in points]
            main = loss in ("none", grid.main_loss)
            label = init if main else f"{init} [{loss}]"
            (line,) = ax.plot(xs, means, marker="o", ms=3, color=colour.get(init, "grey"),
                              ls="-" if main else "--")
            ax.fill_between(xs, [m - c for m, c in zip(means, cis)],
                            [m + c for m, c in zip(means, cis)], color=line.get_color(),
                            alpha=0.12)
            handles.append(line)
            labels.append(label)
        ax.set_xlabel("training GFLOPs (distillation included)", fontsize=7)
        ax.set_ylabel("test top-1 (%)", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(4))
        ax.tick_params(labelsize=7)
        ax.set_title(f"{panel[-1]}\n{_title(group, panel[:-1])}", fontsize=8)
    order = {i: n for n, i in enumerate(grid.orders.get("init", []))}
    pairs = sorted(zip(labels, handles), key=lambda p: order.get(p[0].split(" [")[0], -1))
    legend_below(fig, [h for _, h in pairs], [label for label, _ in pairs])
    save(fig, out)


def distill_layers(layers: pd.DataFrame, grid: Grid, out: Path) -> None:
    """The relative attention-output error per layer (teacher-forced, held-out images), a panel
    per distillation: before its first step, after each evaluated epoch (lighter to darker) and
    at the end, with the two references in its operator as lines: its attention new (dashed)
    and the teacher's softmax weights copied into it (dotted)."""
    from matplotlib import colormaps

    from linvit.report.distillation import distill_key

    key = distill_key(grid)
    errors = layers[layers["metric"] == "rel_err"]
    panels = list(dict.fromkeys(zip(*(errors[k] for k in key))))
    fig, axes = new_grid(len(panels))
    handles, labels = [], []
    for ax, panel in zip(axes, panels):
        part = rows_where(errors, key, panel)
        epochs = sorted(part[part["phase"] == "epoch"]["epoch"].dropna().unique())
        ramp = colormaps["viridis"]
        curves = [("before", "before distillation", ramp(0.0), "-")]
        curves += [(("epoch", e), f"after epoch {e}", ramp((i + 1) / (len(epochs) + 1)), "-")
                   for i, e in enumerate(epochs)]
        curves += [("random", "ref.: new attention", "grey", "--"),
                   ("copied", "ref.: copied softmax", "k", ":")]
        for phase, label, colour, style in curves:
            rows = (part[(part["phase"] == "epoch") & (part["epoch"] == phase[1])]
                    if isinstance(phase, tuple) else part[part["phase"] == phase])
            if rows.empty:
                continue
            rows = rows.sort_values("layer")
            handles += ax.plot(rows["layer"], rows["value"], marker="o", ms=3, color=colour,
                               ls=style)
            labels.append(label)
        ax.set_yscale("log")
        ax.yaxis.set_minor_formatter(NullFormatter())        # log minor labels crowd the axis
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("layer", fontsize=8)
        ax.set_ylabel("relative attention-output error", fontsize=7)
        ax.tick_params(labelsize=7)
        *where, op, loss = panel
        ax.set_title(f"{op} [{loss}]\n{_title(key[:-2], where)}", fontsize=8)
    legend_below(fig, handles, labels)
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
        ax.xaxis.set_major_locator(MaxNLocator(3, prune="both"))   # no label at a panel's edge
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
