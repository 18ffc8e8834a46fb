// Staging memory of a stream for calls that prepare their operands before the dense path runs (the
// k-grouped gather of backends/per_group.cpp) or that carry their own arguments (the CUTLASS grouped
// kernel's per-group arrays). Separate from the plans' scratch, which each dense call takes under its
// own lock.
#pragma once

#include <cstddef>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dispatch/verify.hpp"
#include "scalemm/gemm.hpp"

namespace scalemm::dispatch {

/// `ptr` holds at least the bytes asked for until `lock` is released: one grouped call at a time per
/// stream stages into it. Growing synchronises the stream first, as the plan scratch does.
/// `generation` changes whenever the buffer is (re)allocated, in any handle: a cache keyed by the
/// address alone could not tell a new buffer from a freed one that cudaMalloc handed out again.
struct StagingScratch {
  std::unique_lock<std::mutex> lock;
  char* ptr = nullptr;
  uint64_t generation = 0;
};
StagingScratch staging_scratch(Handle::Impl& impl, Stream stream, size_t bytes);

/// Streams that a grouped call spreads its groups over (the per-group backend): up to `count`
/// non-blocking streams of the caller stream's device, made on first use and kept with the caller
/// stream's resources, each with its own workspace (a dense call on it uses that stream's arena). On
/// creation each stream waits for the work enqueued on the caller stream so far; on destruction the
/// caller stream waits for everything enqueued on them. Both are events, so the fork and the join are
/// captured into a CUDA graph like any launch. `streams` is empty where there is nothing to fork (a
/// simulated machine in host tests, count < 2): the caller then runs its groups on its own stream.
/// One grouped call at a time per caller stream holds them (`lock`).
class ForkedStreams {
 public:
  ForkedStreams() = default;
  ForkedStreams(ForkedStreams&& o) noexcept
      : streams(std::move(o.streams)), lock_(std::move(o.lock_)), caller_(o.caller_), joins_(std::move(o.joins_)) {
    o.streams.clear();
  }
  ForkedStreams& operator=(ForkedStreams&&) = delete;
  ~ForkedStreams();
  std::vector<Stream> streams;

 private:
  friend ForkedStreams fork_streams(Handle::Impl&, Stream, int);
  std::unique_lock<std::mutex> lock_;
  Stream caller_ = nullptr;
  std::vector<void*> joins_;  // cudaEvent_t, one per stream
};
ForkedStreams fork_streams(Handle::Impl& impl, Stream caller, int count);

/// Whole-call graphs of grouped calls (GroupedGemmArgs::graph_replay), kept by the handle under a
/// key that holds everything the call's launches bake in (sizes, shapes, pointers, stream, device).
/// replay_graph launches the graph of `key` on `stream` and returns true, unless there is none or a
/// stream buffer has been reallocated since it was captured (arena_epoch_now() moved on: the graph
/// is dropped). keep_graph stores a cudaGraphExec_t captured at `epoch` (the 64 most recently used
/// are kept).
bool replay_graph(Handle::Impl& impl, const std::string& key, Stream stream);
void keep_graph(Handle::Impl& impl, const std::string& key, void* exec, uint64_t epoch);
uint64_t arena_epoch_now();

/// The plan a dense call on `stream` gets (the handle's cache: planned once per distinct problem).
const Plan& cached_plan(Handle::Impl& impl, const GemmArgs& args, Stream stream);

/// The handle's settings that grouped calls follow as dense calls do.
const HandleOptions& handle_options(const Handle::Impl& impl);
verify::Mode handle_verify_mode(const Handle::Impl& impl);
/// The device a call on `stream` runs on: the stream's, or the current one for a default stream (-1
/// without a GPU).
int call_device(Handle::Impl& impl, Stream stream);
/// The device a DeviceScope must make current for a call on `stream`: `device`, or -1 for a default
/// stream (already the current device) and on a simulated machine (host tests: no CUDA calls).
int scope_device(const Handle::Impl& impl, Stream stream, int device);
/// The pointer checks of a dense call (memory space, and the device against `device`), for a grouped
/// call's whole tensors before any group runs.
Diagnostics check_pointers(Handle::Impl& impl, const GemmArgs& args, Stream stream, int device);
/// The target of device `device` as this handle sees it (a simulated machine in host tests).
const DeviceTarget& device_target(const Handle::Impl& impl, int device);

}  // namespace scalemm::dispatch
