"""Mimetic initialisation of attention (Trockman & Kolter, arXiv 2305.09828): data-free weights
whose products look like those of trained ViTs.

Per head h, with C the model width and d the head width:
    W_q,h^T W_k,h   ~ a1 Z + b1 I      (queries attend to keys like themselves: a diagonal bias)
    W_proj,h W_v,h  ~ a2 Z' - b2 I     (the value-output path slightly negates the identity)
with Z, Z' ~ U(-sqrt(3/C), sqrt(3/C)) drawn per head (unit variance times 1/C), a1 = b1 = 0.7,
a2 = b2 = 0.4. Each C x C target A = U S V^T is cut to rank d and split as (U S^1/2)(S^1/2 V^T)
between the two factors. nn.Linear stores (out, in): q = W_q x, so W_q^T W_k = (U S^1/2)(...)
gives W_q = (U S^1/2)^T and W_k = S^1/2 V^T; proj's columns of head h are U S^1/2 and W_v,h is
S^1/2 V^T. Biases are zero. Only qkv.weight and proj.weight are set: any operator-specific tensor
keeps its own (declared) initialisation, so mimetic applies to every operator with timm's names.
"""
from __future__ import annotations

import math

import torch
from torch import nn

A1 = B1 = 0.7
A2 = B2 = 0.4


def _factors(target: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """left (C, r), right (r, C) with left @ right the best rank-r approximation of target."""
    u, s, vh = torch.linalg.svd(target)
    root = s[:rank].sqrt()
    return u[:, :rank] * root, root[:, None] * vh[:rank]


def _target(width: int, a: float, b: float, generator: torch.Generator | None) -> torch.Tensor:
    bound = math.sqrt(3.0 / width)
    z = (torch.rand(width, width, generator=generator, dtype=torch.float64) * 2 - 1) * bound
    return a * z + b * torch.eye(width, dtype=torch.float64)


def mimetic_weights(width: int, heads: int, generator: torch.Generator | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """qkv.weight (3C, C) and proj.weight (C, C) of one attention layer."""
    d = width // heads
    q, k, v = (torch.zeros(width, width, dtype=torch.float64) for _ in range(3))
    proj = torch.zeros(width, width, dtype=torch.float64)
    for h in range(heads):
        rows = slice(h * d, (h + 1) * d)
        left, right = _factors(_target(width, A1, B1, generator), d)
        q[rows], k[rows] = left.T, right                   # W_q^T W_k = left @ right
        left, right = _factors(_target(width, A2, -B2, generator), d)
        proj[:, rows], v[rows] = left, right               # W_proj,h W_v,h = left @ right
    return torch.cat([q, k, v]), proj


def mimetic_init_(attn: nn.Module, generator: torch.Generator | None = None) -> list[str]:
    """Set an attention module's qkv and proj weights, biases zero; returns the names set.
    Operators whose qkv or proj are wider than timm's (ttt's extra rows and columns) get the
    timm-shaped leading block; the rest keeps the operator's own initialisation."""
    width = attn.proj.out_features
    qkv, proj = mimetic_weights(width, attn.num_heads, generator)
    with torch.no_grad():
        attn.qkv.weight[:3 * width, :width].copy_(qkv)
        attn.proj.weight[:, :width].copy_(proj)
        if attn.qkv.bias is not None:
            attn.qkv.bias[:3 * width].zero_()
        if attn.proj.bias is not None:
            attn.proj.bias.zero_()
    return ["qkv.weight", "proj.weight"] + [f"{n}.bias" for n in ("qkv", "proj")
                                            if getattr(attn, n).bias is not None]
