"""Linear attention with phi(x) = elu(x) + 1 (Katharopoulos et al. 2020, arXiv 2006.16236)."""
from __future__ import annotations

import torch.nn.functional as F

from linvit.attention.base import AttentionOperator
from linvit.ops.linear_attention import (normalized_linear_attention,
                                         normalized_linear_attention_map)


class LinearAttention(AttentionOperator):
    name = "linear"

    def feature_map(self, x):
        return F.elu(x.float()) + 1.0                              # > 0 everywhere

    def global_mix(self, q, k, v):
        return normalized_linear_attention(self.feature_map(q), self.feature_map(k), v)

    def attention_map(self, q, k):
        return normalized_linear_attention_map(self.feature_map(q), self.feature_map(k))
