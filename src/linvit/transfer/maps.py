"""`linvit attention-maps`: a model's attention maps on the teacher's tokens, stored as data.

Every map is taken on the same tokens: the chosen block's attention gets the teacher's input to
that block (as in distillation), so the maps of a teacher and of its distilled students differ
only by the operator's token routing. Maps are averaged over heads; rows are queries, columns
keys (token 0 is the cls token). The report draws them from the file alone.

    maps.safetensors    tensor "maps", (images, layers, N, N) float32; metadata: layers (JSON,
                        resolved to 0..depth-1), operator, model, teacher, images
"""
from __future__ import annotations

import json
import logging

import torch

from linvit.data import get_dataset
from linvit.errors import ConfigError
from linvit.models import load_model
from linvit.models.checkpoint import ModelFile
from linvit.models.tensor_files import save_tensors
from linvit.runs.stage import completed_metrics, start_run
from linvit.transfer.config import MapsConfig

log = logging.getLogger("linvit")
MAPS_FILE = "maps.safetensors"


@torch.no_grad()
def teacher_attention_inputs(teacher, images: torch.Tensor, layers: list[int]) -> dict:
    """layer -> the (B, N, C) tokens the teacher's attention of that block receives."""
    inputs, hooks = {}, []
    for l in layers:
        def keep(module, args, output, l=l):
            inputs[l] = args[0]
        hooks.append(teacher.blocks[l].attn.register_forward_hook(keep))
    try:
        teacher(images)
    finally:
        for h in hooks:
            h.remove()
    return inputs


@torch.no_grad()
def head_mean_map(model, layer: int, tokens: torch.Tensor) -> torch.Tensor:
    """(B, N, N): block `layer`'s attention map of `model` on `tokens`, averaged over heads."""
    attn = model.blocks[layer].attn
    q, k, _ = attn.project(tokens)
    return attn.attention_map(q, k).mean(dim=1)


def resolve_layers(layers: list[int], depth: int) -> list[int]:
    """Negative layers count from the end; ConfigError for a block the model lacks or one
    named twice."""
    bad = [l for l in layers if not -depth <= l < depth]
    if bad:
        raise ConfigError(f"layers: {bad} outside {-depth}..{depth - 1} (the teacher has "
                          f"{depth} blocks)")
    resolved = [l % depth for l in layers]
    if len(set(resolved)) != len(resolved):
        raise ConfigError(f"layers: {layers} name the same block twice ({resolved} of {depth})")
    return resolved


def first_test_images(data_cfg, n: int) -> torch.Tensor:
    """The first `n` images of the test split, normalised as in evaluation."""
    loader = get_dataset(data_cfg.dataset).loader(
        data_cfg.root, "test", batch_size=n, train=False, subset=data_cfg.test_subset,
        img_size=data_cfg.img_size, workers=0)
    images, _ = next(iter(loader.batches(0)), (torch.empty(0), None))
    if len(images) != n:
        raise ConfigError(f"images: {n}, but the test split of {data_cfg.dataset!r} gives "
                          f"{len(images)}")
    return images


def check_models(cfg: MapsConfig, teacher, model, images: torch.Tensor) -> None:
    """The model takes the teacher's tokens, and the teacher takes these images."""
    t = teacher.spec
    if tuple(images.shape[1:]) != (t.in_chans, t.img_size, t.img_size):
        raise ConfigError(f"teacher: takes {t.in_chans}x{t.img_size}x{t.img_size} images, "
                          f"dataset {cfg.data.dataset!r} gives {tuple(images.shape[1:])}")
    m = model.spec
    if (m.size, m.img_size, m.in_chans) != (t.size, t.img_size, t.in_chans):
        raise ConfigError(f"model: {cfg.model} is a {m.size} for {m.img_size} px, the teacher a "
                          f"{t.size} for {t.img_size} px; its attention cannot take the "
                          "teacher's tokens")


def run_attention_maps(cfg: MapsConfig, out, replace: bool = False) -> dict:
    rt, run = start_run(cfg, out, "attention-maps", replace)
    if run.finished:
        return completed_metrics(run)
    source = ModelFile(cfg.teacher)
    source.check_teacher()
    teacher = source.load().eval()
    model = teacher if cfg.model is None else load_model(cfg.model).eval()
    layers = resolve_layers(cfg.layers, len(teacher.blocks))
    images = first_test_images(cfg.data, cfg.images)
    check_models(cfg, teacher, model, images)
    run.open(f"maps of {cfg.model or cfg.teacher} on the tokens of {cfg.teacher}")
    teacher.to(rt.device)
    model.to(rt.device)
    tokens = teacher_attention_inputs(teacher, images.to(rt.device), layers)
    maps = torch.stack([head_mean_map(model, l, tokens[l]).float().cpu() for l in layers], dim=1)
    operator = model.spec.operator
    kind = model.blocks[0].attn.map_kind        # "effective" maps are not the layer's exact map
    if rt.is_main:
        save_tensors(run.path / MAPS_FILE, {"maps": maps},
                     {"layers": json.dumps(layers), "operator": operator, "map_kind": kind,
                      "model": cfg.model or cfg.teacher, "teacher": cfg.teacher,
                      "images": str(cfg.images)})
    log.info("maps %s of layers %s, operator %s", tuple(maps.shape), layers, operator)
    return run.finish({"layers": layers, "images": cfg.images, "operator": operator,
                       "map_kind": kind,
                       "tokens": maps.shape[-1], "model": cfg.model or cfg.teacher,
                       "teacher": cfg.teacher})
