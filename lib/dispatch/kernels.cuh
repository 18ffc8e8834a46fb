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

/// Writes {value, 0.0f} to dst (device alpha/beta pair).
void write_alpha_beta(float* dst, float value, Stream stream);

/// An operand of the emulated backend: FP8/FP4 data (rows, K) and its E8M0/UE4M3 block scales.
struct EmulatedOperand {
  const void* data;
  DType dtype;
  const void* scales;
  layouts::ScaleLayout layout;
};

/// Device scratch of the emulated backend's prepare step (16 bytes, 4-byte aligned).
struct EmulatedShifts {
  int min_code[2];  // per operand, over its logical E8M0 scales
  int max_code[2];
};

/// Chooses, per operand, a power-of-two shift 2^s that keeps every dequantized value inside BF16's
/// exact range, and writes {alpha * 2^-(s_a + s_b), 0} to alpha_beta (device). E4M3 x 2^(c-127) is
/// exact in BF16 for E8M0 codes c in [3, 246] (E5M2: [10, 239]); below that the values fall under
/// BF16's subnormal floor (2^-133) while fp32 still holds them, so the operand is scaled up by up to
/// 3 binades (never past the top of the range) and alpha scaled down by the same power of two.
/// UE4M3-scaled (NVFP4) operands are always exact and get s = 0.
void emulated_prepare(const EmulatedOperand& a, const EmulatedOperand& b, float alpha, EmulatedShifts* shifts,
                      float* alpha_beta, Stream stream);

/// out (rows, K) bf16 = decode(q) * scale * 2^shift, exactly (K % 8 == 0). `shifts`/`which` select
/// the shift that emulated_prepare chose for this operand.
void emulated_dequantize_bf16(const EmulatedOperand& op, const EmulatedShifts* shifts, int which, uint16_t* out,
                              Stream stream);

}  // namespace scalemm::dispatch
