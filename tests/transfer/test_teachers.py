"""Teachers beyond supervised DeiT: MoCo v3 and iBOT checkpoints in their own key layouts (files the
tests write), headless imports, a probe stage that trains their head, and logit KD refused
against a teacher whose head is not trained."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from linvit import cli
from linvit.io import read_json, sha256_file
from linvit.models import ModelSpec, load_model, save_model
from linvit.models.checkpoint import ModelFile, read_metadata
from linvit.models.tensor_files import HEAD_KEY, ORIGIN_KEY

from conftest import make_model, perturb

SPEC = ModelSpec("cpu96", "softmax", num_classes=0, img_size=28, in_chans=1)


@pytest.fixture(scope="module")
def backbone():
    """A headless cpu96 backbone's tensors under timm's names."""
    return {k: v.clone() for k, v in perturb(make_model(SPEC)).state_dict().items()}


def mocov3_file(path, backbone):
    """moco-v3's layout: base and momentum encoders and the predictor under module., the base
    encoder's head being its projection MLP."""
    state = {f"module.base_encoder.{k}": v for k, v in backbone.items()}
    state.update({f"module.momentum_encoder.{k}": v + 1 for k, v in backbone.items()})
    state["module.base_encoder.head.0.weight"] = torch.randn(256, 96)
    state["module.predictor.0.weight"] = torch.randn(256, 256)
    torch.save({"epoch": 300, "arch": "vit_small", "state_dict": state,
                "optimizer": {"state": {}, "param_groups": []}}, path)
    return path


def ibot_file(path, backbone):
    """iBOT's training checkpoint: student and (EMA) teacher, backbone. and head. under module."""
    teacher = {f"module.backbone.{k}": v for k, v in backbone.items()}
    teacher["module.backbone.masked_embed"] = torch.zeros(96)
    teacher["module.head.mlp.0.weight"] = torch.randn(256, 96)
    student = {k: v + 1 for k, v in teacher.items()}
    torch.save({"student": student, "teacher": teacher, "epoch": 100}, path)
    return path


def import_args(out, file, layout, mnist_root, *extra):
    return ["import-teacher", "-o", str(out), "size=cpu96", f"file={file}", f"layout={layout}",
            "data.dataset=fashion_mnist", f"data.root={mnist_root}", *extra]


@pytest.mark.parametrize("layout, write", [("mocov3", mocov3_file), ("ibot", ibot_file)])
def test_self_supervised_layouts_import_their_backbone_tensor_for_tensor(
        tmp_path, mnist_root, backbone, layout, write):
    file = write(tmp_path / f"{layout}.pth", backbone)
    out = tmp_path / "teacher"
    assert cli.main(import_args(out, file, layout, mnist_root, "headless=true")) == 0
    model = load_model(out / "model.safetensors")
    assert model.spec.num_classes == 0 and ModelFile(out / "model.safetensors").head == "none"
    state = model.state_dict()
    assert set(state) == set(backbone)
    assert all(torch.equal(state[k], backbone[k]) for k in backbone)     # not the momentum copy
    report = read_json(out / "metrics.json")["import"]
    dropped = {"mocov3": ["module.base_encoder.head.0.weight", "module.predictor.0.weight"],
               "ibot": ["masked_embed", "head.mlp.0.weight"]}[layout]
    assert all(any(d.endswith(k) or k.endswith(d) for k in report["dropped"]) for d in dropped)
    # its origin (file name, digest, layout) is in the model file, to travel with every model
    # made from it (test_a_derived_model_carries_its_head_state_and_origin)
    assert read_metadata(out / "model.safetensors")[ORIGIN_KEY] == json.dumps(
        {"layout": layout, "sha256": sha256_file(file), "source": file.name}, sort_keys=True)


def test_a_foreign_layout_read_as_timm_s_is_refused_naming_the_keys(tmp_path, mnist_root,
                                                                     backbone, capsys):
    file = mocov3_file(tmp_path / "moco.pth", backbone)
    out = tmp_path / "teacher"
    assert cli.main(import_args(out, file, "timm", mnist_root, "headless=true")) == 2
    err = capsys.readouterr().err
    assert "does not fit the model" in err and "missing" in err and "base_encoder" in err
    assert not (out / "model.safetensors").exists()


def test_a_headless_checkpoint_needs_reset_head_or_headless(tmp_path, mnist_root, backbone,
                                                            capsys):
    file = ibot_file(tmp_path / "ibot.pth", backbone)
    assert cli.main(import_args(tmp_path / "t", file, "ibot", mnist_root)) == 2
    assert "no classifier head" in capsys.readouterr().err


def test_probe_trains_a_head_and_only_then_logit_kd_is_allowed(tmp_path, mnist_root, backbone,
                                                               capsys):
    file = mocov3_file(tmp_path / "moco.pth", backbone)
    imported = tmp_path / "imported"
    assert cli.main(import_args(imported, file, "mocov3", mnist_root, "reset_head=true")) == 0
    teacher = imported / "model.safetensors"
    assert ModelFile(teacher).head == "new"
    student = ["finetune", "-o", str(tmp_path / "cell"), f"teacher={teacher}",
               "init.strategy=copy_mlp", "model.operator=linear", f"data.root={mnist_root}",
               "optim.epochs=1", "optim.warmup_epochs=0", "data.batch_size=64",
               "run.progress=false"]
    assert cli.main([*student, "kd.weight=0.5"]) == 2
    assert "untrained, new head" in capsys.readouterr().err
    assert not (tmp_path / "cell").exists()

    probed = tmp_path / "probed"
    assert cli.main(["probe", "-o", str(probed), f"teacher={teacher}", f"data.root={mnist_root}",
                     "optim.epochs=1", "optim.warmup_epochs=0", "data.batch_size=64",
                     "run.progress=false"]) == 0
    model = load_model(probed / "model.safetensors")
    before = load_model(teacher).state_dict()
    after = model.state_dict()
    assert all(torch.equal(after[k], before[k]) for k in before if not k.startswith("head."))
    assert not torch.equal(after["head.weight"], before["head.weight"])  # linear probe: head only
    assert ModelFile(probed / "model.safetensors").head == "trained"
    student[3] = f"teacher={probed}/model.safetensors"
    assert cli.main([*student, "kd.weight=0.5"]) == 0


def test_strategies_give_a_student_of_a_headless_teacher_a_new_head(tmp_path, mnist_root,
                                                                    backbone):
    file = ibot_file(tmp_path / "ibot.pth", backbone)
    imported = tmp_path / "imported"
    assert cli.main(import_args(imported, file, "ibot", mnist_root, "headless=true")) == 0
    init = tmp_path / "init"
    assert cli.main(["init", "-o", str(init), f"teacher={imported}/model.safetensors",
                     "init.strategy=copy_all", "model.operator=linear",
                     f"data.root={mnist_root}"]) == 0
    tensors = read_json(init / "copied.json")["tensors"]
    assert tensors["head.weight"]["source"] == "new"
    assert "headless" in tensors["head.weight"]["reason"]
    assert tensors["blocks.0.mlp.fc1.weight"]["source"] == "teacher"


def test_timm_name_and_file_together_are_refused(tmp_path, capsys):
    assert cli.main(["import-teacher", "-o", str(tmp_path / "t"), "timm_name=x",
                     f"file={__file__}"]) == 2
    assert "timm_name" in capsys.readouterr().err


TEACHER_STAGES = {   # every stage that reads a teacher, with what else it needs
    "distill": ["model.operator=linear"],
    "finetune": ["model.operator=linear", "init.strategy=copy_mlp"],
    "init": ["model.operator=linear", "init.strategy=copy_mlp"],
    "select": ["size=cpu96"],
    "attention-maps": [],
}


@pytest.mark.parametrize("stage", sorted(TEACHER_STAGES))
@pytest.mark.parametrize("teacher, why", [
    ("linear", "is a linear model; a teacher is a softmax ViT"),
    ("extra", "is not a softmax cpu96 model (unexpected: extra.tensor)"),
])
def test_every_stage_refuses_a_teacher_that_is_not_a_plain_softmax_model(
        tmp_path, mnist_root, capsys, stage, teacher, why):
    """One teacher check (ModelFile.check_teacher) serves every stage: a student of
    another operator, or a softmax file with a tensor too many, teaches nothing."""
    from linvit.models.tensor_files import load_tensors, save_tensors

    path = tmp_path / "teacher.safetensors"
    operator = "linear" if teacher == "linear" else "softmax"
    save_model(make_model(ModelSpec("cpu96", "softmax", 10, 28, 1), operator), path)
    if teacher == "extra":
        tensors, meta = load_tensors(path)
        save_tensors(path, {**tensors, "extra.tensor": torch.zeros(2)}, meta)
    out = tmp_path / "out"
    assert cli.main([stage, "-o", str(out), f"teacher={path}", f"data.root={mnist_root}",
                     *TEACHER_STAGES[stage]]) == 2
    assert why in capsys.readouterr().err
    assert not out.exists()


# What the head of each stage's output model is, made from a teacher whose head is untrained
# ("new", as imported from a self-supervised checkpoint): carried through a copy, "trained" where
# the stage trains it. Every stage that reads a teacher and writes a model has an entry.
HEAD_AFTER = {
    "select": (["size=cpu96"], "new"),
    "distill": (["model.operator=linear"], "new"),                    # head copied, not trained
    "init": (["model.operator=linear", "init.strategy=copy_all"], "new"),
    "finetune": (["model.operator=linear", "init.strategy=copy_all"], "trained"),
    "probe": ([], "trained"),
}


def test_every_stage_that_derives_a_model_says_what_its_head_is():
    from linvit.cli import stage_config
    from linvit.stages import STAGES
    derived = {name for name, stage in STAGES.items() if "model.safetensors" in stage.outputs
               and "teacher" in stage_config(name).__dataclass_fields__}
    assert derived == set(HEAD_AFTER)


@pytest.mark.parametrize("stage", sorted(HEAD_AFTER))
def test_a_derived_model_carries_its_head_state_and_origin(tmp_path, mnist_root, stage):
    teacher = tmp_path / "teacher.safetensors"
    origin = {"layout": "mocov3", "sha256": "ab" * 32, "source": "vit-s-300ep.pth.tar"}
    save_model(perturb(make_model(ModelSpec("cpu96", "softmax", 10, 28, 1))), teacher,
               {HEAD_KEY: "new", ORIGIN_KEY: origin})
    args, expected = HEAD_AFTER[stage]
    short = [] if stage in ("select", "init") else [
        "optim.epochs=1", "optim.warmup_epochs=0", "data.batch_size=64",
        "data.train_subset=128", "run.progress=false"]
    out = tmp_path / "out"
    assert cli.main([stage, "-o", str(out), f"teacher={teacher}", f"data.root={mnist_root}",
                     "data.test_subset=64", *args, *short]) == 0
    assert ModelFile(out / "model.safetensors").head == expected
    assert json.loads(read_metadata(out / "model.safetensors")[ORIGIN_KEY]) == origin


def test_a_copied_head_keeps_its_source_s_state_and_a_new_one_is_new(tmp_path, mnist_root):
    teacher = tmp_path / "teacher.safetensors"
    save_model(perturb(make_model(ModelSpec("cpu96", "softmax", 10, 28, 1))), teacher)
    for strategy, expected in (("copy_all", "trained"), ("random", "new")):
        out = tmp_path / strategy
        assert cli.main(["init", "-o", str(out), f"teacher={teacher}", f"data.root={mnist_root}",
                         "data.test_subset=64", "model.operator=linear",
                         f"init.strategy={strategy}"]) == 0
        assert ModelFile(out / "model.safetensors").head == expected, strategy


def test_a_stage_reads_each_model_file_once(tmp_path, mnist_root, monkeypatch):
    """A fine-tune's checks (teacher, distilled student, heads, provenance) read the files a
    stage opened (ModelFile): each file's header once, its tensors once."""
    import linvit.models.checkpoint as checkpoint
    import linvit.models.tensor_files as tensor_files

    teacher, distilled = tmp_path / "teacher.safetensors", tmp_path / "distilled.safetensors"
    save_model(perturb(make_model(ModelSpec("cpu96", "softmax", 10, 28, 1))), teacher)
    save_model(make_model(ModelSpec("cpu96", "softmax", 10, 28, 1), "linear"), distilled)
    headers, tensors = [], []
    for module, name, seen in ((checkpoint, "read_header", headers),
                               (tensor_files, "load_tensors", tensors)):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda path, real=real, seen=seen:
                            seen.append(Path(path).name) or real(path))
    assert cli.main(["init", "-o", str(tmp_path / "out"), f"teacher={teacher}",
                     f"distilled={distilled}", f"data.root={mnist_root}", "data.test_subset=64",
                     "model.operator=linear", "init.strategy=copy_mlp+distill"]) == 0
    for name in ("teacher.safetensors", "distilled.safetensors"):
        assert (headers.count(name), tensors.count(name)) == (1, 1), (name, headers, tensors)
