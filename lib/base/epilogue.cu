// Device passes around a backend's GEMM (epilogue.hpp).
#include "base/epilogue.hpp"

#include <cuda_runtime.h>

#include <algorithm>

#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/formats.hpp"

namespace scalemm::base {
namespace {

__global__ void bf16_to_f32_kernel(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = formats::decode_bf16(src[i]);
}

// FP8 output of a staged GEMM: D = fp8(d_scale * v), saturating, and amax = max |v| (NaN ignored).
// Non-negative floats order as their bit patterns, so the amax is an atomicMax on the bits.
template <DType kOut>
__global__ void __launch_bounds__(256) finish_fp8_kernel(const float* __restrict__ src, uint8_t* __restrict__ d,
                                                         int64_t count, const float* d_scale, float* amax) {
  const float s = *d_scale;
  float local = 0.0f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = src[i];
    local = fmaxf(local, fabsf(v));
    d[i] = kOut == DType::kE4M3 ? formats::encode_e4m3(s * v) : formats::encode_e5m2(s * v);
  }
  if (!amax) return;
  for (int off = 16; off; off /= 2) local = fmaxf(local, __shfl_xor_sync(0xFFFFFFFFu, local, off));
  if (threadIdx.x % 32 == 0) atomicMax(reinterpret_cast<unsigned*>(amax), __float_as_uint(local));
}

}  // namespace

void bf16_to_f32(const uint16_t* src, float* dst, int64_t n, Stream stream) {
  if (n <= 0) return;
  bf16_to_f32_kernel<<<unsigned(std::min<int64_t>(n / 256 + 1, 1024)), 256, 0, stream>>>(src, dst, n);
  detail::launch_check("bf16_to_f32");
}

void finish_fp8_output(const float* src, void* d, DType d_dtype, int64_t count, const float* d_scale, float* d_amax,
                       Stream stream) {
  const cudaStream_t cs = stream;
  if (d_amax) detail::cuda_check(cudaMemsetAsync(d_amax, 0, sizeof(float), cs), "finish_fp8_output: clear d_amax");
  const unsigned blocks = unsigned(std::max<int64_t>(1, std::min<int64_t>((count + 255) / 256, 2048)));
  if (d_dtype == DType::kE4M3)
    finish_fp8_kernel<DType::kE4M3><<<blocks, 256, 0, cs>>>(src, static_cast<uint8_t*>(d), count, d_scale, d_amax);
  else
    finish_fp8_kernel<DType::kE5M2><<<blocks, 256, 0, cs>>>(src, static_cast<uint8_t*>(d), count, d_scale, d_amax);
  detail::launch_check("finish_fp8_output");
}

}  // namespace scalemm::base
