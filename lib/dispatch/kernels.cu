#include <cuda_runtime.h>

#include "kernels.cuh"
#include "scalemm/formats.hpp"
#include "scalemm/status.hpp"

namespace scalemm::dispatch {
namespace {

__global__ void broadcast_scalar_kernel(const float* src, float* dst, int64_t n) {
  const float v = *src;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = v;
}

__global__ void bf16_to_f32_kernel(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = formats::decode_bf16(src[i]);
}

__global__ void alpha_beta_kernel(float* dst, float value) {
  dst[0] = value;
  dst[1] = 0.0f;
}

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw Error(StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

int blocks_for(int64_t n) { return int(n / 256 + 1 < 1024 ? n / 256 + 1 : 1024); }

}  // namespace

void broadcast_scalar(const float* src, float* dst, int64_t n, Stream stream) {
  broadcast_scalar_kernel<<<blocks_for(n), 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(src, dst, n);
  check_launch("broadcast_scalar");
}

void bf16_to_f32(const uint16_t* src, float* dst, int64_t n, Stream stream) {
  bf16_to_f32_kernel<<<blocks_for(n), 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(src, dst, n);
  check_launch("bf16_to_f32");
}

void write_alpha_beta(float* dst, float value, Stream stream) {
  alpha_beta_kernel<<<1, 1, 0, reinterpret_cast<cudaStream_t>(stream)>>>(dst, value);
  check_launch("write_alpha_beta");
}

}  // namespace scalemm::dispatch
