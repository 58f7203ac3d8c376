// The bidirectional gated scan on the CPU (linvit.ops.gated_scan: GLA's per-channel decays and
// Mamba-2/SSD's one decay per head), one task per head: both scans run chunk by chunk while the
// chunk and the state sit in cache, the backward one visiting the chunks last to first.
//
// Per chunk of C tokens and direction, b the cumulative log-decays in the scan's order (b_i the
// sum over the chunk's tokens up to and including i), S the state entering the chunk:
//   per channel  P = q e^b, K = k e^-b, A = P K^T on the scan's side (diagonal unless strict),
//                o += P S + A V,  S <- e^b_last (S + K^T V)      (e^-b finite: the floor, see
//                gated_scan/definition.py)
//   scalar       E_ij = e^(b_i - b_j) on the scan's side (exponents <= 0), D = E diag(w),
//                o += e^b (Q S) + (Q K^T * D) V,  S <- e^b_last S + (k e^(b_last - b) w)^T V
// with w the direction's key weights (SSD's dt; 1 without them). Q K^T is the same for both
// directions: computed once per chunk and kept. The backward pass differentiates these steps in
// the reverse of the scan's order, G the gradient of the state leaving the chunk; the gradient of
// b becomes that of the log-decays by the transposed cumulative sum. Formulas as in
// gated_scan/chunked.py, whose tests hold both paths to the token-by-token recurrence.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "blas.h"
#include "scan.h"

namespace {

using linvit::dot;
using linvit::gemm;
using linvit::keep_side;
using linvit::side;
using linvit::scaled;
using linvit::scratch;
using linvit::T;

enum Slot { kS = 0, kB = 1, kE = 2, kP = 3, kK = 4, kA = 5, kY = 6, kDa = 7, kDp = 8,
            kDk = 9, kVg = 10, kDb = 11, kG = 12, kR = 13, kCol = 14, kB1 = 15,
            kE1 = 16, kA1 = 17 };

struct Shape {
  int64_t heads, tokens, chunk, chunks, dk, dv;
  bool strict, scalar, weighted;
};

// b (C x W): the cumulative sums of the chunk's log-decays (C x W) in the scan's order.
void cumulative(const T* la, T* b, int64_t C, int64_t W, bool backward) {
  for (int64_t s = 0; s < C; ++s) {
    const int64_t i = backward ? C - 1 - s : s, prev = backward ? i + 1 : i - 1;
    for (int64_t c = 0; c < W; ++c) b[i * W + c] = la[i * W + c] + (s ? b[prev * W + c] : T(0));
  }
}

// d log-decays from d b: the transposed cumulative sum (each token's decay enters b at itself and
// every token after it in the scan's order), written over db.
void cumulative_grad(T* db, int64_t C, int64_t W, bool backward) {
  for (int64_t s = C - 2; s >= 0; --s) {
    const int64_t i = backward ? C - 1 - s : s, next = backward ? i - 1 : i + 1;
    for (int64_t c = 0; c < W; ++c) db[i * W + c] += db[next * W + c];
  }
}

inline int64_t last_row(const Shape& d, bool backward) { return backward ? 0 : d.chunk - 1; }

// Pointers to one chunk's rows: head h, chunk c; per-direction tensors (2, BH, N, .) at dir.
struct Rows {
  int64_t r0, rd;  // the chunk's first row, and that row in the direction's half
  Rows(const Shape& d, int64_t dir, int64_t h, int64_t c)
      : r0(h * d.tokens + c * d.chunk), rd(dir * d.heads * d.tokens + r0) {}
};

struct Inputs {
  const T *q, *k, *v, *la, *w;  // la (2, BH, N, Dk or 1), w (2, BH, N) or null
  T *states, *qk;               // saved: (2, BH, n, Dk, Dv); (BH, n, C, C), scalar only
};

// --- per-channel decays ------------------------------------------------------------------------

// e = exp(b), P = q e, K = k / e for one chunk (C x Dk each), from its log-decays.
void channel_factors(const Shape& d, const Inputs& in, const Rows& r, bool backward, T* e, T* p,
                     T* kt) {
  const int64_t C = d.chunk, Dk = d.dk;
  cumulative(in.la + r.rd * Dk, e, C, Dk, backward);
  const T *qc = in.q + r.r0 * Dk, *kc = in.k + r.r0 * Dk;
  for (int64_t x = 0; x < C * Dk; ++x) {
    e[x] = std::exp(e[x]);
    p[x] = qc[x] * e[x];
    kt[x] = kc[x] / e[x];
  }
}

void channel_forward(const Shape& d, const Inputs& in, int64_t h, bool backward, T* out) {
  const int64_t C = d.chunk, Dk = d.dk, Dv = d.dv;
  T *S = scratch(kS, Dk * Dv), *e = scratch(kE, C * Dk), *p = scratch(kP, C * Dk);
  T *kt = scratch(kK, C * Dk), *a = scratch(kA, C * C);
  std::fill(S, S + Dk * Dv, T(0));
  for (int64_t step = 0; step < d.chunks; ++step) {
    const int64_t c = backward ? d.chunks - 1 - step : step;
    const Rows r(d, backward, h, c);
    channel_factors(d, in, r, backward, e, p, kt);
    const T* vc = in.v + r.r0 * Dv;
    T* oc = out + r.r0 * Dv;
    std::copy(S, S + Dk * Dv, in.states + (r.rd / C) * Dk * Dv);
    gemm(false, true, C, C, Dk, p, Dk, kt, Dk, 0, a, C);  // A = P K^T
    keep_side(a, C, backward, !d.strict);
    gemm(false, false, C, Dv, Dk, p, Dk, S, Dv, backward ? 1 : 0, oc, Dv);  // P S
    gemm(false, false, C, Dv, C, a, C, vc, Dv, 1, oc, Dv);                 // + A V
    gemm(true, false, Dk, Dv, C, kt, Dk, vc, Dv, 1, S, Dv);                // S + K^T V
    const T* total = e + last_row(d, backward) * Dk;
    for (int64_t x = 0; x < Dk; ++x)
      for (int64_t y = 0; y < Dv; ++y) S[x * Dv + y] *= total[x];
  }
}

struct Grads {
  T *dq, *dk, *dv, *dla, *dw;
};

// One chunk's gradients, per channel, given dO and G (the gradient of the state leaving it),
// which becomes the gradient of the state entering it.
void channel_chunk_grads(const Shape& d, const Inputs& in, const Rows& r, bool backward,
                         const T* doc, T* G, const Grads& out) {
  const int64_t C = d.chunk, Dk = d.dk, Dv = d.dv;
  T *e = scratch(kE, C * Dk), *p = scratch(kP, C * Dk), *kt = scratch(kK, C * Dk);
  T *a = scratch(kA, C * C), *da = scratch(kDa, C * C), *dp = scratch(kDp, C * Dk);
  T *dkt = scratch(kDk, C * Dk), *db = scratch(kDb, C * Dk);
  channel_factors(d, in, r, backward, e, p, kt);
  const T *vc = in.v + r.r0 * Dv, *S = in.states + (r.rd / C) * Dk * Dv;
  const T* total = e + last_row(d, backward) * Dk;
  const T beta = backward ? 1 : 0;  // the second direction adds to the first's gradients
  gemm(false, true, C, C, Dk, p, Dk, kt, Dk, 0, a, C);
  keep_side(a, C, backward, !d.strict);
  gemm(false, true, C, C, Dv, doc, Dv, vc, Dv, 0, da, C);  // dA = dO V^T, A's side
  keep_side(da, C, backward, !d.strict);
  T* dvc = out.dv + r.r0 * Dv;
  gemm(true, false, C, Dv, C, a, C, doc, Dv, beta, dvc, Dv);  // dV = A^T dO + (K e_last) G
  T* kg = scratch(kR, C * Dk);
  for (int64_t i = 0; i < C; ++i)
    for (int64_t x = 0; x < Dk; ++x) kg[i * Dk + x] = kt[i * Dk + x] * total[x];
  gemm(false, false, C, Dv, Dk, kg, Dk, G, Dv, 1, dvc, Dv);
  gemm(false, true, C, Dk, Dv, doc, Dv, S, Dv, 0, dp, Dk);  // dP = dO S^T + dA K
  gemm(false, false, C, Dk, C, da, C, kt, Dk, 1, dp, Dk);
  gemm(false, true, C, Dk, Dv, vc, Dv, G, Dv, 0, dkt, Dk);  // V G^T, then dK = that e_last
  // d e_last = sum over v of G (S + K^T V): the second term is sum_j K_j (V G^T)_j
  T* dtotal = scratch(kVg, Dk);
  std::fill(dtotal, dtotal + Dk, T(0));
  for (int64_t x = 0; x < Dk; ++x)
    for (int64_t y = 0; y < Dv; ++y) dtotal[x] += G[x * Dv + y] * S[x * Dv + y];
  for (int64_t i = 0; i < C; ++i)
    for (int64_t x = 0; x < Dk; ++x) {
      dtotal[x] += kt[i * Dk + x] * dkt[i * Dk + x];
      dkt[i * Dk + x] *= total[x];
    }
  gemm(true, false, C, Dk, C, da, C, p, Dk, 1, dkt, Dk);  // + dA^T P
  T *dqc = out.dq + r.r0 * Dk, *dkc = out.dk + r.r0 * Dk;
  for (int64_t x = 0; x < C * Dk; ++x) {  // d(q e)/db = P, d(k/e)/db = -K
    db[x] = dp[x] * p[x] - dkt[x] * kt[x];
    dqc[x] = (backward ? dqc[x] : T(0)) + dp[x] * e[x];
    dkc[x] = (backward ? dkc[x] : T(0)) + dkt[x] / e[x];
  }
  T* db_last = db + last_row(d, backward) * Dk;
  for (int64_t x = 0; x < Dk; ++x) db_last[x] += dtotal[x] * total[x];
  cumulative_grad(db, C, Dk, backward);
  std::copy(db, db + C * Dk, out.dla + r.rd * Dk);
  for (int64_t x = 0; x < Dk; ++x)  // G <- e_last G + P^T dO
    for (int64_t y = 0; y < Dv; ++y) G[x * Dv + y] *= total[x];
  gemm(true, false, Dk, Dv, C, p, Dk, doc, Dv, 1, G, Dv);
}

// --- one decay per head ------------------------------------------------------------------------
// The map within a chunk is the same matrix for both directions' sides, (Q K^T * (D_F + D_B)): its
// product with V and its gradient run once per chunk (in the forward direction's pass), as the
// PyTorch path does; only the states' parts run per direction.

// b (C), e = exp(b), r = e^(b_last - b), the key weights w (ones without them), r w, and, with
// `matrices`, the masked exponentials E (C x C) and D = E diag(w), for one chunk of one direction
// (its own scratch slots: both directions' factors are held at once). Only the map's passes use
// E and D; the states' parts need the vectors alone.
struct ScalarFactors {
  T *b, *e, *r, *w, *rw, *E, *D;
};

ScalarFactors scalar_factors(const Shape& d, const Inputs& in, const Rows& r, bool backward,
                             bool matrices) {
  const int64_t C = d.chunk;
  T* v = scratch(backward ? kB1 : kB, 5 * C);
  ScalarFactors f{v, v + C, v + 2 * C, v + 3 * C, v + 4 * C, scratch(backward ? kE1 : kE, C * C),
                  scratch(backward ? kA1 : kA, C * C)};
  cumulative(in.la + r.rd, f.b, C, 1, backward);
  const T last = f.b[last_row(d, backward)];
  for (int64_t i = 0; i < C; ++i) {
    f.e[i] = std::exp(f.b[i]);
    f.r[i] = std::exp(last - f.b[i]);
    f.w[i] = in.w ? in.w[r.rd + i] : T(1);
    f.rw[i] = f.r[i] * f.w[i];
  }
  if (!matrices) return f;
  // E by rows in the scan's order, each the row before times the token's decay a_i = e^la_i
  // (e^(b_i - b_j) = a_i e^(b_prev - b_j)): C exponentials rather than C^2; then D = E w on the
  // scan's side, the diagonal left out if strict
  std::fill(f.E, f.E + C * C, T(0));
  std::fill(f.D, f.D + C * C, T(0));
  for (int64_t s = 0; s < C; ++s) {
    const int64_t i = backward ? C - 1 - s : s, prev = backward ? i + 1 : i - 1;
    T *Ei = f.E + i * C, *Di = f.D + i * C;
    if (s) {
      const auto [lo, hi] = side(i, C, backward, false);
      const T a = std::exp(in.la[r.rd + i]);
      const T* Ep = f.E + prev * C;
      for (int64_t j = lo; j < hi; ++j) Ei[j] = Ep[j] * a;
    }
    Ei[i] = 1;
    const auto [lo, hi] = side(i, C, backward, !d.strict);
    for (int64_t j = lo; j < hi; ++j) Di[j] = Ei[j] * f.w[j];
  }
  return f;
}

// a = Q K^T * (D_F + D_B): the chunk's map, both sides.
void scalar_map(const T* qk, const ScalarFactors& f, const ScalarFactors& g, T* a, int64_t C) {
  for (int64_t x = 0; x < C * C; ++x) a[x] = qk[x] * (f.D[x] + g.D[x]);
}

void scalar_forward(const Shape& d, const Inputs& in, int64_t h, bool backward, T* out) {
  const int64_t C = d.chunk, Dk = d.dk, Dv = d.dv;
  T *S = scratch(kS, Dk * Dv), *y = scratch(kY, C * Dv), *kw = scratch(kK, C * Dk);
  std::fill(S, S + Dk * Dv, T(0));
  for (int64_t step = 0; step < d.chunks; ++step) {
    const int64_t c = backward ? d.chunks - 1 - step : step;
    const Rows r(d, backward, h, c);
    const T *qc = in.q + r.r0 * Dk, *kc = in.k + r.r0 * Dk, *vc = in.v + r.r0 * Dv;
    T *qk = in.qk + r.r0 * C, *oc = out + r.r0 * Dv;
    const ScalarFactors f = scalar_factors(d, in, r, backward, backward);
    std::copy(S, S + Dk * Dv, in.states + (r.rd / C) * Dk * Dv);
    gemm(false, false, C, Dv, Dk, qc, Dk, S, Dv, 0, y, Dv);  // Y = Q S, then o (+)= e Y
    for (int64_t i = 0; i < C; ++i) scaled(f.e[i], y + i * Dv, oc + i * Dv, Dv, backward);
    if (backward) {  // the map of both sides, once: Q K^T was kept by the forward pass
      const ScalarFactors g = scalar_factors(d, in, Rows(d, 0, h, c), false, true);
      T* a = scratch(kDa, C * C);
      scalar_map(qk, f, g, a, C);
      gemm(false, false, C, Dv, C, a, C, vc, Dv, 1, oc, Dv);
    } else {
      gemm(false, true, C, C, Dk, qc, Dk, kc, Dk, 0, qk, C);
    }
    for (int64_t i = 0; i < C; ++i) scaled(f.rw[i], kc + i * Dk, kw + i * Dk, Dk);
    const T total = f.e[last_row(d, backward)];
    for (int64_t x = 0; x < Dk * Dv; ++x) S[x] *= total;
    gemm(true, false, Dk, Dv, C, kw, Dk, vc, Dv, 1, S, Dv);  // S e_last + (k r w)^T V
  }
}

// One row of map_decay_grads: t_j = da_j qk_j E_j over [lo, hi), added to col; returns
// sum_j t_j w_j.
inline T side_sums(const T* __restrict__ da, const T* __restrict__ qk, const T* __restrict__ E,
                   const T* __restrict__ w, T* __restrict__ col, int64_t lo, int64_t hi) {
  T row = 0;
  for (int64_t j = lo; j < hi; ++j) {
    const T t = da[j] * qk[j] * E[j];
    row += t * w[j];
    col[j] += t;
  }
  return row;
}

// d b and d w of one direction through D = E diag(w), E_ij = e^(b_i - b_j): with
// t = dA * Q K^T * E on the direction's side, d b_i += sum_j t_ij w_j, d b_j -= w_j sum_i t_ij,
// d w_j += sum_i t_ij. Added to db, dw (C).
void map_decay_grads(const Shape& d, const ScalarFactors& f, bool backward, const T* da,
                     const T* qk, T* db, T* dw) {
  const int64_t C = d.chunk;
  T* col = scratch(kCol, C);
  std::fill(col, col + C, T(0));
  for (int64_t i = 0; i < C; ++i) {
    const auto [lo, hi] = side(i, C, backward, !d.strict);
    db[i] += side_sums(da + i * C, qk + i * C, f.E + i * C, f.w, col, lo, hi);
  }
  for (int64_t j = 0; j < C; ++j) db[j] -= f.w[j] * col[j], dw[j] += col[j];
}

// Adds the log-decays' gradient from d b (C, spent) and the key weights' dw to the outputs.
void add_decay_grads(const Shape& d, const Rows& r, bool backward, T* db, const T* dw,
                     const Grads& out) {
  cumulative_grad(db, d.chunk, 1, backward);
  for (int64_t i = 0; i < d.chunk; ++i) out.dla[r.rd + i] += db[i];
  if (out.dw)
    for (int64_t i = 0; i < d.chunk; ++i) out.dw[r.rd + i] += dw[i];
}

// The gradients through the chunk's map, both sides (written: the first to reach dq, dk, dv),
// and its share of both directions' d b and d w, in the forward direction's pass.
void scalar_map_grads(const Shape& d, const Inputs& in, int64_t h, int64_t c, const T* doc,
                      const Grads& out) {
  const int64_t C = d.chunk, Dk = d.dk, Dv = d.dv;
  const Rows rf(d, 0, h, c), rb(d, 1, h, c);
  const ScalarFactors f = scalar_factors(d, in, rf, false, true);
  const ScalarFactors g = scalar_factors(d, in, rb, true, true);
  const T *qc = in.q + rf.r0 * Dk, *kc = in.k + rf.r0 * Dk, *vc = in.v + rf.r0 * Dv;
  const T* qk = in.qk + rf.r0 * C;
  T *da = scratch(kDa, C * C), *a = scratch(kDk, C * C);
  gemm(false, true, C, C, Dv, doc, Dv, vc, Dv, 0, da, C);  // dA = dO V^T
  scalar_map(qk, f, g, a, C);
  gemm(true, false, C, Dv, C, a, C, doc, Dv, 0, out.dv + rf.r0 * Dv, Dv);  // dV = A^T dO
  T *db = scratch(kDb, 2 * C), *dw = scratch(kR, 2 * C);
  std::fill(db, db + 2 * C, T(0));
  std::fill(dw, dw + 2 * C, T(0));
  map_decay_grads(d, f, false, da, qk, db, dw);
  map_decay_grads(d, g, true, da, qk, db + C, dw + C);
  add_decay_grads(d, rf, false, db, dw, out);
  add_decay_grads(d, rb, true, db + C, dw + C, out);
  for (int64_t x = 0; x < C * C; ++x) da[x] *= f.D[x] + g.D[x];  // d(Q K^T)
  gemm(false, false, C, Dk, C, da, C, kc, Dk, 0, out.dq + rf.r0 * Dk, Dk);  // dQ = d(QK) K
  gemm(true, false, C, Dk, C, da, C, qc, Dk, 0, out.dk + rf.r0 * Dk, Dk);   // dK = d(QK)^T Q
}

// One direction's state part of a chunk's gradients, added to dq, dk, dv and the decays'; G is
// the gradient of the state leaving the chunk and becomes that of the state entering it.
void scalar_state_grads(const Shape& d, const Inputs& in, const Rows& r, bool backward,
                        const T* doc, T* G, const Grads& out) {
  const int64_t C = d.chunk, Dk = d.dk, Dv = d.dv;
  const ScalarFactors f = scalar_factors(d, in, r, backward, false);
  const T *qc = in.q + r.r0 * Dk, *kc = in.k + r.r0 * Dk, *vc = in.v + r.r0 * Dv;
  const T* S = in.states + (r.rd / C) * Dk * Dv;
  T *z = scratch(kDp, C * Dk), *vg = scratch(kVg, C * Dk), *kw = scratch(kK, C * Dk);
  T *db = scratch(kDb, C), *dw = scratch(kR, C), *y = scratch(kY, C * Dv);
  const int64_t last = last_row(d, backward);
  for (int64_t i = 0; i < C; ++i) scaled(f.rw[i], kc + i * Dk, kw + i * Dk, Dk);
  T *dqc = out.dq + r.r0 * Dk, *dkc = out.dk + r.r0 * Dk;
  gemm(false, false, C, Dv, Dk, kw, Dk, G, Dv, 1, out.dv + r.r0 * Dv, Dv);  // dV += (k r w) G
  gemm(false, true, C, Dk, Dv, doc, Dv, S, Dv, 0, z, Dk);  // Z = dO S^T
  gemm(false, true, C, Dk, Dv, vc, Dv, G, Dv, 0, vg, Dk);  // d(k r w) = V G^T
  T dlast = 0;
  for (int64_t i = 0; i < C; ++i) {
    // o_i has e_i Q_i S: d e_i = dO_i . Q_i S = Q_i . Z_i
    const T qz = dot(qc + i * Dk, z + i * Dk, Dk), s = dot(vg + i * Dk, kc + i * Dk, Dk);
    scaled(f.e[i], z + i * Dk, dqc + i * Dk, Dk, true);
    scaled(f.rw[i], vg + i * Dk, dkc + i * Dk, Dk, true);
    // r w = e^(b_last - b_i) w_i: d w_i = r_i s, d b_i -= r_i w_i s, d b_last += r_i w_i s
    db[i] = f.e[i] * qz - f.rw[i] * s;
    dw[i] = f.r[i] * s;
    dlast += f.rw[i] * s;
  }
  T gs = 0;  // S_out = e_last S + ...: d b_last += e_last sum(G S)
  for (int64_t x = 0; x < Dk * Dv; ++x) gs += G[x] * S[x];
  db[last] += dlast + f.e[last] * gs;
  add_decay_grads(d, r, backward, db, dw, out);
  // G <- e_last G + Q^T (e dO)
  for (int64_t i = 0; i < C; ++i) scaled(f.e[i], doc + i * Dv, y + i * Dv, Dv);
  for (int64_t x = 0; x < Dk * Dv; ++x) G[x] *= f.e[last];
  gemm(true, false, Dk, Dv, C, qc, Dk, y, Dv, 1, G, Dv);
}

// --- the ops -----------------------------------------------------------------------------------

void check(const at::Tensor& t, const char* name, int64_t dim) {
  linvit::check_input(t, "gated scan", name, dim);
}

Shape shape_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
               const at::Tensor& la, const at::Tensor& w, int64_t chunk, bool strict) {
  check(q, "q", 3), check(k, "k", 3), check(v, "v", 3), check(la, "log_a", 4);
  const int64_t H = q.size(0), N = q.size(1);
  TORCH_CHECK(chunk > 0 && N % chunk == 0, "linvit gated scan: ", N,
              " tokens are not whole chunks of ", chunk);
  const bool scalar = la.size(3) == 1, weighted = w.numel() > 0;
  TORCH_CHECK(k.sizes() == q.sizes() && v.size(0) == H && v.size(1) == N && la.size(0) == 2 &&
                  la.size(1) == H && la.size(2) == N && (scalar || la.size(3) == q.size(2)),
              "linvit gated scan: q, k (BH, N, Dk), v (BH, N, Dv), log_a (2, BH, N, Dk or 1) "
              "disagree");
  if (weighted) {
    check(w, "key weights", 3);
    TORCH_CHECK(scalar && w.size(0) == 2 && w.size(1) == H && w.size(2) == N,
                "linvit gated scan: key weights (2, BH, N) go with scalar decays");
  }
  return {H, N, chunk, N / chunk, q.size(2), v.size(2), strict, scalar, weighted};
}

std::vector<at::Tensor> forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& la, const at::Tensor& w, int64_t chunk,
                                bool strict) {
  const Shape d = shape_of(q, k, v, la, w, chunk, strict);
  auto out = at::empty({d.heads, d.tokens, d.dv}, q.options());
  auto states = at::empty({2, d.heads, d.chunks, d.dk, d.dv}, q.options());
  auto qk = at::empty({d.scalar ? d.heads : 0, d.chunks, chunk, chunk}, q.options());
  const Inputs in{q.data_ptr<T>(), k.data_ptr<T>(), v.data_ptr<T>(), la.data_ptr<T>(),
                  d.weighted ? w.data_ptr<T>() : nullptr, states.data_ptr<T>(),
                  d.scalar ? qk.data_ptr<T>() : nullptr};
  T* op = out.data_ptr<T>();
  linvit::each_task(d.heads, [&](int64_t h) {
    for (int64_t dir = 0; dir < 2; ++dir) {
      if (d.scalar) scalar_forward(d, in, h, dir == 1, op);
      else channel_forward(d, in, h, dir == 1, op);
    }
  });
  return {out, states, qk};
}

std::vector<at::Tensor> backward(const at::Tensor& g, const at::Tensor& q, const at::Tensor& k,
                                 const at::Tensor& v, const at::Tensor& la, const at::Tensor& w,
                                 const at::Tensor& states, const at::Tensor& qk, int64_t chunk,
                                 bool strict) {
  const Shape d = shape_of(q, k, v, la, w, chunk, strict);
  check(g, "grad", 3), check(states, "states", 5), check(qk, "q k^T", 4);
  TORCH_CHECK(g.sizes() == v.sizes(), "linvit gated scan: grad must have v's shape");
  auto dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  // the scalar path adds its parts of the decays' gradients
  auto dla = d.scalar ? at::zeros_like(la) : at::empty_like(la), dw = at::zeros_like(w);
  const Inputs in{q.data_ptr<T>(), k.data_ptr<T>(), v.data_ptr<T>(), la.data_ptr<T>(),
                  d.weighted ? w.data_ptr<T>() : nullptr, states.data_ptr<T>(),
                  d.scalar ? qk.data_ptr<T>() : nullptr};
  const Grads out{dq.data_ptr<T>(), dk.data_ptr<T>(), dv.data_ptr<T>(), dla.data_ptr<T>(),
                  d.weighted ? dw.data_ptr<T>() : nullptr};
  const T* gp = g.data_ptr<T>();
  linvit::each_task(d.heads, [&](int64_t h) {
    T* G = scratch(kG, d.dk * d.dv);
    for (int64_t dir = 0; dir < 2; ++dir) {
      const bool backward = dir == 1;
      std::fill(G, G + d.dk * d.dv, T(0));
      for (int64_t step = 0; step < d.chunks; ++step) {  // the reverse of the scan's order
        const int64_t c = backward ? step : d.chunks - 1 - step;
        const Rows r(d, dir, h, c);
        const T* doc = gp + r.r0 * d.dv;
        if (!d.scalar) {
          channel_chunk_grads(d, in, r, backward, doc, G, out);
          continue;
        }
        if (!backward) scalar_map_grads(d, in, h, c, doc, out);  // writes dq, dk, dv first
        scalar_state_grads(d, in, r, backward, doc, G, out);
      }
    }
  });
  return {dq, dk, dv, dla, dw};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(linvit_cpu, m) {
  m.def("gated_forward(Tensor q, Tensor k, Tensor v, Tensor log_a, Tensor w, int chunk, "
        "bool strict) -> Tensor[]");
  m.def("gated_backward(Tensor g, Tensor q, Tensor k, Tensor v, Tensor log_a, Tensor w, "
        "Tensor states, Tensor qk, int chunk, bool strict) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(linvit_cpu, CPU, m) {
  m.impl("gated_forward", &forward);
  m.impl("gated_backward", &backward);
}
