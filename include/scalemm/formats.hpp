// Bit-exact number formats: E4M3FN, E5M2, E2M1, UE4M3, E8M0, BF16, FP16.
//
// Every codec is a `constexpr` function usable on the host and the device, working on raw bits so
// that one definition serves the emulator, the quantizers, the layout validators and the tests.
// Encoding is round-to-nearest-even from float32. Overflow follows an explicit Saturation mode:
//   kSatFinite      finite overflow and +-Inf become +-max (PTX `cvt.rn.satfinite`, cuBLASLt, TE);
//   kNonSaturating  RNE into the encoding space: overflow becomes Inf where the format has it, else
//                   NaN (E4M3: |x| > 464 -> 0x7F/0xFF, like ml_dtypes and PyTorch <= 2.11 eager).
// A NaN input always encodes to the format's canonical NaN. Where formats lack NaN or Inf (E2M1),
// or where implementations disagree, the choice is named in docs/numerics.md.
#pragma once

#include <cstdint>

#include "scalemm/config.hpp"

namespace scalemm::formats {

enum class Saturation : uint8_t { kSatFinite = 0, kNonSaturating = 1 };

/// How a float32 becomes a power of two (E8M0 has no mantissa to round).
enum class E8M0Rounding : uint8_t {
  kUp = 0,       ///< ceil(log2|x|): RCEIL, `cvt.rp.satfinite.ue8m0x2.f32`, cuBLASLt D-output scales
  kDown = 1,     ///< floor(log2|x|): the OCP MX "suggested" FLOOR rule, `cvt.rz`
  kNearest = 2,  ///< nearest on the linear value, ties up (1.5 -> 2, 3 -> 4), as ml_dtypes/PyTorch except
                 ///< for float32 subnormals in (2^-127, 1.5*2^-127), which they round up (docs/numerics.md)
};

// ---- bit casts ------------------------------------------------------------------------------

SCALEMM_HD constexpr uint32_t float_bits(float f) { return __builtin_bit_cast(uint32_t, f); }
SCALEMM_HD constexpr float bits_float(uint32_t u) { return __builtin_bit_cast(float, u); }

namespace detail {

/// Description of a small float format: sign bit on top, then exponent, then mantissa.
struct MiniFloat {
  int man_bits;
  int bias;
  uint32_t max_code;  ///< largest finite magnitude code
  bool has_inf;       ///< IEEE-style: max_code + 1 is Inf
  bool has_nan;
  uint32_t nan_code;  ///< canonical (positive) NaN magnitude code
  int sign_shift;     ///< position of the sign bit (7 for 8-bit formats, 3 for E2M1, 15 for FP16)
};

// Functions rather than variables so that device code can use them without an ODR definition.
SCALEMM_HD constexpr MiniFloat e4m3_format() { return {3, 7, 0x7E, false, true, 0x7F, 7}; }
SCALEMM_HD constexpr MiniFloat e5m2_format() { return {2, 15, 0x7B, true, true, 0x7F, 7}; }
SCALEMM_HD constexpr MiniFloat e2m1_format() { return {1, 1, 0x7, false, false, 0x7, 3}; }
SCALEMM_HD constexpr MiniFloat f16_format() { return {10, 15, 0x7BFF, true, true, 0x7E00, 15}; }

/// Shifts right by s with round-to-nearest-even on the dropped bits.
SCALEMM_HD constexpr uint64_t shift_rne(uint64_t m, int s) {
  if (s <= 0) return m << (-s);
  if (s >= 64) return 0;
  const uint64_t kept = m >> s;
  const uint64_t rem = m & ((uint64_t(1) << s) - 1);
  const uint64_t half = uint64_t(1) << (s - 1);
  return kept + ((rem > half || (rem == half && (kept & 1))) ? 1 : 0);
}

/// Magnitude code of |x| (finite, float32 bits without sign), rounded to nearest even, possibly
/// beyond max_code. Subnormals of the target format come out naturally: the code of a value is
/// ((e - emin) << M) + n with n the RNE-rounded significand at the format's quantum.
SCALEMM_HD constexpr uint32_t magnitude_code(uint32_t abs_bits, MiniFloat f) {
  const int fexp = int(abs_bits >> 23);
  uint64_t sig = abs_bits & 0x7FFFFFu;
  int e = fexp - 127;
  if (fexp == 0) {
    e = -126;  // float32 subnormal: no implicit bit
  } else {
    sig |= 0x800000u;
  }
  const int emin = 1 - f.bias;
  const int below = emin > e ? emin - e : 0;
  const uint64_t n = shift_rne(sig, (23 - f.man_bits) + below);
  const uint64_t base = e > emin ? uint64_t(e - emin) << f.man_bits : 0;
  const uint64_t code = base + n;
  return code > 0xFFFFFFu ? 0xFFFFFFu : uint32_t(code);
}

SCALEMM_HD constexpr uint32_t encode(uint32_t bits, MiniFloat f, Saturation sat) {
  const uint32_t sign = (bits >> 31) << f.sign_shift;
  const uint32_t a = bits & 0x7FFFFFFFu;
  // NaN: the canonical (positive) NaN; a format without NaN (E2M1) gets +max whatever the input's
  // sign, as CUDA's __nv_cvt_float_to_fp4 and cvt.rn.satfinite.e2m1x2 do.
  if (a > 0x7F800000u) return f.has_nan ? f.nan_code : f.max_code;
  const uint32_t inf_code = f.max_code + 1;
  if (a == 0x7F800000u) {  // +-Inf
    if (sat == Saturation::kSatFinite || (!f.has_inf && !f.has_nan)) return sign | f.max_code;
    return sign | (f.has_inf ? inf_code : f.nan_code);
  }
  const uint32_t code = magnitude_code(a, f);
  if (code <= f.max_code) return sign | code;
  if (sat == Saturation::kSatFinite || (!f.has_inf && !f.has_nan)) return sign | f.max_code;
  return sign | (f.has_inf ? inf_code : f.nan_code);
}

/// float32 bits of n * 2^p (exact for the small n and p used by these formats).
SCALEMM_HD constexpr uint32_t scaled_int_bits(uint32_t n, int p) {
  if (n == 0) return 0;
  // Index of the highest set bit, branch-light (decode runs per element in kernels; n < 2^12 here).
  int h = 0;
  if (n >> 8) h += 8;
  if (n >> (h + 4)) h += 4;
  if (n >> (h + 2)) h += 2;
  if (n >> (h + 1)) h += 1;
  const int exp_field = p + h + 127;
  if (exp_field >= 1) return (uint32_t(exp_field) << 23) | ((n & ~(1u << h)) << (23 - h));
  return n << (p + 149);  // float32 subnormal
}

SCALEMM_HD constexpr uint32_t decode(uint32_t code, MiniFloat f) {
  const uint32_t sign = ((code >> f.sign_shift) & 1u) << 31;
  const uint32_t mag = code & ((1u << f.sign_shift) - 1);
  if (f.has_nan && mag > f.max_code + (f.has_inf ? 1u : 0u)) return 0x7FC00000u | sign;
  if (f.has_inf && mag == f.max_code + 1) return 0x7F800000u | sign;
  const uint32_t e = mag >> f.man_bits;
  const uint32_t m = mag & ((1u << f.man_bits) - 1);
  const int emin = 1 - f.bias;
  if (e == 0) return sign | scaled_int_bits(m, emin - f.man_bits);
  return sign | scaled_int_bits((1u << f.man_bits) | m, int(e) - f.bias - f.man_bits);
}

}  // namespace detail

// ---- FP8 E4M3FN ------------------------------------------------------------------------------
inline constexpr float kE4M3Max = 448.0f;
SCALEMM_HD constexpr uint8_t encode_e4m3_bits(uint32_t f32, Saturation s = Saturation::kSatFinite) {
  return uint8_t(detail::encode(f32, detail::e4m3_format(), s));
}
SCALEMM_HD constexpr uint8_t encode_e4m3(float x, Saturation s = Saturation::kSatFinite) {
  return encode_e4m3_bits(float_bits(x), s);
}
SCALEMM_HD constexpr float decode_e4m3(uint8_t c) { return bits_float(detail::decode(c, detail::e4m3_format())); }

// ---- FP8 E5M2 --------------------------------------------------------------------------------
inline constexpr float kE5M2Max = 57344.0f;
SCALEMM_HD constexpr uint8_t encode_e5m2_bits(uint32_t f32, Saturation s = Saturation::kSatFinite) {
  return uint8_t(detail::encode(f32, detail::e5m2_format(), s));
}
SCALEMM_HD constexpr uint8_t encode_e5m2(float x, Saturation s = Saturation::kSatFinite) {
  return encode_e5m2_bits(float_bits(x), s);
}
SCALEMM_HD constexpr float decode_e5m2(uint8_t c) { return bits_float(detail::decode(c, detail::e5m2_format())); }

// ---- FP4 E2M1 (a 4-bit code in the low nibble) -------------------------------------------------
// No Inf or NaN codes: overflow and +-Inf saturate to +-6 in both modes; NaN encodes to +6 (0x7),
// as CUDA's __nv_cvt_float_to_fp4 does (ml_dtypes gives +-0; see docs/numerics.md).
inline constexpr float kE2M1Max = 6.0f;
SCALEMM_HD constexpr uint8_t encode_e2m1_bits(uint32_t f32, Saturation s = Saturation::kSatFinite) {
  return uint8_t(detail::encode(f32, detail::e2m1_format(), s));
}
SCALEMM_HD constexpr uint8_t encode_e2m1(float x, Saturation s = Saturation::kSatFinite) {
  return encode_e2m1_bits(float_bits(x), s);
}
SCALEMM_HD constexpr float decode_e2m1(uint8_t nibble) {
  return bits_float(detail::decode(nibble & 0xFu, detail::e2m1_format()));
}
/// Element i of a packed FP4 array (element 2j in the low nibble of byte j).
SCALEMM_HD constexpr uint8_t get_e2m1(const uint8_t* packed, int64_t i) {
  return (i & 1) ? uint8_t(packed[i >> 1] >> 4) : uint8_t(packed[i >> 1] & 0xF);
}
SCALEMM_HD constexpr void set_e2m1(uint8_t* packed, int64_t i, uint8_t nibble) {
  uint8_t& b = packed[i >> 1];
  b = (i & 1) ? uint8_t((b & 0x0F) | (nibble << 4)) : uint8_t((b & 0xF0) | (nibble & 0xF));
}

// ---- UE4M3 (NVFP4 block scale) -------------------------------------------------------------------
// Unsigned E4M3: decode ignores bit 7, as cuBLASLt does. Encode: -0 -> 0x00; a negative value
// saturates to 0x00 (kSatFinite) or becomes NaN 0x7F (kNonSaturating).
SCALEMM_HD constexpr uint8_t encode_ue4m3_bits(uint32_t f32, Saturation s = Saturation::kSatFinite) {
  if ((f32 & 0x7FFFFFFFu) > 0x7F800000u) return 0x7F;
  if (f32 >> 31) return ((f32 & 0x7FFFFFFFu) == 0 || s == Saturation::kSatFinite) ? 0x00 : 0x7F;
  return uint8_t(detail::encode(f32, detail::e4m3_format(), s));
}
SCALEMM_HD constexpr uint8_t encode_ue4m3(float x, Saturation s = Saturation::kSatFinite) {
  return encode_ue4m3_bits(float_bits(x), s);
}
SCALEMM_HD constexpr float decode_ue4m3(uint8_t c) { return decode_e4m3(uint8_t(c & 0x7F)); }

// ---- E8M0 (MX scale): 2^(c-127); c = 0xFF is NaN; code 0 is 2^-127, a float32 subnormal --------
// Encode ignores the sign (a scale's magnitude is what matters; PTX cvt does the same). 0 and values
// at or below 2^-127 give code 0. kSatFinite clamps overflow and Inf to 0xFE (2^127);
// kNonSaturating gives 0xFF. NaN gives 0xFF.
inline constexpr uint8_t kE8M0Nan = 0xFF;
SCALEMM_HD constexpr uint8_t encode_e8m0_bits(uint32_t f32, E8M0Rounding r = E8M0Rounding::kUp,
                                              Saturation s = Saturation::kSatFinite) {
  const uint32_t a = f32 & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return kE8M0Nan;
  if (a == 0x7F800000u) return s == Saturation::kSatFinite ? 0xFE : kE8M0Nan;
  if (a <= 0x00400000u) return 0;  // <= 2^-127 (code 0 is the smallest value there is)
  int e = 0;            // floor(log2 a)
  bool exact = false;    // a is a power of two
  bool upper_half = false;  // a >= 1.5 * 2^e: nearest rounds up (ties up)
  if ((a >> 23) == 0) {  // float32 subnormal in (2^-127, 2^-126)
    e = -127;
    exact = false;
    upper_half = a >= 0x00600000u;
  } else {
    e = int(a >> 23) - 127;
    exact = (a & 0x7FFFFFu) == 0;
    upper_half = (a & 0x7FFFFFu) >= 0x400000u;
  }
  int up = 0;
  switch (r) {
    case E8M0Rounding::kUp: up = exact ? 0 : 1; break;
    case E8M0Rounding::kDown: up = 0; break;
    case E8M0Rounding::kNearest: up = upper_half ? 1 : 0; break;
  }
  int code = e + up + 127;
  if (code < 0) code = 0;
  if (code > 254) return s == Saturation::kSatFinite ? 0xFE : kE8M0Nan;
  return uint8_t(code);
}
SCALEMM_HD constexpr uint8_t encode_e8m0(float x, E8M0Rounding r = E8M0Rounding::kUp,
                                         Saturation s = Saturation::kSatFinite) {
  return encode_e8m0_bits(float_bits(x), r, s);
}
SCALEMM_HD constexpr uint32_t decode_e8m0_bits(uint8_t c) {
  return c == kE8M0Nan ? 0x7FC00000u : (c == 0 ? 0x00400000u : uint32_t(c) << 23);
}
SCALEMM_HD constexpr float decode_e8m0(uint8_t c) { return bits_float(decode_e8m0_bits(c)); }

// ---- BF16 -----------------------------------------------------------------------------------------
// NaN -> quiet NaN with the input's sign (0x7FC0 / 0xFFC0); kSatFinite turns overflow and Inf into
// +-max (0x7F7F), kNonSaturating into +-Inf.
SCALEMM_HD constexpr uint16_t encode_bf16_bits(uint32_t f32, Saturation s = Saturation::kNonSaturating) {
  const uint32_t a = f32 & 0x7FFFFFFFu;
  const uint16_t sign = uint16_t((f32 >> 16) & 0x8000u);
  if (a > 0x7F800000u) return uint16_t(sign | 0x7FC0u);
  uint32_t r = a == 0x7F800000u ? 0x7F80u : uint32_t(detail::shift_rne(a, 16));
  if (r >= 0x7F80u && s == Saturation::kSatFinite) r = 0x7F7Fu;
  return uint16_t(sign | r);
}
SCALEMM_HD constexpr uint16_t encode_bf16(float x, Saturation s = Saturation::kNonSaturating) {
  return encode_bf16_bits(float_bits(x), s);
}
SCALEMM_HD constexpr float decode_bf16(uint16_t b) { return bits_float(uint32_t(b) << 16); }

// ---- FP16 -----------------------------------------------------------------------------------------
// NaN -> quiet NaN with the input's sign (0x7E00 / 0xFE00).
SCALEMM_HD constexpr uint16_t encode_f16_bits(uint32_t f32, Saturation s = Saturation::kNonSaturating) {
  if ((f32 & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t(((f32 >> 16) & 0x8000u) | 0x7E00u);
  return uint16_t(detail::encode(f32, detail::f16_format(), s));
}
SCALEMM_HD constexpr uint16_t encode_f16(float x, Saturation s = Saturation::kNonSaturating) {
  return encode_f16_bits(float_bits(x), s);
}
SCALEMM_HD constexpr float decode_f16(uint16_t h) { return bits_float(detail::decode(h, detail::f16_format())); }

}  // namespace scalemm::formats
