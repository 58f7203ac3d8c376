"""The bidirectional delta rule (DeltaNet, arXiv 2406.06484): tensors in, tensors out.

Per head and scan direction, with unit keys k_t and write strengths beta_t in (0, 1):

    u_t = beta_t (v_t - S_{t-1}^T k_t),   S_t = S_{t-1} + k_t u_t^T,   o_t = s S_t^T q_t

i.e. S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T: each token overwrites what the state
recalls for its key (an online least-squares step) instead of adding to it, as linear attention
does. The backward direction runs the same recursion from the last token with its own betas, and
o = (o_F + J o_F(J q, J k, J v, J beta_B)) / 2, J the token flip.

Shapes: q, k (B, H, N, Dk), v (B, H, N, Dv), betas (B, H, N). Four paths, one signature, picked
by `delta_path` (linvit.ops.paths):
  reference  the recursion token by token, both directions stacked in one batch: the definition;
  torch      chunked (WY form, below), the backward pass written out (delta_rule/chunked.py):
             float64, or float32 without the kernel;
  cpp        the same chunks in linvit's C++ kernel (delta_rule/cpp.py, csrc/delta_rule.cpp):
             the CPU default for float32, with the chunk loop of both scans per head in cache;
  triton     fla's `chunk_delta_rule` (optional flash-linear-attention, CUDA, bf16/fp16 inputs)
             on both directions stacked; anything else takes the chunked path, said once.
`delta_rule_map` forms the exact (B, H, N, N) map M with delta_rule(...) == M @ v.

Chunked form: within a chunk of C tokens the recursion is a unit lower-triangular system,
L N = diag(beta) (V - K S_in) with L = I + tril(diag(beta) K K^T, -1), so with T = L^-1 (one
batched triangular solve per chunk), W = T diag(beta) K and U = T diag(beta) V the chunk's values
are N = U - W S_in, the state leaves as S_in + K^T N and the outputs are Q S_in + tril(Q K^T) N.
Only the pass over chunks is sequential (two small matrix products per chunk). The backward
direction is the mirror image: upper triangles, chunks visited last to first. The PyTorch path
runs it as the forward scan of the reversed sequence: both directions gathered by one index
into a stack of 2 B H heads, the backward half in reversed token order. The C++ kernel runs it
on the same chunks in place, its K K^T the forward scan's transposed. The backward pass is
written out: autograd through the chunk loop would keep and differentiate every per-chunk
intermediate. On a CPU the small per-chunk products are memory-bound, so fewer materialised
tensors is what buys speed.

Numerics: the cores compute in float32 (float64 when given float64, so the tests can hold the
paths to each other tightly) and cast back to v's dtype. The map is formed in the same precision.
"""
from __future__ import annotations

import torch

from linvit.ops import paths
from linvit.ops.chunks import chunk_size
from linvit.ops.definitions import compute_dtype
from linvit.ops.delta_rule.chunked import chunked_scan
from linvit.ops.delta_rule.cpp import cpp_scan
from linvit.ops.delta_rule.fla import fla_refuses, fla_scan
from linvit.ops.delta_rule.map import delta_rule_map  # noqa: F401
from linvit.ops.delta_rule.reference import reference

# The longest chunk: the O(N C d) intra-chunk products against the N / C sequential steps of the
# chunk loop (32 was picked over 48 and 64 by timing them at d = 64, N = 4096). Any N works:
# chunk_size evens N out over the fewest chunks of at most CHUNK tokens, padding the last.
CHUNK = 32


def delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta_forward: torch.Tensor,
               beta_backward: torch.Tensor, scale: float) -> torch.Tensor:
    """o = (o_F + o_B) / 2 of the two delta-rule scans; keys should have unit norm."""
    path = delta_path(q)
    if path == "reference":
        return reference(q, k, v, beta_forward, beta_backward, scale)
    if path == "triton":
        return fla_scan(q, k, v, beta_forward, beta_backward, scale)
    chunk = chunk_size(q.shape[2], CHUNK)
    if path == "cpp":
        return cpp_scan(q, k, v, beta_forward, beta_backward, scale, chunk)
    return chunked_scan(q, k, v, beta_forward, beta_backward, scale, chunk)


def delta_path(q: torch.Tensor) -> str:
    """The path of one call (linvit.ops.paths): the C++ kernel takes what computes in float32."""
    return paths.choose("delta rule", q, compute_dtype(q) == torch.float32,
                        lambda: fla_refuses(q))
