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
  s->blocks_done = 0;
}

// Admissible shifts per operand: [need, cap]; the pair s_a = -s_b closest to 0 inside both ranges.
__device__ void choose_shifts(EmulatedShifts* s, DType ta, DType tb, bool a_e8m0, bool b_e8m0) {
  // UE4M3 operands are exact for any shift in [-3, 3] (their values span 2^-18 .. 2^12 inside BF16's
  // 2^-133 .. 2^127).
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
  const int from = max(lo[0], -hi[1]), to = min(hi[0], -lo[1]);
  if (from > to) {
    s->inexact = 1;
    return;
  }
  const int sa = from > 0 ? from : (to < 0 ? to : 0);
  s->shift[0] = sa;
  s->shift[1] = -sa;
}

struct NeedArgs {
  const uint8_t* data[2];
  const uint8_t* scales[2];
  layouts::ScaleLayout layout[2];
  DType dtype[2];
  bool e8m0[2];
  bool flat[2];  // compact 1x32 scales: the buffer is the logical grid itself, scanned as bytes
};

// The shift an E8M0 scale's block needs (low bound minus code; blocks under code 3 are read to see
// whether they hold subnormal, normal or no nonzero values), and the largest code. Both operands in one
// launch (blockIdx.y); the last block to finish chooses the shifts, so prepare is two small launches.
// Compact mxfp8 scales (the common case) are scanned as a flat byte buffer, 16 codes per load: every
// byte is a real scale, and the rare block that needs its data read finds (row, K-block) by division,
// checked against offset(). Other formats walk (row, K-block) and read four adjacent codes at once
// (adjacent in both formats: compact rows, and the s % 4 lane of a 128x4 tile; checked through
// offset() before one 32-bit load).
__global__ void __launch_bounds__(256) e8m0_need_kernel(NeedArgs a, EmulatedShifts* s) {
  __shared__ int need_s[8], max_s[8];
  __shared__ bool last;
  const int which = blockIdx.y;
  int need = kNoNeed, hi = -1;
  const layouts::ScaleLayout l = a.layout[which];
  const uint8_t* scales = a.scales[which];
  const DType dtype = a.dtype[which];
  const int low_code = low_code_subnormal(dtype);
  auto visit = [&](int c, int64_t r, int64_t kb) {
    if (c == 255) return;  // NaN scales stay NaN whatever the shift
    hi = max(hi, c);
    if (c >= low_code) {
      need = max(need, low_code - c);  // conservative: as if subnormals were present
      return;
    }
    int low = kNoNeed;  // rare: look at the block's elements
    const int64_t k_end = min(l.k, (kb + 1) * 32);
    for (int64_t kk = kb * 32; kk < k_end; ++kk) {
      const uint8_t v = a.data[which][r * l.k + kk];
      if ((v & 0x7F) == 0) continue;
      low = max(low, fp8_is_subnormal_nonzero(v, dtype) ? low_code : 0);
    }
    if (low != kNoNeed) need = max(need, low - c);
  };
  if (a.e8m0[which] && a.flat[which]) {
    const int64_t n = l.size(), kbs = l.kblocks();
    auto visit_flat = [&](int c, int64_t idx) {
      if (c >= low_code && c != 255) {  // the common case, without locating the block
        hi = max(hi, c);
        need = max(need, low_code - c);
        return;
      }
      const int64_t r = idx / kbs, kb = idx - r * kbs;
      if (l.offset(r, kb) == idx) visit(c, r, kb);
    };
    const bool vec = (reinterpret_cast<uintptr_t>(scales) & 15) == 0;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i * 16 < n; i += int64_t(gridDim.x) * blockDim.x) {
      if (vec && i * 16 + 16 <= n) {
        const uint4 w = *reinterpret_cast<const uint4*>(scales + i * 16);
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int q = 0; q < 16; ++q) visit_flat(int((words[q / 4] >> (8 * (q % 4))) & 0xFF), i * 16 + q);
      } else {
        for (int64_t idx = i * 16; idx < min(n, i * 16 + 16); ++idx) visit_flat(scales[idx], idx);
      }
    }
  } else if (a.e8m0[which]) {
    const int64_t kb_count = l.kblocks();
    for (int64_t r = blockIdx.x; r < l.rows; r += gridDim.x)
      for (int64_t kb0 = int64_t(threadIdx.x) * 4; kb0 < kb_count; kb0 += int64_t(blockDim.x) * 4) {
        const int64_t o = l.offset(r, kb0);
        const int n = kb_count - kb0 < 4 ? int(kb_count - kb0) : 4;
        if (n == 4 && (o & 3) == 0 && l.offset(r, kb0 + 3) == o + 3) {
          const uint32_t w = *reinterpret_cast<const uint32_t*>(scales + o);
          for (int q = 0; q < 4; ++q) visit(int((w >> (8 * q)) & 0xFF), r, kb0 + q);
        } else {
          for (int q = 0; q < n; ++q) visit(scales[l.offset(r, kb0 + q)], r, kb0 + q);
        }
      }
  }
  for (int off = 16; off; off /= 2) {
    need = max(need, __shfl_down_sync(0xFFFFFFFFu, need, off));
    hi = max(hi, __shfl_down_sync(0xFFFFFFFFu, hi, off));
  }
  if (threadIdx.x % 32 == 0) need_s[threadIdx.x / 32] = need, max_s[threadIdx.x / 32] = hi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < int(blockDim.x / 32); ++w) need = max(need, need_s[w]), hi = max(hi, max_s[w]);
    if (a.e8m0[which] && (need != kNoNeed || hi >= 0)) {  // one atomic pair per block that saw a scale
      atomicMax(&s->need[which], need);
      atomicMax(&s->max_code[which], hi);
    }
    __threadfence();
    last = atomicAdd(&s->blocks_done, 1u) == gridDim.x * gridDim.y - 1;
  }
  __syncthreads();
  if (last && threadIdx.x == 0) {
    __threadfence();
    choose_shifts(s, a.dtype[0], a.dtype[1], a.e8m0[0], a.e8m0[1]);
  }
}

// 2^e as a float (e8m0 code + shift - 127), by its bits where it is a normal float.
__device__ __forceinline__ float pow2f(int e) {
  return (e >= -126 && e <= 127) ? __int_as_float((e + 127) << 23) : scalbnf(1.0f, e);
}

// Each thread turns chunks of 8 consecutive K elements (one scale: block_k is 16 or 32) into bf16:
// 8 (FP8) or 4 (FP4) bytes in, 16 bytes out, so a warp's loads and stores are both contiguous. Rows
// run over blockIdx.y and K over blockIdx.x (no division per chunk). Decoding uses the hardware
// conversions (bit-identical to formats.hpp: tests/formats compares them on the GPU), and the scale
// is a power of two, so every step is exact.
constexpr int kDqThreads = 256, kDqPer = 8, kDqUnroll = 2;
template <DType kData>
__global__ void __launch_bounds__(kDqThreads) dequant_bf16_kernel(const uint8_t* __restrict__ data,
                                                                  const void* __restrict__ scales,
                                                                  layouts::ScaleLayout l,
                                                                  const EmulatedShifts* shifts, int which,
                                                                  uint16_t* __restrict__ out) {
  const bool e8m0 = l.scale_dtype() == DType::kE8M0;
  const int shift = shifts->shift[which];
  const int bk_log2 = __ffs(int(l.block_k())) - 1;  // 16 or 32: a power of two
  const int64_t k = l.k;
  constexpr int kBytes = kData == DType::kE2M1 ? kDqPer / 2 : kDqPer;  // input bytes per chunk
  for (int64_t r = blockIdx.y; r < l.rows; r += gridDim.y) {
    uint32_t w[kDqUnroll][kBytes / 4];
    float scale[kDqUnroll];
    int64_t k0[kDqUnroll];
#pragma unroll
    for (int u = 0; u < kDqUnroll; ++u) {  // all loads first: bytes in flight
      k0[u] = (int64_t(blockIdx.x) * kDqUnroll + u) * (kDqThreads * kDqPer) + threadIdx.x * kDqPer;
      if (k0[u] >= k) continue;
      const uint8_t code = static_cast<const uint8_t*>(scales)[l.offset(r, k0[u] >> bk_log2)];
      if (e8m0) scale[u] = code == 255 ? __int_as_float(0x7FC00000) : pow2f(int(code) - 127 + shift);
      else scale[u] = formats::decode_ue4m3(code) * pow2f(shift);
      const uint8_t* src = data + (r * k + k0[u]) * kBytes / kDqPer;
      if constexpr (kBytes == 8) {
        const uint2 v = __ldcs(reinterpret_cast<const uint2*>(src));
        w[u][0] = v.x, w[u][1] = v.y;
      } else {
        w[u][0] = __ldcs(reinterpret_cast<const unsigned int*>(src));
      }
    }
#pragma unroll
    for (int u = 0; u < kDqUnroll; ++u) {
      if (k0[u] >= k) continue;
      uint32_t o[kDqPer / 2];
#pragma unroll
      for (int j = 0; j < kDqPer; j += 2) {
        __half2_raw h;
        if constexpr (kData == DType::kE2M1) {
          const uint8_t pair = uint8_t(w[u][j / 8] >> (4 * (j % 8)));
          h = __nv_cvt_fp4x2_to_halfraw2(__nv_fp4x2_storage_t(pair), __NV_E2M1);
        } else {
          const uint16_t pair = uint16_t(w[u][j / 4] >> (8 * (j % 4)));
          h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(pair), kData == DType::kE4M3 ? __NV_E4M3 : __NV_E5M2);
        }
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
        const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * scale[u], f.y * scale[u]);
        o[j / 2] = *reinterpret_cast<const uint32_t*>(&b);
      }
      // Streaming store: the BF16 copy is read once, by the GEMM that follows, and should not sit in
      // L2 as dirty lines when that GEMM starts.
      __stcs(reinterpret_cast<uint4*>(out + r * k + k0[u]), make_uint4(o[0], o[1], o[2], o[3]));
    }
  }
}

// Small scale conversions of one GEMM in one launch: each thread writes one element of a destination's
// padded grid, the source element found through the source layout's offset() (zero for padding), as
// the host conversion does. Uncoalesced on one side, which does not matter at these sizes: what a small
// GEMM pays for is launches (see convert_scales_small).
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
    const int64_t so = real ? c.from.offset(p * c.to.row_step(), kb) : 0;
    const int64_t d = c.to.padded_offset(p, kb);
    if (c.to.scale_bytes() == 4)
      static_cast<float*>(c.dst)[d] = real ? static_cast<const float*>(c.src)[so] : 0.0f;
    else
      static_cast<uint8_t*>(c.dst)[d] = real ? static_cast<const uint8_t*>(c.src)[so] : uint8_t(0);
  }
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
  NeedArgs na{};
  const EmulatedOperand* ops[2] = {&a, &b};
  int64_t blocks = 1;
  for (int i = 0; i < 2; ++i) {
    const layouts::ScaleLayout& l = ops[i]->layout;
    na.data[i] = static_cast<const uint8_t*>(ops[i]->data);
    na.scales[i] = static_cast<const uint8_t*>(ops[i]->scales);
    na.layout[i] = l;
    na.dtype[i] = ops[i]->dtype;
    na.e8m0[i] = l.scale_dtype() == DType::kE8M0;
    na.flat[i] = l.recipe == Recipe::kMxfp8 && l.format == ScaleFormat::kCompact;
    if (na.e8m0[i]) blocks = std::max(blocks, na.flat[i] ? (l.size() + 4095) / 4096 : l.rows);
  }
  // Flat scans: 4096 codes per block; row walks: one row per block. At most 1024 blocks per operand.
  const dim3 grid(unsigned(std::min<int64_t>(blocks, 1024)), 2);
  e8m0_need_kernel<<<grid, 256, 0, cs>>>(na, shifts);
  check_launch("emulated_prepare");
}

void emulated_dequantize_bf16(const EmulatedOperand& op, const EmulatedShifts* shifts, int which, uint16_t* out,
                              Stream stream) {
  if (op.layout.k % 8 != 0)
    throw Error(StatusCode::kInternal, "emulated_dequantize_bf16: K=" + std::to_string(op.layout.k) +
                                           " is not a multiple of 8 (the planner should not have chosen this path)");
  const cudaStream_t cs = reinterpret_cast<cudaStream_t>(stream);
  constexpr int64_t kPerBlock = int64_t(kDqThreads) * kDqPer * kDqUnroll;
  const dim3 grid(unsigned((op.layout.k + kPerBlock - 1) / kPerBlock),
                  unsigned(std::max<int64_t>(1, std::min<int64_t>(op.layout.rows, 65535))));
  const auto* d = static_cast<const uint8_t*>(op.data);
  switch (op.dtype) {
    case DType::kE4M3: dequant_bf16_kernel<DType::kE4M3><<<grid, kDqThreads, 0, cs>>>(d, op.scales, op.layout, shifts, which, out); break;
    case DType::kE5M2: dequant_bf16_kernel<DType::kE5M2><<<grid, kDqThreads, 0, cs>>>(d, op.scales, op.layout, shifts, which, out); break;
    case DType::kE2M1: dequant_bf16_kernel<DType::kE2M1><<<grid, kDqThreads, 0, cs>>>(d, op.scales, op.layout, shifts, which, out); break;
    default: throw Error(StatusCode::kInternal, "emulated_dequantize_bf16: unsupported data type");
  }
  check_launch("emulated_dequantize_bf16");
}

void convert_scales_small(const ScaleConversion* conv, int count, Stream stream) {
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
  convert_small_kernel<<<blocks, 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(sc);
  check_launch("convert_scales_small");
}

void finish_fp8_output(const float* src, void* d, DType d_dtype, int64_t count, const float* d_scale, float* d_amax,
                       Stream stream) {
  const cudaStream_t cs = reinterpret_cast<cudaStream_t>(stream);
  if (d_amax && cudaMemsetAsync(d_amax, 0, sizeof(float), cs) != cudaSuccess) check_launch("finish_fp8_output amax");
  const unsigned blocks = unsigned(std::max<int64_t>(1, std::min<int64_t>((count + 255) / 256, 2048)));
  if (d_dtype == DType::kE4M3)
    finish_fp8_kernel<DType::kE4M3><<<blocks, 256, 0, cs>>>(src, static_cast<uint8_t*>(d), count, d_scale, d_amax);
  else
    finish_fp8_kernel<DType::kE5M2><<<blocks, 256, 0, cs>>>(src, static_cast<uint8_t*>(d), count, d_scale, d_amax);
  check_launch("finish_fp8_output");
}

}  // namespace scalemm::dispatch
