// The emulator's device executor (its functors through thrust::cuda::par_nosync on a stream) and a
// workspace (the caller's, or stream-ordered), shared by emulation/device.cu and the production
// quantizers' fallback (quantize/api.cu). Private: nvcc only.
#pragma once

#include <cuda_runtime.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/system/cuda/execution_policy.h>

#include <cstdint>
#include <string>

#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/status.hpp"

namespace scalemm::numerics::detail {

struct DeviceExec {
  cudaStream_t stream;
  template <class F>
  void for_each(int64_t n, F f) {
    thrust::for_each(thrust::cuda::par_nosync.on(stream), thrust::counting_iterator<int64_t>(0),
                     thrust::counting_iterator<int64_t>(n), f);
    scalemm::detail::cuda_check(cudaGetLastError(), "thrust::for_each launch");
  }
  void zero(void* p, size_t bytes) {
    if (bytes) scalemm::detail::cuda_check(cudaMemsetAsync(p, 0, bytes, stream), "cudaMemsetAsync");
  }
};

inline size_t round256(size_t b) { return (b + 255) / 256 * 256; }


/// Workspace from the caller, or a stream-ordered allocation released when this object dies.
class Workspace {
 public:
  Workspace(void* given, size_t given_bytes, size_t need, cudaStream_t s) : stream_(s) {
    if (need == 0) return;
    if (given) {
      if (given_bytes < need)
        throw Error(StatusCode::kInvalidArgument, "emulation: workspace of " + std::to_string(given_bytes) +
                                                      " bytes is smaller than the " + std::to_string(need) +
                                                      " bytes needed");
      ptr_ = given;
    } else {
      scalemm::detail::cuda_check(cudaMallocAsync(&ptr_, need, s), "cudaMallocAsync(workspace)");
      owned_ = true;
    }
  }
  ~Workspace() {
    if (owned_) cudaFreeAsync(ptr_, stream_);
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
  bool owned_ = false;
  cudaStream_t stream_;
};

}  // namespace scalemm::numerics::detail
