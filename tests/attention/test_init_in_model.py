"""An operator inside a model starts where its documentation says it starts.

timm's ViT init resets every nn.Linear of the model after the blocks are built, an operator's
gates and branches included; AttentionOperator.init_weights re-applies the operator's own values
(init_notes). Generated from the registry: for every operator, each parameter of its own (not
qkv or proj, which keep timm's init or the teacher's tensors) is compared between a bare operator
and the same operator in the first block of a `create_vit` model."""
from __future__ import annotations

import pytest
import torch

from linvit.attention import OPERATORS
from linvit.models import ModelSpec, create_vit
from linvit.models.sizes import SIZES

SIZE = SIZES["cpu96"]


def own_parameters(op) -> dict[str, torch.Tensor]:
    params = dict(op.named_parameters())
    return {n: params[n].detach() for n in op.operator_specific_parameters()}


def bare(name: str, seed: int):
    torch.manual_seed(seed)
    return OPERATORS[name](SIZE.width, num_heads=SIZE.heads, qkv_bias=True)


@pytest.mark.parametrize("name", list(OPERATORS))
def test_an_operator_in_a_model_keeps_its_documented_init(name):
    first, second = own_parameters(bare(name, 0)), own_parameters(bare(name, 1))
    torch.manual_seed(2)
    model = create_vit(ModelSpec("cpu96", name, 10, 28, 1))
    built = own_parameters(model.blocks[0].attn)
    assert built.keys() == first.keys() and (built or name in ("softmax", "linear", "inline"))
    for param, value in built.items():
        if torch.equal(first[param], second[param]):     # a set value (0, 4, I, ...): exactly it
            assert torch.equal(value, first[param]), f"{name}.{param}: not its documented init"
        else:                                            # drawn: from the same distribution
            want = torch.cat([first[param].flatten(), second[param].flatten()]).std()
            got = value.std()
            assert abs(got / want - 1) < 0.25, \
                f"{name}.{param}: drawn with std {got:.4f}, its own init gives {want:.4f}"
