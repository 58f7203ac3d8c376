"""The fast paths of linear attention against the einsum reference, forward and backward.

The Triton kernels run under Triton's CPU interpreter in a separate process (tests/ops/interpreted):
the interpreter must be chosen before triton is first imported, and this process imported it long
ago (through torch).
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from linvit.attention import OPERATORS
from linvit.ops import backends, paths
from linvit.ops.backends import backend, resolve_backend, triton_available
from linvit.ops.definitions import FEATURES
from linvit.ops.linear_attention import linear_attention

from kernel_cases import VARIANTS, assert_match, inputs, on_backends, operator_off_init, run

HERE = Path(__file__).parent


@pytest.mark.parametrize("kind,normalize", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_torch_matches_reference(kind, normalize, dtype, cpu_path):
    qkv, grad = inputs((2, 3, 63, 24), 40, dtype=dtype, kind=kind, normalize=normalize)
    want = run("reference", qkv, grad, kind, normalize)
    got = run("torch", qkv, grad, kind, normalize)
    assert_match(got, want, rtol=1e-5 if dtype == torch.float32 else 2e-2)


def test_fused_torch_is_float64_exact_where_the_reference_is(cpu_path):
    """Both compute in float32; with float64 inputs they must still agree to float32 precision,
    and the output keeps the input dtype."""
    qkv, grad = inputs((1, 2, 17, 8), 8, dtype=torch.float64)
    got = run("torch", qkv, grad, "elu1", True)
    assert got[0].dtype == torch.float64
    assert_match(got, run("reference", qkv, grad, "elu1", True))


def test_elu_gradient_at_zero_and_far_below(cpu_path):
    """elu'(0) = 1 and elu'(-100) = exp(-100) ~ 0: the fused backward reads both off phi."""
    q = torch.tensor([0.0, -100.0, 2.0]).reshape(1, 1, 3, 1).expand(1, 1, 3, 16).contiguous()
    qkv = [q, torch.ones_like(q), torch.randn(1, 1, 3, 16)]
    grad = torch.randn(1, 1, 3, 16)
    assert_match(run("torch", qkv, grad, "elu1", True), run("reference", qkv, grad, "elu1", True))


def test_auto_backend_on_cpu_is_the_fused_path_and_names_are_checked():
    assert resolve_backend(torch.zeros(1)) == "torch"
    with pytest.raises(ValueError, match="unknown linear-attention backend"), \
            backend("cuda-magic"):
        pass
    with pytest.raises(ValueError, match="unknown feature map"):
        linear_attention(torch.ones(1, 1, 2, 2), torch.ones(1, 1, 2, 2), torch.ones(1, 1, 2, 2),
                         kind="relu")


@pytest.mark.parametrize("name", list(OPERATORS))      # softmax too: it must ignore the backend
def test_every_operator_mixes_alike_on_every_cpu_backend(name, cpu_path):
    """Off their init (zero gate weights would make the gates' gradient paths trivially alike),
    and the operator's own parameters' gradients compared too."""
    op, own = operator_off_init(name)
    qkv, grad = inputs((2, 4, 50, 24), 24)
    results = on_backends(op.mix, qkv, grad, own)
    assert_match(results["torch"], results["reference"])


@pytest.mark.skipif(not torch.cuda.is_available() or not triton_available(),
                    reason="needs CUDA and triton")
@pytest.mark.parametrize("kind", list(FEATURES))
def test_triton_core_under_torch_compile_on_cuda_matches_eager(kind):
    """Inductor passes the kernels' Python float eps as a float64 scalar: the normaliser must
    stay float32 (it broke the compiled training step on an H200). The interpreter cannot show
    this: it takes every float as float32."""
    q, k, v = (torch.randn(2, 3, 300, 64, device="cuda", requires_grad=True) for _ in range(3))

    def step(q, k, v):
        out = linear_attention(q, k, v, kind)
        return out, torch.autograd.grad(out.square().sum(), (q, k, v))
    torch._dynamo.reset()
    with backend("triton"):            # outside the trace: the compiled call must take it too
        want, got = step(q, k, v), torch.compile(step)(q, k, v)
    for a, b in zip((got[0], *got[1]), (want[0], *want[1])):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_triton_takes_heads_up_to_its_limit_and_wider_ones_fall_back_with_one_warning(
        monkeypatch, caplog):
    """The dispatch alone, on the CPU: a spy stands in for the Triton kernels."""
    from linvit.ops import triton_kernels

    taken = []
    monkeypatch.setattr(triton_kernels, "triton_linear_attention",
                        lambda q, k, v, *rest: taken.append((q.shape[-1], v.shape[-1])) or v)
    paths.forget()                                     # "once" counts from this test on
    limit = triton_kernels.MAX_HEAD_DIM

    def call(dk, dv):
        q, k = torch.rand(1, 2, 5, dk), torch.rand(1, 2, 5, dk)
        return q, k, torch.rand(1, 2, 5, dv)

    with backend("triton"), caplog.at_level(logging.WARNING, logger="linvit"):
        linear_attention(*call(limit, limit), "elu1")
        wide = call(limit + 1, 8)
        outs = [linear_attention(*wide, "elu1") for _ in range(3)]
        linear_attention(*call(8, limit + 1), "elu1")
    assert taken == [(limit, limit)]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 2, warned                    # once per distinct head dims
    assert f"({limit + 1}, 8)" in warned[0] and f"(8, {limit + 1})" in warned[1]
    assert all(str(limit) in w and "; using the " in w for w in warned)
    with backend("torch"):
        assert torch.equal(outs[0], linear_attention(*wide, "elu1"))


def test_triton_feature_codes_are_keyed_by_the_python_feature_maps():
    pytest.importorskip("triton")
    # imported directly, not through triton_available(), which would turn a failure into a skip
    from linvit.ops.triton_kernels import FEATURE_CODES

    assert FEATURE_CODES.keys() == FEATURES.keys()
    assert len(set(FEATURE_CODES.values())) == len(FEATURE_CODES)


def test_triton_availability_compiles_without_a_warning_or_a_graph_break():
    """A compiled model asks on every trace (resolve_backend), first with nothing cached: dynamo
    must trace it in one graph and not warn that it ignores a functools cache (seen on CUDA)."""
    def f(x):
        return x + 1 if triton_available() else x - 1
    torch._dynamo.reset()
    backends.triton_available.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = torch.compile(f, fullgraph=True, backend="eager")(torch.zeros(2))
    assert torch.equal(out, torch.full((2,), 1.0 if triton_available() else -1.0))


@pytest.mark.parametrize("missing, warns", [("triton", False), ("linvit.ops.triton_kernels", True)])
def test_triton_that_cannot_load_is_said_unless_simply_absent(monkeypatch, caplog, missing, warns):
    monkeypatch.delitem(sys.modules, "linvit.ops.triton_kernels", raising=False)
    monkeypatch.setitem(sys.modules, missing, None)    # None in sys.modules: that import fails
    backends.triton_available.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="linvit"):
            assert not triton_available()
    finally:
        backends.triton_available.cache_clear()        # the real answer for later tests
    assert any("Triton kernels unavailable" in r.getMessage() for r in caplog.records) == warns


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_triton_kernels_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    # -n 0: one process (pyproject's -n 3 would start three, each importing torch, for one file)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-n", "0", str(HERE / "interpreted")], env=env, cwd=HERE.parents[1],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


@pytest.mark.parametrize("p", [3.0, 2.0])
def test_fused_focused_features_match_autograd(p):
    from linvit.ops.focused_features import focused_features

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 63, 24, generator=g)
    x[0, 0, :5] = -1.0                                # rows at the relu floor
    scale = 0.3 * torch.randn(1, 3, 1, 24, generator=g)
    grad = torch.randn(2, 3, 63, 24, generator=g)
    results = []
    for fused in (False, True):
        leaves = [x.clone().requires_grad_(), scale.clone().requires_grad_()]
        out = focused_features(*leaves, p, fused=fused)
        results.append((out, *torch.autograd.grad(out, leaves, grad)))
    for name, a, b in zip(("phi", "dx", "dscale"), results[1], results[0]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
