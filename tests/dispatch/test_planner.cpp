// Planner decisions, checked without a GPU against simulated devices.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <tuple>
#include <vector>

#include "base/capabilities.hpp"
#include "scalemm/formats.hpp"
#include "scalemm/gemm.hpp"

using namespace scalemm;

namespace {

struct SimDevice {
  const char* label;
  int sm;
  size_t cublas;
};
constexpr SimDevice kDevices[] = {
    {"sm_89 cuBLASLt 13.1", 89, 130100}, {"sm_90 cuBLASLt 12.8", 90, 120800}, {"sm_90 cuBLASLt 13.1", 90, 130100},
    {"sm_100 cuBLASLt 13.1", 100, 130100}, {"sm_120 cuBLASLt 13.1", 120, 130100}, {"no GPU", 0, 130100},
};

GemmProblem problem(Recipe a, Recipe b, int64_t m = 256, int64_t n = 256, int64_t k = 512) {
  GemmProblem p;
  p.m = m, p.n = n, p.k = k;
  p.a_recipe = a, p.b_recipe = b;
  p.a_dtype = a == Recipe::kNvfp4 ? DType::kE2M1 : DType::kE4M3;
  p.b_dtype = b == Recipe::kNvfp4 ? DType::kE2M1 : DType::kE4M3;
  return p;
}

std::string decision_table() {
  std::ostringstream os;
  os << "# Planner decisions for every recipe pair (A x B) on simulated devices: M=N=256, K=512, e4m3 data\n"
        "# (e2m1 for nvfp4), compact scales, bf16 output, device pointers (no GPU: host pointers).\n"
        "# Regenerate with SCALEMM_UPDATE_GOLDEN=1 and review the diff line by line.\n";
  for (const auto& dev : kDevices) {
    const DeviceTarget t = DeviceTarget::simulated(dev.sm, dev.cublas);
    for (Recipe a : kAllRecipes)
      for (Recipe b : kAllRecipes) {
        GemmProblem p = problem(a, b);
        if (!t.has_gpu()) p.space = MemorySpace::kHost;
        const Plan plan = scalemm::plan(p, t);
        os << dev.label << " | " << to_string(a) << " x " << to_string(b) << " -> " << to_string(plan.backend) << '\n';
      }
  }
  return os.str();
}

}  // namespace

TEST_CASE("the planner's decision for every recipe pair on every simulated device matches the golden table",
          "[dispatch][planner]") {
  const std::string got = decision_table();
  const char* path = SCALEMM_DISPATCH_GOLDEN;
  if (std::getenv("SCALEMM_UPDATE_GOLDEN")) {
    std::ofstream(path) << got;
    WARN("golden table rewritten: " << path);
  }
  std::ifstream f(path);
  REQUIRE(f.good());
  std::stringstream want;
  want << f.rdbuf();
  REQUIRE(got == want.str());
}

TEST_CASE("blockwise FP8 is native on sm_90 with cuBLASLt 12.9 or newer and emulated nowhere", "[dispatch][planner]") {
  const auto h200 = DeviceTarget::simulated(90, 130100);
  for (auto pr : {std::pair{Recipe::kBlock1x128, Recipe::kBlock1x128}, {Recipe::kBlock1x128, Recipe::kBlock128x128},
                  {Recipe::kBlock128x128, Recipe::kBlock1x128}}) {
    const Plan p = plan(problem(pr.first, pr.second), h200);
    CHECK(p.backend == Backend::kNative);
    // K=512: the 1x128 scales are transposed to outer-major; a 128x128 grid of 4 K-blocks already is
    // the cuBLASLt buffer (stride 4), so it is passed as it is.
    const size_t n1x128 = (pr.first == Recipe::kBlock1x128) + (pr.second == Recipe::kBlock1x128);
    CHECK(p.conversions.size() == n1x128);
    CHECK(p.convert_scale_a == (pr.first == Recipe::kBlock1x128));
    CHECK(p.convert_scale_b == (pr.second == Recipe::kBlock1x128));
    // K=640: 5 K-blocks, padded to 8 in the cuBLASLt buffer: every compact buffer is converted.
    const Plan q = plan(problem(pr.first, pr.second, 256, 256, 640), h200);
    CHECK(q.conversions.size() == 2);
    CHECK((q.convert_scale_a && q.convert_scale_b));
  }
  const Plan old = plan(problem(Recipe::kBlock1x128, Recipe::kBlock128x128), DeviceTarget::simulated(90, 120800));
  CHECK(old.backend == Backend::kReference);
  CHECK_THAT(old.explain(), Catch::Contains("needs cuBLASLt >= 12.9.0, this is 12.8.0"));
  const Plan b100 = plan(problem(Recipe::kBlock1x128, Recipe::kBlock128x128), DeviceTarget::simulated(100, 130100));
  CHECK(b100.backend == Backend::kReference);
  CHECK_THAT(b100.explain(), Catch::Contains("needs sm_90"));
}

TEST_CASE("mxfp8 on Hopper falls back to exact BF16 emulation and says why", "[dispatch][planner]") {
  const Plan p = plan(problem(Recipe::kMxfp8, Recipe::kMxfp8), DeviceTarget::simulated(90, 130100));
  CHECK(p.backend == Backend::kEmulated);
  const std::string e = p.explain();
  CHECK_THAT(e, Catch::Contains("mxfp8\xC3\x97mxfp8 on sm_90: cuBLASLt VEC32_UE8M0 needs sm_100+"));
  CHECK_THAT(e, Catch::Contains("emulated: exact dequantization to BF16 + cuBLASLt BF16"));
  CHECK(p.workspace_bytes >= size_t(256 * 512 * 2 * 2));
  CHECK(plan(problem(Recipe::kMxfp8, Recipe::kMxfp8), DeviceTarget::simulated(100, 130100)).backend ==
        Backend::kNative);
}

TEST_CASE("the 128x128 x 128x128 pair is refused natively with its source", "[dispatch][planner]") {
  const Plan p = plan(problem(Recipe::kBlock128x128, Recipe::kBlock128x128), DeviceTarget::simulated(90, 130100));
  CHECK(p.backend == Backend::kReference);
  CHECK_THAT(p.explain(), Catch::Contains("BLK128x128_32F x BLK128x128_32F is not supported"));
}

TEST_CASE("shape and type rules of the native contracts send a problem elsewhere with the rule named",
          "[dispatch][planner]") {
  const auto h200 = DeviceTarget::simulated(90, 130100);
  SECTION("K not a multiple of 16") {
    const Plan p = plan(problem(Recipe::kTensorwise, Recipe::kTensorwise, 256, 256, 520), h200);
    CHECK(p.backend == Backend::kReference);
    CHECK_THAT(p.explain(), Catch::Contains("K=520 is not a multiple of 16"));
  }
  SECTION("bf16 output with N not a multiple of 8") {
    CHECK(plan(problem(Recipe::kTensorwise, Recipe::kTensorwise, 256, 260, 512), h200).backend == Backend::kReference);
    GemmProblem p = problem(Recipe::kTensorwise, Recipe::kTensorwise, 256, 260, 512);
    p.d_dtype = DType::kF32;
    CHECK(plan(p, h200).backend == Backend::kNative);
  }
  SECTION("VEC128 needs M and N multiples of 4: M is padded, N is not") {
    const Plan p = plan(problem(Recipe::kBlock1x128, Recipe::kBlock128x128, 130, 256, 512), h200);
    CHECK(p.backend == Backend::kConvertNative);
    CHECK(p.padded_m == 132);
    CHECK_THAT(p.explain(), Catch::Contains("needs M and N multiples of 4, got M=130"));
    CHECK_THAT(p.explain(), Catch::Contains("A padded to M=132 with zero rows"));
    GemmProblem n130 = problem(Recipe::kBlock1x128, Recipe::kBlock128x128, 256, 130, 512);
    n130.d_dtype = DType::kF32;
    const Plan q = plan(n130, h200);
    CHECK(q.backend == Backend::kReference);
    CHECK_THAT(q.explain(), Catch::Contains("N=130 is not a multiple of 4"));
  }
  SECTION("e5m2 x e5m2") {
    GemmProblem p = problem(Recipe::kTensorwise, Recipe::kTensorwise);
    p.a_dtype = p.b_dtype = DType::kE5M2;
    CHECK(plan(p, h200).backend == Backend::kReference);
    p.b_dtype = DType::kE4M3;
    CHECK(plan(p, h200).backend == Backend::kNative);
  }
}

TEST_CASE("blockwise decoding (M = 1..3) runs natively on A padded to 4 rows", "[dispatch][planner]") {
  const auto h200 = DeviceTarget::simulated(90, 130100);
  // N = 2048: 16 N tiles, too few for scalemm's own kernel (the contiguous backend) to be taken.
  for (int64_t m : {1, 2, 3}) {
    const Plan p = plan(problem(Recipe::kBlock1x128, Recipe::kBlock128x128, m, 2048, 7168), h200);
    CAPTURE(m, p.explain());
    CHECK(p.backend == Backend::kConvertNative);
    CHECK(p.padded_m == 4);
    // A's scales still need their compact -> cuBLASLt conversion; the padded copies are in the workspace.
    CHECK(p.convert_scale_a);
    CHECK(p.workspace_bytes >= size_t(4 * 7168 + 4 * 2048 * 2));
  }
  // Not on a device without blockwise support, and not for host memory.
  CHECK(plan(problem(Recipe::kBlock1x128, Recipe::kBlock128x128, 1, 7168, 2048), DeviceTarget::simulated(100, 130100))
            .backend == Backend::kReference);
}

TEST_CASE("FP8 output is native only with tensorwise scales; other pairs stage an fp32 D", "[dispatch][planner]") {
  const auto h200 = DeviceTarget::simulated(90, 130100);
  GemmProblem tw = problem(Recipe::kTensorwise, Recipe::kTensorwise);
  tw.d_dtype = DType::kE4M3;
  tw.has_amax = true;
  const Plan p = plan(tw, h200);
  CHECK(p.backend == Backend::kNative);
  CHECK(p.staged_output_bytes == 0);
  GemmProblem e5 = tw;
  e5.d_dtype = DType::kE5M2;  // e4m3 x e4m3 cannot give an e5m2 D from cuBLASLt: native with fp32 D
  const Plan q = plan(e5, h200);
  CHECK(q.backend == Backend::kNative);
  CHECK_THAT(q.explain(), Catch::Contains("E5M2 output needs an E5M2 input"));
  CHECK(q.staged_output_bytes == size_t(256 * 256 * 4));
  for (auto [ra, rb] : {std::pair{Recipe::kBlock1x128, Recipe::kBlock128x128}, {Recipe::kRowwise, Recipe::kRowwise},
                        {Recipe::kMxfp8, Recipe::kMxfp8}}) {
    GemmProblem x = problem(ra, rb);
    x.d_dtype = DType::kE4M3;
    const Plan r = plan(x, h200);
    CAPTURE(r.explain());
    CHECK(r.backend == (ra == Recipe::kMxfp8 ? Backend::kEmulated : Backend::kNative));  // all with fp32 D
    CHECK(r.staged_output_bytes == size_t(256 * 256 * 4));
    CHECK_THAT(r.explain(), Catch::Contains("fp32 D, then e4m3 with d_scale"));
    CHECK(r.workspace_bytes >= r.staged_output_bytes);
  }
}

TEST_CASE("FP8 output on the host reference: saturating conversion with d_scale, amax before it", "[dispatch]") {
  // A = B = 1.0 (e4m3 0x38) with scales 1: every output is K = 64; d_scale 8 -> 512 saturates to 448.
  std::vector<uint8_t> a(16 * 64, 0x38), b(32 * 64, 0x38), d(16 * 32, 0);
  float sa = 1.0f, sb = 1.0f, amax = -1.0f;
  for (float ds : {0.25f, 8.0f}) {
    GemmArgs args;
    args.m = 16, args.n = 32, args.k = 64;
    args.a = {a.data(), DType::kE4M3, Recipe::kTensorwise, &sa, ScaleFormat::kCompact, 1.0f};
    args.b = {b.data(), DType::kE4M3, Recipe::kTensorwise, &sb, ScaleFormat::kCompact, 1.0f};
    args.d = d.data(), args.d_dtype = DType::kE4M3, args.d_scale = &ds, args.d_amax = &amax;
    args.space = MemorySpace::kHost;
    Handle h;
    h.gemm(args);
    const uint8_t want = formats::encode_e4m3(ds * 64.0f);
    CAPTURE(ds);
    CHECK(formats::decode_e4m3(want) == std::min(448.0f, ds * 64.0f));
    for (uint8_t v : d) REQUIRE(v == want);
    CHECK(amax == 64.0f);
  }
}

TEST_CASE("tensorwise with rowwise is made native by broadcasting the single scale", "[dispatch][planner]") {
  const Plan p = plan(problem(Recipe::kTensorwise, Recipe::kRowwise), DeviceTarget::simulated(90, 130100));
  CHECK(p.backend == Backend::kConvertNative);
  REQUIRE(p.conversions.size() == 1);
  CHECK_THAT(p.conversions[0].what, Catch::Contains("scale_a: tensorwise -> rowwise"));
}

TEST_CASE("strict mode refuses every fallback and a forced backend must be able to run", "[dispatch][planner]") {
  const auto h200 = DeviceTarget::simulated(90, 130100);
  PlanOptions strict;
  strict.strict = true;
  CHECK(plan(problem(Recipe::kBlock1x128, Recipe::kBlock128x128), h200, strict).backend == Backend::kNative);
  try {
    plan(problem(Recipe::kMxfp8, Recipe::kMxfp8), h200, strict);
    FAIL("strict mode accepted an emulated plan");
  } catch (const Error& e) {
    CHECK(e.code() == StatusCode::kUnsupported);
    CHECK_THAT(std::string(e.what()), Catch::Contains("strict mode refuses emulated"));
  }
  PlanOptions forced;
  forced.force = Backend::kReference;
  CHECK(plan(problem(Recipe::kBlock1x128, Recipe::kBlock128x128), h200, forced).backend == Backend::kReference);
  forced.force = Backend::kEmulated;
  CHECK_THROWS_AS(plan(problem(Recipe::kBlock1x128, Recipe::kBlock128x128), h200, forced), Error);
}

TEST_CASE("every argument the GPU tests use passes validation as device memory", "[dispatch][validate]") {
  // validate() is host code: run it on every recipe pair, both scale formats and the GPU tests' shapes
  // with MemorySpace::kDevice (nothing is dereferenced), so a rule that would refuse a valid GPU call
  // shows up on a machine without a GPU.
  alignas(256) static uint8_t buffer[1 << 20];
  for (Recipe ra : kAllRecipes)
    for (Recipe rb : kAllRecipes)
      for (ScaleFormat f : {ScaleFormat::kCompact, ScaleFormat::kCublasLt})
        for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{128, 256, 512}, {264, 136, 640}, {7, 33, 160},
                               {1, 7168, 2048}, {129, 256, 640}}) {
          GemmArgs g;
          g.m = m, g.n = n, g.k = k;
          g.a = {buffer, ra == Recipe::kNvfp4 ? DType::kE2M1 : DType::kE4M3, ra, buffer + 4096, f, 1.0f};
          g.b = {buffer, rb == Recipe::kNvfp4 ? DType::kE2M1 : DType::kE4M3, rb, buffer + 8192, f, 1.0f};
          g.d = buffer;
          g.space = MemorySpace::kDevice;
          CAPTURE(to_string(ra), to_string(rb), to_string(f), m, n, k);
          const auto d = validate(g);
          CHECK(to_string(d) == "");
        }
}

TEST_CASE("every row of the capability table names its source", "[dispatch][planner]") {
  size_t count = 0;
  const auto* rows = base::native_pairs(&count);
  REQUIRE(count >= 10);
  for (size_t i = 0; i < count; ++i) {
    CAPTURE(i);
    CHECK(std::string(rows[i].source).size() > 20);
  }
}

TEST_CASE("bad GEMM arguments are named and the output is left untouched", "[dispatch][validate]") {
  uint8_t a[64 * 64] = {}, b[64 * 64] = {};
  float sa = 1.0f, sb = 1.0f;
  float d[64 * 64];
  for (auto& v : d) v = -7.0f;  // poison
  GemmArgs args;
  args.m = args.n = args.k = 64;
  args.a = {a, DType::kE4M3, Recipe::kTensorwise, &sa, ScaleFormat::kCompact, 1.0f};
  args.b = {b, DType::kE4M3, Recipe::kTensorwise, &sb, ScaleFormat::kCompact, 1.0f};
  args.d = d;
  args.d_dtype = DType::kF32;
  args.space = MemorySpace::kHost;
  Handle h;

  auto expect_rule = [&](GemmArgs bad, const std::string& rule) {
    CAPTURE(rule);
    const auto diags = validate(bad);
    bool found = false;
    for (const auto& dg : diags) found |= dg.rule == rule;
    CHECK(found);
    CHECK_THROWS_AS(h.gemm(bad), Error);
    for (float v : d) REQUIRE(v == -7.0f);
  };
  CHECK(validate(args).empty());
  {
    auto bad = args;
    bad.k = 0;
    expect_rule(bad, "positive-extent");
  }
  {
    auto bad = args;
    bad.a.dtype = DType::kE2M1;
    expect_rule(bad, "recipe-dtype");
  }
  {
    auto bad = args;
    bad.b.scale = nullptr;
    expect_rule(bad, "scale-null");
  }
  {
    auto bad = args;
    bad.d_dtype = DType::kE2M1;
    expect_rule(bad, "out-dtype");
  }
  {
    auto bad = args;
    bad.d_dtype = DType::kE4M3;  // FP8 output without its D scale
    expect_rule(bad, "fp8-out-d-scale");
  }
  {
    auto bad = args;
    const float ds = 2.0f;
    bad.d_scale = &ds;  // a D scale with bf16/f32 output
    expect_rule(bad, "d-scale-without-fp8-out");
  }
  {
    auto bad = args;
    bad.b.scale_format = ScaleFormat::kCublasLt;
    bad.b.scale = reinterpret_cast<const char*>(&sb) + 1;
    expect_rule(bad, "scale-alignment-16");
  }
  {
    auto bad = args;
    bad.alpha = std::numeric_limits<float>::quiet_NaN();
    expect_rule(bad, "finite-alpha");
  }
}

namespace {
// Whether this build holds scalemm's sm_90a kernel (the contiguous backend says "not built" otherwise).
bool contiguous_built() {
  PlanOptions forced;
  forced.force = Backend::kContiguous;
  try {
    plan(problem(Recipe::kBlock1x128, Recipe::kBlock128x128), DeviceTarget::simulated(90, 130100), forced);
    return true;
  } catch (const Error& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("contiguous: not built"));
    return false;
  }
}
}  // namespace

TEST_CASE("dense blockwise at M <= 256 where N fills the SMs and at the largest outputs runs scalemm's kernel, and says why not elsewhere",
          "[dispatch][planner][contiguous]") {
  const auto h200 = DeviceTarget::simulated(90, 130100);
  const auto blockwise = [](int64_t m, int64_t n, int64_t k) {
    return problem(Recipe::kBlock1x128, Recipe::kBlock128x128, m, n, k);
  };
  // Problems of another kind never mention it: their explanations are unchanged.
  for (auto [ra, rb] : {std::pair{Recipe::kTensorwise, Recipe::kTensorwise}, {Recipe::kBlock1x128, Recipe::kBlock1x128},
                        {Recipe::kMxfp8, Recipe::kMxfp8}}) {
    const Plan p = plan(problem(ra, rb, 16, 7168, 2048), h200);
    CAPTURE(p.explain());
    CHECK(p.backend != Backend::kContiguous);
    CHECK_THAT(p.explain(), !Catch::Contains("contiguous"));
  }
  CHECK_THAT(plan(blockwise(16, 7168, 2048), DeviceTarget::simulated(100, 130100)).explain(),
             !Catch::Contains("contiguous"));
  if (!contiguous_built()) {
    const Plan p = plan(blockwise(16, 7168, 2048), h200);
    CHECK(p.backend == Backend::kNative);
    CHECK_THAT(p.explain(), Catch::Contains("contiguous: not built"));
    WARN("SKIPPED: the sm_90a kernels are not built here (no CUTLASS headers or no sm_90 architecture)");
    return;
  }
  // Taken: M = 1 to 256 where the kernel's tiles cover at least 40% of the SMs, long K included; no
  // conversion, no workspace, no padding of M = 1.
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 7168, 2048}, {7, 7168, 2048}, {16, 7168, 2048},
                         {129, 10240, 8192}, {256, 7168, 2048}, {64, 6784, 1040}, {1, 4096, 7168}, {3, 10240, 8192},
                         {64, 4096, 7168}, {256, 4096, 7168}, {16, 4096, 7168}, {16, 10240, 8192}, {60, 7168, 4096}}) {
    const Plan p = plan(blockwise(m, n, k), h200);
    CAPTURE(m, n, k, p.explain());
    CHECK(p.backend == Backend::kContiguous);
    CHECK(p.conversions.empty());
    CHECK(p.workspace_bytes == 0);
    CHECK(p.padded_m == 0);
    CHECK(p.reasons.size() == 2);  // the problem, then how it runs
    CHECK_THAT(p.explain(), Catch::Contains("the call as one group") && Catch::Contains("no scale conversion launch") &&
                                Catch::Contains("compact scales read in place"));
    if (m <= 64)
      CHECK_THAT(p.explain(), Catch::Contains("the second warpgroup's rows lie past M: it skips its WGMMAs"));
    else
      CHECK_THAT(p.explain(), !Catch::Contains("skips its WGMMAs"));
  }
  // cuBLASLt-format scales too (row term plus K-block term, read in place): the kernel's shorter host
  // path than cuBLASLt's, and the same rule.
  for (auto [fa, fb, named] : {std::tuple{ScaleFormat::kCublasLt, ScaleFormat::kCublasLt, "cublaslt"},
                               {ScaleFormat::kCompact, ScaleFormat::kCublasLt, "A compact, B cublaslt"}})
    for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 7168, 2048}, {16, 4096, 7168}, {128, 10240, 8192}}) {
      GemmProblem q = blockwise(m, n, k);
      q.a_format = fa, q.b_format = fb;
      const Plan p = plan(q, h200);
      CAPTURE(m, n, k, p.explain());
      CHECK(p.backend == Backend::kContiguous);
      CHECK(p.conversions.empty());
      CHECK_THAT(p.explain(), Catch::Contains(std::string("; ") + named + " scales read in place"));
    }
  // Passed over by auto's measured rule, with the rule named; cuBLASLt runs them.
  const Plan big_m = plan(blockwise(260, 7168, 2048), h200);
  CHECK(big_m.backend == Backend::kNative);
  CHECK_THAT(big_m.explain(), Catch::Contains("contiguous: M = 260: auto takes scalemm's kernel at M <= 256"));
  // Above M = 256, taken from 4096 rows and 2048 columns (K >= 2048) where the output has 2^25 elements
  // (measured faster there); else passed over with that rule named.
  for (auto [m, n, k, taken] :
       {std::tuple<int64_t, int64_t, int64_t, bool>{8192, 8192, 8192, true}, {16384, 7168, 2048, true},
        {8192, 14336, 4096, true}, {8192, 4096, 14336, true}, {16384, 2048, 7168, true}, {4096, 8192, 2048, true},
        {4096, 4096, 4096, false}, {4096, 2048, 8192, false}, {2048, 2048, 7168, false}, {2048, 16384, 7168, false},
        {16384, 2048, 1024, false}, {32768, 1024, 7168, false}}) {
    const Plan p = plan(blockwise(m, n, k), h200);
    CAPTURE(m, n, k, p.explain());
    CHECK(p.backend == (taken ? Backend::kContiguous : Backend::kNative));
    if (taken) {
      CHECK(p.conversions.empty());
      CHECK_THAT(p.explain(), Catch::Contains("the call as one group"));
    } else {
      CHECK_THAT(p.explain(), Catch::Contains("and from 4096 x 2048 with K >= 2048 and M x N >= 2^25"));
    }
  }
  const Plan few_n = plan(blockwise(64, 2048, 2048), h200);  // 16 N tiles of 128 columns, 32 of 64
  CHECK(few_n.backend == Backend::kNative);
  CHECK_THAT(few_n.explain(), Catch::Contains("N = 2048 gives 32 tiles of 64 columns for 132 SMs"));
  CHECK_THAT(plan(blockwise(256, 4096, 7168), h200).explain(), Catch::Contains("128x64x128 tiles"));
  // The same N on a device of fewer SMs fills 40% of them.
  DeviceTarget small = h200;
  small.multiprocessors = 78;
  CHECK(plan(blockwise(64, 2048, 2048), small).backend == Backend::kContiguous);
  // A call of one M tile loads only A's rows; from 128 rows on, whole 128-row tiles.
  CHECK_THAT(plan(blockwise(16, 4096, 7168), h200).explain(), Catch::Contains("A loaded as its M = 16 rows"));
  CHECK_THAT(plan(blockwise(1, 7168, 2048), h200).explain(), Catch::Contains("A loaded as its M = 1 rows"));
  CHECK_THAT(plan(blockwise(129, 10240, 8192), h200).explain(), !Catch::Contains("A loaded as its"));
  // What the kernel cannot run goes elsewhere with the reason (N % 8 != 0: to the reference, as before).
  GemmProblem bias = blockwise(16, 7168, 2048);
  bias.has_bias = true;
  GemmProblem f32 = blockwise(16, 7168, 2048);
  f32.d_dtype = DType::kF32;
  GemmProblem fp8_out = blockwise(16, 7168, 2048);
  fp8_out.d_dtype = DType::kE4M3;
  GemmProblem n_odd = blockwise(16, 7172, 2048);  // rows of D off 16 bytes: no TMA
  for (auto [q, why] : {std::pair{bias, "no bias epilogue"},
                        {f32, "built for bf16 output"}, {fp8_out, "built for bf16 output"},
                        {n_odd, "N % 8 == 0"}}) {
    const Plan p = plan(q, h200);
    CAPTURE(p.explain());
    CHECK(p.backend == (q.n == 7172 ? Backend::kReference : Backend::kNative));
    CHECK_THAT(p.explain(), Catch::Contains("contiguous: ") && Catch::Contains(why));
  }
  // Strict mode keeps to cuBLASLt; a forced contiguous backend runs any shape the kernel can, and
  // refuses the rest with its reason.
  PlanOptions strict;
  strict.strict = true;
  const Plan s = plan(blockwise(16, 7168, 2048), h200, strict);
  CHECK(s.backend == Backend::kNative);
  CHECK_THAT(s.explain(), Catch::Contains("contiguous: strict mode takes only the native backend"));
  PlanOptions forced;
  forced.force = Backend::kContiguous;
  CHECK(plan(blockwise(4096, 256, 512), h200, forced).backend == Backend::kContiguous);
  try {
    plan(problem(Recipe::kTensorwise, Recipe::kTensorwise), h200, forced);
    FAIL("a forced contiguous backend took tensorwise");
  } catch (const Error& e) {
    CHECK(e.code() == StatusCode::kUnsupported);
    CHECK_THAT(std::string(e.what()), Catch::Contains("forced to contiguous") &&
                                          Catch::Contains("contiguous: runs block1x128(e4m3) x block128x128(e4m3)"));
  }
  CHECK(parse_backend("contiguous") == Backend::kContiguous);
  CHECK(to_string(Backend::kContiguous) == "contiguous");
}

TEST_CASE("a host plan names host memory as what stops cuBLASLt, not the recipes", "[dispatch][planner]") {
  const auto h200 = DeviceTarget::simulated(90, 130100);
  for (auto [a, b] : {std::pair{Recipe::kBlock1x128, Recipe::kBlock128x128}, {Recipe::kMxfp8, Recipe::kMxfp8},
                      {Recipe::kTensorwise, Recipe::kRowwise}}) {
    GemmProblem p = problem(a, b);
    p.space = MemorySpace::kHost;
    const std::string e = plan(p, h200).explain();
    INFO(e);
    CHECK_THAT(e, Catch::Contains("host pointers: cuBLASLt needs device memory"));
    CHECK_THAT(e, !Catch::Contains("no exact recipe conversion"));
    CHECK_THAT(e, !Catch::Contains("cannot be made native"));
  }
}
