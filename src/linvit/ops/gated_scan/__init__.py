"""Bidirectional gated linear attention: tensors in, tensors out (GLA's and Mamba-2/SSD's core).

Per head, with log-decays log a_i per key channel (GLA) or one per head (SSD), the forward scan is

    S_i = diag(a_i) S_{i-1} + k_i v_i^T,    o_i = q_i^T S_i        (inclusive: j <= i)

and the backward scan the same recursion run from the last token with its own log-decays. In map
form, with b_i = sum_{t<=i} log a_t (forward) and c_i = sum_{t>=i} log a_t (backward):

    M_F[i, j] = [j <= i] sum_d q_id k_jd exp(b_id - b_jd)
    M_B[i, j] = [j >= i] sum_d q_id k_jd exp(c_id - c_jd)

`gated_scan` returns scale (o_F + o_B) = scale (M_F + M_B) V, `gated_scan_map` the map. Both
directions' inputs come stacked on a leading axis of 2: log_a (2, B, H, N, Dk or 1), the log-decays
being decay_scale * log_a; key_scale (2, B, H, N, 1) multiplies each direction's keys (SSD's dt).
With strict=True the diagonal is left out (j < i, j > i: SSD as Hydra's quasiseparable mixer).

Paths, picked by `gated_path` (linvit.ops.paths):
  reference  the recurrence token by token: the readable definition (slow: N steps);
  torch      chunked: exact within chunks of at most CHUNK tokens (ops.chunks.chunk_size), a state
             carried between them, time and memory linear in N; both directions at once on shared q,
             k, v, with the backward pass written out (_ChannelChunks, _ScalarChunks);
  cpp        the same chunks in linvit's C++ kernel (gated_scan/cpp.py, csrc/gated_scan.cpp):
             float32 on the CPU where it loads (per-channel decays without key scales, or scalar
             decays), both scans of a head chunk by chunk in cache;
  triton     fla's chunk_gla / chunk_simple_gla on CUDA when flash-linear-attention is installed,
             otherwise the chunked path (said once).

Numerics: computed in float32 (float64 kept for float64 inputs), cast back to v's dtype. Decays
enter as differences of cumulative log-gates, and every inter-chunk exponent is <= 0. Within a
chunk, scalar decays use the exact C x C matrix exp(b_i - b_j), masked before exp. Per-channel
decays use the factorisation (q e^b)(k e^-b)^T, which needs e^-b finite: they are floored at
-MAX_STEP_DECAY per token, in every path alike (a deliberate part of the definition), so that
|b| <= CHUNK * MAX_STEP_DECAY <= EXP_BOUND within a chunk whatever the gates.
"""
from __future__ import annotations

import torch

from linvit.ops import paths
from linvit.ops.chunks import chunk_size, padded_length
from linvit.ops.gated_scan.chunked import chunked_scan
from linvit.ops.gated_scan.cpp import cpp_scan
from linvit.ops.gated_scan.definition import (  # noqa: F401  (the definition's names, here too)
    CHUNK,
    EXP_BOUND,
    MAX_STEP_DECAY,
    directions,
    floor_decays,
    prepare,
)
from linvit.ops.gated_scan.fla import fla_refuses, fla_scan
from linvit.ops.gated_scan.map import gated_scan_map  # noqa: F401
from linvit.ops.gated_scan.reference import recurrence


def gated_scan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_a: torch.Tensor,
               key_scale: torch.Tensor | None = None, strict: bool = False, scale: float = 1.0,
               decay_scale: float = 1.0) -> torch.Tensor:
    """scale (o_F + o_B), (B, H, N, Dv) in v's dtype. q, k (B, H, N, Dk); v (B, H, N, Dv); log_a
    (2, B, H, N, Dk or 1), decay_scale > 0 and decay_scale * log_a <= 0; key_scale
    (2, B, H, N, 1) or None."""
    q32, k32, v32, log_a, scales = prepare(q, k, v, log_a, key_scale, decay_scale)
    path = gated_path(q32, log_a, scales)
    chunk = chunk_size(q.shape[2], CHUNK)
    if path == "reference":
        keys, decays = directions(k32, scales), decay_scale * log_a
        out = scale * (recurrence(q32, keys[0], v32, decays[0], strict, reverse=False)
                       + recurrence(q32, keys[1], v32, decays[1], strict, reverse=True))
    elif path == "triton":
        out = fla_scan(q32 * scale, directions(k32, scales), v32, decay_scale * log_a, strict)
    elif path == "cpp":
        out = cpp_scan(q32, k32, v32, log_a, scales, strict, scale, decay_scale, chunk)
    else:
        out = chunked_scan(q32, k32, v32, log_a, scales, strict, scale, decay_scale, chunk)
    return out.to(v.dtype)


def gated_path(q32: torch.Tensor, log_a: torch.Tensor, scales: torch.Tensor | None) -> str:
    """The path of one call (linvit.ops.paths): the C++ kernel takes float32 with scalar decays,
    or per-channel ones without key scales."""
    cpp = q32.dtype == torch.float32 and (log_a.shape[-1] == 1 or scales is None)
    return paths.choose("gated scan", q32, cpp, lambda: fla_refuses(q32, log_a))


def chunked_core_flops(tokens: int, dk: int, dv: int, scalar: bool = False) -> float:
    """Forward FLOPs of both directions of one head on the chunked path (multiply-add = 2), per
    chunk of C = chunk_size(tokens, CHUNK) tokens, padding counted: the states W = K^T V
    (2 C Dk Dv per direction), the inter-chunk outputs P E (2 C Dk Dv per direction), the
    intra-chunk matrices (per-channel: P K^T per direction, 2 C^2 Dk each; scalar: one q k^T,
    2 C^2 Dk) and their product with V (2 C^2 Dv, once), and the cumulative log-gates as
    triangular matmuls (2 C^2 per channel and direction). The state recursion, decays and masks
    are elementwise."""
    chunk, padded = padded_length(tokens, CHUNK)
    channels = 1 if scalar else dk
    scores = (1 if scalar else 2) * 2.0 * chunk * dk
    return padded * (8.0 * dk * dv + scores + 2.0 * chunk * dv + 4.0 * chunk * channels)
