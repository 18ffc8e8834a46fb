// Per-block and per-element functors of the emulator: one definition, run on the host (Thrust CPP
// system, g++) and on the GPU (Thrust CUDA system, nvcc). Detail, not public: no Thrust here, only
// plain structs with a SCALEMM_HD operator()(int64_t item).
//
// Arithmetic rule: no expression of the form a*b+c (nvcc would contract it into an FMA, g++ on x86-64
// would not). Where an FMA is meant, it is written as fmaf/fma explicitly.
#pragma once

#include <cmath>
#include <cstdint>

#include "scalemm/config.hpp"
#include "scalemm/formats.hpp"
#include "scalemm/layouts/scale_layout.hpp"
#include "scalemm/types.hpp"

namespace scalemm::numerics::detail {

using layouts::ScaleLayout;
namespace fmt = scalemm::formats;

inline constexpr float kFltMax = 3.40282347e+38f;

SCALEMM_HD inline float abs_f(float x) { return fmt::bits_float(fmt::float_bits(x) & 0x7FFFFFFFu); }
SCALEMM_HD inline bool is_nan_f(float x) { return (fmt::float_bits(x) & 0x7FFFFFFFu) > 0x7F800000u; }
SCALEMM_HD inline bool is_finite_f(float x) { return (fmt::float_bits(x) & 0x7F800000u) != 0x7F800000u; }

/// NaN-propagating running max of |v| (a NaN anywhere makes the result NaN); m is a previous result
/// (non-negative or a positive NaN), 0 to start. As integers the magnitude bits order like the values,
/// and every NaN's bits exceed +Inf's, so one integer max does it. Which NaN comes out is not
/// specified (only NaN-ness is ever used: every scale rule maps a NaN amax to the same bytes).
SCALEMM_HD inline float amax_update(float m, float v) {
  const uint32_t a = fmt::float_bits(v) & 0x7FFFFFFFu, b = fmt::float_bits(m);
  return fmt::bits_float(a > b ? a : b);
}

/// Loads element i of an f32/bf16/f16 array as fp32.
SCALEMM_HD inline float load_hp(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kBF16: return fmt::decode_bf16(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16: return fmt::decode_f16(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

/// The canonical NaN every output NaN is written as (f32 0x7FC00000; bf16 0x7FC0, f16 0x7E00).
inline constexpr uint32_t kCanonicalNanBits = 0x7FC00000u;

/// Stores fp32 x as out_dtype (f32, bf16 or f16, RNE, overflow to Inf). A NaN is stored as the
/// canonical positive quiet NaN: arithmetic on a NaN keeps the operand's payload and sign on x86
/// (0x7FC00000 stays 0x7FC00000) but gives 0x7FFFFFFF on NVIDIA GPUs, so without this step host and
/// device outputs would differ in the NaN bits.
/// The bits store_hp writes for x: 32 (f32) or the low 16 (bf16, f16).
SCALEMM_HD inline uint32_t hp_bits(DType t, float x) {
  if (is_nan_f(x)) x = fmt::bits_float(kCanonicalNanBits);
  switch (t) {
    case DType::kBF16: return fmt::encode_bf16(x);
    case DType::kF16: return fmt::encode_f16(x);
    default: return fmt::float_bits(x);
  }
}

SCALEMM_HD inline void store_hp(void* p, DType t, int64_t i, float x) {
  const uint32_t b = hp_bits(t, x);
  if (t == DType::kBF16 || t == DType::kF16) static_cast<uint16_t*>(p)[i] = uint16_t(b);
  else static_cast<uint32_t*>(p)[i] = b;
}

/// Largest finite value and exponent of the largest power of two of an element type.
SCALEMM_HD inline float elem_max(DType t) {
  return t == DType::kE5M2 ? fmt::kE5M2Max : t == DType::kE2M1 ? fmt::kE2M1Max : fmt::kE4M3Max;
}
SCALEMM_HD inline int elem_emax(DType t) { return t == DType::kE5M2 ? 15 : t == DType::kE2M1 ? 2 : 8; }

/// m >> s rounded to nearest even on the dropped bits, 32-bit (1 <= s <= 31).
SCALEMM_HD inline uint32_t shift_rne32(uint32_t m, int s) {
  const uint32_t kept = m >> s;
  const uint32_t rem = m & ((1u << s) - 1u);
  const uint32_t half = 1u << (s - 1);
  return kept + ((rem > half || (rem == half && (kept & 1u))) ? 1u : 0u);
}

/// Satfinite encode of float32 bits into an element format: the same function as
/// formats::detail::encode(bits, f, kSatFinite) (tested against it on every sign/exponent/rounding
/// pattern), in 32-bit integer arithmetic so that it is cheap on the GPU. Normal results round with
/// the add-half trick (a mantissa carry moves into the exponent by itself); results below the
/// format's smallest normal shift the significand with RNE.
SCALEMM_HD inline uint32_t encode_satfinite(uint32_t bits, fmt::detail::MiniFloat f) {
  const uint32_t sign = (bits >> 31) << f.sign_shift;
  const uint32_t a = bits & 0x7FFFFFFFu;
  const int shift = 23 - f.man_bits;
  uint32_t code;
  if (a >= (uint32_t(128 - f.bias) << 23)) {
    // At or above the smallest normal 2^(1 - bias); +-Inf and NaN land here too and come out above
    // max_code (Inf saturates below; NaN is replaced at the end).
    const uint32_t r = a + ((1u << (shift - 1)) - 1u) + ((a >> shift) & 1u);
    code = (r >> shift) - (uint32_t(127 - f.bias) << f.man_bits);
  } else {
    const int fexp = int(a >> 23);
    const uint32_t sig = fexp ? ((a & 0x7FFFFFu) | 0x800000u) : a;
    const int e = fexp ? fexp - 127 : -126;
    const int s = shift + (1 - f.bias - e);
    code = s >= 32 ? 0u : shift_rne32(sig, s);
  }
  if (a > 0x7F800000u) return f.has_nan ? f.nan_code : f.max_code;  // NaN: unsigned NaN code (E2M1: +max)
  return sign | (code <= f.max_code ? code : f.max_code);
}

/// E2M1 satfinite encode without branches: the same function as encode_satfinite(bits, e2m1_format())
/// (proven equal on the host over every input whose magnitude lies in [2^-3, 2^3) plus samples of all
/// other exponents and the specials, and on the GPU over all 2^32 patterns). E2M1 has the magnitudes
/// 0, 0.5 (subnormals), 1, 1.5, 2, 3, 4, 6 (normals, one mantissa bit), codes 0..7 in that order:
///   * y = min(|x|, 6): what saturation leaves (a NaN input gives 0x7, selected at the end);
///   * with e = max(floor(log2 y), 0), the E2M1 values of y's binade are spaced 2^(e-1) apart, which is
///     the fp32 spacing at 2^(e+22); so the fp32 sum y + 2^(e+22) rounds y to that grid with the FPU's
///     round-to-nearest-even, and its low bits count the steps: k = y / 2^(e-1) in 0..4;
///   * the code is 2e + k (even k is even code, so ties go to the even code as RNE wants);
///   * the sign is kept (-0 and negative values that round to 0 give 0x8), except that NaN gives 0x7.
/// About 11 instructions; the quantizer runs it once per NVFP4 element. encode_e2m1_not_nan is all of
/// it but the NaN test: encode_e2m1_satfinite's value for every non-NaN x.
///
/// e2m1_rounded_sum is the rounding step this encoder shares with encode_e2m1x4_not_nan: the bits of
/// y + 2^(e+22), which are
/// (e + 149) << 23 | k with k < 8 and bits 3..22 zero. On the GPU it is one fma of the exact power of
/// two 2^e * 2^22 and y: the same single rounding, one instruction less. e2m1_sum_small is that step
/// without the saturation, for 0 <= y < 7: there e <= 2 and 6 <= y < 7 rounds to 6, so the sum is
/// the same as for min(y, 6).
SCALEMM_HD inline uint32_t e2m1_sum_small(float y) {
  const uint32_t yb = fmt::float_bits(y);
  const uint32_t eb = (yb > 0x3F800000u ? yb : 0x3F800000u) & 0x7F800000u;  // 2^e
#if defined(__CUDA_ARCH__)
  return fmt::float_bits(__fmaf_rn(fmt::bits_float(eb), 4194304.0f, y));  // 2^e * 2^22 + y
#else
  return fmt::float_bits(y + fmt::bits_float(eb + (22u << 23)));
#endif
}
SCALEMM_HD inline uint32_t e2m1_rounded_sum(float x) { return e2m1_sum_small(fminf(fabsf(x), 6.0f)); }
SCALEMM_HD inline uint32_t encode_e2m1_not_nan(float x) {
  const uint32_t sb = e2m1_rounded_sum(x);
  const uint32_t code = (sb & 7u) + (sb >> 22) - 298u;  // k + 2e: (sb >> 22) = 2e + 298
  return ((fmt::float_bits(x) >> 28) & 0x8u) | code;
}
SCALEMM_HD inline uint32_t encode_e2m1_satfinite(uint32_t bits) {
  const float x = fmt::bits_float(bits);
  return x == x ? encode_e2m1_not_nan(x) : 0x7u;
}

/// Four E2M1 codes, element j in bits 4j..4j+3 of the result (bits 16 and up zero): each equal to
/// encode_e2m1_not_nan(x_j), for non-NaN inputs (a NaN may disturb the other codes; the kernels
/// replace a NaN block's codes). The quantizer kernels' inner loop, so the code is read
/// off the rounded sum in two shift-adds per element instead of a subtraction chain:
///   * s = e2m1_rounded_sum(x_j), whose bits are (e + 149) << 23 | k with k < 8 and bits 3..22 zero;
///   * acc += s << 4j adds k << 4j (the exponent lands at bit 23 + 4j, above the result), and
///     acc += s >> (22 - 4j) adds (2e + 298) << 4j (k's bits shift out); the 298s are taken off once,
///     so the low 16 bits of acc are sum of (k + 2e) << 4j, codes <= 7 that never carry;
///   * the signs go to bits 3, 7, 11, 15 (GPU: two byte permutes replicating the sign bytes).
/// e2m1_pack4 is the packing step (bits 16 and up of its result are junk), shared with e2m1x4_small.
SCALEMM_HD inline uint32_t e2m1_pack4(uint32_t s0, uint32_t s1, uint32_t s2, uint32_t s3) {
  const uint32_t sb[4] = {s0, s1, s2, s3};
  uint32_t acc = 0u - 298u * 0x1111u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int j = 0; j < 4; ++j) acc += (sb[j] << (4 * j)) + (sb[j] >> (22 - 4 * j));
  return acc;
}
SCALEMM_HD inline uint32_t encode_e2m1x4_not_nan(float x0, float x1, float x2, float x3) {
  const uint32_t acc = e2m1_pack4(e2m1_rounded_sum(x0), e2m1_rounded_sum(x1), e2m1_rounded_sum(x2),
                                  e2m1_rounded_sum(x3));
  uint32_t sign;
#if defined(__CUDA_ARCH__)
  // prmt selector nibble 8 | byte: the byte's sign bit replicated over 8 bits. Bytes 0, 1 of a are
  // the signs of x0, x2 (bits 3 and 11 kept), of b those of x1, x3 (bits 7 and 15 kept).
  uint32_t a, b;
  asm("prmt.b32 %0, %1, %2, 0xFB;" : "=r"(a) : "r"(fmt::float_bits(x0)), "r"(fmt::float_bits(x2)));
  asm("prmt.b32 %0, %1, %2, 0xFB;" : "=r"(b) : "r"(fmt::float_bits(x1)), "r"(fmt::float_bits(x3)));
  sign = (a & 0x0808u) | (b & 0x8080u);
#else
  sign = ((fmt::float_bits(x0) >> 28) & 0x8u) | ((fmt::float_bits(x1) >> 24) & 0x80u) |
         ((fmt::float_bits(x2) >> 20) & 0x800u) | ((fmt::float_bits(x3) >> 16) & 0x8000u);
#endif
  return (acc & 0xFFFFu) | sign;
}
/// Four E2M1 magnitude codes (sign bits clear) of y_j with 0 <= y_j < 7, element j in bits 4j..4j+2:
/// encode_e2m1_not_nan(y_j) without its saturation and sign steps, which such y do not need. The
/// NVFP4 tile kernel takes it for blocks whose amax times multiplier is below 7 (every product then
/// is, rounding being monotone) and sets the signs from the source codes.
SCALEMM_HD inline uint32_t e2m1x4_small(float y0, float y1, float y2, float y3) {
  return e2m1_pack4(e2m1_sum_small(y0), e2m1_sum_small(y1), e2m1_sum_small(y2), e2m1_sum_small(y3)) & 0xFFFFu;
}

/// Element encode with saturation (satfinite: overflow and +-Inf -> +-max, NaN -> NaN code; E2M1 NaN -> 0x7).
SCALEMM_HD inline uint8_t encode_elem(float x, DType t) {
  switch (t) {
    case DType::kE5M2: return uint8_t(encode_satfinite(fmt::float_bits(x), fmt::detail::e5m2_format()));
    case DType::kE2M1: return uint8_t(encode_e2m1_satfinite(fmt::float_bits(x)));
    default: return uint8_t(encode_satfinite(fmt::float_bits(x), fmt::detail::e4m3_format()));
  }
}

/// The GPU's FP8 conversion instructions (sm_89 and later) stand in for the software codecs where
/// they give the same bytes on every input (tested over all 2^32 fp32 patterns); host code and
/// SCALEMM_EMU_SOFTWARE_FP8=1 builds use the software codecs.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && !(defined(SCALEMM_EMU_SOFTWARE_FP8) && SCALEMM_EMU_SOFTWARE_FP8)
#define SCALEMM_EMU_HW_FP8 1
#else
#define SCALEMM_EMU_HW_FP8 0
#endif

/// UE4M3 code of x >= 0 (RNE, satfinite: above 448 and +Inf give 448 = 0x7E; NaN gives 0x7F) and its
/// value: fmt::encode_ue4m3 / decode_ue4m3,
/// by cvt.rn.satfinite.e4m3x2.f32 and cvt.rn.f16x2.e4m3x2 on the GPU (for a non-negative x the E4M3
/// code is the UE4M3 code; every E4M3 value is an f16 value, so the decode is exact).
SCALEMM_HD inline uint8_t ue4m3_encode_nonneg(float x) {
#if SCALEMM_EMU_HW_FP8
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(x));
  return uint8_t(r);
#else
  return fmt::encode_ue4m3(x, fmt::Saturation::kSatFinite);
#endif
}
SCALEMM_HD inline float ue4m3_decode(uint8_t c) {
#if SCALEMM_EMU_HW_FP8
  uint32_t h2;
  float f;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(uint16_t(c & 0x7F)));
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(uint16_t(h2 & 0xFFFFu)));
  return f;
#else
  return fmt::decode_ue4m3(c);
#endif
}

/// Scale mode numbers as used in the functors (mirrors emulation::ScaleMode, resolved).
enum Mode : int { kModeAmax = 1, kModeAmaxPow2 = 2, kModeFloor = 3, kModeRceil = 4, kModeNvfp4 = 5 };

/// The result of one block's scale computation.
struct BlockScale {
  float stored_f32 = 0.0f;  ///< fp32 recipes: the stored dequantization scale
  uint8_t stored_u8 = 0;    ///< E8M0 / UE4M3 byte
  float multiplier = 0.0f;  ///< what data elements are multiplied by before the element cast
};

/// a / 6 in fp32, correctly rounded (the division of nvfp4_scale_byte). div6_fma is the GPU's form
/// for a in [2^-125, FLT_MAX]: the product with RN(1/6) and one FMA correction from its exact
/// residual, equal to a / 6.0f on every fp32 in that range (tested); below it the quotient is
/// subnormal and the correction can miss by one ulp, and Inf / NaN give NaN, so those take the
/// division. Three FMA-pipe instructions instead of the division's range check, six FMAs and branch.
SCALEMM_HD inline float div6_fma(float a) {
  const float r = 0x1.555556p-3f;  // RN(1/6)
  const float q = a * r;
  return fmaf(fmaf(-q, 6.0f, a), r, q);
}
SCALEMM_HD inline float div6(float a) {
#if defined(__CUDA_ARCH__)
  if (a >= 0x1p-125f && a <= kFltMax) return div6_fma(a);
#endif
  return a / 6.0f;
}

/// NVFP4 block scale byte: UE4M3 of (amax / 6) * S_enc, saturated at 448. A NaN amax gives 0x7F (NaN:
/// the whole block dequantizes to NaN); no other amax reaches it (amax >= 0 and S_enc > 0, so the ratio
/// is a non-negative number or +Inf, which saturates), so the byte alone decides the multiplier. The
/// encoder's satfinite rounding is the clamp and its NaN rule the NaN test (the [gpu] sweep checks this
/// against the explicit division, NaN test and clamp on every fp32 amax).
SCALEMM_HD inline uint8_t nvfp4_scale_byte(float amax, float senc) { return ue4m3_encode_nonneg(div6(amax) * senc); }
/// The data multiplier of an NVFP4 block with scale byte b: 1 / (decode(b) * S_dec), FLT_MAX where
/// that is not finite (b = 0), NaN for the NaN byte. A function of b alone for a given S_dec, so a
/// kernel may tabulate it over the 128 bytes.
SCALEMM_HD inline float nvfp4_multiplier(uint8_t b, float sdec) {
  if (b == 0x7F) return fmt::bits_float(0x7FC00000u);
  const float m = 1.0f / (ue4m3_decode(b) * sdec);
  return is_finite_f(m) ? m : kFltMax;
}

/// amax -> scale, for every mode (docs/emulation.md spells out each rule).
///   nvfp4_senc: the global encode scale S_enc; nvfp4_sdec = 1/S_enc (fp32 division).
SCALEMM_HD inline BlockScale compute_scale(float amax, int mode, DType elem, float eps, float nvfp4_senc,
                                           float nvfp4_sdec) {
  BlockScale s;
  const float mx = elem_max(elem);
  switch (mode) {
    case kModeAmax:
    case kModeAmaxPow2: {
      float q = 1.0f;  // non-finite amax (NaN or Inf in the block): scale 1, elements saturate
      if (is_finite_f(amax)) {
        q = mx / (amax > eps ? amax : eps);
        if (!is_finite_f(q) || !(q > 0.0f)) q = 1.0f;  // eps = 0 with amax = 0
        if (mode == kModeAmaxPow2) q = fmt::bits_float(fmt::float_bits(q) & 0xFF800000u);
      }
      s.multiplier = q;
      s.stored_f32 = 1.0f / q;
      break;
    }
    case kModeFloor:
    case kModeRceil: {
      uint8_t c = 0;
      if (mode == kModeFloor) {
        // floor(log2 amax) from amax's own exponent, minus emax_elem, clamped to code 0.
        const uint8_t ca = fmt::encode_e8m0(amax, fmt::E8M0Rounding::kDown, fmt::Saturation::kNonSaturating);
        const int e = elem_emax(elem);
        c = ca == fmt::kE8M0Nan ? fmt::kE8M0Nan : uint8_t(ca > e ? ca - e : 0);
      } else {
        // Round the ratio amax / max_elem (one fp32 division) up to a power of two.
        c = fmt::encode_e8m0(amax / mx, fmt::E8M0Rounding::kUp, fmt::Saturation::kNonSaturating);
      }
      s.stored_u8 = c;
      // Exact reciprocal 2^(127 - e): code 0 -> 2^127, 254 -> 2^-127; 255 (NaN) -> NaN.
      s.multiplier = c == fmt::kE8M0Nan ? fmt::bits_float(0x7FC00000u) : fmt::decode_e8m0(uint8_t(254 - c));
      break;
    }
    case kModeNvfp4: {
      s.stored_u8 = nvfp4_scale_byte(amax, nvfp4_senc);
      s.multiplier = nvfp4_multiplier(s.stored_u8, nvfp4_sdec);
      break;
    }
    default: break;
  }
  return s;
}

/// The global NVFP4 encode scale from the tensor amax: S_enc = 2688 / amax (fp32 division);
/// 1 when amax is 0, NaN or Inf, or the result is not a finite positive number.
SCALEMM_HD inline float nvfp4_global_encode(float amax_tensor) {
  if (!is_finite_f(amax_tensor) || !(amax_tensor > 0.0f)) return 1.0f;
  const float s = (448.0f * 6.0f) / amax_tensor;
  return is_finite_f(s) && s > 0.0f ? s : 1.0f;
}

// ---- quantizer functors -------------------------------------------------------------------------

/// Partial amax of one column over all rows (item = column). Coalesced on the GPU.
struct ColumnAmax {
  const void* src;
  DType src_dtype;
  int64_t rows, cols;
  float* out;  ///< cols floats
  SCALEMM_HD void operator()(int64_t c) const {
    float m = 0.0f;
    for (int64_t r = 0; r < rows; ++r) m = amax_update(m, load_hp(src, src_dtype, r * cols + c));
    out[c] = m;
  }
};

/// Single item: reduce the column partials to the tensor amax and derive the global scalars.
///   g[0] = amax, g[1] = S_enc (NVFP4) , g[2] = S_dec = 1/S_enc; *global_out = S_dec when given.
/// The global scalars from the tensor amax m (shared by FinishGlobal and the GPU fast path).
SCALEMM_HD inline void finish_global(float m, float* g, float* global_out) {
  const float senc = nvfp4_global_encode(m);
  g[0] = m;
  g[1] = senc;
  g[2] = 1.0f / senc;
  if (global_out) *global_out = g[2];
}

struct FinishGlobal {
  const float* partials;
  int64_t n;
  float* g;
  float* global_out;
  SCALEMM_HD void operator()(int64_t) const {
    float m = 0.0f;
    for (int64_t i = 0; i < n; ++i) m = amax_update(m, partials[i]);
    finish_global(m, g, global_out);
  }
};

/// Stores one block's scale at the buffer position of data row r, K-block kb (ScaleLayout::offset).
/// The stored scale at buffer index i (= L.offset(r, kb)); kernels that hoist offset()'s row term
/// (offset(r, kb) == offset(r, 0) + offset(0, kb) in every layout) call this one.
SCALEMM_HD inline void store_scale_at(const ScaleLayout& L, void* scales, int64_t i, const BlockScale& s) {
  if (L.scale_dtype() == DType::kF32)
    static_cast<float*>(scales)[i] = s.stored_f32;
  else
    static_cast<uint8_t*>(scales)[i] = s.stored_u8;
}
SCALEMM_HD inline void store_scale(const ScaleLayout& L, void* scales, int64_t r, int64_t kb, const BlockScale& s) {
  store_scale_at(L, scales, L.offset(r, kb), s);
}

/// Writes one block's scale to every buffer position its data rows use (ScaleLayout::offset), and its
/// multiplier to the compact scratch grid (grid_row * kblocks + kb).
SCALEMM_HD inline void write_block(const ScaleLayout& L, void* scales, float* mult, int64_t grid_row, int64_t kb,
                                   const BlockScale& s) {
  const int64_t br = L.block_rows();
  const int64_t r0 = grid_row * br;
  const int64_t r1 = r0 + br < L.rows ? r0 + br : L.rows;
  for (int64_t r = r0; r < r1; ++r) store_scale(L, scales, r, kb, s);
  mult[grid_row * L.kblocks() + kb] = s.multiplier;
}

/// The amax + scale pass. Item = one tile of the (R, C) source of tile_r x tile_c elements
/// (tiles_c tiles per tile row). In one read of the tile it accumulates the amax of every rowwise
/// block (1 x tile_c per row, or the whole tile for 2D recipes) and every columnwise block
/// (tile_r x 1 per column), then writes the scales of both directions.
///   kind 0: 1D blocks (rowwise 1 x bk along C and/or columnwise bk x 1 along R), tile bk x bk
///   kind 1: 2D blocks: one amax per tile, shared by both directions (the tile is the block)
///   kind 2: one fp32 scale for the whole tensor from g[0] (tensorwise; single item)
///   kind 3: rowwise recipe: items [0, R) are rows (rowwise scales), [R, R + C) are columns
struct ScaleTiles {
  const void* src;
  DType src_dtype;
  int64_t rows, cols;
  int kind;
  int64_t tile_r, tile_c, tiles_c;
  bool rowwise, columnwise;
  ScaleLayout lr, lc;         ///< rowwise layout (rows = R, k = C); columnwise (rows = C, k = R)
  void* scales_r;
  void* scales_c;
  float* mult_r;
  float* mult_c;
  int mode;
  DType elem;
  float eps;
  const float* g;             ///< global scalars (FinishGlobal), or nullptr

  SCALEMM_HD float senc() const { return g ? g[1] : 1.0f; }
  SCALEMM_HD float sdec() const { return g ? g[2] : 1.0f; }
  SCALEMM_HD BlockScale scale_of(float amax) const { return compute_scale(amax, mode, elem, eps, senc(), sdec()); }

  SCALEMM_HD void operator()(int64_t item) const {
    if (kind == 2) {
      const BlockScale s = scale_of(g[0]);
      if (rowwise) write_block(lr, scales_r, mult_r, 0, 0, s);
      if (columnwise) write_block(lc, scales_c, mult_c, 0, 0, s);
      return;
    }
    if (kind == 3) {
      float m = 0.0f;
      const int64_t it = rowwise ? item : item + rows;  // columns follow the rows in the item space
      if (it < rows) {
        for (int64_t c = 0; c < cols; ++c) m = amax_update(m, load_hp(src, src_dtype, it * cols + c));
        write_block(lr, scales_r, mult_r, it, 0, scale_of(m));
      } else {
        const int64_t c = it - rows;
        for (int64_t r = 0; r < rows; ++r) m = amax_update(m, load_hp(src, src_dtype, r * cols + c));
        write_block(lc, scales_c, mult_c, c, 0, scale_of(m));
      }
      return;
    }
    const int64_t tr = item / tiles_c, tc = item % tiles_c;
    const int64_t r0 = tr * tile_r, c0 = tc * tile_c;
    const int64_t r1 = r0 + tile_r < rows ? r0 + tile_r : rows;
    const int64_t c1 = c0 + tile_c < cols ? c0 + tile_c : cols;
    if (kind == 1) {
      float m = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) m = amax_update(m, load_hp(src, src_dtype, r * cols + c));
      const BlockScale s = scale_of(m);
      if (rowwise) write_block(lr, scales_r, mult_r, tr, tc, s);
      if (columnwise) write_block(lc, scales_c, mult_c, tc, tr, s);
      return;
    }
    // kind 0: 1D blocks. Rowwise block (r, kb = tc) when tile_c = bk; columnwise block (c, kb = tr).
    float colmax[128];
    const int64_t nc = c1 - c0;
    for (int64_t j = 0; j < nc && j < 128; ++j) colmax[j] = 0.0f;
    for (int64_t r = r0; r < r1; ++r) {
      float m = 0.0f;
      for (int64_t c = c0; c < c1; ++c) {
        const float v = load_hp(src, src_dtype, r * cols + c);
        m = amax_update(m, v);
        if (columnwise) colmax[c - c0] = amax_update(colmax[c - c0], v);
      }
      if (rowwise) write_block(lr, scales_r, mult_r, r, tc, scale_of(m));
    }
    if (columnwise)
      for (int64_t c = c0; c < c1; ++c) write_block(lc, scales_c, mult_c, c, tr, scale_of(colmax[c - c0]));
  }
};

/// The encode pass. Item = a 2x2 quad of the source (rows 2qr, 2qr+1; cols 2qc, 2qc+1): each source
/// element is read once and written to the rowwise and/or the transposed output. The quad keeps FP4
/// pairs whole in both directions (rowwise pairs along C, columnwise pairs along R).
struct EncodeQuads {
  const void* src;
  DType src_dtype;
  int64_t rows, cols;
  int64_t quads_c;
  bool rowwise, columnwise;
  ScaleLayout lr, lc;
  const float* mult_r;
  const float* mult_c;
  DType elem;
  uint8_t* out_r;
  uint8_t* out_c;

  SCALEMM_HD void operator()(int64_t item) const {
    const int64_t r0 = (item / quads_c) * 2, c0 = (item % quads_c) * 2;
    uint8_t qr[2][2] = {{0, 0}, {0, 0}}, qc[2][2] = {{0, 0}, {0, 0}};
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) {
        const int64_t r = r0 + i, c = c0 + j;
        if (r >= rows || c >= cols) continue;
        const float x = load_hp(src, src_dtype, r * cols + c);
        if (rowwise) {
          const float m = mult_r[(r / lr.block_rows()) * lr.kblocks() + c / lr.block_k()];
          qr[i][j] = encode_elem(x * m, elem);
        }
        if (columnwise) {
          const float m = mult_c[(c / lc.block_rows()) * lc.kblocks() + r / lc.block_k()];
          qc[i][j] = encode_elem(x * m, elem);
        }
      }
    const bool fp4 = elem == DType::kE2M1;
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) {
        const int64_t r = r0 + i, c = c0 + j;
        if (r >= rows || c >= cols) continue;
        if (rowwise) {
          if (!fp4) out_r[r * cols + c] = qr[i][j];
          else if (j == 0) out_r[(r * cols + c) / 2] = uint8_t((qr[i][0] & 0xF) | (qr[i][1] << 4));
        }
        if (columnwise) {  // transposed: element (c, r) of the (C, R) output
          if (!fp4) out_c[c * rows + r] = qc[i][j];
          else if (i == 0) out_c[(c * rows + r) / 2] = uint8_t((qc[0][j] & 0xF) | (qc[1][j] << 4));
        }
      }
  }
};

// ---- dequantization and the reference GEMM --------------------------------------------------------

/// Plain-value view of a QuantizedTensor for device code.
struct OperandView {
  const void* data;
  DType dtype;
  int64_t ld;
  const void* scales;
  ScaleLayout layout;
  const float* global;

  /// Data element i (= r * ld + kk) decoded to fp32.
  SCALEMM_HD float element(int64_t i) const {
    switch (dtype) {
      case DType::kE4M3: return fmt::decode_e4m3(static_cast<const uint8_t*>(data)[i]);
      case DType::kE5M2: return fmt::decode_e5m2(static_cast<const uint8_t*>(data)[i]);
      case DType::kE2M1: return fmt::decode_e2m1(fmt::get_e2m1(static_cast<const uint8_t*>(data), i));
      default: return load_hp(data, dtype, i);
    }
  }
  /// The scale at buffer index so, decoded to fp32.
  SCALEMM_HD float scale_at(int64_t so) const {
    switch (layout.scale_dtype()) {
      case DType::kE8M0: return fmt::decode_e8m0(static_cast<const uint8_t*>(scales)[so]);
      case DType::kUE4M3: return fmt::decode_ue4m3(static_cast<const uint8_t*>(scales)[so]);
      default: return static_cast<const float*>(scales)[so];
    }
  }
  /// decode(q) * scale [* global], left to right in fp32.
  SCALEMM_HD float apply(float q, float s) const {
    float v = q * s;
    if (global) v = v * global[0];
    return v;
  }
  /// value(r, kk) = decode(q) * scale [* global], left to right in fp32.
  SCALEMM_HD float value(int64_t r, int64_t kk) const {
    return apply(element(r * ld + kk), scale_at(layout.offset(r, kk / layout.block_k())));
  }
};

/// Item = element (r, kk): out[r * k + kk] = value(r, kk) as out_dtype.
struct Dequantize {
  OperandView t;
  void* out;
  DType out_dtype;
  SCALEMM_HD void operator()(int64_t i) const {
    const int64_t k = t.layout.k;
    store_hp(out, out_dtype, i, t.value(i / k, i % k));
  }
};

/// Epilogue shared by every GEMM path: alpha * acc, then + bias, then the output cast.
SCALEMM_HD inline void gemm_store(void* d, DType out_dtype, int64_t idx, float acc, float alpha, const float* bias,
                                  int64_t n) {
  float v = alpha * acc;
  if (bias) v = v + bias[n];
  store_hp(d, out_dtype, idx, v);
}

/// Reference GEMM over fp32 dequantized operands (A (M, K), B (N, K) row-major). Item = output (m, n).
/// Sequential fma in K order, accumulating in Acc: float (fmaf: the GPU tiled kernel performs the same
/// operations per output) or, on the host only, double. Then alpha, the bias, and one rounding to D.
SCALEMM_HD inline float ref_fma(float x, float y, float acc) { return fmaf(x, y, acc); }
inline double ref_fma(double x, double y, double acc) { return std::fma(x, y, acc); }  // host only

template <class Acc>
struct GemmRef {
  const float* a;
  const float* b;
  int64_t m, n, k;
  Acc alpha;
  const float* bias;
  void* d;
  DType out_dtype;
  int64_t ldd;
  SCALEMM_HD void operator()(int64_t i) const {
    const int64_t row = i / n, col = i % n;
    const float* pa = a + row * k;
    const float* pb = b + col * k;
    Acc acc = 0;
    for (int64_t kk = 0; kk < k; ++kk) acc = ref_fma(Acc(pa[kk]), Acc(pb[kk]), acc);
    Acc v = alpha * acc;
    if (bias) v = v + Acc(bias[col]);
    store_hp(d, out_dtype, row * ldd + col, float(v));
  }
};
using GemmF32 = GemmRef<float>;

}  // namespace scalemm::numerics::detail
