// The fp32 tile kernel (quant_tile_kernel: one CTA per 128 x 128 tile, both directions through a
// shared fp32 tile) and the rowwise-only row kernels (row_direct_kernel, row_nvfp4_kernel: a warp per
// item, no shared memory).
// Included by fast_quantizers.cu only (one translation unit: the kernels compile once).
#pragma once

#include "quantize_common.cuh"

namespace scalemm::quantize::kernels {

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

}  // namespace scalemm::quantize::kernels
