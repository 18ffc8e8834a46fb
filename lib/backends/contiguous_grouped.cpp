// The contiguous grouped backend (grouped_backend.hpp): m-grouped blockwise FP8 (block1x128 x
// block128x128) in one launch of scalemm's own Hopper kernel (contiguous_grouped_sm90a.cu), with
// host or device-side sizes and no workspace.
#include <algorithm>
#include <cstdint>
#include <string>

#include "backends/contiguous_grouped.hpp"
#include "backends/grouped_backend.hpp"
#include "scalemm/layouts/scale_layout.hpp"

namespace scalemm::backends {

// H100, interleaved with the CUTLASS kernel in one process (bench_grouped, docs/benchmarks.md): at K
// 7168 and N 4096, 64 groups of 8 or 32 rows 0.95-0.97x its time, and 16 groups of 64 rows with the
// wide tile 180 against 191 us; at K 2048 (32 x 16 rows, N 7168) the 128-wide tile is the faster one.
// One group (a dense call) is not decode-like: its few tiles fill fewer SMs when wider. At 1-64 x
// 10240 x 8192, 128-wide tiles in clusters sharing A took 0.92-0.93x the GPU time of the 160-wide
// ones and 0.91x of 192-wide ones (H100, the same bits).
bool contiguous_grouped::decode_like(const GroupedGemmArgs& a) {
  return a.groups > 1 && a.m <= 64 * a.groups && a.k >= 4096 && a.n >= 2048;
}

// The kernel against itself on an H100 (interleaved, the same bits): at K 4096-7168, 128 x 192
// tiles took 0.89-0.96x the time of 128 x 128 ones with 256-2048 rows per group (N 4096-7168; even at
// 256 rows and N 2048) and 0.99x at 64 x 8-32 rows; 1.04x at K 2048 with 256 rows per group, and
// 1.15-1.2x on one group of 16-200 rows.
namespace {
bool many_rows(const GroupedGemmArgs& a) { return a.groups > 0 && a.m >= 256 * a.groups; }  // on average
// The call's 128-row M tiles, from host sizes (0 where the sizes are on the device).
int64_t host_m_tiles(const GroupedGemmArgs& a) {
  if (a.group_sizes_device || !a.group_sizes) return 0;
  int64_t tiles = 0;
  for (int64_t g = 0; g < a.groups; ++g) tiles += layouts::ceil_div(std::max<int64_t>(a.group_sizes[g], 0), 128);
  return tiles;
}
}  // namespace

bool contiguous_grouped::wide_tiles(const GroupedGemmArgs& a) { return decode_like(a) || (a.k >= 4096 && many_rows(a)); }

// Interleaved against the same tiles without clusters (H100, the same bits): 0.92-0.98x the
// time at 256-2048 rows per group (8 x 2048 x 4096 x 7168 884 against 903 us, 16 x 256 x 2048 x 7168
// 130 against 141), 1.00x at 16 x 384, 1.01-1.02x at 16 x 256 uneven with K 4096. Decode-like calls
// have one M tile per group, so no pair would share B.
bool contiguous_grouped::shared_b(const GroupedGemmArgs& a) { return wide_tiles(a) && !decode_like(a); }

// Each tile of a wave takes about as long, so a call takes about (waves) x (tile width) x (the width's
// cost per column). Interleaved, the same bits: 160-wide tiles took 0.85-0.97x the time of 192- or
// 128-wide ones where they fill the waves better and 1.00-1.16x elsewhere (docs/history/performance-notes.md).
// Device sizes are not read on the host: no 160 there.
bool contiguous_grouped::narrow_tiles(const GroupedGemmArgs& a, int multiprocessors) {
  const bool wide = wide_tiles(a);
  if (!wide && !many_rows(a)) return false;  // 128 for few rows over a short K
  const int64_t m_tiles = host_m_tiles(a);
  if (m_tiles == 0 || multiprocessors <= 0) return false;
  auto cost = [&](int64_t width) { return layouts::ceil_div(m_tiles * layouts::ceil_div(a.n, width), multiprocessors) * width; };
  return wide ? 100 * cost(160) <= 92 * cost(192) : cost(160) <= cost(128);
}

// One group (the dense backend's calls): measured there only (bench_gemm --small-m).
bool contiguous_grouped::half_tiles(const GroupedGemmArgs& a, int multiprocessors) {
  const int64_t m_tiles = a.groups == 1 ? host_m_tiles(a) : 0;
  return m_tiles > 0 && 2 * m_tiles * layouts::ceil_div(a.n, 128) <= multiprocessors;
}

// One group again, where one M tile or two over a wide N give 128-wide tiles to 40-75% of the SMs and
// 64-wide ones would take two waves (1-128 x 10240 x 8192: 80 tiles of 128 columns, 107 of 96, 160 of 64).
bool contiguous_grouped::third_tiles(const GroupedGemmArgs& a, int multiprocessors) {
  const int64_t m_tiles = a.groups == 1 ? host_m_tiles(a) : 0;
  if (m_tiles == 0 || half_tiles(a, multiprocessors)) return false;
  const int64_t t96 = m_tiles * layouts::ceil_div(a.n, 96), t128 = m_tiles * layouts::ceil_div(a.n, 128);
  return t96 <= multiprocessors && 4 * t96 >= 5 * t128;
}

contiguous_grouped::Tiles contiguous_grouped::tiles(const GroupedGemmArgs& a, int multiprocessors) {
  if (half_tiles(a, multiprocessors)) return Tiles::k64;
  if (third_tiles(a, multiprocessors)) return Tiles::k96;
  // At decode, 160-wide tiles in clusters sharing A took 0.96x the time of the same without clusters
  // (99.9 against 104.3 us at 10 experts of up to 64 rows, H100; 82.5 against 86.0, H200).
  if (narrow_tiles(a, multiprocessors)) return decode_like(a) ? Tiles::k160SharedA : Tiles::k160SharedB;
  if (!wide_tiles(a)) return Tiles::k128SharedA;
  return shared_b(a) ? Tiles::k192SharedB : Tiles::k192;
}

int contiguous_grouped::tile_columns(Tiles tiles) {
  switch (tiles) {
    case Tiles::k64: return 64;
    case Tiles::k96: return 96;
    case Tiles::k128SharedA: return 128;
    case Tiles::k160SharedA:
    case Tiles::k160SharedB: return 160;
    case Tiles::k192:
    case Tiles::k192SharedB: return 192;
  }
  return 128;
}

namespace {

class ContiguousGrouped final : public GroupedBackendImpl {
 public:
  GroupedBackend id() const override { return GroupedBackend::kContiguous; }

  Verdict plan(const GroupedGemmArgs& a, const DeviceTarget& t, const PlanOptions& options) const override {
    if (!contiguous_grouped::built())
      return {false, "not built (CUTLASS's headers, whose CuTe parts it uses, were not found at configure time: tools/fetch-cutlass.sh)"};
    // A handle forcing the dense contiguous backend (the same kernel, one group a call) takes it too.
    if (options.force && *options.force != Backend::kNative && *options.force != Backend::kContiguous)
      return {false, "the handle forces the " + std::string(to_string(*options.force)) + " backend"};
    // auto takes it wherever it runs. bench_grouped, interleaved, the same bits: 0.81-0.96x the CUTLASS
    // kernel's time on all twelve MoE shapes on an H100, 0.80-0.99x on an H200 (decode 0.93-0.99x),
    // and below the per-group backend's time on the large shapes.
    const std::string why = contiguous_grouped::blocker(a, t);
    return {why.empty(), why.empty() ? "one launch of the contiguous grouped kernel" : why};
  }

  bool one_launch() const override { return true; }

  void run(const GroupedGemmArgs& a, const GroupedRunContext& ctx) const override {
    contiguous_grouped::run(a, ctx.stream, contiguous_grouped::tiles(a, ctx.target ? ctx.target->multiprocessors : 0));
  }

  std::string explain(Handle& h, const GroupedGemmArgs& a, const std::string&) const override {
    const contiguous_grouped::Tiles t = contiguous_grouped::tiles(a, h.target().multiprocessors);
    std::string s = "contiguous grouped backend: " + contiguous_grouped::describe(a, t);
    if (a.graph_replay) s += " (graph_replay has no effect: the call is one launch already)";
    return s;
  }
};

}  // namespace

const GroupedBackendImpl& contiguous_grouped_backend() {
  static const ContiguousGrouped b;
  return b;
}

}  // namespace scalemm::backends
