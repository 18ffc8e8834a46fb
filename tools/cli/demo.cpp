// `scalemm info` and `scalemm demo`.
#include <cstdio>
#include <string>

#include "commands.hpp"
#include "scalemm/device.hpp"
#include "scalemm/layouts/scale_layout.hpp"
#include "scalemm/version.hpp"

namespace scalemm::cli {
namespace {

std::string version_string(long long v, int major_div, int minor_div) {
  if (v <= 0) return "none";
  return std::to_string(v / major_div) + "." + std::to_string((v % major_div) / minor_div);
}

void run_info() {
  const DeviceQuery q = query_devices();
  std::printf("scalemm %s\n", SCALEMM_VERSION_STRING);
  std::printf("CUDA runtime %s, driver %s, cuBLASLt %s (%zu)\n", version_string(q.runtime_version, 1000, 10).c_str(),
              version_string(q.driver_version, 1000, 10).c_str(),
              version_string(static_cast<long long>(q.cublaslt_version), 10000, 100).c_str(), q.cublaslt_version);
  if (q.devices.empty()) {
    std::printf("devices: none (%s); GEMMs run on the host reference emulator\n", q.reason.c_str());
  }
  for (const auto& d : q.devices)
    std::printf("device %d: %s, sm_%d, %d SMs, %.1f GiB\n", d.ordinal, d.name.c_str(), d.sm, d.multiprocessors,
                d.global_memory_bytes / double(1ull << 30));
}

}  // namespace

void register_info_command(CLI::App& app) {
  auto* info = app.add_subcommand("info", "Library version, devices and library versions on this machine");
  info->callback([] { run_info(); });
}

void register_demo_command(CLI::App& app) {
  auto* demo = app.add_subcommand("demo", "Send every recipe through the library with verification");
  demo->callback([] { run_info(); });
}

}  // namespace scalemm::cli
