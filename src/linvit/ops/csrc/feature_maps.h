// The feature maps of linvit's C++ linear-attention kernel, on one block of rows while it is in
// cache: phi(x), and the gradient through phi. Codes and formulas as in linvit.ops.definitions
// (identity, elu + 1) and linvit.ops.focused_features (FLatten's focused map).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace linvit {

using T = float;  // linvit's cores compute in float32 (the Python side casts)

enum Kind : int64_t { kIdentity = 0, kElu1 = 1, kFocused = 2 };
constexpr T kFloor = 1e-6f;  // focused_features.FLOOR

// A feature map with its parameters: for the focused map, softplus(s) per (head, channel) as
// (heads, d), and the focusing power p.
struct Feature {
  int64_t kind;
  const T* sp;
  T p;
};

// x'^p, and x'^(p-1), with the cube written out (vectorised loops; std::pow is not).
template <bool Cube>
inline T pw(T x, T p) { return Cube ? x * x * x : std::pow(x, p); }
template <bool Cube>
inline T pw1(T x, T p) { return Cube ? x * x : std::pow(x, p - T(1)); }

// 1 / softplus(s) of head h, per channel: one division per channel rather than per value.
inline const T* inverse_sp(const Feature& f, int64_t h, int64_t D) {
  thread_local std::vector<T> inv;
  inv.resize(D);
  for (int64_t c = 0; c < D; ++c) inv[c] = T(1) / f.sp[h * D + c];
  return inv.data();
}

// phi = ||x'|| x'^p / ||x'^p||, per row, x' = (relu(x) + floor) / sp.
template <bool Cube>
void focused(const T* x, T* phi, int64_t R, int64_t D, const Feature& f, int64_t h) {
  const T* inv = inverse_sp(f, h, D);
  for (int64_t i = 0; i < R; ++i) {
    T n1 = 0, n2 = 0;
    for (int64_t c = 0; c < D; ++c) {
      const T xs = (std::max(x[i * D + c], T(0)) + kFloor) * inv[c], y = pw<Cube>(xs, f.p);
      phi[i * D + c] = y;
      n1 += xs * xs;
      n2 += y * y;
    }
    const T ratio = std::sqrt(n1 / n2);
    for (int64_t c = 0; c < D; ++c) phi[i * D + c] *= ratio;
  }
}

// With n1 = ||x'||, n2 = ||x'^p||, gd = G . phi (focused_features.py): g_x' =
// p x'^(p-1) (n1 G - phi gd / n1) / n2 + x' gd / n1^2, g_x = g_x' / sp [x > 0]; dsp -= g_x' x'/sp.
template <bool Cube>
void focused_grad(const T* x, const T* phi, T* grad, int64_t R, int64_t D, const Feature& f,
                  int64_t h, T* dsp) {
  const T* inv = inverse_sp(f, h, D);
  for (int64_t i = 0; i < R; ++i) {
    const T *xr = x + i * D, *pr = phi + i * D;
    T* g = grad + i * D;
    T n1 = 0, n2 = 0, gd = 0;
    for (int64_t c = 0; c < D; ++c) {
      const T xs = (std::max(xr[c], T(0)) + kFloor) * inv[c], y = pw<Cube>(xs, f.p);
      n1 += xs * xs;
      n2 += y * y;
      gd += g[c] * pr[c];
    }
    n1 = std::sqrt(n1), n2 = std::sqrt(n2);
    const T a = f.p * n1 / n2, b = f.p * gd / (n1 * n2), e = gd / (n1 * n1);
    for (int64_t c = 0; c < D; ++c) {
      const T xs = (std::max(xr[c], T(0)) + kFloor) * inv[c];
      const T g_xs = pw1<Cube>(xs, f.p) * (a * g[c] - b * pr[c]) + xs * e;
      dsp[c] -= g_xs * xs * inv[c];
      g[c] = xr[c] > T(0) ? g_xs * inv[c] : T(0);
    }
  }
}

// phi(x) of R rows of width D of head h.
inline void features(const T* x, T* phi, int64_t R, int64_t D, const Feature& f, int64_t h) {
  if (f.kind == kIdentity) {
    std::copy(x, x + R * D, phi);
  } else if (f.kind == kElu1) {
    for (int64_t i = 0; i < R * D; ++i)  // elu(x) + 1 = exp(min(x, 0)) + max(x, 0)
      phi[i] = std::exp(std::min(x[i], T(0))) + std::max(x[i], T(0));
  } else if (f.p == T(3)) {  // FLatten's default, with the power written out
    focused<true>(x, phi, R, D, f, h);
  } else {
    focused<false>(x, phi, R, D, f, h);
  }
}

// grad (dL/dphi, R x D, in place) -> dL/dx, read off x and phi; for the focused map, adds
// dL/d softplus(s) of this block to dsp (D).
inline void through_features(const T* x, const T* phi, T* grad, int64_t R, int64_t D,
                             const Feature& f, int64_t h, T* dsp) {
  if (f.kind == kElu1) {  // d(elu + 1)/dx = exp(min(x, 0)) = min(phi, 1)
    for (int64_t i = 0; i < R * D; ++i) grad[i] *= std::min(phi[i], T(1));
    return;
  }
  if (f.kind != kFocused) return;
  if (f.p == T(3))
    focused_grad<true>(x, phi, grad, R, D, f, h, dsp);
  else
    focused_grad<false>(x, phi, grad, R, D, f, h, dsp);
}

}  // namespace linvit
