// The contiguous grouped kernel's device code (contiguous_grouped.hpp): scans, tiles, K loop, kernel body.
//
// Structure, and why:
//  * 384 threads, one CTA per SM, persistent: warpgroup 0 is the producer (one thread issues TMA
//    loads, its registers given back with setmaxnreg), warpgroups 1 and 2 compute rows 0-63 and
//    64-127 of each tile. Producer and consumers walk the same unit sequence (unit u, u + clusters,
//    ...), so the stage ring's phases agree without any other hand-off. A warpgroup none of whose rows
//    belongs to the tile's group issues no WGMMAs (the two share the tensor cores): at M <= 64 that
//    took the GPU time of one-tile calls to 0.82-0.94x (H200, the same bits).
//  * Tile configurations (Config): 128 x 128 tiles in clusters of two, and 128 x 192 tiles over a long
//    K, without clusters for few rows per group and in clusters of two for many (wide_tiles() and
//    shared_b() say where they measured faster); 128 x 160 instead where 192-wide tiles would leave
//    the last wave nearly empty (narrow_tiles()). A wide tile spans two 128-column scale blocks, split
//    at column 128 or 64 (192), or 128, 96, 64 or 32 (160); 160- and 96-wide tiles are staged for their
//    store in 32-column boxes (64-byte rows, 64-byte swizzle), the others in 64-column ones. A call of one
//    group at small M runs 128 x 64 or 128 x 96 tiles without clusters (half_tiles(), third_tiles()),
//    whichever fills one wave of the SMs.
//  * Clusters of two CTAs take two N tiles of one M tile with 128-wide tiles: each loads half of the A
//    tile and multicasts it to both, so A crosses from L2 once per pair. With 192-wide tiles they take
//    two M tiles of one N tile (kShareB): where both lie in one group each loads half of the B tile
//    and multicasts it (28% less traffic from L2 than without clusters; 0.92-0.98x the time), else
//    each loads its own. A consumer hands a stage back to both CTAs' producers, and a producer leaves
//    only when every stage it filled has been handed back, so no CTA exits while its peer may still
//    write into it.
//  * With 128-wide tiles a tile's K loop keeps two partial-sum fragments per thread: block k+1's
//    four WGMMAs are issued before block k is waited for; then block k's stage is handed back (one
//    arrive per warp) and its partial sums promoted: accum += part * (scale_a[row] * scale_b[block]),
//    CUTLASS's expressions in its order, so the output is bit-identical to the CUTLASS kernel's. A
//    192-wide tile leaves registers for one fragment only (96 + 96 per thread): there the other
//    warpgroup's WGMMAs run while one promotes.
//  * The scales travel with the stages: a second producer warp copies each stage's scales (the
//    tile's 128 A rows, its one or two B blocks) into shared memory with cp.async, arriving on the
//    stage's full barrier, and the consumers read them there once the stage is full, as DeepGEMM
//    does. Loaded from L2 by each consumer thread instead, a load still in flight held the next
//    block's last WGMMA back (the SASS places the scale product between the WGMMAs; Nsight Compute
//    put 9% of all stall samples on it), and each tile's first loads were not hidden at all. The
//    copies measured 1-8% faster on eleven of twelve shapes (H100, interleaved, the same bits) and
//    1.4% slower on the smallest (5 groups of 77 rows, 14.2 against 14.0 us).
//  * Every tile is staged in shared memory (swizzled, conflict-free). A whole tile goes out through
//    TMA, which clips N; the consumers go on to the next tile while it drains. A tile that a group
//    ends inside (a TMA box would write the next group's rows) is copied out by the consumers in
//    16-byte stores, eight lanes to a 128-byte line, on the group's rows only. (The TMA store measured
//    11% faster at 16 x 256 x 2048 x 2048, and with 192-wide tiles 6-7% faster on the long-K shapes;
//    the staged tile costs a pipeline stage, which with the scales in shared memory no longer
//    measured slower anywhere. The 16-byte copy-out took 0.93-0.99x the time of bf16 pairs stored
//    from the registers wherever groups end inside tiles: 0.96x at 16 uneven experts x 2048 x 2048,
//    0.98x at decode uneven, H100, the same bits.) Only a D off 16-byte alignment still stores from
//    the registers. Both warpgroups write the staged tile with stmatrix, then meet at one
//    barrier: the tensor pipe idles while they do, so the epilogue is kept short (stmatrix took
//    0.93-0.96x the time of 4-byte stores with 128-wide tiles over a long K), and the shared barrier
//    keeps the two warpgroups close (each storing its own half without it took 1.04-1.15x the time:
//    drifted apart, they release stages late for the one ahead).
//  * The role branches and the unit loop read their warp index, validity and tile count through
//    lane 0 (__shfl_sync), so the compiler knows they are warp-uniform, as DeepGEMM and CUTLASS do:
//    the consumers' stage indices and WGMMA descriptors then live in uniform registers. Without it
//    each descriptor took an add and a register-to-uniform move before every WGMMA (133 instructions
//    per K block and warp against 118); 128 x 192 tiles measured 6% faster on the long-K shapes (H100,
//    the same bits).
// Included by contiguous_grouped_sm90a.cu only.
#pragma once

#include <climits>
#include <cstdint>

#include "backends/contiguous_grouped_config.cuh"
#include "cute/arch/cluster_sm90.hpp"
#include "cute/arch/copy_sm90_tma.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"

namespace scalemm::backends::contiguous_grouped::impl {

// Warp 1: the groups' prefix sums into shared memory, and whether the sizes are valid (non-negative,
// summing to m). CTA 0 reports to device_status as the CUTLASS set-up kernel does.
template <int kCap, class S>
__device__ void scan_groups(const ParamsWith<kCap>& p, S& s, int lane) {
  int64_t rows = 0;
  int32_t tiles = 0;
  int bad = INT_MAX;
  if (lane == 0) s.tile_start[0] = s.row_start[0] = 0;
  for (int base = 0; base < p.groups; base += 32) {
    const int g = base + lane;
    int64_t size = 0;
    if (g < p.groups) {
      size = !p.device_sizes ? p.host_sizes[g]
             : p.sizes_int64 ? static_cast<const int64_t*>(p.device_sizes)[g]
                             : static_cast<const int32_t*>(p.device_sizes)[g];
      if (size < 0) bad = min(bad, g);
    }
    // Clamped so that no sum overflows; any size above m still makes the total differ from m.
    int64_t r = size < 0 ? 0 : min(size, int64_t(p.m) + 1);
    int32_t t = int32_t((r + kBlockM - 1) / kBlockM);
    for (int o = 1; o < 32; o <<= 1) {
      const int64_t rr = __shfl_up_sync(0xffffffffu, r, o);
      const int32_t tt = __shfl_up_sync(0xffffffffu, t, o);
      if (lane >= o) r += rr, t += tt;
    }
    if (g < p.groups) {
      s.row_start[g + 1] = int32_t(min(rows + r, int64_t(INT_MAX)));
      s.tile_start[g + 1] = tiles + t;
    }
    rows += __shfl_sync(0xffffffffu, r, 31);
    tiles += __shfl_sync(0xffffffffu, t, 31);
  }
  bad = __reduce_min_sync(0xffffffffu, bad);
  const bool valid = bad == INT_MAX && rows == p.m;
  if (lane == 0) {
    s.valid = valid;
    if (blockIdx.x == 0 && p.device_status)
      *p.device_status = valid ? 0 : bad != INT_MAX ? bad + 1 : p.groups + 1;
  }
}

// The tile a CTA computes for unit u (an M tile and kCluster consecutive N tiles; with kShareB two
// consecutive M tiles and one N tile): its group (g advances monotonically along a CTA's units),
// first row, row count and N tile. Units are numbered M tile by M tile: the clusters running at one
// time share a few A tiles and one expert's B (bands of 4-16 M tiles, M fastest, measured no better,
// with B shared 1.00-1.05x the time). The N tile of a cluster's last unit may lie past N
// (odd tile count), and with kShareB the last M tile's peer past M: that CTA loads and computes for
// its peer's sake and stores nothing.
struct Tile {
  int g = 0, row0 = 0, rows = 0, nt = 0;
  bool share_b = false;  // kShareB: the pair's two M tiles lie in one group, so B is multicast
  template <class C, class S>
  __device__ void seek(const S& s, int64_t u, int n_units, int rank, int total_tiles, int m) {
    int mt;
    const int mu = int(u / n_units), nu = int(u % n_units);
    if constexpr (C::kShareB) {
      mt = mu * 2 + rank, nt = nu;
      if (mt >= total_tiles) {  // the odd last M tile's peer: loads rows past M for its sake, stores nothing
        row0 = m, rows = 0, share_b = false;
        return;
      }
    } else {
      mt = mu, nt = nu * C::kCluster + rank;
    }
    while (s.tile_start[g + 1] <= mt) ++g;
    row0 = s.row_start[g] + (mt - s.tile_start[g]) * kBlockM;
    rows = s.row_start[g + 1] - row0;
    if constexpr (C::kShareB)  // both CTAs of the pair reach the same answer
      share_b = rank == 0 ? mt + 1 < total_tiles && s.tile_start[g + 1] > mt + 1 : mt - 1 >= s.tile_start[g];
  }
};

// One 4-byte cp.async (global to shared, through L1).
__device__ __forceinline__ void cp_async_4(float* dst, const float* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(cute::cast_smem_ptr_to_uint(dst)), "l"(src) : "memory");
}

// A scale from its stage's shared-memory copy, read after the stage's barrier wait (volatile, so the
// compiler keeps it there).
__device__ __forceinline__ float ld_shared(const float* q) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(cute::cast_smem_ptr_to_uint(q)) : "memory");
  return v;
}

// The byte offset in the staged D tile (boxes of 128 rows x kBoxCols columns) of row `row`'s 16-byte
// chunk `chunk` (8 columns), XOR-swizzled by row as the map's swizzle reads it (128-byte box rows:
// chunk ^ row % 8; 64-byte rows: chunk ^ (row / 2) % 4): stmatrix writes and the copy-out reads through it.
template <class C>
__device__ __forceinline__ uint32_t staged_offset(int row, int chunk) {
  constexpr int kRowBytes = C::kBoxCols * 2, kChunks = kRowBytes / 16;
  const int x = kChunks == 8 ? row & 7 : (row >> 1) & 3;
  return uint32_t((chunk / kChunks) * (kBlockM * kRowBytes) + row * kRowBytes + (((chunk % kChunks) ^ x) << 4));
}

// One tile's K loop for a consumer warpgroup: for each K block, wait for its stage, read its scales
// (sfa: the thread's first row's A scale in stage 0), issue its four WGMMAs into `part` from zero,
// wait for them, hand the stage back, and promote: accum += part *
// (scale_a[row] * scale_b[block]), CUTLASS's expressions in its order, so the output is bit-identical
// to the CUTLASS kernel's whatever the tile width. While one warpgroup promotes, the other's WGMMAs
// keep the tensor cores busy. Columns [0, 8 kSplit) of the tile take the first scale block's
// scale, the rest the second's (a 192-wide tile starts at 0 or 64 within a scale block, a 160- or
// 96-wide one at 0, 32, 64 or 96).
// `idle` (warp-uniform): none of the warpgroup's 64 rows belongs to the tile's group (a one-tile call of
// M <= 64, a group's last tile ending in the first half, a pair's peer past M). Its WGMMAs would feed
// no stored output, and they share the SM's tensor cores with the other warpgroup's, so it only keeps
// the stage protocol: waits for each stage and hands it back.
template <class C, int kSplit, class Ring, class Mma, class FragA, class FragB, class Accum>
__device__ __forceinline__ void k_loop(const Params& p, Ring& ring, Mma& mma, const FragA& tCrA, const FragB& tCrB,
                                       Accum& accum, Accum& part, Accum& part2, int lane, const float* sfa,
                                       const float* sfb, bool idle) {
  using Full = cutlass::arch::ClusterTransactionBarrier;
  using Empty = cutlass::arch::ClusterBarrier;
  if (idle) {
    for (int kb = 0; kb < p.kb; ++kb) {
      Full::wait(&ring.full[ring.read], ring.read_phase);
      if (++ring.read == C::kStages) ring.read = 0, ring.read_phase ^= 1;
      __syncwarp();
      if (lane == 0)
        for (int c = 0; c < C::kCluster; ++c) Empty::arrive(&ring.empty[ring.done], uint32_t(c), 1u);
      if (++ring.done == C::kStages) ring.done = 0;
    }
    clear(accum);  // staged like any tile's rows past the group, never stored
    return;
  }
  struct Scales {
    float a0, a1, b0, b1;
  };
  // Waits for the next stage, reads its K block's scales, issues the block's four WGMMAs into
  // `frag`, from zero, and returns the scales.
  auto issue = [&](auto& frag) {
    Full::wait(&ring.full[ring.read], ring.read_phase);
    const int st = ring.read;
    const Scales sc{ld_shared(sfa + st * kBlockM), ld_shared(sfa + st * kBlockM + 8), ld_shared(sfb + st * 2),
                    kSplit < C::kBlockN / 8 ? ld_shared(sfb + st * 2 + 1) : 0.0f};
    warpgroup_fence_operand(frag);
    warpgroup_arrive();
    mma.accumulate_ = GMMA::ScaleOut::Zero;
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < size<2>(tCrA); ++k) {
      cute::gemm(mma, tCrA(_, _, k, ring.read), tCrB(_, _, k, ring.read), frag);
      mma.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
    warpgroup_fence_operand(frag);
    if (++ring.read == C::kStages) ring.read = 0, ring.read_phase ^= 1;
    return sc;
  };
  // The oldest issued block's WGMMAs are complete: hand its stage back to every producer that
  // writes into it, then promote its partial sums.
  auto promote = [&](auto& frag, const Scales& sc) {
    warpgroup_fence_operand(frag);
    // An arrive releases only its own lane's reads: the warp's other lanes read this stage's scales
    // too, and the scale warp refills it once every warp has arrived, so the warp meets first.
    __syncwarp();
    if constexpr (C::kLaneArrives) {
      if (lane < C::kCluster) Empty::arrive(&ring.empty[ring.done], uint32_t(lane), 1u);
    } else if (lane == 0) {
      for (int c = 0; c < C::kCluster; ++c) Empty::arrive(&ring.empty[ring.done], uint32_t(c), 1u);
    }
    if (++ring.done == C::kStages) ring.done = 0;
    const float s00 = sc.a0 * sc.b0, s10 = sc.a1 * sc.b0, s01 = sc.a0 * sc.b1, s11 = sc.a1 * sc.b1;
    warpgroup_fence_operand(accum);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(accum); ++i) {
      const bool hi = (i >> 1) & 1;
      accum(i) += frag(i) * ((i >> 2) < kSplit ? (hi ? s10 : s00) : (hi ? s11 : s01));
    }
    warpgroup_fence_operand(accum);
  };
  clear(accum);
  if constexpr (C::kTwoFragments) {
    // Block k+1's WGMMAs are issued before block k is waited for and promoted; the loop body covers
    // two blocks so that each fragment stays in fixed registers.
    Scales sc0 = issue(part);
    int k = 1;
    for (; k + 1 < p.kb; k += 2) {
      const Scales sc1 = issue(part2);
      warpgroup_wait<1>();
      promote(part, sc0);
      sc0 = issue(part);
      warpgroup_wait<1>();
      promote(part2, sc1);
    }
    if (k < p.kb) {
      const Scales sc1 = issue(part2);
      warpgroup_wait<1>();
      promote(part, sc0);
      warpgroup_wait<0>();
      promote(part2, sc1);
    } else {
      warpgroup_wait<0>();
      promote(part, sc0);
    }
  } else {
    // One fragment (a 192-wide tile leaves no registers for a second): while this warpgroup
    // promotes, the other one's WGMMAs keep the tensor cores busy.
    for (int kb = 0; kb < p.kb; ++kb) {
      const Scales sc = issue(part);
      warpgroup_wait<0>();
      promote(part, sc);
    }
  }
}

template <int kCap, class C>
__global__ void __launch_bounds__(kThreads, 1) contiguous_grouped_kernel(const __grid_constant__ ParamsWith<kCap> p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kBlockN = C::kBlockN, kCluster = C::kCluster, kStages = C::kStages;
  extern __shared__ uint8_t smem_raw[];
  using Storage = SharedStorage<C>;
  Storage& s = *reinterpret_cast<Storage*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  // The warp index through a shuffle, so that the compiler knows it is warp-uniform: the role branches
  // below are then uniform, and the consumers' stage indices, barrier addresses and WGMMA descriptors
  // stay in uniform registers (without it every descriptor took a register-to-uniform move).
  const int warp = __shfl_sync(0xffffffffu, int(threadIdx.x) / 32, 0), lane = threadIdx.x % 32, wg = warp / 4;
  using Full = cutlass::arch::ClusterTransactionBarrier;
  using Empty = cutlass::arch::ClusterBarrier;
  const int rank = int(cute::block_rank_in_cluster());

  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      Full::init(&s.full[i], 1 + 32);  // the TMA thread and each lane of the scale warp
      Empty::init(&s.empty[i], kCluster * kMathWarpgroups * 4);  // every consumer warp of the cluster
    }
    cutlass::arch::fence_barrier_init();
    prefetch_tma_descriptor(reinterpret_cast<const TmaDescriptor*>(&p.a));
    prefetch_tma_descriptor(reinterpret_cast<const TmaDescriptor*>(&p.b));
    if (p.tma_store) prefetch_tma_descriptor(reinterpret_cast<const TmaDescriptor*>(&p.dmap));
  }
  if (warp == 1) scan_groups(p, s, lane);
  __syncthreads();
  cute::cluster_sync();  // the peer's barriers exist before anything reaches them
  // Read from shared memory through lane 0, so that the compiler knows the unit loops below are
  // warp-uniform (and with them the stage ring the consumers carry across tiles).
  if (!__shfl_sync(0xffffffffu, s.valid, 0)) return;  // both CTAs of a cluster read the same sizes
  const int total_tiles = __shfl_sync(0xffffffffu, s.tile_start[p.groups], 0);
  const int n_units = C::kShareB ? p.n_tiles : (p.n_tiles + kCluster - 1) / kCluster;
  const int64_t units = int64_t(C::kShareB ? (total_tiles + 1) / 2 : total_tiles) * n_units;
  const int64_t first = blockIdx.x / kCluster, step = gridDim.x / kCluster;

  if (wg == 0) {  // producer
    cutlass::arch::warpgroup_reg_dealloc<40>();
    if (threadIdx.x == 0) {
      int stage = 0;
      uint32_t phase = 0;
      Tile tile;
      constexpr uint64_t hint = uint64_t(TMA::CacheHintSm90::EVICT_NORMAL);
      const int slice_m = p.a_rows / kCluster;  // the rows of A this CTA loads for the cluster
      const uint32_t stage_bytes = uint32_t(p.a_rows + kBlockN) * kBlockK;
      for (int64_t u = first; u < units; u += step) {
        tile.seek<C>(s, u, n_units, rank, total_tiles, p.m);
        const int brow0 = tile.g * p.n + tile.nt * kBlockN;
        for (int kb = 0; kb < p.kb; ++kb) {
          Empty::wait(&s.empty[stage], phase ^ 1);
          Full::arrive_and_expect_tx(&s.full[stage], stage_bytes);
          Fp8* a_dst = s.a + stage * kBlockM * kBlockK;
          Fp8* b_dst = s.b + stage * kBlockN * kBlockK;
          if constexpr (C::kShareB) {
            // Its own A; half of B each, multicast to both where the pair shares it, else both halves.
            constexpr int kHalf = kBlockN / 2;
            SM90_TMA_LOAD_2D::copy(&p.a, &s.full[stage], hint, a_dst, kb * kBlockK, tile.row0);
            if (tile.share_b) {
              SM90_TMA_LOAD_MULTICAST_2D::copy(&p.b, &s.full[stage], uint16_t(3), hint, b_dst + rank * kHalf * kBlockK,
                                               kb * kBlockK, brow0 + rank * kHalf);
            } else {
              SM90_TMA_LOAD_2D::copy(&p.b, &s.full[stage], hint, b_dst, kb * kBlockK, brow0);
              SM90_TMA_LOAD_2D::copy(&p.b, &s.full[stage], hint, b_dst + kHalf * kBlockK, kb * kBlockK, brow0 + kHalf);
            }
          } else {
            if constexpr (kCluster > 1)
              SM90_TMA_LOAD_MULTICAST_2D::copy(&p.a, &s.full[stage], uint16_t((1 << kCluster) - 1), hint,
                                               a_dst + rank * slice_m * kBlockK, kb * kBlockK, tile.row0 + rank * slice_m);
            else
              SM90_TMA_LOAD_2D::copy(&p.a, &s.full[stage], hint, a_dst, kb * kBlockK, tile.row0);
            SM90_TMA_LOAD_2D::copy(&p.b, &s.full[stage], hint, b_dst, kb * kBlockK, brow0);
          }
          if (++stage == kStages) stage = 0, phase ^= 1;
        }
      }
      // Every stage handed back by every consumer of the cluster: after this no peer arrives here.
      if constexpr (kCluster > 1)
        for (int i = 0; i < kStages; ++i) {
          Empty::wait(&s.empty[stage], phase ^ 1);
          if (++stage == kStages) stage = 0, phase ^= 1;
        }
    } else if (warp == 1) {
      // The scale warp: each stage's scales (the tile's 128 rows of A, clamped to the last row, and
      // one or two B blocks) copied into shared memory; each lane's copies arrive on the stage's full
      // barrier when they land. It walks the same units as the TMA thread.
      int stage = 0;
      uint32_t phase = 0;
      Tile tile;
      const int n_blocks = (p.n + 127) / 128;
      for (int64_t u = first; u < units; u += step) {
        tile.seek<C>(s, u, n_units, rank, total_tiles, p.m);
        const int blk = min(tile.nt * kBlockN / 128, n_blocks - 1);
        const float* sb = p.sb + tile.g * p.sb_group + int64_t(min(blk + lane, n_blocks - 1)) * p.sb_row;
        const float* sa[4];
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < 4; ++j) sa[j] = p.sa + int64_t(min(tile.row0 + lane + 32 * j, p.m - 1)) * p.sa_row;
        // Running pointers (one add each per stage, not a 64-bit multiply per copy): this warp issues
        // for every stage and had fallen behind the tensor cores. With them the kernel took 0.87-0.97x
        // its time with 256 or more rows per group over a long K (the same bits).
        const int64_t sa_kb = p.sa_kb;
        for (int kb = 0; kb < p.kb; ++kb) {
          Empty::wait(&s.empty[stage], phase ^ 1);
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < 4; ++j)
            cp_async_4(&s.sfa[stage * kBlockM + lane + 32 * j], sa[j]), sa[j] += sa_kb;
          if (lane < 2) cp_async_4(&s.sfb[stage * 2 + lane], sb);
          ++sb;
          asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(cast_smem_ptr_to_uint(&s.full[stage]))
                       : "memory");
          if (++stage == kStages) stage = 0, phase ^= 1;
        }
      }
      asm volatile("cp.async.wait_all;" ::: "memory");
    }
    return;
  }

  // Consumers: warpgroup mw computes rows [64 mw, 64 mw + 64) of each tile.
  cutlass::arch::warpgroup_reg_alloc<232>();
  const int mw = wg - 1;
  typename C::TiledMma mma;
  Tensor sA = make_tensor(make_smem_ptr(s.a), typename C::SmemLayoutA{});
  Tensor sB = make_tensor(make_smem_ptr(s.b), typename C::SmemLayoutB{});
  auto wg_mma = mma.get_slice(mw * 128);
  // The operands' shared-memory descriptors, their base shuffled from lane 0 so that the compiler
  // knows it is warp-uniform (as DeepGEMM does): each stage's and K step's descriptor is then an add
  // in uniform registers, not an add and a register-to-uniform move before every WGMMA.
  auto uniform = [](auto t) {
    cute::GmmaDescriptor d = t.data().desc_;
    d.reg32_[0] = __shfl_sync(0xffffffffu, d.reg32_[0], 0);
    d.reg32_[1] = __shfl_sync(0xffffffffu, d.reg32_[1], 0);
    return make_tensor(GMMA::DescriptorIterator{d}, t.layout());
  };
  Tensor tCrA = uniform(wg_mma.make_fragment_A(wg_mma.partition_A(sA)));  // (MMA, MMA_M, MMA_K, PIPE)
  Tensor tCrB = uniform(wg_mma.make_fragment_B(wg_mma.partition_B(sB)));
  Tensor accum = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor part = make_fragment_like(accum);
  Tensor part2 = make_fragment_like(accum);  // unused (so never allocated) with one fragment
  static_assert(decltype(size(accum))::value == kBlockN / 2, "one 64 x kBlockN WGMMA accumulator per thread");
  // The m64nN accumulator: value i of a thread is at row r0 + 8 ((i >> 1) & 1), column c0 + (i & 1) + 8 (i >> 2).
  const int r0 = mw * 64 + (warp % 4) * 16 + lane / 4;
  const int c0 = (lane % 4) * 2;

  // The consumer's stage ring: `read` is the next stage to wait for, `done` the next to hand back.
  struct Ring {
    uint64_t* full;
    uint64_t* empty;
    int read = 0, done = 0;
    uint32_t read_phase = 0;
  } ring{s.full, s.empty};
  Tile tile;
  for (int64_t u = first; u < units; u += step) {
    tile.seek<C>(s, u, n_units, rank, total_tiles, p.m);
    const int col0 = tile.nt * kBlockN;
    const int in_block = col0 % 128;  // where the tile starts within its first scale block
    // (the tile's row count through lane 0: a branch the compiler knows is uniform)
    const int rows = __shfl_sync(0xffffffffu, tile.rows, 0);
    const bool idle = rows <= 64 * mw;
    // The first scale block takes the tile's first 128 - in_block columns (all of them where they fit).
    if (in_block == 0 || in_block + kBlockN <= 128)
      k_loop<C, 16>(p, ring, mma, tCrA, tCrB, accum, part, part2, lane, s.sfa + r0, s.sfb, idle);
    else if (in_block == 64)
      k_loop<C, 8>(p, ring, mma, tCrA, tCrB, accum, part, part2, lane, s.sfa + r0, s.sfb, idle);
    else if constexpr (kBlockN == 160) {
      if (in_block == 32)
        k_loop<C, 12>(p, ring, mma, tCrA, tCrB, accum, part, part2, lane, s.sfa + r0, s.sfb, idle);
      else
        k_loop<C, 4>(p, ring, mma, tCrA, tCrB, accum, part, part2, lane, s.sfa + r0, s.sfb, idle);
    } else if constexpr (kBlockN == 96) {  // at 96 within the block (at 32 it fits)
      k_loop<C, 4>(p, ring, mma, tCrA, tCrB, accum, part, part2, lane, s.sfa + r0, s.sfb, idle);
    }
    // alpha * acc rounded to bf16, as CUTLASS's LinearCombination epilogue with beta = 0.
    if (p.staged && rows > 0) {
      // Once the previous tile's TMA stores have read the staging tile, both warpgroups write it (each
      // row's 16-byte chunks XOR-swizzled by row, as the map's swizzle reads them).
      if (threadIdx.x == 128) tma_store_wait<0>();
      asm volatile("bar.sync 1, 256;" ::: "memory");
      // stmatrix: four 8 x 8 bf16 matrices per instruction, the accumulator's own layout (a thread's
      // values i, i + 1 are row r0 (+ 8), columns c0, c0 + 1 of an 8-column chunk). Lane l gives the
      // address of row l % 8 of matrix l / 8: rows 0-7 and 8-15 of the warp's 16, chunks 2q and
      // 2q + 1; swizzled (staged_offset), conflict-free with either box width.
      const uint32_t sd = cute::cast_smem_ptr_to_uint(s.d);
      const int srow = mw * 64 + (warp % 4) * 16 + lane % 8 + 8 * ((lane / 8) & 1);
      CUTLASS_PRAGMA_UNROLL
      for (int q = 0; q < kBlockN / 16; ++q) {
        const uint32_t addr = sd + staged_offset<C>(srow, 2 * q + lane / 16);
        uint32_t v[4];
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < 4; ++j) {
          const __nv_bfloat162 h = __floats2bfloat162_rn(p.alpha * accum(8 * q + 2 * j), p.alpha * accum(8 * q + 2 * j + 1));
          v[j] = *reinterpret_cast<const uint32_t*>(&h);
        }
        asm volatile("stmatrix.sync.aligned.x4.m8n8.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v[0]), "r"(v[1]),
                     "r"(v[2]), "r"(v[3]) : "memory");
      }
      if (p.tma_store && rows >= kBlockM) {  // a whole tile: thread 128 stores it box by box through TMA, which clips N
        tma_store_fence();
        asm volatile("bar.sync 1, 256;" ::: "memory");
        if (threadIdx.x == 128) {
          for (int box = 0; box < kBlockN / C::kBoxCols; ++box)
            if (col0 + C::kBoxCols * box < p.n)
              SM90_TMA_STORE_2D::copy(&p.dmap, s.d + box * kBlockM * C::kBoxCols * 2, col0 + C::kBoxCols * box, tile.row0);
          tma_store_arrive();
        }
      } else {
        // The group ends inside the tile, and a TMA box would write the next group's rows: the
        // consumers copy its rows out 16 bytes at a time (eight lanes to a 128-byte line), the 8-column
        // chunks below N (N % 8 == 0).
        asm volatile("bar.sync 1, 256;" ::: "memory");
        constexpr int kRowChunks = kBlockN / 8;
        const int cols = p.n - col0;
        __nv_bfloat16* dt = p.d + int64_t(tile.row0) * p.n + col0;
        for (int i = int(threadIdx.x) - 128; i < min(rows, kBlockM) * kRowChunks; i += 256) {
          const int r = i / kRowChunks, c = i % kRowChunks;
          if (c * 8 < cols) {
            const uint32_t src = sd + staged_offset<C>(r, c);
            uint4 v;
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(src) : "memory");
            *reinterpret_cast<uint4*>(dt + int64_t(r) * p.n + c * 8) = v;
          }
        }
      }
    } else if (rows > 0) {
      // D not 16-byte aligned: straight from the registers, bf16 pairs where D is 4-byte aligned (then
      // every pair is: N is even, a pair starts at an even column), else one element at a time.
      __nv_bfloat16* dt = p.d + int64_t(tile.row0) * p.n + col0;
      const int cols = p.n - col0;
      const bool pairs = (reinterpret_cast<uintptr_t>(p.d) & 3) == 0;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); i += 2) {
        const int r = r0 + 8 * ((i >> 1) & 1), c = c0 + 8 * (i >> 2);
        if (r < tile.rows && c < cols) {
          const __nv_bfloat162 h = __floats2bfloat162_rn(p.alpha * accum(i), p.alpha * accum(i + 1));
          __nv_bfloat16* q = dt + int64_t(r) * p.n + c;
          if (pairs)
            *reinterpret_cast<__nv_bfloat162*>(q) = h;
          else
            q[0] = h.x, q[1] = h.y;
        }
      }
    }
  }
  if (threadIdx.x == 128) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");  // stores complete
#endif
}

}  // namespace scalemm::backends::contiguous_grouped::impl
