// Per-element rules of the scale conversions, shared by the host loops (layouts/convert.cpp) and the
// CUDA kernels (layouts/cuda/convert.cu) so that both produce byte-identical buffers.
//
// Every conversion walks the padded grid of the DESTINATION layout: stored row p < padded_rows(),
// K-block kb < padded_kblocks(). Each op answers "which source element lands at (p, kb)?" with a
// source buffer index computed by ScaleLayout::offset(), or -1 for padding (written as zero). The
// destination index is to.padded_offset(p, kb). No layout formula appears here.
#pragma once

#include <cstdint>

#include "scalemm/config.hpp"
#include "scalemm/formats.hpp"
#include "scalemm/layouts/scale_layout.hpp"

namespace scalemm::layouts::detail {

/// Same operand, other format (or the same one): compact <-> cublaslt.
struct RelayoutOp {
  ScaleLayout from, to;
  SCALEMM_HD constexpr int64_t src(int64_t p, int64_t kb) const {
    return to.is_real(p, kb) ? from.offset(p * to.row_step(), kb) : -1;
  }
};

/// Exact transpose of a square-block grid (block128x128, mxfp8-32x32): `to` describes the transposed
/// operand (to.rows = from.k, to.k = from.rows). Destination data row r is a K index of the source,
/// destination K-block c a block of source rows.
struct TransposeOp {
  ScaleLayout from, to;
  SCALEMM_HD constexpr int64_t src(int64_t p, int64_t c) const {
    if (!to.is_real(p, c)) return -1;
    const int64_t r = p * to.row_step();
    return from.offset(c * to.block_k(), r / from.block_k());
  }
};

/// block128x128 (fp32) -> mxfp8 or mxfp8-32x32 (E8M0): each 128x128 scale is broadcast to the finer
/// blocks it covers.
struct BroadcastOp {
  ScaleLayout from, to;
  SCALEMM_HD constexpr int64_t src(int64_t p, int64_t kb) const {
    if (!to.is_real(p, kb)) return -1;
    return from.offset(p * to.row_step(), kb * to.block_k() / from.block_k());
  }
};

/// E8M0 code of an fp32 scale that is exactly a power of two 2^e (code e + 127), else 0xFF (NaN),
/// so that a buffer built from inexact scales can never pass for a correct one.
SCALEMM_HD constexpr uint8_t e8m0_from_pow2(uint32_t f32_bits, bool* exact) {
  const uint8_t code = formats::encode_e8m0_bits(f32_bits, formats::E8M0Rounding::kDown,
                                                 formats::Saturation::kNonSaturating);
  const bool ok = code != formats::kE8M0Nan && formats::decode_e8m0_bits(code) == f32_bits;
  *exact = ok;
  return ok ? code : formats::kE8M0Nan;
}

}  // namespace scalemm::layouts::detail
