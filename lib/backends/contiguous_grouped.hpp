// The contiguous grouped kernel: m-grouped blockwise FP8 (block1x128 A, block128x128 B, compact fp32
// scales, bf16 D) in one launch of a kernel of our own for Hopper, with the groups' rows contiguous in
// A and D as the caller holds them. Written for the MoE GEMMs where CUTLASS's pointer-array kernel
// spends its time around the tensor cores rather than in them (docs/history/performance-notes.md):
//  * one tensor map for A over all groups' rows and one for B over all experts, no per-group
//    descriptors, no per-group argument arrays and no set-up launch: every CTA scans the group sizes
//    (host or device) into shared memory itself and walks its tiles from that prefix;
//  * a tile of a group that ends inside it is loaded whole (the next group's rows ride along) and
//    stored only up to the group's last row, so groups need no padding;
//  * one producer warp issues TMA loads into a 4- or 5-stage ring, A multicast across clusters of two
//    N tiles with 128-wide tiles, B across clusters of two M tiles with 192-wide ones over many rows
//    per group (shared_b()), and a second copies each stage's scales into shared memory; two consumer
//    warpgroups each run the WGMMAs of 64 rows x 128 columns (160 or 192 over a long K: tiles()) per
//    128-deep K block and promote the block's partial sums into the fp32 accumulator with the row's
//    and the block's scales, CUTLASS's expressions in CUTLASS's order, so the output is
//    bit-identical to the CUTLASS grouped kernel's;
//  * tiles are staged in shared memory and stored through TMA where whole, in 16-byte stores where a
//    group ends inside them.
// Against the CUTLASS kernel (interleaved timing, bit-identical outputs): 0.81-0.96x its time on the
// twelve MoE shapes of bench_grouped on an H100, 0.80-0.99x on an H200, and below one cuBLASLt call
// per group, so `auto` takes it wherever it can run.
// GroupedBackend::kContiguous asks for it by name anywhere it can run.
// Built with the CUTLASS kernels (the same CuTe headers and sm_90a object library); blocker() says
// why a call is not taken.
#pragma once

#include <string>

#include "scalemm/gemm.hpp"
#include "scalemm/grouped.hpp"

namespace scalemm::backends::contiguous_grouped {

/// Whether this library holds the kernel.
bool built();

/// Empty when the kernel runs `args` on `t`; else why not (printable, one line).
std::string blocker(const GroupedGemmArgs& args, const DeviceTarget& t);

/// The kernel's tile configurations (128 rows each): 64, 96, 128, 160 or 192 columns; in clusters of two
/// N tiles sharing A (by multicast), of two M tiles sharing B, or without clusters.
enum class Tiles { k128SharedA, k160SharedA, k160SharedB, k192, k192SharedB, k64, k96 };

/// Enqueues the whole grouped GEMM on `stream` (blocker() was empty) with the given tiles (tiles()
/// picks them; every configuration gives the same bits). Needs no workspace.
void run(const GroupedGemmArgs& args, Stream stream, Tiles tiles);

/// Few rows per group over a long K (two or more groups, average rows per group <= 64, K >= 4096,
/// N >= 2048): the kernel then streams B and runs 128 x 192 tiles without clusters. One group (a dense
/// call) is not: its few tiles fill fewer SMs when wider. A host-side rule, defined whether or
/// not the kernel is built.
bool decode_like(const GroupedGemmArgs& args);

/// The kernel's 128 x 192 tiles: a long K (>= 4096) with few rows per group (decode_like()) or many
/// (256 or more on average); elsewhere 128 x 128 tiles in clusters of two measured faster. A
/// host-side rule, defined whether or not the kernel is built.
bool wide_tiles(const GroupedGemmArgs& args);

/// Wide tiles with many rows per group (wide_tiles() and not decode_like()): clusters of two M tiles
/// then share B, each CTA loading half of it and multicasting it to both where the two tiles lie in
/// one group. A host-side rule, defined whether or not the kernel is built.
bool shared_b(const GroupedGemmArgs& args);

/// Tiles of 160 columns (host sizes only) where they fill the device's `multiprocessors` better in
/// waves, weighted by the tile width: with wide_tiles() at most 0.92 of what the 192-wide ones take
/// (few tiles, or a last wave of 192-wide ones nearly empty); else, with 256 or more rows per group,
/// no more than the 128-wide ones. A host-side rule.
bool narrow_tiles(const GroupedGemmArgs& args, int multiprocessors);

/// Tiles of 64 columns (one group with host sizes: a dense call): where 128-wide ones would give at
/// most half as many tiles as the device's `multiprocessors` (small M), 64-wide ones put twice as
/// many SMs to streaming B. A host-side rule.
bool half_tiles(const GroupedGemmArgs& args, int multiprocessors);

/// Tiles of 96 columns (one group with host sizes: a dense call): where 64-wide ones would need a
/// second wave (half_tiles() is false) and 96-wide ones fill one wave at least a quarter fuller than
/// 128-wide ones. A host-side rule.
bool third_tiles(const GroupedGemmArgs& args, int multiprocessors);

/// The configuration run() takes on a device of `multiprocessors` SMs (half_tiles(), third_tiles(),
/// wide_tiles(), shared_b(), narrow_tiles()). A host-side rule.
Tiles tiles(const GroupedGemmArgs& args, int multiprocessors);

/// The columns of a configuration's tiles (64, 96, 128, 160 or 192).
int tile_columns(Tiles tiles);

/// A one-line description for explain().
std::string describe(const GroupedGemmArgs& args, Tiles tiles);

}  // namespace scalemm::backends::contiguous_grouped
