"""timm's VisionTransformer with a linvit attention operator swapped in, built from a ModelSpec
(linvit.models.spec)."""
from __future__ import annotations

from timm.models.vision_transformer import VisionTransformer

from linvit.attention import AttentionOperator, operator_class
from linvit.models.spec import ModelSpec


class LinvitViT(VisionTransformer):
    """timm's VisionTransformer built from a ModelSpec, which it keeps as `spec` (what
    save_model writes beside the tensors, so the file alone rebuilds the model)."""

    def __init__(self, spec: ModelSpec):
        spec.check()
        size = spec.model_size
        super().__init__(img_size=spec.img_size, in_chans=spec.in_chans,
                         num_classes=spec.num_classes,
                         attn_layer=operator_class(spec.operator, **spec.operator_options),
                         drop_path_rate=spec.drop_path, **size.timm_kwargs())
        self.spec = spec
        set_token_layout(self)


def create_vit(spec: ModelSpec) -> LinvitViT:
    return LinvitViT(spec)


def set_token_layout(model: VisionTransformer, grid_size: tuple[int, int] | None = None) -> None:
    """Tell every operator where the patch grid sits in the token sequence (for local terms)."""
    grid = grid_size or model.patch_embed.grid_size
    for block in model.blocks:
        if isinstance(block.attn, AttentionOperator):
            block.attn.set_token_layout(model.num_prefix_tokens, grid)


def attention_modules(model: VisionTransformer) -> list[AttentionOperator]:
    return [block.attn for block in model.blocks]
