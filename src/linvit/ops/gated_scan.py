"""Bidirectional gated linear attention: tensors in, tensors out (GLA's and Mamba-2/SSD's core).

Per head, with log-decays log_a (B, H, N, Dk) per key channel (GLA) or (B, H, N, 1) per head
(SSD), the forward scan is

    S_i = diag(a_i) S_{i-1} + k_i v_i^T,    o_i = q_i^T S_i        (inclusive: j <= i)

and the backward scan the same recursion run from the last token with its own log-decays. In map
form, with b_i = sum_{t<=i} log a_t (forward) and c_i = sum_{t>=i} log a_t (backward):

    M_F[i, j] = [j <= i] sum_d q_id k_jd exp(b_id - b_jd)
    M_B[i, j] = [j >= i] sum_d q_id k_jd exp(c_id - c_jd)

`gated_scan` returns o_F + o_B = (M_F + M_B) V; callers fold any weight into q. With
strict=True the diagonal is left out of both (j < i, j > i: SSD as Hydra's quasiseparable mixer);
`key_scale` = (w_F, w_B), each (B, H, N, 1), multiplies the keys of each direction (SSD's dt).

Paths, picked by linvit.ops.linear_attention.resolve_backend:
  reference  the recurrence token by token: the readable definition (slow, O(N) steps);
  torch      chunked: exact within chunks of CHUNK tokens, a state carried between them; time and
             memory linear in N; both directions in one batch (stack_directions);
  triton     fla's chunk_gla / chunk_simple_gla on CUDA when flash-linear-attention is installed,
             otherwise the chunked path (said once).
`gated_scan_map` forms M_F + M_B explicitly.

Numerics: computed in float32 (float64 kept for float64 inputs) and cast back to v's dtype.
Decays enter only as differences of cumulative log-gates, exponentiated after subtracting, so
inter-chunk exponents are always <= 0. Per-channel log-decays are floored at -MAX_STEP_DECAY per
token, in every path alike: within a chunk, sum_d q_id k_jd exp(b_id - b_jd) is computed as a
matmul of q exp(b - b_ref) and k exp(b_ref - b), and the floor bounds both exponents by
EXP_BOUND, whatever the gates. Scalar decays need no floor (the C x C decay matrix is exact).
"""
from __future__ import annotations

import functools
import inspect
import logging
import math

import torch

from linvit.ops.bidirectional import (
    TOKENS,
    fla_kernel,
    from_fla,
    split_directions,
    stack_directions,
    to_fla,
)
from linvit.ops.linear_attention import resolve_backend

log = logging.getLogger("linvit")

CHUNK = 32                 # tokens per chunk of the torch path (measured: see the report / bench)
MAX_STEP_DECAY = 2.0       # per-channel log-decays are floored at -2 per token (a ~ 0.135)
EXP_BOUND = 32.0           # |exponent| of the factorised intra-chunk terms: e^32 ~ 8e13
REF = (CHUNK - 1) // 2     # the reference token of the factorisation: mid-chunk halves its range
# |b_i - b_REF| <= (tokens between i and REF) * MAX_STEP_DECAY for every i in a chunk.
assert max(REF, CHUNK - 1 - REF) * MAX_STEP_DECAY <= EXP_BOUND, "chunk too long for the floor"


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """float32 for half precision (sums over thousands of tokens need its bits), float64 kept."""
    return torch.promote_types(t.dtype, torch.float32)


def floor_decays(log_a: torch.Tensor) -> torch.Tensor:
    """The definition's floor: per-channel log-decays below -MAX_STEP_DECAY are raised to it."""
    return log_a if log_a.shape[-1] == 1 else log_a.clamp_min(-MAX_STEP_DECAY)


def _prepare(q, k, log_a, key_scale, dtype):
    """(q, (k_F, k_B), (la_F, la_B)) in `dtype`, keys weighted, per-channel decays floored."""
    q, k = q.to(dtype), k.to(dtype)
    keys = (k, k) if key_scale is None else tuple(k * w.to(dtype) for w in key_scale)
    decays = tuple(floor_decays(la.to(dtype)) for la in log_a)
    return q, keys, decays


def gated_scan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               log_a: tuple[torch.Tensor, torch.Tensor],
               key_scale: tuple[torch.Tensor, torch.Tensor] | None = None,
               strict: bool = False) -> torch.Tensor:
    """o_F + o_B, (B, H, N, Dv) in v's dtype. q, k (B, H, N, Dk); v (B, H, N, Dv); log_a the
    (forward, backward) log-decays, each (B, H, N, Dk) or (B, H, N, 1), <= 0."""
    dtype = compute_dtype(v)
    q, keys, decays = _prepare(q, k, log_a, key_scale, dtype)
    v32 = v.to(dtype)
    name = resolve_backend(q)
    if name == "reference":
        out = (_recurrence(q, keys[0], v32, decays[0], strict, reverse=False)
               + _recurrence(q, keys[1], v32, decays[1], strict, reverse=True))
    elif name == "triton" and _fla_usable(q, decays[0]):
        out = _fla_scan(q, keys, v32, decays, strict)
    else:
        stacked = _chunked(stack_directions(q, q), stack_directions(*keys),
                           stack_directions(v32, v32), stack_directions(*decays), strict)
        forward, backward = split_directions(stacked)
        out = forward + backward
    return out.to(v.dtype)


# --- reference: the recurrence, token by token ----------------------------------------------
def _recurrence(q, k, v, log_a, strict: bool, reverse: bool) -> torch.Tensor:
    B, H, N, Dk = q.shape
    state = q.new_zeros(B, H, Dk, v.shape[-1])                       # S, (B, H, Dk, Dv)
    out = [None] * N
    for i in (reversed(range(N)) if reverse else range(N)):
        state = log_a[:, :, i].exp().unsqueeze(-1) * state           # diag(a_i) S
        if strict:                                                    # o_i before k_i v_i^T
            out[i] = (q[:, :, i].unsqueeze(-2) @ state).squeeze(-2)
        state = state + k[:, :, i].unsqueeze(-1) * v[:, :, i].unsqueeze(-2)
        if not strict:
            out[i] = (q[:, :, i].unsqueeze(-2) @ state).squeeze(-2)
    return torch.stack(out, dim=TOKENS)


# --- torch: chunked ----------------------------------------------------------------------------
def _chunked(q, k, v, log_a, strict: bool) -> torch.Tensor:
    """The causal scan of a batch (both directions stacked): (B, H, N, Dv)."""
    B, H, N, _ = q.shape
    n = -(-N // CHUNK)
    pad = n * CHUNK - N            # zero keys add nothing; the padded tail is cut off at the end
    q, k, v, log_a = (torch.nn.functional.pad(t, (0, 0, 0, pad)).unflatten(TOKENS, (n, CHUNK))
                      for t in (q, k, v, log_a))                     # (B, H, n, C, .)
    b = log_a.cumsum(3)                # decay from the chunk's start through token i, <= 0
    last = b[:, :, :, -1:]             # the whole chunk's decay, (B, H, n, 1, Dk|1)
    # between chunks: each chunk's keys decayed to its end, summed into a state passed on
    k_end = k * (last - b).exp()
    states = chunk_states(k_end.transpose(-1, -2) @ v, last.transpose(-1, -2).exp())
    out = (q * b.exp()) @ states                                     # (B, H, n, C, Dv)
    out = out + _intra_chunk(q, k, b, strict) @ v
    return out.flatten(2, 3)[:, :, :N]


def _intra_chunk(q, k, b, strict: bool) -> torch.Tensor:
    """(B, H, n, C, C): sum_d q_id k_jd exp(b_id - b_jd) for j <= i (j < i if strict), else 0."""
    C = q.shape[3]
    mask = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(-1 if strict else 0)
    if b.shape[-1] == 1:               # scalar: the exponent is masked before exp, so exact
        decay = torch.where(mask, b - b.transpose(-1, -2), -math.inf).exp()
        return (q @ k.transpose(-1, -2)) * decay
    ref = b[:, :, :, REF:REF + 1]      # both exponents bounded by EXP_BOUND (see the top)
    scores = (q * (b - ref).exp()) @ (k * (ref - b).exp()).transpose(-1, -2)
    return torch.where(mask, scores, 0.0)


def chunk_states(inputs: torch.Tensor, decay: torch.Tensor) -> torch.Tensor:
    """The state entering each chunk: E_0 = 0, E_c = decay_{c-1} * E_{c-1} + inputs_{c-1}.
    inputs (B, H, n, Dk, Dv); decay (B, H, n, Dk|1, 1), in [0, 1]."""
    return _ChunkStates.apply(inputs, decay)


class _ChunkStates(torch.autograd.Function):
    """The one sequential part of the chunked path, as a loop over chunks writing in place: an
    autograd graph of 2n small nodes would cost more than the arithmetic."""

    @staticmethod
    def forward(ctx, inputs, decay):
        states = torch.zeros_like(inputs)
        for c in range(1, inputs.shape[2]):
            torch.addcmul(inputs[:, :, c - 1], decay[:, :, c - 1], states[:, :, c - 1],
                          out=states[:, :, c])
        ctx.save_for_backward(decay, states)
        return states

    @staticmethod
    def backward(ctx, grad):
        decay, states = ctx.saved_tensors
        # R_c = dL/dE_c through every later state: R_c = grad_c + decay_c * R_{c+1}
        total = grad.clone()
        for c in range(grad.shape[2] - 2, -1, -1):
            total[:, :, c].addcmul_(decay[:, :, c], total[:, :, c + 1])
        grad_inputs = torch.zeros_like(grad)
        grad_inputs[:, :, :-1] = total[:, :, 1:]                    # E_{c+1} reads inputs_c
        grad_decay = torch.zeros_like(decay)
        grad_decay[:, :, :-1] = (total[:, :, 1:] * states[:, :, :-1]).sum_to_size(
            decay[:, :, :-1].shape)
        return grad_inputs, grad_decay


# --- explicit map ------------------------------------------------------------------------------
def gated_scan_map(q: torch.Tensor, k: torch.Tensor, log_a: tuple[torch.Tensor, torch.Tensor],
                   key_scale: tuple[torch.Tensor, torch.Tensor] | None = None,
                   strict: bool = False) -> torch.Tensor:
    """M_F + M_B, (B, H, N, N), in float32 (float64 for float64 inputs): o = map @ v."""
    dtype = compute_dtype(q)
    q, keys, decays = _prepare(q, k, log_a, key_scale, dtype)
    N = q.shape[2]
    lower = torch.ones(N, N, dtype=torch.bool, device=q.device).tril(-1 if strict else 0)
    # cumulative sums in float64: over thousands of tokens float32 loses the small differences
    # that near-diagonal entries need
    b = decays[0].double().cumsum(TOKENS)
    c = decays[1].double().flip(TOKENS).cumsum(TOKENS).flip(TOKENS)
    return (_direction_map(q, keys[0], b, lower) + _direction_map(q, keys[1], c, lower.T))


def _direction_map(q, k, b, mask) -> torch.Tensor:
    """sum_d q_id k_jd exp(b_id - b_jd) where mask, else 0 (exponent masked before exp)."""
    if b.shape[-1] == 1:
        diff = torch.where(mask, b - b.transpose(-1, -2), -math.inf)
        return (q @ k.transpose(-1, -2)) * diff.to(q.dtype).exp()
    B, H, N, Dk = q.shape
    out = q.new_zeros(B, H, N, N)
    step = max(1, 2 ** 24 // (B * H * N * N))       # channels at a time: bounded memory
    for s in range(0, Dk, step):
        bs = b[..., s:s + step]
        diff = torch.where(mask[..., None], bs.unsqueeze(3) - bs.unsqueeze(2), -math.inf)
        out = out + torch.einsum("bhid,bhjd,bhijd->bhij", q[..., s:s + step], k[..., s:s + step],
                                 diff.to(q.dtype).exp())
    return out


# --- triton backend: fla's causal chunk kernels, both directions in one call ---------------------
def _fla_usable(q: torch.Tensor, log_a: torch.Tensor) -> bool:
    name = "chunk_simple_gla" if log_a.shape[-1] == 1 else "chunk_gla"
    if not q.is_cuda:
        _warn_no_fla("tensors are not on CUDA")
        return False
    if fla_kernel(name.removeprefix("chunk_"), name) is None:
        _warn_no_fla("flash-linear-attention is not installed")
        return False
    return True


@functools.cache
def _warn_no_fla(reason: str) -> None:
    log.warning("gated scan: %s; using the chunked PyTorch path", reason)


def _fla_scan(q, keys, v, decays, strict: bool) -> torch.Tensor:
    qs, ks = stack_directions(q, q), stack_directions(*keys)
    vs, gs = stack_directions(v, v), stack_directions(*decays)
    if strict:
        # o_i = sum_{j<i} ... exp(b_i - b_j): an inclusive scan of keys and values shifted one
        # token later, the key carrying the step's decay a_{j+1} that the shift skips
        ks = _shift(ks) * gs.exp()
        vs = _shift(vs)
    scalar = gs.shape[-1] == 1
    module, name = ("simple_gla", "chunk_simple_gla") if scalar else ("gla", "chunk_gla")
    kernel = fla_kernel(module, name)
    g = to_fla(gs).squeeze(-1) if scalar else to_fla(gs)       # [B, T, H] or [B, T, H, K]
    extra = {"head_first": False} if "head_first" in inspect.signature(kernel).parameters else {}
    out, _ = kernel(to_fla(qs), to_fla(ks), to_fla(vs), g=g, scale=1.0, **extra)
    forward, backward = split_directions(from_fla(out))
    return forward + backward


def _shift(t: torch.Tensor) -> torch.Tensor:
    """Tokens moved one later, a zero first: (B, H, N, d)."""
    return torch.nn.functional.pad(t, (0, 0, 1, 0))[:, :, :-1]


def chunked_core_flops(tokens: int, dk: int, dv: int) -> float:
    """Forward FLOPs of both directions of one head on the chunked path: per chunk of C tokens
    the C x C scores (2 C^2 Dk) and their product with V (2 C^2 Dv); per token the chunk state
    k^T v and the inter-chunk output q S (2 Dk Dv each). The state recursion and the decays are
    elementwise."""
    padded = -(-tokens // CHUNK) * CHUNK
    return 2 * (2.0 * padded * CHUNK * (dk + dv) + 4.0 * padded * dk * dv)
