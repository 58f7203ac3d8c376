"""What the chunked CPU paths (gated scan, delta rule) share: the chunk length for a sequence, and
products over (batch, chunk) axes."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def chunk_bmm(a: torch.Tensor, b: torch.Tensor, spent: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b over the two leading axes, (X, n, r, s) @ (X, n, s, t) -> (X, n, r, t), as one bmm.
    Written into `spent`, a buffer nothing needs any more, when it has the result's shape: fresh
    memory costs page faults that cost as much as the product. Not differentiable: for the
    autograd Functions' own forward and backward passes."""
    shape = (*a.shape[:-1], b.shape[-1])
    out = spent if spent is not None and spent.shape == shape else a.new_empty(shape)
    torch.bmm(a.flatten(0, 1), b.flatten(0, 1), out=out.flatten(0, 1))
    return out


def chunk_size(tokens: int, longest: int) -> int:
    """The chunk length for `tokens`: as few chunks as chunks of at most `longest` allow, evened
    out so that padding is under one token per chunk, since padded tokens cost as much as real
    ones: 50 tokens (28 px in 4 px patches) run as one chunk of 50, not 64 (timings:
    docs/2026-12-04-chunk-per-length.md)."""
    if tokens < 0 or longest < 1:
        raise ValueError(f"chunk_size: needs tokens >= 0 and longest >= 1, got {tokens}, {longest}")
    chunks = max(1, -(-tokens // longest))
    return max(1, -(-tokens // chunks))                  # 0 tokens: no chunk of any length


def padded_length(tokens: int, longest: int) -> tuple[int, int]:
    """(chunk, tokens padded to whole chunks): what a chunked path runs, for counting its FLOPs."""
    chunk = chunk_size(tokens, longest)
    return chunk, -(-tokens // chunk) * chunk


def chunk_rows(t: torch.Tensor, chunk: int) -> torch.Tensor:
    """(..., B, H, N, d) -> (..., B*H, n*C, d): the heads' token rows as the C++ kernels take
    them, zero-padded to whole chunks of `chunk` (the kernels' outputs are cut back to N)."""
    *lead, B, H, N, d = t.shape
    pad = -(-N // chunk) * chunk - N
    t = F.pad(t, (0, 0, 0, pad)) if pad else t
    return t.reshape(*lead, B * H, N + pad, d)
