"""The CPU path: exact within chunks, a state carried between them, time and memory linear in N;
both directions at once on shared q, k, v, with the backward pass written out (_ChannelChunks for
per-channel decays, _ScalarChunks for one decay per head)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from linvit.ops.chunks import chunk_bmm
from linvit.ops.gated_scan.definition import directions


def chunked_scan(q, k, v, log_a, scales, strict: bool, scale: float, decay_scale: float,
                 chunk: int):
    """Tokens in chunks, (B, H, N, d) -> (B*H, n, chunk, d); zero keys pad the tail, cut off at
    the end. Both directions share q, k, v here: no flipped copies."""
    B, H, N, _ = q.shape
    n = -(-N // chunk)

    def blocks(t):
        t = F.pad(t, (0, 0, 0, n * chunk - N)) if n * chunk != N else t
        return t.reshape(*t.shape[:-4], B * H, n, chunk, t.shape[-1])

    q, k, v, log_a = blocks(q), blocks(k), blocks(v), blocks(log_a)
    if log_a.shape[-1] == 1:
        weights = None if scales is None else blocks(scales)
        out = _ScalarChunks.apply(q, k, v, log_a, weights, scale, decay_scale, strict)
    else:
        k_f, k_b = (k, k) if scales is None else directions(k, blocks(scales))
        out = _ChannelChunks.apply(q, k_f, k_b, v, log_a, scale, decay_scale, strict)
    return out.view(B, H, n * chunk, -1)[:, :, :N]


def _cumulative(log_a, decay_scale: float, transpose: bool = False) -> torch.Tensor:
    """decay_scale times the cumulative log-gates within each chunk, (2, X, n, C, .): b_i =
    sum_{t<=i} (forward), c_i = sum_{t>=i} (backward); with transpose, the gradient map back.
    A matmul with triangular ones per direction: as fast as a cumsum here, and it takes the scale
    and the backward direction's reversed sum for free."""
    ones = torch.full((log_a.shape[-2],) * 2, decay_scale, dtype=log_a.dtype, device=log_a.device)
    out = torch.empty_like(log_a)
    for i, triangle in enumerate((ones.tril(), ones.triu())):
        torch.matmul(triangle.T if transpose else triangle, log_a[i], out=out[i])
    return out


def _below(C: int, device) -> torch.Tensor:
    """(C, C) mask, true strictly below the diagonal: the forward direction's part of a chunk."""
    return torch.ones(C, C, dtype=torch.bool, device=device).tril_(-1)


def _linear_scan(x, gamma, reverse: bool, out: torch.Tensor) -> torch.Tensor:
    """out_c = gamma_c out_prev + x_c along the chunk axis (dim 1), prev the chunk before c in
    scan order (c - 1, or c + 1 if reverse), out_first = x_first. The one sequential part, done
    in groups of ~sqrt(n) chunks: the scan inside every group at once, then across the groups'
    ends, then one fill; ~2 sqrt(n) ops over many chunks each rather than n small ones."""
    n = x.shape[1]
    if n == 0:
        return out
    size = max(1, math.isqrt(n))
    groups = n // size
    main = slice(n - groups * size, n) if reverse else slice(0, groups * size)
    xm, gm, om = (t[:, main].unflatten(1, (groups, size)) for t in (x, gamma, out))
    first, last = (size - 1, 0) if reverse else (0, size - 1)
    om[:, :, first].copy_(xm[:, :, first])
    for j in (range(size - 2, -1, -1) if reverse else range(1, size)):     # inside the groups
        torch.addcmul(xm[:, :, j], gm[:, :, j], om[:, :, j + 1 if reverse else j - 1],
                      out=om[:, :, j])
    # decay from each group's start (in scan order) through each of its chunks
    decay = gm.flip(2).cumprod(2).flip(2) if reverse else gm.cumprod(2)
    ends = om[:, :, last]
    for s in (range(groups - 2, -1, -1) if reverse else range(1, groups)):   # across groups
        ends[:, s].addcmul_(decay[:, s, last], ends[:, s + 1 if reverse else s - 1])
    if groups > 1 and reverse:                          # the rest of every group, at once
        om[:, :-1, 1:].addcmul_(decay[:, :-1, 1:], om[:, 1:, :1])
    elif groups > 1:
        om[:, 1:, :-1].addcmul_(decay[:, 1:, :-1], om[:, :-1, -1:])
    for c in (range(n - groups * size - 1, -1, -1) if reverse else range(groups * size, n)):
        torch.addcmul(x[:, c], gamma[:, c], out[:, c + 1 if reverse else c - 1], out=out[:, c])
    return out


def _states(inputs, gamma, reverse: bool, out: torch.Tensor) -> torch.Tensor:
    """The state entering each chunk, (X, n, K, V): E = 0 entering the first chunk in scan order,
    then E_c = gamma_p E_p + U_p, p the chunk before c (U: the chunk's own keys and values,
    decayed to its end): the scan of (U, gamma), one chunk later."""
    if reverse:
        out[:, -1].zero_()
        _linear_scan(inputs[:, 1:], gamma[:, 1:], True, out[:, :-1])
        return out
    out[:, 0].zero_()
    _linear_scan(inputs[:, :-1], gamma[:, :-1], False, out[:, 1:])
    return out


def _states_grad(grad, gamma, states, reverse: bool, inputs_decayed: bool):
    """(dL/dU, dL/dlog gamma) of `_states` given dL/dE. R_c, the gradient reaching E_c through
    every later state (R_c = dL/dE_c + gamma_c R_next), is dL/dU of the chunk before c: a scan
    the other way. inputs_decayed: U_p = gamma_p W_p, and d log gamma counts that path too."""
    d_in = torch.empty_like(grad)
    if reverse:                                         # R runs up, dU_p = R_(p-1)
        d_in[:, 0].zero_()
        _linear_scan(grad[:, :-1], gamma[:, :-1], False, d_in[:, 1:])
    else:                                               # R runs down, dU_p = R_(p+1)
        d_in[:, -1].zero_()
        _linear_scan(grad[:, 1:], gamma[:, 1:], True, d_in[:, :-1])
    nxt, cur = (slice(None, -1), slice(1, None)) if reverse else (slice(1, None), slice(None, -1))
    d_log = torch.zeros_like(gamma)
    if inputs_decayed:      # d log gamma_p = sum R_c (gamma_p E_p + U_p) = sum R_c E_c
        d_log[:, cur] = (d_in[:, cur] * states[:, nxt]).sum_to_size(d_log[:, cur].shape)
    else:                   # d log gamma_p = gamma_p sum R_c E_p
        d_log[:, cur] = (d_in[:, cur] * states[:, cur]).sum_to_size(d_log[:, cur].shape)
        d_log[:, cur] *= gamma[:, cur]
    return d_in, d_log


def _chunk_total(e, reverse: bool):
    """A chunk's whole decay, kept as a (X, n, 1, .) slice: exp of b_last (or of c_first)."""
    return e[:, :, :1] if reverse else e[:, :, -1:]


def _set_diagonal(a, extra):
    """The diagonal of the chunk matrices a (X, n, C, C), which holds the backward direction's
    term: zeroed (extra None: strict), or plus the forward direction's `extra` (X, n, C)."""
    diagonal = a.diagonal(dim1=-2, dim2=-1)
    if extra is None:
        diagonal.zero_()
    else:
        diagonal.add_(extra)


def _left_right(q, v):
    """Buffers L (X, n, C, C + 2K) and R (X, n, C + 2K, V) that the forward pass fills in place:
    L = [A | P_F | P_B], R = [s V ; E_F ; E_B], so that the output s (A V + P_F E_F + P_B E_B) is
    one matmul, with no partial sums written and read back."""
    X, n, C, K = q.shape
    left = q.new_empty(X, n, C, C + 2 * K)
    right = q.new_empty(X, n, C + 2 * K, v.shape[-1])
    return left, right


def _parts(left, right, K):
    """The views (A, P_F, P_B) of L and (s V, E_F, E_B) of R."""
    C = left.shape[2]
    return ((left[..., :C], left[..., C:C + K], left[..., C + K:]),
            (right[:, :, :C], right[:, :, C:C + K], right[:, :, C + K:]))


class _ChannelChunks(torch.autograd.Function):
    """Per-channel decays, both directions, forward and backward written out (autograd over the
    same steps keeps ~3x the tensors and ran ~2x slower). Per direction, with e = exp(b):
    P = q e, K = k / e (so P_i K_j = q_i k_j e^(b_i - b_j)), U = e_last K^T V per chunk (its keys
    decayed to its end), E the states, A = P K^T masked to the direction's side of the diagonal;
    out = A V + P_F E_F + P_B E_B."""

    @staticmethod
    def forward(ctx, q, k_f, k_b, v, log_a, scale, decay_scale, strict):
        left, right = _left_right(q, v)
        (a, p_f, p_b), (v_s, s_f, s_b) = _parts(left, right, q.shape[-1])
        torch.mul(v, scale, out=v_s)
        e_f, e_b = _cumulative(log_a, decay_scale).exp_()
        torch.mul(q, e_f, out=p_f)
        torch.mul(q, e_b, out=p_b)
        kk_f, kk_b = k_f / e_f, k_b / e_b
        for kk, e, s, rev in ((kk_f, e_f, s_f, False), (kk_b, e_b, s_b, True)):
            total = _chunk_total(e, rev).transpose(-1, -2)          # (X, n, K, 1)
            _states(chunk_bmm(kk.transpose(-1, -2), v_s).mul_(total), total, rev, out=s)
        a_f = chunk_bmm(p_f, kk_f.transpose(-1, -2))
        a_b = chunk_bmm(p_b, kk_b.transpose(-1, -2))
        torch.where(_below(q.shape[2], q.device), a_f, a_b, out=a)
        _set_diagonal(a, None if strict else a_f.diagonal(dim1=-2, dim2=-1))
        ctx.save_for_backward(left, right, e_f, e_b, kk_f, kk_b)
        ctx.scale, ctx.decay_scale, ctx.strict = scale, decay_scale, strict
        ctx.same_keys = k_f is k_b
        return chunk_bmm(left, right)

    @staticmethod
    def backward(ctx, grad):
        left, right, e_f, e_b, kk_f, kk_b = ctx.saved_tensors
        (a, p_f, p_b), (v_s, s_f, s_b) = _parts(left, right, e_f.shape[-1])
        g = grad.contiguous()
        d_a = chunk_bmm(g, v_s.transpose(-1, -2))
        d_v = chunk_bmm(a.transpose(-1, -2), g)                     # d(s v); times s at the end
        d_cum = e_f.new_empty(2, *e_f.shape)                  # d cumulative log-gates
        d_q, d_ks = None, []
        sides = ((d_a.tril(-1 if ctx.strict else 0), e_f, p_f, kk_f, s_f, False),
                 (d_a.triu_(1 if ctx.strict else 0), e_b, p_b, kk_b, s_b, True))
        for i, (d_a_side, e, p, kk, s, rev) in enumerate(sides):
            total = _chunk_total(e, rev).transpose(-1, -2)
            d_u, d_log = _states_grad(chunk_bmm(p.transpose(-1, -2), g), total, s, rev, True)
            d_w = d_u.mul_(total)                              # U = total W
            d_v.flatten(0, 1).baddbmm_(kk.flatten(0, 1), d_w.flatten(0, 1),
                                       beta=1.0 if i == 0 else ctx.scale,
                                       alpha=1.0 if i == 0 else ctx.scale)
            d_p = chunk_bmm(g, s.transpose(-1, -2))
            d_p.flatten(0, 1).baddbmm_(d_a_side.flatten(0, 1), kk.flatten(0, 1))
            d_kk = chunk_bmm(v_s, d_w.transpose(-1, -2))
            d_kk.flatten(0, 1).baddbmm_(d_a_side.transpose(-1, -2).flatten(0, 1), p.flatten(0, 1))
            torch.mul(d_p, p, out=d_cum[i])
            d_cum[i].addcmul_(d_kk, kk, value=-1.0)            # d(q e)/db = P, d(k/e)/db = -K
            d_cum[i].select(2, 0 if rev else -1).add_(d_log.squeeze(-1))   # b_last: the total
            d_q = d_p.mul_(e) if d_q is None else d_q.addcmul_(d_p, e)
            if d_ks and ctx.same_keys:                         # one k: both directions' dk
                d_ks[0].addcdiv_(d_kk, e)
            else:
                d_ks.append(d_kk.div_(e))
        d_kf, d_kb = (d_ks[0], None) if ctx.same_keys else d_ks
        d_log_a = _cumulative(d_cum, ctx.decay_scale, transpose=True)
        return d_q, d_kf, d_kb, d_v, d_log_a, None, None, None


class _ScalarChunks(torch.autograd.Function):
    """One decay per head and token, both directions, backward written out. Within a chunk the
    exact C x C matrix mix_ij = [j <= i] w^F_j e^(b_i - b_j) + [j >= i] w^B_j e^(c_i - c_j) (each
    exponent taken on its own side of the diagonal, so <= 0) weighs q k^T; between chunks P = q e^b
    meets the states of the keys weighted by w e^(b_last - b_j) <= w, whatever the decays."""

    @staticmethod
    def forward(ctx, q, k, v, log_a, weights, scale, decay_scale, strict):
        left, right = _left_right(q, v)
        (a, p_f, p_b), (v_s, s_f, s_b) = _parts(left, right, q.shape[-1])
        torch.mul(v, scale, out=v_s)
        cum_f, cum_b = cums = _cumulative(log_a, decay_scale)       # (X, n, C, 1) each
        saved = []
        for cum, w, p, s, rev in ((cum_f, weights, p_f, s_f, False),
                                  (cum_b, weights, p_b, s_b, True)):
            w = None if w is None else w[int(rev)]
            r = (_chunk_total(cum, rev) - cum).exp()           # decay to the chunk's end/start
            e = cum.exp()
            torch.mul(q, e, out=p)
            kk = k * (r if w is None else r * w)
            _states(chunk_bmm(kk.transpose(-1, -2), v_s), _chunk_total(e, rev), rev, out=s)
            saved += [e, r, kk]
        below = _below(q.shape[2], q.device)
        dec = torch.where(below, cum_f - cum_f.transpose(-1, -2),
                          cum_b - cum_b.transpose(-1, -2)).exp_()
        mix = dec if weights is None else dec * torch.where(
            below, weights[0].transpose(-1, -2), weights[1].transpose(-1, -2))
        # (mix may be dec itself: dec's diagonal is never read again)
        _set_diagonal(mix, None if strict else (1.0 if weights is None else weights[0][..., 0]))
        qk = chunk_bmm(q, k.transpose(-1, -2))
        torch.mul(qk, mix, out=a)
        ctx.save_for_backward(q, k, weights, *saved, dec, mix, qk, left, right, cums)
        ctx.scale, ctx.decay_scale, ctx.strict = scale, decay_scale, strict
        return chunk_bmm(left, right)

    @staticmethod
    def backward(ctx, grad):
        (q, k, weights, e_f, r_f, kk_f, e_b, r_b, kk_b, dec, mix, qk, left, right,
         cums) = ctx.saved_tensors
        (a, p_f, p_b), (v_s, s_f, s_b) = _parts(left, right, q.shape[-1])
        g = grad.contiguous()
        d_a = chunk_bmm(g, v_s.transpose(-1, -2))
        d_v = chunk_bmm(a.transpose(-1, -2), g)
        d_qk = d_a * mix
        d_q, d_k = chunk_bmm(d_qk, k), chunk_bmm(d_qk.transpose(-1, -2), q)
        d_cum = torch.empty_like(cums)
        d_w = None if weights is None else torch.empty_like(weights)
        totals = []
        for i, (e, r, kk, p, s) in enumerate(((e_f, r_f, kk_f, p_f, s_f),
                                              (e_b, r_b, kk_b, p_b, s_b))):
            kw = r if weights is None else r * weights[i]
            d_u, d_log = _states_grad(chunk_bmm(p.transpose(-1, -2), g), _chunk_total(e, i == 1), s,
                                      i == 1, False)
            d_v.flatten(0, 1).baddbmm_(kk.flatten(0, 1), d_u.flatten(0, 1),
                                       beta=1.0 if i == 0 else ctx.scale,
                                       alpha=1.0 if i == 0 else ctx.scale)
            d_p = chunk_bmm(g, s.transpose(-1, -2))
            d_kk = chunk_bmm(v_s, d_u.transpose(-1, -2))            # d(k kw)
            d_q.addcmul_(d_p, e)
            d_k.addcmul_(d_kk, kw)
            d_kw = (d_kk * k).sum(-1, keepdim=True)            # (X, n, C, 1)
            # kw = w r, r = e^(total - b): d b -= d_kw kw, d total += sum of d_kw kw
            torch.sum(d_p * p, -1, keepdim=True, out=d_cum[i]).addcmul_(d_kw, kw, value=-1.0)
            totals.append(d_log.squeeze(-1) + (d_kw * kw).sum(2))
            if d_w is not None:
                torch.mul(d_kw, r, out=d_w[i])
        _scalar_mix_grad(d_cum, d_w, d_a.mul_(qk), dec, weights, ctx.strict)
        d_cum[0][:, :, -1] += totals[0]                        # the chunk total is b_last
        d_cum[1][:, :, 0] += totals[1]
        d_log_a = _cumulative(d_cum, ctx.decay_scale, transpose=True)
        return d_q, d_k, d_v, d_log_a, d_w, None, None, None


def _scalar_mix_grad(d_cum, d_w, d_mix, dec, weights, strict: bool):
    """Adds the intra-chunk matrix's share to d cumulative and d key weights, (2, X, n, C, 1).
    With t = d_mix dec: d w_j = column sums of t on the direction's side; d exponent = t w_j,
    whose row sums are matrix-vector products and whose column sums are w_j times those of t."""
    diagonal = d_mix.diagonal(dim1=-2, dim2=-1)
    if not strict and d_w is not None:                         # mix_ii = w^F_i + w^B_i
        d_w += diagonal.unsqueeze(-1)
    diagonal.zero_()                                           # e^0 there: no decay gradient
    t = d_mix.mul_(dec)
    lower = t.tril(-1)
    col_f = lower.sum(-2).unsqueeze(-1)                        # (X, n, C, 1)
    col_b = t.sum(-2).unsqueeze(-1) - col_f
    w = torch.ones_like(d_cum) if weights is None else weights
    rows = chunk_bmm(lower, torch.cat([w[0], w[1]], dim=-1))       # (X, n, C, 2)
    row_b = chunk_bmm(t, w[1]) - rows[..., 1:]
    for i, (row, col) in enumerate(((rows[..., :1], col_f), (row_b, col_b))):
        d_cum[i] += row - w[i] * col                           # exponent x_i - x_j
        if d_w is not None:
            d_w[i] += col
