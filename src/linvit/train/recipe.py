"""DeiT's training recipe from timm's own parts, as the `aug` section of the training stages
(pretrain, probe, distill, finetune); every field is off unless set, so the embedded default keeps
its short CPU recipe.

- `auto_augment`: a timm policy string (DeiT: "rand-m9-mstd0.5-inc1"), applied by timm's
  `create_transform` to folder datasets (PIL images); tensor datasets refuse it.
- `reprob`, `remode`, `recount`: timm's RandomErasing on the normalised batch (DeiT: 0.25, pixel).
- `repeats`: repeated augmentation (DeiT: 3): each image several times in an epoch of the same
  length, differently augmented; timm's RepeatAugSampler for folder datasets, the same draw on
  the global batch for tensor datasets.
- `mixup`, `cutmix`, `mix_prob`, `switch_prob`: timm's Mixup on the batch, which also applies the
  stage's label smoothing to the mixed targets (DeiT: 0.8, 1.0, 1.0, 0.5); the objectives then
  take soft targets (cross-entropy against a distribution, smoothed once).
Layer-wise learning-rate decay is `optim.layer_decay` (timm's parameter groups).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from linvit.errors import ConfigError

POLICIES = ("rand", "augmix", "original", "originalr", "v0", "v0r", "3a")
ERASE_MODES = ("const", "rand", "pixel")


@dataclass
class AugCfg:
    """DeiT's augmentation recipe from timm's parts; every part off unless set."""
    auto_augment: str | None = None   # timm policy string; folder datasets only
    mixup: float = 0.0                # Mixup alpha; 0: off
    cutmix: float = 0.0               # CutMix alpha; 0: off
    mix_prob: float = 1.0             # probability that a batch is mixed
    switch_prob: float = 0.5          # of CutMix rather than Mixup, when both are on
    reprob: float = 0.0               # random erasing probability; 0: off
    # what random erasing fills a box with: const (zeros), rand (one random colour per box) or
    # pixel (random normal values per pixel)
    remode: str = "pixel"
    recount: int = 1                  # at most this many erased boxes per image (drawn 1..recount)
    repeats: int = 1                  # repeated augmentation (DeiT: 3); 1: off

    def validate(self, p: str) -> None:
        if self.auto_augment is not None and self.auto_augment.split("-")[0] not in POLICIES:
            raise ConfigError(f"{p}.auto_augment: {self.auto_augment!r} is not a timm policy "
                              f"string (it starts with one of {', '.join(POLICIES)}, e.g. "
                              "rand-m9-mstd0.5-inc1)")
        for name in ("mixup", "cutmix"):
            if not 0 <= getattr(self, name) < 100:
                raise ConfigError(f"{p}.{name}: an alpha in [0, 100), got {getattr(self, name)}")
        for name in ("mix_prob", "switch_prob", "reprob"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"{p}.{name}: a probability in [0, 1], got "
                                  f"{getattr(self, name)}")
        if self.remode not in ERASE_MODES:
            raise ConfigError(f"{p}.remode: one of {', '.join(ERASE_MODES)}, got {self.remode!r}")
        for name in ("recount", "repeats"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{p}.{name}: an integer >= 1, got {value!r}")

    @property
    def mixes(self) -> bool:
        return self.mixup > 0 or self.cutmix > 0


def check_aug(aug: AugCfg, data) -> None:
    """What a stage's data must allow: PIL policies need a folder dataset, mixing an even batch
    (timm's Mixup pairs each image with its mirror in the batch)."""
    from linvit.data import get_dataset

    if aug.auto_augment and hasattr(get_dataset(data.dataset), "arrays"):
        raise ConfigError(f"aug.auto_augment: timm's policies work on PIL images, which folder "
                          f"datasets read; {data.dataset} is held as tensors")
    if aug.mixes and data.batch_size % 2:
        raise ConfigError(f"aug: Mixup/CutMix pair the images of a batch; data.batch_size "
                          f"{data.batch_size} is odd")


def batch_augment(aug: AugCfg, label_smoothing: float, num_classes: int,
                  device) -> Callable | None:
    """(images, labels) -> (images, targets) for the training loop: random erasing, then
    Mixup/CutMix (soft targets); None when neither is on."""
    if not (aug.mixes or aug.reprob):
        return None
    from timm.data import Mixup
    from timm.data.random_erasing import RandomErasing

    erase = (RandomErasing(aug.reprob, mode=aug.remode, max_count=aug.recount,
                           device=str(device)) if aug.reprob else None)
    mix = (Mixup(mixup_alpha=aug.mixup, cutmix_alpha=aug.cutmix, prob=aug.mix_prob,
                 switch_prob=aug.switch_prob, mode="batch", label_smoothing=label_smoothing,
                 num_classes=num_classes) if aug.mixes else None)

    def apply(images, labels):
        if erase is not None:            # per image in timm's loader, before any mixing
            images = erase(images)
        if mix is not None:
            images, labels = mix(images, labels)
        return images, labels

    return apply


def training_loaders(cfg, rt):
    """A training stage's (info, train loader, test loader, batch augmentation): its `aug`
    section's policy in the training transform and its batch-level parts for the loop."""
    from linvit.runs.evaluation import make_loaders

    info, train, test = make_loaders(cfg.data, rt, cfg.aug.auto_augment, cfg.aug.repeats)
    return info, train, test, batch_augment(cfg.aug, cfg.optim.label_smoothing,
                                            info.num_classes, rt.device)


def make_ema(model, optim_cfg):
    """timm's ModelEmaV3 of `model` when optim.ema_decay asks for one (kept on the model's
    device, updated after every optimizer step), else None."""
    if optim_cfg.ema_decay is None:
        return None
    from timm.utils import ModelEmaV3

    return ModelEmaV3(model, decay=optim_cfg.ema_decay)
