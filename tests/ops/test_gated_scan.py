"""The bidirectional gated scan (GLA, Mamba-2/SSD) and its two operators.

Every path is held to the others forward and backward in float64 on awkward shapes: the token
recurrence (reference), the chunked path (torch), the explicit map times V, an independently
written double sum, and fla's batch-stacked layout (with a stand-in causal kernel on the CPU; the
real kernels only where CUDA and flash-linear-attention both exist).
"""
from __future__ import annotations

import logging
import math

import pytest
import torch
import torch.nn.functional as F

from linvit.attention.gla import GATE_BIAS, GATE_NORMALISER, GatedLinearAttention
from linvit.attention.mamba2 import A_INIT, DT_INIT, Mamba2Attention
from linvit.ops import cpp_kernels, paths
from linvit.ops import gated_scan as gs
from linvit.ops.backends import backend, triton_available
from linvit.ops.gated_scan import CHUNK, MAX_STEP_DECAY, gated_scan, gated_scan_map
from linvit.ops.gated_scan import chunked as gs_chunked
from linvit.ops.gated_scan import cpp as gs_cpp
from linvit.ops.gated_scan import fla as gs_fla

B, H, D = 2, 3, 24
F64 = torch.float64


def inputs(N, scalar, key_scale=False, seed=0, decay_scale=3.0, dtype=F64):
    """q, k, v, log-decays (2, B, H, N, D or 1), key scales (2, B, H, N, 1) or None, and an output
    gradient. Per-channel decays reach below the floor (logsigmoid(3 x) < -1 for x < ~-0.2)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, D, generator=g, dtype=dtype) for _ in range(3))
    width = 1 if scalar else D
    log_a = F.logsigmoid(decay_scale * torch.randn(2, B, H, N, width, generator=g, dtype=dtype))
    scales = (torch.rand(2, B, H, N, 1, generator=g, dtype=dtype) + 0.1) if key_scale else None
    return q, k, v, log_a, scales, torch.randn(B, H, N, D, generator=g, dtype=dtype)


def leaves(*tensors):
    return [None if t is None else t.detach().clone().requires_grad_() for t in tensors]


def run(fn, q, k, v, log_a, scales, grad):
    """fn's output and its gradients w.r.t. q, k, v, the log-decays and the key scales."""
    ls = leaves(q, k, v, log_a, scales)
    out = fn(*ls)
    wrt = [t for t in ls if t is not None]
    return (out, *torch.autograd.grad(out, wrt, grad, allow_unused=True, materialize_grads=True))


def scan(be, strict, scale=0.7, decay_scale=1.0):
    def fn(q, k, v, log_a, scales):
        with backend(be):
            return gated_scan(q, k, v, log_a, scales, strict, scale, decay_scale)
    return fn


def via_map(strict, scale=0.7, decay_scale=1.0):
    def fn(q, k, v, log_a, scales):
        return gated_scan_map(q, k, log_a, scales, strict, scale, decay_scale) @ v
    return fn


def assert_all_close(got, want, tol=1e-10):
    names = ("out", "dq", "dk", "dv", "dlog_a", "dkey_scale")
    for name, a, b in zip(names, got, want):
        assert a.dtype == b.dtype, name
        err = (a - b).abs().max() / b.abs().max().clamp_min(1.0)
        assert err <= tol, f"{name}: relative error {err:.1e}"


@pytest.mark.parametrize("N", [50, 1, CHUNK // 2 + 3, 2 * CHUNK + 8])
@pytest.mark.parametrize("scalar, strict, key_scale", [
    (False, False, False), (False, True, True), (True, False, False), (True, False, True),
    (True, True, True)])
def test_recurrence_chunks_and_map_agree_forward_and_backward(N, scalar, strict, key_scale):
    """N = 50, N < CHUNK, N = 1, and N over three chunks (of 46, two padded tokens)."""
    case = inputs(N, scalar, key_scale)
    decay_scale = 0.5 if key_scale else 1.0            # GLA passes logsigmoid(g) with 1/16
    want = run(scan("reference", strict, decay_scale=decay_scale), *case)
    assert_all_close(run(scan("torch", strict, decay_scale=decay_scale), *case), want)
    assert_all_close(run(via_map(strict, decay_scale=decay_scale), *case), want)


@pytest.mark.parametrize("N, chunk", [(50, CHUNK), (2 * CHUNK + 8, CHUNK), (23, 4), (1, CHUNK)])
@pytest.mark.parametrize("scalar, strict, key_scale", [
    (False, False, False), (False, True, False), (True, False, False), (True, False, True),
    (True, True, True)])
def test_float32_on_each_cpu_path_matches_the_reference(monkeypatch, cpu_path, N, chunk, scalar,
                                                        strict, key_scale):
    """float32 inputs take linvit's C++ kernel where it loads, else the PyTorch chunks: held to
    the recurrence in float64, the output and every gradient (decays' and key scales' too)."""
    monkeypatch.setattr(gs, "CHUNK", chunk)
    calls = []

    def counted(*args):
        calls.append(args[0].shape)
        return gs_cpp.cpp_scan(*args)
    monkeypatch.setattr(gs, "cpp_scan", counted)
    case = inputs(N, scalar, key_scale)
    want = run(scan("reference", strict, decay_scale=0.5), *case)
    got = run(scan("torch", strict, decay_scale=0.5),
              *(None if t is None else t.float() for t in case))
    assert bool(calls) == (cpu_path == "cpp")
    assert_all_close([t.double() for t in got], want, tol=1e-5)


@pytest.mark.parametrize("scalar, strict", [(False, False), (True, True)])
def test_slow_decays_carry_state_across_many_chunks(scalar, strict, monkeypatch):
    """Six chunks of 4 tokens with decays ~1 - 1e-3: every state reaches every later chunk, so a
    chunk recursion (or its gradient) run in the wrong order shows."""
    monkeypatch.setattr(gs, "CHUNK", 4)
    q, k, v, log_a, scales, grad = inputs(23, scalar, key_scale=scalar)
    slow = log_a / 100
    want = run(scan("reference", strict), q, k, v, slow, scales, grad)
    assert_all_close(run(scan("torch", strict), q, k, v, slow, scales, grad), want)


@pytest.mark.parametrize("scalar, strict", [(False, False), (True, True)])
def test_a_chunk_padded_far_past_the_tokens_changes_nothing(scalar, strict, monkeypatch):
    """50 tokens in one chunk of 64 (14 padded), as the path ran before chunk_size evened them
    out: the padding's zero keys add nothing, forward or backward."""
    monkeypatch.setattr(gs, "chunk_size", lambda tokens, longest: longest)
    case = inputs(50, scalar, key_scale=scalar)
    want = run(scan("reference", strict), *case)
    assert_all_close(run(scan("torch", strict), *case), want)


@pytest.mark.parametrize("reverse", [False, True])
def test_grouped_chunk_scan_is_the_plain_recursion(reverse):
    """out_c = gamma_c out_prev + x_c, in groups of ~sqrt(n) chunks, for chunk counts with and
    without a remainder after the groups, per-channel and scalar decays."""
    g = torch.Generator().manual_seed(0)
    for n in [1, 2, 3, 5, 8, 10, 17, 24]:
        for width in (1, 4):
            x = torch.randn(2, n, 4, 3, generator=g, dtype=F64)
            gamma = torch.rand(2, n, width, 1, generator=g, dtype=F64)
            want, order = torch.empty_like(x), list(range(n))[::-1 if reverse else 1]
            want[:, order[0]] = x[:, order[0]]
            for p, c in zip(order, order[1:]):
                want[:, c] = gamma[:, c] * want[:, p] + x[:, c]
            got = gs_chunked._linear_scan(x, gamma, reverse, torch.full_like(x, math.nan))
            torch.testing.assert_close(got, want, msg=f"n={n}, width={width}")


def independent_sum(q, k, v, log_a, scales, strict, scale=0.7):
    """scale (o_F + o_B) as the double sum over token pairs with explicit decay products."""
    a_f, a_b = log_a.clamp_min(-MAX_STEP_DECAY) if log_a.shape[-1] > 1 else log_a
    w_f, w_b = (torch.ones_like(q[..., :1]),) * 2 if scales is None else scales
    N, out = q.shape[2], torch.zeros_like(v)
    for i in range(N):
        for j in range(N):
            if j < i or (j == i and not strict):            # forward: a_{j+1} ... a_i
                weight = (q[:, :, i] * a_f[:, :, j + 1:i + 1].sum(2).exp() * k[:, :, j]).sum(-1)
                out[:, :, i] += (weight * w_f[:, :, j, 0]).unsqueeze(-1) * v[:, :, j]
            if j > i or (j == i and not strict):            # backward: a_i ... a_{j-1}
                weight = (q[:, :, i] * a_b[:, :, i:j].sum(2).exp() * k[:, :, j]).sum(-1)
                out[:, :, i] += (weight * w_b[:, :, j, 0]).unsqueeze(-1) * v[:, :, j]
    return scale * out


@pytest.mark.parametrize("be", ["reference", "torch"])
@pytest.mark.parametrize("scalar, strict", [(False, False), (True, True)])
def test_the_sum_of_both_directions_is_the_double_sum(be, scalar, strict, monkeypatch):
    """Forward and backward decays differ, so a backward scan left in flipped order, or run with
    the forward gates, cannot pass. Chunks of 4 put several chunk boundaries in 11 tokens."""
    monkeypatch.setattr(gs, "CHUNK", 4)
    q, k, v, log_a, scales, _ = inputs(11, scalar, key_scale=scalar, decay_scale=1.0)
    with backend(be):
        got = gated_scan(q, k, v, log_a, scales, strict, 0.7)
    torch.testing.assert_close(got, independent_sum(q, k, v, log_a, scales, strict))


def _causal_scan(q, k, v, g, scale):
    """The inclusive causal scan both fla kernels compute, as a recurrence ([B, T, H, K])."""
    g = g.unsqueeze(-1) if g.dim() == 3 else g
    state = q.new_zeros(q.shape[0], q.shape[2], q.shape[3], v.shape[3])
    out = []
    for t in range(q.shape[1]):
        state = g[:, t].exp().unsqueeze(-1) * state + k[:, t, ..., None] * v[:, t, :, None]
        out.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], state))
    return torch.stack(out, 1), None


# Stand-ins with fla 0.6's signatures and checks (fla/ops/gla/chunk.py, simple_gla/chunk.py):
# chunk_gla has no head_first (a TypeError), chunk_simple_gla raises on it; both take
# [B, T, H, ...] tensors, chunk_gla asserting q, k and g of one shape.
def fake_chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
                   state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None):
    assert q.shape == k.shape == g.shape, "q, k, g must have the same shape."
    assert v.shape == (*q.shape[:3], v.shape[-1]), "v must be of shape (batch size, seq len, num of head, head dim)."  # noqa: E501 (fla's words)
    return _causal_scan(q, k, v, g, q.shape[-1] ** -0.5 if scale is None else scale)


def fake_chunk_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None,
                          output_final_state=False, state_v_first=False, cu_seqlens=None,
                          cu_seqlens_cpu=None, **kwargs):
    if "head_first" in kwargs:
        raise DeprecationWarning("head_first has been removed. Inputs must be in "
                                 "`[B, T, H, ...]` format.")
    assert g.shape == q.shape[:3], "a scalar gate per (batch, token, head): [B, T, H]"
    return _causal_scan(q, k, v, g, k.shape[-1] ** -0.5 if scale is None else scale)


def fake_fla(module):
    return {"gla": fake_chunk_gla, "simple_gla": fake_chunk_simple_gla}[module]


@pytest.mark.parametrize("scalar, strict", [(False, False), (True, True)])
def test_the_fla_path_flips_the_backward_half_back(scalar, strict, monkeypatch):
    """fla_scan with a stand-in kernel: the batch-stacked directions, the flip back, and (strict)
    the key/value shift must reproduce the double sum."""
    monkeypatch.setattr(gs_fla, "fla_kernel", lambda module, name: fake_fla(module))
    q, k, v, log_a, scales, _ = inputs(9, scalar, key_scale=scalar, decay_scale=1.0)
    q32, k32, v32, decays, scales32 = gs.prepare(q, k, v, log_a, scales, 1.0)
    got = gs_fla.fla_scan(q32 * 0.7, gs.directions(k32, scales32), v32, decays, strict)
    torch.testing.assert_close(got, independent_sum(q, k, v, log_a, scales, strict))


@pytest.mark.parametrize("scalar", [False, True])
def test_strongest_gates_stay_finite_and_exact(scalar):
    """Decays at -1e4 per token (per channel: floored) and at 0, with large q and k: finite
    outputs and gradients in float32, and the chunks still equal the recurrence."""
    q, k, v, _, _, grad = inputs(2 * CHUNK + 5, scalar, dtype=torch.float32)
    q, k = 100 * q, 100 * k
    width = 1 if scalar else D
    strong = torch.full((B, H, 2 * CHUNK + 5, width), -1e4)
    for log_a in (torch.stack([strong, strong]), torch.stack([strong, torch.zeros_like(strong)])):
        results = {}
        for be in ("reference", "torch"):
            results[be] = run(scan(be, strict=scalar), q, k, v, log_a, None, grad)
            assert all(torch.isfinite(t).all() for t in results[be]), be
        assert_all_close(results["torch"], results["reference"], tol=1e-5)
        assert torch.isfinite(gated_scan_map(q, k, log_a, strict=scalar)).all()


def test_per_channel_floor_is_part_of_the_definition():
    """Below -MAX_STEP_DECAY (after decay_scale) a per-channel decay acts as the floor, and gets
    no gradient, on every path alike; scalar decays are not floored."""
    q, k, v, log_a, _, grad = inputs(20, scalar=False)
    deep = torch.full_like(log_a, -7.0)                    # x 0.5: -3.5 per token
    want = independent_sum(q, k, v, torch.full_like(log_a, -MAX_STEP_DECAY), None, strict=False)
    for fn in (scan("reference", False, decay_scale=0.5), scan("torch", False, decay_scale=0.5),
               via_map(False, decay_scale=0.5)):
        got = run(fn, q, k, v, deep, None, grad)
        torch.testing.assert_close(got[0], want)
        assert not got[4].any()
    q, k, v, log_a, _, _ = inputs(20, scalar=True)
    deep = torch.full_like(log_a, -3 * MAX_STEP_DECAY)
    with backend("torch"):
        out = gated_scan(q, k, v, deep, strict=True)
    # token 1 reads token j with weight e^(-3 L |1 - j|), not the floor's e^(-L |1 - j|)
    want = sum(math.exp(-3 * MAX_STEP_DECAY * abs(1 - j))
               * (q[:, :, 1] * k[:, :, j]).sum(-1, keepdim=True) * v[:, :, j]
               for j in range(20) if j != 1)
    torch.testing.assert_close(out[:, :, 1], want)


@pytest.mark.skipif(not triton_available(), reason="backend 'triton' needs triton importable")
def test_triton_backend_without_cuda_tensors_takes_the_chunks_and_says_so_once(caplog):
    paths.forget()
    case = inputs(30, scalar=False)
    with caplog.at_level(logging.WARNING, logger="linvit"):
        got = [run(scan("triton", False), *case) for _ in range(2)]
    assert_all_close(got[0], run(scan("torch", False), *case))
    warned = [r.getMessage() for r in caplog.records if "gated scan" in r.getMessage()
              and r.levelno == logging.WARNING]
    assert len(warned) == 1 and "tensors are not on CUDA; using the " in warned[0]


def has_fla() -> bool:
    return torch.cuda.is_available() and gs_fla.fla_kernel("gla", "chunk_gla") is not None


@pytest.mark.skipif(not has_fla(), reason="needs CUDA and flash-linear-attention")
@pytest.mark.parametrize("scalar, strict", [(False, False), (True, True)])
def test_fla_kernels_match_the_chunked_path_on_cuda(scalar, strict):
    q, k, v, log_a, _, grad = (t if t is None else t.float().cuda() for t in inputs(300, scalar))
    want = run(scan("torch", strict), q, k, v, log_a, None, grad)
    got = run(scan("triton", strict), q, k, v, log_a, None, grad)
    assert_all_close(got, want, tol=2e-3)                  # fla's matmuls may run in tf32


# --- the operators ------------------------------------------------------------------------------
OPERATORS = [GatedLinearAttention, Mamba2Attention]


def make(cls, seed=0, perturb=True):
    torch.manual_seed(seed)
    op = cls(H * D, num_heads=H, qkv_bias=True).double()
    if perturb:
        with torch.no_grad():                            # off the init, where W = 0 hides bugs
            for _, p in op.named_parameters():
                p.add_(0.1 * torch.randn_like(p))
    return op


def own_grads(op, fn, q, k, v, grad):
    """fn's output and gradients w.r.t. q, k, v and the operator's own parameters."""
    ls = leaves(q, k, v)
    params = [p for n, p in op.named_parameters() if n in op.operator_specific_parameters()]
    out = fn(*ls)
    return (out, *torch.autograd.grad(out, ls + params, grad))


@pytest.mark.parametrize("cls", OPERATORS)
def test_operator_paths_agree_including_its_own_parameters(cls):
    op = make(cls)
    q, k, v, _, _, grad = inputs(CHUNK + 9, scalar=True)
    results = {}
    for be in ("reference", "torch"):
        with backend(be):
            results[be] = own_grads(op, op.global_mix, q, k, v, grad)
    results["map"] = own_grads(op, lambda q, k, v: op.attention_map(q, k).double() @ v,
                               q, k, v, grad)
    for name in ("torch", "map"):
        tol = 1e-10 if name == "torch" else 1e-5             # the map is float32
        for i, (a, b) in enumerate(zip(results[name], results["reference"])):
            err = (a - b).abs().max() / b.abs().max().clamp_min(1.0)
            assert err <= tol, f"{name}, output/gradient {i}: relative error {err:.1e}"


def test_mamba2_scans_leave_the_diagonal_to_its_diagonal_term():
    """y_i reads v_i only through (D + w_D . k_i): the map's diagonal is that term, written here
    from the parameters, and zeroing it leaves no trace of v_i in y_i."""
    op = make(Mamba2Attention)
    q, k, _, _, _, _ = inputs(40, scalar=True)
    diagonal = op.attention_map(q, k).diagonal(dim1=-2, dim2=-1)
    want = op.D[None, :, None] + torch.einsum("bhnd,hd->bhn", k, op.key_proj[..., 2])
    torch.testing.assert_close(diagonal.double(), want, rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        op.D.zero_()
        op.key_proj[..., 2] = 0
    v = torch.zeros(B, H, 40, D, dtype=F64)
    v[:, :, 17] = torch.randn(B, H, D, dtype=F64)          # one token's value only
    for be in ("reference", "torch"):
        with backend(be):
            y = op.global_mix(q, k, v)
        assert not y[:, :, 17].any() and y[:, :, 16].abs().sum() > 0 and y[:, :, 18].abs().sum() > 0


def test_gla_starts_with_slow_data_independent_decays():
    op = GatedLinearAttention(H * D, num_heads=H)
    k = 3 * torch.randn(B, H, 196, D)
    forward, backward = op.log_decays(k) / GATE_NORMALISER
    want = F.logsigmoid(torch.tensor(GATE_BIAS)) / GATE_NORMALISER
    assert torch.allclose(forward, want.expand_as(forward)) and torch.equal(forward, backward)
    assert 0.75 < math.exp(196 * want) < 0.85                # ~0.8 across a 14 x 14 image
    assert not op.gate_up.weight.any() and op.gate_down.weight.abs().sum() > 0


def test_mamba2_starts_as_a_slowly_decaying_average():
    op = Mamba2Attention(H * D, num_heads=H)
    k = 3 * torch.randn(B, H, 196, D)
    log_a, dt, diagonal = op.gates(k)
    for t in dt:
        torch.testing.assert_close(t, torch.full_like(t, DT_INIT))
    torch.testing.assert_close(diagonal, torch.full_like(diagonal, DT_INIT))
    across = log_a[0, 0, 0].sum().exp()                      # the decay across 196 tokens
    assert abs(across - math.exp(-A_INIT)) < 1e-4
    assert abs(dt[0, 0, 0].sum() - 1.0) < 1e-4               # the sum of dt is an average's


@pytest.mark.parametrize("cls", OPERATORS)
@pytest.mark.parametrize("n", [300, 50, 136])
def test_core_flops_count_the_matmuls_of_the_chunked_path(cls, n):
    """At the chunk the path runs, padding included (300 tokens as 5 chunks of 60, 50 as one of
    50, 136 as 3 of 46: 2 padded). Counted on the PyTorch chunks: to the counter, the C++ kernel
    is one opaque op."""
    from torch.utils.flop_counter import FlopCounterMode

    op, d = cls(2 * 32, num_heads=2), 32
    q, k, v = (torch.randn(1, 2, n, d) for _ in range(3))
    with backend("torch"), cpp_kernels.disabled(), FlopCounterMode(display=False) as counter:
        op.global_mix(q, k, v)
    assert cls.core_flops(n, d) == pytest.approx(counter.get_total_flops() / 2, rel=1e-9)
