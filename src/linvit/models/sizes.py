"""The model-size registry: transformer shapes only. Image size, channels and classes come from the
dataset, so one size serves every dataset. A ModelSize also describes any timm ViT read from timm
itself (linvit.models.architecture): its token layout, LayerScale, pooling and norms, as timm's
VisionTransformer arguments.

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
    # timm's VisionTransformer defaults below: the registry's sizes are plain DeiT-style ViTs
    class_token: bool = True
    reg_tokens: int = 0               # register tokens (DINOv2-reg)
    no_embed_class: bool = False      # position embedding over patches only (DeiT-III, -reg)
    init_values: float | None = None  # LayerScale's initial value; None: no LayerScale
    global_pool: str = "token"        # "token" (the class token), "avg" (MAE's fine-tuning)
    pre_norm: bool = False            # a norm before the blocks (CLIP)
    final_norm: bool = True
    fc_norm: bool | None = None       # None: timm's choice (with avg pooling)
    img_size: int | None = None       # the image size timm's model is made for (informative)

    def timm_kwargs(self) -> dict:
        return dict(embed_dim=self.width, depth=self.depth, num_heads=self.heads,
                    patch_size=self.patch_size, mlp_ratio=self.mlp_ratio, qkv_bias=self.qkv_bias,
                    class_token=self.class_token, reg_tokens=self.reg_tokens,
                    no_embed_class=self.no_embed_class, init_values=self.init_values,
                    global_pool=self.global_pool, pre_norm=self.pre_norm,
                    final_norm=self.final_norm, fc_norm=self.fc_norm)

    @property
    def prefix_tokens(self) -> int:
        return int(self.class_token) + self.reg_tokens

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelSize:
        """A ModelSize from a spec's `architecture` (ValueError naming an unknown field)."""
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"architecture has unknown fields {unknown}")
        size = cls(**d)
        for name in ("width", "depth", "heads", "patch_size"):
            value = getattr(size, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"architecture.{name}: expected an integer >= 1, got {value!r}")
        if size.width % size.heads:
            raise ValueError(f"architecture: width {size.width} is not a multiple of "
                             f"{size.heads} heads")
        return size


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
