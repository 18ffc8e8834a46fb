// The layout arithmetic of grouped calls (grouped.hpp): host-only, shared by the per-group backend,
// the C ABI and the CLI's layout commands.
#include "scalemm/grouped.hpp"
#include "scalemm/layouts/scale_layout.hpp"

namespace scalemm {
namespace {

// A group's scale buffer in a grouped call: cuBLASLt-format buffers start 16-byte aligned.
int64_t group_buffer_bytes(const layouts::ScaleLayout& l) {
  return l.format == ScaleFormat::kCublasLt ? layouts::round_up(l.bytes(), 16) : l.bytes();
}

}  // namespace

std::string_view to_string(GroupDim g) { return g == GroupDim::kK ? "k" : "m"; }

std::string_view to_string(GroupedBackend b) {
  switch (b) {
    case GroupedBackend::kAuto: return "auto";
    case GroupedBackend::kCutlass: return "cutlass";
    case GroupedBackend::kPerGroup: return "per-group";
    case GroupedBackend::kContiguous: return "contiguous";
  }
  return "unknown";
}

std::vector<int64_t> grouped_scale_offsets(const GroupedGemmArgs& a) {
  std::vector<int64_t> offs(size_t(a.groups) + 1, 0);
  for (int64_t g = 0; g < a.groups; ++g)
    offs[size_t(g) + 1] = offs[size_t(g)] +
                          group_buffer_bytes(layouts::ScaleLayout(a.a.recipe, a.group_sizes[g], a.k, a.a.scale_format));
  return offs;
}

int64_t grouped_b_scale_stride(const GroupedGemmArgs& a) {
  return group_buffer_bytes(layouts::ScaleLayout(a.b.recipe, a.n, a.k, a.b.scale_format));
}

}  // namespace scalemm
