"""Attention-map cross-entropy per layer and head (Hedgehog; Attention Transfer)."""
from __future__ import annotations

import torch

from linvit.transfer.losses.base import DistillLoss

# Map entries are clamped before the log: InLine's maps can be <= 0 and linear maps underflow.
MAP_LOG_FLOOR = 1e-6


def map_cross_entropy(student: torch.Tensor, teacher: torch.Tensor, **_) -> torch.Tensor:
    """Mean over rows (batch, head, query) of -sum_j P_ij log A_ij."""
    log_a = student.float().clamp_min(MAP_LOG_FLOOR).log()
    return -(teacher.float() * log_a).sum(-1).mean()


LOSS = DistillLoss("attn_map_ce", "attn_map", map_cross_entropy,
                   "attention-map cross-entropy per layer and head")
