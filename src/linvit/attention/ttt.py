"""The ViT^3 test-time-training layer (arXiv 2512.01643; LeapLabTHU/ViTTT, ttt_block.py).

Keys and values train two small inner modules for one step, and the queries read the result:

    x1  per head, an inner SwiGLU f(x) = (x W1) * SiLU(x W2) (W1, W2: d x d) takes one gradient
        step (lr 1) on L = -(s/N) sum_j <f(k_j), v_j>, each gradient column divided by its norm
        + 1; x1 = f'(q) (global_mix, linvit.ops.ttt.ttt_swiglu);
    x2  a d-wide branch: q2, k2, v2 train a 3x3 depthwise kernel the same way on the patch grid,
        x2 = conv(q2, kernel');
    out = proj(x1 + P x2), P: Linear(d, C), zero at init.

s = 9^-1/2, ViT^3's value (the branch's "equivalent head dim" 1 x 3 x 3; the ViTTT code notes
that d^-1/2 does as well): option `inner_scale`. Cost of x1: 12 N d^2 FLOPs per head (six (N, d) x
(d, d) matmuls), no kernel needed; the branch adds 8 N C d for its four projections.

Deliberate differences from the ViTTT code, so that a softmax checkpoint copies one-to-one:
- qkv stays Linear(C, 3C). ViT^3 draws q2, k2, v2 from 3d extra rows of qkv; here they are
  Linear(C, d) maps of the copied q, k, v (merged heads). q = W_q x + b_q with W_q square and
  generically invertible, so A q + c ranges over the same affine maps of x as ViT^3's extra rows
  (with qk_norm on, the branch reads the normed q, k instead).
- proj stays Linear(C, C). ViT^3's proj([x1, x2]) is Linear(C + d, C); proj(x1 + P x2) is that
  with the extra columns equal to proj.weight @ P, so P = 0 is ViT^3's proj with its extra
  columns zeroed, and a fresh block is the copied projection of x1.
- The branch runs on the patch tokens only; prefix (cls) tokens get x2 = 0 and are left out of
  its inner loss (their mean is over the h*w patches). The SwiGLU branch sees every token.
- Init (ViTTT: trunc_normal(0.02) everywhere, a near-zero layer) is chosen per parameter, see
  build() and init_notes. No RoPE (the ViT keeps its own position embedding). The inner steps
  run in float32 even under bf16 autocast, as every core here does.

attention_map is "effective": x1 is not linear in v. It is the channel mean of d x1 / d v at v = 0
(the first-order term of x1 in v), see linvit.ops.ttt.ttt_swiglu_map; the branch is left out, as
local terms are. With W1 = 0 (the init) the true x1 is, channel by channel, this linear term
scaled by the normaliser 1 / (||g_c|| + 1) of its gradient column.
"""
from __future__ import annotations

import torch
from torch import nn

from linvit.attention.base import AttentionOperator, float32_core
from linvit.ops.ttt import ttt_dwconv, ttt_swiglu, ttt_swiglu_map


class TTTAttention(AttentionOperator):
    name = "ttt"
    family = "test-time training"
    map_kind = "effective"
    options = {"inner_scale": 1 / 3}
    init_notes = {
        "swiglu_w1": "0: the inner gradient of W2 (which carries k W1) is then 0, the gate keeps "
                     "W2 = I and x1 is linear in v up to the gradient-column normalisers",
        "swiglu_w2": "I: the gates SiLU(q_c), SiLU(k_c) are each channel's own soft ReLU, so the "
                     "step mixes v by (q_i . k_j) weighted by them, the teacher's similarity",
        "conv_kernel": "0: the branch's kernel is exactly its test-time step (ViTTT's init "
                       "without its noise)",
        "branch_q": "N(0, 1/C) weight, bias 0: a random d-wide projection keeping the copied "
                    "stream's scale; non-zero so the branch can learn once branch_out moves",
        "branch_k": "N(0, 1/C) weight, bias 0 (as branch_q)",
        "branch_v": "N(0, 1/C) weight, bias 0 (as branch_q)",
        "branch_out": "0: the block starts as the copied proj of x1 (ViT^3's proj with its "
                      "extra columns zeroed)",
    }

    def build(self, device=None, dtype=None):
        H, d = self.num_heads, self.head_dim
        C, dd = H * d, {"device": device, "dtype": dtype}
        # W1 = 0, W2 = I: x1_ic = SiLU(q_ic) (s/N) r_c sum_j (q_i . k_j) SiLU(k_jc) v_jc, a linear
        # attention on the copied q . k gated per channel (r_c: the column's normaliser).
        self.swiglu_w1 = nn.Parameter(torch.zeros(1, H, d, d, **dd))
        self.swiglu_w2 = nn.Parameter(torch.eye(d, **dd).expand(1, H, d, d).clone())
        self.conv_kernel = nn.Parameter(torch.zeros(d, 1, 3, 3, **dd))
        self.branch_q, self.branch_k, self.branch_v = (nn.Linear(C, d, **dd) for _ in range(3))
        # No bias: proj's own bias already plays that part.
        self.branch_out = nn.Linear(d, C, bias=False, **dd)

    def init_parameters(self):
        C = self.num_heads * self.head_dim
        for lin in (self.branch_q, self.branch_k, self.branch_v):
            nn.init.normal_(lin.weight, std=C ** -0.5)
            nn.init.zeros_(lin.bias)
        nn.init.zeros_(self.branch_out.weight)

    @float32_core
    def global_mix(self, q, k, v):
        return ttt_swiglu(q, k, v, self.swiglu_w1, self.swiglu_w2, self.inner_scale)

    @float32_core(cast_back=False)
    def attention_map(self, q, k):
        return ttt_swiglu_map(q, k, self.swiglu_w1, self.swiglu_w2, self.inner_scale)

    def conv_branch(self, q, k, v) -> torch.Tensor:
        """x2 (B, N, d): the test-time-trained 3x3 depthwise conv of q2 on the patch grid, zero on
        the prefix tokens."""
        B, H, N, d = v.shape
        h, w = self.patch_grid(N)
        p = self.num_prefix_tokens

        def image(t, lin):                         # (B, N, C) -> (B, d, h, w), patches only
            return lin(self.merge_heads(t)[:, p:]).transpose(1, 2).reshape(B, d, h, w)

        q2, k2, v2 = image(q, self.branch_q), image(k, self.branch_k), image(v, self.branch_v)
        x2 = ttt_dwconv(q2, k2, v2, self.conv_kernel, self.inner_scale)
        x2 = x2.reshape(B, d, h * w).transpose(1, 2)
        return torch.cat([x2.new_zeros(B, p, d), x2], dim=1)

    def mix(self, q, k, v):
        """x1 + P x2 in the head layout, so that proj(merge_heads(.)) is proj(x1 + P x2)."""
        B, H, N, d = v.shape
        branch = self.branch_out(self.conv_branch(q, k, v))            # (B, N, C)
        return self.global_mix(q, k, v) + branch.reshape(B, N, H, d).transpose(1, 2)

    @classmethod
    def block_flops(cls, tokens, width, head_dim):
        """The conv branch's projections: q2, k2, v2 of the patches (C -> d) and P (d -> C)."""
        return 2.0 * (tokens - 1) * width * head_dim * 3 + 2.0 * tokens * head_dim * width

    @classmethod
    def core_flops(cls, tokens: int, head_dim: int) -> float:
        """Six (N, d) x (d, d) matmuls: k W1, k W2, the two gradients k^T (.), q W1', q W2'."""
        return 12.0 * tokens * head_dim ** 2
