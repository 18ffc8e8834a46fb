// The grouped planner, beside the dense one (planner.cpp): which grouped backend runs a call. It walks
// kGroupedTable in order, as the dense planner walks kTable, and takes the first backend whose plan()
// takes the call; the reasons of those before it make the plan's chain. Host only: a plan reads the
// call's shape, recipes, formats and host sizes, never its buffers, so the handle keeps one per
// distinct call (GroupedPlanCache).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "backends/grouped_backend.hpp"
#include "scalemm/gemm.hpp"
#include "scalemm/grouped.hpp"

namespace scalemm::dispatch {

struct GroupedPlan {
  /// The backend that runs the call; null when the call asks for a backend that cannot run it.
  const backends::GroupedBackendImpl* backend = nullptr;
  /// Why the backends before it passed the call over ("<name> passed over: why; ..."), or, when the
  /// call asks for a backend that cannot run it, why that one cannot.
  std::string passed_over;
  /// The taken backend's own reason (its Verdict).
  std::string reason;
  bool one_launch() const { return backend && backend->one_launch(); }
};

/// "CUTLASS grouped kernel", "contiguous grouped kernel", "per-group backend".
const char* display_name(GroupedBackend b);

/// The plan for `a` on `t` under the handle's `options`.
GroupedPlan plan_grouped(const GroupedGemmArgs& a, const DeviceTarget& t, const PlanOptions& options);

/// Throws Error(kUnsupported) when `plan` has no backend (the call asks for one that cannot run it).
void throw_if_unplanned(const GroupedPlan& plan, const GroupedGemmArgs& a);

/// A handle's grouped plans, one per distinct call as plan() reads it (bounded: cleared when full).
class GroupedPlanCache {
 public:
  std::shared_ptr<const GroupedPlan> get(const GroupedGemmArgs& a, const DeviceTarget& t, const PlanOptions& options);
  void clear();

 private:
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const GroupedPlan>> plans_;
};

}  // namespace scalemm::dispatch
