// A device allocation for GPU test cases: freed on scope exit, filled from the host on request.
#pragma once

#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#define CUDA_OK(x) REQUIRE((x) == cudaSuccess)

namespace scalemm::testing {

struct Dev {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Dev(size_t n) : bytes(n) { CUDA_OK(cudaMalloc(&p, n ? n : 1)); }
  // A pageable upload may return before its DMA lands, and tests also launch on non-blocking streams
  // that do not wait for the legacy stream: finish the copy before the buffer is used.
  Dev(const void* host, size_t n) : Dev(n) {
    CUDA_OK(cudaMemcpy(p, host, n, cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize());
  }
  template <class T>
  explicit Dev(const std::vector<T>& host) : Dev(host.data(), host.size() * sizeof(T)) {}
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(p); }
};

}  // namespace scalemm::testing
