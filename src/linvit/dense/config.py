"""Configs of `linvit make-scenes`, `linvit segment` and `linvit detect`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pathlib import Path

from linvit.config import ConfigError, RunCfg, existing_file, in_range, one_of, positive
from linvit.data import DATASETS


@dataclass
class ScenesConfig:
    """`linvit make-scenes`: the embedded dense data (see linvit.dense.scenes)."""
    size: int = 64
    train: int = 800
    val: int = 200
    max_objects: int = 4
    min_scale: float = 0.35
    max_scale: float = 0.75
    seed: int = 0
    sprites_root: str | None = None     # Fashion-MNIST files (None: Debian's package)

    def validate(self, p: str) -> None:
        # sprites are at least 8 px and placed at most a quarter outside the scene
        in_range("size", self.size, 16, 4096)
        in_range("train", self.train, 1, 10**7)
        in_range("val", self.val, 1, 10**7)
        in_range("max_objects", self.max_objects, 1, 64)
        in_range("seed", self.seed, 0, 2**63 - 2)          # the val split uses seed + 1
        if not 0 < self.min_scale <= self.max_scale <= 1:
            raise ConfigError("min_scale/max_scale: need 0 < min_scale <= max_scale <= 1")


@dataclass
class DenseDataCfg:
    kind: Literal["scenes", "ade20k", "coco"] = "scenes"
    root: str | None = None           # scenes folder (make-scenes), or ADE20K / COCO root
    img_size: int = 64                # images are resized to img_size x img_size
    batch_size: int = 4
    workers: int = 0

    def validate(self, p: str) -> None:
        if self.root is None:
            raise ConfigError(f"{p}.root: required (a folder from `linvit make-scenes`, or an "
                              "ADE20K / COCO root)")
        if not Path(self.root).is_dir():
            raise ConfigError(f"{p}.root: folder not found: {self.root}")
        for name in ("img_size", "batch_size"):
            positive(f"{p}.{name}", getattr(self, name))
        positive(f"{p}.workers", self.workers, allow_zero=True)
        if self.img_size % 32:
            raise ConfigError(f"{p}.img_size: {self.img_size} is not a multiple of 32 (the "
                              "coarsest feature stride)")


@dataclass
class DenseModelCfg:
    head_channels: int = 64           # width of the UPerHead / FPN / RoI heads

    def validate(self, p: str) -> None:
        positive(f"{p}.head_channels", self.head_channels)


@dataclass
class DenseOptimCfg:
    lr: float = 2.0e-4
    weight_decay: float = 0.05
    iters: int = 300
    checkpoint_every: int = 100       # iterations between mmengine checkpoints (resume points)

    def validate(self, p: str) -> None:
        for name in ("lr", "iters", "checkpoint_every"):
            positive(f"{p}.{name}", getattr(self, name))
        positive(f"{p}.weight_decay", self.weight_decay, allow_zero=True)


@dataclass
class DenseConfig:
    """`linvit segment` (UperNet) and `linvit detect` (Mask R-CNN) on a linvit backbone."""
    checkpoint: str | None = None     # any linvit model.safetensors: teacher or student
    pretrain_dataset: str = "fashion_mnist"   # whose normalisation the backbone learned with
    data: DenseDataCfg = field(default_factory=DenseDataCfg)
    model: DenseModelCfg = field(default_factory=DenseModelCfg)
    optim: DenseOptimCfg = field(default_factory=DenseOptimCfg)
    run: RunCfg = field(default_factory=lambda: RunCfg(eval_every=0))

    def validate(self, p: str) -> None:
        if self.checkpoint is None:
            raise ConfigError("checkpoint: required (a linvit model.safetensors)")
        existing_file("checkpoint", self.checkpoint)
        one_of("pretrain_dataset", self.pretrain_dataset, DATASETS)
