// Handle: what a handle is. The plan cache, per-stream resources (cuBLASLt context and workspace, the
// plans' scratch), and the verification hooks; plans are made in planner.cpp, run by lib/backends/.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backends/backend.hpp"
#include "dispatch/handle_scratch.hpp"
#include "dispatch/verify.hpp"
#include "hash.hpp"
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

// Device memory owned by one stream: nothing here is ever shared by GEMMs that can run concurrently.
struct StreamArena {
  std::mutex mu;  // held while one GEMM's launches are enqueued, so scratch is not interleaved
  backends::LtContext lt;
  void* lt_workspace = nullptr;
  size_t lt_bytes = 0;
  char* scratch = nullptr;
  size_t scratch_bytes = 0;
  std::mutex staging_mu;  // held by one grouped call while it stages operands (dispatch::staging_scratch)
  char* staging = nullptr;
  size_t staging_bytes = 0;
  std::unique_ptr<verify::AsyncSampler> sampler;  // SCALEMM_VERIFY=sample only

  ~StreamArena() {
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
    if (buf) cudaFree(buf);
    buf = nullptr;
    have = 0;
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, bytes), std::string(what) + " (" + std::to_string(bytes) + " B)");
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
                          uint64_t(p.space) << 58;
    uint64_t h = detail::kHashSeed;
    for (uint64_t v : {uint64_t(p.m), uint64_t(p.n), uint64_t(p.k), tags}) h = detail::hash_mix(h, v);
    return size_t(h);
  }
};

bool autotune_from_environment() {
  const char* v = std::getenv("SCALEMM_AUTOTUNE");
  return v && (std::string(v) == "1" || std::string(v) == "on");
}

}  // namespace

struct Handle::Impl {
  HandleOptions options;
  DeviceTarget target;
  verify::Mode verify_mode = verify::Mode::kOff;
  bool autotune = false;

  std::mutex mu;  // guards the maps below
  std::unordered_map<GemmProblem, Plan, ProblemHash> plans;  // node-based: references stay valid
  std::map<Stream, std::unique_ptr<StreamArena>> arenas;
  // Addresses already found to be device-accessible (device, managed or pinned host memory). Under
  // unified addressing such an address stays device memory while the context lives, so a warm call
  // (and a call inside a graph capture after a warm-up) asks CUDA nothing about its pointers.
  std::unordered_set<const void*> device_pointers;

  Diagnostics check_pointer_spaces(const GemmArgs& args, Stream stream);

  const Plan& cached_plan(const GemmProblem& p) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = plans.find(p);
    if (it != plans.end()) return it->second;
    Plan made = scalemm::plan(p, target, options.plan);
    if (log_plans()) std::fprintf(stderr, "scalemm plan: %s\n", made.explain().c_str());
    return plans.emplace(p, std::move(made)).first->second;
  }

  StreamArena& arena(Stream s) {
    std::lock_guard<std::mutex> lock(mu);
    auto& slot = arenas[s];
    if (!slot) {
      auto a = std::make_unique<StreamArena>();
      a->lt.set_autotune(autotune);
      cuda_check(cudaMalloc(&a->lt_workspace, options.cublaslt_workspace_bytes), "cuBLASLt workspace");
      a->lt_bytes = options.cublaslt_workspace_bytes;
      slot = std::move(a);
    }
    return *slot;
  }
};

// A host pointer given as device memory makes a kernel fault (a sticky error that ends the process's
// CUDA context); a device pointer given as host memory crashes the host reference. Both are reported
// as invalid arguments before anything runs.
Diagnostics Handle::Impl::check_pointer_spaces(const GemmArgs& args, Stream stream) {
  Diagnostics out;
  const std::pair<const char*, const void*> pointers[] = {
      {"a", args.a.data}, {"scale_a", args.a.scale}, {"b", args.b.data}, {"scale_b", args.b.scale},
      {"d", args.d},      {"bias", args.bias},       {"d_scale", args.d_scale}, {"d_amax", args.d_amax}};
  constexpr int kCount = int(sizeof(pointers) / sizeof(pointers[0]));
  const bool device = args.space == MemorySpace::kDevice;
  if (!device && !target.has_gpu()) return out;  // no GPU: every pointer is host memory
  bool known[kCount] = {};
  if (device) {  // a warm call: every address seen before, one lock, no CUDA query
    std::lock_guard<std::mutex> lock(mu);
    bool all = true;
    for (int i = 0; i < kCount; ++i) {
      known[i] = !pointers[i].second || device_pointers.count(pointers[i].second) != 0;
      all = all && known[i];
    }
    if (all) return out;
    // A new address during a graph capture is left unchecked rather than queried: the capture must
    // not depend on which calls the driver counts as safe while capturing.
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &capturing) != cudaSuccess) {
      cudaGetLastError();
      return out;
    }
    if (capturing != cudaStreamCaptureStatusNone) return out;
  }
  for (int i = 0; i < kCount; ++i) {
    const auto& [name, p] = pointers[i];
    if (!p || known[i]) continue;
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
      cudaGetLastError();  // not a sticky error: the query failed, the pointer stays unchecked
      continue;
    }
    const bool host_only = attr.type == cudaMemoryTypeUnregistered;
    const bool device_only = attr.type == cudaMemoryTypeDevice;
    if (device && host_only) {
      out.push_back({name, "pointer-memory-space", std::string(name) + " points to pageable host memory, but the call says device memory",
                     "device memory (cudaMalloc, managed or pinned host memory)", "pageable host memory",
                     "Copy the buffer to the device, or pass space = host with every pointer in host memory."});
    } else if (!device && device_only) {
      out.push_back({name, "pointer-memory-space", std::string(name) + " points to device memory, but the call says host memory",
                     "host memory", "device memory",
                     "Pass space = device with every pointer in device memory, or copy the buffer to the host."});
    } else if (device) {
      std::lock_guard<std::mutex> lock(mu);
      if (device_pointers.size() >= 16384) device_pointers.clear();
      device_pointers.insert(p);
    }
  }
  return out;
}

Handle::Handle(HandleOptions options) : impl_(new Impl) {
  impl_->options = options;
  impl_->target = DeviceTarget::current();
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

const DeviceTarget& Handle::target() const { return impl_->target; }

dispatch::StagingScratch dispatch::staging_scratch(Handle::Impl& impl, Stream stream, size_t bytes) {
  StreamArena& arena = impl.arena(stream);
  StagingScratch s{std::unique_lock<std::mutex>(arena.staging_mu), nullptr};
  StreamArena::grow(arena.staging, arena.staging_bytes, bytes, stream, "scalemm staging");
  s.ptr = arena.staging;
  return s;
}

const HandleOptions& dispatch::handle_options(const Handle::Impl& impl) { return impl.options; }
verify::Mode dispatch::handle_verify_mode(const Handle::Impl& impl) { return impl.verify_mode; }

Plan Handle::plan(const GemmArgs& args) { return impl_->cached_plan(GemmProblem::from(args)); }

void Handle::gemm(const GemmArgs& args, Stream stream) {
  throw_if_any(validate(args), StatusCode::kInvalidArgument);
  throw_if_any(impl_->check_pointer_spaces(args, stream), StatusCode::kInvalidArgument);
  const Plan& plan = impl_->cached_plan(GemmProblem::from(args));
  if (args.space == MemorySpace::kHost) {  // the host reference, synchronously: no stream resources
    dispatch::execute(args, plan, backends::RunContext{});
    return;
  }
  StreamArena& arena = impl_->arena(stream);
  {
    std::lock_guard<std::mutex> lock(arena.mu);
    arena.reserve(plan.workspace_bytes, stream);
    if (impl_->verify_mode == verify::Mode::kSample && !arena.sampler)
      arena.sampler = std::make_unique<verify::AsyncSampler>();
    dispatch::execute(args, plan, {stream, &arena.lt, arena.lt_workspace, arena.lt_bytes, arena.scratch});
    if (impl_->verify_mode == verify::Mode::kSample) {
      // After the launches, so that polling never delays the GEMM: an earlier call on this stream
      // that failed its check is reported now (this call's result is already on its way).
      arena.sampler->poll();
      arena.sampler->enqueue(args, plan, stream);
    }
  }
  if (impl_->verify_mode == verify::Mode::kFull) verify::check(args, plan, impl_->verify_mode, stream);
}

void Handle::check_verification() {
  std::vector<StreamArena*> all;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (auto& kv : impl_->arenas) all.push_back(kv.second.get());
  }
  for (StreamArena* a : all) {
    std::lock_guard<std::mutex> lock(a->mu);
    if (a->sampler) a->sampler->drain();
  }
}

}  // namespace scalemm
