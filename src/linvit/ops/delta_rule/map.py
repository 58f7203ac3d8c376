"""The exact map M of the bidirectional delta rule, delta_rule(...) == M @ v."""
from __future__ import annotations

import logging

import torch

from linvit.ops.definitions import compute_dtype

log = logging.getLogger("linvit")


def delta_rule_map(q: torch.Tensor, k: torch.Tensor, beta_forward: torch.Tensor,
                   beta_backward: torch.Tensor, scale: float) -> torch.Tensor:
    """The (B, H, N, N) map M with delta_rule(q, k, v, ...) == M @ v: exact, as the layer is
    linear in v given q, k and beta. M = (M_F + J M_F[Jq, Jk, J beta_B] J) / 2."""
    dtype = compute_dtype(q)
    q, k, beta_forward, beta_backward = (t.to(dtype) for t in (q, k, beta_forward, beta_backward))
    forward = _causal_map(q, k, beta_forward, scale)
    backward = _causal_map(q.flip(2), k.flip(2), beta_backward.flip(2), scale).flip(2, 3)
    return (forward + backward) / 2


def _causal_map(q, k, beta, scale):
    """M_F = tril(s Q K^T) (I + diag(beta) tril(K K^T, -1))^-1 diag(beta), (B, H, N, N)."""
    lower = torch.tril(k @ k.mT, -1) * beta[..., :, None]           # I implied: unitriangular
    scores = torch.tril(q @ k.mT) * scale
    solved = torch.linalg.solve_triangular(lower, scores, upper=False, left=False,
                                           unitriangular=True)      # scores (I + lower)^-1
    return solved * beta[..., None, :]
