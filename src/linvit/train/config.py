"""Configs of `linvit pretrain`, `linvit evaluate` and `linvit import-teacher`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from linvit.config import (
    DataCfg,
    ModelCfg,
    OptimCfg,
    RunCfg,
    check_model,
    check_spec,
    existing_file,
    image_size,
    one_of,
    required_file,
)
from linvit.errors import ConfigError
from linvit.models import SIZES, ModelSpec
from linvit.train.recipe import AugCfg, check_aug


@dataclass
class PretrainConfig:
    model: ModelCfg = field(default_factory=ModelCfg)
    data: DataCfg = field(default_factory=DataCfg)
    optim: OptimCfg = field(default_factory=OptimCfg)
    aug: AugCfg = field(default_factory=AugCfg)       # DeiT's recipe (linvit.train.recipe)
    run: RunCfg = field(default_factory=RunCfg)

    def validate(self, p: str) -> None:
        if self.model.size is None:
            raise ConfigError("model.size: required for pretraining")
        check_model(self.model, self.data)
        check_aug(self.aug, self.data)


@dataclass
class EvaluateConfig:
    checkpoint: str | None = None     # the linvit model.safetensors to score
    data: DataCfg = field(default_factory=DataCfg)    # scored on its test split (or val)
    run: RunCfg = field(default_factory=RunCfg)

    def validate(self, p: str) -> None:
        required_file("checkpoint", self.checkpoint)


def import_size(name: str) -> dict | None:
    """The architecture of a softmax teacher of size `name`: None for a registry size, else that
    of the timm model `name`, read from timm (ConfigError naming why it cannot be)."""
    if isinstance(name, str) and name in SIZES:
        return None
    from dataclasses import asdict

    from linvit.models.architecture import read_architecture

    if not isinstance(name, str):
        raise ConfigError(f"size: {name!r} is not a size name")
    try:
        return asdict(read_architecture(name))
    except ConfigError as e:
        raise ConfigError(f"size: {e}") from None


@dataclass
class ImportConfig:
    # a linvit size (`linvit list`), or any timm ViT name (vit_small_patch14_dinov2,
    # vit_base_patch16_224.mae): its architecture read from timm (linvit.models.architecture)
    size: str = "deit_t"
    file: str | None = None           # None: timm's pretrained loader (cache or network)
    layout: str = "timm"              # the file's key layout (linvit.models.layouts)
    timm_name: str | None = None      # timm's loader only: a model tag (default: the size's)
    reset_head: bool = False          # a new head where the checkpoint's does not fit or is none
    headless: bool = False            # no classifier at all (a self-supervised backbone)
    # the dataset the teacher is for: its classes size the head (unless headless), its image
    # size the model's input (no image is read)
    data: DataCfg = field(default_factory=lambda: DataCfg(dataset="imagefolder"))
    run: RunCfg = field(default_factory=RunCfg)      # the workflow sets run.threads on every job

    def validate(self, p: str) -> None:
        from linvit.models.layouts import LAYOUTS

        one_of("layout", self.layout, LAYOUTS)
        existing_file("file", self.file)
        if self.file is not None and self.timm_name is not None:
            raise ConfigError("timm_name: names timm's pretrained weights; give it or file, "
                              "not both")
        if self.headless and self.reset_head:
            raise ConfigError("headless: a headless import has no head to reset")
        check_spec("size", ModelSpec(self.size, "softmax", 1, image_size("data", self.data), 1,
                                     architecture=import_size(self.size)))


@dataclass
class ProbeConfig:
    """`linvit probe`: a head for an imported teacher that has none (or a new one)."""
    teacher: str | None = None        # an imported teacher's model.safetensors
    mode: Literal["linear", "finetune"] = "linear"    # train the head alone, or every tensor
    data: DataCfg = field(default_factory=DataCfg)
    optim: OptimCfg = field(default_factory=OptimCfg)
    aug: AugCfg = field(default_factory=AugCfg)
    run: RunCfg = field(default_factory=RunCfg)

    def validate(self, p: str) -> None:
        required_file("teacher", self.teacher, "an imported teacher's model.safetensors")
        check_aug(self.aug, self.data)
