// The native backend: cuBLASLt with each recipe's own scale mode, scales converted from compact to
// cuBLASLt's layout first when they differ.
#include "backends/native.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/capabilities.hpp"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/layouts/convert_cuda.hpp"
#include "scalemm/layouts/scale_layout.hpp"

namespace scalemm::backends::native {
namespace {

// True when two layouts of one operand place every scale at the same offset in buffers of the same
// size (e.g. block128x128 with a K-block count divisible by 4: compact and cuBLASLt coincide). Walks
// the grid through offset() once per plan; the first difference ends it.
bool same_buffer(const layouts::ScaleLayout& x, const layouts::ScaleLayout& y) {
  if (x.size() != y.size()) return false;
  for (int64_t g = 0; g < x.grid_rows(); ++g) {
    const int64_t r = g * x.block_rows();
    for (int64_t kb = 0; kb < x.kblocks(); ++kb)
      if (x.offset(r, kb) != y.offset(r, kb)) return false;
  }
  return true;
}

}  // namespace

void plan_scales(const GemmProblem& p, Plan& plan) {
  struct Side {
    const char* name;
    Recipe recipe;
    ScaleFormat format;
    int64_t rows;
    bool* flag;
    int tag;
  } sides[] = {{"scale_a", p.a_recipe, p.a_format, p.m, &plan.convert_scale_a, kScaleA},
               {"scale_b", p.b_recipe, p.b_format, p.n, &plan.convert_scale_b, kScaleB}};
  for (const auto& s : sides) {
    if (s.format == ScaleFormat::kCublasLt) continue;
    const layouts::ScaleLayout compact(s.recipe, s.rows, p.k, ScaleFormat::kCompact);
    const layouts::ScaleLayout lt = compact.with_format(ScaleFormat::kCublasLt);
    if (same_buffer(compact, lt)) {
      // Already cuBLASLt's layout, but compact buffers need only 4-byte alignment and cuBLASLt fails
      // at matmul on a scale pointer off 16 bytes: such a buffer is copied here at run time.
      plan.reserve(s.tag, static_cast<size_t>(lt.bytes()));
      continue;
    }
    *s.flag = true;
    plan.conversions.push_back({std::string(s.name) + ": " + std::string(to_string(s.recipe)) +
                                    " compact -> cublaslt " + lt.shape_stride_string(),
                                lt.bytes()});
    plan.reserve(s.tag, static_cast<size_t>(lt.bytes()));
  }
  // cuBLASLt's A is the user's B (and vice versa) after the row-major swap.
  plan.cublas_scale_mode_a = base::recipe_scale_mode(p.b_recipe);
  plan.cublas_scale_mode_b = base::recipe_scale_mode(p.a_recipe);
}

void realign(const GemmOperand& op, int64_t rows, int64_t k, const Plan& plan, const RunContext& ctx, int tag,
             const void*& scale_ptr) {
  if (op.scale_format != ScaleFormat::kCompact || (reinterpret_cast<uintptr_t>(op.scale) & 15u) == 0) return;
  void* dst = ctx.slice(plan, tag);
  const layouts::ScaleLayout l(op.recipe, rows, k, ScaleFormat::kCompact);
  detail::cuda_check(cudaMemcpyAsync(dst, op.scale, size_t(l.bytes()), cudaMemcpyDeviceToDevice, ctx.stream),
                     "native: copy a scale buffer to a 16-byte aligned slice");
  scale_ptr = dst;
}

// Small buffers (both operands) convert in one launch, large ones through the bandwidth kernels.
void run_scales(const GemmArgs& args, const Plan& plan, const RunContext& ctx, const void* scale_ptr[2]) {
  const GemmOperand* ops[2] = {&args.a, &args.b};
  const int64_t rows[2] = {args.m, args.n};
  const bool convert[2] = {plan.convert_scale_a, plan.convert_scale_b};
  layouts::gpu::ScaleConversion conv[2];
  int count = 0;
  int64_t elems = 0;
  for (int i = 0; i < 2; ++i) {
    if (!convert[i]) {
      realign(*ops[i], rows[i], args.k, plan, ctx, i == 0 ? kScaleA : kScaleB, scale_ptr[i]);
      continue;
    }
    const layouts::ScaleLayout from(ops[i]->recipe, rows[i], args.k, ScaleFormat::kCompact);
    const layouts::ScaleLayout to = from.with_format(ScaleFormat::kCublasLt);
    void* dst = ctx.slice(plan, i == 0 ? kScaleA : kScaleB);
    scale_ptr[i] = dst;
    conv[count++] = {from, to, ops[i]->scale, dst};
    elems += to.size();
  }
  if (count == 0) return;
  if (elems <= layouts::gpu::kSmallConversionElements) {
    layouts::gpu::convert_small(conv, count, ctx.stream);
  } else {
    for (int i = 0; i < count; ++i) layouts::gpu::convert(conv[i].from, conv[i].src, conv[i].to, conv[i].dst, ctx.stream);
  }
}

LtCall lt_call(const GemmArgs& args, const void* const scale_ptr[2], const void* a_data, int64_t m, void* d) {
  LtCall c;
  c.m = m, c.n = args.n, c.k = args.k;
  c.a_dtype = args.a.dtype, c.b_dtype = args.b.dtype, c.d_dtype = args.d_dtype;
  c.a_scale_mode = base::recipe_scale_mode(args.a.recipe);
  c.b_scale_mode = base::recipe_scale_mode(args.b.recipe);
  c.a = a_data, c.b = args.b.data, c.d = d, c.bias = args.bias;
  c.a_scale = scale_ptr[0], c.b_scale = scale_ptr[1];
  c.alpha = folded_alpha(args);
  c.d_scale = args.d_scale, c.d_amax = args.d_amax;
  c.fast_accum = args.fast_accum;
  return c;
}

namespace {

class Native final : public BackendImpl {
 public:
  Backend id() const override { return Backend::kNative; }

  Verdict plan(const GemmProblem& p, const DeviceTarget& t, Plan& plan) const override {
    const std::string blocker = base::native_blocker(p, t);
    if (!blocker.empty()) return {false, blocker};
    plan_scales(p, plan);
    return {true, std::string("native: cuBLASLt ") + base::scale_mode_name(plan.cublas_scale_mode_a) +
                      "\xC3\x97" + base::scale_mode_name(plan.cublas_scale_mode_b) + " on " + t.to_string()};
  }

  void run(const GemmArgs& args, const Plan& plan, const RunContext& ctx) const override {
    const void* scale_ptr[2] = {args.a.scale, args.b.scale};
    run_scales(args, plan, ctx, scale_ptr);
    ctx.matmul(lt_call(args, scale_ptr, args.a.data, args.m, args.d));
  }
};

}  // namespace
}  // namespace scalemm::backends::native

namespace scalemm::backends {
const BackendImpl& native_backend() {
  static const native::Native b;
  return b;
}
}  // namespace scalemm::backends
