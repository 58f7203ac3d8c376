"""Bidirectional scans from causal ones: both directions in one batch, the reversed half flipped
back before combining, and optional flash-linear-attention (fla) kernels.

fla's chunk kernels are causal only. Running them on cat([x_forward, flip(x_backward)]) along the
batch does both directions in one call; the second half of the output must be flipped back to
token order before the halves are combined (adding it unflipped misaligns tokens).
"""
from __future__ import annotations

import functools
import importlib
import logging

import torch

log = logging.getLogger("linvit")

TOKENS = 2                                   # token axis of the (B, H, N, d) layout used here


def stack_directions(forward: torch.Tensor, backward: torch.Tensor) -> torch.Tensor:
    """One batch holding both scans: `forward` as is, `backward` with its tokens reversed."""
    return torch.cat([forward, backward.flip(TOKENS)], dim=0)


def split_directions(out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two halves of a stacked scan's output, both in token order."""
    forward, backward = out.chunk(2, dim=0)
    return forward, backward.flip(TOKENS)


@functools.cache
def fla_kernel(module: str, name: str):
    """fla.ops.<module>.<name>, or None when flash-linear-attention is not installed (it is an
    optional GPU dependency: `pip install flash-linear-attention`). An fla that is installed but
    cannot load is said once, as it would otherwise turn the kernels off unnoticed."""
    try:
        return getattr(importlib.import_module(f"fla.ops.{module}"), name)
    except Exception as exc:
        if not (isinstance(exc, ModuleNotFoundError) and exc.name == "fla"):
            log.warning("fla.ops.%s.%s unavailable (%s: %s); using the chunked PyTorch path",
                        module, name, type(exc).__name__, exc)
        return None


def to_fla(t: torch.Tensor) -> torch.Tensor:
    """(B, H, N, d) -> fla's (B, N, H, d), contiguous."""
    return t.transpose(1, 2).contiguous()


def from_fla(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2)
