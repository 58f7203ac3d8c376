"""ViT-Adapter's shape settings and their checks, apart from the modules (linvit.dense.adapter):
the workflow checks every dense job's adapter against its backbone when a run starts, and this
must not import torch, timm or mmcv to do so."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AdapterSpec:
    interactions: tuple[tuple[int, int], ...]   # (first, last) ViT block of each interaction
    heads: int = 6                 # deformable-attention heads (6 for DeiT-T/S, 12 for DeiT-B)
    points: int = 4
    deform_ratio: float = 1.0      # value projection width / ViT width
    cffn_ratio: float = 0.25       # ConvFFN hidden width / ViT width
    channels: int = 64             # width of the spatial prior's first stage
    extra_extractors: int = 2      # after the last interaction, as in the reference


def even_interactions(depth: int, count: int = 4) -> tuple[tuple[int, int], ...]:
    """`count` interactions over consecutive, equal shares of the blocks ((0, 2), (3, 5), (6, 8),
    (9, 11) for 12 blocks, as ViT-Adapter's DeiT configs)."""
    count = min(count, depth)
    bounds = [i * depth // count for i in range(count + 1)]
    return tuple((bounds[i], bounds[i + 1] - 1) for i in range(count))


def check_interactions(interactions, depth: int) -> None:
    """Interactions must cover blocks 0..depth-1 in order, each block once."""
    expected = 0
    for first, last in interactions:
        if first != expected or last < first:
            raise ValueError(f"adapter interactions {list(map(list, interactions))} must cover "
                             f"blocks 0..{depth - 1} in order, each once")
        expected = last + 1
    if expected != depth:
        raise ValueError(f"adapter interactions {list(map(list, interactions))} end at block "
                         f"{expected - 1}, the ViT has {depth} blocks")


def default_heads(vit_heads: int) -> int:
    """ViT-Adapter's deformable heads: 6, or the ViT's own count when larger (12 at ViT-B)."""
    return max(6, vit_heads)


def adapter_spec(settings: dict, depth: int, vit_heads: int) -> AdapterSpec:
    """An AdapterSpec from AdapterCfg's fields, for a ViT of `depth` blocks and
    `vit_heads` heads (interactions checked against the depth)."""
    settings = dict(settings)
    pairs = settings.pop("interactions", None)
    interactions = (tuple(tuple(p) for p in pairs) if pairs is not None
                    else even_interactions(depth))
    check_interactions(interactions, depth)
    if settings.get("heads") is None:
        settings["heads"] = default_heads(vit_heads)
    return AdapterSpec(interactions=interactions, **settings)
