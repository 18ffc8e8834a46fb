// Device-only element codecs of the GPU kernels (device.cu): two FP8 elements per instruction with the
// hardware conversion where the architecture has it (sm_89 and later), else the 32-bit software
// encoder of functors.hpp. CUDA-only header (nvcc); the host never includes it.
//
// Equality with the software encoder is a claim about every input, and it is tested that way: the
// [gpu] test "Hardware FP8 conversion equals the software encoder on all 2^32 fp32 patterns" runs both
// over every fp32 bit pattern in both positions of the pair. What makes them equal:
//   * rounding: cvt.rn is round-to-nearest-even on the exact value, as encode_satfinite;
//   * .satfinite: finite overflow and +-Inf give +-max (0x7E/0xFE E4M3, 0x7B/0xFB E5M2), as kSatFinite;
//   * NaN (any sign, any payload): 0x7F for both formats (numerics.md, "Against ml_dtypes" rows 1-2:
//     scalemm chose CUDA's positive canonical NaN);
//   * -0 and negative values that round to zero keep the sign (0x80);
//   * fp32 subnormal inputs are far below the smallest FP8 subnormal: +-0 either way.
// SCALEMM_EMU_SOFTWARE_FP8=1 at compile time selects the software encoder everywhere
// (SCALEMM_EMU_HW_FP8, detail/functors.hpp).
#pragma once

#include <cstdint>

#include "detail/functors.hpp"

namespace scalemm::numerics::detail {

/// Element type as a template argument: E = 0 e4m3, 1 e5m2, 2 e2m1.
template <int E>
__device__ __forceinline__ uint32_t encode_one(float x) {
  if constexpr (E == 0) return encode_satfinite(fmt::float_bits(x), fmt::detail::e4m3_format());
  else if constexpr (E == 1) return encode_satfinite(fmt::float_bits(x), fmt::detail::e5m2_format());
  else return encode_e2m1_satfinite(fmt::float_bits(x));
}

/// Satfinite codes of (lo, hi) packed as lo | hi << 8 (FP8) or lo | hi << 4 (E2M1), equal to
/// encode_one<E>(lo) | encode_one<E>(hi) << (8 or 4).
template <int E>
__device__ __forceinline__ uint32_t encode_pair(float lo, float hi) {
#if SCALEMM_EMU_HW_FP8
  if constexpr (E == 0 || E == 1) {
    uint16_t r;
    // cvt.*x2 d, a, b: a goes to the upper byte, b to the lower.
    if constexpr (E == 0) asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    else asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return uint32_t(r);
  }
#endif
  constexpr int w = E == 2 ? 4 : 8;
  return encode_one<E>(lo) | (encode_one<E>(hi) << w);
}

/// Software pair encoder, the reference the test compares encode_pair with.
template <int E>
__device__ __forceinline__ uint32_t encode_pair_sw(float lo, float hi) {
  constexpr int w = E == 2 ? 4 : 8;
  return encode_one<E>(lo) | (encode_one<E>(hi) << w);
}

/// Two FP8 codes (lo in bits 0-7) decoded to fp32. Hardware: cvt.rn.f16x2.e4m3x2 / e5m2x2 is exact
/// (every E4M3 and E5M2 value is an f16 value), then f16 -> f32 is exact. A NaN code gives a NaN of
/// another payload than fmt::decode_*'s 0x7FC00000 (with sign); callers store NaNs through hp_bits,
/// which canonicalises them, so only NaN-ness matters.
template <int E>
__device__ __forceinline__ void decode_fp8_pair(uint32_t codes, float& lo, float& hi) {
#if SCALEMM_EMU_HW_FP8
  uint32_t h2;
  const uint16_t c = uint16_t(codes);
  if constexpr (E == 0) asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(c));
  else asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(h2) : "h"(c));
  asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"(uint16_t(h2 & 0xFFFFu)));
  asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"(uint16_t(h2 >> 16)));
#else
  if constexpr (E == 0) {
    lo = fmt::decode_e4m3(uint8_t(codes));
    hi = fmt::decode_e4m3(uint8_t(codes >> 8));
  } else {
    lo = fmt::decode_e5m2(uint8_t(codes));
    hi = fmt::decode_e5m2(uint8_t(codes >> 8));
  }
#endif
}

}  // namespace scalemm::numerics::detail
