"""ViT-Adapter (arXiv 2205.08534) around a linvit ViT of any operator: a convolutional spatial
prior, injectors that add it to the ViT's tokens and extractors that read the ViT back into a
feature pyramid, both by multi-scale deformable attention (mmcv.ops: its CUDA kernel on GPU, its
PyTorch fallback on the CPU).

    image -> spatial prior (strides 4, 8, 16, 32) ----------------------------+
    image -> patch embed -> [injector -> ViT blocks a..b -> extractor] x n ---+-> 4 maps

Deliberate differences from the reference code (czczup/ViT-Adapter):
- The ViT keeps its class token (and any other prefix tokens) through its blocks, so every
  operator mixes the same token set as in classification, where its attention was copied and
  distilled; the injectors and extractors see only the patch tokens.
- The patch stride is the checkpoint's (16 for DeiT, 4 for the CPU sizes), not fixed at 16: the
  prior's strides 8, 16 and 32 are injected wherever the ViT grid lies, and the ViT's map is
  resampled to every output stride.
- GroupNorm instead of (Sync)BatchNorm in the prior and on the outputs: CPU batches are 2-4
  images.
- The ViT's map is resampled to each output stride with antialiasing (a patch-4 map shrinks 8x
  to stride 32); no drop path in the ConvFFN, the ViT feature is always added, and no layer-wise
  learning-rate decay (weight decay skips gamma, level embeddings, norms and biases, as there).
Initialised on purpose: every injector's gamma is zero, so before training the ViT computes
exactly what the checkpoint computes and the adapter only reads it. The rest follows the
reference: level embeddings ~ N(0, 1), linear layers truncated-normal (std 0.02), convolutions
normal with fan-out variance, mmcv's own init for the deformable attention.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from linvit.dense.adapter_spec import AdapterSpec, check_interactions

PRIOR_STRIDES = (8, 16, 32)        # injected into the ViT and extracted from it


def init_like_reference(module: nn.Module) -> None:
    """The reference's init for the adapter's own layers (not mmcv's deformable attention, which
    initialises its sampling offsets on purpose)."""
    from mmcv.ops import MultiScaleDeformableAttention

    own = {id(inner) for m in module.modules() if isinstance(m, MultiScaleDeformableAttention)
           for inner in m.modules()}
    for m in module.modules():
        if id(m) in own:
            continue
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
            fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
            nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_out))
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def _conv(cin: int, cout: int, stride: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.GroupNorm(8, cout),
            nn.ReLU(inplace=True)]


class SpatialPrior(nn.Module):
    """A ResNet-style stem: maps at strides 4, 8, 16 and 32, each projected to `width`."""

    def __init__(self, width: int, channels: int, in_chans: int):
        super().__init__()
        c = channels
        self.stages = nn.ModuleList([
            nn.Sequential(*_conv(in_chans, c, 2), *_conv(c, c, 1), *_conv(c, c, 1),
                          nn.MaxPool2d(3, 2, 1)),
            nn.Sequential(*_conv(c, 2 * c, 2)),
            nn.Sequential(*_conv(2 * c, 4 * c, 2)),
            nn.Sequential(*_conv(4 * c, 4 * c, 2))])
        self.projections = nn.ModuleList(nn.Conv2d(cin, width, 1)
                                         for cin in (c, 2 * c, 4 * c, 4 * c))

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        maps = []
        for stage, projection in zip(self.stages, self.projections):
            x = stage(x)
            maps.append(projection(x))
        return maps


def _deformable(width: int, spec: AdapterSpec, levels: int) -> nn.Module:
    from mmcv.ops import MultiScaleDeformableAttention

    return MultiScaleDeformableAttention(
        embed_dims=width, num_heads=spec.heads, num_levels=levels, num_points=spec.points,
        dropout=0.0, batch_first=True, value_proj_ratio=spec.deform_ratio)


class Levels:
    """Token sequences of several maps laid end to end: their shapes, start offsets and the
    normalised centre of every token (what multi-scale deformable attention takes)."""

    def __init__(self, shapes: list[tuple[int, int]], device):
        self.hw = [(int(h), int(w)) for h, w in shapes]      # Python ints: no device syncs
        self.shapes = torch.as_tensor(self.hw, dtype=torch.long, device=device)
        sizes = self.shapes.prod(1)
        self.starts = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)[:-1]])
        centres = []
        for h, w in shapes:
            y, x = torch.meshgrid((torch.arange(h, device=device) + 0.5) / h,
                                  (torch.arange(w, device=device) + 0.5) / w, indexing="ij")
            centres.append(torch.stack([x.reshape(-1), y.reshape(-1)], -1))
        self.centres = torch.cat(centres)[None, :, None]          # (1, tokens, 1, 2)

    def attend(self, attention: nn.Module, query, value, reference) -> torch.Tensor:
        """attention(query -> value at these levels), without mmcv's residual."""
        return attention(query, value=value, identity=torch.zeros_like(query),
                         reference_points=reference.centres.to(query.dtype),
                         spatial_shapes=self.shapes, level_start_index=self.starts)

    def split(self, tokens: torch.Tensor) -> list[torch.Tensor]:
        """(B, tokens, C) -> one (B, C, h, w) map per level."""
        sizes = [h * w for h, w in self.hw]
        return [t.transpose(1, 2).reshape(t.shape[0], t.shape[2], h, w)
                for t, (h, w) in zip(tokens.split(sizes, 1), self.hw)]


def _norm(width: int) -> nn.LayerNorm:
    return nn.LayerNorm(width, eps=1e-6)


class Injector(nn.Module):
    """ViT tokens += gamma * deformable attention to the spatial prior (gamma starts at 0)."""

    def __init__(self, width: int, spec: AdapterSpec):
        super().__init__()
        self.norm_query, self.norm_prior = _norm(width), _norm(width)
        self.attention = _deformable(width, spec, len(PRIOR_STRIDES))
        self.gamma = nn.Parameter(torch.zeros(width))

    def forward(self, tokens, prior, vit: Levels, pyramid: Levels) -> torch.Tensor:
        mixed = pyramid.attend(self.attention, self.norm_query(tokens),
                               self.norm_prior(prior), vit)
        return tokens + self.gamma * mixed


class Extractor(nn.Module):
    """Pyramid tokens += deformable attention to the ViT tokens, then a convolutional FFN."""

    def __init__(self, width: int, spec: AdapterSpec):
        super().__init__()
        hidden = max(1, int(width * spec.cffn_ratio))
        self.norm_query, self.norm_vit = _norm(width), _norm(width)
        self.attention = _deformable(width, spec, 1)
        self.norm_ffn = _norm(width)
        self.fc1, self.fc2 = nn.Linear(width, hidden), nn.Linear(hidden, width)
        self.dwconv = nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden)

    def forward(self, prior, tokens, vit: Levels, pyramid: Levels) -> torch.Tensor:
        prior = prior + vit.attend(self.attention, self.norm_query(prior),
                                   self.norm_vit(tokens), pyramid)
        hidden = self.fc1(self.norm_ffn(prior))
        maps = [self.dwconv(m) for m in pyramid.split(hidden)]
        hidden = torch.cat([m.flatten(2).transpose(1, 2) for m in maps], 1)
        return prior + self.fc2(F.gelu(hidden))


def vit_tokens(vit: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The ViT's input sequence (prefix tokens first), as timm's forward_features builds it."""
    return vit.norm_pre(vit.patch_drop(vit._pos_embed(vit.patch_embed(x))))


class ViTAdapter(nn.Module):
    """A timm ViT (linvit's operators inside) with ViT-Adapter's interactions; forward returns
    four (B, width, H/s, W/s) maps for s in 4, 8, 16, 32."""

    def __init__(self, width: int, depth: int, spec: AdapterSpec, in_chans: int):
        super().__init__()
        check_interactions(spec.interactions, depth)
        self.spec = spec
        self.prior = SpatialPrior(width, spec.channels, in_chans)
        self.level_embed = nn.Parameter(torch.randn(len(PRIOR_STRIDES), width))
        self.injectors = nn.ModuleList(Injector(width, spec) for _ in spec.interactions)
        count = len(spec.interactions) + spec.extra_extractors
        self.extractors = nn.ModuleList(Extractor(width, spec) for _ in range(count))
        self.up = nn.ConvTranspose2d(width, width, 2, 2)
        self.norms = nn.ModuleList(nn.GroupNorm(1, width) for _ in range(4))
        for module in (self.prior, self.up, self.extractors):
            init_like_reference(module)

    def forward(self, vit: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """`vit` (not a submodule here: the backbone owns it, under its checkpoint's names)
        on images `x`."""
        c1, *maps = self.prior(x)
        pyramid = Levels([m.shape[2:] for m in maps], x.device)
        prior = torch.cat([m.flatten(2).transpose(1, 2) + e
                           for m, e in zip(maps, self.level_embed)], 1)
        patch = vit.patch_embed.patch_size[0]
        grid = Levels([(x.shape[2] // patch, x.shape[3] // patch)], x.device)
        tokens, prefix = vit_tokens(vit, x), vit.num_prefix_tokens
        for (first, last), injector, extractor in zip(self.spec.interactions, self.injectors,
                                                      self.extractors):
            patches = injector(tokens[:, prefix:], prior, grid, pyramid)
            tokens = torch.cat([tokens[:, :prefix], patches], 1)
            for block in vit.blocks[first:last + 1]:
                tokens = block(tokens)
            prior = extractor(prior, tokens[:, prefix:], grid, pyramid)
        for extractor in self.extractors[len(self.spec.interactions):]:
            prior = extractor(prior, tokens[:, prefix:], grid, pyramid)
        c2, c3, c4 = pyramid.split(prior)
        outs = [self.up(c2) + c1, c2, c3, c4]
        # the ViT's own map at every stride (ViT-Adapter's add_vit_feature)
        vit_map = grid.split(tokens[:, prefix:])[0]
        outs = [o + F.interpolate(vit_map, size=o.shape[2:], mode="bilinear",
                                  align_corners=False, antialias=True) for o in outs]
        return tuple(norm(o) for norm, o in zip(self.norms, outs))
