// The CUTLASS grouped backend (grouped_backend.hpp): blockwise and rowwise FP8 grouped GEMMs in one
// launch of the kernels of cutlass_grouped_sm90a.cu, with host or device-side sizes. `auto` takes it
// for the calls the contiguous kernel passes over (rowwise, k-grouped, other layouts) whenever the
// kernels can run them, except large groups with host sizes, measured faster as one dense call per
// group (slower_than_per_group).
#include <string>

#include "backends/cutlass_grouped.hpp"
#include "backends/grouped_backend.hpp"

namespace scalemm::backends {
namespace {

bool rowwise(const GroupedGemmArgs& a) { return a.a.recipe == Recipe::kRowwise; }

// H100, one process (docs/benchmarks.md): at M_g >= 1024 one cuBLASLt call per group on four streams
// beat the rowwise kernel with exact accumulation (769 vs 838 us at G = 8, M_g = 2048; 823 vs 906 us at
// G = 32, M_g = 1024), and at M_g = 2048 the blockwise one (825 vs 868 us equal, 836 vs 879 us uneven);
// at G = 32 blockwise the kernel won uneven sizes (968 vs 1082 us). With fast accumulation the kernel's
// 256 x 128 tiles (wide_fast_accum()) won at G = 32, M_g = 1024 (803.7 against 869.3 us equal, 878.6
// against 977.8 uneven) and lost at G = 8, M_g = 2048 (791.6 against 766.0, 824.8 against 795.9;
// grouped.py, interleaved). Device-side sizes stay here: per-group would read them back with a
// synchronisation.
std::string slower_than_per_group(const GroupedGemmArgs& a) {
  if (a.group_dim != GroupDim::kM || a.group_sizes_device || a.groups == 0) return {};
  const int64_t mean = a.m / a.groups;
  if (rowwise(a) && !a.fast_accum && mean > 512)
    return "rowwise with large groups (average M_g " + std::to_string(mean) + " > 512): measured faster as one cuBLASLt call per group";
  if (rowwise(a) && a.fast_accum && mean >= 2048)
    return "rowwise fast accumulation with large groups (average M_g " + std::to_string(mean) +
           " >= 2048): measured faster as one cuBLASLt call per group";
  if (!rowwise(a) && mean >= 2048)
    return "blockwise with large groups (average M_g " + std::to_string(mean) + " >= 2048): measured faster as one cuBLASLt call per group";
  return {};
}

class CutlassGrouped final : public GroupedBackendImpl {
 public:
  GroupedBackend id() const override { return GroupedBackend::kCutlass; }

  Verdict plan(const GroupedGemmArgs& a, const DeviceTarget& t, const PlanOptions& options) const override {
    if (!cutlass_grouped::built())
      return {false, "not built (CUTLASS's headers were not found at configure time: tools/fetch-cutlass.sh)"};
    if (options.force && *options.force != Backend::kNative)
      return {false, "the handle forces the " + std::string(to_string(*options.force)) + " backend"};
    std::string why = cutlass_grouped::blocker(a, t);
    if (why.empty() && a.backend == GroupedBackend::kAuto) why = slower_than_per_group(a);
    return {why.empty(), why.empty() ? "one launch of the CUTLASS grouped kernel" : why};
  }

  bool one_launch() const override { return true; }

  void run(const GroupedGemmArgs& a, const GroupedRunContext& ctx) const override {
    const size_t need = cutlass_grouped::workspace_bytes(a, *ctx.target);
    StagingScratch scratch = ctx.services->staging(ctx.stream, need);
    cutlass_grouped::run(a, ctx.stream, scratch.ptr, need, scratch.generation);
  }

  std::string explain(Handle&, const GroupedGemmArgs& a, const std::string&) const override {
    std::string s = "CUTLASS grouped backend: " + cutlass_grouped::describe(a);
    if (a.graph_replay) s += " (graph_replay has no effect: the call is one launch already)";
    return s;
  }
};

}  // namespace

// The 256 x 128 tiles against the 128 x 128 ones (H100, interleaved, the same bits): 0.92-0.99x
// the time from 256 rows per group on average (equal and grouped.py's uneven sizes), 1.04-1.32x below.
bool cutlass_grouped::wide_fast_accum(const GroupedGemmArgs& a) {
  return rowwise(a) && a.fast_accum && a.group_dim == GroupDim::kM && a.groups > 0 && a.m >= 256 * a.groups;
}

const GroupedBackendImpl& cutlass_grouped_backend() {
  static const CutlassGrouped b;
  return b;
}

}  // namespace scalemm::backends
