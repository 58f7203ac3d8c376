"""The ViT^3 test-time-training (TTT) cores: tensors in, tensors out.

Two inner modules each take one gradient step (learning rate 1) on the inner loss
L(W) = -(s/N) sum_j <f_W(k_j), v_j> of their keys and values, every gradient column scaled by
1 / (its norm + 1), and are then applied to the queries:

    swiglu   per head, f(x) = (x W1) * SiLU(x W2) with W1, W2 (d, d); shapes (B, H, N, d);
    dwconv   per channel, f = a 3x3 depthwise conv on the patch grid; images (B, d, h, w).

Each has a reference path (the loss written out, its gradient taken by autograd with
create_graph=True, so the outer backward differentiates through the inner step) and a fast path
(the gradient in closed form: batched matmuls, linear in N). `resolve_backend` picks one:
"reference" takes the first, "torch" and "triton" the second (no kernel is needed: the work is
six (N, d) x (d, d) matmuls per head). Tests hold the two to each other forward and backward.

Numerics: computed in float32, or in float64 for float64 inputs, and cast back to v's dtype.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from linvit.ops.linear_attention import resolve_backend


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """float32 for half-precision inputs (sums over thousands of tokens need its bits), float64
    kept (the tests compare the paths at float64 precision)."""
    return torch.promote_types(t.dtype, torch.float32)


def normalise_step(g: torch.Tensor, dims) -> torch.Tensor:
    """g / (||g|| + 1) with the norm over `dims`: ViT^3's clip, a step of norm below 1 whatever
    the size of the gradient, and the plain gradient when it is small."""
    return g / (torch.linalg.vector_norm(g, dim=dims, keepdim=True) + 1.0)


def silu_grad(z: torch.Tensor) -> torch.Tensor:
    """d SiLU(z) / dz = sigmoid(z) (1 + z (1 - sigmoid(z)))."""
    sig = torch.sigmoid(z)
    return sig * (1.0 + z * (1.0 - sig))


# --- the inner SwiGLU ------------------------------------------------------------------------
def _swiglu(x, w1, w2):
    return (x @ w1) * F.silu(x @ w2)


def _swiglu_reference(q, k, v, w1, w2, scale):
    """The definition: the inner loss and its gradient by autograd, per sample and head."""
    B, H, N, d = k.shape
    with torch.enable_grad():
        # One copy of the weights per sample: each sample's inner step is its own.
        w1s, w2s = (w.expand(B, H, d, d).clone() for w in (w1, w2))
        for w in (w1s, w2s):
            if not w.requires_grad:              # frozen weights: the step still needs a grad
                w.requires_grad_()
        loss = -(scale / N) * (_swiglu(k, w1s, w2s) * v).sum()
        g1, g2 = torch.autograd.grad(loss, (w1s, w2s), create_graph=True)
        w1s = w1s - normalise_step(g1, -2)       # dim -2: each column over its input rows
        w2s = w2s - normalise_step(g2, -2)
        return _swiglu(q, w1s, w2s)


def _swiglu_fast(q, k, v, w1, w2, scale):
    """The same step with the gradient in closed form: with z1 = k W1, z2 = k W2 and
    e = dL/df = -(s/N) v, dL/dW1 = k^T (e SiLU(z2)) and dL/dW2 = k^T (e z1 SiLU'(z2)).
    Both weights go through one matmul each way: (N, d) x (d, 2d), (d, N) x (N, 2d)."""
    d, N = k.shape[-1], k.shape[-2]
    w = torch.cat([w1, w2], dim=-1)                          # (1, H, d, 2d)
    z1, z2 = (k @ w).split(d, dim=-1)                        # (B, H, N, d) each
    e = v * (-scale / N)
    g = k.transpose(-2, -1) @ torch.cat([e * F.silu(z2), e * z1 * silu_grad(z2)], dim=-1)
    y1, y2 = (q @ (w - normalise_step(g, -2))).split(d, dim=-1)
    return y1 * F.silu(y2)


def ttt_swiglu(q, k, v, w1, w2, scale: float) -> torch.Tensor:
    """x1 = f_W'(q) with W' = W - step(dL/dW); q, k, v (B, H, N, d), w1, w2 (1, H, d, d)."""
    dtype, ct = v.dtype, compute_dtype(v)
    args = [t.to(ct) for t in (q, k, v, w1, w2)]
    core = _swiglu_reference if resolve_backend(q) == "reference" else _swiglu_fast
    out = core(*args, scale)
    return out.to(dtype)


def ttt_swiglu_map(q, k, w1, w2, scale: float) -> torch.Tensor:
    """The effective map (B, H, N, N), float32: the channel mean of d x1 / d v at v = 0.

    x1 is not linear in v (v sets the normalisers and, through W2', the gate), but its first-order
    term in v is, channel by channel: at v = 0 the gradient is 0, so every normaliser is 1 and the
    step's derivative is the gradient's, and
        d x1_ic / d v_jc' = [c = c'] (s/N) (q_i . k_j) (G_ic A_jc + P_ic R_jc)
    with G = SiLU(q W2), A = SiLU(k W2) (the gates), P = (q W1) SiLU'(q W2) and
    R = (k W1) SiLU'(k W2) (the path through W2'). This returns its mean over c.
    """
    q, k, w1, w2 = (t.float() for t in (q, k, w1, w2))
    d, N = k.shape[-1], k.shape[-2]
    qz1, qz2, kz1, kz2 = q @ w1, q @ w2, k @ w1, k @ w2
    gates = F.silu(qz2) @ F.silu(kz2).transpose(-2, -1)
    through_w2 = (qz1 * silu_grad(qz2)) @ (kz1 * silu_grad(kz2)).transpose(-2, -1)
    return (scale / (N * d)) * (q @ k.transpose(-2, -1)) * (gates + through_w2)


# --- the inner 3x3 depthwise conv on the patch grid ------------------------------------------
def _dwconv(x, kernels):
    """Per-sample depthwise 3x3 conv: x (B, C, h, w), kernels (B, C, 3, 3), zero padding 1."""
    B, C, h, w = x.shape
    out = F.conv2d(x.reshape(1, B * C, h, w), kernels.reshape(B * C, 1, 3, 3), padding=1,
                   groups=B * C)
    return out.reshape(B, C, h, w)


def _dwconv_reference(q, k, v, kernel, scale):
    B, C, h, w = k.shape
    with torch.enable_grad():
        ks = kernel.reshape(1, C, 3, 3).expand(B, C, 3, 3).clone()
        if not ks.requires_grad:
            ks.requires_grad_()
        loss = -(scale / (h * w)) * (_dwconv(k, ks) * v).sum()
        (g,) = torch.autograd.grad(loss, (ks,), create_graph=True)
        return _dwconv(q, ks - normalise_step(g, (-2, -1)))


def _dwconv_fast(q, k, v, kernel, scale):
    """dL/dW[c, a, b] = -(s/hw) sum_{y,x} v[c, y, x] k[c, y + a - 1, x + b - 1] (zero outside the
    grid): the nine shifted copies of k against v, one batched matmul over the unfolded taps."""
    B, C, h, w = k.shape
    taps = F.unfold(k, 3, padding=1).reshape(B * C, 9, h * w)       # tap a*3+b at every pixel
    e = v.reshape(B * C, h * w, 1) * (-scale / (h * w))
    g = (taps @ e).reshape(B, C, 3, 3)
    return _dwconv(q, kernel.reshape(1, C, 3, 3) - normalise_step(g, (-2, -1)))


def ttt_dwconv(q, k, v, kernel, scale: float) -> torch.Tensor:
    """x2 = conv(q, K') with K' = K - step(dL/dK); q, k, v (B, C, h, w) images, kernel (C, 1, 3, 3)
    (one 3x3 filter per channel, shared by the samples until the step)."""
    dtype, ct = v.dtype, compute_dtype(v)
    args = [t.to(ct) for t in (q, k, v, kernel)]
    core = _dwconv_reference if resolve_backend(q) == "reference" else _dwconv_fast
    return core(*args, scale).to(dtype)
