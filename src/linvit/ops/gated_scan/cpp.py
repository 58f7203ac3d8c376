"""The gated scan's CPU path in linvit's C++ kernel (csrc/gated_scan.cpp): the chunked form of
chunked.py, both scans of a head in one task, chunk by chunk in cache, on the token-major tensors.
It takes float32 inputs where the kernel loads (the path `cpp` of linvit.ops.paths); float64
inputs, and per-channel decays with per-direction key scales (no operator uses them), keep the
PyTorch chunks."""
from __future__ import annotations

import torch

from linvit.ops.chunks import chunk_rows


def cpp_scan(q, k, v, log_a, scales, strict: bool, scale: float, decay_scale: float,
             chunk: int):
    """scale (o_F + o_B), (B, H, N, Dv) float32: q, k, v (B, H, N, d), log_a (2, B, H, N, Dk or 1),
    scales (2, B, H, N, 1) or None. Tokens padded to whole chunks (zero keys write nothing, zero
    log-decays keep the state), cut off at the end."""
    B, H, N, _ = q.shape
    weights = q.new_empty(0) if scales is None else chunk_rows(scales, chunk)[..., 0]
    out = _CppGatedScan.apply(chunk_rows(q * scale, chunk), chunk_rows(k, chunk),
                              chunk_rows(v, chunk), chunk_rows(log_a * decay_scale, chunk),
                              weights, chunk, strict)
    return out.view(B, H, -1, out.shape[-1])[:, :, :N]


class _CppGatedScan(torch.autograd.Function):
    """The kernel's forward and backward on (B*H, n*C, d) rows, log-decays (2, B*H, n*C, Dk or 1)
    and key weights (2, B*H, n*C) or empty; it keeps the states entering each chunk (and, for
    scalar decays, each chunk's Q K^T) for the backward pass."""

    @staticmethod
    def forward(ctx, q, k, v, log_a, weights, chunk, strict):
        q, k, v, log_a, weights = (t.contiguous() for t in (q, k, v, log_a, weights))
        out, states, qk = torch.ops.linvit_cpu.gated_forward(q, k, v, log_a, weights, chunk,
                                                             strict)
        ctx.save_for_backward(q, k, v, log_a, weights, states, qk)
        ctx.chunk, ctx.strict = chunk, strict
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, log_a, weights, states, qk = ctx.saved_tensors
        dq, dk, dv, dlog_a, dw = torch.ops.linvit_cpu.gated_backward(
            grad.contiguous(), q, k, v, log_a, weights, states, qk, ctx.chunk, ctx.strict)
        return dq, dk, dv, dlog_a, dw if weights.numel() else None, None, None
