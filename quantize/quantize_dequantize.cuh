// Dequantization (scalemm::quantize::dequantize): a warp per row, FP8 codes decoded in pairs.
// Included by fast_quantizers.cu only (one translation unit: the kernels compile once).
#pragma once

#include "quantize_common.cuh"

namespace scalemm::quantize::kernels {

constexpr int kUnits = 4;  // chunks of 128 K-elements per warp item

/// Dequantization: a warp per row and kUnits chunks of 128 K-elements (lane l: 4l..4l+3). Each
/// block's scale is located (offset()) and decoded once per chunk, by the block's first lane, and
/// passed to the block's other lanes by a shuffle; values are OperandView::apply(element, scale) and
/// stored as numerics::detail::hp_bits, 4 per store where aligned.
/// D = 0 / 1: E4M3 / E5M2 data read 4 codes per 32-bit load where vec_in (ld and the data pointer
/// 4-aligned) and decoded in pairs by numerics::detail::decode_fp8_pair (hardware cvt on sm_89+, exact; NaN codes
/// give some NaN, which hp_bits writes canonically, as it does for OperandView::element's NaN). D = 2:
/// any other data type through OperandView::element.
template <int D>
__global__ void __launch_bounds__(256) dequant_kernel(numerics::detail::OperandView t, void* out, DType out_dtype,
                                                      int64_t groups, bool vec_out, bool vec_in) {
  const int lane = int(threadIdx.x) & 31;
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t K = t.layout.k;
  const int64_t r = w / groups;
  if (r >= t.layout.rows) return;  // warp-uniform
  const int64_t seg0 = (w - r * groups) * kUnits;
  const int64_t bk = t.layout.block_k();
  // Lanes per block within a chunk: 4 (16-element blocks), 8 (32), else the whole warp (128-element
  // blocks, and tensorwise/rowwise where one block is the whole row).
  const int lpb = bk >= kTile ? 32 : int(bk / 4);
  const bool wide = out_dtype == DType::kF32;
#pragma unroll
  for (int k = 0; k < kUnits; ++k) {
    if ((seg0 + k) * kTile >= K) break;  // warp-uniform
    const int64_t c = (seg0 + k) * kTile + 4 * lane;
    float s = 0.0f;
    if (lane % lpb == 0 && c < K) s = t.scale_at(t.layout.offset(r, c / bk));
    s = __shfl_sync(0xFFFFFFFFu, s, lane - lane % lpb);
    if (c >= K) continue;
    const int64_t base = r * t.ld + c, o = r * K + c;
    uint32_t b[4];
    if (D < 2 && vec_in && c + 3 < K) {
      const uint32_t codes = *reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(t.data) + base);
      float q[4];
      numerics::detail::decode_fp8_pair<D == 1 ? 1 : 0>(codes, q[0], q[1]);
      numerics::detail::decode_fp8_pair<D == 1 ? 1 : 0>(codes >> 16, q[2], q[3]);
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = numerics::detail::hp_bits(out_dtype, t.apply(q[j], s));
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = c + j < K ? numerics::detail::hp_bits(out_dtype, t.apply(t.element(base + j), s)) : 0u;
    }
    if (vec_out && c + 3 < K) {
      if (wide) *reinterpret_cast<uint4*>(static_cast<uint32_t*>(out) + o) = make_uint4(b[0], b[1], b[2], b[3]);
      else *reinterpret_cast<uint2*>(static_cast<uint16_t*>(out) + o) = make_uint2(b[0] | (b[1] << 16), b[2] | (b[3] << 16));
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (c + j >= K) break;
        if (wide) static_cast<uint32_t*>(out)[o + j] = b[j];
        else static_cast<uint16_t*>(out)[o + j] = uint16_t(b[j]);
      }
    }
  }
}

}  // namespace scalemm::quantize::kernels
