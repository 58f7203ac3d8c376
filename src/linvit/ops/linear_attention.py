"""Bidirectional (non-causal) attention cores: tensors in, tensors out.

Shape convention everywhere: q, k (B, H, N, Dk), v (B, H, N, Dv).
Each core has an efficient path used in training and an explicit one that forms the (B, H, N, N)
map multiplying V, which map-level distillation needs and the tests compare against.

The efficient path's implementations must agree (tests/ops/test_kernels.py); `linear_path`
picks one per call (linvit.ops.paths):
  reference  plain einsum + autograd: the readable definition;
  cpp        the CPU default: linvit's C++ kernel (linvit.ops.cpp_kernels) where it builds, the
             feature maps (focused, hedgehog) and InLine's centring inside it;
  torch      one fused autograd Function in bmm (linvit.ops.fused_torch): the CPU path without
             the kernel, and for a core with neither feature map nor normaliser;
  triton     fused kernels (linvit.ops.triton_kernels): the CUDA default, for head dims up to
             its MAX_HEAD_DIM (wider heads take the torch path, said once).
`backend("name")` forces reference, torch or triton (benchmarks and tests); "auto" picks by
device.

Numerics: cores run in float32 whatever the input dtype (bf16 sums over thousands of tokens lose
too many bits), and results are cast back. Feature maps and the normaliser's epsilon are defined
once for all backends, in linvit.ops.definitions.
"""
from __future__ import annotations

import torch

from linvit.ops import cpp_kernels, paths
from linvit.ops.definitions import FEATURES, NORMALISER_EPS, feature
from linvit.ops.focused_features import focused_features
from linvit.ops.fused_torch import fused_linear_attention

# What the C++ kernel computes besides linear attention on FEATURES: feature maps and centring
IN_KERNEL = ("focused", "hedgehog", "inline")


def linear_path(q: torch.Tensor, v: torch.Tensor, kind: str, normalize: bool) -> str:
    """The path of one call (linvit.ops.paths) of linear attention with feature map `kind`
    (FEATURES, or IN_KERNEL: an operator whose features the C++ kernel forms itself)."""
    if kind == "inline":
        # below CENTRED_MIN_TOKENS the kernel's per-block calls cost more than batched bmm
        cpp = q.shape[2] >= cpp_kernels.CENTRED_MIN_TOKENS
    else:
        # with neither feature map nor normaliser nothing is left to fuse around the two
        # products: batched bmm was as fast at N=4096 and up to 15% faster at 50 tokens per head
        cpp = kind != "identity" or normalize
    triton = None if kind in IN_KERNEL else (lambda: _triton_refuses(q, v))
    return paths.choose(f"linear attention ({kind})", q, cpp, triton)


def _triton_refuses(q: torch.Tensor, v: torch.Tensor) -> str | None:
    """Why the Triton kernels cannot take these head dims (None: they can)."""
    from linvit.ops.triton_kernels import MAX_HEAD_DIM
    dims = (q.shape[-1], v.shape[-1])
    if max(dims) <= MAX_HEAD_DIM:
        return None
    return f"head dims (Dk, Dv = {dims}) over the Triton kernels' limit of {MAX_HEAD_DIM}"


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
    path = linear_path(q, v, kind, normalize)
    if path == "triton":
        from linvit.ops.triton_kernels import triton_linear_attention
        return triton_linear_attention(q, k, v, kind, normalize, eps)
    if path == "reference":
        return _reference(q, k, v, kind, normalize, eps)
    if path == "cpp":
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
    path = linear_path(q, v, "focused", True)
    if path == "cpp":
        return cpp_kernels.cpp_linear_attention(q, k, v, "focused", True, NORMALISER_EPS, p, scale)
    fused = path != "reference"
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
    # the centring on the sums inside the CPU kernel (linear_path: from CENTRED_MIN_TOKENS on)
    if linear_path(q, v, "inline", False) == "cpp":
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
