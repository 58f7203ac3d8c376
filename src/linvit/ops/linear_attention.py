"""Bidirectional (non-causal) attention cores: tensors in, tensors out.

Shape convention everywhere: q, k (B, H, N, Dk), v (B, H, N, Dv).
Each core has an efficient path used in training and an explicit one that forms the (B, H, N, N)
map multiplying V, which map-level distillation needs and the tests compare against.

The efficient path has three backends that must agree (tests/ops/test_kernels.py):
  reference  plain einsum + autograd: the readable definition;
  torch      the CPU default: linvit's C++ kernel (linvit.ops.cpp_kernels) where it builds, else
             one fused autograd Function in bmm (linvit.ops.fused_torch); both are tested;
  triton     fused kernels (linvit.ops.triton_kernels): the CUDA default, for head dims up to
             its MAX_HEAD_DIM (wider heads take the torch path, with a warning).
`backend("name")` forces one (benchmarks and tests); "auto" picks by device.

Numerics: cores run in float32 whatever the input dtype (bf16 sums over thousands of tokens lose
too many bits), and results are cast back. Feature maps and the normaliser's epsilon are defined
once for all backends, in linvit.ops.definitions.
"""
from __future__ import annotations

import functools
import logging

import torch

from linvit.ops import cpp_kernels
from linvit.ops.backends import resolve_backend
from linvit.ops.definitions import FEATURES, NORMALISER_EPS, feature
from linvit.ops.focused_features import focused_features
from linvit.ops.fused_torch import fused_linear_attention

log = logging.getLogger("linvit")

def _triton_fits(q: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the Triton kernels take these head dims (only asked once triton has loaded)."""
    from linvit.ops.triton_kernels import MAX_HEAD_DIM
    dims = (q.shape[-1], v.shape[-1])
    if max(dims) <= MAX_HEAD_DIM:
        return True
    _warn_fallback(f"head dims over the Triton kernels' limit of {MAX_HEAD_DIM}", dims)
    return False


@functools.cache
def _warn_fallback(reason: str, dims: tuple[int, int]) -> None:
    """Cached: said once per distinct (reason, dims), not on every layer of every step."""
    log.warning("linear attention: %s (Dk, Dv = %s); using the fused PyTorch path", reason, dims)


def _f32(*ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(t.float() for t in ts)


def _reference(q, k, v, kind: str, normalize: bool, eps: float) -> torch.Tensor:
    phi_q, phi_k, v32 = feature(q, kind), feature(k, kind), v.float()
    kv = torch.einsum("bhnk,bhnv->bhkv", phi_k, v32)          # (B, H, Dk, Dv)
    out = torch.einsum("bhnk,bhkv->bhnv", phi_q, kv)          # (B, H, N, Dv)
    if normalize:
        den = torch.einsum("bhnk,bhk->bhn", phi_q, phi_k.sum(dim=2)).unsqueeze(-1)
        out = out / (den + eps)
    return out.to(v.dtype)


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kind: str = "identity",
                     normalize: bool = True, eps: float = NORMALISER_EPS) -> torch.Tensor:
    """o_i = phi(q_i) S / (phi(q_i) z + eps) (or phi(q_i) S unnormalised), S = sum_j phi(k_j)^T v_j,
    z = sum_j phi(k_j), phi = FEATURES[kind] ("identity" or "elu1" = elu(x) + 1).

    Costs O(N Dk Dv) instead of O(N^2 (Dk + Dv)).
    """
    if kind not in FEATURES:
        raise ValueError(f"unknown feature map {kind!r}; allowed: {tuple(FEATURES)}")
    name = resolve_backend(q)
    if name == "triton" and _triton_fits(q, v):
        from linvit.ops.triton_kernels import triton_linear_attention
        return triton_linear_attention(q, k, v, kind, normalize, eps)
    if name == "reference":
        return _reference(q, k, v, kind, normalize, eps)
    # the torch path (or triton's fallback) on the CPU; with neither feature map nor normaliser
    # (InLine) nothing is left to fuse around the two products, and batched bmm was as fast at
    # N=4096 and up to 15% faster at 50 tokens per head
    if not q.is_cuda and (kind != "identity" or normalize) and cpp_kernels.load():
        return cpp_kernels.cpp_linear_attention(q, k, v, kind, normalize, eps)
    return fused_linear_attention(q, k, v, kind, normalize, eps)


def linear_core_flops(tokens: int, dk: int, dv: int, normalize: bool = True) -> float:
    """Forward FLOPs of one head of the core: the state phi(K)^T V and phi(Q) S (2 N Dk Dv each),
    and phi(Q) z for the normaliser (2 N Dk); feature maps and the division are elementwise."""
    return 4.0 * tokens * dk * dv + (2.0 * tokens * dk if normalize else 0.0)


def normalized_linear_attention(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor,
                                eps: float = NORMALISER_EPS) -> torch.Tensor:
    """Normalised linear attention on features already computed (focused, hedgehog)."""
    return linear_attention(phi_q, phi_k, v, "identity", True, eps)


def focused_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             scale: torch.Tensor, p: float) -> torch.Tensor:
    """Normalised linear attention on FLatten's focused features of q and k (focused_features):
    on the CPU, the feature map runs inside linvit's C++ kernel, on each block of rows."""
    if cpp_kernels.runs_on(q):
        return cpp_kernels.cpp_linear_attention(q, k, v, "focused", True, NORMALISER_EPS, p, scale)
    fused = resolve_backend(q) != "reference"
    return normalized_linear_attention(focused_features(q, scale, p, fused),
                                       focused_features(k, scale, p, fused), v)


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
    construction, so there is no division and no epsilon: nothing here can divide by ~0. The
    centring and the mean are O(N d) in PyTorch; the state and output go to the unnormalised core.
    """
    # the centring on the sums, inside the CPU kernel; below CENTRED_MIN_TOKENS its per-block
    # calls cost more than batched bmm and a few passes
    if q.shape[2] >= cpp_kernels.CENTRED_MIN_TOKENS and cpp_kernels.runs_on(q):
        return cpp_kernels.cpp_linear_attention(q, k, v, "inline", False, 0.0, scale)
    dtype = v.dtype
    q, k, v = _f32(q, k, v)
    out = linear_attention(q, _CentredKeys.apply(k, scale), v, normalize=False)
    return _PlusMeanValue.apply(out, v).to(dtype)


class _CentredKeys(torch.autograd.Function):
    """s (k - mean_t k): the scale folded into the keys, (s q).k' = q.(s k'). Written out because
    autograd's mean, subtraction and product take about twice the passes over (N, d) both ways,
    which at N=4096 cost as much as a third of the core."""

    @staticmethod
    def forward(ctx, k, scale: float):
        ctx.scale = scale
        return (k - k.mean(dim=2, keepdim=True)).mul_(scale)

    @staticmethod
    def backward(ctx, grad):
        return (grad - grad.mean(dim=2, keepdim=True)).mul_(ctx.scale), None


class _PlusMeanValue(torch.autograd.Function):
    """out + mean_t v, its gradient to v the column sums of grad over N (broadcast, not stored)."""

    @staticmethod
    def forward(ctx, out, v):
        ctx.tokens, ctx.shape = v.shape[2], v.shape
        return out + v.mean(dim=2, keepdim=True)

    @staticmethod
    def backward(ctx, grad):
        return grad, (grad.sum(dim=2, keepdim=True) / ctx.tokens).expand(ctx.shape)


def injective_linear_attention_map(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    q, k = _f32(q, k)
    scores = scale * (q @ k.transpose(-2, -1))
    return scores - scores.mean(dim=-1, keepdim=True) + 1.0 / k.shape[2]


def softmax_attention_map(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    q, k = _f32(q, k)
    return torch.softmax(scale * (q @ k.transpose(-2, -1)), dim=-1)
