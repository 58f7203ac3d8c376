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

from linvit.ops.bidirectional import (
    fla_kernel,
    from_fla,
    split_directions,
    stack_directions,
    to_fla,
)
from linvit.ops.linear_attention import resolve_backend

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


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


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

    def chunks(t):                  # (B, H, N, d) -> (n, B*H, C, d), zero-padded to n*C tokens
        t = t.to(dtype)
        if n * chunk != N:          # padding: k = 0 and beta = 0 write nothing in either scan
            t = F.pad(t, (0, 0, 0, n * chunk - N))
        return t.reshape(B * H, n, chunk, t.shape[-1]).transpose(0, 1).contiguous()

    out = _ChunkedDeltaRule.apply(chunks(q), chunks(k), chunks(v), chunks(beta_forward[..., None]),
                                  chunks(beta_backward[..., None]), scale / 2)
    out = out.transpose(0, 1).reshape(B, H, n * chunk, -1)[:, :, :N]
    return out.to(v.dtype)


class _ChunkedDeltaRule(torch.autograd.Function):
    """Both scan directions on chunk-major tensors: q, k (n, G, C, Dk), v (n, G, C, Dv),
    betas (n, G, C, 1), G = B*H. Returns factor * (o_F + o_B), (n, G, C, Dv).

    The backward pass, per direction (Z = T^T dN, dN the values' gradient after the loop):
      dV = beta Z,  dK += N G_out^T - beta (Z S_in^T) - (X + X^T) K,  X = diag(beta) tri(Z N^T),
      dbeta = Z.V - K.(Z S_in^T) - rowsum(tri(Z N^T) * K K^T)
    where G_out is the gradient of the state leaving each chunk (a loop over chunks, last first),
    plus the terms of the outputs Q S_in + P N that both directions share.
    """

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)   # float32 under autocast
    def forward(ctx, q, k, v, beta_f, beta_b, factor):
        qk, kk = q @ k.mT, k @ k.mT                        # (n, G, C, C), shared by both scans
        out, saved = None, []
        for beta, rev in ((beta_f, False), (beta_b, True)):
            t, w, u = _wy(kk, k, v, beta, rev)
            states, new = _scan(w, u, k, rev)
            p = _triangle(qk, rev, strict=False)            # what each query sees in its chunk
            out = _matmul_add(out, p, new)
            saved += [beta, t, w, states, new, p]
        states_sum = saved[3] + saved[9]                    # S_F + S_B entering each chunk
        out = _matmul_add(out, q, states_sum).mul_(factor)
        ctx.save_for_backward(q, k, v, kk, states_sum, *saved)
        ctx.factor = factor
        return out

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad):
        q, k, v, kk, states_sum, *saved = ctx.saved_tensors
        do = grad * ctx.factor
        dq = do @ states_sum.mT
        qdo = q.mT @ do                                     # dL/dS_in from the outputs
        dqk = dk = dv = sym = None
        dbetas = []
        for j, rev in enumerate((False, True)):
            beta, t, w, states, new, p = saved[6 * j:6 * j + 6]
            dp = _triangle_(do @ new.mT, rev, strict=False)
            dqk = dp if dqk is None else dqk.add_(dp)
            dnew = p.mT @ do
            g_out = _scan_grad(k, w, qdo, dnew, rev)        # completes dnew in place
            dk = _matmul_add(dk, new, g_out.mT)
            z = t.mT @ dnew                                 # (n, G, C, Dv)
            zn = _triangle_(z @ new.mT, rev, strict=True)   # -(gradient of L), its free part
            zs = z @ states.mT
            dbetas.append(_dot(z, v) - _dot(k, zs) - _dot(zn, kk))
            dv = z.mul_(beta) if dv is None else dv.addcmul_(z, beta)
            dk.addcmul_(zs, beta, value=-1)
            x = zn.mul_(beta)                               # strictly lower (F) or upper (B)
            sym = x if sym is None else sym.add_(x.mT)      # X_F + X_B^T, strictly lower
        dq = _matmul_add(dq, dqk, k)
        dk = _matmul_add(dk, dqk.mT, q)
        dk = _matmul_add(dk, sym + sym.mT, k, alpha=-1)
        return dq, dk, dv, dbetas[0], dbetas[1], None


def _wy(kk, k, v, beta, rev):
    """T = (I + tri(diag(beta) K K^T))^-1 per chunk, W = T diag(beta) K, U = T diag(beta) V."""
    a = _triangle(kk, rev, strict=True).mul_(beta)
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device).expand_as(a)
    t = torch.linalg.solve_triangular(a, eye, upper=rev, unitriangular=True)   # I implied in a
    tb = t * beta.mT
    return t, tb @ k, tb @ v


def _scan(w, u, k, rev):
    """The states entering each chunk (n, G, Dk, Dv) and the chunk's values N = U - W S_in,
    written over u (n, G, C, Dv), which nothing needs afterwards.

    Slot i of `states` enters chunk i of a forward scan and leaves chunk i of a reverse one."""
    n = u.shape[0]
    states = u.new_empty(n + 1, u.shape[1], k.shape[-1], u.shape[-1])
    into, out_of = (1, 0) if rev else (0, 1)
    states[n if rev else 0].zero_()
    ws, news, ks = w.unbind(0), u.unbind(0), k.unbind(0)
    for i in range(n - 1, -1, -1) if rev else range(n):
        s = states[i + into]
        news[i].baddbmm_(ws[i], s, alpha=-1)
        torch.baddbmm(s, ks[i].mT, news[i], out=states[i + out_of])
    return (states[1:] if rev else states[:n]), u


def _scan_grad(k, w, qdo, dnew, rev):
    """The loop of `_scan` backwards: adds K G_out to `dnew` (in place) and returns G_out, the
    gradient of the state leaving each chunk; G_in = G_out + Q^T dO - W^T dN."""
    n = dnew.shape[0]
    grads = qdo.new_empty(n + 1, *qdo.shape[1:])
    into, out_of = (1, 0) if rev else (0, 1)
    grads[0 if rev else n].zero_()                          # the last state reaches no output
    ws, ks, qdos, dnews = w.unbind(0), k.unbind(0), qdo.unbind(0), dnew.unbind(0)
    for i in range(n) if rev else range(n - 1, -1, -1):
        g = grads[i + out_of]
        dnews[i].baddbmm_(ks[i], g)
        torch.baddbmm(g, ws[i].mT, dnews[i], alpha=-1, out=grads[i + into]).add_(qdos[i])
    return grads[:n] if rev else grads[1:]


def _triangle(x, rev, strict):
    """The part of a chunk's (C, C) matrix a scan sees: lower (forward) or upper (reverse)."""
    return x.triu(int(strict)) if rev else x.tril(-int(strict))


def _triangle_(x, rev, strict):
    return x.triu_(int(strict)) if rev else x.tril_(-int(strict))


def _matmul_add(acc, a, b, alpha: float = 1.0):
    """acc + alpha a @ b over the (n, G) batch, accumulated in place (acc None: a new a @ b)."""
    if acc is None:
        return a @ b if alpha == 1.0 else alpha * (a @ b)
    acc.flatten(0, 1).baddbmm_(a.flatten(0, 1), b.flatten(0, 1), alpha=alpha)
    return acc


def _dot(a, b):
    """Row-wise dot products (..., C, d), (..., C, d) -> (..., C, 1)."""
    return torch.einsum("...cd,...cd->...c", a, b).unsqueeze(-1)
