"""The distillation-loss registry. Adding a loss: one file here defining LOSS, one line below."""
from __future__ import annotations

from linvit.registry import Registry
from linvit.transfer.losses import attn_map_ce, attn_out_mse, hidden_mse, logit_kd
from linvit.transfer.losses.base import TARGETS, DistillLoss

MODULES = [
    attn_map_ce,
    attn_out_mse,
    hidden_mse,
    logit_kd,
]
LOSSES: Registry[DistillLoss] = Registry.by_name("distillation loss", *(m.LOSS for m in MODULES))
get_loss = LOSSES.lookup


__all__ = ["DistillLoss", "LOSSES", "TARGETS", "get_loss"]
