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

#include <algorithm>
#include <cmath>
#include <tuple>
#include <type_traits>

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

constexpr int64_t kElu1 = 1;  // the feature map's code; 0 is the identity

// phi(x) row by row into `phi` (rows x d, contiguous), and phi'(x) into `dphi` if given.
template <typename T>
void features(const T* x, T* phi, T* dphi, int64_t count, int64_t kind) {
  if (kind != kElu1) {
    std::copy(x, x + count, phi);
    if (dphi) std::fill(dphi, dphi + count, T(1));
    return;
  }
  for (int64_t i = 0; i < count; ++i) {  // elu(x) + 1 = exp(min(x, 0)) + max(x, 0)
    T e = std::exp(std::min(x[i], T(0)));
    phi[i] = e + std::max(x[i], T(0));
    if (dphi) dphi[i] = e;  // its derivative, exp(min(x, 0))
  }
}

// The tasks: (head, block of rows), rows [lo, hi) of head h.
struct Blocks {
  int64_t heads, tokens, rows, count;
  Blocks(int64_t h, int64_t n, int64_t r) : heads(h), tokens(n), rows(r), count((n + r - 1) / r) {}
  int64_t head(int64_t t) const { return t / count; }
  int64_t lo(int64_t t) const { return (t % count) * rows; }
  int64_t hi(int64_t t) const { return std::min(tokens, lo(t) + rows); }
};

template <typename F>
void each_block(const Blocks& b, F fn) {
  at::parallel_for(0, b.heads * b.count, 1, [&](int64_t begin, int64_t end) {
    const int before = MKL_Set_Num_Threads_Local ? MKL_Set_Num_Threads_Local(1) : 0;
    for (int64_t t = begin; t < end; ++t) fn(t, b.head(t), b.lo(t), b.hi(t));
    if (MKL_Set_Num_Threads_Local) MKL_Set_Num_Threads_Local(before);
  });
}

// (out, s, z): out (BH, N, Dv), s (BH, Dk, Dv), z (BH, Dk) (empty when not normalised).
template <typename T>
std::tuple<at::Tensor, at::Tensor, at::Tensor> forward_impl(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t kind, bool normalize,
    double eps, int64_t rows) {
  const int64_t H = q.size(0), N = q.size(1), Dk = q.size(2), Dv = v.size(2);
  const Blocks b(H, N, rows);
  auto opts = q.options();
  auto s_part = at::zeros({H, b.count, Dk, Dv}, opts);
  auto z_part = at::zeros({H, b.count, Dk}, opts);
  each_block(b, [&](int64_t t, int64_t h, int64_t lo, int64_t hi) {
    auto phi = at::empty({hi - lo, Dk}, opts);
    features(k[h].data_ptr<T>() + lo * Dk, phi.data_ptr<T>(), (T*)nullptr, (hi - lo) * Dk, kind);
    gemm<T>(true, false, Dk, Dv, hi - lo, phi.data_ptr<T>(), Dk, v[h].data_ptr<T>() + lo * Dv,
            Dv, T(0), s_part[h][t % b.count].data_ptr<T>(), Dv);
    T* zp = z_part[h][t % b.count].data_ptr<T>();
    const T* f = phi.data_ptr<T>();
    for (int64_t i = 0; i < hi - lo; ++i)
      for (int64_t c = 0; c < Dk; ++c) zp[c] += f[i * Dk + c];
  });
  auto s = s_part.sum(1);
  auto z = normalize ? z_part.sum(1) : at::empty({0}, opts);
  auto out = at::empty({H, N, Dv}, opts);
  each_block(b, [&](int64_t, int64_t h, int64_t lo, int64_t hi) {
    auto phi = at::empty({hi - lo, Dk}, opts);
    features(q[h].data_ptr<T>() + lo * Dk, phi.data_ptr<T>(), (T*)nullptr, (hi - lo) * Dk, kind);
    T* op = out[h].data_ptr<T>() + lo * Dv;
    gemm<T>(false, false, hi - lo, Dv, Dk, phi.data_ptr<T>(), Dk, s[h].data_ptr<T>(), Dv, T(0),
            op, Dv);
    if (!normalize) return;
    const T *f = phi.data_ptr<T>(), *zh = z[h].data_ptr<T>();
    for (int64_t i = 0; i < hi - lo; ++i) {
      T den = T(eps);
      for (int64_t c = 0; c < Dk; ++c) den += f[i * Dk + c] * zh[c];
      for (int64_t c = 0; c < Dv; ++c) op[i * Dv + c] /= den;
    }
  });
  return {out, s, z};
}

// The query side of backward for one block: dq rows, and this block's shares of dS and dz.
template <typename T>
void query_block(const at::Tensor& q, const at::Tensor& g, const at::Tensor& out,
                 const at::Tensor& s, const at::Tensor& z, at::Tensor& dq, at::Tensor& ds_part,
                 at::Tensor& dz_part, int64_t h, int64_t lo, int64_t hi, int64_t kind,
                 bool normalize, double eps) {
  const int64_t R = hi - lo, Dk = q.size(2), Dv = g.size(2);
  auto opts = q.options();
  auto phi = at::empty({R, Dk}, opts), dphi = at::empty({R, Dk}, opts);
  features(q[h].data_ptr<T>() + lo * Dk, phi.data_ptr<T>(), dphi.data_ptr<T>(), R * Dk, kind);
  at::Tensor dnum = g[h].slice(0, lo, hi);
  auto dden = at::empty({R}, opts);
  if (normalize) {  // dnum = g / den, dden = -(dnum . o): o is the normalised output
    dnum = at::empty({R, Dv}, opts);
    const T *f = phi.data_ptr<T>(), *zh = z[h].data_ptr<T>();
    const T *gp = g[h].data_ptr<T>() + lo * Dv, *op = out[h].data_ptr<T>() + lo * Dv;
    T *dn = dnum.data_ptr<T>(), *dd = dden.data_ptr<T>();
    for (int64_t i = 0; i < R; ++i) {
      T den = T(eps), dot = T(0);
      for (int64_t c = 0; c < Dk; ++c) den += f[i * Dk + c] * zh[c];
      for (int64_t c = 0; c < Dv; ++c) {
        dn[i * Dv + c] = gp[i * Dv + c] / den;
        dot += dn[i * Dv + c] * op[i * Dv + c];
      }
      dd[i] = -dot;
    }
  }
  T* dqp = dq[h].data_ptr<T>() + lo * Dk;
  const T* dn = dnum.data_ptr<T>();
  gemm<T>(false, true, R, Dk, Dv, dn, Dv, s[h].data_ptr<T>(), Dv, T(0), dqp, Dk);  // dnum S^T
  gemm<T>(true, false, Dk, Dv, R, phi.data_ptr<T>(), Dk, dn, Dv, T(0), ds_part.data_ptr<T>(),
          Dv);                                                                   // phi^T dnum
  const T* dp = dphi.data_ptr<T>();
  if (normalize) {
    const T *zh = z[h].data_ptr<T>(), *dd = dden.data_ptr<T>(), *f = phi.data_ptr<T>();
    T* dzp = dz_part.data_ptr<T>();
    for (int64_t i = 0; i < R; ++i)
      for (int64_t c = 0; c < Dk; ++c) {
        dzp[c] += f[i * Dk + c] * dd[i];
        dqp[i * Dk + c] = (dqp[i * Dk + c] + dd[i] * zh[c]) * dp[i * Dk + c];
      }
  } else {
    for (int64_t i = 0; i < R * Dk; ++i) dqp[i] *= dp[i];
  }
}

template <typename T>
std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_impl(
    const at::Tensor& g, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& s, const at::Tensor& z, int64_t kind,
    bool normalize, double eps, int64_t rows) {
  const int64_t H = q.size(0), N = q.size(1), Dk = q.size(2), Dv = v.size(2);
  const Blocks b(H, N, rows);
  auto opts = q.options();
  auto dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  auto ds_part = at::empty({H, b.count, Dk, Dv}, opts);
  auto dz_part = at::zeros({H, b.count, Dk}, opts);
  each_block(b, [&](int64_t t, int64_t h, int64_t lo, int64_t hi) {
    auto dsp = ds_part[h][t % b.count];
    auto dzp = dz_part[h][t % b.count];
    query_block<T>(q, g, out, s, z, dq, dsp, dzp, h, lo, hi, kind, normalize, eps);
  });
  auto ds = ds_part.sum(1);
  auto dz = dz_part.sum(1);
  each_block(b, [&](int64_t, int64_t h, int64_t lo, int64_t hi) {
    const int64_t R = hi - lo;
    auto phi = at::empty({R, Dk}, opts), dphi = at::empty({R, Dk}, opts);
    features(k[h].data_ptr<T>() + lo * Dk, phi.data_ptr<T>(), dphi.data_ptr<T>(), R * Dk, kind);
    T* dkp = dk[h].data_ptr<T>() + lo * Dk;
    gemm<T>(false, true, R, Dk, Dv, v[h].data_ptr<T>() + lo * Dv, Dv, ds[h].data_ptr<T>(), Dv,
            T(0), dkp, Dk);                                          // dphi_k = v dS^T (+ dz)
    gemm<T>(false, false, R, Dv, Dk, phi.data_ptr<T>(), Dk, ds[h].data_ptr<T>(), Dv, T(0),
            dv[h].data_ptr<T>() + lo * Dv, Dv);                      // dv = phi_k dS
    const T *dp = dphi.data_ptr<T>(), *dzh = dz[h].data_ptr<T>();
    for (int64_t i = 0; i < R; ++i)
      for (int64_t c = 0; c < Dk; ++c)
        dkp[i * Dk + c] = (dkp[i * Dk + c] + (normalize ? dzh[c] : T(0))) * dp[i * Dk + c];
  });
  return {dq, dk, dv};
}

void check(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.dim() == 3 && t.is_contiguous() &&
                  t.scalar_type() == at::kFloat,
              "linvit linear attention: ", name, " must be a contiguous float32 (B*H, N, d) CPU "
              "tensor");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(const at::Tensor& q, const at::Tensor& k,
                                                       const at::Tensor& v, int64_t kind,
                                                       bool normalize, double eps, int64_t rows) {
  check(q, "q"), check(k, "k"), check(v, "v");
  TORCH_CHECK(rows > 0, "linvit linear attention: rows must be positive");
  return forward_impl<float>(q, k, v, kind, normalize, eps, rows);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(
    const at::Tensor& g, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& s, const at::Tensor& z, int64_t kind,
    bool normalize, double eps, int64_t rows) {
  check(g, "grad"), check(q, "q"), check(k, "k"), check(v, "v"), check(out, "out");
  TORCH_CHECK(rows > 0, "linvit linear attention: rows must be positive");
  return backward_impl<float>(g, q, k, v, out, s.contiguous(), z.contiguous(), kind, normalize,
                              eps, rows);
}

}  // namespace

// Schemas here, CPU kernels below: the ops have no autograd or composite kernel of their own
// (CppLinearAttention in Python is their autograd), and torch.compile gets their shapes from the
// fake kernels that linvit.ops.cpp_kernels registers.
TORCH_LIBRARY(linvit_cpu, m) {
  m.def("linear_forward(Tensor q, Tensor k, Tensor v, int kind, bool normalize, float eps, "
        "int rows) -> (Tensor, Tensor, Tensor)");
  m.def("linear_backward(Tensor g, Tensor q, Tensor k, Tensor v, Tensor out, Tensor s, "
        "Tensor z, int kind, bool normalize, float eps, int rows) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(linvit_cpu, CPU, m) {
  m.impl("linear_forward", &forward);
  m.impl("linear_backward", &backward);
}
