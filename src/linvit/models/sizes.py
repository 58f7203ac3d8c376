"""The model-size registry: transformer shapes only. Image size, channels and classes come from the
dataset, so one size serves every dataset.

CPU sizes are for this project's laptop runs on 28-32 px images; the DeiT shapes match timm's
deit_*_patch16_224 so their pretrained checkpoints load tensor for tensor.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from linvit.registry import Registry


@dataclass(frozen=True)
class ModelSize:
    width: int
    depth: int
    heads: int
    patch_size: int
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    timm_name: str | None = None      # timm model whose pretrained weights have this shape
    description: str = ""

    def timm_kwargs(self) -> dict:
        return dict(embed_dim=self.width, depth=self.depth, num_heads=self.heads,
                    patch_size=self.patch_size, mlp_ratio=self.mlp_ratio, qkv_bias=self.qkv_bias)

    def as_dict(self) -> dict:
        return asdict(self)


SIZES: Registry[ModelSize] = Registry("model size", {
    "cpu96": ModelSize(96, 6, 3, 4, description="CPU: 28 px -> 7x7 patches + cls = 50 tokens"),
    "cpu64": ModelSize(64, 4, 2, 4,
                       description="CPU, small: cpu96's 32-wide heads, 4 blocks of 64"),
    "cpu96p2": ModelSize(96, 6, 3, 2, description="CPU, long sequence: 28 px -> 196 patches"),
    "cpu192": ModelSize(192, 6, 3, 4, description="CPU, wider: DeiT-T width at depth 6"),
    "deit_t": ModelSize(192, 12, 3, 16, timm_name="deit_tiny_patch16_224", description="DeiT-Tiny"),
    "deit_s": ModelSize(384, 12, 6, 16, timm_name="deit_small_patch16_224",
                        description="DeiT-Small"),
    "deit_b": ModelSize(768, 12, 12, 16, timm_name="deit_base_patch16_224",
                        description="DeiT-Base"),
})
get_size = SIZES.lookup
