// Value types used by every scalemm component: element types, scaling recipes, scale formats,
// memory spaces and a non-owning tensor reference. Each enum has to_string/parse with the exact
// spellings the CLI, the C ABI and the docs use.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "scalemm/config.hpp"

struct CUstream_st;

namespace scalemm {

/// A CUDA stream (a cudaStream_t; nullptr = the legacy default stream): the one spelling every
/// scalemm header uses, so that none of them needs the CUDA headers.
using Stream = CUstream_st*;

/// Element types. Values are part of the C ABI (SCALEMM_DTYPE_*): never renumber.
enum class DType : uint8_t {
  kF32 = 0,
  kF16 = 1,
  kBF16 = 2,
  kE4M3 = 3,   ///< OCP FP8 E4M3FN (no Inf, NaN = S.1111.111)
  kE5M2 = 4,   ///< OCP FP8 E5M2 (IEEE-like)
  kE2M1 = 5,   ///< OCP FP4 E2M1, two per byte, element 2i in the low nibble
  kE8M0 = 6,   ///< OCP MX scale: 2^(e-127), 0xFF = NaN, unsigned
  kUE4M3 = 7,  ///< NVFP4 block scale: unsigned E4M3 (sign bit ignored on decode)
  kU8 = 8,     ///< raw bytes
};
inline constexpr int kDTypeCount = 9;

/// Bits per element (4 for E2M1).
SCALEMM_HD constexpr int dtype_bits(DType t) {
  switch (t) {
    case DType::kF32: return 32;
    case DType::kF16:
    case DType::kBF16: return 16;
    case DType::kE2M1: return 4;
    default: return 8;
  }
}
/// Bytes for n elements, rounding packed FP4 up to whole bytes.
SCALEMM_HD constexpr int64_t dtype_storage_bytes(DType t, int64_t n) {
  return (n * dtype_bits(t) + 7) / 8;
}

/// Scaling recipes: how the scale tensor of one operand tiles it. Values are part of the C ABI.
enum class Recipe : uint8_t {
  kTensorwise = 1,     ///< one fp32 scale
  kRowwise = 2,        ///< one fp32 scale per row (cuBLASLt OUTER_VEC_32F)
  kBlock1x128 = 3,     ///< fp32 per 1x128 along K (DeepSeek activations; VEC128_32F)
  kBlock128x128 = 4,   ///< fp32 per 128x128 (DeepSeek weights; BLK128x128_32F)
  kMxfp8 = 5,          ///< E8M0 per 1x32 along K (VEC32_UE8M0)
  kMxfp8_32x32 = 6,    ///< E8M0 per 32x32 (weights; replicated to 1x32 for cuBLASLt)
  kNvfp4 = 7,          ///< UE4M3 per 1x16 plus a global fp32 (VEC16_UE4M3)
};
inline constexpr std::array<Recipe, 7> kAllRecipes = {
    Recipe::kTensorwise, Recipe::kRowwise,     Recipe::kBlock1x128, Recipe::kBlock128x128,
    Recipe::kMxfp8,      Recipe::kMxfp8_32x32, Recipe::kNvfp4};

/// compact: what quantizers and checkpoints produce (dense row-major grid).
/// cublaslt: exactly the buffer cuBLASLt reads (outer-major, padded, or 128x4-tiled).
enum class ScaleFormat : uint8_t { kCompact = 0, kCublasLt = 1 };

enum class MemorySpace : uint8_t { kHost = 0, kDevice = 1 };

std::string_view to_string(DType t);
std::string_view to_string(Recipe r);
std::string_view to_string(ScaleFormat f);
std::string_view to_string(MemorySpace m);

/// Parsers accept the canonical spelling (as printed by to_string) and a few common aliases
/// ("fp32", "float8_e4m3fn", "mx", ...). They return nullopt on anything else.
std::optional<DType> parse_dtype(std::string_view s);
std::optional<Recipe> parse_recipe(std::string_view s);
std::optional<ScaleFormat> parse_scale_format(std::string_view s);
std::optional<MemorySpace> parse_memory_space(std::string_view s);

/// Like the parse_* functions but throw Error(kInvalidArgument) naming `argument` and listing
/// the accepted spellings.
DType parse_dtype_or_throw(std::string_view s, std::string_view argument);
Recipe parse_recipe_or_throw(std::string_view s, std::string_view argument);
ScaleFormat parse_scale_format_or_throw(std::string_view s, std::string_view argument);

/// Comma-separated canonical spellings, for help texts and error messages.
std::string all_dtype_names();
std::string all_recipe_names();

/// Non-owning view of a strided tensor in host or device memory.
/// Shapes and strides count logical elements (for E2M1: 4-bit elements; the innermost dimension of
/// an E2M1 tensor must be contiguous and even, since two elements share a byte).
struct TensorRef {
  static constexpr int kMaxRank = 4;

  void* data = nullptr;
  DType dtype = DType::kU8;
  int rank = 0;
  std::array<int64_t, kMaxRank> shape{};
  std::array<int64_t, kMaxRank> strides{};
  MemorySpace space = MemorySpace::kHost;

  /// Row-major contiguous tensor of the given shape.
  static TensorRef contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                              MemorySpace space = MemorySpace::kHost);

  int64_t numel() const;
  /// Bytes spanned from data to one past the last element (packed FP4 rounds up).
  int64_t span_bytes() const;
  bool is_contiguous() const;
  /// "e4m3[128, 256] strides (256, 1) on device @0x7f..."
  std::string to_string() const;
  /// "[128, 256]"
  std::string shape_string() const;
};

}  // namespace scalemm
