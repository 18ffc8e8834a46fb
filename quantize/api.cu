// scalemm::quantize (include/scalemm/quantize.hpp): the fast kernels of fast_quantizers.cu, on the
// stream's device; requests the fast path does not cover (empty shapes) run the shared functors
// (numerics/detail) on the device, which give the same bytes. quantize() of host memory runs the same
// functors on the host (detail/host_exec.hpp, the reference emulator's host executor).
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "detail/device_exec.cuh"
#include "detail/driver.hpp"
#include "detail/host_exec.hpp"
#include "fast_quantizers.hpp"
#include "scalemm/detail/device_state.hpp"
#include "scalemm/quantize.hpp"
#include "scalemm/status.hpp"

namespace scalemm::quantize {

using numerics::columnwise_layout;
using numerics::rowwise_layout;
using numerics::detail::DeviceExec;
using numerics::detail::round256;
using numerics::detail::Workspace;

namespace {
/// Scale buffers in a layout with padding are cleared first, since padding must read as zero; the
/// kernels write every real scale (without padding the clear would be a wasted pass and launch).
/// rows_c: the columnwise output's row count (src.rows, or the grouped tokens' padded rows).
void clear_scale_padding(DeviceExec& ex, const SourceMatrix& src, const QuantizeConfig& cfg, const QuantizeOutputs& out,
                         int64_t rows_c) {
  const auto lr = rowwise_layout(cfg, src.rows, src.cols), lc = columnwise_layout(cfg, rows_c, src.cols);
  if (cfg.rowwise && src.rows > 0 && lr.has_padding()) ex.zero(out.scales, size_t(lr.bytes()));
  if (cfg.columnwise && lc.has_padding()) ex.zero(out.scales_t, size_t(lc.bytes()));
}
}  // namespace

size_t workspace_bytes(const SourceMatrix& src, const QuantizeConfig& cfg) {
  const int64_t generic = numerics::detail::plan_quantize(src, cfg).scratch_floats();
  const int64_t fast = kernels::plan_fast(src, cfg).floats();
  return round256(size_t(std::max(generic, fast)) * sizeof(float));
}

namespace {
/// Where an address lives, as far as quantize() cares: pageable host memory (a kernel cannot be
/// handed it; every address counts as such where CUDA has no device to ask, a machine without a GPU),
/// device memory (the host cannot read it), or memory both can read (pinned host, managed).
enum class Space { kPageable, kDevice, kBoth };
Space space_of(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();  // not a sticky error: the query failed
    return Space::kPageable;
  }
  if (attr.type == cudaMemoryTypeUnregistered) return Space::kPageable;
  return attr.type == cudaMemoryTypeDevice ? Space::kDevice : Space::kBoth;
}

/// Whether quantize() runs on the host: some pointer is pageable host memory, and then none may be
/// device memory, since neither the kernels nor the host loop could read both. A source in device
/// memory (the usual call) settles it with one pointer query.
bool runs_on_host(const SourceMatrix& src, const QuantizeOutputs& out) {
  const std::pair<const char*, const void*> ptrs[] = {{"src.data", src.data},         {"out.data", out.data},
                                                      {"out.scales", out.scales},     {"out.data_t", out.data_t},
                                                      {"out.scales_t", out.scales_t}, {"out.global_scale", out.global_scale}};
  if (src.data && space_of(src.data) == Space::kDevice) return false;  // the usual call: the kernels
  const char *pageable = nullptr, *device = nullptr;
  for (const auto& [name, p] : ptrs) {
    if (!p) continue;
    const Space s = space_of(p);
    if (s == Space::kDevice && !device) device = name;
    if (s == Space::kPageable && !pageable) pageable = name;
  }
  if (pageable && device)
    throw_if_any({Diagnostic{device, "quantize-memory-space", "the source and the outputs in memory one side can read",
                             "host memory, as " + std::string(pageable) + " is", "device memory",
                             "Pass device memory for all of them, or host memory for all of them."}},
                 StatusCode::kInvalidArgument);
  return pageable != nullptr;
}
}  // namespace

void quantize(const SourceMatrix& src, const QuantizeConfig& cfg, const QuantizeOutputs& out, void* workspace,
              size_t bytes, cudaStream_t stream) {
  numerics::validate(src, cfg, out);
  if (runs_on_host(src, out)) {  // the reference functors on this thread; stream and workspace are not used
    std::vector<float> scratch(size_t(numerics::detail::plan_quantize(src, cfg).scratch_floats()));
    numerics::detail::HostExec ex;
    numerics::detail::run_quantize(ex, src, cfg, out, scratch.data());
    return;
  }
  const scalemm::detail::DeviceScope scope(scalemm::detail::stream_device(stream));  // the stream's device
  DeviceExec ex{stream};
  if (src.rows > 0 && src.cols > 0) {
    clear_scale_padding(ex, src, cfg, out, src.rows);
    // The fast kernels use scratch only for the amax passes (tensorwise, rowwise, NVFP4's global):
    // block recipes allocate nothing per call (a stream-ordered allocation can stall when the pool
    // has been trimmed at a synchronisation).
    const bool amax = cfg.recipe == Recipe::kTensorwise || cfg.recipe == Recipe::kRowwise || cfg.recipe == Recipe::kNvfp4;
    Workspace ws(workspace, bytes, amax ? round256(size_t(kernels::plan_fast(src, cfg).floats()) * sizeof(float)) : 0,
                 stream);
    if (kernels::quantize(src, cfg, out, static_cast<float*>(ws.get()), stream)) return;
  }
  Workspace ws(workspace, bytes, workspace_bytes(src, cfg), stream);
  numerics::detail::run_quantize(ex, src, cfg, out, static_cast<float*>(ws.get()));
}

int64_t padded_token_rows(int64_t tokens, int64_t groups) {
  SCALEMM_EXPECTS(tokens >= 0 && groups >= 0, StatusCode::kInvalidArgument,
                  "padded_token_rows: tokens and groups must be non-negative, got " + std::to_string(tokens) + ", " +
                      std::to_string(groups));
  return (tokens + 127 * groups + 127) / 128 * 128;
}

namespace {
/// quantize_grouped's named errors, shared by its fused variants.
void check_grouped(Diagnostics& d, const SourceMatrix& src, const QuantizeConfig& cfg, const TokenGroups& groups,
                   const QuantizeOutputs& out) {
  const auto bad = [&](const char* arg, const char* rule, std::string msg, std::string want, std::string got,
                       std::string fix = {}) {
    d.push_back(Diagnostic{arg, rule, std::move(msg), std::move(want), std::move(got), std::move(fix)});
  };
  if (cfg.recipe != Recipe::kBlock1x128 && cfg.recipe != Recipe::kMxfp8)
    bad("cfg.recipe", "grouped-quantize-recipe", "grouped tokens take a 1D-block FP8 recipe along the tokens",
        "block1x128 or mxfp8", std::string(to_string(cfg.recipe)), "Quantize other recipes with quantize() per group.");
  if (src.dtype != DType::kBF16 && src.dtype != DType::kF16)
    bad("src.dtype", "grouped-quantize-source", "grouped tokens are read as 16-bit values", "bf16 or f16",
        std::string(to_string(src.dtype)), "Cast the tokens to bf16 first.");
  if (!cfg.columnwise)
    bad("cfg.columnwise", "grouped-quantize-columnwise", "the grouped layout is the columnwise output", "true",
        "false", "For the rowwise output alone call quantize(): it does not depend on the groups.");
  if (groups.groups < 1 || !groups.sizes)
    bad("groups", "grouped-quantize-sizes", "one device size per group", "groups >= 1 and sizes != null",
        "groups = " + std::to_string(groups.groups) + (groups.sizes ? "" : ", sizes = null"));
  const int64_t need = padded_token_rows(std::max<int64_t>(src.rows, 0), std::max<int64_t>(groups.groups, 0));
  if (groups.padded_rows % 128 || groups.padded_rows < need)
    bad("groups.padded_rows", "grouped-quantize-rows",
        "room for every group padded to 128 rows, whatever the sizes (a multiple of 128)",
        "a multiple of 128 >= " + std::to_string(need), std::to_string(groups.padded_rows),
        "Use padded_token_rows(T, G).");
  if (groups.row_weight && !groups.gather)
    bad("groups.row_weight", "grouped-quantize-row-weight", "row weights apply to gathered rows", "gather set",
        "gather = null");
  if (groups.gather && groups.source_rows < 0)
    bad("groups.source_rows", "grouped-quantize-gather", "the gathered source's row count", ">= 0",
        std::to_string(groups.source_rows));
  if (src.cols > 0 && (!out.data_t || !out.scales_t))
    bad("out", "grouped-quantize-outputs", "the columnwise output (R rows even without tokens)",
        "data_t and scales_t", std::string(out.data_t ? "data_t" : "data_t = null") + ", " +
                                   (out.scales_t ? "scales_t" : "scales_t = null"));
}
}  // namespace

void quantize_grouped(const SourceMatrix& src, const QuantizeConfig& cfg, const TokenGroups& groups,
                      const QuantizeOutputs& out, cudaStream_t stream) {
  Diagnostics d;
  check_grouped(d, src, cfg, groups, out);
  throw_if_any(d, StatusCode::kInvalidArgument);
  numerics::validate(src, cfg, out);  // the source, the recipe's modes and the rowwise outputs
  if (src.cols == 0) return;
  const scalemm::detail::DeviceScope scope(scalemm::detail::stream_device(stream));
  DeviceExec ex{stream};
  clear_scale_padding(ex, src, cfg, out, groups.padded_rows);
  kernels::quantize_grouped(src, cfg, groups.sizes, groups.groups, groups.padded_rows,
                            kernels::GatherRows{groups.gather, groups.source_rows, groups.row_weight}, out, stream);
}

namespace {
using kernels::FusedActivation;

/// The inputs a fused activation reads besides the source: (name, pointer) pairs, null where unused.
struct FusedInputs {
  const char* fn;
  std::pair<const char*, const void*> a{nullptr, nullptr}, b{nullptr, nullptr};
};

/// Named errors for what every fused activation needs: the source type, the further inputs.
void check_fused_source(Diagnostics& d, const SourceMatrix& src, const FusedInputs& in) {
  if (src.dtype != DType::kBF16 && src.dtype != DType::kF16)
    d.push_back(Diagnostic{"src.dtype", "activation-source", std::string(in.fn) +
                           " rounds its results to the source's 16-bit type", "bf16 or f16",
                           std::string(to_string(src.dtype)), "Cast the source to bf16 first."});
  for (const auto& [name, p] : {in.a, in.b})
    if (name && !p && src.rows * src.cols > 0)
      d.push_back(Diagnostic{name, "activation-input", std::string(in.fn) + " reads it at every element",
                             "a device pointer to (R, C) elements of src.dtype", "null", {}});
}

/// quantize_activation(_grad), quantize_swiglu(_grad): validation, then rc1d_act_kernel.
void run_fused(int act, const SourceMatrix& src, const FusedInputs& in, const QuantizeConfig& cfg,
               const QuantizeOutputs& out, cudaStream_t stream) {
  Diagnostics d;
  if (cfg.recipe != Recipe::kBlock1x128 && cfg.recipe != Recipe::kMxfp8)
    d.push_back(Diagnostic{"cfg.recipe", "activation-quantize-recipe",
                           "the fused activation runs in the 1D-block FP8 quantizer", "block1x128 or mxfp8",
                           std::string(to_string(cfg.recipe)),
                           "Write the activation first and quantize() it for other recipes."});
  if (!cfg.columnwise)
    d.push_back(Diagnostic{"cfg.columnwise", "activation-quantize-columnwise",
                           "the fused kernel writes the columnwise output", "true", "false",
                           "Write the activation and quantize() it rowwise alone."});
  check_fused_source(d, src, in);
  throw_if_any(d, StatusCode::kInvalidArgument);
  numerics::validate(src, cfg, out);
  if (src.rows <= 0 || src.cols <= 0) return;
  const scalemm::detail::DeviceScope scope(scalemm::detail::stream_device(stream));
  DeviceExec ex{stream};
  clear_scale_padding(ex, src, cfg, out, src.rows);
  kernels::quantize_activation(act, src, in.a.second, in.b.second, cfg, out, stream);
}

/// apply_*: validation, then the elementwise reference kernel.
void run_reference(int act, const SourceMatrix& src, const FusedInputs& in, void* out, cudaStream_t stream) {
  Diagnostics d;
  check_fused_source(d, src, in);
  if (src.rows < 0 || src.cols < 0 || (src.rows * src.cols > 0 && (!src.data || !out)))
    d.push_back(Diagnostic{"src", "activation-buffers", "a device source and output of R x C elements",
                           "R, C >= 0 and non-null buffers", std::to_string(src.rows) + " x " + std::to_string(src.cols),
                           {}});
  throw_if_any(d, StatusCode::kInvalidArgument);
  const scalemm::detail::DeviceScope scope(scalemm::detail::stream_device(stream));
  kernels::apply_activation(act, src.data, in.a.second, in.b.second, src.rows * src.cols, src.dtype, out, stream);
}

void check_activation_kind(Activation act, const char* fn) {
  if (act != Activation::kGeluTanh)
    throw_if_any(Diagnostics{Diagnostic{"act", "activation-kind", std::string(fn) + " applies one of the activations it knows",
                                        "Activation::kGeluTanh", std::to_string(int(act)), {}}},
                 StatusCode::kInvalidArgument);
}

void check_swiglu_input(SwigluInput which, const char* fn) {
  if (which != SwigluInput::kGate && which != SwigluInput::kUp)
    throw_if_any(Diagnostics{Diagnostic{"which", "swiglu-input", std::string(fn) + " writes the gradient of one input",
                                        "SwigluInput::kGate or kUp", std::to_string(int(which)), {}}},
                 StatusCode::kInvalidArgument);
}
}  // namespace

void quantize_activation(const SourceMatrix& src, Activation act, const QuantizeConfig& cfg,
                         const QuantizeOutputs& out, cudaStream_t stream) {
  check_activation_kind(act, "quantize_activation");
  run_fused(FusedActivation::kGelu, src, {"quantize_activation"}, cfg, out, stream);
}

void quantize_activation_grad(const SourceMatrix& grad, const void* input, Activation act,
                              const QuantizeConfig& cfg, const QuantizeOutputs& out, cudaStream_t stream) {
  check_activation_kind(act, "quantize_activation_grad");
  run_fused(FusedActivation::kGeluGrad, grad, {"quantize_activation_grad", {"input", input}}, cfg, out, stream);
}

void quantize_swiglu(const SourceMatrix& gate, const void* up, const QuantizeConfig& cfg, const QuantizeOutputs& out,
                     cudaStream_t stream) {
  run_fused(FusedActivation::kSwiglu, gate, {"quantize_swiglu", {"up", up}}, cfg, out, stream);
}

void quantize_swiglu_grad(const SourceMatrix& grad, const void* gate, const void* up, SwigluInput which,
                          const QuantizeConfig& cfg, const QuantizeOutputs& out, cudaStream_t stream) {
  check_swiglu_input(which, "quantize_swiglu_grad");
  if (which == SwigluInput::kGate)
    run_fused(FusedActivation::kSwigluGate, grad, {"quantize_swiglu_grad", {"gate", gate}, {"up", up}}, cfg, out, stream);
  else
    run_fused(FusedActivation::kSwigluUp, grad, {"quantize_swiglu_grad", {"gate", gate}}, cfg, out, stream);
}

void apply_activation(const SourceMatrix& src, const void* input, Activation act, void* out, cudaStream_t stream) {
  check_activation_kind(act, "apply_activation");
  if (input) run_reference(FusedActivation::kGeluGrad, src, {"apply_activation", {"input", input}}, out, stream);
  else run_reference(FusedActivation::kGelu, src, {"apply_activation"}, out, stream);
}

void apply_swiglu(const SourceMatrix& gate, const void* up, void* out, cudaStream_t stream) {
  run_reference(FusedActivation::kSwiglu, gate, {"apply_swiglu", {"up", up}}, out, stream);
}

void apply_swiglu_grad(const SourceMatrix& grad, const void* gate, const void* up, SwigluInput which, void* out,
                       cudaStream_t stream) {
  check_swiglu_input(which, "apply_swiglu_grad");
  if (which == SwigluInput::kGate)
    run_reference(FusedActivation::kSwigluGate, grad, {"apply_swiglu_grad", {"gate", gate}, {"up", up}}, out, stream);
  else
    run_reference(FusedActivation::kSwigluUp, grad, {"apply_swiglu_grad", {"gate", gate}}, out, stream);
}

namespace {
/// quantize_grouped_swiglu(_grad): the groups' and SwiGLU's named errors, then the grouped kernel.
/// out_src: the (M, cols) matrix the outputs describe (its data the kernel's source).
void run_grouped_swiglu(bool grad, const SourceMatrix& out_src, int64_t ld_src, const void* gate_up, int64_t inter,
                        const QuantizeConfig& cfg, const TokenGroups& groups, const QuantizeOutputs& out,
                        cudaStream_t stream) {
  const char* fn = grad ? "quantize_grouped_swiglu_grad" : "quantize_grouped_swiglu";
  Diagnostics d;
  check_grouped(d, out_src, cfg, groups, out);
  check_fused_source(d, out_src, {fn, {"gate_up", gate_up}});
  if (inter <= 0 || inter % 128)
    d.push_back(Diagnostic{"gate_up.cols", "grouped-swiglu-halves", std::string(fn) +
                           " reads [gate | up] halves of whole 128-column blocks", "2 I columns, I a positive multiple of 128",
                           std::to_string(2 * inter), "Pad the intermediate size to a multiple of 128."});
  if (groups.gather)
    d.push_back(Diagnostic{"groups.gather", "grouped-swiglu-gather", std::string(fn) + " reads rows in group order",
                           "null", "a gather index", "Gather with quantize_grouped() instead."});
  throw_if_any(d, StatusCode::kInvalidArgument);
  numerics::validate(out_src, cfg, out);
  const scalemm::detail::DeviceScope scope(scalemm::detail::stream_device(stream));
  DeviceExec ex{stream};
  clear_scale_padding(ex, out_src, cfg, out, groups.padded_rows);
  kernels::quantize_grouped_swiglu(grad, out_src, ld_src, gate_up, inter, cfg, groups.sizes, groups.groups,
                                   groups.padded_rows, out, stream);
}
}  // namespace

void quantize_grouped_swiglu(const SourceMatrix& gate_up, const QuantizeConfig& cfg, const TokenGroups& groups,
                             const QuantizeOutputs& out, cudaStream_t stream) {
  const int64_t inter = gate_up.cols % 2 ? 0 : gate_up.cols / 2;
  run_grouped_swiglu(false, SourceMatrix{gate_up.data, gate_up.dtype, gate_up.rows, inter, nullptr}, gate_up.cols,
                     gate_up.data, inter, cfg, groups, out, stream);
}

void quantize_grouped_swiglu_grad(const SourceMatrix& grad, const void* gate_up, const QuantizeConfig& cfg,
                                  const TokenGroups& groups, const QuantizeOutputs& out, cudaStream_t stream) {
  run_grouped_swiglu(true, SourceMatrix{grad.data, grad.dtype, grad.rows, 2 * grad.cols, nullptr}, grad.cols, gate_up,
                     grad.cols, cfg, groups, out, stream);
}

void dequantize(const QuantizedTensor& t, void* out, DType out_dtype, cudaStream_t stream) {
  const scalemm::detail::DeviceScope scope(scalemm::detail::stream_device(stream));
  kernels::dequantize(t, out, out_dtype, stream);
}

void transpose(const void* src, int64_t batch, int64_t rows, int64_t cols, void* dst, cudaStream_t stream) {
  const scalemm::detail::DeviceScope scope(scalemm::detail::stream_device(stream));
  kernels::transpose_bytes(src, batch, rows, cols, dst, stream);
}

}  // namespace scalemm::quantize
