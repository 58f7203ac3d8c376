"""One training epoch; it returns a dict of averaged meters (evaluation: linvit.runs.evaluation).

An objective is an nn.Module called as objective(images, labels) -> (loss, logs), where logs maps
names to scalar tensors averaged like the loss; classification and distillation are both
objectives, so this one loop (with DDP, autocast, clipping, progress) serves every stage.
"""
from __future__ import annotations

import time
from collections import defaultdict

import torch
from torch import nn

from linvit.errors import RunFailed
from linvit.runs.evaluation import progress
from linvit.runs.preempt import Preempted, set_rng_states
from linvit.runs.runtime import Runtime
from linvit.trees import non_finite


def train_one_epoch(module: nn.Module, loader, optimizer, scheduler, epoch: int, rt: Runtime, *,
                    params: list[nn.Parameter], clip_grad: float | None = None,
                    on_backward=None, batch_aug=None, after_step=None, on_step=None,
                    resume: dict | None = None, stop=None) -> dict:
    """`batch_aug`: (images, labels) -> (images, targets) on the device (linvit.train.recipe:
    random erasing, Mixup/CutMix); `after_step(updates)` after each optimizer step (the EMA);
    `on_step(updates, loss, lr)` then too (the live curves; the loss a tensor, not synced).
    `stop(updates)` true after a step: Preempted, with the epoch's position; `resume`: such a
    position (linvit.runs.preempt), whose batches are drawn again from the loader but not
    trained on."""
    module.train()
    sums: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros((), device=rt.device))
    count = torch.zeros((), device=rt.device)
    first = 0
    if resume is not None:
        first = resume["step"]
        sums.update({k: v.to(rt.device) for k, v in resume["sums"].items()})
        count = resume["count"].to(rt.device)
    steps = len(loader)
    start = time.perf_counter()
    for step, (images, labels) in enumerate(progress(loader.batches(epoch), rt, steps,
                                                     f"epoch {epoch + 1}")):
        if step < first:                 # trained before the preemption: drawn, not trained
            continue
        if step == first and resume is not None:      # the generators as they were then
            set_rng_states(*resume["rng"])
        images = images.to(rt.device, non_blocking=True)
        labels = labels.to(rt.device, non_blocking=True)
        if batch_aug is not None:
            images, labels = batch_aug(images, labels)
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
        if after_step is not None:
            after_step(epoch * steps + step + 1)
        if on_step is not None:
            on_step(epoch * steps + step + 1, loss, optimizer.param_groups[0]["lr"])
        n = images.shape[0]
        count += n
        sums["loss"] += loss.detach().float() * n
        for k, v in logs.items():
            sums[k] += v.detach().float() * n
        if stop is not None and step + 1 < steps and stop(epoch * steps + step + 1):
            raise Preempted(step + 1, dict(sums), count)
    elapsed = time.perf_counter() - start
    names = sorted(sums)
    totals = rt.all_reduce_sum(torch.stack([sums[k] for k in names] + [count]))
    stats = {f"train_{k}": (totals[i] / totals[-1]).item() for i, k in enumerate(names)}
    if non_finite(stats):
        raise RunFailed(f"non-finite training loss in epoch {epoch + 1}: {stats}")
    stats.update(lr=optimizer.param_groups[0]["lr"], train_img_per_s=totals[-1].item() / elapsed,
                 train_time_s=elapsed, train_images=int(totals[-1].item()))
    return stats
