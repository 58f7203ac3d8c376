"""The ViT^3 test-time-training operator: reference against fast path, the conv branch, copy
semantics, the effective map's definition, the FLOP count.

Shapes are awkward on purpose: N = 1 + 7*7 with a cls token, head dim 24, and a non-square grid.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import Attention

from linvit.attention.ttt import TTTAttention
from linvit.ops.backends import backend

B, H, D = 2, 3, 24
LAYOUTS = [(1, (7, 7)), (0, (5, 8)), (2, (3, 6))]      # (prefix tokens, grid): cls, none, two


def make_op(prefix=1, grid=(7, 7), seed=0, moved=True, dtype=torch.float64):
    """A ttt block; `moved` shifts every operator-specific parameter off its init (a zero
    branch_out or W1 would hide whole terms from the comparisons)."""
    torch.manual_seed(seed)
    op = TTTAttention(H * D, num_heads=H, qkv_bias=True)
    op.set_token_layout(prefix, grid)
    if moved:
        with torch.no_grad():
            for n, p in op.named_parameters():
                if n in op.operator_specific_parameters():
                    p.add_(0.1 * torch.randn_like(p))
    return op.to(dtype)


def tokens(prefix, grid):
    return prefix + grid[0] * grid[1]


def qkv(n, seed=1, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, D, generator=g, dtype=dtype) for _ in range(3)]


def run(op, fn, be, inputs, grad):
    """Output and gradients w.r.t. q, k, v and every operator-specific parameter."""
    leaves = [t.clone().requires_grad_() for t in inputs]
    own = [p for n, p in op.named_parameters() if n in op.operator_specific_parameters()]
    with backend(be):
        out = getattr(op, fn)(*leaves)
    return (out, *torch.autograd.grad(out, leaves + own, grad, allow_unused=True))


def assert_same(got, want, rtol):
    for i, (a, b) in enumerate(zip(got, want)):
        if b is None:                  # global_mix does not use the branch's parameters
            assert a is None, i
            continue
        err = (a - b).abs().max() / b.abs().max().clamp_min(1.0)
        assert err <= rtol, f"output/grad #{i}: relative error {err:.2e}"


# global_mix does not see the grid: one layout for it, every layout for the branch
@pytest.mark.parametrize("fn,prefix,grid", [("global_mix", *LAYOUTS[0])]
                         + [("mix", *layout) for layout in LAYOUTS])
def test_fast_path_equals_autograd_reference_forward_and_backward(fn, prefix, grid):
    op = make_op(prefix, grid)
    n = tokens(prefix, grid)
    inputs, grad = qkv(n), qkv(n, seed=2)[0]
    want = run(op, fn, "reference", inputs, grad)
    assert_same(run(op, fn, "torch", inputs, grad), want, rtol=1e-10)


def test_float32_paths_agree_and_keep_dtype():
    op = make_op(dtype=torch.float32)
    inputs, grad = qkv(50, dtype=torch.float32), qkv(50, seed=2, dtype=torch.float32)[0]
    got, want = run(op, "mix", "torch", inputs, grad), run(op, "mix", "reference", inputs, grad)
    assert got[0].dtype == torch.float32
    assert_same(got, want, rtol=1e-5)


def test_reference_under_no_grad_is_detached_and_equal():
    op = make_op()
    q, k, v = qkv(50)
    with torch.no_grad(), backend("reference"):
        ref = op.mix(q, k, v)
    with torch.no_grad(), backend("torch"):
        fast = op.mix(q, k, v)
    assert ref.grad_fn is None
    torch.testing.assert_close(ref, fast, rtol=1e-10, atol=1e-10)


def explicit_branch(op, q, k, v):
    """x2 written out tap by tap: token p + y*w + x of the patches sits at pixel (y, x); the
    inner gradient of tap (a, b) is -(s/hw) sum_{y,x} v2[y, x] k2[y + a - 1, x + b - 1]."""
    n, p = q.shape[2], op.num_prefix_tokens
    h, w = op.patch_grid(n)
    s = op.inner_scale

    def image(t, lin):                               # (B, h + 2, w + 2, d), zero border
        return F.pad(lin(op.merge_heads(t))[:, p:].reshape(B, h, w, D), (0, 0, 1, 1, 1, 1))

    q2, k2, v2 = image(q, op.branch_q), image(k, op.branch_k), image(v, op.branch_v)
    centre = v2[:, 1:-1, 1:-1]
    g = torch.zeros(B, D, 3, 3, dtype=q.dtype)
    for a in range(3):
        for b in range(3):
            g[:, :, a, b] = -(s / (h * w)) * (centre * k2[:, a:a + h, b:b + w]).sum((1, 2))
    kernel = op.conv_kernel[:, 0] - g / (g.flatten(2).norm(dim=-1)[..., None, None] + 1)
    x2 = sum(kernel[:, None, None, :, a, b] * q2[:, a:a + h, b:b + w]
             for a in range(3) for b in range(3))
    return torch.cat([torch.zeros(B, p, D, dtype=q.dtype), x2.reshape(B, h * w, D)], dim=1)


@pytest.mark.parametrize("be,prefix,grid", [("reference", *LAYOUTS[0])]
                         + [("torch", *layout) for layout in LAYOUTS])
def test_branch_is_a_test_time_trained_3x3_depthwise_conv_of_the_patch_grid(be, prefix, grid):
    op = make_op(prefix, grid)
    q, k, v = qkv(tokens(prefix, grid))
    with backend(be):
        got = op.conv_branch(q, k, v)
        branch = op.mix(q, k, v) - op.global_mix(q, k, v)
    torch.testing.assert_close(got, explicit_branch(op, q, k, v), rtol=1e-10, atol=1e-12)
    # the branch reaches the heads through branch_out only, and never the prefix tokens
    want = op.branch_out(got).reshape(B, -1, H, D).transpose(1, 2)
    torch.testing.assert_close(branch, want, rtol=1e-10, atol=1e-12)
    assert torch.equal(branch[:, :, :prefix], torch.zeros_like(branch[:, :, :prefix]))
    assert branch[:, :, prefix:].abs().max() > 0


def test_branch_needs_a_placeable_grid():
    op = make_op(1, None)
    with pytest.raises(ValueError, match="cannot place"):
        op.mix(*qkv(48))                                # 47 patches


def test_fresh_block_is_the_copied_projection_of_x1():
    """A softmax (timm) checkpoint loads with exactly the operator-specific tensors missing, and
    with branch_out = 0 the block's output is proj(x1), whatever the branch computes."""
    torch.manual_seed(0)
    teacher = Attention(H * D, num_heads=H, qkv_bias=True).double()
    op = make_op(moved=False)
    missing, unexpected = op.load_state_dict(teacher.state_dict(), strict=False)
    assert sorted(missing) == sorted(op.operator_specific_parameters()) and not unexpected
    assert torch.equal(op.branch_out.weight, torch.zeros_like(op.branch_out.weight))
    x = torch.randn(B, 50, H * D, dtype=torch.float64)
    q, k, v = op.project(x)
    x1 = op.global_mix(q, k, v).transpose(1, 2).reshape(B, 50, H * D)
    torch.testing.assert_close(op(x), teacher.proj(x1), rtol=1e-12, atol=1e-12)
    assert op.conv_branch(q, k, v).abs().max() > 0      # the branch works, it is only gated off
    with torch.no_grad():
        op.branch_out.weight.normal_()
    assert not torch.allclose(op(x), teacher.proj(x1))


def test_init_values_and_notes():
    op = make_op(moved=False)
    assert torch.equal(op.swiglu_w1, torch.zeros_like(op.swiglu_w1))
    assert torch.equal(op.swiglu_w2[0], torch.eye(D, dtype=op.swiglu_w2.dtype).expand(H, D, D))
    assert torch.equal(op.conv_kernel, torch.zeros_like(op.conv_kernel))
    for n in op.operator_specific_parameters():
        assert op.init_note(n), n


@pytest.mark.parametrize("be", ["reference", "torch"])
def test_effective_map_is_the_channel_mean_of_the_jacobian_in_v_at_zero(be):
    """d x1 / d v at v = 0, by autograd through the whole layer (normalisers and gates
    included): channel-diagonal, and its channel mean is attention_map."""
    B_, H_, n, d = 2, 2, 7, 5
    torch.manual_seed(3)
    op = TTTAttention(H_ * d, num_heads=H_).double()
    with torch.no_grad():                      # W1 != 0: the path through W2' counts too
        op.swiglu_w1.normal_(std=0.5)
        op.swiglu_w2.add_(0.3 * torch.randn_like(op.swiglu_w2))
    q, k = torch.randn(2, B_, H_, n, d, dtype=torch.float64)
    with backend(be):
        jac = torch.autograd.functional.jacobian(lambda v: op.global_mix(q, k, v),
                                                 torch.zeros(B_, H_, n, d, dtype=torch.float64))
    jac = jac.diagonal(dim1=0, dim2=4).diagonal(dim1=0, dim2=3)   # (n, d, n, d, B, H)
    jac = jac.permute(4, 5, 0, 2, 1, 3)                           # (B, H, i, j, c, c')
    eye = torch.eye(d, dtype=torch.bool)
    assert jac[..., ~eye].abs().max() < 1e-14                     # channels do not mix
    want = jac.diagonal(dim1=-2, dim2=-1).mean(-1)
    got = op.attention_map(q, k)
    assert got.dtype == torch.float32 and op.map_kind == "effective"
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-7)
    v = torch.randn(B_, H_, n, d, dtype=torch.float64)            # effective: x1 != map @ v
    assert not torch.allclose(op.global_mix(q, k, v), got.double() @ v, atol=1e-3)


def test_at_init_x1_is_the_maps_linear_term_scaled_by_each_columns_normaliser():
    """W1 = 0, W2 = I: W2 takes no step, so x1 is channel by channel the linear term in v (the
    per-channel map whose channel mean attention_map is) times 1 / (||g_c|| + 1)."""
    op = make_op(moved=False)
    q, k, v = qkv(50)
    s, n = op.inner_scale, 50
    gates = F.silu(q)[:, :, :, None] * F.silu(k)[:, :, None]      # (B, H, i, j, c)
    per_channel = (s / n) * (q @ k.mT)[..., None] * gates
    g1 = -(s / n) * k.mT @ (v * F.silu(k))
    r = 1 / (g1.norm(dim=-2) + 1)                                   # (B, H, d): one per column
    want = torch.einsum("bhijc,bhjc->bhic", per_channel, v) * r[:, :, None]
    torch.testing.assert_close(op.global_mix(q, k, v), want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(op.attention_map(q, k), per_channel.mean(-1).float())


@pytest.mark.parametrize("be", ["reference", "torch"])
def test_cores_stay_in_float32_under_bf16_autocast(be):
    """Forward under autocast, backward after it, as linvit.train.loop runs them."""
    op = make_op(dtype=torch.float32)
    inputs, grad = qkv(50, dtype=torch.float32), qkv(50, seed=2, dtype=torch.float32)[0]
    want = run(op, "global_mix", be, inputs, grad)
    leaves = [t.clone().requires_grad_() for t in inputs]
    with torch.autocast("cpu", dtype=torch.bfloat16), backend(be):
        out = op.global_mix(*leaves)
        attn_map = op.attention_map(*inputs[:2])
    got = (out, *torch.autograd.grad(out, leaves + [op.swiglu_w1, op.swiglu_w2], grad))
    assert_same(got, want[:6], rtol=1e-6)
    torch.testing.assert_close(attn_map, op.attention_map(*inputs[:2]))


def test_inner_scale_option_scales_the_map():
    op = make_op()
    q, k, _ = qkv(50)
    doubled = type("TTTx2", (TTTAttention,), {"inner_scale": 2 * TTTAttention.inner_scale})
    op2 = doubled(H * D, num_heads=H, qkv_bias=True).double()
    op2.load_state_dict(op.state_dict())
    torch.testing.assert_close(op2.attention_map(q, k), 2 * op.attention_map(q, k))
    assert TTTAttention.inner_scale == pytest.approx(9 ** -0.5)     # ViT^3's s
