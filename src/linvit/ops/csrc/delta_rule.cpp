// The bidirectional delta rule on the CPU, chunked in WY form (linvit.ops.delta_rule), one task
// per head: both scans of the head run chunk by chunk while the chunk and the state sit in cache.
//
// Per chunk of C tokens and direction, with S the state entering it (Dk x Dv), A = K K^T on the
// direction's side of the diagonal (strictly below for the forward scan, strictly above for the
// backward one, which visits the chunks last to first), T = (I + diag(beta) A)^-1:
//   W = T diag(beta) K,  N = T diag(beta) V - W S,  o += Q S + P N  (P = Q K^T, diagonal kept),
//   S <- S + K^T N.
// The backward pass is the one written out in chunked.py's _ChunkedDeltaRule, per chunk in the
// reverse of the scan's order, G the gradient of the state leaving the chunk.
//
// Why C++: the PyTorch path runs the chunk loop as small batched products from Python, with the
// two directions gathered into and out of a stacked layout and a dozen passes over (N, d)
// tensors around them; here both directions read the token-major tensors in place, and every
// per-chunk step is one BLAS call or one loop over a chunk in cache. The backward direction is
// the same code with the triangles mirrored, not a flipped copy of the sequence.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>

#include "blas.h"
#include "scan.h"

namespace {

using linvit::gemm;
using linvit::keep_side;
using linvit::scratch;
using linvit::T;

enum Slot { kS = 0, kTb = 1, kG = 2, kDp = 3, kDn = 4, kZ = 5, kZn = 6, kZs = 7, kX = 8 };

struct Shape {
  int64_t heads, tokens, chunk, chunks, dk, dv;
};

// t = (I + diag(beta) a)^-1 for a on the scan's strict side, by substitution in scan order:
// row i of t is e_i - beta_i sum_j a_ij t_j over the rows j before it, which are zero outside
// the columns from the scan's start through j.
void unit_inverse(const T* a, const T* beta, T* t, int64_t C, bool backward) {
  std::fill(t, t + C * C, T(0));
  for (int64_t s = 0; s < C; ++s) {
    const int64_t i = backward ? C - 1 - s : s;
    T* ti = t + i * C;
    ti[i] = 1;
    for (int64_t r = 0; r < s; ++r) {
      const int64_t j = backward ? C - 1 - r : r;
      const T f = -beta[i] * a[i * C + j];
      const int64_t lo = backward ? j : 0, hi = backward ? C : j + 1;
      const T* tj = t + j * C;
      for (int64_t c = lo; c < hi; ++c) ti[c] += f * tj[c];
    }
  }
}

// Where a direction's saved tensors for one chunk live: (2, BH, n, ...) per-chunk blocks.
struct Saved {
  T *a, *t, *p, *w, *n, *s;
  Saved at(const Shape& d, int64_t dir, int64_t h, int64_t c) const {
    const int64_t block = (dir * d.heads + h) * d.chunks + c, rows = block * d.chunk;
    const int64_t cc = d.chunk * d.chunk;
    return {a + block * cc, t + block * cc, p + block * cc, w + rows * d.dk, n + rows * d.dv,
            s + block * d.dk * d.dv};
  }
};

// One direction of one head, forward: writes (dir 0) or adds to (dir 1) the head's outputs. The
// backward direction (dir 1) runs after the forward one and reads its saved A.
void forward_scan(const Shape& d, int64_t h, bool backward, const T* q, const T* k, const T* v,
                  const T* beta, T* out, const Saved& saved) {
  const int64_t C = d.chunk, Dk = d.dk, Dv = d.dv;
  T* S = scratch(kS, Dk * Dv);
  T* tb = scratch(kTb, C * C);
  std::fill(S, S + Dk * Dv, T(0));
  for (int64_t step = 0; step < d.chunks; ++step) {
    const int64_t c = backward ? d.chunks - 1 - step : step, r0 = h * d.tokens + c * C;
    const T *qc = q + r0 * Dk, *kc = k + r0 * Dk, *vc = v + r0 * Dv, *bc = beta + r0;
    const Saved x = saved.at(d, backward, h, c);
    if (backward) {  // K K^T is symmetric: the forward scan's lower side of this chunk, transposed
      const T* af = saved.at(d, 0, h, c).a;
      for (int64_t i = 0; i < C; ++i)
        for (int64_t j = 0; j < C; ++j) x.a[i * C + j] = af[j * C + i];
    } else {
      gemm(false, true, C, C, Dk, kc, Dk, kc, Dk, 0, x.a, C);  // K K^T, the scan's side
      keep_side(x.a, C, false, false);
    }
    unit_inverse(x.a, bc, x.t, C, backward);
    for (int64_t i = 0; i < C; ++i)  // T diag(beta)
      for (int64_t j = 0; j < C; ++j) tb[i * C + j] = x.t[i * C + j] * bc[j];
    gemm(false, false, C, Dk, C, tb, C, kc, Dk, 0, x.w, Dk);               // W
    gemm(false, false, C, Dv, C, tb, C, vc, Dv, 0, x.n, Dv);               // U
    gemm(false, false, C, Dv, Dk, x.w, Dk, S, Dv, 1, x.n, Dv, T(-1));      // N = U - W S
    std::copy(S, S + Dk * Dv, x.s);
    T* oc = out + r0 * Dv;
    gemm(false, false, C, Dv, Dk, qc, Dk, S, Dv, backward ? 1 : 0, oc, Dv);  // Q S
    gemm(false, true, C, C, Dk, qc, Dk, kc, Dk, 0, x.p, C);               // P = Q K^T
    keep_side(x.p, C, backward, true);
    gemm(false, false, C, Dv, C, x.p, C, x.n, Dv, 1, oc, Dv);              // + P N
    gemm(true, false, Dk, Dv, C, kc, Dk, x.n, Dv, 1, S, Dv);               // S + K^T N
  }
}

at::Tensor saved_like(const at::Tensor& q, std::initializer_list<int64_t> tail) {
  std::vector<int64_t> shape{2};
  shape.insert(shape.end(), tail);
  return at::empty(shape, q.options());
}

void check(const at::Tensor& t, const char* name, int64_t dim) {
  linvit::check_input(t, "delta rule", name, dim);
}

Shape shape_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
               const at::Tensor& beta, int64_t chunk) {
  check(q, "q", 3), check(k, "k", 3), check(v, "v", 3), check(beta, "beta", 3);
  const int64_t H = q.size(0), N = q.size(1);
  TORCH_CHECK(chunk > 0 && N % chunk == 0, "linvit delta rule: ", N,
              " tokens are not whole chunks of ", chunk);
  TORCH_CHECK(k.sizes() == q.sizes() && v.size(0) == H && v.size(1) == N &&
                  beta.size(0) == 2 && beta.size(1) == H && beta.size(2) == N,
              "linvit delta rule: q, k (BH, N, Dk), v (BH, N, Dv), beta (2, BH, N) disagree");
  return {H, N, chunk, N / chunk, q.size(2), v.size(2)};
}

std::vector<at::Tensor> forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& beta, int64_t chunk) {
  const Shape d = shape_of(q, k, v, beta, chunk);
  const int64_t H = d.heads, n = d.chunks, C = d.chunk;
  auto out = at::empty({H, d.tokens, d.dv}, q.options());
  auto a = saved_like(q, {H, n, C, C}), t = saved_like(q, {H, n, C, C});
  auto p = saved_like(q, {H, n, C, C}), w = saved_like(q, {H, d.tokens, d.dk});
  auto nn = saved_like(q, {H, d.tokens, d.dv}), s = saved_like(q, {H, n, d.dk, d.dv});
  const Saved saved{a.data_ptr<T>(), t.data_ptr<T>(), p.data_ptr<T>(),
                    w.data_ptr<T>(), nn.data_ptr<T>(), s.data_ptr<T>()};
  const T *qp = q.data_ptr<T>(), *kp = k.data_ptr<T>(), *vp = v.data_ptr<T>();
  const T* bp = beta.data_ptr<T>();
  T* op = out.data_ptr<T>();
  linvit::each_task(H, [&](int64_t h) {
    for (int64_t dir = 0; dir < 2; ++dir)
      forward_scan(d, h, dir == 1, qp, kp, vp, bp + dir * H * d.tokens, op, saved);
  });
  return {out, a, t, p, w, nn, s};
}

// Row-wise dot products of (C, D) blocks, subtracted from or added to out (C).
inline void dots(const T* a, const T* b, int64_t C, int64_t D, T sign, T* out) {
  for (int64_t i = 0; i < C; ++i) {
    T acc = 0;
    for (int64_t c = 0; c < D; ++c) acc += a[i * D + c] * b[i * D + c];
    out[i] += sign * acc;
  }
}

struct Grads {
  T *dq, *dk, *dv, *dbeta;
};

// The gradients of one chunk's inputs, given dN (the values' full gradient): through
// N = T diag(beta) (V - K S) ... as in _ChunkedDeltaRule.backward; dq, dk, dv written (first
// direction) or added to (second); dbeta is per direction.
void chunk_grads(const Shape& d, bool backward, const T* qc, const T* kc, const T* vc,
                 const T* bc, const T* doc, const Saved& x, const T* dn, const T* dp,
                 T* dqc, T* dkc, T* dvc, T* dbc) {
  const int64_t C = d.chunk, Dk = d.dk, Dv = d.dv;
  T *z = scratch(kZ, C * Dv), *zn = scratch(kZn, C * C), *zs = scratch(kZs, C * Dk);
  T* xs = scratch(kX, C * C);
  gemm(true, false, C, Dv, C, x.t, C, dn, Dv, 0, z, Dv);           // Z = T^T dN
  gemm(false, true, C, C, Dv, z, Dv, x.n, Dv, 0, zn, C);           // Z N^T, strict side
  keep_side(zn, C, backward, false);
  gemm(false, true, C, Dk, Dv, z, Dv, x.s, Dv, 0, zs, Dk);         // Z S^T
  std::fill(dbc, dbc + C, T(0));
  dots(z, vc, C, Dv, 1, dbc);
  dots(kc, zs, C, Dk, -1, dbc);
  dots(zn, x.a, C, C, -1, dbc);
  for (int64_t i = 0; i < C; ++i) {
    for (int64_t c = 0; c < Dk; ++c) dkc[i * Dk + c] -= bc[i] * zs[i * Dk + c];
    for (int64_t j = 0; j < C; ++j) zn[i * C + j] *= bc[i];        // X = diag(beta) Z N^T
  }
  for (int64_t i = 0; i < C; ++i)
    for (int64_t j = 0; j < C; ++j) xs[i * C + j] = zn[i * C + j] + zn[j * C + i];
  gemm(false, false, C, Dk, C, xs, C, kc, Dk, 1, dkc, Dk, T(-1));  // - (X + X^T) K
  gemm(true, false, C, Dk, C, dp, C, qc, Dk, 1, dkc, Dk);          // + dP^T Q
  gemm(false, true, C, Dk, Dv, doc, Dv, x.s, Dv, backward ? 1 : 0, dqc, Dk);  // dO S^T
  gemm(false, false, C, Dk, C, dp, C, kc, Dk, 1, dqc, Dk);         // + dP K
  for (int64_t i = 0; i < C; ++i)
    for (int64_t c = 0; c < Dv; ++c)
      dvc[i * Dv + c] = (backward ? dvc[i * Dv + c] : T(0)) + bc[i] * z[i * Dv + c];
}

// One direction of one head, backward: the chunks in the reverse of the scan's order.
void backward_scan(const Shape& d, int64_t h, bool backward, const T* g, const T* q, const T* k,
                   const T* v, const T* beta, const Saved& saved, const Grads& out) {
  const int64_t C = d.chunk, Dk = d.dk, Dv = d.dv;
  T *G = scratch(kG, Dk * Dv), *dp = scratch(kDp, C * C), *dn = scratch(kDn, C * Dv);
  std::fill(G, G + Dk * Dv, T(0));
  for (int64_t step = 0; step < d.chunks; ++step) {
    const int64_t c = backward ? step : d.chunks - 1 - step, r0 = h * d.tokens + c * C;
    const T *qc = q + r0 * Dk, *kc = k + r0 * Dk, *doc = g + r0 * Dv;
    const Saved x = saved.at(d, backward, h, c);
    gemm(false, true, C, C, Dv, doc, Dv, x.n, Dv, 0, dp, C);        // dP = dO N^T, P's side
    keep_side(dp, C, backward, true);
    gemm(true, false, C, Dv, C, x.p, C, doc, Dv, 0, dn, Dv);        // dN = P^T dO + K G
    gemm(false, false, C, Dv, Dk, kc, Dk, G, Dv, 1, dn, Dv);
    T* dkc = out.dk + r0 * Dk;
    gemm(false, true, C, Dk, Dv, x.n, Dv, G, Dv, backward ? 1 : 0, dkc, Dk);  // N G^T
    gemm(true, false, Dk, Dv, C, qc, Dk, doc, Dv, 1, G, Dv);        // G + Q^T dO - W^T dN
    gemm(true, false, Dk, Dv, C, x.w, Dk, dn, Dv, 1, G, Dv, T(-1));
    const int64_t rb = (backward ? d.heads * d.tokens : 0) + r0;
    chunk_grads(d, backward, qc, kc, v + r0 * Dv, beta + r0, doc, x, dn, dp, out.dq + r0 * Dk,
                dkc, out.dv + r0 * Dv, out.dbeta + rb);
  }
}

std::vector<at::Tensor> backward(const at::Tensor& g, const at::Tensor& q, const at::Tensor& k,
                                 const at::Tensor& v, const at::Tensor& beta,
                                 const std::vector<at::Tensor>& saved_tensors, int64_t chunk) {
  const Shape d = shape_of(q, k, v, beta, chunk);
  check(g, "grad", 3);
  TORCH_CHECK(g.sizes() == v.sizes(), "linvit delta rule: grad must have v's shape");
  TORCH_CHECK(saved_tensors.size() == 6, "linvit delta rule: expects the forward's 6 tensors");
  for (const auto& t : saved_tensors) check(t, "a saved tensor", t.dim());
  const int64_t H = d.heads;
  auto dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  auto dbeta = at::empty_like(beta);
  const auto& s = saved_tensors;
  const Saved saved{s[0].data_ptr<T>(), s[1].data_ptr<T>(), s[2].data_ptr<T>(),
                    s[3].data_ptr<T>(), s[4].data_ptr<T>(), s[5].data_ptr<T>()};
  const Grads out{dq.data_ptr<T>(), dk.data_ptr<T>(), dv.data_ptr<T>(), dbeta.data_ptr<T>()};
  const T *gp = g.data_ptr<T>(), *qp = q.data_ptr<T>(), *kp = k.data_ptr<T>();
  const T *vp = v.data_ptr<T>(), *bp = beta.data_ptr<T>();
  linvit::each_task(H, [&](int64_t h) {
    for (int64_t dir = 0; dir < 2; ++dir)
      backward_scan(d, h, dir == 1, gp, qp, kp, vp, bp + dir * H * d.tokens, saved, out);
  });
  return {dq, dk, dv, dbeta};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(linvit_cpu, m) {
  m.def("delta_forward(Tensor q, Tensor k, Tensor v, Tensor beta, int chunk) -> Tensor[]");
  m.def("delta_backward(Tensor g, Tensor q, Tensor k, Tensor v, Tensor beta, Tensor[] saved, "
        "int chunk) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(linvit_cpu, CPU, m) {
  m.impl("delta_forward", &forward);
  m.impl("delta_backward", &backward);
}
