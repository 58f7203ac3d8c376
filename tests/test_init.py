"""Each init strategy copies exactly the tensors it declares, bit for bit, and records it."""
from __future__ import annotations

import pytest
import torch

from linvit.models import CheckpointError, ModelSpec, create_vit
from linvit.transfer.groups import GROUPS, group_of
from linvit.transfer.init import apply_init, verify_init
from linvit.transfer.strategies import STRATEGIES, get_strategy

from conftest import make_model, perturb

# Written out independently of linvit.transfer.strategies: what each strategy promises.
STEM = {"embed", "norm", "head"}
EXPECTED = {
    "random": (set(), set()),
    "copy_embed": (STEM, set()),
    "copy_attn": (STEM | {"attn"}, set()),
    "copy_mlp": (STEM | {"mlp"}, set()),
    "copy_all": (STEM | {"attn", "mlp"}, set()),
    "distill": (set(), {"attn"}),
    "copy_mlp+distill": (STEM | {"mlp"}, {"attn"}),
}


def naive_group(name: str) -> str:
    if name.startswith(("patch_embed.", "pos_embed", "cls_token")):
        return "embed"
    if ".attn." in name:
        return "attn"
    if ".mlp." in name:
        return "mlp"
    if ".norm1." in name or ".norm2." in name or name.startswith("norm."):
        return "norm"
    assert name.startswith("head."), name
    return "head"


def test_registry_declares_what_the_paper_grid_needs():
    assert set(EXPECTED) <= set(STRATEGIES)
    for name, (copy, distilled) in EXPECTED.items():
        s = get_strategy(name)
        assert (set(s.copy), set(s.distilled)) == (copy, distilled), name


@pytest.mark.parametrize("operator", ["linear", "focused", "hedgehog"])
@pytest.mark.parametrize("name", list(EXPECTED))
def test_copied_and_new_sets_are_exactly_as_declared(tiny_spec, operator, name):
    teacher = perturb(make_model(tiny_spec, "softmax", seed=1), seed=2).state_dict()
    distilled = perturb(make_model(tiny_spec, operator, seed=3), seed=4).state_dict()
    student = make_model(tiny_spec, operator, seed=5)
    fresh = {k: v.clone() for k, v in student.state_dict().items()}
    record = apply_init(student, get_strategy(name), teacher, distilled)

    copy_groups, distilled_groups = EXPECTED[name]
    own = {f"blocks.{i}.attn.{n}" for i, b in enumerate(student.blocks)
           for n in b.attn.operator_specific_parameters()}
    state = student.state_dict()
    for key, value in state.items():
        group = naive_group(key)
        source = record["tensors"][key]["source"]
        if group in distilled_groups:
            assert source == "distilled" and torch.equal(value, distilled[key]), key
        elif group in copy_groups and key not in own:
            assert source == "teacher" and torch.equal(value, teacher[key]), key
        else:
            assert source == "new" and torch.equal(value, fresh[key]), key
            if group in copy_groups:                  # only operator-specific tensors
                assert key in own and "operator-specific" in record["tensors"][key]["reason"]
    assert sum(record["summary"].values()) == len(state)


def test_operator_specific_tensors_stay_new_under_copy_all(tiny_spec):
    teacher = perturb(make_model(tiny_spec, "softmax", seed=1)).state_dict()
    student = make_model(tiny_spec, "focused", seed=5)
    record = apply_init(student, get_strategy("copy_all"), teacher)
    new = {k for k, e in record["tensors"].items() if e["source"] == "new"}
    assert new == {f"blocks.{i}.attn.{n}" for i in range(6)
                   for n in ("focus_scale", "dwc.weight", "dwc.bias")}


def test_head_of_another_class_count_is_new_with_a_reason(tiny_spec):
    teacher = make_model(ModelSpec("cpu96", "softmax", 1000, 28, 1)).state_dict()
    record = apply_init(make_model(tiny_spec, "linear"), get_strategy("copy_mlp"), teacher)
    assert record["tensors"]["head.weight"]["source"] == "new"
    assert "another class count" in record["tensors"]["head.weight"]["reason"]


def test_group_overrides_and_failures(tiny_spec):
    teacher = make_model(tiny_spec).state_dict()
    student = make_model(tiny_spec, "linear")
    only_mlp = get_strategy("copy_mlp").with_groups(copy=["mlp"])
    record = apply_init(student, only_mlp, teacher)
    assert {e["group"] for e in record["tensors"].values() if e["source"] == "teacher"} == {"mlp"}
    with pytest.raises(ValueError, match="distilled student"):
        apply_init(student, get_strategy("distill"), teacher, None)
    wrong = create_vit(ModelSpec("cpu192", "softmax", 10, 28, 1)).state_dict()
    with pytest.raises(CheckpointError, match=r"blocks\.0\.mlp\.fc1\.weight \(mlp\) from teacher"):
        apply_init(student, get_strategy("copy_mlp"), wrong)


def test_verify_catches_a_record_that_lies(tiny_spec):
    teacher = perturb(make_model(tiny_spec)).state_dict()
    student = make_model(tiny_spec, "linear")
    record = apply_init(student, get_strategy("copy_mlp"), teacher)
    record["tensors"]["blocks.0.attn.qkv.weight"]["source"] = "teacher"
    with pytest.raises(AssertionError, match="blocks.0.attn.qkv.weight"):
        verify_init(student, record, teacher)


def test_every_tensor_of_every_size_has_a_group():
    for size in ("cpu96", "deit_t"):
        model = create_vit(ModelSpec(size, "inline", 10, 28 if size == "cpu96" else 224, 3))
        assert {group_of(k) for k in model.state_dict()} == set(GROUPS)
    with pytest.raises(ValueError, match="no component group"):
        group_of("blocks.0.adapter.weight")
