// Bidirectional linear attention on the CPU, fused in row blocks (linvit.ops.cpp_kernels).
//
//   o_i = phi(q_i) S / (phi(q_i) z + eps)  (or phi(q_i) S),  S = sum_j phi(k_j)^T v_j,
//   z = sum_j phi(k_j),  phi one of feature_maps.h's maps (its own for queries and keys).
//
// Why C++: the PyTorch path (fused_torch.py and the operators' feature maps) makes dozens of
// passes over (N, d) tensors around its matrix products, each a trip through memory. Here every
// (head, block of rows) is one task: the feature map, the normaliser and the derivatives are
// computed on the block while it sits in cache, and the products run on the block (one thread
// each, the tasks in parallel). The sums over all rows (S, z, and the gradients of S, z and the
// maps' parameters) are taken per block and added up after. Same formulas as fused_torch.py,
// whose docstring writes out the backward pass; the tests hold both to the einsum reference.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "blas.h"
#include "feature_maps.h"

namespace {

using linvit::Feature;
using linvit::FeatureGrads;
using linvit::gemm;
using linvit::scratch;
using linvit::T;

// The tasks: (head, block of rows), rows [lo, hi) of head h; `index` numbers the head's blocks.
struct Blocks {
  int64_t heads, tokens, rows, count;
  Blocks(int64_t h, int64_t n, int64_t r) : heads(h), tokens(n), rows(r), count((n + r - 1) / r) {}
};

template <typename F>
void each_block(const Blocks& b, F fn) {
  linvit::each_task(b.heads * b.count, [&](int64_t t) {
    const int64_t h = t / b.count, index = t % b.count, lo = index * b.rows;
    fn(h, index, lo, std::min(b.tokens, lo + b.rows));
  });
}

// [mean_t k, mean_t v] per head, (BH, Dk + Dv): column sums per block, added up.
at::Tensor column_means(const at::Tensor& k, const at::Tensor& v, const Blocks& b) {
  const int64_t N = k.size(1), Dk = k.size(2), Dv = v.size(2), W = Dk + Dv;
  auto sums = at::zeros({b.heads, b.count, W}, k.options());
  const T *kp = k.data_ptr<T>(), *vp = v.data_ptr<T>();
  T* sp = sums.data_ptr<T>();
  each_block(b, [&](int64_t h, int64_t index, int64_t lo, int64_t hi) {
    T* out = sp + (h * b.count + index) * W;
    for (int64_t i = lo; i < hi; ++i) {
      for (int64_t c = 0; c < Dk; ++c) out[c] += kp[(h * N + i) * Dk + c];
      for (int64_t c = 0; c < Dv; ++c) out[Dk + c] += vp[(h * N + i) * Dv + c];
    }
  });
  return sums.sum(1).div_(N);
}

// (out, s, z): out (BH, N, Dv), s (BH, Dk, Dv), z (BH, Dk) (empty when not normalised).
std::tuple<at::Tensor, at::Tensor, at::Tensor> forward_impl(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Feature& fq,
    const Feature& fk, bool normalize, double eps, int64_t rows) {
  const int64_t H = q.size(0), N = q.size(1), Dx = fq.dx, Dk = fq.dk, Dv = v.size(2);
  const Blocks b(H, N, rows);
  auto opts = q.options();
  const bool centred = fq.kind == linvit::kInline;
  const T *qp = q.data_ptr<T>(), *kp = k.data_ptr<T>(), *vp = v.data_ptr<T>();
  // InLine: the means of k and v first, so that its keys are centred in each block before the
  // product (S - N kbar vbar^T on the sums would cancel digits when the means dominate)
  const auto means = centred ? column_means(k, v, b) : at::Tensor();
  const T* mp = centred ? means.data_ptr<T>() : nullptr;
  auto s_part = at::empty({H, b.count, Dk, Dv}, opts);
  auto z_part = at::zeros({normalize ? H : 0, b.count, Dk}, opts);
  T *sp = s_part.data_ptr<T>(), *zp = z_part.data_ptr<T>();
  each_block(b, [&](int64_t h, int64_t index, int64_t lo, int64_t hi) {
    const int64_t R = hi - lo, part = h * b.count + index;
    T* phi = scratch(linvit::kPhi, R * Dk);
    linvit::features(kp + (h * N + lo) * Dx, phi, R, fk, h);
    const T* vr = vp + (h * N + lo) * Dv;
    if (centred) {  // (k - kbar)^T (v - vbar): equal to (k - kbar)^T v, without the rounding
      const T *kbar = mp + h * (Dk + Dv), *vbar = kbar + Dk;  // that sum_t (k_t - kbar) leaves
      T* vc = scratch(linvit::kNum, R * Dv);
      for (int64_t i = 0; i < R; ++i) {
        for (int64_t c = 0; c < Dk; ++c) phi[i * Dk + c] -= kbar[c];
        for (int64_t c = 0; c < Dv; ++c) vc[i * Dv + c] = vr[i * Dv + c] - vbar[c];
      }
      vr = vc;
    }
    gemm(true, false, Dk, Dv, R, phi, Dk, vr, Dv, T(0), sp + part * Dk * Dv, Dv);  // phi_k^T v
    if (!normalize) return;
    T* zs = zp + part * Dk;
    for (int64_t i = 0; i < R; ++i)
      for (int64_t c = 0; c < Dk; ++c) zs[c] += phi[i * Dk + c];
  });
  auto s = s_part.sum(1);
  auto z = normalize ? z_part.sum(1) : at::empty({0}, opts);
  if (centred) {  // s (K - kbar)^T V; z carries [kbar, vbar] for the output and backward
    s.mul_(fq.p);
    z = means;
  }
  auto out = at::empty({H, N, Dv}, opts);
  const T *sh = s.data_ptr<T>(), *zh = normalize ? z.data_ptr<T>() : nullptr;
  T* o = out.data_ptr<T>();
  each_block(b, [&](int64_t h, int64_t, int64_t lo, int64_t hi) {
    const int64_t R = hi - lo;
    T *phi = scratch(linvit::kPhi, R * Dk), *op = o + (h * N + lo) * Dv;
    linvit::features(qp + (h * N + lo) * Dx, phi, R, fq, h);
    gemm(false, false, R, Dv, Dk, phi, Dk, sh + h * Dk * Dv, Dv, T(0), op, Dv);  // phi_q S
    if (centred) {  // + mean_t v
      const T* vbar = z.data_ptr<T>() + h * (Dk + Dv) + Dk;
      for (int64_t i = 0; i < R; ++i)
        for (int64_t c = 0; c < Dv; ++c) op[i * Dv + c] += vbar[c];
    }
    if (!normalize) return;
    const T* zr = zh + h * Dk;
    for (int64_t i = 0; i < R; ++i) {
      T den = T(eps);
      for (int64_t c = 0; c < Dk; ++c) den += phi[i * Dk + c] * zr[c];
      const T inv = T(1) / den;
      for (int64_t c = 0; c < Dv; ++c) op[i * Dv + c] *= inv;
    }
  });
  return {out, s, z};
}

// One side's per-block partial sums of its map's parameter gradients: (BH, blocks, size).
struct ParamParts {
  at::Tensor dsp, dw, db;
  ParamParts(const Feature& f, int64_t H, int64_t count, const at::TensorOptions& opts) {
    const bool focused = f.kind == linvit::kFocused, hedgehog = f.kind == linvit::kHedgehog;
    dsp = at::zeros({focused ? H : 0, count, f.dx}, opts);
    dw = at::zeros({hedgehog ? H : 0, count, f.dx, f.dx}, opts);
    db = at::zeros({hedgehog ? H : 0, count, f.dx}, opts);
  }
  FeatureGrads slot(int64_t part, int64_t dx) const {
    auto ptr = [&](const at::Tensor& t, int64_t size) {
      return t.numel() ? t.data_ptr<T>() + part * size : nullptr;
    };
    return {ptr(dsp, dx), ptr(dw, dx * dx), ptr(db, dx)};
  }
  std::vector<at::Tensor> sums() const {
    std::vector<at::Tensor> out;
    for (const auto* t : {&dsp, &dw, &db})
      if (t->numel()) out.push_back(t->sum(1));
    return out;
  }
};

// The pointers backward reads and writes, with the sizes.
struct Grads {
  const T *g, *q, *k, *v, *out, *s, *z;
  T *dq, *dk, *dv, *ds_part, *dz_part, *gsum_part;  // gsum: InLine's column sums of grad
  int64_t N, Dv, count;
  Feature fq, fk;
  const ParamParts *pq, *pk;
  bool normalize;
  double eps;
};

// The query side of backward for one block: its dq rows, and its shares of dS, dz and the
// query map's parameter gradients.
void query_block(const Grads& a, int64_t h, int64_t index, int64_t lo, int64_t hi) {
  const int64_t R = hi - lo, Dx = a.fq.dx, Dk = a.fq.dk, Dv = a.Dv, part = h * a.count + index;
  T* phi = scratch(linvit::kPhi, R * Dk);
  const T* x = a.q + (h * a.N + lo) * Dx;
  linvit::features(x, phi, R, a.fq, h);
  const T *g = a.g + (h * a.N + lo) * Dv, *dn = g;
  const T* z = a.normalize ? a.z + h * Dk : nullptr;
  T* dden = scratch(linvit::kDen, R);
  if (a.normalize) {  // dnum = g / den, dden = -(dnum . o): o is the normalised output
    T* dnum = scratch(linvit::kNum, R * Dv);
    const T* o = a.out + (h * a.N + lo) * Dv;
    for (int64_t i = 0; i < R; ++i) {
      T den = T(a.eps), dot = T(0);
      for (int64_t c = 0; c < Dk; ++c) den += phi[i * Dk + c] * z[c];
      const T inv = T(1) / den;
      for (int64_t c = 0; c < Dv; ++c) {
        dnum[i * Dv + c] = g[i * Dv + c] * inv;
        dot += dnum[i * Dv + c] * o[i * Dv + c];
      }
      dden[i] = -dot;
    }
    dn = dnum;
  }
  T* dq = a.dq + (h * a.N + lo) * Dx;
  T* dphi = Dk == Dx ? dq : scratch(linvit::kDphi, R * Dk);
  gemm(false, true, R, Dk, Dv, dn, Dv, a.s + h * Dk * Dv, Dv, T(0), dphi, Dk);  // dnum S^T
  gemm(true, false, Dk, Dv, R, phi, Dk, dn, Dv, T(0), a.ds_part + part * Dk * Dv,
       Dv);                                                                     // phi^T dnum
  if (a.normalize) {  // dphi_q += dden z^T; dz += phi^T dden
    T* dz = a.dz_part + part * Dk;
    for (int64_t i = 0; i < R; ++i)
      for (int64_t c = 0; c < Dk; ++c) {
        dz[c] += phi[i * Dk + c] * dden[i];
        dphi[i * Dk + c] += dden[i] * z[c];
      }
  }
  if (a.fq.kind == linvit::kInline) {  // the mean of V's share: dv += sum_t g_t / N
    T* gs = a.gsum_part + part * Dv;
    for (int64_t i = 0; i < R; ++i)
      for (int64_t c = 0; c < Dv; ++c) gs[c] += g[i * Dv + c];
  }
  linvit::through_features(x, phi, dphi, dq, R, a.fq, h, a.pq->slot(part, Dx));
}

// InLine's key side: dk = (v - vbar) dS^T, dv = (k - kbar) dS + gbar, with dS already scaled.
void centred_key_block(const Grads& a, const T* ds, const T* gbar, int64_t h, int64_t lo,
                       int64_t hi) {
  const int64_t R = hi - lo, Dk = a.fk.dx, Dv = a.Dv;
  const T *kbar = a.z + h * (Dk + Dv), *vbar = kbar + Dk, *dsh = ds + h * Dk * Dv;
  T *kc = scratch(linvit::kPhi, R * Dk), *vc = scratch(linvit::kDphi, R * Dv);
  const T *kr = a.k + (h * a.N + lo) * Dk, *vr = a.v + (h * a.N + lo) * Dv;
  for (int64_t i = 0; i < R; ++i) {
    for (int64_t c = 0; c < Dk; ++c) kc[i * Dk + c] = kr[i * Dk + c] - kbar[c];
    for (int64_t c = 0; c < Dv; ++c) vc[i * Dv + c] = vr[i * Dv + c] - vbar[c];
  }
  gemm(false, true, R, Dk, Dv, vc, Dv, dsh, Dv, T(0), a.dk + (h * a.N + lo) * Dk, Dk);
  T* dv = a.dv + (h * a.N + lo) * Dv;
  gemm(false, false, R, Dv, Dk, kc, Dk, dsh, Dv, T(0), dv, Dv);
  const T* gb = gbar + h * Dv;
  for (int64_t i = 0; i < R; ++i)
    for (int64_t c = 0; c < Dv; ++c) dv[i * Dv + c] += gb[c];
}

// The key side of backward for one block: its dk and dv rows, from the summed dS and dz.
void key_block(const Grads& a, const T* ds, const T* dz, int64_t h, int64_t index, int64_t lo,
               int64_t hi) {
  const int64_t R = hi - lo, Dx = a.fk.dx, Dk = a.fk.dk, Dv = a.Dv;
  T* phi = scratch(linvit::kPhi, R * Dk);
  const T* x = a.k + (h * a.N + lo) * Dx;
  linvit::features(x, phi, R, a.fk, h);
  T* dk = a.dk + (h * a.N + lo) * Dx;
  T* dphi = Dk == Dx ? dk : scratch(linvit::kDphi, R * Dk);
  const T* dsh = ds + h * Dk * Dv;
  gemm(false, true, R, Dk, Dv, a.v + (h * a.N + lo) * Dv, Dv, dsh, Dv, T(0), dphi,
       Dk);                                                               // v dS^T (+ dz)
  gemm(false, false, R, Dv, Dk, phi, Dk, dsh, Dv, T(0), a.dv + (h * a.N + lo) * Dv,
       Dv);                                                               // dv = phi_k dS
  if (a.normalize) {
    const T* dzh = dz + h * Dk;
    for (int64_t i = 0; i < R; ++i)
      for (int64_t c = 0; c < Dk; ++c) dphi[i * Dk + c] += dzh[c];
  }
  const int64_t part = h * a.count + index;
  linvit::through_features(x, phi, dphi, dk, R, a.fk, h, a.pk->slot(part, Dx));
}

// (dq, dk, dv, the maps' parameter gradients: focused [dsp], hedgehog [dwq, dbq, dwk, dbk]).
// For InLine (kInline), z holds [kbar, vbar] per head and s is the centred, scaled state.
std::tuple<at::Tensor, at::Tensor, at::Tensor, std::vector<at::Tensor>> backward_impl(
    const at::Tensor& g, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& s, const at::Tensor& z, const Feature& fq,
    const Feature& fk, bool normalize, double eps, int64_t rows) {
  const int64_t H = q.size(0), N = q.size(1), Dk = fq.dk, Dv = v.size(2);
  const Blocks b(H, N, rows);
  auto opts = q.options();
  auto dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  auto ds_part = at::empty({H, b.count, Dk, Dv}, opts);
  auto dz_part = at::zeros({H, b.count, Dk}, opts);
  const bool centred = fq.kind == linvit::kInline;
  auto gsum_part = at::zeros({centred ? H : 0, b.count, Dv}, opts);
  const ParamParts pq(fq, H, b.count, opts);
  const bool shared = fq.kind == linvit::kFocused;  // one scale for queries and keys
  const ParamParts pk_own(shared ? Feature{} : fk, H, b.count, opts);
  const ParamParts* pk = shared ? &pq : &pk_own;
  const Grads a{g.data_ptr<T>(), q.data_ptr<T>(), k.data_ptr<T>(), v.data_ptr<T>(),
                out.data_ptr<T>(), s.data_ptr<T>(), z.numel() ? z.data_ptr<T>() : nullptr,
                dq.data_ptr<T>(), dk.data_ptr<T>(), dv.data_ptr<T>(), ds_part.data_ptr<T>(),
                dz_part.data_ptr<T>(), gsum_part.data_ptr<T>(), N, Dv, b.count, fq, fk, &pq, pk,
                normalize, eps};
  each_block(b, [&](int64_t h, int64_t index, int64_t lo, int64_t hi) {
    query_block(a, h, index, lo, hi);
  });
  auto ds = ds_part.sum(1), dz = dz_part.sum(1);
  const T *dsp = ds.data_ptr<T>(), *dzp = dz.data_ptr<T>();
  if (centred) {  // S_c = s (S - N kbar vbar^T): the scale reaches dS; gbar = sum_t g_t / N
    ds.mul_(fq.p);
    auto gbar = gsum_part.sum(1).div_(N);
    const T* gb = gbar.data_ptr<T>();
    each_block(b, [&](int64_t h, int64_t, int64_t lo, int64_t hi) {
      centred_key_block(a, dsp, gb, h, lo, hi);
    });
    return {dq, dk, dv, {}};
  }
  each_block(b, [&](int64_t h, int64_t index, int64_t lo, int64_t hi) {
    key_block(a, dsp, dzp, h, index, lo, hi);
  });
  auto params = pq.sums();
  for (auto& t : pk_own.sums()) params.push_back(t);
  return {dq, dk, dv, params};
}

void check(const at::Tensor& t, const char* name, int64_t dim = 3) {
  linvit::check_input(t, "linear attention", name, dim);
}

// The feature maps of queries and keys from the call's `params`: none (identity, elu + 1),
// [softplus(s) (BH, dx)] (focused, both sides), [Wq, bq, Wk, bk] (hedgehog, per side).
std::pair<Feature, Feature> features_of(const at::Tensor& q, int64_t kind, double p,
                                        const std::vector<at::Tensor>& params, int64_t rows) {
  TORCH_CHECK(rows > 0, "linvit linear attention: rows must be positive");
  TORCH_CHECK(kind >= linvit::kIdentity && kind <= linvit::kInline,
              "linvit linear attention: unknown feature map code ", kind);
  const int64_t dx = q.size(2);
  const size_t wanted = kind == linvit::kFocused ? 1 : kind == linvit::kHedgehog ? 4 : 0;
  TORCH_CHECK(params.size() == wanted, "linvit linear attention: feature map ", kind, " takes ",
              wanted, " parameter tensors, got ", params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const bool weight = kind == linvit::kHedgehog && i % 2 == 0;
    check(params[i], "a feature map's parameter", weight ? 3 : 2);
    TORCH_CHECK(params[i].size(0) == q.size(0) && params[i].size(-1) == dx &&
                    (!weight || params[i].size(1) == dx),
                "linvit linear attention: a feature map's parameter has the wrong shape");
  }
  Feature f{kind, dx, kind == linvit::kHedgehog ? 2 * dx : dx, nullptr, T(p), nullptr, nullptr};
  Feature fq = f, fk = f;
  if (kind == linvit::kFocused) fq.sp = fk.sp = params[0].data_ptr<T>();
  if (kind == linvit::kHedgehog) {
    fq.w = params[0].data_ptr<T>(), fq.b = params[1].data_ptr<T>();
    fk.w = params[2].data_ptr<T>(), fk.b = params[3].data_ptr<T>();
  }
  return {fq, fk};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t kind, bool normalize,
    double eps, int64_t rows, const std::vector<at::Tensor>& params, double p) {
  check(q, "q"), check(k, "k"), check(v, "v");
  const auto [fq, fk] = features_of(q, kind, p, params, rows);
  return forward_impl(q, k, v, fq, fk, normalize, eps, rows);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, std::vector<at::Tensor>> backward(
    const at::Tensor& g, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& s, const at::Tensor& z, int64_t kind,
    bool normalize, double eps, int64_t rows, const std::vector<at::Tensor>& params, double p) {
  check(g, "grad"), check(q, "q"), check(k, "k"), check(v, "v"), check(out, "out");
  const auto [fq, fk] = features_of(q, kind, p, params, rows);
  return backward_impl(g, q, k, v, out, s.contiguous(), z.contiguous(), fq, fk, normalize, eps,
                       rows);
}

}  // namespace

// Schemas here, CPU kernels below: the ops have no autograd or composite kernel of their own
// (CppLinearAttention in Python is their autograd), and torch.compile gets their shapes from the
// fake kernels that linvit.ops.cpp_kernels registers.
TORCH_LIBRARY(linvit_cpu, m) {
  m.def("linear_forward(Tensor q, Tensor k, Tensor v, int kind, bool normalize, float eps, "
        "int rows, Tensor[] params, float p) -> (Tensor, Tensor, Tensor)");
  m.def("linear_backward(Tensor g, Tensor q, Tensor k, Tensor v, Tensor out, Tensor s, "
        "Tensor z, int kind, bool normalize, float eps, int rows, Tensor[] params, float p) -> "
        "(Tensor, Tensor, Tensor, Tensor[])");
}

TORCH_LIBRARY_IMPL(linvit_cpu, CPU, m) {
  m.impl("linear_forward", &forward);
  m.impl("linear_backward", &backward);
}
