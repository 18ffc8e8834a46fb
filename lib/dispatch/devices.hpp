// Several GPUs in one process: which device a call runs on, the plan cache's key, the named error for
// a pointer on another device, and a simulated machine that host tests install in a Handle.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "scalemm/detail/device_state.hpp"
#include "scalemm/gemm.hpp"

namespace scalemm::dispatch {

/// The target of device `ordinal` in `table` (the process's devices, or a simulated set); the no-GPU
/// target when the table is empty. Throws Error(kInvalidArgument) for an ordinal not in the table.
const DeviceTarget& target_in(const std::vector<DeviceTarget>& table, int ordinal);

/// The streams that stand for the current device's default stream: nullptr (legacy),
/// cudaStreamLegacy and cudaStreamPerThread. A call on one of them runs on the current device.
bool is_default_stream(Stream s);

/// The plan cache's key: the problem and the device it is planned for (-1 without a GPU).
struct PlanKey {
  GemmProblem problem;
  int device = -1;
  bool operator==(const PlanKey& o) const { return device == o.device && problem == o.problem; }
};
struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const;
};

/// What a pointer query (cudaPointerGetAttributes) says about one address.
struct PointerInfo {
  enum Kind {
    kUnknown,    ///< the query failed: the pointer stays unchecked
    kPageable,   ///< host memory the device cannot read
    kDevice,     ///< device memory of `device`
    kAnyDevice,  ///< managed or pinned host memory: readable from every device
  };
  Kind kind = kUnknown;
  int device = -1;
};

/// The named error (`pointer-device`) for device memory of `pointer_device` passed to a call on
/// `call_device`: it names the argument, both devices and the fix.
Diagnostic pointer_device_mismatch(const char* argument, int pointer_device, int call_device);

/// A simulated machine for host tests: its devices, the current one, each stream's device and each
/// pointer's memory. Installed in a Handle, it answers every device question the handle asks before
/// anything runs, so planning, the plan cache and the pointer checks can be tested with several
/// devices on a machine with none. Nothing runs on it: a device call that passes the checks is
/// refused (kUnsupported, "simulated machine") before its first CUDA call, with or without a GPU.
struct SimulatedDevices {
  std::vector<DeviceTarget> devices;              ///< DeviceTarget::simulated(sm, cublas, ordinal)
  int current = 0;                                ///< the calling thread's current device
  std::function<int(Stream)> stream_device;       ///< a non-default stream's device
  std::function<PointerInfo(const void*)> pointer;  ///< cudaPointerGetAttributes
  std::function<bool(Stream)> capturing;          ///< cudaStreamIsCapturing (empty: never capturing)
};
void simulate_devices(Handle& handle, SimulatedDevices sim);

/// Makes `device` current for the scope of a call when it is not already (a stream of device 1 used
/// while device 0 is current), and restores the previous device; nothing for device < 0.
using DeviceScope = scalemm::detail::DeviceScope;

}  // namespace scalemm::dispatch
