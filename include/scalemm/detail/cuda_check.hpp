// The library's one CUDA runtime error check (cuBLASLt statuses go through the same
// detail::throw_api_error in cublaslt/cublaslt.cpp, the only file that sees cublasLt.h).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "scalemm/status.hpp"

namespace scalemm::detail {

/// Throws Error for a failed CUDA call: kOutOfMemory for allocation failures, kCudaError otherwise,
/// with the message "<what>: cudaErrorX (description)". A non-sticky error is cleared first, so the
/// next CUDA call is not blamed for this one.
inline void cuda_check(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();
  throw_api_error(e == cudaErrorMemoryAllocation ? StatusCode::kOutOfMemory : StatusCode::kCudaError, what,
                  cudaGetErrorName(e), cudaGetErrorString(e));
}

/// cuda_check of the last launch on this thread (a kernel's configuration error).
inline void launch_check(const std::string& what) { cuda_check(cudaGetLastError(), what); }

}  // namespace scalemm::detail

/// cuda_check of one CUDA runtime call, named by its own text: the one check of tests and tools.
#define SCALEMM_CUDA_CHECK(call) ::scalemm::detail::cuda_check((call), #call)
