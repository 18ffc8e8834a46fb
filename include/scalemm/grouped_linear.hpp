// The three grouped GEMMs of a mixture-of-experts linear layer (G experts, weights W (G, N, K)), as
// ScaledLinear (scalemm/linear.hpp) does them for one dense layer, with the same recipes and the
// same quantizations, through Handle::grouped_gemm (docs/grouped.md). Tokens are sorted by expert:
// X (sum M_g, K), the rows of expert g consecutive; the group sizes M_g are host integers.
//
//   GEMM     form       D                    A                                    B
//   forward  m-grouped  Y  (sum M_g, N) bf16  X    (sum M_g, K) act, per group      W   (G, N, K) weight
//   dgrad    m-grouped  dX (sum M_g, K) bf16  dY   (sum M_g, N) act, per group      W^T (G, K, N) weight
//   wgrad    k-grouped  dW (G, N, K) f32      dY^T (N, sum M_g) act along tokens    X^T (K, sum M_g) act
//
// Quantization: each expert's W_g once, rowwise W_g and its exact transpose W_g^T (as ScaledLinear's
// set_weight); each expert's rows of X and dY rowwise into that group's own scale buffer (the m-grouped
// A layout: grouped_scale_offsets); X and dY once more as whole tensors, columnwise only, for wgrad
// (the k-grouped layout: the whole tensor's scales, each expert a column range). With every M_g on the
// activation's K-block boundary (128 for blockwise FP8, 32 for MXFP8) these are the same bytes and
// scales that a dense ScaledLinear per expert makes, so every expert's Y, dX and dW are bit-identical to
// it. wgrad needs those boundaries: backward() with dW refuses other sizes, naming the group and the
// size to pad to (pad each expert's tokens with zero rows: they add nothing to dW; forward and dgrad
// take any sizes). An expert with no tokens has no rows of Y and dX and gets dW_g = 0.
//
// Memory space: kDevice (default; device pointers, scalemm::quantize, the planner's backends) or kHost
// (host pointers, quantize_host, the host reference: for tests and machines without a GPU).
// Buffers: the weights at the first set_weight, the activations at reserve()/the first forward for a
// token count larger than any before; calls with sum M_g up to that capacity allocate nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "scalemm/grouped.hpp"
#include "scalemm/linear.hpp"

namespace scalemm {

struct GroupedLinearOptions : LinearOptions {
  MemorySpace space = MemorySpace::kDevice;  ///< where every pointer given to the layer lives
};

/// A grouped (MoE) linear layer's quantized state and grouped GEMMs for inputs in fp32. Not
/// thread-safe (one layer, one stream at a time); the Handle it uses may be shared.
class GroupedScaledLinear {
 public:
  /// experts G, out_features N, in_features K (all >= 1). Allocates nothing yet.
  GroupedScaledLinear(Handle& handle, LinearRecipe recipe, int64_t experts, int64_t n, int64_t k,
                      GroupedLinearOptions options = {});
  ~GroupedScaledLinear();
  GroupedScaledLinear(const GroupedScaledLinear&) = delete;
  GroupedScaledLinear& operator=(const GroupedScaledLinear&) = delete;

  LinearRecipe recipe() const;
  int64_t experts() const;
  int64_t n() const;
  int64_t k() const;
  Recipe activation_recipe() const;  ///< block1x128 or mxfp8
  Recipe weight_recipe() const;      ///< block128x128 or mxfp8-32x32
  /// Tokens per K-block of the activation recipe (128 or 32): wgrad's group sizes are multiples of it.
  int64_t token_block() const;

  /// Quantizes W (G, N, K) f32 (row-major, expert after expert): W_g for forward and W_g^T (K, N) for
  /// dgrad. The first call allocates the weight buffers.
  void set_weight(const float* w, Stream stream);

  /// Makes sure buffers for `tokens` = sum M_g exist (allocates only when it exceeds every earlier
  /// count; a growing reallocation of device buffers synchronises the device first).
  void reserve(int64_t tokens);
  /// Bytes this layer holds for `tokens`: weights, W^T, X, X^T, dY, dY^T, quantizer workspace.
  size_t workspace_bytes(int64_t tokens) const;

  /// Y (sum M_g, N) bf16: the rows of expert g are X_g W_g^T. `group_sizes`: G host integers M_g >= 0.
  /// Keeps the sizes and the quantized X^T for backward().
  void forward(const float* x, const int64_t* group_sizes, uint16_t* y_bf16, Stream stream);
  /// For dY (sum M_g, N) f32 of the last forward: dX (sum M_g, K) bf16, rows of g = dY_g W_g (skipped
  /// when dx is null), and dW (G, N, K) f32, dW_g = dY_g^T X_g (skipped when dw is null; overwritten).
  void backward(const float* dy, uint16_t* dx_bf16, float* dw, Stream stream);

  /// sum M_g of the last forward (0 before the first) and its group sizes.
  int64_t tokens() const;
  const std::vector<int64_t>& group_sizes() const;
  /// The arguments of GEMM `which` as the last forward/backward ran it (pointers into this layer's
  /// buffers and the caller's output; group_sizes points into this layer). Throws when it has not run.
  GroupedGemmArgs gemm_args(LinearGemm which) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace scalemm
