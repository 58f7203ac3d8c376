"""Every registered operator: map x V equals the fast path, finite forward/backward, timm fit."""
from __future__ import annotations

import pytest
import torch
from timm.models.vision_transformer import Attention
from torch import nn

from linvit.attention import OPERATORS, AttentionOperator, get_operator, operator_class
from linvit.bench.operators import parts_of
from linvit.ops.backends import backend
from linvit.ops.linear_attention import (
    injective_linear_attention_map,
    normalized_linear_attention_map,
)

ALL = list(OPERATORS)
HEAD_DIM, HEADS, TOKENS = 24, 3, 50          # awkward on purpose: N=50 = cls + 7x7, d=24


def has_local_term(name: str) -> bool:
    op = get_operator(name)(HEAD_DIM * HEADS, num_heads=HEADS)
    op.set_token_layout(1, (2, 2))
    return op.local_mix(torch.zeros(1, HEADS, 5, HEAD_DIM)) is not None


# asked of the operators themselves, so a new operator with a local term joins these tests
LOCAL = [name for name in OPERATORS if has_local_term(name)]


def make_op(name, seed=0, **kw):
    torch.manual_seed(seed)
    op = get_operator(name)(HEAD_DIM * HEADS, num_heads=HEADS, qkv_bias=True, **kw)
    with torch.no_grad():                     # move operator-specific params off their init
        for n, p in op.named_parameters():
            if n in op.operator_specific_parameters():
                p.add_(0.1 * torch.randn_like(p))
    return op.double()


# operators whose `attention_map` is exact (global_mix == map @ V); "effective" maps are
# linearisations, tested by their operator's own tests
EXACT = [name for name in OPERATORS if OPERATORS[name].map_kind != "effective"]


@pytest.mark.parametrize("name", EXACT)
def test_fast_path_equals_explicit_map_times_v(name):
    op = make_op(name)
    x = torch.randn(2, TOKENS, HEAD_DIM * HEADS, dtype=torch.float64)
    q, k, v = op.project(x)
    fast = op.global_mix(q, k, v)
    attn_map = op.attention_map(q, k)
    assert attn_map.shape == (2, HEADS, TOKENS, TOKENS)
    explicit = attn_map.to(v.dtype) @ v
    # maps are formed in float32 (see linvit.ops), hence the float32-level tolerance
    torch.testing.assert_close(fast.to(explicit.dtype), explicit, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", EXACT)
def test_fast_path_gradients_equal_the_explicit_maps(name):
    """The fast path's written-out backward passes (cores, feature maps, InLine's centring)
    against autograd through the explicit map times V, for q, k and v."""
    op = make_op(name)
    x = torch.randn(2, TOKENS, HEAD_DIM * HEADS, dtype=torch.float64)
    q, k, v = (t.detach().requires_grad_() for t in op.project(x))
    weights = torch.randn(2, HEADS, TOKENS, HEAD_DIM, dtype=torch.float64)
    fast = torch.autograd.grad((op.global_mix(q, k, v) * weights).sum(), (q, k, v))
    explicit = torch.autograd.grad(((op.attention_map(q, k).to(v.dtype) @ v) * weights).sum(),
                                   (q, k, v))
    for name_, a, b in zip("qkv", fast, explicit):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4, msg=f"d{name_}")


@pytest.mark.parametrize("name", ALL)
def test_maps_are_what_their_kind_declares(name):
    """"stochastic" maps (the only ones map losses accept) are non-negative with rows summing to
    1; the operators' maps that are declared otherwise really are signed or unnormalised, so the
    declaration is not a blanket refusal."""
    op = make_op(name)
    q, k, _ = op.project(torch.randn(2, TOKENS, HEAD_DIM * HEADS, dtype=torch.float64))
    attn_map = op.attention_map(q, k)
    stochastic = bool((attn_map >= 0).all()) and torch.allclose(
        attn_map.sum(-1), torch.ones_like(attn_map[..., 0]), atol=1e-5)
    assert stochastic == (op.map_kind == "stochastic"), op.map_kind


@pytest.mark.parametrize("name", ALL)
def test_forward_with_map_matches_forward(name):
    """Both run one code path; for an exact map the output is also rebuilt from the map the
    method returns (map @ V plus the local term, heads merged, proj): a map that is not the one
    the output used cannot pass."""
    op = make_op(name).eval()
    x = torch.randn(2, TOKENS, HEAD_DIM * HEADS, dtype=torch.float64)
    out, attn_map = op.forward_with_map(x)
    torch.testing.assert_close(out, op(x), rtol=1e-4, atol=1e-5)
    assert attn_map.dtype == torch.float32
    if name in EXACT:
        _, _, v = op.project(x)
        local = op.local_mix(v)
        mixed = attn_map.double() @ v + (0 if local is None else local)
        rebuilt = op.proj(op.norm(mixed.transpose(1, 2).reshape(x.shape)))
        torch.testing.assert_close(rebuilt, out, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("kind", ["zeros", "large", "normal"])
@pytest.mark.parametrize("path", ["reference", "torch"])
def test_forward_backward_finite(name, kind, path):
    op = make_op(name).float()
    x = {"zeros": torch.zeros, "normal": torch.randn,
         "large": lambda *s: 200 * torch.randn(*s)}[kind](2, TOKENS, HEAD_DIM * HEADS)
    x.requires_grad_(True)
    with backend(path):
        out, attn_map = op.forward_with_map(x)
        (out.square().mean() + attn_map.square().mean()).backward()
    assert torch.isfinite(out).all() and torch.isfinite(attn_map).all()
    assert torch.isfinite(x.grad).all()
    for n, p in op.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n


def test_normalised_maps_are_row_stochastic_even_when_features_underflow():
    phi = torch.rand(1, 2, 10, 4)
    assert torch.allclose(normalized_linear_attention_map(phi, phi).sum(-1), torch.ones(1, 2, 10))
    zero = torch.zeros(1, 2, 10, 4)          # every feature underflowed: output 0, not NaN
    assert torch.equal(normalized_linear_attention_map(zero, zero), torch.zeros(1, 2, 10, 10))
    q, k = torch.randn(1, 2, 10, 4), torch.randn(1, 2, 10, 4)
    rows = injective_linear_attention_map(q, k, 0.5).sum(-1)
    torch.testing.assert_close(rows, torch.ones(1, 2, 10))


@pytest.mark.parametrize("fused", [True, False])
def test_softmax_equals_timm_attention(fused):
    torch.manual_seed(0)
    ref = Attention(96, num_heads=3, qkv_bias=True).eval()
    ref.fused_attn = fused
    ours = get_operator("softmax")(96, num_heads=3, qkv_bias=True).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)   # same parameter names
    x = torch.randn(2, 50, 96)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-6)
    out, attn_map = ours.forward_with_map(x)
    torch.testing.assert_close(out, ref(x), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(attn_map.sum(-1), torch.ones(2, 3, 50))


@pytest.mark.parametrize("name", ALL)
def test_bf16_input_keeps_dtype(name):
    op = make_op(name).to(torch.bfloat16)
    x = torch.randn(1, TOKENS, HEAD_DIM * HEADS, dtype=torch.bfloat16)
    out = op(x)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()


@pytest.mark.parametrize("name", ALL)
def test_operator_is_bidirectional_only(name):
    op = make_op(name)
    x = torch.randn(1, TOKENS, HEAD_DIM * HEADS, dtype=torch.float64)
    with pytest.raises(ValueError, match="bidirectional"):
        op(x, is_causal=True)


def test_registry_errors_name_the_allowed_values():
    with pytest.raises(ValueError, match="allowed: softmax, linear"):
        get_operator("lineer")
    with pytest.raises(ValueError, match="focusing_factor"):
        operator_class("focused", focus=2)
    cls = operator_class("focused", focusing_factor=2.0)
    assert cls.focusing_factor == 2.0 and issubclass(cls, get_operator("focused"))


@pytest.mark.parametrize("name", ALL)
def test_operator_name_is_its_registry_key(name):
    assert OPERATORS[name].name == name
    assert make_op(name).name == name
    overridden = {k: _another_value(v) for k, v in OPERATORS[name].options.items()}
    assert operator_class(name, **overridden).name == name


def _another_value(default):
    """A valid value other than the default: +2 keeps a kernel size odd, x2 keeps a float > 0."""
    if isinstance(default, bool):
        return not default
    return default + 2 if isinstance(default, int) else default * 2


@pytest.mark.parametrize("name", ALL)
def test_option_defaults_are_what_instances_carry(name):
    options = dict(OPERATORS[name].options)                    # a copy: compared after
    op = operator_class(name)(HEAD_DIM * HEADS, num_heads=HEADS)
    assert {k: getattr(op, k) for k in options} == options
    assert {k: type(getattr(op, k)) for k in options} == {k: type(v) for k, v in options.items()}
    changed = {k: _another_value(v) for k, v in options.items()}
    op = operator_class(name, **changed)(HEAD_DIM * HEADS, num_heads=HEADS)
    assert {k: getattr(op, k) for k in options} == changed
    assert OPERATORS[name].options == options                  # overrides leave the defaults


def test_an_option_default_is_declared_once():
    with pytest.raises(TypeError, match="declare the default once"):
        type("Twice", (AttentionOperator,), {"options": {"kernel_size": 3}, "kernel_size": 3})


def adds_to_global_mix(name: str) -> bool:
    """Whether the operator's whole mixing (what bench's `mix` rows time) is more than its
    global_mix: a local_mix, or a mix of its own (ttt's conv branch)."""
    op = make_op(name)
    op.set_token_layout(1, (7, 7))
    q, k, v = (torch.randn(1, HEADS, TOKENS, HEAD_DIM, dtype=torch.float64) for _ in range(3))
    return not torch.equal(op.mix(q, k, v), op.global_mix(q, k, v))


def test_local_terms_are_found_alike_by_tests_and_bench():
    """LOCAL asks local_mix; the bench asks whether local_mix or mix is overridden. An operator
    whose local term went missing (returning None or nothing) would go unnoticed otherwise."""
    assert LOCAL, "no operator has a local term: the local-term tests below would run nothing"
    assert set(LOCAL) <= {name for name in OPERATORS if adds_to_global_mix(name)}
    assert [name for name in OPERATORS if "mix" in parts_of(name)] == \
        [name for name in OPERATORS if adds_to_global_mix(name)]


@pytest.mark.parametrize("name", LOCAL)
def test_local_terms_need_a_placeable_grid(name):
    op = make_op(name)
    with pytest.raises(ValueError, match="cannot place"):
        op(torch.randn(1, 48, HEAD_DIM * HEADS, dtype=torch.float64))   # 47 patches
    op.set_token_layout(0, (6, 8))                                     # no cls, 6x8 grid
    assert op(torch.randn(1, 48, HEAD_DIM * HEADS, dtype=torch.float64)).shape == (1, 48, 72)


def test_linear_operators_reject_attention_dropout():
    with pytest.raises(ValueError, match="attn_drop"):
        get_operator("linear")(96, num_heads=3, attn_drop=0.1)


@pytest.mark.parametrize("name", LOCAL)
def test_local_term_is_the_conv_of_the_patch_grid(name):
    """Token (1 + y*w + x) of head h, channel c sits at pixel (y, x) of channel h*d + c (or of
    channel c for a conv shared by heads); prefix tokens get no local term."""
    op = make_op(name)
    convs = [m for m in op.children() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 1, f"{name}: a local term other than one depthwise conv; extend this test"
    conv = convs[0]
    per_head = conv.in_channels == HEAD_DIM            # one conv shared by the heads (FLatten)
    assert conv.groups == conv.in_channels == (HEAD_DIM if per_head else HEADS * HEAD_DIM)
    B, h, w = 2, 5, 7                                   # a non-square grid catches a transpose
    op.set_token_layout(1, (h, w))
    v = torch.randn(B, HEADS, 1 + h * w, HEAD_DIM, dtype=torch.float64)
    image = v[:, :, 1:].reshape(B, HEADS, h, w, HEAD_DIM).permute(0, 1, 4, 2, 3)
    if per_head:
        want = conv(image.reshape(B * HEADS, HEAD_DIM, h, w))
    else:
        want = conv(image.reshape(B, HEADS * HEAD_DIM, h, w))
    want = want.reshape(B, HEADS, HEAD_DIM, h * w).transpose(-1, -2)
    got = op.local_mix(v)
    assert torch.equal(got[:, :, 0], torch.zeros_like(got[:, :, 0]))
    torch.testing.assert_close(got[:, :, 1:], want)
