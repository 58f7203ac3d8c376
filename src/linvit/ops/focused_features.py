"""FLatten's focused feature map, phi_p(x) = ||x'|| x'^p / ||x'^p||, x' = (relu(x) + 1e-6) / sp,
sp = softplus(s) per channel: a reference (autograd) and a fused Function with its backward
written out.

Autograd through the reference keeps about ten (N, d) intermediates and runs as many elementwise
kernels backward; the fused version keeps x' and phi and does the backward in a few in-place
passes. With n1 = ||x'||, n2 = ||x'^p||, phi = n1 x'^p / n2 and one row dot gd = sum_d G phi:

    g_x' = p x'^(p-1) (n1 G - phi gd / n1) / n2 + x' gd / n1^2
    g_x  = g_x' / sp * [x > 0],   g_sp = -sum_{b,n} g_x' x' / sp,   g_s = g_sp sigmoid(s)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

FLOOR = 1e-6


def focused_features_reference(x: torch.Tensor, scale: torch.Tensor, p: float) -> torch.Tensor:
    x = (F.relu(x.float()) + FLOOR) / F.softplus(scale.float())
    x_pow = x ** p
    # x >= FLOOR / softplus(s) keeps ||x^p|| well above 0 for p <= 3 in float32.
    return x.norm(dim=-1, keepdim=True) * x_pow / x_pow.norm(dim=-1, keepdim=True)


class FocusedFeatures(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)   # float32 under autocast
    def forward(ctx, x, scale, p: float):
        sp = F.softplus(scale.float())
        xs = torch.relu(x.float()).add_(FLOOR).div_(sp)                 # x'
        n1 = torch.linalg.vector_norm(xs, dim=-1, keepdim=True)
        y = xs * xs * xs if p == 3.0 else xs.pow(p)
        n2 = torch.linalg.vector_norm(y, dim=-1, keepdim=True)
        phi = y.mul_(n1 / n2)                                            # in place: y is done
        ctx.save_for_backward(x, scale, xs, phi, n1, n2)
        ctx.p = p
        return phi

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad):
        x, scale, xs, phi, n1, n2 = ctx.saved_tensors
        p, g = ctx.p, grad.float()
        gd = (g * phi).sum(dim=-1, keepdim=True)
        g_xs = g.mul(n1).addcmul_(phi, gd / n1, value=-1.0).mul_(p / n2)
        if p == 3.0:                                   # FLatten's default: no pow kernel
            g_xs.mul_(xs).mul_(xs)
        else:
            g_xs.mul_(xs.pow(p - 1))
        g_xs.addcmul_(xs, gd / n1.square())
        sp = F.softplus(scale.float())
        g_sp = -(g_xs * xs).sum(dim=(0, 2), keepdim=True).div_(sp)
        # relu's derivative as sign(relu(x)) in {0, 1}: masked_fill_ is ~15x slower on CPU
        g_x = g_xs.div_(sp).mul_(torch.relu(x.float()).sign_())
        g_scale = (g_sp * torch.sigmoid(scale.float())).to(scale.dtype)
        return g_x.to(x.dtype), g_scale, None


def focused_features(x: torch.Tensor, scale: torch.Tensor, p: float,
                     fused: bool = True) -> torch.Tensor:
    if fused:
        return FocusedFeatures.apply(x, scale, p)
    return focused_features_reference(x, scale, p)
