// The reference emulator: quantizers, dequantization and a reference GEMM for every scaling recipe.
//
// One source, compiled twice: the per-block and per-element functors live in numerics/detail and run
// through thrust::for_each on the host (Thrust CPP system, g++) and on the GPU (Thrust CUDA system,
// one nvcc translation unit). Host and GPU produce byte-identical quantized data and scales and
// bit-identical reference GEMM results (fp32 accumulation, fused multiply-add in K order).
//
// Conventions (scale modes, zero/NaN/Inf blocks, the NVFP4 arithmetic order) are in docs/emulation.md.
// Every scale is located through layouts::ScaleLayout::offset(); any scale format is accepted.
//
// Memory: the *_host functions take host pointers; the *_device functions take device pointers and
// enqueue on `stream` (no synchronisation). Device workspace: pass at least *_workspace_bytes() bytes,
// or nullptr to let the call allocate it stream-ordered (cudaMallocAsync/cudaFreeAsync).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "scalemm/layouts/scale_layout.hpp"
#include "scalemm/numerics/quantized.hpp"
#include "scalemm/types.hpp"

namespace scalemm::emulation {

// The quantization contract, shared with the library's quantizers (scalemm/numerics/quantized.hpp).
using numerics::ScaleMode;
using numerics::resolve_scale_mode;
using numerics::to_string;
using numerics::parse_scale_mode;
using numerics::SourceMatrix;
using numerics::QuantizeConfig;
using numerics::QuantizeOutputs;
using numerics::rowwise_layout;
using numerics::columnwise_layout;
using numerics::data_bytes;
using numerics::element_dtype;
using numerics::validate;
using numerics::QuantizedTensor;
using numerics::rowwise_operand;
using numerics::columnwise_operand;

/// The reference quantizer on host memory. Device memory: scalemm::quantize (scalemm/quantize.hpp),
/// the library's kernels, which give these bytes.
void quantize_host(const SourceMatrix& src, const QuantizeConfig& cfg, const QuantizeOutputs& out);

// ---- dequantization --------------------------------------------------------------------------

/// Dequantizes to a row-major (rows, k) matrix of out_dtype (kF32, kBF16 or kF16; RNE).
/// (Device memory: scalemm::quantize::dequantize.)
void dequantize_host(const QuantizedTensor& t, void* out, DType out_dtype = DType::kF32);

// ---- reference GEMM -----------------------------------------------------------------------------

/// D(M, N) = alpha * dequant(A)(M, K) * dequant(B)(N, K)^T (+ bias[N]), row-major D with row stride
/// ldd (0: N). Per output: acc = 0; for k in 0..K-1: acc = fma(a, b, acc) (fp32, or fp64 on the host
/// on request); d = alpha * acc; d = d + bias[n]; then RNE to out_dtype (fp64: to fp32 first).
struct GemmOptions {
  float alpha = 1.0f;
  const float* bias = nullptr;     ///< N floats, same memory space as the operands, or nullptr
  DType out_dtype = DType::kF32;   ///< kF32, kBF16 or kF16
  int64_t ldd = 0;
  bool fp64_accumulate = false;    ///< host only
};

void gemm_host(const QuantizedTensor& a, const QuantizedTensor& b, void* d, const GemmOptions& opt = {});
/// Workspace: fp32 dequantized A and B ((M + N) * K * 4 bytes, rounded to 256 B each).
size_t gemm_device_workspace_bytes(const QuantizedTensor& a, const QuantizedTensor& b);
void gemm_device(const QuantizedTensor& a, const QuantizedTensor& b, void* d, const GemmOptions& opt,
                 void* workspace, size_t workspace_bytes, Stream stream);

/// fp32 tiled SGEMM used by gemm_device (exposed for benchmarks and tests): D = alpha*A*B^T (+bias),
/// A (M, K), B (N, K) row-major fp32 on the device, same per-output arithmetic as gemm_host.
void sgemm_nt_device(const float* a, const float* b, void* d, int64_t m, int64_t n, int64_t k,
                     const GemmOptions& opt, Stream stream);

// ---- grouped reference GEMMs ----------------------------------------------------------------------
//
// Each group's operands are ordinary QuantizedTensors (each with its own scale layout and scale
// pointer, as grouped cuBLASLt/TE buffers are laid out per group). The helpers below build them from
// one big buffer; the GEMMs then run group by group.

/// 2D x 3D ("row groups", MoE forward): A (M_total, K) split at row offsets offs[0..G] (offs[0] = 0,
/// offs[G] = M_total, non-decreasing), B[g] (N, K); D (M_total, N), group g writes rows
/// [offs[g], offs[g+1]). a[g] and b[g] describe the G groups.
void grouped_gemm_rows_host(const QuantizedTensor* a, const QuantizedTensor* b, const int64_t* offs, int groups,
                            void* d, const GemmOptions& opt = {});
void grouped_gemm_rows_device(const QuantizedTensor* a, const QuantizedTensor* b, const int64_t* offs, int groups,
                              void* d, const GemmOptions& opt, void* workspace, size_t workspace_bytes,
                              Stream stream);

/// 2D x 2D ("K groups", MoE weight gradient): group g reduces over K range [koffs[g], koffs[g+1]) and
/// writes D[g] (M, N) at d + g*M*N elements. a[g] (M, K_g) and b[g] (N, K_g).
void grouped_gemm_k_host(const QuantizedTensor* a, const QuantizedTensor* b, int groups, void* d,
                         const GemmOptions& opt = {});
void grouped_gemm_k_device(const QuantizedTensor* a, const QuantizedTensor* b, int groups, void* d,
                           const GemmOptions& opt, void* workspace, size_t workspace_bytes, Stream stream);
/// Workspace for the grouped device GEMMs: the largest group's gemm_device_workspace_bytes.
size_t grouped_gemm_device_workspace_bytes(const QuantizedTensor* a, const QuantizedTensor* b, int groups);

/// A sub-view of rows [r0, r1) of a K-contiguous operand whose scales for those rows live at
/// `scales` in `format` (a group's own layout, as produced by quantizing the group separately).
QuantizedTensor row_slice(const QuantizedTensor& t, int64_t r0, int64_t r1, const void* scales);
/// A sub-view of K range [k0, k1) (k0 even for E2M1) with its own scales in `format`.
QuantizedTensor k_slice(const QuantizedTensor& t, int64_t k0, int64_t k1, const void* scales);

}  // namespace scalemm::emulation
