"""Bidirectional Mamba-2 / SSD as Hydra's quasiseparable mixer (arXiv 2407.09941; goombalab/hydra).

Per head h, with C <- s q (s = head_dim^-0.5), B <- k, x <- v, A = -exp(A_log) one scalar per
head (shared by the directions), and per direction dt = softplus(w_dt . k_i + dt_bias) read from
the head's own key:

    y_i = sum_{j<i} (s q_i . k_j) dt^F_j exp(A sum_{r=j+1..i} dt^F_r) v_j        (forward)
        + sum_{j>i} (s q_i . k_j) dt^B_j exp(A sum_{r=i..j-1} dt^B_r) v_j        (backward)
        + (D + w_D . k_i) v_i                                                    (diagonal)

i.e. SSD with log-decay dt A and its input weighted by dt, both scans strict (without their
diagonal: j < i forward, j > i backward), plus a diagonal term. B and C are shared by both
directions (one q, one k, as Hydra shares its projections) and are per head (each head its own q
and k), where Mamba-2 shares one B and C across the heads of a group. w_dt^F, w_dt^B, w_D are
the three columns of `key_proj` (H, d, 3). The map is exact and signed.

Why C = s q: a copied softmax block's q, k were trained for the logits s q.k, and softmax's first
order exp(x) ~ 1 + x weighs token j by exactly that logit: with s, C.B is the teacher's logit.

Init, on purpose (a copied block should start as an attention-like average): key_proj = 0 and
dt = DT_INIT = 1/196 for every token, so each token weighs like one patch in the average over a
224-px image and sum_j dt_j stays on the scale of an average; A = -A_INIT = -0.25, so the decay
across 196 tokens is exp(-0.25) ~ 0.78 (slow, nearly global). D = DT_INIT: the token itself counts
like one more token of that average, data-independent at first (Hydra's D = 1 would start the
block as a per-token copy of v that outweighs all the mixing).

Deliberate differences from Hydra, to keep y linear in V so that the map is exact and q, k, v
stay the copied projections: no depthwise conv and SiLU on x, B, C, no z gate, no RMSNorm.
- dt and the diagonal read the head's own key, not the whole token x (Hydra: in_proj and fc_D
  read all channels): a function of q, k keeps the map exact, and a per-head read keeps the
  operator's cost per head a function of (tokens, head_dim), as core_flops must be.
- Hydra removes the diagonal by rolling each scan's output one token, so that row i reads C_{i-1}
  and decays over (j, i-1]; here row i keeps its own query and the decays over (j, i] (the
  paper's quasiseparable matrix with its diagonal removed): the same family for a C learned from
  scratch, but a copied query must stay on its own token.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from linvit.attention.base import AttentionOperator, float32_core
from linvit.ops.definitions import compute_dtype
from linvit.ops.gated_scan import chunked_core_flops, gated_scan, gated_scan_map

DT_INIT = 1.0 / 196        # one patch's weight in the average over a 14 x 14 grid
A_INIT = 0.25              # decay exp(-A_INIT) over DT_INIT^-1 tokens


class Mamba2Attention(AttentionOperator):
    name = "mamba2"
    cpp_sources = ("gated_scan.cpp",)
    family = "state space"
    map_kind = "signed"
    reference_max_tokens = 1024          # the reference path is a token-by-token loop
    init_notes = {
        "key_proj": "0: dt and the diagonal start data-independent",
        "dt_bias": f"softplus^-1({DT_INIT:.4g}): each token weighs like one patch of a 14 x 14 "
                   "average, so sum_j dt_j stays on the scale of an average",
        "A_log": f"log {A_INIT:g}: decay exp(-{A_INIT:g}) over 196 tokens, slow (attention-like)",
        "D": f"{DT_INIT:.4g}: the token itself counts like one more token of the average",
    }

    def build(self, device=None, dtype=None):
        dd = {"device": device, "dtype": dtype}
        H, d = self.num_heads, self.head_dim
        # per head, the key's weights of dt_F, dt_B and the diagonal: (H, d, 3)
        self.key_proj = nn.Parameter(torch.zeros(H, d, 3, **dd))
        inv_softplus = DT_INIT + math.log(-math.expm1(-DT_INIT))
        self.dt_bias = nn.Parameter(torch.full((2, H), inv_softplus, **dd))
        self.A_log = nn.Parameter(torch.full((H,), math.log(A_INIT), **dd))
        self.D = nn.Parameter(torch.full((H,), DT_INIT, **dd))

    def gates(self, k: torch.Tensor):
        """(log-decays, dt), each (2, B, H, N, 1) (forward, backward), and the diagonal term
        (B, H, N, 1), read from the keys."""
        dtype = compute_dtype(k)
        read = torch.einsum("bhnd,hde->ebhn", k, self.key_proj.to(k.dtype)).to(dtype)
        read = read + torch.cat([self.dt_bias, self.D[None]]).to(dtype)[:, None, :, None]
        dt = F.softplus(read[:2]).unsqueeze(-1)                                  # (2, B, H, N, 1)
        A = -self.A_log.to(dtype).exp().view(1, 1, -1, 1, 1)
        return dt * A, dt, read[2].unsqueeze(-1)

    @float32_core
    def global_mix(self, q, k, v):
        log_a, dt, diagonal = self.gates(k)
        scans = gated_scan(q, k, v, log_a, key_scale=dt, strict=True, scale=self.scale)
        return (scans.to(diagonal.dtype) + diagonal * v.to(diagonal.dtype)).to(v.dtype)

    @float32_core(cast_back=False)
    def attention_map(self, q, k):
        log_a, dt, diagonal = self.gates(k)
        scans = gated_scan_map(q, k, log_a, key_scale=dt, strict=True, scale=self.scale)
        return (scans + torch.diag_embed(diagonal.squeeze(-1))).float()

    @classmethod
    def core_flops(cls, tokens, head_dim):
        # per head and token the key's three reads (dt_F, dt_B, the diagonal: 2 d each), then the
        # scans; the diagonal's product with v is elementwise
        return 6.0 * tokens * head_dim + chunked_core_flops(tokens, head_dim, head_dim, scalar=True)
