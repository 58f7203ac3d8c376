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
    # where elu runs through a scalar expm1, it is ~10x faster than F.elu (see linvit bench).
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
