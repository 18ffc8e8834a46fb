// Grouped GEMMs with host pointers (the host reference, group by group): every recipe pair, m- and
// k-grouped, empty and tiny groups, against the exact fp64 product of each group; bad group sizes.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/contiguous_grouped.hpp"
#include "backends/cutlass_grouped.hpp"
#include "backends/grouped_backend.hpp"
#include "dispatch/devices.hpp"
#include "grouped_inputs.hpp"
#include "support/test_support.hpp"

using namespace scalemm;
using scalemm::testing::GroupedInputs;

namespace {

int64_t mismatches(const GroupedInputs& in, const std::vector<float>& d) {
  int64_t bad = 0;
  for (size_t i = 0; i < in.expected.size(); ++i) bad += d[i] != float(in.expected[i]);
  return bad;
}

bool pair_allowed(Recipe ra, Recipe rb) { return (ra == Recipe::kNvfp4) == (rb == Recipe::kNvfp4); }

}  // namespace

TEST_CASE("m-grouped host GEMMs equal each group's exact product for every recipe pair", "[dispatch][grouped][host]") {
  auto rng = scalemm::testing::rng(0x6A0);
  Handle h;
  int runs = 0;
  for (Recipe ra : kAllRecipes)
    for (Recipe rb : kAllRecipes) {
      if (!pair_allowed(ra, rb)) continue;
      const ScaleFormat fa = runs % 2 ? ScaleFormat::kCublasLt : ScaleFormat::kCompact;
      const ScaleFormat fb = runs % 3 ? ScaleFormat::kCompact : ScaleFormat::kCublasLt;
      CAPTURE(to_string(ra), to_string(rb), to_string(fa), to_string(fb));
      const auto in = scalemm::testing::make_grouped(GroupDim::kM, ra, rb, fa, fb, {7, 0, 1, 129}, 160, 33, rng);
      std::vector<float> d(in.expected.size(), std::nanf(""));
      h.grouped_gemm(in.args(d.data()));
      CHECK(mismatches(in, d) == 0);
      ++runs;
    }
  CHECK(runs == 37);
}

TEST_CASE("k-grouped host GEMMs equal each group's exact product and zero the empty groups", "[dispatch][grouped][host]") {
  auto rng = scalemm::testing::rng(0x6A1);
  Handle h;
  int runs = 0;
  for (Recipe ra : kAllRecipes)
    for (Recipe rb : kAllRecipes) {
      if (!pair_allowed(ra, rb)) continue;
      const ScaleFormat fa = runs % 2 ? ScaleFormat::kCompact : ScaleFormat::kCublasLt;
      const ScaleFormat fb = runs % 3 ? ScaleFormat::kCublasLt : ScaleFormat::kCompact;
      CAPTURE(to_string(ra), to_string(rb), to_string(fa), to_string(fb));
      const int64_t s = scalemm::testing::k_split(ra, rb);
      const auto in = scalemm::testing::make_grouped(GroupDim::kK, ra, rb, fa, fb, {s, 0, 2 * s, s}, 9, 20, rng);
      std::vector<float> d(in.expected.size(), std::nanf(""));
      h.grouped_gemm(in.args(d.data()));
      CHECK(mismatches(in, d) == 0);
      ++runs;
    }
  CHECK(runs == 37);
}

TEST_CASE("grouped GEMMs with G = 1 and G = 16 equal the same dense calls bit for bit", "[dispatch][grouped][host]") {
  auto rng = scalemm::testing::rng(0x6A2);
  Handle h;
  for (const std::vector<int64_t>& sizes :
       {std::vector<int64_t>{40}, std::vector<int64_t>{3, 0, 5, 1, 0, 0, 8, 2, 1, 1, 9, 0, 4, 4, 7, 1}}) {
    const auto in = scalemm::testing::make_grouped(GroupDim::kM, Recipe::kBlock1x128, Recipe::kBlock128x128,
                                                   ScaleFormat::kCompact, ScaleFormat::kCompact, sizes, 256, 16, rng);
    std::vector<float> grouped(in.expected.size(), std::nanf(""));
    h.grouped_gemm(in.args(grouped.data()));
    // The same groups as dense calls over the same buffers.
    std::vector<float> dense(in.expected.size(), std::nanf(""));
    const GroupedGemmArgs ga = in.args(dense.data());
    const std::vector<int64_t> offs = grouped_scale_offsets(ga);
    int64_t r0 = 0;
    for (size_t g = 0; g < sizes.size(); ++g) {
      if (sizes[g] == 0) continue;
      GemmArgs c;
      c.m = sizes[g], c.n = in.n, c.k = in.k;
      c.a = ga.a, c.b = ga.b;
      c.a.data = in.a_data.data() + r0 * in.k;
      c.a.scale = in.a_scale.data() + offs[g];
      c.b.data = in.b_data.data() + int64_t(g) * in.n * in.k;
      c.b.scale = in.b_scale.data() + int64_t(g) * grouped_b_scale_stride(ga);
      c.d = dense.data() + r0 * in.n;
      c.d_dtype = DType::kF32;
      c.space = MemorySpace::kHost;
      h.gemm(c);
      r0 += sizes[g];
    }
    CHECK(std::memcmp(grouped.data(), dense.data(), grouped.size() * 4) == 0);
    CHECK(mismatches(in, grouped) == 0);
  }
}

TEST_CASE("bad group sizes are named errors and leave the output untouched", "[dispatch][grouped][host]") {
  auto rng = scalemm::testing::rng(0x6A3);
  Handle h;
  const auto mg = scalemm::testing::make_grouped(GroupDim::kM, Recipe::kMxfp8, Recipe::kMxfp8, ScaleFormat::kCompact,
                                                 ScaleFormat::kCompact, {4, 0, 5}, 64, 8, rng);
  const auto kg = scalemm::testing::make_grouped(GroupDim::kK, Recipe::kBlock1x128, Recipe::kBlock128x128,
                                                 ScaleFormat::kCompact, ScaleFormat::kCompact, {128, 256}, 4, 8, rng);
  struct Row {
    const char* name;
    const GroupedInputs* in;
    std::function<void(GroupedGemmArgs&, std::vector<int64_t>&)> breaks;
    const char* argument;
    const char* rule;
  };
  const std::vector<Row> rows = {
      {"negative size", &mg, [](GroupedGemmArgs&, std::vector<int64_t>& s) { s = {4, -1, 6}; }, "group_sizes[1]", "group-size-negative"},
      {"sizes do not add up to M", &mg, [](GroupedGemmArgs&, std::vector<int64_t>& s) { s = {4, 0, 4}; }, "group_sizes", "group-size-sum"},
      {"no groups", &mg, [](GroupedGemmArgs& a, std::vector<int64_t>&) { a.groups = 0; }, "groups", "group-count"},
      {"null sizes", &mg, [](GroupedGemmArgs& a, std::vector<int64_t>&) { a.group_sizes = nullptr; }, "group_sizes", "null-pointer"},
      {"K split off a 128 block", &kg, [](GroupedGemmArgs&, std::vector<int64_t>& s) { s = {100, 284}; }, "group_sizes[0]", "group-k-block"},
      {"FP8 output", &mg, [](GroupedGemmArgs& a, std::vector<int64_t>&) { a.d_dtype = DType::kE4M3; }, "d_dtype", "grouped-out-dtype"},
      {"null B scales", &mg, [](GroupedGemmArgs& a, std::vector<int64_t>&) { a.b.scale = nullptr; }, "scale_b", ""},
      {"sizes on the host and the device", &mg,
       [](GroupedGemmArgs& a, std::vector<int64_t>& s) { a.group_sizes_device = s.data(); }, "group_sizes_device",
       "group-sizes-twice"},
      {"device-side sizes for a host-memory call", &mg,
       [](GroupedGemmArgs& a, std::vector<int64_t>& s) { a.group_sizes = nullptr, a.group_sizes_device = s.data(); },
       "group_sizes_device", "group-sizes-space"},
      {"unknown grouped backend", &mg, [](GroupedGemmArgs& a, std::vector<int64_t>&) { a.backend = GroupedBackend(7); },
       "backend", "grouped-backend"},
  };
  for (const Row& r : rows) {
    CAPTURE(r.name);
    std::vector<float> d(r.in->expected.size(), 1234.5f);
    std::vector<int64_t> sizes = r.in->sizes;
    GroupedGemmArgs a = r.in->args(d.data());
    r.breaks(a, sizes);
    if (a.group_sizes) a.group_sizes = sizes.data();
    try {
      h.grouped_gemm(a);
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.code() == StatusCode::kInvalidArgument);
      CHECK_THAT(e.what(), Catch::Contains(r.argument));
      CHECK_THAT(e.what(), Catch::Contains(r.rule));
    }
    for (float v : d) REQUIRE(v == 1234.5f);
  }
  // The K-block error says what to pad to.
  std::vector<float> d(kg.expected.size());
  std::vector<int64_t> sizes = {100, 284};
  GroupedGemmArgs a = kg.args(d.data());
  a.group_sizes = sizes.data();
  CHECK_THAT(to_string(validate(a)), Catch::Contains("K_g = 128"));
}

TEST_CASE("a grouped call explains one plan per distinct group shape", "[dispatch][grouped][host]") {
  auto rng = scalemm::testing::rng(0x6A4);
  const auto in = scalemm::testing::make_grouped(GroupDim::kM, Recipe::kMxfp8, Recipe::kMxfp8, ScaleFormat::kCompact,
                                                 ScaleFormat::kCompact, {4, 0, 4, 2}, 64, 8, rng);
  std::vector<float> d(in.expected.size());
  Handle h;
  const std::string text = h.explain(in.args(d.data()));
  CHECK_THAT(text, Catch::Contains("3 distinct group shape(s)"));
  CHECK_THAT(text, Catch::Contains("M_g=4 (groups 0 2)"));
  CHECK_THAT(text, Catch::Contains("M_g=0 (groups 1): no rows"));
  CHECK_THAT(text, Catch::Contains("reference"));
  // The CUTLASS grouped kernel says why it did not take the call.
  CHECK_THAT(text, Catch::Contains("CUTLASS grouped kernel passed over: "));
  // Host arrays run their groups one after another; device arrays spread them over forked streams,
  // one per non-empty group up to four.
  CHECK_THAT(text, !Catch::Contains("streams forked"));
  Handle hs;  // device arrays are planned for a (simulated) sm_90
  dispatch::SimulatedDevices sim;
  sim.devices = {DeviceTarget::simulated(90, 130100, 0)};
  dispatch::simulate_devices(hs, sim);
  GroupedGemmArgs dev = in.args(d.data());
  dev.space = MemorySpace::kDevice;
  CHECK_THAT(hs.explain(dev), Catch::Contains("the groups run on 3 streams forked from the caller's"));
  std::vector<int64_t> many(12, 1);
  const auto wide = scalemm::testing::make_grouped(GroupDim::kM, Recipe::kMxfp8, Recipe::kMxfp8, ScaleFormat::kCompact,
                                                   ScaleFormat::kCompact, many, 64, 8, rng);
  std::vector<float> dw(wide.expected.size());
  GroupedGemmArgs w = wide.args(dw.data());
  w.space = MemorySpace::kDevice;
  CHECK_THAT(hs.explain(w), Catch::Contains("the groups run on 4 streams"));
  // Emulated groups read compact scales as they are: no batch of conversions.
  CHECK_THAT(hs.explain(w), !Catch::Contains("scale conversions run in one launch"));
  CHECK_THAT(hs.explain(w), !Catch::Contains("graph_replay"));
  // Native groups with compact blockwise A scales: all groups' conversions in one launch; with
  // graph_replay the whole call is captured once (f32 output: the CUTLASS kernel passes).
  const auto bw = scalemm::testing::make_grouped(GroupDim::kM, Recipe::kBlock1x128, Recipe::kBlock128x128,
                                                 ScaleFormat::kCompact, ScaleFormat::kCompact, {64, 0, 128}, 128, 128, rng);
  std::vector<float> db(bw.expected.size());
  GroupedGemmArgs b = bw.args(db.data());
  b.space = MemorySpace::kDevice;
  CHECK_THAT(hs.explain(b), Catch::Contains("every group's scale conversions run in one launch before the groups"));
  b.graph_replay = true;
  CHECK_THAT(hs.explain(b), Catch::Contains("graph_replay: on a non-default stream the whole call is captured"));
}

TEST_CASE("device-side group sizes need A scales that do not depend on the sizes", "[dispatch][grouped][host]") {
  // Checked before any device memory is touched: a block128x128 A starts a new block grid per group.
  auto rng = scalemm::testing::rng(0x6A5);
  const auto in = scalemm::testing::make_grouped(GroupDim::kM, Recipe::kBlock128x128, Recipe::kBlock1x128,
                                                 ScaleFormat::kCompact, ScaleFormat::kCompact, {4, 4}, 128, 8, rng);
  std::vector<float> d(in.expected.size());
  GroupedGemmArgs a = in.args(d.data());
  a.space = MemorySpace::kDevice;
  a.group_sizes = nullptr;
  a.group_sizes_device = in.sizes.data();  // never read: validation stops first
  const std::string text = to_string(validate(a));
  CHECK_THAT(text, Catch::Contains("scale_a"));
  CHECK_THAT(text, Catch::Contains("group-sizes-device-scales"));
  CHECK_THAT(text, Catch::Contains("block128x128, compact"));
}

TEST_CASE("a grouped call that insists on the CUTLASS kernel it cannot have is refused with the reason",
          "[dispatch][grouped][host]") {
  auto rng = scalemm::testing::rng(0x6A6);
  const auto in = scalemm::testing::make_grouped(GroupDim::kM, Recipe::kBlock1x128, Recipe::kBlock128x128,
                                                 ScaleFormat::kCompact, ScaleFormat::kCompact, {4, 4}, 128, 8, rng);
  std::vector<float> d(in.expected.size(), 1234.5f);
  GroupedGemmArgs a = in.args(d.data());  // host memory (and f32 output): never the CUTLASS kernel
  a.backend = GroupedBackend::kCutlass;
  Handle h;
  try {
    h.grouped_gemm(a);
    FAIL("accepted");
  } catch (const Error& e) {
    CHECK(e.code() == StatusCode::kUnsupported);
    CHECK_THAT(e.what(), Catch::Contains("CUTLASS grouped kernel cannot run this call"));
  }
  for (float v : d) REQUIRE(v == 1234.5f);
  // explain() says what the call would do: the same refusal, not the plan of another backend.
  try {
    (void)h.explain(a);
    FAIL("explained");
  } catch (const Error& e) {
    CHECK(e.code() == StatusCode::kUnsupported);
    CHECK_THAT(e.what(), Catch::Contains("CUTLASS grouped kernel cannot run this call: host memory"));
  }
  // Asking for the per-group backend names why the CUTLASS kernel was passed over.
  a.backend = GroupedBackend::kPerGroup;
  CHECK_THAT(h.explain(a), Catch::Contains("CUTLASS grouped kernel passed over: the call asks for the per-group backend"));
  CHECK(to_string(GroupedBackend::kPerGroup) == "per-group");
  // The same for the contiguous kernel, which runs device memory only.
  a.backend = GroupedBackend::kContiguous;
  for (float v : d) REQUIRE(v == 1234.5f);
  try {
    h.grouped_gemm(a);
    FAIL("accepted");
  } catch (const Error& e) {
    CHECK(e.code() == StatusCode::kUnsupported);
    CHECK_THAT(e.what(), Catch::Contains("contiguous grouped kernel cannot run this call"));
  }
  for (float v : d) REQUIRE(v == 1234.5f);
  CHECK(to_string(GroupedBackend::kContiguous) == "contiguous");
}

TEST_CASE("the contiguous grouped kernel names why it does not take a call; auto picks it for decode and short K",
          "[dispatch][grouped][host]") {
  auto rng = scalemm::testing::rng(0x6A8);
  auto machine = [](int sm) {
    dispatch::SimulatedDevices sim;
    sim.devices = {DeviceTarget::simulated(sm, 130100, 0)};
    return sim;
  };
  Handle h90, h100;
  dispatch::simulate_devices(h90, machine(90));
  dispatch::simulate_devices(h100, machine(100));
  auto inputs = [&](GroupDim dim, Recipe rb, ScaleFormat f, std::vector<int64_t> sizes) {
    return scalemm::testing::make_grouped(dim, Recipe::kBlock1x128, rb, f, f, sizes, 256, 128, rng);
  };
  std::vector<float> d;
  auto args = [&](const GroupedInputs& in) {
    d.assign(in.expected.size(), 0.0f);
    GroupedGemmArgs a = in.args(d.data());
    a.space = MemorySpace::kDevice;  // planned for the simulated device, never run
    a.d_dtype = DType::kBF16;
    a.backend = GroupedBackend::kContiguous;
    return a;
  };
  auto refusal = [](Handle& h, const GroupedGemmArgs& a) {
    try {
      (void)h.explain(a);
    } catch (const Error& e) {
      CHECK(e.code() == StatusCode::kUnsupported);
      return std::string(e.what());
    }
    return std::string("taken");
  };
  const GroupedInputs in = inputs(GroupDim::kM, Recipe::kBlock128x128, ScaleFormat::kCompact, {64, 0, 129});
  GroupedGemmArgs a = args(in);
  const std::string first = refusal(h90, a);
  if (first.find("not built") != std::string::npos) {
    WARN("SKIPPED: the sm_90a kernels are not built here (no CUTLASS headers or no sm_90 architecture)");
    return;
  }
  CHECK(first == "taken");
  const std::string text = h90.explain(a);
  CHECK_THAT(text, Catch::Contains("contiguous grouped backend") && Catch::Contains("one launch for all 3 groups") &&
                       Catch::Contains("from host sizes"));
  a.backend = GroupedBackend::kAuto;  // measured faster than the CUTLASS kernel on every MoE shape: auto takes it
  CHECK_THAT(h90.explain(a), Catch::Contains("contiguous grouped backend") && !Catch::Contains("CUTLASS grouped backend"));
  // An auto call over compact blockwise inputs of these sizes, K and N. Only planned: the cases below
  // build small operands (their exact product is computed on the host) and then set the K and N planned.
  std::vector<GroupedInputs> kept;  // the args point into them
  auto auto_args = [&](std::vector<int64_t> sizes, int64_t k, int64_t n) {
    kept.push_back(scalemm::testing::make_grouped(GroupDim::kM, Recipe::kBlock1x128, Recipe::kBlock128x128,
                                                  ScaleFormat::kCompact, ScaleFormat::kCompact, sizes, k, n, rng));
    GroupedGemmArgs x = args(kept.back());
    x.backend = GroupedBackend::kAuto;
    return x;
  };
  kept.reserve(3);
  {  // few rows per group over a long K (decode): auto takes it, with 128 x 192 tiles
    GroupedGemmArgs da = auto_args({8, 0, 64, 1}, 128, 16);
    da.k = 4096, da.n = 2048;
    CHECK(backends::contiguous_grouped::decode_like(da));
    CHECK(backends::contiguous_grouped::wide_tiles(da));
    CHECK_FALSE(backends::contiguous_grouped::shared_b(da));  // one M tile per group: no pair would share B
    CHECK_THAT(h90.explain(da), Catch::Contains("contiguous grouped backend") && Catch::Contains("128x192x128 tiles without clusters"));
    {  // on an H200 too (0.98-1.00x the CUTLASS kernel's time at decode)
      dispatch::SimulatedDevices sim = machine(90);
      sim.devices[0].name = "NVIDIA H200";
      Handle h200;
      dispatch::simulate_devices(h200, sim);
      CHECK_THAT(h200.explain(da), Catch::Contains("contiguous grouped backend") && !Catch::Contains("CUTLASS grouped backend"));
    }
    da.n = 1024;  // N below 2048: not decode-like
    CHECK_FALSE(backends::contiguous_grouped::decode_like(da));
  }
  {  // a short K: auto takes it, with 128 x 128 tiles
    GroupedGemmArgs sa = auto_args({256, 0, 300, 200}, 128, 16);
    sa.k = 2048, sa.n = 256;
    CHECK_FALSE(backends::contiguous_grouped::decode_like(sa));
    CHECK_FALSE(backends::contiguous_grouped::wide_tiles(sa));
    CHECK_THAT(h90.explain(sa), Catch::Contains("contiguous grouped backend") && Catch::Contains("128x128x128 tiles"));
  }
  {  // many rows per group over a long K: auto takes it, with 128 x 192 tiles in clusters sharing B
    GroupedGemmArgs wa = auto_args({1024, 0, 700, 324}, 128, 16);
    wa.k = 4096;
    CHECK(backends::contiguous_grouped::wide_tiles(wa));
    CHECK(backends::contiguous_grouped::shared_b(wa));
    CHECK_FALSE(backends::contiguous_grouped::decode_like(wa));
    CHECK_THAT(h90.explain(wa), Catch::Contains("contiguous grouped backend") && Catch::Contains("128x192x128 tiles") &&
                                   Catch::Contains("clusters of 2 M tiles (B multicast within a group)") &&
                                   Catch::Contains("a long K with many rows per group"));
    wa.m = 4 * 256 - 1;  // fewer than 256 rows per group on average (4 groups): 128 x 128 tiles
    CHECK_FALSE(backends::contiguous_grouped::wide_tiles(wa));
    CHECK_FALSE(backends::contiguous_grouped::shared_b(wa));
    wa.m = 4 * 256;
    CHECK(backends::contiguous_grouped::shared_b(wa));
    wa.k = 3968;  // a K below 4096
    CHECK_FALSE(backends::contiguous_grouped::wide_tiles(wa));
    CHECK_FALSE(backends::contiguous_grouped::shared_b(wa));
  }
  {  // 160-wide tiles where they fill the SMs' waves better than 192-wide ones (host sizes only)
    namespace cg = backends::contiguous_grouped;
    std::vector<int64_t> few(64, 0);  // decode, 10 experts routed: 10 M tiles
    for (int g = 0; g < 10; ++g) few[size_t(6 * g)] = g < 8 ? 48 : 64;
    GroupedGemmArgs d = auto_args(few, 128, 16);
    d.k = 7168, d.n = 4096;
    REQUIRE(cg::decode_like(d));
    // 10 x 22 tiles of 192 columns fill 2 waves of 132 SMs, 10 x 26 of 160 also 2: 320 / 384 columns
    CHECK(cg::narrow_tiles(d, 132));
    CHECK(cg::tiles(d, 132) == cg::Tiles::k160SharedA);
    CHECK_FALSE(cg::narrow_tiles(d, 0));  // no SM count known (a simulated device): 192 columns
    CHECK(cg::tiles(d, 0) == cg::Tiles::k192);
    CHECK(cg::tiles(d, 260) == cg::Tiles::k160SharedA);  // one wave either way
    CHECK(cg::tiles(d, 220) == cg::Tiles::k192);  // one wave of 192 columns, two of 160
    {
      dispatch::SimulatedDevices sim = machine(90);
      sim.devices[0].multiprocessors = 132;
      Handle h132;
      dispatch::simulate_devices(h132, sim);
      CHECK_THAT(h132.explain(d), Catch::Contains("128x160x128 tiles in clusters of 2 (A multicast)") &&
                                      Catch::Contains("160 columns fill the SMs' waves better here than 192"));
    }
    // Device sizes are not read on the host: 192 columns
    GroupedGemmArgs dd = d;
    dd.group_sizes = nullptr;
    dd.group_sizes_device = few.data();
    CHECK_FALSE(cg::narrow_tiles(dd, 132));
    // Every expert routed 8 rows: 64 x 22 tiles, 11 waves of 192 columns against 13 of 160 (0.985): 192
    std::vector<int64_t> eight(64, 8);
    GroupedGemmArgs e = d;
    e.group_sizes = eight.data();
    CHECK(cg::tiles(e, 132) == cg::Tiles::k192);
    // Many rows per group: 8 x 512 x 7168 x 4096 takes 10 waves of 192-wide tiles, 11 of 160 (0.917):
    // 160 columns, B shared; 8 x 2048 x 4096 x 7168 22 and 26 waves (0.985): 192
    std::vector<int64_t> g512(8, 512), g2048(8, 2048);
    GroupedGemmArgs w = d;
    w.groups = 8, w.group_sizes = g512.data(), w.m = 8 * 512, w.n = 7168, w.k = 4096;
    REQUIRE(cg::shared_b(w));
    CHECK(cg::tiles(w, 132) == cg::Tiles::k160SharedB);
    w.group_sizes = g2048.data(), w.m = 8 * 2048, w.n = 4096, w.k = 7168;
    CHECK(cg::tiles(w, 132) == cg::Tiles::k192SharedB);
    w.k = 2048;  // a short K: 128-wide tiles, 32 waves of them against 26 of 160 columns (4160 / 4096)
    CHECK(cg::tiles(w, 132) == cg::Tiles::k128SharedA);
    // 16 x 256 x 2048 x 2048: equal, 4 waves of 128 or 160 columns (128); uneven (grouped.py's sizes,
    // 38 M tiles), 5 waves of 128 columns against 4 of 160 (160, B shared)
    std::vector<int64_t> eq16(16, 256), un16 = {48, 208, 464, 1152, 64, 0, 64, 224, 32, 496, 464, 224, 16, 240, 352, 48};
    w.groups = 16, w.m = 4096, w.n = 2048, w.k = 2048, w.group_sizes = eq16.data();
    CHECK(cg::tiles(w, 132) == cg::Tiles::k128SharedA);
    w.group_sizes = un16.data();
    CHECK(cg::tiles(w, 132) == cg::Tiles::k160SharedB);
    w.m = 4095;  // fewer than 256 rows per group on average over a short K: 128 whatever the waves
    CHECK_FALSE(cg::narrow_tiles(w, 132));
    // Decode with every group empty: no tiles to balance
    std::vector<int64_t> none(64, 0);
    e.group_sizes = none.data(), e.m = 0;
    REQUIRE(cg::decode_like(e));
    CHECK_FALSE(cg::narrow_tiles(e, 132));
  }
  {  // 64-wide tiles for one group (a dense call) whose 128-wide tiles fill at most half the SMs
    namespace cg = backends::contiguous_grouped;
    std::vector<int64_t> one = {16};
    GroupedGemmArgs g;
    g.groups = 1, g.group_sizes = one.data(), g.m = 16, g.n = 7168, g.k = 2048;  // 56 N tiles: 112 of 64 columns
    CHECK(cg::half_tiles(g, 132));
    CHECK(cg::tiles(g, 132) == cg::Tiles::k64);
    CHECK_FALSE(cg::half_tiles(g, 100));  // 112 tiles of 64 columns are more than 100 SMs
    CHECK_FALSE(cg::half_tiles(g, 0));    // no SM count known
    one[0] = 256;  // 2 M tiles: 224 of 64 columns
    CHECK_FALSE(cg::half_tiles(g, 132));
    one[0] = 16;
    g.n = 10240;  // 80 N tiles: 160 of 64 columns
    CHECK_FALSE(cg::half_tiles(g, 132));
    g.n = 4096, g.k = 7168;  // 32 N tiles: 64 of 64 columns, whatever K
    CHECK(cg::tiles(g, 132) == cg::Tiles::k64);
    CHECK_THAT(cg::describe(g, cg::Tiles::k64), Catch::Contains("128x64x128 tiles without clusters") &&
                                                    Catch::Contains("the call as one group"));
    // Two groups, or sizes on the device: the rules above
    std::vector<int64_t> two = {8, 8};
    GroupedGemmArgs g2 = g;
    g2.groups = 2, g2.group_sizes = two.data(), g2.n = 7168;
    CHECK_FALSE(cg::half_tiles(g2, 132));
    GroupedGemmArgs dev = g;
    dev.group_sizes = nullptr, dev.group_sizes_device = one.data();
    CHECK_FALSE(cg::half_tiles(dev, 132));
    // One group of few rows over a long K is not decode-like: 107 tiles of 96 columns (80 of 128 fill
    // 61% of the SMs, 160 of 64 would take two waves), not 64 of 160 (two groups of the same rows are)
    g.n = 10240, g.k = 8192;
    CHECK_FALSE(cg::decode_like(g));
    CHECK_FALSE(cg::half_tiles(g, 132));
    CHECK(cg::third_tiles(g, 132));
    CHECK(cg::tiles(g, 132) == cg::Tiles::k96);
    CHECK_THAT(cg::describe(g, cg::Tiles::k96), Catch::Contains("128x96x128 tiles without clusters"));
    CHECK_FALSE(cg::third_tiles(g, 100));  // 107 tiles of 96 columns are more than 100 SMs
    CHECK_FALSE(cg::third_tiles(g, 0));    // no SM count known
    one[0] = 200;  // 2 M tiles: 214 of 96 columns, two waves; 160 of 128 columns
    CHECK(cg::tiles(g, 132) == cg::Tiles::k128SharedA);
    one[0] = 16;
    g.n = 7168;  // 64-wide tiles fit one wave: they win
    CHECK_FALSE(cg::third_tiles(g, 132));
    CHECK_FALSE(cg::third_tiles(g2, 132));  // two groups
    CHECK_FALSE(cg::third_tiles(dev, 132));  // sizes on the device
    g2.n = 10240, g2.k = 8192;
    CHECK(cg::decode_like(g2));
    CHECK(cg::tiles(g2, 132) == cg::Tiles::k160SharedA);
  }
  {  // what it cannot run passes on under auto, with its reason: an f32 output
    GroupedGemmArgs fa = auto_args({256, 0, 300, 200}, 128, 16);
    fa.d_dtype = DType::kF32;
    CHECK_THAT(h90.explain(fa), Catch::Contains("per-group backend") &&
                                    Catch::Contains("contiguous grouped kernel passed over: the contiguous grouped kernel is built for bf16 output"));
  }
  a.backend = GroupedBackend::kContiguous;
  CHECK_THAT(refusal(h100, a), Catch::Contains("built for sm_90a; this device is sm_100"));
  a.d_dtype = DType::kF32;
  CHECK_THAT(refusal(h90, a), Catch::Contains("built for bf16 output"));
  struct Case {
    GroupDim dim;
    Recipe rb;
    ScaleFormat f;
    std::vector<int64_t> sizes;
    const char* why;
  };
  const Case cases[] = {
      {GroupDim::kK, Recipe::kBlock1x128, ScaleFormat::kCompact, {128, 128}, "runs m-grouped calls"},
      {GroupDim::kM, Recipe::kBlock1x128, ScaleFormat::kCompact, {64, 64}, "runs block1x128 x block128x128"},
      {GroupDim::kM, Recipe::kBlock128x128, ScaleFormat::kCublasLt, {64, 64}, "reads A's scales of several groups in the compact format"},
      {GroupDim::kM, Recipe::kBlock128x128, ScaleFormat::kCompact, std::vector<int64_t>(1025, 1), "more than 1024 groups"},
  };
  for (const Case& c : cases) {
    const GroupedInputs cin = inputs(c.dim, c.rb, c.f, c.sizes);
    const GroupedGemmArgs ca = args(cin);
    CAPTURE(c.why);
    CHECK_THAT(refusal(h90, ca), Catch::Contains("contiguous grouped kernel cannot run this call") && Catch::Contains(c.why));
  }
  // cuBLASLt-format scales where each is a row term plus a K-block term: B's per-expert buffers, and A's
  // one buffer of a single group. Read in place, as explain() says.
  for (auto [fa, sizes, named] : {std::tuple{ScaleFormat::kCompact, std::vector<int64_t>{64, 0, 129}, "A compact, B cublaslt"},
                                  {ScaleFormat::kCublasLt, std::vector<int64_t>{129}, "cublaslt"}}) {
    const GroupedInputs lin = scalemm::testing::make_grouped(GroupDim::kM, Recipe::kBlock1x128, Recipe::kBlock128x128, fa,
                                                             ScaleFormat::kCublasLt, sizes, 256, 128, rng);
    const GroupedGemmArgs la = args(lin);
    CAPTURE(named);
    CHECK(refusal(h90, la) == "taken");
    CHECK_THAT(h90.explain(la), Catch::Contains("contiguous grouped backend") &&
                                    Catch::Contains(std::string("; ") + named + " scales read in place"));
  }
}

TEST_CASE("rowwise fast accumulation over many rows per group takes the CUTLASS kernel's 256 x 128 tiles under auto",
          "[dispatch][grouped][host]") {
  auto rng = scalemm::testing::rng(0x6A9);
  dispatch::SimulatedDevices sim;
  sim.devices = {DeviceTarget::simulated(90, 130100, 0)};
  Handle h;
  dispatch::simulate_devices(h, sim);
  std::vector<float> d;
  auto plan = [&](std::vector<int64_t> sizes, bool fast) {
    const GroupedInputs in = scalemm::testing::make_grouped(GroupDim::kM, Recipe::kRowwise, Recipe::kRowwise,
                                                            ScaleFormat::kCompact, ScaleFormat::kCompact, sizes, 256, 128, rng);
    d.assign(in.expected.size(), 0.0f);
    GroupedGemmArgs a = in.args(d.data());
    a.space = MemorySpace::kDevice;  // planned for the simulated device, never run
    a.d_dtype = DType::kBF16;
    a.fast_accum = fast;
    CHECK(backends::cutlass_grouped::wide_fast_accum(a) == (fast && in.m >= 256 * int64_t(sizes.size())));
    return h.explain(a);
  };
  const std::string many = plan({1024, 0, 1040}, true);
  if (many.find("not built") != std::string::npos || many.find("CUTLASS grouped backend") == std::string::npos) {
    CHECK_THAT(many, Catch::Contains("not built"));
    WARN("SKIPPED: the sm_90a kernels are not built here (no CUTLASS headers or no sm_90 architecture)");
    return;
  }
  // one launch, 256 x 128 tiles: measured faster than one cuBLASLt call per group below 2048 rows per group
  CHECK_THAT(many, Catch::Contains("256x128x128 tiles") && Catch::Contains("fast accumulation"));
  // exact accumulation over the same groups, or fast over 2048 rows per group: one cuBLASLt call per group, as measured
  CHECK_THAT(plan({1024, 0, 1040}, false), Catch::Contains("measured faster as one cuBLASLt call per group"));
  CHECK_THAT(plan({2048, 2048}, true), Catch::Contains("rowwise fast accumulation with large groups (average M_g 2048 >= 2048)"));
  // fewer than 256 rows per group on average: the 128 x 128 tiles
  CHECK_THAT(plan({7, 0, 1, 129}, true), Catch::Contains("128x128x128 tiles") && Catch::Contains("fast accumulation"));
}

namespace {

// GroupedServices that record what the per-group backend asks for, in order, and run nothing: the
// order in which a device call allocates and enqueues is checked without a device.
class RecordingServices final : public backends::GroupedServices {
 public:
  struct Event {
    std::string what;  // "plan", "staging", "fork", "reserve", "begin", "gemm", "join"
    Stream stream = nullptr;
    size_t bytes = 0;
  };
  std::vector<Event> log;
  std::vector<std::unique_ptr<Plan>> plans;
  std::vector<char> stage = std::vector<char>(1 << 20);

  const Plan& dense_plan(const GemmArgs& a, Stream s) override {
    plans.push_back(std::make_unique<Plan>());
    plans.back()->backend = Backend::kEmulated;  // reads compact scales as they are: no batch
    plans.back()->workspace_bytes = size_t(a.m) * 1000;
    log.push_back({"plan", s, plans.back()->workspace_bytes});
    return *plans.back();
  }
  void run_dense(const GemmArgs& a, const Plan& p, Stream s) override {
    CHECK(p.workspace_bytes == size_t(a.m) * 1000);  // the plan made for this group's shape
    log.push_back({"gemm", s, size_t(a.m)});
  }
  backends::StagingScratch staging(Stream s, size_t bytes) override {
    log.push_back({"staging", s, bytes});
    backends::StagingScratch out;
    out.ptr = stage.data();
    return out;
  }
  std::unique_ptr<backends::ForkedStreams> fork(Stream caller, int count) override {
    log.push_back({"fork", caller, size_t(count)});
    auto f = std::make_unique<Fork>(log);
    for (int i = 0; count > 1 && i < count; ++i) f->streams.push_back(reinterpret_cast<Stream>(uintptr_t(0x1000 + i)));
    return f;
  }
  void reserve_dense(Stream s, size_t bytes) override { log.push_back({"reserve", s, bytes}); }

 private:
  class Fork final : public backends::ForkedStreams {
   public:
    explicit Fork(std::vector<Event>& log) : log_(log) {}
    ~Fork() override { log_.push_back({"join", nullptr, 0}); }
    void begin() override { log_.push_back({"begin", nullptr, 0}); }

   private:
    std::vector<Event>& log_;
  };
};

}  // namespace

TEST_CASE("the per-group backend allocates every stream's workspace and staging before it enqueues a group",
          "[dispatch][grouped][host][memory]") {
  // Device-memory arguments whose buffers are never read: the recording services run nothing, and
  // blockwise FP8 with K = 512 needs no aligned copies or scale batch.
  auto rng = scalemm::testing::rng(0x6A9);
  const auto in = scalemm::testing::make_grouped(GroupDim::kM, Recipe::kBlock1x128, Recipe::kBlock128x128,
                                                 ScaleFormat::kCompact, ScaleFormat::kCompact, {7, 0, 129, 64, 300, 1},
                                                 512, 256, rng);
  std::vector<float> d(in.expected.size());
  GroupedGemmArgs args = in.args(d.data(), in.a_data.data(), in.a_scale.data(), in.b_data.data(), in.b_scale.data(),
                                 MemorySpace::kDevice);
  args.backend = GroupedBackend::kPerGroup;
  RecordingServices svc;
  const backends::GroupedRunContext ctx{reinterpret_cast<Stream>(uintptr_t(0x10)), nullptr, &svc};
  backends::per_group_backend().run(args, ctx);

  auto at = [&](const std::string& what) {
    for (size_t i = 0; i < svc.log.size(); ++i)
      if (svc.log[i].what == what) return i;
    return svc.log.size();
  };
  const size_t begin = at("begin"), first_gemm = at("gemm");
  REQUIRE(begin < svc.log.size());
  REQUIRE(first_gemm < svc.log.size());
  CHECK(begin < first_gemm);
  std::map<Stream, size_t> reserved;  // what each stream was given before the fork began
  for (size_t i = 0; i < svc.log.size(); ++i) {
    const auto& e = svc.log[i];
    CAPTURE(i, e.what);
    if (e.what == "reserve" || e.what == "staging" || e.what == "fork" || e.what == "plan") CHECK(i < begin);
    if (e.what == "reserve") reserved[e.stream] = std::max(reserved[e.stream], e.bytes);
  }
  int gemms = 0;
  for (const auto& e : svc.log) {
    if (e.what != "gemm") continue;
    ++gemms;
    INFO("a group of " << e.bytes << " rows");
    REQUIRE(reserved.count(e.stream) == 1);
    CHECK(reserved[e.stream] >= e.bytes * 1000);  // the group's plan's workspace, reserved up front
  }
  CHECK(gemms == 5);                 // the non-empty groups
  CHECK(reserved.size() == 4);       // four forked streams, each reserved
  CHECK(svc.log.back().what == "join");
}
