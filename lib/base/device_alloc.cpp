#include "scalemm/detail/device_alloc.hpp"

#include <atomic>
#include <cstdlib>
#include <mutex>

namespace scalemm::detail {
namespace {

std::atomic<int> countdown{0};  // > 0: allocations left until the one that fails
std::atomic<int64_t> failed{0};
std::once_flag from_environment;

}  // namespace

cudaError_t device_malloc(void** p, size_t bytes) {
  std::call_once(from_environment, [] {
    if (const char* v = std::getenv("SCALEMM_TEST_FAIL_DEVICE_ALLOC")) countdown = std::atoi(v);
  });
  int left = countdown.load();
  while (left > 0 && !countdown.compare_exchange_weak(left, left - 1)) {
  }
  if (left == 1) {
    *p = nullptr;
    ++failed;
    return cudaErrorMemoryAllocation;
  }
  return cudaMalloc(p, bytes);
}

void fail_device_allocation(int nth) {
  std::call_once(from_environment, [] {});  // an explicit arming wins over the environment
  countdown = nth > 0 ? nth : 0;
}

int64_t failed_device_allocations() { return failed.load(); }

}  // namespace scalemm::detail
