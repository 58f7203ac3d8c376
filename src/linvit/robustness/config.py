"""Configs of `linvit corrupt` (a corrupted copy of a test split) and `linvit robustness` (a model
scored on the clean split, its corrupted copy and ImageNet shift sets)."""
from __future__ import annotations

from dataclasses import dataclass, field

from linvit.config import (
    MAX_SEED,
    DataCfg,
    RunCfg,
    existing_file,
    in_range,
    one_of,
    positive,
    required_file,
)
from linvit.errors import ConfigError
from linvit.robustness.corruptions import COMMON, LIBRARY_CORRUPTIONS, SEVERITIES
from linvit.robustness.shifts import SHIFTS


@dataclass
class CorruptionsCfg:
    """The corrupted copies: which corruptions, at which severities, of how many test images."""
    # imagecorruptions' names (`linvit list`; default: ImageNet-C's 15, not its 4 extra ones)
    names: list[str] = field(default_factory=lambda: list(COMMON))
    severities: list[int] = field(default_factory=lambda: list(SEVERITIES))   # each of 1..5
    samples: int | None = 1000        # a fixed random subset of the test split; None: all of it
    seed: int = 0                     # of the corruptions' random draws

    def validate(self, p: str) -> None:
        for key, values, allowed in (("names", self.names, LIBRARY_CORRUPTIONS),
                                     ("severities", self.severities, SEVERITIES)):
            if not values:
                raise ConfigError(f"{p}.{key}: empty")
            if len(set(values)) != len(values):
                raise ConfigError(f"{p}.{key}: {values} names an entry twice")
            for i, v in enumerate(values):
                one_of(f"{p}.{key}[{i}]", v, allowed)
        positive(f"{p}.samples", self.samples)
        in_range(f"{p}.seed", self.seed, 0, MAX_SEED)


@dataclass
class CorruptConfig:
    data: DataCfg = field(default_factory=DataCfg)    # the dataset whose test split is corrupted
    corruptions: CorruptionsCfg = field(default_factory=CorruptionsCfg)
    run: RunCfg = field(default_factory=RunCfg)       # threads; the draws use corruptions.seed


@dataclass
class RobustnessConfig:
    checkpoint: str | None = None     # the linvit model.safetensors to score
    data: DataCfg = field(default_factory=DataCfg)    # the clean test split
    corrupted: str | None = None      # a `linvit corrupt` run's corrupted.safetensors, or none
    shifts: dict[str, str] = field(default_factory=dict)   # shift set -> its folder
    partial_shifts: bool = False      # score a set that lacks classes (reported as partial)
    run: RunCfg = field(default_factory=RunCfg)

    def validate(self, p: str) -> None:
        required_file("checkpoint", self.checkpoint)
        existing_file("corrupted", self.corrupted)
        # names only: the folders are read (and refused) before compute, like data.root, as a
        # workflow checks every job's config on a host where the data may not be
        for name in self.shifts:
            one_of(f"shifts.{name}", name, SHIFTS)
