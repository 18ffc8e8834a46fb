// Small GPU scale conversions: one launch for a GEMM's scale buffers, and the tensorwise -> rowwise
// broadcast. Separate from convert.cu (the bandwidth kernels), which also builds against the CPU
// emulation of CUDA in tests/layouts/emu.
#include <cuda_runtime.h>

#include <algorithm>

#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/layouts/convert_cuda.hpp"

namespace scalemm::layouts::gpu {
namespace {

// Small scale conversions of one GEMM in one launch: each thread writes one element of a destination's
// padded grid, the source element found through the source layout's offset() (zero for padding), as
// the host conversion does. Uncoalesced on one side, which does not matter at these sizes: what a small
// GEMM pays for is launches (see convert_small).
struct SmallConversions {
  ScaleConversion c[2];
  int count;
  int64_t split;  // destination elements of c[0]
};
__global__ void __launch_bounds__(256) convert_small_kernel(SmallConversions sc) {
  const int64_t total = sc.split + (sc.count > 1 ? sc.c[1].to.size() : 0);
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int which = t < sc.split ? 0 : 1;
    const ScaleConversion& c = sc.c[which];
    const int64_t e = which == 0 ? t : t - sc.split;
    const int64_t cols = c.to.padded_kblocks();
    const int64_t p = e / cols, kb = e - p * cols;
    const bool real = c.to.is_real(p, kb);
    const int64_t so = real ? c.from.offset(p * c.to.row_step(), c.kb0 + kb) : 0;
    const int64_t d = c.to.padded_offset(p, kb);
    if (c.to.scale_bytes() == 4)
      static_cast<float*>(c.dst)[d] = real ? static_cast<const float*>(c.src)[so] : 0.0f;
    else
      static_cast<uint8_t*>(c.dst)[d] = real ? static_cast<const uint8_t*>(c.src)[so] : uint8_t(0);
  }
}

__global__ void broadcast_kernel(const float* src, float* dst, int64_t n) {
  const float v = *src;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = v;
}

}  // namespace

void convert_small(const ScaleConversion* conv, int count, Stream stream) {
  if (count <= 0) return;
  SmallConversions sc{};
  sc.count = std::min(count, 2);
  int64_t total = 0;
  for (int i = 0; i < sc.count; ++i) {
    sc.c[i] = conv[i];
    total += conv[i].to.size();
  }
  sc.split = conv[0].to.size();
  const unsigned blocks = unsigned(std::max<int64_t>(1, std::min<int64_t>((total + 255) / 256, 1024)));
  convert_small_kernel<<<blocks, 256, 0, stream>>>(sc);
  detail::launch_check("layouts::gpu::convert_small");
}

void broadcast_tensorwise(const float* src, float* dst, int64_t rows, Stream stream) {
  if (rows <= 0) return;
  const unsigned blocks = unsigned(std::min<int64_t>(rows / 256 + 1, 1024));
  broadcast_kernel<<<blocks, 256, 0, stream>>>(src, dst, rows);
  detail::launch_check("layouts::gpu::broadcast_tensorwise");
}

}  // namespace scalemm::layouts::gpu
