// Quantizers and dequantization on the host: byte-level agreement with a scalar model built from the
// formats codecs, the documented special-value bytes, cublaslt padding, direction equivalences.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <limits>

#include "detail/functors.hpp"
#include "emu_test_util.hpp"
#include "scalemm/status.hpp"

using namespace emu_test;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

/// NaN-propagating amax, written plainly.
float amax_of(const std::vector<float>& x, int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  float m = 0.0f;
  bool nan = false;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) {
      const float v = x[size_t(r * cols + c)];
      if (std::isnan(v)) nan = true;
      m = std::max(m, std::fabs(v));
    }
  return nan ? kNaN : m;
}

struct Model {
  std::vector<uint8_t> data, scales;
  float global = 1.0f;
};

/// Scalar model of the rowwise quantizer (docs/emulation.md), from the formats codecs.
Model model_rowwise(const std::vector<float>& x, int64_t R, int64_t C, const QuantizeConfig& cfg) {
  Model m;
  const ScaleLayout L(cfg.recipe, R, C, cfg.format);
  const ScaleMode mode = resolve_scale_mode(cfg.recipe, cfg.mode);
  const DType elem = elem_of(cfg.recipe, cfg.data_dtype);
  const float emax_val = elem == DType::kE5M2 ? 57344.0f : elem == DType::kE2M1 ? 6.0f : 448.0f;
  const int emax_exp = elem == DType::kE5M2 ? 15 : elem == DType::kE2M1 ? 2 : 8;
  m.data.assign(size_t(dtype_storage_bytes(elem, R * C)), 0);
  m.scales.assign(size_t(L.bytes()), 0);
  float senc = 1.0f;
  if (cfg.recipe == Recipe::kNvfp4) {
    const float at = amax_of(x, C, 0, R, 0, C);
    senc = (std::isfinite(at) && at > 0) ? 2688.0f / at : 1.0f;
    if (!std::isfinite(senc) || senc == 0) senc = 1.0f;
    m.global = 1.0f / senc;
  }
  const int64_t br = L.block_rows(), bk = L.block_k();
  for (int64_t gr = 0; gr < L.grid_rows(); ++gr)
    for (int64_t kb = 0; kb < L.kblocks(); ++kb) {
      const int64_t r0 = gr * br, r1 = std::min(R, r0 + br), c0 = kb * bk, c1 = std::min(C, c0 + bk);
      const float amax = amax_of(x, C, r0, r1, c0, c1);
      float mult = 1.0f, stored = 1.0f;
      uint8_t byte = 0;
      switch (mode) {
        case ScaleMode::kAmax:
        case ScaleMode::kAmaxPow2:
          if (std::isfinite(amax)) {
            mult = emax_val / std::max(amax, cfg.eps);
            if (mode == ScaleMode::kAmaxPow2) {
              int e = 0;
              std::frexp(mult, &e);
              mult = std::ldexp(1.0f, e - 1);
            }
          }
          stored = 1.0f / mult;
          break;
        case ScaleMode::kE8M0Floor: {
          if (!std::isfinite(amax)) byte = 0xFF;
          else if (amax == 0) byte = 0;
          else {
            int e = 0;
            std::frexp(amax, &e);  // amax = f * 2^e, f in [0.5, 1): floor(log2 amax) = e - 1
            byte = uint8_t(std::clamp(e - 1 - emax_exp + 127, 0, 254));
          }
          mult = byte == 0xFF ? kNaN : std::ldexp(1.0f, 127 - int(byte));
          break;
        }
        case ScaleMode::kE8M0Rceil:
          byte = fmt::encode_e8m0(amax / emax_val, fmt::E8M0Rounding::kUp, fmt::Saturation::kNonSaturating);
          mult = byte == 0xFF ? kNaN : std::ldexp(1.0f, 127 - int(byte));
          break;
        default:  // NVFP4
          if (std::isnan(amax)) {
            byte = 0x7F;
            mult = kNaN;
          } else {
            byte = fmt::encode_ue4m3(std::min((amax / 6.0f) * senc, 448.0f));
            mult = 1.0f / (fmt::decode_ue4m3(byte) * m.global);
            if (!std::isfinite(mult)) mult = std::numeric_limits<float>::max();
          }
          break;
      }
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t off = L.offset(r, kb);
        if (L.scale_dtype() == DType::kF32) std::memcpy(&m.scales[size_t(off * 4)], &stored, 4);
        else m.scales[size_t(off)] = byte;
        for (int64_t c = c0; c < c1; ++c) {
          const float v = x[size_t(r * C + c)] * mult;
          const int64_t i = r * C + c;
          if (elem == DType::kE2M1) fmt::set_e2m1(m.data.data(), i, fmt::encode_e2m1(v));
          else if (elem == DType::kE5M2) m.data[size_t(i)] = fmt::encode_e5m2(v);
          else m.data[size_t(i)] = fmt::encode_e4m3(v);
        }
      }
    }
  return m;
}

std::vector<ScaleMode> modes_of(Recipe r) {
  if (r == Recipe::kNvfp4) return {ScaleMode::kNvfp4TwoLevel};
  if (r == Recipe::kMxfp8 || r == Recipe::kMxfp8_32x32) return {ScaleMode::kE8M0Rceil, ScaleMode::kE8M0Floor};
  return {ScaleMode::kAmax, ScaleMode::kAmaxPow2};
}

/// Random data with a wide dynamic range across blocks, and a few exact zeros.
std::vector<float> wide_data(std::mt19937_64& g, int64_t n) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::uniform_int_distribution<int> e(-20, 20), z(0, 15);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = z(g) == 0 ? 0.0f : std::ldexp(d(g), e(g));
  return v;
}

}  // namespace

TEST_CASE("Scale mode names round-trip and each recipe resolves its default mode", "[emulation][quantize]") {
  for (ScaleMode m : {ScaleMode::kAmax, ScaleMode::kAmaxPow2, ScaleMode::kE8M0Floor, ScaleMode::kE8M0Rceil,
                      ScaleMode::kNvfp4TwoLevel}) {
    ScaleMode back{};
    REQUIRE(parse_scale_mode(to_string(m), &back));
    CHECK(back == m);
  }
  CHECK_FALSE(parse_scale_mode("nearest", nullptr));
  CHECK(resolve_scale_mode(Recipe::kBlock1x128, ScaleMode::kDefault) == ScaleMode::kAmax);
  CHECK(resolve_scale_mode(Recipe::kMxfp8, ScaleMode::kDefault) == ScaleMode::kE8M0Rceil);
  CHECK(resolve_scale_mode(Recipe::kNvfp4, ScaleMode::kDefault) == ScaleMode::kNvfp4TwoLevel);
}

TEST_CASE("Every recipe's quantizer writes the scale and data bytes of the scalar codec model",
          "[emulation][quantize]") {
  auto g = scalemm::testing::rng(101);
  const int64_t R = 130, C = 200;  // partial 128/32 row blocks, K tail in every block size
  const auto x = wide_data(g, R * C);
  for (Recipe r : kAllRecipes)
    for (ScaleMode mode : modes_of(r))
      for (ScaleFormat f : {ScaleFormat::kCompact, ScaleFormat::kCublasLt})
        for (DType fp8 : {DType::kE4M3, DType::kE5M2}) {
          if (r == Recipe::kNvfp4 && fp8 == DType::kE5M2) continue;
          INFO(recipe_name(r) << " " << to_string(mode) << " " << format_name(f) << " " << to_string(fp8).data());
          const auto cfg = make_cfg(r, f, true, false, mode, fp8);
          auto q = quantize_h(x.data(), R, C, cfg);
          const Model m = model_rowwise(x, R, C, cfg);
          int64_t first = -1;
          CHECK(bitwise_equal(q.scales.data(), m.scales.data(), m.scales.size(), &first));
          INFO("first differing scale byte " << first);
          CHECK(bitwise_equal(q.data.data(), m.data.data(), m.data.size(), &first));
          INFO("first differing data byte " << first);
          if (r == Recipe::kNvfp4) CHECK(q.global == m.global);
        }
}

TEST_CASE("Columnwise output equals rowwise quantization of the transpose, and both-at-once equals separate calls",
          "[emulation][quantize]") {
  auto g = scalemm::testing::rng(102);
  const int64_t R = 100, C = 262;  // even (FP4 pairs both ways), not block multiples
  const auto x = wide_data(g, R * C);
  const auto xt = transpose(x, R, C);
  for (Recipe r : kAllRecipes)
    for (ScaleFormat f : {ScaleFormat::kCompact, ScaleFormat::kCublasLt}) {
      INFO(recipe_name(r) << " " << format_name(f));
      auto both = quantize_h(x.data(), R, C, make_cfg(r, f, true, true));
      auto row = quantize_h(x.data(), R, C, make_cfg(r, f, true, false));
      auto col = quantize_h(x.data(), R, C, make_cfg(r, f, false, true));
      auto tr = quantize_h(xt.data(), C, R, make_cfg(r, f, true, false));
      CHECK(both.data == row.data);
      CHECK(both.scales == row.scales);
      CHECK(both.data_t == col.data_t);
      CHECK(both.scales_t == col.scales_t);
      CHECK(col.data_t == tr.data);
      CHECK(col.scales_t == tr.scales);
      if (r == Recipe::kNvfp4) CHECK(col.global == tr.global);
    }
}

TEST_CASE("bf16 and f16 sources quantize exactly like their fp32 values", "[emulation][quantize]") {
  auto g = scalemm::testing::rng(103);
  const int64_t R = 64, C = 96;
  auto x = random_normal(g, R * C, 3.0f);
  std::vector<uint16_t> xb(x.size()), xh(x.size());
  std::vector<float> xbf(x.size()), xhf(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    xb[i] = fmt::encode_bf16(x[i]);
    xbf[i] = fmt::decode_bf16(xb[i]);
    xh[i] = fmt::encode_f16(x[i]);
    xhf[i] = fmt::decode_f16(xh[i]);
  }
  for (Recipe r : kAllRecipes) {
    INFO(recipe_name(r));
    const auto cfg = make_cfg(r, ScaleFormat::kCublasLt, true, true);
    QuantizeConfig c = cfg;
    HostQuant a = quantize_h(reinterpret_cast<const float*>(xb.data()), R, C, c, 0xA5, DType::kBF16);
    HostQuant b = quantize_h(xbf.data(), R, C, c);
    CHECK(a.data == b.data);
    CHECK(a.scales == b.scales);
    CHECK(a.data_t == b.data_t);
    HostQuant h = quantize_h(reinterpret_cast<const float*>(xh.data()), R, C, c, 0xA5, DType::kF16);
    HostQuant hf = quantize_h(xhf.data(), R, C, c);
    CHECK(h.data == hf.data);
    CHECK(h.scales_t == hf.scales_t);
  }
}

TEST_CASE("cublaslt scale buffers come out with zero padding and the compact scales at offset()",
          "[emulation][quantize]") {
  auto g = scalemm::testing::rng(104);
  const int64_t R = 70, C = 200;  // 70 rows -> 128-row tiles and 4-row padding; 200 -> K blocks not multiple of 4
  const auto x = wide_data(g, R * C);
  for (Recipe r : kAllRecipes) {
    INFO(recipe_name(r));
    auto lt = quantize_h(x.data(), R, C, make_cfg(r, ScaleFormat::kCublasLt, true, true), 0xA5);
    auto cp = quantize_h(x.data(), R, C, make_cfg(r, ScaleFormat::kCompact, true, true), 0xA5);
    for (int dir = 0; dir < 2; ++dir) {
      const ScaleLayout Llt = dir == 0 ? rowwise_layout(lt.cfg, R, C) : columnwise_layout(lt.cfg, R, C);
      const ScaleLayout Lcp = Llt.with_format(ScaleFormat::kCompact);
      const auto& blt = dir == 0 ? lt.scales : lt.scales_t;
      const auto& bcp = dir == 0 ? cp.scales : cp.scales_t;
      const int sb = Llt.scale_bytes();
      std::vector<char> reached(size_t(Llt.size()), 0);
      bool same = true;
      for (int64_t row = 0; row < Llt.rows; ++row)
        for (int64_t kb = 0; kb < Llt.kblocks(); ++kb) {
          reached[size_t(Llt.offset(row, kb))] = 1;
          same &= std::memcmp(&blt[size_t(Llt.offset(row, kb) * sb)], &bcp[size_t(Lcp.offset(row, kb) * sb)], size_t(sb)) == 0;
        }
      CHECK(same);
      int64_t nonzero_padding = 0;
      for (int64_t i = 0; i < Llt.size(); ++i)
        if (!reached[size_t(i)])
          for (int b = 0; b < sb; ++b) nonzero_padding += blt[size_t(i * sb + b)] != 0;
      CHECK(nonzero_padding == 0);
    }
  }
}

namespace {
/// One MX block of 32 values: returns (scale byte, data bytes) from a 1 x 32 rowwise quantization.
std::pair<uint8_t, std::vector<uint8_t>> mx_block(const std::vector<float>& v, ScaleMode mode) {
  auto q = quantize_h(v.data(), 1, 32, make_cfg(Recipe::kMxfp8, ScaleFormat::kCompact, true, false, mode));
  return {q.scales[0], q.data};
}
std::vector<float> block_of(float fill, std::initializer_list<std::pair<int, float>> set = {}) {
  std::vector<float> v(32, fill);
  for (auto& p : set) v[size_t(p.first)] = p.second;
  return v;
}
}  // namespace

TEST_CASE("MXFP8 special-value blocks give the documented scale and data bytes", "[emulation][quantize]") {
  for (ScaleMode mode : {ScaleMode::kE8M0Rceil, ScaleMode::kE8M0Floor}) {
    INFO(to_string(mode));
    const bool rceil = mode == ScaleMode::kE8M0Rceil;
    SECTION("all zero: code 0 (2^-127), zero data, never NaN") {
      auto [s, d] = mx_block(block_of(0.0f), mode);
      CHECK(s == 0x00);
      CHECK(std::all_of(d.begin(), d.end(), [](uint8_t b) { return b == 0; }));
      auto [s2, d2] = mx_block(block_of(-0.0f), mode);
      CHECK(s2 == 0x00);
      CHECK(std::all_of(d2.begin(), d2.end(), [](uint8_t b) { return b == 0x80; }));  // signed zero kept
    }
    SECTION("one NaN: scale 0xFF, every element the NaN code 0x7F") {
      auto [s, d] = mx_block(block_of(1.0f, {{5, kNaN}}), mode);
      CHECK(s == 0xFF);
      CHECK(std::all_of(d.begin(), d.end(), [](uint8_t b) { return b == 0x7F; }));
    }
    SECTION("one Inf: scale 0xFF (NaN block), like NaN") {
      auto [s, d] = mx_block(block_of(1.0f, {{7, -kInf}}), mode);
      CHECK(s == 0xFF);
      CHECK(std::all_of(d.begin(), d.end(), [](uint8_t b) { return b == 0x7F; }));
    }
    SECTION("+-448: scale 2^0 (0x7F), data +-max 0x7E/0xFE; 248 rounds up into the next binade (0x78)") {
      auto [s, d] = mx_block(block_of(1.0f, {{0, 448.0f}, {1, -448.0f}, {2, 248.0f}, {3, 247.0f}}), mode);
      CHECK(s == 0x7F);
      CHECK(d[0] == 0x7E);
      CHECK(d[1] == 0xFE);
      CHECK(d[2] == 0x78);  // tie between 240 (odd mantissa) and 256: even -> 256 = 2^8
      CHECK(d[3] == 0x77);  // 240
      CHECK(d[4] == 0x38);  // 1.0
    }
    SECTION("amax 480: RCEIL takes 2^1 (480 -> 240), FLOOR keeps 2^0 and saturates (480 -> 448)") {
      auto [s, d] = mx_block(block_of(0.0f, {{0, 480.0f}}), mode);
      CHECK(s == (rceil ? 0x80 : 0x7F));
      CHECK(d[0] == (rceil ? 0x77 : 0x7E));
    }
    SECTION("amax 449: just past 448, RCEIL rounds the ratio up into the next binade") {
      auto [s, d] = mx_block(block_of(0.0f, {{0, 449.0f}}), mode);
      CHECK(s == (rceil ? 0x80 : 0x7F));
      CHECK(d[0] == (rceil ? 0x76 : 0x7E));  // 224.5 -> 224 ; 449 -> 448 (satfinite)
    }
    SECTION("fp32 subnormals: amax 2^-130 gives code 0 and data 2^-3 (0x20)") {
      auto [s, d] = mx_block(block_of(0.0f, {{0, std::ldexp(1.0f, -130)}, {1, -std::ldexp(1.0f, -149)}}), mode);
      CHECK(s == 0x00);
      CHECK(d[0] == 0x20);
      CHECK(d[1] == 0x80);  // 2^-22 underflows to -0
    }
    SECTION("fp32 max: RCEIL code 247, FLOOR code 246") {
      auto [s, d] = mx_block(block_of(0.0f, {{0, std::numeric_limits<float>::max()}}), mode);
      CHECK(s == (rceil ? 247 : 246));
      CHECK(d[0] == (rceil ? 0x78 : 0x7E));  // FLT_MAX * 2^-120 = 255.99998 -> 256; * 2^-119 -> 448 (sat)
    }
  }
}

TEST_CASE("FP8 fp32-scale special blocks: zero gives a finite scale, NaN/Inf give scale 1", "[emulation][quantize]") {
  std::vector<float> v(128, 0.0f);
  SECTION("all zero: stored = 1/(448/eps), data zero") {
    auto q = quantize_h(v.data(), 1, 128, make_cfg(Recipe::kBlock1x128));
    float s;
    std::memcpy(&s, q.scales.data(), 4);
    CHECK(s == 1.0f / (448.0f / 1e-12f));
    CHECK(std::isfinite(s));
    CHECK(std::all_of(q.data.begin(), q.data.end(), [](uint8_t b) { return b == 0; }));
  }
  SECTION("NaN and Inf: stored 1; NaN -> 0x7F, +-Inf -> +-448, others saturate at scale 1") {
    v[0] = kNaN;
    v[1] = kInf;
    v[2] = -kInf;
    v[3] = 1.0f;
    v[4] = 1000.0f;
    auto q = quantize_h(v.data(), 1, 128, make_cfg(Recipe::kBlock1x128));
    float s;
    std::memcpy(&s, q.scales.data(), 4);
    CHECK(s == 1.0f);
    CHECK(q.data[0] == 0x7F);
    CHECK(q.data[1] == 0x7E);
    CHECK(q.data[2] == 0xFE);
    CHECK(q.data[3] == 0x38);
    CHECK(q.data[4] == 0x7E);
  }
  SECTION("pow2 rounds the quantization scale down: amax 3 -> q = 128 (not 149.3), stored 1/128") {
    v[0] = 3.0f;
    auto q = quantize_h(v.data(), 1, 128, make_cfg(Recipe::kBlock1x128, ScaleFormat::kCompact, true, false,
                                                   ScaleMode::kAmaxPow2));
    float s;
    std::memcpy(&s, q.scales.data(), 4);
    CHECK(s == 1.0f / 128.0f);
    CHECK(q.data[0] == fmt::encode_e4m3(384.0f));
  }
}

TEST_CASE("NVFP4 special blocks: zero block 0x00, NaN block 0x7F, Inf saturates, zero tensor stays finite",
          "[emulation][quantize]") {
  std::vector<float> v(64, 0.0f);  // 1 x 64: four blocks of 16
  for (int i = 16; i < 32; ++i) v[size_t(i)] = 1.0f;
  v[16] = 6.0f;
  SECTION("zero tensor: S_dec = 1, every byte zero") {
    std::vector<float> z(64, 0.0f);
    auto q = quantize_h(z.data(), 1, 64, make_cfg(Recipe::kNvfp4));
    CHECK(q.global == 1.0f);
    CHECK(std::all_of(q.scales.begin(), q.scales.end(), [](uint8_t b) { return b == 0; }));
    CHECK(std::all_of(q.data.begin(), q.data.end(), [](uint8_t b) { return b == 0; }));
  }
  SECTION("a zero block inside a non-zero tensor: scale 0x00 and zero data; the amax block stores 448") {
    auto q = quantize_h(v.data(), 1, 64, make_cfg(Recipe::kNvfp4));
    CHECK(q.global == 1.0f / (2688.0f / 6.0f));
    CHECK(q.scales[0] == 0x00);
    CHECK(q.scales[1] == 0x7E);  // (6/6) * 448 = 448
    CHECK(q.data[0] == 0);
    CHECK(fmt::get_e2m1(q.data.data(), 16) == 0x7);  // 6
    CHECK(fmt::get_e2m1(q.data.data(), 17) == 0x2);  // 1
  }
  SECTION("a NaN in a block: scale 0x7F, the block dequantizes to NaN, other blocks unaffected") {
    v[40] = kNaN;
    auto q = quantize_h(v.data(), 1, 64, make_cfg(Recipe::kNvfp4));
    CHECK(q.global == 1.0f);  // non-finite tensor amax -> S_enc = 1
    CHECK(q.scales[2] == 0x7F);
    std::vector<float> dq(64);
    dequantize_host(q.rowwise(), dq.data());
    CHECK(std::isnan(dq[40]));
    CHECK(std::isnan(dq[33]));
    CHECK(dq[16] == 6.0f);
  }
  SECTION("an Inf: S_enc = 1, the block scale clamps to 448 before the cast, Inf -> 6") {
    v[48] = kInf;
    auto q = quantize_h(v.data(), 1, 64, make_cfg(Recipe::kNvfp4));
    CHECK(q.global == 1.0f);
    CHECK(q.scales[3] == 0x7E);
    CHECK(fmt::get_e2m1(q.data.data(), 48) == 0x7);
  }
}

TEST_CASE("A given tensor amax replaces the amax pass: the true amax gives the same bytes, a smaller one saturates",
          "[emulation][quantize]") {
  auto g = scalemm::testing::rng(121);
  const int64_t R = 38, C = 96;  // even: NVFP4 packs pairs in both directions
  const auto x = random_normal(g, R * C, 3.0f);
  const float am = amax_of(x, C, 0, R, 0, C);
  const auto same = [](const HostQuant& a, const HostQuant& b) {
    CHECK(a.data == b.data);
    CHECK(a.scales == b.scales);
    CHECK(a.data_t == b.data_t);
    CHECK(a.scales_t == b.scales_t);
    CHECK(a.global == b.global);
  };
  for (Recipe r : {Recipe::kTensorwise, Recipe::kNvfp4})
    for (ScaleFormat f : {ScaleFormat::kCompact, ScaleFormat::kCublasLt}) {
      INFO(recipe_name(r) << " " << format_name(f));
      const auto cfg = make_cfg(r, f, true, true);
      const auto computed = quantize_h(x.data(), R, C, cfg);
      same(quantize_h(x.data(), R, C, cfg, 0xA5, DType::kF32, &am), computed);
      const float neg = -am;  // the magnitude is used
      same(quantize_h(x.data(), R, C, cfg, 0xA5, DType::kF32, &neg), computed);
    }
  SECTION("tensorwise with a quarter of the amax: scale from the given value, larger elements at +-448") {
    const float quarter = am / 4.0f;
    const auto q = quantize_h(x.data(), R, C, make_cfg(Recipe::kTensorwise), 0xA5, DType::kF32, &quarter);
    float stored = 0.0f;
    std::memcpy(&stored, q.scales.data(), 4);
    CHECK(stored == 1.0f / (448.0f / quarter));
    int saturated = 0;
    for (size_t i = 0; i < x.size(); ++i)
      if (std::fabs(x[i]) > quarter * 1.07f) {  // past the rounding range of 448
        CHECK((q.data[i] & 0x7F) == 0x7E);
        ++saturated;
      }
    CHECK(saturated > 0);
  }
  SECTION("NVFP4 with a quarter of the amax: S_dec from the given value, blocks past it clamp to 448") {
    const float quarter = am / 4.0f;
    const auto q = quantize_h(x.data(), R, C, make_cfg(Recipe::kNvfp4), 0xA5, DType::kF32, &quarter);
    CHECK(q.global == 1.0f / (2688.0f / quarter));
    CHECK(std::count(q.scales.begin(), q.scales.end(), uint8_t(0x7E)) > 0);
  }
  SECTION("any other recipe refuses an amax, naming it") {
    for (Recipe r : {Recipe::kRowwise, Recipe::kBlock1x128, Recipe::kBlock128x128, Recipe::kMxfp8}) {
      INFO(recipe_name(r));
      try {
        quantize_h(x.data(), R, C, make_cfg(r), 0xA5, DType::kF32, &am);
        FAIL("no error");
      } catch (const scalemm::Error& e) {
        CHECK(e.code() == scalemm::StatusCode::kInvalidArgument);
        CHECK(std::string(e.what()).find("amax") != std::string::npos);
      }
    }
  }
}

TEST_CASE("Dequantization applies decode(q) * scale through offset() for every recipe and format",
          "[emulation][quantize]") {
  auto g = scalemm::testing::rng(105);
  const int64_t R = 66, C = 144;
  const auto x = wide_data(g, R * C);
  for (Recipe r : kAllRecipes) {
    INFO(recipe_name(r));
    auto cp = quantize_h(x.data(), R, C, make_cfg(r, ScaleFormat::kCompact));
    auto lt = quantize_h(x.data(), R, C, make_cfg(r, ScaleFormat::kCublasLt));
    std::vector<float> d1(size_t(R * C)), d2(size_t(R * C));
    dequantize_host(cp.rowwise(), d1.data());
    dequantize_host(lt.rowwise(), d2.data());
    CHECK(bitwise_equal(d1.data(), d2.data(), d1.size() * 4));
    const ScaleLayout L = cp.rowwise().layout;
    int64_t bad = 0;
    for (int64_t i = 0; i < R; ++i)
      for (int64_t k = 0; k < C; ++k) {
        const int64_t o = L.offset(i, k / L.block_k());
        float q, s;
        if (r == Recipe::kNvfp4) {
          q = fmt::decode_e2m1(fmt::get_e2m1(cp.data.data(), i * C + k));
          s = fmt::decode_ue4m3(cp.scales[size_t(o)]);
        } else {
          q = fmt::decode_e4m3(cp.data[size_t(i * C + k)]);
          if (L.scale_dtype() == DType::kE8M0) s = fmt::decode_e8m0(cp.scales[size_t(o)]);
          else std::memcpy(&s, &cp.scales[size_t(o * 4)], 4);
        }
        float want = q * s;
        if (r == Recipe::kNvfp4) want = want * cp.global;
        bad += std::memcmp(&want, &d1[size_t(i * C + k)], 4) != 0;
      }
    CHECK(bad == 0);
    // bf16 output is the RNE of the fp32 dequantization
    std::vector<uint16_t> b(size_t(R * C));
    dequantize_host(cp.rowwise(), b.data(), DType::kBF16);
    int64_t badb = 0;
    for (size_t i = 0; i < b.size(); ++i) badb += b[i] != fmt::encode_bf16(d1[i]);
    CHECK(badb == 0);
  }
}

TEST_CASE("Malformed quantize requests are refused with a named reason", "[emulation][quantize]") {
  std::vector<float> x(6 * 5, 1.0f);
  std::vector<uint8_t> d(64), s(4096);
  float gs = 0;
  QuantizeOutputs o{d.data(), s.data(), d.data(), s.data(), &gs};
  auto expect_invalid = [&](const QuantizeConfig& c, int64_t R, int64_t C) {
    try {
      quantize_host(SourceMatrix{x.data(), DType::kF32, R, C}, c, o);
      FAIL("no error");
    } catch (const scalemm::Error& e) {
      CHECK(e.code() == StatusCode::kInvalidArgument);
      INFO(e.what());
    }
  };
  expect_invalid(make_cfg(Recipe::kNvfp4), 6, 5);                        // odd K for packed FP4
  expect_invalid(make_cfg(Recipe::kNvfp4, ScaleFormat::kCompact, false, true), 5, 6);  // odd R columnwise
  expect_invalid(make_cfg(Recipe::kMxfp8, ScaleFormat::kCompact, true, false, ScaleMode::kAmax), 6, 5);
  expect_invalid(make_cfg(Recipe::kRowwise, ScaleFormat::kCompact, true, false, ScaleMode::kE8M0Floor), 6, 5);
  expect_invalid(make_cfg(Recipe::kRowwise, ScaleFormat::kCompact, false, false), 6, 5);
  QuantizeConfig c = make_cfg(Recipe::kRowwise);
  c.data_dtype = DType::kE2M1;
  expect_invalid(c, 6, 5);
}

TEST_CASE("The emulator's 32-bit element encoder equals the formats codecs on every sign, exponent and rounding "
          "pattern",
          "[emulation][quantize]") {
  // The upper 16 bits cover sign, exponent and the kept/half bits of every rounding position the
  // element formats use (bit 16 and up); the low patterns make the sticky bits zero or not.
  static const uint32_t lows[] = {0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1234, 0xC0DE};
  int64_t bad4 = 0, bad5 = 0, bad2 = 0;
  for (uint32_t hi = 0; hi < 0x10000u; ++hi)
    for (uint32_t lo : lows) {
      const uint32_t b = (hi << 16) | lo;
      const float x = fmt::bits_float(b);
      bad4 += scalemm::numerics::detail::encode_elem(x, DType::kE4M3) !=
              fmt::encode_e4m3_bits(b, fmt::Saturation::kSatFinite);
      bad5 += scalemm::numerics::detail::encode_elem(x, DType::kE5M2) !=
              fmt::encode_e5m2_bits(b, fmt::Saturation::kSatFinite);
      bad2 += scalemm::numerics::detail::encode_elem(x, DType::kE2M1) !=
              fmt::encode_e2m1_bits(b, fmt::Saturation::kSatFinite);
    }
  CHECK(bad4 == 0);
  CHECK(bad5 == 0);
  CHECK(bad2 == 0);
}

TEST_CASE("The branch-free E2M1 encoder equals the software encoder on every input of the rounding range and "
          "samples of all others",
          "[emulation][quantize]") {
  // Exhaustive where E2M1 rounds: every fp32 pattern whose magnitude lies in [2^-3, 2^3) (exponent
  // fields 124..129, all 2^23 mantissas, both signs), which holds every threshold 0.25 ... 5. Outside
  // that range both give 0 (below) or 7 (above); checked on every exponent field with 4099 mantissas
  // each (stride 2047 plus the ends), and on the specials: +-0, fp32 subnormals, +-Inf, NaN payloads.
  // The GPU test "... all 2^32 fp32 patterns" covers the rest exhaustively.
  namespace d = scalemm::numerics::detail;
  const auto ref = [](uint32_t b) { return d::encode_satfinite(b, fmt::detail::e2m1_format()); };
  int64_t bad = 0, n = 0;
  uint32_t first_bad = 0;
  const auto check = [&](uint32_t b) {
    ++n;
    if (d::encode_e2m1_satfinite(b) != ref(b)) {
      if (bad++ == 0) first_bad = b;
    }
  };
  for (uint32_t s = 0; s < 2; ++s) {
    for (uint32_t e = 124; e <= 129; ++e)
      for (uint32_t m = 0; m < (1u << 23); ++m) check((s << 31) | (e << 23) | m);
    for (uint32_t e = 0; e < 256; ++e) {
      for (uint32_t m = 0; m < (1u << 23); m += 2047) check((s << 31) | (e << 23) | m);
      for (uint32_t m : {1u, 2u, 0x400000u, 0x7FFFFEu, 0x7FFFFFu}) check((s << 31) | (e << 23) | m);
    }
  }
  for (uint32_t b : {0u, 0x80000000u, 1u, 0x807FFFFFu, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u, 0x7F800001u,
                     0xFFFFFFFFu, 0x3E800000u, 0x3E800001u, 0x40A00000u, 0x40A00001u})
    check(b);
  CAPTURE(n, bad, first_bad);
  CHECK(n > 100000000);
  CHECK(bad == 0);
}

namespace {
/// A packed 4-code E2M1 encoder's result on the patterns b against encode_e2m1_not_nan of each, element
/// j in bits 4j..4j+3; counts the checks and keeps the first failing pattern.
struct PackedE2m1Sweep {
  int64_t n = 0, bad = 0;
  uint32_t first_bad = 0;
  template <class Enc>
  void check(Enc enc, const uint32_t (&b)[4], uint32_t name) {
    namespace d = scalemm::numerics::detail;
    const uint32_t got = enc(fmt::bits_float(b[0]), fmt::bits_float(b[1]), fmt::bits_float(b[2]), fmt::bits_float(b[3]));
    uint32_t want = 0;
    for (int j = 0; j < 4; ++j) want |= d::encode_e2m1_not_nan(fmt::bits_float(b[j])) << (4 * j);
    ++n;
    if (got != want && bad++ == 0) first_bad = name;
  }
};
}  // namespace

TEST_CASE("The packed E2M1 encoder equals the element encoder in each of its four positions",
          "[emulation][quantize]") {
  // Host build of encode_e2m1x4_not_nan (shifts for the signs and an add for the rounding sum; the
  // GPU build, prmt and fma, is swept over all 2^32 patterns by the [gpu] test). Every pattern of
  // the rounding range [2^-3, 2^3), both signs, is element j = b % 4 once, beside three patterns of
  // other exponents (hashed; NaNs among those become 0), plus the specials in every position.
  PackedE2m1Sweep sw;
  const auto check = [&](uint32_t (&b)[4]) {
    for (int j = 0; j < 4; ++j)  // the encoder is for non-NaN inputs (kernels test the block's NaN once)
      if ((b[j] & 0x7FFFFFFFu) > 0x7F800000u) b[j] = 0;
    sw.check(scalemm::numerics::detail::encode_e2m1x4_not_nan, b, b[0]);
  };
  for (uint32_t s = 0; s < 2; ++s)
    for (uint32_t e = 124; e <= 129; ++e)
      for (uint32_t m = 0; m < (1u << 23); ++m) {
        const uint32_t x = (s << 31) | (e << 23) | m;
        uint32_t b[4];
        for (int j = 0; j < 4; ++j) b[j] = x * 2654435761u + 0x9E3779B9u * uint32_t(j + 1);
        b[x % 4] = x;
        check(b);
      }
  const uint32_t specials[] = {0u, 0x80000000u, 1u, 0x807FFFFFu, 0x7F800000u, 0xFF800000u, 0x7FC00000u,
                               0xFFC00000u, 0x7F800001u, 0xFFFFFFFFu, 0x3E800000u, 0x40A00001u, 0x40C00000u};
  for (uint32_t a : specials)
    for (uint32_t c : specials) {
      uint32_t b[4] = {a, c, a ^ 0x80000000u, c ^ 0x80000000u};
      check(b);
    }
  CAPTURE(sw.n, sw.bad, sw.first_bad);
  CHECK(sw.n > 100000000);
  CHECK(sw.bad == 0);
}

TEST_CASE("The unsaturated packed E2M1 encoder equals the element encoder below 7", "[emulation][quantize]") {
  // e2m1x4_small (the NVFP4 tile kernel's encoder for blocks whose products stay below 7) against
  // encode_e2m1_not_nan: every pattern of [2^-3, 7), where the rounding decisions lie, in position
  // x % 4 beside three hashed patterns (those outside [0, 7) become 0), then every 101st pattern below.
  PackedE2m1Sweep sw;
  const auto check = [&](uint32_t x) {
    uint32_t b[4];
    for (int j = 0; j < 4; ++j) {
      b[j] = x * 2654435761u + 0x9E3779B9u * uint32_t(j + 1);
      if (b[j] >= 0x40E00000u) b[j] = 0;
    }
    b[x % 4] = x;
    sw.check(scalemm::numerics::detail::e2m1x4_small, b, x);
  };
  for (uint32_t x = 0x3E000000u; x < 0x40E00000u; ++x) check(x);
  for (uint32_t x = 0; x < 0x3E000000u; x += 101) check(x);
  CAPTURE(sw.n, sw.bad, sw.first_bad);
  CHECK(sw.n > 40000000);
  CHECK(sw.bad == 0);
}

TEST_CASE("div6_fma is the correctly rounded quotient a / 6 from 2^-125 to FLT_MAX", "[emulation][quantize]") {
  // The GPU's division in nvfp4_scale_byte (the [gpu] sweep checks the byte on all 2^32 patterns).
  // Here: every bf16 and f16 value in the range (the tile kernel's amaxes), the first 2^20 patterns
  // from 2^-125 up, and every 97th pattern of the whole range.
  namespace d = scalemm::numerics::detail;
  int64_t bad = 0, n = 0;
  uint32_t first_bad = 0;
  const auto check = [&](float a) {
    if (!(a >= 0x1p-125f && a <= d::kFltMax)) return;
    ++n;
    if (fmt::float_bits(d::div6_fma(a)) != fmt::float_bits(a / 6.0f) && bad++ == 0) first_bad = fmt::float_bits(a);
  };
  for (uint32_t c = 0; c < 0x8000u; ++c) {
    check(fmt::decode_bf16(uint16_t(c)));
    check(fmt::decode_f16(uint16_t(c)));
  }
  for (uint32_t b = 0x01000000u; b < 0x01100000u; ++b) check(fmt::bits_float(b));
  for (uint32_t b = 0x01000000u; b <= 0x7F7FFFFFu; b += 97) check(fmt::bits_float(b));
  CAPTURE(n, bad, first_bad);
  CHECK(n > 20000000);
  CHECK(bad == 0);
}
