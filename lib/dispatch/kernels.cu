#include <cuda_runtime.h>

#include <algorithm>
#include <string>

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

// Exact range of E8M0 codes for a data format (see kernels.cuh).
__host__ __device__ constexpr int low_code(DType t) { return t == DType::kE5M2 ? 10 : 3; }
__host__ __device__ constexpr int high_code(DType t) { return t == DType::kE5M2 ? 239 : 246; }

__global__ void init_shifts_kernel(EmulatedShifts* s) {
  for (int i = 0; i < 2; ++i) {
    s->min_code[i] = 255;
    s->max_code[i] = -1;
  }
}

// Min/max E8M0 code over the logical scales (padding excluded: it is never read as a scale).
__global__ void e8m0_range_kernel(const uint8_t* scales, layouts::ScaleLayout l, EmulatedShifts* s, int which) {
  int lo = 255, hi = -1;
  const int64_t n = l.rows * l.kblocks();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / l.kblocks(), kb = i % l.kblocks();
    const int c = scales[l.offset(r, kb)];
    if (c == 255) continue;  // NaN scales stay NaN whatever the shift
    lo = min(lo, c);
    hi = max(hi, c);
  }
  for (int off = 16; off; off /= 2) {
    lo = min(lo, __shfl_down_sync(0xFFFFFFFFu, lo, off));
    hi = max(hi, __shfl_down_sync(0xFFFFFFFFu, hi, off));
  }
  if (threadIdx.x % 32 == 0) {
    atomicMin(&s->min_code[which], lo);
    atomicMax(&s->max_code[which], hi);
  }
}

__global__ void finish_shifts_kernel(EmulatedShifts* s, DType ta, DType tb, bool a_e8m0, bool b_e8m0, float alpha,
                                     float* alpha_beta) {
  int total = 0;
  const DType types[2] = {ta, tb};
  const bool e8m0[2] = {a_e8m0, b_e8m0};
  for (int i = 0; i < 2; ++i) {
    int shift = 0;
    if (e8m0[i] && s->max_code[i] >= 0 && s->min_code[i] < low_code(types[i]))
      shift = max(0, min(low_code(types[i]) - s->min_code[i], high_code(types[i]) - s->max_code[i]));
    s->min_code[i] = shift;  // from here on the slot holds the chosen shift
    total += shift;
  }
  alpha_beta[0] = scalbnf(alpha, -total);
  alpha_beta[1] = 0.0f;
}

// Each thread turns kPer consecutive K elements (all under one scale: block_k is 16 or 32) into bf16.
// Rows come from blockIdx.y (grid-stride), K-chunks from x, so no 64-bit division sits in the loop.
template <DType kData, int kPer>
__global__ void __launch_bounds__(128) dequant_bf16_kernel(const uint8_t* __restrict__ data,
                                                           const void* __restrict__ scales, layouts::ScaleLayout l,
                                                           const EmulatedShifts* shifts, int which,
                                                           uint16_t* __restrict__ out) {
  __shared__ float lut[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x)
    lut[i] = kData == DType::kE4M3 ? formats::decode_e4m3(uint8_t(i))
             : kData == DType::kE5M2 ? formats::decode_e5m2(uint8_t(i))
                                     : formats::decode_e2m1(uint8_t(i & 0xF));
  __syncthreads();
  const bool e8m0 = l.scale_dtype() == DType::kE8M0;
  const int shift = e8m0 ? shifts->min_code[which] : 0;
  const int bk_log2 = __ffs(int(l.block_k())) - 1;  // 16 or 32: a power of two
  const int chunks = int(l.k / kPer);
  constexpr int kBytes = kData == DType::kE2M1 ? kPer / 2 : kPer;  // input bytes per chunk
  for (int64_t r = blockIdx.y; r < l.rows; r += gridDim.y) {
    const uint8_t* row_in = data + r * l.k * kBytes / kPer;
    uint16_t* row_out = out + r * l.k;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += gridDim.x * blockDim.x) {
      const int k0 = c * kPer;
      const int64_t so = l.offset(r, k0 >> bk_log2);
      float scale;
      if (e8m0) {
        const uint8_t code = static_cast<const uint8_t*>(scales)[so];
        // scalbnf(1, e) is the exact power of two, subnormal ones included (e >= -130 here).
        scale = code == 255 ? __int_as_float(0x7FC00000) : scalbnf(1.0f, int(code) - 127 + shift);
      } else {
        scale = formats::decode_ue4m3(static_cast<const uint8_t*>(scales)[so]);
      }
      uint32_t w[kBytes / 4];
      if constexpr (kBytes == 16) {
        const uint4 v = *reinterpret_cast<const uint4*>(row_in + c * kBytes);
        w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
      } else if constexpr (kBytes == 8) {
        const uint2 v = *reinterpret_cast<const uint2*>(row_in + c * kBytes);
        w[0] = v.x, w[1] = v.y;
      } else {
        w[0] = *reinterpret_cast<const uint32_t*>(row_in + c * kBytes);
      }
      uint32_t o[kPer / 2];
#pragma unroll
      for (int j = 0; j < kPer; j += 2) {
        float v0, v1;
        if constexpr (kData == DType::kE2M1) {
          v0 = lut[(w[j / 8] >> (4 * (j % 8))) & 0xF];
          v1 = lut[(w[(j + 1) / 8] >> (4 * ((j + 1) % 8))) & 0xF];
        } else {
          v0 = lut[(w[j / 4] >> (8 * (j % 4))) & 0xFF];
          v1 = lut[(w[(j + 1) / 4] >> (8 * ((j + 1) % 4))) & 0xFF];
        }
        o[j / 2] = uint32_t(formats::encode_bf16(v0 * scale)) | (uint32_t(formats::encode_bf16(v1 * scale)) << 16);
      }
      uint4* dst = reinterpret_cast<uint4*>(row_out + k0);
#pragma unroll
      for (int q = 0; q < kPer / 8; ++q) dst[q] = make_uint4(o[4 * q], o[4 * q + 1], o[4 * q + 2], o[4 * q + 3]);
    }
  }
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

void emulated_prepare(const EmulatedOperand& a, const EmulatedOperand& b, float alpha, EmulatedShifts* shifts,
                      float* alpha_beta, Stream stream) {
  const cudaStream_t cs = reinterpret_cast<cudaStream_t>(stream);
  init_shifts_kernel<<<1, 1, 0, cs>>>(shifts);
  const EmulatedOperand* ops[2] = {&a, &b};
  bool e8m0[2];
  for (int i = 0; i < 2; ++i) {
    e8m0[i] = ops[i]->layout.scale_dtype() == DType::kE8M0;
    if (!e8m0[i]) continue;
    const int64_t n = ops[i]->layout.rows * ops[i]->layout.kblocks();
    e8m0_range_kernel<<<blocks_for(n), 256, 0, cs>>>(static_cast<const uint8_t*>(ops[i]->scales), ops[i]->layout,
                                                     shifts, i);
  }
  finish_shifts_kernel<<<1, 1, 0, cs>>>(shifts, a.dtype, b.dtype, e8m0[0], e8m0[1], alpha, alpha_beta);
  check_launch("emulated_prepare");
}

void emulated_dequantize_bf16(const EmulatedOperand& op, const EmulatedShifts* shifts, int which, uint16_t* out,
                              Stream stream) {
  if (op.layout.k % 8 != 0)
    throw Error(StatusCode::kInternal, "emulated_dequantize_bf16: K=" + std::to_string(op.layout.k) +
                                           " is not a multiple of 8 (the planner should not have chosen this path)");
  const cudaStream_t cs = reinterpret_cast<cudaStream_t>(stream);
  const bool wide = op.layout.k % 16 == 0;
  const int per = wide ? 16 : 8;
  const int64_t chunks = op.layout.k / per;
  const unsigned gx = unsigned(std::min<int64_t>((chunks + 127) / 128, 65535));
  const unsigned gy = unsigned(std::max<int64_t>(1, std::min<int64_t>(op.layout.rows, 65535)));
  const dim3 grid(gx ? gx : 1, gy);
  const auto* d = static_cast<const uint8_t*>(op.data);
#define SCALEMM_DEQUANT(T)                                                                                   \
  (wide ? dequant_bf16_kernel<T, 16><<<grid, 128, 0, cs>>>(d, op.scales, op.layout, shifts, which, out)    \
        : dequant_bf16_kernel<T, 8><<<grid, 128, 0, cs>>>(d, op.scales, op.layout, shifts, which, out))
  switch (op.dtype) {
    case DType::kE4M3: SCALEMM_DEQUANT(DType::kE4M3); break;
    case DType::kE5M2: SCALEMM_DEQUANT(DType::kE5M2); break;
    case DType::kE2M1: SCALEMM_DEQUANT(DType::kE2M1); break;
    default: throw Error(StatusCode::kInternal, "emulated_dequantize_bf16: unsupported data type");
  }
#undef SCALEMM_DEQUANT
  check_launch("emulated_dequantize_bf16");
}

void write_alpha_beta(float* dst, float value, Stream stream) {
  alpha_beta_kernel<<<1, 1, 0, reinterpret_cast<cudaStream_t>(stream)>>>(dst, value);
  check_launch("write_alpha_beta");
}

}  // namespace scalemm::dispatch
