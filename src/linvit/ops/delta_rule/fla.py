"""The CUDA path: fla's chunk_delta_rule on both directions stacked (bf16/fp16 inputs)."""
from __future__ import annotations

import functools
import logging

import torch

from linvit.ops.bidirectional import (
    fla_kernel,
    from_fla,
    split_directions,
    stack_directions,
    to_fla,
)

log = logging.getLogger("linvit")

FLA_DTYPES = (torch.bfloat16, torch.float16)          # fla's chunk_delta_rule refuses float32


def fla_takes(q: torch.Tensor) -> bool:
    if fla_kernel("delta_rule", "chunk_delta_rule") is None:
        _warn_fallback("flash-linear-attention is not installed")
    elif not q.is_cuda:
        _warn_fallback("fla kernels need CUDA tensors")
    elif q.dtype not in FLA_DTYPES:
        _warn_fallback(f"fla's chunk_delta_rule takes bf16/fp16 only, not {q.dtype}")
    else:
        return True
    return False


@functools.cache
def _warn_fallback(reason: str) -> None:
    """Cached: said once per reason, not on every layer of every step."""
    log.warning("delta rule: %s; using the chunked PyTorch path", reason)


def fla_scan(q, k, v, beta_forward, beta_backward, scale):
    kernel = fla_kernel("delta_rule", "chunk_delta_rule")
    q, k, v = (to_fla(stack_directions(t, t)) for t in (q, k, v))    # (2B, N, H, d)
    beta = stack_directions(beta_forward, beta_backward).transpose(1, 2).contiguous()
    # q and k arrive normalised (and q scaled) by the operator: fla must not normalise again
    out, _ = kernel(q, k, v, beta.to(q.dtype), scale=scale, use_qk_l2norm_in_kernel=False)
    forward, backward = split_directions(from_fla(out).float())
    return ((forward + backward) / 2).to(v.dtype)
