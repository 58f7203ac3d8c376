"""Every operator's core computes in float32 under autocast (CPU bf16 here; the same on CUDA where
it exists), and whole models train under autocast without error."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linvit.attention import OPERATORS
from linvit.attention.base import AttentionOperator, computes_in_float32, float32_core
from linvit.models import ModelSpec, create_vit

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
FLOAT32_CORES = sorted(n for n, cls in OPERATORS.items() if computes_in_float32(cls.global_mix))


def test_every_linear_operator_states_its_core_in_float32_and_softmax_does_not():
    """The rule is written where each operator is defined (@float32_core), for both methods."""
    for name, cls in OPERATORS.items():
        stated = (computes_in_float32(cls.global_mix), computes_in_float32(cls.attention_map))
        assert stated == ((False, False) if name == "softmax" else (True, True)), name


def test_an_operator_with_only_one_method_in_float32_is_refused():
    with pytest.raises(TypeError, match="must both compute in float32 under autocast"):
        class Half(AttentionOperator):            # noqa: F841 (defining it is the test)
            @float32_core
            def global_mix(self, q, k, v):
                return v

            def attention_map(self, q, k):
                return q @ k.transpose(-2, -1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", FLOAT32_CORES)
def test_the_core_and_its_map_compute_in_float32_under_autocast(name, device):
    torch.manual_seed(0)
    op = OPERATORS[name](dim=72, num_heads=3).to(device)
    q, k, v = torch.randn(3, 2, 3, 50, 24, device=device)
    want, want_map = op.global_mix(q, k, v), op.attention_map(q, k)
    with torch.autocast(device, dtype=torch.bfloat16):
        got, got_map = op.global_mix(q, k, v), op.attention_map(q, k)
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)   # float32's, not bf16's
    torch.testing.assert_close(got_map, want_map, rtol=1e-5, atol=1e-5)


def gradients(model, x, autocast: bool):
    """The logits and every parameter's gradient of logsumexp(logits), by name."""
    model.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
        logits = model(x)
    logits.float().logsumexp(-1).sum().backward()
    return logits.float(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_a_model_steps_under_autocast(name, device):
    """Under bf16 autocast every parameter that float32 trains gets a finite gradient pointing
    where float32's does, and the logits move by bf16 rounding only (about 1% of their size at
    init, 0.003-0.004 here; an operator whose core ran in bf16, or dropped a gradient, fails)."""
    torch.manual_seed(0)
    model = create_vit(ModelSpec("cpu96", name, 10, 28, 1)).to(device)
    x = torch.randn(2, 1, 28, 28, device=device)
    want, want_grads = gradients(model, x, autocast=False)
    logits, grads = gradients(model, x, autocast=True)
    assert sorted(grads) == sorted(want_grads)
    for n, g in grads.items():
        assert torch.isfinite(g).all(), n
        cosine = F.cosine_similarity(g.flatten().double(), want_grads[n].flatten().double(), dim=0)
        assert want_grads[n].abs().max() == 0 or cosine > 0.99, (n, cosine.item())
    torch.testing.assert_close(logits, want, rtol=0, atol=0.02)   # bf16 projections
