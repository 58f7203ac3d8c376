"""The CPU path: both scans in chunks (WY form), the backward pass written out."""
from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F

from linvit.ops.chunks import chunk_bmm
from linvit.ops.definitions import compute_dtype

log = logging.getLogger("linvit")


def chunked_scan(q, k, v, beta_forward, beta_backward, scale, chunk: int):
    """Both scans in chunks of `chunk` tokens (the WY form of the package docstring)."""
    B, H, N, _ = q.shape
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
