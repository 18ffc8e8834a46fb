// The contiguous backend: a dense blockwise GEMM (block1x128 A, block128x128 B, bf16 D) as one group
// of scalemm's own Hopper kernel (contiguous_grouped_sm90a.cu). The kernel reads the scales where they
// are, compact or in cuBLASLt's layout, so with compact scales a call makes one launch where the native
// backend makes two (the 1x128 scales' conversion to cuBLASLt's layout, then cuBLASLt), at M = 1 none
// of the convert-native backend's padding, and in either format a shorter host path than a cuBLASLt
// call. The planner tries it first; auto_declines() keeps the calls where cuBLASLt measured faster on
// cuBLASLt: large M except the largest outputs.
#include <cstdint>
#include <string>

#include "backends/backend.hpp"
#include "backends/contiguous_grouped.hpp"
#include "scalemm/grouped.hpp"
#include "scalemm/layouts/scale_layout.hpp"

namespace scalemm::backends {

namespace {

// The SM count the tile rules plan for: the device's, or an H100's / H200's for a simulated one.
int planning_sms(const DeviceTarget& t) { return t.multiprocessors > 0 ? t.multiprocessors : 132; }

// The dense call as the grouped kernel's one group; `rows` holds M and outlives the returned args.
GroupedGemmArgs one_group(const GemmProblem& p, const int64_t* rows) {
  GroupedGemmArgs g;
  g.group_dim = GroupDim::kM;
  g.groups = 1;
  g.group_sizes = rows;
  g.m = p.m, g.n = p.n, g.k = p.k;
  g.a.dtype = p.a_dtype, g.a.recipe = p.a_recipe, g.a.scale_format = p.a_format;
  g.b.dtype = p.b_dtype, g.b.recipe = p.b_recipe, g.b.scale_format = p.b_format;
  g.d_dtype = p.d_dtype;
  g.space = p.space;
  g.backend = GroupedBackend::kContiguous;
  return g;
}

class Contiguous final : public BackendImpl {
 public:
  Backend id() const override { return Backend::kContiguous; }

  Verdict plan(const GemmProblem& p, const DeviceTarget& t, Plan& plan) const override {
    // Problems of another kind pass over it quietly: their explanations stay as they were.
    if (p.a_recipe != Recipe::kBlock1x128 || p.b_recipe != Recipe::kBlock128x128 || p.a_dtype != DType::kE4M3 ||
        p.b_dtype != DType::kE4M3 || t.sm != 90 || p.space != MemorySpace::kDevice)
      return {false, "runs block1x128(e4m3) x block128x128(e4m3) in device memory on sm_90", true};
    if (!contiguous_grouped::built())
      return {false, "not built (CUTLASS's headers, whose CuTe parts the kernel uses, were not found at configure "
                     "time: tools/fetch-cutlass.sh)"};
    if (p.has_bias) return {false, "the kernel has no bias epilogue"};
    const int64_t rows = p.m;
    const GroupedGemmArgs g = one_group(p, &rows);
    const std::string why = contiguous_grouped::blocker(g, t);
    if (!why.empty()) return {false, why};
    (void)plan;  // no conversions, no workspace
    return {true, "scalemm's " + contiguous_grouped::describe(g, contiguous_grouped::tiles(g, planning_sms(t))) +
                      "; no scale conversion launch"};
  }

  // auto's two regions for dense blockwise, measured against the same call on cuBLASLt (interleaved,
  // bit-identical outputs; docs/history/performance-notes.md): at M <= 256 the host path and the scale
  // conversion the kernel saves are a large part of the call (0.37-0.80x the cuBLASLt call's time at
  // M = 1-256), and where the output has 2^25 elements or more from 4096 x 2048 with K >= 2048 its tiles
  // fill many waves (0.94-0.99x); between, cuBLASLt measured as fast or faster (1.01-1.12x).
  static bool large_output(const GemmProblem& p) {
    return p.m >= 4096 && p.n >= 2048 && p.k >= 2048 && p.m * p.n >= (int64_t(1) << 25);
  }
  std::string auto_declines(const GemmProblem& p, const DeviceTarget& t) const override {
    if (large_output(p)) return {};
    if (p.m > 256)
      return "M = " + std::to_string(p.m) + ": auto takes scalemm's kernel at M <= 256, where the host path and "
             "scale conversion it saves are a large part of the call, and from 4096 x 2048 with K >= 2048 and "
             "M x N >= 2^25, where its tiles fill many waves (between, cuBLASLt measured as fast or faster)";
    const int sms = planning_sms(t);
    const int64_t rows = p.m;
    const GroupedGemmArgs g = one_group(p, &rows);
    const int width = contiguous_grouped::tile_columns(contiguous_grouped::tiles(g, sms));
    const int64_t tiles = layouts::ceil_div(p.m, 128) * layouts::ceil_div(p.n, width);
    if (100 * tiles < 40 * int64_t(sms))
      return "N = " + std::to_string(p.n) + " gives " + std::to_string(tiles) + " tiles of " + std::to_string(width) +
             " columns for " + std::to_string(sms) + " SMs: auto takes scalemm's kernel from 40% of the SMs "
             "(cuBLASLt splits K over the idle ones and measured faster below that)";
    return {};
  }

  void run(const GemmArgs& args, const Plan&, const RunContext& ctx) const override {
    const int64_t rows = args.m;
    GroupedGemmArgs g = one_group(GemmProblem::from(args), &rows);
    g.a = args.a, g.b = args.b, g.d = args.d, g.alpha = args.alpha;
    contiguous_grouped::run(g, ctx.stream, contiguous_grouped::tiles(g, ctx.target ? ctx.target->multiprocessors : 0));
  }
};

}  // namespace

const BackendImpl& contiguous_backend() {
  static const Contiguous b;
  return b;
}

}  // namespace scalemm::backends
