"""Bidirectional (non-causal) attention cores: tensors in, tensors out.

Shape convention everywhere: q, k (B, H, N, Dk) after the feature map, v (B, H, N, Dv).
Each core has two paths that must agree: the efficient one used in training, and an explicit
one that forms the (B, H, N, N) map multiplying V, which map-level distillation needs and the
tests compare against.

Numerics: cores run in float32 whatever the input dtype (bf16 sums over thousands of tokens lose
too many bits), and results are cast back.
"""
from __future__ import annotations

import torch

# Feature maps used here are strictly positive, so the normaliser sum_j phi(q_i).phi(k_j) is > 0
# in exact arithmetic. In float32 it can still underflow to 0 (elu(x)+1 = exp(x) for x < -87, or a
# row of relu(x)+1e-6 features at the floor), and 0/0 would turn a whole sequence into NaN. 1e-6 is
# far below any normaliser of a healthy row (>= N * Dk * 1e-12 even at the floor for the focused
# map, and O(N) for elu+1 and softmax maps) yet keeps the all-underflow case finite (output -> 0).
NORMALISER_EPS = 1e-6


def _f32(*ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(t.float() for t in ts)


def normalized_linear_attention(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor,
                                eps: float = NORMALISER_EPS) -> torch.Tensor:
    """o_i = phi(q_i) S / (phi(q_i) z + eps), S = sum_j phi(k_j)^T v_j, z = sum_j phi(k_j).

    Costs O(N Dk Dv) instead of O(N^2 (Dk + Dv)).
    """
    dtype = v.dtype
    phi_q, phi_k, v = _f32(phi_q, phi_k, v)
    kv = torch.einsum("bhnk,bhnv->bhkv", phi_k, v)          # (B, H, Dk, Dv)
    z = phi_k.sum(dim=2)                                     # (B, H, Dk)
    num = torch.einsum("bhnk,bhkv->bhnv", phi_q, kv)         # (B, H, N, Dv)
    den = torch.einsum("bhnk,bhk->bhn", phi_q, z).unsqueeze(-1)
    return (num / (den + eps)).to(dtype)


def normalized_linear_attention_map(phi_q: torch.Tensor, phi_k: torch.Tensor,
                                    eps: float = NORMALISER_EPS) -> torch.Tensor:
    """The (B, H, N, N) map that `normalized_linear_attention` multiplies V with."""
    phi_q, phi_k = _f32(phi_q, phi_k)
    scores = phi_q @ phi_k.transpose(-2, -1)                 # (B, H, N, N), >= 0
    return scores / (scores.sum(dim=-1, keepdim=True) + eps)


def injective_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               scale: float) -> torch.Tensor:
    """InLine's map A_ij = s q_i.k_j - mean_t s q_i.k_t + 1/N, applied to V in linear time.

    sum_j A_ij v_j = mean_j v_j + s q_i^T sum_j (k_j - mean k) v_j^T. Rows of A sum to exactly 1 by
    construction, so there is no division and no epsilon: nothing here can divide by ~0.
    """
    dtype = v.dtype
    q, k, v = _f32(q, k, v)
    k_centred = k - k.mean(dim=2, keepdim=True)
    kv = torch.einsum("bhnk,bhnv->bhkv", k_centred, v)       # (B, H, Dk, Dv)
    out = v.mean(dim=2, keepdim=True) + scale * (q @ kv)
    return out.to(dtype)


def injective_linear_attention_map(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    q, k = _f32(q, k)
    scores = scale * (q @ k.transpose(-2, -1))
    return scores - scores.mean(dim=-1, keepdim=True) + 1.0 / k.shape[2]


def softmax_attention_map(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    q, k = _f32(q, k)
    return torch.softmax(scale * (q @ k.transpose(-2, -1)), dim=-1)
