// The byte transpose of the exact-transpose recipes' FP8 data (scalemm::quantize::transpose): bytes
// moved through a shared 64 x 64 tile, never decoded.
// Included by fast_quantizers.cu only (one translation unit: the kernels compile once).
#pragma once

#include <cstdint>

namespace scalemm::quantize::kernels {

constexpr int kTT = 64;  // a block moves one 64 x 64 byte tile through shared memory

// dst[b](c, r) = src[b](r, c). Each of the 256 threads loads 16 bytes of a tile row and stores 16 bytes
// of a tile column: one 16-byte access each way where the tile is whole and the pitch allows it, bytes
// elsewhere. Rows of the shared tile are 80 bytes apart, so that every row starts 16-byte aligned.
__global__ void __launch_bounds__(256) transpose_bytes_kernel(const uint8_t* __restrict__ src,
                                                              uint8_t* __restrict__ dst, int64_t rows,
                                                              int64_t cols, bool vec_in, bool vec_out) {
  __shared__ alignas(16) uint8_t tile[kTT][kTT + 16];
  const int64_t off = int64_t(blockIdx.z) * rows * cols;
  const int64_t r0 = int64_t(blockIdx.y) * kTT, c0 = int64_t(blockIdx.x) * kTT;
  const int lr = int(threadIdx.x) >> 2, lc = (int(threadIdx.x) & 3) * 16;
  const bool whole = r0 + kTT <= rows && c0 + kTT <= cols;
  const uint8_t* s = src + off;
  uint8_t* d = dst + off;
  if (whole && vec_in) {
    *reinterpret_cast<uint4*>(&tile[lr][lc]) = *reinterpret_cast<const uint4*>(s + (r0 + lr) * cols + c0 + lc);
  } else {
    for (int i = 0; i < 16; ++i)
      if (r0 + lr < rows && c0 + lc + i < cols) tile[lr][lc + i] = s[(r0 + lr) * cols + c0 + lc + i];
  }
  __syncthreads();
  if (whole && vec_out) {
    alignas(16) uint8_t v[16];
    for (int i = 0; i < 16; ++i) v[i] = tile[lc + i][lr];
    *reinterpret_cast<uint4*>(d + (c0 + lr) * rows + r0 + lc) = *reinterpret_cast<const uint4*>(v);
  } else {
    for (int i = 0; i < 16; ++i)
      if (c0 + lr < cols && r0 + lc + i < rows) d[(c0 + lr) * rows + r0 + lc + i] = tile[lc + i][lr];
  }
}

}  // namespace scalemm::quantize::kernels
