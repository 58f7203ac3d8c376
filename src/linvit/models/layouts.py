"""Key layouts of ViT checkpoints that are not timm's, converted to timm's names before the strict
load (timm's own checkpoint_filter_fn then handles DeiT/JAX names and position-embedding grids).

    timm    timm/DeiT/MAE/DINO files: taken as they are
    mocov3  facebookresearch/moco-v3 (`vit_*` checkpoints): state_dict with `module.base_encoder.`
            (kept), `module.momentum_encoder.` and `module.predictor.` (dropped); the base
            encoder's `head.*` is the contrastive projection MLP, not a classifier: dropped
    ibot    bytedance/ibot: a training checkpoint's `teacher` (the EMA network iBOT evaluates) or
            a `state_dict`, with `backbone.` (kept, also under `module.`); `head.*` (the iBOT
            projection head) and `masked_embed` (the masked-image-modelling token) dropped

Each returns the converted state and the keys it dropped, which the import report lists. A
self-supervised backbone has no classifier: it imports headless (see linvit.train.stages).
Adding a layout: one function and one line in LAYOUTS.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from linvit.registry import Registry

State = dict[str, torch.Tensor]


def _keep_prefix(state: State, prefix: str, drop: Callable[[str], bool]) -> tuple[State, list]:
    """Keys under `prefix` with it removed (all keys when none has it), minus those `drop`
    names; returns (kept, dropped)."""
    scoped = any(k.startswith(prefix) for k in state)
    kept, dropped = {}, []
    for key, value in state.items():
        name = key.removeprefix(prefix) if scoped else key
        if (scoped and not key.startswith(prefix)) or drop(name):
            dropped.append(key)
        else:
            kept[name] = value
    return kept, sorted(dropped)


def _timm(state: State) -> tuple[State, list]:
    return state, []


def _mocov3(state: State) -> tuple[State, list]:
    return _keep_prefix(state, "base_encoder.", lambda name: name.startswith("head."))


def _ibot(state: State) -> tuple[State, list]:
    return _keep_prefix(state, "backbone.",
                        lambda name: name.startswith("head.") or name == "masked_embed")


@dataclass(frozen=True)
class Layout:
    convert: Callable[[State], tuple[State, list]]
    wrappers: tuple[str, ...] = ()     # top-level keys to look in first (before the usual ones)


LAYOUTS = Registry("checkpoint layout", {
    "timm": Layout(_timm),
    "mocov3": Layout(_mocov3),
    "ibot": Layout(_ibot, wrappers=("teacher",)),
})
