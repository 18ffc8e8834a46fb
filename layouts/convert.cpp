#include "scalemm/layouts/convert.hpp"

#include <cstring>
#include <sstream>

#include "scalemm/layouts/detail/convert_ops.hpp"

namespace scalemm::layouts {
namespace {

void require(bool cond, const std::string& msg) {
  if (!cond) throw Error(StatusCode::kInvalidArgument, msg);
}

void require_buffers(const ScaleLayout& from, const void* src, const ScaleLayout& to, const void* dst,
                     const char* fn) {
  require(from.rows >= 0 && from.k >= 0 && to.rows >= 0 && to.k >= 0,
          std::string(fn) + ": negative extent in " + from.to_string() + " / " + to.to_string());
  require(src != nullptr || from.size() == 0, std::string(fn) + ": src is null");
  require(dst != nullptr || to.size() == 0, std::string(fn) + ": dst is null");
}

template <typename T>
T load(const void* p, int64_t i) {
  T v;
  std::memcpy(&v, static_cast<const unsigned char*>(p) + i * int64_t(sizeof(T)), sizeof(T));
  return v;
}
template <typename T>
void store(void* p, int64_t i, T v) {
  std::memcpy(static_cast<unsigned char*>(p) + i * int64_t(sizeof(T)), &v, sizeof(T));
}

// Walks the destination's padded grid: every destination element is written once.
template <typename T, typename Op>
void run_copy(const Op& op, const void* src, void* dst) {
  const ScaleLayout& to = op.to;
  if (to.size() == 0) return;  // K = 0 or rows = 0: nothing to write, however many empty rows
  for (int64_t p = 0; p < to.padded_rows(); ++p)
    for (int64_t kb = 0; kb < to.padded_kblocks(); ++kb) {
      const int64_t s = op.src(p, kb);
      store<T>(dst, to.padded_offset(p, kb), s < 0 ? T(0) : load<T>(src, s));
    }
}

template <typename Op>
void copy_by_size(const Op& op, const void* src, void* dst) {
  if (op.to.scale_bytes() == 4)
    run_copy<uint32_t>(op, src, dst);
  else
    run_copy<uint8_t>(op, src, dst);
}

}  // namespace

void convert(const ScaleLayout& from, const void* src, const ScaleLayout& to, void* dst) {
  require(from.recipe == to.recipe && from.rows == to.rows && from.k == to.k,
          "layouts::convert: 'to' must describe the same operand as 'from': " + from.to_string() + " vs " +
              to.to_string());
  require_buffers(from, src, to, dst, "layouts::convert");
  copy_by_size(detail::RelayoutOp{from, to}, src, dst);
}

namespace {
// Source element of a K slice: the destination's (p, kb) read at K-block kb0 + kb of the source.
struct SliceOp {
  ScaleLayout from, to;
  int64_t kb0;
  int64_t src(int64_t p, int64_t kb) const {
    return to.is_real(p, kb) ? from.offset(p * to.row_step(), kb0 + kb) : -1;
  }
};
}  // namespace

void slice_kblocks(const ScaleLayout& from, const void* src, int64_t kb0, const ScaleLayout& to, void* dst) {
  require(from.recipe == to.recipe && from.rows == to.rows && kb0 >= 0 && kb0 + to.kblocks() <= from.kblocks(),
          "layouts::slice_kblocks: K-blocks [" + std::to_string(kb0) + ", " + std::to_string(kb0 + to.kblocks()) +
              ") of " + from.to_string() + " cannot form " + to.to_string());
  require_buffers(from, src, to, dst, "layouts::slice_kblocks");
  copy_by_size(SliceOp{from, to, kb0}, src, dst);
}

void to_cublaslt(const ScaleLayout& compact, const void* src, void* dst) {
  require(compact.format == ScaleFormat::kCompact, "layouts::to_cublaslt: source must be compact: " + compact.to_string());
  convert(compact, src, compact.with_format(ScaleFormat::kCublasLt), dst);
}

void to_compact(const ScaleLayout& cublaslt, const void* src, void* dst) {
  require(cublaslt.format == ScaleFormat::kCublasLt,
          "layouts::to_compact: source must be in cublaslt format: " + cublaslt.to_string());
  convert(cublaslt, src, cublaslt.with_format(ScaleFormat::kCompact), dst);
}

std::vector<uint8_t> to_cublaslt(const ScaleLayout& compact, const void* src) {
  std::vector<uint8_t> out(size_t(compact.with_format(ScaleFormat::kCublasLt).bytes()));
  to_cublaslt(compact, src, out.data());
  return out;
}

std::vector<uint8_t> to_compact(const ScaleLayout& cublaslt, const void* src) {
  std::vector<uint8_t> out(size_t(cublaslt.with_format(ScaleFormat::kCompact).bytes()));
  to_compact(cublaslt, src, out.data());
  return out;
}

ScaleLayout transposed(const ScaleLayout& l, ScaleFormat format) {
  require(recipe_transposes_exactly(l.recipe),
          "layouts::transposed: only block128x128 and mxfp8-32x32 grids transpose exactly, not " +
              std::string(to_string(l.recipe)) + " (requantize the transposed operand instead)");
  return ScaleLayout(l.recipe, l.k, l.rows, format);
}

void transpose(const ScaleLayout& from, const void* src, const ScaleLayout& to, void* dst) {
  require(to == transposed(from, to.format),
          "layouts::transpose: 'to' must be transposed(from): expected " + transposed(from, to.format).to_string() +
              ", got " + to.to_string());
  require_buffers(from, src, to, dst, "layouts::transpose");
  copy_by_size(detail::TransposeOp{from, to}, src, dst);
}

Diagnostics BroadcastResult::diagnostics(std::string_view argument) const {
  if (exact()) return {};
  std::ostringstream msg, got;
  msg << "block128x128 -> mxfp8 is exact only when every fp32 scale is a power of two 2^e (E8M0 code e+127); "
      << inexact << " are not, the first at source index " << first_inexact_index << " (value "
      << first_inexact_value << ")";
  got << inexact << " not";
  return {Diagnostic{std::string(argument), "blk128-to-mxfp8-not-power-of-two", msg.str(), "all powers of two",
                     got.str(), "Requantize the operand with power-of-two scales (or with mxfp8 directly)."}};
}

ScaleLayout mxfp8_layout_for(const ScaleLayout& blk, Recipe target, ScaleFormat format) {
  require(blk.recipe == Recipe::kBlock128x128, "layouts::mxfp8_layout_for: source must be block128x128");
  require(target == Recipe::kMxfp8 || target == Recipe::kMxfp8_32x32,
          "layouts::mxfp8_layout_for: target must be mxfp8 or mxfp8-32x32");
  return ScaleLayout(target, blk.rows, blk.k, format);
}

BroadcastResult broadcast_block128_to_mxfp8(const ScaleLayout& from, const float* src, const ScaleLayout& to,
                                            uint8_t* dst) {
  require(to == mxfp8_layout_for(from, to.recipe, to.format),
          "layouts::broadcast_block128_to_mxfp8: 'to' must be the mxfp8 layout of the same operand, got " +
              to.to_string());
  require_buffers(from, src, to, dst, "layouts::broadcast_block128_to_mxfp8");
  BroadcastResult res;
  const detail::BroadcastOp op{from, to};
  for (int64_t p = 0; p < to.padded_rows(); ++p)
    for (int64_t kb = 0; kb < to.padded_kblocks(); ++kb) {
      const int64_t s = op.src(p, kb);
      uint8_t code = 0;
      if (s >= 0) {
        bool exact = true;
        const uint32_t bits = load<uint32_t>(src, s);
        code = detail::e8m0_from_pow2(bits, &exact);
        // Count each source scale once: at the first destination block it covers.
        const bool first = (p * to.row_step()) % from.block_rows() == 0 && (kb * to.block_k()) % from.block_k() == 0;
        if (!exact && first) {
          ++res.inexact;
          if (res.first_inexact_index < 0 || s < res.first_inexact_index) {
            res.first_inexact_index = s;
            std::memcpy(&res.first_inexact_value, &bits, 4);
          }
        }
      }
      dst[to.padded_offset(p, kb)] = code;
    }
  return res;
}

std::vector<int64_t> grouped_offsets(Recipe recipe, int64_t k, ScaleFormat format, const int64_t* row_offsets,
                                     int groups) {
  require(groups >= 0 && (row_offsets != nullptr || groups == 0), "layouts::grouped_offsets: bad groups");
  std::vector<int64_t> out(size_t(groups) + 1, 0);
  for (int g = 0; g < groups; ++g) {
    const int64_t rows = row_offsets[g + 1] - row_offsets[g];
    require(rows >= 0, "layouts::grouped_offsets: row_offsets must be non-decreasing (group " + std::to_string(g) +
                           " has " + std::to_string(rows) + " rows)");
    out[size_t(g) + 1] = out[size_t(g)] + ScaleLayout(recipe, rows, k, format).size();
  }
  return out;
}

void convert_grouped(Recipe recipe, int64_t k, const int64_t* row_offsets, int groups, ScaleFormat from,
                     const void* src, ScaleFormat to, void* dst) {
  const auto so = grouped_offsets(recipe, k, from, row_offsets, groups);
  const auto dof = grouped_offsets(recipe, k, to, row_offsets, groups);
  const int eb = ScaleLayout(recipe, 1, k, from).scale_bytes();
  for (int g = 0; g < groups; ++g) {
    const int64_t rows = row_offsets[g + 1] - row_offsets[g];
    const ScaleLayout lf(recipe, rows, k, from), lt(recipe, rows, k, to);
    copy_by_size(detail::RelayoutOp{lf, lt}, static_cast<const unsigned char*>(src) + so[size_t(g)] * eb,
                 static_cast<unsigned char*>(dst) + dof[size_t(g)] * eb);
  }
}

}  // namespace scalemm::layouts
