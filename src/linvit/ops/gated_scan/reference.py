"""The reference path: the recurrence, token by token (the readable definition; N steps)."""
from __future__ import annotations

import torch

from linvit.ops.bidirectional import TOKENS


def recurrence(q, k, v, log_a, strict: bool, reverse: bool) -> torch.Tensor:
    B, H, N, Dk = q.shape
    state = q.new_zeros(B, H, Dk, v.shape[-1])                       # S, (B, H, Dk, Dv)
    out = [None] * N
    for i in (reversed(range(N)) if reverse else range(N)):
        state = log_a[:, :, i].exp().unsqueeze(-1) * state           # diag(a_i) S
        if strict:                                                    # o_i before k_i v_i^T
            out[i] = (q[:, :, i].unsqueeze(-2) @ state).squeeze(-2)
        state = state + k[:, :, i].unsqueeze(-1) * v[:, :, i].unsqueeze(-2)
        if not strict:
            out[i] = (q[:, :, i].unsqueeze(-2) @ state).squeeze(-2)
    return torch.stack(out, dim=TOKENS)
