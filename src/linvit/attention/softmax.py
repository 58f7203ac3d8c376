"""Softmax attention: the teacher and the reference operator.

Training uses torch's fused scaled_dot_product_attention (as timm does), which never forms the
map; `attention_map` forms it explicitly for map-level distillation and for the tests.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from linvit.attention.base import AttentionOperator
from linvit.ops.linear_attention import softmax_attention_map


class SoftmaxAttention(AttentionOperator):
    name = "softmax"
    family = "softmax"
    supports_attn_drop = True
    # Attention transfer's copy mode (linvit.models.attention_copy): a (B, H, N, N) map from
    # the teacher that replaces this block's own for one forward; None: compute it.
    given_map: torch.Tensor | None = None

    # no @float32_core: SDPA's fused kernels run in autocast's dtype
    def global_mix(self, q, k, v):
        p = self.attn_drop.p if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, scale=self.scale)

    @classmethod
    def core_flops(cls, tokens, head_dim):
        return 4.0 * tokens * tokens * head_dim                   # Q K^T and A V

    def attention_map(self, q, k):
        return softmax_attention_map(q, k, self.scale)

    def _forward(self, x: torch.Tensor, need_map: bool):
        if not need_map and self.given_map is None:
            return super()._forward(x, need_map)
        # With the map at hand, use it for the output too (one N^2 pass, dropout applied to the
        # map as in timm's unfused path).
        B, N, C = x.shape
        q, k, v = self.project(x)
        attn_map = self.attention_map(q, k) if self.given_map is None else self.given_map
        out = (self.attn_drop(attn_map).to(v.dtype) @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(self.norm(out))), attn_map
