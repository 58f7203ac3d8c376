"""timm's VisionTransformer with a linvit attention operator swapped in.

A model is fully described by a small `ModelSpec` (size, operator, data shape), which travels
inside every checkpoint's metadata so a checkpoint file alone rebuilds its model.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from timm.models.vision_transformer import VisionTransformer

from linvit.attention import AttentionOperator, operator_class
from linvit.models.sizes import get_size


@dataclass(frozen=True)
class ModelSpec:
    size: str
    operator: str
    num_classes: int
    img_size: int
    in_chans: int
    operator_options: dict = field(default_factory=dict)
    drop_path: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelSpec":
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"model spec has unknown fields {unknown}")
        return cls(**d)

    def with_operator(self, operator: str, operator_options: dict | None = None) -> "ModelSpec":
        return ModelSpec(**{**self.as_dict(), "operator": operator,
                            "operator_options": dict(operator_options or {})})


def create_vit(spec: ModelSpec) -> VisionTransformer:
    size = get_size(spec.size)
    attn_cls = operator_class(spec.operator, **spec.operator_options)
    model = VisionTransformer(img_size=spec.img_size, in_chans=spec.in_chans,
                              num_classes=spec.num_classes, attn_layer=attn_cls,
                              drop_path_rate=spec.drop_path, **size.timm_kwargs())
    set_token_layout(model)
    model.linvit_spec = spec
    return model


def set_token_layout(model: VisionTransformer, grid_size: tuple[int, int] | None = None) -> None:
    """Tell every operator where the patch grid sits in the token sequence (for local terms)."""
    grid = grid_size or model.patch_embed.grid_size
    for block in model.blocks:
        if isinstance(block.attn, AttentionOperator):
            block.attn.set_token_layout(model.num_prefix_tokens, grid)


def attention_modules(model: VisionTransformer) -> list[AttentionOperator]:
    return [block.attn for block in model.blocks]
