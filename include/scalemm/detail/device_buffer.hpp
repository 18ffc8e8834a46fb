// One owning device allocation for the library's internals, its tests and its tools: cudaMalloc'd
// bytes freed on destruction, uploaded from and downloaded to the host. Failures throw through the
// library's one CUDA check (cuda_check.hpp), naming the call.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/detail/device_alloc.hpp"

namespace scalemm::detail {

struct DeviceBuffer {
  void* p = nullptr;
  size_t bytes = 0;  ///< as asked for; at least 256 bytes are allocated, so empty buffers have an address

  DeviceBuffer() = default;
  /// `bytes` uninitialised, or every byte set to `fill` (0..255) when fill >= 0.
  /// `what` names the buffer in an out-of-memory error.
  explicit DeviceBuffer(size_t n, int fill = -1, const char* what = "DeviceBuffer") {
    alloc(n, what);
    if (fill >= 0) cuda_check(cudaMemset(p, fill, std::max<size_t>(n, 1)), "DeviceBuffer: cudaMemset");
  }
  /// A copy of `n` host bytes. The upload is finished before the constructor returns: a pageable copy
  /// may return before its DMA lands, and work on non-blocking streams does not wait for it.
  DeviceBuffer(const void* host, size_t n) { upload(host, n); }
  template <class T>
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.data(), host.size() * sizeof(T)) {}

  DeviceBuffer(DeviceBuffer&& o) noexcept : p(std::exchange(o.p, nullptr)), bytes(std::exchange(o.bytes, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p, o.p);
    std::swap(bytes, o.bytes);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (p) cudaFree(p);
  }

  /// Frees what it held and allocates `n` bytes; returns the new address.
  void* alloc(size_t n, const char* what = "DeviceBuffer") {
    if (p) cudaFree(p);
    p = nullptr;
    bytes = 0;
    cuda_check(device_malloc(&p, std::max<size_t>(n, 256)), std::string(what) + ": cudaMalloc of " + std::to_string(n) +
                                                                 " bytes");
    bytes = n;
    return p;
  }
  /// alloc(n) and a copy of `n` host bytes, finished before it returns; returns the new address.
  void* upload(const void* host, size_t n) {
    alloc(n);
    if (n) cuda_check(cudaMemcpy(p, host, n, cudaMemcpyHostToDevice), "DeviceBuffer: upload");
    cuda_check(cudaDeviceSynchronize(), "DeviceBuffer: upload");
    return p;
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
  /// The first `bytes` bytes (whole T elements) back on the host (synchronous).
  template <class T = uint8_t>
  std::vector<T> download() const {
    std::vector<T> h(bytes / sizeof(T));
    if (!h.empty()) cuda_check(cudaMemcpy(h.data(), p, h.size() * sizeof(T), cudaMemcpyDeviceToHost), "DeviceBuffer: download");
    return h;
  }
};

}  // namespace scalemm::detail
