// One step of the library's cache-key hashing: the plan cache (dispatch/handle.cpp) and the
// prepared-descriptor cache (cublaslt/cublaslt.cpp) fold their keys field by field through it.
#pragma once

#include <cstdint>

namespace scalemm::detail {

constexpr uint64_t kHashSeed = 0xCBF29CE484222325ull;

/// Folds v into h: xor, golden-ratio multiply, xor-shift (so high input bits reach the low bits that
/// std::unordered_map's bucket index uses).
constexpr uint64_t hash_mix(uint64_t h, uint64_t v) {
  h = (h ^ v) * 0x9E3779B97F4A7C15ull;
  return h ^ (h >> 29);
}

}  // namespace scalemm::detail
