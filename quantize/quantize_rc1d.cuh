// 1D blocks (block1x128, mxfp8, nvfp4) in both directions from one read of a bf16 / f16 source,
// and its variants with an activation fused in and for grouped tokens.
// Included by fast_quantizers.cu only (one translation unit: the kernels compile once).
#pragma once

#include "quantize_activations.cuh"
#include "quantize_common.cuh"
#include "quantize_tiles.cuh"

namespace scalemm::quantize::kernels {

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

}  // namespace scalemm::quantize::kernels
