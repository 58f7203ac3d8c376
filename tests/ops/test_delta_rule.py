"""The bidirectional delta rule: its three paths held to each other and to what the rule means.

reference (token loop) == chunked (hand-written backward) == explicit map @ V, forward and
backward, in float64 on awkward shapes; the two-direction merge against a formula written here;
the overwrite property; stability at beta ~ 1; the DeltaNet operator's documented init.
"""
from __future__ import annotations

import logging
import math

import pytest
import torch
import torch.nn.functional as F

from linvit.attention.deltanet import DeltaNetAttention
from linvit.ops import delta_rule as dr
from linvit.ops import paths
from linvit.ops.backends import backend, triton_available
from linvit.ops.bidirectional import fla_kernel
from linvit.ops.definitions import unit_rows
from linvit.ops.delta_rule import delta_rule, delta_rule_map
from linvit.ops.delta_rule import fla as dr_fla
from linvit.ops.delta_rule.cpp import cpp_scan

B, H, N, D = 2, 3, 50, 24                   # awkward on purpose: N = 1 + 7x7, d = 24
SCALE = 0.7


def scan_inputs(n=N, d=D, dv=D + 4, dtype=torch.float64, seed=0):
    """q, k (unit keys), v, beta_forward, beta_backward, with dv != dk to catch transposes."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, n, d, generator=g, dtype=dtype)
    k = F.normalize(torch.randn(B, H, n, d, generator=g, dtype=dtype), dim=-1)
    v = torch.randn(B, H, n, dv, generator=g, dtype=dtype)
    betas = [torch.rand(B, H, n, generator=g, dtype=dtype) for _ in range(2)]
    return [q, k, v, *betas]


def with_grads(fn, inputs, seed=1):
    """fn's output and its gradients with respect to every input."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed),  # on the CPU,
                       dtype=torch.float64).to(out)      # in float64: alike for any device, dtype
    return [out, *torch.autograd.grad(out, leaves, grad)]


def on_backend(name):
    def run(q, k, v, bf, bb):
        with backend(name):
            return delta_rule(q, k, v, bf, bb, SCALE)
    return run


def through_map(q, k, v, bf, bb):
    return delta_rule_map(q, k, bf, bb, SCALE) @ v


def assert_all_close(got, want, tol=1e-10):
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=f"tensor {i} differs")


# --- the three paths ---------------------------------------------------------------------------
# (n, longest chunk): 51 tokens run as 2 chunks of 26 (one padded token), 50 as 8 of 7 (six)
@pytest.mark.parametrize("n, chunk", [(51, 32), (50, 7), (50, 64), (20, 20), (1, 32)],
                         ids=["several-chunks-ragged", "many-chunks", "fewer-tokens-than-chunk",
                              "one-full-chunk", "one-token"])
def test_reference_chunked_and_map_agree_forward_and_backward(monkeypatch, n, chunk):
    monkeypatch.setattr(dr, "CHUNK", chunk)
    inputs = scan_inputs(n=n)
    want = with_grads(on_backend("reference"), inputs)
    assert_all_close(with_grads(on_backend("torch"), inputs), want)
    assert_all_close(with_grads(through_map, inputs), want)


@pytest.mark.parametrize("n, chunk", [(51, 32), (50, 7), (50, 64), (20, 20), (1, 32), (200, 32)],
                         ids=["several-chunks-ragged", "many-chunks", "fewer-tokens-than-chunk",
                              "one-full-chunk", "one-token", "seven-chunks"])
def test_float32_on_each_cpu_path_matches_the_reference(monkeypatch, cpu_path, n, chunk):
    """float32 inputs take linvit's C++ kernel where it loads, else the PyTorch chunks: held to
    the reference in float64, the output and every gradient (both betas' included)."""
    monkeypatch.setattr(dr, "CHUNK", chunk)
    calls = []

    def counted(*args):
        calls.append(args[0].shape)
        return cpp_scan(*args)
    monkeypatch.setattr(dr, "cpp_scan", counted)
    inputs = scan_inputs(n=n, dtype=torch.float32)
    want = with_grads(on_backend("reference"), [t.double() for t in inputs])
    got = with_grads(on_backend("torch"), inputs)
    assert bool(calls) == (cpu_path == "cpp")
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == torch.float32
        err = (a.double() - b).abs().max() / b.abs().max()
        assert err < 1e-5, (i, err)


def test_a_chunk_padded_far_past_the_tokens_changes_nothing(monkeypatch):
    """50 tokens in one chunk of 64 (14 padded), as the path ran before chunk_size evened them
    out: the padding (zero keys, zero betas) adds nothing, forward or backward."""
    monkeypatch.setattr(dr, "CHUNK", 64)
    monkeypatch.setattr(dr, "chunk_size", lambda tokens, longest: longest)
    inputs = scan_inputs(n=50)
    assert_all_close(with_grads(on_backend("torch"), inputs),
                     with_grads(on_backend("reference"), inputs))


def test_chunked_backward_passes_gradcheck(monkeypatch):
    """The hand-written backward against finite differences, on several chunks with padding."""
    monkeypatch.setattr(dr, "CHUNK", 3)
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 1, 7, 3, generator=g, dtype=torch.float64)
    k = F.normalize(torch.randn(1, 1, 7, 3, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(1, 1, 7, 2, generator=g, dtype=torch.float64)
    bf, bb = (torch.rand(1, 1, 7, generator=g, dtype=torch.float64) for _ in range(2))
    leaves = [t.requires_grad_() for t in (q, k, v, bf, bb)]
    assert torch.autograd.gradcheck(on_backend("torch"), leaves, fast_mode=True)


def test_outputs_keep_the_input_dtype_and_compute_in_float32():
    inputs = [t.float() for t in scan_inputs()]
    want = on_backend("reference")(*inputs)
    for name in ("reference", "torch"):
        got = on_backend(name)(*[t.bfloat16() for t in inputs])
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want, rtol=0.05, atol=0.05)
    torch.testing.assert_close(on_backend("torch")(*inputs), want, rtol=1e-4, atol=1e-5)


# --- what the operator computes ----------------------------------------------------------------
def causal_scan(q, k, v, beta):
    """One direction, written as S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T."""
    eye = torch.eye(k.shape[-1], dtype=k.dtype)
    state = torch.zeros(*k.shape[:2], k.shape[-1], v.shape[-1], dtype=k.dtype)
    outs = []
    for t in range(k.shape[2]):
        kt, bt = k[:, :, t, :, None], beta[:, :, t, None, None]
        state = (eye - bt * kt @ kt.mT) @ state + bt * kt @ v[:, :, t, None, :]
        outs.append(SCALE * (q[:, :, t, None, :] @ state)[:, :, 0])
    return torch.stack(outs, dim=2)


@pytest.mark.parametrize("name", ["reference", "torch"])
def test_bidirectional_merge_is_the_average_of_both_scans_in_token_order(name):
    q, k, v, bf, bb = scan_inputs()
    forward = causal_scan(q, k, v, bf)
    backward = causal_scan(q.flip(2), k.flip(2), v.flip(2), bb.flip(2))
    got = on_backend(name)(q, k, v, bf, bb)
    torch.testing.assert_close(got, (forward + backward.flip(2)) / 2, rtol=1e-10, atol=1e-10)
    # the test can tell a merge that forgets to flip the backward half back
    assert (got - (forward + backward) / 2).abs().max() > 0.1


def test_each_direction_reads_only_its_side_of_the_sequence():
    """beta_backward = 0: the backward scan writes nothing, the map is lower triangular and the
    output is half the forward scan; beta_forward = 0 mirrors it."""
    q, k, v, bf, bb = scan_inputs()
    zero = torch.zeros_like(bf)
    lower = delta_rule_map(q, k, bf, zero, SCALE)
    upper = delta_rule_map(q, k, zero, bb, SCALE)
    assert torch.equal(lower, lower.tril()) and lower.triu(1).abs().max() == 0
    assert torch.equal(upper, upper.triu())
    torch.testing.assert_close(on_backend("torch")(q, k, v, bf, zero), causal_scan(q, k, v, bf) / 2)


@pytest.mark.parametrize("path", ["reference", "torch", "map"])
def test_beta_one_overwrites_what_a_key_recalls(path):
    """With beta = 1 and orthonormal keys a key recalls the latest value written under it, not the
    sum of all of them (which linear attention would return)."""
    d, n = 8, 12
    k = torch.eye(d, dtype=torch.float64)[torch.arange(n) % 4].expand(1, 1, n, d)  # 4 keys, cycled
    probe = torch.eye(d, dtype=torch.float64)[torch.tensor([1] * n)].expand(1, 1, n, d)  # key 1
    v = torch.randn(1, 1, n, 5, dtype=torch.float64)
    one, zero = torch.ones(1, 1, n, dtype=torch.float64), torch.zeros(1, 1, n, dtype=torch.float64)
    run = through_map if path == "map" else on_backend(path)
    got = run(probe, k, v, one, zero) * (2 / SCALE)          # the forward scan alone, unscaled
    written = [t for t in range(n) if t % 4 == 1]             # tokens that wrote under key 1
    for t in range(n):
        latest = max((s for s in written if s <= t), default=None)
        want = v[0, 0, latest] if latest is not None else torch.zeros(5, dtype=torch.float64)
        torch.testing.assert_close(got[0, 0, t], want, msg=f"token {t}")
    assert not torch.allclose(got[0, 0, -1], v[0, 0, written].sum(0))


@pytest.mark.parametrize("name", ["reference", "torch"])
def test_stable_at_beta_near_one_with_large_values(name):
    n = 100
    q, k, v, bf, bb = [t.float() for t in scan_inputs(n=n, d=16, dv=16)]
    near_one = torch.full_like(bf, 1 - 1e-6)
    inputs = [100 * q, k, 1e4 * v, near_one, near_one]
    out, *grads = with_grads(on_backend(name), inputs)
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
    # For unit keys and beta in [0, 1], |S_t|^2 <= |S_{t-1}|^2 + |v_t|^2 (Cauchy-Schwarz on
    # S_t^T x = S_{t-1}^T (x - beta (k.x) k) + beta (k.x) v_t), so |o_t| <= s |q_t| sqrt(N) max |v|
    bound = SCALE * inputs[0].norm(dim=-1) * math.sqrt(n) * inputs[2].norm(dim=-1).max()
    assert (out.norm(dim=-1) <= bound * (1 + 1e-4)).all()


def test_chunked_path_matches_the_reference_at_beta_near_one_in_float32():
    """The chunk's triangular inverse is where float32 error could grow; it must not."""
    inputs = [t.float() for t in scan_inputs(n=100, d=16, dv=16)]
    inputs[3:] = [torch.full_like(inputs[3], 1 - 1e-6)] * 2
    want = with_grads(on_backend("reference"), inputs)
    for a, b in zip(with_grads(on_backend("torch"), inputs), want):
        err = (a - b).abs().max() / b.abs().max()
        assert err < 1e-4, err


# --- the GPU path ------------------------------------------------------------------------------
def fake_chunk_delta_rule(q, k, v, beta, scale=None, initial_state=None,
                          output_final_state=False, use_qk_l2norm_in_kernel=False,
                          cu_seqlens=None, cu_seqlens_cpu=None, **kwargs):
    """fla 0.6's chunk_delta_rule (fla/ops/delta_rule/chunk.py): its signature and its checks
    (one dtype for q, k and v, float32 refused, beta [B, T, H], head_first gone), computed as a
    causal recurrence in fla's layout so that the GPU path's stacking, flipping and averaging run
    on the CPU; beyond fla's own checks, what linvit's call must give: contiguous tensors, beta
    in q's dtype, no second normalisation."""
    assert q.dtype == k.dtype == v.dtype
    assert q.dtype != torch.float32, "ChunkDeltaRuleFunction does not support float32. Please use bfloat16."  # noqa: E501 (fla's words)
    assert len(beta.shape) == 3, "beta must be of shape (batch size, num of head, seq len)."
    if "head_first" in kwargs:
        raise DeprecationWarning("head_first has been removed. Inputs must be in "
                                 "`[B, T, H, ...]` format.")
    assert beta.shape == q.shape[:3] and q.is_contiguous()
    assert beta.dtype == q.dtype and use_qk_l2norm_in_kernel is False and not kwargs
    scale = k.shape[-1] ** -0.5 if scale is None else scale
    v_dtype = v.dtype
    q, k, v, beta = (t.float() for t in (q, k, v, beta))    # the recurrence in float32
    state = q.new_zeros(q.shape[0], q.shape[2], q.shape[3], v.shape[3])
    out = []
    for t in range(q.shape[1]):
        recalled = torch.einsum("bhk,bhkv->bhv", k[:, t], state)
        u_t = beta[:, t, :, None] * (v[:, t] - recalled)
        state = state + k[:, t, ..., None] * u_t[..., None, :]
        out.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], state))
    return torch.stack(out, 1).to(v_dtype), None


def test_the_fla_path_stacks_and_flips_both_directions(monkeypatch):
    """fla_scan with a stand-in kernel equals the reference: the backward betas must go to the
    flipped half and its output must be flipped back (different betas per direction, dv != dk)."""
    monkeypatch.setattr(dr_fla, "fla_kernel", lambda module, name: fake_chunk_delta_rule)
    # the call linvit makes: bf16 tensors (fla_refuses sends no other dtype to fla)
    inputs = [t.bfloat16() for t in scan_inputs(n=13)]
    assert inputs[0].dtype in dr_fla.FLA_DTYPES
    got = with_grads(lambda *t: dr_fla.fla_scan(*t, SCALE), inputs)
    assert got[0].dtype == torch.bfloat16
    want = with_grads(on_backend("reference"), [t.double() for t in inputs])
    # the stand-in computes in float32 and rounds its output to bf16, as fla does: bf16's
    # rounding, relative to each tensor's scale (a flipped or misplaced half errs by ~100%)
    for i, (a, b) in enumerate(zip(got, want)):
        assert (a.double() - b).abs().max() / b.abs().max() < 1.5e-2, i


@pytest.mark.skipif(not triton_available(), reason="triton is not installed")
def test_triton_backend_without_fla_on_the_cpu_falls_back_once(caplog):
    paths.forget()
    inputs = scan_inputs()
    with caplog.at_level(logging.WARNING, logger="linvit"):
        outs = [on_backend("triton")(*inputs) for _ in range(3)]
    warned = [r.getMessage() for r in caplog.records if "delta rule" in r.getMessage()
              and r.levelno == logging.WARNING]
    assert len(warned) == 1 and "; using the " in warned[0]
    assert torch.equal(outs[0], on_backend("torch")(*inputs))


@pytest.mark.skipif(not torch.cuda.is_available()
                    or fla_kernel("delta_rule", "chunk_delta_rule") is None,
                    reason="needs CUDA and flash-linear-attention")
def test_fla_kernel_matches_the_chunked_path():
    inputs = [t.float().cuda() for t in scan_inputs(n=200, d=64, dv=64)]
    want = with_grads(on_backend("torch"), inputs)
    got = with_grads(on_backend("triton"), [t.bfloat16() for t in inputs])
    for name, a, b in zip(("out", "dq", "dk", "dv", "dbeta_f", "dbeta_b"), got, want):
        err = (a.float() - b).abs().max() / b.abs().max().clamp_min(1.0)
        assert err < 3e-2, f"{name}: {err:.2e}"


# --- the operator --------------------------------------------------------------------------------
def make_op(seed=0, perturb=True, **options):
    torch.manual_seed(seed)
    cls = type("Opt", (DeltaNetAttention,), options) if options else DeltaNetAttention
    op = cls(H * D, num_heads=H, qkv_bias=True)
    if perturb:                                    # move the own parameters off their init
        with torch.no_grad():
            for name, p in op.named_parameters():
                if name in op.operator_specific_parameters():
                    p.add_(0.1 * torch.randn_like(p))
    return op.double()


def test_operator_parameters_get_the_same_gradients_on_every_path():
    op = make_op()
    x = torch.randn(B, N, H * D, dtype=torch.float64)
    q, k, v = (t.detach() for t in op.project(x))
    own = [p for n, p in op.named_parameters() if n in op.operator_specific_parameters()]
    assert len(own) == 3

    def grads(run):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = run(*leaves)
        return [out, *torch.autograd.grad(out.square().sum(), [*leaves, *own])]

    def mix(name):
        def run(q, k, v):
            with backend(name):
                return op.global_mix(q, k, v)
        return run

    want = grads(mix("reference"))
    assert_all_close(grads(mix("torch")), want, tol=1e-5)   # map and cores meet in float32
    assert_all_close(grads(lambda q, k, v: op.attention_map(q, k).double() @ v), want, tol=1e-5)


def test_init_writes_with_beta_init_everywhere_and_a_unit_query_gain():
    for beta_init in (0.25, 0.1):
        op = make_op(perturb=False, **({} if beta_init == 0.25 else {"beta_init": beta_init}))
        assert torch.equal(op.beta_proj.weight, torch.zeros_like(op.beta_proj.weight))
        assert torch.equal(op.query_scale, torch.ones_like(op.query_scale))
        x = 50 * torch.randn(B, N, H * D, dtype=torch.float64)
        q, k, _ = op.project(x)
        *_, beta_f, beta_b = op.scan_inputs(q, k)
        torch.testing.assert_close(beta_f, torch.full_like(beta_f, beta_init))
        torch.testing.assert_close(beta_b, torch.full_like(beta_b, beta_init))
    assert not DeltaNetAttention.option_rules["beta_init"][0](1.0)


def test_at_init_the_output_ignores_query_and_key_lengths():
    """q and k are normalised, and beta is data-independent at init: rescaling each token's q and
    k changes nothing (the teacher's temperature is not carried over, as documented)."""
    op = make_op(perturb=False)
    x = torch.randn(B, N, H * D, dtype=torch.float64)
    q, k, v = op.project(x)
    lengths = torch.rand(B, H, N, 1, dtype=torch.float64) * 10 + 0.1
    torch.testing.assert_close(op.global_mix(q * lengths, k / lengths, v), op.global_mix(q, k, v))
    assert op.attention_map(q, k).dtype == torch.float32


@pytest.mark.parametrize("n, c, padded", [(4096, dr.CHUNK, 4096), (50, 25, 50), (51, 26, 52)])
def test_core_flops_counts_the_chunked_path(n, c, padded):
    """At the chunk the path runs, padding included: 50 tokens go as 2 chunks of 25, not 2 of
    32; 51 as 2 of 26, one padded."""
    d = 64
    per_token = 2 * c * c + 20 * c * d + 12 * d * d
    assert DeltaNetAttention.core_flops(n, d) == padded * per_token
    assert DeltaNetAttention.reference_max_tokens is not None


@pytest.mark.parametrize("gain_shape", [None, (H, 1, 1), (1, H, 1, 1)])
def test_unit_rows_is_f_normalize_times_the_gain_forward_and_backward(gain_shape):
    """deltanet's q and k normalisation (ops.definitions.unit_rows, a hand-written backward)
    against F.normalize times the gain under autograd, and gradcheck."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(B, H, N, D, generator=g, dtype=torch.float64)
    x[0, 0, 0] = 0.0                                  # a zero row: the eps clamp, as F.normalize
    # (gradcheck below skips it: at 0 the clamp makes the function not differentiable)
    gain = None if gain_shape is None else torch.rand(gain_shape, generator=g, dtype=torch.float64)
    inputs = [x] if gain is None else [x, gain]

    def fast(x, gain=None):
        return unit_rows(x, gain)

    def slow(x, gain=None):
        y = F.normalize(x, dim=-1)
        return y if gain is None else y * gain
    for (a, b) in zip(with_grads(fast, inputs), with_grads(slow, inputs)):
        torch.testing.assert_close(a, b)
    leaves = [t[1:, :, :5].clone().requires_grad_() if t is x else t.clone().requires_grad_()
              for t in inputs]
    assert torch.autograd.gradcheck(fast, leaves)
