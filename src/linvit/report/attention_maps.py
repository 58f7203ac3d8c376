"""Teacher vs distilled-student attention maps for a few test images and layers.

All maps are taken on the same tokens: each student attention gets the teacher's input to that
layer (as in distillation), so the panels differ only by the operator's token routing. Maps are
averaged over heads; rows of a map are queries, columns keys (token 0 is the cls token).
"""
from __future__ import annotations

from pathlib import Path

import torch

from linvit.data import get_dataset
from linvit.models import load_model
from linvit.render.plotting import plt, save


@torch.no_grad()
def teacher_attention_inputs(teacher, images: torch.Tensor, layers: list[int]) -> dict:
    inputs, hooks = {}, []
    for l in layers:
        def keep(module, args, output, l=l):
            inputs[l] = args[0]
        hooks.append(teacher.blocks[l].attn.register_forward_hook(keep))
    teacher(images)
    for h in hooks:
        h.remove()
    return inputs


@torch.no_grad()
def head_mean_map(model, layer: int, tokens: torch.Tensor) -> torch.Tensor:
    attn = model.blocks[layer].attn
    q, k, _ = attn.project(tokens)
    return attn.attention_map(q, k).mean(dim=1)                  # (B, N, N)


def attention_figure(teacher_path: str, students: dict[str, str], data: dict,
                     layers: list[int], n_images: int, out: Path) -> None:
    teacher = load_model(teacher_path).eval()
    depth = len(teacher.blocks)
    layers = [l if l >= 0 else depth + l for l in layers]
    models = {"softmax teacher": teacher,
              **{name: load_model(path).eval() for name, path in students.items()}}
    loader = get_dataset(data["dataset"]).loader(
        data.get("root"), "test", batch_size=n_images, train=False, img_size=data.get("img_size"),
        workers=0)
    images, _ = next(loader.batches(0))
    tokens = teacher_attention_inputs(teacher, images, layers)
    rows = [(i, l) for i in range(len(images)) for l in layers]
    fig, axes = plt.subplots(len(rows), len(models), figsize=(2.2 * len(models), 2.2 * len(rows)),
                             squeeze=False)
    for r, (i, l) in enumerate(rows):
        for c, (name, model) in enumerate(models.items()):
            ax = axes[r][c]
            ax.imshow(head_mean_map(model, l, tokens[l][i:i + 1])[0].numpy(), cmap="viridis")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(name, fontsize=8)
            if c == 0:
                ax.set_ylabel(f"image {i}, layer {l}", fontsize=8)
    save(fig, out)


def attention_figure_from_records(teacher_record: str, student_records: dict[str, str],
                                  data: dict, layers: list[int], n_images: int, out: Path) -> None:
    """The figure from job records: failed jobs are left out, and a failed teacher gives a
    figure that says so instead of failing the report."""
    from linvit.report.record import read_records

    teacher, = read_records([teacher_record])
    ok = {name: f"{r['run_dir']}/model.safetensors"
          for name, r in zip(student_records, read_records(student_records.values()))
          if r["status"] == "ok"}
    if teacher["status"] != "ok":
        fig, ax = plt.subplots(figsize=(5, 1.5))
        ax.axis("off")
        ax.text(0.5, 0.5, f"no attention maps: the teacher job failed\n{teacher['error'][:80]}",
                ha="center", va="center", fontsize=8)
        save(fig, out)
        return
    attention_figure(f"{teacher['run_dir']}/model.safetensors",
                     {f"{name} (distilled)": path for name, path in ok.items()}, data, layers,
                     n_images, out)


def run_step(a) -> None:
    import json

    students = dict(s.split("=", 1) for s in a.student_record)
    attention_figure_from_records(a.teacher_record, students, json.loads(a.data), a.layers,
                                  a.images, Path(a.out))
