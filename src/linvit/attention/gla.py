"""Bidirectional gated linear attention (ViG, arXiv 2405.18425; hustvl/ViG).

Per head, a forward and a backward scan with data-dependent decays per key channel,

    S_i = diag(a_i) S_{i-1} + k_i v_i^T,   o_i = s q_i^T S_i,   o = (o_F + o_B) / 2,

s = head_dim^-0.5, log a = logsigmoid(g) / 16 (ViG's normaliser) per direction, from a low-rank
projection of the keys g = W2 (W1 k) + b (W1: C -> gate_rank, W2: gate_rank -> 2C, the two halves
are the forward and backward gates). The map (M_F + M_B) / 2 is exact but signed and not
row-normalised (see linvit.ops.gated_scan).

Init, on purpose: b = GATE_BIAS = 4, so a = sigmoid(4)^(1/16) ~ 1 - 1.1e-3 per token: ~0.8 across
a 196-patch image, an attention-like (global) mixing at init, where b = 0 would give ~e^-8.5 over
200 tokens (almost local). W2 = 0, so decays start data-independent and a copied block's mixing
is decided by the copied q k^T alone; W2 learns from the first step (its gradient reads W1 k),
and W1 keeps nn.Linear's random init so that W2's gradient is not zero.

Deliberate differences from ViG: no output gate, RMSNorm or local (depthwise conv) term, all of
which would make the layer nonlinear in V (the map would no longer be exact); the output is
therefore a signed sum over the tokens, not a weighted average, so a copied block starts on
another scale than the teacher's (fine-tuning or distillation must absorb it). Gates read the
keys, not x (see merge_heads). Per-token log-decays are floored at -MAX_STEP_DECAY = -1
(a >= 0.37, reached only for g < ~-16; ViG's optional clamp_min, unset there), which keeps the
chunked path exact and finite whatever the gates (linvit.ops.gated_scan).
"""
from __future__ import annotations

import torch
from torch import nn

from linvit.attention.base import AttentionOperator, float32_core
from linvit.ops.definitions import compute_dtype, log_sigmoid
from linvit.ops.gated_scan import chunked_core_flops, gated_scan, gated_scan_map

GATE_NORMALISER = 16.0     # ViG's gate_logit_normalizer
GATE_BIAS = 4.0            # attention-like at init: a ~ 1 - 1.1e-3 per token


class GatedLinearAttention(AttentionOperator):
    name = "gla"
    cpp_sources = ("gated_scan.cpp",)
    family = "gated"
    map_kind = "signed"
    options = {"gate_rank": 16}          # ViG's gate_low_rank_dim
    init_notes = {
        "gate_down": "PyTorch's default Linear init: random, so that gate_up's gradient "
                     "(which reads gate_down(k)) is not zero",
        "gate_up.weight": "0: the decays start data-independent, the copied q k^T alone decides "
                          "the mixing",
        "gate_up.bias": f"{GATE_BIAS:g}: a = sigmoid(b)^(1/16) ~ 1 - 1.1e-3 per token, ~0.8 "
                        "across 196 tokens (attention-like; 0 would be almost local)",
    }
    reference_max_tokens = 1024          # the reference path is a token-by-token loop

    def build(self, device=None, dtype=None):
        dim = self.num_heads * self.head_dim
        self.gate_down = nn.Linear(dim, self.gate_rank, bias=False, device=device, dtype=dtype)
        self.gate_up = nn.Linear(self.gate_rank, 2 * dim, device=device, dtype=dtype)

    def init_parameters(self):
        self.gate_down.reset_parameters()                  # PyTorch's default, not timm's
        nn.init.zeros_(self.gate_up.weight)
        nn.init.constant_(self.gate_up.bias, GATE_BIAS)

    def log_decays(self, k: torch.Tensor) -> torch.Tensor:
        """logsigmoid(g), (2, B, H, N, d): forward then backward; the log-decays are it / 16."""
        B, H, N, d = k.shape
        # gate_down(merge_heads(k)), read per head and summed: no transposed copy of k
        down = self.gate_down.weight.view(-1, H, d).permute(1, 2, 0)       # (H, d, r)
        low = torch.matmul(k, down).sum(1)                                  # (B, N, r)
        # gate_up per direction and head (its bias as a weight on a constant input), so that g
        # comes out as (2, B, H, N, d): each direction contiguous in the scan's layout
        low = torch.cat([low, low.new_ones(B, N, 1)], dim=-1)
        weight = torch.cat([self.gate_up.weight, self.gate_up.bias[:, None]], dim=1)
        weight = weight.view(2, 1, H, d, -1).transpose(-1, -2)            # (2, 1, H, r + 1, d)
        return log_sigmoid(torch.matmul(low[None, :, None], weight).to(compute_dtype(k)))

    @float32_core
    def global_mix(self, q, k, v):
        # s (o_F + o_B) / 2: the 1/2 goes with the query scale
        return gated_scan(q, k, v, self.log_decays(k), scale=self.scale / 2,
                          decay_scale=1 / GATE_NORMALISER)

    @float32_core(cast_back=False)
    def attention_map(self, q, k):
        return gated_scan_map(q, k, self.log_decays(k), scale=self.scale / 2,
                              decay_scale=1 / GATE_NORMALISER).float()

    @classmethod
    def core_flops(cls, tokens, head_dim):
        # per head and token: the gate projection's share (2 d r down, 2 (r + 1) 2d up, the bias
        # as one more input), then the scans
        gate = 2.0 * tokens * head_dim * (3 * cls.gate_rank + 2)
        return gate + chunked_core_flops(tokens, head_dim, head_dim)
