"""The CUDA path: fla's chunk_delta_rule on both directions stacked (bf16/fp16 inputs)."""
from __future__ import annotations

import torch

from linvit.ops.bidirectional import (
    fla_kernel,
    from_fla,
    split_directions,
    stack_directions,
    to_fla,
)

FLA_DTYPES = (torch.bfloat16, torch.float16)          # fla's chunk_delta_rule refuses float32


def fla_refuses(q: torch.Tensor) -> str | None:
    """Why fla's chunk_delta_rule cannot take this call (None: it can)."""
    if fla_kernel("delta_rule", "chunk_delta_rule") is None:
        return "flash-linear-attention is not installed"
    if not q.is_cuda:
        return "fla kernels need CUDA tensors"
    if q.dtype not in FLA_DTYPES:
        return f"fla's chunk_delta_rule takes bf16/fp16 only, not {q.dtype}"
    return None


def fla_scan(q, k, v, beta_forward, beta_backward, scale):
    kernel = fla_kernel("delta_rule", "chunk_delta_rule")
    q, k, v = (to_fla(stack_directions(t, t)) for t in (q, k, v))    # (2B, N, H, d)
    beta = stack_directions(beta_forward, beta_backward).transpose(1, 2).contiguous()
    # q and k arrive normalised (and q scaled) by the operator: fla must not normalise again
    out, _ = kernel(q, k, v, beta.to(q.dtype), scale=scale, use_qk_l2norm_in_kernel=False)
    forward, backward = split_directions(from_fla(out).float())
    return ((forward + backward) / 2).to(v.dtype)
