"""The distillation-loss registry. Adding a loss: one file here defining LOSS, one line below."""
from __future__ import annotations

from linvit.transfer.losses import attn_map_ce, attn_out_mse, hidden_mse, logit_kd
from linvit.transfer.losses.base import TARGETS, DistillLoss

MODULES = [
    attn_map_ce,
    attn_out_mse,
    hidden_mse,
    logit_kd,
]
LOSSES: dict[str, DistillLoss] = {m.LOSS.name: m.LOSS for m in MODULES}


def get_loss(name: str) -> DistillLoss:
    try:
        return LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown distillation loss {name!r}; "
                         f"allowed: {', '.join(LOSSES)}") from None


__all__ = ["DistillLoss", "LOSSES", "TARGETS", "get_loss"]
