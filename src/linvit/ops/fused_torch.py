"""The fast PyTorch path of bidirectional linear attention: one autograd Function, all in bmm.

    o = phi(q) S / (phi(q) z + eps)   (normalised)   or   o = phi(q) S   (unnormalised),
    S = phi(k)^T v,  z = sum_n phi(k_n).

Why it is faster than the einsum reference (see `linvit bench`): the reference lets autograd save
and differentiate every intermediate (feature maps, numerator, denominator, the division) through
generic elementwise kernels. Here the backward pass is written out, as six matrix products plus a
few in-place elementwise passes:

    forward   S = phi_k^T v,  z = sum_n phi_k,  o = (phi_q S) / (phi_q z + eps)
    backward  dnum = dO / den,  dden = -(dnum . o)
              dphi_q = dnum S^T + dden z^T     dS = phi_q^T dnum     dz = phi_q^T dden
              dphi_k = v dS^T + dz             dv = phi_k dS

(An extra column of ones on V would fold z and den into the same products, but odd widths such as
65 make MKL's batched GEMM up to 2x slower than 64: the separate mat-vecs are cheaper.)
Only phi(q), phi(k), v, S, z, the output and its denominator are kept for backward: memory stays
linear in N. Everything is computed in float32, as in the reference.
"""
from __future__ import annotations

import torch

from linvit.ops.definitions import NORMALISER_EPS, feature, feature_grad


class FusedLinearAttention(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)   # float32 under autocast
    def forward(ctx, q, k, v, kind: str, normalize: bool, eps: float):
        phi_q, phi_k, v32 = feature(q, kind), feature(k, kind), v.float()
        s = phi_k.transpose(-2, -1) @ v32                       # (B, H, Dk, Dv)
        out = phi_q @ s                                          # (B, H, N, Dv)
        z = den = None
        if normalize:
            z = phi_k.sum(dim=-2, keepdim=True)                  # (B, H, 1, Dk)
            den = (phi_q @ z.transpose(-2, -1)).add_(eps)        # (B, H, N, 1)
            out.div_(den)
        ctx.save_for_backward(phi_q, phi_k, v32, s, z, out, den)
        ctx.kind, ctx.normalize = kind, normalize
        ctx.dtypes = (q.dtype, k.dtype, v.dtype)
        return out.to(v.dtype)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad_out):
        phi_q, phi_k, v32, s, z, out, den = ctx.saved_tensors
        g = grad_out.float()
        if ctx.normalize:
            dnum = g / den
            dden = -(dnum * out).sum(dim=-1, keepdim=True)       # (B, H, N, 1)
            dphi_q = (dnum @ s.transpose(-2, -1)).addcmul_(dden, z)
            ds = phi_q.transpose(-2, -1) @ dnum
            dz = (phi_q * dden).sum(dim=-2, keepdim=True)       # (B, H, 1, Dk); a mat-vec
            # as bmm runs ~6x slower than this multiply-and-sum on CPU
            dphi_k = (v32 @ ds.transpose(-2, -1)).add_(dz)
        else:
            dphi_q = g @ s.transpose(-2, -1)
            ds = phi_q.transpose(-2, -1) @ g
            dphi_k = v32 @ ds.transpose(-2, -1)
        dv = phi_k @ ds
        dq = feature_grad(phi_q, dphi_q, ctx.kind)
        dk = feature_grad(phi_k, dphi_k, ctx.kind)
        tq, tk, tv = ctx.dtypes
        return dq.to(tq), dk.to(tk), dv.to(tv), None, None, None


def fused_linear_attention(q, k, v, kind: str = "identity", normalize: bool = True,
                           eps: float = NORMALISER_EPS) -> torch.Tensor:
    return FusedLinearAttention.apply(q, k, v, kind, normalize, eps)
