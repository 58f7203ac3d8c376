"""A linvit ViT (any operator) as an mmseg/mmdet backbone, with a simple feature pyramid or
ViT-Adapter (linvit.dense.adapter).

The ViT comes from a linvit checkpoint (teacher or transferred student): its position
embedding is resampled to the dense image size and its patch embedding adapted to the input
channels (timm's helpers), the classifier is dropped, and every other tensor must load (strict,
named errors). As in ViTDet, the last block's patch tokens are turned into four maps at strides
4, 8, 16 and 32 pixels by transposed convolutions and pooling, so UperNet and Mask R-CNN (FPN)
heads fit unchanged. ViT-Adapter builds the same four maps from a convolutional prior and the
ViT together.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from linvit.dense.adapter_spec import adapter_spec
from linvit.models import create_vit, load_strict, read_spec, read_state_dict

STRIDES = (4, 8, 16, 32)


def _level(channels: int, scale: float) -> nn.Module:
    """Resample a (B, C, h, w) map by `scale` (a power of two)."""
    if scale == 1:
        return nn.Identity()
    if scale < 1:
        return nn.MaxPool2d(kernel_size=int(round(1 / scale)))
    layers = []
    for i in range(int(math.log2(scale))):
        if i:
            layers += [nn.GroupNorm(1, channels), nn.GELU()]
        layers.append(nn.ConvTranspose2d(channels, channels, 2, stride=2))
    return nn.Sequential(*layers)


def adapted_state(checkpoint: str, model: nn.Module) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors reshaped for a ViT of another image size / channel count."""
    from timm.layers import resample_abs_pos_embed
    from timm.models import adapt_input_conv

    state = {k: v for k, v in read_state_dict(checkpoint).items() if not k.startswith("head.")}
    own = model.state_dict()
    if state["pos_embed"].shape != own["pos_embed"].shape:
        prefix = model.num_prefix_tokens
        state["pos_embed"] = resample_abs_pos_embed(
            state["pos_embed"], new_size=model.patch_embed.grid_size, num_prefix_tokens=prefix)
    weight = "patch_embed.proj.weight"
    have, want = state[weight].shape[1], own[weight].shape[1]
    if have == 1 and want > 1:
        # a grey image copied into every channel gives the checkpoint's own activations
        state[weight] = state[weight].repeat(1, want, 1, 1) / want
    elif have != want:
        state[weight] = adapt_input_conv(want, state[weight])
    return state


class LinViTBackbone(nn.Module):
    """mmseg/mmdet backbone: the ViT of `checkpoint` (a linvit model.safetensors); returns four
    feature maps at STRIDES, by a simple feature pyramid (neck="simple") or ViT-Adapter
    (neck="adapter", `adapter`: AdapterCfg's fields)."""

    def __init__(self, checkpoint: str, img_size: int = 64, in_chans: int = 3,
                 neck: str = "simple", adapter: dict | None = None, frozen_vit: bool = False):
        super().__init__()
        base = read_spec(checkpoint)
        self.spec = base.derive(img_size=img_size, in_chans=in_chans, num_classes=0)
        self.vit = create_vit(self.spec)
        load_strict(self.vit, adapted_state(checkpoint, self.vit), checkpoint)
        self.vit.requires_grad_(not frozen_vit)
        self.frozen_vit = frozen_vit
        self.patch = self.vit.patch_embed.patch_size[0]
        width = self.vit.embed_dim
        self.out_channels = [width] * len(STRIDES)
        if neck == "adapter":
            from linvit.dense.adapter import ViTAdapter

            spec = adapter_spec(adapter or {}, len(self.vit.blocks),
                                self.vit.blocks[0].attn.num_heads)
            self.adapter = ViTAdapter(width, len(self.vit.blocks), spec, in_chans)
        elif neck == "simple":
            self.levels = nn.ModuleList(_level(width, self.patch / s) for s in STRIDES)
        else:
            raise ValueError(f"neck: {neck!r} is not simple or adapter")
        self.neck = neck

    def train(self, mode: bool = True):
        """A frozen ViT stays in eval mode: no stochastic depth or dropout in its blocks."""
        super().train(mode)
        if self.frozen_vit:
            self.vit.eval()
        return self

    def init_weights(self) -> None:
        """The ViT's weights come from the checkpoint and the neck's from its own init (the
        adapter's is deliberate); nothing to do for mmengine."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        maps = self.adapter(self.vit, x) if self.neck == "adapter" else self._simple(x)
        # Contiguous NCHW, whatever the layout the tokens left: a token grid is a channels-last
        # view, convolutions keep that layout down to the heads, and mmcv's RoIAlign reads its
        # input as contiguous NCHW without checking (open-mmlab/mmcv#2203), so Mask R-CNN's RoI
        # heads would see scrambled features and never learn.
        return tuple(m.contiguous() for m in maps)

    def _simple(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        tokens = self.vit.forward_features(x)[:, self.vit.num_prefix_tokens:]   # (B, h*w, C)
        B, N, C = tokens.shape
        h, w = x.shape[2] // self.patch, x.shape[3] // self.patch
        grid = tokens.transpose(1, 2).reshape(B, C, h, w)
        return tuple(level(grid) for level in self.levels)


def register() -> None:
    """Make the backbone known to mmseg's and mmdet's registries (idempotent)."""
    from mmdet.registry import MODELS as DET_MODELS
    from mmseg.registry import MODELS as SEG_MODELS

    for registry in (SEG_MODELS, DET_MODELS):
        registry.register_module(name="LinViTBackbone", module=LinViTBackbone, force=True)
