// The cuBLASLt backend: descriptors, scale modes, cached heuristics. The only place (with the
// version query) that includes cublasLt.h.
//
// Row-major D (M,N) = A (M,K) * B (N,K)^T is run as column-major D^T = B * A^T in TN form:
// cuBLASLt A := user B (k x N, transposed), cuBLASLt B := user A (k x M), m = N, n = M, so the scale
// pointers and scale modes swap with the operands.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "scalemm/gemm.hpp"

namespace scalemm::backends {

/// The cuBLASLt half of the library's error check (a cublasStatus_t as int, so that callers need no
/// cublasLt.h): throws Error(kCublasError, "<what>: CUBLAS_STATUS_X"), kOutOfMemory for ALLOC_FAILED.
void cublas_check(int status, const std::string& what);

/// One GEMM as cuBLASLt sees it, in the user's row-major terms (the swap happens inside).
struct LtCall {
  int64_t m = 0, n = 0, k = 0;
  DType a_dtype = DType::kE4M3, b_dtype = DType::kE4M3, d_dtype = DType::kBF16;
  int a_scale_mode = -1, b_scale_mode = -1;  ///< cublasLtMatmulMatrixScale_t of the USER's A and B; -1: none (bf16)
  const void* a = nullptr;
  const void* b = nullptr;
  const void* a_scale = nullptr;
  const void* b_scale = nullptr;
  void* d = nullptr;
  const void* bias = nullptr;  ///< bf16 [N]
  float alpha = 1.0f;
  const float* alpha_device = nullptr;  ///< when set, alpha is read from device memory at run time
  const float* d_scale = nullptr;       ///< FP8 D: D_SCALE_POINTER (device fp32)
  float* d_amax = nullptr;              ///< FP8 D, optional: AMAX_D_POINTER (device fp32)
  bool fast_accum = false;              ///< FAST_ACCUM: no periodic promotion of FP8 partial sums
};

/// A cuBLASLt handle plus a cache of prepared descriptors and heuristic results per problem key.
/// Not thread-safe by itself: the caller (Handle) serialises use per handle.
class LtContext {
 public:
  LtContext();
  ~LtContext();
  LtContext(const LtContext&) = delete;
  LtContext& operator=(const LtContext&) = delete;

  /// Runs `call` on `stream` with `workspace` (256-byte aligned, `workspace_bytes` long). Throws
  /// Error(kCublasError) with the problem and the failing cuBLASLt call in the message.
  void matmul(const LtCall& call, void* workspace, size_t workspace_bytes, Stream stream);

  /// Number of distinct problems prepared so far (heuristic queries made).
  size_t cached_problems() const;

  /// Autotuning (off by default): for a new problem, ask the heuristic for up to kAutotuneCandidates
  /// algorithms, time each once on the call's own buffers (2 warm-ups, median of 5; one host
  /// synchronisation per new problem) and keep the fastest. Choices are shared by every context of the
  /// process per device and problem, so all streams and handles run the same algorithm. Inside a CUDA
  /// graph capture the heuristic's first choice is used (and not remembered).
  void set_autotune(bool on);
  static constexpr int kAutotuneCandidates = 16;

  /// (index of the algorithm in use among the heuristic's results, number of results considered) for
  /// a prepared problem; (-1, 0) when `call` has not run on this context.
  std::pair<int, int> algorithm_choice(const LtCall& call) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace scalemm::backends
