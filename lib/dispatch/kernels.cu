#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>
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

// Exact range of E8M0 codes (see kernels.cuh).
__host__ __device__ constexpr int low_code_subnormal(DType t) { return t == DType::kE5M2 ? 10 : 3; }
__host__ __device__ constexpr int high_code(DType t) { return t == DType::kE5M2 ? 239 : 246; }
__device__ inline bool fp8_is_subnormal_nonzero(uint8_t b, DType t) {
  return t == DType::kE5M2 ? ((b & 0x7C) == 0 && (b & 0x03) != 0) : ((b & 0x78) == 0 && (b & 0x07) != 0);
}
constexpr int kNoNeed = -1000;

__global__ void init_shifts_kernel(EmulatedShifts* s) {
  for (int i = 0; i < 2; ++i) {
    s->need[i] = kNoNeed;
    s->max_code[i] = -1;
    s->shift[i] = 0;
  }
  s->inexact = 0;
}

// Per E8M0 scale: the shift its block needs (low bound minus code; blocks under code 3 are read to
// see whether they hold subnormal, normal or no nonzero values) and the largest code.
__global__ void e8m0_need_kernel(const uint8_t* data, DType dtype, const uint8_t* scales, layouts::ScaleLayout l,
                                 EmulatedShifts* s, int which) {
  __shared__ int need_s[8], max_s[8];
  int need = kNoNeed, hi = -1;
  const int64_t kb_count = l.kblocks();
  // Rows across blocks, K-blocks across threads: no 64-bit division per scale.
  for (int64_t r = blockIdx.x; r < l.rows; r += gridDim.x)
    for (int64_t kb = threadIdx.x; kb < kb_count; kb += blockDim.x) {
      const int c = scales[l.offset(r, kb)];
      if (c == 255) continue;  // NaN scales stay NaN whatever the shift
      hi = max(hi, c);
      if (c >= low_code_subnormal(dtype)) {
        need = max(need, low_code_subnormal(dtype) - c);  // conservative: as if subnormals were present
        continue;
      }
      int low = kNoNeed;  // rare: look at the block's elements
      const int64_t k_end = min(l.k, (kb + 1) * 32);
      for (int64_t kk = kb * 32; kk < k_end; ++kk) {
        const uint8_t q = data[r * l.k + kk];
        if ((q & 0x7F) == 0) continue;
        low = max(low, fp8_is_subnormal_nonzero(q, dtype) ? low_code_subnormal(dtype) : 0);
      }
      if (low != kNoNeed) need = max(need, low - c);
    }
  for (int off = 16; off; off /= 2) {
    need = max(need, __shfl_down_sync(0xFFFFFFFFu, need, off));
    hi = max(hi, __shfl_down_sync(0xFFFFFFFFu, hi, off));
  }
  if (threadIdx.x % 32 == 0) need_s[threadIdx.x / 32] = need, max_s[threadIdx.x / 32] = hi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < int(blockDim.x / 32); ++w) need = max(need, need_s[w]), hi = max(hi, max_s[w]);
    atomicMax(&s->need[which], need);
    atomicMax(&s->max_code[which], hi);
  }
}

__global__ void choose_shifts_kernel(EmulatedShifts* s, DType ta, DType tb, bool a_e8m0, bool b_e8m0) {
  // Admissible shifts per operand: [need, cap]. UE4M3 operands are exact for any shift in [-3, 3]
  // (their values span 2^-18 .. 2^12 inside BF16's 2^-133 .. 2^127).
  int lo[2], hi[2];
  const bool e8m0[2] = {a_e8m0, b_e8m0};
  const DType types[2] = {ta, tb};
  for (int i = 0; i < 2; ++i) {
    if (e8m0[i]) {
      lo[i] = s->need[i] == kNoNeed ? -1000 : s->need[i];
      hi[i] = s->max_code[i] < 0 ? 1000 : high_code(types[i]) - s->max_code[i];
    } else {
      lo[i] = -3;
      hi[i] = 3;
    }
  }
  // s_a in [lo_a, hi_a] and -s_a in [lo_b, hi_b]; prefer the shift closest to 0.
  const int from = max(lo[0], -hi[1]), to = min(hi[0], -lo[1]);
  if (from > to) {
    s->inexact = 1;
    return;
  }
  const int sa = from > 0 ? from : (to < 0 ? to : 0);
  s->shift[0] = sa;
  s->shift[1] = -sa;
}

// Each thread turns kPer consecutive K elements (all under one scale: block_k is 16 or 32) into bf16,
// several chunks per thread. Decoding uses the hardware conversions (bit-identical to formats.hpp:
// tests/formats compares them on the GPU), and the scale is a power of two, so every step is exact.
template <DType kData, int kPer>
__global__ void __launch_bounds__(256) dequant_bf16_kernel(const uint8_t* __restrict__ data,
                                                           const void* __restrict__ scales, layouts::ScaleLayout l,
                                                           const EmulatedShifts* shifts, int which,
                                                           uint16_t* __restrict__ out) {
  const bool e8m0 = l.scale_dtype() == DType::kE8M0;
  const int shift = shifts->shift[which];
  const int bk_log2 = __ffs(int(l.block_k())) - 1;  // 16 or 32: a power of two
  const int64_t chunks_per_row = l.k / kPer;
  const int64_t total = l.rows * chunks_per_row;
  constexpr int kBytes = kData == DType::kE2M1 ? kPer / 2 : kPer;  // input bytes per chunk
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / chunks_per_row;
    const int k0 = int(i - r * chunks_per_row) * kPer;
    const int64_t so = l.offset(r, k0 >> bk_log2);
    float scale;
    if (e8m0) {
      const uint8_t code = static_cast<const uint8_t*>(scales)[so];
      scale = code == 255 ? __int_as_float(0x7FC00000) : scalbnf(1.0f, int(code) - 127 + shift);
    } else {
      scale = scalbnf(formats::decode_ue4m3(static_cast<const uint8_t*>(scales)[so]), shift);
    }
    const uint8_t* src = data + (r * l.k + k0) * kBytes / kPer;
    uint32_t w[kBytes / 4];
    if constexpr (kBytes == 16) {
      const uint4 v = *reinterpret_cast<const uint4*>(src);
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else if constexpr (kBytes == 8) {
      const uint2 v = *reinterpret_cast<const uint2*>(src);
      w[0] = v.x, w[1] = v.y;
    } else {
      w[0] = *reinterpret_cast<const uint32_t*>(src);
    }
    uint32_t o[kPer / 2];
#pragma unroll
    for (int j = 0; j < kPer; j += 2) {
      __half2_raw h;
      if constexpr (kData == DType::kE2M1) {
        const uint8_t pair = uint8_t(w[j / 8] >> (4 * (j % 8)));
        h = __nv_cvt_fp4x2_to_halfraw2(__nv_fp4x2_storage_t(pair), __NV_E2M1);
      } else {
        const uint16_t pair = uint16_t(w[j / 4] >> (8 * (j % 4)));
        h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(pair), kData == DType::kE4M3 ? __NV_E4M3 : __NV_E5M2);
      }
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
      const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * scale, f.y * scale);
      o[j / 2] = *reinterpret_cast<const uint32_t*>(&b);
    }
    uint4* dst = reinterpret_cast<uint4*>(out + r * l.k + k0);
#pragma unroll
    for (int q = 0; q < kPer / 8; ++q) dst[q] = make_uint4(o[4 * q], o[4 * q + 1], o[4 * q + 2], o[4 * q + 3]);
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

void emulated_prepare(const EmulatedOperand& a, const EmulatedOperand& b, EmulatedShifts* shifts, Stream stream) {
  const cudaStream_t cs = reinterpret_cast<cudaStream_t>(stream);
  init_shifts_kernel<<<1, 1, 0, cs>>>(shifts);
  const EmulatedOperand* ops[2] = {&a, &b};
  bool e8m0[2];
  for (int i = 0; i < 2; ++i) {
    e8m0[i] = ops[i]->layout.scale_dtype() == DType::kE8M0;
    if (!e8m0[i]) continue;
    const int blocks = int(std::min<int64_t>(ops[i]->layout.rows, 1056));
    e8m0_need_kernel<<<blocks > 0 ? blocks : 1, 256, 0, cs>>>(static_cast<const uint8_t*>(ops[i]->data),
                                                              ops[i]->dtype,
                                                              static_cast<const uint8_t*>(ops[i]->scales),
                                                              ops[i]->layout, shifts, i);
  }
  choose_shifts_kernel<<<1, 1, 0, cs>>>(shifts, a.dtype, b.dtype, e8m0[0], e8m0[1]);
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
  const int64_t chunks = op.layout.rows * (op.layout.k / per);
  int sms = 132;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);  // cached by the runtime: cheap
  const int blocks = int(std::max<int64_t>(1, std::min<int64_t>((chunks + 255) / 256, int64_t(sms) * 8)));
  const dim3 grid(blocks);
  const auto* d = static_cast<const uint8_t*>(op.data);
#define SCALEMM_DEQUANT(T)                                                                                   \
  (wide ? dequant_bf16_kernel<T, 16><<<grid, 256, 0, cs>>>(d, op.scales, op.layout, shifts, which, out)    \
        : dequant_bf16_kernel<T, 8><<<grid, 256, 0, cs>>>(d, op.scales, op.layout, shifts, which, out))
  switch (op.dtype) {
    case DType::kE4M3: SCALEMM_DEQUANT(DType::kE4M3); break;
    case DType::kE5M2: SCALEMM_DEQUANT(DType::kE5M2); break;
    case DType::kE2M1: SCALEMM_DEQUANT(DType::kE2M1); break;
    default: throw Error(StatusCode::kInternal, "emulated_dequantize_bf16: unsupported data type");
  }
#undef SCALEMM_DEQUANT
  check_launch("emulated_dequantize_bf16");
}


}  // namespace scalemm::dispatch
