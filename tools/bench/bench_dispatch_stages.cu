// Where the time of the emulated backend and of sample verification goes, stage by stage.
// CUDA events around each stage, 5 warm-ups, median of 30; random MXFP8/NVFP4 inputs quantized on
// the host (never zeros). Usage: bench_dispatch_stages [--quick]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "../../lib/backends/cublaslt.hpp"
#include "../../lib/dispatch/kernels.cuh"
#include "../../lib/dispatch/verify.hpp"
#include "scalemm/emulation/emulation.hpp"
#include "scalemm/gemm.hpp"

using namespace scalemm;

namespace {

#define OK(x)                                                                    \
  do {                                                                           \
    cudaError_t e_ = (x);                                                        \
    if (e_ != cudaSuccess) {                                                     \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)

double median_us(const std::function<void()>& fn, int iters = 30) {
  cudaEvent_t a, b;
  OK(cudaEventCreate(&a));
  OK(cudaEventCreate(&b));
  for (int i = 0; i < 5; ++i) fn();
  std::vector<float> t;
  for (int i = 0; i < iters; ++i) {
    OK(cudaEventRecord(a));
    fn();
    OK(cudaEventRecord(b));
    OK(cudaEventSynchronize(b));
    float ms = 0;
    OK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.0f);
  }
  std::sort(t.begin(), t.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return t[t.size() / 2];
}

struct Operand {
  void* data = nullptr;
  void* scales = nullptr;
  layouts::ScaleLayout layout;
  DType dtype;
  float global = 1.0f;
};

Operand make(Recipe r, int64_t rows, int64_t k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> src(size_t(rows * k));
  for (auto& v : src) v = nd(rng);
  emulation::QuantizeConfig cfg;
  cfg.recipe = r;
  cfg.data_dtype = r == Recipe::kNvfp4 ? DType::kE2M1 : DType::kE4M3;
  Operand op;
  op.layout = emulation::rowwise_layout(cfg, rows, k);
  op.dtype = cfg.data_dtype;
  std::vector<uint8_t> data(size_t(emulation::data_bytes(cfg, rows, k))), scales(size_t(op.layout.bytes()));
  emulation::QuantizeOutputs out;
  out.data = data.data();
  out.scales = scales.data();
  out.global_scale = &op.global;
  emulation::quantize_host({src.data(), DType::kF32, rows, k}, cfg, out);
  OK(cudaMalloc(&op.data, data.size()));
  OK(cudaMalloc(&op.scales, scales.size()));
  OK(cudaMemcpy(op.data, data.data(), data.size(), cudaMemcpyHostToDevice));
  OK(cudaMemcpy(op.scales, scales.data(), scales.size(), cudaMemcpyHostToDevice));
  return op;
}

void emulated_stages(Recipe r, int64_t m, int64_t n, int64_t k) {
  const Operand a = make(r, m, k, 1), b = make(r, n, k, 2);
  void *a16, *b16, *d, *ws, *scratch;
  OK(cudaMalloc(&a16, size_t(m * k) * 2));
  OK(cudaMalloc(&b16, size_t(n * k) * 2));
  OK(cudaMalloc(&d, size_t(m * n) * 2));
  OK(cudaMalloc(&ws, 32u << 20));
  OK(cudaMalloc(&scratch, 4096));
  auto* shifts = static_cast<dispatch::EmulatedShifts*>(scratch);
  auto* alpha_beta = reinterpret_cast<float*>(static_cast<char*>(scratch) + 256);
  const dispatch::EmulatedOperand ea{a.data, a.dtype, a.scales, a.layout}, eb{b.data, b.dtype, b.scales, b.layout};
  backends::LtContext lt;
  backends::LtCall host_alpha;
  host_alpha.m = m, host_alpha.n = n, host_alpha.k = k;
  host_alpha.a_dtype = host_alpha.b_dtype = DType::kBF16, host_alpha.d_dtype = DType::kBF16;
  host_alpha.a = a16, host_alpha.b = b16, host_alpha.d = d;
  backends::LtCall dev_alpha = host_alpha;
  dev_alpha.alpha_device = alpha_beta;
  dispatch::emulated_prepare(ea, eb, shifts, nullptr);
  const float ab[2] = {1.0f, 0.0f};
  OK(cudaMemcpy(alpha_beta, ab, sizeof(ab), cudaMemcpyHostToDevice));

  Handle h;
  GemmArgs g;
  g.m = m, g.n = n, g.k = k;
  g.a = {a.data, a.dtype, r, a.scales, ScaleFormat::kCompact, a.global};
  g.b = {b.data, b.dtype, r, b.scales, ScaleFormat::kCompact, b.global};
  g.d = d, g.d_dtype = DType::kBF16;

  const double t_prep = median_us([&] { dispatch::emulated_prepare(ea, eb, shifts, nullptr); });
  const double t_da = median_us([&] { dispatch::emulated_dequantize_bf16(ea, shifts, 0, static_cast<uint16_t*>(a16), nullptr); });
  const double t_db = median_us([&] { dispatch::emulated_dequantize_bf16(eb, shifts, 1, static_cast<uint16_t*>(b16), nullptr); });
  const double t_host = median_us([&] { lt.matmul(host_alpha, ws, 32u << 20, nullptr); });
  const double t_dev = median_us([&] { lt.matmul(dev_alpha, ws, 32u << 20, nullptr); });
  const double t_all = median_us([&] { h.gemm(g, nullptr); });
  // The same four launches back to back, as Handle::gemm issues them: the difference to the sum of the
  // isolated stages is what running them in sequence costs (caches, clocks), not host work.
  const double t_seq = median_us([&] {
    dispatch::emulated_prepare(ea, eb, shifts, nullptr);
    dispatch::emulated_dequantize_bf16(ea, shifts, 0, static_cast<uint16_t*>(a16), nullptr);
    dispatch::emulated_dequantize_bf16(eb, shifts, 1, static_cast<uint16_t*>(b16), nullptr);
    lt.matmul(host_alpha, ws, 32u << 20, nullptr);
  });
  const double bytes_a = double(m * k) * (a.dtype == DType::kE2M1 ? 0.5 : 1.0) + double(m * k) * 2;
  const double bytes_b = double(n * k) * (b.dtype == DType::kE2M1 ? 0.5 : 1.0) + double(n * k) * 2;
  std::printf("| %s %lldx%lldx%lld | %.1f | %.1f (%.0f GB/s) | %.1f (%.0f GB/s) | %.1f | %.1f | %.1f | %.1f |\n",
              std::string(to_string(r)).c_str(), (long long)m, (long long)n, (long long)k, t_prep, t_da,
              bytes_a / t_da / 1e3, t_db, bytes_b / t_db / 1e3, t_host, t_dev, t_seq, t_all);
  for (void* p : {a.data, a.scales, b.data, b.scales, a16, b16, d, ws, scratch}) cudaFree(p);
}

void sample_stage(int64_t m, int64_t n, int64_t k) {
  const Operand a = make(Recipe::kBlock1x128, m, k, 3), b = make(Recipe::kBlock128x128, n, k, 4);
  void* d;
  OK(cudaMalloc(&d, size_t(m * n) * 2));
  GemmArgs g;
  g.m = m, g.n = n, g.k = k;
  g.a = {a.data, a.dtype, Recipe::kBlock1x128, a.scales, ScaleFormat::kCompact, 1.0f};
  g.b = {b.data, b.dtype, Recipe::kBlock128x128, b.scales, ScaleFormat::kCompact, 1.0f};
  g.d = d, g.d_dtype = DType::kBF16;
  Handle h;
  const Plan plan = h.plan(g);
  verify::AsyncSampler sampler;
  const double t_gemm = median_us([&] { h.gemm(g, nullptr); });
  const double t_sample = median_us([&] {
    sampler.enqueue(g, plan, nullptr);
  });
  sampler.drain();
  std::printf("| blockwise %lldx%lldx%lld | %.1f | %.1f | %+.1f%% |\n", (long long)m, (long long)n, (long long)k, t_gemm,
              t_sample, 100.0 * t_sample / t_gemm);
  for (void* p : {a.data, a.scales, b.data, b.scales, d}) cudaFree(p);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  cudaDeviceProp p{};
  OK(cudaGetDeviceProperties(&p, 0));
  std::printf("bench_dispatch_stages on %s; CUDA-event medians of 30 after 5 warm-ups, microseconds\n\n", p.name);
  std::printf("| emulated case | prepare | dequant A | dequant B | BF16 GEMM host alpha | BF16 GEMM device alpha | stages back to back | Handle::gemm |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  emulated_stages(Recipe::kMxfp8, 128, 7168, 2048);
  emulated_stages(Recipe::kNvfp4, 128, 7168, 2048);
  emulated_stages(Recipe::kMxfp8, 4096, 4096, 4096);
  if (!quick) {
    emulated_stages(Recipe::kMxfp8, 8192, 8192, 8192);
    emulated_stages(Recipe::kNvfp4, 8192, 8192, 8192);
  }
  std::printf("\n| sample verification | GEMM | sample check (enqueue + kernels) | overhead |\n|---|---|---|---|\n");
  sample_stage(4096, 4096, 4096);
  return 0;
}
