// The three GEMMs of a training linear layer Y = X W^T, for blockwise FP8 and MXFP8, with the
// quantization, transposes and layouts each one needs. Every GEMM goes through Handle::gemm.
//
//   GEMM     D (rows x cols)   A (rows, K) [blocks along K]         B (cols, K) [blocks along K]     K
//   forward  Y  (M, N) bf16    X      (M, K)  act   along K          W      (N, K)  weight block      K
//   dgrad    dX (M, K) bf16    dY     (M, N)  act   along N          W^T    (K, N)  weight block      N
//   wgrad    dW (N, K) f32     dY^T   (N, M)  act   along M (tokens) X^T    (K, M)  act along M       M
//
//   recipe          act (X, dY, dY^T, X^T)     weight (W, W^T)
//   blockwise-fp8   block1x128, fp32 scales    block128x128, fp32 scales (DeepSeek-V3)
//   mxfp8           mxfp8 1x32, e8m0           mxfp8-32x32, e8m0 (its transpose is exact)
//
// Quantization, one read of each high-precision tensor (scalemm::quantize::quantize with rowwise AND
// columnwise output):
//   set_weight  W  -> W (N,K) and W^T (K,N). For the square-block weight recipes the columnwise output
//               IS the exact transpose: the same bytes at transposed positions and the same scale grid
//               transposed (identical to layouts::transpose of the rowwise scales); no requantization,
//               so forward and dgrad see the same quantized weight (tests check it byte for byte).
//   forward     X  -> X (M,K) blocks along K, and X^T (K,M) blocks along M, kept for wgrad.
//   backward    dY -> dY (M,N) blocks along N for dgrad, and dY^T (N,M) blocks along M for wgrad.
// All scales are written directly in the cuBLASLt format (LinearOptions::scale_format), so no GEMM
// converts scales per call.
//
// Memory: device buffers are allocated by set_weight (weights) and by reserve()/the first forward for
// a token count larger than any before (activations); calls with M up to that capacity allocate
// nothing (the Handle's own scratch grows once per new GEMM shape, see docs/dispatch.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "scalemm/gemm.hpp"
#include "scalemm/types.hpp"

namespace scalemm {

enum class LinearRecipe : uint8_t {
  kBlockwiseFp8 = 0,  ///< activations/gradients block1x128, weights block128x128 (fp32 scales)
  kMxfp8 = 1,         ///< activations/gradients mxfp8 (1x32), weights mxfp8-32x32 (E8M0 scales)
};
std::string_view to_string(LinearRecipe r);

/// The three GEMMs of a layer.
enum class LinearGemm : uint8_t { kForward = 0, kDgrad = 1, kWgrad = 2 };
std::string_view to_string(LinearGemm g);

struct LinearOptions {
  /// Blockwise FP8: round the fp32 scales to powers of two (ScaleMode kAmaxPow2, Transformer Engine's
  /// default for its blockwise recipe). MXFP8 scales are powers of two anyway.
  bool power_of_two_scales = false;
  /// Format the quantizers write the scales in. kCublasLt (default): no conversion per GEMM.
  ScaleFormat scale_format = ScaleFormat::kCublasLt;
  DType data_dtype = DType::kE4M3;  ///< FP8 element type of every operand (kE4M3 or kE5M2)
};

/// A linear layer's quantized state and GEMMs for inputs in fp32. Not thread-safe (one layer, one
/// stream at a time); the Handle it uses may be shared.
class ScaledLinear {
 public:
  /// out_features N, in_features K (both >= 1). Allocates nothing yet.
  ScaledLinear(Handle& handle, LinearRecipe recipe, int64_t n, int64_t k, LinearOptions options = {});
  ~ScaledLinear();
  ScaledLinear(const ScaledLinear&) = delete;
  ScaledLinear& operator=(const ScaledLinear&) = delete;

  LinearRecipe recipe() const;
  int64_t n() const;
  int64_t k() const;
  Recipe activation_recipe() const;  ///< block1x128 or mxfp8
  Recipe weight_recipe() const;      ///< block128x128 or mxfp8-32x32

  /// Quantizes the weight W (N, K) f32 (device, row-major) on `stream`: W for forward and its exact
  /// transpose W^T (K, N) for dgrad. The first call allocates the weight buffers.
  void set_weight(const float* w, Stream stream);

  /// Makes sure buffers for M tokens exist (allocates only when M exceeds every earlier M; a growing
  /// reallocation synchronises the device first). forward() calls it.
  void reserve(int64_t m);
  /// Device bytes this layer holds for M tokens: weights, W^T, X, X^T, dY, dY^T, quantizer workspace.
  size_t workspace_bytes(int64_t m) const;

  /// Y (M, N) bf16 = X W^T for X (M, K) f32 (device). Keeps the quantized X^T for backward().
  void forward(const float* x, int64_t m, uint16_t* y_bf16, Stream stream);
  /// For dY (M, N) f32 of the last forward's M: dX (M, K) bf16 = dY W (skipped when dx is null) and
  /// dW (N, K) f32 = dY^T X (skipped when dw is null; overwritten, not accumulated).
  void backward(const float* dy, uint16_t* dx_bf16, float* dw, Stream stream);

  /// M of the last forward (0 before the first).
  int64_t tokens() const;
  /// The arguments of GEMM `which` as the last forward/backward ran it (device pointers into this
  /// layer's buffers; d is the caller's output). For Handle::plan(...).explain() and for tests that
  /// recompute a GEMM with the reference emulator. Throws when that GEMM has not run yet.
  GemmArgs gemm_args(LinearGemm which) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace scalemm
