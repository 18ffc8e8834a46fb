// Small device helpers of the dispatch layer (declared here, defined in kernels.cu).
#pragma once

#include <cstdint>

#include "scalemm/gemm.hpp"
#include "scalemm/layouts/scale_layout.hpp"

namespace scalemm::dispatch {

/// dst[i] = *src for i < n (tensorwise scale broadcast to a rowwise vector).
void broadcast_scalar(const float* src, float* dst, int64_t n, Stream stream);

/// dst[i] = float(src[i]) for a bf16 vector (bias for the f32 reference path).
void bf16_to_f32(const uint16_t* src, float* dst, int64_t n, Stream stream);

/// One scale-buffer conversion (same recipe and operand, different format).
struct ScaleConversion {
  layouts::ScaleLayout from, to;
  const void* src;
  void* dst;
};

/// Destination elements up to which convert_scales_small is used: below it a GEMM's scale conversions
/// are launch-bound, and one launch for both operands halves what they cost (layouts::gpu::convert is
/// the bandwidth path for larger buffers).
constexpr int64_t kSmallConversionElements = int64_t(1) << 18;

/// Converts one or two scale buffers in one launch (element by element through offset(); padding
/// written as zero). Byte-identical to layouts::to_cublaslt / layouts::gpu::convert.
void convert_scales_small(const ScaleConversion* conv, int count, Stream stream);

/// FP8 output of a staged GEMM: d[i] = fp8(*d_scale * src[i]) (round to nearest even, saturating to
/// the largest finite value, NaN to NaN), and *d_amax = max |src[i]| when d_amax is set.
void finish_fp8_output(const float* src, void* d, DType d_dtype, int64_t count, const float* d_scale, float* d_amax,
                       Stream stream);

/// An operand of the emulated backend: FP8/FP4 data (rows, K) and its E8M0/UE4M3 block scales.
struct EmulatedOperand {
  const void* data;
  DType dtype;
  const void* scales;
  layouts::ScaleLayout layout;
};

/// Device scratch of the emulated backend's prepare step (4-byte aligned).
struct EmulatedShifts {
  int need[2];      // per operand: the smallest power-of-two shift that keeps its values exact in BF16
  int max_code[2];  // per operand: largest E8M0 code (the shift may not push it past the top)
  int shift[2];     // the chosen shifts (s_a = -s_b: the product, and so alpha, is unchanged)
  int inexact;      // 1 when no cancelling pair of shifts exists (see emulated_prepare)
  unsigned blocks_done;  // the prepare kernel's last block chooses the shifts
};

/// Chooses per-operand power-of-two shifts s_a = -s_b that keep every dequantized value of both
/// operands exact in BF16, so that the GEMM runs with the caller's alpha (host pointer mode).
/// E4M3 x 2^(c-127) is exact in BF16 when c >= 3 for E4M3 subnormal values and c >= 0 for normal
/// ones, and when c <= 246 (E5M2: 10, 0 and 239); all-zero blocks impose nothing. Only blocks whose
/// code is below 3 are inspected element by element, so the pass reads little more than the scales.
/// When the two operands' admissible shift ranges do not overlap after negation, both shifts stay 0
/// and `inexact` is set: some values of both operands then lie under BF16's subnormal floor. UE4M3
/// (NVFP4) operands are always exact and only absorb a shift when their range allows it.
void emulated_prepare(const EmulatedOperand& a, const EmulatedOperand& b, EmulatedShifts* shifts, Stream stream);

/// out (rows, K) bf16 = decode(q) * scale * 2^shift, exactly (K % 8 == 0).
void emulated_dequantize_bf16(const EmulatedOperand& op, const EmulatedShifts* shifts, int which, uint16_t* out,
                              Stream stream);

}  // namespace scalemm::dispatch
