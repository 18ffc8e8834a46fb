// The amax passes: the global amax (tensorwise, NVFP4's global scale) in a grid-stride pass and its
// finish, and the rowwise recipe's per-row and per-column amaxes with its fused row kernel.
// Included by fast_quantizers.cu only (one translation unit: the kernels compile once).
#pragma once

#include "quantize_common.cuh"
#include "quantize_tiles.cuh"

namespace scalemm::quantize::kernels {

/// Block-wide NaN-propagating amax; the result is valid in thread 0.
__device__ __forceinline__ float block_amax(float m, float* red) {
  m = group_amax(m, 32);
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, nw = int(blockDim.x) >> 5;
  if (lane == 0) red[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = lane < nw ? red[lane] : 0.0f;
    m = group_amax(m, 32);
  }
  return m;
}

/// Grid-stride amax of the whole source; one partial per CTA.
template <int S>
__global__ void __launch_bounds__(256) global_amax_kernel(const void* src, int64_t n, bool vec, float* partials) {
  __shared__ float red[32];
  float m = 0.0f;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, nth = int64_t(gridDim.x) * blockDim.x;
  int64_t tail = 0;
  if (vec) {
    using T = typename Raw4<S>::T;
    const T* p = static_cast<const T*>(src);
    const int64_t n4 = n / 4;
    int64_t i = tid;
    for (; i + 3 * nth < n4; i += 4 * nth) {
      T x[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) x[u] = p[i + u * nth];
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int j = 0; j < 4; ++j) m = numerics::detail::amax_update(m, raw_elem<S>(x[u], j));
    }
    for (; i < n4; i += nth)
#pragma unroll
      for (int j = 0; j < 4; ++j) m = numerics::detail::amax_update(m, raw_elem<S>(p[i], j));
    tail = n4 * 4;
  }
  for (int64_t i = tail + tid; i < n; i += nth) {
    const uint32_t b = raw_bits<S>(src, i);
    m = numerics::detail::amax_update(m, S == 0 ? fmt::bits_float(b) : S == 1 ? fmt::decode_bf16(uint16_t(b))
                                                                    : fmt::decode_f16(uint16_t(b)));
  }
  m = block_amax(m, red);
  if (threadIdx.x == 0) partials[blockIdx.x] = m;
}

/// Reduces the partials and derives the global scalars (numerics::detail::finish_global). For tensorwise
/// (pm set) it also makes the one scale: its multiplier to pm[0], the stored scale to each requested
/// direction (a tensorwise layout is the one element at offset 0), so no separate launch sits
/// between the amax pass and the encode pass.
__global__ void __launch_bounds__(1024) finish_global_kernel(const float* partials, int n, float* g, float* global_out,
                                                             TileArgs a, float* pm) {
  __shared__ float red[32];
  float m = 0.0f;
  for (int i = int(threadIdx.x); i < n; i += int(blockDim.x)) m = numerics::detail::amax_update(m, partials[i]);
  m = block_amax(m, red);
  if (threadIdx.x == 0) {
    numerics::detail::finish_global(m, g, global_out);
    if (pm) {
      a.g = g;
      const BlockScale s = a.scale_of(g[0]);
      pm[0] = s.multiplier;
      if (a.rowwise && a.rows > 0) numerics::detail::store_scale(a.lr, a.scales_r, 0, 0, s);
      if (a.columnwise && a.cols > 0) numerics::detail::store_scale(a.lc, a.scales_c, 0, 0, s);
    }
  }
}

/// Rowwise recipe, rowwise direction: a warp per row computes the row amax, its scale and multiplier.
template <int S>
__global__ void __launch_bounds__(256) row_amax_kernel(TileArgs a, float* pm_r) {
  const int64_t r = int64_t(blockIdx.x) * 8 + (threadIdx.x >> 5);
  const int lane = int(threadIdx.x) & 31;
  if (r >= a.rows) return;  // warp-uniform
  float m = 0.0f;
#pragma unroll 4
  for (int64_t c = 4 * lane; c < a.cols; c += 128) {
    const auto x = load_raw4<S>(a.src, a.rows, a.cols, a.vec_in, r, c);
#pragma unroll
    for (int j = 0; j < 4; ++j) m = numerics::detail::amax_update(m, raw_elem<S>(x, j));
  }
  m = group_amax(m, 32);
  const BlockScale s = a.scale_of(m);
  if (lane == 0) {
    numerics::detail::store_scale(a.lr, a.scales_r, r, 0, s);
    pm_r[r] = s.multiplier;
  }
}

/// Rowwise recipe, rowwise only, rows of up to kFusedCols elements: amax and encode in one read. One
/// 256-thread CTA per row holds the whole row in registers (thread t: elements 4(t + 256u)..+3 for
/// u < kFusedUnits; bf16: 16 registers, f32: 32), reduces the row amax (block_amax), and thread 0
/// computes and stores the row's scale (the same compute_scale/store_scale as row_amax_kernel); then
/// every thread encodes its elements with the multiplier. Longer rows take row_amax_kernel +
/// row_direct_kernel (two reads).
constexpr int kFusedUnits = 8;
constexpr int64_t kFusedCols = int64_t(256) * 4 * kFusedUnits;  // 8192

template <int S, int E>
__global__ void __launch_bounds__(256) row_fused_kernel(TileArgs a) {
  __shared__ float red[32];
  __shared__ float mult_s;
  const int64_t r = blockIdx.x;
  typename Raw4<S>::T raw[kFusedUnits];
  float m = 0.0f;
#pragma unroll
  for (int u = 0; u < kFusedUnits; ++u) {
    raw[u] = load_raw4<S>(a.src, a.rows, a.cols, a.vec_in, r, 4 * (int64_t(threadIdx.x) + 256 * u));
#pragma unroll
    for (int j = 0; j < 4; ++j) m = numerics::detail::amax_update(m, raw_elem<S>(raw[u], j));
  }
  m = block_amax(m, red);
  if (threadIdx.x == 0) {
    const BlockScale s = a.scale_of(m);
    numerics::detail::store_scale(a.lr, a.scales_r, r, 0, s);
    mult_s = s.multiplier;
  }
  __syncthreads();
  const float mult = mult_s;
#pragma unroll
  for (int u = 0; u < kFusedUnits; ++u) {
    const int64_t c = 4 * (int64_t(threadIdx.x) + 256 * u);
    if (c >= a.cols) break;
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = raw_elem<S>(raw[u], j);
    store4(a.out_r, r * a.cols + c, a.cols - c, encode4<E>(v, 0, mult), E == 2, a.vec_out_r);
  }
}

/// Rowwise recipe, columnwise direction: partial amax of each column over a chunk of kColChunk rows.
template <int S>
__global__ void __launch_bounds__(256) col_amax_partial_kernel(TileArgs a, float* part) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t rb = int64_t(blockIdx.y) * kColChunk;
  if (c >= a.cols) return;
  const int64_t re = rb + kColChunk < a.rows ? rb + kColChunk : a.rows;
  float m = 0.0f;
  int64_t r = rb;
  for (; r + 3 < re; r += 4) {
    uint32_t b[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) b[u] = raw_bits<S>(a.src, (r + u) * a.cols + c);
#pragma unroll
    for (int u = 0; u < 4; ++u)
      m = numerics::detail::amax_update(m, S == 0 ? fmt::bits_float(b[u]) : S == 1 ? fmt::decode_bf16(uint16_t(b[u]))
                                                                          : fmt::decode_f16(uint16_t(b[u])));
  }
  for (; r < re; ++r) {
    const uint32_t b = raw_bits<S>(a.src, r * a.cols + c);
    m = numerics::detail::amax_update(m, S == 0 ? fmt::bits_float(b) : S == 1 ? fmt::decode_bf16(uint16_t(b))
                                                                    : fmt::decode_f16(uint16_t(b)));
  }
  part[blockIdx.y * a.cols + c] = m;
}

/// Rowwise recipe, columnwise direction: column amax from the chunks, scale and multiplier.
__global__ void col_amax_finish_kernel(TileArgs a, const float* part, int64_t chunks, float* pm_c) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= a.cols) return;
  float m = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) m = numerics::detail::amax_update(m, part[k * a.cols + c]);
  const BlockScale s = a.scale_of(m);
  numerics::detail::store_scale(a.lc, a.scales_c, c, 0, s);
  pm_c[c] = s.multiplier;
}

}  // namespace scalemm::quantize::kernels
