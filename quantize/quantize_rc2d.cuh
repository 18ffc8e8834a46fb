// 2D blocks (block128x128, mxfp8-32x32) in both directions through a 16-bit tile (bf16 / f16, FP8).
// Included by fast_quantizers.cu only (one translation unit: the kernels compile once).
#pragma once

#include "quantize_common.cuh"
#include "quantize_rc1d.cuh"

namespace scalemm::quantize::kernels {

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

}  // namespace scalemm::quantize::kernels
