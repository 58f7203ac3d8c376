// Bidirectional linear attention on the CPU, fused in row blocks (linvit.ops.cpp_kernels).
//
//   o_i = phi(q_i) S / (phi(q_i) z + eps)  (or phi(q_i) S),  S = sum_j phi(k_j)^T v_j,
//   z = sum_j phi(k_j),  phi = identity or elu(x) + 1.
//
// Why C++: the PyTorch path (fused_torch.py) makes some forty passes over (N, d) tensors around
// its six matrix products (feature maps, their derivatives, the normaliser), each a trip through
// memory. Here every (head, block of rows) is one task: the feature map, the normaliser and the
// derivatives are computed on the block while it sits in cache, and the products run on the
// block (one thread each, the tasks in parallel). The sums over all rows (S, z and their
// gradients) are taken per block and added up after. Same maths and formulas as fused_torch.py,
// whose docstring writes out the backward pass; the tests hold both to the einsum reference.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "feature_maps.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <type_traits>
#include <vector>

// BLAS as torch's x86 wheels export it (MKL's Fortran interface): one block's products run as
// one plain call each, with none of at::mm's dispatch, checks and allocation per call, which
// cost more than the product itself at these sizes. Inside the parallel tasks MKL runs on the
// calling thread.
extern "C" {
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*,
            const float*, const int*, const float*, const int*, const float*, float*, const int*);
// MKL threads its own calls even inside another parallel region (torch turns its dynamic
// adjustment off): each task asks for one thread, weak so that other BLAS builds still load.
int MKL_Set_Num_Threads_Local(int) __attribute__((weak));
}

namespace {

// Row-major C (m x n) = op(A) op(B) + beta C, op(X) = X^T where the flag says; lda, ldb, ldc the
// row strides. BLAS is column-major: it computes C^T = op(B)^T op(A)^T on the same memory.
template <typename T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
          const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  const char opa = tb ? 'T' : 'N', opb = ta ? 'T' : 'N';
  const int M = n, N = m, K = k, LA = ldb, LB = lda, LC = ldc;
  static_assert(std::is_same_v<T, float>, "linvit's cores compute in float32");
  const T one = 1;
  sgemm_(&opa, &opb, &M, &N, &K, &one, b, &LA, a, &LB, &beta, c, &LC);
}

using linvit::Feature;
using linvit::T;

// A scratch buffer per thread, reused across tasks and calls (no allocation per block).
T* scratch(int slot, int64_t size) {
  thread_local std::vector<T> buffers[3];
  if ((int64_t)buffers[slot].size() < size) buffers[slot].resize(size);
  return buffers[slot].data();
}

// The tasks: (head, block of rows), rows [lo, hi) of head h; `index` numbers the head's blocks.
struct Blocks {
  int64_t heads, tokens, rows, count;
  Blocks(int64_t h, int64_t n, int64_t r) : heads(h), tokens(n), rows(r), count((n + r - 1) / r) {}
};

template <typename F>
void each_block(const Blocks& b, F fn) {
  at::parallel_for(0, b.heads * b.count, 1, [&](int64_t begin, int64_t end) {
    const int before = MKL_Set_Num_Threads_Local ? MKL_Set_Num_Threads_Local(1) : 0;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t h = t / b.count, index = t % b.count, lo = index * b.rows;
      fn(h, index, lo, std::min(b.tokens, lo + b.rows));
    }
    if (MKL_Set_Num_Threads_Local) MKL_Set_Num_Threads_Local(before);
  });
}

// (out, s, z): out (BH, N, Dv), s (BH, Dk, Dv), z (BH, Dk) (empty when not normalised).
std::tuple<at::Tensor, at::Tensor, at::Tensor> forward_impl(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Feature& f,
    bool normalize, double eps, int64_t rows) {
  const int64_t H = q.size(0), N = q.size(1), Dk = q.size(2), Dv = v.size(2);
  const Blocks b(H, N, rows);
  auto opts = q.options();
  auto s_part = at::empty({H, b.count, Dk, Dv}, opts);
  auto z_part = at::zeros({H, b.count, Dk}, opts);
  const T *qp = q.data_ptr<T>(), *kp = k.data_ptr<T>(), *vp = v.data_ptr<T>();
  T *sp = s_part.data_ptr<T>(), *zp = z_part.data_ptr<T>();
  each_block(b, [&](int64_t h, int64_t index, int64_t lo, int64_t hi) {
    const int64_t R = hi - lo, part = h * b.count + index;
    T* phi = scratch(0, R * Dk);
    linvit::features(kp + (h * N + lo) * Dk, phi, R, Dk, f, h);
    gemm<T>(true, false, Dk, Dv, R, phi, Dk, vp + (h * N + lo) * Dv, Dv, T(0),
            sp + part * Dk * Dv, Dv);                                  // phi_k^T v
    T* zs = zp + part * Dk;
    for (int64_t i = 0; i < R; ++i)
      for (int64_t c = 0; c < Dk; ++c) zs[c] += phi[i * Dk + c];
  });
  auto s = s_part.sum(1);
  auto z = normalize ? z_part.sum(1) : at::empty({0}, opts);
  auto out = at::empty({H, N, Dv}, opts);
  const T *sh = s.data_ptr<T>(), *zh = normalize ? z.data_ptr<T>() : nullptr;
  T* o = out.data_ptr<T>();
  each_block(b, [&](int64_t h, int64_t, int64_t lo, int64_t hi) {
    const int64_t R = hi - lo;
    T *phi = scratch(0, R * Dk), *op = o + (h * N + lo) * Dv;
    linvit::features(qp + (h * N + lo) * Dk, phi, R, Dk, f, h);
    gemm<T>(false, false, R, Dv, Dk, phi, Dk, sh + h * Dk * Dv, Dv, T(0), op, Dv);  // phi_q S
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

// The pointers backward reads and writes, with the sizes.
struct Grads {
  const T *g, *q, *k, *v, *out, *s, *z;
  T *dq, *dk, *dv, *ds_part, *dz_part, *dsp_part;
  int64_t N, Dk, Dv, count;
  Feature f;
  bool normalize;
  double eps;
};

// The query side of backward for one block: its dq rows, and its shares of dS and dz.
void query_block(const Grads& a, int64_t h, int64_t index, int64_t lo, int64_t hi) {
  const int64_t R = hi - lo, Dk = a.Dk, Dv = a.Dv, part = h * a.count + index;
  T* phi = scratch(0, R * Dk);
  const T* x = a.q + (h * a.N + lo) * Dk;
  linvit::features(x, phi, R, Dk, a.f, h);
  const T *g = a.g + (h * a.N + lo) * Dv, *dn = g;
  const T* z = a.normalize ? a.z + h * Dk : nullptr;
  T* dden = scratch(2, R);
  if (a.normalize) {  // dnum = g / den, dden = -(dnum . o): o is the normalised output
    T* dnum = scratch(1, R * Dv);
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
  T* dq = a.dq + (h * a.N + lo) * Dk;
  gemm<T>(false, true, R, Dk, Dv, dn, Dv, a.s + h * Dk * Dv, Dv, T(0), dq, Dk);  // dnum S^T
  gemm<T>(true, false, Dk, Dv, R, phi, Dk, dn, Dv, T(0), a.ds_part + part * Dk * Dv,
          Dv);                                                                  // phi^T dnum
  if (a.normalize) {  // dphi_q += dden z^T; dz += phi^T dden
    T* dz = a.dz_part + part * Dk;
    for (int64_t i = 0; i < R; ++i)
      for (int64_t c = 0; c < Dk; ++c) {
        dz[c] += phi[i * Dk + c] * dden[i];
        dq[i * Dk + c] += dden[i] * z[c];
      }
  }
  linvit::through_features(x, phi, dq, R, Dk, a.f, h, a.dsp_part + part * Dk);
}

// The key side of backward for one block: its dk and dv rows, from the summed dS and dz.
void key_block(const Grads& a, const T* ds, const T* dz, int64_t h, int64_t index, int64_t lo,
               int64_t hi) {
  const int64_t R = hi - lo, Dk = a.Dk, Dv = a.Dv;
  T* phi = scratch(0, R * Dk);
  const T* x = a.k + (h * a.N + lo) * Dk;
  linvit::features(x, phi, R, Dk, a.f, h);
  T* dk = a.dk + (h * a.N + lo) * Dk;
  const T* dsh = ds + h * Dk * Dv;
  gemm<T>(false, true, R, Dk, Dv, a.v + (h * a.N + lo) * Dv, Dv, dsh, Dv, T(0), dk,
          Dk);                                                           // v dS^T (+ dz)
  gemm<T>(false, false, R, Dv, Dk, phi, Dk, dsh, Dv, T(0), a.dv + (h * a.N + lo) * Dv,
          Dv);                                                           // dv = phi_k dS
  if (a.normalize) {
    const T* dzh = dz + h * Dk;
    for (int64_t i = 0; i < R; ++i)
      for (int64_t c = 0; c < Dk; ++c) dk[i * Dk + c] += dzh[c];
  }
  linvit::through_features(x, phi, dk, R, Dk, a.f, h, a.dsp_part + (h * a.count + index) * Dk);
}

// (dq, dk, dv, dsp): dsp (BH, Dk) is dL/d softplus(s) for the focused map, else empty.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_impl(
    const at::Tensor& g, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& s, const at::Tensor& z, const Feature& f,
    bool normalize, double eps, int64_t rows) {
  const int64_t H = q.size(0), N = q.size(1), Dk = q.size(2), Dv = v.size(2);
  const Blocks b(H, N, rows);
  auto opts = q.options();
  auto dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  auto ds_part = at::empty({H, b.count, Dk, Dv}, opts);
  auto dz_part = at::zeros({H, b.count, Dk}, opts);
  auto dsp_part = at::zeros({f.kind == linvit::kFocused ? H : 0, b.count, Dk}, opts);
  const Grads a{g.data_ptr<T>(), q.data_ptr<T>(), k.data_ptr<T>(), v.data_ptr<T>(),
                out.data_ptr<T>(), s.data_ptr<T>(), normalize ? z.data_ptr<T>() : nullptr,
                dq.data_ptr<T>(), dk.data_ptr<T>(), dv.data_ptr<T>(), ds_part.data_ptr<T>(),
                dz_part.data_ptr<T>(), dsp_part.data_ptr<T>(), N, Dk, Dv, b.count, f, normalize,
                eps};
  each_block(b, [&](int64_t h, int64_t index, int64_t lo, int64_t hi) {
    query_block(a, h, index, lo, hi);
  });
  auto ds = ds_part.sum(1), dz = dz_part.sum(1);
  const T *dsp = ds.data_ptr<T>(), *dzp = dz.data_ptr<T>();
  each_block(b, [&](int64_t h, int64_t index, int64_t lo, int64_t hi) {
    key_block(a, dsp, dzp, h, index, lo, hi);
  });
  return {dq, dk, dv, dsp_part.sum(1)};
}

void check(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.dim() == 3 && t.is_contiguous() &&
                  t.scalar_type() == at::kFloat,
              "linvit linear attention: ", name, " must be a contiguous float32 (B*H, N, d) CPU "
              "tensor");
}

// The feature map of the call: `sp`, for the focused map, is softplus(s) as (B*H, Dk).
Feature feature(const at::Tensor& q, int64_t kind, const c10::optional<at::Tensor>& sp,
                double p, int64_t rows) {
  TORCH_CHECK(rows > 0, "linvit linear attention: rows must be positive");
  TORCH_CHECK(kind >= linvit::kIdentity && kind <= linvit::kFocused,
              "linvit linear attention: unknown feature map code ", kind);
  if (kind != linvit::kFocused) return {kind, nullptr, T(p)};
  TORCH_CHECK(sp.has_value() && sp->is_contiguous() && sp->scalar_type() == at::kFloat &&
                  sp->dim() == 2 && sp->size(0) == q.size(0) && sp->size(1) == q.size(2),
              "linvit linear attention: the focused map needs softplus(s) as a contiguous "
              "float32 (B*H, Dk) tensor");
  return {kind, sp->data_ptr<T>(), T(p)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t kind, bool normalize,
    double eps, int64_t rows, const c10::optional<at::Tensor>& sp, double p) {
  check(q, "q"), check(k, "k"), check(v, "v");
  return forward_impl(q, k, v, feature(q, kind, sp, p, rows), normalize, eps, rows);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward(
    const at::Tensor& g, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& s, const at::Tensor& z, int64_t kind,
    bool normalize, double eps, int64_t rows, const c10::optional<at::Tensor>& sp, double p) {
  check(g, "grad"), check(q, "q"), check(k, "k"), check(v, "v"), check(out, "out");
  return backward_impl(g, q, k, v, out, s.contiguous(), z.contiguous(),
                       feature(q, kind, sp, p, rows), normalize, eps, rows);
}

}  // namespace

// Schemas here, CPU kernels below: the ops have no autograd or composite kernel of their own
// (CppLinearAttention in Python is their autograd), and torch.compile gets their shapes from the
// fake kernels that linvit.ops.cpp_kernels registers.
TORCH_LIBRARY(linvit_cpu, m) {
  m.def("linear_forward(Tensor q, Tensor k, Tensor v, int kind, bool normalize, float eps, "
        "int rows, Tensor? sp, float p) -> (Tensor, Tensor, Tensor)");
  m.def("linear_backward(Tensor g, Tensor q, Tensor k, Tensor v, Tensor out, Tensor s, "
        "Tensor z, int kind, bool normalize, float eps, int rows, Tensor? sp, float p) -> "
        "(Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(linvit_cpu, CPU, m) {
  m.impl("linear_forward", &forward);
  m.impl("linear_backward", &backward);
}
