// Facts and settings that belong to one GPU, not to the process: which device a stream's launches go
// to, making that device current for a call, and values computed once per device (SM counts,
// occupancies, function attributes such as a kernel's dynamic shared memory limit, which CUDA keeps
// per device: set on device 0 only, a launch on device 1 fails with cudaErrorInvalidValue).
#pragma once

#include <cuda_runtime_api.h>

#include <mutex>

#include "scalemm/detail/cuda_check.hpp"

namespace scalemm::detail {

/// The device current on this thread.
inline int current_device() {
  int d = 0;
  cuda_check(cudaGetDevice(&d), "cudaGetDevice");
  return d;
}

/// The device that launches on `stream` run on: the stream's own, or the current device for the
/// default streams (legacy, per-thread), which stand for whichever device is current. A stream that
/// is capturing a graph cannot be asked (cudaErrorStreamCaptureUnsupported, and the capture would be
/// invalidated): the current device then, as captures are made with their stream's device current.
inline int stream_device(cudaStream_t stream) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return current_device();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    (void)cudaGetLastError();
    return current_device();
  }
  if (capture != cudaStreamCaptureStatusNone) return current_device();
  int d = 0;
  cuda_check(cudaStreamGetDevice(stream, &d), "cudaStreamGetDevice (the stream's device)");
  return d;
}

/// Makes `device` current for a scope when it is not already (a stream of device 1 used while device
/// 0 is current) and restores the previous device on exit; nothing for device < 0.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (device < 0) return;
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    if (current == device) return;
    cuda_check(cudaSetDevice(device), "make device " + std::to_string(device) + " current for the call");
    previous_ = current;
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

/// One value per device, computed by `make(device)` on first use with that device current and kept
/// for the process (a device's attributes do not change). Thread-safe; a `make` that throws leaves
/// the slot empty, so the next call tries again. Ordinals past kMaxDevices are computed every time.
template <class T, int kMaxDevices = 64>
class PerDevice {
 public:
  template <class Make>
  T get(int device, Make&& make) {
    if (device < 0 || device >= kMaxDevices) return make(device);
    Slot& s = slots_[device];
    std::call_once(s.once, [&] { s.value = make(device); });
    return s.value;
  }

 private:
  struct Slot {
    std::once_flag once;
    T value{};
  };
  Slot slots_[kMaxDevices];
};

/// The SM count of `device`, asked once per device.
inline int sm_count(int device) {
  static PerDevice<int> cache;
  return cache.get(device, [](int d) {
    int n = 0;
    cuda_check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, d), "cudaDeviceGetAttribute(SM count)");
    return n > 0 ? n : 1;
  });
}

}  // namespace scalemm::detail
