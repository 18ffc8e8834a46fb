// Handle: what a handle is. The plan cache (per problem and device), per-stream resources (cuBLASLt
// context and workspace, the plans' scratch, on the stream's device), and the verification hooks;
// plans are made in planner.cpp, run by lib/backends/.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backends/backend.hpp"
#include "dispatch/planner.hpp"
#include "dispatch/devices.hpp"
#include "dispatch/handle_scratch.hpp"
#include "dispatch/verify.hpp"
#include "support/hash.hpp"
#include "scalemm/detail/device_alloc.hpp"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/gemm.hpp"

namespace scalemm {
namespace {

using detail::cuda_check;


bool log_plans() {
  static const bool on = [] {
    const char* v = std::getenv("SCALEMM_LOG");
    return v && (std::string(v) == "info" || std::string(v) == "debug");
  }();
  return on;
}

// Reallocations of any stream's buffers, in any handle: whole-call graphs made before the last one
// are not replayed (they may hold a freed buffer).
std::atomic<uint64_t> arena_epoch{0};

// Device memory owned by one stream: nothing here is ever shared by GEMMs that can run concurrently.
// It lives on the stream's device; Handle::Impl destroys it with that device current.
struct StreamArena {
  int device = -1;
  std::mutex mu;  // held while one GEMM's launches are enqueued, so scratch is not interleaved
  backends::LtContext lt;
  void* lt_workspace = nullptr;
  size_t lt_bytes = 0;
  char* scratch = nullptr;
  size_t scratch_bytes = 0;
  std::mutex staging_mu;  // held by one grouped call while it stages operands (dispatch::staging_scratch)
  char* staging = nullptr;
  size_t staging_bytes = 0;
  uint64_t staging_generation = 0;  // backends::StagingScratch::generation
  std::unique_ptr<verify::AsyncSampler> sampler;  // SCALEMM_VERIFY=sample only
  // Streams grouped calls on this stream fork their groups onto (dispatch::fork_streams), with the
  // events of the fork (one) and the join (one per stream).
  std::mutex fork_mu;
  std::vector<cudaStream_t> forks;
  cudaEvent_t fork_event = nullptr;
  std::vector<cudaEvent_t> join_events;

  ~StreamArena() {
    for (cudaEvent_t e : join_events) cudaEventDestroy(e);
    if (fork_event) cudaEventDestroy(fork_event);
    for (cudaStream_t s : forks) cudaStreamDestroy(s);  // after their work: destruction does not wait
    sampler.reset();  // reports an unreported failure before the buffers go
    if (lt_workspace) cudaFree(lt_workspace);
    if (scratch) cudaFree(scratch);
    if (staging) cudaFree(staging);
  }

  // Growing happens when a new, larger problem first runs on this stream: wait for the work that may
  // still read the old buffer, then replace it.
  static void grow(char*& buf, size_t& have, size_t bytes, Stream stream, const char* what) {
    if (bytes <= have) return;
    cuda_check(cudaStreamSynchronize(stream), std::string(what) + " growth");
    ++arena_epoch;  // a graph captured before now may hold the old buffer (dispatch::replay_graph)
    if (buf) cudaFree(buf);
    buf = nullptr;
    have = 0;
    void* p = nullptr;
    cuda_check(detail::device_malloc(&p, bytes), std::string(what) + " (" + std::to_string(bytes) + " B)");
    buf = static_cast<char*>(p);
    have = bytes;
  }
  void reserve(size_t bytes, Stream stream) { grow(scratch, scratch_bytes, bytes, stream, "scalemm scratch"); }
};

// The plan cache's hash: a warm call looks its problem up once, in constant time whatever the number
// of shapes a model uses (a linear scan cost about 1 us per call with 100 cached problems).
struct ProblemHash {
  size_t operator()(const GemmProblem& p) const {
    const uint64_t tags = uint64_t(p.a_dtype) | uint64_t(p.b_dtype) << 8 | uint64_t(p.a_recipe) << 16 |
                          uint64_t(p.b_recipe) << 24 | uint64_t(p.a_format) << 32 | uint64_t(p.b_format) << 40 |
                          uint64_t(p.d_dtype) << 48 | uint64_t(p.has_bias) << 56 | uint64_t(p.has_amax) << 57 |
                          uint64_t(p.space) << 58 | uint64_t(p.fast_accum) << 60;
    uint64_t h = detail::kHashSeed;
    for (uint64_t v : {uint64_t(p.m), uint64_t(p.n), uint64_t(p.k), tags}) h = detail::hash_mix(h, v);
    return size_t(h);
  }
};

bool autotune_from_environment() {
  const char* v = std::getenv("SCALEMM_AUTOTUNE");
  return v && (std::string(v) == "1" || std::string(v) == "on");
}

// What CUDA says about one address (memory type and owning device).
dispatch::PointerInfo query_pointer(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // not a sticky error: the query failed, the pointer stays unchecked
    return {};
  }
  switch (attr.type) {
    case cudaMemoryTypeUnregistered: return {dispatch::PointerInfo::kPageable, -1};
    case cudaMemoryTypeDevice: return {dispatch::PointerInfo::kDevice, attr.device};
    default: return {dispatch::PointerInfo::kAnyDevice, -1};  // managed, or pinned host memory
  }
}

}  // namespace

namespace dispatch {

size_t PlanKeyHash::operator()(const PlanKey& k) const {
  return size_t(detail::hash_mix(uint64_t(ProblemHash{}(k.problem)), uint64_t(int64_t(k.device))));
}

bool is_default_stream(Stream s) {
  return s == nullptr || s == reinterpret_cast<Stream>(cudaStreamLegacy) ||
         s == reinterpret_cast<Stream>(cudaStreamPerThread);
}

Diagnostic pointer_device_mismatch(const char* argument, int pointer_device, int call_device) {
  const std::string a(argument), on = "device " + std::to_string(pointer_device),
                    want = "device " + std::to_string(call_device);
  return {a, "pointer-device",
          a + " is memory of " + on + ", but the call runs on " + want + " (its stream's device)",
          "memory of " + want, "memory of " + on,
          "Pass a stream of " + on + " (or make " + on + " current for the default stream), or copy " + a +
              " to " + want + "."};
}

}  // namespace dispatch

struct Handle::Impl {
  HandleOptions options;
  verify::Mode verify_mode = verify::Mode::kOff;
  bool autotune = false;
  // The devices plans are made for, by ordinal: the process's, or a simulated machine's (host tests).
  const std::vector<DeviceTarget>* devices = &DeviceTarget::all();
  std::unique_ptr<dispatch::SimulatedDevices> sim;

  std::mutex mu;  // guards the maps below
  std::unordered_map<dispatch::PlanKey, Plan, dispatch::PlanKeyHash> plans;  // node-based: references stay valid
  dispatch::GroupedPlanCache grouped_plans;  // its own lock
  // Per stream and device: the legacy default stream (nullptr) of device 0 and of device 1 are two
  // streams with one handle value.
  std::map<std::pair<Stream, int>, std::unique_ptr<StreamArena>> arenas;
  // Addresses already found to be device-accessible, with the device that owns them (-1: managed or
  // pinned host memory, readable from every device). Under unified addressing an address names one
  // allocation while it lives, so a warm call (and a call inside a graph capture after a warm-up) asks
  // CUDA nothing about its pointers.
  std::unordered_map<const void*, int> device_pointers;
  // Whole-call graphs of grouped calls (GroupedGemmArgs::graph_replay), by call key.
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    uint64_t epoch = 0;     // arena_epoch when captured
    uint64_t last_use = 0;  // for evicting the least recently used
  };
  std::mutex graph_mu;
  std::unordered_map<std::string, Graph> graphs;
  uint64_t graph_clock = 0;
  Handle::GraphCounts graph_counts;
  std::mutex stream_mu;  // guards stream_devices
  // The device of each non-default stream seen, asked once (a stream stays on its device).
  std::unordered_map<Stream, int> stream_devices;

  ~Impl() {
    for (auto& [key, g] : graphs) cudaGraphExecDestroy(g.exec);
    // Each stream's resources are freed with their own device current, whatever device the
    // destroying thread has made current.
    for (auto& [key, arena] : arenas) {
      try {
        const dispatch::DeviceScope scope(sim ? -1 : arena->device);
        arena.reset();
      } catch (const Error&) {  // the device cannot be made current (process teardown): free from here
        arena.reset();
      }
    }
  }

  const DeviceTarget& target_of(int device) const { return dispatch::target_in(*devices, device); }

  int current_device() const {
    if (devices->empty()) return -1;
    if (sim) return sim->current;
    int d = 0;
    if (cudaGetDevice(&d) != cudaSuccess) {
      cudaGetLastError();
      return devices->front().ordinal;
    }
    return d;
  }

  // The device a call on `s` runs on: the stream's, or the current one for a default stream.
  int device_of(Stream s) {
    if (devices->empty()) return -1;
    if (dispatch::is_default_stream(s)) return current_device();
    {
      std::lock_guard<std::mutex> lock(stream_mu);
      auto it = stream_devices.find(s);
      if (it != stream_devices.end()) return it->second;
    }
    int d = -1;
    if (sim) {
      d = sim->stream_device ? sim->stream_device(s) : sim->current;
    } else {
      cuda_check(cudaStreamGetDevice(reinterpret_cast<cudaStream_t>(s), &d), "scalemm: the stream's device");
    }
    std::lock_guard<std::mutex> lock(stream_mu);
    if (stream_devices.size() >= 4096) stream_devices.clear();
    stream_devices[s] = d;
    return d;
  }

  dispatch::PointerInfo pointer_info(const void* p) const {
    if (sim) return sim->pointer ? sim->pointer(p) : dispatch::PointerInfo{};
    return query_pointer(p);
  }

  Diagnostics check_pointers(const GemmArgs& args, Stream stream, int device);
  // A validated, planned call on `stream` of `device` (Handle::gemm, and each group of a grouped call).
  void run(const GemmArgs& args, const Plan& plan, Stream stream, int device);
  // What a call of `workspace_bytes` allocates on `arena` (its mutex held): the plans' scratch, and
  // the sampler's buffers when SCALEMM_VERIFY=sample.
  void reserve(StreamArena& arena, size_t workspace_bytes, Stream stream) {
    arena.reserve(workspace_bytes, stream);
    if (verify_mode == verify::Mode::kSample && !arena.sampler) arena.sampler = std::make_unique<verify::AsyncSampler>();
  }

  const Plan& cached_plan(const GemmProblem& p, int device) {
    std::lock_guard<std::mutex> lock(mu);
    const dispatch::PlanKey key{p, device};
    auto it = plans.find(key);
    if (it != plans.end()) return it->second;
    Plan made = scalemm::plan(p, target_of(device), options.plan);
    if (log_plans()) std::fprintf(stderr, "scalemm plan: %s\n", made.explain().c_str());
    return plans.emplace(key, std::move(made)).first->second;
  }

  // The arena of `s` on `device`; created with `device` current (the caller's DeviceScope).
  StreamArena& arena(Stream s, int device) {
    std::lock_guard<std::mutex> lock(mu);
    auto& slot = arenas[{s, device}];
    if (!slot) {
      auto a = std::make_unique<StreamArena>();
      a->device = device;
      a->lt.set_autotune(autotune);
      cuda_check(detail::device_malloc(&a->lt_workspace, options.cublaslt_workspace_bytes),
                 "cuBLASLt workspace (" + std::to_string(options.cublaslt_workspace_bytes) + " B)");
      a->lt_bytes = options.cublaslt_workspace_bytes;
      slot = std::move(a);
    }
    return *slot;
  }
};

// A host pointer given as device memory makes a kernel fault (a sticky error that ends the process's
// CUDA context); a device pointer given as host memory crashes the host reference; memory of another
// device than the call's is read through peer access or faults. All three are reported as invalid
// arguments before anything runs.
Diagnostics Handle::Impl::check_pointers(const GemmArgs& args, Stream stream, int call_device) {
  Diagnostics out;
  const std::pair<const char*, const void*> pointers[] = {
      {"a", args.a.data}, {"scale_a", args.a.scale}, {"b", args.b.data}, {"scale_b", args.b.scale},
      {"d", args.d},      {"bias", args.bias},       {"d_scale", args.d_scale}, {"d_amax", args.d_amax}};
  constexpr int kCount = int(sizeof(pointers) / sizeof(pointers[0]));
  const bool device = args.space == MemorySpace::kDevice;
  if (devices->empty()) return out;  // no GPU: every pointer is host memory
  bool known[kCount] = {};
  int recorded[kCount];  // the device an address was recorded with (-1: any device, -2: not recorded)
  if (device) {  // a warm call: every address seen before, one lock, no CUDA query
    std::lock_guard<std::mutex> lock(mu);
    bool all = true;
    for (int i = 0; i < kCount; ++i) {
      recorded[i] = -2;
      if (!pointers[i].second) {
        known[i] = true;
        continue;
      }
      auto it = device_pointers.find(pointers[i].second);
      if (it != device_pointers.end()) recorded[i] = it->second;
      // A recorded address of another device is asked again below: it may have been freed and its
      // address reused on this device.
      known[i] = it != device_pointers.end() && (it->second < 0 || it->second == call_device);
      all = all && known[i];
    }
    if (all) return out;
    // During a graph capture nothing is queried (the capture must not depend on which calls the
    // driver counts as safe while capturing): a new address is left unchecked, and so is one recorded
    // on another device, whose record may be stale: caching allocators return memory to CUDA, and
    // the address can come back as another device's allocation (a capture right after
    // torch.cuda.graph's empty_cache did, on two GPUs). Its record is dropped, so that the next call
    // outside a capture asks CUDA again.
    bool capturing = false;
    if (sim) {
      capturing = sim->capturing && sim->capturing(stream);
    } else {
      cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &status) != cudaSuccess) {
        cudaGetLastError();
        return out;
      }
      capturing = status != cudaStreamCaptureStatusNone;
    }
    if (capturing) {
      for (int i = 0; i < kCount; ++i)
        if (recorded[i] >= 0 && recorded[i] != call_device) device_pointers.erase(pointers[i].second);
      return out;
    }
  }
  for (int i = 0; i < kCount; ++i) {
    const auto& [name, p] = pointers[i];
    if (!p || known[i]) continue;
    const dispatch::PointerInfo info = pointer_info(p);
    if (info.kind == dispatch::PointerInfo::kUnknown) continue;
    const bool host_only = info.kind == dispatch::PointerInfo::kPageable;
    const bool device_only = info.kind == dispatch::PointerInfo::kDevice;
    if (device && host_only) {
      out.push_back({name, "pointer-memory-space", std::string(name) + " points to pageable host memory, but the call says device memory",
                     "device memory (cudaMalloc, managed or pinned host memory)", "pageable host memory",
                     "Copy the buffer to the device, or pass space = host with every pointer in host memory."});
    } else if (!device && device_only) {
      out.push_back({name, "pointer-memory-space", std::string(name) + " points to device memory, but the call says host memory",
                     "host memory", "device memory",
                     "Pass space = device with every pointer in device memory, or copy the buffer to the host."});
    } else if (device) {
      const int owner = device_only ? info.device : -1;
      if (owner >= 0 && call_device >= 0 && owner != call_device)
        out.push_back(dispatch::pointer_device_mismatch(name, owner, call_device));
      std::lock_guard<std::mutex> lock(mu);
      if (device_pointers.size() >= 16384) device_pointers.clear();
      device_pointers[p] = owner;
    }
  }
  return out;
}

Handle::Handle(HandleOptions options) : impl_(new Impl) {
  impl_->options = options;
  impl_->autotune = options.autotune == Autotune::kOn ||
                    (options.autotune == Autotune::kFromEnvironment && autotune_from_environment());
  switch (options.verify) {
    case VerifyMode::kFromEnvironment: impl_->verify_mode = verify::mode_from_environment(); break;
    case VerifyMode::kOff: impl_->verify_mode = verify::Mode::kOff; break;
    case VerifyMode::kSample: impl_->verify_mode = verify::Mode::kSample; break;
    case VerifyMode::kFull: impl_->verify_mode = verify::Mode::kFull; break;
  }
}

Handle::~Handle() = default;

const DeviceTarget& Handle::target() const { return impl_->target_of(impl_->current_device()); }

struct HandleAccess {
  static Handle::Impl& impl(Handle& h) { return *h.impl_; }
};

void dispatch::simulate_devices(Handle& handle, SimulatedDevices sim) {
  Handle::Impl& impl = HandleAccess::impl(handle);
  std::lock_guard<std::mutex> lock(impl.mu);
  std::lock_guard<std::mutex> slock(impl.stream_mu);
  impl.plans.clear();
  impl.grouped_plans.clear();
  impl.device_pointers.clear();
  impl.stream_devices.clear();
  impl.sim = std::make_unique<SimulatedDevices>(std::move(sim));
  impl.devices = &impl.sim->devices;
}

int dispatch::call_device(Handle::Impl& impl, Stream stream) { return impl.device_of(stream); }

int dispatch::scope_device(const Handle::Impl& impl, Stream stream, int device) {
  return impl.sim || dispatch::is_default_stream(stream) ? -1 : device;
}

Diagnostics dispatch::check_pointers(Handle::Impl& impl, const GemmArgs& args, Stream stream, int device) {
  return impl.check_pointers(args, stream, device);
}

void dispatch::refuse_to_run_simulated(const Handle::Impl& impl) {
  if (impl.sim)
    throw Error(StatusCode::kUnsupported,
                "simulated machine: the call passed its checks and was planned, but a Handle under "
                "dispatch::simulate_devices runs nothing on the device");
}

backends::StagingScratch dispatch::staging_scratch(Handle::Impl& impl, Stream stream, size_t bytes) {
  StreamArena& arena = impl.arena(stream, impl.device_of(stream));
  static std::atomic<uint64_t> allocations{0};
  backends::StagingScratch s{std::unique_lock<std::mutex>(arena.staging_mu), nullptr};
  const size_t had = arena.staging_bytes;
  StreamArena::grow(arena.staging, arena.staging_bytes, bytes, stream, "scalemm staging");
  if (arena.staging_bytes != had) arena.staging_generation = ++allocations;
  s.ptr = arena.staging;
  s.generation = arena.staging_generation;
  return s;
}

namespace {

// The caller stream's forks, held (arena.fork_mu) until joined.
class Fork final : public backends::ForkedStreams {
 public:
  ~Fork() override {
    // The join runs on every path once begun, a group that threw included: a caller stream that did
    // not wait for its forks would race them, and a capture left with unjoined streams cannot end.
    for (size_t i = 0; begun && i < streams.size(); ++i) {
      const cudaEvent_t e = joins[i];
      if (cudaEventRecord(e, static_cast<cudaStream_t>(streams[i])) != cudaSuccess ||
          cudaStreamWaitEvent(caller, e, 0) != cudaSuccess)
        std::fprintf(stderr, "scalemm: grouped_gemm could not join stream %zu back to its caller\n", i);
    }
  }
  void begin() override {
    if (streams.empty() || begun) return;
    cuda_check(cudaEventRecord(fork_event, caller), "grouped_gemm: fork");
    begun = true;  // before the first wait: the destructor joins what was forked
    for (Stream s : streams)
      cuda_check(cudaStreamWaitEvent(static_cast<cudaStream_t>(s), fork_event, 0), "grouped_gemm: fork");
  }
  std::unique_lock<std::mutex> lock;
  cudaStream_t caller = nullptr;
  cudaEvent_t fork_event = nullptr;
  std::vector<cudaEvent_t> joins;  // one per stream
  bool begun = false;
};

}  // namespace

std::unique_ptr<backends::ForkedStreams> dispatch::fork_streams(Handle::Impl& impl, Stream caller, int count) {
  auto f = std::make_unique<Fork>();
  if (impl.sim || count < 2) return f;
  StreamArena& arena = impl.arena(caller, impl.device_of(caller));
  f->lock = std::unique_lock<std::mutex>(arena.fork_mu);
  if (!arena.fork_event)
    cuda_check(cudaEventCreateWithFlags(&arena.fork_event, cudaEventDisableTiming), "grouped_gemm: fork event");
  while (int(arena.forks.size()) < count) {
    cudaStream_t s = nullptr;
    cudaEvent_t e = nullptr;
    cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "grouped_gemm: a stream for the groups");
    arena.forks.push_back(s);
    cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "grouped_gemm: a join event");
    arena.join_events.push_back(e);
  }
  f->caller = static_cast<cudaStream_t>(caller);
  f->fork_event = arena.fork_event;
  for (int i = 0; i < count; ++i) {
    f->streams.push_back(arena.forks[size_t(i)]);
    f->joins.push_back(arena.join_events[size_t(i)]);
  }
  return f;
}

void dispatch::reserve_dense(Handle::Impl& impl, Stream stream, size_t workspace_bytes) {
  if (impl.sim) return;
  StreamArena& arena = impl.arena(stream, impl.device_of(stream));
  std::lock_guard<std::mutex> lock(arena.mu);
  impl.reserve(arena, workspace_bytes, stream);
}

bool dispatch::replay_graph(Handle::Impl& impl, const std::string& key, Stream stream) {
  std::lock_guard<std::mutex> lock(impl.graph_mu);
  auto it = impl.graphs.find(key);
  if (it == impl.graphs.end()) return false;
  if (it->second.epoch != arena_epoch.load()) {  // a buffer it holds may be gone: capture anew
    cudaGraphExecDestroy(it->second.exec);
    impl.graphs.erase(it);
    return false;
  }
  cuda_check(cudaGraphLaunch(it->second.exec, reinterpret_cast<cudaStream_t>(stream)), "grouped_gemm: graph replay");
  it->second.last_use = ++impl.graph_clock;
  ++impl.graph_counts.replays;
  return true;
}

void dispatch::keep_graph(Handle::Impl& impl, const std::string& key, void* exec, uint64_t epoch) {
  constexpr size_t kMaxGraphs = 64;
  std::lock_guard<std::mutex> lock(impl.graph_mu);
  ++impl.graph_counts.captures;
  auto& slot = impl.graphs[key];
  if (slot.exec) cudaGraphExecDestroy(slot.exec);  // another thread captured the same call meanwhile
  slot = {static_cast<cudaGraphExec_t>(exec), epoch, ++impl.graph_clock};
  if (impl.graphs.size() <= kMaxGraphs) return;
  auto oldest = impl.graphs.begin();
  for (auto it = impl.graphs.begin(); it != impl.graphs.end(); ++it)
    if (it->second.last_use < oldest->second.last_use) oldest = it;
  cudaGraphExecDestroy(oldest->second.exec);
  impl.graphs.erase(oldest);
}

uint64_t dispatch::arena_epoch_now() { return arena_epoch.load(); }

Handle::GraphCounts Handle::grouped_graph_counts() const {
  std::lock_guard<std::mutex> lock(impl_->graph_mu);
  return impl_->graph_counts;
}

const Plan& dispatch::cached_plan(Handle::Impl& impl, const GemmArgs& args, Stream stream) {
  return impl.cached_plan(GemmProblem::from(args), impl.device_of(stream));
}

dispatch::GroupedPlanCache& dispatch::grouped_plans(Handle::Impl& impl) { return impl.grouped_plans; }

const HandleOptions& dispatch::handle_options(const Handle::Impl& impl) { return impl.options; }
verify::Mode dispatch::handle_verify_mode(const Handle::Impl& impl) { return impl.verify_mode; }

const DeviceTarget& dispatch::device_target(const Handle::Impl& impl, int device) { return impl.target_of(device); }

Plan Handle::plan(const GemmArgs& args, Stream stream) {
  return impl_->cached_plan(GemmProblem::from(args), impl_->device_of(stream));
}

void Handle::gemm(const GemmArgs& args, Stream stream) {
  throw_if_any(validate(args), StatusCode::kInvalidArgument);
  const int device = impl_->device_of(stream);
  throw_if_any(impl_->check_pointers(args, stream, device), StatusCode::kInvalidArgument);
  impl_->run(args, impl_->cached_plan(GemmProblem::from(args), device), stream, device);
}

void dispatch::run_planned(Handle::Impl& impl, const GemmArgs& args, const Plan& plan, Stream stream) {
  impl.run(args, plan, stream, args.space == MemorySpace::kHost ? -1 : impl.device_of(stream));
}

void Handle::Impl::run(const GemmArgs& args, const Plan& plan, Stream stream, int device) {
  if (args.space == MemorySpace::kHost) {  // the host reference, synchronously: no stream resources
    dispatch::execute(args, plan, backends::RunContext{});
    return;
  }
  dispatch::refuse_to_run_simulated(*this);
  // Launches, allocations and cuBLASLt calls go to the stream's device, whichever is current (a
  // default stream's device is the current one already).
  const dispatch::DeviceScope scope(dispatch::is_default_stream(stream) ? -1 : device);
  StreamArena& arena = this->arena(stream, device);
  {
    std::lock_guard<std::mutex> lock(arena.mu);
    reserve(arena, plan.workspace_bytes, stream);
    dispatch::execute(args, plan,
                      {stream, &arena.lt, arena.lt_workspace, arena.lt_bytes, arena.scratch, &target_of(device)});
    if (verify_mode == verify::Mode::kSample) {
      // After the launches, so that polling never delays the GEMM: an earlier call on this stream
      // that failed its check is reported now (this call's result is already on its way).
      arena.sampler->poll();
      arena.sampler->enqueue(args, plan, stream);
    }
  }
  if (verify_mode == verify::Mode::kFull) {
    try {  // its buffers are allocated after the call: say what a failed one leaves in D
      verify::check(args, plan, verify_mode, stream);
    } catch (const Error& e) {
      if (e.code() != StatusCode::kOutOfMemory) throw;
      throw Error(StatusCode::kOutOfMemory,
                  "SCALEMM_VERIFY=full could not check the call: " + e.status().message + "; D holds its unverified result");
    }
  }
}

void Handle::check_verification() {
  std::vector<StreamArena*> all;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (auto& kv : impl_->arenas) all.push_back(kv.second.get());
  }
  for (StreamArena* a : all) {
    const dispatch::DeviceScope scope(impl_->sim ? -1 : a->device);
    std::lock_guard<std::mutex> lock(a->mu);
    if (a->sampler) a->sampler->drain();
  }
}

}  // namespace scalemm
