// BLAS as torch's x86 wheels export it (MKL's Fortran interface), for linvit's C++ kernel: each
// block's products run as one plain call, with none of at::mm's dispatch, checks and allocation,
// which cost more than the product itself at these sizes.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <vector>

extern "C" {
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*,
            const float*, const int*, const float*, const int*, const float*, float*, const int*);
// MKL threads its own calls even inside another parallel region (torch turns its dynamic
// adjustment off): each task asks for one thread; weak, so that other BLAS builds still load.
int MKL_Set_Num_Threads_Local(int) __attribute__((weak));
}

namespace linvit {

using T = float;  // linvit's cores compute in float32 (the Python side casts)

// Row-major C (m x n) = alpha op(A) op(B) + beta C, op(X) = X^T where the flag says; lda, ldb,
// ldc the row strides. BLAS is column-major: it computes C^T = op(B)^T op(A)^T on the same memory.
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
                 const T* b, int64_t ldb, T beta, T* c, int64_t ldc, T alpha = 1) {
  const char opa = tb ? 'T' : 'N', opb = ta ? 'T' : 'N';
  const int M = n, N = m, K = k, LA = ldb, LB = lda, LC = ldc;
  sgemm_(&opa, &opb, &M, &N, &K, &alpha, b, &LA, a, &LB, &beta, c, &LC);
}

// A scratch buffer per thread and slot, reused across tasks and calls. Each kernel numbers its
// own slots: a task of one kernel never runs inside a task of another.
inline T* scratch(int slot, int64_t size) {
  thread_local std::vector<T> buffers[32];
  if ((int64_t)buffers[slot].size() < size) buffers[slot].resize(size);
  return buffers[slot].data();
}

// fn(task) for task in [0, count), the tasks spread over torch's threads, each calling BLAS
// single-threaded.
template <typename F>
void each_task(int64_t count, F fn) {
  at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    const int before = MKL_Set_Num_Threads_Local ? MKL_Set_Num_Threads_Local(1) : 0;
    for (int64_t t = begin; t < end; ++t) fn(t);
    if (MKL_Set_Num_Threads_Local) MKL_Set_Num_Threads_Local(before);
  });
}

// Row helpers for the kernels' elementwise steps: __restrict__ tells the compiler the rows do not
// overlap, which it cannot prove for float pointers, so that these loops vectorise.
inline T dot(const T* __restrict__ a, const T* __restrict__ b, int64_t n) {
  T acc = 0;
  for (int64_t x = 0; x < n; ++x) acc += a[x] * b[x];
  return acc;
}

// y = a x, or y += a x with `add`.
inline void scaled(T a, const T* __restrict__ x, T* __restrict__ y, int64_t n, bool add = false) {
  if (add) {
    for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = a * x[i];
  }
}

// Every op's inputs: contiguous float32 CPU tensors of `dim` dims, or an error naming the op and
// the tensor (the Python side makes them so; this guards direct calls).
inline void check_input(const at::Tensor& t, const char* op, const char* name, int64_t dim) {
  TORCH_CHECK(t.device().is_cpu() && t.dim() == dim && t.is_contiguous() &&
                  t.scalar_type() == at::kFloat,
              "linvit ", op, ": ", name, " must be a contiguous float32 CPU tensor of ", dim,
              " dims");
}

}  // namespace linvit
