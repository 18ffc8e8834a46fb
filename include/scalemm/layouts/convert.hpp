// Host conversions between scale layouts (plain C++, part of scalemm_layouts: no CUDA needed).
// The same operations run on the GPU through scalemm/layouts/convert_cuda.hpp, byte-identically.
//
// Buffers are raw: `layout.size()` elements of `layout.scale_bytes()` bytes each (fp32 or one-byte
// E8M0/UE4M3 codes), copied bit for bit. Every destination element is written exactly once;
// padding is written as zero. Source and destination must not overlap. Mismatched layouts throw
// scalemm::Error(kInvalidArgument) naming the argument.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scalemm/layouts/scale_layout.hpp"
#include "scalemm/status.hpp"
#include "scalemm/types.hpp"

namespace scalemm::layouts {

/// Re-lays out the scales of one operand: `from` and `to` must agree on recipe, rows and k.
void convert(const ScaleLayout& from, const void* src, const ScaleLayout& to, void* dst);
/// compact -> cublaslt (`compact.format` must be kCompact); dst holds compact.with_format(kCublasLt).size().
void to_cublaslt(const ScaleLayout& compact, const void* src, void* dst);
/// cublaslt -> compact (`cublaslt.format` must be kCublasLt). For mxfp8-32x32 the first row of each
/// 32-row block is read (validate_scale checks that the replicas agree).
void to_compact(const ScaleLayout& cublaslt, const void* src, void* dst);

/// Convenience forms returning a new buffer of bytes.
std::vector<uint8_t> to_cublaslt(const ScaleLayout& compact, const void* src);
std::vector<uint8_t> to_compact(const ScaleLayout& cublaslt, const void* src);

// ---- transposes ----------------------------------------------------------------------------------
/// True for the recipes whose scale grid transposes exactly (square blocks: block128x128, mxfp8-32x32).
constexpr bool recipe_transposes_exactly(Recipe r) {
  return r == Recipe::kBlock128x128 || r == Recipe::kMxfp8_32x32;
}
/// The layout of the transposed operand: rows = l.k, k = l.rows, same recipe; `format` as given.
ScaleLayout transposed(const ScaleLayout& l, ScaleFormat format);
/// Scales of the transposed operand (W^T for a weight W): no requantization needed. `to` must be
/// transposed(from, to.format). Any format on either side.
void transpose(const ScaleLayout& from, const void* src, const ScaleLayout& to, void* dst);

// ---- block128x128 -> mxfp8 -------------------------------------------------------------------------
/// Result of broadcasting fp32 128x128 scales to E8M0 scales.
struct BroadcastResult {
  int64_t inexact = 0;              ///< fp32 scales that are not a power of two in E8M0 range
  int64_t first_inexact_index = -1;  ///< source buffer index of the first one
  float first_inexact_value = 0.0f;
  bool exact() const { return inexact == 0; }
  /// Empty when exact, else one diagnostic (rule "blk128-to-mxfp8-not-power-of-two").
  Diagnostics diagnostics(std::string_view argument) const;
};
/// The mxfp8 layout the broadcast produces for `blk` (recipe kMxfp8 or kMxfp8_32x32).
ScaleLayout mxfp8_layout_for(const ScaleLayout& blk, Recipe target, ScaleFormat format);
/// block128x128 fp32 scales -> E8M0 scales of recipe `to.recipe` (kMxfp8 or kMxfp8_32x32, same rows
/// and k, either format). Exact when every scale is 2^e (code e + 127); inexact scales are counted
/// and written as 0xFF (NaN) so that the result can never be mistaken for a correct buffer.
BroadcastResult broadcast_block128_to_mxfp8(const ScaleLayout& from, const float* src, const ScaleLayout& to,
                                            uint8_t* dst);

// ---- grouped (ragged) operands --------------------------------------------------------------------
/// Groups of a concatenated operand: group g owns data rows [row_offsets[g], row_offsets[g+1]) and
/// its scales form their own buffer of ScaleLayout(recipe, rows_g, k, format). Buffers of
/// consecutive groups are concatenated; each cublaslt buffer is padded on its own.
/// Returns groups+1 element offsets of each group's buffer (the last = total elements).
std::vector<int64_t> grouped_offsets(Recipe recipe, int64_t k, ScaleFormat format, const int64_t* row_offsets,
                                     int groups);
/// Converts all groups (host arrays). row_offsets has groups+1 non-decreasing entries.
void convert_grouped(Recipe recipe, int64_t k, const int64_t* row_offsets, int groups, ScaleFormat from,
                     const void* src, ScaleFormat to, void* dst);

/// K-blocks [kb0, kb0 + to.kblocks()) of `from` written as the buffer `to` (same recipe and rows,
/// to.k <= from.k, either format; padding written as zero): one group of a k-grouped operand whose
/// K range starts at K-block kb0. Throws Error(kInvalidArgument) when the range does not fit.
void slice_kblocks(const ScaleLayout& from, const void* src, int64_t kb0, const ScaleLayout& to, void* dst);

}  // namespace scalemm::layouts
