"""Injective linear attention (InLine, arXiv 2412.06590).

A_ij = s q_i.k_j - mean_t(s q_i.k_t) + 1/N with the identity kernel and s = head_dim^-0.5 (InLine's
default), plus a local 3x3 depthwise residual on V. The subtraction makes the map injective and its
rows sum to 1 without any division, so there is no normaliser to vanish.

Difference from the InLine code, on purpose: the local residual is a learned depthwise conv (one
3x3 filter per channel) rather than filters predicted from the mean token.
"""
from __future__ import annotations

from torch import nn

from linvit.attention.base import ODD_KERNEL, AttentionOperator, float32_core
from linvit.ops.linear_attention import (
    injective_linear_attention,
    injective_linear_attention_map,
    linear_core_flops,
)


class InLineAttention(AttentionOperator):
    name = "inline"
    cpp_sources = ("linear_attention.cpp",)
    family = "feature map"
    map_kind = "signed"                  # rows sum to 1 but entries can be negative
    options = {"kernel_size": 3}
    option_rules = {"kernel_size": ODD_KERNEL}
    init_notes = {"local": "PyTorch's default depthwise-conv init (InLine's local residual "
                           "starts small and unbiased towards any direction)"}

    def build(self, device=None, dtype=None):
        dim = self.num_heads * self.head_dim
        self.local = nn.Conv2d(dim, dim, self.kernel_size, padding=self.kernel_size // 2,
                               groups=dim, device=device, dtype=dtype)

    @float32_core
    def global_mix(self, q, k, v):
        return injective_linear_attention(q, k, v, self.scale)

    @classmethod
    def core_flops(cls, tokens, head_dim):
        return linear_core_flops(tokens, head_dim, head_dim, normalize=False)   # centring: O(Nd)

    @float32_core(cast_back=False)
    def attention_map(self, q, k):
        return injective_linear_attention_map(q, k, self.scale)

    def local_mix(self, v):
        return self.depthwise_on_patches(v, self.local, per_head=False)
