// The quantization contract that the reference emulator (emulation.hpp) and the library's quantizers
// (quantize.hpp) both implement, byte for byte: the request (source, recipe, scale mode, outputs), its
// validation, the output layouts, and a quantized operand as the GEMMs read it. Scale modes and the
// arithmetic of each are in docs/emulation.md.
#pragma once

#include <cstddef>
#include <cstdint>

#include "scalemm/layouts/scale_layout.hpp"
#include "scalemm/types.hpp"

namespace scalemm::numerics {

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

/// Throws Error(kInvalidArgument) for a malformed operand (`name` leads the message) or dequantization request.
void check_operand(const QuantizedTensor& t, const char* name);
void check_dequantize_args(const QuantizedTensor& t, const void* out, DType out_dtype);

}  // namespace scalemm::numerics
