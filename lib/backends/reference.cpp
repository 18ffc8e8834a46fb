// The reference backend: the reference emulator (the verification oracle) as a backend. Device
// pointers run its GPU build (dequantization to f32 + tiled f32 GEMM) on the stream; host pointers run
// the host emulator synchronously.
#include <cmath>
#include <vector>

#include "backends/backend.hpp"
#include "backends/native.hpp"
#include "base/epilogue.hpp"
#include "base/operands.hpp"
#include "scalemm/emulation/emulation.hpp"
#include "scalemm/formats.hpp"

namespace scalemm::backends {
namespace {

enum Slot : int { kGemm = 0, kBiasF32 = 1 };

emulation::QuantizedTensor layout_only(Recipe r, DType t, ScaleFormat f, int64_t rows, int64_t k) {
  emulation::QuantizedTensor q;
  q.dtype = t;
  q.layout = layouts::ScaleLayout(r, rows, k, f);
  return q;
}

// Host memory: the emulator with fp32 accumulation; an FP8 D goes through an fp32 D and the same
// conversion as base::finish_fp8_output.
void run_host(const GemmArgs& args) {
  std::vector<float> bias;
  emulation::GemmOptions opt;
  opt.alpha = native::folded_alpha(args);
  opt.out_dtype = args.d_dtype;
  std::vector<float> staged;
  if (is_fp8_output(args.d_dtype)) {
    staged.resize(static_cast<size_t>(args.m * args.n));
    opt.out_dtype = DType::kF32;
  }
  if (args.bias) {
    bias.resize(static_cast<size_t>(args.n));
    const auto* b = static_cast<const uint16_t*>(args.bias);
    for (int64_t i = 0; i < args.n; ++i) bias[size_t(i)] = formats::decode_bf16(b[i]);
    opt.bias = bias.data();
  }
  emulation::gemm_host(base::as_quantized(args.a, args.m, args.k), base::as_quantized(args.b, args.n, args.k),
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

class Reference final : public BackendImpl {
 public:
  Backend id() const override { return Backend::kReference; }

  Verdict plan(const GemmProblem& p, const DeviceTarget& t, Plan& plan) const override {
    if (p.space == MemorySpace::kHost) return {true, "reference: host emulator (fp32 accumulation)"};
    if (!t.has_gpu()) return {false, "device pointers but no CUDA device to run on"};
    const size_t bytes = static_cast<size_t>(p.m * p.k + p.n * p.k) * 4;
    plan.conversions.push_back({"a, b: dequantize to f32", int64_t(bytes)});
    plan.reserve(kGemm, emulation::gemm_device_workspace_bytes(
                            layout_only(p.a_recipe, p.a_dtype, p.a_format, p.m, p.k),
                            layout_only(p.b_recipe, p.b_dtype, p.b_format, p.n, p.k)));
    if (p.has_bias) plan.reserve(kBiasF32, static_cast<size_t>(p.n) * 4);
    return {true, "reference: GPU dequantization to f32 + tiled f32 GEMM (the verification oracle)"};
  }

  void run(const GemmArgs& args, const Plan& plan, const RunContext& ctx) const override {
    if (args.space == MemorySpace::kHost) {
      run_host(args);
      return;
    }
    emulation::GemmOptions opt;
    opt.alpha = native::folded_alpha(args);
    opt.out_dtype = args.d_dtype;
    if (args.bias) {
      auto* b32 = ctx.slice<float>(plan, kBiasF32);
      base::bf16_to_f32(static_cast<const uint16_t*>(args.bias), b32, args.n, ctx.stream);
      opt.bias = b32;
    }
    const Plan::WorkspaceSlice& ws = plan.workspace_slice(kGemm);
    emulation::gemm_device(base::as_quantized(args.a, args.m, args.k), base::as_quantized(args.b, args.n, args.k),
                           args.d, opt, ctx.workspace + ws.offset, ws.bytes, ctx.stream);
  }
};

}  // namespace

const BackendImpl& reference_backend() {
  static const Reference b;
  return b;
}

}  // namespace scalemm::backends
