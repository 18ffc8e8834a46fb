// The grouped blockwise kernels' mainloop: CUTLASS's Hopper pointer-array blockwise-scaling mainloop
// (everything it sets up: TMA loads, scale copies, shared memory, the pipeline) with its consumer side
// replaced, so that promoting K block k overlaps the tensor cores' work on K block k+1.
//
// Why: a K block of a 128x128 tile is 4 WGMMAs per consumer warpgroup, then a promotion (each
// thread's 64 partial sums scaled by their row's and column's scales and added into the fp32
// accumulator). CUTLASS's consumer waits for all of a block's WGMMAs, promotes, and only then issues
// the next block, and the two warpgroups of the cooperative schedule wait on the same stages, so the
// tensor cores idle through every promotion (about a fifth of a block's time). Here each warpgroup
// keeps two partial-sum fragments: it issues block k+1 into one, waits for block k only, promotes
// the other while k+1 runs, then releases block k's stage. 64 more registers per thread (192 of
// the consumer's 240 hold accumulators), one more stage held by the consumers.
//
// The arithmetic is CUTLASS's, in the same order: block k's partial sums (exact fp8 products summed by
// the tensor cores from zero) are scaled and added into the accumulator once per K block, block after
// block, with the same expressions; so the output is bit-identical to the mainloop it replaces.
//
// The kernel class (GemmUniversal with the cooperative pointer-array schedule) sees the same
// collective interface: this type derives from CUTLASS's collective, replaces mma() and mma_tail(),
// and inherits the rest.
#pragma once

#include "cutlass/gemm/collective/collective_mma.hpp"  // CollectiveMma and its Hopper blockwise specialization

namespace scalemm::backends::cutlass_grouped {

template <class Base>
struct OverlappedPromotionMainloop : Base {
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::TensorStorage;
  using typename Base::TiledMma;
  using typename Base::TileShape;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::SmemLayoutSFA;
  using typename Base::SmemLayoutSFB;
  using ElementBlockScale = typename Base::ElementBlockScale;
  static constexpr int ScaleMsPerTile = Base::ScaleMsPerTile;
  static constexpr int ScaleNsPerTile = Base::ScaleNsPerTile;

  // One promotion per K tile: the scale blocks are as deep as the tile (128), so each tile's partial
  // sums start from zero and are promoted once (CUTLASS's "finest granularity" case).
  static_assert(Base::ScalePromotionInterval * cute::size<2>(typename TiledMma::AtomShape_MNK{}) ==
                    cute::size<2>(TileShape{}),
                "the overlapped mainloop promotes once per K tile: scale blocks as deep as the tile");

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum, int k_tile_count,
                          int thread_idx, TensorStorage& shared_tensors, Params const& /*mainloop_params*/) {
    using namespace cute;
    static_assert(is_rmem<FrgTensorC>::value, "C tensor must be rmem resident.");

    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});  // (BLK_M,BLK_K,PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});  // (BLK_N,BLK_K,PIPE)
    // The scale grids of a stage, broadcast to the tile's (M, N) as CUTLASS's mainloop views them.
    Tensor sSFA = make_tensor(
        make_smem_ptr(shared_tensors.smem_SFA.data()),
        make_layout(make_shape(shape<0>(SmemLayoutSFA{}), get<1>(TileShape{}),
                               make_shape(shape<1>(SmemLayoutSFA{}), shape<2>(SmemLayoutSFA{}))),
                    make_stride(stride<0>(SmemLayoutSFA{}), _0{},
                                make_stride(stride<1>(SmemLayoutSFA{}), stride<2>(SmemLayoutSFA{})))));
    Tensor sSFB = make_tensor(
        make_smem_ptr(shared_tensors.smem_SFB.data()),
        make_layout(make_shape(get<0>(TileShape{}), shape<0>(SmemLayoutSFB{}),
                               make_shape(shape<1>(SmemLayoutSFB{}), shape<2>(SmemLayoutSFB{}))),
                    make_stride(_0{}, stride<0>(SmemLayoutSFB{}),
                                make_stride(stride<1>(SmemLayoutSFB{}), stride<2>(SmemLayoutSFB{})))));

    constexpr int MmaWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    Layout warp_group_thread_layout = make_layout(Int<MmaWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{});
    int warp_group_idx = __shfl_sync(0xFFFFFFFF, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    TiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_slice(warp_group_thread_layout(warp_group_idx));

    Tensor tCsSFA = tiled_mma.get_slice(thread_idx).partition_C(sSFA);  // (MMA,MMA_M,MMA_N,(MMA_K,PIPE))
    Tensor tCsSFB = tiled_mma.get_slice(thread_idx).partition_C(sSFB);
    Tensor tCrA = thread_mma.make_fragment_A(thread_mma.partition_A(sA));  // (MMA,MMA_M,MMA_K,PIPE)
    Tensor tCrB = thread_mma.make_fragment_B(thread_mma.partition_B(sB));  // (MMA,MMA_N,MMA_K,PIPE)
    Tensor tCrSFA = make_tensor_like<ElementBlockScale>(tCsSFA(_, _, _, _0{}));  // (MMA,MMA_M,MMA_N)
    Tensor tCrSFB = make_tensor_like<ElementBlockScale>(tCsSFB(_, _, _, _0{}));

    // Two partial-sum fragments: one being written by the tensor cores, one being promoted.
    Tensor part0 = make_fragment_like(accum);
    Tensor part1 = make_fragment_like(accum);
    clear(accum);
    warpgroup_fence_operand(accum);
    if (k_tile_count <= 0) {
      return;
    }

    PipelineState read = smem_pipe_read;
    PipelineState release = smem_pipe_read;

    // Waits for the stage's data and issues its K tile's WGMMAs into `part` (from zero).
    auto issue = [&](auto& part) {
      pipeline.consumer_wait(read, pipeline.consumer_try_wait(read));
      int const stage = read.index();
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
      warpgroup_fence_operand(part);
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < size<2>(tCrA); ++k_block) {
        cute::gemm(tiled_mma, tCrA(_, _, k_block, stage), tCrB(_, _, k_block, stage), part);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(part);
      ++read;
    };

    // `part` holds the finished partial sums of the oldest stage still held: scale them into the
    // accumulator (CUTLASS's expressions, case by case), then hand the stage back to the producer.
    auto promote = [&](auto& part) {
      warpgroup_fence_operand(part);
      warpgroup_fence_operand(accum);
      int const stage = release.index();
      copy(tCsSFA(_, _, _, make_coord(_0{}, stage)), tCrSFA);
      copy(tCsSFB(_, _, _, make_coord(_0{}, stage)), tCrSFB);
      if constexpr (ScaleMsPerTile == 1 && ScaleNsPerTile == 1) {
        ElementBlockScale const scale_ab = tCrSFA(_0{}) * tCrSFB(_0{});
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(accum); ++i) {
          accum(i) += part(i) * scale_ab;
        }
      } else if constexpr (ScaleMsPerTile > 1 && ScaleNsPerTile == 1) {
        ElementBlockScale const scale_b = tCrSFB(_0{});
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(filter_zeros(tCrSFA)); i++) {
          filter_zeros(tCrSFA)(i) = filter_zeros(tCrSFA)(i) * scale_b;
        }
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(accum); ++i) {
          accum(i) += part(i) * tCrSFA(i);
        }
      } else if constexpr (ScaleMsPerTile == 1 && ScaleNsPerTile > 1) {
        ElementBlockScale const scale_a = tCrSFA(_0{});
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(filter_zeros(tCrSFB)); i++) {
          filter_zeros(tCrSFB)(i) = filter_zeros(tCrSFB)(i) * scale_a;
        }
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(accum); ++i) {
          accum(i) += part(i) * tCrSFB(i);
        }
      } else {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(accum); ++i) {
          accum(i) += part(i) * tCrSFA(i) * tCrSFB(i);
        }
      }
      warpgroup_fence_operand(accum);
      // Every thread's scale reads come before the release (the producer refills the stage with
      // cp.async): one named barrier per consumer warpgroup, as in the patched CUTLASS mainloop.
      cutlass::arch::NamedBarrier(cutlass::NumThreadsPerWarpGroup, uint32_t(cutlass::canonical_warp_group_idx() - 1))
          .arrive_and_wait_unaligned();
      pipeline.consumer_release(release);
      ++release;
    };

    // Blocks alternate between the two fragments; the loop body covers two blocks so that each
    // fragment stays in fixed registers.
    issue(part0);
    int k = 1;
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k + 1 < k_tile_count; k += 2) {
      issue(part1);
      warpgroup_wait<1>();
      promote(part0);
      issue(part0);
      warpgroup_wait<1>();
      promote(part1);
    }
    if (k < k_tile_count) {
      issue(part1);
      warpgroup_wait<1>();
      promote(part0);
      warpgroup_wait<0>();
      promote(part1);
    } else {
      warpgroup_wait<0>();
      promote(part0);
    }
    warpgroup_fence_operand(accum);
  }

  // mma() has released every stage it read.
  CUTLASS_DEVICE void mma_tail(MainloopPipeline, PipelineState, int) {}
};

}  // namespace scalemm::backends::cutlass_grouped
