"""Shared by test_kernels.py and interpreted/test_triton.py: random inputs and the reference."""
from __future__ import annotations

import torch

from linvit.ops.backends import backend
from linvit.ops.definitions import FEATURES
from linvit.ops.linear_attention import linear_attention

# (feature map, normalised): every map the backends define, both ways. Operators use three of them
# (linear: elu1; focused/hedgehog: identity on positive features; inline: identity, unnormalised).
VARIANTS = [(kind, normalize) for kind in FEATURES for normalize in (True, False)]


def inputs(shape=(2, 3, 63, 24), dv=40, dtype=torch.float32, kind="elu1", normalize=True,
           seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(shape, generator=g) for _ in range(2))
    if kind == "identity" and normalize:        # features must be positive for a normaliser
        q, k = q.abs() + 0.05, k.abs() + 0.05
    v = torch.randn(shape[:-1] + (dv,), generator=g)
    grad = torch.randn(shape[:-1] + (dv,), generator=g)
    return [t.to(dtype) for t in (q, k, v)], grad.to(dtype)


def operator_off_init(name, side=7, seed=0):
    """An operator of 4 heads of 24 on a side x side grid (+ cls), its own parameters moved off
    their init (zero gate weights would make gates' gradient paths trivially alike): (op, own)."""
    from linvit.attention import OPERATORS
    torch.manual_seed(seed)
    op = OPERATORS[name](96, num_heads=4)
    op.set_token_layout(1, (side, side))
    own = [p for n, p in op.named_parameters() if n in op.operator_specific_parameters()]
    with torch.no_grad():
        for p in own:
            p.add_(0.1 * torch.randn_like(p))
    return op, own


def on_backends(fn, qkv, grad, own, names=("reference", "torch")):
    """fn's output and the gradients of q, k, v and `own` on each backend, by name."""
    results = {}
    for name in names:
        leaves = [t.clone().requires_grad_() for t in qkv]
        with backend(name):
            out = fn(*leaves)
        results[name] = (out, *torch.autograd.grad(out, leaves + own, grad, allow_unused=True))
    return results


def run(name, qkv, grad, kind, normalize, **kw):
    """Output and input gradients of one backend."""
    leaves = [t.detach().clone().requires_grad_() for t in qkv]
    if name == "triton-direct":
        from linvit.ops.triton_kernels import triton_linear_attention
        out = triton_linear_attention(*leaves, kind, normalize, **kw)
    else:
        with backend(name):
            out = linear_attention(*leaves, kind, normalize)
    return (out, *torch.autograd.grad(out, leaves, grad))


def assert_match(got, want, rtol=1e-5, atol=1e-5):
    """Output, input gradients and any further gradients (operators' own parameters): all of
    them, so that a missing or extra gradient fails too."""
    assert len(got) == len(want), (len(got), len(want))
    names = ("out", "dq", "dk", "dv", *(f"grad {i}" for i in range(4, len(want))))
    for name, a, b in zip(names, got, want):
        if a is None or b is None:                   # a parameter neither path reached
            assert a is None and b is None, f"{name}: a gradient on one path only"
            continue
        assert a.dtype == b.dtype, name
        scale = b.float().abs().max().clamp_min(1.0)
        err = (a.float() - b.float()).abs().max() / scale
        assert err <= max(rtol, atol), f"{name}: max error {err:.2e} (relative to {scale:.2f})"
