// Host-side facts the training linear layer (scalemm/linear.hpp) relies on: the quantizer's columnwise
// output of a square-block weight is the exact transpose of its rowwise output; a 1x128/1x32
// activation's is not (it is requantized along the other axis, hence X^T is kept from forward); the
// unpadded 128x128 scale grid (torchao's K-block stride L instead of roundup(L, 4)) is named by
// validation and visibly wrong when read anyway; the operand table of linear.hpp, emulated on the
// host, is exact on exact inputs and >= 25 dB on random ones; the plans of the three GEMMs on sm_90.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "linear_inputs.hpp"
#include "test_operands.hpp"
#include "scalemm/emulation/compare.hpp"
#include "scalemm/emulation/emulation.hpp"
#include "scalemm/layouts/convert.hpp"
#include "scalemm/layouts/validate.hpp"
#include "scalemm/linear.hpp"
#include "support/test_support.hpp"

using namespace scalemm;

namespace {

struct BothWays {
  emulation::QuantizeConfig cfg;
  int64_t rows = 0, cols = 0;
  std::vector<float> src;
  std::vector<uint8_t> data, scales, data_t, scales_t;

  emulation::SourceMatrix source() const { return {src.data(), DType::kF32, rows, cols}; }
  emulation::QuantizeOutputs outputs() {
    emulation::QuantizeOutputs o;
    o.data = data.data();
    o.scales = scales.data();
    o.data_t = data_t.data();
    o.scales_t = scales_t.data();
    return o;
  }
};

// Random normal data with a per-row magnitude spread (so that blocks get different scales),
// quantized once with rowwise and columnwise outputs.
BothWays quantize_both(Recipe r, ScaleFormat f, int64_t rows, int64_t cols, std::mt19937_64& rng) {
  BothWays q;
  q.cfg.recipe = r;
  q.cfg.format = f;
  q.cfg.rowwise = q.cfg.columnwise = true;
  q.rows = rows;
  q.cols = cols;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-6, 6);
  q.src.resize(size_t(rows * cols));
  for (int64_t i = 0; i < rows; ++i) {
    const float row_scale = std::ldexp(1.0f, ex(rng));
    for (int64_t j = 0; j < cols; ++j) q.src[size_t(i * cols + j)] = nd(rng) * row_scale;
  }
  q.data.assign(size_t(emulation::data_bytes(q.cfg, rows, cols)), 0);
  q.data_t.assign(size_t(emulation::data_bytes(q.cfg, cols, rows)), 0);
  q.scales.assign(size_t(emulation::rowwise_layout(q.cfg, rows, cols).bytes()), 0xAB);
  q.scales_t.assign(size_t(emulation::columnwise_layout(q.cfg, rows, cols).bytes()), 0xAB);
  emulation::quantize_host(q.source(), q.cfg, q.outputs());
  return q;
}

std::vector<float> dequant(const emulation::QuantizedTensor& t) {
  std::vector<float> out(size_t(t.rows() * t.k()));
  emulation::dequantize_host(t, out.data(), DType::kF32);
  return out;
}

}  // namespace

TEST_CASE("the columnwise output of a square-block weight quantization is its exact transpose",
          "[dispatch][linear]") {
  auto rng = scalemm::testing::rng(0x11AE);
  struct Shape {
    int64_t rows, cols;
  };
  for (Recipe r : {Recipe::kBlock128x128, Recipe::kMxfp8_32x32})
    for (ScaleFormat f : {ScaleFormat::kCompact, ScaleFormat::kCublasLt})
      for (Shape s : {Shape{256, 512}, Shape{256, 640}, Shape{200, 352}}) {
        CAPTURE(to_string(r), to_string(f), s.rows, s.cols);
        auto q = quantize_both(r, f, s.rows, s.cols, rng);
        // Data: the same bytes at transposed positions.
        int64_t data_mismatches = 0;
        for (int64_t i = 0; i < s.rows; ++i)
          for (int64_t j = 0; j < s.cols; ++j)
            data_mismatches += q.data_t[size_t(j * s.rows + i)] != q.data[size_t(i * s.cols + j)];
        CHECK(data_mismatches == 0);
        // Scales: exactly what layouts::transpose makes of the rowwise scales (padding included).
        const auto lr = emulation::rowwise_layout(q.cfg, s.rows, s.cols);
        const auto lc = emulation::columnwise_layout(q.cfg, s.rows, s.cols);
        REQUIRE(lc == layouts::transposed(lr, f));
        std::vector<uint8_t> transposed(size_t(lc.bytes()), 0xCD);
        layouts::transpose(lr, q.scales.data(), lc, transposed.data());
        CHECK(emulation::bitwise_equal(transposed.data(), q.scales_t.data(), transposed.size()));
        // Hence dequant(W^T) == dequant(W)^T bit for bit.
        const auto w = dequant(emulation::rowwise_operand(q.source(), q.cfg, q.outputs()));
        const auto wt = dequant(emulation::columnwise_operand(q.source(), q.cfg, q.outputs()));
        int64_t value_mismatches = 0;
        for (int64_t i = 0; i < s.rows; ++i)
          for (int64_t j = 0; j < s.cols; ++j) {
            const float a = w[size_t(i * s.cols + j)], b = wt[size_t(j * s.rows + i)];
            value_mismatches += std::memcmp(&a, &b, 4) != 0;
          }
        CHECK(value_mismatches == 0);
      }
}

TEST_CASE("a 1x128 or 1x32 activation's columnwise output is requantized, not a transpose",
          "[dispatch][linear]") {
  // Why the layer keeps the columnwise X^T from forward instead of transposing X for wgrad: its blocks
  // run along the tokens, so its scales (and hence some values) differ from X's.
  auto rng = scalemm::testing::rng(0x11AF);
  for (Recipe r : {Recipe::kBlock1x128, Recipe::kMxfp8}) {
    auto q = quantize_both(r, ScaleFormat::kCompact, 256, 512, rng);
    const auto x = dequant(emulation::rowwise_operand(q.source(), q.cfg, q.outputs()));
    const auto xt = dequant(emulation::columnwise_operand(q.source(), q.cfg, q.outputs()));
    int64_t differ = 0;
    for (int64_t i = 0; i < 256; ++i)
      for (int64_t j = 0; j < 512; ++j) differ += x[size_t(i * 512 + j)] != xt[size_t(j * 256 + i)];
    CAPTURE(to_string(r), differ);
    CHECK(differ > 0);
  }
}

TEST_CASE("an unpadded 128x128 weight scale grid (K-block stride L, not roundup(L,4)) is named and visibly wrong",
          "[dispatch][linear]") {
  // The torchao bug (pytorch/ao#4229, pytorch/pytorch#166752): K = 640 gives L = 5 K-blocks; cuBLASLt's
  // BLK128x128 buffer has K-block stride L4 = 8. Passing the quantizer's (N/128, L) row-major grid as
  // the cuBLASLt buffer makes every 128-row block after the first read the wrong scales.
  auto rng = scalemm::testing::rng(0x70A0);
  const int64_t n = 256, k = 640, m = 128;
  const auto w = scalemm::testing::random_operand(Recipe::kBlock128x128, n, k, ScaleFormat::kCompact, rng);
  const auto x = scalemm::testing::random_operand(Recipe::kBlock1x128, m, k, ScaleFormat::kCompact, rng);
  const layouts::ScaleLayout blk(Recipe::kBlock128x128, n, k, ScaleFormat::kCublasLt);
  REQUIRE(blk.kblocks() == 5);
  REQUIRE(blk.padded_kblocks() == 8);

  auto rules_of = [](const Diagnostics& d) {
    std::string s;
    for (const auto& x : d) s += x.rule + " ";
    return s;
  };
  // 1. Validation names it, whether the grid comes as a (2, 5) tensor or as a flat buffer of 10.
  std::vector<float> grid(size_t(blk.grid_rows() * blk.kblocks()));
  std::memcpy(grid.data(), w.scales.data(), grid.size() * 4);  // the compact (N/128, L) grid
  const auto d2 = layouts::validate_scale(TensorRef::contiguous(grid.data(), DType::kF32, {2, 5}), blk, "scale_b");
  const auto d1 = layouts::validate_scale(TensorRef::contiguous(grid.data(), DType::kF32, {10}), blk, "scale_b");
  std::printf("unpadded 128x128 scales as cuBLASLt BLK128x128, (2,5): %s\n", to_string(d2).c_str());
  CHECK(rules_of(d2).find(layouts::rules::kBlk128KBlockStride) != std::string::npos);
  CHECK(rules_of(d1).find(layouts::rules::kBlk128KBlockStride) != std::string::npos);
  // With K = 512 (L = 4 = L4) the same view is correct: the bug only shows when L % 4 != 0.
  const layouts::ScaleLayout blk512(Recipe::kBlock128x128, n, 512, ScaleFormat::kCublasLt);
  CHECK(layouts::validate_scale(TensorRef::contiguous(grid.data(), DType::kF32, {2, 4}), blk512, "scale_b").empty());

  // 2. A raw pointer carries no strides: in a full-size buffer the content check catches it (row
  //    block 1's scales sit in row block 0's padding; its real slots read zero).
  std::vector<float> unpadded(size_t(blk.size()), 0.0f);
  std::memcpy(unpadded.data(), grid.data(), grid.size() * 4);
  const auto content = layouts::content_diagnostics(blk, layouts::check_content(blk, unpadded.data()), "scale_b");
  std::printf("content of the unpadded buffer: %s\n", to_string(content).c_str());
  CHECK(rules_of(content).find(layouts::rules::kPaddingNonzero) != std::string::npos);
  CHECK(rules_of(content).find(layouts::rules::kF32NonPositive) != std::string::npos);

  // 3. Read anyway, the product is visibly wrong; the padded buffer gives the right one.
  std::vector<float> padded(size_t(blk.size()));
  layouts::to_cublaslt(w.layout(), w.scales.data(), padded.data());
  auto b_ok = w.quantized();
  b_ok.scales = padded.data();
  b_ok.layout = blk;
  auto b_bad = b_ok;
  b_bad.scales = unpadded.data();
  std::vector<float> ref(size_t(m * n)), ok(size_t(m * n)), bad(size_t(m * n));
  emulation::gemm_host(x.quantized(), w.quantized(), ref.data());
  emulation::gemm_host(x.quantized(), b_ok, ok.data());
  emulation::gemm_host(x.quantized(), b_bad, bad.data());
  CHECK(emulation::compare(ref.data(), ok.data(), m * n).bitwise_equal());
  const auto wrong = emulation::compare(ref.data(), bad.data(), m * n);
  std::printf("GEMM with the unpadded buffer read as BLK128x128: %s\n", wrong.to_string().c_str());
  CHECK(wrong.sqnr_db < 10.0);
}

TEST_CASE("the operand table of linear.hpp, emulated on the host: exact on exact inputs, >= 25 dB on random",
          "[dispatch][linear]") {
  // The same quantizations and operand pairs as ScaledLinear (cuBLASLt-format scales, one quantize
  // call with both outputs per tensor), through the host reference: what the GPU cases compare with.
  auto rng = scalemm::testing::rng(0x11B0);
  struct Q {
    emulation::QuantizeConfig cfg;
    std::vector<uint8_t> d, s, dt, st;
    emulation::QuantizedTensor row, col;
  };
  auto quant = [](const std::vector<float>& x, int64_t rows, int64_t cols, Recipe r, bool pow2) {
    Q q;
    q.cfg.recipe = r;
    q.cfg.format = ScaleFormat::kCublasLt;
    q.cfg.rowwise = q.cfg.columnwise = true;
    if (r == Recipe::kBlock1x128 || r == Recipe::kBlock128x128)
      q.cfg.mode = pow2 ? emulation::ScaleMode::kAmaxPow2 : emulation::ScaleMode::kAmax;
    q.d.resize(size_t(rows * cols));
    q.dt.resize(size_t(rows * cols));
    q.s.resize(size_t(emulation::rowwise_layout(q.cfg, rows, cols).bytes()));
    q.st.resize(size_t(emulation::columnwise_layout(q.cfg, rows, cols).bytes()));
    const emulation::SourceMatrix src{x.data(), DType::kF32, rows, cols};
    emulation::QuantizeOutputs o;
    o.data = q.d.data();
    o.scales = q.s.data();
    o.data_t = q.dt.data();
    o.scales_t = q.st.data();
    emulation::quantize_host(src, q.cfg, o);
    q.row = emulation::rowwise_operand(src, q.cfg, o);
    q.col = emulation::columnwise_operand(src, q.cfg, o);
    return q;
  };
  const int64_t n = 256, k = 640;
  for (LinearRecipe lr : {LinearRecipe::kBlockwiseFp8, LinearRecipe::kMxfp8})
    for (bool exact : {false, true})
      for (int64_t m : {128, 264}) {
        const Recipe act = lr == LinearRecipe::kBlockwiseFp8 ? Recipe::kBlock1x128 : Recipe::kMxfp8;
        const Recipe wt = lr == LinearRecipe::kBlockwiseFp8 ? Recipe::kBlock128x128 : Recipe::kMxfp8_32x32;
        const auto x = scalemm::testing::make_input(m, k, exact, rng);
        const auto w = scalemm::testing::make_input(n, k, exact, rng);
        const auto dy = scalemm::testing::make_input(m, n, exact, rng);
        const Q qx = quant(x, m, k, act, exact), qw = quant(w, n, k, wt, exact), qdy = quant(dy, m, n, act, exact);
        std::vector<float> y(size_t(m * n)), dx(size_t(m * k)), dw(size_t(n * k));
        emulation::gemm_host(qx.row, qw.row, y.data());    // Y = X W^T
        emulation::gemm_host(qdy.row, qw.col, dx.data());  // dX = dY (W^T)^T
        emulation::gemm_host(qdy.col, qx.col, dw.data());  // dW = dY^T (X^T)^T
        const auto ey = scalemm::testing::product(x, k, 1, w, k, 1, m, n, k);
        const auto edx = scalemm::testing::product(dy, n, 1, w, 1, k, m, k, n);
        const auto edw = scalemm::testing::product(dy, 1, n, x, 1, k, n, k, m);
        const double sq[3] = {emulation::sqnr_db(ey.data(), y.data(), m * n),
                              emulation::sqnr_db(edx.data(), dx.data(), m * k),
                              emulation::sqnr_db(edw.data(), dw.data(), n * k)};
        std::printf("host-emulated %-13s %-6s M=%3lld N=%lld K=%lld: forward %.1f dB, dgrad %.1f dB, wgrad %.1f dB\n",
                    std::string(to_string(lr)).c_str(), exact ? "exact" : "random", (long long)m, (long long)n,
                    (long long)k, sq[0], sq[1], sq[2]);
        CAPTURE(to_string(lr), exact, m, sq[0], sq[1], sq[2]);
        for (double v : sq) CHECK((exact ? std::isinf(v) : v >= 25.0));  // exact: +inf dB, i.e. identical
      }
}

TEST_CASE("plans of the three linear-layer GEMMs on a simulated H200", "[dispatch][linear]") {
  const auto target = DeviceTarget::simulated(90, 130100);
  const int64_t n = 256, k = 640;
  for (LinearRecipe lr : {LinearRecipe::kBlockwiseFp8, LinearRecipe::kMxfp8}) {
    const Recipe act = lr == LinearRecipe::kBlockwiseFp8 ? Recipe::kBlock1x128 : Recipe::kMxfp8;
    const Recipe wt = lr == LinearRecipe::kBlockwiseFp8 ? Recipe::kBlock128x128 : Recipe::kMxfp8_32x32;
    for (int64_t m : {128, 256, 264}) {
      struct G {
        const char* name;
        int64_t m, n, k;
        Recipe a, b;
        DType d;
      };
      const G gemms[] = {{"forward", m, n, k, act, wt, DType::kBF16},
                         {"dgrad", m, k, n, act, wt, DType::kBF16},
                         {"wgrad", n, k, m, act, act, DType::kF32}};
      for (const G& g : gemms) {
        GemmProblem p;
        p.m = g.m, p.n = g.n, p.k = g.k;
        p.a_recipe = g.a, p.b_recipe = g.b;
        p.a_format = p.b_format = ScaleFormat::kCublasLt;
        p.d_dtype = g.d;
        const Plan plan = scalemm::plan(p, target);
        std::printf("%-13s M=%3lld %-7s %-44s -> %s\n", std::string(to_string(lr)).c_str(), (long long)m, g.name,
                    p.to_string().c_str(), std::string(to_string(plan.backend)).c_str());
        CAPTURE(to_string(lr), m, g.name, plan.explain());
        if (lr == LinearRecipe::kMxfp8) {
          // No MXFP8 kernel on sm_90: exact emulation (BF16 operands, so the token count 264 of
          // wgrad, not a multiple of 16, still runs there).
          CHECK(plan.backend == Backend::kEmulated);
        } else {
          // Blockwise FP8 is native on sm_90 except where the reduction length (tokens, for wgrad)
          // breaks cuBLASLt's K % 16.
          CHECK(plan.backend == (g.k % 16 == 0 ? Backend::kNative : Backend::kReference));
        }
      }
    }
  }
}

TEST_CASE("ScaledLinear checks its arguments and call order without touching the GPU", "[dispatch][linear]") {
  Handle h;
  CHECK_THROWS_AS(ScaledLinear(h, LinearRecipe::kMxfp8, 0, 512), Error);
  LinearOptions bad;
  bad.data_dtype = DType::kBF16;
  CHECK_THROWS_AS(ScaledLinear(h, LinearRecipe::kMxfp8, 256, 512, bad), Error);
  ScaledLinear layer(h, LinearRecipe::kBlockwiseFp8, 256, 640);
  CHECK(layer.activation_recipe() == Recipe::kBlock1x128);
  CHECK(layer.weight_recipe() == Recipe::kBlock128x128);
  CHECK(layer.tokens() == 0);
  std::vector<uint16_t> y(16);
  std::vector<float> x(16);
  CHECK_THROWS_AS(layer.forward(x.data(), 128, y.data(), nullptr), Error);           // no weight yet
  CHECK_THROWS_AS(layer.backward(x.data(), y.data(), x.data(), nullptr), Error);     // no forward yet
  CHECK_THROWS_AS(layer.gemm_args(LinearGemm::kWgrad), Error);
  CHECK_THROWS_AS(layer.set_weight(nullptr, nullptr), Error);
  // Footprint: at least the FP8 data of W, W^T, X, X^T, dY, dY^T; grows with M.
  const size_t b128 = layer.workspace_bytes(128), b264 = layer.workspace_bytes(264);
  CHECK(b128 >= size_t(2 * 256 * 640 + 2 * 128 * 640 + 2 * 128 * 256));
  CHECK(b264 > b128);
  ScaledLinear mx(h, LinearRecipe::kMxfp8, 256, 640);
  CHECK(mx.weight_recipe() == Recipe::kMxfp8_32x32);
  CHECK(to_string(LinearRecipe::kMxfp8) == "mxfp8");
  CHECK(to_string(LinearGemm::kDgrad) == "dgrad");
}
