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
from linvit.runs import runtime
from linvit.train.stages import run_pretrain
from linvit.transfer.stages import run_finetune

from train_runs import cut_in_epoch_2, finetune_cfg, pretrain_cfg

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
    cut_in_epoch_2(run, cfg, tmp_path / "cut", monkeypatch)
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


def test_the_end_to_end_phase_trains_on_logits_after_the_layer_wise_one_and_resumes_in_it(
        mnist_root, tmp_path, monkeypatch):
    """optim.epochs=3, distill.e2e_epochs=2: epoch 1 on the attention outputs, epochs 2-3 on the
    logits (only the attention learning); cut in epoch 3, the resumed run is the same run."""
    from linvit.models import flops
    from linvit.transfer.config import DistillConfig
    from linvit.transfer.stages import run_distill

    run_pretrain(pretrain_cfg(mnist_root, "optim.epochs=1", "optim.warmup_epochs=0"),
                 tmp_path / "teacher")
    teacher = tmp_path / "teacher" / "model.safetensors"
    cfg = load_config(DistillConfig, None, [
        f"teacher={teacher}", f"data.root={mnist_root}", "data.batch_size=64",
        "data.eval_batch_size=128", "optim.epochs=3", "distill.e2e_epochs=2",
        "run.progress=false", "run.threads=1"])
    full = run_distill(cfg, tmp_path / "full")
    history = read_jsonl(tmp_path / "full" / "train.jsonl")
    assert ["train_attn_out_mse/L0" in r for r in history] == [True, False, False]
    assert ["train_logit_kd" in r for r in history] == [False, True, True]
    assert all("test_tf_attn_out_mse/L0" in r and "test_tf_rel_err/L5" in r for r in history)
    cut_in_epoch_2(run_distill, cfg, tmp_path / "cut", monkeypatch, epoch=3)
    resumed = run_distill(cfg, tmp_path / "cut")
    assert resumed["top1"] == full["top1"] and resumed["e2e_epochs"] == 2
    assert [r["train_loss"] for r in read_jsonl(tmp_path / "cut" / "train.jsonl")] == [
        r["train_loss"] for r in history]
    a, b, t = (load_file(p) for p in (tmp_path / "full" / "model.safetensors",
                                      tmp_path / "cut" / "model.safetensors", teacher))
    assert all(torch.equal(a[k], b[k]) for k in a)
    changed = {k.split(".")[2] for k in a if k in t and not torch.equal(a[k], t[k])}
    assert changed == {"attn"}                      # the MLPs, norms, stem and head the teacher's
    s = ModelSpec.from_dict(full["spec"])
    forced = flops.forward_flops(ModelSpec.from_dict(read_json(
        tmp_path / "teacher" / "metrics.json")["spec"])) + 6 * flops.attention_flops(s)
    layer_wise = forced + 6 * 2 * flops.attention_flops(s)
    end_to_end = forced + flops.train_flops_per_image(s)
    assert full["train_flops_per_image"] == pytest.approx((layer_wise + 2 * end_to_end) / 3)


def test_rerun_with_another_config_is_refused(mnist_root, tmp_path):
    run_pretrain(pretrain_cfg(mnist_root, "optim.epochs=2"), tmp_path / "run")
    with pytest.raises(RunDirError, match="optim.lr"):
        run_pretrain(pretrain_cfg(mnist_root, "optim.epochs=2", "optim.lr=0.01"), tmp_path / "run")


@pytest.mark.slow
def test_compiled_training_step_matches_eager(mnist_root, tmp_path, monkeypatch):
    # aot_eager traces forward and backward as inductor does, without its C++ build (CI's minutes)
    compiled, real = [], torch.compile

    def spy(module, **kwargs):
        compiled.append(kwargs["backend"])
        return real(module, **kwargs)

    monkeypatch.setattr(torch, "compile", spy)
    runs = {name: run_pretrain(pretrain_cfg(mnist_root, "optim.epochs=2", *extra), tmp_path / name)
            for name, extra in (("eager", ()), ("compiled", ("run.compile=aot_eager",)))}
    assert compiled == ["aot_eager"]
    losses = {name: [r["train_loss"] for r in read_jsonl(tmp_path / name / "train.jsonl")]
              for name in runs}
    assert losses["compiled"] == pytest.approx(losses["eager"], rel=1e-3)
    assert runs["compiled"]["top1"] == pytest.approx(runs["eager"]["top1"], abs=1.0)
    # the checkpoint keeps the plain module's tensor names (no _orig_mod. prefix)
    assert load_file(tmp_path / "compiled" / "model.safetensors").keys() == \
        load_file(tmp_path / "eager" / "model.safetensors").keys()


def test_a_run_resumed_on_another_machine_keeps_the_precision_it_started_in(
        mnist_root, tmp_path, monkeypatch, caplog):
    """run.amp=auto is decided by the machine: a run cut in bf16 and resumed where auto would
    choose float32 goes on in bf16 (said in the log) and ends as the uninterrupted bf16 run."""
    cfg = pretrain_cfg(mnist_root, "optim.epochs=2")
    monkeypatch.setattr(runtime, "bf16_pays", lambda device: True)
    full = run_pretrain(cfg, tmp_path / "full")
    cut_in_epoch_2(run_pretrain, cfg, tmp_path / "cut", monkeypatch)
    monkeypatch.setattr(runtime, "bf16_pays", lambda device: False)
    with caplog.at_level("WARNING", logger="linvit"):
        resumed = run_pretrain(cfg, tmp_path / "cut")
    assert "continuing in bfloat16 autocast, as this run started" in caplog.text
    for key in ("top1", "loss", "per_class_acc"):
        assert resumed[key] == full[key], key
    fresh = run_pretrain(cfg, tmp_path / "fresh")              # this machine's own choice
    assert fresh["loss"] != full["loss"]


@pytest.mark.slow
def test_two_process_ddp_matches_one_process(mnist_root, tmp_path):
    """gloo, 2 CPU processes x 32 images == 1 process x 64 images, step for step (in float32:
    bf16 autocast, on a CPU that has it, rounds the two batch splits differently)."""
    args = ["pretrain", "-o", None, f"data.root={mnist_root}", "data.batch_size=64",
            "data.train_subset=256", "optim.epochs=2", "optim.warmup_epochs=1",
            "run.progress=false", "run.threads=1", "run.amp=float32"]
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


# Loaded by every process of the run below (PYTHONPATH): rank 0 kills torchrun and every worker
# (SIGKILL, itself last) as it starts its second epoch, after its first epoch's checkpoint.
KILL_AT_EPOCH_2 = '''
import os, signal
if os.environ.get("RANK") == "0":
    import psutil
    from linvit.train import trainer
    real, calls = trainer.train_one_epoch, []
    def train_one_epoch(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            launcher = psutil.Process(os.getppid())
            for proc in [launcher, *launcher.children(recursive=True)]:
                if proc.pid != os.getpid():
                    proc.send_signal(signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)
    trainer.train_one_epoch = train_one_epoch
'''


@pytest.mark.slow
def test_two_process_run_with_deit_s_recipe_resumes_exactly_after_kill_9(tmp_path):
    """The paper's fine-tuning path on an ImageNet-layout folder: torchrun with 2 processes,
    RandAugment, Mixup/CutMix, random erasing, repeated augmentation, layer decay and an EMA,
    killed (SIGKILL, every process) in its second epoch, then run again: the same model and EMA
    as a run never interrupted."""
    import signal

    from PIL import Image
    for split in ("train", "val"):
        for c in range(3):
            (tmp_path / "images" / split / f"c{c}").mkdir(parents=True)
            for i in range(8):
                Image.new("RGB", (36, 36), (80 * c, 30 * i, 7 * i)).save(
                    tmp_path / "images" / split / f"c{c}" / f"{i}.png")
    data = [f"data.root={tmp_path / 'images'}", "data.dataset=imagefolder", "data.img_size=32",
            "data.workers=0", "data.batch_size=8", "data.eval_batch_size=8",
            "run.progress=false", "run.threads=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cli = [sys.executable, "-m", "linvit.cli"]
    teacher = tmp_path / "teacher"
    subprocess.run([*cli, "pretrain", "-o", str(teacher), *data, "optim.epochs=1",
                    "optim.warmup_epochs=0"], env=env, check=True, capture_output=True)
    finetune = ["--nproc", "2", "finetune", *data, f"teacher={teacher}/model.safetensors",
                "init.strategy=copy_mlp", "model.operator=linear", "optim.epochs=2",
                "optim.warmup_epochs=0", "aug.auto_augment=rand-m9-mstd0.5-inc1", *RECIPE,
                "aug.repeats=3"]

    def run(out, extra_env=None):
        return subprocess.run([*cli, *finetune, "-o", str(out)], env={**env, **(extra_env or {})},
                              capture_output=True, text=True, timeout=600,
                              start_new_session=True)

    full = run(tmp_path / "full")
    assert full.returncode == 0, full.stderr[-3000:]
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(KILL_AT_EPOCH_2)
    killed = run(tmp_path / "cut", {"PYTHONPATH": str(tmp_path / "hook")})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert (tmp_path / "cut" / "checkpoint.safetensors").is_file()
    assert not (tmp_path / "cut" / "metrics.json").exists()
    resumed = run(tmp_path / "cut")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resum" in resumed.stderr.lower(), resumed.stderr[-3000:]
    for name in ("model.safetensors", "model_ema.safetensors"):
        a, b = (load_file(tmp_path / run_dir / name) for run_dir in ("full", "cut"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    metrics = [read_json(tmp_path / run_dir / "metrics.json") for run_dir in ("full", "cut")]
    assert metrics[0]["env"]["processes"] == metrics[1]["env"]["processes"] == 2
    assert metrics[0]["top1"] == metrics[1]["top1"]
    assert metrics[0]["ema_top1"] == metrics[1]["ema_top1"]
