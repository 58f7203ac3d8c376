// The feature maps of linvit's C++ linear-attention kernel, on one block of rows while it is in
// cache: phi(x), and the gradient through phi (to x and to the map's parameters). Codes and
// formulas as in linvit.ops.definitions (identity, elu + 1), linvit.ops.focused_features
// (FLatten's focused map) and linvit.attention.hedgehog (Hedgehog's softmax features).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "blas.h"

namespace linvit {

// kInline: InLine's core, identity features with the keys centred and scaled and the mean of V
// added (linear_attention.cpp does the centring on the sums; the map itself is the identity).
enum Kind : int64_t { kIdentity = 0, kElu1 = 1, kFocused = 2, kHedgehog = 3, kInline = 4 };
constexpr T kFloor = 1e-6f;  // focused_features.FLOOR

// A feature map of one side (queries or keys) with its parameters, per head of B*H:
// focused: softplus(s) (BH, dx) and the power p; hedgehog: W (BH, dx, dx) and b (BH, dx);
// inline: p is the scale s.
struct Feature {
  int64_t kind, dx, dk;  // input width, feature width (2 dx for hedgehog, else dx)
  const T* sp;
  T p;
  const T *w, *b;
};

// Where one block adds its share of the parameters' gradients (null where the map has none).
struct FeatureGrads {
  T *dsp, *dw, *db;
};

// linvit::scratch's slots (blas.h) for these maps and linear_attention.cpp
enum Slot { kPhi = 0, kNum = 1, kDen = 2, kZ = 3, kDphi = 4, kDz = 5, kInv = 6 };

// x'^p and x'^(p-1), with the cube written out (vectorised loops; std::pow is not).
template <bool Cube>
inline T pw(T x, T p) { return Cube ? x * x * x : std::pow(x, p); }
template <bool Cube>
inline T pw1(T x, T p) { return Cube ? x * x : std::pow(x, p - T(1)); }

// 1 / softplus(s) of head h: one division per channel rather than per value.
inline const T* inverse_sp(const Feature& f, int64_t h) {
  T* inv = scratch(kInv, f.dx);
  for (int64_t c = 0; c < f.dx; ++c) inv[c] = T(1) / f.sp[h * f.dx + c];
  return inv;
}

// phi = ||x'|| x'^p / ||x'^p||, per row, x' = (relu(x) + floor) / sp.
template <bool Cube>
void focused(const T* x, T* phi, int64_t R, const Feature& f, int64_t h) {
  const int64_t D = f.dx;
  const T* inv = inverse_sp(f, h);
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
void focused_grad(const T* x, const T* phi, T* grad, int64_t R, const Feature& f, int64_t h,
                  T* dsp) {
  const int64_t D = f.dx;
  const T* inv = inverse_sp(f, h);
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

// One row's softmax of sign * z into out (width D).
inline void softmax_row(const T* z, T sign, T* out, int64_t D) {
  T top = sign * z[0], sum = 0;
  for (int64_t c = 1; c < D; ++c) top = std::max(top, sign * z[c]);
  for (int64_t c = 0; c < D; ++c) sum += out[c] = std::exp(sign * z[c] - top);
  const T inv = T(1) / sum;
  for (int64_t c = 0; c < D; ++c) out[c] *= inv;
}

// phi = [softmax(z), softmax(-z)], z = x W + b, per row (Hedgehog).
inline void hedgehog(const T* x, T* phi, int64_t R, const Feature& f, int64_t h) {
  const int64_t D = f.dx;
  T* z = scratch(kZ, R * D);
  const T* b = f.b + h * D;
  for (int64_t i = 0; i < R; ++i) std::copy(b, b + D, z + i * D);
  gemm(false, false, R, D, D, x, D, f.w + h * D * D, D, T(1), z, D);
  for (int64_t i = 0; i < R; ++i) {
    softmax_row(z + i * D, T(1), phi + i * 2 * D, D);
    softmax_row(z + i * D, T(-1), phi + i * 2 * D + D, D);
  }
}

// dz = s+ (g+ - <g+, s+>) - s- (g- - <g-, s->); dx = dz W^T, dW += x^T dz, db += sum_rows dz.
inline void hedgehog_grad(const T* x, const T* phi, const T* grad, T* dx, int64_t R,
                          const Feature& f, int64_t h, const FeatureGrads& fg) {
  const int64_t D = f.dx;
  T* dz = scratch(kDz, R * D);
  for (int64_t i = 0; i < R; ++i) {
    const T *sp = phi + i * 2 * D, *sn = sp + D, *gp = grad + i * 2 * D, *gn = gp + D;
    T dp = 0, dn = 0;
    for (int64_t c = 0; c < D; ++c) {
      dp += gp[c] * sp[c];
      dn += gn[c] * sn[c];
    }
    for (int64_t c = 0; c < D; ++c) {
      dz[i * D + c] = sp[c] * (gp[c] - dp) - sn[c] * (gn[c] - dn);
      fg.db[c] += dz[i * D + c];
    }
  }
  gemm(false, true, R, D, D, dz, D, f.w + h * D * D, D, T(0), dx, D);  // dz W^T
  gemm(true, false, D, D, R, x, D, dz, D, T(1), fg.dw, D);             // += x^T dz
}

// phi(x) of R rows of head h: x (R, dx) -> phi (R, dk).
inline void features(const T* x, T* phi, int64_t R, const Feature& f, int64_t h) {
  if (f.kind == kIdentity || f.kind == kInline) {
    std::copy(x, x + R * f.dx, phi);
  } else if (f.kind == kElu1) {
    for (int64_t i = 0; i < R * f.dx; ++i)  // elu(x) + 1 = exp(min(x, 0)) + max(x, 0)
      phi[i] = std::exp(std::min(x[i], T(0))) + std::max(x[i], T(0));
  } else if (f.kind == kFocused) {
    f.p == T(3) ? focused<true>(x, phi, R, f, h) : focused<false>(x, phi, R, f, h);
  } else {
    hedgehog(x, phi, R, f, h);
  }
}

// dL/dphi (R, dk) -> dL/dx (R, dx) in dx, which may be grad itself where dk == dx; adds the
// block's share of the parameters' gradients to fg.
inline void through_features(const T* x, const T* phi, T* grad, T* dx, int64_t R,
                             const Feature& f, int64_t h, const FeatureGrads& fg) {
  if (f.kind == kHedgehog) return hedgehog_grad(x, phi, grad, dx, R, f, h, fg);
  if (grad != dx) std::copy(grad, grad + R * f.dx, dx);
  if (f.kind == kElu1) {  // d(elu + 1)/dx = exp(min(x, 0)) = min(phi, 1)
    for (int64_t i = 0; i < R * f.dx; ++i) dx[i] *= std::min(phi[i], T(1));
  } else if (f.kind == kFocused) {
    f.p == T(3) ? focused_grad<true>(x, phi, dx, R, f, h, fg.dsp)
                : focused_grad<false>(x, phi, dx, R, f, h, fg.dsp);
  }
}

}  // namespace linvit
