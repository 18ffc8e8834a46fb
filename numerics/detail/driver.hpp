// Drivers shared by the host and the device translation units. `Exec` supplies:
//   template <class F> void for_each(int64_t n, F f);   // thrust::for_each over [0, n) with its policy
//   void zero(void* p, size_t bytes);                   // memset in the same memory space / stream
// The drivers only plan launches; all arithmetic is in functors.hpp.
#pragma once

#include <cstdint>

#include "detail/functors.hpp"
#include "scalemm/numerics/quantized.hpp"

namespace scalemm::numerics::detail {

/// Scratch the quantizer needs, in floats: column partials, 4 global scalars, and the multiplier grids.
struct QuantPlan {
  ScaleLayout lr, lc;
  int mode = 0;
  int kind = 0;
  int64_t tile_r = 1, tile_c = 1, tiles = 0;
  bool need_global = false;
  int64_t n_partials = 0, n_mult_r = 0, n_mult_c = 0;

  int64_t scratch_floats() const { return n_partials + 4 + n_mult_r + n_mult_c; }
};

inline QuantPlan plan_quantize(const SourceMatrix& src, const QuantizeConfig& cfg) {
  QuantPlan p;
  const int64_t R = src.rows, C = src.cols;
  p.lr = rowwise_layout(cfg, R, C);
  p.lc = columnwise_layout(cfg, R, C);
  p.mode = int(resolve_scale_mode(cfg.recipe, cfg.mode));
  p.need_global = cfg.recipe == Recipe::kTensorwise || cfg.recipe == Recipe::kNvfp4;
  p.n_partials = p.need_global ? C : 0;
  p.n_mult_r = cfg.rowwise ? p.lr.logical_size() : 0;
  p.n_mult_c = cfg.columnwise ? p.lc.logical_size() : 0;
  switch (cfg.recipe) {
    case Recipe::kTensorwise:
      p.kind = 2;
      p.tiles = 1;
      break;
    case Recipe::kRowwise:
      p.kind = 3;
      p.tiles = (cfg.rowwise ? R : 0) + (cfg.columnwise ? C : 0);
      break;
    case Recipe::kBlock128x128:
    case Recipe::kMxfp8_32x32: {
      p.kind = 1;
      const int64_t b = p.lr.block_k();
      p.tile_r = b;
      p.tile_c = b;
      break;
    }
    default: {  // 1D blocks: 1 x bk along C rowwise, bk x 1 along R columnwise
      p.kind = 0;
      const int64_t bk = p.lr.block_k();
      p.tile_r = cfg.columnwise ? bk : 1;
      p.tile_c = cfg.rowwise ? bk : 1;
      break;
    }
  }
  if (p.kind <= 1) p.tiles = layouts::ceil_div(R, p.tile_r) * layouts::ceil_div(C, p.tile_c);
  if (R == 0 || C == 0) p.tiles = 0;
  return p;
}

template <class Exec>
void run_quantize(Exec& ex, const SourceMatrix& src, const QuantizeConfig& cfg, const QuantizeOutputs& out,
                  float* scratch) {
  const QuantPlan p = plan_quantize(src, cfg);
  const int64_t R = src.rows, C = src.cols;
  float* partials = scratch;
  float* g = scratch + p.n_partials;
  float* mult_r = g + 4;
  float* mult_c = mult_r + p.n_mult_r;
  const DType elem = element_dtype(cfg);

  // Scale buffers: padding must read as zero, so the whole buffer is cleared first (same stream).
  if (cfg.rowwise && p.lr.format == ScaleFormat::kCublasLt) ex.zero(out.scales, size_t(p.lr.bytes()));
  if (cfg.columnwise && p.lc.format == ScaleFormat::kCublasLt) ex.zero(out.scales_t, size_t(p.lc.bytes()));

  if (p.need_global) {
    float* gout = cfg.recipe == Recipe::kNvfp4 ? out.global_scale : nullptr;
    if (src.amax) {
      ex.for_each(1, FinishGlobal{src.amax, 1, g, gout});  // the given amax is the one "partial"
    } else {
      if (R > 0 && C > 0) ex.for_each(C, ColumnAmax{src.data, src.dtype, R, C, partials});
      ex.for_each(1, FinishGlobal{partials, (R > 0 ? C : 0), g, gout});
    }
  }
  if (p.tiles > 0) {
    ScaleTiles st{src.data, src.dtype, R, C, p.kind, p.tile_r, p.tile_c,
                  p.kind <= 1 ? layouts::ceil_div(C, p.tile_c) : 1, cfg.rowwise, cfg.columnwise, p.lr, p.lc,
                  out.scales, out.scales_t, mult_r, mult_c, p.mode, elem, cfg.eps,
                  p.need_global ? g : nullptr};
    ex.for_each(p.tiles, st);
  }
  const int64_t quads_r = (R + 1) / 2, quads_c = (C + 1) / 2;
  if (quads_r * quads_c > 0) {
    EncodeQuads eq{src.data, src.dtype, R, C, quads_c, cfg.rowwise, cfg.columnwise, p.lr, p.lc, mult_r, mult_c,
                   elem, static_cast<uint8_t*>(out.data), static_cast<uint8_t*>(out.data_t)};
    ex.for_each(quads_r * quads_c, eq);
  }
}

inline OperandView view_of(const QuantizedTensor& t) {
  return OperandView{t.data, t.dtype, t.row_stride(), t.scales, t.layout, t.global_scale};
}

template <class Exec>
void run_dequantize(Exec& ex, const QuantizedTensor& t, void* out, DType out_dtype) {
  check_dequantize_args(t, out, out_dtype);
  const int64_t n = t.rows() * t.k();
  if (n > 0) ex.for_each(n, Dequantize{view_of(t), out, out_dtype});
}

}  // namespace scalemm::numerics::detail
