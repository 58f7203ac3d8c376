"""One training epoch and one evaluation pass; both return dicts of averaged meters.

An objective is an nn.Module called as objective(images, labels) -> (loss, logs), where logs maps
names to scalar tensors averaged like the loss; classification and distillation are both
objectives, so this one loop (with DDP, autocast, clipping, progress) serves every stage.
"""
from __future__ import annotations

import time
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from linvit.errors import RunFailed
from linvit.runs.runtime import Runtime


def progress(iterable, rt: Runtime, total: int, desc: str):
    return tqdm(iterable, total=total, desc=desc, disable=not (rt.progress and rt.is_main),
                mininterval=2.0, dynamic_ncols=True, leave=False)


def train_one_epoch(module: nn.Module, loader, optimizer, scheduler, epoch: int, rt: Runtime, *,
                    params: list[nn.Parameter], clip_grad: float | None = None,
                    on_backward=None) -> dict:
    module.train()
    sums: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros((), device=rt.device))
    count = torch.zeros((), device=rt.device)
    steps = len(loader)
    start = time.perf_counter()
    for step, (images, labels) in enumerate(progress(loader.batches(epoch), rt, steps,
                                                     f"epoch {epoch + 1}")):
        images = images.to(rt.device, non_blocking=True)
        labels = labels.to(rt.device, non_blocking=True)
        with rt.autocast():
            loss, logs = module(images, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if on_backward is not None:
            on_backward()
        if clip_grad:
            torch.nn.utils.clip_grad_norm_(params, clip_grad)
        optimizer.step()
        scheduler.step_update(num_updates=epoch * steps + step + 1)
        n = images.shape[0]
        count += n
        sums["loss"] += loss.detach().float() * n
        for k, v in logs.items():
            sums[k] += v.detach().float() * n
    elapsed = time.perf_counter() - start
    names = sorted(sums)
    totals = rt.all_reduce_sum(torch.stack([sums[k] for k in names] + [count]))
    stats = {f"train_{k}": (totals[i] / totals[-1]).item() for i, k in enumerate(names)}
    if not all(map(_finite, stats.values())):
        raise RunFailed(f"non-finite training loss in epoch {epoch + 1}: {stats}")
    stats.update(lr=optimizer.param_groups[0]["lr"], train_img_per_s=totals[-1].item() / elapsed,
                 train_time_s=elapsed, train_images=int(totals[-1].item()))
    return stats


def _finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")


@torch.no_grad()
def evaluate(model: nn.Module, loader, rt: Runtime, num_classes: int) -> dict:
    """Top-1/top-5 accuracy (%), cross-entropy, per-class accuracy and throughput."""
    model.eval()
    k = min(5, num_classes)
    hits = torch.zeros(3, device=rt.device)                    # top1, topk, loss sum
    per_class = torch.zeros(2, num_classes, device=rt.device)  # correct, seen
    start = time.perf_counter()
    for images, labels in progress(loader.batches(0), rt, len(loader), "eval"):
        images, labels = images.to(rt.device), labels.to(rt.device)
        with rt.autocast():
            logits = model(images)
        logits = logits.float()
        topk = logits.topk(k, dim=-1).indices
        correct1 = topk[:, 0] == labels
        hits[0] += correct1.sum()
        hits[1] += (topk == labels[:, None]).any(-1).sum()
        hits[2] += F.cross_entropy(logits, labels, reduction="sum")
        per_class[0].index_add_(0, labels, correct1.float())
        per_class[1].index_add_(0, labels, torch.ones_like(labels, dtype=torch.float))
    elapsed = time.perf_counter() - start
    hits, per_class = rt.all_reduce_sum(hits), rt.all_reduce_sum(per_class)
    n = per_class[1].sum().item()
    return {
        "top1": 100 * hits[0].item() / n,
        f"top{k}" if k != 5 else "top5": 100 * hits[1].item() / n,
        "loss": hits[2].item() / n,
        "per_class_acc": (100 * per_class[0] / per_class[1].clamp_min(1)).tolist(),
        "eval_img_per_s": n / elapsed,
        "eval_samples": int(n),
    }
