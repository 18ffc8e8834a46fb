// Grouped GEMMs (grouped.hpp) at the handle, beside the dense Handle::gemm: validation, the choice of
// grouped backend (kGroupedTable, as the dense planner walks kTable), device-side sizes, verification
// and whole-call graphs. The backends themselves are objects in lib/backends (grouped_backend.hpp):
//  * the contiguous grouped kernel (backends/contiguous_grouped.cpp) runs m-grouped blockwise FP8 into
//    bf16 on sm_90a in one launch; `auto` takes it wherever it can run;
//  * the CUTLASS grouped kernels (backends/cutlass_grouped.cpp) run blockwise and rowwise FP8 on sm_90
//    in one launch, with host or device-side sizes; `auto` takes them for the rest they can run,
//    except large groups with host sizes, measured faster per group;
//  * otherwise the per-group backend (backends/per_group.cpp) runs one dense call per non-empty group.
//    It needs the sizes on the host: device-side sizes are copied over first (one synchronisation,
//    refused during a capture).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "backends/grouped_backend.hpp"
#include "backends/per_group.hpp"
#include "base/capabilities.hpp"
#include "dispatch/devices.hpp"
#include "dispatch/grouped_planner.hpp"
#include "dispatch/handle_scratch.hpp"
#include "dispatch/verify.hpp"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/grouped.hpp"
#include "scalemm/layouts/scale_layout.hpp"

namespace scalemm {
namespace {

void add(Diagnostics& out, std::string arg, std::string rule, std::string msg, std::string expected, std::string actual,
         std::string fix) {
  out.push_back({std::move(arg), std::move(rule), std::move(msg), std::move(expected), std::move(actual), std::move(fix)});
}

}  // namespace

namespace {
// How far validate_grouped() goes: the arguments and sizes only (validate_sizes); the operands as whole
// tensors (A's (m, K), B's first expert: enough for the CUTLASS grouped kernel, whose blocker demands
// per-row compact A scales and 16-byte rows, and far cheaper for large G); or group by group as each
// group's dense call will see them (validate).
enum class Depth { kSizes, kWhole, kPerGroup };

Diagnostics validate_grouped(const GroupedGemmArgs& a, Depth depth) {
  Diagnostics out;
  const bool mg = a.group_dim == GroupDim::kM;
  if (a.group_dim != GroupDim::kM && a.group_dim != GroupDim::kK)
    add(out, "group_dim", "group-dim", "the grouped dimension must be m or k", "m or k",
        std::to_string(int(a.group_dim)), "");
  if (a.backend != GroupedBackend::kAuto && a.backend != GroupedBackend::kCutlass &&
      a.backend != GroupedBackend::kPerGroup && a.backend != GroupedBackend::kContiguous)
    add(out, "backend", "grouped-backend", "unknown grouped backend", "auto, cutlass, contiguous or per-group",
        std::to_string(int(a.backend)), "");
  if (a.groups < 1)
    add(out, "groups", "group-count", "a grouped GEMM needs at least one group", ">= 1", std::to_string(a.groups),
        "Pass G = the number of experts (group_sizes has G entries).");
  const bool dev_sizes = a.group_sizes_device != nullptr;
  if (!a.group_sizes && !dev_sizes && a.groups >= 1)
    add(out, "group_sizes", "null-pointer", "group sizes are null",
        "G sizes in host memory (group_sizes) or in device memory (group_sizes_device)", "nullptr", "");
  if (a.group_sizes && dev_sizes)
    add(out, "group_sizes_device", "group-sizes-twice", "group sizes are given twice", "group_sizes or group_sizes_device",
        "both", "Pass the sizes in one place: leave group_sizes null when they live on the device.");
  if (dev_sizes && a.space == MemorySpace::kHost)
    add(out, "group_sizes_device", "group-sizes-space", "a host-memory call takes its group sizes from the host",
        "group_sizes (host)", "group_sizes_device", "Pass the sizes in group_sizes.");
  if (dev_sizes && a.group_dim == GroupDim::kM &&
      !(a.a.scale_format == ScaleFormat::kCompact &&
        (a.a.recipe == Recipe::kRowwise || a.a.recipe == Recipe::kBlock1x128 || a.a.recipe == Recipe::kMxfp8 ||
         a.a.recipe == Recipe::kNvfp4)))
    add(out, "scale_a", "group-sizes-device-scales",
        "with device-side group sizes, A's scales must not depend on the sizes: a per-row recipe in compact format",
        "rowwise, block1x128, mxfp8 or nvfp4, compact",
        std::string(to_string(a.a.recipe)) + ", " + std::string(to_string(a.a.scale_format)),
        "Pass the sizes on the host (group_sizes), or quantize A per row.");
  if (a.n < 1) add(out, "n", "positive-extent", "N must be at least 1", ">= 1", std::to_string(a.n), "");
  if (mg ? a.k < 1 : a.m < 1)
    add(out, mg ? "k" : "m", "positive-extent", std::string(mg ? "K" : "M") + " must be at least 1", ">= 1",
        std::to_string(mg ? a.k : a.m), "");
  if (auto d = base::fast_accum_refusal(a.fast_accum, a.a.recipe, a.b.recipe)) out.push_back(std::move(*d));
  if (a.d_dtype != DType::kBF16 && a.d_dtype != DType::kF16 && a.d_dtype != DType::kF32)
    add(out, "d_dtype", "grouped-out-dtype", "grouped output must be bf16, f16 or f32", "bf16, f16 or f32",
        std::string(to_string(a.d_dtype)), "");
  if (!out.empty() || (dev_sizes && depth == Depth::kSizes)) return out;
  const bool whole = dev_sizes || (depth == Depth::kWhole && a.group_dim == GroupDim::kM);
  if (whole && !dev_sizes) {  // the sizes first, as below
    int64_t sum = 0;
    for (int64_t g = 0; g < a.groups; ++g) {
      if (a.group_sizes[g] < 0) {
        add(out, "group_sizes[" + std::to_string(g) + "]", "group-size-negative", "a group size cannot be negative",
            ">= 0", std::to_string(a.group_sizes[g]), "");
        return out;
      }
      sum += a.group_sizes[g];
    }
    if (sum != a.m) {
      add(out, "group_sizes", "group-size-sum", "the group sizes must add up to M (the rows of A and D)",
          std::to_string(a.m), std::to_string(sum) + " over " + std::to_string(a.groups) + " groups",
          "Pass m = the sum of the group sizes (padding rows belong to a group).");
      return out;
    }
  }
  if (whole) {  // the sizes are checked on the device, or above; the operands as the whole tensors they are
    GemmArgs c;
    c.m = a.group_dim == GroupDim::kM ? std::max<int64_t>(a.m, 1) : a.m;
    c.n = a.n, c.k = a.k;
    c.a = a.a, c.b = a.b, c.d = a.d, c.d_dtype = a.d_dtype, c.alpha = a.alpha, c.space = a.space;
    for (auto x : validate(c)) out.push_back(std::move(x));
    return out;
  }

  int64_t sum = 0;
  const int64_t gran = mg ? 1 : std::max(backends::per_group::k_granularity(a.a.recipe), backends::per_group::k_granularity(a.b.recipe));
  for (int64_t g = 0; g < a.groups; ++g) {
    const int64_t s = a.group_sizes[g];
    const std::string arg = "group_sizes[" + std::to_string(g) + "]";
    if (s < 0) {
      add(out, arg, "group-size-negative", "a group size cannot be negative", ">= 0", std::to_string(s), "");
      continue;
    }
    if (!mg && s % gran != 0)
      add(out, arg, "group-k-block",
          "K_g must fall on the K-block boundaries of both recipes (" + std::string(to_string(a.a.recipe)) + ", " +
              std::string(to_string(a.b.recipe)) + ")",
          "a multiple of " + std::to_string(gran), std::to_string(s),
          "Pad group " + std::to_string(g) + " with zero columns in A and B to K_g = " +
              std::to_string(layouts::round_up(s, gran)) + ".");
    sum += s;
  }
  const int64_t want = mg ? a.m : a.k;
  if (out.empty() && sum != want)
    add(out, "group_sizes", "group-size-sum",
        std::string("the group sizes must add up to ") + (mg ? "M (the rows of A and D)" : "K (the columns of A and B)"),
        std::to_string(want), std::to_string(sum) + " over " + std::to_string(a.groups) + " groups",
        mg ? "Pass m = the sum of the group sizes (padding rows belong to a group)." : "");
  if (!out.empty() || depth == Depth::kSizes) return out;

  // The operands: m-grouped through each group's dense call (its scale slice, B[g]); k-grouped through
  // the whole (M, sum K) and (N, sum K) tensors, of which the groups are column ranges.
  auto prefixed = [&](const Diagnostics& d, const std::string& prefix) {
    for (auto x : d) {
      x.argument = prefix + x.argument;
      out.push_back(std::move(x));
    }
  };
  if (mg) {
    std::vector<int64_t> rows(size_t(a.groups) + 1, 0);
    for (int64_t g = 0; g < a.groups; ++g) rows[size_t(g) + 1] = rows[size_t(g)] + a.group_sizes[g];
    if (!a.a.scale || !a.b.scale || !a.a.data || !a.b.data || !a.d) {
      // The dense check names it; a null base pointer must not be offset first.
      GemmArgs c;
      c.m = std::max<int64_t>(a.m, 1), c.n = a.n, c.k = a.k;
      c.a = a.a, c.b = a.b, c.d = a.d, c.d_dtype = a.d_dtype, c.space = a.space;
      prefixed(validate(c), "");
      return out;
    }
    const std::vector<int64_t> offs = grouped_scale_offsets(a);
    // The whole tensors' own alignment is the caller's; a group that starts off it runs on a copy.
    GemmArgs whole;
    whole.m = std::max<int64_t>(a.m, 1), whole.n = a.n, whole.k = a.k;
    whole.a = a.a, whole.b = a.b, whole.d = a.d, whole.d_dtype = a.d_dtype, whole.space = a.space;
    for (const Diagnostic& x : validate(whole))
      if (x.rule == "data-alignment") out.push_back(x);
    if (!out.empty()) return out;
    for (int64_t g = 0; g < a.groups; ++g)
      if (a.group_sizes[g] > 0) prefixed(validate(backends::per_group::m_group_view(a, rows, offs, g)), "group " + std::to_string(g) + ": ");
  } else {
    GemmArgs c;
    c.m = a.m, c.n = a.n, c.k = a.k;
    c.a = a.a, c.b = a.b, c.d = a.d, c.d_dtype = a.d_dtype, c.alpha = a.alpha, c.space = a.space;
    prefixed(validate(c), "");
  }
  return out;
}

}  // namespace

Diagnostics validate(const GroupedGemmArgs& a) { return validate_grouped(a, Depth::kPerGroup); }
Diagnostics validate_sizes(const GroupedGemmArgs& a) { return validate_grouped(a, Depth::kSizes); }

namespace {

// What the handle lends a grouped backend (grouped_backend.hpp).
class Services final : public backends::GroupedServices {
 public:
  explicit Services(Handle::Impl& impl) : impl_(impl) {}
  const Plan& dense_plan(const GemmArgs& args, Stream stream) override {
    return dispatch::cached_plan(impl_, args, stream);
  }
  void run_dense(const GemmArgs& args, const Plan& plan, Stream stream) override {
    dispatch::run_planned(impl_, args, plan, stream);
  }
  backends::StagingScratch staging(Stream stream, size_t bytes) override {
    return dispatch::staging_scratch(impl_, stream, bytes);
  }
  std::unique_ptr<backends::ForkedStreams> fork(Stream caller, int count) override {
    return dispatch::fork_streams(impl_, caller, count);
  }
  void reserve_dense(Stream stream, size_t workspace_bytes) override {
    dispatch::reserve_dense(impl_, stream, workspace_bytes);
  }

 private:
  Handle::Impl& impl_;
};

// The per-group backend needs the sizes on the host: one copy and one synchronisation.
std::vector<int64_t> sizes_to_host(const GroupedGemmArgs& a, const std::string& why, Stream stream) {
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  detail::cuda_check(cudaStreamIsCapturing(stream, &capturing), "grouped_gemm: capture status");
  if (capturing != cudaStreamCaptureStatusNone)
    throw Error(StatusCode::kUnsupported,
                "group_sizes_device: this call runs on the per-group backend, which needs the sizes on the host, "
                "and a graph capture cannot wait for them (" + why +
                    "). Fix: pass host sizes (group_sizes), or a call the CUTLASS kernel runs.");
  std::vector<int64_t> sizes(size_t(a.groups));
  std::vector<int32_t> s32(a.group_sizes_int64 ? 0 : sizes.size());
  void* dst = a.group_sizes_int64 ? static_cast<void*>(sizes.data()) : static_cast<void*>(s32.data());
  detail::cuda_check(cudaMemcpyAsync(dst, a.group_sizes_device, sizes.size() * (a.group_sizes_int64 ? 8 : 4),
                                     cudaMemcpyDeviceToHost, stream),
                     "grouped_gemm: copy device-side group sizes");
  detail::cuda_check(cudaStreamSynchronize(stream), "grouped_gemm: wait for device-side group sizes");
  std::copy(s32.begin(), s32.end(), sizes.begin());
  return sizes;
}

// SCALEMM_VERIFY for a call a one-launch backend ran: each group against the reference, as a dense
// call of the native tier's tolerance (synchronous, in both modes: the sizes may first have to be read).
void verify_whole_call(Handle::Impl& impl, const GroupedGemmArgs& in, const std::string& description, verify::Mode mode,
                       Stream stream) {
  std::vector<int64_t> host_sizes;
  GroupedGemmArgs a = in;
  if (a.group_sizes_device) {
    host_sizes = sizes_to_host(a, "", stream);
    a.group_sizes = host_sizes.data(), a.group_sizes_device = nullptr;
    if (!validate(a).empty()) return;  // invalid device sizes: the call wrote nothing, device_status says why
  }
  Plan plan;
  plan.backend = Backend::kNative;
  plan.reasons = {description};
  if (a.group_dim == GroupDim::kM) {
    std::vector<int64_t> rows(size_t(a.groups) + 1, 0);
    for (int64_t g = 0; g < a.groups; ++g) rows[size_t(g) + 1] = rows[size_t(g)] + a.group_sizes[g];
    const std::vector<int64_t> offs = grouped_scale_offsets(a);
    for (int64_t g = 0; g < a.groups; ++g)
      if (a.group_sizes[g] > 0) verify::check(backends::per_group::m_group_call(a, rows, offs, g), plan, mode, stream);
    return;
  }
  backends::StagingScratch scratch = dispatch::staging_scratch(impl, stream, backends::per_group::k_stage_bytes(a));
  const size_t d_bytes = size_t(dtype_storage_bytes(a.d_dtype, a.m * a.n));
  std::vector<uint8_t> dg(d_bytes);
  int64_t k0 = 0;
  for (int64_t g = 0; g < a.groups; ++g) {
    if (a.group_sizes[g] == 0) {  // D[g] must be zero
      detail::cuda_check(cudaMemcpy(dg.data(), static_cast<uint8_t*>(a.d) + size_t(g) * d_bytes, d_bytes,
                                    cudaMemcpyDeviceToHost), "verify: read D[g] of an empty group");
      if (std::any_of(dg.begin(), dg.end(), [](uint8_t v) { return v != 0; }))
        throw Error(StatusCode::kVerificationFailed,
                    "grouped_gemm verification: D[" + std::to_string(g) + "] of an empty k-group is not zero");
      continue;
    }
    verify::check(backends::per_group::stage_k_group(a, g, k0, scratch.ptr, stream), plan, mode, stream);
    k0 += a.group_sizes[g];
  }
}


// What a call's launches bake in, as a key for its whole-call graph: the sizes, shapes, dtypes,
// recipes, pointers, alpha and global scales, the stream and the device.
std::string replay_key(const GroupedGemmArgs& a, Stream stream, int device) {
  std::string k;
  auto put = [&k](const auto& v) { k.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(a.group_dim), put(a.groups), put(a.m), put(a.n), put(a.k), put(a.d), put(a.d_dtype), put(a.alpha);
  for (const GemmOperand* op : {&a.a, &a.b})
    put(op->data), put(op->dtype), put(op->recipe), put(op->scale), put(op->scale_format), put(op->global_scale);
  put(stream), put(device);
  k.append(reinterpret_cast<const char*>(a.group_sizes), size_t(a.groups) * sizeof(int64_t));
  return k;
}

// Why a graph_replay call runs without its graph (empty: it can have one).
std::string graph_blocker(const GroupedGemmArgs& a, Stream stream, verify::Mode mode) {
  if (a.space == MemorySpace::kHost) return "host arrays";
  if (dispatch::is_default_stream(stream)) return "the default stream cannot be captured";
  if (mode != verify::Mode::kOff) return "SCALEMM_VERIFY checks each call";
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  detail::cuda_check(cudaStreamIsCapturing(stream, &capturing), "grouped_gemm: capture status");
  if (capturing != cudaStreamCaptureStatusNone) return "the caller is capturing the stream";
  return "";
}

}  // namespace

void Handle::grouped_gemm(const GroupedGemmArgs& a, Stream stream) {
  const bool host = a.space == MemorySpace::kHost;
  // The call's device (the stream's), then the backend for it (blockers read no buffer), so that the
  // checks fit what runs.
  const int device = host ? -1 : dispatch::call_device(*impl_, stream);
  const DeviceTarget& target = host ? this->target() : dispatch::device_target(*impl_, device);
  const std::shared_ptr<const dispatch::GroupedPlan> plan =
      dispatch::grouped_plans(*impl_).get(a, target, dispatch::handle_options(*impl_).plan);
  const dispatch::GroupedPlan& choice = *plan;
  const bool one_launch = choice.one_launch();
  throw_if_any(validate_grouped(a, one_launch ? Depth::kWhole : Depth::kPerGroup), StatusCode::kInvalidArgument);
  dispatch::throw_if_unplanned(choice, a);
  // The whole tensors' memory space and device, before any group runs (the groups are views into
  // them, and k-grouped groups read staged copies that the dense check never sees).
  if (!host) {
    GemmArgs whole;
    whole.a = a.a, whole.b = a.b, whole.d = a.d, whole.space = a.space;
    throw_if_any(dispatch::check_pointers(*impl_, whole, stream, device), StatusCode::kInvalidArgument);
    dispatch::refuse_to_run_simulated(*impl_);
  }
  // Staging, its copies and every launch go to the stream's device.
  const dispatch::DeviceScope scope(host ? -1 : dispatch::scope_device(*impl_, stream, device));
  Services services(*impl_);
  const backends::GroupedRunContext ctx{stream, &target, &services};
  if (one_launch) {
    choice.backend->run(a, ctx);
    const verify::Mode mode = dispatch::handle_verify_mode(*impl_);
    if (mode != verify::Mode::kOff) verify_whole_call(*impl_, a, choice.backend->explain(*this, a, ""), mode, stream);
    return;
  }
  // The groups run as dense calls, which need the sizes on the host.
  if (a.group_sizes_device) {
    const std::vector<int64_t> sizes = sizes_to_host(a, choice.passed_over, stream);
    GroupedGemmArgs h = a;
    h.group_sizes = sizes.data(), h.group_sizes_device = nullptr, h.device_status = nullptr;
    throw_if_any(validate(h), StatusCode::kInvalidArgument);
    if (a.device_status)
      detail::cuda_check(cudaMemsetAsync(a.device_status, 0, sizeof(int32_t), stream), "grouped_gemm: device_status");
    grouped_gemm(h, stream);
    return;
  }
  if (a.graph_replay && graph_blocker(a, stream, dispatch::handle_verify_mode(*impl_)).empty()) {
    // Replayed while the call repeats exactly; otherwise run as usual (which allocates whatever the
    // call needs and computes D), then captured for the next time.
    const std::string key = replay_key(a, stream, device);
    if (dispatch::replay_graph(*impl_, key, stream)) return;
    choice.backend->run(a, ctx);
    const uint64_t epoch = dispatch::arena_epoch_now();
    cudaStream_t cs = reinterpret_cast<cudaStream_t>(stream);
    detail::cuda_check(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal), "grouped_gemm: graph capture");
    cudaGraph_t graph = nullptr;
    try {
      choice.backend->run(a, ctx);
    } catch (...) {
      cudaStreamEndCapture(cs, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    detail::cuda_check(cudaStreamEndCapture(cs, &graph), "grouped_gemm: graph capture");
    cudaGraphExec_t exec = nullptr;
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    detail::cuda_check(made, "grouped_gemm: graph instantiation");
    dispatch::keep_graph(*impl_, key, exec, epoch);
    return;
  }
  choice.backend->run(a, ctx);
}

std::string Handle::explain(const GroupedGemmArgs& a) {
  throw_if_any(validate(a), StatusCode::kInvalidArgument);
  const std::shared_ptr<const dispatch::GroupedPlan> plan =
      dispatch::grouped_plans(*impl_).get(a, target(), dispatch::handle_options(*impl_).plan);
  const dispatch::GroupedPlan& choice = *plan;
  dispatch::throw_if_unplanned(choice, a);
  std::ostringstream os;
  os << "grouped (" << to_string(a.group_dim) << "), G=" << a.groups << ", "
     << choice.backend->explain(*this, a, choice.passed_over);
  return os.str();
}


}  // namespace scalemm
