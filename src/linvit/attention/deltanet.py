"""Bidirectional DeltaNet attention (arXiv 2406.06484; fla `fla/layers/delta_net.py`).

Per head, with q and k normalised to unit length:

    beta = sigmoid(Linear(C, 2H)(k_all))         per token, head and scan direction
    u_t = beta_t (v_t - S^T k_t),  S += k_t u_t^T,  o_t = g_h S^T q_t     in each direction
    o = (o_forward + o_backward) / 2

(linvit.ops.delta_rule). The map that multiplies V is exact but signed and not row-normalised
("signed"): distil it with output or hidden-state losses, not map cross-entropy.

Design, and how it differs from fla's DeltaNet on purpose:
- Bidirectional: both scans share q, k, v; each has its own beta, as writing order matters.
- Unit q and k: the state transition I - beta k k^T is a contraction only for ||k|| = 1 and
  beta in (0, 1), which keeps the recursion stable over any number of tokens.
- No SiLU before the normalisation (fla's qk_activation): it would rectify the copied teacher's
  q and k; the normalisation alone gives the stability.
- No SiLU on v either (fla applies SiLU to v before the scan): v stays the copied value
  projection, and the output stays linear in V, so the map is exact.
- The teacher's temperature: normalising removes |q| |k| and the map is linear in q, so no scale
  can restore a softmax's sharpness; a scale on q is only an output gain. It is a learnable
  per-head gain g_h (`query_scale`), 1 at init rather than fla's d^-1/2: the state holds a
  regression from unit keys to values, so a unit query reads a value-sized vector, the size of
  the convex combination of values that the copied projection `proj` was trained on.
- beta reads the keys of all heads, not x (see AttentionOperator.merge_heads). At init its weight
  is zero and its bias logit(beta_init): every token writes with the same strength, and the gate
  learns content dependence from there (the weight's gradient is not zero). beta_init = 0.25:
  for unit keys in d dimensions a write of strength beta fades an older one by about beta / d
  per token, so the state spans about d / beta tokens, 256 at d = 64, more than the 197 tokens
  of a 224px ViT: at init each scan reads from the whole image, as the teacher's global
  attention does, rather than from the last few tokens.
- No short convolution (fla's causal conv1d on q, k, v): on v it would have to enter the map, and
  the ViT's position embedding and the two scan directions already give token order. No output
  gate or norm either: timm's optional `norm` (scale_norm) plays that part for every operator.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from linvit.attention.base import AttentionOperator, float32_core
from linvit.ops.chunks import padded_length
from linvit.ops.definitions import unit_rows
from linvit.ops.delta_rule import CHUNK, delta_rule, delta_rule_map


class DeltaNetAttention(AttentionOperator):
    name = "deltanet"
    cpp_sources = ("delta_rule.cpp",)
    family = "delta rule"
    map_kind = "signed"
    options = {"beta_init": 0.25}
    option_rules = {"beta_init": (lambda b: 0.0 < b < 1.0, "in (0, 1)")}
    init_notes = {
        "beta_proj.weight": "0: every token writes with the same strength at init; the gate "
                            "learns content dependence from there",
        "beta_proj.bias": "logit(beta_init), beta = 0.25 by default: each scan's state spans "
                          "~d / beta tokens (256 at d = 64), the whole image at init",
        "query_scale": "1: a unit query reads a value-sized vector from the state (the copied "
                       "q/k temperature cannot be restored in a map linear in q)",
    }
    reference_max_tokens = 1024                     # the reference is a token-by-token loop

    def build(self, device=None, dtype=None):
        H, C = self.num_heads, self.num_heads * self.head_dim
        self.beta_proj = nn.Linear(C, 2 * H, device=device, dtype=dtype)   # [forward | backward]
        self.query_scale = nn.Parameter(torch.ones(H, device=device, dtype=dtype))

    def init_parameters(self):
        nn.init.zeros_(self.beta_proj.weight)
        nn.init.constant_(self.beta_proj.bias, math.log(self.beta_init / (1 - self.beta_init)))
        nn.init.ones_(self.query_scale)

    def scan_inputs(self, q, k):
        """Unit q times the head's gain, unit k, and the forward and backward betas (B, H, N)."""
        beta = torch.sigmoid(self.beta_proj(self.merge_heads(k)))           # (B, N, 2H)
        beta_f, beta_b = beta.transpose(1, 2).unflatten(1, (2, self.num_heads)).unbind(1)
        gain = self.query_scale.to(q.dtype).view(-1, 1, 1)                # (H, 1, 1)
        return unit_rows(q, gain), unit_rows(k), beta_f, beta_b

    @float32_core
    def global_mix(self, q, k, v):
        q, k, beta_f, beta_b = self.scan_inputs(q, k)
        return delta_rule(q, k, v, beta_f, beta_b, scale=1.0)

    @float32_core(cast_back=False)
    def attention_map(self, q, k):
        return delta_rule_map(*self.scan_inputs(q, k), scale=1.0).float()

    @classmethod
    def core_flops(cls, tokens, head_dim):
        """Chunked path, N tokens padded to whole chunks of C = chunk_size(tokens, CHUNK), both
        directions run as one scan (so nothing is shared between them): per direction a C x C
        triangular inverse per chunk (N C^2), K K^T, Q K^T, T diag(beta) [K V] and P N
        (10 N C d), Q S and the chunk loop's W S and K^T N (6 N d^2)."""
        (c, n), d = padded_length(tokens, CHUNK), head_dim
        return 2.0 * n * c * c + 20.0 * n * c * d + 12.0 * n * d * d
