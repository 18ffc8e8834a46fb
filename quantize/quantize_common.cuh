// What the fast quantizer kernels share: their schedule in outline, the tile constants, the kernel
// arguments (TileArgs), 16-bit and fp32 source loads, lane-group maxima, packed stores and the
// 4-element encoder. Every kernel family's header includes this one.
// Included by fast_quantizers.cu only (one translation unit: the kernels compile once).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "detail/driver.hpp"
#include "detail/fast_codecs.cuh"
#include "fast_quantizers.hpp"
#include "scalemm/status.hpp"

namespace scalemm::quantize::kernels {

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

}  // namespace scalemm::quantize::kernels
