// Whole-call graphs of grouped calls (grouped_graphs.hpp).
#include "dispatch/grouped_graphs.hpp"

#include <cuda_runtime_api.h>

#include "dispatch/devices.hpp"
#include "dispatch/handle_scratch.hpp"
#include "scalemm/detail/cuda_check.hpp"

namespace scalemm::dispatch {
namespace {

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

}  // namespace

std::string graph_blocker(const GroupedGemmArgs& a, Stream stream, verify::Mode mode) {
  if (a.space == MemorySpace::kHost) return "host arrays";
  if (dispatch::is_default_stream(stream)) return "the default stream cannot be captured";
  if (mode != verify::Mode::kOff) return "SCALEMM_VERIFY checks each call";
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  detail::cuda_check(cudaStreamIsCapturing(stream, &capturing), "grouped_gemm: capture status");
  if (capturing != cudaStreamCaptureStatusNone) return "the caller is capturing the stream";
  return "";
}


void run_with_graph(Handle::Impl& impl, const GroupedGemmArgs& a, Stream stream, int device,
                    const std::function<void()>& run) {
  // Replayed while the call repeats exactly; otherwise run as usual (which allocates whatever the
  // call needs and computes D), then captured for the next time.
  const std::string key = replay_key(a, stream, device);
  if (replay_graph(impl, key, stream)) return;
  run();
  const uint64_t epoch = arena_epoch_now();
  cudaStream_t cs = reinterpret_cast<cudaStream_t>(stream);
  detail::cuda_check(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal), "grouped_gemm: graph capture");
  cudaGraph_t graph = nullptr;
  try {
    run();
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
  keep_graph(impl, key, exec, epoch);
}

}  // namespace scalemm::dispatch
