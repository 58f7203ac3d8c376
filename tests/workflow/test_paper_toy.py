"""The paper configuration's structure, end to end at toy scale on the CPU, so the paper path runs
on every CI run and not only as a dry run: config/paper.yaml with fewer entries per axis and tiny
schedules, an ImageNet-layout folder the test writes (1000 classes, 224 px after timm's
transforms), a DeiT-T teacher imported from a timm-format file the test writes, distillation and
fine-tuning under torch.distributed with two CPU processes, and robustness on ImageNet-C-style
corruptions and the four shift-set folders."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from PIL import Image
from test_snakemake import copy_project, snakemake

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def synsets(name: str) -> list[str]:
    from importlib.resources import files
    return (files("timm.data") / "_info" / name).read_text().split()


def write_images(folder: Path, count: int, seed: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        colour = ((seed * 37 + i * 91) % 256, (seed * 11) % 256, (i * 53) % 256)
        Image.new("RGB", (48, 40), colour).save(folder / f"{i}.jpg")


def imagenet_folder(root: Path) -> Path:
    """train/ and val/ with the 1000 ImageNet wnids, one image each (the class count is the
    model's; the stages score fixed subsets of them)."""
    for split in ("train", "val"):
        for c, wnid in enumerate(synsets("imagenet_synsets.txt")):
            write_images(root / split / wnid, 1, c)
    return root


def shift_folders(root: Path) -> dict[str, str]:
    folders = {"imagenet_a": synsets("imagenet_a_synsets.txt")[:2],
               "imagenet_r": synsets("imagenet_r_synsets.txt")[:2],
               "imagenet_sketch": synsets("imagenet_synsets.txt")[:2],
               "imagenet_v2": ["0", "10", "2"]}
    for name, classes in folders.items():
        for i, c in enumerate(classes):
            write_images(root / name / c, 2, i)
    return {name: str(root / name) for name in folders}


def deit_tiny_file(path: Path) -> Path:
    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    save_file(timm.create_model("deit_tiny_patch16_224").state_dict(), str(path))
    return path


def toy_paper_config(data: Path, teacher: Path, shifts: dict) -> dict:
    """paper.yaml with every axis cut to a few entries and every schedule to a few steps."""
    config = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
    config.update(
        results="results", sizes=["deit_t"], operators=["linear"], seeds=[0],
        # the recipe and its data-free baseline. Random init and the loss grid run in the tiny
        # grid (test_snakemake.py), whose jobs cost a tenth of these, but there in one process
        # per job: nproc=2 (below) is held by these two strategies only
        strategies=["copy_mlp+distill", "copy_mlp+mimetic"],
        teachers={"deit_t": {"source": "timm", "size": "deit_t", "file": str(teacher)}},
        bench=None,
        figures={"attention_layers": [0, 11], "attention_images": 1})
    del config["loss_grid"]
    config["datasets"]["imagenet"]["root"] = str(data)
    tiny = {"data": {"batch_size": 4, "eval_batch_size": 8, "workers": 0, "train_subset": 8,
                     "test_subset": 8},
            "optim": {"epochs": 1, "warmup_epochs": 0}, "run": {"progress": False}}
    # fine-tuning keeps paper.yaml's DeiT recipe (RandAugment, Mixup/CutMix, random erasing,
    # layer decay) and adds an EMA, under two processes
    recipe = config["stages"]["finetune"]
    config["stages"] = {"distill": tiny, "finetune": {
        **tiny, "model": {"drop_path": 0.1}, "aug": recipe["aug"],
        "optim": {**tiny["optim"], "layer_decay": recipe["optim"]["layer_decay"],
                  "ema_decay": 0.9}}}
    config["robustness"] = {"corruptions": {"names": ["contrast"], "severities": [1],
                                            "samples": 4},
                            "shifts": shifts, "partial_shifts": True,   # 2 classes each
                            "data": {"eval_batch_size": 8, "workers": 0, "test_subset": 8}}
    return config


def test_the_paper_grid_runs_end_to_end_at_toy_scale(tmp_path):
    project = copy_project(tmp_path / "project")
    data = imagenet_folder(tmp_path / "imagenet")
    config = toy_paper_config(data, deit_tiny_file(tmp_path / "deit_t.safetensors"),
                              shift_folders(tmp_path / "shifts"))
    (project / "config" / "toy_paper.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    run = snakemake(project, "--cores", "2", "--configfile", "config/toy_paper.yaml",
                    "--set-resources", "distill:nproc=2", "finetune:nproc=2", timeout=1500)
    assert run.returncode == 0, run.stderr[-4000:]
    results = project / "results"
    frame = pd.read_csv(results / "results.csv")
    assert set(frame["status"]) == {"ok"}, frame[["kind", "init", "status", "error"]]
    cells = frame[frame["kind"] == "cell"]
    assert set(cells["init"]) == {"copy_mlp+distill", "copy_mlp+mimetic", "copy_all", "attn_copy"}
    # the training jobs ran under torch.distributed, two processes
    for run_dir in frame[frame["kind"].isin(["distill", "cell"])]["run_dir"]:
        env = json.loads((project / run_dir / "metrics.json").read_text())["env"]
        assert env["processes"] == 2, run_dir
    robust = pd.read_csv(results / "tables" / "robustness.csv")
    for title in ("ImageNet-A", "ImageNet-R", "ImageNet-Sketch", "ImageNet-V2"):
        column, = [c for c in robust.columns if c.startswith(f"{title} (partial: ")]
        assert not robust[column].isin(["failed", "missing"]).any(), robust
    for run_dir in cells["run_dir"]:             # the recipe's EMA, scored and saved
        metrics = json.loads((project / run_dir / "metrics.json").read_text())
        assert "ema_top1" in metrics and (project / run_dir / "model_ema.safetensors").is_file()
        used = yaml.safe_load((project / run_dir / "config.yaml").read_text())["config"]
        assert used["aug"]["mixup"] == 0.8 and used["optim"]["layer_decay"] == 0.75
    teacher = json.loads((results / "robustness" / "teachers" / "imagenet" / "deit_t" / "deit_t"
                          / "record.json").read_text())
    assert teacher["status"] == "ok" and set(teacher["metrics"]["shifts"]) == set(
        config["robustness"]["shifts"])
    assert "## Robustness" in (results / "report.md").read_text()
