// Notes for compute-sanitizer about writes it cannot see.
#pragma once

#include <cstddef>

#include "scalemm/types.hpp"

namespace scalemm::backends {

/// Tells compute-sanitizer's initcheck that `bytes` at `ptr` were written by the work just enqueued on
/// `stream`. cuBLASLt's and CUTLASS's Hopper kernels store D through the tensor memory accelerator,
/// whose writes initcheck does not track: without the note, every later read of D (a copy, the FP8
/// finishing kernel, the caller's own kernels) is reported as a read of uninitialized memory. Costs a
/// pointer test when no tool is attached (NVTX, header-only).
void mark_initialized(const void* ptr, size_t bytes, Stream stream);

}  // namespace scalemm::backends
