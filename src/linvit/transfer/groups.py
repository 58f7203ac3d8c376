"""Component groups of a ViT: every tensor of the model belongs to exactly one.

    embed  patch embedding, position embedding, cls/register tokens
    attn   everything inside blocks.*.attn (timm's qkv/proj/q_norm/k_norm/norm and any
           operator-specific tensors), plus the attention branch's layer scale ls1
    mlp    blocks.*.mlp and the MLP branch's layer scale ls2
    norm   block norms (norm1, norm2) and the model-level norms (norm_pre, norm, fc_norm)
    head   the classifier

A tensor that matches no rule is an error, so a future timm adding a parameter cannot slip into
"new" or "copied" unnoticed.
"""
from __future__ import annotations

import re

GROUPS = ("embed", "attn", "mlp", "norm", "head")

_RULES = [
    ("embed", re.compile(r"^(patch_embed\.|pos_embed$|cls_token$|reg_token$)")),
    ("attn", re.compile(r"^blocks\.\d+\.(attn\.|ls1\.)")),
    ("mlp", re.compile(r"^blocks\.\d+\.(mlp\.|ls2\.)")),
    ("norm", re.compile(r"^(blocks\.\d+\.norm[12]\.|norm_pre\.|norm\.|fc_norm\.)")),
    ("head", re.compile(r"^(head\.|head_drop\.)")),
]


def group_of(name: str) -> str:
    for group, pattern in _RULES:
        if pattern.match(name):
            return group
    raise ValueError(f"tensor {name!r} belongs to no component group ({', '.join(GROUPS)}); "
                     "extend linvit.transfer.groups")


def check_groups(groups, field: str) -> frozenset[str]:
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
        raise ValueError(f"{field}: unknown group(s) {unknown}; allowed: {', '.join(GROUPS)}")
    return frozenset(groups)
