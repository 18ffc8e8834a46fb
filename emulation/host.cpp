// Host backend: the functors of detail/functors.hpp run by the host executor (detail/host_exec.hpp,
// compiled by g++). Same functors as device.cu, hence byte-identical results.
#include <cmath>
#include <cstring>
#include <vector>

#include "checks.hpp"
#include "detail/driver.hpp"
#include "detail/host_exec.hpp"
#include "scalemm/emulation/emulation.hpp"
#include "scalemm/status.hpp"

namespace scalemm::emulation {

using numerics::detail::HostExec;

void quantize_host(const SourceMatrix& src, const QuantizeConfig& cfg, const QuantizeOutputs& out) {
  validate(src, cfg, out);
  const numerics::detail::QuantPlan p = numerics::detail::plan_quantize(src, cfg);
  std::vector<float> scratch(size_t(p.scratch_floats()));
  HostExec ex;
  numerics::detail::run_quantize(ex, src, cfg, out, scratch.data());
}

void dequantize_host(const QuantizedTensor& t, void* out, DType out_dtype) {
  HostExec ex;
  numerics::detail::run_dequantize(ex, t, out, out_dtype);
}

void gemm_host(const QuantizedTensor& a, const QuantizedTensor& b, void* d, const GemmOptions& opt) {
  check_gemm_args(a, b, d, opt);
  const int64_t M = a.rows(), N = b.rows(), K = a.k();
  if (M == 0 || N == 0) return;
  std::vector<float> da(size_t(M * K)), db(size_t(N * K));
  HostExec ex;
  numerics::detail::run_dequantize(ex, a, da.data(), DType::kF32);
  numerics::detail::run_dequantize(ex, b, db.data(), DType::kF32);
  const int64_t ldd = opt.ldd > 0 ? opt.ldd : N;
  if (opt.fp64_accumulate)
    ex.for_each(M * N, numerics::detail::GemmRef<double>{da.data(), db.data(), M, N, K, double(opt.alpha), opt.bias, d, opt.out_dtype, ldd});
  else
    ex.for_each(M * N, numerics::detail::GemmF32{da.data(), db.data(), M, N, K, opt.alpha, opt.bias, d, opt.out_dtype, ldd});
}

void grouped_gemm_rows_host(const QuantizedTensor* a, const QuantizedTensor* b, const int64_t* offs, int groups,
                            void* d, const GemmOptions& opt) {
  SCALEMM_EXPECTS(groups >= 0 && offs && offs[0] == 0, StatusCode::kInvalidArgument,
                  "grouped_gemm_rows: offs must start at 0");
  const int64_t N = groups > 0 ? b[0].rows() : 0;
  const int64_t ldd = opt.ldd > 0 ? opt.ldd : N;
  const int bytes = dtype_bits(opt.out_dtype) / 8;
  for (int g = 0; g < groups; ++g) {
    SCALEMM_EXPECTS(offs[g + 1] >= offs[g] && a[g].rows() == offs[g + 1] - offs[g] && b[g].rows() == N,
                    StatusCode::kInvalidArgument, "grouped_gemm_rows: group " + std::to_string(g) + " shape mismatch");
    GemmOptions o = opt;
    o.ldd = ldd;
    gemm_host(a[g], b[g], static_cast<uint8_t*>(d) + offs[g] * ldd * bytes, o);
  }
}

void grouped_gemm_k_host(const QuantizedTensor* a, const QuantizedTensor* b, int groups, void* d,
                         const GemmOptions& opt) {
  SCALEMM_EXPECTS(groups >= 0, StatusCode::kInvalidArgument, "grouped_gemm_k: negative group count");
  if (groups == 0) return;
  const int64_t M = a[0].rows(), N = b[0].rows();
  const int bytes = dtype_bits(opt.out_dtype) / 8;
  for (int g = 0; g < groups; ++g) {
    SCALEMM_EXPECTS(a[g].rows() == M && b[g].rows() == N, StatusCode::kInvalidArgument,
                    "grouped_gemm_k: group " + std::to_string(g) + " shape mismatch");
    GemmOptions o = opt;
    o.ldd = 0;
    gemm_host(a[g], b[g], static_cast<uint8_t*>(d) + int64_t(g) * M * N * bytes, o);
  }
}

}  // namespace scalemm::emulation
