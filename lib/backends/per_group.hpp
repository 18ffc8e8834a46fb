// The per-group grouped backend (per_group.cpp, per_group_backend() in grouped_backend.hpp): the
// group arithmetic that the handle's grouped validation and verification share with it
// (dispatch/grouped_handle.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scalemm/gemm.hpp"
#include "scalemm/grouped.hpp"

namespace scalemm::backends::per_group {

/// K granularity of a k-grouped split: the recipe's K-block (tensorwise and rowwise scale all of K).
int64_t k_granularity(Recipe r);

/// The dense call of m-group g on the whole tensors' memory (row_offs: prefix sums of the sizes;
/// scale_offs: grouped_scale_offsets), and the same as validation sees it.
GemmArgs m_group_call(const GroupedGemmArgs& a, const std::vector<int64_t>& row_offs,
                      const std::vector<int64_t>& scale_offs, int64_t g);
GemmArgs m_group_view(const GroupedGemmArgs& a, const std::vector<int64_t>& rows, const std::vector<int64_t>& offs,
                      int64_t g);

/// The dense call of k-group g (columns from k0), its operands staged into `base`; and the staging bytes
/// a k-grouped call needs.
GemmArgs stage_k_group(const GroupedGemmArgs& a, int64_t g, int64_t k0, char* base, Stream stream);
size_t k_stage_bytes(const GroupedGemmArgs& a);

}  // namespace scalemm::backends::per_group
