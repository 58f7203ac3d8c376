"""Attention transfer's copy mode (strategy attn_copy): the teacher's maps drive a softmax student,
in training and wherever the student is loaded again."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from linvit import cli
from linvit.errors import CheckpointError
from linvit.models import load_model, save_model
from linvit.models.attention_copy import MAPS_KEY, drive_with_teacher

from conftest import make_model, perturb


@pytest.fixture
def teacher(tiny_spec):
    return perturb(make_model(tiny_spec)).eval()


def test_a_driven_student_ignores_its_own_queries_and_keys(tiny_spec, teacher):
    """Its output depends on its q/k projections only through nothing: the maps are the
    teacher's. The same student undriven does depend on them."""
    x = torch.randn(3, 1, 28, 28)
    student = perturb(make_model(tiny_spec, seed=5), seed=6).eval()
    plain = perturb(make_model(tiny_spec, seed=5), seed=6).eval()
    drive_with_teacher(student, teacher)
    before, plain_before = student(x), plain(x)
    with torch.no_grad():
        for model in (student, plain):
            for block in model.blocks:
                block.attn.qkv.weight[: 2 * 96].mul_(3.0)       # q and k rows, not v
    torch.testing.assert_close(student(x), before)
    assert not torch.allclose(plain(x), plain_before, atol=1e-4)
    assert all(block.attn.given_map is None for block in student.blocks)   # nothing outlives


def test_a_student_with_the_teacher_s_weights_computes_the_teacher(tiny_spec, teacher):
    """Given its own maps back, a copy of the teacher is the teacher."""
    student = make_model(tiny_spec)
    student.load_state_dict(teacher.state_dict())
    drive_with_teacher(student.eval(), teacher)
    x = torch.randn(2, 1, 28, 28)
    torch.testing.assert_close(student(x), teacher(x), rtol=1e-5, atol=1e-5)


def test_maps_reach_the_student_block_for_block(tiny_spec, teacher):
    """Every block gets a map of its own (not one map for all), a softmax map of the right
    shape."""
    student = perturb(make_model(tiny_spec, seed=2), seed=3).eval()
    drive_with_teacher(student, teacher)
    x = torch.randn(2, 1, 28, 28)
    seen = []
    hooks = [b.attn.register_forward_hook(lambda m, a, o: seen.append(m.given_map))
             for b in student.blocks]
    student(x)
    for h in hooks:
        h.remove()
    assert len(seen) == len(teacher.blocks)
    assert all(m.shape == (2, 3, 50, 50) for m in seen)
    assert not torch.allclose(seen[0], seen[-1])          # per block, not one map for all
    rows = seen[0].sum(-1)
    torch.testing.assert_close(rows, torch.ones_like(rows))   # softmax maps: rows sum to 1


def finetune(out, teacher_file, mnist_root, *extra):
    return cli.main(["finetune", "-o", str(out), f"teacher={teacher_file}",
                     "init.strategy=attn_copy", "model.operator=softmax",
                     f"data.root={mnist_root}", "data.batch_size=64", "optim.epochs=1",
                     "optim.warmup_epochs=0", "run.progress=false", *extra])


def test_the_saved_student_is_scored_with_its_teacher_s_maps(tmp_path, mnist_root, tiny_spec,
                                                             teacher):
    teacher_file = tmp_path / "teacher.safetensors"
    save_model(teacher, teacher_file)
    assert finetune(tmp_path / "cell", teacher_file, mnist_root) == 0
    model_file = tmp_path / "cell" / "model.safetensors"
    with safe_open(str(model_file), framework="pt") as f:
        assert json.loads(f.metadata()[MAPS_KEY]) == str(teacher_file)
    copied = json.loads((tmp_path / "cell" / "copied.json").read_text())
    assert copied["teacher_maps"] == str(teacher_file) and set(copied["summary"]) == {"new"}
    # evaluating the file alone reproduces the run's own final accuracy: the maps came back
    final = json.loads((tmp_path / "cell" / "metrics.json").read_text())["top1"]
    assert cli.main(["evaluate", "-o", str(tmp_path / "eval"), f"checkpoint={model_file}",
                     f"data.root={mnist_root}"]) == 0
    scored = json.loads((tmp_path / "eval" / "metrics.json").read_text())["top1"]
    assert scored == pytest.approx(final)
    # the loaded student is the driven one, not the same weights run on their own maps
    loaded = load_model(model_file).eval()
    plain = make_model(tiny_spec)
    plain.load_state_dict(loaded.state_dict())
    driven = drive_with_teacher(make_model(tiny_spec), teacher)
    driven.load_state_dict(loaded.state_dict())
    x = torch.randn(4, 1, 28, 28)
    torch.testing.assert_close(loaded(x), driven.eval()(x))
    assert not torch.allclose(loaded(x), plain.eval()(x), atol=1e-4)
    teacher_file.unlink()
    with pytest.raises(CheckpointError, match="attention transfer, copy mode.*not found"):
        load_model(model_file)


def test_attention_copy_is_refused_for_a_linear_student(tmp_path, mnist_root, tiny_spec,
                                                        teacher, capsys):
    teacher_file = tmp_path / "teacher.safetensors"
    save_model(teacher, teacher_file)
    assert finetune(tmp_path / "cell", teacher_file, mnist_root, "model.operator=linear") == 2
    assert "drives a softmax student" in capsys.readouterr().err
    assert not (tmp_path / "cell").exists()
