// What the handle keeps for grouped calls beyond the dense plans: the staging memory of a stream, for
// calls that prepare their operands before the dense path runs (the k-grouped gather of
// backends/per_group.cpp) or that carry their own arguments (the CUTLASS grouped kernel's per-group
// arrays), separate from the plans' scratch, which each dense call takes under its own lock; forked
// streams; whole-call graphs; and the handle's settings grouped calls follow.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/grouped_backend.hpp"
#include "dispatch/grouped_planner.hpp"
#include "dispatch/verify.hpp"
#include "scalemm/gemm.hpp"

namespace scalemm::dispatch {

/// The staging memory of `stream` (backends::StagingScratch), grown to `bytes`; growing synchronises
/// the stream first, as the plan scratch does.
backends::StagingScratch staging_scratch(Handle::Impl& impl, Stream stream, size_t bytes);

/// Streams that a grouped call spreads its groups over (the per-group backend): up to `count`
/// non-blocking streams of the caller stream's device, made on first use and kept with the caller
/// stream's resources, each with its own workspace (a dense call on it uses that stream's arena). On
/// ForkedStreams::begin each stream waits for the work enqueued on the caller stream so far; on destruction
/// (once begun) the caller stream waits for everything enqueued on them. Both are events, so the fork and the join are
/// captured into a CUDA graph like any launch. `streams` is empty where there is nothing to fork (a
/// simulated machine in host tests, count < 2). One grouped call at a time per caller stream holds
/// them.
std::unique_ptr<backends::ForkedStreams> fork_streams(Handle::Impl& impl, Stream caller, int count);

/// What a dense call of `workspace_bytes` on `stream` allocates (backends::GroupedServices::reserve_dense).
void reserve_dense(Handle::Impl& impl, Stream stream, size_t workspace_bytes);

/// Whole-call graphs of grouped calls (GroupedGemmArgs::graph_replay), kept by the handle under a
/// key that holds everything the call's launches bake in (sizes, shapes, pointers, stream, device).
/// replay_graph launches the graph of `key` on `stream` and returns true, unless there is none or a
/// stream buffer has been reallocated since it was captured (arena_epoch_now() moved on: the graph
/// is dropped). keep_graph stores a cudaGraphExec_t captured at `epoch` (the 64 most recently used
/// are kept).
bool replay_graph(Handle::Impl& impl, const std::string& key, Stream stream);
void keep_graph(Handle::Impl& impl, const std::string& key, void* exec, uint64_t epoch);
uint64_t arena_epoch_now();

/// Runs `plan` for `args` on `stream` as Handle::gemm does once it has validated and planned the call.
void run_planned(Handle::Impl& impl, const GemmArgs& args, const Plan& plan, Stream stream);

/// The handle's grouped plans (dispatch/grouped_planner.hpp).
GroupedPlanCache& grouped_plans(Handle::Impl& impl);

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
/// Throws Error(kUnsupported) on a simulated machine: a device call that passed its checks stops there,
/// before its first CUDA call (the simulation's streams and addresses are not real, and on a machine
/// with a GPU, CUDA would be handed them).
void refuse_to_run_simulated(const Handle::Impl& impl);
/// The target of device `device` as this handle sees it (a simulated machine in host tests).
const DeviceTarget& device_target(const Handle::Impl& impl, int device);

}  // namespace scalemm::dispatch
