"""fit(): epochs of train_one_epoch with timm's optimizer and scheduler, checkpoint each epoch,
resume from the last checkpoint, evaluation on schedule. Used by pretrain, distill and finetune.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import torch
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from linvit.errors import RunDirError, RunFailed, RunPreempted
from linvit.runs.loggers import open_loggers
from linvit.runs.preempt import STOP_CHECK_EVERY, Preempted, Preemption, rng_states
from linvit.runs.rundir import RunDir
from linvit.runs.runtime import Runtime, epoch_seed
from linvit.runs.state import load_state, save_state, started_precision
from linvit.train.loop import train_one_epoch
from linvit.trees import non_finite

log = logging.getLogger("linvit")


def build_optimizer(model: nn.Module, cfg, updates_per_epoch: int):
    # timm skips frozen parameters and exempts biases, norms and model.no_weight_decay() from
    # weight decay.
    # optim.layer_decay: timm's layer-wise learning-rate decay (parameter groups by depth)
    decay = {"layer_decay": cfg.layer_decay} if cfg.layer_decay is not None else {}
    optimizer = create_optimizer_v2(model, opt=cfg.opt, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                    **decay)
    scheduler, _ = create_scheduler_v2(optimizer, sched=cfg.sched, num_epochs=cfg.epochs,
                                       warmup_epochs=cfg.warmup_epochs, warmup_lr=cfg.warmup_lr,
                                       min_lr=cfg.min_lr, step_on_epochs=False,
                                       updates_per_epoch=updates_per_epoch)
    return optimizer, scheduler


def fit(objective: nn.Module, model: nn.Module, train_loader, optim_cfg, run: RunDir | None,
        rt: Runtime, *, evaluate_fn: Callable[[], dict], eval_every: int = 1,
        on_backward: Callable[[], None] | None = None, find_unused: bool = False,
        batch_aug: Callable | None = None, ema=None,
        evaluate_ema: Callable[[nn.Module], dict] | None = None,
        before_epoch: Callable[[int], None] | None = None) -> list[dict]:
    """Train `model` (inside `objective`) for optim_cfg.epochs; returns the per-epoch history,
    whose last record holds the final evaluation (test_* keys; test_ema_* for the EMA `ema`,
    timm's ModelEmaV3 of `model`, updated after every step and scored by `evaluate_ema`).
    `before_epoch(epoch)` runs before each epoch trains, a resumed one included (a phase
    switch).

    With `run` None (linvit.api: a model in memory) nothing is written: no checkpoint, no
    history file, no live curves, and nothing to resume from.
    The run's identity (its config without volatile fields, and the training step's precision) is
    stored in each checkpoint and must match on resume, so a checkpoint is never continued under
    another config or in another precision.
    """
    optimizer, scheduler = build_optimizer(model, optim_cfg, len(train_loader))
    params = [p for p in model.parameters() if p.requires_grad]
    position: list = []          # where a preempted epoch stopped (linvit.runs.preempt)
    start, history, identity = (_resume(run, rt, model, optimizer, scheduler, ema, optim_cfg,
                                        position)
                                if run is not None else (0, [], None))
    module = _wrap(objective, rt, find_unused)
    steps = len(train_loader)
    resumed = position[0] if position else None
    curves = open_loggers(run.config.get("run", {}).get("loggers", []) if run else [],
                          run.path if run else ".", run.config if run else {},
                          start * steps + (resumed["step"] if resumed else 0), rt.is_main)
    with contextlib.ExitStack() as stack:
        # a run in memory (run None) has nothing to save on a signal: it keeps the default
        preemption = stack.enter_context(Preemption()) if run is not None else None
        stack.callback(curves.close)
        for epoch in range(start, optim_cfg.epochs):
            seed_epoch(epoch_seed(rt.seed, epoch, rt.rank))
            if before_epoch is not None:
                before_epoch(epoch)
            try:
                stats = train_one_epoch(
                    module, train_loader, optimizer, scheduler, epoch, rt, params=params,
                    clip_grad=optim_cfg.clip_grad, on_backward=on_backward, batch_aug=batch_aug,
                    after_step=(lambda n: ema.update(model, step=n)) if ema else None,
                    on_step=curves.step if curves else None,
                    resume=_mine(resumed, rt) if epoch == start else None,
                    stop=(lambda update: _any_rank(preemption.requested, rt, update))
                    if preemption else None)
            except Preempted as stopped:
                _save_preempted(run, rt, stopped, model, optimizer, scheduler, epoch, history,
                                identity, ema)
                raise RunPreempted(f"{run.path}: stopped after step {stopped.step} of epoch "
                                   f"{epoch + 1} by signal {preemption.signal}; its checkpoint "
                                   "resumes from there") from None
            last = epoch + 1 == optim_cfg.epochs
            if last or (eval_every and (epoch + 1) % eval_every == 0):
                stats.update(_evaluate(epoch, last, evaluate_fn, ema, evaluate_ema))
            history.append({"epoch": epoch + 1, **stats})
            log.info("epoch %d/%d %s", epoch + 1, optim_cfg.epochs, _brief(history[-1]))
            curves.epoch(history[-1], (epoch + 1) * steps)
            if rt.is_main and run is not None:
                save_state(run.checkpoint, model, optimizer, scheduler, epoch + 1, history,
                           identity, ema)
                run.write_history(history)
            rt.barrier()
            # a signal in the epoch's last steps (or between checks): stop here, where the
            # epoch's checkpoint was just saved, not one epoch's steps later
            if (preemption is not None and epoch + 1 < optim_cfg.epochs
                    and _any_rank(preemption.requested, rt, 0)):
                raise RunPreempted(f"{run.path}: stopped after epoch {epoch + 1} by signal "
                                   f"{preemption.signal}; its checkpoint resumes from there")
    return history


def _mine(position: dict | None, rt: Runtime) -> dict | None:
    """A preempted epoch's position for this process: its own generators, and the epoch's sums
    (saved summed over the processes) on the main one, zeros elsewhere, so that the epoch's
    total is the same. Only as many processes as saved it can go on inside that epoch."""
    if position is None:
        return None
    states = position["rng"]
    if states[0][1].get("rank", 0) is None:     # from before each process's were kept
        log.warning("this checkpoint holds the main process's random states alone: every "
                    "process resumes on them")
        states = states * rt.world
    if len(states) != rt.world:
        raise RunDirError(f"the checkpoint stopped inside an epoch with {len(states)} "
                          f"process(es), and this run has {rt.world}: resume it with --nproc "
                          f"{len(states)} (the epoch's batches are split per process)")
    mine = {**position, "rng": states[rt.rank]}
    if rt.is_main:
        return mine
    return {**mine, "sums": {k: v * 0 for k, v in position["sums"].items()},
            "count": position["count"] * 0}


def _any_rank(flag: bool, rt: Runtime, update: int) -> bool:
    """Whether any process was signalled, so that all stop at the same step: in one process at
    once, under torch.distributed every STOP_CHECK_EVERY updates (a collective and a host sync)."""
    if not rt.distributed:
        return flag
    if update % STOP_CHECK_EVERY:
        return False
    return rt.all_reduce_sum(torch.tensor([float(flag)], device=rt.device)).item() > 0


def _save_preempted(run: RunDir, rt: Runtime, stopped: Preempted, model, optimizer, scheduler,
                    epoch: int, history: list[dict], identity: dict, ema) -> None:
    """The checkpoint of the step a preemption stopped at: the epoch it is in, its step, the
    epoch's sums over every process and every process's generators."""
    names = sorted(stopped.sums)
    totals = rt.all_reduce_sum(torch.stack([stopped.sums[k] for k in names] + [stopped.count]))
    every = rt.gather(rng_states())
    if rt.is_main:
        save_state(run.checkpoint, model, optimizer, scheduler, epoch, history, identity, ema,
                   position={"step": stopped.step, "count": totals[-1],
                             "sums": dict(zip(names, totals[:-1])), "rng": every})
    rt.barrier()


def _resume(run: RunDir, rt: Runtime, model, optimizer, scheduler, ema, optim_cfg,
            position: list):
    """(first epoch, history so far, identity): from the run's checkpoint where it has one,
    which must be of this config and precision."""
    start, history = 0, []
    resuming = run.checkpoint.is_file()
    if resuming:
        rt.keep_precision(started_precision(run.checkpoint))
    identity = {**run.identity, "precision": rt.precision}
    if resuming:
        start, history = load_state(run.checkpoint, model, optimizer, scheduler, identity, ema,
                                    position)
        where = f" and step {position[0]['step']} of the next" if position else ""
        log.info("resuming %s after epoch %d%s of %d", run.path, start, where, optim_cfg.epochs)
    return start, history, identity


def _wrap(objective: nn.Module, rt: Runtime, find_unused: bool) -> nn.Module:
    """The objective as the training step calls it: under DDP, compiled, as the run asks."""
    module = objective
    if rt.distributed:
        module = DistributedDataParallel(
            objective, device_ids=[rt.device.index] if rt.device.type == "cuda" else None,
            find_unused_parameters=find_unused)
    if rt.compile:       # the model and loss; checkpoints keep the plain module's tensor names
        module = torch.compile(module, backend=rt.compile)
    return module


def _evaluate(epoch: int, last: bool, evaluate_fn, ema, evaluate_ema) -> dict:
    """The evaluation after `epoch` as test_* keys (the EMA's as test_ema_*)."""
    evaluation = evaluate_fn()
    if bad := non_finite(evaluation):
        raise RunFailed(f"non-finite evaluation after epoch {epoch + 1}: {bad}")
    if ema is not None and evaluate_ema is not None:
        scored = evaluate_ema(ema.module)
        evaluation.update({f"ema_{k}": v for k, v in scored.items()
                           if k in ("top1", "top5", "loss")})
    if not last:                      # keep per-epoch lines short
        evaluation.pop("per_class_acc", None)
    return {f"test_{k}": v for k, v in evaluation.items()}


def seed_epoch(seed: int) -> None:
    """Every generator an epoch draws from: torch's, and numpy's and Python's, which timm's Mixup
    and RandomErasing use; so an epoch is the same whether or not the run resumed before it."""
    import random

    import numpy as np

    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def _brief(record: dict) -> str:
    keys = [k for k in record if k in ("train_loss", "lr", "test_top1", "train_img_per_s")]
    return " ".join(f"{k}={record[k]:.4g}" for k in keys)
