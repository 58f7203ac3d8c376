"""The CUDA path: flash-linear-attention's causal chunk kernels, both directions in one call."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from linvit.ops.bidirectional import (
    fla_kernel,
    from_fla,
    split_directions,
    stack_directions,
    to_fla,
)


def fla_refuses(q: torch.Tensor, log_a: torch.Tensor) -> str | None:
    """Why fla's kernels cannot take this call (None: they can)."""
    if not q.is_cuda:
        return "tensors are not on CUDA"
    module = "simple_gla" if log_a.shape[-1] == 1 else "gla"
    if fla_kernel(module, f"chunk_{module}") is None:
        return "flash-linear-attention is not installed"
    return None


def fla_scan(q, keys, v, decays, strict: bool) -> torch.Tensor:
    """fla's kernels are causal: both directions as one batch, the backward half flipped."""
    qs, ks = stack_directions(q, q), stack_directions(*keys)
    vs, gs = stack_directions(v, v), stack_directions(*decays)
    if strict:
        # o_i = sum_{j<i} ... exp(b_i - b_j): an inclusive scan of keys and values shifted one
        # token later, each key carrying the step's decay a_{j+1} that the shift skips
        ks = _shift(ks) * gs.exp()
        vs = _shift(vs)
    module = "simple_gla" if gs.shape[-1] == 1 else "gla"
    kernel = fla_kernel(module, f"chunk_{module}")
    g = to_fla(gs).squeeze(-1) if module == "simple_gla" else to_fla(gs)   # [B, T, H(, K)]
    # fla >= 0.2.2 takes [B, T, H, ...] only (head_first is gone: chunk_gla has no such
    # parameter, chunk_simple_gla raises on it)
    out, _ = kernel(to_fla(qs), to_fla(ks), to_fla(vs), g=g, scale=1.0)
    forward, backward = split_directions(from_fla(out))
    return forward + backward


def _shift(t: torch.Tensor) -> torch.Tensor:
    """Tokens moved one later, a zero first: (B, H, N, d)."""
    return F.pad(t, (0, 0, 1, 0))[:, :, :-1]
