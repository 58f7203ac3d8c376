"""The bidirectional delta rule (DeltaNet, arXiv 2406.06484): tensors in, tensors out.

Per head and scan direction, with unit keys k_t and write strengths beta_t in (0, 1):

    u_t = beta_t (v_t - S_{t-1}^T k_t),   S_t = S_{t-1} + k_t u_t^T,   o_t = s S_t^T q_t

i.e. S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T: each token overwrites what the state
recalls for its key (an online least-squares step) instead of adding to it, as linear attention
does. The backward direction runs the same recursion from the last token with its own betas, and
o = (o_F + J o_F(J q, J k, J v, J beta_B)) / 2, J the token flip.

Shapes: q, k (B, H, N, Dk), v (B, H, N, Dv), betas (B, H, N). Three paths, one signature:
  reference  the recursion token by token, both directions stacked in one batch: the definition;
  torch      chunked (WY form, below), the backward pass written out: the CPU default;
  triton     fla's `chunk_delta_rule` (optional flash-linear-attention, CUDA, bf16/fp16 inputs)
             on both directions stacked; anything else takes the chunked path, said once.
`delta_rule_map` forms the exact (B, H, N, N) map M with delta_rule(...) == M @ v.

Chunked form: within a chunk of C tokens the recursion is a unit lower-triangular system,
L N = diag(beta) (V - K S_in) with L = I + tril(diag(beta) K K^T, -1), so with T = L^-1 (one
batched triangular solve per chunk), W = T diag(beta) K and U = T diag(beta) V the chunk's values
are N = U - W S_in, the state leaves as S_in + K^T N and the outputs are Q S_in + tril(Q K^T) N.
Only the pass over chunks is sequential (two small matrix products per chunk). The backward
direction is the mirror image: upper triangles, chunks visited last to first. It runs on the same
chunks rather than on flipped copies, so both directions share Q K^T, K K^T and Q (S_F + S_B),
and no token order is ever reversed in memory. The backward pass is written out: autograd
through the chunk loop would keep and differentiate every per-chunk intermediate. On a CPU the
small per-chunk products are memory-bound, so fewer materialised tensors is what buys speed.

Numerics: the cores compute in float32 (float64 when given float64, so the tests can hold the
paths to each other tightly) and cast back to v's dtype. The map is formed in the same precision.
"""
from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F

from linvit.ops.backends import resolve_backend
from linvit.ops.bidirectional import (
    fla_kernel,
    from_fla,
    split_directions,
    stack_directions,
    to_fla,
)
from linvit.ops.chunks import chunk_bmm
from linvit.ops.definitions import compute_dtype

log = logging.getLogger("linvit")

# Tokens per chunk: the O(N C d) intra-chunk products against the N / C sequential steps of the
# chunk loop; at d = 64 on a 2-core CPU 32 ran faster than 48 or 64. Any N works (padding).
CHUNK = 32
FLA_DTYPES = (torch.bfloat16, torch.float16)          # fla's chunk_delta_rule refuses float32


def delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta_forward: torch.Tensor,
               beta_backward: torch.Tensor, scale: float) -> torch.Tensor:
    """o = (o_F + o_B) / 2 of the two delta-rule scans; keys should have unit norm."""
    name = resolve_backend(q)
    if name == "reference":
        return _reference(q, k, v, beta_forward, beta_backward, scale)
    if name == "triton" and _fla_takes(q):
        return _fla(q, k, v, beta_forward, beta_backward, scale)
    return _chunked(q, k, v, beta_forward, beta_backward, scale)


def delta_rule_map(q: torch.Tensor, k: torch.Tensor, beta_forward: torch.Tensor,
                   beta_backward: torch.Tensor, scale: float) -> torch.Tensor:
    """The (B, H, N, N) map M with delta_rule(q, k, v, ...) == M @ v: exact, as the layer is
    linear in v given q, k and beta. M = (M_F + J M_F[Jq, Jk, J beta_B] J) / 2."""
    dtype = compute_dtype(q)
    q, k, beta_forward, beta_backward = (t.to(dtype) for t in (q, k, beta_forward, beta_backward))
    forward = _causal_map(q, k, beta_forward, scale)
    backward = _causal_map(q.flip(2), k.flip(2), beta_backward.flip(2), scale).flip(2, 3)
    return (forward + backward) / 2


def _causal_map(q, k, beta, scale):
    """M_F = tril(s Q K^T) (I + diag(beta) tril(K K^T, -1))^-1 diag(beta), (B, H, N, N)."""
    lower = torch.tril(k @ k.mT, -1) * beta[..., :, None]           # I implied: unitriangular
    scores = torch.tril(q @ k.mT) * scale
    solved = torch.linalg.solve_triangular(lower, scores, upper=False, left=False,
                                           unitriangular=True)      # scores (I + lower)^-1
    return solved * beta[..., None, :]


# --- reference: the recursion as written -------------------------------------------------------
def _reference(q, k, v, beta_forward, beta_backward, scale):
    dtype = compute_dtype(q)
    both = [stack_directions(t, t).to(dtype) for t in (q, k, v)]
    betas = stack_directions(beta_forward, beta_backward).to(dtype)
    forward, backward = split_directions(_recurrence(*both, betas, scale))
    return ((forward + backward) / 2).to(v.dtype)


def _recurrence(q, k, v, beta, scale):
    """One causal scan, token by token."""
    B, H, N, dk = q.shape
    state = q.new_zeros(B, H, dk, v.shape[-1])                        # S, (B, H, Dk, Dv)
    out = []
    for t in range(N):
        k_t = k[:, :, t]
        recalled = torch.einsum("bhk,bhkv->bhv", k_t, state)          # S^T k_t
        u_t = beta[:, :, t, None] * (v[:, :, t] - recalled)
        state = state + k_t[..., :, None] * u_t[..., None, :]
        out.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, :, t], state))
    return torch.stack(out, dim=2)


# --- GPU: fla's chunk kernel on both directions stacked -----------------------------------------
def _fla_takes(q: torch.Tensor) -> bool:
    if fla_kernel("delta_rule", "chunk_delta_rule") is None:
        _warn_fallback("flash-linear-attention is not installed")
    elif not q.is_cuda:
        _warn_fallback("fla kernels need CUDA tensors")
    elif q.dtype not in FLA_DTYPES:
        _warn_fallback(f"fla's chunk_delta_rule takes bf16/fp16 only, not {q.dtype}")
    else:
        return True
    return False


@functools.cache
def _warn_fallback(reason: str) -> None:
    """Cached: said once per reason, not on every layer of every step."""
    log.warning("delta rule: %s; using the chunked PyTorch path", reason)


def _fla(q, k, v, beta_forward, beta_backward, scale):
    kernel = fla_kernel("delta_rule", "chunk_delta_rule")
    q, k, v = (to_fla(stack_directions(t, t)) for t in (q, k, v))    # (2B, N, H, d)
    beta = stack_directions(beta_forward, beta_backward).transpose(1, 2).contiguous()
    # q and k arrive normalised (and q scaled) by the operator: fla must not normalise again
    out, _ = kernel(q, k, v, beta.to(q.dtype), scale=scale, use_qk_l2norm_in_kernel=False)
    forward, backward = split_directions(from_fla(out).float())
    return ((forward + backward) / 2).to(v.dtype)


# --- chunked: the CPU path -----------------------------------------------------------------------
def _chunked(q, k, v, beta_forward, beta_backward, scale):
    B, H, N, _ = q.shape
    chunk = CHUNK                   # read at call time, so the tests can vary it
    n = -(-N // chunk)
    dtype = compute_dtype(q)
    stack, merge = _direction_indices(B * H, n, chunk, q.device)

    def padded(t):                  # zero-padded to n*C tokens: k = 0 and beta = 0 write nothing
        t = t.to(dtype)
        return t if n * chunk == N else F.pad(t, (0, 0, 0, n * chunk - N))

    def both(t):                    # (B, H, N, d) -> (n, 2BH, C, d): both scans' chunks
        rows = padded(t).reshape(-1, t.shape[-1])
        return _Reindex.apply(rows, stack, merge).view(n, 2 * B * H, chunk, -1)

    betas = padded(torch.stack((beta_forward, beta_backward), dim=-1)).reshape(B * H, n, chunk, 2)
    betas = torch.cat((betas[..., 0], betas[..., 1].flip(1, 2))).transpose(0, 1)[..., None]
    out = _ChunkedDeltaRule.apply(both(q * (scale / 2)), both(k), both(v), betas.contiguous())
    out = _Reindex.apply(out.flatten(0, 2), merge, stack)          # o_F + o_B in token rows
    return out.view(B, H, n * chunk, -1)[:, :, :N].to(v.dtype)


@functools.lru_cache(maxsize=16)
def _direction_indices(heads, n, chunk, device):
    """Row indices between token rows (heads * n*C, d) and both scans' chunks (n, 2 heads, C, d),
    the second `heads` of them on the reversed sequence: `stack` gathers the chunks' rows, and
    `merge` (2, heads * n*C) the two rows of each token, forward then backward, to be summed."""
    tokens = torch.arange(n * chunk, device=device).view(n, 1, chunk)
    first = torch.arange(heads, device=device).view(1, heads, 1) * (n * chunk)
    stack = torch.cat((first + tokens, first + (n * chunk - 1 - tokens)), dim=1).flatten()
    merge = torch.empty(2, heads * n * chunk, dtype=torch.long, device=device)
    slots = torch.arange(stack.numel(), device=device).view(n, 2, -1)
    for half in range(2):
        merge[half, stack.view(n, 2, -1)[:, half].flatten()] = slots[:, half].flatten()
    return stack[None], merge


class _Reindex(torch.autograd.Function):
    """out[r] = sum_i x[index[i, r]] over rows; the backward pass is the same with `adjoint`, the
    index of the transposed map (stacking both scans' copies of a token <-> summing them)."""

    @staticmethod
    def forward(ctx, x, index, adjoint):
        ctx.adjoint = adjoint
        return _gather_rows(x, index)

    @staticmethod
    def backward(ctx, grad):
        return _gather_rows(grad, ctx.adjoint), None, None


def _gather_rows(x, index):
    out = x.index_select(0, index[0])
    for more in index[1:]:
        out.add_(x.index_select(0, more))
    return out


class _ChunkedDeltaRule(torch.autograd.Function):
    """One causal scan, chunked: q, k (n, G, C, Dk), v (n, G, C, Dv), beta (n, G, C, 1) chunk-major,
    G independent heads (here both directions of B*H heads). Returns Q S_in + P N, (n, G, C, Dv).

    The backward pass (Z = T^T dN, dN the values' gradient after the loop over chunks):
      dV = beta Z,  dK = N G_out^T - beta (Z S_in^T) - (X + X^T) K + dP^T Q,
      X = diag(beta) tril(Z N^T, -1),  dQ = dO S_in^T + dP K,  dP = tril(dO N^T),
      dbeta = Z.V - K.(Z S_in^T) - rowsum(tril(Z N^T, -1) * K K^T)
    where G_out is the gradient of the state leaving each chunk (a loop over chunks, last first).
    """

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)   # float32 under autocast
    def forward(ctx, q, k, v, beta):
        lower = (k @ k.mT).tril_(-1)                        # K K^T below the diagonal
        t, w, u = _wy(lower, k, v, beta)
        p = (q @ k.mT).tril_()                              # what each query sees in its chunk
        out = torch.empty_like(v)
        states, new = _scan(w, u, k, q, out)                # out = Q S_in
        _matmul_add(out, p, new)
        ctx.save_for_backward(q, k, v, beta, lower, t, w, states, new, p)
        return out

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, do):
        q, k, v, beta, lower, t, w, states, new, p = ctx.saved_tensors
        dp = (do @ new.mT).tril_()
        dnew = p.mT @ do
        dk = _scan_grad(k, w, q, do, new, dnew)             # N G_out^T; completes dnew
        z = t.mT @ dnew                                     # (n, G, C, Dv)
        zn = (z @ new.mT).tril_(-1)                         # -(gradient of L), its free part
        zs = chunk_bmm(z, states.mT, dnew)                   # dnew is spent: reuse its memory
        dbeta = _dot(z, v) - _dot(k, zs) - _dot(zn, lower)
        dk.addcmul_(zs, beta, value=-1)
        x = zn.mul_(beta)
        _matmul_add(dk, x + x.mT, k, alpha=-1)
        _matmul_add(dk, dp.mT, q)
        dq = _matmul_add(chunk_bmm(do, states.mT, zs), dp, k)
        return dq, dk, z.mul_(beta), dbeta


def _wy(lower, k, v, beta):
    """T = (I + diag(beta) tril(K K^T, -1))^-1 per chunk, W = T diag(beta) K, U = T diag(beta) V."""
    a = lower * beta
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device).expand_as(a)
    t = torch.linalg.solve_triangular(a, eye, upper=False, unitriangular=True)  # I implied in a
    tb = torch.mul(t, beta.mT, out=a)
    return t, tb @ k, tb @ v


def _scan(w, u, k, q, out):
    """The loop over chunks: the states entering each chunk (n, G, Dk, Dv), the chunk's values
    N = U - W S_in, written over u (n, G, C, Dv), which nothing needs afterwards, and Q S_in,
    written into out while the state is in cache."""
    n = u.shape[0]
    states = u.new_empty(n, u.shape[1], k.shape[-1], u.shape[-1])
    states[0].zero_()
    s = states.unbind(0)
    for i, (w_i, u_i, k_i, q_i, o_i) in enumerate(zip(w, u, k, q, out)):
        u_i.baddbmm_(w_i, s[i], alpha=-1)                  # N = U - W S_in
        torch.bmm(q_i, s[i], out=o_i)
        if i + 1 < n:                                       # the last state reaches no output
            torch.baddbmm(s[i], k_i.mT, u_i, out=s[i + 1])
    return states, u


def _scan_grad(k, w, q, do, new, dnew):
    """The loop of `_scan` backwards, last chunk first, with G the gradient of the state leaving
    the chunk (kept in cache, never stored): dN += K G, returns N G^T (n, G, C, Dk) per chunk;
    then G becomes the gradient of the state entering it, G + Q^T dO - W^T dN."""
    g = dnew.new_zeros(dnew.shape[1], k.shape[-1], dnew.shape[-1])
    dk = torch.empty_like(k)
    steps = list(zip(k, w, q, do, new, dnew, dk))
    for k_i, w_i, q_i, do_i, n_i, dn_i, dk_i in reversed(steps):
        dn_i.baddbmm_(k_i, g)
        torch.bmm(n_i, g.mT, out=dk_i)
        g.baddbmm_(q_i.mT, do_i).baddbmm_(w_i.mT, dn_i, alpha=-1)
    return dk


def _matmul_add(acc, a, b, alpha: float = 1.0):
    """acc + alpha a @ b over the (n, G) batch, accumulated in place."""
    acc.flatten(0, 1).baddbmm_(a.flatten(0, 1), b.flatten(0, 1), alpha=alpha)
    return acc


def _dot(a, b):
    """Row-wise dot products (..., C, d), (..., C, d) -> (..., C, 1)."""
    return torch.linalg.vecdot(a, b).unsqueeze(-1)         # einsum: a (1 x d)(d x 1) bmm per row
