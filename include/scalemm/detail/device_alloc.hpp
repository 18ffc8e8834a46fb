// The one device allocation call of the library (its arenas, workspaces, verification and staging
// buffers, and detail::DeviceBuffer), with a test-only failure hook: out-of-memory paths are tested by
// making one chosen allocation fail, on any GPU, without filling its memory (docs/reliability.md,
// "GPU memory faults").
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace scalemm::detail {

/// cudaMalloc(p, bytes), unless the failure hook picks this allocation: then *p = nullptr and
/// cudaErrorMemoryAllocation, as a real out-of-memory would return.
cudaError_t device_malloc(void** p, size_t bytes);

/// Test only: the `nth` device allocation from now (1 = the next one) fails, once; 0 disarms. The
/// environment variable SCALEMM_TEST_FAIL_DEVICE_ALLOC=<nth> arms it at the process's first allocation.
void fail_device_allocation(int nth);

/// How many allocations the hook has made fail in this process.
int64_t failed_device_allocations();

}  // namespace scalemm::detail
