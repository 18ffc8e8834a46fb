// The host executor of the drivers (driver.hpp): the functors run through thrust::for_each with the
// Thrust CPP system (sequential, on the calling thread). The reference emulator's host calls and the
// host branch of scalemm::quantize both run it, so host bytes are the same from either.
#pragma once

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/system/cpp/execution_policy.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace scalemm::numerics::detail {

struct HostExec {
  template <class F>
  void for_each(int64_t n, F f) {
    thrust::for_each(thrust::cpp::par, thrust::counting_iterator<int64_t>(0), thrust::counting_iterator<int64_t>(n), f);
  }
  void zero(void* p, size_t bytes) {
    if (bytes) std::memset(p, 0, bytes);
  }
};

}  // namespace scalemm::numerics::detail
