"""What every backend of linear attention (reference, fused PyTorch, Triton) shares, defined once:
the feature maps by name and the normaliser's epsilon.

The Triton kernels apply the feature maps inside the kernels (`triton_kernels._phi`); their codes
are keyed by the names in FEATURES, which that module checks when it is imported.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

# Feature maps used here are strictly positive, so the normaliser sum_j phi(q_i).phi(k_j) is > 0
# in exact arithmetic. In float32 it can still underflow to 0 (elu(x)+1 = exp(x) for x < -87, or a
# row of focused features at their floor, focused_features.FLOOR), and 0/0 would turn a whole
# sequence into NaN. 1e-6 is far below any normaliser of a healthy row (>= N * Dk * 1e-12 even at
# the floor for the focused map, and O(N) for elu+1 and softmax maps) yet keeps the all-underflow
# case finite (output -> 0).
NORMALISER_EPS = 1e-6


class FeatureMap(NamedTuple):
    apply: Callable[[torch.Tensor], torch.Tensor]                  # phi(x), x float32
    # (phi, g) -> g * phi'(x), in place on g and read off phi, so backward need not keep x
    grad: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _identity_grad(phi: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    return grad


def _elu1(x: torch.Tensor) -> torch.Tensor:
    # elu(x) + 1 = exp(min(x, 0)) + max(x, 0). Written this way on purpose: on CPU builds
    # where elu runs through a scalar expm1, it is much faster than F.elu (see linvit bench).
    return torch.clamp_max(x, 0.0).exp_() + torch.relu(x)


def _elu1_grad(phi: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    # d(elu(x)+1)/dx = exp(min(x, 0)) = min(phi, 1): read off phi, no mask, no x needed.
    return grad.mul_(torch.clamp_max(phi, 1.0))


FEATURES: dict[str, FeatureMap] = {
    "identity": FeatureMap(_identity, _identity_grad),
    "elu1": FeatureMap(_elu1, _elu1_grad),                         # elu(x) + 1 > 0 everywhere
}


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """What the cores compute in: float32 for half precision (sums over thousands of tokens need
    its bits), float64 kept (the tests compare the paths at float64 precision)."""
    return torch.promote_types(t.dtype, torch.float32)


def feature(x: torch.Tensor, kind: str) -> torch.Tensor:
    """phi(x) in float32, phi = FEATURES[kind]."""
    return FEATURES[kind].apply(x.float())


def feature_grad(phi: torch.Tensor, grad: torch.Tensor, kind: str) -> torch.Tensor:
    """grad * phi'(x), in place on grad, from phi = feature(x, kind)."""
    return FEATURES[kind].grad(phi, grad)


def log_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """F.logsigmoid(x), as min(x, 0) - log(1 + e^-|x|) with a written-out backward off CUDA.

    Why: the CPU build linvit pins runs F.logsigmoid (and log1p) as a scalar loop, where exp and
    log are vectorised; gla takes the log-sigmoid of its gates, (2, B, H, N, d), in every layer
    (timings: docs/2026-12-04-chunk-per-length.md). Precision: log(1 + e) for e = e^-|x| <= 1
    is within half an ulp of 1 of log1p(e) (6e-8 in float32), an absolute error: for large x,
    where logsigmoid(x) ~ -e^-x is that small, the relative error grows and past x ~ 17 (float32)
    the result is 0, which as a log-decay means no decay, as e^-e^-x would round to anyway."""
    if x.is_cuda:
        return torch.nn.functional.logsigmoid(x)
    return _LogSigmoid.apply(x)


class _LogSigmoid(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.clamp_max(x, 0).sub_(x.abs().neg_().exp_().add_(1).log_())

    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        return grad * torch.sigmoid(-x)                     # d logsigmoid(x) / dx = sigmoid(-x)


def unit_rows(x: torch.Tensor, gain: torch.Tensor | None = None,
              eps: float = 1e-12) -> torch.Tensor:
    """gain * x / ||x|| over the last dim (F.normalize's result, eps its clamp of the norm), with
    `gain` broadcast against x's leading dims, e.g. (H, 1, 1) for one gain per head.

    Written out because F.normalize's autograd graph (norm, clamp, division, each saved and
    differentiated) costs several times this one's two passes, which matters for operators that
    normalise q and k of every layer (deltanet)."""
    return _UnitRows.apply(x, gain, eps)


class _UnitRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gain, eps):
        r = torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min_(eps).reciprocal_()
        unit = x * r
        ctx.save_for_backward(unit, r, gain)
        return unit if gain is None else unit * gain

    @staticmethod
    def backward(ctx, grad):
        unit, r, gain = ctx.saved_tensors
        dgain = None
        if gain is not None:
            if ctx.needs_input_grad[1]:                  # sum of grad . unit over what gain spans
                dots = torch.linalg.vecdot(grad, unit).unsqueeze(-1)
                dgain = _sum_to(dots, gain.shape)
            grad = grad * gain
        # d(x / |x|) = (g - u (u . g)) / |x|: the component of g along x does not change x's unit
        along = torch.linalg.vecdot(grad, unit).unsqueeze(-1)
        return torch.addcmul(grad, unit, along, value=-1).mul_(r), dgain, None


def _sum_to(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """t summed over the dims broadcasting expanded to reach t's shape from `shape`."""
    lead = t.dim() - len(shape)
    dims = [*range(lead),
            *(lead + i for i, s in enumerate(shape) if s == 1 and t.shape[lead + i] != 1)]
    return t.sum(dims, keepdim=True).reshape(shape) if dims else t
