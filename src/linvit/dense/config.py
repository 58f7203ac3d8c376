"""Configs of `linvit make-scenes`, `linvit segment` and `linvit detect`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from linvit.config import RunCfg, one_of, positive, required_file
from linvit.data import DATASETS
from linvit.dense.scenes import SceneSpec
from linvit.errors import ConfigError


@dataclass(frozen=True)
class ScenesConfig(SceneSpec):
    """`linvit make-scenes`: the scene settings (their fields, defaults and checks are
    linvit.dense.scenes.SceneSpec's) and where the sprites come from."""
    sprites_root: str | None = None     # Fashion-MNIST files (None: Debian's package)


@dataclass
class DenseDataCfg:
    """The dense data: embedded scenes or a real ADE20K / COCO folder, and its loading."""
    # scenes (`linvit make-scenes`, either task), ade20k (segment only) or coco (detect only)
    kind: Literal["scenes", "ade20k", "coco"] = "scenes"
    root: str | None = None           # scenes folder (make-scenes), or ADE20K / COCO root
    img_size: int = 64                # images are resized to img_size x img_size
    batch_size: int = 4               # training images per iteration (validation takes 1)
    workers: int = 0                  # data-loading worker processes (0: in the main process)

    def validate(self, p: str) -> None:
        # that the folder exists is checked where the job runs (linvit.dense.stages), as for
        # image datasets: a cluster's data need not be mounted where the workflow is planned
        if self.root is None:
            raise ConfigError(f"{p}.root: required (a folder from `linvit make-scenes`, or an "
                              "ADE20K / COCO root)")
        for name in ("img_size", "batch_size"):
            positive(f"{p}.{name}", getattr(self, name))
        positive(f"{p}.workers", self.workers, allow_zero=True)
        if self.img_size % 32:
            raise ConfigError(f"{p}.img_size: {self.img_size} is not a multiple of 32 (the "
                              "coarsest feature stride)")


@dataclass
class AdapterCfg:
    """ViT-Adapter's settings (linvit.dense.adapter_spec.AdapterSpec)."""
    interactions: list[list[int]] | None = None   # [first, last] blocks; None: 4 even shares
    heads: int | None = None          # deformable-attention heads; None: max(6, the ViT's)
    points: int = 4                   # sampling points per head and level
    deform_ratio: float = 1.0         # value projection width / ViT width
    cffn_ratio: float = 0.25          # ConvFFN hidden width / ViT width
    channels: int = 64                # the spatial prior's first-stage width
    extra_extractors: int = 2         # after the last interaction

    def validate(self, p: str) -> None:
        for name in ("points", "channels", "deform_ratio", "cffn_ratio"):
            positive(f"{p}.{name}", getattr(self, name))
        if self.heads is not None:
            positive(f"{p}.heads", self.heads)
        if self.channels % 8:
            raise ConfigError(f"{p}.channels: {self.channels} is not a multiple of 8 (the "
                              "spatial prior's GroupNorm groups)")
        positive(f"{p}.extra_extractors", self.extra_extractors, allow_zero=True)
        for i, pair in enumerate(self.interactions or []):
            if len(pair) != 2:
                raise ConfigError(f"{p}.interactions[{i}]: expected [first, last] blocks, got "
                                  f"{pair!r}")


@dataclass
class DenseModelCfg:
    """The dense model around the ViT: its neck, the heads' width, whether the ViT trains."""
    head_channels: int = 64           # width of the UPerHead / FPN / RoI heads
    # the multi-scale maps from the ViT: ViTDet's simple feature pyramid, or ViT-Adapter
    neck: Literal["simple", "adapter"] = "simple"
    adapter: AdapterCfg = field(default_factory=AdapterCfg)   # read with neck: adapter only
    # the checkpoint's ViT fixed (weights, and eval mode: no drop path) while neck and heads
    # train: a cheaper schedule; with the simple neck, a score of the features themselves (the
    # adapter's injections still change what the fixed blocks see)
    frozen_vit: bool = False

    def validate(self, p: str) -> None:
        positive(f"{p}.head_channels", self.head_channels)


@dataclass
class DenseOptimCfg:
    """mmengine's AdamW schedule: linear warm-up over the first tenth of iters, then cosine."""
    lr: float = 2.0e-4                # the peak; warm-up starts at lr / 10, cosine ends at lr / 100
    weight_decay: float = 0.05        # none on norms, biases, embeddings and the adapter's gates
    iters: int = 300                  # training iterations (batches); validation once at the end
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
        required_file("checkpoint", self.checkpoint, "a linvit model.safetensors")
        one_of("pretrain_dataset", self.pretrain_dataset, DATASETS)
