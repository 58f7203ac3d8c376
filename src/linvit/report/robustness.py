"""The robustness results: table, figure and robustness.md, from the robustness jobs' records.

Rows: each teacher, then each cell (operator, init strategy, loss design), mean ± 95% CI over
seeds. Columns: clean test top-1; ImageNet-C-style corruptions (made here, not the official
files: see linvit.robustness.corruptions) as the mean over corruption types and severities, the
share of the clean accuracy it keeps (on the same images), and its difference from the teacher's;
then top-1 on each ImageNet shift set scored. A job that failed or has not run reads
"failed" / "missing", as in every table.
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from linvit.io import write_text
from linvit.render.plotting import colours, legend_below, new_figure, save
from linvit.render.tables import cell_text, rank, rows_where, to_markdown, write_table
from linvit.report.collect import unique_keys
from linvit.report.grid import Grid

TEACHER = "teacher"
CAPTION = ("Robustness: clean test top-1, ImageNet-C-style corruptions (mean over types and "
           "severities; kept: % of the clean accuracy on the same images; vs teacher: points) "
           "and ImageNet shift sets (%)")


def _key(grid: Grid) -> list[str]:
    """A scored model's key: a cell's (a teacher's with init "teacher"), and the config axes."""
    return [k for k in grid.key if k not in ("kind", "task")]


def robustness_frame(records: list[dict], grid: Grid) -> pd.DataFrame:
    """One row per scored model: its key, status and scalar results; expected cells without a
    record as missing. One record per key: two are an error naming both."""
    key = _key(grid)
    unique_keys(records, key, "robustness records")
    rows = []
    for r in records:
        row = {**{k: r["key"].get(k) for k in key}, "status": r["status"]}
        m = r.get("metrics") or {}
        row["clean"] = m.get("top1")
        c = m.get("corruptions") or {}
        if c:
            row.update(corruption_mean=c["mean"], corruption_kept=100 * c["mean"] / c["clean"]
                       if c["clean"] else None, clean_subset=c["clean"])
            row.update({f"severity_{s}": _severity_mean(c, s) for s in _severities(c)})
        row.update({f"shift_{k}": v for k, v in (m.get("shifts") or {}).items()})
        rows.append(row)
    seen = {tuple(row[k] for k in key) for row in rows}
    for cell in grid.cells:
        if tuple(cell.get(k) for k in key) not in seen:
            rows.append({**{k: cell.get(k) for k in key}, "status": "missing"})
    return pd.DataFrame(rows, columns=list(dict.fromkeys(key + ["status"] + [
        k for row in rows for k in row])))


def _severities(c: dict) -> list[str]:
    return sorted({s for sets in c["sets"].values() for s in sets}, key=int)


def _severity_mean(c: dict, severity: str) -> float:
    values = [sets[severity] for sets in c["sets"].values() if severity in sets]
    return sum(values) / len(values)


def shift_titles(records: list[dict]) -> dict[str, str]:
    """Each shift set's title, as the robustness jobs recorded it beside its score."""
    return {k: v for r in records for k, v in ((r.get("metrics") or {}).get("shift_titles")
                                               or {}).items()}


def robustness_table(frame: pd.DataFrame, grid: Grid,
                     titles: dict[str, str] | None = None) -> pd.DataFrame:
    frame, titles = _with_teacher_difference(grid.complete(frame), grid.group), titles or {}
    columns = [("clean", "clean")]
    if "corruption_mean" in frame:
        columns += [("corruption_mean", "corruptions"), ("corruption_kept", "kept %"),
                    ("vs_teacher", "vs teacher")]
    columns += [(c, titles.get(c.removeprefix("shift_"), c.removeprefix("shift_")))
                for c in frame.columns if c.startswith("shift_")]
    rows, index = [], []
    for key, rows_of in _model_groups(frame, grid):
        rows.append([cell_text(rows_of, column) for column, _ in columns])
        index.append(key)
    return pd.DataFrame(rows, columns=[title for _, title in columns],
                        index=pd.MultiIndex.from_tuples(index, names=[*grid.group, "model"]))


def _with_teacher_difference(frame: pd.DataFrame, group: list[str]) -> pd.DataFrame:
    """vs_teacher: a model's mean corruption accuracy minus its teacher model's (same dataset,
    teacher, size and config axes)."""
    if "corruption_mean" not in frame:
        return frame
    keys = frame[group].fillna("")          # an empty key matches an empty key
    ok_teacher = (frame["init"] == TEACHER) & (frame["status"] == "ok")
    base = frame[ok_teacher].groupby([keys[k][ok_teacher] for k in group])["corruption_mean"]
    base = base.mean()
    pairs = zip(*(keys[k] for k in group))
    frame = frame.copy()
    frame["vs_teacher"] = [m - base.get(k, float("nan")) for m, k in
                           zip(frame["corruption_mean"], pairs)]
    return frame


def _model_groups(frame: pd.DataFrame, grid: Grid):
    """((group..., model label), rows over seeds), teacher first, then grid order."""
    orders, group = grid.orders, grid.group
    order = {"init": [TEACHER] + orders.get("init", []),
             "operator": orders.get("operator", []), "loss": orders.get("loss", [])}
    names = group + ["operator", "init", "loss"]
    keys = sorted({tuple(k) for k in frame[names].itertuples(index=False)},
                  key=lambda k: (*(rank(orders.get(n), v) for n, v in zip(group, k)),
                                 k[-2] != TEACHER, rank(order["operator"], k[-3]),
                                 rank(order["init"], k[-2]), rank(order["loss"], k[-1])))
    for key in keys:
        *where, op, init, loss = key
        label = "softmax teacher" if init == TEACHER else f"{op} {init}" + (
            "" if loss in ("none", grid.main_loss) else f" ({loss})")
        yield (*where, label), rows_where(frame, names, key)


def robustness_figure(frame: pd.DataFrame, grid: Grid, out: Path) -> None:
    """Mean accuracy over corruption types against severity (0: clean, same images), one panel
    per operator with a line per init strategy, the teacher dashed in every panel; the first
    group of the grid (dataset / teacher / size / config axes; the table has them all)."""
    orders, group = grid.orders, grid.group
    severities = sorted(int(c.split("_")[1]) for c in frame.columns if c.startswith("severity_"))
    ok = grid.complete(frame[frame["status"] == "ok"])
    groups = sorted({tuple(k) for k in ok[group].itertuples(index=False)},
                    key=lambda k: tuple(rank(orders.get(n), v) for n, v in zip(group, k)))
    ok = rows_where(ok, group, groups[0] if groups else ())
    operators = [o for o in orders.get("operator", []) if o in set(ok["operator"])
                 and o != "softmax"] or ["softmax"]
    fig, axes = new_figure(len(operators), width=3.6)
    xs = [0, *severities]

    def curve(rows):
        return [rows["clean_subset"].mean(), *(rows[f"severity_{s}"].mean() for s in severities)]
    teacher = ok[ok["init"] == TEACHER]
    where = "".join(f", {n}={v}" for n, v in zip(group[3:], groups[0][3:] if groups else ()))
    colour, handles, labels = colours(orders.get("init", [])), [], []
    for ax, op in zip(axes, operators):
        if len(teacher) and severities:
            handles += ax.plot(xs, curve(teacher), "k--")
            labels.append("softmax teacher")
        cells = ok[(ok["operator"] == op) & (ok["init"] != TEACHER)]
        for init, rows in sorted(cells.groupby("init"), key=lambda g: rank(orders.get("init"),
                                                                          g[0])):
            if severities:
                handles += ax.plot(xs, curve(rows), marker="o", ms=3,
                                   color=colour.get(init, "grey"))
                labels.append(init)
        ax.set(title=op + where, xlabel="severity (0: clean)", ylabel="top-1 (%)", xticks=xs)
    legend_below(fig, handles, labels)
    save(fig, out)


def write_robustness(records: list[dict], grid: Grid, tables_dir: Path, figures_dir: Path,
                     out: Path) -> pd.DataFrame:
    frame = robustness_frame(records, grid)
    table = robustness_table(frame, grid, shift_titles(records))
    write_table(table, Path(tables_dir) / "robustness", CAPTION)
    robustness_figure(frame, grid, Path(figures_dir) / "robustness")
    rel = os.path.relpath(Path(figures_dir) / "robustness.png", Path(out).parent)
    write_text(out, "\n".join(["## Robustness\n", CAPTION + ".\n", _provenance(records),
                               to_markdown(table), f"![robustness]({rel})\n"]) + "\n")
    return table


def _provenance(records: list[dict]) -> str:
    """What the corruption numbers are: library, sets, images (from the first scored model)."""
    for r in records:
        c = ((r.get("metrics") or {}).get("corruptions")) or {}
        if c:
            names = ", ".join(c["sets"])
            return (f"Corruptions: {len(c['sets'])} types x {len(_severities(c))} severities "
                    f"({names}) on a fixed subset of {c['samples']} test images, made on the fly "
                    "with imagecorruptions (ImageNet-C-style: not the official ImageNet-C files, "
                    "so not comparable with published ImageNet-C numbers).\n")
    return "No corruption results.\n"


def run_step(a) -> None:
    from linvit.report.grid import read_grid
    from linvit.report.record import read_records

    write_robustness(read_records(a.records), read_grid(a.grid), Path(a.tables),
                     Path(a.figures), Path(a.out))
