"""Configs of `linvit distill`, `linvit init`, `linvit finetune`, `linvit attention-maps` and
`linvit select`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from linvit.attention import OPERATORS
from linvit.attention.base import MAP_KINDS
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
    positive,
    required_file,
)
from linvit.errors import ConfigError
from linvit.models import SIZES, ModelSpec
from linvit.train.recipe import AugCfg, check_aug
from linvit.transfer.groups import GROUPS
from linvit.transfer.losses import LOSSES
from linvit.transfer.strategies import STRATEGIES


def check_map_losses(operator: str, losses: dict[str, float], key: str = "distill.losses") -> None:
    """Map-level losses read each row of the student's map as a distribution over keys: refused,
    before any compute, for an operator whose map is signed, unnormalised or only effective."""
    kind = OPERATORS[operator].map_kind
    on_maps = [n for n, w in losses.items() if w and LOSSES[n].target == "attn_map"]
    if on_maps and kind != "stochastic":
        raise ConfigError(f"{key}: {', '.join(on_maps)} compare(s) attention-map rows as "
                          f"distributions, but operator {operator!r} has a {kind} map "
                          f"({MAP_KINDS[kind]}); use an output-level loss "
                          f"({', '.join(n for n, l in LOSSES.items() if l.target != 'attn_map')})")


def check_student(cfg) -> None:
    """With model.size given, the student must be buildable on this data. The checks that need
    the teacher's own spec (size, classes, depth) run in the stage, before its first write."""
    if cfg.model.size is not None:
        check_model(cfg.model, cfg.data)


@dataclass
class DistillCfg:
    """The distillation: its losses, layers, the groups that learn, an end-to-end phase."""
    # loss name -> weight (the registry's losses, `linvit list`), the per-layer ones
    # teacher-forced; trained on before the e2e phase
    losses: dict[str, float] = field(default_factory=lambda: {"attn_out_mse": 1.0})
    layers: list[int] | None = None   # None: every block
    train: list[str] = field(default_factory=lambda: ["attn"])   # groups that learn
    attn_init: Literal["random", "teacher"] = "random"   # student attention before distilling
    temperature: float = 1.0          # logit_kd only
    # RADLADS' second step: the schedule's last e2e_epochs train the same groups end to end
    e2e_epochs: int = 0
    # loss name -> weight for those last e2e_epochs (the same names as losses)
    e2e_losses: dict[str, float] = field(default_factory=lambda: {"logit_kd": 1.0})

    def validate(self, p: str) -> None:
        for key in ("losses", "e2e_losses"):
            weights = getattr(self, key)
            if not weights or not any(weights.values()):
                raise ConfigError(f"{p}.{key}: give at least one loss with a non-zero weight "
                                  f"(allowed: {', '.join(LOSSES)})")
            for name, w in weights.items():
                one_of(f"{p}.{key}", name, LOSSES)
                positive(f"{p}.{key}.{name}", w, allow_zero=True)
        positive(f"{p}.e2e_epochs", self.e2e_epochs, allow_zero=True)
        for g in self.train:
            one_of(f"{p}.train", g, GROUPS)
        if not self.train:
            raise ConfigError(f"{p}.train: name at least one group to train")
        positive(f"{p}.temperature", self.temperature)


def check_e2e_epochs(distill: DistillCfg, epochs: int) -> None:
    """The end-to-end phase is the schedule's last e2e_epochs: it cannot be longer."""
    if distill.e2e_epochs > epochs:
        raise ConfigError(f"distill.e2e_epochs: {distill.e2e_epochs} is more than the "
                          f"schedule's optim.epochs ({epochs}); the end-to-end phase is its last "
                          "epochs")


@dataclass
class InitCfg:
    """The student's init: which groups it takes from the teacher or a distilled student."""
    # a registry strategy (linvit.transfer.strategies; `linvit list`): the groups copied from the
    # teacher and taken from the distilled student, and its mechanisms; the rest starts new
    strategy: str = "copy_mlp+distill"
    copy: list[str] | None = None         # override the strategy's copied groups
    distilled: list[str] | None = None    # override the strategy's distilled groups

    def validate(self, p: str) -> None:
        one_of(f"{p}.strategy", self.strategy, STRATEGIES)
        for name in ("copy", "distilled"):
            for g in getattr(self, name) or []:
                one_of(f"{p}.{name}", g, GROUPS)

    def resolve(self):
        return STRATEGIES[self.strategy].with_groups(self.copy, self.distilled)


@dataclass
class KDCfg:
    """Logit KD from the softmax teacher while fine-tuning (off at weight 0)."""
    weight: float = 0.0               # share of the loss given to logit KD from the teacher
    temperature: float = 1.0          # softens both logits (the KL is scaled by T^2)

    def validate(self, p: str) -> None:
        if not 0 <= self.weight <= 1:
            raise ConfigError(f"{p}.weight: must be in [0, 1], got {self.weight}")
        positive(f"{p}.temperature", self.temperature)


@dataclass
class DistillConfig:
    teacher: str | None = None        # the softmax teacher's model.safetensors
    # the student: the teacher's shape with this operator (size: None or the teacher's)
    model: ModelCfg = field(default_factory=lambda: ModelCfg(size=None, operator="linear"))
    data: DataCfg = field(default_factory=DataCfg)
    optim: OptimCfg = field(default_factory=lambda: OptimCfg(epochs=1, warmup_epochs=0,
                                                             weight_decay=0.0))
    distill: DistillCfg = field(default_factory=DistillCfg)
    aug: AugCfg = field(default_factory=AugCfg)       # DeiT's recipe (linvit.train.recipe)
    run: RunCfg = field(default_factory=RunCfg)

    def validate(self, p: str) -> None:
        required_file("teacher", self.teacher, "a softmax teacher's model.safetensors")
        check_aug(self.aug, self.data)
        check_student(self)
        check_map_losses(self.model.operator, self.distill.losses)
        if self.distill.e2e_epochs:
            check_map_losses(self.model.operator, self.distill.e2e_losses, "distill.e2e_losses")
        check_e2e_epochs(self.distill, self.optim.epochs)
        if self.model.size is not None:
            depth = SIZES[self.model.size].depth
            bad = [l for l in self.distill.layers or [] if not 0 <= l < depth]
            if bad:
                raise ConfigError(f"distill.layers: {bad} outside 0..{depth - 1} "
                                  f"({self.model.size} has {depth} blocks)")


@dataclass
class FinetuneConfig:
    # the softmax teacher's model.safetensors: the student's shape, its copied groups, KD's logits
    teacher: str | None = None
    # a `linvit distill` run's model.safetensors: the distilled groups (strategies that take them)
    distilled: str | None = None
    init: InitCfg = field(default_factory=InitCfg)
    # the student: the teacher's shape with this operator (size: None or the teacher's)
    model: ModelCfg = field(default_factory=lambda: ModelCfg(size=None, operator="linear"))
    data: DataCfg = field(default_factory=DataCfg)
    optim: OptimCfg = field(default_factory=OptimCfg)
    kd: KDCfg = field(default_factory=KDCfg)
    aug: AugCfg = field(default_factory=AugCfg)       # DeiT's recipe (linvit.train.recipe)
    run: RunCfg = field(default_factory=RunCfg)

    def validate(self, p: str) -> None:
        required_file("teacher", self.teacher, "the softmax teacher's model.safetensors; "
                      "strategy 'random' uses it for the model shape")
        check_aug(self.aug, self.data)
        existing_file("distilled", self.distilled)
        check_student(self)
        for mechanism in self.init.resolve().mechanisms:
            if problem := mechanism.check(self):
                raise ConfigError(problem)
        if self.init.resolve().needs_distilled and self.distilled is None:
            raise ConfigError(f"distilled: strategy {self.init.strategy!r} needs a distilled "
                              "student (the output of `linvit distill`)")


@dataclass
class MapsConfig:
    """`linvit attention-maps`: head-mean attention maps of `model` on the teacher's tokens."""
    teacher: str | None = None        # the (softmax) teacher: its attention inputs are the tokens
    model: str | None = None          # whose maps are taken; None: the teacher's own
    data: DataCfg = field(default_factory=DataCfg)   # the images: the first of its test split
    layers: list[int] = field(default_factory=lambda: [0, -1])   # negative: from the end
    images: int = 2                   # the first test images
    run: RunCfg = field(default_factory=RunCfg)

    def validate(self, p: str) -> None:
        required_file("teacher", self.teacher, "a softmax teacher's model.safetensors")
        existing_file("model", self.model)
        if not self.layers:
            raise ConfigError("layers: name at least one block (negative counts from the end)")
        positive("images", self.images)


@dataclass
class SelectConfig:
    """`linvit select`: a smaller softmax teacher cut out of a larger one (weight selection)."""
    teacher: str | None = None        # the larger softmax teacher's model.safetensors
    size: str = "cpu96"               # the smaller model's size
    data: DataCfg = field(default_factory=DataCfg)   # the selected model's test accuracy
    run: RunCfg = field(default_factory=RunCfg)

    def validate(self, p: str) -> None:
        required_file("teacher", self.teacher, "a softmax teacher's model.safetensors")
        one_of("size", self.size, SIZES)
        check_spec("size", ModelSpec(self.size, "softmax", 1, image_size("data", self.data), 1))
