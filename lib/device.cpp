#include "scalemm/device.hpp"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

namespace scalemm {

DeviceQuery query_devices() {
  DeviceQuery q;
  cudaRuntimeGetVersion(&q.runtime_version);
  q.cublaslt_version = cublasLtGetVersion();
  if (cudaDriverGetVersion(&q.driver_version) != cudaSuccess) q.driver_version = 0;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // Without a driver the runtime reports cudaErrorInsufficientDriver, which reads like an outdated
    // driver; on a machine with no GPU it is simply the absence of one.
    if (err == cudaErrorInsufficientDriver && q.driver_version == 0)
      q.reason = "no CUDA device (no driver loaded)";
    else if (err == cudaErrorNoDevice)
      q.reason = "no CUDA device (the driver reports none)";
    else
      q.reason = std::string("no usable CUDA device (cudaGetDeviceCount: ") + cudaGetErrorName(err) + ": " +
                 cudaGetErrorString(err) + ")";
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return q;
  }
  if (count == 0) {
    q.reason = "no CUDA device (the driver reports none)";
    return q;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    DeviceInfo d;
    d.ordinal = i;
    d.name = p.name;
    d.sm = p.major * 10 + p.minor;
    d.multiprocessors = p.multiProcessorCount;
    d.global_memory_bytes = static_cast<long long>(p.totalGlobalMem);
    q.devices.push_back(d);
  }
  if (q.devices.empty()) q.reason = "no usable CUDA device (none answered cudaGetDeviceProperties)";
  return q;
}

bool cuda_device_available(std::string* reason) {
  DeviceQuery q = query_devices();
  if (reason) *reason = q.reason;
  return !q.devices.empty();
}

}  // namespace scalemm
