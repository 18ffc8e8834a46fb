// What cuBLASLt can run natively, as one data table. Every fact carries its source; the planner reads
// only this table, so "why did this call fall back" has one answer in one place.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "scalemm/gemm.hpp"

namespace scalemm::base {

// cublasLtMatmulMatrixScale_t values (cublasLt.h, cuBLAS 13.1); kept numeric so this table needs no
// cuBLASLt header and the planner builds on any machine.
enum ScaleMode : int {
  kScalar32F = 0,
  kVec16UE4M3 = 1,
  kVec32UE8M0 = 2,
  kOuterVec32F = 3,
  kVec128_32F = 4,
  kBlk128x128_32F = 5,
};
const char* scale_mode_name(int mode);

/// cuBLASLt scale mode of a recipe's operand (mxfp8-32x32 runs as VEC32_UE8M0 on its replicated,
/// tiled buffer).
int recipe_scale_mode(Recipe r);

/// One recipe pair cuBLASLt can run (or, with supported = false, one it cannot, with the evidence).
struct NativePair {
  Recipe a;  ///< the user's A (activations, rows = M)
  Recipe b;  ///< the user's B (weights, rows = N)
  bool supported;
  int min_sm;               ///< inclusive
  int max_sm;               ///< inclusive
  size_t min_cublaslt;      ///< cublasLtGetVersion() form
  const char* source;
};

/// The table itself (for `scalemm info` and the docs).
const NativePair* native_pairs(size_t* count);

/// Version number in cublasLtGetVersion() form: (major, minor, patch) -> 130100.
constexpr size_t cublaslt_version(int major, int minor, int patch = 0) {
  return size_t(major) * 10000 + size_t(minor) * 100 + size_t(patch);
}
std::string cublaslt_version_string(size_t v);

/// Why cuBLASLt cannot run `p` natively on `t` ("" when it can). Checks the recipe pair, dtypes,
/// output type, bias, and the shape/alignment rules; each reason names its rule and source.
std::string native_blocker(const GemmProblem& p, const DeviceTarget& t);

/// The rule "fast accumulation takes tensorwise and rowwise operands only" (cuBLASLt's FAST_ACCUM
/// turns off the per-K-block promotion that block scales need), as a Diagnostic; none when it holds.
std::optional<Diagnostic> fast_accum_refusal(bool fast_accum, Recipe a, Recipe b);

/// True when both recipes dequantize exactly to BF16 (E8M0/UE4M3 block scales): the emulated backend.
bool exact_in_bf16(const GemmProblem& p, std::string* why_not);

}  // namespace scalemm::base
