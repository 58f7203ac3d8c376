"""The explicit map of the gated scan: scale (M_F + M_B), out = map @ v."""
from __future__ import annotations

import math

import torch

from linvit.ops.bidirectional import TOKENS
from linvit.ops.gated_scan.definition import directions, prepare


def gated_scan_map(q: torch.Tensor, k: torch.Tensor, log_a: torch.Tensor,
                   key_scale: torch.Tensor | None = None, strict: bool = False,
                   scale: float = 1.0, decay_scale: float = 1.0) -> torch.Tensor:
    """scale (M_F + M_B), (B, H, N, N), in float32 (float64 for float64 inputs): out = map @ v."""
    q, k, _, log_a, scales = prepare(q, k, k, log_a, key_scale, decay_scale)
    keys = directions(k, scales)
    N = q.shape[2]
    lower = torch.ones(N, N, dtype=torch.bool, device=q.device).tril(-1 if strict else 0)
    # cumulative sums in float64: over thousands of tokens float32 loses the small differences
    # that near-diagonal entries need
    decays = decay_scale * log_a.double()
    b = decays[0].cumsum(TOKENS)
    c = decays[1].flip(TOKENS).cumsum(TOKENS).flip(TOKENS)
    return scale * (_direction_map(q, keys[0], b, lower) + _direction_map(q, keys[1], c, lower.T))


def _direction_map(q, k, b, mask) -> torch.Tensor:
    """sum_d q_id k_jd exp(b_id - b_jd) where mask, else 0 (exponent masked before exp)."""
    if b.shape[-1] == 1:
        diff = torch.where(mask, b - b.transpose(-1, -2), -math.inf)
        return (q @ k.transpose(-1, -2)) * diff.to(q.dtype).exp()
    B, H, N, Dk = q.shape
    out = q.new_zeros(B, H, N, N)
    step = max(1, 2 ** 24 // (B * H * N * N))       # channels at a time: bounded memory
    for s in range(0, Dk, step):
        bs = b[..., s:s + step]
        diff = torch.where(mask[..., None], bs.unsqueeze(3) - bs.unsqueeze(2), -math.inf)
        out = out + torch.einsum("bhid,bhjd,bhijd->bhij", q[..., s:s + step], k[..., s:s + step],
                                 diff.to(q.dtype).exp())
    return out
