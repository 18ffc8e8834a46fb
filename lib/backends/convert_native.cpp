// The convert-then-native backend: exact rewrites that turn a problem cuBLASLt refuses into one it
// runs. Two of them:
//  * VEC128/BLK128x128 pairs with M not a multiple of 4 (decoding, M = 1): A with zero rows appended
//    to M rounded up to 4, cuBLASLt into a scratch D, then D's first M rows copied out. Zero rows of A
//    give zero rows of D, and A's cuBLASLt-format scale buffer already has roundup(M, 4) rows (VEC128:
//    kb * roundup(M,4) + r; BLK128x128: one grid row per 128 rows), so only A's data and D are copied.
//  * tensorwise x rowwise (either way): the single scale broadcast to a vector, an OUTER_VEC_32F pair.
#include <cuda_runtime_api.h>

#include "backends/backend.hpp"
#include "backends/native.hpp"
#include "base/capabilities.hpp"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/layouts/convert_cuda.hpp"
#include "scalemm/layouts/scale_layout.hpp"

namespace scalemm::backends {
namespace {

// Slots 0 and 1 are native::kScaleA/kScaleB (the scale conversions of the padded path).
enum Slot : int { kPaddedA = 2, kPaddedD = 3, kBroadcast = 4, kRowwiseRealigned = 5 };

bool block_fp32(Recipe r) { return r == Recipe::kBlock1x128 || r == Recipe::kBlock128x128; }

class ConvertNative final : public BackendImpl {
 public:
  Backend id() const override { return Backend::kConvertNative; }

  Verdict plan(const GemmProblem& p, const DeviceTarget& t, Plan& plan) const override {
    if (block_fp32(p.a_recipe) && block_fp32(p.b_recipe) && p.m % 4 != 0 && p.space == MemorySpace::kDevice &&
        t.has_gpu())
      return plan_pad_m(p, t, plan);
    const bool tw_rw = (p.a_recipe == Recipe::kTensorwise && p.b_recipe == Recipe::kRowwise) ||
                       (p.a_recipe == Recipe::kRowwise && p.b_recipe == Recipe::kTensorwise);
    // Host pointers stop every cuBLASLt path, whatever the recipes: say that, not that the pair
    // cannot be made native (it may be native on this device already).
    if (p.space == MemorySpace::kHost) return {false, "host pointers: cuBLASLt needs device memory", true};
    if (!tw_rw) {
      if (base::native_blocker(p, t).empty()) return {false, "the pair is native: nothing to convert", true};
      return {false, "no exact recipe conversion makes " + std::string(to_string(p.a_recipe)) + "\xC3\x97" +
                         std::string(to_string(p.b_recipe)) + " native"};
    }
    GemmProblem q = p;
    q.a_recipe = q.b_recipe = Recipe::kRowwise;
    const std::string blocker = base::native_blocker(q, t);
    if (!blocker.empty()) return {false, "as rowwise\xC3\x97rowwise: " + blocker};
    const bool a_is_tw = p.a_recipe == Recipe::kTensorwise;
    const int64_t len = a_is_tw ? p.m : p.n;
    plan.conversions.push_back({std::string(a_is_tw ? "scale_a" : "scale_b") +
                                    ": tensorwise -> rowwise (broadcast to " + std::to_string(len) + " rows)",
                                len * 4});
    plan.reserve(kBroadcast, static_cast<size_t>(len) * 4);
    plan.reserve(kRowwiseRealigned, static_cast<size_t>(a_is_tw ? p.n : p.m) * 4);  // see native::realign
    plan.cublas_scale_mode_a = plan.cublas_scale_mode_b = base::kOuterVec32F;
    return {true, "convert-then-native: tensorwise broadcast to rowwise (exact), cuBLASLt OUTER_VEC_32F"};
  }

  void run(const GemmArgs& args, const Plan& plan, const RunContext& ctx) const override {
    if (plan.padded_m) {
      run_pad_m(args, plan, ctx);
      return;
    }
    const bool a_is_tw = args.a.recipe == Recipe::kTensorwise;
    auto* vec = ctx.slice<float>(plan, kBroadcast);
    layouts::gpu::broadcast_tensorwise(static_cast<const float*>(a_is_tw ? args.a.scale : args.b.scale), vec,
                                       a_is_tw ? args.m : args.n, ctx.stream);
    const void* rowwise_scale = a_is_tw ? args.b.scale : args.a.scale;
    native::realign(a_is_tw ? args.b : args.a, a_is_tw ? args.n : args.m, args.k, plan, ctx, kRowwiseRealigned,
                    rowwise_scale);
    LtCall c;
    c.m = args.m, c.n = args.n, c.k = args.k;
    c.a_dtype = args.a.dtype, c.b_dtype = args.b.dtype, c.d_dtype = args.d_dtype;
    c.a_scale_mode = c.b_scale_mode = base::kOuterVec32F;
    c.a = args.a.data, c.b = args.b.data, c.d = args.d, c.bias = args.bias;
    c.a_scale = a_is_tw ? vec : rowwise_scale;
    c.b_scale = a_is_tw ? rowwise_scale : vec;
    c.alpha = native::folded_alpha(args);
    c.fast_accum = args.fast_accum;
    ctx.matmul(c);
  }

 private:
  static Verdict plan_pad_m(const GemmProblem& p, const DeviceTarget& t, Plan& plan) {
    GemmProblem q = p;
    q.m = layouts::round_up(p.m, 4);
    const std::string blocker = base::native_blocker(q, t);
    if (!blocker.empty()) return {false, "padded to M=" + std::to_string(q.m) + ": " + blocker};
    const layouts::ScaleLayout a_lt(p.a_recipe, p.m, p.k, ScaleFormat::kCublasLt);
    if (a_lt.size() != layouts::ScaleLayout(p.a_recipe, q.m, p.k, ScaleFormat::kCublasLt).size())
      return {false, "scale_a's cuBLASLt buffer does not cover M=" + std::to_string(q.m)};
    native::plan_scales(p, plan);
    const size_t a_bytes = static_cast<size_t>(q.m * p.k);
    const size_t d_bytes = static_cast<size_t>(dtype_storage_bytes(p.d_dtype, q.m * p.n));
    plan.conversions.push_back(
        {"a: M=" + std::to_string(p.m) + " -> " + std::to_string(q.m) + " rows (zero rows appended)", int64_t(a_bytes)});
    plan.conversions.push_back(
        {"d: first " + std::to_string(p.m) + " of " + std::to_string(q.m) + " rows copied out", int64_t(d_bytes)});
    plan.reserve(kPaddedA, a_bytes);
    plan.reserve(kPaddedD, d_bytes);
    plan.padded_m = q.m;
    return {true, "convert-then-native: A padded to M=" + std::to_string(q.m) + " with zero rows (exact), cuBLASLt " +
                      base::scale_mode_name(plan.cublas_scale_mode_a) + "\xC3\x97" +
                      base::scale_mode_name(plan.cublas_scale_mode_b)};
  }

  static void run_pad_m(const GemmArgs& args, const Plan& plan, const RunContext& ctx) {
    const void* scale_ptr[2] = {args.a.scale, args.b.scale};
    native::run_scales(args, plan, ctx, scale_ptr);
    const cudaStream_t cs = ctx.stream;
    const size_t row_a = static_cast<size_t>(args.k);
    const size_t row_d = static_cast<size_t>(dtype_storage_bytes(args.d_dtype, args.n));
    const size_t pad_rows = static_cast<size_t>(plan.padded_m - args.m);
    char* a_pad = ctx.slice<char>(plan, kPaddedA);
    char* d_pad = ctx.slice<char>(plan, kPaddedD);
    detail::cuda_check(cudaMemcpyAsync(a_pad, args.a.data, row_a * size_t(args.m), cudaMemcpyDeviceToDevice, cs), "pad A");
    detail::cuda_check(cudaMemsetAsync(a_pad + row_a * size_t(args.m), 0, row_a * pad_rows, cs), "pad A");
    ctx.matmul(native::lt_call(args, scale_ptr, a_pad, plan.padded_m, d_pad));
    detail::cuda_check(cudaMemcpyAsync(args.d, d_pad, row_d * size_t(args.m), cudaMemcpyDeviceToDevice, cs), "copy out D");
  }
};

}  // namespace

const BackendImpl& convert_native_backend() {
  static const ConvertNative b;
  return b;
}

}  // namespace scalemm::backends
