"""Training cost in FLOPs, from a model's spec: the portable unit of time-to-accuracy curves.

Counted like the operators' `core_flops`: matrix products only, a multiply-add is 2 FLOPs, and
norms, activations, softmax and other elementwise work are left out. Per image, a ViT's forward
is its patch embedding, per block the qkv projection, each head's operator core
(`core_flops(tokens, head_dim)`) and its own projections (`block_flops`), the output projection
and the MLP, and the classifier head. A
training step costs 3 forwards (the forward, and the backward's gradients for activations and for
weights; Kaplan et al. 2020 use the same factor), also where some weights are frozen: an upper
bound there, stated rather than guessed at.
"""
from __future__ import annotations

from linvit.attention import OPERATORS

TRAIN_FACTOR = 3.0        # forward + backward, per image, relative to the forward


def tokens(spec) -> int:
    """Patches plus the prefix tokens (class, registers)."""
    size = spec.model_size
    return (spec.img_size // size.patch_size) ** 2 + size.prefix_tokens


def attention_flops(spec) -> float:
    """One block's attention forward per image: qkv, every head's core, the operator's own
    projections, the output projection."""
    size, n = spec.model_size, tokens(spec)
    head_dim, operator = size.width // size.heads, OPERATORS[spec.operator]
    core = operator.core_flops(n, head_dim)
    if core is None:
        raise ValueError(f"operator {spec.operator!r} does not count its FLOPs (core_flops)")
    own = operator.block_flops(n, size.width, head_dim)
    return 2.0 * n * size.width * 4 * size.width + size.heads * core + own


def mlp_flops(spec) -> float:
    size, n = spec.model_size, tokens(spec)
    return 2.0 * n * size.width * int(size.width * size.mlp_ratio) * 2


def forward_flops(spec) -> float:
    """One image through the whole model."""
    size = spec.model_size
    patches = (spec.img_size // size.patch_size) ** 2
    embed = 2.0 * patches * spec.in_chans * size.patch_size ** 2 * size.width
    blocks = size.depth * (attention_flops(spec) + mlp_flops(spec))
    return embed + blocks + 2.0 * size.width * spec.num_classes


def train_flops_per_image(spec) -> float:
    return TRAIN_FACTOR * forward_flops(spec)
