// GroupedScaledLinear in host memory (the host reference backend): forward, dgrad and wgrad against a
// float64 computation per expert, for G = 1 and 4 with uneven and empty groups; exact inputs give
// exact results (bf16 outputs: the float64 value rounded once), random ones >= 25 dB. Argument and
// call-order checks, and wgrad's named refusal of group sizes off the token blocks.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "linear_inputs.hpp"
#include "scalemm/emulation/compare.hpp"
#include "scalemm/formats.hpp"
#include "scalemm/grouped_linear.hpp"
#include "support/test_support.hpp"

using namespace scalemm;

namespace {

GroupedLinearOptions host_options() {
  GroupedLinearOptions o;
  o.space = MemorySpace::kHost;
  return o;
}

// Expected outputs of the whole grouped layer in float64, expert by expert (tokens sorted by expert).
struct Expected {
  std::vector<double> y, dx, dw;
};
Expected expected(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& dy,
                  const std::vector<int64_t>& sizes, int64_t n, int64_t k) {
  const int64_t t = std::accumulate(sizes.begin(), sizes.end(), int64_t(0));
  Expected e;
  e.y.assign(size_t(t * n), 0.0);
  e.dx.assign(size_t(t * k), 0.0);
  e.dw.assign(size_t(int64_t(sizes.size()) * n * k), 0.0);
  int64_t row = 0;
  for (size_t g = 0; g < sizes.size(); ++g) {
    const int64_t mg = sizes[g];
    const std::vector<float> xg(x.begin() + row * k, x.begin() + (row + mg) * k);
    const std::vector<float> dyg(dy.begin() + row * n, dy.begin() + (row + mg) * n);
    const std::vector<float> wg(w.begin() + int64_t(g) * n * k, w.begin() + int64_t(g + 1) * n * k);
    if (mg > 0) {
      const auto y = scalemm::testing::product(xg, k, 1, wg, k, 1, mg, n, k);      // X_g W_g^T
      const auto dx = scalemm::testing::product(dyg, n, 1, wg, 1, k, mg, k, n);    // dY_g W_g
      const auto dw = scalemm::testing::product(dyg, 1, n, xg, 1, k, n, k, mg);    // dY_g^T X_g
      std::copy(y.begin(), y.end(), e.y.begin() + row * n);
      std::copy(dx.begin(), dx.end(), e.dx.begin() + row * k);
      std::copy(dw.begin(), dw.end(), e.dw.begin() + int64_t(g) * n * k);
    }
    row += mg;
  }
  return e;
}

std::vector<float> widen_bf16(const std::vector<uint16_t>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = formats::decode_bf16(v[i]);
  return f;
}

// Elements whose bits differ from the float64 value rounded once to bf16 (exact inputs: the fp32 sum
// is exact, so its bf16 rounding is the float64 value's).
int64_t bf16_mismatches(const std::vector<double>& ref, const std::vector<uint16_t>& got) {
  int64_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) bad += formats::encode_bf16(float(ref[i])) != got[i];
  return bad;
}
int64_t f32_mismatches(const std::vector<double>& ref, const std::vector<float>& got) {
  int64_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) bad += double(got[i]) != ref[i];
  return bad;
}

}  // namespace

TEST_CASE("GroupedScaledLinear on the host: forward, dgrad and wgrad per expert against float64",
          "[dispatch][grouped][linear][grouped-linear]") {
  auto rng = scalemm::testing::rng(0x6A11);
  const int64_t n = 128, k = 256;
  Handle h;
  for (LinearRecipe lr : {LinearRecipe::kBlockwiseFp8, LinearRecipe::kMxfp8}) {
    const int64_t b = lr == LinearRecipe::kBlockwiseFp8 ? 128 : 32;
    // G = 1, and G = 4 with uneven sizes and an empty expert (all on the token blocks: wgrad runs).
    const std::vector<std::vector<int64_t>> cases = {{2 * b}, {b, 0, 3 * b, 2 * b}, {0, 2 * b, b, 0}};
    for (const auto& sizes : cases)
      for (bool exact : {true, false}) {
        const int64_t g = int64_t(sizes.size());
        const int64_t t = std::accumulate(sizes.begin(), sizes.end(), int64_t(0));
        CAPTURE(to_string(lr), g, exact, t);
        const auto x = scalemm::testing::make_input(t, k, exact, rng);
        const auto w = scalemm::testing::make_input(g * n, k, exact, rng);
        const auto dy = scalemm::testing::make_input(t, n, exact, rng);
        GroupedScaledLinear layer(h, lr, g, n, k, host_options());
        layer.set_weight(w.data(), nullptr);
        std::vector<uint16_t> y(size_t(t * n), 0xFFFF), dx(size_t(t * k), 0xFFFF);
        std::vector<float> dw(size_t(g * n * k), NAN);
        layer.forward(x.data(), sizes.data(), y.data(), nullptr);
        layer.backward(dy.data(), dx.data(), dw.data(), nullptr);
        CHECK(layer.tokens() == t);
        CHECK(layer.group_sizes() == sizes);
        const Expected e = expected(x, w, dy, sizes, n, k);
        if (exact) {
          CHECK(bf16_mismatches(e.y, y) == 0);
          CHECK(bf16_mismatches(e.dx, dx) == 0);
          CHECK(f32_mismatches(e.dw, dw) == 0);  // empty experts included: dW_g = 0
        } else {
          const double sq[3] = {emulation::sqnr_db(e.y.data(), widen_bf16(y).data(), t * n),
                                emulation::sqnr_db(e.dx.data(), widen_bf16(dx).data(), t * k),
                                emulation::sqnr_db(e.dw.data(), dw.data(), g * n * k)};
          std::printf("grouped host %-13s G=%lld T=%4lld: forward %.1f dB, dgrad %.1f dB, wgrad %.1f dB\n",
                      std::string(to_string(lr)).c_str(), (long long)g, (long long)t, sq[0], sq[1], sq[2]);
          CAPTURE(sq[0], sq[1], sq[2]);
          for (double v : sq) CHECK(v >= 25.0);
          // An empty expert's dW is exactly zero.
          for (int64_t gi = 0; gi < g; ++gi)
            if (sizes[size_t(gi)] == 0)
              for (int64_t i = 0; i < n * k; ++i) REQUIRE(dw[size_t(gi * n * k + i)] == 0.0f);
        }
        // The GEMMs as they ran: m-grouped forward and dgrad, k-grouped wgrad over the tokens.
        const GroupedGemmArgs fa = layer.gemm_args(LinearGemm::kForward), da = layer.gemm_args(LinearGemm::kDgrad),
                              wa = layer.gemm_args(LinearGemm::kWgrad);
        CHECK((fa.group_dim == GroupDim::kM && fa.m == t && fa.n == n && fa.k == k));
        CHECK((da.group_dim == GroupDim::kM && da.m == t && da.n == k && da.k == n));
        CHECK((wa.group_dim == GroupDim::kK && wa.m == n && wa.n == k && wa.k == t));
        CHECK(fa.b.recipe == layer.weight_recipe());
        CHECK(wa.b.recipe == layer.activation_recipe());
      }
  }
}

TEST_CASE("GroupedScaledLinear: forward and dgrad take any group sizes, wgrad names the group to pad",
          "[dispatch][grouped][linear][grouped-linear]") {
  auto rng = scalemm::testing::rng(0x6A12);
  const int64_t n = 128, k = 256;
  const std::vector<int64_t> sizes = {3, 0, 5, 130};
  const int64_t g = 4, t = 138;
  Handle h;
  const auto x = scalemm::testing::make_input(t, k, true, rng);
  const auto w = scalemm::testing::make_input(g * n, k, true, rng);
  const auto dy = scalemm::testing::make_input(t, n, true, rng);
  GroupedScaledLinear layer(h, LinearRecipe::kBlockwiseFp8, g, n, k, host_options());
  layer.set_weight(w.data(), nullptr);
  std::vector<uint16_t> y(size_t(t * n)), dx(size_t(t * k));
  std::vector<float> dw(size_t(g * n * k), 7.0f);
  layer.forward(x.data(), sizes.data(), y.data(), nullptr);
  const Expected e = expected(x, w, dy, sizes, n, k);
  CHECK(bf16_mismatches(e.y, y) == 0);
  try {
    layer.backward(dy.data(), dx.data(), dw.data(), nullptr);
    FAIL("wgrad ran with group sizes off the 128-token blocks");
  } catch (const Error& err) {
    const std::string msg = err.what();
    CHECK(err.code() == StatusCode::kInvalidArgument);
    CHECK(msg.find("group_sizes[0]: ") != std::string::npos);
    CHECK(msg.find("expected a multiple of 128, got 3") != std::string::npos);
    CHECK(msg.find("Pad each expert's tokens with zero rows to 128") != std::string::npos);
    CHECK(msg.find("[group-k-block]") != std::string::npos);
  }
  for (float v : dw) REQUIRE(v == 7.0f);  // nothing written
  layer.backward(dy.data(), dx.data(), nullptr, nullptr);  // dgrad alone runs
  CHECK(bf16_mismatches(e.dx, dx) == 0);
}

TEST_CASE("GroupedScaledLinear checks its arguments and call order; buffers are allocated once",
          "[dispatch][grouped][linear][grouped-linear]") {
  Handle h;
  CHECK_THROWS_AS(GroupedScaledLinear(h, LinearRecipe::kMxfp8, 0, 128, 256), Error);
  CHECK_THROWS_AS(GroupedScaledLinear(h, LinearRecipe::kMxfp8, 4, 0, 256), Error);
  GroupedLinearOptions bad = host_options();
  bad.data_dtype = DType::kBF16;
  CHECK_THROWS_AS(GroupedScaledLinear(h, LinearRecipe::kMxfp8, 4, 128, 256, bad), Error);
  GroupedScaledLinear layer(h, LinearRecipe::kBlockwiseFp8, 4, 128, 256, host_options());
  CHECK(layer.activation_recipe() == Recipe::kBlock1x128);
  CHECK(layer.weight_recipe() == Recipe::kBlock128x128);
  CHECK(layer.token_block() == 128);
  CHECK(layer.experts() == 4);
  CHECK(layer.tokens() == 0);
  std::vector<float> x(256 * 256, 1.0f), w(4 * 128 * 256, 1.0f);
  std::vector<uint16_t> y(256 * 128);
  const std::vector<int64_t> sizes = {128, 0, 128, 0};
  CHECK_THROWS_AS(layer.forward(x.data(), sizes.data(), y.data(), nullptr), Error);  // no weight yet
  CHECK_THROWS_AS(layer.backward(x.data(), y.data(), x.data(), nullptr), Error);     // no forward yet
  CHECK_THROWS_AS(layer.gemm_args(LinearGemm::kWgrad), Error);
  CHECK_THROWS_AS(layer.set_weight(nullptr, nullptr), Error);
  layer.set_weight(w.data(), nullptr);
  const std::vector<int64_t> negative = {128, -1, 129, 0};
  try {
    layer.forward(x.data(), negative.data(), y.data(), nullptr);
    FAIL("a negative group size was taken");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("group_sizes[1]: expected a token count in [0, 2^40], got -1") !=
          std::string::npos);
  }
  const std::vector<int64_t> none = {0, 0, 0, 0};
  CHECK_THROWS_AS(layer.forward(x.data(), none.data(), y.data(), nullptr), Error);
  CHECK_THROWS_AS(layer.forward(x.data(), nullptr, y.data(), nullptr), Error);
  // Footprint: at least the FP8 data of W, W^T (G experts), X, X^T, dY, dY^T; grows with the tokens.
  const size_t b128 = layer.workspace_bytes(128), b512 = layer.workspace_bytes(512);
  CHECK(b128 >= size_t(2 * 4 * 128 * 256 + 2 * 128 * 256 + 2 * 128 * 128));
  CHECK(b512 > b128);
  // reserve() for the largest count; smaller calls reuse the buffers (the pointers stay).
  layer.reserve(256);
  layer.forward(x.data(), sizes.data(), y.data(), nullptr);
  const GroupedGemmArgs first = layer.gemm_args(LinearGemm::kForward);
  const std::vector<int64_t> fewer = {0, 128, 0, 0};
  layer.forward(x.data(), fewer.data(), y.data(), nullptr);
  const GroupedGemmArgs second = layer.gemm_args(LinearGemm::kForward);
  CHECK(first.a.data == second.a.data);
  CHECK(first.a.scale == second.a.scale);
  CHECK(first.b.data == second.b.data);
}
