"""Each init strategy copies exactly the tensors it declares, bit for bit, and records it.

The expected copy set of every strategy is derived from its registry entry (its declared copy and
distilled groups), for every operator, so a new strategy or operator is tested on arrival. Groups
are assigned here by a naive rule written independently of linvit.transfer.groups.
"""
from __future__ import annotations

import re
from collections import Counter

import pytest
import torch

from linvit.attention import OPERATORS
from linvit.errors import CheckpointError
from linvit.models import ModelSpec, create_vit
from linvit.transfer.groups import GROUPS, group_of
from linvit.transfer.init import apply_init, verify_init
from linvit.transfer.strategies import STEM, STRATEGIES, get_strategy

from conftest import make_model, perturb

SPEC = ModelSpec("cpu96", "softmax", num_classes=10, img_size=28, in_chans=1)


# The paper's strategies, written out independently of linvit.transfer.strategies: the generated
# tests below check that apply_init does what the registry declares, this checks the declarations.
PAPER_STEM = {"embed", "norm", "head"}
PAPER = {
    "random": (set(), set()),
    "copy_embed": (PAPER_STEM, set()),
    "copy_attn": (PAPER_STEM | {"attn"}, set()),
    "copy_mlp": (PAPER_STEM | {"mlp"}, set()),
    "copy_all": (PAPER_STEM | {"attn", "mlp"}, set()),
    "distill": (set(), {"attn"}),
    "copy_mlp+distill": (PAPER_STEM | {"mlp"}, {"attn"}),
    "copy_embed+distill": (PAPER_STEM, {"attn"}),
}


# The data-free baselines: mimetic attention alone and with the stem and MLPs copied.
BASELINES = {"mimetic": set(), "copy_mlp+mimetic": PAPER_STEM | {"mlp"}}


def test_registry_declares_the_mimetic_baselines():
    for name, copy in BASELINES.items():
        s = get_strategy(name)
        assert (set(s.copy), set(s.distilled), s.uses("mimetic")) == (copy, set(), True), name
    assert not any(get_strategy(name).uses("mimetic") for name in PAPER)


def test_registry_declares_the_papers_strategies():
    assert set(PAPER) <= set(STRATEGIES)
    for name, (copy, distilled) in PAPER.items():
        s = get_strategy(name)
        assert (set(s.copy), set(s.distilled)) == (copy, distilled), name


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


def promised_source(name: str, strategy, teacher: dict) -> str:
    """Where the strategy's registry entry says a tensor comes from. A softmax teacher has no
    operator-specific tensors, so those stay new under a copy (and come from a distilled model,
    which has the student's operator)."""
    group = naive_group(name)
    formed = re.fullmatch(r"blocks\.\d+\.attn\.(qkv|proj)\.(weight|bias)", name)
    if strategy.uses("mimetic") and formed:
        return "mimetic"
    if group in strategy.distilled:
        return "distilled"
    if group in strategy.copy and name in teacher:
        return "teacher"
    return "new"


@pytest.fixture(scope="module")
def models():
    """operator -> (teacher, distilled, student, fresh): one softmax teacher and, per operator, a
    distilled model and a student (reset to `fresh` before each use); built once per module."""
    teacher = perturb(make_model(SPEC, "softmax", seed=1), seed=2).state_dict()
    cache = {}

    def get(operator):
        if operator not in cache:
            distilled = perturb(make_model(SPEC, operator, seed=3), seed=4).state_dict()
            student = make_model(SPEC, operator, seed=5)
            cache[operator] = (distilled, student,
                               {k: v.clone() for k, v in student.state_dict().items()})
        distilled, student, fresh = cache[operator]
        student.load_state_dict(fresh)
        return teacher, distilled, student, fresh

    return get


@pytest.mark.parametrize("operator", list(OPERATORS))
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_copied_and_new_sets_are_exactly_as_declared(models, operator, name):
    strategy = STRATEGIES[name]
    teacher, distilled, student, fresh = models(operator)
    record = apply_init(student, strategy, teacher, distilled)

    state = student.state_dict()
    expected = {key: promised_source(key, strategy, teacher) for key in state}
    assert {key: e["source"] for key, e in record["tensors"].items()} == expected
    sources = {"teacher": teacher, "distilled": distilled}
    for key, value in state.items():
        if expected[key] == "new":
            assert torch.equal(value, fresh[key]), key
            assert not any(torch.equal(value, m[key]) for m in sources.values() if key in m), key
        elif expected[key] == "mimetic":
            assert not torch.equal(value, fresh[key]) or not value.any(), key   # biases: 0
            assert "mimetic" in record["tensors"][key]["reason"], key
        else:
            assert torch.equal(value, sources[expected[key]][key]), key
            assert not torch.equal(value, fresh[key]), key
    attn = student.blocks[0].attn
    own = {f"blocks.{i}.attn.{n}": attn.init_note(n) for i in range(len(student.blocks))
           for n in attn.operator_specific_parameters()}
    for key, entry in record["tensors"].items():
        if entry["source"] == "new" and key in own:          # whatever the strategy
            assert "operator-specific" in entry["reason"] and own[key] in entry["reason"], key
        elif entry["source"] == "new" and naive_group(key) in strategy.copy:
            assert "class count" in entry["reason"], key        # the only other reason
        elif entry["source"] == "mimetic":
            continue
        else:
            assert "reason" not in entry, key
    assert record["copy_groups"] == sorted(strategy.copy)
    assert record["distilled_groups"] == sorted(strategy.distilled)
    assert record["summary"] == dict(Counter(expected.values()))


@pytest.mark.parametrize("operator", list(OPERATORS))
def test_operator_specific_tensors_are_what_a_softmax_teacher_lacks(models, operator):
    """The tensors that stay new under a teacher copy are exactly the operator's declared
    operator-specific parameters, all inside the attention group."""
    teacher, _, student, _ = models(operator)
    lacking = set(student.state_dict()) - set(teacher)
    declared = {f"blocks.{i}.attn.{n}" for i, block in enumerate(student.blocks)
                for n in block.attn.operator_specific_parameters()}
    assert lacking == declared
    assert {naive_group(k) for k in lacking} <= {"attn"}
    assert set(teacher) <= set(student.state_dict())


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_registry_entry_is_well_formed(models, name):
    strategy = STRATEGIES[name]
    assert strategy.name == name and strategy.description
    assert strategy.copy | strategy.distilled <= set(GROUPS)
    assert not strategy.copy & strategy.distilled
    assert not strategy.copy or strategy.copy >= STEM, "the stem travels with every copy"
    assert strategy.needs_distilled == bool(strategy.distilled)
    if strategy.needs_distilled:
        teacher, _, student, _ = models("linear")
        with pytest.raises(ValueError, match="distilled student"):
            apply_init(student, strategy, teacher, None)


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


@pytest.mark.parametrize("operator", list(OPERATORS))
def test_every_operator_specific_tensor_says_why_it_starts_where_it_does(operator):
    """An operator declares an init note for each of its own parameters, and copied.json carries
    it beside the tensor, whatever the strategy."""
    op = OPERATORS[operator](48, num_heads=2)
    missing = [n for n in op.operator_specific_parameters() if not op.init_note(n)]
    assert not missing, f"{operator}: no init_notes entry for {missing}"
    assert not op.init_note("qkv.weight")      # shared tensors come from timm, not from a note


def test_mimetic_weights_form_their_targets_and_the_proj_columns_of_each_head():
    """With one head (d = C) the rank cut is exact: W_q^T W_k and W_proj W_v are the targets
    a Z + b I themselves (Z redrawn here from the same generator), which catches a transposed
    factor; with several heads each head's products are a rank-d cut, positive (q.k) and negative
    (value path) on the diagonal."""
    from linvit.transfer import mimetic
    width = 24
    gen = torch.Generator().manual_seed(0)
    qkv, proj = mimetic.mimetic_weights(width, 1, gen)
    gen = torch.Generator().manual_seed(0)
    bound = (3.0 / width) ** 0.5
    z1, z2 = ((torch.rand(width, width, generator=gen, dtype=torch.float64) * 2 - 1) * bound
              for _ in range(2))
    q, k, v = qkv.split(width)
    eye = torch.eye(width, dtype=torch.float64)
    torch.testing.assert_close(q.T @ k, 0.7 * z1 + 0.7 * eye)
    torch.testing.assert_close(proj @ v, 0.4 * z2 - 0.4 * eye)
    qkv, proj = mimetic.mimetic_weights(width, 3)
    q, k, v = qkv.split(width)
    for h in range(3):
        rows = slice(8 * h, 8 * h + 8)
        qk, pv = q[rows].T @ k[rows], proj[:, rows] @ v[rows]
        assert torch.linalg.matrix_rank(qk) == 8 and torch.linalg.matrix_rank(pv) == 8
        assert qk.diagonal().mean() > 0 > pv.diagonal().mean()
