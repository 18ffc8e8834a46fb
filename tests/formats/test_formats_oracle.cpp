// scalemm's codecs against an independent oracle, byte for byte: ml_dtypes (FP8, FP4, E8M0 nearest,
// BF16), numpy (FP16) and exact math (E8M0 up/down), computed by tests/formats/oracle.py over every
// code value, every midpoint between adjacent codes, +-1 ulp around each, the special values and
// 10^6 seeded random float32 bit patterns. The CTest fixture 'formats_oracle' writes the file and
// passes its path in SCALEMM_FORMATS_ORACLE. Each accepted difference is a named rule below, and
// docs/numerics.md ("Where implementations disagree and what scalemm chose") names the same ones.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdio>
#include <string>

#include "oracle_file.hpp"
#include "scalemm/formats.hpp"
#include "support/test_support.hpp"
#include "tally.hpp"

namespace fmt = scalemm::formats;
using fmt::E8M0Rounding;
using fmt::Saturation;
using scalemm_test_oracle::OracleFile;
using scalemm_test_tally::by_rule;
using scalemm_test_tally::Expected;
using scalemm_test_tally::is_nan_f32;
using scalemm_test_tally::reference;
using scalemm_test_tally::Tally;

namespace {

constexpr const char* kRuleE4M3Nan =
    "input is NaN: scalemm writes the canonical NaN 0x7F like CUDA's cvt; ml_dtypes keeps the sign (0xFF)";
constexpr const char* kRuleE5M2Nan =
    "input is NaN: scalemm writes the canonical NaN 0x7F like CUDA's cvt; ml_dtypes writes 0x7E with the "
    "input's sign (0x7E/0xFE)";
constexpr const char* kRuleE2M1Nan =
    "input is NaN: E2M1 has no NaN; scalemm writes +6 (0x7) like CUDA's __nv_cvt_float_to_fp4; ml_dtypes "
    "writes a zero (0x8 for +NaN, 0x0 for -NaN)";
constexpr const char* kRuleE8M0Zero =
    "input is +-0: scalemm writes code 0 (2^-127) like CUDA's cvt and PyTorch; ml_dtypes writes NaN 0xFF";
constexpr const char* kRuleE8M0Negative =
    "input is negative: scalemm encodes |x| (a scale's sign is ignored, like CUDA's cvt); ml_dtypes writes "
    "NaN 0xFF";
constexpr const char* kRuleE8M0Subnormal =
    "kNearest, |x| in (2^-127, 1.5*2^-127), float32 bits 0x00400001-0x005FFFFF: scalemm rounds to the nearest "
    "power of two on the linear value, code 0; ml_dtypes (and PyTorch) round up to code 1";
constexpr const char* kRuleF16Nan =
    "input is NaN: scalemm writes the quiet NaN 0x7E00 with the input's sign; numpy keeps the top 10 payload "
    "bits (0x7F800001 -> 0x7C01, a signalling NaN)";
constexpr const char* kRuleF16DecodeNan =
    "code is an FP16 NaN: scalemm decodes to the quiet NaN 0x7FC00000 with the code's sign; numpy keeps the "
    "payload (0x7C01 -> 0x7F802000)";

constexpr Saturation kSat = Saturation::kSatFinite;
constexpr Saturation kNoSat = Saturation::kNonSaturating;

const OracleFile& oracle() {
  const OracleFile& o = OracleFile::from_environment();
  static bool printed = false;
  if (!printed) {
    printed = true;
    std::printf("formats oracle: %s, seed %llu (replay with SCALEMM_TEST_SEED=%llu), %llu inputs\n",
                o.path().c_str(), (unsigned long long)o.seed(), (unsigned long long)o.seed(),
                (unsigned long long)o.count("input"));
  }
  return o;
}

/// Compares scalemm's encoding of every oracle input with one oracle column.
template <class T, class Encode, class Expect>
void compare(const char* what, const char* column, int digits, Encode encode, Expect expect) {
  const OracleFile& o = oracle();
  const uint64_t n = o.count("input");
  const uint32_t* in = o.get<uint32_t>("input", n);
  const T* ref = o.get<T>(column, n);
  Tally t(what, std::string("oracle '") + column + "'", digits);
  for (uint64_t i = 0; i < n; ++i) t.add(in[i], encode(in[i]), ref[i], expect(in[i], ref[i], i));
  t.print();
  INFO(t.report());
  CHECK(t.mismatches() == 0);
}

Expected plain(uint32_t, uint32_t ref, uint64_t) { return reference(ref); }

/// Compares scalemm's decoding of every code with an oracle decode table (float32 bits).
template <class Decode, class Expect>
void compare_decode(const char* what, const char* column, uint32_t ncodes, Decode decode, Expect expect) {
  const OracleFile& o = oracle();
  const uint32_t* ref = o.get<uint32_t>(column, ncodes);
  Tally t(what, std::string("oracle '") + column + "'", 8);
  for (uint32_t c = 0; c < ncodes; ++c) t.add(c, decode(c), ref[c], expect(c, ref[c]));
  t.print();
  INFO(t.report());
  CHECK(t.mismatches() == 0);
}

Expected plain_decode(uint32_t, uint32_t ref) { return reference(ref); }

}  // namespace

TEST_CASE("The oracle file holds every boundary input and 10^6 seeded random floats with specials",
          "[formats][oracle]") {
  const OracleFile& o = oracle();
  const uint64_t n = o.count("input");
  const uint32_t* in = o.get<uint32_t>("input", n);
  const uint8_t* kind = o.get<uint8_t>("kind", n);
  uint64_t random = 0, nan = 0, inf = 0, zero = 0, subnormal = 0, huge = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t a = in[i] & 0x7FFFFFFFu;
    random += kind[i] == 1;
    nan += a > 0x7F800000u;
    inf += a == 0x7F800000u;
    zero += a == 0;
    subnormal += a != 0 && a < 0x00800000u;
    huge += a >= 0x7E000000u && a < 0x7F800000u;
  }
  std::printf("formats oracle inputs: %llu boundary, %llu random; NaN %llu, Inf %llu, zero %llu, subnormal %llu, "
              "huge %llu\n",
              (unsigned long long)(n - random), (unsigned long long)random, (unsigned long long)nan,
              (unsigned long long)inf, (unsigned long long)zero, (unsigned long long)subnormal,
              (unsigned long long)huge);
  CHECK(random == 1000000);
  CHECK(n - random > 100000);
  CHECK(nan > 1000);
  CHECK(inf > 100);
  CHECK(zero > 100);
  CHECK(subnormal > 1000);
  CHECK(huge > 1000);
}

TEST_CASE("Every code decodes exactly as ml_dtypes and numpy decode it", "[formats][oracle]") {
  compare_decode("E4M3 decode", "decode.e4m3", 256, [](uint32_t c) { return fmt::float_bits(fmt::decode_e4m3(uint8_t(c))); },
                 plain_decode);
  compare_decode("E5M2 decode", "decode.e5m2", 256, [](uint32_t c) { return fmt::float_bits(fmt::decode_e5m2(uint8_t(c))); },
                 plain_decode);
  compare_decode("E2M1 decode", "decode.e2m1", 16, [](uint32_t c) { return fmt::float_bits(fmt::decode_e2m1(uint8_t(c))); },
                 plain_decode);
  compare_decode("E8M0 decode", "decode.e8m0", 256, [](uint32_t c) { return fmt::decode_e8m0_bits(uint8_t(c)); },
                 plain_decode);
  compare_decode("BF16 decode", "decode.bf16", 65536,
                 [](uint32_t c) { return fmt::float_bits(fmt::decode_bf16(uint16_t(c))); }, plain_decode);
  compare_decode("FP16 decode", "decode.f16", 65536,
                 [](uint32_t c) { return fmt::float_bits(fmt::decode_f16(uint16_t(c))); },
                 [](uint32_t c, uint32_t ref) {
                   if ((c & 0x7FFFu) > 0x7C00u) return by_rule((c & 0x8000u) << 16 | 0x7FC00000u, kRuleF16DecodeNan);
                   return reference(ref);
                 });
  // UE4M3 ignores bit 7: every code decodes as E4M3 of its low 7 bits.
  const uint32_t* e4m3 = oracle().get<uint32_t>("decode.e4m3", 256);
  Tally t("UE4M3 decode", "oracle 'decode.e4m3' of code & 0x7F", 8);
  for (uint32_t c = 0; c < 256; ++c)
    t.add(c, fmt::float_bits(fmt::decode_ue4m3(uint8_t(c))), e4m3[c & 0x7F], reference(e4m3[c & 0x7F]));
  t.print();
  CHECK(t.mismatches() == 0);
}

TEST_CASE("E4M3 encodings match ml_dtypes byte for byte in both saturation modes", "[formats][oracle]") {
  auto expect = [](uint32_t x, uint32_t ref, uint64_t) {
    return is_nan_f32(x) ? by_rule(0x7F, kRuleE4M3Nan) : reference(ref);
  };
  compare<uint8_t>("E4M3 satfinite", "e4m3.sat", 2, [](uint32_t x) { return fmt::encode_e4m3_bits(x, kSat); }, expect);
  compare<uint8_t>("E4M3 non-saturating", "e4m3.nosat", 2, [](uint32_t x) { return fmt::encode_e4m3_bits(x, kNoSat); },
                   expect);
}

TEST_CASE("E5M2 encodings match ml_dtypes byte for byte in both saturation modes", "[formats][oracle]") {
  auto expect = [](uint32_t x, uint32_t ref, uint64_t) {
    return is_nan_f32(x) ? by_rule(0x7F, kRuleE5M2Nan) : reference(ref);
  };
  compare<uint8_t>("E5M2 satfinite", "e5m2.sat", 2, [](uint32_t x) { return fmt::encode_e5m2_bits(x, kSat); }, expect);
  compare<uint8_t>("E5M2 non-saturating", "e5m2.nosat", 2, [](uint32_t x) { return fmt::encode_e5m2_bits(x, kNoSat); },
                   expect);
}

TEST_CASE("E2M1 encodings match ml_dtypes byte for byte in both saturation modes", "[formats][oracle]") {
  auto expect = [](uint32_t x, uint32_t ref, uint64_t) {
    return is_nan_f32(x) ? by_rule(0x7, kRuleE2M1Nan) : reference(ref);
  };
  compare<uint8_t>("E2M1 satfinite", "e2m1.sat", 1, [](uint32_t x) { return fmt::encode_e2m1_bits(x, kSat); }, expect);
  compare<uint8_t>("E2M1 non-saturating", "e2m1.nosat", 1, [](uint32_t x) { return fmt::encode_e2m1_bits(x, kNoSat); },
                   expect);
}

TEST_CASE("UE4M3 encodings match ml_dtypes E4M3 on the non-negative range in both saturation modes",
          "[formats][oracle]") {
  compare<uint8_t>("UE4M3 satfinite", "ue4m3.sat", 2, [](uint32_t x) { return fmt::encode_ue4m3_bits(x, kSat); }, plain);
  compare<uint8_t>("UE4M3 non-saturating", "ue4m3.nosat", 2,
                   [](uint32_t x) { return fmt::encode_ue4m3_bits(x, kNoSat); }, plain);
}

TEST_CASE("E8M0 nearest matches ml_dtypes and E8M0 up and down match exact ceil and floor of log2",
          "[formats][oracle]") {
  const OracleFile& o = oracle();
  const uint64_t n = o.count("input");
  for (Saturation s : {kSat, kNoSat}) {
    const bool sat = s == kSat;
    const uint8_t* abs_ref = o.get<uint8_t>(sat ? "e8m0.nearest.sat.abs" : "e8m0.nearest.nosat.abs", n);
    auto expect = [abs_ref](uint32_t x, uint32_t ref, uint64_t i) {
      const uint32_t a = x & 0x7FFFFFFFu;
      if (is_nan_f32(x)) return reference(ref);
      if (a == 0) return by_rule(0x00, kRuleE8M0Zero);
      if (a > 0x00400000u && a < 0x00600000u) return by_rule(0x00, kRuleE8M0Subnormal);
      if (x >> 31) return by_rule(abs_ref[i], kRuleE8M0Negative);
      return reference(ref);
    };
    compare<uint8_t>(sat ? "E8M0 nearest satfinite" : "E8M0 nearest non-saturating",
                     sat ? "e8m0.nearest.sat" : "e8m0.nearest.nosat", 2,
                     [s](uint32_t x) { return fmt::encode_e8m0_bits(x, E8M0Rounding::kNearest, s); }, expect);
    compare<uint8_t>(sat ? "E8M0 up satfinite" : "E8M0 up non-saturating", sat ? "e8m0.up.sat" : "e8m0.up.nosat", 2,
                     [s](uint32_t x) { return fmt::encode_e8m0_bits(x, E8M0Rounding::kUp, s); }, plain);
    compare<uint8_t>(sat ? "E8M0 down satfinite" : "E8M0 down non-saturating",
                     sat ? "e8m0.down.sat" : "e8m0.down.nosat", 2,
                     [s](uint32_t x) { return fmt::encode_e8m0_bits(x, E8M0Rounding::kDown, s); }, plain);
  }
}

TEST_CASE("BF16 and FP16 encodings match ml_dtypes and numpy in both saturation modes", "[formats][oracle]") {
  auto f16_expect = [](uint32_t x, uint32_t ref, uint64_t) {
    return is_nan_f32(x) ? by_rule(((x >> 16) & 0x8000u) | 0x7E00u, kRuleF16Nan) : reference(ref);
  };
  compare<uint16_t>("BF16 satfinite", "bf16.sat", 4, [](uint32_t x) { return fmt::encode_bf16_bits(x, kSat); }, plain);
  compare<uint16_t>("BF16 non-saturating", "bf16.nosat", 4, [](uint32_t x) { return fmt::encode_bf16_bits(x, kNoSat); },
                    plain);
  compare<uint16_t>("FP16 satfinite", "f16.sat", 4, [](uint32_t x) { return fmt::encode_f16_bits(x, kSat); },
                    f16_expect);
  compare<uint16_t>("FP16 non-saturating", "f16.nosat", 4, [](uint32_t x) { return fmt::encode_f16_bits(x, kNoSat); },
                    f16_expect);
}
