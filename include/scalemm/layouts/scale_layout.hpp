// The scale-layout contract: where the scale of each block of an operand lives.
//
// One operand (A: rows = M, B: rows = N; both K-contiguous) with one recipe has a logical grid of
// scales, one per block of data elements, and a physical buffer in one of two formats:
//   compact   the dense row-major grid that quantizers and checkpoints produce;
//   cublaslt  exactly the buffer cuBLASLt reads (outer-major, padded, or 128x4-tiled).
// `offset(r, kb)` is THE formula: the buffer index of the scale that applies to data row r and K-block
// kb. Validation, conversion kernels, the emulator, the CLI and the tests all call it; no other copy of
// these formulas exists. Buffer positions that no (r, kb) reaches are padding and must be zero.
//
//   recipe        block     scale  compact grid (row-major)     cublaslt buffer
//   tensorwise    R x K     f32    (1,)                          same
//   rowwise       1 x K     f32    (R,)                          same (OUTER_VEC_32F)
//   block1x128    1 x 128   f32    (R, L)        L = ceil(K/128) kb*R4 + r, R4 = roundup(R,4) (VEC128_32F)
//   block128x128  128x128   f32    (ceil(R/128), L)              (r/128)*L4 + kb, L4 = roundup(L,4) (BLK128x128_32F)
//   mxfp8         1 x 32    e8m0   (R, S)        S = ceil(K/32)  128x4 tiles (VEC32_UE8M0)
//   mxfp8-32x32   32 x 32   e8m0   (ceil(R/32), S)               replicated to rows, then 128x4 tiles
//   nvfp4         1 x 16    ue4m3  (R, S)        S = ceil(K/16)  128x4 tiles (VEC16_UE4M3) (+ global f32)
//
// 128x4 tile offset (cuBLAS docs "block scaling factors layout"): rows padded to roundup(R,128),
// scale columns to S4 = roundup(S,4);
//   offset = ((r/128)*(S4/4) + s/4)*512 + (r%32)*16 + ((r%128)/32)*4 + s%4
#pragma once

#include <cstdint>
#include <string>

#include "scalemm/config.hpp"
#include "scalemm/types.hpp"

namespace scalemm::layouts {

SCALEMM_HD constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
SCALEMM_HD constexpr int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

/// Scale element type of a recipe.
SCALEMM_HD constexpr DType recipe_scale_dtype(Recipe r) {
  return r == Recipe::kMxfp8 || r == Recipe::kMxfp8_32x32 ? DType::kE8M0
         : r == Recipe::kNvfp4                             ? DType::kUE4M3
                                                           : DType::kF32;
}

/// True for the recipes whose cuBLASLt buffer is the 128x4-tiled layout.
SCALEMM_HD constexpr bool recipe_is_tiled(Recipe r) {
  return r == Recipe::kMxfp8 || r == Recipe::kMxfp8_32x32 || r == Recipe::kNvfp4;
}

/// The scale layout of one operand. A small value: copy it into kernels freely.
struct ScaleLayout {
  Recipe recipe = Recipe::kTensorwise;
  int64_t rows = 0;  ///< R: M for operand A, N for operand B
  int64_t k = 0;     ///< K: reduction length in elements (unpacked for FP4)
  ScaleFormat format = ScaleFormat::kCompact;

  SCALEMM_HD constexpr ScaleLayout() = default;
  SCALEMM_HD constexpr ScaleLayout(Recipe r, int64_t rows_, int64_t k_, ScaleFormat f)
      : recipe(r), rows(rows_), k(k_), format(f) {}

  /// The same operand in the other format.
  SCALEMM_HD constexpr ScaleLayout with_format(ScaleFormat f) const { return {recipe, rows, k, f}; }

  SCALEMM_HD constexpr DType scale_dtype() const { return recipe_scale_dtype(recipe); }
  SCALEMM_HD constexpr int scale_bytes() const { return scale_dtype() == DType::kF32 ? 4 : 1; }

  /// Data rows covered by one scale (tensorwise: all of them).
  SCALEMM_HD constexpr int64_t block_rows() const {
    switch (recipe) {
      case Recipe::kTensorwise: return rows > 0 ? rows : 1;
      case Recipe::kBlock128x128: return 128;
      case Recipe::kMxfp8_32x32: return 32;
      default: return 1;
    }
  }
  /// K elements covered by one scale (tensorwise/rowwise: all of K).
  SCALEMM_HD constexpr int64_t block_k() const {
    switch (recipe) {
      case Recipe::kTensorwise:
      case Recipe::kRowwise: return k > 0 ? k : 1;
      case Recipe::kBlock1x128:
      case Recipe::kBlock128x128: return 128;
      case Recipe::kMxfp8:
      case Recipe::kMxfp8_32x32: return 32;
      case Recipe::kNvfp4: return 16;
    }
    return 1;
  }

  /// Logical grid: one scale per (grid row, K-block).
  SCALEMM_HD constexpr int64_t grid_rows() const { return ceil_div(rows, block_rows()); }
  // Divisions by literal block sizes: these run per element in kernels, and a 64-bit division by a
  // run-time value costs ~100 instructions on a GPU. Same values as ceil_div(k, block_k()).
  SCALEMM_HD constexpr int64_t kblocks() const {
    switch (recipe) {
      case Recipe::kTensorwise:
      case Recipe::kRowwise: return k > 0 ? 1 : 0;
      case Recipe::kBlock1x128:
      case Recipe::kBlock128x128: return (k + 127) / 128;
      case Recipe::kMxfp8:
      case Recipe::kMxfp8_32x32: return (k + 31) / 32;
      case Recipe::kNvfp4: return (k + 15) / 16;
    }
    return ceil_div(k, block_k());
  }
  SCALEMM_HD constexpr int64_t logical_size() const { return grid_rows() * kblocks(); }

  // ---- physical buffer --------------------------------------------------------------------------
  /// Rows of the buffer as cuBLASLt sees them: the padded outer extent.
  SCALEMM_HD constexpr int64_t padded_rows() const {
    if (format == ScaleFormat::kCompact) return grid_rows();
    switch (recipe) {
      case Recipe::kBlock1x128: return round_up(rows, 4);
      case Recipe::kBlock128x128: return grid_rows();
      case Recipe::kMxfp8:
      case Recipe::kMxfp8_32x32:
      case Recipe::kNvfp4: return round_up(rows, 128);
      default: return grid_rows();
    }
  }
  /// K-blocks of the buffer, padded where cuBLASLt wants a multiple of 4.
  SCALEMM_HD constexpr int64_t padded_kblocks() const {
    if (format == ScaleFormat::kCublasLt &&
        (recipe == Recipe::kBlock128x128 || recipe_is_tiled(recipe)))
      return round_up(kblocks(), 4);
    return kblocks();
  }
  /// Data rows that share one stored row of this buffer: block_rows(), except that the cuBLASLt
  /// buffer of mxfp8-32x32 replicates each 32x32 scale to all 32 rows (1).
  SCALEMM_HD constexpr int64_t row_step() const {
    return format == ScaleFormat::kCublasLt && recipe == Recipe::kMxfp8_32x32 ? 1 : block_rows();
  }
  /// Stored rows that hold real scales; stored rows real_rows() .. padded_rows()-1 are padding.
  SCALEMM_HD constexpr int64_t real_rows() const { return ceil_div(rows, row_step()); }
  /// True when stored position (p, kb) of the padded grid holds a real scale (else padding).
  SCALEMM_HD constexpr bool is_real(int64_t p, int64_t kb) const {
    return p * row_step() < rows && kb < kblocks();
  }
  /// True when some buffer position is padding (is_real false); false when every position holds a
  /// real scale, so a writer of all real scales leaves nothing to clear.
  SCALEMM_HD constexpr bool has_padding() const {
    return padded_rows() != real_rows() || padded_kblocks() != kblocks();
  }
  /// The padded grid: stored rows p < padded_rows() and K-blocks kb < padded_kblocks().
  /// offset(p * row_step(), kb) maps the padded grid one-to-one onto [0, size()) (tests check it);
  /// conversions and content checks walk this grid so that every buffer element is visited once.
  SCALEMM_HD constexpr int64_t padded_offset(int64_t p, int64_t kb) const { return offset(p * row_step(), kb); }

  /// Scale elements in the buffer, padding included.
  SCALEMM_HD constexpr int64_t size() const { return padded_rows() * padded_kblocks(); }
  SCALEMM_HD constexpr int64_t bytes() const { return size() * scale_bytes(); }

  /// Buffer index of the scale for data row r (0 <= r < rows) and K-block kb (0 <= kb < kblocks()).
  /// In every layout it is a row term plus a K-block term: offset(r, kb) == offset(r, 0) +
  /// offset(0, kb) (tested), so a kernel writing many K-blocks of one row takes the row term once.
  SCALEMM_HD constexpr int64_t offset(int64_t r, int64_t kb) const {
    SCALEMM_ASSUME(r >= 0 && kb >= 0 && rows >= 0 && k >= 0);
    switch (recipe) {
      case Recipe::kTensorwise: return 0;
      case Recipe::kRowwise: return r;
      case Recipe::kBlock1x128:
        return format == ScaleFormat::kCompact ? r * kblocks() + kb : kb * round_up(rows, 4) + r;
      case Recipe::kBlock128x128: return int64_t(uint64_t(r) / 128) * padded_kblocks() + kb;
      case Recipe::kMxfp8:
      case Recipe::kNvfp4:
        return format == ScaleFormat::kCompact ? r * kblocks() + kb : tiled_offset(r, kb);
      case Recipe::kMxfp8_32x32:
        return format == ScaleFormat::kCompact ? int64_t(uint64_t(r) / 32) * kblocks() + kb : tiled_offset(r, kb);
    }
    return 0;
  }
  /// Step of the row term between rows 32 apart in one aligned 128-row group: in every layout
  /// offset(r + 32 * i, kb) == offset(r, kb) + i * row32_step() when r % 128 + 32 * i < 128 (i may be
  /// negative; tested), so a kernel writing the scales of rows r, r + 32, r + 64, r + 96 locates one.
  SCALEMM_HD constexpr int64_t row32_step() const { return offset(32, 0) - offset(0, 0); }
  /// Step of the row term between adjacent rows of one aligned 32-row group: in every layout
  /// offset(r + 1, kb) == offset(r, kb) + row1_step() when r % 32 < 31 (tested), so a kernel writing
  /// the scales of rows r and r + 1 (r even) locates one.
  SCALEMM_HD constexpr int64_t row1_step() const { return offset(1, 0) - offset(0, 0); }
  /// Buffer index of the scale for data element (r, kk), 0 <= kk < k.
  SCALEMM_HD constexpr int64_t offset_of_element(int64_t r, int64_t kk) const {
    switch (recipe) {
      case Recipe::kTensorwise:
      case Recipe::kRowwise: return offset(r, 0);
      case Recipe::kBlock1x128:
      case Recipe::kBlock128x128: return offset(r, kk / 128);
      case Recipe::kMxfp8:
      case Recipe::kMxfp8_32x32: return offset(r, kk / 32);
      case Recipe::kNvfp4: return offset(r, kk / 16);
    }
    return offset(r, kk / block_k());
  }

  /// The 128x4 tile formula (valid for the tiled recipes in cublaslt format).
  /// Unsigned arithmetic (r, s >= 0): divisions and remainders by powers of two are then shifts and
  /// masks, without the sign fix-ups of signed ones (this runs once per scale in the kernels).
  SCALEMM_HD constexpr int64_t tiled_offset(int64_t r, int64_t s) const {
    const uint64_t ur = uint64_t(r), us = uint64_t(s), tiles_k = uint64_t(padded_kblocks()) / 4;
    return int64_t(((ur / 128) * tiles_k + us / 4) * 512 + (ur % 32) * 16 + ((ur % 128) / 32) * 4 + us % 4);
  }

  SCALEMM_HD constexpr bool operator==(const ScaleLayout& o) const {
    return recipe == o.recipe && rows == o.rows && k == o.k && format == o.format;
  }
  SCALEMM_HD constexpr bool operator!=(const ScaleLayout& o) const { return !(*this == o); }

  /// One line: "mxfp8 scales of a 200x96 operand, cublaslt: e8m0 256x4 (128x4 tiles), 1024 B".
  std::string to_string() const;
  /// Shape of the buffer as a (rows, cols):(row stride, col stride) pair, CuTe style.
  std::string shape_stride_string() const;
};

}  // namespace scalemm::layouts
