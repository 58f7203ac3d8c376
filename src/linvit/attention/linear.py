"""Linear attention with phi(x) = elu(x) + 1 (Katharopoulos et al. 2020, arXiv 2006.16236)."""
from __future__ import annotations

from linvit.attention.base import AttentionOperator, float32_core
from linvit.ops.definitions import feature
from linvit.ops.linear_attention import (
    linear_attention,
    linear_core_flops,
    normalized_linear_attention_map,
)


class LinearAttention(AttentionOperator):
    name = "linear"
    cpp_sources = ("linear_attention.cpp",)
    family = "feature map"
    feature_kind = "elu1"                                          # elu(x) + 1 > 0 everywhere

    def feature_map(self, x):
        return feature(x, self.feature_kind)

    @float32_core
    def global_mix(self, q, k, v):
        # the feature map is fused into the core (it is recomputed in backward, never stored)
        return linear_attention(q, k, v, kind=self.feature_kind)

    @classmethod
    def core_flops(cls, tokens, head_dim):
        return linear_core_flops(tokens, head_dim, head_dim)

    @float32_core(cast_back=False)
    def attention_map(self, q, k):
        return normalized_linear_attention_map(self.feature_map(q), self.feature_map(k))
