"""Teacher vs distilled-student attention maps, drawn from the `linvit attention-maps` jobs' files.

Each job (linvit.transfer.maps) stores the head-mean maps of one model on the teacher's tokens
for a few test images and layers: maps.safetensors, tensor "maps" of shape (images, layers, N, N)
with the resolved layers in its metadata. This step reads those files (safetensors and numpy, no
model code) and draws one row per (image, layer), one column per model. Failed student jobs are
left out; a failed teacher job gives a figure that says so. Records and run folders are read
through report.record and runs.verify, whose code maps hold no model, data or operator file.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors import safe_open

from linvit.render.plotting import plt, save
from linvit.report.record import read_records
from linvit.runs.verify import verified_metrics


def read_maps(record: dict) -> tuple[np.ndarray, dict]:
    """(maps, metadata) of an "ok" maps record, its run folder verified against the checksums
    the run sealed it with; the maps file is the run's one output."""
    metrics = verified_metrics(record["run_dir"])
    if metrics is None or metrics["outputs"] != record["metrics"]["outputs"]:
        raise ValueError(f"{record['run_dir']}: changed since its job recorded it; rerun the job")
    name, = metrics["outputs"]
    with safe_open(str(Path(record["run_dir"]) / name), framework="np") as f:
        return f.get_tensor("maps"), dict(f.metadata() or {})


def load_panels(teacher: dict, students: dict[str, dict]) -> tuple[dict[str, np.ndarray], list]:
    """Column title -> maps (images, layers, N, N), teacher first, and the layers; every
    student's maps must be of the teacher's images, layers and tokens."""
    maps, meta = read_maps(teacher)
    layers = json.loads(meta["layers"])
    panels = {"softmax teacher": maps}
    for name, record in students.items():
        theirs, their_meta = read_maps(record)
        if (theirs.shape, json.loads(their_meta["layers"]), their_meta["teacher"]) != \
                (maps.shape, layers, meta["teacher"]):
            raise ValueError(f"{name}: maps of shape {theirs.shape}, layers "
                             f"{their_meta['layers']} on the tokens of {their_meta['teacher']}; "
                             f"the teacher's are {maps.shape}, {layers}, {meta['teacher']}")
        # say so where a map is not a distribution over keys, or not the layer's exact map
        kind = their_meta.get("map_kind", "stochastic")
        panels[f"{name} (distilled)" if kind == "stochastic" else
               f"{name} (distilled, {kind} map)"] = theirs
    return panels, layers


def draw(panels: dict[str, np.ndarray], layers: list[int], out: Path) -> None:
    n_images = next(iter(panels.values())).shape[0]
    rows = [(i, j) for i in range(n_images) for j in range(len(layers))]
    fig, axes = plt.subplots(len(rows), len(panels), figsize=(2.2 * len(panels), 2.2 * len(rows)),
                             squeeze=False)
    for r, (i, j) in enumerate(rows):
        for c, (name, maps) in enumerate(panels.items()):
            ax = axes[r][c]
            ax.imshow(maps[i, j], cmap="viridis")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(name, fontsize=8)
            if c == 0:
                ax.set_ylabel(f"image {i}, layer {layers[j]}", fontsize=8)
    save(fig, out)


def draw_failed(error: str, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(5, 1.5))
    ax.axis("off")
    ax.text(0.5, 0.5, f"no attention maps: the teacher's maps job failed\n{error[:80]}",
            ha="center", va="center", fontsize=8)
    save(fig, out)


def attention_figure_from_records(teacher_record: str, student_records: dict[str, str],
                                  out: Path) -> None:
    """The figure from the maps jobs' records: failed students are left out, and a failed
    teacher gives a figure that says so instead of failing the report."""
    teacher, *others = read_records([teacher_record, *student_records.values()])
    wrong = [r["run_dir"] for r in [teacher, *others] if r.get("kind") != "maps"]
    if wrong:
        raise ValueError(f"not records of attention-maps jobs: {', '.join(wrong)}")
    if teacher["status"] != "ok":
        draw_failed(teacher.get("error", ""), out)
        return
    students = {name: r for name, r in zip(student_records, others) if r["status"] == "ok"}
    draw(*load_panels(teacher, students), out)


def run_step(a) -> None:
    students = dict(s.split("=", 1) for s in a.student_record)
    attention_figure_from_records(a.teacher_record, students, Path(a.out))
