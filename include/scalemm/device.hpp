// What CUDA devices this process can see, without ever failing on a machine that has none.
#pragma once

#include <string>
#include <vector>

namespace scalemm {

struct DeviceInfo {
  int ordinal = -1;
  std::string name;
  int sm = 0;                ///< compute capability as major*10+minor (90 for H100/H200)
  int multiprocessors = 0;
  long long global_memory_bytes = 0;
};

struct DeviceQuery {
  std::vector<DeviceInfo> devices;
  std::string reason;        ///< why `devices` is empty ("" when it is not)
  int runtime_version = 0;   ///< cudaRuntimeGetVersion, e.g. 13000
  int driver_version = 0;    ///< cudaDriverGetVersion (0 with no driver)
  size_t cublaslt_version = 0;  ///< cublasLtGetVersion(), e.g. 130100 (library load needs no device)
};

/// Queries the CUDA runtime once per call; never throws for "no device" or "no driver".
DeviceQuery query_devices();

/// True when at least one CUDA device is usable; otherwise `reason` says why.
bool cuda_device_available(std::string* reason = nullptr);

}  // namespace scalemm
