// The per-group grouped backend (per_group.cpp): what the handle's grouped entry points
// (dispatch/grouped_handle.cpp) run and ask of it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dispatch/handle_scratch.hpp"
#include "scalemm/gemm.hpp"
#include "scalemm/grouped.hpp"

namespace scalemm::backends::per_group {

/// Every non-empty group's dense call, after validation, with the sizes on the host.
void run(Handle& h, Handle::Impl& impl, const GroupedGemmArgs& a, Stream stream);

/// The explain() text of a call this backend runs (`why`: why the CUTLASS kernel passed it over):
/// streams, staging, conversions, and the dense plan of each distinct group shape.
std::string explain(Handle& h, const GroupedGemmArgs& a, const std::string& why);

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
