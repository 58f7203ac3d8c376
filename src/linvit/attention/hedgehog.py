"""Hedgehog linear attention (arXiv 2402.04347).

A learnable per-head feature map phi(x) = [softmax(xW + b), softmax(-(xW + b))] (softmax over the
feature dimension, 2d features), separate for queries and keys, initialised to W = I, b = 0. It is
meant to be trained to mimic softmax attention weights (the attn_map_ce distillation loss).
"""
from __future__ import annotations

import torch
from torch import nn

from linvit.attention.base import AttentionOperator, float32_core
from linvit.ops import cpp_kernels
from linvit.ops.definitions import NORMALISER_EPS
from linvit.ops.linear_attention import (
    linear_core_flops,
    linear_path,
    normalized_linear_attention,
    normalized_linear_attention_map,
)


class HedgehogAttention(AttentionOperator):
    name = "hedgehog"
    cpp_sources = ("linear_attention.cpp",)
    family = "feature map"
    init_notes = {"fmap_": "W = I, b = 0 (Hedgehog's init): the features start as "
                           "[softmax(x), softmax(-x)] of the copied queries and keys"}

    def build(self, device=None, dtype=None):
        H, d = self.num_heads, self.head_dim
        eye = torch.eye(d, device=device, dtype=dtype).expand(H, d, d).clone()
        self.fmap_q_weight = nn.Parameter(eye.clone())
        self.fmap_q_bias = nn.Parameter(torch.zeros(H, 1, d, device=device, dtype=dtype))
        self.fmap_k_weight = nn.Parameter(eye)
        self.fmap_k_bias = nn.Parameter(torch.zeros(H, 1, d, device=device, dtype=dtype))

    @staticmethod
    def _feature_map(x, weight, bias):
        z = torch.einsum("bhnd,hde->bhne", x.float(), weight.float()) + bias.float()
        return torch.cat([torch.softmax(z, dim=-1), torch.softmax(-z, dim=-1)], dim=-1)

    def features(self, q, k):
        return (self._feature_map(q, self.fmap_q_weight, self.fmap_q_bias),
                self._feature_map(k, self.fmap_k_weight, self.fmap_k_bias))

    @classmethod
    def core_flops(cls, tokens, head_dim):
        # the d x d projections of Q and K, then a core on 2d-wide features
        return 2 * 2.0 * tokens * head_dim * head_dim + linear_core_flops(tokens, 2 * head_dim,
                                                                          head_dim)

    @float32_core
    def global_mix(self, q, k, v):
        if linear_path(q, v, "hedgehog", True) == "cpp":   # the feature maps in the kernel
            return cpp_kernels.cpp_linear_attention(
                q, k, v, "hedgehog", True, NORMALISER_EPS, 0.0, self.fmap_q_weight,
                self.fmap_q_bias, self.fmap_k_weight, self.fmap_k_bias)
        return normalized_linear_attention(*self.features(q, k), v)

    @float32_core(cast_back=False)
    def attention_map(self, q, k):
        return normalized_linear_attention_map(*self.features(q, k))
