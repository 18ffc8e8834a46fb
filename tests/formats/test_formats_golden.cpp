// Golden checks of the number-format codecs that need no Python: every decode of every 8-bit and
// 4-bit code, the CUDA conversion results measured on an H200 (numerics reference, section 2.8),
// and round trips of every code of every format. The tables are also checked at compile time.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>

#include "golden_tables.hpp"
#include "scalemm/formats.hpp"
#include "support/test_support.hpp"

namespace fmt = scalemm::formats;
using fmt::E8M0Rounding;
using fmt::Saturation;
using namespace scalemm_test_golden;

namespace {

constexpr Saturation kSat = Saturation::kSatFinite;
constexpr Saturation kNoSat = Saturation::kNonSaturating;

// ---- decodes ----------------------------------------------------------------------------------

constexpr bool decodes_match_golden() {
  for (uint32_t c = 0; c < 256; ++c) {
    const auto b = uint8_t(c);
    if (fmt::float_bits(fmt::decode_e4m3(b)) != kE4M3Decode[c]) return false;
    if (fmt::float_bits(fmt::decode_e5m2(b)) != kE5M2Decode[c]) return false;
    if (fmt::decode_e8m0_bits(b) != kE8M0Decode[c]) return false;
    if (fmt::float_bits(fmt::decode_e8m0(b)) != kE8M0Decode[c]) return false;
    if (fmt::float_bits(fmt::decode_ue4m3(b)) != kE4M3Decode[c & 0x7F]) return false;  // bit 7 ignored
    if (fmt::float_bits(fmt::decode_e2m1(b)) != kE2M1Decode[c & 0xF]) return false;    // high nibble ignored
  }
  return true;
}
static_assert(decodes_match_golden(), "a decode differs from tests/formats/golden_tables.hpp");

// Named values of each format (docs/numerics.md, "Number formats").
static_assert(fmt::decode_e4m3(0x7E) == fmt::kE4M3Max && fmt::kE4M3Max == 448.0f, "E4M3 max");
static_assert(fmt::decode_e4m3(0x08) == 0x1p-6f && fmt::decode_e4m3(0x01) == 0x1p-9f, "E4M3 min normal/subnormal");
static_assert(fmt::decode_e5m2(0x7B) == fmt::kE5M2Max && fmt::kE5M2Max == 57344.0f, "E5M2 max");
static_assert(fmt::decode_e5m2(0x04) == 0x1p-14f && fmt::decode_e5m2(0x01) == 0x1p-16f, "E5M2 min normal/subnormal");
static_assert(fmt::decode_e2m1(0x7) == fmt::kE2M1Max && fmt::kE2M1Max == 6.0f, "E2M1 max");
static_assert(fmt::decode_e2m1(0x2) == 1.0f && fmt::decode_e2m1(0x1) == 0.5f, "E2M1 min normal/subnormal");
static_assert(fmt::decode_e8m0_bits(0x00) == 0x00400000u, "E8M0 code 0 is 2^-127, a float32 subnormal");
static_assert(fmt::decode_e8m0(0x7F) == 1.0f && fmt::decode_e8m0(0xFE) == 0x1p127f, "E8M0 bias 127, max 2^127");
static_assert(fmt::decode_bf16(0x7F7F) == 0x1.FEp127f && fmt::decode_f16(0x7BFF) == 65504.0f, "16-bit max");
static_assert(fmt::decode_f16(0x0001) == 0x1p-24f && fmt::decode_bf16(0x0001) == 0x1p-133f, "16-bit min subnormal");

// ---- the CUDA conversion table (H200, CUDA 13.0 headers; reference section 2.8) -----------------

constexpr int kNone = -1;  // the reference table has no entry

struct CudaRow {
  const char* input;
  uint32_t bits;
  int e4m3_sat, e4m3_nosat, e5m2_sat, e5m2_nosat, e2m1, e8m0_up_sat, e8m0_up_nosat, e8m0_down_sat;
};

// clang-format off
constexpr CudaRow kCudaRows[] = {
  //  input              float32 bits   E4M3 sat/nosat  E5M2 sat/nosat  E2M1  E8M0 rp+sat rp rz+sat
  {"-0.0",               0x80000000u,   0x80, 0x80,     0x80, 0x80,     0x08, 0x00, 0x00, 0x00},
  {"448",                0x43E00000u,   0x7E, 0x7E,     0x5F, 0x5F,     0x07, 0x88, 0x88, 0x87},
  {"464 (tie)",          0x43E80000u,   0x7E, 0x7E,     0x5F, 0x5F,     0x07, 0x88, 0x88, 0x87},
  {"464 + 1 ulp",        0x43E80001u,   0x7E, 0x7F,     0x5F, 0x5F,     0x07, 0x88, 0x88, 0x87},
  {"465",                0x43E88000u,   0x7E, 0x7F,     0x5F, 0x5F,     0x07, 0x88, 0x88, 0x87},
  {"479",                0x43EF8000u,   0x7E, 0x7F,     0x5F, 0x5F,     0x07, 0x88, 0x88, 0x87},
  {"61440 (E5M2 tie)",   0x47700000u,   0x7E, 0x7F,     0x7B, 0x7C,     0x07, 0x8F, 0x8F, 0x8E},
  {"+Inf",               0x7F800000u,   0x7E, 0x7F,     0x7B, 0x7C,     0x07, 0xFE, 0xFF, 0xFE},
  {"-Inf",               0xFF800000u,   0xFE, 0xFF,     0xFB, 0xFC,     0x0F, 0xFE, 0xFF, 0xFE},
  {"NaN",                0x7FC00000u,   0x7F, 0x7F,     0x7F, 0x7F,     0x07, 0xFF, 0xFF, 0xFF},
  {"-NaN",               0xFFC00000u,   0x7F, 0x7F,     0x7F, 0x7F,     0x07, 0xFF, 0xFF, 0xFF},
  {"2^-10",              0x3A800000u,   0x00, 0x00,     0x14, 0x14,     0x00, 0x75, 0x75, 0x75},
  {"2^-127",             0x00400000u,   0x00, 0x00,     0x00, 0x00,     0x00, 0x00, 0x00, 0x00},
  {"2^-127 + 1 ulp",     0x00400001u,   0x00, 0x00,     0x00, 0x00,     0x00, 0x01, 0x01, 0x00},
  {"2^127",              0x7F000000u,   0x7E, 0x7F,     0x7B, 0x7C,     0x07, 0xFE, 0xFE, 0xFE},
  {"2^127 + 1 ulp",      0x7F000001u,   0x7E, 0x7F,     0x7B, 0x7C,     0x07, 0xFE, 0xFF, 0xFE},
  {"FLT_MAX",            0x7F7FFFFFu,   0x7E, 0x7F,     0x7B, 0x7C,     0x07, 0xFE, 0xFF, 0xFE},
  {"0.25 (E2M1 tie)",    0x3E800000u,   kNone, kNone,   kNone, kNone,   0x00, kNone, kNone, kNone},
  {"0.75 (E2M1 tie)",    0x3F400000u,   kNone, kNone,   kNone, kNone,   0x02, kNone, kNone, kNone},
  {"2.5 (E2M1 tie)",     0x40200000u,   kNone, kNone,   kNone, kNone,   0x04, kNone, kNone, kNone},
  {"5.0 (E2M1 tie)",     0x40A00000u,   kNone, kNone,   kNone, kNone,   0x06, kNone, kNone, kNone},
  {"5.01",               0x40A051ECu,   kNone, kNone,   kNone, kNone,   0x07, kNone, kNone, kNone},
};
// clang-format on

constexpr bool same(int expected, uint32_t got) { return expected == kNone || uint32_t(expected) == got; }

constexpr bool row_ok(const CudaRow& r) {
  return same(r.e4m3_sat, fmt::encode_e4m3_bits(r.bits, kSat)) &&
         same(r.e4m3_nosat, fmt::encode_e4m3_bits(r.bits, kNoSat)) &&
         same(r.e5m2_sat, fmt::encode_e5m2_bits(r.bits, kSat)) &&
         same(r.e5m2_nosat, fmt::encode_e5m2_bits(r.bits, kNoSat)) &&
         same(r.e2m1, fmt::encode_e2m1_bits(r.bits, kSat)) && same(r.e2m1, fmt::encode_e2m1_bits(r.bits, kNoSat)) &&
         same(r.e8m0_up_sat, fmt::encode_e8m0_bits(r.bits, E8M0Rounding::kUp, kSat)) &&
         same(r.e8m0_up_nosat, fmt::encode_e8m0_bits(r.bits, E8M0Rounding::kUp, kNoSat)) &&
         same(r.e8m0_down_sat, fmt::encode_e8m0_bits(r.bits, E8M0Rounding::kDown, kSat));
}

constexpr bool cuda_table_ok() {
  for (const auto& r : kCudaRows)
    if (!row_ok(r)) return false;
  return true;
}
static_assert(cuda_table_ok(), "an encoding differs from the CUDA table measured on an H200");

// E8M0 nearest (PyTorch / ml_dtypes, reference 2.8 prose): ties up on the linear value.
static_assert(fmt::encode_e8m0(1.5f, E8M0Rounding::kNearest) == 0x80, "1.5 -> 2");
static_assert(fmt::encode_e8m0(3.0f, E8M0Rounding::kNearest) == 0x81, "3 -> 4");
static_assert(fmt::encode_e8m0(1.25f, E8M0Rounding::kNearest) == 0x7F, "1.25 -> 1");
static_assert(fmt::encode_e8m0(0x1.8p127f, E8M0Rounding::kNearest, kNoSat) == 0xFF, "overflow -> NaN");
static_assert(fmt::encode_e8m0(0x1.8p127f, E8M0Rounding::kNearest, kSat) == 0xFE, "overflow -> 2^127");
static_assert(fmt::encode_e8m0(-1.0f) == 0x7F && fmt::encode_e8m0(0.0f) == 0x00, "sign ignored, 0 -> code 0");

std::string hex(uint32_t v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*X", digits, v);
  return buf;
}

void check_cell(const char* what, const CudaRow& r, int expected, uint32_t got) {
  if (expected == kNone) return;
  INFO(what << " of " << r.input << " (" << hex(r.bits, 8) << "): scalemm " << hex(got, 2) << ", CUDA on H200 "
            << hex(uint32_t(expected), 2));
  CHECK(got == uint32_t(expected));
}

}  // namespace

TEST_CASE("Every code of E4M3, E5M2, UE4M3, E8M0 and E2M1 decodes to its golden value", "[formats]") {
  int checked = 0;
  for (uint32_t c = 0; c < 256; ++c) {
    const auto b = uint8_t(c);
    INFO("code " << hex(c, 2));
    CHECK(fmt::float_bits(fmt::decode_e4m3(b)) == kE4M3Decode[c]);
    CHECK(fmt::float_bits(fmt::decode_e5m2(b)) == kE5M2Decode[c]);
    CHECK(fmt::decode_e8m0_bits(b) == kE8M0Decode[c]);
    CHECK(fmt::float_bits(fmt::decode_ue4m3(b)) == kE4M3Decode[c & 0x7F]);
    CHECK(fmt::float_bits(fmt::decode_e2m1(b)) == kE2M1Decode[c & 0xF]);
    ++checked;
  }
  // The NVFP4 table of the reference (section 2.4), written out by hand.
  const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int c = 0; c < 8; ++c) {
    CHECK(fmt::decode_e2m1(uint8_t(c)) == e2m1[c]);
    CHECK(fmt::float_bits(fmt::decode_e2m1(uint8_t(c | 8))) == (fmt::float_bits(e2m1[c]) | 0x80000000u));
  }
  CHECK(checked == 256);
}

TEST_CASE("Encodings match the CUDA conversions measured on an H200", "[formats]") {
  for (const auto& r : kCudaRows) {
    check_cell("E4M3 satfinite", r, r.e4m3_sat, fmt::encode_e4m3_bits(r.bits, kSat));
    check_cell("E4M3 non-saturating", r, r.e4m3_nosat, fmt::encode_e4m3_bits(r.bits, kNoSat));
    check_cell("E5M2 satfinite", r, r.e5m2_sat, fmt::encode_e5m2_bits(r.bits, kSat));
    check_cell("E5M2 non-saturating", r, r.e5m2_nosat, fmt::encode_e5m2_bits(r.bits, kNoSat));
    check_cell("E2M1 satfinite", r, r.e2m1, fmt::encode_e2m1_bits(r.bits, kSat));
    check_cell("E2M1 non-saturating", r, r.e2m1, fmt::encode_e2m1_bits(r.bits, kNoSat));
    check_cell("E8M0 up satfinite", r, r.e8m0_up_sat, fmt::encode_e8m0_bits(r.bits, E8M0Rounding::kUp, kSat));
    check_cell("E8M0 up non-saturating", r, r.e8m0_up_nosat,
               fmt::encode_e8m0_bits(r.bits, E8M0Rounding::kUp, kNoSat));
    check_cell("E8M0 down satfinite", r, r.e8m0_down_sat,
               fmt::encode_e8m0_bits(r.bits, E8M0Rounding::kDown, kSat));
  }
}

TEST_CASE("Encoding a decoded code gives the code back in both saturation modes", "[formats]") {
  for (Saturation s : {kSat, kNoSat}) {
    INFO((s == kSat ? "satfinite" : "non-saturating"));
    for (uint32_t c = 0; c < 256; ++c) {
      const auto b = uint8_t(c);
      INFO("code " << hex(c, 2));
      // E4M3: the two NaN codes come back as the canonical 0x7F.
      const bool e4m3_nan = (c & 0x7F) == 0x7F;
      CHECK(fmt::encode_e4m3(fmt::decode_e4m3(b), s) == (e4m3_nan ? 0x7F : b));
      // E5M2: NaN codes -> 0x7F; Inf -> Inf (non-saturating) or +-max (satfinite).
      const uint32_t m = c & 0x7F;
      uint8_t e5m2 = b;
      if (m > 0x7C) e5m2 = 0x7F;
      if (m == 0x7C && s == kSat) e5m2 = uint8_t((c & 0x80) | 0x7B);
      CHECK(fmt::encode_e5m2(fmt::decode_e5m2(b), s) == e5m2);
      // UE4M3: codes 0x00-0x7E are their own encoding; 0x7F is NaN.
      if (c < 0x80) CHECK(fmt::encode_ue4m3(fmt::decode_ue4m3(b), s) == b);
      // E2M1: all 16 codes.
      if (c < 16) CHECK(fmt::encode_e2m1(fmt::decode_e2m1(b), s) == b);
      // E8M0: every rounding gives a power of two back unchanged; NaN stays NaN.
      for (E8M0Rounding r : {E8M0Rounding::kUp, E8M0Rounding::kDown, E8M0Rounding::kNearest})
        CHECK(fmt::encode_e8m0(fmt::decode_e8m0(b), r, s) == b);
    }
    int bf16_bad = 0, f16_bad = 0;
    for (uint32_t c = 0; c < 65536; ++c) {
      const auto h = uint16_t(c);
      const uint32_t sign = c & 0x8000u, mag = c & 0x7FFFu;
      uint32_t bf16 = c, f16 = c;
      if (mag > 0x7F80u) bf16 = sign | 0x7FC0u;
      if (mag == 0x7F80u && s == kSat) bf16 = sign | 0x7F7Fu;
      if (mag > 0x7C00u) f16 = sign | 0x7E00u;
      if (mag == 0x7C00u && s == kSat) f16 = sign | 0x7BFFu;
      bf16_bad += fmt::encode_bf16(fmt::decode_bf16(h), s) != bf16;
      f16_bad += fmt::encode_f16(fmt::decode_f16(h), s) != f16;
    }
    CHECK(bf16_bad == 0);
    CHECK(f16_bad == 0);
  }
}

TEST_CASE("FP4 packing puts element 2j in the low nibble of byte j", "[formats]") {
  uint8_t packed[3] = {0xAA, 0xAA, 0xAA};
  const uint8_t values[6] = {0x1, 0xF, 0x7, 0x8, 0x0, 0x5};
  for (int i = 0; i < 6; ++i) fmt::set_e2m1(packed, i, values[i]);
  CHECK(packed[0] == 0xF1);
  CHECK(packed[1] == 0x87);
  CHECK(packed[2] == 0x50);
  for (int i = 0; i < 6; ++i) CHECK(fmt::get_e2m1(packed, i) == values[i]);
  fmt::set_e2m1(packed, 3, 0x2);  // the neighbour nibble is kept
  CHECK(packed[1] == 0x27);
}

namespace {

/// For x in [0, max] (float32 bits from 0 to max_bits, every stride-th pattern plus each exact value
/// and its neighbours), the code must be the nearest one, with ties to the even code; the negative
/// input must give the same code with the sign bit. Independent of any oracle: only decode is used.
template <class Encode, class Decode>
uint64_t check_nearest(const char* what, Encode encode, Decode decode, uint32_t max_code, uint32_t sign_bit,
                       uint32_t stride) {
  const uint32_t max_bits = fmt::float_bits(float(decode(max_code)));
  uint64_t bad = 0, checked = 0;
  auto check = [&](uint32_t xb) {
    const double x = double(fmt::bits_float(xb));
    const uint32_t c = encode(xb);
    ++checked;
    bool ok = c <= max_code && encode(xb | 0x80000000u) == (c | sign_bit);
    if (ok) {
      const double d = std::fabs(x - double(decode(c)));
      const double below = c > 0 ? std::fabs(x - double(decode(c - 1))) : INFINITY;
      const double above = c < max_code ? std::fabs(x - double(decode(c + 1))) : INFINITY;
      ok = d <= below && d <= above && !((d == below || d == above) && (c & 1u));
    }
    if (!ok && bad++ < 8) {
      INFO(what << ": input " << hex(xb, 8) << " -> code " << hex(c, 4) << " is not the nearest, ties to even");
      CHECK(ok);
    }
  };
  for (uint64_t b = 0; b <= max_bits; b += stride) check(uint32_t(b));
  for (uint32_t c = 0; c <= max_code; ++c) {  // every value, and the float32 patterns around it
    const uint32_t vb = fmt::float_bits(float(decode(c)));
    for (uint32_t xb : {vb, vb + 1, vb - 1})
      if (xb <= max_bits) check(xb);
  }
  std::printf("%s: %llu float32 inputs checked for nearest-even, %llu wrong\n", what, (unsigned long long)checked,
              (unsigned long long)bad);
  return bad;
}

}  // namespace

TEST_CASE("Every encoding within range is the nearest code with ties to even on a sweep of float32",
          "[formats]") {
  for (Saturation s : {kSat, kNoSat}) {
    CHECK(check_nearest("E4M3", [s](uint32_t x) { return uint32_t(fmt::encode_e4m3_bits(x, s)); },
                        [](uint32_t c) { return fmt::decode_e4m3(uint8_t(c)); }, 0x7E, 0x80, 251) == 0);
    CHECK(check_nearest("E5M2", [s](uint32_t x) { return uint32_t(fmt::encode_e5m2_bits(x, s)); },
                        [](uint32_t c) { return fmt::decode_e5m2(uint8_t(c)); }, 0x7B, 0x80, 251) == 0);
    CHECK(check_nearest("E2M1", [s](uint32_t x) { return uint32_t(fmt::encode_e2m1_bits(x, s)); },
                        [](uint32_t c) { return fmt::decode_e2m1(uint8_t(c)); }, 0x7, 0x8, 251) == 0);
    CHECK(check_nearest("BF16", [s](uint32_t x) { return uint32_t(fmt::encode_bf16_bits(x, s)); },
                        [](uint32_t c) { return fmt::decode_bf16(uint16_t(c)); }, 0x7F7F, 0x8000, 1021) == 0);
    CHECK(check_nearest("FP16", [s](uint32_t x) { return uint32_t(fmt::encode_f16_bits(x, s)); },
                        [](uint32_t c) { return fmt::decode_f16(uint16_t(c)); }, 0x7BFF, 0x8000, 251) == 0);
  }
}
