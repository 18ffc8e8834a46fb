// The reference emulator on the GPU: the functors of detail/functors.hpp run through thrust::for_each
// with the Thrust CUDA system on the caller's stream (par_nosync: nothing here synchronises), plus the
// tiled fp32 SGEMM that makes the reference GEMM usable at real sizes. It uses nothing of the library's
// own quantizers (quantize/, scalemm::quantize), which are checked against it. Compiled with
// -fmad=false so that only the explicit fmaf calls are fused.
#include <cuda_runtime.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/system/cuda/execution_policy.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include "checks.hpp"
#include "detail/driver.hpp"
#include "detail/fast_codecs.cuh"
#include "detail/device_exec.cuh"
#include "scalemm/emulation/emulation.hpp"
#include "scalemm/status.hpp"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/detail/device_state.hpp"

using scalemm::detail::cuda_check;

namespace scalemm::emulation {

namespace {

using numerics::detail::DeviceExec;
using numerics::detail::Workspace;
using numerics::detail::round256;





// ---- tiled fp32 SGEMM: D = alpha * A * B^T (+ bias), A (M, K), B (N, K) row-major ----------------
// 128x128 output tile per block, K step 8, 256 threads, 8x8 outputs per thread in registers.
// Every output accumulates acc = fmaf(a_k, b_k, acc) for k = 0..K-1 in order (the zero padding past K
// adds exact zeros), which is exactly what the host GemmRef<float> functor does.
constexpr int kBM = 128, kBN = 128, kBK = 8, kTM = 8, kTN = 8, kThreads = 256;

__global__ void __launch_bounds__(kThreads) sgemm_nt_kernel(const float* __restrict__ A, const float* __restrict__ B,
                                                            void* D, int64_t M, int64_t N, int64_t K, float alpha,
                                                            const float* __restrict__ bias, DType out_dtype,
                                                            int64_t ldd) {
  __shared__ __align__(16) float As[kBK][kBM + 4];
  __shared__ __align__(16) float Bs[kBK][kBN + 4];
  const int tid = threadIdx.x;
  const int tx = tid % 16, ty = tid / 16;
  const int64_t m0 = int64_t(blockIdx.y) * kBM, n0 = int64_t(blockIdx.x) * kBN;
  const int lrow = tid / 2, lk = (tid % 2) * 4;
  const int64_t am = m0 + lrow, bn = n0 + lrow;
  const float* pa = A + am * K;
  const float* pb = B + bn * K;

  float acc[kTM][kTN];
#pragma unroll
  for (int i = 0; i < kTM; ++i)
#pragma unroll
    for (int j = 0; j < kTN; ++j) acc[i][j] = 0.0f;

  for (int64_t k0 = 0; k0 < K; k0 += kBK) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t gk = k0 + lk + j;
      As[lk + j][lrow] = (am < M && gk < K) ? pa[gk] : 0.0f;
      Bs[lk + j][lrow] = (bn < N && gk < K) ? pb[gk] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      float a[kTM], b[kTN];
      const float4 a0 = *reinterpret_cast<const float4*>(&As[kk][ty * kTM]);
      const float4 a1 = *reinterpret_cast<const float4*>(&As[kk][ty * kTM + 4]);
      const float4 b0 = *reinterpret_cast<const float4*>(&Bs[kk][tx * kTN]);
      const float4 b1 = *reinterpret_cast<const float4*>(&Bs[kk][tx * kTN + 4]);
      a[0] = a0.x; a[1] = a0.y; a[2] = a0.z; a[3] = a0.w; a[4] = a1.x; a[5] = a1.y; a[6] = a1.z; a[7] = a1.w;
      b[0] = b0.x; b[1] = b0.y; b[2] = b0.z; b[3] = b0.w; b[4] = b1.x; b[5] = b1.y; b[6] = b1.z; b[7] = b1.w;
#pragma unroll
      for (int i = 0; i < kTM; ++i)
#pragma unroll
        for (int j = 0; j < kTN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const int64_t r = m0 + ty * kTM + i;
    if (r >= M) continue;
#pragma unroll
    for (int j = 0; j < kTN; ++j) {
      const int64_t c = n0 + tx * kTN + j;
      if (c < N) numerics::detail::gemm_store(D, out_dtype, r * ldd + c, acc[i][j], alpha, bias, c);
    }
  }
}

}  // namespace

void sgemm_nt_device(const float* a, const float* b, void* d, int64_t m, int64_t n, int64_t k,
                     const GemmOptions& opt, cudaStream_t stream) {
  if (m == 0 || n == 0) return;
  const int64_t ldd = opt.ldd > 0 ? opt.ldd : n;
  const dim3 grid(unsigned((n + kBN - 1) / kBN), unsigned((m + kBM - 1) / kBM));
  SCALEMM_EXPECTS(grid.y <= 65535u, StatusCode::kUnsupported, "sgemm_nt_device: M too large for one launch");
  sgemm_nt_kernel<<<grid, kThreads, 0, stream>>>(a, b, d, m, n, k, opt.alpha, opt.bias, opt.out_dtype, ldd);
  cuda_check(cudaGetLastError(), "sgemm_nt_kernel launch");
}

size_t gemm_device_workspace_bytes(const QuantizedTensor& a, const QuantizedTensor& b) {
  return round256(size_t(a.rows() * a.k()) * 4) + round256(size_t(b.rows() * b.k()) * 4);
}

void gemm_device(const QuantizedTensor& a, const QuantizedTensor& b, void* d, const GemmOptions& opt,
                 void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  check_gemm_args(a, b, d, opt);
  SCALEMM_EXPECTS(!opt.fp64_accumulate, StatusCode::kUnsupported,
                  "gemm_device: fp64 accumulation is host-only (use gemm_host)");
  const int64_t M = a.rows(), N = b.rows(), K = a.k();
  if (M == 0 || N == 0) return;
  Workspace ws(workspace, workspace_bytes, gemm_device_workspace_bytes(a, b), stream);
  float* da = static_cast<float*>(ws.get());
  float* db = reinterpret_cast<float*>(static_cast<char*>(ws.get()) + round256(size_t(M * K) * 4));
  DeviceExec ex{stream};  // the emulator's own dequantization: it depends on no production kernel
  numerics::detail::run_dequantize(ex, a, da, DType::kF32);
  numerics::detail::run_dequantize(ex, b, db, DType::kF32);
  sgemm_nt_device(da, db, d, M, N, K, opt, stream);
}

size_t grouped_gemm_device_workspace_bytes(const QuantizedTensor* a, const QuantizedTensor* b, int groups) {
  size_t m = 0;
  for (int g = 0; g < groups; ++g) {
    const size_t w = gemm_device_workspace_bytes(a[g], b[g]);
    m = w > m ? w : m;
  }
  return m;
}

void grouped_gemm_rows_device(const QuantizedTensor* a, const QuantizedTensor* b, const int64_t* offs, int groups,
                              void* d, const GemmOptions& opt, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
  SCALEMM_EXPECTS(groups >= 0 && offs && offs[0] == 0, StatusCode::kInvalidArgument,
                  "grouped_gemm_rows: offs (host array) must start at 0");
  if (groups == 0) return;
  const int64_t N = b[0].rows();
  const int64_t ldd = opt.ldd > 0 ? opt.ldd : N;
  const int bytes = dtype_bits(opt.out_dtype) / 8;
  Workspace ws(workspace, workspace_bytes, grouped_gemm_device_workspace_bytes(a, b, groups), stream);
  for (int g = 0; g < groups; ++g) {
    SCALEMM_EXPECTS(offs[g + 1] >= offs[g] && a[g].rows() == offs[g + 1] - offs[g] && b[g].rows() == N,
                    StatusCode::kInvalidArgument, "grouped_gemm_rows: group " + std::to_string(g) + " shape mismatch");
    GemmOptions o = opt;
    o.ldd = ldd;
    gemm_device(a[g], b[g], static_cast<uint8_t*>(d) + offs[g] * ldd * bytes, o, ws.get(),
                grouped_gemm_device_workspace_bytes(a, b, groups), stream);
  }
}

void grouped_gemm_k_device(const QuantizedTensor* a, const QuantizedTensor* b, int groups, void* d,
                           const GemmOptions& opt, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  SCALEMM_EXPECTS(groups >= 0, StatusCode::kInvalidArgument, "grouped_gemm_k: negative group count");
  if (groups == 0) return;
  const int64_t M = a[0].rows(), N = b[0].rows();
  const int bytes = dtype_bits(opt.out_dtype) / 8;
  const size_t need = grouped_gemm_device_workspace_bytes(a, b, groups);
  Workspace ws(workspace, workspace_bytes, need, stream);
  for (int g = 0; g < groups; ++g) {
    SCALEMM_EXPECTS(a[g].rows() == M && b[g].rows() == N, StatusCode::kInvalidArgument,
                    "grouped_gemm_k: group " + std::to_string(g) + " shape mismatch");
    GemmOptions o = opt;
    o.ldd = 0;
    gemm_device(a[g], b[g], static_cast<uint8_t*>(d) + int64_t(g) * M * N * bytes, o, ws.get(), need, stream);
  }
}

}  // namespace scalemm::emulation
