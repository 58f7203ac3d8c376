"""The distillation and fine-tuning loops as functions over a model and loaders.

The stages (`linvit distill`, `linvit finetune`) call them with a run folder, which makes them
checkpoint, resume and log. linvit.api calls them with `run=None`, on a model in memory, and
nothing is written. Either way the loop is the same code: linvit.train.trainer.fit on a
distillation or classification objective.
"""
from __future__ import annotations

from collections.abc import Callable

from torch import nn

from linvit.train.objectives import ClassificationObjective
from linvit.train.trainer import fit
from linvit.transfer.config import DistillCfg, KDCfg
from linvit.transfer.distill import DistillObjective, GradCensus, freeze_except
from linvit.transfer.kd import LogitKDObjective


def distill_objective(student: nn.Module, teacher: nn.Module, d: DistillCfg) -> DistillObjective:
    """The teacher-forced objective of `d`'s losses, with only `d.train`'s groups of the student
    left trainable."""
    freeze_except(student, d.train)
    return DistillObjective(student, teacher, d.losses, d.layers, d.temperature)


def phase_at(d: DistillCfg, epochs: int, epoch: int) -> dict[str, float]:
    """The losses epoch `epoch` (0-based) of an `epochs`-long schedule trains on: the last
    d.e2e_epochs are end to end."""
    return d.e2e_losses if epoch >= epochs - d.e2e_epochs else d.losses


def distill_loop(objective: DistillObjective, train, optim, rt, d: DistillCfg, *, run=None,
                 evaluate_fn: Callable[[], dict] = dict, eval_every: int = 0,
                 batch_aug=None, ema=None, evaluate_ema=None) -> tuple[list[dict], dict]:
    """Distil for optim.epochs (layer-wise, then d.e2e_epochs end to end); returns the per-epoch
    history and, per student tensor, which share of its entries ever got a gradient."""
    census = GradCensus(objective.student)
    history = fit(objective, objective.student, train, optim, run, rt, evaluate_fn=evaluate_fn,
                  eval_every=eval_every, on_backward=census, find_unused=True,
                  batch_aug=batch_aug, ema=ema, evaluate_ema=evaluate_ema,
                  before_epoch=lambda epoch: objective.use(phase_at(d, optim.epochs, epoch)))
    return history, census.report()


def finetune_objective(model: nn.Module, label_smoothing: float, teacher: nn.Module | None = None,
                       kd: KDCfg | None = None) -> nn.Module:
    """Cross-entropy on the labels, mixed with logit KD from `teacher` where kd.weight > 0."""
    if teacher is None or kd is None or not kd.weight:
        return ClassificationObjective(model, label_smoothing)
    return LogitKDObjective(model, label_smoothing, teacher, kd.weight, kd.temperature)


def finetune_loop(model: nn.Module, train, optim, rt, *, teacher: nn.Module | None = None,
                  kd: KDCfg | None = None, run=None, evaluate_fn: Callable[[], dict] = dict,
                  eval_every: int = 0, batch_aug=None, ema=None,
                  evaluate_ema=None) -> list[dict]:
    """Fine-tune every trainable tensor of `model` for optim.epochs; the per-epoch history."""
    objective = finetune_objective(model, optim.label_smoothing, teacher, kd)
    return fit(objective, model, train, optim, run, rt, evaluate_fn=evaluate_fn,
               eval_every=eval_every, batch_aug=batch_aug, ema=ema, evaluate_ema=evaluate_ema)
