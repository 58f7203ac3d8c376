"""The fast PyTorch path of bidirectional linear attention: one autograd Function, all in bmm.

    o = phi(q) S / (phi(q) z + eps)   (normalised)   or   o = phi(q) S   (unnormalised),
    S = phi(k)^T v,  z = sum_n phi(k_n).

Why it is faster than the einsum reference (see `linvit bench`): the reference lets autograd save
and differentiate every intermediate (feature maps, numerator, denominator, the division), and
each einsum may permute its operands into copies. Here the normaliser rides along as an extra
column of ones on V, so the state [S | z] and the output [num | den] are one bmm each; the
backward pass is four bmm calls on the same augmented matrices:

    dnum1 = [dO / den, -(dO . o) / den]        (N, Dv+1)
    dphi_q = dnum1 S1^T      dS1 = phi_q^T dnum1
    dphi_k = v1 dS1^T        dv  = phi_k dS1[:, :Dv]

Only phi(q), phi(k), the augmented V and the output are kept for backward: memory stays linear in N.
Everything is computed in float32, as in the reference.
"""
from __future__ import annotations

import torch

FEATURES = ("identity", "elu1")


def feature(x: torch.Tensor, kind: str) -> torch.Tensor:
    x = x.float()
    if kind == "elu1":
        return torch.nn.functional.elu(x) + 1.0
    return x


def _feature_grad(phi: torch.Tensor, grad: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "elu1":
        # d(elu(x)+1)/dx = 1 for x > 0, exp(x) = phi otherwise; phi > 1 exactly when x > 0.
        return torch.where(phi > 1.0, grad, grad * phi)
    return grad


class FusedLinearAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, kind: str, normalize: bool, eps: float):
        phi_q, phi_k = feature(q, kind), feature(k, kind)
        v1 = v.float()
        if normalize:
            v1 = torch.cat([v1, v1.new_ones(v1.shape[:-1] + (1,))], dim=-1)
        s1 = phi_k.transpose(-2, -1) @ v1                       # (B, H, Dk, Dv[+1])
        out1 = phi_q @ s1                                        # (B, H, N, Dv[+1])
        if normalize:
            den = out1[..., -1:] + eps
            out = out1[..., :-1] / den
        else:
            den, out = None, out1
        ctx.save_for_backward(phi_q, phi_k, v1, s1, out, den)
        ctx.kind, ctx.normalize = kind, normalize
        ctx.dtypes = (q.dtype, k.dtype, v.dtype)
        return out.to(v.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        phi_q, phi_k, v1, s1, out, den = ctx.saved_tensors
        g = grad_out.float()
        if ctx.normalize:
            dnum = g / den
            dden = -(dnum * out).sum(dim=-1, keepdim=True)
            dnum1 = torch.cat([dnum, dden], dim=-1)
        else:
            dnum1 = g
        dphi_q = dnum1 @ s1.transpose(-2, -1)
        ds1 = phi_q.transpose(-2, -1) @ dnum1
        dphi_k = v1 @ ds1.transpose(-2, -1)
        dv = phi_k @ ds1[..., :out.shape[-1]]
        dq = _feature_grad(phi_q, dphi_q, ctx.kind)
        dk = _feature_grad(phi_k, dphi_k, ctx.kind)
        tq, tk, tv = ctx.dtypes
        return dq.to(tq), dk.to(tk), dv.to(tv), None, None, None


def fused_linear_attention(q, k, v, kind: str = "identity", normalize: bool = True,
                           eps: float = 1e-6) -> torch.Tensor:
    return FusedLinearAttention.apply(q, k, v, kind, normalize, eps)
