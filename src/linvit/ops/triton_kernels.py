"""Triton kernels for bidirectional linear attention, forward and backward.

Same maths as `fused_torch` (read its docstring first):

    o = phi(q) S / (phi(q) z + eps)  or  phi(q) S,   S = phi(k)^T v,  z = sum_n phi(k_n),

with the feature map (identity or elu+1) applied inside the kernels, so phi(q) and phi(k) never go
to memory and backward saves only q, k, v and the (Dk x Dv) state. Four kernels:

    _state_fwd   grid (B*H, splits)   partial [S, z] over a slice of tokens (summed after)
    _output_fwd  grid (B*H, N-blocks) o = phi(q) S / (phi(q) z + eps)
    _dq_state    grid (B*H, splits)   dq for a slice of tokens and partial [dS, dz] over it
    _dkv         grid (B*H, N-blocks) dk = (v dS^T + dz) * phi'(k),  dv = phi(k) dS

Splitting the token reductions over several programs keeps a GPU busy when B*H is small (one image
at high resolution); the partial states are (Dk x Dv) each and summed in PyTorch. Head dims are
padded to powers of two >= 16 (tl.dot's minimum) and masked.

Importing this module needs triton; kernels run on CUDA tensors, or on CPU tensors when
TRITON_INTERPRET=1 was set before the import (how the tests check them).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from linvit.ops.definitions import FEATURES, NORMALISER_EPS

# The codes _phi/_phi_grad branch on, per feature map of linvit.ops.definitions. Kept explicit
# (not numbered from FEATURES' order): the kernels' branches are written against these numbers.
FEATURE_CODES = {"identity": 0, "elu1": 1}
if FEATURE_CODES.keys() != FEATURES.keys():
    # a map missing here would not run in Triton; fail the import (triton_available says why)
    raise ImportError(f"triton kernels implement feature maps {sorted(FEATURE_CODES)}, "
                      f"linvit.ops.definitions defines {sorted(FEATURES)}")
# The widest head the kernels take: one program holds the whole padded (Dk, Dv) state. The
# dispatcher (linvit.ops.linear_attention) sends wider heads to the fused PyTorch path.
MAX_HEAD_DIM = 128


@triton.jit
def _phi(x, FEATURE: tl.constexpr):
    if FEATURE == 1:
        x = tl.where(x > 0, x + 1.0, tl.exp(x))
    return x


@triton.jit
def _phi_grad(x, grad, FEATURE: tl.constexpr):
    if FEATURE == 1:
        grad = tl.where(x > 0, grad, grad * tl.exp(x))
    return grad


@triton.jit
def _load_rows(ptr, offs_n, offs_d, N, D, stride_n):
    """A (BLOCK_N, BD) float32 tile; rows >= N and columns >= D read as 0."""
    mask = (offs_n[:, None] < N) & (offs_d[None, :] < D)
    x = tl.load(ptr + offs_n[:, None] * stride_n + offs_d[None, :], mask=mask, other=0.0)
    return x.to(tl.float32)


@triton.jit
def _features(x, offs_n, offs_d, N, D, FEATURE: tl.constexpr):
    """phi(x) with the padding kept at 0 (phi(0) = 1 for elu+1 would count padded tokens)."""
    mask = (offs_n[:, None] < N) & (offs_d[None, :] < D)
    return tl.where(mask, _phi(x, FEATURE), 0.0)


@triton.jit
def _store_rows(ptr, x, offs_n, offs_d, N, D, stride_n):
    """Store a (BLOCK_N, BD) tile in the tensor's dtype, leaving rows >= N / columns >= D alone."""
    mask = (offs_n[:, None] < N) & (offs_d[None, :] < D)
    tl.store(ptr + offs_n[:, None] * stride_n + offs_d[None, :], x.to(ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def _denominator(phi, z, eps):
    """phi z + eps in float32. Under torch.compile a Python float argument may arrive as a
    float64 scalar, which would promote den, and with it tl.dot's operands, to float64."""
    return (tl.sum(phi * z[None, :], axis=1) + eps).to(tl.float32)


@triton.jit
def _state(index, offs_k, offs_v, BK: tl.constexpr, BV: tl.constexpr):
    """Offsets of the (BK, BV) state number `index` in a dense padded state buffer."""
    return index * BK * BV + offs_k[:, None] * BV + offs_v[None, :]


@triton.jit
def _head(H):
    """This program's (batch x head) index, and the batch and head it stands for."""
    bh = tl.program_id(0)
    return bh, bh // H, bh % H


@triton.jit
def _state_fwd(K, V, S, Z, N, DK, DV, H, chunk, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n,
               FEATURE: tl.constexpr, NORMALIZE: tl.constexpr,
               BLOCK_N: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
               PRECISION: tl.constexpr):
    bh, b, h = _head(H)
    split = tl.program_id(1)
    offs_k = tl.arange(0, BK)
    offs_v = tl.arange(0, BV)
    acc = tl.zeros((BK, BV), dtype=tl.float32)
    zacc = tl.zeros((BK,), dtype=tl.float32)
    k_ptr = K + b * sk_b + h * sk_h
    v_ptr = V + b * sv_b + h * sv_h
    for i in range(0, chunk, BLOCK_N):
        offs_n = split * chunk + i + tl.arange(0, BLOCK_N)
        kt = _load_rows(k_ptr, offs_n, offs_k, N, DK, sk_n)
        kt = _features(kt, offs_n, offs_k, N, DK, FEATURE)
        vt = _load_rows(v_ptr, offs_n, offs_v, N, DV, sv_n)
        acc += tl.dot(tl.trans(kt), vt, input_precision=PRECISION)
        if NORMALIZE:
            zacc += tl.sum(kt, axis=0)
    part = bh * tl.num_programs(1) + split
    tl.store(S + _state(part, offs_k, offs_v, BK, BV), acc)
    if NORMALIZE:
        tl.store(Z + part * BK + offs_k, zacc)


@triton.jit
def _output_fwd(Q, S, Z, O, N, DK, DV, H, eps, sq_b, sq_h, sq_n, so_b, so_h, so_n,
                FEATURE: tl.constexpr, NORMALIZE: tl.constexpr,
                BLOCK_N: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                PRECISION: tl.constexpr):
    bh, b, h = _head(H)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BK)
    offs_v = tl.arange(0, BV)
    qt = _load_rows(Q + b * sq_b + h * sq_h, offs_n, offs_k, N, DK, sq_n)
    qt = _features(qt, offs_n, offs_k, N, DK, FEATURE)
    s = tl.load(S + _state(bh, offs_k, offs_v, BK, BV))
    out = tl.dot(qt, s, input_precision=PRECISION)
    if NORMALIZE:
        z = tl.load(Z + bh * BK + offs_k)
        den = _denominator(qt, z, eps)
        out = out / den[:, None]
    _store_rows(O + b * so_b + h * so_h, out, offs_n, offs_v, N, DV, so_n)


@triton.jit
def _dq_state(Q, DO, S, Z, DQ, DS, DZ, N, DK, DV, H, chunk, eps,
              sq_b, sq_h, sq_n, sd_b, sd_h, sd_n, sg_b, sg_h, sg_n,
              FEATURE: tl.constexpr, NORMALIZE: tl.constexpr,
              BLOCK_N: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
              PRECISION: tl.constexpr):
    bh, b, h = _head(H)
    split = tl.program_id(1)
    offs_k = tl.arange(0, BK)
    offs_v = tl.arange(0, BV)
    s = tl.load(S + _state(bh, offs_k, offs_v, BK, BV))
    z = tl.zeros((BK,), dtype=tl.float32)
    if NORMALIZE:
        z = tl.load(Z + bh * BK + offs_k)
    acc_s = tl.zeros((BK, BV), dtype=tl.float32)
    acc_z = tl.zeros((BK,), dtype=tl.float32)
    q_ptr = Q + b * sq_b + h * sq_h
    for i in range(0, chunk, BLOCK_N):
        offs_n = split * chunk + i + tl.arange(0, BLOCK_N)
        q_raw = _load_rows(q_ptr, offs_n, offs_k, N, DK, sq_n)
        phi = _features(q_raw, offs_n, offs_k, N, DK, FEATURE)
        g = _load_rows(DO + b * sd_b + h * sd_h, offs_n, offs_v, N, DV, sd_n)
        if NORMALIZE:
            # o is recomputed rather than saved: one extra (BLOCK_N x BK x BV) product
            den = _denominator(phi, z, eps)
            dnum = g / den[:, None]
            o = tl.dot(phi, s, input_precision=PRECISION) / den[:, None]
            dden = -tl.sum(dnum * o, axis=1)
            dphi = tl.dot(dnum, tl.trans(s), input_precision=PRECISION)
            dphi += dden[:, None] * z[None, :]
            acc_z += tl.sum(phi * dden[:, None], axis=0)
        else:
            dnum = g
            dphi = tl.dot(dnum, tl.trans(s), input_precision=PRECISION)
        acc_s += tl.dot(tl.trans(phi), dnum, input_precision=PRECISION)
        dq = _phi_grad(q_raw, dphi, FEATURE)
        _store_rows(DQ + b * sg_b + h * sg_h, dq, offs_n, offs_k, N, DK, sg_n)
    part = bh * tl.num_programs(1) + split
    tl.store(DS + _state(part, offs_k, offs_v, BK, BV), acc_s)
    if NORMALIZE:
        tl.store(DZ + part * BK + offs_k, acc_z)


@triton.jit
def _dkv(K, V, DS, DZ, DK_, DV_, N, DK, DV, H, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n,
         sgk_b, sgk_h, sgk_n, sgv_b, sgv_h, sgv_n,
         FEATURE: tl.constexpr, NORMALIZE: tl.constexpr,
         BLOCK_N: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
         PRECISION: tl.constexpr):
    bh, b, h = _head(H)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BK)
    offs_v = tl.arange(0, BV)
    k_ptr = K + b * sk_b + h * sk_h
    k_raw = _load_rows(k_ptr, offs_n, offs_k, N, DK, sk_n)
    phi = _features(k_raw, offs_n, offs_k, N, DK, FEATURE)
    vt = _load_rows(V + b * sv_b + h * sv_h, offs_n, offs_v, N, DV, sv_n)
    ds = tl.load(DS + _state(bh, offs_k, offs_v, BK, BV))
    dphi = tl.dot(vt, tl.trans(ds), input_precision=PRECISION)
    if NORMALIZE:
        dz = tl.load(DZ + bh * BK + offs_k)
        dphi += dz[None, :]
    dk = _phi_grad(k_raw, dphi, FEATURE)
    dv = tl.dot(phi, ds, input_precision=PRECISION)
    _store_rows(DK_ + b * sgk_b + h * sgk_h, dk, offs_n, offs_k, N, DK, sgk_n)
    _store_rows(DV_ + b * sgv_b + h * sgv_h, dv, offs_n, offs_v, N, DV, sgv_n)


# --- launchers ------------------------------------------------------------------------------
def _block(d: int) -> int:
    return max(16, triton.next_power_of_2(d))


def _rows(x: torch.Tensor) -> torch.Tensor:
    """Kernels index (B, H, N, D) by strides but need the feature dim contiguous."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _splits(bh: int, n_blocks: int, device: torch.device, splits: int | None) -> int:
    if splits is not None:
        return max(1, min(splits, n_blocks))
    if device.type != "cuda":
        return 1
    # enough programs to fill every SM about four times over
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(n_blocks, -(-4 * sms // bh)))


def _chunked(n: int, block_n: int, splits: int) -> int:
    """Tokens per split, a multiple of block_n."""
    return -(-triton.cdiv(n, block_n) // splits) * block_n


class TritonLinearAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, kind: str, normalize: bool, eps: float, splits: int | None,
                block_n: int):
        q, k, v = _rows(q), _rows(k), _rows(v)
        B, H, N, Dk = q.shape
        Dv = v.shape[-1]
        if max(Dk, Dv) > MAX_HEAD_DIM:
            raise ValueError(f"triton linear attention supports head dims <= {MAX_HEAD_DIM}, "
                             f"got Dk={Dk}, Dv={Dv}")
        BK, BV = _block(Dk), _block(Dv)
        nsplit = _splits(B * H, triton.cdiv(N, block_n), q.device, splits)
        chunk = _chunked(N, block_n, nsplit)
        # float32 products in TF32 only where torch's own matmuls may use it (same global switch)
        precision = "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"
        meta = dict(FEATURE=FEATURE_CODES[kind], NORMALIZE=normalize, BLOCK_N=block_n, BK=BK,
                    BV=BV, PRECISION=precision, num_warps=8 if BK * BV >= 128 * 64 else 4)
        f32 = dict(device=q.device, dtype=torch.float32)
        s_part = torch.empty(B * H, nsplit, BK, BV, **f32)
        z_part = torch.zeros(B * H, nsplit, BK, **f32)
        _state_fwd[(B * H, nsplit)](k, v, s_part, z_part, N, Dk, Dv, H, chunk,
                                     *k.stride()[:3], *v.stride()[:3], **meta)
        s, z = s_part.sum(1), z_part.sum(1)
        out = torch.empty(B, H, N, Dv, device=q.device, dtype=v.dtype)
        _output_fwd[(B * H, triton.cdiv(N, block_n))](q, s, z, out, N, Dk, Dv, H, eps,
                                                      *q.stride()[:3], *out.stride()[:3], **meta)
        ctx.save_for_backward(q, k, v, s, z)
        ctx.setup = (eps, nsplit, chunk, meta)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, s, z = ctx.saved_tensors
        eps, nsplit, chunk, meta = ctx.setup
        g = _rows(grad_out)
        B, H, N, Dk = q.shape
        Dv = v.shape[-1]
        BK, BV, block_n = meta["BK"], meta["BV"], meta["BLOCK_N"]
        f32 = dict(device=q.device, dtype=torch.float32)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        ds_part = torch.empty(B * H, nsplit, BK, BV, **f32)
        dz_part = torch.zeros(B * H, nsplit, BK, **f32)
        _dq_state[(B * H, nsplit)](q, g, s, z, dq, ds_part, dz_part, N, Dk, Dv, H, chunk, eps,
                                   *q.stride()[:3], *g.stride()[:3], *dq.stride()[:3], **meta)
        ds, dz = ds_part.sum(1), dz_part.sum(1)
        _dkv[(B * H, triton.cdiv(N, block_n))](k, v, ds, dz, dk, dv, N, Dk, Dv, H,
                                               *k.stride()[:3], *v.stride()[:3],
                                               *dk.stride()[:3], *dv.stride()[:3], **meta)
        return dq, dk, dv, None, None, None, None, None


def triton_linear_attention(q, k, v, kind: str = "identity", normalize: bool = True,
                            eps: float = NORMALISER_EPS, splits: int | None = None,
                            block_n: int = 64) -> torch.Tensor:
    return TritonLinearAttention.apply(q, k, v, kind, normalize, eps, splits, block_n)
