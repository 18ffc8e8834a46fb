// Small GPU scale conversions: one launch for a GEMM's scale buffers, and the tensorwise -> rowwise
// broadcast. Separate from convert.cu (the bandwidth kernels), which also builds against the CPU
// emulation of CUDA in tests/layouts/emu.
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/layouts/convert_cuda.hpp"

namespace scalemm::layouts::gpu {
namespace {

// Small scale conversions in one launch: each thread writes one element of a destination's padded
// grid, the source element found through the source layout's offset() (zero for padding), as the host
// conversion does. Uncoalesced on one side, which does not matter at these sizes: what a small GEMM
// (or a grouped call's many small ones) pays for is launches. The conversions travel as the kernel's
// parameter (__grid_constant__: read in place), sized by kCap so that a dense GEMM's two cost what
// they always did and a grouped call's many fit one launch.
template <int kCap>
struct Conversions {
  ScaleConversion c[kCap];
  int64_t start[kCap + 1];  // first destination element of each conversion in the launch's range
  int count;
};
template <int kCap>
__global__ void __launch_bounds__(256) convert_small_kernel(const __grid_constant__ Conversions<kCap> b) {
  const int64_t total = b.start[b.count];
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    int lo = 0, hi = b.count - 1;  // the last conversion starting at or before t
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (b.start[mid] <= t) lo = mid;
      else hi = mid - 1;
    }
    const ScaleConversion& c = b.c[lo];
    const int64_t e = t - b.start[lo];
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

template <int kCap>
void launch_small(const ScaleConversion* conv, int count, Stream stream) {
  if (count <= 0) return;
  Conversions<kCap> b{};
  b.count = count;
  b.start[0] = 0;
  for (int i = 0; i < count; ++i) {
    b.c[i] = conv[i];
    b.start[i + 1] = b.start[i] + conv[i].to.size();
  }
  if (b.start[count] == 0) return;
  const unsigned blocks = unsigned(std::max<int64_t>(1, std::min<int64_t>((b.start[count] + 255) / 256, 1024)));
  convert_small_kernel<kCap><<<blocks, 256, 0, stream>>>(b);
  detail::launch_check("layouts::gpu::convert_small");
}

// Conversions per launch of convert_batch: 256 x 88 bytes fit the 32 KB kernel-parameter limit.
constexpr int kBatchCap = 256;

__global__ void broadcast_kernel(const float* src, float* dst, int64_t n) {
  const float v = *src;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = v;
}

}  // namespace

void convert_small(const ScaleConversion* conv, int count, Stream stream) {
  launch_small<2>(conv, std::min(count, 2), stream);
}

void convert_batch(const ScaleConversion* conv, int count, Stream stream) {
  std::vector<ScaleConversion> small;
  for (int i = 0; i < count; ++i) {
    const ScaleConversion& c = conv[i];
    const bool whole = c.kb0 == 0 && c.from.recipe == c.to.recipe && c.from.rows == c.to.rows && c.from.k == c.to.k;
    if (whole && c.to.size() > kSmallConversionElements)
      convert(c.from, c.src, c.to, c.dst, stream);
    else
      small.push_back(c);
  }
  // The parameter block grows with the capacity, and the driver copies all of it at each launch.
  const int n = int(small.size());
  if (n <= 2) launch_small<2>(small.data(), n, stream);
  else if (n <= 32) launch_small<32>(small.data(), n, stream);
  else
    for (int i = 0; i < n; i += kBatchCap) launch_small<kBatchCap>(small.data() + i, std::min(kBatchCap, n - i), stream);
}

void broadcast_tensorwise(const float* src, float* dst, int64_t rows, Stream stream) {
  if (rows <= 0) return;
  const unsigned blocks = unsigned(std::min<int64_t>(rows / 256 + 1, 1024));
  broadcast_kernel<<<blocks, 256, 0, stream>>>(src, dst, rows);
  detail::launch_check("layouts::gpu::broadcast_tensorwise");
}

}  // namespace scalemm::layouts::gpu
