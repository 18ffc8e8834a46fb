// The library's fast GPU quantizers (fast_quantizers.cu): what scalemm::quantize (quantize/api.cu)
// runs. The reference emulator (emulation/) is the oracle they are checked against; both implement
// the contract of scalemm/numerics/quantized.hpp with the arithmetic of numerics/detail.
#pragma once

#include <cstdint>

#include "scalemm/numerics/quantized.hpp"

namespace scalemm::quantize::kernels {

using numerics::QuantizeConfig;
using numerics::QuantizedTensor;
using numerics::QuantizeOutputs;
using numerics::SourceMatrix;

/// Scratch floats of the fast path: amax partials, 4 global scalars, per-row and per-column
/// multipliers (rowwise recipe; 1 each for tensorwise), column chunk partials (rowwise recipe).
struct FastPlan {
  int64_t n_part = 0, n_pm_r = 0, n_pm_c = 0, n_colpart = 0, chunks = 0;
  int64_t floats() const { return n_part + 4 + n_pm_r + n_pm_c + n_colpart; }
};

FastPlan plan_fast(const SourceMatrix& src, const QuantizeConfig& cfg);

/// The fast path; false when it does not apply (empty shapes), then the generic functors run.
bool quantize(const SourceMatrix& src, const QuantizeConfig& cfg, const QuantizeOutputs& out, float* scratch,
              Stream st);

/// Grouped rows gathered from a source of source_rows rows (quantize::TokenGroups::gather); index null: none.
struct GatherRows {
  const int64_t* index = nullptr;
  int64_t source_rows = 0;
  const float* row_weight = nullptr;
};

/// quantize::quantize_grouped after validation: rc1d_kernel over the R padded rows.
void quantize_grouped(const SourceMatrix& src, const QuantizeConfig& cfg, const int64_t* group_sizes, int64_t groups,
                      int64_t padded_rows, const GatherRows& gather, const QuantizeOutputs& out, Stream st);

/// The fused activations (fast_quantizers.cu, kAct*): 1 GELU, 2 GELU's input gradient, 3 SwiGLU,
/// 4 SwiGLU's gate gradient, 5 its up gradient; aux and aux2 the further inputs each one reads.
enum FusedActivation : int { kGelu = 1, kGeluGrad = 2, kSwiglu = 3, kSwigluGate = 4, kSwigluUp = 5 };

/// quantize::quantize_activation(_grad) and quantize_swiglu(_grad) after validation: rc1d_act_kernel.
void quantize_activation(int act, const SourceMatrix& src, const void* aux, const void* aux2,
                         const QuantizeConfig& cfg, const QuantizeOutputs& out, Stream st);

/// quantize::quantize_grouped_swiglu(_grad) after validation: rc1d_grouped_act_kernel over the R padded
/// rows. grad false: SwiGLU of src (the gate half, rows ld_src apart) and gate_up + inter (the up half);
/// true: src the product's gradient (M, inter), the (M, 2 inter) output the gradients of both halves.
void quantize_grouped_swiglu(bool grad, const SourceMatrix& src, int64_t ld_src, const void* gate_up, int64_t inter,
                             const QuantizeConfig& cfg, const int64_t* group_sizes, int64_t groups, int64_t padded_rows,
                             const QuantizeOutputs& out, Stream st);

/// The activation alone, as the fused kernels compute it: n bf16/f16 elements rounded to dtype.
void apply_activation(int act, const void* src, const void* aux, const void* aux2, int64_t n, DType dtype, void* out,
                      Stream st);

/// out = dequantize(q) on the GPU, in f32, bf16 or f16.
void dequantize(const QuantizedTensor& q, void* out, DType out_dtype, Stream st);

/// dst = each (rows, cols) row-major matrix of 1-byte elements transposed (batch of them, packed).
void transpose_bytes(const void* src, int64_t batch, int64_t rows, int64_t cols, void* dst, Stream st);

}  // namespace scalemm::quantize::kernels
