"""Any timm ViT as a linvit architecture: its shape read from the timm model itself (on the meta
device: nothing is allocated), then checked by rebuilding it, so that a teacher's every tensor
has its place in the linvit model and means there what it meant in timm's.

What linvit's blocks do not build (qk-norm, SwiGLU, RMSNorm, parallel or post-norm blocks,
attention pooling, another LayerNorm epsilon or activation) is refused, naming the feature."""
from __future__ import annotations

from dataclasses import asdict

from linvit.errors import ConfigError
from linvit.models.sizes import ModelSize
from linvit.models.spec import ModelSpec

LAYER_NORM_EPS = 1e-6             # timm's VisionTransformer default, which linvit builds


def timm_model_name(name: str) -> str:
    """timm's architecture of `name` (a tag, `.mae`, names weights, not a shape)."""
    return name.split(".", 1)[0]


def _meta_model(name: str):
    import timm
    import torch
    from timm.models.vision_transformer import VisionTransformer

    if not timm.is_model(timm_model_name(name)):
        raise ConfigError(f"{name!r} is neither a linvit size nor a timm model "
                          "(`linvit list` names the sizes, timm.list_models() timm's)")
    with torch.device("meta"):
        model = timm.create_model(timm_model_name(name), pretrained=False)
    if type(model) is not VisionTransformer:
        raise ConfigError(f"timm's {name} is a {type(model).__name__}, not a VisionTransformer "
                          "(the ViTs linvit converts)")
    return model


def _unsupported(model) -> list[str]:
    from timm.layers import Mlp, PatchEmbed
    from timm.models.vision_transformer import Block
    from torch import nn

    block = model.blocks[0]
    norm = block.norm1
    checks = [
        (all(type(b) is Block for b in model.blocks), "blocks other than timm's pre-norm Block"),
        (type(block.mlp) is Mlp, f"a {type(block.mlp).__name__} MLP"),
        (type(getattr(block.mlp, "act", None)) is nn.GELU
         and block.mlp.act.approximate == "none", "an activation other than exact GELU"),
        (isinstance(norm, nn.LayerNorm) and norm.eps == LAYER_NORM_EPS,
         f"{type(norm).__name__}(eps={getattr(norm, 'eps', '?')}) instead of LayerNorm(eps=1e-6)"),
        (isinstance(block.attn.q_norm, nn.Identity), "qk-norm"),
        (block.attn.proj.bias is not None, "an attention projection without bias"),
        (model.global_pool in ("token", "avg", ""), f"global_pool={model.global_pool!r}"),
        (model.pos_embed is not None, "no learned position embedding"),
        (type(model.patch_embed) is PatchEmbed and model.patch_embed.proj.bias is not None
         and isinstance(model.patch_embed.norm, nn.Identity), "another patch embedding"),
        (not getattr(model, "dynamic_img_size", False), "dynamic image size"),
    ]
    return [what for ok, what in checks if not ok]


def _init_values(name: str) -> float | None:
    """LayerScale's initial value, read from a one-block instance (meta tensors hold none)."""
    import timm

    one = timm.create_model(timm_model_name(name), pretrained=False, depth=1)
    ls = one.blocks[0].ls1
    # as the entrypoint wrote it (1e-5), not its float32 rounding
    return float(f"{float(ls.gamma.detach().flatten()[0]):.6g}") if hasattr(ls, "gamma") else None


def read_architecture(name: str) -> ModelSize:
    """The ModelSize of timm's model `name` (ConfigError naming what linvit cannot build)."""
    from torch import nn

    model = _meta_model(name)
    if problems := _unsupported(model):
        raise ConfigError(f"timm's {name} has {', '.join(problems)}: not an architecture "
                          "linvit's blocks build")
    block = model.blocks[0]
    fc_norm = not isinstance(model.fc_norm, nn.Identity)
    size = ModelSize(
        width=model.embed_dim, depth=len(model.blocks), heads=block.attn.num_heads,
        patch_size=model.patch_embed.patch_size[0],
        mlp_ratio=block.mlp.fc1.out_features / model.embed_dim,
        qkv_bias=block.attn.qkv.bias is not None, timm_name=name,
        description=f"read from timm's {timm_model_name(name)}",
        class_token=model.cls_token is not None, reg_tokens=model.num_reg_tokens,
        no_embed_class=model.no_embed_class,
        init_values=_init_values(name) if not isinstance(block.ls1, nn.Identity) else None,
        global_pool=model.global_pool, pre_norm=not isinstance(model.norm_pre, nn.Identity),
        final_norm=fc_norm or not isinstance(model.norm, nn.Identity),
        fc_norm=fc_norm if model.global_pool == "avg" or fc_norm else None,
        img_size=model.patch_embed.img_size[0])
    check_rebuilds(name, model, size)
    return size


def check_rebuilds(name: str, timm_model, size: ModelSize) -> None:
    """The linvit model of `size` holds exactly timm's tensors, shape for shape."""
    import torch

    from linvit.models.checkpoint import mismatch_report
    from linvit.models.vit import create_vit

    spec = ModelSpec(name, "softmax", timm_model.num_classes, size.img_size,
                     timm_model.patch_embed.proj.in_channels, architecture=asdict(size))
    with torch.device("meta"):
        ours = create_vit(spec)
    report = mismatch_report(ours, timm_model.state_dict())
    problems = [f"{kind}: {', '.join(keys[:4])}" for kind, keys in report.items() if keys]
    if problems:
        raise ConfigError(f"timm's {name} does not rebuild as a linvit model "
                          f"({'; '.join(problems)})")


def size_of(name: str) -> tuple[str, dict | None]:
    """(spec.size, spec.architecture) for a registry size or a timm model name."""
    from linvit.models.sizes import SIZES

    if name in SIZES:
        return name, None
    return name, asdict(read_architecture(name))
