// GEMMs through the Handle with host pointers (the host reference backend), against an independent
// fp64 evaluation of D = alpha * dequant(A) * dequant(B)^T + bias on exact-by-construction inputs.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "test_operands.hpp"
#include "scalemm/formats.hpp"
#include "support/test_support.hpp"

using namespace scalemm;
using scalemm::testing::HostOperand;

using scalemm::testing::dequant_rows;
using scalemm::testing::exact_dot;

TEST_CASE("host GEMMs through the handle equal the exact product for every recipe pair", "[dispatch][host]") {
  auto rng = scalemm::testing::rng(0xD15A);
  Handle h;
  for (Recipe ra : kAllRecipes)
    for (Recipe rb : kAllRecipes) {
      if ((ra == Recipe::kNvfp4) != (rb == Recipe::kNvfp4)) continue;
      const int64_t m = 7, n = 33, k = 160;
      CAPTURE(to_string(ra), to_string(rb));
      auto a = scalemm::testing::exact_operand(ra, m, k, ScaleFormat::kCompact, rng);
      auto b = scalemm::testing::exact_operand(rb, n, k, ScaleFormat::kCublasLt, rng);
      std::vector<uint16_t> bias(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) bias[size_t(j)] = formats::encode_bf16(float(j % 5) - 2.0f);
      std::vector<float> d(static_cast<size_t>(m * n), std::nanf(""));
      GemmArgs args;
      args.m = m, args.n = n, args.k = k;
      args.a = a.view();
      args.b = b.view();
      args.d = d.data();
      args.d_dtype = DType::kF32;
      args.bias = bias.data();
      args.alpha = 0.5f;
      args.space = MemorySpace::kHost;
      h.gemm(args);
      int64_t mismatches = 0;
      const std::vector<double> av = dequant_rows(a), bv = dequant_rows(b);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          const double acc = exact_dot(av, bv, k, i, j, 0, k);
          const double want = 0.5 * acc + formats::decode_bf16(bias[size_t(j)]);
          mismatches += d[size_t(i * n + j)] != float(want);
        }
      CHECK(mismatches == 0);
    }
}

TEST_CASE("the handle plans host pointers onto the host reference and explains it", "[dispatch][host]") {
  auto rng = scalemm::testing::rng(7);
  auto a = scalemm::testing::exact_operand(Recipe::kMxfp8, 4, 64, ScaleFormat::kCompact, rng);
  auto b = scalemm::testing::exact_operand(Recipe::kMxfp8, 4, 64, ScaleFormat::kCompact, rng);
  std::vector<float> d(16);
  GemmArgs args;
  args.m = args.n = 4, args.k = 64;
  args.a = a.view(), args.b = b.view(), args.d = d.data(), args.d_dtype = DType::kF32;
  args.space = MemorySpace::kHost;
  Handle h;
  const Plan p = h.plan(args);
  CHECK(p.backend == Backend::kReference);
  CHECK_THAT(p.explain(), Catch::Contains("host"));
}

TEST_CASE("fast accumulation: refused for block recipes, planned as cuBLASLt's FAST_ACCUM, exact elsewhere",
          "[dispatch][host]") {
  auto rng = scalemm::testing::rng(0xFA57);
  auto call = [&](Recipe r, HostOperand& a, HostOperand& b, std::vector<float>& d) {
    a = scalemm::testing::exact_operand(r, 8, 256, ScaleFormat::kCompact, rng);
    b = scalemm::testing::exact_operand(r, 16, 256, ScaleFormat::kCompact, rng);
    d.assign(8 * 16, std::nanf(""));
    GemmArgs args;
    args.m = 8, args.n = 16, args.k = 256;
    args.a = a.view(), args.b = b.view(), args.d = d.data(), args.d_dtype = DType::kF32;
    args.space = MemorySpace::kHost;
    args.fast_accum = true;
    return args;
  };
  HostOperand a, b;
  std::vector<float> d;
  // Block recipes promote per K block: the switch is refused by name, before anything runs.
  const GemmArgs block = call(Recipe::kBlock1x128, a, b, d);
  const Diagnostics diags = validate(block);
  REQUIRE(diags.size() == 1);
  CHECK(diags[0].argument == "fast_accum");
  CHECK(diags[0].rule == "fast-accum-recipe");
  Handle h;
  CHECK_THROWS_AS(h.gemm(block), Error);
  CHECK(std::isnan(d[0]));  // nothing written
  for (Recipe r : {Recipe::kTensorwise, Recipe::kRowwise}) {
    CAPTURE(to_string(r));
    const GemmArgs args = call(r, a, b, d);
    CHECK(validate(args).empty());
    // On sm_90 the native plan says it runs cuBLASLt with fast accumulation; the problem text marks it
    // (so the plan cache keeps it apart from the exact call).
    GemmProblem p = GemmProblem::from(args);
    p.space = MemorySpace::kDevice;
    const Plan native = plan(p, DeviceTarget::simulated(90, 130100));
    CHECK(native.backend == Backend::kNative);
    CHECK_THAT(native.explain(), Catch::Contains("+fast-accum") && Catch::Contains("with fast accumulation"));
    GemmProblem exact = p;
    exact.fast_accum = false;
    CHECK_FALSE(exact == p);
    CHECK_THAT(plan(exact, DeviceTarget::simulated(90, 130100)).explain(),
               !Catch::Contains("fast accumulation") && !Catch::Contains("+fast-accum"));
    // The host reference accumulates exactly, says so, and gives the exact product.
    CHECK_THAT(h.plan(args).explain(), Catch::Contains("accumulates exactly"));
    h.gemm(args);
    int64_t mismatches = 0;
    const std::vector<double> av = dequant_rows(a), bv = dequant_rows(b);
    for (int64_t i = 0; i < 8; ++i)
      for (int64_t j = 0; j < 16; ++j) mismatches += d[size_t(i * 16 + j)] != float(exact_dot(av, bv, 256, i, j, 0, 256));
    CHECK(mismatches == 0);
  }
}
