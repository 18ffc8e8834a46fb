// The emulated backend (emulated.hpp): plan, run, and the two device steps that make the dequantized
// BF16 operands exact.
#include "backends/emulated.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "backends/backend.hpp"
#include "backends/native.hpp"
#include "base/capabilities.hpp"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/formats.hpp"
#include "scalemm/status.hpp"

namespace scalemm::backends {
namespace {

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

constexpr int kNeedLoads = 4;  // 16-code words per thread and pass of the flat scan

// The shift an E8M0 scale's block needs (low bound minus code; blocks under code 3 are read to see
// whether they hold subnormal, normal or no nonzero values), and the largest code. Both operands in one
// launch (blockIdx.y); the last block to finish chooses the shifts, so prepare is two small launches.
// Compact mxfp8 scales (the common case) are scanned as a flat byte buffer, 16 codes per load: every
// byte is a real scale, and the rare block that needs its data read finds (row, K-block) by division,
// checked against offset(). Other formats walk (row, K-block) and read four adjacent codes at once
// (adjacent in both formats: compact rows, and the s % 4 lane of a 128x4 tile; checked through
// offset() before one 32-bit load).
// `a` is a grid constant: indexing it by blockIdx.y reads the parameter space in place instead of
// copying the struct to each thread's stack.
__global__ void __launch_bounds__(256) e8m0_need_kernel(const __grid_constant__ NeedArgs a, EmulatedShifts* s) {
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
    // kNeedLoads 16-code words per thread, all loaded before any is looked at (a one-wave grid of
    // latency-bound blocks otherwise). Words whose 16 codes all lie in [low_code, 254] need only
    // their minimum and maximum; the others (rare) are re-read byte by byte afterwards.
    const bool vec = (reinterpret_cast<uintptr_t>(scales) & 15) == 0;
    const int64_t n16 = (n + 15) / 16, stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t base = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; base < n16; base += kNeedLoads * stride) {
      uint4 w[kNeedLoads];
#pragma unroll
      for (int u = 0; u < kNeedLoads; ++u) {
        const int64_t i = base + u * stride;
        if (vec && i * 16 + 16 <= n) w[u] = *reinterpret_cast<const uint4*>(scales + i * 16);
      }
      unsigned slow = 0;
#pragma unroll
      for (int u = 0; u < kNeedLoads; ++u) {
        const int64_t i = base + u * stride;
        if (i >= n16) continue;
        if (!vec || i * 16 + 16 > n) {
          slow |= 1u << u;
          continue;
        }
        const uint32_t lo4 = __vminu4(__vminu4(w[u].x, w[u].y), __vminu4(w[u].z, w[u].w));
        const uint32_t hi4 = __vmaxu4(__vmaxu4(w[u].x, w[u].y), __vmaxu4(w[u].z, w[u].w));
        const int lo_c = int(min(min(lo4 & 0xFF, (lo4 >> 8) & 0xFF), min((lo4 >> 16) & 0xFF, lo4 >> 24)));
        const int hi_c = int(max(max(hi4 & 0xFF, (hi4 >> 8) & 0xFF), max((hi4 >> 16) & 0xFF, hi4 >> 24)));
        if (lo_c >= low_code && hi_c != 255) {
          hi = max(hi, hi_c);
          need = max(need, low_code - lo_c);
        } else {
          slow |= 1u << u;
        }
      }
      for (; slow; slow &= slow - 1) {
        const int64_t i = base + (__ffs(int(slow)) - 1) * stride;
        for (int64_t idx = i * 16; idx < min(n, i * 16 + 16); ++idx) visit_flat(scales[idx], idx);
      }
    }
  } else if (a.e8m0[which]) {
    const int64_t kb_count = l.kblocks();
    for (int64_t r = blockIdx.x; r < l.rows; r += gridDim.x)
      for (int64_t kb0 = int64_t(threadIdx.x) * 4; kb0 < kb_count; kb0 += int64_t(blockDim.x) * 4) {
        const int64_t o = l.offset(r, kb0);
        const int n = kb_count - kb0 < 4 ? int(kb_count - kb0) : 4;
        if (n == 4 && (reinterpret_cast<uintptr_t>(scales + o) & 3) == 0 && l.offset(r, kb0 + 3) == o + 3) {
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

// Two E2M1 values (the low byte of b: element 0 in the low nibble) as f16x2 bits whose values are
// the E2M1 values times 2^-14: sign to bit 15, the three magnitude bits (exponent, mantissa) to the
// top of the f16 exponent and mantissa fields. Exponent 0 lands on the f16 subnormal 2^-15 (E2M1
// 0.5), exponent e > 0 on 2^(e-15) (E2M1 2^(e-1)), so one scale factor of 2^14 restores every value.
// sm_90 has no E2M1 conversion instruction (cuda_fp4.hpp falls back to a generic software path).
__device__ __forceinline__ uint32_t e2m1x2_to_f16x2_times_2pow_m14(uint32_t b) {
  return ((b & 0x7u) << 9) | ((b & 0x8u) << 12) | ((b & 0x70u) << 21) | ((b & 0x80u) << 24);
}

// Each thread turns kDqUnroll chunks of 8 consecutive K elements (8 FP8 / 4 FP4 bytes in, 16 bytes of
// bf16 out) into bf16. Chunks are numbered over the whole (rows, K) matrix, which K % 8 == 0 makes
// contiguous in both the input and the output: the lanes of a warp read and write adjacent chunks
// (coalesced on both sides), and only the scale lookup needs the row (one 32-bit division per chunk).
// A chunk lies inside one 16- or 32-element block, so it has one scale. FP8 decodes through the
// hardware conversion (bit-identical to formats.hpp: tests/formats compares them on the GPU), FP4
// through the bit mapping above; every scale is a power of two or a UE4M3 value and every product
// fits BF16 (see emulated_prepare), so every step is exact.
constexpr int kDqThreads = 256, kDqPer = 8, kDqUnroll = 4;
template <DType kData>
__global__ void __launch_bounds__(kDqThreads) dequant_bf16_kernel(const uint8_t* __restrict__ data,
                                                                  const uint8_t* __restrict__ scales,
                                                                  layouts::ScaleLayout l,
                                                                  const EmulatedShifts* shifts, int which,
                                                                  uint16_t* __restrict__ out,
                                                                  uint32_t chunks_per_row, uint64_t chunks) {
  constexpr bool kFp4 = kData == DType::kE2M1;
  constexpr int kIn = kFp4 ? kDqPer / 2 : kDqPer;  // input bytes per chunk
  const bool e8m0 = l.scale_dtype() == DType::kE8M0;
  const int shift = shifts->shift[which] + (kFp4 ? 14 : 0);
  const int bk_log2 = __ffs(int(l.block_k())) - 1;  // 16 or 32: a power of two
  const bool narrow = chunks <= 0xFFFFFFFFull;
  uint32_t w[kDqUnroll][kIn / 4];
  float scale[kDqUnroll];
  uint64_t c[kDqUnroll];
#pragma unroll
  for (int u = 0; u < kDqUnroll; ++u) {  // all loads first: bytes in flight
    c[u] = (uint64_t(blockIdx.x) * kDqUnroll + u) * kDqThreads + threadIdx.x;
    if (c[u] >= chunks) continue;
    const uint64_t r = narrow ? uint64_t(uint32_t(c[u]) / chunks_per_row) : c[u] / chunks_per_row;
    const int64_t kb = (int64_t(c[u] - r * chunks_per_row) * kDqPer) >> bk_log2;
    const uint8_t code = scales[l.offset(int64_t(r), kb)];
    if (e8m0) scale[u] = code == 255 ? __int_as_float(0x7FC00000) : pow2f(int(code) - 127 + shift);
    else scale[u] = formats::decode_ue4m3(code) * pow2f(shift);
    const uint8_t* src = data + c[u] * kIn;
    if constexpr (kIn == 8) {
      const uint2 v = __ldcs(reinterpret_cast<const uint2*>(src));
      w[u][0] = v.x, w[u][1] = v.y;
    } else {
      w[u][0] = __ldcs(reinterpret_cast<const unsigned int*>(src));
    }
  }
#pragma unroll
  for (int u = 0; u < kDqUnroll; ++u) {
    if (c[u] >= chunks) continue;
    uint32_t o[kDqPer / 2];
#pragma unroll
    for (int p = 0; p < kDqPer / 2; ++p) {  // elements 2p, 2p + 1
      uint32_t h;
      if constexpr (kFp4) {
        h = e2m1x2_to_f16x2_times_2pow_m14(w[u][0] >> (8 * p));
      } else {
        const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w[u][p / 2] >> (16 * (p % 2))),
                                                          kData == DType::kE4M3 ? __NV_E4M3 : __NV_E5M2);
        h = uint32_t(r.x) | (uint32_t(r.y) << 16);
      }
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
      const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * scale[u], f.y * scale[u]);
      o[p] = *reinterpret_cast<const uint32_t*>(&b);
    }
    // Streaming store: the BF16 copy is read once, by the GEMM that follows, and should not sit in
    // L2 as dirty lines when that GEMM starts.
    __stcs(reinterpret_cast<uint4*>(out + c[u] * kDqPer), make_uint4(o[0], o[1], o[2], o[3]));
  }
}

template <DType kData>
void launch_dequant(const EmulatedOperand& op, const EmulatedShifts* shifts, int which, uint16_t* out,
                    cudaStream_t cs) {
  const uint64_t per_row = uint64_t(op.layout.k / kDqPer), chunks = per_row * uint64_t(op.layout.rows);
  if (chunks == 0) return;
  const uint64_t blocks = (chunks + kDqThreads * kDqUnroll - 1) / (kDqThreads * kDqUnroll);
  dequant_bf16_kernel<kData><<<unsigned(blocks), kDqThreads, 0, cs>>>(
      static_cast<const uint8_t*>(op.data), static_cast<const uint8_t*>(op.scales), op.layout, shifts, which, out,
      uint32_t(per_row), chunks);
}

}  // namespace

void emulated_prepare(const EmulatedOperand& a, const EmulatedOperand& b, EmulatedShifts* shifts, Stream stream) {
  const cudaStream_t cs = stream;
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
    if (na.e8m0[i]) blocks = std::max(blocks, na.flat[i] ? (l.size() + 16 * 256 * kNeedLoads - 1) / (16 * 256 * kNeedLoads) : l.rows);
  }
  // Flat scans: 16 codes x kNeedLoads per thread; row walks: one row per block. At most 1024 blocks
  // per operand.
  const dim3 grid(unsigned(std::min<int64_t>(blocks, 1024)), 2);
  e8m0_need_kernel<<<grid, 256, 0, cs>>>(na, shifts);
  detail::launch_check("emulated_prepare");
}

void emulated_dequantize_bf16(const EmulatedOperand& op, const EmulatedShifts* shifts, int which, uint16_t* out,
                              Stream stream) {
  const int64_t k = op.layout.k;
  if (k % 8 != 0)
    throw Error(StatusCode::kInternal, "emulated_dequantize_bf16: K=" + std::to_string(k) +
                                           " is not a multiple of 8 (the planner should not have chosen this path)");
  const cudaStream_t cs = stream;
  switch (op.dtype) {
    case DType::kE4M3: launch_dequant<DType::kE4M3>(op, shifts, which, out, cs); break;
    case DType::kE5M2: launch_dequant<DType::kE5M2>(op, shifts, which, out, cs); break;
    case DType::kE2M1: launch_dequant<DType::kE2M1>(op, shifts, which, out, cs); break;
    default: throw Error(StatusCode::kInternal, "emulated_dequantize_bf16: unsupported data type");
  }
  detail::launch_check("emulated_dequantize_bf16");
}

namespace {

enum Slot : int { kShifts = 0, kA16 = 1, kB16 = 2 };

class Emulated final : public BackendImpl {
 public:
  Backend id() const override { return Backend::kEmulated; }

  Verdict plan(const GemmProblem& p, const DeviceTarget& t, Plan& plan) const override {
    if (p.space == MemorySpace::kHost) return {false, "host pointers"};
    if (!t.has_gpu()) return {false, "no CUDA device"};
    std::string why;
    if (!base::exact_in_bf16(p, &why)) return {false, why};
    // cuBLASLt's BF16 GEMM writes a bf16 or f32 D, and takes a bf16 bias only with a bf16 D
    // (f16 D: NOT_SUPPORTED, f32 D with a bf16 bias: INVALID_VALUE, cuBLASLt 13.1 on sm_90).
    if (p.d_dtype != DType::kBF16 && p.d_dtype != DType::kF32)
      return {false, "cuBLASLt's BF16 GEMM writes bf16 or f32, not " + std::string(to_string(p.d_dtype))};
    if (p.has_bias && p.d_dtype != DType::kBF16)
      return {false, "cuBLASLt's BF16 GEMM takes a bf16 bias only with a bf16 output, got " +
                         std::string(to_string(p.d_dtype))};
    if (p.k % 8 != 0)
      return {false, "the exact BF16 dequantization writes 16-byte rows: K must be a multiple of 8, got K=" +
                         std::to_string(p.k)};
    const size_t a_bytes = static_cast<size_t>(p.m * p.k) * 2, b_bytes = static_cast<size_t>(p.n * p.k) * 2;
    plan.conversions.push_back({"a: " + std::string(to_string(p.a_recipe)) + " -> bf16 (exact)", int64_t(a_bytes)});
    plan.conversions.push_back({"b: " + std::string(to_string(p.b_recipe)) + " -> bf16 (exact)", int64_t(b_bytes)});
    plan.reserve(kShifts, sizeof(EmulatedShifts));
    plan.reserve(kA16, a_bytes);
    plan.reserve(kB16, b_bytes);
    return {true, "emulated: exact dequantization to BF16 + cuBLASLt BF16 GEMM with fp32 accumulation"};
  }

  // A power-of-two shift chosen on the device (no host sync, graph-capturable) moves an operand whose
  // values would fall under BF16's subnormal floor, and the opposite shift on the other operand keeps
  // the product, so alpha stays a host value.
  void run(const GemmArgs& args, const Plan& plan, const RunContext& ctx) const override {
    auto* shifts = ctx.slice<EmulatedShifts>(plan, kShifts);
    auto* a16 = ctx.slice<uint16_t>(plan, kA16);
    auto* b16 = ctx.slice<uint16_t>(plan, kB16);
    const EmulatedOperand ea{args.a.data, args.a.dtype, args.a.scale,
                             layouts::ScaleLayout(args.a.recipe, args.m, args.k, args.a.scale_format)};
    const EmulatedOperand eb{args.b.data, args.b.dtype, args.b.scale,
                             layouts::ScaleLayout(args.b.recipe, args.n, args.k, args.b.scale_format)};
    emulated_prepare(ea, eb, shifts, ctx.stream);
    emulated_dequantize_bf16(ea, shifts, 0, a16, ctx.stream);
    emulated_dequantize_bf16(eb, shifts, 1, b16, ctx.stream);
    LtCall c;
    c.m = args.m, c.n = args.n, c.k = args.k;
    c.a_dtype = c.b_dtype = DType::kBF16, c.d_dtype = args.d_dtype;
    c.a = a16, c.b = b16, c.d = args.d, c.bias = args.bias;
    c.alpha = native::folded_alpha(args);
    ctx.matmul(c);
  }
};

}  // namespace

const BackendImpl& emulated_backend() {
  static const Emulated b;
  return b;
}

}  // namespace scalemm::backends
