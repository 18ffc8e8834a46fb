// Grouped GEMM test inputs: exact-by-construction operands laid out as grouped.hpp defines, and the
// exact result of every group in fp64.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "test_operands.hpp"
#include "scalemm/grouped.hpp"

namespace scalemm::testing {

struct GroupedInputs {
  GroupDim dim = GroupDim::kM;
  Recipe ra = Recipe::kTensorwise, rb = Recipe::kTensorwise;
  ScaleFormat fa = ScaleFormat::kCompact, fb = ScaleFormat::kCompact;
  DType da = DType::kE4M3, db = DType::kE4M3;
  std::vector<int64_t> sizes;
  int64_t m = 0, n = 0, k = 0;
  std::vector<uint8_t> a_data, a_scale, b_data, b_scale;
  std::vector<double> expected;  ///< D in fp64 (exact): (sum M_g, N) or (G, M, N)

  /// The call over `d` with the pointers of `a_*`/`b_*` (or the given device copies).
  GroupedGemmArgs args(void* d, const void* ad = nullptr, const void* as = nullptr, const void* bd = nullptr,
                       const void* bs = nullptr, MemorySpace space = MemorySpace::kHost) const {
    GroupedGemmArgs g;
    g.group_dim = dim;
    g.groups = int64_t(sizes.size());
    g.group_sizes = sizes.data();
    g.m = m, g.n = n, g.k = k;
    g.a = {ad ? ad : a_data.data(), da, ra, as ? as : a_scale.data(), fa, 1.0f};
    g.b = {bd ? bd : b_data.data(), db, rb, bs ? bs : b_scale.data(), fb, 1.0f};
    g.d = d;
    g.d_dtype = DType::kF32;
    g.space = space;
    return g;
  }
};

/// Appends one group's buffer; cuBLASLt-format scale buffers start 16-byte aligned (grouped.hpp).
inline void append(std::vector<uint8_t>& to, const std::vector<uint8_t>& from, bool align16 = false) {
  if (align16) to.resize(size_t(layouts::round_up(int64_t(to.size()), 16)), 0);
  to.insert(to.end(), from.begin(), from.end());
}

/// m-grouped: `sizes` are M_g (A rows per group, each group quantized on its own), B holds G experts
/// (N, K). k-grouped: `sizes` are K_g; A (m, sum K_g) and B (N, sum K_g) are whole tensors.
inline GroupedInputs make_grouped(GroupDim dim, Recipe ra, Recipe rb, ScaleFormat fa, ScaleFormat fb,
                                  std::vector<int64_t> sizes, int64_t m_or_k, int64_t n, std::mt19937_64& rng) {
  GroupedInputs in;
  in.dim = dim, in.ra = ra, in.rb = rb, in.fa = fa, in.fb = fb, in.sizes = sizes, in.n = n;
  in.da = default_dtype(ra), in.db = default_dtype(rb);
  const int64_t G = int64_t(sizes.size());
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  if (dim == GroupDim::kM) {
    in.m = total, in.k = m_or_k;
    in.expected.assign(size_t(in.m * n), 0.0);
    int64_t r0 = 0;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t mg = sizes[size_t(g)];
      HostOperand b = exact_operand(rb, n, in.k, fb, rng);
      append(in.b_data, b.data);
      append(in.b_scale, b.scales, fb == ScaleFormat::kCublasLt);
      if (mg == 0) {  // an empty group still owns its (possibly non-empty) scale buffer slot
        append(in.a_scale, std::vector<uint8_t>(size_t(layouts::ScaleLayout(ra, 0, in.k, fa).bytes()), 0),
               fa == ScaleFormat::kCublasLt);
        continue;
      }
      HostOperand a = exact_operand(ra, mg, in.k, fa, rng);
      append(in.a_data, a.data);
      append(in.a_scale, a.scales, fa == ScaleFormat::kCublasLt);
      const std::vector<double> av = dequant_rows(a), bv = dequant_rows(b);
      for (int64_t i = 0; i < mg; ++i)
        for (int64_t j = 0; j < n; ++j) in.expected[size_t((r0 + i) * n + j)] = exact_dot(av, bv, in.k, i, j, 0, in.k);
      r0 += mg;
    }
  } else {
    in.m = m_or_k, in.k = total;
    HostOperand a = exact_operand(ra, in.m, in.k, fa, rng), b = exact_operand(rb, n, in.k, fb, rng);
    in.a_data = a.data, in.a_scale = a.scales, in.b_data = b.data, in.b_scale = b.scales;
    in.expected.assign(size_t(G * in.m * n), 0.0);
    const std::vector<double> av = dequant_rows(a), bv = dequant_rows(b);
    int64_t k0 = 0;
    for (int64_t g = 0; g < G; ++g) {
      for (int64_t i = 0; i < in.m; ++i)
        for (int64_t j = 0; j < n; ++j)
          in.expected[size_t((g * in.m + i) * n + j)] = exact_dot(av, bv, in.k, i, j, k0, k0 + sizes[size_t(g)]);
      k0 += sizes[size_t(g)];
    }
  }
  return in;
}

/// K granularity of a k-grouped split for a recipe pair (the larger K-block; 16 for FP4 data).
inline int64_t k_split(Recipe ra, Recipe rb) {
  auto one = [](Recipe r) -> int64_t {
    switch (r) {
      case Recipe::kBlock1x128:
      case Recipe::kBlock128x128: return 128;
      case Recipe::kMxfp8:
      case Recipe::kMxfp8_32x32: return 32;
      case Recipe::kNvfp4: return 16;
      default: return 16;  // tensorwise, rowwise: any K_g; 16 keeps FP8 rows 16-byte aligned
    }
  };
  return std::max(one(ra), one(rb));
}

}  // namespace scalemm::testing
