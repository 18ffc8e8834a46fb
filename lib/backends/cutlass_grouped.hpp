// The CUTLASS grouped kernels: DeepSeek-style blockwise FP8 grouped GEMMs (block1x128 A with
// block128x128 or block1x128 B) and rowwise x rowwise ones in ONE launch of CUTLASS's Hopper
// pointer-array kernels (TMA, warp-specialized, problem shapes read on the device). A small set-up
// kernel turns the group sizes, from the host or from device memory, into the kernel's per-group
// shapes, pointers and scale layouts on the device, so device-side sizes never reach the host and the
// call is graph-capturable.
//
// Built only when CUTLASS's headers were found at configure time (tools/fetch-cutlass.sh) and sm_90 is
// among the architectures; otherwise built() is false (cutlass_grouped_stub.cpp). The backend object
// the handle's table holds (the choice, the staging, explain) is cutlass_grouped.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "scalemm/gemm.hpp"
#include "scalemm/grouped.hpp"

namespace scalemm::backends::cutlass_grouped {

/// Whether this library holds the kernels.
bool built();

/// Empty when these kernels run `args` on `t`; else why not (printable, one line).
std::string blocker(const GroupedGemmArgs& args, const DeviceTarget& t);

/// Device scratch the call needs (256-byte aligned pieces, one allocation).
size_t workspace_bytes(const GroupedGemmArgs& args, const DeviceTarget& t);

/// Enqueues the whole grouped GEMM on `stream`. `workspace` holds workspace_bytes(); blocker() was empty.
/// `generation` identifies the workspace's allocation (StagingScratch::generation).
void run(const GroupedGemmArgs& args, Stream stream, char* workspace, size_t bytes, uint64_t generation);

/// Rowwise fast accumulation over many rows per group (m-grouped, on average 256 or more): the kernel
/// then runs 256 x 128 tiles, else 128 x 128 ones (both in clusters of two N tiles). A host-side rule, defined
/// whether or not the kernels are built.
bool wide_fast_accum(const GroupedGemmArgs& args);

/// A one-line description of the kernel configuration for explain().
std::string describe(const GroupedGemmArgs& args);

}  // namespace scalemm::backends::cutlass_grouped
