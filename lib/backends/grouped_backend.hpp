// A grouped backend is one object in one file, as a dense one is (backend.hpp): plan() answers with the
// dense backends' Verdict whether it can run a call (and if not, why), run() runs it with what the
// handle lends it, explain() says how. The grouped planner (dispatch/grouped_planner.cpp) walks
// kGroupedTable in order and takes the first backend that takes the call.
//
// A grouped backend never reaches into the handle: the dense path, staging memory and forked streams
// it needs come through GroupedServices, which the handle implements.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends/backend.hpp"
#include "scalemm/gemm.hpp"
#include "scalemm/grouped.hpp"

namespace scalemm::backends {

/// Staging memory of one stream: `ptr` holds at least the bytes asked for until `lock` is released
/// (one grouped call at a time per stream stages into it). `generation` changes whenever the buffer is
/// (re)allocated, in any handle: a cache keyed by the address alone could not tell a new buffer from
/// a freed one that cudaMalloc handed out again.
struct StagingScratch {
  std::unique_lock<std::mutex> lock;
  char* ptr = nullptr;
  uint64_t generation = 0;
};

/// Streams forked from a caller stream, each with its own workspace. They exist (and their resources
/// can be allocated) from the start, but wait for the caller only from begin() on, so that a call can
/// allocate everything it needs before it enqueues anything; once begun, they are joined back to the
/// caller when this is destroyed, on every path (a capture left with unjoined streams cannot end).
/// `streams` is empty where there is nothing to fork: the caller then runs on its own stream.
class ForkedStreams {
 public:
  virtual ~ForkedStreams() = default;
  /// Each stream waits for the work enqueued on the caller so far (an event: captured like a launch).
  virtual void begin() = 0;
  std::vector<Stream> streams;
};

/// What the handle lends a grouped backend for one call.
class GroupedServices {
 public:
  /// The plan a dense call on `stream` gets (the handle's cache: planned once per distinct problem).
  virtual const Plan& dense_plan(const GemmArgs& args, Stream stream) = 0;
  /// Runs one dense call of `plan` (dense_plan() of `args`'s problem) as Handle::gemm runs a planned
  /// call: the stream's workspace and cuBLASLt context, then verification. `args` is not validated
  /// again: the grouped call's validation has checked every group (grouped_handle.cpp).
  virtual void run_dense(const GemmArgs& args, const Plan& plan, Stream stream) = 0;
  /// The staging memory of `stream`, grown to `bytes` (growing synchronises the stream first).
  virtual StagingScratch staging(Stream stream, size_t bytes) = 0;
  /// Up to `count` non-blocking streams of the caller's device, which wait for the work enqueued on
  /// `caller` once begun (ForkedStreams::begin; events, so a graph capture holds the fork and the join).
  virtual std::unique_ptr<ForkedStreams> fork(Stream caller, int count) = 0;
  /// Allocates what a dense call of `workspace_bytes` on `stream` uses (the stream's cuBLASLt
  /// workspace, the plans' scratch grown to `workspace_bytes`, verification's buffers), so that a
  /// grouped call fails out of memory before its first launch rather than after some groups ran.
  virtual void reserve_dense(Stream stream, size_t workspace_bytes) = 0;

 protected:
  ~GroupedServices() = default;
};

/// What run() is given besides the call: its stream, the device target it was chosen for, and the
/// handle's services.
struct GroupedRunContext {
  Stream stream = nullptr;
  const DeviceTarget* target = nullptr;
  GroupedServices* services = nullptr;
};

class GroupedBackendImpl {
 public:
  virtual ~GroupedBackendImpl() = default;
  virtual GroupedBackend id() const = 0;
  /// Host only, before validation reads any buffer: taken when this backend runs `args` on `t`, else
  /// passed over with why (printable, one line). `options.force` is the handle's forced dense backend;
  /// a call that leaves the choice to the library (GroupedBackend::kAuto) may be passed over where a
  /// measurement says another backend is faster. Reads the call's shape, recipes, formats and host
  /// sizes, never its buffers.
  virtual Verdict plan(const GroupedGemmArgs& args, const DeviceTarget& t, const PlanOptions& options) const = 0;
  /// True when the backend runs the whole call in one launch: the handle then verifies its groups
  /// against the reference itself (no dense call did) and graph_replay has nothing to add. False when
  /// it runs the groups as dense calls, which need the sizes on the host.
  virtual bool one_launch() const = 0;
  /// Enqueues the call on ctx.stream (host arrays: runs it). args are validated: whole tensors for a
  /// one-launch backend (its blocker asks for what per-group validation checks), every group otherwise.
  virtual void run(const GroupedGemmArgs& args, const GroupedRunContext& ctx) const = 0;
  /// How it runs `args` (`passed_over`: why the backends before it in the table did not take it).
  virtual std::string explain(Handle& h, const GroupedGemmArgs& args, const std::string& passed_over) const = 0;
};

// The grouped backends, one file each.
const GroupedBackendImpl& cutlass_grouped_backend();     // cutlass_grouped.cpp (kernels: cutlass_grouped_sm90a.cu)
const GroupedBackendImpl& contiguous_grouped_backend();  // contiguous_grouped.cpp (kernel: contiguous_grouped_sm90a.cu)
const GroupedBackendImpl& per_group_backend();        // per_group.cpp

}  // namespace scalemm::backends
