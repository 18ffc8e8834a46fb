#include "support/test_support.hpp"

#include <chrono>
#include <cstdlib>

#include "scalemm/device.hpp"

namespace scalemm::testing {

uint32_t seed() {
  static const uint32_t value = [] {
    if (const char* s = std::getenv("SCALEMM_TEST_SEED")) return static_cast<uint32_t>(std::strtoul(s, nullptr, 0));
    return static_cast<uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count() & 0xFFFFFFFFu);
  }();
  return value;
}

bool gpu_available(std::string* reason) {
  static std::string why;
  static const bool ok = scalemm::cuda_device_available(&why);
  if (reason) *reason = why;
  return ok;
}

int gpu_count() {
  static const int n = int(scalemm::query_devices().devices.size());
  return n;
}

std::string gpu_name() {
  auto q = scalemm::query_devices();
  if (q.devices.empty()) return "none";
  const auto& d = q.devices.front();
  return d.name + " (sm_" + std::to_string(d.sm) + ", " + std::to_string(d.multiprocessors) + " SMs)";
}

}  // namespace scalemm::testing
