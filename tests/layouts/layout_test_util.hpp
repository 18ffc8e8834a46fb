// Shared helpers of the layout tests (host and [gpu] sources).
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "scalemm/layouts/scale_layout.hpp"

namespace scalemm::layouts::testutil {

/// Rows and K extents every per-recipe sweep covers: partial blocks and ceil(K/128) in {1,2,3,4,5,8}.
inline const std::vector<int64_t> kRows = {1, 3, 4, 5, 31, 32, 33, 127, 128, 129, 257};
inline const std::vector<int64_t> kKs = {16, 100, 128, 200, 300, 512, 600, 640, 1000};

inline uint32_t load_bits(const void* p, int64_t i, int bytes) {
  if (bytes == 4) {
    uint32_t v;
    std::memcpy(&v, static_cast<const uint8_t*>(p) + i * 4, 4);
    return v;
  }
  return static_cast<const uint8_t*>(p)[i];
}

/// Random bits for every element of a buffer (any pattern but zero, so padding stands out).
inline std::vector<uint8_t> fill_buffer(const ScaleLayout& l, std::mt19937_64& g) {
  std::vector<uint8_t> b(size_t(l.bytes()));
  for (auto& x : b) x = uint8_t(g() | 1);
  return b;
}

/// Random VALID scales: positive finite fp32, E8M0 codes 0..254, UE4M3 codes without NaN.
inline std::vector<uint8_t> fill_valid(const ScaleLayout& l, std::mt19937_64& g) {
  std::vector<uint8_t> b(size_t(l.bytes()));
  for (int64_t i = 0; i < l.size(); ++i) {
    if (l.scale_bytes() == 4) {
      const float v = float(std::ldexp(1.0 + double(g() % 1000) / 1000.0, int(g() % 40) - 20));
      std::memcpy(b.data() + i * 4, &v, 4);
    } else if (l.scale_dtype() == DType::kE8M0) {
      b[size_t(i)] = uint8_t(g() % 255);
    } else {
      b[size_t(i)] = uint8_t(1 + g() % 0x7E);
    }
  }
  return b;
}

}  // namespace scalemm::layouts::testutil
