// GroupedScaledLinear: per-expert quantization of the weights and of the activations' rows, whole-tensor
// columnwise quantization for wgrad, and the three grouped GEMMs through Handle::grouped_gemm. See
// include/scalemm/grouped_linear.hpp for the operand table.
#include "scalemm/grouped_linear.hpp"
#include "linear_common.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/emulation/emulation.hpp"
#include "scalemm/layouts/scale_layout.hpp"
#include "scalemm/quantize.hpp"

using scalemm::detail::cuda_check;

namespace scalemm {
namespace {

[[noreturn]] void invalid(const std::string& what) {
  throw Error(StatusCode::kInvalidArgument, "GroupedScaledLinear: " + what);
}

using Arena = detail::LinearArena;
using detail::linear_aligned;
size_t aligned(size_t b) { return linear_aligned(b); }

/// A quantized tensor in this layer's buffers: data and scales.
struct Quantized {
  char* data = nullptr;
  char* scales = nullptr;
};

}  // namespace

struct GroupedScaledLinear::Impl : detail::LinearCore<GroupedLinearOptions, GroupedGemmArgs> {
  Impl(Handle& h, LinearRecipe r, int64_t experts, int64_t n_, int64_t k_, const GroupedLinearOptions& o)
      : LinearCore("GroupedScaledLinear", h, r, n_, k_, o, o.space, true), g(experts) {}

  int64_t g = 0;               // experts
  Quantized w, wt_;            // W (G, N, K) and W^T (G, K, N), scales stacked per expert
  int64_t w_stride = 0, wt_stride = 0;  // bytes between two experts' scale buffers
  Quantized x, x_t, dy, dy_t;  // X, dY rowwise per group; X^T (K, T), dY^T (N, T) whole, columnwise
  bool x_t_valid = false;      // X^T quantized by the last forward (its sizes on the token blocks)

  std::vector<int64_t> sizes;  // M_g of the last forward
  int64_t tokens = 0;

  bool host() const { return options.space == MemorySpace::kHost; }
  int64_t token_block() const { return act == Recipe::kBlock1x128 ? 128 : 32; }

  size_t quant_workspace(Recipe r, int64_t rows, int64_t cols, bool rowwise, bool columnwise) const {
    if (host() || rows == 0) return 0;
    const emulation::SourceMatrix src{nullptr, DType::kF32, rows, cols};
    return scalemm::quantize::workspace_bytes(src, config(r, rowwise, columnwise));
  }
  int64_t layout_bytes(Recipe r, int64_t rows, int64_t cols) const {
    return layouts::ScaleLayout(r, rows, cols, options.scale_format).bytes();
  }
  // Bytes of the per-group rowwise scale buffers of any G sizes adding up to at most `t` rows: every
  // group padded by at most a 128-row tile and to a 16-byte boundary.
  int64_t grouped_rows_scale_bytes(int64_t t, int64_t cols) const {
    return layout_bytes(act, t + 128 * g, cols) + 16 * g;
  }

  size_t weight_bytes() const {
    return aligned(size_t(g * n * k)) * 2 + aligned(size_t(w_stride_of(n, k) * g)) +
           aligned(size_t(w_stride_of(k, n) * g)) + aligned(quant_workspace(wt, n, k, true, true));
  }
  int64_t w_stride_of(int64_t rows, int64_t cols) const {
    GroupedGemmArgs a;
    a.b.recipe = wt;
    a.b.scale_format = options.scale_format;
    a.n = rows;
    a.k = cols;
    return grouped_b_scale_stride(a);
  }
  size_t activation_bytes(int64_t t) const {
    size_t b = 0;
    for (int64_t cols : {k, n}) {
      b += aligned(size_t(t * cols)) * 2;                                    // rowwise data, columnwise data
      b += aligned(size_t(grouped_rows_scale_bytes(t, cols)));               // per-group rowwise scales
      b += aligned(size_t(layouts::ScaleLayout(act, cols, t, options.scale_format).bytes()));  // columnwise
    }
    return b + aligned(workspace_for(t));
  }
  size_t workspace_for(int64_t t) const {
    size_t ws = 0;
    for (int64_t cols : {k, n})
      ws = std::max({ws, quant_workspace(act, t, cols, true, false), quant_workspace(act, t, cols, false, true)});
    return ws;
  }

  // Each group's rows of an (T, cols) source, rowwise, into the group's own scale buffer (the m-grouped
  // A layout); an empty group has none.
  void quantize_rows(const float* src, int64_t cols, const Quantized& out, Stream stream) const {
    const auto cfg = config(act, true, false);
    GroupedGemmArgs layout;
    layout.groups = g;
    layout.group_sizes = sizes.data();
    layout.k = cols;
    layout.a.recipe = act;
    layout.a.scale_format = options.scale_format;
    const std::vector<int64_t> offsets = grouped_scale_offsets(layout);
    int64_t row = 0;
    for (int64_t gi = 0; gi < g; ++gi) {
      const int64_t mg = sizes[size_t(gi)];
      if (mg > 0) {
        emulation::QuantizeOutputs o;
        o.data = out.data + row * cols;
        o.scales = out.scales + offsets[size_t(gi)];
        quantize(src + row * cols, mg, cols, cfg, o, act_workspace, act_workspace_bytes, stream);
      }
      row += mg;
    }
  }
  // The whole (T, cols) source, columnwise only: (cols, T) with blocks along the tokens (k-grouped).
  void quantize_columns(const float* src, int64_t cols, const Quantized& out, Stream stream) const {
    emulation::QuantizeOutputs o;
    o.data_t = out.data;
    o.scales_t = out.scales;
    quantize(src, tokens, cols, config(act, false, true), o, act_workspace, act_workspace_bytes, stream);
  }
  bool on_token_blocks() const {
    return std::all_of(sizes.begin(), sizes.end(), [&](int64_t s) { return s % token_block() == 0; });
  }

  void run(LinearGemm which, GroupDim dim, int64_t gm, int64_t gn, int64_t gk, const GemmOperand& a,
           const GemmOperand& b, void* d, DType d_dtype, Stream stream) {
    GroupedGemmArgs args = gemm_args(gm, gn, gk, a, b, d, d_dtype, options.space);
    args.group_dim = dim;
    args.groups = g;
    args.group_sizes = sizes.data();
    handle->grouped_gemm(args, stream);
    record(which, args);
  }
};

GroupedScaledLinear::GroupedScaledLinear(Handle& handle, LinearRecipe recipe, int64_t experts, int64_t n, int64_t k,
                                         GroupedLinearOptions options)
{
  if (experts < 1 || n < 1 || k < 1)
    invalid("experts, N and K must be >= 1, got experts=" + std::to_string(experts) + " N=" + std::to_string(n) +
            " K=" + std::to_string(k));
  impl_ = std::make_unique<Impl>(handle, recipe, experts, n, k, options);  // checks the recipe first
  if (options.space != MemorySpace::kDevice && options.space != MemorySpace::kHost)
    invalid("memory space must be device or host, got " + std::to_string(int(options.space)));
  Impl& s = *impl_;
  s.w_stride = s.w_stride_of(n, k);
  s.wt_stride = s.w_stride_of(k, n);
  s.sizes.assign(size_t(experts), 0);
}

GroupedScaledLinear::~GroupedScaledLinear() = default;

LinearRecipe GroupedScaledLinear::recipe() const { return impl_->recipe; }
int64_t GroupedScaledLinear::experts() const { return impl_->g; }
int64_t GroupedScaledLinear::n() const { return impl_->n; }
int64_t GroupedScaledLinear::k() const { return impl_->k; }
Recipe GroupedScaledLinear::activation_recipe() const { return impl_->act; }
Recipe GroupedScaledLinear::weight_recipe() const { return impl_->wt; }
int64_t GroupedScaledLinear::token_block() const { return impl_->token_block(); }
int64_t GroupedScaledLinear::tokens() const { return impl_->tokens; }
const std::vector<int64_t>& GroupedScaledLinear::group_sizes() const { return impl_->sizes; }

size_t GroupedScaledLinear::workspace_bytes(int64_t tokens) const {
  if (tokens < 0) invalid("tokens must be >= 0, got " + std::to_string(tokens));
  return impl_->weight_bytes() + impl_->activation_bytes(tokens);
}

void GroupedScaledLinear::set_weight(const float* w, Stream stream) {
  Impl& s = *impl_;
  if (!w) invalid("set_weight: weight pointer is null");
  if (s.weight_arena.empty()) {
    s.weight_arena.allocate(s.weight_bytes());
    s.w.data = s.weight_arena.take(size_t(s.g * s.n * s.k));
    s.wt_.data = s.weight_arena.take(size_t(s.g * s.n * s.k));
    s.w.scales = s.weight_arena.take(size_t(s.w_stride * s.g));
    s.wt_.scales = s.weight_arena.take(size_t(s.wt_stride * s.g));
    s.w_workspace_bytes = s.quant_workspace(s.wt, s.n, s.k, true, true);
    s.w_workspace = s.weight_arena.take(s.w_workspace_bytes);
  }
  // One read of each W_g: rowwise W_g (N, K) for forward, its exact transpose W_g^T (K, N) for dgrad,
  // as ScaledLinear::set_weight quantizes its one weight.
  const auto cfg = s.config(s.wt, true, true);
  for (int64_t gi = 0; gi < s.g; ++gi) {
    emulation::QuantizeOutputs o;
    o.data = s.w.data + gi * s.n * s.k;
    o.scales = s.w.scales + gi * s.w_stride;
    o.data_t = s.wt_.data + gi * s.n * s.k;
    o.scales_t = s.wt_.scales + gi * s.wt_stride;
    s.quantize(w + gi * s.n * s.k, s.n, s.k, cfg, o, s.w_workspace, s.w_workspace_bytes, stream);
  }
  s.has_weight = true;
}

void GroupedScaledLinear::reserve(int64_t tokens) {
  Impl& s = *impl_;
  if (tokens < 1) invalid("tokens must be >= 1, got " + std::to_string(tokens));
  if (tokens <= s.capacity) return;
  // Growing: buffers of an earlier count may still be in use by enqueued work.
  if (!s.act_arena.empty() && !s.host()) cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize before growing");
  s.act_arena.allocate(s.activation_bytes(tokens));
  s.x.data = s.act_arena.take(size_t(tokens * s.k));
  s.x_t.data = s.act_arena.take(size_t(tokens * s.k));
  s.x.scales = s.act_arena.take(size_t(s.grouped_rows_scale_bytes(tokens, s.k)));
  s.x_t.scales = s.act_arena.take(size_t(layouts::ScaleLayout(s.act, s.k, tokens, s.options.scale_format).bytes()));
  s.dy.data = s.act_arena.take(size_t(tokens * s.n));
  s.dy_t.data = s.act_arena.take(size_t(tokens * s.n));
  s.dy.scales = s.act_arena.take(size_t(s.grouped_rows_scale_bytes(tokens, s.n)));
  s.dy_t.scales = s.act_arena.take(size_t(layouts::ScaleLayout(s.act, s.n, tokens, s.options.scale_format).bytes()));
  s.act_workspace_bytes = s.workspace_for(tokens);
  s.act_workspace = s.act_arena.take(s.act_workspace_bytes);
  s.capacity = tokens;
  s.forget_gemms();
  s.tokens = 0;
  s.x_t_valid = false;
}

void GroupedScaledLinear::forward(const float* x, const int64_t* group_sizes, uint16_t* y_bf16, Stream stream) {
  Impl& s = *impl_;
  if (!s.has_weight) invalid("forward before set_weight");
  if (!x || !y_bf16) invalid("forward: null input or output pointer");
  if (!group_sizes) invalid("group_sizes: null; expected " + std::to_string(s.g) + " host integers");
  int64_t t = 0;
  for (int64_t gi = 0; gi < s.g; ++gi) {
    const int64_t mg = group_sizes[gi];
    if (mg < 0 || mg > (int64_t(1) << 40))
      throw Error(StatusCode::kInvalidArgument,
                  "group_sizes[" + std::to_string(gi) + "]: expected a token count in [0, 2^40], got " +
                      std::to_string(mg) + " [group-size-negative]");
    t += mg;
  }
  if (t < 1)
    throw Error(StatusCode::kInvalidArgument, "group_sizes: expected at least one token in all, got " +
                                                  std::to_string(s.g) + " empty groups");
  reserve(t);
  s.sizes.assign(group_sizes, group_sizes + s.g);
  s.tokens = t;
  s.forget_gemms();
  s.quantize_rows(x, s.k, s.x, stream);
  // X^T for wgrad: the whole tensor with blocks along the tokens, each expert a column range, which
  // needs every M_g on a token block; otherwise backward() refuses dW by name.
  s.x_t_valid = s.on_token_blocks();
  if (s.x_t_valid) s.quantize_columns(x, s.k, s.x_t, stream);
  // Y rows of g = X_g (M_g, K) . W_g (N, K)^T
  s.run(LinearGemm::kForward, GroupDim::kM, t, s.n, s.k, s.operand(s.x.data, s.act, s.x.scales),
        s.operand(s.w.data, s.wt, s.w.scales), y_bf16, DType::kBF16, stream);
}

void GroupedScaledLinear::backward(const float* dy, uint16_t* dx_bf16, float* dw, Stream stream) {
  Impl& s = *impl_;
  if (s.tokens == 0) invalid("backward before forward (the group sizes and X^T of the forward pass are needed)");
  if (!dy) invalid("backward: dY pointer is null");
  if (dw && !s.x_t_valid) {
    const int64_t b = s.token_block();
    for (int64_t gi = 0; gi < s.g; ++gi)
      if (s.sizes[size_t(gi)] % b != 0)
        throw Error(StatusCode::kInvalidArgument,
                    "group_sizes[" + std::to_string(gi) + "]: wgrad reduces over each expert's tokens in " +
                        std::string(scalemm::to_string(s.act)) + " blocks of " + std::to_string(b) +
                        ": expected a multiple of " + std::to_string(b) + ", got " +
                        std::to_string(s.sizes[size_t(gi)]) + ". Pad each expert's tokens with zero rows to " +
                        std::to_string(layouts::round_up(s.sizes[size_t(gi)], b)) +
                        " (zero rows add nothing to dW), or pass dw = nullptr [group-k-block]");
  }
  if (dx_bf16) {  // dX rows of g = dY_g (M_g, N) . (W_g^T (K, N))^T
    s.quantize_rows(dy, s.n, s.dy, stream);
    s.run(LinearGemm::kDgrad, GroupDim::kM, s.tokens, s.k, s.n, s.operand(s.dy.data, s.act, s.dy.scales),
          s.operand(s.wt_.data, s.wt, s.wt_.scales), dx_bf16, DType::kBF16, stream);
  }
  if (dw) {  // dW_g (N, K) = dY^T (N, cols of g) . (X^T (K, cols of g))^T, k-grouped over the tokens
    s.quantize_columns(dy, s.n, s.dy_t, stream);
    s.run(LinearGemm::kWgrad, GroupDim::kK, s.n, s.k, s.tokens, s.operand(s.dy_t.data, s.act, s.dy_t.scales),
          s.operand(s.x_t.data, s.act, s.x_t.scales), dw, DType::kF32, stream);
  }
}

GroupedGemmArgs GroupedScaledLinear::gemm_args(LinearGemm which) const {
  return impl_->last_gemm(which);
}

}  // namespace scalemm
