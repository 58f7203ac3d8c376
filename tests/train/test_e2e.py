"""The whole transfer through the CLI and the demo, on small synthetic data in Fashion-MNIST
layout."""
from __future__ import annotations

import json

import pytest
import yaml

from linvit import cli
from linvit.demo import run_demo
from linvit.io import read_jsonl
from markdown_rows import has_row, rows

RUN_FILES = {"config.yaml", "run.log", "train.jsonl", "metrics.json", "model.safetensors"}


@pytest.mark.slow
def test_cli_stages_chain_and_leave_their_records(mnist_root, tmp_path):
    common = [f"data.root={mnist_root}", "data.batch_size=64", "run.progress=false"]
    teacher, distilled = tmp_path / "teacher", tmp_path / "distill"
    assert cli.main(["pretrain", "-o", str(teacher), "optim.epochs=3", "optim.lr=2e-3",
                     *common]) == 0
    assert cli.main(["distill", "-o", str(distilled), f"teacher={teacher}/model.safetensors",
                     "model.operator=focused", "distill.losses={attn_map_ce: 1, attn_out_mse: 1}",
                     *common]) == 0
    student = tmp_path / "student"
    assert cli.main(["finetune", "-o", str(student), f"teacher={teacher}/model.safetensors",
                     f"distilled={distilled}/model.safetensors", "model.operator=focused",
                     "optim.epochs=2", "kd.weight=0.5", *common]) == 0
    evaluation = tmp_path / "eval"
    assert cli.main(["evaluate", "-o", str(evaluation), f"checkpoint={student}/model.safetensors",
                     *common]) == 0

    for folder in (teacher, distilled, student):
        assert {p.name for p in folder.iterdir()} >= RUN_FILES, folder
        assert not (folder / "checkpoint.safetensors").exists()
    assert (distilled / "trained.json").is_file() and (student / "copied.json").is_file()
    metrics = {f.name: json.loads((f / "metrics.json").read_text())
               for f in (teacher, distilled, student, evaluation)}
    assert metrics["teacher"]["top1"] > 25          # 10 = chance; 24 steps of training
    assert metrics["student"]["top1"] == metrics["eval"]["top1"]
    assert metrics["student"]["copied"] == {"teacher": 56, "distilled": 42}
    history = read_jsonl(student / "train.jsonl")
    assert [r["epoch"] for r in history] == [1, 2] and "train_kd" in history[0]
    # the distillation's quality: before, references, every epoch, the end, free-running
    quality = metrics["distill"]["quality"]
    assert set(quality) == {"before", "random", "copied", "free"}
    assert quality["before"] == quality["random"]        # attn_init random: the same start
    layers = {f"tf_{m}/L{l}" for m in ("rel_err", "map_kl") for l in range(6)}
    assert layers <= set(quality["copied"]) and layers <= set(metrics["distill"])
    assert all(metrics["distill"][f"tf_rel_err/L{l}"] < quality["random"][f"tf_rel_err/L{l}"]
               for l in range(6))                       # distillation brought it closer
    assert {f"test_tf_rel_err/L{l}" for l in range(6)} <= set(
        read_jsonl(distilled / "train.jsonl")[-1])
    assert set(quality["free"]) == {"logit_kl", "agreement", "top1"}
    assert 0 <= quality["free"]["agreement"] <= 100 and quality["free"]["logit_kl"] >= 0
    moved = metrics["student"]["attn_moved"]
    assert sorted(moved) == [f"L{l}" for l in range(6)] and all(v > 0 for v in moved.values())
    config = yaml.safe_load((student / "config.yaml").read_text())
    assert config["stage"] == "finetune" and config["config"]["kd"]["weight"] == 0.5


@pytest.mark.slow
def test_demo_prints_the_comparison_table(mnist_root, tmp_path, capsys):
    extra = [f"data.root={mnist_root}", "optim.epochs=1", "optim.warmup_epochs=0",
             "run.progress=false", "data.train_subset=256"]
    table = run_demo(tmp_path / "demo", "linear", extra)
    assert len(rows(table)) == 1 + 4                # header + teacher, distilled, 2 students
    assert has_row(table, "student", "linear", "random")
    assert has_row(table, "student", "linear", "copy_mlp+distill")
    assert (tmp_path / "demo" / "table.md").read_text() == table
    # a second call reuses every finished stage
    assert run_demo(tmp_path / "demo", "linear", extra).splitlines()[:6] == table.splitlines()[:6]


def test_import_teacher_then_init_through_the_cli(mnist_root, tmp_path):
    import torch
    from timm.models.vision_transformer import VisionTransformer

    from linvit.models import load_model

    torch.manual_seed(0)
    ref = VisionTransformer(img_size=28, patch_size=4, in_chans=1, num_classes=10, embed_dim=96,
                            depth=6, num_heads=3).eval()
    torch.save({"model": ref.state_dict()}, tmp_path / "timm.pth")
    teacher = tmp_path / "teacher"
    assert cli.main(["import-teacher", "-o", str(teacher), "size=cpu96",
                     f"file={tmp_path / 'timm.pth'}", "data.dataset=fashion_mnist",
                     f"data.root={mnist_root}"]) == 0
    x = torch.randn(2, 1, 28, 28)
    torch.testing.assert_close(load_model(teacher / "model.safetensors").eval()(x), ref(x))

    init = tmp_path / "init"
    assert cli.main(["init", "-o", str(init), f"teacher={teacher}/model.safetensors",
                     "init.strategy=copy_mlp", "model.operator=inline", f"data.root={mnist_root}",
                     "run.progress=false"]) == 0
    record = json.loads((init / "copied.json").read_text())
    assert record["strategy"] == "copy_mlp" and record["summary"] == {"teacher": 56, "new": 36}
    student = load_model(init / "model.safetensors")
    assert student.spec.operator == "inline"
    assert json.loads((init / "metrics.json").read_text())["init"]["eval_samples"] == 256
