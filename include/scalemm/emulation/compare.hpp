// Comparison helpers for tests, verify mode and the CLI (host memory, plain C++).
//
// Two kinds of question, never mixed up:
//  * implementation correctness: a result vs the reference on identical quantized inputs -> bitwise
//    equality, or a tolerance that covers accumulation order and output rounding (gemm_tolerance);
//  * quantization quality: a result vs the unquantized high-precision product -> SQNR in dB.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "scalemm/types.hpp"

namespace scalemm::emulation {

/// |test - ref| <= atol + rtol * |ref| elementwise.
struct Tolerance {
  double atol = 0.0;
  double rtol = 0.0;
  std::string to_string() const;
};

struct Comparison {
  int64_t count = 0;
  int64_t bit_mismatches = 0;      ///< elements whose bits differ (all NaNs of one side count as equal)
  int64_t first_bit_mismatch = -1;
  double max_abs_err = 0.0;        ///< over elements where both are finite
  int64_t max_abs_index = -1;
  double max_rel_err = 0.0;        ///< |t - r| / |r| over finite elements with r != 0
  int64_t max_rel_index = -1;
  double sqnr_db = 0.0;            ///< 10 log10(sum r^2 / sum (t - r)^2) over finite pairs; +inf when equal
  int64_t nan_ref = 0, nan_test = 0, inf_ref = 0, inf_test = 0;
  int64_t nonfinite_mismatches = 0;  ///< positions where NaN/Inf-ness or the Inf sign differ
  int64_t violations = 0;          ///< elements outside the tolerance (when one was given)
  int64_t first_violation = -1;

  bool bitwise_equal() const { return bit_mismatches == 0; }
  bool within_tolerance() const { return violations == 0 && nonfinite_mismatches == 0; }
  /// "n=4096 bitwise=no (17 differ, first at 3) max_abs=1.2e-06 @42 max_rel=... sqnr=88.1 dB nan 0/0 inf 0/0"
  std::string to_string() const;
};

/// Element-wise comparison of two arrays of n elements of dtype (kF32, kBF16, kF16, or 8-bit types
/// compared via their fp32 decode: kE4M3, kE5M2, kE8M0, kUE4M3). `tol` adds a tolerance check.
Comparison compare(const void* ref, const void* test, DType dtype, int64_t n, const Tolerance* tol = nullptr);
Comparison compare(const float* ref, const float* test, int64_t n, const Tolerance* tol = nullptr);
/// Reference in fp64 (e.g. a product of the unquantized inputs), test in fp32.
Comparison compare(const double* ref, const float* test, int64_t n, const Tolerance* tol = nullptr);

/// Byte equality; *first_diff receives the first differing byte index (-1 when equal).
bool bitwise_equal(const void* a, const void* b, size_t bytes, int64_t* first_diff = nullptr);

/// SQNR in dB of test against ref: 10 log10(sum ref^2 / sum (test - ref)^2); +inf when equal.
double sqnr_db(const double* ref, const float* test, int64_t n);
double sqnr_db(const float* ref, const float* test, int64_t n);

/// Tolerance for comparing a GEMM implementation with the reference on the same quantized inputs:
/// covers a different fp32 accumulation order over K plus the output rounding. `ref_scale` is a
/// typical magnitude of the sum of |a_k * b_k| (e.g. max |ref| of a dense random problem):
///   rtol = 2 u_out + 2 u_in_scale,  atol = (2 sqrt(K) + 2) * u_acc * ref_scale + u_out * ref_scale
/// with u_out the unit roundoff of out_dtype (f32 2^-24, f16 2^-11, bf16 2^-8), u_acc = 2^-24 and
/// u_in_scale = 2^-24 for fp32-scale inputs, 2^-23 for NVFP4 (two scales folded into alpha).
Tolerance gemm_tolerance(int64_t k, DType in_dtype, DType out_dtype, double ref_scale);

}  // namespace scalemm::emulation
