"""The delta rule's CPU path in linvit's C++ kernel (csrc/delta_rule.cpp): the chunked WY form of
chunked.py, both scans of a head in one task, reading the token-major tensors in place (no
stacked, flipped copies). It runs float32 inputs where the kernel loads (the path `cpp` of
linvit.ops.paths); float64 inputs keep the PyTorch chunked path, which the tests hold to the
reference at float64 precision."""
from __future__ import annotations

import torch

from linvit.ops.chunks import chunk_rows


def cpp_scan(q, k, v, beta_forward, beta_backward, scale, chunk: int):
    """o = (o_F + o_B) / 2 on (B, H, N, d) inputs, in v's dtype; tokens padded to whole chunks
    (zero keys and betas write nothing), cut off at the end."""
    B, H, N, _ = q.shape
    rows = [chunk_rows(t.float(), chunk) for t in (q * (scale / 2), k, v)]
    betas = chunk_rows(torch.stack((beta_forward, beta_backward)).float()[..., None], chunk)
    out = _CppDeltaRule.apply(*rows, betas[..., 0], chunk)
    return out.view(B, H, -1, out.shape[-1])[:, :, :N].to(v.dtype)


class _CppDeltaRule(torch.autograd.Function):
    """The kernel's forward and backward on (B*H, n*C, d) float32 rows and betas (2, B*H, n*C);
    per direction and chunk it keeps what the backward pass reads (A, T, P, W, N, the states)."""

    @staticmethod
    def forward(ctx, q, k, v, betas, chunk):
        q, k, v, betas = (t.contiguous() for t in (q, k, v, betas))
        out, *saved = torch.ops.linvit_cpu.delta_forward(q, k, v, betas, chunk)
        ctx.save_for_backward(q, k, v, betas, *saved)
        ctx.chunk = chunk
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, betas, *saved = ctx.saved_tensors
        dq, dk, dv, dbetas = torch.ops.linvit_cpu.delta_backward(
            grad.contiguous(), q, k, v, betas, saved, ctx.chunk)
        return dq, dk, dv, dbetas, None
