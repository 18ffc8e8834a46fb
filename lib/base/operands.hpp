// GEMM operands as the reference emulator sees them.
#pragma once

#include <cstdint>

#include "scalemm/emulation/emulation.hpp"
#include "scalemm/gemm.hpp"
#include "scalemm/layouts/scale_layout.hpp"

namespace scalemm::base {

/// The emulator's view of one GEMM operand of `rows` x `k` (global scale excluded: callers fold it
/// into alpha, as the cuBLASLt paths do).
inline emulation::QuantizedTensor as_quantized(const GemmOperand& op, int64_t rows, int64_t k) {
  emulation::QuantizedTensor t;
  t.data = op.data;
  t.dtype = op.dtype;
  t.scales = op.scale;
  t.layout = layouts::ScaleLayout(op.recipe, rows, k, op.scale_format);
  return t;
}

}  // namespace scalemm::base
