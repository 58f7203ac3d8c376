"""Layer-wise distillation: the right inputs, the right losses, only the configured tensors
learn."""
from __future__ import annotations

import math

import pytest
import torch

from linvit.transfer.distill import DistillObjective, GradCensus, freeze_except
from linvit.transfer.init import apply_init
from linvit.transfer.losses import LOSSES
from linvit.transfer.quality import layer_quality, map_kl
from linvit.transfer.stages import distill_student_strategy

from conftest import make_model, perturb


def distill_pair(spec, operator="linear", attn_init="random"):
    teacher = perturb(make_model(spec, "softmax", seed=1)).eval()
    student = make_model(spec, operator, seed=2)
    apply_init(student, distill_student_strategy(attn_init), teacher.state_dict())
    return teacher, student


def train_steps(objective, params, steps=3, census=None):
    opt = torch.optim.AdamW(params, lr=1e-3)
    images = torch.randn(4, 1, 28, 28)
    losses = []
    for _ in range(steps):
        loss, logs = objective(images)
        opt.zero_grad()
        loss.backward()
        if census:
            census()
        opt.step()
        losses.append(loss.item())
    return losses, logs


@pytest.mark.parametrize("loss", list(LOSSES))
def test_each_loss_logs_per_layer_and_sums_into_the_total(tiny_spec, loss):
    teacher, student = distill_pair(tiny_spec)
    objective = DistillObjective(student, teacher, {loss: 0.5}, layers=[0, 3])
    total, logs = objective(torch.randn(2, 1, 28, 28))
    assert torch.isfinite(total) and total.requires_grad
    assert {"rel_err/L0", "rel_err/L3"} <= set(logs)
    if LOSSES[loss].per_layer:
        assert set(k for k in logs if k.startswith(f"{loss}/")) == {f"{loss}/L0", f"{loss}/L3"}
        parts = [logs[f"{loss}/L0"], logs[f"{loss}/L3"]]
        expected = 0.5 * (parts[0] + parts[1]) / 2          # weight x mean over the layers
    else:
        parts = [logs[loss]]
        expected = 0.5 * parts[0]
    # a random linear student is not the teacher: every logged loss is positive
    assert all(p.item() > 0 for p in parts)
    assert total.item() == pytest.approx(expected.item(), rel=1e-6)


@pytest.mark.parametrize("train", [["attn"], ["attn", "mlp"]])
def test_only_configured_groups_change(tiny_spec, train):
    teacher, student = distill_pair(tiny_spec)
    teacher_before = {k: v.clone() for k, v in teacher.state_dict().items()}
    before = {k: v.clone() for k, v in student.state_dict().items()}
    freeze_except(student, train)
    objective = DistillObjective(student, teacher, {"hidden_mse": 1.0, "attn_out_mse": 1.0})
    train_steps(objective, [p for p in student.parameters() if p.requires_grad])
    after = student.state_dict()
    for k in before:
        group = "attn" if ".attn." in k else "mlp" if ".mlp." in k else "other"
        changed = not torch.equal(before[k], after[k])
        assert changed == (group in train), k
    assert all(torch.equal(teacher_before[k], v) for k, v in teacher.state_dict().items())


def test_map_loss_cannot_reach_v_or_proj(tiny_spec):
    teacher, student = distill_pair(tiny_spec)
    freeze_except(student, ["attn"])
    census = GradCensus(student)
    objective = DistillObjective(student, teacher, {"attn_map_ce": 1.0})
    train_steps(objective, [p for p in student.parameters() if p.requires_grad], 2, census)
    report = census.report()
    assert report["blocks.0.attn.proj.weight"]["grad_fraction"] == 0.0
    # qkv stacks q|k|v rows: only the q and k thirds get gradient from a map loss
    assert report["blocks.0.attn.qkv.weight"]["grad_fraction"] == pytest.approx(2 / 3)
    assert report["blocks.0.mlp.fc1.weight"] == {"group": "mlp", "trainable": False,
                                                 "grad_fraction": 0.0}


def test_student_is_teacher_forced(tiny_spec):
    """Each student layer sees the teacher's input to that layer. With the teacher's attention
    copied into a softmax student and only layer 2's attention changed, layer 2 alone differs:
    the layers after it still get the teacher's (not the changed student's) inputs, so their
    losses are exactly zero, while the student's own forward pass (the logits) does change."""
    teacher, student = distill_pair(tiny_spec, operator="softmax", attn_init="teacher")
    changed = 2
    with torch.no_grad():
        student.blocks[changed].attn.proj.weight.mul_(1.5)
    own = teacher.state_dict()
    differ = [k for k, v in student.state_dict().items() if not torch.equal(v, own[k])]
    assert differ == [f"blocks.{changed}.attn.proj.weight"]
    objective = DistillObjective(student, teacher, {"attn_out_mse": 1.0, "hidden_mse": 1.0,
                                                    "logit_kd": 1.0})
    _, logs = objective(torch.randn(2, 1, 28, 28))
    depth = len(student.blocks)
    assert depth == 6
    for name in ("attn_out_mse", "hidden_mse", "rel_err"):
        values = {l: logs[f"{name}/L{l}"].item() for l in range(depth)}
        assert values[changed] > 1e-6, (name, values)
        assert all(v == 0.0 for l, v in values.items() if l != changed), (name, values)
    # the change does reach the student's own output, i.e. the forcing above is what hides it
    assert logs["logit_kd"].item() > 1e-6


def test_distillation_reduces_the_attention_error(tiny_spec):
    teacher, student = distill_pair(tiny_spec)
    freeze_except(student, ["attn"])
    objective = DistillObjective(student, teacher, {"attn_out_mse": 1.0})
    losses, _ = train_steps(objective, [p for p in student.parameters() if p.requires_grad], 30)
    assert losses[-1] < 0.5 * losses[0]


def test_bad_layers_are_refused(tiny_spec):
    teacher, student = distill_pair(tiny_spec)
    with pytest.raises(ValueError, match="outside 0..5"):
        DistillObjective(student, teacher, {"attn_out_mse": 1.0}, layers=[6])


@pytest.mark.parametrize("loss", list(LOSSES))
def test_each_loss_counts_its_training_flops(tiny_spec, loss):
    """The teacher's forward, then what the loss trains: per layer the student's attention (its
    block for a block loss, its maps for a map loss), or its whole forward for a logit loss."""
    from linvit.models import flops

    teacher, student = distill_pair(tiny_spec)
    objective = DistillObjective(student, teacher, {loss: 1.0})
    s, depth = student.spec, len(student.blocks)
    logged = flops.forward_flops(teacher.spec) + depth * flops.attention_flops(s)  # rel_err
    target = LOSSES[loss].target
    if target == "attn_out":
        assert objective.flops_per_image() == logged + depth * 2 * flops.attention_flops(s)
    elif target == "logits":
        assert objective.flops_per_image() == logged + flops.train_flops_per_image(s)
    elif target == "block_out":
        assert objective.flops_per_image() == logged + depth * 3 * (
            flops.attention_flops(s) + flops.mlp_flops(s))
    else:
        assert objective.flops_per_image() > logged + depth * 2 * flops.attention_flops(s)


def test_the_map_kl_is_the_kl_of_each_row_summed():
    p = torch.tensor([[[[0.5, 0.5], [0.9, 0.1]]]])
    q = torch.tensor([[[[0.25, 0.75], [0.9, 0.1]]]])
    want = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)      # the second row: 0
    assert map_kl(p, q).item() == pytest.approx(want)
    assert map_kl(p, p).item() == pytest.approx(0.0, abs=1e-7)


def test_a_student_equal_to_its_teacher_has_no_error_and_a_changed_layer_has_its_own(tiny_spec):
    teacher, student = distill_pair(tiny_spec, operator="softmax", attn_init="teacher")
    objective = DistillObjective(student, teacher, {"attn_out_mse": 1.0})
    images = torch.randn(3, 1, 28, 28)
    same = {k: (v[0] / v[1]).item() for k, v in layer_quality(objective, images).items()}
    assert set(same) == {f"{m}/L{l}" for m in ("rel_err", "map_kl") for l in range(6)}
    assert all(v == pytest.approx(0.0, abs=1e-6) for v in same.values())
    with torch.no_grad():
        student.blocks[3].attn.qkv.weight.mul_(1.3)     # layer 3's map and output change
    changed = {k: (v[0] / v[1]).item() for k, v in layer_quality(objective, images).items()}
    assert changed["rel_err/L3"] > 1e-4 and changed["map_kl/L3"] > 1e-6
    assert all(changed[f"rel_err/L{l}"] == pytest.approx(0.0, abs=1e-6) for l in (0, 1, 2, 4, 5))
    # the relative error is the squared distance over the teacher's, by hand on layer 3
    trace = objective.teacher_trace(images)
    h, target = trace[("attn_in", 3)], trace[("attn_out", 3)]
    own = student.blocks[3].attn(h)
    assert changed["rel_err/L3"] == pytest.approx(
        ((own - target).pow(2).sum() / target.pow(2).sum()).item(), rel=1e-5)


def test_an_operator_without_a_stochastic_map_has_no_map_kl(tiny_spec):
    teacher, student = distill_pair(tiny_spec, operator="gla")
    objective = DistillObjective(student, teacher, {"attn_out_mse": 1.0})
    names = set(layer_quality(objective, torch.randn(2, 1, 28, 28)))
    assert names == {f"rel_err/L{l}" for l in range(6)}
