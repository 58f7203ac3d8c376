"""The ViT^3 test-time-training (TTT) cores: tensors in, tensors out.

Two inner modules each take one gradient step (learning rate 1) on the inner loss
L(W) = -(s/N) sum_j <f_W(k_j), v_j> of their keys and values, every gradient column scaled by
1 / (its norm + 1), and are then applied to the queries:

    swiglu   per head, f(x) = (x W1) * SiLU(x W2) with W1, W2 (d, d); shapes (B, H, N, d);
    dwconv   per channel, f = a 3x3 depthwise conv on the patch grid; images (B, d, h, w).

Each has a reference path (the loss written out, its gradient taken by autograd with
create_graph=True, so the outer backward differentiates through the inner step) and a fast path
(the gradient in closed form: batched matmuls, linear in N; the SwiGLU's outer backward is written
by hand). `ttt_path` picks one (linvit.ops.paths): "reference" the first, "torch" the second,
also where Triton was asked for (no kernel is needed: the work is six (N, d) x (d, d) matmuls
per head). Tests hold the two to each other forward and backward.

Numerics: computed in float32 (also under autocast), or in float64 for float64 inputs, and cast
back to v's dtype.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from linvit.ops import paths
from linvit.ops.definitions import compute_dtype


def ttt_path(q: torch.Tensor, module: str) -> str:
    """The path of one call of an inner module's step (linvit.ops.paths)."""
    return paths.choose(f"test-time training ({module})", q)


def _no_autocast(t: torch.Tensor):
    """The cores' float32 (or float64) arithmetic, kept under a bf16 autocast too."""
    return torch.autocast(t.device.type, enabled=False)


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
    outer = torch.is_grad_enabled()
    with torch.enable_grad():              # the inner step needs a gradient even in eval
        # One copy of the weights per sample: each sample's inner step is its own.
        w1s, w2s = (w.expand(B, H, d, d).clone() for w in (w1, w2))
        for w in (w1s, w2s):
            if not w.requires_grad:              # frozen weights: the step still needs a grad
                w.requires_grad_()
        loss = -(scale / N) * (_swiglu(k, w1s, w2s) * v).sum()
        g1, g2 = torch.autograd.grad(loss, (w1s, w2s), create_graph=True)
        w1s = w1s - normalise_step(g1, -2)       # dim -2: each column over its input rows
        w2s = w2s - normalise_step(g2, -2)
        out = _swiglu(q, w1s, w2s)
    return out if outer else out.detach()


class _SwiGLUStep(torch.autograd.Function):
    """The same step with the gradient in closed form, and the outer backward by hand.

    With z1 = k W1, z2 = k W2, a = SiLU(z2) and e = dL/df = c v (c = -s/N):
    dL/dW1 = c k^T (v a) and dL/dW2 = c k^T (v z1 SiLU'(z2)). At d = 64 the passes over (N, d)
    tensors cost as much as the six matmuls, so the backward is written to make few of them
    (autograd through these lines makes about twice as many).
    """

    @staticmethod
    def forward(ctx, q, k, v, w1, w2, scale):            # called with autocast off
        c = -scale / k.shape[-2]
        z1, z2 = k @ w1, k @ w2
        a, da = F.silu(z2), _silu_grad_times(z2.new_ones(()).expand_as(z2), z2)
        u1, u2 = v * a, (v * z1).mul_(da)                  # dL/dW = c k^T u
        g1, g2 = (k.mT @ u1).mul_(c), (k.mT @ u2).mul_(c)
        w1n, w2n = w1 - normalise_step(g1, -2), w2 - normalise_step(g2, -2)
        y1, y2 = q @ w1n, q @ w2n
        ctx.save_for_backward(q, k, v, w1, w2, z1, z2, a, da, u1, u2, g1, g2, w1n, w2n, y1, y2)
        ctx.c = c
        return y1 * F.silu(y2)

    @staticmethod
    @once_differentiable
    def backward(ctx, dx):
        with _no_autocast(dx):                 # whatever the autocast state backward runs in
            return (*_swiglu_step_backward(ctx.c, dx, *ctx.saved_tensors), None)


def _swiglu_step_backward(c, dx, q, k, v, w1, w2, z1, z2, a, da, u1, u2, g1, g2, w1n, w2n, y1,
                          y2):
    """dx -> the gradients of q, k, v, W1, W2 (the weights' summed over the batch)."""
    dy1, dy2 = dx * F.silu(y2), _silu_grad_times(dx * y1, y2)
    dq = _add_matmul(dy1 @ w1n.mT, dy2, w2n.mT)
    # W' = W - step(g) and g = c k^T u: h = dL/d(k^T u)
    h1 = _normalise_step_backward(g1, q.mT @ dy1).mul_(-c)
    h2 = _normalise_step_backward(g2, q.mT @ dy2).mul_(-c)
    du1, du2 = k @ h1, k @ h2
    r = du2 * da
    dv = torch.addcmul(du1 * a, r, z1)
    dz1 = r.mul_(v)
    dz2 = torch.addcmul((du2 * z1).mul_(_silu_second(z2, a)), du1, da).mul_(v)
    dk = _add_matmul(_add_matmul(_add_matmul(u1 @ h1.mT, u2, h2.mT), dz1, w1.mT), dz2, w2.mT)
    dw1 = _add_matmul(q.mT @ dy1, k.mT, dz1).sum_to_size(w1.shape)
    dw2 = _add_matmul(q.mT @ dy2, k.mT, dz2).sum_to_size(w2.shape)
    return dq, dk, dv, dw1, dw2


def _silu_grad_times(grad, z):
    """grad * SiLU'(z) in one pass (aten's fused SiLU backward)."""
    return torch.ops.aten.silu_backward(grad, z)


def _silu_second(z, a):
    """SiLU''(z) = sig (1 - sig) (2 + z - 2 SiLU(z)), sig = sigmoid(z), a = SiLU(z)."""
    sig = torch.sigmoid(z)
    return torch.add(z, a, alpha=-2.0).add_(2.0).mul_(torch.addcmul(sig, sig, sig, value=-1.0))


def _add_matmul(acc, x, y):
    """acc + x @ y for (B, H, ., .) tensors, the sum done by the matmul itself (BLAS's beta = 1)
    rather than by one more pass over acc; acc is a fresh contiguous result and is reused."""
    B, H = acc.shape[:2]
    x, y = (t.expand(B, H, *t.shape[2:]).reshape(B * H, *t.shape[2:]) for t in (x, y))
    acc.view(B * H, *acc.shape[2:]).baddbmm_(x, y)
    return acc


def _normalise_step_backward(g, grad):
    """The backward of normalise_step(g, -2) applied to grad: with n the column norm,
    d/dg [g / (n + 1)] applied to grad = grad / (n + 1) - g <grad, g> / ((n + 1)^2 n),
    whose second term is 0 for a zero column (g = 0 there)."""
    n = torch.linalg.vector_norm(g, dim=-2, keepdim=True)
    dot = (grad * g).sum(dim=-2, keepdim=True)
    return grad / (n + 1.0) - g * (dot / ((n + 1.0) ** 2 * n.clamp_min(torch.finfo(g.dtype).tiny)))


def ttt_swiglu(q, k, v, w1, w2, scale: float) -> torch.Tensor:
    """x1 = f_W'(q) with W' = W - step(dL/dW); q, k, v (B, H, N, d), w1, w2 (1, H, d, d)."""
    dtype, ct = v.dtype, compute_dtype(v)
    args = [t.to(ct) for t in (q, k, v, w1, w2)]
    core = _swiglu_reference if ttt_path(q, "swiglu") == "reference" else _SwiGLUStep.apply
    with _no_autocast(q):
        return core(*args, scale).to(dtype)


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
    with _no_autocast(q):
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
    outer = torch.is_grad_enabled()
    with torch.enable_grad():
        ks = kernel.reshape(1, C, 3, 3).expand(B, C, 3, 3).clone()
        if not ks.requires_grad:
            ks.requires_grad_()
        loss = -(scale / (h * w)) * (_dwconv(k, ks) * v).sum()
        (g,) = torch.autograd.grad(loss, (ks,), create_graph=True)
        out = _dwconv(q, ks - normalise_step(g, (-2, -1)))
    return out if outer else out.detach()


def _dwconv_fast(q, k, v, kernel, scale):
    """dL/dW[c, a, b] = -(s/hw) sum_{y,x} v[c, y, x] k[c, y + a - 1, x + b - 1] (zero outside the
    grid): nine dot products of v with shifted views of the zero-padded k (cheaper than unfolding
    k into a nine-fold copy, or a conv with an h x w kernel)."""
    B, C, h, w = k.shape
    padded, e = F.pad(k, (1, 1, 1, 1)), v * (-scale / (h * w))
    g = torch.stack([(padded[..., a:a + h, b:b + w] * e).sum((-2, -1))
                     for a in range(3) for b in range(3)], dim=-1)
    return _dwconv(q, kernel.reshape(1, C, 3, 3) - normalise_step(g.reshape(B, C, 3, 3), (-2, -1)))


def ttt_dwconv(q, k, v, kernel, scale: float) -> torch.Tensor:
    """x2 = conv(q, K') with K' = K - step(dL/dK); q, k, v (B, C, h, w) images, kernel (C, 1, 3, 3)
    (one 3x3 filter per channel, shared by the samples until the step)."""
    dtype, ct = v.dtype, compute_dtype(v)
    args = [t.to(ct) for t in (q, k, v, kernel)]
    core = _dwconv_reference if ttt_path(q, "dwconv") == "reference" else _dwconv_fast
    with _no_autocast(q):
        return core(*args, scale).to(dtype)
