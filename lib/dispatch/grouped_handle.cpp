// Grouped GEMMs (grouped.hpp) at the handle, beside the dense Handle::gemm: the call's plan (the
// grouped planner, grouped_planner.cpp, cached per distinct call), its validation (grouped_validate.cpp),
// device-side sizes, verification and whole-call graphs (grouped_graphs.cpp), with the handle's stream
// resources lent to the backend through one class (StreamResources). The backends themselves are
// objects in lib/backends (grouped_backend.hpp):
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
#include "dispatch/devices.hpp"
#include "dispatch/grouped_graphs.hpp"
#include "dispatch/grouped_planner.hpp"
#include "dispatch/grouped_validate.hpp"
#include "dispatch/handle_scratch.hpp"
#include "dispatch/verify.hpp"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/grouped.hpp"
#include "scalemm/layouts/scale_layout.hpp"

namespace scalemm {
namespace {

// What the handle lends a grouped backend (grouped_backend.hpp): the stream resources of the call's
// streams (staging, forked streams, workspaces) and the dense plans and runs.
class StreamResources final : public backends::GroupedServices {
 public:
  explicit StreamResources(Handle::Impl& impl) : impl_(impl) {}
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


}  // namespace

void Handle::grouped_gemm(const GroupedGemmArgs& a, Stream stream) {
  const bool host = a.space == MemorySpace::kHost;
  // The call's device (the stream's), then the plan for it (a plan reads no buffer), so that the
  // checks fit what runs.
  const int device = host ? -1 : dispatch::call_device(*impl_, stream);
  const DeviceTarget& target = host ? this->target() : dispatch::device_target(*impl_, device);
  const std::shared_ptr<const dispatch::GroupedPlan> plan =
      dispatch::grouped_plans(*impl_).get(a, target, dispatch::handle_options(*impl_).plan);
  const dispatch::GroupedPlan& choice = *plan;
  const bool one_launch = choice.one_launch();
  throw_if_any(dispatch::validate_grouped(a, one_launch ? dispatch::Depth::kWhole : dispatch::Depth::kPerGroup), StatusCode::kInvalidArgument);
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
  StreamResources services(*impl_);
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
  if (a.graph_replay && dispatch::graph_blocker(a, stream, dispatch::handle_verify_mode(*impl_)).empty()) {
    dispatch::run_with_graph(*impl_, a, stream, device, [&] { choice.backend->run(a, ctx); });
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
