"""The reference path: the recursion token by token, both directions stacked in one batch."""
from __future__ import annotations

import logging

import torch

from linvit.ops.bidirectional import (
    split_directions,
    stack_directions,
)
from linvit.ops.definitions import compute_dtype

log = logging.getLogger("linvit")


def reference(q, k, v, beta_forward, beta_backward, scale):
    dtype = compute_dtype(q)
    both = [stack_directions(t, t).to(dtype) for t in (q, k, v)]
    betas = stack_directions(beta_forward, beta_backward).to(dtype)
    forward, backward = split_directions(_recurrence(*both, betas, scale))
    return ((forward + backward) / 2).to(v.dtype)


def _recurrence(q, k, v, beta, scale):
    """One causal scan, token by token."""
    B, H, N, dk = q.shape
    state = q.new_zeros(B, H, dk, v.shape[-1])                        # S, (B, H, Dk, Dv)
    out = []
    for t in range(N):
        k_t = k[:, :, t]
        recalled = torch.einsum("bhk,bhkv->bhv", k_t, state)          # S^T k_t
        u_t = beta[:, :, t, None] * (v[:, :, t] - recalled)
        state = state + k_t[..., :, None] * u_t[..., None, :]
        out.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, :, t], state))
    return torch.stack(out, dim=2)
