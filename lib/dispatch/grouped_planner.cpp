// The grouped planner (grouped_planner.hpp): the table of grouped backends and the walk over it.
#include "dispatch/grouped_planner.hpp"

#include <cstdint>

namespace scalemm::dispatch {
namespace {

// The grouped backends in the order the planner tries them (grouped_backend.hpp): the first that
// takes the call runs it. The per-group backend takes every call that validates.
const backends::GroupedBackendImpl* const kGroupedTable[] = {
    &backends::contiguous_grouped_backend(),
    &backends::cutlass_grouped_backend(),
    &backends::per_group_backend(),
};

// Everything a backend's plan() reads (grouped_backend.hpp): the shape, recipes and formats, the
// handle's options, the device, and the host sizes of a k-grouped call (the CUTLASS kernel's rowwise
// check reads each K_g; an m-grouped plan reads only M and G).
std::string key_of(const GroupedGemmArgs& a, const DeviceTarget& t, const PlanOptions& o) {
  std::string k;
  auto put = [&k](const auto& v) { k.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(a.group_dim), put(a.groups), put(a.m), put(a.n), put(a.k), put(a.d_dtype), put(a.space), put(a.backend);
  put(a.fast_accum), put(a.group_sizes_int64);
  put(a.group_sizes_device != nullptr), put(a.group_sizes != nullptr);
  for (const GemmOperand* op : {&a.a, &a.b}) put(op->dtype), put(op->recipe), put(op->scale_format);
  put(t.ordinal), put(t.sm), put(t.multiprocessors), put(o.strict), put(o.force.has_value());
  if (o.force) put(*o.force);
  if (a.group_dim == GroupDim::kK && a.group_sizes && !a.group_sizes_device)
    k.append(reinterpret_cast<const char*>(a.group_sizes), size_t(a.groups) * sizeof(int64_t));
  return k;
}

}  // namespace

const char* display_name(GroupedBackend b) {
  return b == GroupedBackend::kCutlass      ? "CUTLASS grouped kernel"
         : b == GroupedBackend::kContiguous ? "contiguous grouped kernel"
                                            : "per-group backend";
}

GroupedPlan plan_grouped(const GroupedGemmArgs& a, const DeviceTarget& t, const PlanOptions& options) {
  GroupedPlan p;
  for (const backends::GroupedBackendImpl* b : kGroupedTable) {
    const backends::Verdict v = a.backend != GroupedBackend::kAuto && a.backend != b->id()
                                    ? backends::Verdict{false, "the call asks for the " + std::string(display_name(a.backend))}
                                    : b->plan(a, t, options);
    if (v.taken) {
      p.backend = b;
      p.reason = v.reason;
      return p;
    }
    if (a.backend == b->id()) {
      p.passed_over = v.reason;
      return p;
    }
    p.passed_over += (p.passed_over.empty() ? "" : "; ") + std::string(display_name(b->id())) + " passed over: " + v.reason;
  }
  return p;
}

void throw_if_unplanned(const GroupedPlan& plan, const GroupedGemmArgs& a) {
  if (!plan.backend)
    throw Error(StatusCode::kUnsupported, "backend: the " + std::string(display_name(a.backend)) +
                                              " cannot run this call: " + plan.passed_over +
                                              ". Fix: pass GroupedBackend::kAuto or kPerGroup.");
}

std::shared_ptr<const GroupedPlan> GroupedPlanCache::get(const GroupedGemmArgs& a, const DeviceTarget& t,
                                                         const PlanOptions& options) {
  std::string key = key_of(a, t, options);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
  }
  auto made = std::make_shared<const GroupedPlan>(plan_grouped(a, t, options));
  std::lock_guard<std::mutex> lock(mu_);
  if (plans_.size() >= 1024) plans_.clear();  // bounded: k-grouped sizes vary from step to step
  return plans_.emplace(std::move(key), std::move(made)).first->second;
}

void GroupedPlanCache::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  plans_.clear();
}

}  // namespace scalemm::dispatch
