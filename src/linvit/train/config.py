"""Configs of `linvit pretrain`, `linvit evaluate` and `linvit import-teacher`."""
from __future__ import annotations

from dataclasses import dataclass, field

from linvit.config import (
    ConfigError,
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
from linvit.models import SIZES, ModelSpec


@dataclass
class PretrainConfig:
    model: ModelCfg = field(default_factory=ModelCfg)
    data: DataCfg = field(default_factory=DataCfg)
    optim: OptimCfg = field(default_factory=OptimCfg)
    run: RunCfg = field(default_factory=RunCfg)

    def validate(self, p: str) -> None:
        if self.model.size is None:
            raise ConfigError("model.size: required for pretraining")
        check_model(self.model, self.data)


@dataclass
class EvaluateConfig:
    checkpoint: str | None = None
    data: DataCfg = field(default_factory=DataCfg)
    run: RunCfg = field(default_factory=RunCfg)

    def validate(self, p: str) -> None:
        required_file("checkpoint", self.checkpoint)


@dataclass
class ImportConfig:
    size: str = "deit_t"
    file: str | None = None           # None: timm's pretrained loader (cache or network)
    reset_head: bool = False          # new head when the class count differs
    data: DataCfg = field(default_factory=lambda: DataCfg(dataset="imagefolder"))

    def validate(self, p: str) -> None:
        one_of("size", self.size, SIZES)
        existing_file("file", self.file)
        check_spec("size", ModelSpec(self.size, "softmax", 1, image_size("data", self.data), 1))
