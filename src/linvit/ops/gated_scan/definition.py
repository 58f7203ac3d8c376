"""The gated scan's definition shared by every path: chunk size, the per-channel decay floor, and
the inputs as each path takes them (see the package docstring)."""
from __future__ import annotations

import torch

from linvit.ops.definitions import compute_dtype

# 64 measured fastest on the CPU at N=4096 among 32, 64 and 128 (linvit bench): the C^2
# intra-chunk work grows with C, the states' traffic and the sequential loop shrink.
CHUNK = 64
MAX_STEP_DECAY = 1.0       # per-channel log-decays are floored at -1 per token (a >= 0.37)
EXP_BOUND = 64.0           # e^-b <= e^64 ~ 6e27 within a chunk (float32 overflows past e^88)
assert CHUNK * MAX_STEP_DECAY <= EXP_BOUND, "chunk too long for the per-channel decay floor"


def floor_decays(log_a: torch.Tensor, decay_scale: float = 1.0) -> torch.Tensor:
    """The definition's floor: per-channel log-decays decay_scale * log_a below -MAX_STEP_DECAY
    are raised to it. Off CUDA the clamp (and its backward) is skipped where nothing reaches the
    floor, the usual case; on CUDA it always runs, as asking would wait for the device."""
    floor = -MAX_STEP_DECAY / decay_scale
    if log_a.shape[-1] == 1 or not (log_a.is_cuda or log_a.min() < floor):
        return log_a
    return log_a.clamp_min(floor)


def prepare(q, k, v, log_a, key_scale, decay_scale):
    """q, k, v, log_a (floored) and key scales in the compute dtype."""
    dtype = compute_dtype(v)
    scales = None if key_scale is None else key_scale.to(dtype)
    return (q.to(dtype), k.to(dtype), v.to(dtype), floor_decays(log_a.to(dtype), decay_scale),
            scales)


def directions(k, key_scale):
    """The keys of each direction, (k_F, k_B)."""
    return (k, k) if key_scale is None else (k * key_scale[0], k * key_scale[1])
