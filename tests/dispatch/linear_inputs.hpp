// Inputs and fp64 products for the linear-layer tests (host and GPU).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "scalemm/layouts/scale_layout.hpp"

namespace scalemm::testing {

/// d(r, c) = sum_j a(r, j) * b(c, j) in fp64; a (R, J), b (C, J) row-major, with strides given so that
/// transposed views (dY^T, X^T, W^T) need no copy: a(r, j) = a[r*ar + j*aj].
inline std::vector<double> product(const std::vector<float>& a, int64_t ar, int64_t aj, const std::vector<float>& b,
                            int64_t bc, int64_t bj, int64_t R, int64_t C, int64_t J) {
  std::vector<double> d(size_t(R * C), 0.0);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0.0;
      for (int64_t j = 0; j < J; ++j) acc += double(a[size_t(r * ar + j * aj)]) * double(b[size_t(c * bc + j * bj)]);
      d[size_t(r * C + c)] = acc;
    }
  return d;
}

/// Inputs of one layer problem. Random: normal values. Exact: small integers times a power of two
/// that is constant on each 128x128 tile (so every 1x128, 128x1, 1x32, 32x1, 128x128 and 32x32 block
/// has a power-of-two amax ratio): quantization is lossless and every sum is exact in fp32.
inline std::vector<float> make_input(int64_t rows, int64_t cols, bool exact, std::mt19937_64& rng) {
  std::vector<float> v(size_t(rows * cols));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ival(-2, 2), ex(-2, 2);
  std::vector<int> tile_exp(size_t(layouts::ceil_div(rows, 128) * layouts::ceil_div(cols, 128)));
  for (auto& e : tile_exp) e = ex(rng);
  const int64_t tiles_c = layouts::ceil_div(cols, 128);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      v[size_t(i * cols + j)] =
          exact ? std::ldexp(float(ival(rng)), tile_exp[size_t((i / 128) * tiles_c + j / 128)]) : nd(rng);
  return v;
}

}  // namespace scalemm::testing
