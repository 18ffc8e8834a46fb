// The library's quantizers and dequantizer on the GPU (declared in fast_quantizers.hpp; reached
// through scalemm::quantize, quantize/api.cu). Their arithmetic is numerics/detail/functors.hpp, the
// reference emulator's too, so their bytes equal the host emulator's; the tests in tests/emulation
// check that byte for byte. Compiled with -fmad=false like the emulator.
#include "fast_quantizers.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "detail/driver.hpp"
#include "detail/fast_codecs.cuh"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/detail/device_state.hpp"
#include "scalemm/status.hpp"

namespace scalemm::quantize::kernels {

using scalemm::detail::cuda_check;

using scalemm::detail::PerDevice;

namespace {
/// SM count of the current device (the caller made the stream's device current).
int sm_count() { return scalemm::detail::sm_count(scalemm::detail::current_device()); }

/// Blocks of `kernel` (256 threads, no dynamic shared memory) resident per SM on the current device.
template <class Kernel>
int blocks_per_sm(PerDevice<int>& cache, Kernel kernel) {
  return cache.get(scalemm::detail::current_device(), [&](int) {
    int n = 0;
    cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, 256, 0), "occupancy");
    return std::max(n, 1);
  });
}
}  // namespace

// ---- fast GPU quantizers ------------------------------------------------------------------------
// Dedicated kernels for scalemm::quantize::quantize. They call the per-element and per-block arithmetic of
// detail/functors.hpp (load_hp's codecs, amax_update, compute_scale, encode_elem, finish_global,
// store_scale -> ScaleLayout::offset), so their bytes equal the host's; only the schedule differs:
//   * one 256-thread CTA per 128 x 128 tile of the source: the tile is read once (vector loads, one
//     row of 128 elements per warp) into shared memory as fp32 (row stride 129, odd, so that both
//     row and column accesses are conflict-free with the lane rotation below);
//   * rowwise output: a warp per tile row, 4 elements per lane, block amax by warp shuffles over the
//     bk/4 lanes of a block, 4 (FP8) or 2 (FP4) bytes per store, a warp writes 128 (64) contiguous B;
//   * columnwise output: a warp per tile column reads it down the shared tile (the transpose), same
//     per-lane work, stores contiguous along the transposed rows;
//   * 2D recipes: per-row partial amaxes in shared memory, then one warp per 2D block;
//   * tensorwise / NVFP4: a grid-stride amax pass first (a second read), unless the caller gives the
//     tensor amax (SourceMatrix::amax); rowwise recipe: a warp per row and a column-chunk amax pass,
//     then the tile kernel encodes with the precomputed multipliers.
// Which kernel runs (launch_all): rowwise-only requests take row_direct_kernel (or row_fused_kernel
// for the rowwise recipe); bf16/f16 sources with a columnwise output take rc2d_kernel (2D blocks) or
// rc1d_kernel (1D blocks); everything else (f32 sources with a columnwise output, the rowwise and
// tensorwise recipes' columnwise output) the fp32 tile kernel described here.


using numerics::detail::BlockScale;
using layouts::ScaleLayout;
namespace fmt = scalemm::formats;

constexpr int kTile = 128;             // tile rows and columns
constexpr int kStride = kTile + 1;     // shared row stride in floats
constexpr int kQThreads = 256;         // 8 warps
constexpr int kRowPart = 128 * 4;      // 2D row partials: 128 rows x up to 4 K-blocks
constexpr int kStage = 128 * 8;        // 1D: staged scales of one direction, 128 lines x up to 8 blocks
// After the tile: 2D uses row partials + block multipliers, 1D the two staged-scale arrays.
constexpr size_t kTileSmem = size_t(kTile * kStride + 2 * kStage) * sizeof(float);
constexpr int kAmaxBlocks = 1024;      // partials of the global amax pass
constexpr int64_t kColChunk = 256;     // rows per column-amax partial (rowwise recipe)

enum Kind : int { kBlocks1D = 0, kBlocks2D = 1, kPrecomputed = 4 };

/// Element type as a template argument (E = 0 e4m3, 1 e5m2, 2 e2m1): the encoder specialises.
template <int E>
constexpr DType kElem = E == 0 ? DType::kE4M3 : E == 1 ? DType::kE5M2 : DType::kE2M1;

struct TileArgs {
  const void* src;
  int64_t rows, cols, tiles_c;
  bool rowwise, columnwise;
  ScaleLayout lr, lc;
  void* scales_r;
  void* scales_c;
  int kind, bk;
  int mode;
  DType elem;
  float eps;
  const float* g;     ///< global scalars (tensorwise, NVFP4) or nullptr
  /// NVFP4 with a given tensor amax: the kernels derive the global scalars from it (globals()) and
  /// block 0 writes the output's global scale (publish_global), instead of a finish_global_kernel
  /// launch before them. Otherwise nullptr.
  const float* amax_in = nullptr;
  float* global_out = nullptr;
  const float* pm_r;  ///< kPrecomputed: multiplier of rowwise data row r at pm_r[r * pm_step] (kblocks = 1)
  const float* pm_c;  ///< kPrecomputed: multiplier of columnwise data row c at pm_c[c * pm_step]
  int64_t pm_step;    ///< 1: one multiplier per row (rowwise recipe); 0: one for all (tensorwise)
  uint8_t* out_r;
  uint8_t* out_c;
  bool vec_in, vec_out_r, vec_out_c;
  /// Grouped tokens (quantize_grouped, rc1d_kernel only): `groups` sizes in device memory, the source
  /// has src_rows rows, and `rows` is the padded row count of the columnwise output. Else nullptr.
  const int64_t* group_sizes = nullptr;
  int64_t groups = 0, src_rows = 0;
  /// Grouped tokens gathered (TokenGroups::gather): row r of the grouped source is row gather[r] of the
  /// gather_rows rows at src (zero for an index outside them), times row_weight[r] when not null.
  const int64_t* gather = nullptr;
  int64_t gather_rows = 0;
  const float* row_weight = nullptr;
  /// rc1d_act_kernel's further inputs, laid out as src (act_needs_aux / act_needs_aux2): the activation's
  /// input (GELU's backward), SwiGLU's up (forward) or gate (backward), and up (the gate's gradient).
  const void* aux = nullptr;
  const void* aux2 = nullptr;
  /// rc1d_act_kernel / rc1d_grouped_act_kernel: row strides in elements of src and of aux, aux2 (the
  /// halves of an MoE layer's [gate | up] output are strided views); tile_args sets both to cols.
  int64_t ld_src = 0, ld_aux = 0;
  /// rc1d_grouped_act_kernel with a second activation: the first column it applies to (see there).
  int64_t split = 0;

  __device__ BlockScale scale_of(float amax) const {
    const float2 gs = globals();
    return numerics::detail::compute_scale(amax, mode, elem, eps, gs.x, gs.y);
  }
  // Kernels templated on the element type E (0 e4m3, 1 e5m2, 2 e2m1) use these: E2M1 data is only
  // ever the NVFP4 recipe with its one scale mode (QuantizeConfig validation), so for E = 2 the
  // recipe and mode become constants and compute_scale's and offset()'s switches fold away.
  // gs = globals(): loops read g[1], g[2] once, ahead of the loop, instead of once per block (the
  // compiler cannot hoist them past the loop's stores).
  __device__ float2 globals() const {
    if (amax_in) {  // finish_global_kernel's arithmetic on the one given value
      float gg[3];
      numerics::detail::finish_global(numerics::detail::amax_update(0.0f, *amax_in), gg, nullptr);
      return make_float2(gg[1], gg[2]);
    }
    return g ? make_float2(g[1], g[2]) : make_float2(1.0f, 1.0f);
  }
  /// Every kernel that may run with amax_in calls this: block 0 writes S_dec to the global output.
  __device__ void publish_global() const {
    if (global_out && blockIdx.x == 0 && threadIdx.x == 0) *global_out = globals().y;
  }
  template <int E>
  __device__ BlockScale scale_as(float amax, float2 gs) const {
    return numerics::detail::compute_scale(amax, E == 2 ? int(numerics::detail::kModeNvfp4) : mode, kElem<E>, eps, gs.x, gs.y);
  }
  template <int E>
  __device__ BlockScale scale_as(float amax) const {
    return scale_as<E>(amax, globals());
  }
  /// First row and column of this block's 128 x 128 tile. One block per tile, so tiles_c <= gridDim.x
  /// < 2^32: a 32-bit division (a 64-bit one is ~70 instructions). Tiles from the last back, as
  /// row_direct_kernel's items (L2 holds what was read last).
  __device__ void tile_origin(int64_t& r0, int64_t& c0) const {
    const uint32_t tc32 = uint32_t(tiles_c), t = gridDim.x - 1 - blockIdx.x, tr = t / tc32;
    r0 = int64_t(tr) * kTile;
    c0 = int64_t(t - tr * tc32) * kTile;
  }
  /// The 128 x 128 tile at (r0, c0) lies inside the matrix and every access of it is aligned, so
  /// loads and stores need no bounds tests (load_raw4_whole / store4_whole).
  __device__ bool whole_tile(int64_t r0, int64_t c0) const {
    return vec_in && (!rowwise || vec_out_r) && (!columnwise || vec_out_c) && r0 + 128 <= rows && c0 + 128 <= cols;
  }
  // BK (1D-block kernels that know their block width at compile time): 32 is only ever MXFP8's
  // 1x32 / 32x1 blocks and 128 block1x128's, so the recipe is a constant there too.
  /// 2D-block kernels: BK 32 is only ever mxfp8-32x32, 128 block128x128.
  template <int BK>
  __device__ ScaleLayout layout_2d(const ScaleLayout& l) const {
    ScaleLayout c = l;
    c.recipe = BK == 32 ? Recipe::kMxfp8_32x32 : Recipe::kBlock128x128;
    return c;
  }
  template <int E, int BK = 0>
  __device__ ScaleLayout layout_as(const ScaleLayout& l) const {
    ScaleLayout c = l;
    if constexpr (E == 2) c.recipe = Recipe::kNvfp4;
    else if constexpr (BK == 32) c.recipe = Recipe::kMxfp8;
    else if constexpr (BK == 128) c.recipe = Recipe::kBlock1x128;
    return c;
  }
};

// Source element codecs: S = 0 f32, 1 bf16, 2 f16 (the same codecs as numerics::detail::load_hp).
template <int S>
struct Raw4 {
  using T = uint2;  // four 16-bit elements
};
template <>
struct Raw4<0> {
  using T = uint4;  // four f32
};

/// A 16-bit (bf16 / f16) code as fp32; half_value: the low (hi = 0) or high half of a 32-bit word.
template <int S>
__device__ __forceinline__ float decode16(uint32_t code16) {
  return S == 1 ? fmt::decode_bf16(uint16_t(code16)) : fmt::decode_f16(uint16_t(code16));
}
template <int S>
__device__ __forceinline__ float half_value(uint32_t w, int hi) {
  return decode16<S>(hi ? w >> 16 : w & 0xFFFFu);
}

template <int S>
__device__ __forceinline__ float raw_elem(const typename Raw4<S>::T& x, int j) {
  if constexpr (S == 0) {
    const uint32_t b = j == 0 ? x.x : j == 1 ? x.y : j == 2 ? x.z : x.w;
    return fmt::bits_float(b);
  } else {
    return half_value<S>(j < 2 ? x.x : x.y, j & 1);
  }
}

template <int S>
__device__ __forceinline__ uint32_t raw_bits(const void* src, int64_t i) {
  if constexpr (S == 0) return static_cast<const uint32_t*>(src)[i];
  else return static_cast<const uint16_t*>(src)[i];
}

/// Elements (r, c..c+3) of the source, its rows ld elements apart (ld = cols but for strided views), as
/// raw bits; zero (which decodes to +0, neutral for amax) outside the matrix.
template <int S>
__device__ __forceinline__ typename Raw4<S>::T load_raw4_ld(const void* src, int64_t rows, int64_t cols, int64_t ld,
                                                           bool vec, int64_t r, int64_t c) {
  using T = typename Raw4<S>::T;
  if (r >= rows || c >= cols) return T{};
  const int64_t i = r * ld + c;
  if (vec && c + 3 < cols) return *reinterpret_cast<const T*>(static_cast<const char*>(src) + i * (S == 0 ? 4 : 2));
  uint32_t e[4] = {0, 0, 0, 0};
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (c + j < cols) e[j] = raw_bits<S>(src, i + j);
  T x{};
  if constexpr (S == 0) {
    x.x = e[0]; x.y = e[1]; x.z = e[2]; x.w = e[3];
  } else {
    x.x = e[0] | (e[1] << 16);
    x.y = e[2] | (e[3] << 16);
  }
  return x;
}

template <int S>
__device__ __forceinline__ typename Raw4<S>::T load_raw4(const void* src, int64_t rows, int64_t cols, bool vec,
                                                        int64_t r, int64_t c) {
  return load_raw4_ld<S>(src, rows, cols, cols, vec, r, c);
}

// ---- activations fused into the 1D-block quantizer (quantize_activation, quantize_swiglu) --------
// ACT (FusedActivation): the value quantized at each element, from the source v and TileArgs::aux (a), aux2 (b):
//   kGelu          gelu_tanh(v)
//   kGeluGrad      v * gelu_tanh'(a)                       (v: the output gradient, a: GELU's input)
//   kSwiglu        silu(v) * a                             (v: gate, a: up)
//   kSwigluGate    silu'(a) * (v * b)                      (v: the output gradient, a: gate, b: up)
//   kSwigluUp      v * silu(a)                             (v: the output gradient, a: gate)
// Every intermediate a framework writes in the source's 16-bit type (silu(gate), the product's
// gradient) and the result are rounded to that type, so the bytes are those of quantizing what its
// elementwise kernels write. The arithmetic is spelled out with explicit roundings and fused
// multiply-adds where a compiler that contracts (PyTorch's kernels are built with -fmad=true) fuses
// them; this file itself is compiled with -fmad=false.
constexpr bool act_needs_aux(int act) { return act != kGelu; }
constexpr bool act_needs_aux2(int act) { return act == kSwigluGate; }

constexpr float kGeluBeta = float(0.79788456080286535588);  // sqrt(2 / pi)
constexpr float kGeluKappa = float(0.044715);

__device__ __forceinline__ float gelu_tanh(float x) {
  const float x_cube = __fmul_rn(__fmul_rn(x, x), x);
  const float inner = __fmul_rn(kGeluBeta, __fmaf_rn(kGeluKappa, x_cube, x));
  return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(inner)));
}

__device__ __forceinline__ float gelu_tanh_grad(float dy, float x) {
  const float x_sq = __fmul_rn(x, x);
  const float inner = __fmul_rn(kGeluBeta, __fmaf_rn(kGeluKappa, __fmul_rn(x_sq, x), x));
  const float t = tanhf(inner);
  const float left = __fmul_rn(0.5f, x);
  const float right = __fadd_rn(1.0f, t);
  const float tanh_derivative = __fmaf_rn(-t, t, 1.0f);
  const float inner_derivative = __fmul_rn(kGeluBeta, __fmaf_rn(3.0f * kGeluKappa, x_sq, 1.0f));
  const float right_derivative = __fmul_rn(__fmul_rn(left, tanh_derivative), inner_derivative);
  return __fmul_rn(dy, __fmaf_rn(0.5f, right, right_derivative));
}

__device__ __forceinline__ float silu(float x) { return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x))); }

__device__ __forceinline__ float silu_grad(float dy, float x) {
  const float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x)));
  return __fmul_rn(__fmul_rn(dy, s), __fmaf_rn(x, __fsub_rn(1.0f, s), 1.0f));
}

/// fp32 -> the 16-bit source type, to nearest even (the hardware conversion), NaN as the quiet NaN
/// with the input's sign that a framework's conversion writes.
template <int S>
__device__ __forceinline__ uint32_t round16(float v) {
  const uint32_t b = fmt::float_bits(v);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return ((b >> 16) & 0x8000u) | (S == 1 ? 0x7FC0u : 0x7E00u);
  if constexpr (S == 1) return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  else return __half_as_ushort(__float2half_rn(v));
}

/// One element through activation ACT, rounded to the source type (see FusedActivation).
template <int S, int ACT>
__device__ __forceinline__ uint32_t activate1(float v, float a, float b) {
  const auto r = [](float x) { return decode16<S>(round16<S>(x)); };  // a framework's 16-bit intermediate
  if constexpr (ACT == kGelu) return round16<S>(gelu_tanh(v));
  else if constexpr (ACT == kGeluGrad) return round16<S>(gelu_tanh_grad(v, a));
  else if constexpr (ACT == kSwiglu) return round16<S>(__fmul_rn(r(silu(v)), a));
  else if constexpr (ACT == kSwigluGate) return round16<S>(silu_grad(r(__fmul_rn(v, b)), a));
  else return round16<S>(__fmul_rn(v, r(silu(a))));
}

/// Four 16-bit source codes through the activation (aux, aux2: the further inputs' codes).
template <int S, int ACT>
__device__ __forceinline__ uint2 activate4(uint2 v, uint2 aux, uint2 aux2) {
  const uint32_t w[2] = {v.x, v.y}, x[2] = {aux.x, aux.y}, y[2] = {aux2.x, aux2.y};
  uint32_t o[2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
    o[i] = activate1<S, ACT>(half_value<S>(w[i], 0), half_value<S>(x[i], 0), half_value<S>(y[i], 0)) |
           (activate1<S, ACT>(half_value<S>(w[i], 1), half_value<S>(x[i], 1), half_value<S>(y[i], 1)) << 16);
  return make_uint2(o[0], o[1]);
}

/// NaN-propagating amax over groups of n consecutive lanes (n a power of two <= 32).
__device__ __forceinline__ float group_amax(float m, int n) {
  for (int off = 1; off < n; off <<= 1) m = numerics::detail::amax_update(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
  return m;
}

// Magnitudes of 16-bit (bf16 / f16) sources compared as raw codes: the sign masked off, two per
// 32-bit word; decoding is monotone non-decreasing in |code| with NaN codes above Inf, so the largest
// code decodes to exactly the amax that numerics::detail::amax_update folds over the decoded values.
__device__ __forceinline__ uint32_t mag2(uint32_t w) { return w & 0x7FFF7FFFu; }
__device__ __forceinline__ uint32_t umax_group(uint32_t m, int n) {
  for (int off = 1; off < n; off <<= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
  return m;
}

/// Block maxima of U units of 4 16-bit elements per lane (raw[k]: unit k), as magnitude codes packed
/// two units per word (mp[p]: unit 2p low, 2p + 1 high) and reduced over groups of n lanes: the
/// shuffles and maxima run on pairs of units.
/// Two units' code pairs (each the maxima of a lane's elements in two halves) folded to one word:
/// unit 0's maximum low, unit 1's high.
__device__ __forceinline__ uint32_t pack_unit_maxima(uint32_t c0, uint32_t c1) {
  return __vmaxu2(__byte_perm(c0, c1, 0x5410), __byte_perm(c0, c1, 0x7632));
}
template <int U>
__device__ __forceinline__ void unit_pair_maxima(const uint2 (&raw)[U], int n, uint32_t (&mp)[U / 2]) {
#pragma unroll
  for (int p = 0; p < U / 2; ++p) {
    const uint32_t c0 = __vmaxu2(mag2(raw[2 * p].x), mag2(raw[2 * p].y));
    const uint32_t c1 = __vmaxu2(mag2(raw[2 * p + 1].x), mag2(raw[2 * p + 1].y));
    uint32_t m = pack_unit_maxima(c0, c1);
    for (int off = 1; off < n; off <<= 1) m = __vmaxu2(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
    mp[p] = m;
  }
}
/// Unit k's block maximum held by lane src, decoded (k among units 2 * p0 .. 2 * p1 - 1: the shuffles
/// cover only those pairs).
template <int S, int U>
__device__ __forceinline__ float unit_max_from(const uint32_t (&mp)[U / 2], int p0, int p1, int k, int src) {
  uint32_t w = 0;
#pragma unroll
  for (int p = p0; p < p1; ++p) {
    const uint32_t x = __shfl_sync(0xFFFFFFFFu, mp[p], src);
    if (p == k >> 1) w = x;
  }
  return decode16<S>((k & 1) ? w >> 16 : w & 0xFFFFu);
}

/// Stores the packed codes of 4 consecutive output elements starting at element idx (n_valid of them
/// inside the row): FP8 one byte each, FP4 one nibble each (element 2i in the low nibble).
__device__ __forceinline__ void store4(uint8_t* out, int64_t idx, int64_t n_valid, uint32_t word, bool fp4, bool vec) {
  if (n_valid <= 0) return;
  if (fp4) {  // idx is even: rows have an even length and idx % 4 == 0 within the row
    uint8_t* p = out + idx / 2;
    if (vec && n_valid >= 4) {
      *reinterpret_cast<uint16_t*>(p) = uint16_t(word);
    } else {
      p[0] = uint8_t(word);
      if (n_valid >= 3) p[1] = uint8_t(word >> 8);
    }
  } else {
    if (vec && n_valid >= 4) {
      *reinterpret_cast<uint32_t*>(out + idx) = word;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (j < n_valid) out[idx + j] = uint8_t(word >> (8 * j));
    }
  }
}

/// load_raw4 / store4 where the caller knows all four elements lie inside the matrix and the
/// access is aligned (a whole tile or item): no bounds tests, one vector access.
template <int S>
__device__ __forceinline__ typename Raw4<S>::T load_raw4_whole(const void* src, int64_t i) {
  return *reinterpret_cast<const typename Raw4<S>::T*>(static_cast<const char*>(src) + i * (S == 0 ? 4 : 2));
}
/// The byte of output element idx (>= 0; FP4: idx even, two elements per byte). In whole tiles the
/// kernels take it once per lane and step it by whole rows (idx terms are even for FP4, so the
/// halving distributes), instead of a 64-bit index product and halving per store.
__device__ __forceinline__ uint8_t* out_at(uint8_t* out, int64_t idx, bool fp4) {
  return out + (uint64_t(idx) >> (fp4 ? 1 : 0));
}
__device__ __forceinline__ void store_packed(uint8_t* p, uint32_t word, bool fp4) {
  if (fp4) *reinterpret_cast<uint16_t*>(p) = uint16_t(word);
  else *reinterpret_cast<uint32_t*>(p) = word;
}
__device__ __forceinline__ void store4_whole(uint8_t* out, int64_t idx, uint32_t word, bool fp4) {
  store_packed(out_at(out, idx, fp4), word, fp4);
}

/// Encodes 4 values (v[j] is element (j + rot) & 3 of the group) with multiplier m and packs them in
/// element order. FP8 pairs go through numerics::detail::encode_pair (hardware cvt on sm_89+, equal to
/// encode_elem on every input), E2M1 quads through encode_e2m1x4_not_nan; the codes are packed in v's
/// order and the word rotated afterwards.
template <int E>
__device__ __forceinline__ uint32_t encode4(const float v[4], int rot, float m) {
  const float p0 = v[0] * m, p1 = v[1] * m, p2 = v[2] * m, p3 = v[3] * m;
  if constexpr (E == 2) {
    // NVFP4 multipliers are positive and finite, or NaN for a block that holds a NaN, and the four
    // values share one block: a product is NaN exactly when m is, so the NaN case of
    // encode_e2m1_satfinite (code 0x7) is one test here instead of one per element.
    uint32_t w = numerics::detail::encode_e2m1x4_not_nan(p0, p1, p2, p3);
    if (m != m) w = 0x7777u;
    const int s = 4 * rot;  // 16-bit rotate left: nibble j moves to nibble (j + rot) & 3
    return ((w << s) | (w >> ((16 - s) & 15))) & 0xFFFFu;
  } else {
    const uint32_t w = numerics::detail::encode_pair<E>(p0, p1) | (numerics::detail::encode_pair<E>(p2, p3) << 16);
    return __funnelshift_l(w, w, 8 * rot);  // byte j moves to byte (j + rot) & 3
  }
}

/// One direction's output of a 1D-block tile (COL: the transposed output, lines are tile columns).
/// Warp w owns the tile's lines w, w + 8, ..., w + 120; lane l holds elements 4l..4l+3 of a line (in
/// the rotated order of the shared tile). Three steps, so that the scale arithmetic runs once per
/// block on one lane instead of on every lane of every line:
///   A. per line: block amax by shuffles over the block's lanes, one lane writes it to stage[];
///   B. lane t computes the scales of blocks t, t + 32, ... of the warp's 16 x nbk blocks
///      (compute_scale), stores each at offset(data row, K-block) and leaves its multiplier in stage[];
///   C. per line: the elements again from shared memory, encoded with stage[]'s multiplier.
/// stage[line * 8 + b] (b < nbk <= 8) is only touched by the line's warp: __syncwarp suffices.
template <int E, bool COL>
__device__ __forceinline__ void lines_1d(const TileArgs& a, const float* tile, float* stage, int warp, int lane,
                                         int rot, int64_t r0, int64_t c0) {
  const int bk = a.bk, lpb = bk / 4, nbk = kTile / bk;
  constexpr int es = COL ? kStride : 1;  // element step along a line in the shared tile
  const int64_t line0 = COL ? c0 : r0, k0 = COL ? r0 : c0;
  const int64_t nlines = COL ? a.cols : a.rows, K = COL ? a.rows : a.cols;
  const auto line_ptr = [&](int line) {
    return COL ? tile + (4 * lane) * kStride + line : tile + line * kStride + 4 * lane;
  };
#pragma unroll 4
  for (int i = 0; i < kTile / 8; ++i) {
    const int line = warp + 8 * i;
    if (line0 + line >= nlines) continue;  // warp-uniform
    const float* p = line_ptr(line);
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) m = numerics::detail::amax_update(m, p[((j + rot) & 3) * es]);
    m = group_amax(m, lpb);
    if (lane % lpb == 0) stage[line * 8 + lane / lpb] = m;
  }
  __syncwarp();
  const float2 gs = a.globals();
  for (int e = lane; e < (kTile / 8) * nbk; e += 32) {
    const int line = warp + 8 * (e / nbk), b = e % nbk;
    const int64_t gl = line0 + line, kb = k0 / bk + b;
    if (gl >= nlines || kb * bk >= K) continue;
    const BlockScale s = a.template scale_as<E>(stage[line * 8 + b], gs);
    numerics::detail::store_scale(a.template layout_as<E>(COL ? a.lc : a.lr), COL ? a.scales_c : a.scales_r, gl, kb, s);
    stage[line * 8 + b] = s.multiplier;
  }
  __syncwarp();
  uint8_t* out = COL ? a.out_c : a.out_r;
  const bool vec = COL ? a.vec_out_c : a.vec_out_r;
#pragma unroll 2
  for (int i = 0; i < kTile / 8; ++i) {
    const int line = warp + 8 * i;
    const int64_t gl = line0 + line;
    if (gl >= nlines) continue;  // warp-uniform
    const float* p = line_ptr(line);
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = p[((j + rot) & 3) * es];
    const float mult = stage[line * 8 + lane / lpb];  // blocks past K: not a multiplier, nothing stored
    const int64_t kk = k0 + 4 * lane;
    store4(out, gl * K + kk, K - kk, encode4<E>(v, rot, mult), E == 2, vec);
  }
}

// Lane rotation: lane l touches element (j + l/8) & 3 of its 4-element group at step j, so that the
// 32 lanes of a warp hit 32 distinct banks both along a tile row (4l + jj + r) and down a tile column
// ((4l + jj) * 129 + c).
template <int S, int E>
__global__ void __launch_bounds__(kQThreads, 3) quant_tile_kernel(TileArgs a) {
  a.publish_global();
  extern __shared__ float smem[];
  float* tile = smem;
  float* rowpart = tile + kTile * kStride;  // 2D: [128][4]
  float* bmult = rowpart + kRowPart;        // 2D: up to 16 block multipliers
  // 1D: scales staged per (tile row, block) and (tile column, block), written after both passes so
  // that the offset() evaluations run on all lanes at once instead of one per warp and line.
  float* stage_r = tile + kTile * kStride;
  float* stage_c = stage_r + kStage;
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, rot = lane >> 3;
  int64_t r0, c0;
  a.tile_origin(r0, c0);

  // 1. The tile, read once: warp w loads rows w, w + 8, ...; lane l columns 4l..4l+3. (A persistent
  // variant that prefetched the next tile into registers ran slower: 2 CTAs per SM instead of 3.)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    typename Raw4<S>::T raw[8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
      raw[i] = load_raw4<S>(a.src, a.rows, a.cols, a.vec_in, r0 + warp + 8 * (8 * h + i), c0 + 4 * lane);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      float* trow = tile + (warp + 8 * (8 * h + i)) * kStride + 4 * lane;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int jj = (j + rot) & 3;
        trow[jj] = raw_elem<S>(raw[i], jj);
      }
    }
  }
  __syncthreads();

  const int bk = a.bk, lanes_per_block = a.bk / 4, nbk = kTile / a.bk;

  // 2. 2D blocks: row partials, then one warp per bk x bk block computes and writes its scale.
  if (a.kind == kBlocks2D) {
    for (int i = 0; i < kTile / 8; ++i) {
      const int lrow = warp + 8 * i;
      const float* trow = tile + lrow * kStride + 4 * lane;
      float m = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) m = numerics::detail::amax_update(m, trow[(j + rot) & 3]);
      m = group_amax(m, lanes_per_block);
      if (lane % lanes_per_block == 0) rowpart[lrow * 4 + (4 * lane) / bk] = m;
    }
    __syncthreads();
    for (int b = warp; b < nbk * nbk; b += 8) {
      const int br = b / nbk, bc = b % nbk;
      float m = 0.0f;
      for (int rr = lane; rr < bk; rr += 32) m = numerics::detail::amax_update(m, rowpart[(br * bk + rr) * 4 + bc]);
      m = group_amax(m, 32);
      const BlockScale s = a.scale_of(m);
      if (lane == 0) bmult[b] = s.multiplier;
      const int64_t gr = r0 / kTile * nbk + br, gk = c0 / kTile * nbk + bc;  // (grid row, K-block), rowwise grid
      const int64_t rb = gr * bk, cb = gk * bk;
      if (rb < a.rows && cb < a.cols) {
        if (a.rowwise) {
          const int64_t re = rb + bk < a.rows ? rb + bk : a.rows;
          for (int64_t r = rb + lane; r < re; r += 32) numerics::detail::store_scale(a.lr, a.scales_r, r, gk, s);
        }
        if (a.columnwise) {
          const int64_t ce = cb + bk < a.cols ? cb + bk : a.cols;
          for (int64_t c = cb + lane; c < ce; c += 32) numerics::detail::store_scale(a.lc, a.scales_c, c, gr, s);
        }
      }
    }
    __syncthreads();
  }

  constexpr bool fp4 = E == 2;

  // 3. Rowwise output. 1D blocks: lines_1d (lane-parallel scales). 2D and precomputed multipliers: a
  // warp per tile row (two lines in flight per warp for instruction-level parallelism).
  if (a.rowwise && a.kind == kBlocks1D) lines_1d<E, false>(a, tile, stage_r, warp, lane, rot, r0, c0);
  if (a.rowwise && a.kind != kBlocks1D) {
#pragma unroll 2
    for (int i = 0; i < kTile / 8; ++i) {
      const int lrow = warp + 8 * i;
      const int64_t r = r0 + lrow;
      if (r >= a.rows) continue;  // warp-uniform
      const int64_t c = c0 + 4 * lane;
      const float* trow = tile + lrow * kStride + 4 * lane;
      float v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = trow[(j + rot) & 3];
      const float mult = a.kind == kBlocks2D ? bmult[(lrow / bk) * nbk + (4 * lane) / bk] : a.pm_r[r * a.pm_step];
      store4(a.out_r, r * a.cols + c, a.cols - c, encode4<E>(v, rot, mult), fp4, a.vec_out_r);
    }
  }

  // 4. Columnwise (transposed) output: warp per tile column, lane l rows 4l..4l+3.
  if (a.columnwise && a.kind == kBlocks1D) lines_1d<E, true>(a, tile, stage_c, warp, lane, rot, r0, c0);
  if (a.columnwise && a.kind != kBlocks1D) {
#pragma unroll 2
    for (int i = 0; i < kTile / 8; ++i) {
      const int lcol = warp + 8 * i;
      const int64_t c = c0 + lcol;
      if (c >= a.cols) continue;  // warp-uniform
      const int64_t r = r0 + 4 * lane;
      const float* tcol = tile + (4 * lane) * kStride + lcol;
      float v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = tcol[((j + rot) & 3) * kStride];
      const float mult = a.kind == kBlocks2D ? bmult[((4 * lane) / bk) * nbk + lcol / bk] : a.pm_c[c * a.pm_step];
      store4(a.out_c, c * a.rows + r, a.rows - r, encode4<E>(v, rot, mult), fp4, a.vec_out_c);
    }
  }
}

/// The row kernels' items (row r, group g of a row's columns) go round-robin over the grid's warps.
/// The grid is one wave, so each warp steps through several items: (ri, gi) advance by the warp
/// count without a division per item, and a kernel's set-up runs once per warp. Items run from the
/// end of the matrix back (r = rows - 1 - ri, g = groups - 1 - gi): a global amax pass, or whatever
/// wrote the source, read it last, so its last tens of MB are still in L2 when the first items load.
template <class Item>
__device__ __forceinline__ void walk_items(int64_t rows, int64_t groups, Item&& item) {
  const int64_t nwarps = int64_t(gridDim.x) * (blockDim.x >> 5);
  const int64_t w0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t dr = nwarps / groups, dg = nwarps - dr * groups;
  int64_t ri = w0 / groups, gi = w0 - ri * groups;
  for (; ri < rows; ri += dr, gi += dg) {  // warp-uniform
    if (gi >= groups) {
      gi -= groups;
      if (++ri >= rows) break;
    }
    item(rows - 1 - ri, groups - 1 - gi);
  }
}

/// Rowwise-only requests of the 1D and precomputed kinds: no shared memory, no barrier. A unit is
/// 128 consecutive elements of one row (lane l: elements 4l..4l+3); each warp loads U units before it
/// encodes them, so that enough loads are in flight: U = 8 (64 bytes of bf16 per lane, as the fused
/// rowwise kernel). The scale step gives one block to each lane, in rounds of 32 blocks: one for FP8
/// (U * 128 / bk <= 32), two for NVFP4's 64 blocks of 16.
constexpr int kUnits = 4;  // dequantization
template <int E>
constexpr int kRowUnits = 8;
template <int E>
constexpr int kRowRounds = E == 2 ? 2 : 1;  // scale-step rounds of 32 blocks (one block per lane)

template <int S, int E>
__global__ void __launch_bounds__(256) row_direct_kernel(TileArgs a, int64_t groups) {
  a.publish_global();
  constexpr int kUnits = kRowUnits<E>;
  constexpr bool fp4 = E == 2;
  const int lane = int(threadIdx.x) & 31;
  // Block width: NVFP4's 16 as a constant; FP8 1D blocks are 32 or 128 wide, so lane arithmetic
  // goes by shifts (lpb = 2^lg_lpb lanes per block, nb blocks per unit).
  const int bk = E == 2 ? 16 : a.bk;
  const int lg_lpb = 29 - __clz(bk), lanes_per_block = 1 << lg_lpb, nb = kTile >> (lg_lpb + 2);
  const ScaleLayout lr = a.template layout_as<E>(a.lr);
  const float2 gs = a.globals();
  const bool vec = a.vec_in && a.vec_out_r;
  walk_items(a.rows, groups, [&](int64_t r, int64_t g) {
    const int64_t seg0 = g * kUnits, c0 = seg0 * kTile + 4 * lane;
    // Whole items (all kUnits units inside the row, aligned rows): one base address, no bounds.
    const bool whole = vec && (seg0 + kUnits) * kTile <= a.cols;
    const int64_t e0 = r * a.cols + c0;  // element index of the lane's first element
    typename Raw4<S>::T raw[kUnits];
    if (whole) {
#pragma unroll
      for (int k = 0; k < kUnits; ++k) raw[k] = load_raw4_whole<S>(a.src, e0 + k * kTile);
    } else {
#pragma unroll
      for (int k = 0; k < kUnits; ++k) raw[k] = load_raw4<S>(a.src, a.rows, a.cols, a.vec_in, r, c0 + k * kTile);
    }
    // E2M1 data is only ever NVFP4, always the 1D-block kind: the kind test folds away.
    const bool blocks1d = E == 2 || a.kind == kBlocks1D;
    const float pm = E != 2 && a.kind == kPrecomputed ? a.pm_r[r * a.pm_step] : 0.0f;
    float mult[kUnits];
#pragma unroll
    for (int k = 0; k < kUnits; ++k) mult[k] = pm;
    if (blocks1d) {
      // Block amaxes of the kUnits units (every lane of a block holds its block's amax), then lane t
      // takes block t of the warp's kUnits * nb blocks: one compute_scale and one offset() per lane
      // instead of one compute_scale per lane and unit; the multipliers go back by shuffles.
      // 16-bit sources: the largest magnitude code (mag2: decoding is monotone in |code|, NaN codes
      // above Inf), two units' codes packed in one word (unit 2p low, 2p + 1 high), so that the
      // lane reduction and the gather below shuffle pairs of units; decoded once per block.
      constexpr int kPairsU = kUnits / 2;
      uint32_t mp[kPairsU];
      float mk[kUnits];
      if constexpr (S == 0) {
#pragma unroll
        for (int k = 0; k < kUnits; ++k) {
          float m = 0.0f;
#pragma unroll
          for (int j = 0; j < 4; ++j) m = numerics::detail::amax_update(m, raw_elem<S>(raw[k], j));
          mk[k] = group_amax(m, lanes_per_block);
        }
      } else {
        unit_pair_maxima<kUnits>(raw, lanes_per_block, mp);
      }
      // Rounds of 32 blocks (NVFP4: 8 units x 8 blocks, two rounds of 4 units; FP8: one round).
      constexpr int kUR = kUnits / kRowRounds<E>;  // units per round (even)
#pragma unroll
      for (int h = 0; h < kRowRounds<E>; ++h) {
        const int k_of_t = h * kUR + (lane >> (5 - lg_lpb)), b_of_t = lane & (nb - 1);
        float mine = 0.0f;  // lanes past the round's blocks compute an unused scale of 0
        if constexpr (S == 0) {
#pragma unroll
          for (int k = h * kUR; k < (h + 1) * kUR; ++k) {
            const float x = __shfl_sync(0xFFFFFFFFu, mk[k], b_of_t << lg_lpb);
            if (k == k_of_t) mine = x;
          }
        } else {
          mine = unit_max_from<S, kUnits>(mp, h * kUR / 2, (h + 1) * kUR / 2, k_of_t, b_of_t << lg_lpb);
        }
        const BlockScale s = a.template scale_as<E>(mine, gs);
        const int64_t kb = (seg0 + h * kUR) * nb + lane;
        if (lane < kUR * nb && (whole || kb * bk < a.cols)) numerics::detail::store_scale(lr, a.scales_r, r, kb, s);
#pragma unroll
        for (int k = h * kUR; k < (h + 1) * kUR; ++k)
          mult[k] = __shfl_sync(0xFFFFFFFFu, s.multiplier, (k - h * kUR) * nb + (lane >> lg_lpb));
      }
    }
    const auto word = [&](int k) {
      float v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = raw_elem<S>(raw[k], j);
      return encode4<E>(v, 0, mult[k]);
    };
    if (whole) {
#pragma unroll
      for (int k = 0; k < kUnits; ++k) store4_whole(a.out_r, e0 + k * kTile, word(k), fp4);
    } else {
#pragma unroll
      for (int k = 0; k < kUnits; ++k) {  // units past the row end store nothing
        const int64_t c = c0 + k * kTile;
        store4(a.out_r, r * a.cols + c, a.cols - c, word(k), fp4, a.vec_out_r);
      }
    }
  });
}

/// NVFP4 rowwise from bf16 / f16 sources (row_direct_kernel's job, with wider lanes): a unit is 256
/// elements of a row and lane l holds elements 8l..8l+7 of it, one 16-byte load and one 32-bit store
/// of 8 codes; an item is 4 units (1024 elements, 64 blocks: groups as row_direct_kernel's). The two
/// lanes of a 16-element block each hold half of it, so the block maximum is one shuffle away, and
/// two units' maxima travel packed in one word. The scale step is row_direct_kernel's: two rounds of
/// 32 blocks, one block per lane (round h: units 2h and 2h + 1), multipliers back by shuffle. Every
/// 8 elements of a lane share one block, so a NaN block costs one test per 8 codes.
constexpr int kNvUnit = 256;  // elements per unit
constexpr int kNvUnits = 4;   // units per item (kRowUnits<2> * kTile elements)
static_assert(kNvUnit * kNvUnits == 8 * kTile, "row_nvfp4_kernel items are row_direct_kernel's");
template <int S>
__global__ void __launch_bounds__(256) row_nvfp4_kernel(TileArgs a, int64_t groups) {
  a.publish_global();
  const int lane = int(threadIdx.x) & 31;
  const ScaleLayout lr = a.template layout_as<2>(a.lr);
  const float2 gs = a.globals();
  // 16-byte loads need rows of a multiple of 8 elements and a 16-byte aligned source; the 32-bit
  // stores rows of a multiple of 8 codes and a 4-byte aligned output.
  const bool vec = a.vec_in && a.vec_out_r && (a.cols & 7) == 0 && (reinterpret_cast<uintptr_t>(a.src) & 15) == 0 &&
                   (reinterpret_cast<uintptr_t>(a.out_r) & 3) == 0;
  walk_items(a.rows, groups, [&](int64_t r, int64_t g) {
    const int64_t c0 = g * (kNvUnit * kNvUnits) + 8 * lane;
    const bool whole = vec && (g + 1) * (kNvUnit * kNvUnits) <= a.cols;
    const int64_t e0 = r * a.cols + c0;  // element index of the lane's first element
    uint4 raw[kNvUnits];
    if (whole) {
#pragma unroll
      for (int k = 0; k < kNvUnits; ++k)
        raw[k] = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.src) + e0 + k * kNvUnit);
    } else {
#pragma unroll
      for (int k = 0; k < kNvUnits; ++k) {
        const uint2 lo = load_raw4<S>(a.src, a.rows, a.cols, a.vec_in, r, c0 + k * kNvUnit);
        const uint2 hi = load_raw4<S>(a.src, a.rows, a.cols, a.vec_in, r, c0 + k * kNvUnit + 4);
        raw[k] = make_uint4(lo.x, lo.y, hi.x, hi.y);
      }
    }
    // Block maxima as magnitude codes, units (2p, 2p + 1) packed in mp[p], over the block's 2 lanes.
    uint32_t mp[kNvUnits / 2];
#pragma unroll
    for (int p = 0; p < kNvUnits / 2; ++p) {
      uint32_t c[2];
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const uint4& x = raw[2 * p + u];
        c[u] = __vmaxu2(__vmaxu2(mag2(x.x), mag2(x.y)), __vmaxu2(mag2(x.z), mag2(x.w)));
      }
      const uint32_t m = pack_unit_maxima(c[0], c[1]);
      mp[p] = __vmaxu2(m, __shfl_xor_sync(0xFFFFFFFFu, m, 1));
    }
    // Round h: lane t takes block t & 15 of unit 2h + (t >> 4), i.e. K-block 64g + 32h + t.
    const int64_t srow = lr.offset(r, 0);  // the row term of the item's scale offsets
    float mult[kNvUnits];
#pragma unroll
    for (int h = 0; h < kNvUnits / 2; ++h) {
      const uint32_t w = __shfl_sync(0xFFFFFFFFu, mp[h], 2 * (lane & 15));
      const BlockScale s = a.template scale_as<2>(decode16<S>((lane & 16) ? w >> 16 : w & 0xFFFFu), gs);
      const int64_t kb = g * (kNvUnits * kNvUnit / 16) + 32 * h + lane;
      if (whole || kb * 16 < a.cols) numerics::detail::store_scale_at(lr, a.scales_r, srow + lr.offset(0, kb), s);
#pragma unroll
      for (int u = 0; u < 2; ++u) mult[2 * h + u] = __shfl_sync(0xFFFFFFFFu, s.multiplier, 16 * u + (lane >> 1));
    }
    const auto half = [&](int k, int j) {  // codes of elements 4j..4j+3 of the lane's 8 in unit k
      const uint2 w = j ? make_uint2(raw[k].z, raw[k].w) : make_uint2(raw[k].x, raw[k].y);
      float v[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) v[i] = raw_elem<S>(w, i);
      return encode4<2>(v, 0, mult[k]);
    };
    if (whole) {
      uint8_t* const o = out_at(a.out_r, e0, true);
#pragma unroll
      for (int k = 0; k < kNvUnits; ++k)
        *reinterpret_cast<uint32_t*>(o + k * (kNvUnit / 2)) = half(k, 0) | (half(k, 1) << 16);
    } else {
#pragma unroll
      for (int k = 0; k < kNvUnits; ++k)
#pragma unroll
        for (int j = 0; j < 2; ++j) {  // past the row end nothing is stored
          const int64_t c = c0 + k * kNvUnit + 4 * j;
          store4(a.out_r, r * a.cols + c, a.cols - c, half(k, j), true, a.vec_out_r);
        }
    }
  });
}

/// Dequantization: a warp per row and kUnits chunks of 128 K-elements (lane l: 4l..4l+3). Each
/// block's scale is located (offset()) and decoded once per chunk, by the block's first lane, and
/// passed to the block's other lanes by a shuffle; values are OperandView::apply(element, scale) and
/// stored as numerics::detail::hp_bits, 4 per store where aligned.
/// D = 0 / 1: E4M3 / E5M2 data read 4 codes per 32-bit load where vec_in (ld and the data pointer
/// 4-aligned) and decoded in pairs by numerics::detail::decode_fp8_pair (hardware cvt on sm_89+, exact; NaN codes
/// give some NaN, which hp_bits writes canonically, as it does for OperandView::element's NaN). D = 2:
/// any other data type through OperandView::element.
template <int D>
__global__ void __launch_bounds__(256) dequant_kernel(numerics::detail::OperandView t, void* out, DType out_dtype,
                                                      int64_t groups, bool vec_out, bool vec_in) {
  const int lane = int(threadIdx.x) & 31;
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t K = t.layout.k;
  const int64_t r = w / groups;
  if (r >= t.layout.rows) return;  // warp-uniform
  const int64_t seg0 = (w - r * groups) * kUnits;
  const int64_t bk = t.layout.block_k();
  // Lanes per block within a chunk: 4 (16-element blocks), 8 (32), else the whole warp (128-element
  // blocks, and tensorwise/rowwise where one block is the whole row).
  const int lpb = bk >= kTile ? 32 : int(bk / 4);
  const bool wide = out_dtype == DType::kF32;
#pragma unroll
  for (int k = 0; k < kUnits; ++k) {
    if ((seg0 + k) * kTile >= K) break;  // warp-uniform
    const int64_t c = (seg0 + k) * kTile + 4 * lane;
    float s = 0.0f;
    if (lane % lpb == 0 && c < K) s = t.scale_at(t.layout.offset(r, c / bk));
    s = __shfl_sync(0xFFFFFFFFu, s, lane - lane % lpb);
    if (c >= K) continue;
    const int64_t base = r * t.ld + c, o = r * K + c;
    uint32_t b[4];
    if (D < 2 && vec_in && c + 3 < K) {
      const uint32_t codes = *reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(t.data) + base);
      float q[4];
      numerics::detail::decode_fp8_pair<D == 1 ? 1 : 0>(codes, q[0], q[1]);
      numerics::detail::decode_fp8_pair<D == 1 ? 1 : 0>(codes >> 16, q[2], q[3]);
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = numerics::detail::hp_bits(out_dtype, t.apply(q[j], s));
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = c + j < K ? numerics::detail::hp_bits(out_dtype, t.apply(t.element(base + j), s)) : 0u;
    }
    if (vec_out && c + 3 < K) {
      if (wide) *reinterpret_cast<uint4*>(static_cast<uint32_t*>(out) + o) = make_uint4(b[0], b[1], b[2], b[3]);
      else *reinterpret_cast<uint2*>(static_cast<uint16_t*>(out) + o) = make_uint2(b[0] | (b[1] << 16), b[2] | (b[3] << 16));
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (c + j >= K) break;
        if (wide) static_cast<uint32_t*>(out)[o + j] = b[j];
        else static_cast<uint16_t*>(out)[o + j] = uint16_t(b[j]);
      }
    }
  }
}

void dequantize(const QuantizedTensor& q, void* out, DType out_dtype, cudaStream_t st) {
  check_dequantize_args(q, out, out_dtype);
  const int64_t R = q.rows(), K = q.k();
  if (R * K == 0) return;
  const int64_t groups = layouts::ceil_div(layouts::ceil_div(K, kTile), kUnits);
  const int64_t blocks = layouts::ceil_div(R * groups, 8);
  SCALEMM_EXPECTS(blocks <= int64_t(0x7FFFFFFF), StatusCode::kUnsupported, "quantize::dequantize: matrix too large");
  const bool wide = out_dtype == DType::kF32;
  const bool vec_out = K % 4 == 0 && reinterpret_cast<uintptr_t>(out) % (wide ? 16 : 8) == 0;
  const bool vec_in = q.row_stride() % 4 == 0 && reinterpret_cast<uintptr_t>(q.data) % 4 == 0;
  const auto v = numerics::detail::view_of(q);
  if (q.dtype == DType::kE4M3) dequant_kernel<0><<<unsigned(blocks), 256, 0, st>>>(v, out, out_dtype, groups, vec_out, vec_in);
  else if (q.dtype == DType::kE5M2) dequant_kernel<1><<<unsigned(blocks), 256, 0, st>>>(v, out, out_dtype, groups, vec_out, vec_in);
  else dequant_kernel<2><<<unsigned(blocks), 256, 0, st>>>(v, out, out_dtype, groups, vec_out, vec_in);
  cuda_check(cudaGetLastError(), "dequant_kernel launch");
}

// ---- byte transpose (FP8 operands of the exact-transpose recipes) -------------------------------------

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

void transpose_bytes(const void* src, int64_t batch, int64_t rows, int64_t cols, void* dst, cudaStream_t st) {
  SCALEMM_EXPECTS(batch >= 0 && rows >= 0 && cols >= 0, StatusCode::kInvalidArgument,
                  "quantize::transpose: batch, rows and cols must be >= 0");
  if (batch * rows * cols == 0) return;
  SCALEMM_EXPECTS(src != nullptr && dst != nullptr, StatusCode::kInvalidArgument,
                  "quantize::transpose: src and dst must be device pointers, got null");
  const dim3 grid(unsigned(layouts::ceil_div(cols, kTT)), unsigned(layouts::ceil_div(rows, kTT)), unsigned(batch));
  SCALEMM_EXPECTS(layouts::ceil_div(rows, kTT) <= 65535 && batch <= 65535, StatusCode::kUnsupported,
                  "quantize::transpose: at most 65535 matrices of at most 4194240 rows");
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec_in = cols % 16 == 0 && aligned(src), vec_out = rows % 16 == 0 && aligned(dst);
  transpose_bytes_kernel<<<grid, 256, 0, st>>>(static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), rows,
                                               cols, vec_in, vec_out);
  cuda_check(cudaGetLastError(), "transpose_bytes_kernel launch");
}

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

// ---- 1D blocks in both directions from one read (bf16 / f16 sources) -----------------------------
// block1x128, mxfp8 and nvfp4 with columnwise output: a 256-thread CTA per 128 x 128 tile.
//   1. Warp w reads tile rows w, w + 8, ... straight into registers (lane l: columns 4l..4l+3, one
//      8-byte load per row) and encodes the rowwise output from them as row_direct_kernel does (kU
//      rows at a time, one block scale per lane); the raw 16-bit codes also go to shared memory.
//   2. The transposed output reads the tile down its columns, two columns per 32-bit word: lane l
//      holds rows 4l..4l+3 of a column pair; block amaxes are raw-code maxima of both columns at once
//      (__vmaxu2, shuffles over the block's bk/4 lanes), the warp's column scales are spread over its
//      lanes through a small shared stage, and the elements are encoded and stored 4 per lane.
// The tile is 128 rows of 65 words (odd, with the lane rotation of quant_tile_kernel: conflict-free
// column reads); 33 KB instead of the fp32 tile's 66 KB. The arithmetic is the shared one
// (compute_scale, encode_pair, store_scale -> offset()), so the bytes equal the host's.
constexpr int kW = 65;        // words per shared tile row: 64 column pairs + 1
constexpr int kPairs = 8;     // column pairs per warp in phase 2 (64 pairs / 8 warps)

/// The columnwise output of a 16-bit tile: column pairs cw = warp + 8q (q < kPairs), lane l holding
/// rows 4l..4l+3 of both columns (read with the lane rotation), 4 codes per lane and column stored
/// into the transposed rows. mult(q, col): the multiplier of column 2cw + col for the lane's rows.
template <int S, int E, class Mult>
__device__ __forceinline__ void encode_tile_columns(const TileArgs& a, const uint32_t* tile, int warp, int lane,
                                                    int64_t r0, int64_t c0, bool whole, Mult mult) {
  const int rot = lane >> 3;
  const int64_t rr = r0 + 4 * lane;
  // Whole tiles: the lane's byte in column c0 of the transposed output, stepped by columns.
  uint8_t* const ocol = whole ? out_at(a.out_c, c0 * a.rows + rr, E == 2) : nullptr;
  const int64_t col_bytes = E == 2 ? a.rows >> 1 : a.rows;
#pragma unroll 2
  for (int q = 0; q < kPairs; ++q) {
    const int cw = warp + 8 * q;
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) w[j] = tile[(4 * lane + ((j + rot) & 3)) * kW + cw];
#pragma unroll
    for (int col = 0; col < 2; ++col) {
      const int64_t c = c0 + 2 * cw + col;
      if (!whole && c >= a.cols) continue;  // warp-uniform
      float v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = decode16<S>((w[j] >> (16 * col)) & 0xFFFFu);
      const uint32_t code = encode4<E>(v, rot, mult(q, col));
      if (whole) store_packed(ocol + (2 * cw + col) * col_bytes, code, E == 2);
      else store4(a.out_c, c * a.rows + rr, a.rows - rr, code, E == 2, a.vec_out_c);
    }
  }
}

/// Elements (r, c..c+3) of gathered grouped tokens: row gather[r] of the source, times row_weight[r] in
/// fp32 rounded to the source type (a framework's gather, then its multiply); zero for index -1.
template <int S>
__device__ __forceinline__ uint2 load_gathered4(const TileArgs& a, int64_t r, int64_t c) {
  const int64_t g = a.gather[r];
  if (g < 0 || g >= a.gather_rows) return uint2{};
  const uint2 x = load_raw4<S>(a.src, a.gather_rows, a.cols, a.vec_in, g, c);
  if (!a.row_weight) return x;
  const float w = a.row_weight[r];
  const uint32_t in[2] = {x.x, x.y};
  uint32_t o[2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
    o[i] = round16<S>(__fmul_rn(half_value<S>(in[i], 0), w)) | (round16<S>(__fmul_rn(half_value<S>(in[i], 1), w)) << 16);
  return make_uint2(o[0], o[1]);
}

// One tile of rc1d_kernel. kWhole (the tile lies inside the matrix) is a template argument so that the
// interior tiles, nearly all of a large matrix, run without bounds checks, divergent-branch bookkeeping
// or the partial-store paths. The rows come from source rows rs0 .. rlim - 1 (zero below rlim) and go
// to rowwise rows rs0..; the columnwise output takes them as rows r0.. of the (a.rows) transposed
// columns. One matrix: rs0 = r0, rlim = a.rows; grouped tokens: group_rows().
template <int S, int E, int BK, bool kWhole, int ACT = 0, bool kGather = false>
__device__ __forceinline__ void rc1d_tile(const TileArgs& a, uint32_t* tile, uint32_t (*cmax)[kPairs * 8],
                                          float (*cmult)[kPairs * 2 * 8], int64_t r0, int64_t c0, int64_t rs0,
                                          int64_t rlim) {
  constexpr bool fp4 = E == 2;
  constexpr int kU = E == 2 ? 4 : 8;  // rows per rowwise batch: kU * (128 / bk) <= 32 blocks
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, rot = lane >> 3;
  // Block width BK: 16 (NVFP4), 32 (MXFP8) or 128 (block1x128), a template argument so that the
  // lane arithmetic, the shuffle loops and the recipe of offset() are constants.
  static_assert(BK == 16 || BK == 32 || BK == 128, "rc1d_kernel: 1D blocks are 16, 32 or 128 wide");
  constexpr int bk = BK, lg_lpb = BK == 16 ? 2 : BK == 32 ? 3 : 5, lg_nb = 5 - lg_lpb;
  constexpr int lpb = 1 << lg_lpb, nb = 1 << lg_nb;
  constexpr bool whole = kWhole;
  const float2 gs = a.globals();

  // 1. Rows: batches of kU rows (warp + 8 * (b * kU + k)).
#pragma unroll 1
  for (int b = 0; b < kTile / 8 / kU; ++b) {
    uint2 raw[kU];
    if (whole) {  // row k of the batch: 8 * kU * b + 8 * k rows below the warp's first
      const int64_t row = rs0 + warp + 8 * kU * b, c = c0 + 4 * lane;
      const int64_t ld = ACT != 0 ? a.ld_src : a.cols, e = row * ld + c, step = 8 * ld;
#pragma unroll
      for (int k = 0; k < kU; ++k) raw[k] = load_raw4_whole<S>(a.src, e + k * step);
      if constexpr (ACT != 0) {
        const int64_t ea = row * a.ld_aux + c, step_a = 8 * a.ld_aux;
#pragma unroll
        for (int k = 0; k < kU; ++k)
          raw[k] = activate4<S, ACT>(raw[k], act_needs_aux(ACT) ? load_raw4_whole<S>(a.aux, ea + k * step_a) : uint2{},
                                     act_needs_aux2(ACT) ? load_raw4_whole<S>(a.aux2, ea + k * step_a) : uint2{});
      }
    } else {
#pragma unroll
      for (int k = 0; k < kU; ++k) {
        const int64_t r = rs0 + warp + 8 * (b * kU + k);
        if constexpr (kGather) raw[k] = r < rlim ? load_gathered4<S>(a, r, c0 + 4 * lane) : uint2{};
        else if constexpr (ACT != 0) raw[k] = load_raw4_ld<S>(a.src, rlim, a.cols, a.ld_src, a.vec_in, r, c0 + 4 * lane);
        else raw[k] = load_raw4<S>(a.src, rlim, a.cols, a.vec_in, r, c0 + 4 * lane);
      }
      if constexpr (ACT != 0) {  // outside the matrix every load gives +0, which the activations keep
#pragma unroll
        for (int k = 0; k < kU; ++k) {
          const int64_t r = rs0 + warp + 8 * (b * kU + k), c = c0 + 4 * lane;
          raw[k] = activate4<S, ACT>(raw[k],
                                     act_needs_aux(ACT) ? load_raw4_ld<S>(a.aux, rlim, a.cols, a.ld_aux, a.vec_in, r, c) : uint2{},
                                     act_needs_aux2(ACT) ? load_raw4_ld<S>(a.aux2, rlim, a.cols, a.ld_aux, a.vec_in, r, c) : uint2{});
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      uint32_t* t = tile + (warp + 8 * (b * kU + k)) * kW + 2 * lane;
      t[0] = raw[k].x;
      t[1] = raw[k].y;
    }
    if (!a.rowwise) continue;
    uint32_t mp[kU / 2];
    unit_pair_maxima<kU>(raw, lpb, mp);
    // Lane t: block (k, kb) = (t >> lg_nb, t & (nb - 1)) of the batch.
    const int k_of_t = lane >> lg_nb, b_of_t = lane & (nb - 1);
    const float mine = unit_max_from<S, kU>(mp, 0, kU / 2, k_of_t, b_of_t << lg_lpb);
    const BlockScale s = a.template scale_as<E>(mine, gs);
    {
      const int64_t r = rs0 + warp + 8 * (b * kU + k_of_t), kb = (c0 >> (lg_lpb + 2)) + b_of_t;
      if (lane < kU * nb && (whole || (r < rlim && kb * bk < a.cols)))
        numerics::detail::store_scale(a.template layout_as<E, BK>(a.lr), a.scales_r, r, kb, s);
    }
    // Whole tiles: the lane's byte in the batch's first row, stepped by 8 rows.
    uint8_t* const orow = whole ? out_at(a.out_r, (rs0 + warp + 8 * kU * b) * a.cols + c0 + 4 * lane, fp4) : nullptr;
    const int64_t row8_bytes = fp4 ? 4 * a.cols : 8 * a.cols;
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      const float m = __shfl_sync(0xFFFFFFFFu, s.multiplier, k * nb + (lane >> lg_lpb));
      const int64_t r = rs0 + warp + 8 * (b * kU + k);
      if (!whole && r >= rlim) continue;  // warp-uniform
      const int64_t c = c0 + 4 * lane;
      float v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = raw_elem<S>(raw[k], j);
      const uint32_t code = encode4<E>(v, 0, m);
      if (whole) store_packed(orow + k * row8_bytes, code, fp4);
      else store4(a.out_r, r * a.cols + c, a.cols - c, code, fp4, a.vec_out_r);
    }
  }
  __syncthreads();

  // 2. Column pairs cw = warp + 8q. A. packed block maxima to cmax; B. lane t computes scales t,
  // t + 32, ... of the warp's 2 * kPairs * nb (column, block) pairs; C. encode and store.
  const auto word = [&](int cw, int j) { return tile[(4 * lane + ((j + rot) & 3)) * kW + cw]; };
#pragma unroll 2
  for (int q = 0; q < kPairs; ++q) {
    const int cw = warp + 8 * q;
    uint32_t m = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) m = __vmaxu2(m, mag2(word(cw, j)));
    for (int off = 1; off < lpb; off <<= 1) m = __vmaxu2(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
    if ((lane & (lpb - 1)) == 0) cmax[warp][q * nb + (lane >> lg_lpb)] = m;
  }
  __syncwarp();
  for (int i = lane; i < 2 * kPairs * nb; i += 32) {
    const int q = i >> (lg_nb + 1), col = (i >> lg_nb) & 1, blk = i & (nb - 1);
    const uint32_t code = (cmax[warp][q * nb + blk] >> (16 * col)) & 0xFFFFu;
    const BlockScale s = a.template scale_as<E>(decode16<S>(code), gs);
    const int64_t c = c0 + 2 * (warp + 8 * q) + col, kb = (r0 >> (lg_lpb + 2)) + blk;
    if (whole || (c < a.cols && kb * bk < a.rows)) numerics::detail::store_scale(a.template layout_as<E, BK>(a.lc), a.scales_c, c, kb, s);
    cmult[warp][i] = s.multiplier;
  }
  __syncwarp();
  encode_tile_columns<S, E>(a, tile, warp, lane, r0, c0, whole, [&](int q, int col) {
    return cmult[warp][((2 * q + col) << lg_nb) + (lane >> lg_lpb)];
  });
}

// NVFP4 row+col of a whole tile from a 16-bit source: one 16-element block per lane and direction.
// rc1d_tile spreads a block over 4 lanes, so every block costs maxima and multiplier shuffles and a
// staged scale step, and every lane locates a scale per block. Here a lane holds its whole block:
//   rows:    lane owns elements 16 (l & 7) .. +15 of tile rows rb + 32 i (rb = 4 warp + (l >> 3),
//            i < 4): the maximum in registers, one 8-byte store of 16 codes; the next row's two
//            16-byte loads are issued before this row is encoded;
//   columns: lane owns rows 16 g .. 16 g + 15 (g = l & 7) of column pairs p = 4 warp + h + 32 t
//            (h = l >> 3, t < 2): 16 shared words hold both columns' blocks, and the 8 lanes of a
//            column pair store 64 contiguous bytes of codes and their scales 4 and 4 adjacent bytes
//            (a lane per column pair and row group scattered the scale bytes over 32 sectors per
//            store and made the kernel L2-bound);
//   shared:  rows of kWn = 68 words (16-byte aligned, so 16-byte chunks move whole), chunk k of row r
//            at k ^ (k >> 3) ^ ((r >> 4) & 7): the 8 lanes of a row store chunks 2 ch (+ 1) into 8
//            distinct 4-bank groups, and word (16 g + j, p) of the column phase sits in bank
//            (4 j + 4 ((p >> 2) ^ t ^ g) + h) mod 32, 32 distinct banks over the warp;
//   scales:  the byte from nvfp4_scale_byte, the multiplier from a 128-entry table of
//            nvfp4_multiplier (a function of the byte alone), the position from one offset() per
//            lane stepped by ScaleLayout::row32_step() and row1_step();
//   codes:   from the magnitudes (source codes with the sign bits cleared, which the maximum needs
//            anyway) times the multiplier; the signs come from the source codes (the multiplier is
//            positive, so the product has the element's sign, -0 included). A block whose amax times
//            multiplier is below 7 needs no saturation (e2m1x4_small); others (tiny or zero-scale
//            blocks with the FLT_MAX multiplier, Inf, NaN) clamp at 6 and a NaN block's codes are 0x7.
// The arithmetic is compute_scale's and the encoder the element encoder's (tested over all inputs),
// so the bytes equal the host's. Needs 16-byte aligned source rows and 8-byte aligned outputs.
// Staging the whole tile through shared memory first (16 consecutive lanes per row per 16-byte load,
// rows encoded from there) measured 9% slower than each lane loading its own rows.
constexpr int kWn = 68;  // words per shared tile row of rc_nvfp4_tile
/// Byte offset in rc_nvfp4_tile's shared tile of 16-byte chunk k (< 16) of tile row r.
__device__ __forceinline__ uint32_t nv_chunk_bytes(int r, int k) {
  return uint32_t(4 * (r * kWn) + 16 * (k ^ (k >> 3) ^ ((r >> 4) & 7)));
}
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void sts128(uint32_t addr, const uint4& v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
/// prmt with a selector whose nibbles 8 | b replicate byte b's top bit (the sign of a 16-bit code).
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}
/// E2M1 sign bits (bit 3 of each code) of a row block's 16 elements, element e = half e & 1 of w[e >> 1].
__device__ __forceinline__ uint2 nv_signs_row(const uint32_t* w) {
  uint32_t r[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t* v = w + 4 * h;
    const uint32_t lo = prmt(prmt(v[0], v[1], 0xD9), prmt(v[2], v[3], 0xD9), 0x5410);  // elements 0, 2, 4, 6
    const uint32_t hi = prmt(prmt(v[0], v[1], 0xFB), prmt(v[2], v[3], 0xFB), 0x5410);  // elements 1, 3, 5, 7
    r[h] = (lo & 0x08080808u) | (hi & 0x80808080u);
  }
  return make_uint2(r[0], r[1]);
}
/// The same for both columns of a column pair, element e of column c = half c of w[e] (w[0..16)).
__device__ __forceinline__ void nv_signs_cols(const uint32_t* w, uint2 (&sg)[2]) {
  uint32_t s[4];  // elements 4q .. 4q + 3: column 0 in bits 0..15, column 1 in bits 16..31
#pragma unroll
  for (int q = 0; q < 4; ++q)
    s[q] = (prmt(w[4 * q], w[4 * q + 2], 0xFBD9) & 0x08080808u) | (prmt(w[4 * q + 1], w[4 * q + 3], 0xFBD9) & 0x80808080u);
  sg[0] = make_uint2(prmt(s[0], s[1], 0x5410), prmt(s[2], s[3], 0x5410));
  sg[1] = make_uint2(prmt(s[0], s[1], 0x7632), prmt(s[2], s[3], 0x7632));
}
/// Magnitude codes of a block (ROW: element e = half e & 1 of mw[e >> 1]; else half `hi` of mw[e]),
/// times m, saturated at 6 when SAT.
template <int S, bool ROW, bool SAT>
__device__ __forceinline__ uint2 nv_mag16(const uint32_t* mw, int hi, float m) {
  const auto y = [&](int e) {
    const float v = (ROW ? half_value<S>(mw[e >> 1], e & 1) : half_value<S>(mw[e], hi)) * m;
    return SAT ? fminf(v, 6.0f) : v;
  };
  uint32_t c[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) c[q] = numerics::detail::e2m1x4_small(y(4 * q), y(4 * q + 1), y(4 * q + 2), y(4 * q + 3));
  return make_uint2(c[0] | (c[1] << 16), c[2] | (c[3] << 16));
}
/// One block's 16 codes: magnitudes, signs sg, scale byte and multiplier m, block amax.
template <int S, bool ROW>
__device__ __forceinline__ uint2 nv_block16(const uint32_t* mw, int hi, uint2 sg, float amax, uint32_t byte, float m) {
  uint2 q;
  if (amax * m < 7.0f) {  // false for NaN
    q = nv_mag16<S, ROW, false>(mw, hi, m);
  } else {
    q = nv_mag16<S, ROW, true>(mw, hi, m);
    if (byte == 0x7F) return make_uint2(0x77777777u, 0x77777777u);  // encode_e2m1_satfinite of NaN
  }
  return make_uint2(q.x | sg.x, q.y | sg.y);
}
/// Magnitude-code maximum of 16-bit pairs w[0..n) (sign bits already cleared; __vmaxu2 of three is one VIMNMX3).
template <int N>
__device__ __forceinline__ uint32_t pair_max(const uint32_t* w) {
  uint32_t m = w[0];
#pragma unroll
  for (int j = 1; j + 1 < N; j += 2) m = __vmaxu2(m, __vmaxu2(w[j], w[j + 1]));
  if constexpr (N % 2 == 0) m = __vmaxu2(m, w[N - 1]);
  return m;
}

template <int S>
__device__ __forceinline__ void rc_nvfp4_tile(const TileArgs& a, uint32_t* tile, int64_t r0, int64_t c0) {
  __shared__ float mtab[128];  // nvfp4_multiplier of every byte
  __shared__ float senc_s;
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  if (threadIdx.x < 128) {
    const float2 gs = a.globals();
    mtab[threadIdx.x] = numerics::detail::nvfp4_multiplier(uint8_t(threadIdx.x), gs.y);
    if (threadIdx.x == 0) senc_s = gs.x;
  }
  __syncthreads();  // mtab, senc_s
  const float senc = senc_s;
  const uint32_t tile_s = smem_u32(tile);

  // 1. Rows rb + 32 i.
  {
    const int rb = 4 * warp + (lane >> 3), ch = lane & 7;
    const int64_t e0 = (r0 + rb) * a.cols + c0 + 16 * ch;  // the lane's first element
    const uint4* src = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.src) + e0);
    const int64_t lstep = 4 * a.cols;  // 32 rows, in 16-byte units
    const bool rw = a.rowwise;
    uint8_t* orow = rw ? out_at(a.out_r, e0, true) : nullptr;
    uint8_t* srow = static_cast<uint8_t*>(a.scales_r);
    int64_t sstep = 0;
    if (rw) {
      const ScaleLayout lr = a.template layout_as<2, 16>(a.lr);
      srow += lr.offset(r0 + rb, (c0 >> 4) + ch);
      sstep = lr.row32_step();
    }
    const int64_t ostep = 16 * a.cols;  // 32 rows of codes
    uint4 x0 = src[0], x1 = src[1];
#pragma unroll 1
    for (int i = 0; i < 4; ++i) {
      uint4 n0 = x0, n1 = x1;
      if (i < 3) {  // the next row's loads in flight while this one is encoded
        src += lstep;
        n0 = src[0];
        n1 = src[1];
      }
      const int r = rb + 32 * i;
      sts128(tile_s + nv_chunk_bytes(r, 2 * ch), x0);
      sts128(tile_s + nv_chunk_bytes(r, 2 * ch + 1), x1);
      if (rw) {  // block-uniform
        const uint32_t w[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        uint32_t mw[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) mw[j] = mag2(w[j]);
        const uint32_t m2 = pair_max<8>(mw);
        const float amax = decode16<S>(max(m2 & 0xFFFFu, m2 >> 16));
        const uint32_t byte = numerics::detail::nvfp4_scale_byte(amax, senc);
        *srow = uint8_t(byte);
        *reinterpret_cast<uint2*>(orow) = nv_block16<S, true>(mw, 0, nv_signs_row(w), amax, byte, mtab[byte]);
        srow += sstep;
        orow += ostep;
      }
      x0 = n0;
      x1 = n1;
    }
  }
  __syncthreads();

  // 2. Column pairs 4 warp + h + 32 t: both columns' 16-row blocks from 16 shared words.
  const ScaleLayout lc = a.template layout_as<2, 16>(a.lc);
  const int g = lane & 7, h = lane >> 3, pc = 4 * warp + h;
  uint8_t* const scol = static_cast<uint8_t*>(a.scales_c) + lc.offset(c0 + 2 * pc, (r0 >> 4) + g);
  const int64_t s1 = lc.row1_step(), st = 2 * lc.row32_step();  // next column; columns 64 further
  uint8_t* const ocol = out_at(a.out_c, (c0 + 2 * pc) * a.rows + r0 + 16 * g, true);
  const int64_t o1 = a.rows >> 1, ot = 32 * a.rows;
#pragma unroll 1
  for (int t = 0; t < 2; ++t) {
    // Pair pc + 32 t lies in chunk warp + 8 t; rows 16 g + j share the chunk swizzle.
    const uint32_t* const tcol = tile + (nv_chunk_bytes(16 * g, warp + 8 * t) >> 2) + h;
    uint32_t mw[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) mw[j] = tcol[j * kWn];
    uint2 sg[2];
    nv_signs_cols(mw, sg);
#pragma unroll
    for (int j = 0; j < 16; ++j) mw[j] = mag2(mw[j]);
    const uint32_t m2 = pair_max<16>(mw);
#pragma unroll
    for (int col = 0; col < 2; ++col) {
      const float amax = decode16<S>(col ? m2 >> 16 : m2 & 0xFFFFu);
      const uint32_t byte = numerics::detail::nvfp4_scale_byte(amax, senc);
      scol[t * st + col * s1] = uint8_t(byte);
      *reinterpret_cast<uint2*>(ocol + t * ot + col * o1) = nv_block16<S, false>(mw, col, sg[col], amax, byte, mtab[byte]);
    }
  }
}

/// Grouped tokens: padded row r0 (a multiple of 128) lies in group g when P_g <= r0 < P_g + ceil(M_g,
/// 128), P_g the sum of the padded sizes before it; its source rows are then S_g + (r0 - P_g) onwards
/// (S_g: the sum of the sizes before g), at most 128 and at most M_g - (r0 - P_g) of them, and never
/// past the source's rows. Rows in no group (the slack up to a.rows) have none: rs0 = rlim = 0. Warp 0
/// scans the sizes 32 at a time (negative sizes count as 0); the block reads the result after a
/// barrier.
__device__ __forceinline__ void group_rows(const TileArgs& a, int64_t r0, int64_t& rs0, int64_t& rlim) {
  __shared__ int64_t found[2];
  if (threadIdx.x < 32) {
    const int lane = int(threadIdx.x);
    int64_t p_base = 0, s_base = 0, first = 0, count = 0;
    for (int64_t g0 = 0; g0 < a.groups; g0 += 32) {
      const int64_t g = g0 + lane;
      const int64_t m = g < a.groups ? max(a.group_sizes[g], int64_t(0)) : 0;
      const int64_t p = (m + kTile - 1) / kTile * kTile;
      int64_t ip = p, im = m;  // inclusive sums over the lanes
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const int64_t xp = __shfl_up_sync(0xFFFFFFFFu, ip, off), xm = __shfl_up_sync(0xFFFFFFFFu, im, off);
        if (lane >= off) {
          ip += xp;
          im += xm;
        }
      }
      const int64_t pstart = p_base + ip - p;
      const unsigned hit = __ballot_sync(0xFFFFFFFFu, r0 >= pstart && r0 < pstart + p);
      if (hit) {  // warp-uniform
        const int src = __ffs(int(hit)) - 1;
        first = __shfl_sync(0xFFFFFFFFu, s_base + im - m + (r0 - pstart), src);
        count = __shfl_sync(0xFFFFFFFFu, m - (r0 - pstart), src);
        break;
      }
      p_base += __shfl_sync(0xFFFFFFFFu, ip, 31);
      s_base += __shfl_sync(0xFFFFFFFFu, im, 31);
    }
    if (lane == 0) {
      count = max(int64_t(0), min(min(count, int64_t(kTile)), a.src_rows - first));
      found[0] = count ? first : 0;
      found[1] = count;
    }
  }
  __syncthreads();
  rs0 = found[0];
  rlim = found[0] + found[1];
}

template <int S, int E, int BK>
__global__ void __launch_bounds__(kQThreads, E == 2 ? 5 : 4) rc1d_kernel(TileArgs a) {
  a.publish_global();
  __shared__ __align__(16) uint32_t tile[kTile * (E == 2 ? kWn : kW)];
  __shared__ uint32_t cmax[8][kPairs * 8];      // per warp: (pair, block) packed column-pair maxima
  __shared__ float cmult[8][kPairs * 2 * 8];    // per warp: (pair, column, block) multipliers
  int64_t r0, c0;
  a.tile_origin(r0, c0);
  const bool whole = a.whole_tile(r0, c0);
  if constexpr (E == 2) {
    // NVFP4: whole tiles with 16-element aligned rows and columns take rc_nvfp4_tile.
    const uintptr_t out_bits = reinterpret_cast<uintptr_t>(a.rowwise ? a.out_r : nullptr) |
                               reinterpret_cast<uintptr_t>(a.out_c);
    if (whole && (a.rows & 15) == 0 && (a.cols & 15) == 0 &&
        (reinterpret_cast<uintptr_t>(a.src) & 15) == 0 && (out_bits & 7) == 0) {  // block-uniform
      rc_nvfp4_tile<S>(a, tile, r0, c0);
      return;
    }
    rc1d_tile<S, E, BK, false>(a, tile, cmax, cmult, r0, c0, r0, a.rows);
  } else {
    int64_t rs0 = r0, rlim = a.rows;
    bool full = whole;
    if (a.group_sizes) {
      group_rows(a, r0, rs0, rlim);
      full = whole && rlim - rs0 == kTile;
    }
    if (a.gather) rc1d_tile<S, E, BK, false, 0, true>(a, tile, cmax, cmult, r0, c0, rs0, rlim);  // block-uniform
    else if (full) rc1d_tile<S, E, BK, true>(a, tile, cmax, cmult, r0, c0, rs0, rlim);
    else rc1d_tile<S, E, BK, false>(a, tile, cmax, cmult, r0, c0, rs0, rlim);
  }
}

/// quantize_activation(_grad): rc1d_kernel's tiles with the activation applied as the source is read.
template <int S, int E, int BK, int ACT>
__global__ void __launch_bounds__(kQThreads, 3) rc1d_act_kernel(TileArgs a) {
  static_assert(E != 2 && ACT != 0, "rc1d_act_kernel: FP8 outputs and an activation");
  __shared__ __align__(16) uint32_t tile[kTile * kW];
  __shared__ uint32_t cmax[8][kPairs * 8];
  __shared__ float cmult[8][kPairs * 2 * 8];
  int64_t r0, c0;
  a.tile_origin(r0, c0);
  if (a.whole_tile(r0, c0)) rc1d_tile<S, E, BK, true, ACT>(a, tile, cmax, cmult, r0, c0, r0, a.rows);  // block-uniform
  else rc1d_tile<S, E, BK, false, ACT>(a, tile, cmax, cmult, r0, c0, r0, a.rows);
}

/// Grouped tokens through an activation (quantize_grouped_swiglu(_grad)): rc1d_kernel's grouped tiles
/// (group_rows) with ACT applied as the source is read. ACT2 != 0: the tiles at columns >= a.split
/// apply ACT2 to src and aux read split columns to the left (one (M, 2I) output holding the gradients
/// of both halves of [gate | up]; split = I, a multiple of 128, so no tile straddles the two).
template <int S, int E, int BK, int ACT, int ACT2>
__global__ void __launch_bounds__(kQThreads, 3) rc1d_grouped_act_kernel(TileArgs a) {
  static_assert(E != 2 && ACT != 0, "rc1d_grouped_act_kernel: FP8 outputs and an activation");
  __shared__ __align__(16) uint32_t tile[kTile * kW];
  __shared__ uint32_t cmax[8][kPairs * 8];
  __shared__ float cmult[8][kPairs * 2 * 8];
  int64_t r0, c0, rs0, rlim;
  a.tile_origin(r0, c0);
  group_rows(a, r0, rs0, rlim);
  const bool full = a.whole_tile(r0, c0) && rlim - rs0 == kTile;
  if (ACT2 != 0 && c0 >= a.split) {  // block-uniform
    TileArgs b = a;
    b.src = static_cast<const uint16_t*>(a.src) - a.split;
    b.aux = static_cast<const uint16_t*>(a.aux) - a.split;
    if (full) rc1d_tile<S, E, BK, true, ACT2 != 0 ? ACT2 : ACT>(b, tile, cmax, cmult, r0, c0, rs0, rlim);
    else rc1d_tile<S, E, BK, false, ACT2 != 0 ? ACT2 : ACT>(b, tile, cmax, cmult, r0, c0, rs0, rlim);
    return;
  }
  if (full) rc1d_tile<S, E, BK, true, ACT>(a, tile, cmax, cmult, r0, c0, rs0, rlim);
  else rc1d_tile<S, E, BK, false, ACT>(a, tile, cmax, cmult, r0, c0, rs0, rlim);
}

// ---- 2D blocks in both directions through a 16-bit tile (bf16 / f16 sources, FP8) -----------------
// block128x128 and mxfp8-32x32: the same 33 KB tile as rc1d_kernel. Every 2D block spans rows of all
// eight warps, so the tile is read first (raw codes to shared memory, each lane keeping the packed
// maximum of its 4 columns per 32-row band), the block amaxes are reduced across warps, one thread
// per block computes its scale (compute_scale) and all threads write the scales at offset(); then
// rows are encoded from shared memory (two words per lane and row) and columns as in rc1d_kernel.
template <int S, int E, int BK>
__global__ void __launch_bounds__(kQThreads, 4) rc2d_kernel(TileArgs a) {
  __shared__ uint32_t tile[kTile * kW];
  __shared__ uint32_t part[8][4][4];  // per warp: (row band, column block) max codes
  __shared__ float bf[4][4], bm[4][4];  // (row block, column block): stored fp32 scale, multiplier
  __shared__ __align__(16) uint8_t bu[4][4];    // stored byte scale (MX); bk = 128 uses [0][0]
  __shared__ __align__(16) uint8_t bu_t[4][4];  // its transpose (the columnwise 128x4 tile)
  constexpr bool fp4 = E == 2;
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  int64_t r0, c0;
  a.tile_origin(r0, c0);
  // Block side BK, a template argument: 32 (mxfp8-32x32) or 128 (block128x128).
  static_assert(BK == 32 || BK == 128, "rc2d_kernel: 2D blocks are 32x32 or 128x128");
  constexpr int bk = BK, nb = BK == 32 ? 4 : 1;
  const bool whole = a.whole_tile(r0, c0);

  // 1. Tile rows warp + 8i (i < 16) to shared memory; band i >> 2 covers tile rows 32 * band ...
  uint32_t m[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint2 raw[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int64_t r = r0 + warp + 8 * (8 * h + k), c = c0 + 4 * lane;
      raw[k] = whole ? load_raw4_whole<S>(a.src, r * a.cols + c) : load_raw4<S>(a.src, a.rows, a.cols, a.vec_in, r, c);
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      uint32_t* t = tile + (warp + 8 * (8 * h + k)) * kW + 2 * lane;
      t[0] = raw[k].x;
      t[1] = raw[k].y;
      const int band = (8 * h + k) >> 2;
      m[band] = __vmaxu2(m[band], __vmaxu2(mag2(raw[k].x), mag2(raw[k].y)));
    }
  }
#pragma unroll
  for (int band = 0; band < 4; ++band) m[band] = max(m[band] & 0xFFFFu, m[band] >> 16);
  if (bk == 32) {  // column block = lane / 8
#pragma unroll
    for (int band = 0; band < 4; ++band) {
      const uint32_t x = umax_group(m[band], 8);
      if ((lane & 7) == 0) part[warp][band][lane >> 3] = x;
    }
  } else {
    const uint32_t x = umax_group(max(max(m[0], m[1]), max(m[2], m[3])), 32);
    if (lane == 0) part[warp][0][0] = x;
  }
  __syncthreads();
  if (int(threadIdx.x) < nb * nb) {
    const int rb = int(threadIdx.x) / nb, cb = int(threadIdx.x) % nb;
    uint32_t x = 0;
#pragma unroll
    for (int w = 0; w < 8; ++w) x = max(x, part[w][rb][cb]);
    const BlockScale sc = a.template scale_as<E>(decode16<S>(x));
    bf[rb][cb] = sc.stored_f32;
    bu[rb][cb] = bu_t[cb][rb] = sc.stored_u8;
    bm[rb][cb] = sc.multiplier;
  }
  __syncthreads();
  // Scales: block (rb, cb) goes to the rows of its block in the rowwise grid (K-block c0/bk + cb) and
  // to its columns in the columnwise grid (K-block r0/bk + rb). A layout keeps one scale per
  // row_step() data rows, so only those are written: one per block, except mxfp8-32x32 in cuBLASLt
  // format, which replicates the scale to all 32 rows.
  constexpr int lg_bk = BK == 32 ? 5 : 7, lg_nb = 7 - lg_bk;
#pragma unroll
  for (int dir = 0; dir < 2; ++dir) {
    if (!(dir ? a.columnwise : a.rowwise)) continue;
    const ScaleLayout L = a.template layout_2d<BK>(dir ? a.lc : a.lr);
    void* scales = dir ? a.scales_c : a.scales_r;
    const bool rep = BK == 32 && L.format == ScaleFormat::kCublasLt;  // row_step() == 1
    if (rep && whole && (reinterpret_cast<uintptr_t>(scales) & 15) == 0) {
      // The tile's scales fill one 128x4 tile of the buffer: for p0 % 128 == 0 and s0 % 4 == 0,
      // offset(p0 + t + 32j, s0 + i) == offset(p0 + t, s0) + 4j + i (t < 32; tiled_offset), and
      // here p0 = r0 (rowwise: j = row block, i = column block) or c0 (columnwise: j = column block,
      // i = row block). So warp dir stores 32 copies of 16 bytes, one per lane.
      if (warp == dir) {
        const int64_t o = L.offset((dir ? c0 : r0) + lane, (dir ? r0 : c0) >> lg_bk);
        *reinterpret_cast<uint4*>(static_cast<uint8_t*>(scales) + o) =
            *reinterpret_cast<const uint4*>(dir ? &bu_t[0][0] : &bu[0][0]);
      }
      continue;
    }
    const int lg_per = rep ? 5 : 0;  // stored rows per block: 32 or 1
    for (int it = int(threadIdx.x); it < (nb * nb) << lg_per; it += kQThreads) {
      const int blk = it >> lg_per, j = (it - (blk << lg_per)) << (lg_bk - lg_per);
      const int rb = blk >> lg_nb, cb = blk & (nb - 1);
      const int64_t gr = (r0 >> lg_bk) + rb, gk = (c0 >> lg_bk) + cb;  // the block in the scale grids
      const int64_t row = (dir ? gk : gr) * bk + j, kb = dir ? gr : gk;
      if (row >= (dir ? a.cols : a.rows) || kb * bk >= (dir ? a.rows : a.cols)) continue;
      BlockScale sc;
      sc.stored_f32 = bf[rb][cb];
      sc.stored_u8 = bu[rb][cb];
      sc.multiplier = bm[rb][cb];
      numerics::detail::store_scale(L, scales, row, kb, sc);
    }
  }

  // 2. Rows from shared memory.
  if (a.rowwise) {
    const float mr = bm[0][0];  // bk = 128: the one block
    uint8_t* const orow = whole ? out_at(a.out_r, (r0 + warp) * a.cols + c0 + 4 * lane, fp4) : nullptr;
    const int64_t row8_bytes = fp4 ? 4 * a.cols : 8 * a.cols;
#pragma unroll 4
    for (int i = 0; i < 16; ++i) {
      const int lr = warp + 8 * i;
      const int64_t r = r0 + lr;
      if (!whole && r >= a.rows) continue;  // warp-uniform
      const uint32_t* t = tile + lr * kW + 2 * lane;
      const uint2 raw = make_uint2(t[0], t[1]);
      float v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = raw_elem<S>(raw, j);
      const float mult = bk == 32 ? bm[lr >> 5][lane >> 3] : mr;
      const int64_t c = c0 + 4 * lane;
      const uint32_t code = encode4<E>(v, 0, mult);
      if (whole) store_packed(orow + i * row8_bytes, code, fp4);
      else store4(a.out_r, r * a.cols + c, a.cols - c, code, fp4, a.vec_out_r);
    }
  }

  // 3. Columns: pairs cw = warp + 8q; lane l holds rows 4l..4l+3 (rotated), in row block 4l / bk.
  if (a.columnwise) {
    const int rb = (4 * lane) / bk;
    encode_tile_columns<S, E>(a, tile, warp, lane, r0, c0, whole,
                              [&](int q, int col) { return bm[rb][(2 * (warp + 8 * q) + col) / bk]; });
  }
}


FastPlan plan_fast(const SourceMatrix& src, const QuantizeConfig& cfg) {
  FastPlan p;
  const int64_t R = src.rows, C = src.cols;
  if (cfg.recipe == Recipe::kTensorwise || cfg.recipe == Recipe::kNvfp4) p.n_part = kAmaxBlocks;
  if (cfg.recipe == Recipe::kTensorwise) p.n_pm_r = p.n_pm_c = 1;
  if (cfg.recipe == Recipe::kRowwise) {
    p.n_pm_r = cfg.rowwise ? R : 0;
    if (cfg.columnwise) {
      p.n_pm_c = C;
      p.chunks = layouts::ceil_div(R, kColChunk);
      p.n_colpart = p.chunks * C;
    }
  }
  return p;
}

template <int S, int E>
void launch_all(TileArgs a, const FastPlan& p, float* scratch, const float* src_amax, float* global_out, int64_t tiles,
                cudaStream_t st) {
  float* part = scratch;
  float* g = part + p.n_part;
  float* pm_r = g + 4;
  float* pm_c = pm_r + p.n_pm_r;
  float* colpart = pm_c + p.n_pm_c;
  const int64_t n = a.rows * a.cols;
  const Recipe recipe = a.lr.recipe;
  if (recipe == Recipe::kTensorwise || recipe == Recipe::kNvfp4) {
    float* gout = recipe == Recipe::kNvfp4 ? global_out : nullptr;
    float* pm = recipe == Recipe::kTensorwise ? pm_r : nullptr;  // tensorwise: the scale too
    if (src_amax && recipe == Recipe::kNvfp4) {  // given: no amax pass, the source is read once, and
      a.amax_in = src_amax;                         // no launch: the kernels derive the global scalars
      a.global_out = gout;
    } else if (src_amax) {
      finish_global_kernel<<<1, 32, 0, st>>>(src_amax, 1, g, gout, a, pm);
    } else {
      const int blocks = int(std::min<int64_t>(kAmaxBlocks, std::max<int64_t>(1, layouts::ceil_div(n, 256 * 16))));
      global_amax_kernel<S><<<blocks, 256, 0, st>>>(a.src, n, a.vec_in, part);
      finish_global_kernel<<<1, 1024, 0, st>>>(part, blocks, g, gout, a, pm);
    }
    a.g = g;
  }
  if (recipe == Recipe::kTensorwise) {
    a.pm_r = pm_r;
    a.pm_c = pm_r;  // one multiplier for both directions
    a.pm_step = 0;
  }
  if (recipe == Recipe::kRowwise && !a.columnwise && a.cols <= kFusedCols) {
    SCALEMM_EXPECTS(a.rows <= int64_t(0x7FFFFFFF), StatusCode::kUnsupported, "quantize::quantize: matrix too large");
    row_fused_kernel<S, E><<<unsigned(a.rows), 256, 0, st>>>(a);
    cuda_check(cudaGetLastError(), "quantizer kernel launch");
    return;
  }
  if (recipe == Recipe::kRowwise) {
    if (a.rowwise) row_amax_kernel<S><<<unsigned(layouts::ceil_div(a.rows, 8)), 256, 0, st>>>(a, pm_r);
    if (a.columnwise) {
      const dim3 grid(unsigned(layouts::ceil_div(a.cols, 256)), unsigned(p.chunks));
      col_amax_partial_kernel<S><<<grid, 256, 0, st>>>(a, colpart);
      col_amax_finish_kernel<<<unsigned(layouts::ceil_div(a.cols, 256)), 256, 0, st>>>(a, colpart, p.chunks, pm_c);
    }
    a.pm_r = pm_r;
    a.pm_c = pm_c;
    a.pm_step = 1;
  }
  if (!a.columnwise && a.kind != kBlocks2D) {
    // One block per lane in row_direct_kernel's scale step (FP8 1D blocks are 32 or 128 wide).
    SCALEMM_EXPECTS(a.kind != kBlocks1D || kRowUnits<E> / kRowRounds<E> * (kTile / a.bk) <= 32, StatusCode::kInternal,
                    "quantize::quantize: block width " + std::to_string(a.bk) + " too small for the row kernel");
    const int64_t segs = layouts::ceil_div(a.cols, kTile), groups = layouts::ceil_div(segs, kRowUnits<E>);
    // 1D blocks: one wave, as many blocks as fit on the GPU at once, each warp looping over items.
    const int64_t items_blocks = std::min<int64_t>(layouts::ceil_div(a.rows * groups, 8), 0x7FFFFFFF);
    if constexpr (E == 2 && S != 0) {  // NVFP4 from 16-bit sources: 8 elements per lane
      static PerDevice<int> occupancy;
      const int nv_per_sm = blocks_per_sm(occupancy, row_nvfp4_kernel<S>);
      const int64_t blocks = std::min<int64_t>(items_blocks, int64_t(nv_per_sm) * sm_count());
      row_nvfp4_kernel<S><<<unsigned(std::max<int64_t>(blocks, 1)), 256, 0, st>>>(a, groups);
    } else {
      static PerDevice<int> occupancy;
      const int per_sm = blocks_per_sm(occupancy, row_direct_kernel<S, E>);
      // The precomputed kind (tensorwise, long rowwise rows) has no per-item scale step to amortise
      // and measured faster with a warp per item (H100: 90-91% of copy against 85-87%).
      // (Any grid size is correct: warps step through the items by the grid's warp count.)
      const int64_t blocks =
          a.kind == kPrecomputed ? items_blocks : std::min<int64_t>(items_blocks, int64_t(per_sm) * sm_count());
      row_direct_kernel<S, E><<<unsigned(std::max<int64_t>(blocks, 1)), 256, 0, st>>>(a, groups);
    }
    cuda_check(cudaGetLastError(), "quantizer kernel launch");
    return;
  }
  if constexpr (S != 0) {  // bf16 / f16: 2D blocks from registers, 1D blocks with a 16-bit tile
    if (E != 2 && a.kind == kBlocks2D) {  // E2M1 is NVFP4: 1D blocks only
      SCALEMM_EXPECTS(a.bk == 32 || a.bk == 128, StatusCode::kInternal,
                      "quantize::quantize: no 2D-block kernel for block side " + std::to_string(a.bk));
      if constexpr (E != 2) {
        if (a.bk == 32) rc2d_kernel<S, E, 32><<<unsigned(tiles), kQThreads, 0, st>>>(a);
        else rc2d_kernel<S, E, 128><<<unsigned(tiles), kQThreads, 0, st>>>(a);
      }
      cuda_check(cudaGetLastError(), "quantizer kernel launch");
      return;
    }
    if (a.kind == kBlocks1D) {
      SCALEMM_EXPECTS(E == 2 ? a.bk == 16 : (a.bk == 32 || a.bk == 128), StatusCode::kInternal,
                      "quantize::quantize: no 1D-block kernel for block width " + std::to_string(a.bk));
      if constexpr (E == 2) rc1d_kernel<S, E, 16><<<unsigned(tiles), kQThreads, 0, st>>>(a);
      else if (a.bk == 32) rc1d_kernel<S, E, 32><<<unsigned(tiles), kQThreads, 0, st>>>(a);
      else rc1d_kernel<S, E, 128><<<unsigned(tiles), kQThreads, 0, st>>>(a);
      cuda_check(cudaGetLastError(), "quantizer kernel launch");
      return;
    }
  }
  // A function attribute is per device: set once on each device the kernel runs on.
  static PerDevice<bool> smem_set;
  smem_set.get(scalemm::detail::current_device(), [](int) {
    cuda_check(cudaFuncSetAttribute(quant_tile_kernel<S, E>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(kTileSmem)),
               "cudaFuncSetAttribute(quant_tile_kernel)");
    return true;
  });
  quant_tile_kernel<S, E><<<unsigned(tiles), kQThreads, kTileSmem, st>>>(a);
  cuda_check(cudaGetLastError(), "quantizer kernel launch");
}

template <int S>
void launch_elem(int e, const TileArgs& a, const FastPlan& p, float* scratch, const float* src_amax, float* global_out,
                 int64_t tiles, cudaStream_t st) {
  if (e == 2) launch_all<S, 2>(a, p, scratch, src_amax, global_out, tiles, st);
  else if (e == 1) launch_all<S, 1>(a, p, scratch, src_amax, global_out, tiles, st);
  else launch_all<S, 0>(a, p, scratch, src_amax, global_out, tiles, st);
}

/// The kernels' arguments for a (src.rows, src.cols) source whose columnwise output has R rows (R =
/// src.rows but for grouped tokens).
TileArgs tile_args(const SourceMatrix& src, const QuantizeConfig& cfg, const QuantizeOutputs& out, int64_t R) {
  const int64_t C = src.cols;
  TileArgs a{};
  a.src = src.data;
  a.rows = R;
  a.cols = C;
  a.tiles_c = layouts::ceil_div(C, kTile);
  a.rowwise = cfg.rowwise;
  a.columnwise = cfg.columnwise;
  a.lr = rowwise_layout(cfg, src.rows, C);
  a.lc = columnwise_layout(cfg, R, C);
  a.scales_r = out.scales;
  a.scales_c = out.scales_t;
  a.mode = int(resolve_scale_mode(cfg.recipe, cfg.mode));
  a.elem = element_dtype(cfg);
  a.eps = cfg.eps;
  a.out_r = static_cast<uint8_t*>(out.data);
  a.out_c = static_cast<uint8_t*>(out.data_t);
  a.ld_src = a.ld_aux = C;
  switch (cfg.recipe) {
    case Recipe::kTensorwise:
    case Recipe::kRowwise: a.kind = kPrecomputed; a.bk = kTile; break;
    case Recipe::kBlock128x128:
    case Recipe::kMxfp8_32x32: a.kind = kBlocks2D; a.bk = int(a.lr.block_k()); break;
    default: a.kind = kBlocks1D; a.bk = int(a.lr.block_k()); break;
  }
  const int esize = src.dtype == DType::kF32 ? 4 : 2;
  a.vec_in = C % 4 == 0 && reinterpret_cast<uintptr_t>(src.data) % size_t(4 * esize) == 0;
  a.vec_out_r = C % 4 == 0 && reinterpret_cast<uintptr_t>(out.data) % 4 == 0;
  a.vec_out_c = R % 4 == 0 && reinterpret_cast<uintptr_t>(out.data_t) % 4 == 0;
  return a;
}

template <int S, int E>
void launch_grouped(const TileArgs& a, int64_t tiles, cudaStream_t st) {
  if (a.bk == 32) rc1d_kernel<S, E, 32><<<unsigned(tiles), kQThreads, 0, st>>>(a);
  else rc1d_kernel<S, E, 128><<<unsigned(tiles), kQThreads, 0, st>>>(a);
  cuda_check(cudaGetLastError(), "quantizer kernel launch");
}

void quantize_grouped(const SourceMatrix& src, const QuantizeConfig& cfg, const int64_t* group_sizes, int64_t groups,
                      int64_t padded_rows, const GatherRows& gather, const QuantizeOutputs& out, cudaStream_t st) {
  const int64_t tiles = padded_rows / kTile * layouts::ceil_div(src.cols, kTile);
  SCALEMM_EXPECTS(tiles <= int64_t(0x7FFFFFFF), StatusCode::kUnsupported, "quantize::quantize_grouped: matrix too large");
  if (tiles == 0) return;
  TileArgs a = tile_args(src, cfg, out, padded_rows);
  a.group_sizes = group_sizes;
  a.groups = groups;
  a.src_rows = src.rows;
  a.gather = gather.index;
  a.gather_rows = gather.source_rows;
  a.row_weight = gather.row_weight;
  const bool e5m2 = a.elem == DType::kE5M2;
  if (src.dtype == DType::kBF16) e5m2 ? launch_grouped<1, 1>(a, tiles, st) : launch_grouped<1, 0>(a, tiles, st);
  else e5m2 ? launch_grouped<2, 1>(a, tiles, st) : launch_grouped<2, 0>(a, tiles, st);
}

template <int S, int ACT>
__global__ void __launch_bounds__(256) activation_kernel(const uint16_t* src, const uint16_t* aux,
                                                         const uint16_t* aux2, int64_t n, uint16_t* out) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = uint16_t(activate1<S, ACT>(decode16<S>(src[i]), act_needs_aux(ACT) ? decode16<S>(aux[i]) : 0.0f,
                                        act_needs_aux2(ACT) ? decode16<S>(aux2[i]) : 0.0f));
}

template <int S, int ACT>
void launch_reference(const void* src, const void* aux, const void* aux2, int64_t n, void* out, cudaStream_t st) {
  const unsigned blocks = unsigned(std::min<int64_t>((n + 255) / 256, int64_t(sm_count()) * 8));
  activation_kernel<S, ACT><<<blocks, 256, 0, st>>>(static_cast<const uint16_t*>(src), static_cast<const uint16_t*>(aux),
                                                    static_cast<const uint16_t*>(aux2), n, static_cast<uint16_t*>(out));
}

template <int S>
void launch_reference(int act, const void* src, const void* aux, const void* aux2, int64_t n, void* out, cudaStream_t st) {
  switch (act) {
    case kGelu: launch_reference<S, kGelu>(src, aux, aux2, n, out, st); break;
    case kGeluGrad: launch_reference<S, kGeluGrad>(src, aux, aux2, n, out, st); break;
    case kSwiglu: launch_reference<S, kSwiglu>(src, aux, aux2, n, out, st); break;
    case kSwigluGate: launch_reference<S, kSwigluGate>(src, aux, aux2, n, out, st); break;
    default: launch_reference<S, kSwigluUp>(src, aux, aux2, n, out, st); break;
  }
}

void apply_activation(int act, const void* src, const void* aux, const void* aux2, int64_t n, DType dtype, void* out,
                      cudaStream_t st) {
  if (n <= 0) return;
  if (dtype == DType::kBF16) launch_reference<1>(act, src, aux, aux2, n, out, st);
  else launch_reference<2>(act, src, aux, aux2, n, out, st);
  cuda_check(cudaGetLastError(), "activation kernel launch");
}

template <int S, int E, int ACT>
void launch_activation(const TileArgs& a, int64_t tiles, cudaStream_t st) {
  if (a.bk == 32) rc1d_act_kernel<S, E, 32, ACT><<<unsigned(tiles), kQThreads, 0, st>>>(a);
  else rc1d_act_kernel<S, E, 128, ACT><<<unsigned(tiles), kQThreads, 0, st>>>(a);
  cuda_check(cudaGetLastError(), "quantizer kernel launch");
}

template <int ACT>
void launch_activation(const TileArgs& a, DType src_dtype, int64_t tiles, cudaStream_t st) {
  const bool e5m2 = a.elem == DType::kE5M2;
  if (src_dtype == DType::kBF16) e5m2 ? launch_activation<1, 1, ACT>(a, tiles, st) : launch_activation<1, 0, ACT>(a, tiles, st);
  else e5m2 ? launch_activation<2, 1, ACT>(a, tiles, st) : launch_activation<2, 0, ACT>(a, tiles, st);
}

void quantize_activation(int act, const SourceMatrix& src, const void* aux, const void* aux2, const QuantizeConfig& cfg,
                         const QuantizeOutputs& out, cudaStream_t st) {
  const int64_t tiles = layouts::ceil_div(src.rows, kTile) * layouts::ceil_div(src.cols, kTile);
  SCALEMM_EXPECTS(tiles <= int64_t(0x7FFFFFFF), StatusCode::kUnsupported, "quantize::quantize_activation: matrix too large");
  if (tiles == 0) return;
  TileArgs a = tile_args(src, cfg, out, src.rows);
  a.aux = aux;
  a.aux2 = aux2;
  // The vector path needs every source aligned.
  for (const void* p : {aux, aux2}) a.vec_in = a.vec_in && reinterpret_cast<uintptr_t>(p) % 8 == 0;
  switch (act) {
    case kGelu: launch_activation<kGelu>(a, src.dtype, tiles, st); break;
    case kGeluGrad: launch_activation<kGeluGrad>(a, src.dtype, tiles, st); break;
    case kSwiglu: launch_activation<kSwiglu>(a, src.dtype, tiles, st); break;
    case kSwigluGate: launch_activation<kSwigluGate>(a, src.dtype, tiles, st); break;
    default: launch_activation<kSwigluUp>(a, src.dtype, tiles, st); break;
  }
}

/// The fast path; false when it does not apply (empty shapes), then the generic functors run.
bool quantize(const SourceMatrix& src, const QuantizeConfig& cfg, const QuantizeOutputs& out, float* scratch,
              cudaStream_t st) {
  const int64_t R = src.rows, C = src.cols;
  if (R <= 0 || C <= 0) return false;
  const int64_t tiles = layouts::ceil_div(R, kTile) * layouts::ceil_div(C, kTile);
  if (tiles > int64_t(0x7FFFFFFF)) return false;
  const TileArgs a = tile_args(src, cfg, out, R);
  const FastPlan p = plan_fast(src, cfg);
  const int e = a.elem == DType::kE2M1 ? 2 : a.elem == DType::kE5M2 ? 1 : 0;
  switch (src.dtype) {
    case DType::kBF16: launch_elem<1>(e, a, p, scratch, src.amax, out.global_scale, tiles, st); break;
    case DType::kF16: launch_elem<2>(e, a, p, scratch, src.amax, out.global_scale, tiles, st); break;
    default: launch_elem<0>(e, a, p, scratch, src.amax, out.global_scale, tiles, st); break;
  }
  return true;
}


template <int S, int E, int ACT, int ACT2>
void launch_grouped_act(const TileArgs& a, int64_t tiles, cudaStream_t st) {
  if (a.bk == 32) rc1d_grouped_act_kernel<S, E, 32, ACT, ACT2><<<unsigned(tiles), kQThreads, 0, st>>>(a);
  else rc1d_grouped_act_kernel<S, E, 128, ACT, ACT2><<<unsigned(tiles), kQThreads, 0, st>>>(a);
  cuda_check(cudaGetLastError(), "quantizer kernel launch");
}

template <int ACT, int ACT2>
void launch_grouped_act(const TileArgs& a, DType src_dtype, int64_t tiles, cudaStream_t st) {
  const bool e5m2 = a.elem == DType::kE5M2;
  if (src_dtype == DType::kBF16) e5m2 ? launch_grouped_act<1, 1, ACT, ACT2>(a, tiles, st) : launch_grouped_act<1, 0, ACT, ACT2>(a, tiles, st);
  else e5m2 ? launch_grouped_act<2, 1, ACT, ACT2>(a, tiles, st) : launch_grouped_act<2, 0, ACT, ACT2>(a, tiles, st);
}

void quantize_grouped_swiglu(bool grad, const SourceMatrix& src, int64_t ld_src, const void* gate_up, int64_t inter,
                             const QuantizeConfig& cfg, const int64_t* group_sizes, int64_t groups, int64_t padded_rows,
                             const QuantizeOutputs& out, cudaStream_t st) {
  const int64_t tiles = padded_rows / kTile * layouts::ceil_div(src.cols, kTile);
  SCALEMM_EXPECTS(tiles <= int64_t(0x7FFFFFFF), StatusCode::kUnsupported, "quantize::quantize_grouped_swiglu: matrix too large");
  if (tiles == 0) return;
  TileArgs a = tile_args(src, cfg, out, padded_rows);
  a.group_sizes = group_sizes;
  a.groups = groups;
  a.src_rows = src.rows;
  a.ld_src = ld_src;
  a.ld_aux = 2 * inter;
  const auto* gu = static_cast<const uint16_t*>(gate_up);
  a.aux = grad ? gu : gu + inter;  // forward: src is the gate half, aux the up half
  a.aux2 = gu + inter;
  a.split = grad ? inter : 0;
  for (const void* p : {a.src, a.aux, a.aux2}) a.vec_in = a.vec_in && reinterpret_cast<uintptr_t>(p) % 8 == 0;
  a.vec_in = a.vec_in && ld_src % 4 == 0 && inter % 4 == 0;
  if (grad) launch_grouped_act<kSwigluGate, kSwigluUp>(a, src.dtype, tiles, st);
  else launch_grouped_act<kSwiglu, 0>(a, src.dtype, tiles, st);
}

}  // namespace scalemm::quantize::kernels
