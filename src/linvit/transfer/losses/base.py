"""What a distillation loss is: a function comparing one student quantity with the teacher's.

Targets (which quantity a loss compares):
    attn_map    (B, H, N, N) map multiplying V, per layer      needs the explicit O(N^2) map
    attn_out    (B, N, C) attention output, per layer          teacher-forced: same input
    block_out   (B, N, C) block output, per layer              teacher-forced: same block input
    logits      (B, classes), whole model                      student runs on its own

Which tensors a loss can train follows from its target: a map loss reaches only Q and K (and the
feature map); V and the output projection get no gradient from it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

TARGETS = ("attn_map", "attn_out", "block_out", "logits")


@dataclass(frozen=True)
class DistillLoss:
    name: str
    target: str
    fn: Callable[..., torch.Tensor]
    description: str = ""

    def __post_init__(self):
        if self.target not in TARGETS:
            raise ValueError(f"loss {self.name}: target {self.target!r} not one of {TARGETS}")

    @property
    def per_layer(self) -> bool:
        return self.target != "logits"


def mse(student: torch.Tensor, teacher: torch.Tensor, **_) -> torch.Tensor:
    return F.mse_loss(student.float(), teacher.float())
