// The reference emulator on the GPU: the functors of detail/functors.hpp run through thrust::for_each
// with the Thrust CUDA system on the caller's stream (par_nosync: nothing here synchronises), plus the
// tiled fp32 SGEMM that makes the reference GEMM usable at real sizes, and the public device entry
// points. quantize_device / dequantize_device run the library's fast kernels (quantize/) and fall back
// to the functors where those do not apply. Compiled with -fmad=false so that only the explicit fmaf
// calls are fused.
#include <cuda_runtime.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/system/cuda/execution_policy.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include "detail/driver.hpp"
#include "detail/fast_codecs.cuh"
#include "fast_quantizers.hpp"
#include "scalemm/emulation/emulation.hpp"
#include "scalemm/status.hpp"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/detail/device_state.hpp"

using scalemm::detail::cuda_check;

namespace scalemm::emulation {

namespace {


struct DeviceExec {
  cudaStream_t stream;
  template <class F>
  void for_each(int64_t n, F f) {
    thrust::for_each(thrust::cuda::par_nosync.on(stream), thrust::counting_iterator<int64_t>(0),
                     thrust::counting_iterator<int64_t>(n), f);
    cuda_check(cudaGetLastError(), "thrust::for_each launch");
  }
  void zero(void* p, size_t bytes) {
    if (bytes) cuda_check(cudaMemsetAsync(p, 0, bytes, stream), "cudaMemsetAsync");
  }
};

size_t round256(size_t b) { return (b + 255) / 256 * 256; }


/// Workspace from the caller, or a stream-ordered allocation released when this object dies.
class Workspace {
 public:
  Workspace(void* given, size_t given_bytes, size_t need, cudaStream_t s) : stream_(s) {
    if (need == 0) return;
    if (given) {
      if (given_bytes < need)
        throw Error(StatusCode::kInvalidArgument, "emulation: workspace of " + std::to_string(given_bytes) +
                                                      " bytes is smaller than the " + std::to_string(need) +
                                                      " bytes needed");
      ptr_ = given;
    } else {
      cuda_check(cudaMallocAsync(&ptr_, need, s), "cudaMallocAsync(workspace)");
      owned_ = true;
    }
  }
  ~Workspace() {
    if (owned_) cudaFreeAsync(ptr_, stream_);
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
  bool owned_ = false;
  cudaStream_t stream_;
};


// ---- tiled fp32 SGEMM: D = alpha * A * B^T (+ bias), A (M, K), B (N, K) row-major ----------------
// 128x128 output tile per block, K step 8, 256 threads, 8x8 outputs per thread in registers.
// Every output accumulates acc = fmaf(a_k, b_k, acc) for k = 0..K-1 in order (the zero padding past K
// adds exact zeros), which is exactly what the host GemmF32 functor does.
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
      if (c < N) detail::gemm_store(D, out_dtype, r * ldd + c, acc[i][j], alpha, bias, c);
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

size_t quantize_device_workspace_bytes(const SourceMatrix& src, const QuantizeConfig& cfg) {
  const int64_t generic = detail::plan_quantize(src, cfg).scratch_floats();
  const int64_t fast = fastq::plan_fast(src, cfg).floats();
  return round256(size_t(std::max(generic, fast)) * sizeof(float));
}

void quantize_device(const SourceMatrix& src, const QuantizeConfig& cfg, const QuantizeOutputs& out,
                     void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  validate(src, cfg, out);
  const scalemm::detail::DeviceScope scope(scalemm::detail::stream_device(stream));  // the stream's device
  DeviceExec ex{stream};
  if (src.rows > 0 && src.cols > 0) {
    // Scale buffers: padding must read as zero, so a cublaslt buffer with padding is cleared first
    // (the kernels write every real scale; without padding the clear would be a wasted pass and launch).
    const auto lr = rowwise_layout(cfg, src.rows, src.cols), lc = columnwise_layout(cfg, src.rows, src.cols);
    if (cfg.rowwise && lr.has_padding()) ex.zero(out.scales, size_t(lr.bytes()));
    if (cfg.columnwise && lc.has_padding()) ex.zero(out.scales_t, size_t(lc.bytes()));
    // The fast kernels use scratch only for the amax passes (tensorwise, rowwise, NVFP4's global):
    // block recipes allocate nothing per call (a stream-ordered allocation can stall when the pool
    // has been trimmed at a synchronisation).
    const bool amax = cfg.recipe == Recipe::kTensorwise || cfg.recipe == Recipe::kRowwise || cfg.recipe == Recipe::kNvfp4;
    Workspace ws(workspace, workspace_bytes, amax ? round256(size_t(fastq::plan_fast(src, cfg).floats()) * sizeof(float)) : 0,
                 stream);
    if (fastq::quantize(src, cfg, out, static_cast<float*>(ws.get()), stream)) return;
  }
  Workspace ws(workspace, workspace_bytes, quantize_device_workspace_bytes(src, cfg), stream);
  detail::run_quantize(ex, src, cfg, out, static_cast<float*>(ws.get()));
}

void dequantize_device(const QuantizedTensor& t, void* out, DType out_dtype, cudaStream_t stream) {
  const scalemm::detail::DeviceScope scope(scalemm::detail::stream_device(stream));
  fastq::dequantize(t, out, out_dtype, stream);
}

void transpose_device(const void* src, int64_t batch, int64_t rows, int64_t cols, void* dst, cudaStream_t stream) {
  const scalemm::detail::DeviceScope scope(scalemm::detail::stream_device(stream));
  fastq::transpose_bytes(src, batch, rows, cols, dst, stream);
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
  fastq::dequantize(a, da, DType::kF32, stream);
  fastq::dequantize(b, db, DType::kF32, stream);
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
