"""Weight selection: selected tensors are the teacher's slices (indices written out here, head by
head), selecting to the same size is the identity, impossible selections are refused, and the
`select` stage writes a loadable teacher that the init strategies take."""
from __future__ import annotations

import pytest
import torch

from linvit import cli
from linvit.io import read_json
from linvit.models import ModelSpec, load_model, save_model
from linvit.models.sizes import get_size
from linvit.transfer.select import evenly_spaced, select_state

from conftest import make_model, perturb


def state_of(size, classes=10, img=28, chans=1):
    return perturb(make_model(ModelSpec(size, "softmax", classes, img, chans))).state_dict()


def test_evenly_spaced_stays_in_range_for_any_sizes():
    assert evenly_spaced(3, 6).tolist() == [0, 2, 4]
    assert evenly_spaced(4, 4).tolist() == [0, 1, 2, 3]
    for small in range(1, 50):
        for large in range(small, 60):
            idx = evenly_spaced(small, large)
            assert len(set(idx.tolist())) == small and idx.max() < large
    with pytest.raises(ValueError):
        evenly_spaced(5, 4)


def test_selecting_to_the_same_size_reproduces_the_teacher():
    teacher = state_of("cpu96")
    selected = select_state(teacher, "cpu96", list(teacher), "cpu96")
    assert all(torch.equal(selected[k], teacher[k]) for k in teacher)


def expected_rows(teacher, student, head_dim_t, head_dim_s):
    """qkv rows a student takes, written out: segment, head, channel."""
    heads = [h * teacher.heads // student.heads for h in range(student.heads)]
    chans = [j * head_dim_t // head_dim_s for j in range(head_dim_s)]
    return [s * teacher.width + h * head_dim_t + j
            for s in range(3) for h in heads for j in chans]


@pytest.mark.parametrize("big, small", [("cpu192", "cpu96"), ("deit_s", "deit_t")])
def test_selected_tensors_are_the_teacher_s_slices(big, small):
    """cpu192 -> cpu96 halves every head's width; deit_s -> deit_t keeps head width 64 and takes
    heads 0, 2, 4: both per-head layouts of qkv and proj are checked."""
    img = 28 if big.startswith("cpu") else 32
    teacher = state_of(big, img=img)
    student = state_of(small, img=img)
    t, s = get_size(big), get_size(small)
    dt, ds = t.width // t.heads, s.width // s.heads
    selected = select_state(teacher, big, list(student), small)
    assert {k: v.shape for k, v in selected.items()} == {k: v.shape for k, v in student.items()}
    width = [i * t.width // s.width for i in range(s.width)]
    hidden = [i * 4 * t.width // (4 * s.width) for i in range(4 * s.width)]
    rows = expected_rows(t, s, dt, ds)
    last = s.depth - 1
    block = f"blocks.{last}"
    checks = {
        f"{block}.attn.qkv.weight": teacher[f"{block}.attn.qkv.weight"][rows][:, width],
        f"{block}.attn.qkv.bias": teacher[f"{block}.attn.qkv.bias"][rows],
        f"{block}.attn.proj.weight": teacher[f"{block}.attn.proj.weight"][width][
            :, rows[:s.width]],
        f"{block}.mlp.fc1.weight": teacher[f"{block}.mlp.fc1.weight"][hidden][:, width],
        f"{block}.mlp.fc2.weight": teacher[f"{block}.mlp.fc2.weight"][width][:, hidden],
        f"{block}.norm2.bias": teacher[f"{block}.norm2.bias"][width],
        "patch_embed.proj.weight": teacher["patch_embed.proj.weight"][width],
        "pos_embed": teacher["pos_embed"][..., width],
        "cls_token": teacher["cls_token"][..., width],
        "head.weight": teacher["head.weight"][:, width],
        "norm.weight": teacher["norm.weight"][width],
    }
    for name, want in checks.items():
        assert torch.equal(selected[name], want), name
    assert f"blocks.{s.depth}.attn.qkv.weight" not in selected or s.depth == t.depth


def test_a_student_larger_in_any_way_is_refused():
    teacher = state_of("cpu96")
    student = state_of("cpu192")
    with pytest.raises(Exception, match="width 192 > 96"):
        select_state(teacher, "cpu96", list(student), "cpu192")
    patch2 = state_of("cpu96p2")
    with pytest.raises(Exception, match="patch size"):
        select_state(teacher, "cpu96", list(patch2), "cpu96p2")


def test_select_stage_writes_a_teacher_that_strategies_take(tmp_path, mnist_root):
    big = tmp_path / "big.safetensors"
    save_model(perturb(make_model(ModelSpec("cpu192", "softmax", 10, 28, 1))), big)
    out = tmp_path / "selected"
    assert cli.main(["select", "-o", str(out), f"teacher={big}", "size=cpu96",
                     f"data.root={mnist_root}"]) == 0
    metrics = read_json(out / "metrics.json")
    assert 0 <= metrics["top1"] <= 100 and metrics["spec"]["size"] == "cpu96"
    record = read_json(out / "selected.json")
    assert record["heads"][:3] == [0, 1, 2] and record["width"][:3] == [0, 2, 4]
    teacher = load_model(out / "model.safetensors")
    assert teacher.spec.size == "cpu96"
    init = tmp_path / "init"
    assert cli.main(["init", "-o", str(init), f"teacher={out}/model.safetensors",
                     "init.strategy=copy_mlp", "model.operator=linear",
                     f"data.root={mnist_root}"]) == 0
    copied = read_json(init / "copied.json")
    assert copied["summary"]["teacher"] > 0
    assert cli.main(["select", "-o", str(tmp_path / "x"), f"teacher={big}", "size=deit_b",
                     f"data.root={mnist_root}"]) == 2


@pytest.mark.parametrize("head", ["trained", "new"])
def test_a_selected_teacher_keeps_the_state_of_its_head(tmp_path, mnist_root, head):
    """A self-supervised teacher's new head stays marked untrained through selection, so logit
    KD against it is refused after select as it is before."""
    from linvit.models.checkpoint import ModelFile
    from linvit.models.tensor_files import HEAD_KEY

    big = tmp_path / "big.safetensors"
    save_model(make_model(ModelSpec("cpu192", "softmax", 10, 28, 1)), big, {HEAD_KEY: head})
    out = tmp_path / "selected"
    assert cli.main(["select", "-o", str(out), f"teacher={big}", "size=cpu96",
                     f"data.root={mnist_root}"]) == 0
    assert ModelFile(out / "model.safetensors").head == ModelFile(big).head == head
    kd = ["finetune", "-o", str(tmp_path / "kd"), f"teacher={out}/model.safetensors",
          "init.strategy=copy_mlp", "model.operator=linear", "kd.weight=0.5",
          f"data.root={mnist_root}", "optim.epochs=1", "data.train_subset=64",
          "data.batch_size=32", "optim.warmup_epochs=0",
          "data.test_subset=32", "run.progress=false"]
    assert cli.main(kd) == (0 if head == "trained" else 2)


def test_the_same_select_run_twice_writes_the_same_bytes(tmp_path, mnist_root):
    """Every file a run writes, its log aside (timestamps), is byte-identical for identical
    inputs, also from two processes (the safetensors header's key order once varied by process)."""
    import subprocess
    import sys

    big = tmp_path / "big.safetensors"
    save_model(make_model(ModelSpec("cpu192", "softmax", 10, 28, 1)), big)
    for out in ("a", "b"):
        subprocess.run([sys.executable, "-m", "linvit.cli", "select", "-o", str(tmp_path / out),
                        f"teacher={big}", "size=cpu96", f"data.root={mnist_root}"], check=True,
                       capture_output=True)
    files = sorted(p.name for p in (tmp_path / "a").iterdir() if p.name != "run.log")
    assert {"model.safetensors", "metrics.json", "selected.json", "config.yaml"} <= set(files)
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
