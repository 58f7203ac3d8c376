"""linvit's C++ CPU kernel for linear attention: awkward shapes against the reference, how it is
chosen, built and refused. (The cases every CPU path shares run on it in test_kernels.py.)"""
from __future__ import annotations

import logging
import os
import shutil

import pytest
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

from linvit.attention import OPERATORS
from linvit.ops import cpp_kernels
from linvit.ops.backends import backend
from linvit.ops.definitions import NORMALISER_EPS
from linvit.ops.linear_attention import focused_linear_attention, linear_attention
from linvit.runs.environment import environment

from kernel_cases import VARIANTS, assert_match, inputs, on_backends, operator_off_init, run

needs_compiler = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None,
                                    reason="no C++ compiler to build linvit's CPU kernel")


@pytest.fixture
def fresh_state(monkeypatch):
    """load() asks again from scratch; the process's answer is restored afterwards."""
    monkeypatch.setattr(cpp_kernels, "_STATE", {})


@needs_compiler
@pytest.mark.parametrize("kind,normalize", VARIANTS)
def test_the_cpu_default_runs_the_kernel_where_there_is_something_to_fuse(kind, normalize):
    """A feature map or a normaliser: the kernel; neither (InLine's core): batched bmm."""
    q, k, v = (torch.rand(1, 2, 9, 8, requires_grad=True) for _ in range(3))
    with backend("torch"):
        out = linear_attention(q, k, v, kind, normalize)
    kernel = kind != "identity" or normalize
    assert type(out.grad_fn).__name__ == ("CppLinearAttentionBackward" if kernel
                                          else "FusedLinearAttentionBackward")


@needs_compiler
@pytest.mark.parametrize("kind,normalize", VARIANTS)
@pytest.mark.parametrize("shape,dv,rows", [
    ((1, 1, 1, 8), 8, 4),            # one token
    ((2, 3, 37, 24), 40, 8),         # tokens not a multiple of the block, Dk != Dv
    ((1, 2, 16, 16), 16, 16),        # exactly one block
    ((3, 1, 70, 5), 3, 512),         # narrow heads, one block shorter than the default
])
def test_kernel_matches_reference_on_awkward_shapes(monkeypatch, kind, normalize, shape, dv,
                                                    rows):
    monkeypatch.setattr(cpp_kernels, "ROWS", rows)
    assert cpp_kernels.load(), cpp_kernels.status()      # called directly: nothing else loads it
    qkv, grad = inputs(shape, dv, kind=kind, normalize=normalize, seed=3)
    leaves = [t.clone().requires_grad_() for t in qkv]   # the kernel called directly: the
    out = cpp_kernels.cpp_linear_attention(*leaves, kind, normalize, NORMALISER_EPS)  # dispatch
    got = (out, *torch.autograd.grad(out, leaves, grad))  # leaves (identity, unnormalised) to bmm
    assert_match(got, run("reference", qkv, grad, kind, normalize))


@needs_compiler
def test_kernel_takes_strided_and_half_precision_inputs():
    """q, k, v as a qkv projection splits them (non-contiguous), and bf16 as autocast gives them:
    computed in float32, returned in the input's dtype."""
    qkv = torch.randn(2, 30, 3, 4, 16).permute(2, 0, 3, 1, 4)        # (3, B, H, N, d), strided
    q, k, v = qkv.unbind(0)
    grad = torch.randn(2, 4, 30, 16)
    assert not q.is_contiguous()
    for inputs_ in ([q, k, v], [t.bfloat16() for t in (q, k, v)]):   # the kernel, not a fallback
        with backend("torch"):
            out = linear_attention(*(t.clone().requires_grad_() for t in inputs_), "elu1", True)
        assert type(out.grad_fn).__name__ == "CppLinearAttentionBackward", inputs_[0].dtype
    assert_match(run("torch", [q, k, v], grad, "elu1", True),
                 run("reference", [q, k, v], grad, "elu1", True))
    half = [t.bfloat16() for t in (q, k, v)]
    got = run("torch", half, grad.bfloat16(), "elu1", True)
    assert all(t.dtype == torch.bfloat16 for t in got)
    assert_match(got, run("reference", half, grad.bfloat16(), "elu1", True), rtol=2e-2)


@needs_compiler
def test_kernel_compiles_into_a_model_graph(fresh_state):
    """torch.compile traces forward and backward through the ops (AOT autograd, on their fake
    kernels) in one graph, with the eager results, even where the first question whether the
    kernel loads comes inside the trace (a compiled model's first step)."""
    def step(fn):
        leaves = [t.clone().requires_grad_() for t in qkv]
        out = fn(*leaves)
        return out, *torch.autograd.grad(out.square().sum(), leaves)
    qkv = [torch.randn(1, 2, 20, 8), torch.randn(1, 2, 20, 8), torch.randn(1, 2, 20, 12)]
    torch._dynamo.reset()
    with backend("torch"):
        got = step(torch.compile(lambda q, k, v: linear_attention(q, k, v, "elu1"),
                                 backend="aot_eager", fullgraph=True))
        want = step(lambda q, k, v: linear_attention(q, k, v, "elu1"))
    assert cpp_kernels.status() == "C++ kernels"
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


@needs_compiler
@pytest.mark.parametrize("name", ["deltanet", "gla", "mamba2"])
def test_scan_kernels_compile_into_a_model_graph(name):
    """The gated-scan and delta-rule ops under torch.compile (AOT autograd on their fake
    kernels): the eager kernel's output and gradients, the ops seen in the graph."""
    assert cpp_kernels.load(), cpp_kernels.status()
    op, own = operator_off_init(name)
    qkv, grad = inputs((1, 4, 50, 24), 24)

    def step(fn):
        leaves = [t.clone().requires_grad_() for t in qkv]
        out = fn(*leaves)
        return out, *torch.autograd.grad(out, [*leaves, *own], grad)
    torch._dynamo.reset()
    seen = []

    def spy(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes)
        return make_boxed_func(gm.forward)
    with backend("torch"):
        got = step(torch.compile(op.mix, backend=aot_autograd(fw_compiler=spy)))
        want = step(op.mix)
    assert any("linvit_cpu" in t for t in seen), seen
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_linvit_cpp_0_keeps_the_fused_pytorch_path(monkeypatch, fresh_state):
    monkeypatch.setenv("LINVIT_CPP", "0")
    monkeypatch.setattr(cpp_kernels, "_build", lambda: pytest.fail("must not build"))
    q, k, v = (torch.randn(1, 2, 9, 8, requires_grad=True) for _ in range(3))
    with backend("torch"):
        out = linear_attention(q, k, v, "elu1")
    assert type(out.grad_fn).__name__ == "FusedLinearAttentionBackward"
    assert cpp_kernels.status() == "PyTorch (LINVIT_CPP=0)"


def test_status_says_what_ran_without_building(monkeypatch, fresh_state):
    monkeypatch.setattr(cpp_kernels, "_build", lambda: pytest.fail("must not build"))
    assert cpp_kernels.status() == "not used"
    assert environment()["cpu_kernels"] == "not used"


def test_a_kernel_that_cannot_build_falls_back_and_says_why_once(monkeypatch, fresh_state,
                                                                  caplog):
    calls = []

    def broken():
        calls.append(1)
        raise RuntimeError("Error building extension 'linvit_cpu'\nc++: not found")
    monkeypatch.setattr(cpp_kernels, "_build", broken)
    qkv, grad = inputs((1, 2, 9, 8), 8)
    with caplog.at_level(logging.WARNING, logger="linvit"):
        got = [run("torch", qkv, grad, "elu1", True) for _ in range(3)]
    assert len(calls) == 1                                   # tried once per process
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "c++: not found" in warned[0] and "PyTorch paths" in warned[0]
    assert cpp_kernels.status().startswith("PyTorch (RuntimeError")
    assert_match(got[0], run("reference", qkv, grad, "elu1", True))


def test_build_key_follows_the_source_torch_and_cpu(monkeypatch, tmp_path):
    """A binary is never loaded for another source, torch or CPU than it was compiled for."""
    key = cpp_kernels.build_key()
    assert cpp_kernels.build_key() == key
    with monkeypatch.context() as m:
        m.setattr(cpp_kernels, "cpu_model", lambda: "another CPU")
        assert cpp_kernels.build_key() != key
    with monkeypatch.context() as m:
        m.setattr(torch, "__version__", "0.0.0")
        assert cpp_kernels.build_key() != key
    sources = sorted(cpp_kernels.CSRC.iterdir())
    assert {"blas.h", "linear_attention.cpp", "delta_rule.cpp"} <= {f.name for f in sources}
    for edited in sources:                    # each source and header, one at a time
        copy = tmp_path / edited.name
        shutil.copytree(cpp_kernels.CSRC, copy)
        (copy / edited.name).write_bytes(edited.read_bytes() + b"\n// edited\n")
        monkeypatch.setattr(cpp_kernels, "CSRC", copy)
        assert cpp_kernels.build_key() != key, edited.name


@needs_compiler
@pytest.mark.parametrize("p", [3.0, 2.0, 1.5])
@pytest.mark.parametrize("shape,rows", [((2, 3, 37, 24), 8), ((1, 2, 5, 8), 512)])
def test_focused_map_inside_the_kernel_matches_reference(monkeypatch, p, shape, rows):
    """FLatten's focused features computed on each block (and p = 3 written out), with the
    gradient of its per-(head, channel) scale, against the reference features and core."""
    monkeypatch.setattr(cpp_kernels, "ROWS", rows)
    g = torch.Generator().manual_seed(5)
    qkv = [torch.randn(shape, generator=g) for _ in range(3)]
    qkv[0][..., :3] = -1.0                             # rows with channels at the floor
    scale = 0.3 * torch.randn(1, shape[1], 1, shape[-1], generator=g)
    grad = torch.randn(shape, generator=g)
    results = {}
    for name in ("reference", "torch"):
        leaves = [t.clone().requires_grad_() for t in (*qkv, scale)]
        with backend(name):
            out = focused_linear_attention(*leaves, p)
        results[name] = (out, *torch.autograd.grad(out, leaves, grad))
    assert type(out.grad_fn).__name__ == "CppLinearAttentionBackward"
    assert_match(results["torch"], results["reference"], rtol=2e-5)


@needs_compiler
@pytest.mark.parametrize("name", [n for n, op in OPERATORS.items() if op.family == "feature map"])
def test_feature_map_operators_take_the_kernel_across_blocks(monkeypatch, name):
    """Every feature-map operator's core in the kernel, split into many blocks (the last one
    short), with its own parameters' gradients (focused's scale, Hedgehog's maps), against the
    reference path."""
    monkeypatch.setattr(cpp_kernels, "ROWS", 8)
    op, own = operator_off_init(name, side=11, seed=1)   # 122 tokens: past CENTRED_MIN_TOKENS
    qkv, grad = inputs((2, 4, 122, 24), 24, seed=2)
    results = on_backends(op.global_mix, qkv, grad, own)
    assert type(results["torch"][0].grad_fn).__name__ == "CppLinearAttentionBackward"
    assert_match(results["torch"], results["reference"], rtol=2e-5)


@needs_compiler
def test_inline_takes_the_kernel_from_its_threshold_on(monkeypatch):
    op = OPERATORS["inline"](48, num_heads=2)
    n = cpp_kernels.CENTRED_MIN_TOKENS
    for tokens, kernel in ((n - 1, False), (n, True)):
        q, k, v = (torch.randn(1, 2, tokens, 24, requires_grad=True) for _ in range(3))
        with backend("torch"):
            out = op.global_mix(q, k, v)
        assert (type(out.grad_fn).__name__ == "CppLinearAttentionBackward") == kernel, tokens


@needs_compiler
def test_inline_in_the_kernel_is_as_precise_as_the_reference_when_means_dominate():
    """Keys and values far from zero (means 100x their spread): against InLine's formula in
    float64, the kernel (keys centred in each block before the product) errs no more than the
    float32 reference path does (centring on the sums, S - N kbar vbar^T, erred 7x more)."""
    op, own = operator_off_init("inline", side=11)
    qkv, grad = inputs((1, 4, 122, 24), 24, seed=4)
    qkv[1], qkv[2] = qkv[1] + 100.0, qkv[2] + 100.0

    def truth(q, k, v):
        q, k, v = q.double(), k.double(), v.double()
        state = (k - k.mean(2, keepdim=True)).transpose(-1, -2) @ v
        return v.mean(2, keepdim=True) + op.scale * q @ state
    results = on_backends(op.global_mix, qkv, grad, own)
    want = on_backends(truth, qkv, grad.double(), [], names=("reference",))["reference"]
    assert type(results["torch"][0].grad_fn).__name__ == "CppLinearAttentionBackward"
    for i, name in enumerate(("out", "dq", "dk", "dv")):
        err = {be: ((r[i].double() - want[i]).abs().max() / want[i].abs().max()).item()
               for be, r in results.items()}
        assert err["torch"] <= max(1.5 * err["reference"], 2e-5), (name, err)   # 2e-5: float32


@needs_compiler
def test_a_built_kernel_is_loaded_as_it_is_and_a_broken_one_rebuilt(monkeypatch, fresh_state,
                                                                     tmp_path, caplog):
    """A kernel built before for the same key loads without cpp_extension (which rebuilds for a
    checkout at another path); an unreadable file is rebuilt, with a warning."""
    from torch.utils import cpp_extension
    assert cpp_kernels.load()                          # built (or loaded) in this process
    built = []
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: built.append(kw["build_directory"]))
    monkeypatch.setattr(cpp_kernels, "_STATE", {})
    assert cpp_kernels.load() and built == []          # the real cache: loaded as it is
    monkeypatch.setenv("LINVIT_CACHE", str(tmp_path))
    key = cpp_kernels.build_key()
    broken = tmp_path / "cpp" / key / f"linvit_cpu_{key}.so"
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"not a library")
    monkeypatch.setattr(cpp_kernels, "_STATE", {})
    with caplog.at_level(logging.WARNING, logger="linvit"):
        assert cpp_kernels.load()
    assert built == [str(broken.parent)]
    assert any("rebuilding" in r.getMessage() for r in caplog.records)


@needs_compiler
def test_disabled_runs_the_fused_path_inside_the_block_only():
    q, k, v = (torch.randn(1, 2, 9, 8, requires_grad=True) for _ in range(3))
    with backend("torch"):
        with cpp_kernels.disabled():
            off = linear_attention(q, k, v, "elu1")
        on = linear_attention(q, k, v, "elu1")
        wrapped = cpp_kernels.disabled()(lambda: linear_attention(q, k, v, "elu1"))
        twice = [wrapped(), wrapped()]                 # as a decorator: off on every call
    assert type(off.grad_fn).__name__ == "FusedLinearAttentionBackward"
    assert type(on.grad_fn).__name__ == "CppLinearAttentionBackward"
    assert all(type(t.grad_fn).__name__ == "FusedLinearAttentionBackward" for t in twice)


def _scan_call(op, q, k, v, chunk=4, decays=1, weights=None):
    bh, n = q.shape[:2]
    if op == "delta":
        return torch.ops.linvit_cpu.delta_forward(q, k, v, torch.rand(2, bh, n), chunk)
    w = torch.empty(0) if weights is None else weights
    return torch.ops.linvit_cpu.gated_forward(q, k, v, -torch.rand(2, bh, n, decays), w, chunk,
                                              False)


@needs_compiler
@pytest.mark.parametrize("op, case, message", [
    *((op, case, message) for op in ("delta", "gated") for case, message in (
        ("float64", "must be a contiguous float32 CPU tensor"),
        ("ragged", "are not whole chunks of 4"),
        ("shapes", "disagree"))),
    ("gated", "weights", "key weights")])
def test_scan_ops_name_bad_input_before_computing(op, case, message):
    """Called directly, the ops check their inputs and say what is wrong (the Python sides pad
    and cast, so these guard misuse)."""
    assert cpp_kernels.load(), cpp_kernels.status()
    q, k, v = (torch.randn(3, 8, 6) for _ in range(3))
    first = lambda t, n: t[:, :n].contiguous()                   # noqa: E731
    args = {"float64": (q.double(), k, v), "ragged": (first(q, 6), first(k, 6), first(v, 6)),
            "shapes": (q, first(k, 4), v), "weights": (q, k, v)}[case]
    kwargs = {"decays": 6, "weights": torch.rand(2, 3, 8)} if case == "weights" else {}
    with pytest.raises(RuntimeError, match=message):
        _scan_call(op, *args, **kwargs)


@needs_compiler
@pytest.mark.parametrize("name", list(OPERATORS))
def test_each_operator_declares_the_kernels_its_cpu_path_runs(name):
    """An operator's cpp_sources are the .cpp files whose ops its float32 CPU forward and
    backward call (seen by torch's profiler): what joins its jobs' code stamps."""
    from linvit.attention import get_operator

    assert cpp_kernels.load(), cpp_kernels.status()
    torch.manual_seed(0)
    op = get_operator(name)(48, num_heads=2)
    op.set_token_layout(1, (10, 10))                       # past InLine's kernel threshold
    x = torch.randn(2, 101, 48, requires_grad=True)
    with backend("torch"), torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        op(x).square().sum().backward()
    called = {e.name.split("::", 1)[1] for e in prof.events()
              if e.name.startswith("linvit_cpu::")}
    ran = {cpp.name for cpp in cpp_kernels.CSRC.glob("*.cpp")
           if cpp_kernels.kernel_ops(cpp.name) & called}
    assert ran == set(OPERATORS[name].cpp_sources), called
