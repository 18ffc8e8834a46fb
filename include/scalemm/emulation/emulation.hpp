// The reference emulator: quantizers, dequantization and a reference GEMM for every scaling recipe.
//
// One source, compiled twice: the per-block and per-element functors live in emulation/detail and run
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
#include "scalemm/types.hpp"

namespace scalemm::emulation {

/// How a block's amax becomes its scale. See docs/emulation.md for the exact arithmetic.
enum class ScaleMode : uint8_t {
  kDefault = 0,        ///< kAmax for fp32-scale recipes, kE8M0Rceil for MX, kNvfp4TwoLevel for NVFP4
  kAmax = 1,           ///< q = max_elem / max(amax, eps); stored = 1/q (dequantization scale)
  kAmaxPow2 = 2,       ///< as kAmax, q rounded down to a power of two (stored scale rounds up)
  kE8M0Floor = 3,      ///< OCP MX "suggested": X = 2^(floor(log2 amax) - emax_elem)
  kE8M0Rceil = 4,      ///< cuBLASLt/TE: X = 2^ceil(log2(amax / max_elem))
  kNvfp4TwoLevel = 5,  ///< per-16 UE4M3 + global fp32, cuBLASLt/TE/PyTorch arithmetic
};

/// The mode kDefault stands for with this recipe.
ScaleMode resolve_scale_mode(Recipe recipe, ScaleMode mode);
/// "amax", "amax-pow2", "e8m0-floor", "e8m0-rceil", "nvfp4"; and the parser for those names.
const char* to_string(ScaleMode mode);
bool parse_scale_mode(const char* name, ScaleMode* out);

/// A row-major (rows, cols) high-precision input: f32, bf16 or f16, contiguous rows of `cols`.
struct SourceMatrix {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  /// Optional, tensorwise and NVFP4 only: the tensor's amax, already known (one float in the memory
  /// space of `data`; its magnitude is used). The quantizer then reads the source once instead of
  /// twice (an amax pass, then the encode). For a producer that computes the amax as it writes the
  /// tensor, or for delayed scaling, where it comes from earlier steps: elements above the amax
  /// given saturate to +-max of the element type. Null: computed from the data.
  const float* amax = nullptr;
};

struct QuantizeConfig {
  Recipe recipe = Recipe::kTensorwise;
  DType data_dtype = DType::kE4M3;  ///< kE4M3 or kE5M2; kE2M1 for NVFP4 (the only choice there)
  ScaleMode mode = ScaleMode::kDefault;
  ScaleFormat format = ScaleFormat::kCompact;
  float eps = 1e-12f;               ///< amax floor of the fp32 modes
  bool rowwise = true;              ///< produce (R, C) data with scales along C (K = C)
  bool columnwise = false;          ///< produce the transposed (C, R) data with scales along R (K = R)
};

/// Output buffers. Data is row-major and contiguous; E2M1 is packed (element 2i in the low nibble),
/// so NVFP4 needs an even C for rowwise and an even R for columnwise output.
/// Scale buffers must hold layout.bytes(); the call writes every byte, padding as zero.
struct QuantizeOutputs {
  void* data = nullptr;            ///< rowwise: (R, C) elements of data_dtype
  void* scales = nullptr;          ///< rowwise: rowwise_layout(cfg, R, C)
  void* data_t = nullptr;          ///< columnwise: (C, R) elements (the transposed operand)
  void* scales_t = nullptr;        ///< columnwise: columnwise_layout(cfg, R, C)
  float* global_scale = nullptr;   ///< NVFP4: receives the global decode scale S_dec (same memory space)
};

/// Scale layout of the rowwise output of an (R, C) source: ScaleLayout(recipe, R, C, format).
layouts::ScaleLayout rowwise_layout(const QuantizeConfig& cfg, int64_t rows, int64_t cols);
/// Scale layout of the columnwise (transposed) output: ScaleLayout(recipe, C, R, format).
layouts::ScaleLayout columnwise_layout(const QuantizeConfig& cfg, int64_t rows, int64_t cols);
/// Bytes of one data output (rows*cols elements of data_dtype, FP4 packed).
int64_t data_bytes(const QuantizeConfig& cfg, int64_t rows, int64_t cols);
/// The element type the quantizer writes: e2m1 for nvfp4 (its only choice), else cfg.data_dtype.
inline DType element_dtype(const QuantizeConfig& cfg) {
  return cfg.recipe == Recipe::kNvfp4 ? DType::kE2M1 : cfg.data_dtype;
}

/// Throws Error(kInvalidArgument) naming what is wrong with this request.
void validate(const SourceMatrix& src, const QuantizeConfig& cfg, const QuantizeOutputs& out);

/// The reference quantizer on host memory. Device memory: scalemm::quantize (scalemm/quantize.hpp),
/// the library's kernels, which give these bytes.
void quantize_host(const SourceMatrix& src, const QuantizeConfig& cfg, const QuantizeOutputs& out);

// ---- quantized operands, dequantization --------------------------------------------------------

/// One K-contiguous quantized operand: data (rows, k) with row stride ld, scales in `layout`.
/// value(r, kk) = decode(data) * scale(layout.offset(r, kk / block_k)) [* *global_scale]
/// (NVFP4: (e2m1 * ue4m3) * S_dec, products taken left to right in fp32).
struct QuantizedTensor {
  const void* data = nullptr;
  DType dtype = DType::kE4M3;      ///< kE4M3, kE5M2, kE2M1, or kF32/kBF16/kF16 (scales then still apply)
  int64_t ld = 0;                  ///< row stride in elements; 0 means layout.k (must be even for E2M1)
  const void* scales = nullptr;
  layouts::ScaleLayout layout{};   ///< rows, k, recipe and scale format
  const float* global_scale = nullptr;  ///< optional extra factor (NVFP4 S_dec); same memory space

  int64_t rows() const { return layout.rows; }
  int64_t k() const { return layout.k; }
  int64_t row_stride() const { return ld > 0 ? ld : layout.k; }
};

/// The operands a quantize call produced, as QuantizedTensors.
QuantizedTensor rowwise_operand(const SourceMatrix& src, const QuantizeConfig& cfg, const QuantizeOutputs& out);
QuantizedTensor columnwise_operand(const SourceMatrix& src, const QuantizeConfig& cfg, const QuantizeOutputs& out);

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
