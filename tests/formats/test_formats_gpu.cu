// scalemm's codecs against CUDA's own conversions (cuda_fp8.h, cuda_fp4.h, cuda_bf16.h,
// cuda_fp16.h) over every boundary input and 10^6 seeded random float32 bit patterns, and every
// code's decode:
//   [gpu]  scalemm's device-compiled codecs and CUDA's device conversions (hardware cvt where the
//          header uses it) run in one kernel; results are compared on the host.
//   host   the same comparison against the CUDA headers' host emulation, so that a machine without a
//          GPU checks the same table.
// Every accepted difference is a named rule; docs/numerics.md names the same ones.
#include <catch2/catch.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "scalemm/formats.hpp"
#include "support/test_support.hpp"
#include "tally.hpp"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/detail/device_buffer.hpp"

namespace fmt = scalemm::formats;
using fmt::E8M0Rounding;
using fmt::Saturation;
using scalemm_test_tally::by_rule;
using scalemm_test_tally::Expected;
using scalemm_test_tally::is_nan_f32;
using scalemm_test_tally::reference;
using scalemm_test_tally::Tally;

namespace {

// ---- the conversions compared, one column each ---------------------------------------------------

enum Column : int {
  kE4M3Sat,
  kE4M3NoSat,
  kE5M2Sat,
  kE5M2NoSat,
  kE2M1Sat,    // CUDA: __nv_cvt_float_to_fp4 (cudaRoundNearest; always saturating)
  kE2M1NoSat,  // scalemm's non-saturating E2M1 also saturates (no Inf/NaN codes): same CUDA call
  kUE4M3Sat,   // CUDA has no unsigned E4M3: compared with E4M3 satfinite
  kE8M0UpSat,
  kE8M0UpNoSat,
  kE8M0DownSat,
  kE8M0DownNoSat,
  kBF16,  // round to nearest even, non-saturating: __float2bfloat16_rn
  kF16,   // __float2half_rn
  kNumColumns
};

const char* const kColumnNames[kNumColumns] = {
    "E4M3 satfinite",        "E4M3 non-saturating",  "E5M2 satfinite",          "E5M2 non-saturating",
    "E2M1 satfinite",        "E2M1 non-saturating",  "UE4M3 satfinite",         "E8M0 up satfinite",
    "E8M0 up non-saturating", "E8M0 down satfinite", "E8M0 down non-saturating", "BF16 non-saturating",
    "FP16 non-saturating"};
const int kColumnDigits[kNumColumns] = {2, 2, 2, 2, 1, 1, 2, 2, 2, 2, 2, 4, 4};

__host__ __device__ inline float as_float(uint32_t u) { return fmt::bits_float(u); }

__host__ __device__ inline void cuda_encode(uint32_t x, uint16_t* out) {
  const float f = as_float(x);
  out[kE4M3Sat] = __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
  out[kE4M3NoSat] = __nv_cvt_float_to_fp8(f, __NV_NOSAT, __NV_E4M3);
  out[kE5M2Sat] = __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E5M2);
  out[kE5M2NoSat] = __nv_cvt_float_to_fp8(f, __NV_NOSAT, __NV_E5M2);
  out[kE2M1Sat] = __nv_cvt_float_to_fp4(f, __NV_E2M1, cudaRoundNearest);
  out[kE2M1NoSat] = out[kE2M1Sat];
  out[kUE4M3Sat] = out[kE4M3Sat];
  out[kE8M0UpSat] = __nv_cvt_float_to_e8m0(f, __NV_SATFINITE, cudaRoundPosInf);
  out[kE8M0UpNoSat] = __nv_cvt_float_to_e8m0(f, __NV_NOSAT, cudaRoundPosInf);
  out[kE8M0DownSat] = __nv_cvt_float_to_e8m0(f, __NV_SATFINITE, cudaRoundZero);
  out[kE8M0DownNoSat] = __nv_cvt_float_to_e8m0(f, __NV_NOSAT, cudaRoundZero);
  out[kBF16] = static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(f)).x;
  out[kF16] = static_cast<__half_raw>(__float2half_rn(f)).x;
}

__host__ __device__ inline void scalemm_encode(uint32_t x, uint16_t* out) {
  constexpr Saturation kSat = Saturation::kSatFinite, kNoSat = Saturation::kNonSaturating;
  out[kE4M3Sat] = fmt::encode_e4m3_bits(x, kSat);
  out[kE4M3NoSat] = fmt::encode_e4m3_bits(x, kNoSat);
  out[kE5M2Sat] = fmt::encode_e5m2_bits(x, kSat);
  out[kE5M2NoSat] = fmt::encode_e5m2_bits(x, kNoSat);
  out[kE2M1Sat] = fmt::encode_e2m1_bits(x, kSat);
  out[kE2M1NoSat] = fmt::encode_e2m1_bits(x, kNoSat);
  out[kUE4M3Sat] = fmt::encode_ue4m3_bits(x, kSat);
  out[kE8M0UpSat] = fmt::encode_e8m0_bits(x, E8M0Rounding::kUp, kSat);
  out[kE8M0UpNoSat] = fmt::encode_e8m0_bits(x, E8M0Rounding::kUp, kNoSat);
  out[kE8M0DownSat] = fmt::encode_e8m0_bits(x, E8M0Rounding::kDown, kSat);
  out[kE8M0DownNoSat] = fmt::encode_e8m0_bits(x, E8M0Rounding::kDown, kNoSat);
  out[kBF16] = fmt::encode_bf16_bits(x, kNoSat);
  out[kF16] = fmt::encode_f16_bits(x, kNoSat);
}

// ---- decodes: float32 bits of every code ---------------------------------------------------------

enum DecodeColumn : int { kDecE4M3, kDecE5M2, kDecE2M1, kDecE8M0, kDecUE4M3, kDecBF16, kDecF16, kNumDecode };
const char* const kDecodeNames[kNumDecode] = {"E4M3 decode",  "E5M2 decode",  "E2M1 decode", "E8M0 decode",
                                              "UE4M3 decode", "BF16 decode", "FP16 decode"};
const uint32_t kDecodeCodes[kNumDecode] = {256, 256, 16, 256, 256, 65536, 65536};

__host__ __device__ inline uint32_t half_raw_to_f32_bits(__half_raw h) {
  return fmt::float_bits(__half2float(__half(h)));
}

__host__ __device__ inline void cuda_decode(uint32_t c, uint32_t* out) {
  const auto b = __nv_fp8_storage_t(c & 0xFF);
  out[kDecE4M3] = half_raw_to_f32_bits(__nv_cvt_fp8_to_halfraw(b, __NV_E4M3));
  out[kDecE5M2] = half_raw_to_f32_bits(__nv_cvt_fp8_to_halfraw(b, __NV_E5M2));
  out[kDecE2M1] = half_raw_to_f32_bits(__nv_cvt_fp4_to_halfraw(__nv_fp4_storage_t(c & 0xF), __NV_E2M1));
  out[kDecE8M0] = uint32_t(__nv_cvt_e8m0_to_bf16raw(b).x) << 16;
  out[kDecUE4M3] = half_raw_to_f32_bits(__nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(c & 0x7F), __NV_E4M3));
  __nv_bfloat16_raw braw;
  braw.x = uint16_t(c);
  out[kDecBF16] = fmt::float_bits(__bfloat162float(__nv_bfloat16(braw)));
  __half_raw hraw;
  hraw.x = uint16_t(c);
  out[kDecF16] = fmt::float_bits(__half2float(__half(hraw)));
}

__host__ __device__ inline void scalemm_decode(uint32_t c, uint32_t* out) {
  out[kDecE4M3] = fmt::float_bits(fmt::decode_e4m3(uint8_t(c)));
  out[kDecE5M2] = fmt::float_bits(fmt::decode_e5m2(uint8_t(c)));
  out[kDecE2M1] = fmt::float_bits(fmt::decode_e2m1(uint8_t(c & 0xF)));
  out[kDecE8M0] = fmt::decode_e8m0_bits(uint8_t(c));
  out[kDecUE4M3] = fmt::float_bits(fmt::decode_ue4m3(uint8_t(c)));
  out[kDecBF16] = fmt::float_bits(fmt::decode_bf16(uint16_t(c)));
  out[kDecF16] = fmt::float_bits(fmt::decode_f16(uint16_t(c)));
}

__global__ void encode_kernel(const uint32_t* in, size_t n, uint16_t* cuda, uint16_t* ours) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    cuda_encode(in[i], cuda + i * kNumColumns);
    scalemm_encode(in[i], ours + i * kNumColumns);
  }
}

__global__ void decode_kernel(uint32_t* cuda, uint32_t* ours) {
  const uint32_t c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c < 65536) {
    cuda_decode(c, cuda + size_t(c) * kNumDecode);
    scalemm_decode(c, ours + size_t(c) * kNumDecode);
  }
}

// ---- the named differences from CUDA ---------------------------------------------------------------

constexpr const char* kRuleUE4M3Negative =
    "UE4M3, input negative (not NaN): UE4M3 has no sign; scalemm satfinite writes 0x00. CUDA has no unsigned "
    "E4M3 conversion; its signed E4M3 writes the negative code";
constexpr const char* kRule16BitNan =
    "BF16/FP16, input is NaN: scalemm writes the quiet NaN with the input's sign (BF16 0x7FC0/0xFFC0 as "
    "ml_dtypes, FP16 0x7E00/0xFE00); CUDA writes its canonical NaN 0x7FFF";
constexpr const char* kRuleDecodeNan =
    "decode of an E4M3, E5M2, UE4M3, E8M0 or FP16 NaN code: scalemm returns the float32 quiet NaN 0x7FC00000 "
    "with the code's sign; CUDA's decode returns its canonical NaN (half or bfloat16 0x7FFF, so float32 "
    "0x7FFFFFFF or 0x7FFF0000), sign dropped";

bool is_nan16(uint32_t h, int column) {
  return column == kBF16 ? (h & 0x7FFFu) > 0x7F80u : (h & 0x7FFFu) > 0x7C00u;
}

Expected expect_encode(int column, uint32_t x, uint32_t cuda) {
  switch (column) {
    case kUE4M3Sat:
      if ((x >> 31) && !is_nan_f32(x)) return by_rule(0x00, kRuleUE4M3Negative);
      break;
    case kBF16:
      if (is_nan_f32(x) && is_nan16(cuda, column)) return by_rule(((x >> 16) & 0x8000u) | 0x7FC0u, kRule16BitNan);
      break;
    case kF16:
      if (is_nan_f32(x) && is_nan16(cuda, column)) return by_rule(((x >> 16) & 0x8000u) | 0x7E00u, kRule16BitNan);
      break;
    default:
      break;
  }
  return reference(cuda);
}

/// Sign of the float32 NaN that scalemm decodes a NaN code to: the code's sign bit where the
/// format has one (UE4M3 and E8M0 decode to +NaN).
uint32_t decode_nan_sign(int column, uint32_t c) {
  switch (column) {
    case kDecE4M3:
    case kDecE5M2: return (c >> 7) & 1u;
    case kDecBF16:
    case kDecF16: return (c >> 15) & 1u;
    default: return 0;
  }
}

Expected expect_decode(int column, uint32_t c, uint32_t cuda) {
  // Only where CUDA's result is a NaN too: a NaN against a number stays a mismatch. BF16 decodes are
  // bit shifts on both sides, payload included, and are compared exactly.
  if (column != kDecBF16 && is_nan_f32(cuda)) return by_rule((decode_nan_sign(column, c) << 31) | 0x7FC00000u, kRuleDecodeNan);
  return reference(cuda);
}

uint64_t compare_encodings(const std::string& reference_name, const std::vector<uint32_t>& in,
                           const std::vector<uint16_t>& cuda, const std::vector<uint16_t>& ours) {
  uint64_t bad = 0;
  for (int col = 0; col < kNumColumns; ++col) {
    Tally t(kColumnNames[col], reference_name, kColumnDigits[col]);
    for (size_t i = 0; i < in.size(); ++i) {
      const uint32_t c = cuda[i * kNumColumns + col], o = ours[i * kNumColumns + col];
      t.add(in[i], o, c, expect_encode(col, in[i], c));
    }
    t.print();
    INFO(t.report());
    CHECK(t.mismatches() == 0);
    bad += t.mismatches();
  }
  return bad;
}

uint64_t compare_decodes(const std::string& reference_name, const std::vector<uint32_t>& cuda,
                         const std::vector<uint32_t>& ours) {
  uint64_t bad = 0;
  for (int col = 0; col < kNumDecode; ++col) {
    Tally t(kDecodeNames[col], reference_name, 8);
    for (uint32_t c = 0; c < kDecodeCodes[col]; ++c) {
      const uint32_t r = cuda[size_t(c) * kNumDecode + col], o = ours[size_t(c) * kNumDecode + col];
      t.add(c, o, r, expect_decode(col, c, r));
    }
    t.print();
    INFO(t.report());
    CHECK(t.mismatches() == 0);
    bad += t.mismatches();
  }
  return bad;
}

// ---- inputs: every boundary of every format, specials, and 10^6 seeded random floats ------------

void add_ladder(std::vector<uint32_t>& out, std::vector<double> values, double next_above_max) {
  values.push_back(next_above_max);
  for (size_t i = 0; i + 1 < values.size(); ++i) {
    const float v = float(values[i]);
    const float mid = float((values[i] + values[i + 1]) / 2);  // exact: one more mantissa bit
    for (float p : {v, mid})
      for (float q : {p, std::nextafter(p, INFINITY), std::nextafter(p, -INFINITY)}) {
        out.push_back(fmt::float_bits(q));
        out.push_back(fmt::float_bits(q) ^ 0x80000000u);
      }
  }
}

template <class Decode>
std::vector<double> code_values(uint32_t first, uint32_t last, Decode decode) {
  std::vector<double> v;
  for (uint32_t c = first; c <= last; ++c) v.push_back(double(decode(c)));
  return v;
}

std::vector<uint32_t> make_inputs(uint64_t random_count) {
  std::vector<uint32_t> in;
  add_ladder(in, code_values(0x00, 0x7E, [](uint32_t c) { return fmt::decode_e4m3(uint8_t(c)); }), 480.0);
  add_ladder(in, code_values(0x00, 0x7B, [](uint32_t c) { return fmt::decode_e5m2(uint8_t(c)); }), 65536.0);
  add_ladder(in, code_values(0x0, 0x7, [](uint32_t c) { return fmt::decode_e2m1(uint8_t(c)); }), 8.0);
  add_ladder(in, code_values(0x0000, 0x7F7F, [](uint32_t c) { return fmt::decode_bf16(uint16_t(c)); }),
             std::ldexp(1.0, 128));
  add_ladder(in, code_values(0x0000, 0x7BFF, [](uint32_t c) { return fmt::decode_f16(uint16_t(c)); }), 65536.0);
  for (int k = -127; k <= 127; ++k)
    for (double m : {1.0, 1.25, 1.5}) {
      const float p = float(std::ldexp(m, k));
      for (float q : {p, std::nextafter(p, INFINITY), std::nextafter(p, -INFINITY)}) {
        in.push_back(fmt::float_bits(q));
        in.push_back(fmt::float_bits(q) ^ 0x80000000u);
      }
    }
  const uint32_t specials[] = {
      0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u,
      0x7FFFFFFFu, 0xFFFFFFFFu, 0x7FA00000u, 0x7FBFFFFFu, 0x7FC00001u, 0xFFA5A5A5u, 0x00000001u, 0x80000001u,
      0x007FFFFFu, 0x807FFFFFu, 0x00400000u, 0x00400001u, 0x003FFFFFu, 0x00600000u, 0x005FFFFFu, 0x00600001u,
      0x00800000u, 0x80800000u, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x7F000000u, 0x7F000001u, 0x7F400000u, 0x7EFFFFFFu,
      0x3A800000u, 0x43E00000u, 0x43E80000u, 0x43E80001u, 0x43E88000u, 0x43EF8000u, 0x47700000u, 0x3E800000u,
      0x3F400000u, 0x40200000u, 0x40A00000u, 0x40A051ECu};
  in.insert(in.end(), std::begin(specials), std::end(specials));

  // Random: 30% uniform bits, 55% in the formats' range with mantissas truncated to hit ties, 15%
  // specials (NaN payloads, +-Inf, +-0, subnormals, huge, tiny).
  auto rng = scalemm::testing::rng(0xF0F0C0DEull);
  std::uniform_int_distribution<uint32_t> u32;
  for (uint64_t i = 0; i < random_count; ++i) {
    const uint32_t r = u32(rng), s = u32(rng) & 0x80000000u, man = u32(rng) & 0x7FFFFFu;
    const uint32_t pick = u32(rng) % 100;
    uint32_t x;
    if (pick < 30) {
      x = r;
    } else if (pick < 85) {
      const uint32_t e = 127 - 30 + r % 51;
      uint32_t m = man;
      if (u32(rng) % 100 < 35) m &= ~((1u << (23 - u32(rng) % 14)) - 1) & 0x7FFFFFu;
      x = s | (e << 23) | m;
    } else {
      switch (r % 6) {
        case 0: x = s | 0x7F800000u | (man ? man : 1u); break;        // NaN, random payload
        case 1: x = s | ((man & 1) ? 0x7F800000u : 0u); break;      // +-Inf, +-0
        case 2: x = s | man; break;                                   // float32 subnormal
        case 3: x = s | ((0xE0u + r % 31) << 23) | man; break;       // huge
        case 4: x = s | ((1u + r % 48) << 23) | man; break;          // tiny normal
        default: x = s | 0x7FC00000u | (man & 0xFFu); break;         // quiet NaN, small payload
      }
    }
    in.push_back(x);
  }
  return in;
}

constexpr uint64_t kRandomCount = 1000000;

}  // namespace

TEST_CASE("Device-compiled codecs match CUDA's own conversions on the GPU for every boundary and 10^6 random floats",
          "[formats][gpu]") {
  const std::vector<uint32_t> in = make_inputs(kRandomCount);
  const size_t n = in.size();
  std::printf("formats on %s: %zu inputs (%llu random, seed %u)\n", scalemm::testing::gpu_name().c_str(), n,
              (unsigned long long)kRandomCount, scalemm::testing::seed());

  const size_t enc_bytes = n * kNumColumns * sizeof(uint16_t);
  const size_t dec_bytes = size_t(65536) * kNumDecode * sizeof(uint32_t);
  const scalemm::detail::DeviceBuffer d_in(in);
  scalemm::detail::DeviceBuffer d_cuda(enc_bytes), d_ours(enc_bytes), d_dec_cuda(dec_bytes), d_dec_ours(dec_bytes);
  encode_kernel<<<1024, 256>>>(d_in.as<uint32_t>(), n, d_cuda.as<uint16_t>(), d_ours.as<uint16_t>());
  SCALEMM_CUDA_CHECK(cudaGetLastError());
  decode_kernel<<<65536 / 256, 256>>>(d_dec_cuda.as<uint32_t>(), d_dec_ours.as<uint32_t>());
  SCALEMM_CUDA_CHECK(cudaGetLastError());
  SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());

  const std::vector<uint16_t> cuda = d_cuda.download<uint16_t>(), ours = d_ours.download<uint16_t>();
  const std::vector<uint32_t> dec_cuda = d_dec_cuda.download<uint32_t>(), dec_ours = d_dec_ours.download<uint32_t>();

  // The device codecs must also equal the host codecs (one definition, two compilers).
  uint64_t host_device_diff = 0;
  uint16_t host[kNumColumns];
  for (size_t i = 0; i < n; ++i) {
    scalemm_encode(in[i], host);
    for (int c = 0; c < kNumColumns; ++c) host_device_diff += host[c] != ours[i * kNumColumns + c];
  }
  CHECK(host_device_diff == 0);

  const uint64_t bad = compare_encodings("CUDA device", in, cuda, ours) + compare_decodes("CUDA device", dec_cuda, dec_ours);
  std::printf("formats on GPU: %llu mismatches\n", (unsigned long long)bad);
}

TEST_CASE("Codecs match the CUDA headers' host emulation for every boundary and 10^6 random floats",
          "[formats][cuda-host]") {
  const std::vector<uint32_t> in = make_inputs(kRandomCount);
  const size_t n = in.size();
  std::printf("formats vs CUDA host emulation: %zu inputs (%llu random, seed %u)\n", n,
              (unsigned long long)kRandomCount, scalemm::testing::seed());
  std::vector<uint16_t> cuda(n * kNumColumns), ours(n * kNumColumns);
  for (size_t i = 0; i < n; ++i) {
    cuda_encode(in[i], &cuda[i * kNumColumns]);
    scalemm_encode(in[i], &ours[i * kNumColumns]);
  }
  std::vector<uint32_t> dec_cuda(size_t(65536) * kNumDecode), dec_ours(size_t(65536) * kNumDecode);
  for (uint32_t c = 0; c < 65536; ++c) {
    cuda_decode(c, &dec_cuda[size_t(c) * kNumDecode]);
    scalemm_decode(c, &dec_ours[size_t(c) * kNumDecode]);
  }
  compare_encodings("CUDA host emulation", in, cuda, ours);
  compare_decodes("CUDA host emulation", dec_cuda, dec_ours);
}
