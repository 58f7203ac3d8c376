"""Focused linear attention (FLatten, arXiv 2308.00442).

phi_p(x) = ||x'|| * x'^p / ||x'^p||, x' = (relu(x) + 1e-6) / softplus(s), with a learnable
per-channel scale s and focusing power p = 3, plus a depthwise conv on V (kernel 5, shared across
heads) added to the output.

Differences from the FLatten code, on purpose: the focusing norms are taken per head (every
operator here keeps heads independent), and FLatten's extra learnable positional encoding on K is
left out (it ties the operator to one resolution; the ViT's own position embedding remains).
"""
from __future__ import annotations

import torch
from torch import nn

from linvit.attention.base import ODD_KERNEL, AttentionOperator, float32_core
from linvit.ops.focused_features import focused_features
from linvit.ops.linear_attention import (
    focused_linear_attention,
    linear_core_flops,
    linear_path,
    normalized_linear_attention_map,
)


class FocusedLinearAttention(AttentionOperator):
    name = "focused"
    cpp_sources = ("linear_attention.cpp",)
    family = "feature map"
    options = {"focusing_factor": 3.0, "kernel_size": 5}
    option_rules = {"kernel_size": ODD_KERNEL}
    init_notes = {"focus_scale": "0, so softplus(s) = ln 2 (FLatten's init)",
                  "dwc": "PyTorch's default depthwise-conv init, as FLatten"}

    def build(self, device=None, dtype=None):
        d = self.head_dim
        # softplus(0) = ln 2: the FLatten initialisation.
        self.focus_scale = nn.Parameter(torch.zeros(1, self.num_heads, 1, d, device=device,
                                                    dtype=dtype))
        self.dwc = nn.Conv2d(d, d, self.kernel_size, padding=self.kernel_size // 2, groups=d,
                             device=device, dtype=dtype)

    def feature_map(self, x):
        fused = linear_path(x, x, "focused", True) != "reference"
        return focused_features(x, self.focus_scale, self.focusing_factor, fused)

    @float32_core
    def global_mix(self, q, k, v):
        return focused_linear_attention(q, k, v, self.focus_scale, self.focusing_factor)

    @classmethod
    def core_flops(cls, tokens, head_dim):
        return linear_core_flops(tokens, head_dim, head_dim)     # the focusing is elementwise

    @float32_core(cast_back=False)
    def attention_map(self, q, k):
        return normalized_linear_attention_map(self.feature_map(q), self.feature_map(k))

    def local_mix(self, v):
        return self.depthwise_on_patches(v, self.dwc, per_head=True)
