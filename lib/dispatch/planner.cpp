// The backend table: plan() walks it in order, each entry taken or passed over with its reason;
// execute() runs the chosen entry. A staged FP8 output (every backend but cuBLASLt's own FP8
// epilogue) is planned and run here, around the backend, since it is the same for all of them.
#include <algorithm>
#include <sstream>

#include "backends/backend.hpp"
#include "dispatch/planner.hpp"
#include "base/epilogue.hpp"
#include "scalemm/gemm.hpp"

namespace scalemm {

namespace {

constexpr const char* kArrow = " \xE2\x86\x92 ";  // " → "

// The backend table, tried in order: the first that takes a problem runs it. The order is not the
// enum's: scalemm's own kernel goes first, where its measured rule takes the call.
const backends::BackendImpl* const* table() {
  static const backends::BackendImpl* const kTable[] = {
      &backends::contiguous_backend(),
      &backends::native_backend(),
      &backends::convert_native_backend(),
      &backends::emulated_backend(),
      &backends::reference_backend(),
  };
  static_assert(sizeof(kTable) / sizeof(kTable[0]) == kBackendCount, "one table entry per Backend value");
  return kTable;
}

const backends::BackendImpl& entry_of(Backend id) {
  for (int i = 0; i < kBackendCount; ++i)
    if (table()[i]->id() == id) return *table()[i];
  throw Error(StatusCode::kInternal, "no backend table entry for backend " + std::to_string(int(id)));
}

}  // namespace

std::string_view to_string(Backend b) {
  switch (b) {
    case Backend::kNative: return "native";
    case Backend::kConvertNative: return "convert-native";
    case Backend::kEmulated: return "emulated";
    case Backend::kReference: return "reference";
    case Backend::kContiguous: return "contiguous";
  }
  return "unknown";
}

std::optional<Backend> parse_backend(std::string_view s) {
  for (int i = 0; i < kBackendCount; ++i)
    if (to_string(Backend(i)) == s) return Backend(i);
  return std::nullopt;
}

std::string Plan::explain() const {
  std::ostringstream os;
  for (size_t i = 0; i < reasons.size(); ++i) os << (i ? kArrow : "") << reasons[i];
  for (const auto& c : conversions) os << "\n  convert " << c.what << " (" << c.output_bytes << " B)";
  if (workspace_bytes) os << "\n  workspace " << workspace_bytes << " B";
  if (!target.empty()) os << "\n  planned for " << target;
  return os.str();
}

Plan plan(const GemmProblem& p, const DeviceTarget& t, const PlanOptions& options) {
  Plan result;
  std::vector<std::string> passed, tried;  // the plan's chain; every reason, for the error
  const bool fp8_out = is_fp8_output(p.d_dtype);
  for (int i = 0; i < kBackendCount; ++i) {
    const backends::BackendImpl& entry = *table()[i];
    const Backend id = entry.id();
    if (options.force && *options.force != id) continue;
    Plan attempt;
    // FP8 output beyond the native path: the backend writes an fp32 D, one pass quantizes it.
    // The native entry first tries cuBLASLt's own FP8 epilogue (tensorwise pairs only).
    GemmProblem q = p;
    bool staged = fp8_out && id != Backend::kNative;
    if (staged) q.d_dtype = DType::kF32, q.has_amax = false;
    backends::Verdict c = entry.plan(q, t, attempt);
    if (!c.taken && fp8_out && id == Backend::kNative) {
      q.d_dtype = DType::kF32, q.has_amax = false;
      Plan retry;
      backends::Verdict f32 = entry.plan(q, t, retry);
      if (f32.taken) {
        attempt = std::move(retry);
        f32.reason = c.reason + "; " + f32.reason;
        c = std::move(f32);
        staged = true;
      }
    }
    if (c.taken && staged) {
      attempt.staged_output_bytes = static_cast<size_t>(p.m * p.n) * 4;
      attempt.reserve(backends::kStagedOutputTag, attempt.staged_output_bytes);
      attempt.conversions.push_back({"d: f32 -> " + std::string(to_string(p.d_dtype)) + " with d_scale" +
                                         (p.has_amax ? " and amax" : "") + " (one pass)",
                                     p.m * p.n});
      c.reason += "; fp32 D, then " + std::string(to_string(p.d_dtype)) + " with d_scale";
    }
    if (c.taken && !options.force) {
      // The planner's own choice: a backend that can run the call may still be measured slower.
      std::string declined = entry.auto_declines(q, t);
      if (!declined.empty()) c = {false, std::move(declined)};
    }
    // Strict mode runs cuBLASLt's native kernels; scalemm's kernel steps aside for them.
    if (c.taken && options.strict && id == Backend::kContiguous) c = {false, "strict mode takes only the native backend"};
    if (c.taken && options.strict && id != Backend::kNative) {
      passed.push_back("strict mode refuses " + std::string(to_string(id)));
      tried.push_back(passed.back());
      break;
    }
    if (!c.taken) {
      tried.push_back(std::string(to_string(id)) + ": " + c.reason);
      if (!c.quiet) passed.push_back(tried.back());
      continue;
    }
    // Fast accumulation is a permission: the cuBLASLt backends take it (lt_call), the others do not.
    if (p.fast_accum)
      c.reason += id == Backend::kNative || id == Backend::kConvertNative
                      ? "; with fast accumulation"
                      : "; accumulates exactly (fast_accum applies to cuBLASLt's FP8 kernels only)";
    result = std::move(attempt);
    result.backend = id;
    result.target = t.describe();
    result.reasons = {p.to_string()};
    for (auto& r : passed) result.reasons.push_back(std::move(r));
    result.reasons.push_back(c.reason);
    return result;
  }
  std::ostringstream os;
  os << "no backend can run " << p.to_string() << " on " << t.to_string();
  if (options.strict) os << " in strict mode";
  if (options.force) os << " with backend forced to " << to_string(*options.force);
  for (const auto& r : tried) os << kArrow << r;
  throw Error(StatusCode::kUnsupported, os.str());
}

size_t Plan::reserve(int tag, size_t bytes) {
  const size_t offset = workspace_bytes;
  workspace.push_back({tag, offset, bytes});
  workspace_bytes += (bytes + 255) / 256 * 256;
  return offset;
}

const Plan::WorkspaceSlice& Plan::workspace_slice(int tag) const {
  for (const auto& w : workspace)
    if (w.tag == tag) return w;
  throw Error(StatusCode::kInternal, "plan for backend " + std::string(to_string(backend)) +
                                         " has no workspace slice " + std::to_string(tag));
}

namespace dispatch {

void execute(const GemmArgs& args, const Plan& plan, const backends::RunContext& ctx) {
  const backends::BackendImpl& backend = entry_of(plan.backend);
  if (!plan.staged_output_bytes || args.space == MemorySpace::kHost) {
    backend.run(args, plan, ctx);
    return;
  }
  GemmArgs staged = args;
  staged.d = ctx.slice(plan, backends::kStagedOutputTag);
  staged.d_dtype = DType::kF32;
  staged.d_scale = nullptr;
  staged.d_amax = nullptr;
  backend.run(staged, plan, ctx);
  base::finish_fp8_output(static_cast<const float*>(staged.d), args.d, args.d_dtype, args.m * args.n, args.d_scale,
                    args.d_amax, ctx.stream);
}

}  // namespace dispatch

}  // namespace scalemm
