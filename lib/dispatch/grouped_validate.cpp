// Grouped validation (grouped_validate.hpp): the arguments, the group sizes, and the operands as the
// whole tensors or group by group.
#include "dispatch/grouped_validate.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "backends/per_group.hpp"
#include "base/capabilities.hpp"
#include "scalemm/layouts/scale_layout.hpp"

namespace scalemm {
namespace {

void add(Diagnostics& out, std::string arg, std::string rule, std::string msg, std::string expected, std::string actual,
         std::string fix) {
  out.push_back({std::move(arg), std::move(rule), std::move(msg), std::move(expected), std::move(actual), std::move(fix)});
}

}  // namespace

namespace dispatch {

Diagnostics validate_grouped(const GroupedGemmArgs& a, Depth depth) {
  Diagnostics out;
  const bool mg = a.group_dim == GroupDim::kM;
  if (a.group_dim != GroupDim::kM && a.group_dim != GroupDim::kK)
    add(out, "group_dim", "group-dim", "the grouped dimension must be m or k", "m or k",
        std::to_string(int(a.group_dim)), "");
  if (a.backend != GroupedBackend::kAuto && a.backend != GroupedBackend::kCutlass &&
      a.backend != GroupedBackend::kPerGroup && a.backend != GroupedBackend::kContiguous)
    add(out, "backend", "grouped-backend", "unknown grouped backend", "auto, cutlass, contiguous or per-group",
        std::to_string(int(a.backend)), "");
  if (a.groups < 1)
    add(out, "groups", "group-count", "a grouped GEMM needs at least one group", ">= 1", std::to_string(a.groups),
        "Pass G = the number of experts (group_sizes has G entries).");
  const bool dev_sizes = a.group_sizes_device != nullptr;
  if (!a.group_sizes && !dev_sizes && a.groups >= 1)
    add(out, "group_sizes", "null-pointer", "group sizes are null",
        "G sizes in host memory (group_sizes) or in device memory (group_sizes_device)", "nullptr", "");
  if (a.group_sizes && dev_sizes)
    add(out, "group_sizes_device", "group-sizes-twice", "group sizes are given twice", "group_sizes or group_sizes_device",
        "both", "Pass the sizes in one place: leave group_sizes null when they live on the device.");
  if (dev_sizes && a.space == MemorySpace::kHost)
    add(out, "group_sizes_device", "group-sizes-space", "a host-memory call takes its group sizes from the host",
        "group_sizes (host)", "group_sizes_device", "Pass the sizes in group_sizes.");
  if (dev_sizes && a.group_dim == GroupDim::kM &&
      !(a.a.scale_format == ScaleFormat::kCompact &&
        (a.a.recipe == Recipe::kRowwise || a.a.recipe == Recipe::kBlock1x128 || a.a.recipe == Recipe::kMxfp8 ||
         a.a.recipe == Recipe::kNvfp4)))
    add(out, "scale_a", "group-sizes-device-scales",
        "with device-side group sizes, A's scales must not depend on the sizes: a per-row recipe in compact format",
        "rowwise, block1x128, mxfp8 or nvfp4, compact",
        std::string(to_string(a.a.recipe)) + ", " + std::string(to_string(a.a.scale_format)),
        "Pass the sizes on the host (group_sizes), or quantize A per row.");
  if (a.n < 1) add(out, "n", "positive-extent", "N must be at least 1", ">= 1", std::to_string(a.n), "");
  if (mg ? a.k < 1 : a.m < 1)
    add(out, mg ? "k" : "m", "positive-extent", std::string(mg ? "K" : "M") + " must be at least 1", ">= 1",
        std::to_string(mg ? a.k : a.m), "");
  if (auto d = base::fast_accum_refusal(a.fast_accum, a.a.recipe, a.b.recipe)) out.push_back(std::move(*d));
  if (a.d_dtype != DType::kBF16 && a.d_dtype != DType::kF16 && a.d_dtype != DType::kF32)
    add(out, "d_dtype", "grouped-out-dtype", "grouped output must be bf16, f16 or f32", "bf16, f16 or f32",
        std::string(to_string(a.d_dtype)), "");
  if (!out.empty() || (dev_sizes && depth == Depth::kSizes)) return out;
  const bool whole = dev_sizes || (depth == Depth::kWhole && a.group_dim == GroupDim::kM);
  if (whole && !dev_sizes) {  // the sizes first, as below
    int64_t sum = 0;
    for (int64_t g = 0; g < a.groups; ++g) {
      if (a.group_sizes[g] < 0) {
        add(out, "group_sizes[" + std::to_string(g) + "]", "group-size-negative", "a group size cannot be negative",
            ">= 0", std::to_string(a.group_sizes[g]), "");
        return out;
      }
      sum += a.group_sizes[g];
    }
    if (sum != a.m) {
      add(out, "group_sizes", "group-size-sum", "the group sizes must add up to M (the rows of A and D)",
          std::to_string(a.m), std::to_string(sum) + " over " + std::to_string(a.groups) + " groups",
          "Pass m = the sum of the group sizes (padding rows belong to a group).");
      return out;
    }
  }
  if (whole) {  // the sizes are checked on the device, or above; the operands as the whole tensors they are
    GemmArgs c;
    c.m = a.group_dim == GroupDim::kM ? std::max<int64_t>(a.m, 1) : a.m;
    c.n = a.n, c.k = a.k;
    c.a = a.a, c.b = a.b, c.d = a.d, c.d_dtype = a.d_dtype, c.alpha = a.alpha, c.space = a.space;
    for (auto x : validate(c)) out.push_back(std::move(x));
    return out;
  }

  int64_t sum = 0;
  const int64_t gran = mg ? 1 : std::max(backends::per_group::k_granularity(a.a.recipe), backends::per_group::k_granularity(a.b.recipe));
  for (int64_t g = 0; g < a.groups; ++g) {
    const int64_t s = a.group_sizes[g];
    const std::string arg = "group_sizes[" + std::to_string(g) + "]";
    if (s < 0) {
      add(out, arg, "group-size-negative", "a group size cannot be negative", ">= 0", std::to_string(s), "");
      continue;
    }
    if (!mg && s % gran != 0)
      add(out, arg, "group-k-block",
          "K_g must fall on the K-block boundaries of both recipes (" + std::string(to_string(a.a.recipe)) + ", " +
              std::string(to_string(a.b.recipe)) + ")",
          "a multiple of " + std::to_string(gran), std::to_string(s),
          "Pad group " + std::to_string(g) + " with zero columns in A and B to K_g = " +
              std::to_string(layouts::round_up(s, gran)) + ".");
    sum += s;
  }
  const int64_t want = mg ? a.m : a.k;
  if (out.empty() && sum != want)
    add(out, "group_sizes", "group-size-sum",
        std::string("the group sizes must add up to ") + (mg ? "M (the rows of A and D)" : "K (the columns of A and B)"),
        std::to_string(want), std::to_string(sum) + " over " + std::to_string(a.groups) + " groups",
        mg ? "Pass m = the sum of the group sizes (padding rows belong to a group)." : "");
  if (!out.empty() || depth == Depth::kSizes) return out;

  // The operands: m-grouped through each group's dense call (its scale slice, B[g]); k-grouped through
  // the whole (M, sum K) and (N, sum K) tensors, of which the groups are column ranges.
  auto prefixed = [&](const Diagnostics& d, const std::string& prefix) {
    for (auto x : d) {
      x.argument = prefix + x.argument;
      out.push_back(std::move(x));
    }
  };
  if (mg) {
    std::vector<int64_t> rows(size_t(a.groups) + 1, 0);
    for (int64_t g = 0; g < a.groups; ++g) rows[size_t(g) + 1] = rows[size_t(g)] + a.group_sizes[g];
    if (!a.a.scale || !a.b.scale || !a.a.data || !a.b.data || !a.d) {
      // The dense check names it; a null base pointer must not be offset first.
      GemmArgs c;
      c.m = std::max<int64_t>(a.m, 1), c.n = a.n, c.k = a.k;
      c.a = a.a, c.b = a.b, c.d = a.d, c.d_dtype = a.d_dtype, c.space = a.space;
      prefixed(validate(c), "");
      return out;
    }
    const std::vector<int64_t> offs = grouped_scale_offsets(a);
    // The whole tensors' own alignment is the caller's; a group that starts off it runs on a copy.
    GemmArgs whole;
    whole.m = std::max<int64_t>(a.m, 1), whole.n = a.n, whole.k = a.k;
    whole.a = a.a, whole.b = a.b, whole.d = a.d, whole.d_dtype = a.d_dtype, whole.space = a.space;
    for (const Diagnostic& x : validate(whole))
      if (x.rule == "data-alignment") out.push_back(x);
    if (!out.empty()) return out;
    for (int64_t g = 0; g < a.groups; ++g)
      if (a.group_sizes[g] > 0) prefixed(validate(backends::per_group::m_group_view(a, rows, offs, g)), "group " + std::to_string(g) + ": ");
  } else {
    GemmArgs c;
    c.m = a.m, c.n = a.n, c.k = a.k;
    c.a = a.a, c.b = a.b, c.d = a.d, c.d_dtype = a.d_dtype, c.alpha = a.alpha, c.space = a.space;
    prefixed(validate(c), "");
  }
  return out;
}

}  // namespace dispatch

using dispatch::Depth;

Diagnostics validate(const GroupedGemmArgs& a) { return validate_grouped(a, Depth::kPerGroup); }
Diagnostics validate_sizes(const GroupedGemmArgs& a) { return validate_grouped(a, Depth::kSizes); }


}  // namespace scalemm
