// Validation of scale tensors against their layout contract (cuBLASLt contract §7).
//
// Every rule answers with scalemm::Diagnostic values naming the argument ("scale_b"), a stable rule
// id, what was expected, what was given and how to fix it. Nothing here throws for a bad buffer:
// "invalid" is a normal answer. Positions are always computed with ScaleLayout::offset(); strides
// that a rank-2 view must have are read off offset() too (offset(step,0)-offset(0,0), ...), so no
// second copy of any layout formula exists.
//
// Content checks (values, padding) run directly on host data. For device data they are opt-in and
// live in scalemm/layouts/convert_cuda.hpp (check_content_async / validate_device), because this
// header belongs to the CUDA-free target scalemm_layouts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "scalemm/config.hpp"
#include "scalemm/formats.hpp"
#include "scalemm/layouts/scale_layout.hpp"
#include "scalemm/status.hpp"
#include "scalemm/types.hpp"

namespace scalemm::layouts {

/// Stable rule identifiers (the `rule` field of a Diagnostic).
namespace rules {
inline constexpr const char* kNull = "scale-null";
inline constexpr const char* kDType = "scale-dtype";
inline constexpr const char* kElementCount = "scale-element-count";
inline constexpr const char* kShape = "scale-shape";
inline constexpr const char* kStrides = "scale-strides";
inline constexpr const char* kVec128KMajor = "vec128-k-major";          ///< VEC128 given as row-major (R, L)
inline constexpr const char* kBlk128KBlockStride = "blk128-kblock-stride";  ///< BLK ld L instead of L4
inline constexpr const char* kBlk128MMajor = "blk128-m-major";          ///< BLK given outer-major
inline constexpr const char* kMajorOrder = "scale-major-order";         ///< other transposed views
inline constexpr const char* kAlignment = "scale-alignment-16";
inline constexpr const char* kMemorySpace = "scale-memory-space";
inline constexpr const char* kPaddingNonzero = "scale-padding-nonzero";
inline constexpr const char* kE8M0Nan = "e8m0-nan";
inline constexpr const char* kUE4M3Nan = "ue4m3-nan";
inline constexpr const char* kF32NonPositive = "f32-scale-non-positive";
inline constexpr const char* kF32NonFinite = "f32-scale-non-finite";
inline constexpr const char* kReplicaMismatch = "mxfp8-32x32-replica-mismatch";
// GEMM-side conditions.
inline constexpr const char* kDims = "gemm-dims-positive";
inline constexpr const char* kRecipePair = "gemm-recipe-pair";
inline constexpr const char* kFp8KMultiple16 = "fp8-k-multiple-16";
inline constexpr const char* kFp4KMultiple32 = "fp4-k-multiple-32";
inline constexpr const char* kVec128Outer4 = "vec128-outer-multiple-4";
inline constexpr const char* kBlk128Outer4 = "blk128-outer-multiple-4";
inline constexpr const char* kBlk128Both = "blk128-both-operands";
}  // namespace rules

/// Content rules that a host loop or a device kernel can count.
enum class ContentRule : int {
  kPaddingNonzero = 0,  ///< a padding element is not zero
  kE8M0Nan = 1,         ///< E8M0 code 0xFF
  kUE4M3Nan = 2,        ///< UE4M3 code 0x7F/0xFF
  kF32NonPositive = 3,  ///< fp32 scale <= 0 (or -0)
  kF32NonFinite = 4,    ///< fp32 scale NaN or Inf
  kReplicaMismatch = 5, ///< mxfp8-32x32 cublaslt: a row differs from the first row of its 32-row block
};
inline constexpr int kContentRuleCount = 6;
const char* content_rule_id(ContentRule r);

/// Counts of content violations: filled by the host check or (in device memory) by the device kernel.
/// first_offset holds the smallest buffer index that broke each rule (~0ull when none).
struct ContentReport {
  unsigned long long count[kContentRuleCount];
  unsigned long long first_offset[kContentRuleCount];
  unsigned int any;  ///< the error flag: nonzero when any count is nonzero
  unsigned int reserved;

  static ContentReport empty() {
    ContentReport r{};
    for (int i = 0; i < kContentRuleCount; ++i) r.first_offset[i] = ~0ull;
    return r;
  }
};

/// The content rule broken by one real scale value with raw bits `bits` (-1 when fine). Shared by the
/// host check and the device kernel.
SCALEMM_HD constexpr int content_violation(DType dtype, uint32_t bits) {
  if (dtype == DType::kE8M0) return bits == formats::kE8M0Nan ? int(ContentRule::kE8M0Nan) : -1;
  if (dtype == DType::kUE4M3) return (bits & 0x7Fu) == 0x7Fu ? int(ContentRule::kUE4M3Nan) : -1;
  if (dtype == DType::kF32) {
    if ((bits & 0x7F800000u) == 0x7F800000u) return int(ContentRule::kF32NonFinite);
    if ((bits >> 31) || bits == 0) return int(ContentRule::kF32NonPositive);
  }
  return -1;
}

struct ValidateOptions {
  /// Check values and padding when the data is in host memory (device: see convert_cuda.hpp).
  bool check_content = true;
  /// When set, the tensor must live in this memory space (cuBLASLt needs kDevice).
  std::optional<MemorySpace> required_space;
  /// Require 16-byte alignment of the data pointer. Defaults to on for the cublaslt format.
  std::optional<bool> require_alignment;
};

/// Validates a scale tensor against the layout it must have. Rules: null, dtype (E8M0/UE4M3 also
/// accept U8 as raw bytes), element count, shape and strides (rank 1: a flat buffer of size();
/// rank 2: (stored rows, K-blocks) or (K-blocks, stored rows) with strides read off offset(); the
/// tiled layouts only as a flat buffer or (padded_rows, padded_kblocks) contiguous), alignment,
/// memory space, and, for host data, the content rules.
Diagnostics validate_scale(const TensorRef& scale, const ScaleLayout& layout, std::string_view argument,
                           const ValidateOptions& options = {});

/// Content rules over a raw buffer of layout.size() elements in host memory.
ContentReport check_content(const ScaleLayout& layout, const void* scales);
/// Turns a ContentReport into diagnostics (one per broken rule, with count and first offset).
Diagnostics content_diagnostics(const ScaleLayout& layout, const ContentReport& report,
                                std::string_view argument);

/// GEMM-side conditions of the cuBLASLt contract for D = A * B^T with A (m x k) scaled by
/// recipe_a and B (n x k) scaled by recipe_b: positive dims, supported recipe pair, FP8 K % 16,
/// FP4 K % 32, VEC128/BLK128x128 outer dimension % 4, no BLK128x128 x BLK128x128.
Diagnostics validate_gemm(Recipe recipe_a, Recipe recipe_b, int64_t m, int64_t n, int64_t k);

}  // namespace scalemm::layouts
