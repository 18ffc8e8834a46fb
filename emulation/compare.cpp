// Comparison helpers (host).
#include "scalemm/emulation/compare.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "scalemm/formats.hpp"
#include "scalemm/status.hpp"

namespace scalemm::emulation {

namespace {

namespace fmt = scalemm::formats;

double decode_any(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kBF16: return fmt::decode_bf16(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16: return fmt::decode_f16(static_cast<const uint16_t*>(p)[i]);
    case DType::kE4M3: return fmt::decode_e4m3(static_cast<const uint8_t*>(p)[i]);
    case DType::kE5M2: return fmt::decode_e5m2(static_cast<const uint8_t*>(p)[i]);
    case DType::kE8M0: return fmt::decode_e8m0(static_cast<const uint8_t*>(p)[i]);
    case DType::kUE4M3: return fmt::decode_ue4m3(static_cast<const uint8_t*>(p)[i]);
    default: break;
  }
  throw Error(StatusCode::kInvalidArgument, "compare: unsupported dtype " + std::string(to_string(t)));
}

uint64_t raw_bits(const void* p, DType t, int64_t i) {
  switch (dtype_bits(t)) {
    case 32: return static_cast<const uint32_t*>(p)[i];
    case 16: return static_cast<const uint16_t*>(p)[i];
    default: return static_cast<const uint8_t*>(p)[i];
  }
}

/// Core loop over decoded values; `bits` tells whether both sides are the same raw encoding.
template <class GetR, class GetT, class Same>
Comparison compare_impl(int64_t n, GetR ref, GetT test, Same same_bits, const Tolerance* tol) {
  Comparison c;
  c.count = n;
  long double sig = 0, noise = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double r = ref(i), t = test(i);
    const bool rn = std::isnan(r), tn = std::isnan(t), ri = std::isinf(r), ti = std::isinf(t);
    c.nan_ref += rn;
    c.nan_test += tn;
    c.inf_ref += ri;
    c.inf_test += ti;
    const bool equal_bits = (rn && tn) || same_bits(i);
    if (!equal_bits) {
      ++c.bit_mismatches;
      if (c.first_bit_mismatch < 0) c.first_bit_mismatch = i;
    }
    if (rn || tn || ri || ti) {
      const bool ok = (rn && tn) || (ri && ti && (r > 0) == (t > 0));
      if (!ok) {
        ++c.nonfinite_mismatches;
        if (tol && c.first_violation < 0) c.first_violation = i;
      }
      continue;
    }
    const double e = std::fabs(t - r);
    if (e > c.max_abs_err || c.max_abs_index < 0) {
      c.max_abs_err = e;
      c.max_abs_index = i;
    }
    if (r != 0.0) {
      const double rel = e / std::fabs(r);
      if (rel > c.max_rel_err || c.max_rel_index < 0) {
        c.max_rel_err = rel;
        c.max_rel_index = i;
      }
    }
    sig += (long double)r * r;
    noise += (long double)(t - r) * (t - r);
    if (tol && e > tol->atol + tol->rtol * std::fabs(r)) {
      ++c.violations;
      if (c.first_violation < 0) c.first_violation = i;
    }
  }
  c.sqnr_db = noise == 0 ? std::numeric_limits<double>::infinity()
                         : double(10.0L * std::log10(sig / noise));
  return c;
}

}  // namespace

std::string Tolerance::to_string() const {
  char buf[96];
  std::snprintf(buf, sizeof buf, "atol=%.3g rtol=%.3g", atol, rtol);
  return buf;
}

std::string Comparison::to_string() const {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "n=%lld bitwise=%s (%lld differ, first at %lld) max_abs=%.6g @%lld max_rel=%.6g @%lld "
                "sqnr=%.2f dB nan ref/test %lld/%lld inf ref/test %lld/%lld nonfinite_mismatch=%lld "
                "violations=%lld (first at %lld)",
                (long long)count, bitwise_equal() ? "yes" : "no", (long long)bit_mismatches,
                (long long)first_bit_mismatch, max_abs_err, (long long)max_abs_index, max_rel_err,
                (long long)max_rel_index, sqnr_db, (long long)nan_ref, (long long)nan_test, (long long)inf_ref,
                (long long)inf_test, (long long)nonfinite_mismatches, (long long)violations,
                (long long)first_violation);
  return buf;
}

Comparison compare(const void* ref, const void* test, DType dtype, int64_t n, const Tolerance* tol) {
  return compare_impl(
      n, [&](int64_t i) { return decode_any(ref, dtype, i); }, [&](int64_t i) { return decode_any(test, dtype, i); },
      [&](int64_t i) { return raw_bits(ref, dtype, i) == raw_bits(test, dtype, i); }, tol);
}

Comparison compare(const float* ref, const float* test, int64_t n, const Tolerance* tol) {
  return compare(static_cast<const void*>(ref), static_cast<const void*>(test), DType::kF32, n, tol);
}

Comparison compare(const double* ref, const float* test, int64_t n, const Tolerance* tol) {
  return compare_impl(
      n, [&](int64_t i) { return ref[i]; }, [&](int64_t i) { return double(test[i]); },
      [&](int64_t i) { return ref[i] == double(test[i]) && std::signbit(ref[i]) == std::signbit(test[i]); }, tol);
}

bool bitwise_equal(const void* a, const void* b, size_t bytes, int64_t* first_diff) {
  const auto* pa = static_cast<const uint8_t*>(a);
  const auto* pb = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < bytes; ++i)
    if (pa[i] != pb[i]) {
      if (first_diff) *first_diff = int64_t(i);
      return false;
    }
  if (first_diff) *first_diff = -1;
  return true;
}

double sqnr_db(const double* ref, const float* test, int64_t n) { return compare(ref, test, n).sqnr_db; }
double sqnr_db(const float* ref, const float* test, int64_t n) { return compare(ref, test, n).sqnr_db; }

Tolerance gemm_tolerance(int64_t k, DType in_dtype, DType out_dtype, double ref_scale) {
  const double u_acc = std::ldexp(1.0, -24);
  // Unit roundoff of the output: half a unit in the last place (FP8 outputs: e4m3 3, e5m2 2 mantissa
  // bits; their subnormal floor is covered by the u_out * ref_scale term when d_scale maps the output's
  // amax near the format's maximum, as delayed and current scaling do).
  const double u_out = out_dtype == DType::kBF16  ? std::ldexp(1.0, -8)
                       : out_dtype == DType::kF16 ? std::ldexp(1.0, -11)
                       : out_dtype == DType::kE4M3 ? std::ldexp(1.0, -4)
                       : out_dtype == DType::kE5M2 ? std::ldexp(1.0, -3)
                                                   : u_acc;
  const double u_in = in_dtype == DType::kE2M1 ? std::ldexp(1.0, -23) : u_acc;
  // Among a 16-bit output's subnormals the spacing no longer shrinks with the value: a result that is
  // right to fp32 rounding may round to the neighbour of the reference's subnormal (f16: 2.98e-7
  // against 2.38e-7, one step of 2^-24, seen by the grouped fuzzer with small scales). One step of
  // the format's smallest subnormal is the floor of the absolute tolerance.
  const double sub_out = out_dtype == DType::kF16 ? std::ldexp(1.0, -24) : out_dtype == DType::kBF16 ? std::ldexp(1.0, -133) : 0.0;
  Tolerance t;
  t.rtol = 2 * u_out + 2 * u_in;
  t.atol = (2 * std::sqrt(double(k)) + 2) * u_acc * ref_scale + u_out * ref_scale + sub_out;
  return t;
}

}  // namespace scalemm::emulation
