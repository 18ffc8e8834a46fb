// A backend is one object in one file: plan() decides whether it can run a problem (and if not, why)
// and lays out the scratch it needs; run() executes exactly that plan. The planner (dispatch/planner.cpp)
// walks its table in order; the Handle (dispatch/handle.cpp) owns the memory run() is given.
//
// Adding a backend: write lib/backends/<name>.cpp with a BackendImpl, add its Backend enum value
// (gemm.hpp, scalemm.h) and one line to the table in planner.cpp. docs/dispatch.md walks through it.
#pragma once

#include <cstddef>
#include <string>

#include "cublaslt/cublaslt.hpp"
#include "scalemm/gemm.hpp"

namespace scalemm::backends {

/// A backend's answer to plan(): taken (the reason says how it runs) or passed over (why not).
struct Verdict {
  bool taken = false;
  std::string reason;
  /// Passed over because the problem is not of the backend's kind at all (another recipe, device or
  /// memory): the reason then stays out of the plan's chain, and appears only when nothing runs.
  bool quiet = false;
};

/// What run() is given besides the call and its plan: the stream, the stream's cuBLASLt context and
/// workspace, and the plan's scratch (Plan::workspace_bytes long, 256-byte aligned).
struct RunContext {
  Stream stream = nullptr;
  LtContext* lt = nullptr;
  void* lt_workspace = nullptr;
  size_t lt_bytes = 0;
  char* workspace = nullptr;
  const DeviceTarget* target = nullptr;  ///< the device the plan was made for (null for host memory)

  /// The slice the plan reserved under `tag` (Plan::reserve).
  template <class T = void>
  T* slice(const Plan& plan, int tag) const {
    return reinterpret_cast<T*>(workspace + plan.workspace_slice(tag).offset);
  }
  /// Runs `call` through the stream's cuBLASLt context.
  void matmul(const LtCall& call) const { lt->matmul(call, lt_workspace, lt_bytes, stream); }
};

class BackendImpl {
 public:
  virtual ~BackendImpl() = default;
  virtual Backend id() const = 0;
  /// Host only. Fills `plan`'s backend fields, conversions and workspace slices when taken.
  virtual Verdict plan(const GemmProblem& p, const DeviceTarget& t, Plan& plan) const = 0;
  /// Host only, for a problem plan() took: why the planner's own choice passes it over anyway (a
  /// measured rule), or "" to take it. A forced backend skips this.
  virtual std::string auto_declines(const GemmProblem&, const DeviceTarget&) const { return {}; }
  /// Enqueues the GEMM on ctx.stream (device memory) or runs it synchronously (host memory, where ctx
  /// is empty). args have been validated and match the problem the plan was made for.
  virtual void run(const GemmArgs& args, const Plan& plan, const RunContext& ctx) const = 0;
};

// The backends, one file each.
const BackendImpl& native_backend();          // native.cpp
const BackendImpl& convert_native_backend();  // convert_native.cpp
const BackendImpl& emulated_backend();        // emulated.cu
const BackendImpl& reference_backend();       // reference.cpp
const BackendImpl& contiguous_backend();      // contiguous.cpp (kernel: contiguous_grouped_sm90a.cu)

/// Workspace tag of a staged FP8 output (planner.cpp); backends number their own slices from 0.
constexpr int kStagedOutputTag = 100;

}  // namespace scalemm::backends
