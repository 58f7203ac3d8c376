"""The training loop: resume after an interrupt, and two-process DDP equal to one process."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from linvit.config import load_config
from linvit.errors import RunDirError
from linvit.io import read_json, read_jsonl
from linvit.models.spec import ModelSpec
from linvit.train import trainer
from linvit.train.config import PretrainConfig
from linvit.train.stages import run_pretrain
from linvit.transfer.config import FinetuneConfig
from linvit.transfer.stages import run_finetune


def pretrain_cfg(root, *extra):
    return load_config(PretrainConfig, None, [
        f"data.root={root}", "data.batch_size=64", "data.eval_batch_size=128",
        "optim.epochs=3", "optim.warmup_epochs=1", "run.progress=false", "run.threads=1",
        *extra])


def finetune_cfg(root, teacher, *extra):
    return load_config(FinetuneConfig, None, [
        f"teacher={teacher}", "init.strategy=copy_mlp", "model.operator=focused",
        f"data.root={root}", "data.batch_size=64", "data.eval_batch_size=128", "optim.epochs=3",
        "optim.warmup_epochs=1", "run.progress=false", "run.threads=1", *extra])


# DeiT's recipe's random parts (linvit.train.recipe): Mixup/CutMix draw from numpy, random
# erasing from Python's random; layer decay changes the parameter groups the state restores.
RECIPE = ("aug.mixup=0.8", "aug.cutmix=1.0", "aug.reprob=0.25", "optim.layer_decay=0.75",
          "optim.ema_decay=0.9")


@pytest.mark.parametrize("stage", ["pretrain", "finetune", "finetune+recipe"])
def test_resume_after_interrupt_reproduces_uninterrupted_run(mnist_root, tmp_path, monkeypatch,
                                                             stage):
    # two epochs: the interrupt lands after the warmup epoch, in the cosine one
    if stage == "pretrain":
        run, cfg = run_pretrain, pretrain_cfg(mnist_root, "model.drop_path=0.1",  # RNG in use
                                              "optim.epochs=2")
    else:
        run_pretrain(pretrain_cfg(mnist_root, "optim.epochs=1", "optim.warmup_epochs=0"),
                     tmp_path / "teacher")
        run = run_finetune
        cfg = finetune_cfg(mnist_root, tmp_path / "teacher" / "model.safetensors",
                           "model.drop_path=0.1", "optim.epochs=2",
                           *(RECIPE if stage.endswith("recipe") else ()))
    full = run(cfg, tmp_path / "full")

    real, calls = trainer.train_one_epoch, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt("simulated interrupt in epoch 2")
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "train_one_epoch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "cut")
    assert (tmp_path / "cut" / "checkpoint.safetensors").is_file()
    assert not (tmp_path / "cut" / "metrics.json").exists()    # never taken for a result
    assert len(read_jsonl(tmp_path / "cut" / "train.jsonl")) == 1
    monkeypatch.setattr(trainer, "train_one_epoch", real)

    resumed = run(cfg, tmp_path / "cut")
    for key in ("top1", "top5", "loss", "per_class_acc"):
        assert resumed[key] == full[key], key
    if stage != "pretrain":                     # accuracy at init survives the interrupt
        assert resumed["init"]["top1"] == full["init"]["top1"]
    # the portable cost: images seen over both epochs (512 a pass), FLOPs per image of the model
    from linvit.models.flops import train_flops_per_image
    assert resumed["train_images"] == full["train_images"] == 2 * 512
    assert full["train_flops_per_image"] == train_flops_per_image(
        ModelSpec.from_dict(full["spec"]))
    for name in ("model.safetensors",) + (("model_ema.safetensors",) if "recipe" in stage
                                          else ()):
        a = load_file(tmp_path / "full" / name)
        b = load_file(tmp_path / "cut" / name)
        assert all(torch.equal(a[k], b[k]) for k in a), name
    if "recipe" in stage:                       # the EMA: its own weights, scored and listed
        assert resumed["ema_top1"] == full["ema_top1"]
        assert "model_ema.safetensors" in read_json(tmp_path / "cut" / "metrics.json")["outputs"]
        ema, model = (load_file(tmp_path / "full" / n) for n in ("model_ema.safetensors",
                                                                 "model.safetensors"))
        assert not all(torch.equal(ema[k], model[k]) for k in model)
    losses = [[r["train_loss"] for r in read_jsonl(p / "train.jsonl")]
              for p in (tmp_path / "full", tmp_path / "cut")]
    assert losses[0] == losses[1] and len(losses[0]) == 2
    assert not (tmp_path / "cut" / "checkpoint.safetensors").exists()


def test_rerun_with_another_config_is_refused(mnist_root, tmp_path):
    run_pretrain(pretrain_cfg(mnist_root, "optim.epochs=2"), tmp_path / "run")
    with pytest.raises(RunDirError, match="optim.lr"):
        run_pretrain(pretrain_cfg(mnist_root, "optim.epochs=2", "optim.lr=0.01"), tmp_path / "run")


@pytest.mark.slow
def test_two_process_ddp_matches_one_process(mnist_root, tmp_path):
    """gloo, 2 CPU processes x 32 images == 1 process x 64 images, step for step."""
    args = ["pretrain", "-o", None, f"data.root={mnist_root}", "data.batch_size=64",
            "data.train_subset=256", "optim.epochs=2", "optim.warmup_epochs=1",
            "run.progress=false", "run.threads=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    outs = {}
    for name, launcher in (("single", [sys.executable, "-m", "linvit.cli"]),
                           ("ddp", [sys.executable, "-m", "linvit.cli", "--nproc", "2"])):
        out = tmp_path / name
        args[2] = str(out)
        proc = subprocess.run(launcher + args, env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outs[name] = out
    single, ddp = (json.loads((outs[n] / "metrics.json").read_text()) for n in ("single", "ddp"))
    assert ddp["eval_samples"] == single["eval_samples"] == 256
    assert abs(ddp["loss"] - single["loss"]) < 1e-3
    a, b = (load_file(outs[n] / "model.safetensors") for n in ("single", "ddp"))
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-3
