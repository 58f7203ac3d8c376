"""The distillation-loss registry.

Each loss compares one student quantity with the teacher's and says which quantity (its target):

    attn_map    (B, H, N, N) map multiplying V, per layer      needs the explicit O(N^2) map
    attn_out    (B, N, C) attention output, per layer          teacher-forced: same input
    block_out   (B, N, C) block output, per layer              teacher-forced: same block input
    logits      (B, classes), whole model                      student runs on its own

Which tensors a loss can train follows from its target: a map loss reaches only Q and K (and the
feature map); V and the output projection get no gradient from it. The distill stage records what
each run actually trained (trained.json). Adding a loss: a function and one line in LOSSES.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from linvit.train.objectives import logit_kd

TARGETS = ("attn_map", "attn_out", "block_out", "logits")
# Map entries are clamped before the log: InLine's maps can be <= 0 and linear maps underflow.
MAP_LOG_FLOOR = 1e-6


def map_cross_entropy(student: torch.Tensor, teacher: torch.Tensor, **_) -> torch.Tensor:
    """Mean over rows (batch, head, query) of -sum_j P_ij log A_ij (Hedgehog, Attention Transfer)."""
    log_a = student.float().clamp_min(MAP_LOG_FLOOR).log()
    return -(teacher.float() * log_a).sum(-1).mean()


def mse(student: torch.Tensor, teacher: torch.Tensor, **_) -> torch.Tensor:
    return F.mse_loss(student.float(), teacher.float())


@dataclass(frozen=True)
class DistillLoss:
    name: str
    target: str
    fn: Callable[..., torch.Tensor]
    description: str = ""

    @property
    def per_layer(self) -> bool:
        return self.target != "logits"


LOSSES: dict[str, DistillLoss] = {loss.name: loss for loss in [
    DistillLoss("attn_map_ce", "attn_map", map_cross_entropy,
                "attention-map cross-entropy per layer and head"),
    DistillLoss("attn_out_mse", "attn_out", mse, "attention-output MSE per layer"),
    DistillLoss("hidden_mse", "block_out", mse, "block-output (hidden-state) MSE per layer"),
    DistillLoss("logit_kd", "logits", logit_kd, "final-logit KD"),
]}


def get_loss(name: str) -> DistillLoss:
    try:
        return LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown distillation loss {name!r}; allowed: {', '.join(LOSSES)}") from None
