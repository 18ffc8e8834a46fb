// ScaledLinear: quantization with rowwise + columnwise outputs, then the forward, dgrad and wgrad
// GEMMs through Handle::gemm. See include/scalemm/linear.hpp for the operand table.
#include "scalemm/linear.hpp"
#include "linear_common.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>

#include "scalemm/emulation/emulation.hpp"
#include "scalemm/layouts/scale_layout.hpp"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/quantize.hpp"

using scalemm::detail::cuda_check;

namespace scalemm {

std::string_view to_string(LinearRecipe r) {
  switch (r) {
    case LinearRecipe::kBlockwiseFp8: return "blockwise-fp8";
    case LinearRecipe::kMxfp8: return "mxfp8";
  }
  return "unknown";
}

std::string_view to_string(LinearGemm g) {
  switch (g) {
    case LinearGemm::kForward: return "forward";
    case LinearGemm::kDgrad: return "dgrad";
    case LinearGemm::kWgrad: return "wgrad";
  }
  return "unknown";
}

namespace {

using Arena = detail::LinearArena;
size_t aligned(size_t b) { return detail::linear_aligned(b); }

/// The buffers of one quantized (R, C) tensor with both outputs: (R, C) rowwise and (C, R) columnwise.
struct QuantPair {
  void* data = nullptr;
  void* scales = nullptr;
  void* data_t = nullptr;
  void* scales_t = nullptr;
};

}  // namespace

struct ScaledLinear::Impl : detail::LinearCore<LinearOptions, GemmArgs> {
  using LinearCore::LinearCore;

  QuantPair w;      // W (N,K) and W^T (K,N)
  QuantPair x, dy;  // X (M,K) + X^T (K,M); dY (M,N) + dY^T (N,M)
  int64_t m = 0;    // M of the last forward

  emulation::QuantizeConfig config(Recipe r) const { return LinearCore::config(r, true, true); }

  // Sizes of one quantized pair of an (R, C) source.
  struct PairSizes {
    size_t data, scales, data_t, scales_t, workspace;
    size_t total() const { return aligned(data) + aligned(scales) + aligned(data_t) + aligned(scales_t); }
  };
  PairSizes sizes(Recipe r, int64_t rows, int64_t cols) const {
    const auto cfg = config(r);
    const emulation::SourceMatrix src{nullptr, DType::kF32, rows, cols};
    return {size_t(emulation::data_bytes(cfg, rows, cols)), size_t(emulation::rowwise_layout(cfg, rows, cols).bytes()),
            size_t(emulation::data_bytes(cfg, cols, rows)),
            size_t(emulation::columnwise_layout(cfg, rows, cols).bytes()),
            scalemm::quantize::workspace_bytes(src, cfg)};
  }
  QuantPair carve(Arena& a, const PairSizes& s) {
    QuantPair p;
    p.data = a.take(s.data);
    p.scales = a.take(s.scales);
    p.data_t = a.take(s.data_t);
    p.scales_t = a.take(s.scales_t);
    return p;
  }
  size_t weight_bytes() const {
    const PairSizes s = sizes(wt, n, k);
    return s.total() + aligned(s.workspace);
  }
  size_t activation_bytes(int64_t rows) const {
    const PairSizes sx = sizes(act, rows, k), sd = sizes(act, rows, n);
    return sx.total() + sd.total() + aligned(std::max(sx.workspace, sd.workspace));
  }

  // Both outputs of an (rows, cols) source of recipe r.
  void quantize_pair(const float* src, int64_t rows, int64_t cols, Recipe r, const QuantPair& out, void* ws,
                     size_t ws_bytes, Stream stream) const {
    emulation::QuantizeOutputs o;
    o.data = out.data;
    o.scales = out.scales;
    o.data_t = out.data_t;
    o.scales_t = out.scales_t;
    quantize(src, rows, cols, config(r), o, ws, ws_bytes, stream);
  }

  void run(LinearGemm which, int64_t gm, int64_t gn, int64_t gk, const GemmOperand& a, const GemmOperand& b, void* d,
           DType d_dtype, Stream stream) {
    const GemmArgs args = gemm_args(gm, gn, gk, a, b, d, d_dtype, MemorySpace::kDevice);
    handle->gemm(args, stream);
    record(which, args);
  }
};

namespace {
[[noreturn]] void invalid(const std::string& what) {
  throw Error(StatusCode::kInvalidArgument, "ScaledLinear: " + what);
}
}  // namespace

ScaledLinear::ScaledLinear(Handle& handle, LinearRecipe recipe, int64_t n, int64_t k, LinearOptions options) {
  if (n < 1 || k < 1) invalid("N and K must be >= 1, got N=" + std::to_string(n) + " K=" + std::to_string(k));
  impl_ = std::make_unique<Impl>("ScaledLinear", handle, recipe, n, k, options, MemorySpace::kDevice, false);
}

ScaledLinear::~ScaledLinear() = default;

LinearRecipe ScaledLinear::recipe() const { return impl_->recipe; }
int64_t ScaledLinear::n() const { return impl_->n; }
int64_t ScaledLinear::k() const { return impl_->k; }
Recipe ScaledLinear::activation_recipe() const { return impl_->act; }
Recipe ScaledLinear::weight_recipe() const { return impl_->wt; }
int64_t ScaledLinear::tokens() const { return impl_->m; }

size_t ScaledLinear::workspace_bytes(int64_t m) const {
  if (m < 0) invalid("M must be >= 0");
  return impl_->weight_bytes() + impl_->activation_bytes(m);
}

void ScaledLinear::set_weight(const float* w, Stream stream) {
  Impl& s = *impl_;
  if (!w) invalid("set_weight: weight pointer is null");
  if (s.weight_arena.empty()) {
    const Impl::PairSizes ps = s.sizes(s.wt, s.n, s.k);
    s.weight_arena.allocate(s.weight_bytes());
    s.w = s.carve(s.weight_arena, ps);
    s.w_workspace_bytes = ps.workspace;
    s.w_workspace = s.weight_arena.take(ps.workspace);
  }
  // One read of W: rowwise W (N,K) for forward, columnwise W^T (K,N) for dgrad. With square blocks the
  // columnwise output is the exact transpose (same amax per 128x128 / 32x32 block, same multiplier).
  s.quantize_pair(w, s.n, s.k, s.wt, s.w, s.w_workspace, s.w_workspace_bytes, stream);
  s.has_weight = true;
}

void ScaledLinear::reserve(int64_t m) {
  Impl& s = *impl_;
  if (m < 1) invalid("M must be >= 1, got " + std::to_string(m));
  if (m <= s.capacity) return;
  // Growing: buffers of an earlier M may still be in use by enqueued work.
  if (!s.act_arena.empty()) cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize before growing");
  s.act_arena.allocate(s.activation_bytes(m));
  const Impl::PairSizes sx = s.sizes(s.act, m, s.k), sd = s.sizes(s.act, m, s.n);
  s.x = s.carve(s.act_arena, sx);
  s.dy = s.carve(s.act_arena, sd);
  s.act_workspace_bytes = std::max(sx.workspace, sd.workspace);
  s.act_workspace = s.act_arena.take(s.act_workspace_bytes);
  s.capacity = m;
  s.forget_gemms();
  s.m = 0;
}

void ScaledLinear::forward(const float* x, int64_t m, uint16_t* y_bf16, Stream stream) {
  Impl& s = *impl_;
  if (!s.has_weight) invalid("forward before set_weight");
  if (!x || !y_bf16) invalid("forward: null input or output pointer");
  reserve(m);
  // One read of X: X (M,K) blocks along K for this GEMM, X^T (K,M) blocks along M kept for wgrad.
  s.quantize_pair(x, m, s.k, s.act, s.x, s.act_workspace, s.act_workspace_bytes, stream);
  s.m = m;
  // Y (M,N) = X (M,K) . W (N,K)^T
  s.run(LinearGemm::kForward, m, s.n, s.k, s.operand(s.x.data, s.act, s.x.scales),
        s.operand(s.w.data, s.wt, s.w.scales), y_bf16, DType::kBF16, stream);
}

void ScaledLinear::backward(const float* dy, uint16_t* dx_bf16, float* dw, Stream stream) {
  Impl& s = *impl_;
  if (s.m == 0) invalid("backward before forward (X^T of the forward pass is needed for wgrad)");
  if (!dy) invalid("backward: dY pointer is null");
  const int64_t m = s.m;
  // One read of dY: dY (M,N) blocks along N for dgrad, dY^T (N,M) blocks along M for wgrad.
  s.quantize_pair(dy, m, s.n, s.act, s.dy, s.act_workspace, s.act_workspace_bytes, stream);
  if (dx_bf16)  // dX (M,K) = dY (M,N) . (W^T (K,N))^T
    s.run(LinearGemm::kDgrad, m, s.k, s.n, s.operand(s.dy.data, s.act, s.dy.scales),
          s.operand(s.w.data_t, s.wt, s.w.scales_t), dx_bf16, DType::kBF16, stream);
  if (dw)  // dW (N,K) = dY^T (N,M) . (X^T (K,M))^T, both with blocks along the tokens
    s.run(LinearGemm::kWgrad, s.n, s.k, m, s.operand(s.dy.data_t, s.act, s.dy.scales_t),
          s.operand(s.x.data_t, s.act, s.x.scales_t), dw, DType::kF32, stream);
}

GemmArgs ScaledLinear::gemm_args(LinearGemm which) const {
  return impl_->last_gemm(which);
}

}  // namespace scalemm
