// What the chunked scan kernels (gated_scan.cpp, delta_rule.cpp) share: which part of a chunk's
// C x C matrix a scan direction sees. The forward scan sees the tokens before each row's (j < i),
// the backward scan those after it (j > i); `diagonal` adds j = i.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "blas.h"

namespace linvit {

// The columns [lo, hi) of row i on the scan's side.
inline std::pair<int64_t, int64_t> side(int64_t i, int64_t C, bool backward, bool diagonal) {
  if (backward) return {diagonal ? i : i + 1, C};
  return {0, diagonal ? i + 1 : i};
}

// Zeroes a (C x C, row-major) off the scan's side.
inline void keep_side(T* a, int64_t C, bool backward, bool diagonal) {
  for (int64_t i = 0; i < C; ++i) {
    const auto [lo, hi] = side(i, C, backward, diagonal);
    std::fill(a + i * C, a + i * C + lo, T(0));
    std::fill(a + i * C + hi, a + (i + 1) * C, T(0));
  }
}

}  // namespace linvit
