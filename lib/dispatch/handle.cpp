// Handle: plan cache, per-stream resources, execution of a plan, optional verification.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "../backends/cublaslt.hpp"
#include "../hash.hpp"
#include "capabilities.hpp"
#include "kernels.cuh"
#include "operands.hpp"
#include "scalemm/emulation/emulation.hpp"
#include "scalemm/formats.hpp"
#include "scalemm/gemm.hpp"
#include "scalemm/layouts/convert_cuda.hpp"
#include "scalemm/layouts/scale_layout.hpp"
#include "verify.hpp"

namespace scalemm {
namespace {

void cuda_check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess)
    throw Error(e == cudaErrorMemoryAllocation ? StatusCode::kOutOfMemory : StatusCode::kCudaError,
                what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

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
  std::unique_ptr<verify::AsyncSampler> sampler;  // SCALEMM_VERIFY=sample only

  ~StreamArena() {
    sampler.reset();  // reports an unreported failure before the buffers go
    if (lt_workspace) cudaFree(lt_workspace);
    if (scratch) cudaFree(scratch);
  }

  void reserve(size_t bytes, Stream stream) {
    if (bytes <= scratch_bytes) return;
    // Growing happens when a new, larger problem is first planned on this stream: wait for the work
    // that may still read the old buffer, then replace it.
    cuda_check(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)), "scratch growth");
    if (scratch) cudaFree(scratch);
    scratch = nullptr;
    scratch_bytes = 0;
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, bytes), "scalemm scratch (" + std::to_string(bytes) + " B)");
    scratch = static_cast<char*>(p);
    scratch_bytes = bytes;
  }
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

  void run_host_reference(const GemmArgs& args);
  void run_device(const GemmArgs& args, const Plan& plan, StreamArena& arena, Stream stream);
};

void Handle::Impl::run_host_reference(const GemmArgs& args) {
  std::vector<float> bias;
  emulation::GemmOptions opt;
  opt.alpha = args.alpha * args.a.global_scale * args.b.global_scale;
  opt.out_dtype = args.d_dtype;
  std::vector<float> staged;
  if (is_fp8_output(args.d_dtype)) {  // fp32 D, then the FP8 conversion (as finish_fp8_output)
    staged.resize(static_cast<size_t>(args.m * args.n));
    opt.out_dtype = DType::kF32;
  }
  if (args.bias) {
    bias.resize(static_cast<size_t>(args.n));
    const auto* b = static_cast<const uint16_t*>(args.bias);
    for (int64_t i = 0; i < args.n; ++i) bias[size_t(i)] = formats::decode_bf16(b[i]);
    opt.bias = bias.data();
  }
  emulation::gemm_host(dispatch::as_quantized(args.a, args.m, args.k), dispatch::as_quantized(args.b, args.n, args.k),
                       staged.empty() ? args.d : staged.data(), opt);
  if (staged.empty()) return;
  const float ds = *args.d_scale;
  float amax = 0.0f;
  auto* d = static_cast<uint8_t*>(args.d);
  for (size_t i = 0; i < staged.size(); ++i) {
    amax = std::fmax(amax, std::fabs(staged[i]));
    d[i] = args.d_dtype == DType::kE4M3 ? formats::encode_e4m3(ds * staged[i]) : formats::encode_e5m2(ds * staged[i]);
  }
  if (args.d_amax) *args.d_amax = amax;
}

namespace {

// The native cuBLASLt call of a GEMM whose A may be a padded copy (a_data, m).
backends::LtCall native_call(const GemmArgs& args, const void* const scale_ptr[2], const void* a_data, int64_t m,
                             void* d, float alpha) {
  backends::LtCall c;
  c.m = m, c.n = args.n, c.k = args.k;
  c.a_dtype = args.a.dtype, c.b_dtype = args.b.dtype, c.d_dtype = args.d_dtype;
  c.a_scale_mode = dispatch::recipe_scale_mode(args.a.recipe);
  c.b_scale_mode = dispatch::recipe_scale_mode(args.b.recipe);
  c.a = a_data, c.b = args.b.data, c.d = d, c.bias = args.bias;
  c.a_scale = scale_ptr[0], c.b_scale = scale_ptr[1];
  c.alpha = alpha;
  c.d_scale = args.d_scale, c.d_amax = args.d_amax;
  return c;
}

// Converts the scale buffers the plan marks from compact to cuBLASLt format into scratch and points
// scale_ptr at the results: small buffers (both operands) in one launch, large ones through the
// bandwidth kernels of layouts::gpu.
template <class Take>
void convert_scales(const GemmArgs& args, const Plan& plan, const void* scale_ptr[2], Take& take, Stream stream) {
  const GemmOperand* ops[2] = {&args.a, &args.b};
  const int64_t rows[2] = {args.m, args.n};
  const bool convert[2] = {plan.convert_scale_a, plan.convert_scale_b};
  dispatch::ScaleConversion small[2];
  int n_small = 0;
  int64_t small_elems = 0;
  for (int i = 0; i < 2; ++i) {
    const GemmOperand& op = *ops[i];
    if (!convert[i]) continue;
    const layouts::ScaleLayout from(op.recipe, rows[i], args.k, ScaleFormat::kCompact);
    const layouts::ScaleLayout to = from.with_format(ScaleFormat::kCublasLt);
    void* dst = take(static_cast<size_t>(to.bytes()));
    scale_ptr[i] = dst;
    small[n_small++] = {from, to, op.scale, dst};
    small_elems += to.size();
  }
  if (small_elems <= dispatch::kSmallConversionElements) {
    dispatch::convert_scales_small(small, n_small, stream);
  } else {
    for (int i = 0; i < n_small; ++i)
      layouts::gpu::convert(small[i].from, small[i].src, small[i].to, small[i].dst,
                            reinterpret_cast<cudaStream_t>(stream));
  }
}

}  // namespace

void Handle::Impl::run_device(const GemmArgs& args, const Plan& plan, StreamArena& arena, Stream stream) {
  const cudaStream_t cs = reinterpret_cast<cudaStream_t>(stream);
  char* scratch = arena.scratch;
  auto take = [&](size_t bytes) {
    char* p = scratch;
    scratch += align256(bytes);
    return p;
  };
  const float alpha = args.alpha * args.a.global_scale * args.b.global_scale;

  switch (plan.backend) {
    case Backend::kNative: {
      const void* scale_ptr[2] = {args.a.scale, args.b.scale};
      convert_scales(args, plan, scale_ptr, take, stream);
      arena.lt.matmul(native_call(args, scale_ptr, args.a.data, args.m, args.d, alpha), arena.lt_workspace,
                      arena.lt_bytes, stream);
      return;
    }
    case Backend::kConvertNative: {
      if (plan.padded_m) {
        // A with zero rows appended, the GEMM on padded_m rows into scratch, then D's first M rows.
        const void* scale_ptr[2] = {args.a.scale, args.b.scale};
        convert_scales(args, plan, scale_ptr, take, stream);
        const size_t row_a = static_cast<size_t>(args.k), row_d = static_cast<size_t>(dtype_storage_bytes(args.d_dtype, args.n));
        const size_t pad_rows = static_cast<size_t>(plan.padded_m - args.m);
        char* a_pad = take(row_a * size_t(plan.padded_m));
        char* d_pad = take(row_d * size_t(plan.padded_m));
        cuda_check(cudaMemcpyAsync(a_pad, args.a.data, row_a * size_t(args.m), cudaMemcpyDeviceToDevice, cs), "pad A");
        cuda_check(cudaMemsetAsync(a_pad + row_a * size_t(args.m), 0, row_a * pad_rows, cs), "pad A");
        arena.lt.matmul(native_call(args, scale_ptr, a_pad, plan.padded_m, d_pad, alpha), arena.lt_workspace,
                        arena.lt_bytes, stream);
        cuda_check(cudaMemcpyAsync(args.d, d_pad, row_d * size_t(args.m), cudaMemcpyDeviceToDevice, cs), "copy out D");
        return;
      }
      const bool a_is_tw = args.a.recipe == Recipe::kTensorwise;
      const int64_t len = a_is_tw ? args.m : args.n;
      auto* vec = reinterpret_cast<float*>(take(static_cast<size_t>(len) * 4));
      dispatch::broadcast_scalar(static_cast<const float*>(a_is_tw ? args.a.scale : args.b.scale), vec, len, stream);
      backends::LtCall c;
      c.m = args.m, c.n = args.n, c.k = args.k;
      c.a_dtype = args.a.dtype, c.b_dtype = args.b.dtype, c.d_dtype = args.d_dtype;
      c.a_scale_mode = c.b_scale_mode = dispatch::kOuterVec32F;
      c.a = args.a.data, c.b = args.b.data, c.d = args.d, c.bias = args.bias;
      c.a_scale = a_is_tw ? vec : args.a.scale;
      c.b_scale = a_is_tw ? args.b.scale : vec;
      c.alpha = alpha;
      arena.lt.matmul(c, arena.lt_workspace, arena.lt_bytes, stream);
      return;
    }
    case Backend::kEmulated: {
      // Exact dequantization to BF16. A power-of-two shift chosen on the device (no host sync, graph-
      // capturable) moves an operand whose values would fall under BF16's subnormal floor, and the
      // opposite shift on the other operand keeps the product, so alpha stays a host value.
      auto* shifts = reinterpret_cast<dispatch::EmulatedShifts*>(take(sizeof(dispatch::EmulatedShifts)));
      auto* a16 = reinterpret_cast<uint16_t*>(take(static_cast<size_t>(args.m * args.k) * 2));
      auto* b16 = reinterpret_cast<uint16_t*>(take(static_cast<size_t>(args.n * args.k) * 2));
      const dispatch::EmulatedOperand ea{args.a.data, args.a.dtype, args.a.scale,
                                         layouts::ScaleLayout(args.a.recipe, args.m, args.k, args.a.scale_format)};
      const dispatch::EmulatedOperand eb{args.b.data, args.b.dtype, args.b.scale,
                                         layouts::ScaleLayout(args.b.recipe, args.n, args.k, args.b.scale_format)};
      dispatch::emulated_prepare(ea, eb, shifts, stream);
      dispatch::emulated_dequantize_bf16(ea, shifts, 0, a16, stream);
      dispatch::emulated_dequantize_bf16(eb, shifts, 1, b16, stream);
      backends::LtCall c;
      c.m = args.m, c.n = args.n, c.k = args.k;
      c.a_dtype = c.b_dtype = DType::kBF16, c.d_dtype = args.d_dtype;
      c.a = a16, c.b = b16, c.d = args.d, c.bias = args.bias;
      c.alpha = alpha;
      arena.lt.matmul(c, arena.lt_workspace, arena.lt_bytes, stream);
      return;
    }
    case Backend::kReference: {
      emulation::GemmOptions opt;
      opt.alpha = alpha;
      opt.out_dtype = args.d_dtype;
      if (args.bias) {
        auto* b32 = reinterpret_cast<float*>(take(static_cast<size_t>(args.n) * 4));
        dispatch::bf16_to_f32(static_cast<const uint16_t*>(args.bias), b32, args.n, stream);
        opt.bias = b32;
      }
      const auto qa = dispatch::as_quantized(args.a, args.m, args.k), qb = dispatch::as_quantized(args.b, args.n, args.k);
      const size_t ws = emulation::gemm_device_workspace_bytes(qa, qb);
      void* w = take(ws);
      emulation::gemm_device(qa, qb, args.d, opt, w, ws, cs);
      return;
    }
  }
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

Plan Handle::plan(const GemmArgs& args) { return impl_->cached_plan(GemmProblem::from(args)); }

void Handle::gemm(const GemmArgs& args, Stream stream) {
  throw_if_any(validate(args), StatusCode::kInvalidArgument);
  const Plan& plan = impl_->cached_plan(GemmProblem::from(args));
  if (args.space == MemorySpace::kHost) {
    impl_->run_host_reference(args);
    return;
  }
  StreamArena& arena = impl_->arena(stream);
  {
    std::lock_guard<std::mutex> lock(arena.mu);
    // The plan's scratch, plus room for the small per-call items (bias in f32, shifts, device alpha).
    size_t need = plan.workspace_bytes + align256(static_cast<size_t>(args.n) * 4) + 3 * 256;
    if (plan.backend == Backend::kReference)
      need += align256(emulation::gemm_device_workspace_bytes(dispatch::as_quantized(args.a, args.m, args.k),
                                                              dispatch::as_quantized(args.b, args.n, args.k)));
    // A staged FP8 output lives after everything the backend takes from the front of the scratch.
    const size_t staged_at = need;
    need += align256(plan.staged_output_bytes);
    arena.reserve(need, stream);
    if (impl_->verify_mode == verify::Mode::kSample && !arena.sampler)
      arena.sampler = std::make_unique<verify::AsyncSampler>();
    if (plan.staged_output_bytes) {
      GemmArgs staged = args;
      staged.d = arena.scratch + staged_at;
      staged.d_dtype = DType::kF32;
      staged.d_scale = nullptr;
      staged.d_amax = nullptr;
      impl_->run_device(staged, plan, arena, stream);
      dispatch::finish_fp8_output(static_cast<const float*>(staged.d), args.d, args.d_dtype, args.m * args.n,
                                  args.d_scale, args.d_amax, stream);
    } else {
      impl_->run_device(args, plan, arena, stream);
    }
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
