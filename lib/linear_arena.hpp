// The buffers of the linear layers (linear.cpp, grouped_linear.cpp): one allocation, device memory or
// host memory, carved into 256-byte aligned pieces; with `clear`, zeroed once, so that the bytes
// between two pieces (the padding between groups' scale buffers) are defined.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/status.hpp"
#include "scalemm/types.hpp"

namespace scalemm::detail {

constexpr size_t kLinearAlign = 256;
inline size_t linear_aligned(size_t b) { return (b + kLinearAlign - 1) / kLinearAlign * kLinearAlign; }

class LinearArena {
 public:
  /// `owner` names the layer in an overflow error ("ScaledLinear").
  LinearArena(const char* owner, MemorySpace space, bool clear) : owner_(owner), space_(space), clear_(clear) {}
  ~LinearArena() { release(); }
  LinearArena(const LinearArena&) = delete;
  LinearArena& operator=(const LinearArena&) = delete;

  void allocate(size_t bytes) {
    release();
    const size_t n = std::max<size_t>(bytes, 1);
    if (space_ == MemorySpace::kDevice) {
      cuda_check(cudaMalloc(&base_, n), "cudaMalloc");
      if (clear_) cuda_check(cudaMemset(base_, 0, n), "cudaMemset");
    } else {
      host_.assign(n + kLinearAlign, 0);
      const auto p = reinterpret_cast<uintptr_t>(host_.data());
      base_ = host_.data() + (linear_aligned(p) - p);
    }
    bytes_ = bytes;
    used_ = 0;
  }
  void release() {
    if (base_ && space_ == MemorySpace::kDevice) cudaFree(base_);
    host_.clear();
    host_.shrink_to_fit();
    base_ = nullptr;
    bytes_ = used_ = 0;
  }
  char* take(size_t bytes) {
    char* p = static_cast<char*>(base_) + used_;
    used_ += linear_aligned(bytes);
    if (used_ > bytes_) throw Error(StatusCode::kInternal, std::string(owner_) + ": arena overflow");
    return p;
  }
  bool empty() const { return base_ == nullptr; }

 private:
  const char* owner_;
  MemorySpace space_;
  bool clear_;
  std::vector<uint8_t> host_;
  void* base_ = nullptr;
  size_t bytes_ = 0, used_ = 0;
};

}  // namespace scalemm::detail
