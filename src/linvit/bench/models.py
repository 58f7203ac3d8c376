"""Whole-model inference throughput against image resolution (timm ViT shapes, random weights).

Patch 16 at 224 px is 196 tokens; at 1024 px it is 4096, where softmax's N^2 term dominates and
linear operators keep the cost of the MLPs. Forward only, batch `models.batch`, no gradients.
"""
from __future__ import annotations

import logging

import torch

from linvit.bench.measure import median_seconds, peak_bytes
from linvit.models import ModelSpec, create_vit

log = logging.getLogger("linvit")


def bench_model(size: str, operator: str, resolution: int, cfg, device: torch.device) -> dict:
    spec = ModelSpec(size=size, operator=operator, num_classes=1000, img_size=resolution,
                     in_chans=3)
    model = create_vit(spec).to(device).eval()
    images = torch.randn(cfg.batch, 3, resolution, resolution, device=device)

    def forward():
        with torch.inference_mode():
            return model(images)
    seconds = median_seconds(forward, cfg.min_run_time)
    peak = peak_bytes(forward, device)
    return {"size": size, "operator": operator, "resolution": resolution,
            "tokens": model.patch_embed.num_patches + model.num_prefix_tokens, "batch": cfg.batch,
            "device": device.type, "ms_per_batch": seconds * 1e3,
            "images_per_s": cfg.batch / seconds, "peak_mib": peak / 2**20}


def sweep_models(cfg, device: torch.device, on_row=None) -> list[dict]:
    """Every (size, operator, resolution) once; `on_row(rows)` after each, with the rows so far."""
    jobs = [(s, o, r) for s in cfg.sizes for o in cfg.operators for r in cfg.resolutions]
    rows = []
    for i, (size, operator, resolution) in enumerate(jobs, 1):
        row = bench_model(size, operator, resolution, cfg, device)
        log.info("[%d/%d] %-6s %-8s %4d px %8.2f img/s %9.1f MiB", i, len(jobs), size, operator,
                 resolution, row["images_per_s"], row["peak_mib"])
        rows.append(row)
        if on_row:
            on_row(rows)
    return rows
