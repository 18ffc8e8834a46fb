// scalemm::quantize on host memory: the library's public quantizer, called with host pointers (as the
// C++ linear layers call it for a host layer), gives the reference emulator's bytes.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "emu_test_util.hpp"
#include "scalemm/quantize.hpp"
#include "scalemm/status.hpp"

using namespace emu_test;

TEST_CASE("scalemm::quantize on host memory gives the emulator's bytes for every recipe, mode, format and direction",
          "[emulation][quantize]") {
  // Partial blocks and tiles in both directions; NVFP4 needs even C (rowwise) and even R (columnwise),
  // so 8 rows, not 7, where its columnwise output is asked for.
  struct Shape {
    int64_t r, c;
  };
  const Shape shapes[] = {{8, 40}, {130, 258}, {7, 136}, {1, 6}};
  for (const auto& sh : shapes) {
    const int64_t R = sh.r, C = sh.c;
    auto g = scalemm::testing::rng(907 + uint64_t(R * 1000 + C));
    auto x = random_normal(g, R * C, 3.0f);
    for (int64_t i = 0; i < R * C; ++i)
      if ((i / 16) % 5 == 2) x[size_t(i)] = std::ldexp(x[size_t(i)], -30);  // small blocks beside large ones
    if (R * C > 20) x[20] = std::numeric_limits<float>::quiet_NaN();
    std::vector<uint16_t> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = fmt::encode_bf16(x[i]);
    for (Recipe r : kAllRecipes)
      for (ScaleFormat f : {ScaleFormat::kCompact, ScaleFormat::kCublasLt})
        for (int dirs : {1, 2, 3})
          for (int alt = 0; alt < 2; ++alt) {
            if (!shape_fits(r, dirs, R, C)) continue;
            const ScaleMode mode = sweep_mode(r, alt);
            const DType src_dtype = alt == 0 ? DType::kF32 : DType::kBF16;
            const auto cfg = make_cfg(r, f, dirs & 1, dirs & 2, mode,
                                      alt == 1 && r != Recipe::kNvfp4 ? DType::kE5M2 : DType::kE4M3);
            INFO(recipe_name(r) << " " << format_name(f) << " dirs=" << dirs << " mode " << to_string(mode) << " src "
                                << to_string(src_dtype) << " shape " << R << "x" << C);
            const float* hx = alt == 0 ? x.data() : reinterpret_cast<const float*>(xb.data());
            const auto want = quantize_h(hx, R, C, cfg, 0xA5, src_dtype);
            // The same poisoned buffers, filled by the library's quantizer.
            HostQuant got;
            got.src = want.src;
            got.cfg = cfg;
            if (cfg.rowwise) {
              got.data.assign(want.data.size(), 0xEE);
              got.scales.assign(want.scales.size(), 0xA5);
            }
            if (cfg.columnwise) {
              got.data_t.assign(want.data_t.size(), 0xEE);
              got.scales_t.assign(want.scales_t.size(), 0xA5);
            }
            scalemm::quantize::quantize(got.src, cfg, got.outputs(), nullptr, 0, nullptr);
            CHECK(got.data == want.data);
            CHECK(got.scales == want.scales);
            CHECK(got.data_t == want.data_t);
            CHECK(got.scales_t == want.scales_t);
            if (r == Recipe::kNvfp4) CHECK(got.global == want.global);
          }
  }
}

TEST_CASE("scalemm::quantize on host memory refuses a malformed request with the emulator's named reason",
          "[emulation][quantize]") {
  std::vector<float> x(7 * 16, 1.0f);
  const auto cfg = make_cfg(Recipe::kNvfp4, ScaleFormat::kCompact, false, true);
  std::vector<uint8_t> d(64), s(256);
  QuantizeOutputs o;
  o.data_t = d.data();
  o.scales_t = s.data();
  float gs = 0;
  o.global_scale = &gs;
  const SourceMatrix src{x.data(), DType::kF32, 7, 16};
  std::string host_reason, api_reason;
  try {
    quantize_host(src, cfg, o);
  } catch (const scalemm::Error& e) {
    host_reason = e.what();
  }
  try {
    scalemm::quantize::quantize(src, cfg, o, nullptr, 0, nullptr);
  } catch (const scalemm::Error& e) {
    api_reason = e.what();
  }
  CHECK_FALSE(host_reason.empty());
  CHECK(api_reason == host_reason);
}
