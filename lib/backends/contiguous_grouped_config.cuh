// The contiguous grouped kernel's tile configurations (Config: tile width, cluster, which operand a
// pair shares), the shared-memory layout each implies and the kernel's parameters. Which
// configuration a call runs is chosen on the host (contiguous_grouped.cpp: wide_tiles(),
// narrow_tiles(), half_tiles(), ...); this file fixes what each one is.
// Included by contiguous_grouped_kernel.cuh and contiguous_grouped_sm90a.cu only (sm_90a, CuTe).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "cute/arch/copy_sm90_desc.hpp"
#include "cute/atom/mma_traits_sm90_gmma.hpp"
#include "cute/arch/mma_sm90_gmma_ext.hpp"  // the m64n160 atom
#include "cute/atom/mma_traits_sm90_gmma_ext.hpp"
#include "cute/tensor.hpp"

namespace scalemm::backends::contiguous_grouped::impl {

using namespace cute;

constexpr int kBlockM = 128, kBlockK = 128;
constexpr int kMathWarpgroups = 2;
constexpr int kThreads = 128 * (1 + kMathWarpgroups);
constexpr int kMaxGroups = 1024;  // the groups' prefix sums live in shared memory

using Fp8 = cutlass::float_e4m3_t;

// A tile configuration: kBlockN columns per tile (64 or 128; 96, 160 or 192, which may span two
// 128-column scale blocks), kCluster CTAs sharing one A tile by multicast (1 or 2), or with kShareB two
// sharing one B tile. Tiles of up to 128 columns keep two partial-sum fragments. Whole tiles are stored
// through shared memory and TMA, in boxes of 64 columns (32 with 96- and 160-wide tiles): the staged D tile
// costs a pipeline stage (8 stages of 24 KB with 64-wide tiles, 6 of 28 KB with 96-wide ones, 5 of 32 KB
// with 128-wide ones, 4 of 36 or 40 KB with the wider ones).
template <int kBlockN_, int kCluster_, bool kShareB_ = false>
struct Config {
  static constexpr int kBlockN = kBlockN_, kCluster = kCluster_;
  static constexpr bool kShareB = kShareB_;  // the cluster takes two M tiles sharing B (else N tiles sharing A)
  static_assert(!kShareB || kCluster == 2, "B is shared by a pair of M tiles");
  static constexpr bool kTwoFragments = kBlockN <= 128;
  // How a consumer warp hands a stage back to the cluster's CTAs: with one fragment one lane per CTA,
  // at once (0.99x the time of lane 0 arriving on each in turn); with two, lane 0 (the parallel
  // arrives measured 1.005x at 16 x 256 x 2048 x 2048).
  static constexpr bool kLaneArrives = !kTwoFragments;
  static constexpr uint32_t kStageBytes = (kBlockM + kBlockN) * kBlockK;
  static constexpr int kStages = (208 * 1024 - kBlockM * kBlockN * 2) / kStageBytes;
  static constexpr int kBoxCols = kBlockN % 64 == 0 ? 64 : 32;  // D's staging boxes: 128 or 64 bytes a row
  static_assert(kBlockN % kBoxCols == 0, "D is staged in whole boxes");
  using SmemLayoutA = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Fp8>{},
                                             Shape<Int<kBlockM>, Int<kBlockK>, Int<kStages>>{}));
  using SmemLayoutB = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Fp8>{},
                                             Shape<Int<kBlockN>, Int<kBlockK>, Int<kStages>>{}));
  using Atom = std::conditional_t<
      kBlockN == 64, SM90_64x64x32_F32E4M3E4M3_SS_TN<>,
      std::conditional_t<kBlockN == 96, SM90_64x96x32_F32E4M3E4M3_SS_TN<>,
      std::conditional_t<
          kBlockN == 128, SM90_64x128x32_F32E4M3E4M3_SS_TN<>,
          std::conditional_t<kBlockN == 160, SM90_64x160x32_F32E4M3E4M3_SS_TN<>, SM90_64x192x32_F32E4M3E4M3_SS_TN<>>>>>;
  using TiledMma = decltype(make_tiled_mma(Atom{}, Layout<Shape<_2, _1, _1>>{}));
  // Tiles start at multiples of 32 columns within a scale block, so a tile of at most 160 columns, or a
  // 192-wide one (starting at 0 or 64), spans at most two scale blocks; a 64-wide one (at 0 or 64) one,
  // a 96-wide one (at 0, 32, 64 or 96) one or two.
  static_assert(kBlockN == 64 || kBlockN == 96 || kBlockN == 128 || kBlockN == 160 || kBlockN == 192,
                "a tile spans at most two 128-column scale blocks");
};

template <class C>
struct alignas(1024) SharedStorage {
  Fp8 a[C::kStages * kBlockM * kBlockK];  // each stage 1024-byte aligned, as the 128-byte swizzle needs
  Fp8 b[C::kStages * C::kBlockN * kBlockK];
  alignas(1024) uint8_t d[kBlockM * C::kBlockN * 2];  // bf16, boxes of 128 rows x kBoxCols columns
  float sfa[C::kStages * kBlockM];  // each stage's A scales, by tile row
  float sfb[C::kStages * 2];        // each stage's one or two B scales
  uint64_t full[C::kStages];   // TMA bytes landed and the scale warp's copies
  uint64_t empty[C::kStages];  // every consumer warp done reading
  int32_t tile_start[kMaxGroups + 1];  // exclusive prefix of the groups' M tiles
  int32_t row_start[kMaxGroups + 1];   // exclusive prefix of the groups' rows
  int32_t valid;
};

struct Params {
  CUtensorMap a;  // A (m, k) e4m3 row-major; box 128 x (a_rows / cluster) rows (a_rows with kShareB), 128-byte swizzle
  CUtensorMap b;  // B (groups * n, k); box 128 x kBlockN rows (kBlockN / 2 with kShareB)
  CUtensorMap dmap;  // D (m, n) bf16; box kBoxCols columns x 128 rows, 128- or 64-byte swizzle (when tma_store)
  // Scales, as their layouts' offset functions place them (a row term plus a K-block term):
  // A's row r, K block kb at sa[r * sa_row + kb * sa_kb]; expert g's block (r / 128, kb) at
  // sb[g * sb_group + (r / 128) * sb_row + kb].
  const float* sa;
  const float* sb;
  __nv_bfloat16* d;  // (m, n)
  int64_t sa_row, sa_kb, sb_row, sb_group;
  int m, n, kb, groups, n_tiles;
  // Rows of A each stage receives: 128, or for a call of one M tile (one group, M < 128) M rounded up
  // to 16, so that TMA fetches no rows past M. Its zero fill of those rows cost more than loading real
  // ones (M = 16 took 1.1-1.4x the time of M = 128 at 7168 x 2048, with or without the WGMMAs, H100).
  // The stage's other rows are never written: each output row reads only its own row of A, and rows
  // past M are never stored.
  int a_rows;
  float alpha;
  const void* device_sizes;  // or host_sizes below
  bool sizes_int64;
  bool staged;     // D 16-byte aligned: tiles are staged in shared memory and stored from there
  bool tma_store;  // staged, with at least one whole tile: whole tiles are stored through TMA
  int32_t* device_status;
};
template <int kCap>
struct ParamsWith : Params {
  int32_t host_sizes[kCap];
};

}  // namespace scalemm::backends::contiguous_grouped::impl
