// The emulated backend: exact dequantization of MX/NVFP4 operands to BF16, then a cuBLASLt BF16 GEMM
// with fp32 accumulation. Its device steps are declared here for the tests that check them alone.
#pragma once

#include <cstdint>

#include "scalemm/gemm.hpp"
#include "scalemm/layouts/scale_layout.hpp"

namespace scalemm::backends {

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

}  // namespace scalemm::backends
