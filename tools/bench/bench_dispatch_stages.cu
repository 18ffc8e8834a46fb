// Where the time of the emulated backend and of sample verification goes, stage by stage.
// CUDA events around each stage, 5 warm-ups, median of 30; random MXFP8/NVFP4 inputs quantized on
// the host (never zeros). Usage: bench_dispatch_stages [--quick | --shape M N K]
//
// The full run adds, at 8192^3, the back-to-back sequence split by events into its stages, and the
// BF16 GEMM alone, after a D2D copy moving the dequantizations' bytes, and back to back, each over
// 300 calls with the SM clock and board power sampled by NVML (loaded at run time; "-" without it):
// the answer to "why is the GEMM slower right after the memory-bound passes".
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cublaslt/cublaslt.hpp"
#include "backends/emulated.hpp"
#include "dispatch/verify.hpp"
#include "scalemm/emulation/emulation.hpp"
#include "scalemm/gemm.hpp"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/detail/device_buffer.hpp"

using namespace scalemm;

namespace {

double median_us(const std::function<void()>& fn, int iters = 30) {
  cudaEvent_t a, b;
  SCALEMM_CUDA_CHECK(cudaEventCreate(&a));
  SCALEMM_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 5; ++i) fn();
  std::vector<float> t;
  for (int i = 0; i < iters; ++i) {
    SCALEMM_CUDA_CHECK(cudaEventRecord(a));
    fn();
    SCALEMM_CUDA_CHECK(cudaEventRecord(b));
    SCALEMM_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    SCALEMM_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.0f);
  }
  std::sort(t.begin(), t.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return t[t.size() / 2];
}

// NVML through dlopen (no build dependency): SM clock (MHz) and board power (mW), sampled every
// 200 us by a thread while a phase runs.
struct Nvml {
  using Init = int (*)();
  using Handle = int (*)(unsigned, void**);
  using Clock = int (*)(void*, int, unsigned*);
  using Power = int (*)(void*, unsigned*);
  Clock clock = nullptr;
  Power power = nullptr;
  void* dev = nullptr;
  Nvml() {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) return;
    auto init = reinterpret_cast<Init>(dlsym(lib, "nvmlInit_v2"));
    auto handle = reinterpret_cast<Handle>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
    clock = reinterpret_cast<Clock>(dlsym(lib, "nvmlDeviceGetClockInfo"));
    power = reinterpret_cast<Power>(dlsym(lib, "nvmlDeviceGetPowerUsage"));
    if (!init || !handle || !clock || !power || init() != 0 || handle(0, &dev) != 0) clock = nullptr;
  }
  bool ok() const { return clock != nullptr; }
};

struct Sampled {
  double us = 0, mhz = 0, watts = 0;  // medians
};

template <class Fn>
Sampled sampled_phase(const Nvml& nv, int iters, Fn&& one_call) {
  std::vector<unsigned> mhz, mw;
  std::atomic<bool> run{true};
  std::thread t([&] {
    while (run.load()) {
      unsigned c = 0, p = 0;
      if (nv.ok() && nv.clock(nv.dev, 1 /* NVML_CLOCK_SM */, &c) == 0 && nv.power(nv.dev, &p) == 0)
        mhz.push_back(c), mw.push_back(p);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  std::vector<float> us;
  for (int i = 0; i < iters; ++i) us.push_back(float(one_call()));
  run = false;
  t.join();
  auto med = [](auto v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return double(v[v.size() / 2]);
  };
  return {med(us), med(mhz), med(mw) / 1000.0};
}

struct Operand {
  detail::DeviceBuffer data_mem, scale_mem;
  void* data = nullptr;    // data_mem.p
  void* scales = nullptr;  // scale_mem.p
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
  op.data = op.data_mem.upload(data.data(), data.size());
  op.scales = op.scale_mem.upload(scales.data(), scales.size());
  return op;
}

__global__ void spin_kernel(long long ns) {
  const long long t0 = clock64(), cycles = ns * 3 / 2;  // >= ns at clocks up to 1.5 GHz
  while (clock64() - t0 < cycles) {
  }
}

// The sequence split by events, and the BF16 GEMM in three surroundings, 300 calls each with NVML
// sampling. Printed after the stage table's row.
std::vector<std::string> g_split_lines;
void split_stages(const backends::EmulatedOperand& ea, const backends::EmulatedOperand& eb,
                  backends::EmulatedShifts* shifts, backends::LtContext& lt, const backends::LtCall& call, void* ws,
                  int64_t m, int64_t n, int64_t k, void* a16, void* b16) {
  const Nvml nv;
  const int iters = 300;
  cudaEvent_t ev[5];
  for (auto& e : ev) SCALEMM_CUDA_CHECK(cudaEventCreate(&e));
  auto gemm = [&] { lt.matmul(call, ws, 32u << 20, nullptr); };
  auto elapsed = [&](int i, int j) {
    float ms = 0;
    SCALEMM_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[i], ev[j]));
    return double(ms) * 1000.0;
  };
  // 1. The four launches back to back, an event between each: per-stage medians inside the sequence.
  // A 200-us spin kernel holds the GPU while the host enqueues them, so these are GPU times without
  // the host's launch latency (which the stage table above includes).
  std::vector<std::vector<double>> parts(4);
  for (int i = 0; i < 5; ++i) gemm();
  const Sampled seq = sampled_phase(nv, iters, [&] {
    spin_kernel<<<1, 1>>>(200000);
    SCALEMM_CUDA_CHECK(cudaEventRecord(ev[0]));
    backends::emulated_prepare(ea, eb, shifts, nullptr);
    SCALEMM_CUDA_CHECK(cudaEventRecord(ev[1]));
    backends::emulated_dequantize_bf16(ea, shifts, 0, static_cast<uint16_t*>(a16), nullptr);
    SCALEMM_CUDA_CHECK(cudaEventRecord(ev[2]));
    backends::emulated_dequantize_bf16(eb, shifts, 1, static_cast<uint16_t*>(b16), nullptr);
    SCALEMM_CUDA_CHECK(cudaEventRecord(ev[3]));
    gemm();
    SCALEMM_CUDA_CHECK(cudaEventRecord(ev[4]));
    SCALEMM_CUDA_CHECK(cudaEventSynchronize(ev[4]));
    for (int s = 0; s < 4; ++s) parts[size_t(s)].push_back(elapsed(s, s + 1));
    return elapsed(0, 4);
  });
  for (auto& p : parts) std::sort(p.begin(), p.end());
  // 2. The GEMM alone, the host waiting for each call (as the stage table times it).
  const Sampled alone = sampled_phase(nv, iters, [&] {
    SCALEMM_CUDA_CHECK(cudaEventRecord(ev[0]));
    gemm();
    SCALEMM_CUDA_CHECK(cudaEventRecord(ev[1]));
    SCALEMM_CUDA_CHECK(cudaEventSynchronize(ev[1]));
    return elapsed(0, 1);
  });
  // 3. The GEMM right after a D2D copy moving the same bytes as the two dequantizations (no compute).
  const size_t copy_bytes = size_t((m + n) * k) * 3 / 2;  // read + write = (m + n) k (1 + 2) bytes
  detail::DeviceBuffer src_mem(copy_bytes), dst_mem(copy_bytes);
  void *src = src_mem.p, *dst = dst_mem.p;
  std::vector<double> copy_part;
  const Sampled after_copy = sampled_phase(nv, iters, [&] {
    SCALEMM_CUDA_CHECK(cudaEventRecord(ev[0]));
    SCALEMM_CUDA_CHECK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, nullptr));
    SCALEMM_CUDA_CHECK(cudaEventRecord(ev[1]));
    gemm();
    SCALEMM_CUDA_CHECK(cudaEventRecord(ev[2]));
    SCALEMM_CUDA_CHECK(cudaEventSynchronize(ev[2]));
    copy_part.push_back(elapsed(0, 1));
    return elapsed(1, 2);
  });
  std::sort(copy_part.begin(), copy_part.end());
  // 4. The GEMM back to back, four per sample, the host never idle-waiting between them.
  const Sampled b2b = sampled_phase(nv, iters / 4, [&] {
    SCALEMM_CUDA_CHECK(cudaEventRecord(ev[0]));
    for (int i = 0; i < 4; ++i) gemm();
    SCALEMM_CUDA_CHECK(cudaEventRecord(ev[1]));
    SCALEMM_CUDA_CHECK(cudaEventSynchronize(ev[1]));
    return elapsed(0, 1) / 4;
  });
  for (auto& e : ev) cudaEventDestroy(e);
  auto med = [](const std::vector<double>& v) { return v[v.size() / 2]; };
  char line[512];
  auto clk = [&](const Sampled& x) {
    char b[64];
    if (!nv.ok()) return std::string("- | -");
    std::snprintf(b, sizeof b, "%.0f | %.0f", x.mhz, x.watts);
    return std::string(b);
  };
  std::snprintf(line, sizeof line, "| sequence, GPU time (prepare %.1f, dequant A %.1f, dequant B %.1f, GEMM %.1f) | %.1f | %s |",
                med(parts[0]), med(parts[1]), med(parts[2]), med(parts[3]), seq.us, clk(seq).c_str());
  g_split_lines.push_back(line);
  std::snprintf(line, sizeof line, "| GEMM alone, host waits for each call | %.1f | %s |", alone.us, clk(alone).c_str());
  g_split_lines.push_back(line);
  std::snprintf(line, sizeof line, "| GEMM right after a %.0f MB D2D copy (copy %.1f) | %.1f | %s |",
                2.0 * double(copy_bytes) / 1e6, med(copy_part), after_copy.us, clk(after_copy).c_str());
  g_split_lines.push_back(line);
  std::snprintf(line, sizeof line, "| GEMM back to back (4 per sample) | %.1f | %s |", b2b.us, clk(b2b).c_str());
  g_split_lines.push_back(line);
}

void emulated_stages(Recipe r, int64_t m, int64_t n, int64_t k, bool split = false) {
  const Operand a = make(r, m, k, 1), b = make(r, n, k, 2);
  detail::DeviceBuffer a16_mem(size_t(m * k) * 2), b16_mem(size_t(n * k) * 2), d_mem(size_t(m * n) * 2),
      ws_mem(32u << 20), scratch_mem(4096);
  void *a16 = a16_mem.p, *b16 = b16_mem.p, *d = d_mem.p, *ws = ws_mem.p, *scratch = scratch_mem.p;
  auto* shifts = static_cast<backends::EmulatedShifts*>(scratch);
  auto* alpha_beta = reinterpret_cast<float*>(static_cast<char*>(scratch) + 256);
  const backends::EmulatedOperand ea{a.data, a.dtype, a.scales, a.layout}, eb{b.data, b.dtype, b.scales, b.layout};
  backends::LtContext lt;
  backends::LtCall host_alpha;
  host_alpha.m = m, host_alpha.n = n, host_alpha.k = k;
  host_alpha.a_dtype = host_alpha.b_dtype = DType::kBF16, host_alpha.d_dtype = DType::kBF16;
  host_alpha.a = a16, host_alpha.b = b16, host_alpha.d = d;
  backends::LtCall dev_alpha = host_alpha;
  dev_alpha.alpha_device = alpha_beta;
  backends::emulated_prepare(ea, eb, shifts, nullptr);
  const float ab[2] = {1.0f, 0.0f};
  SCALEMM_CUDA_CHECK(cudaMemcpy(alpha_beta, ab, sizeof(ab), cudaMemcpyHostToDevice));

  Handle h;
  GemmArgs g;
  g.m = m, g.n = n, g.k = k;
  g.a = {a.data, a.dtype, r, a.scales, ScaleFormat::kCompact, a.global};
  g.b = {b.data, b.dtype, r, b.scales, ScaleFormat::kCompact, b.global};
  g.d = d, g.d_dtype = DType::kBF16;

  const double t_prep = median_us([&] { backends::emulated_prepare(ea, eb, shifts, nullptr); });
  const double t_da = median_us([&] { backends::emulated_dequantize_bf16(ea, shifts, 0, static_cast<uint16_t*>(a16), nullptr); });
  const double t_db = median_us([&] { backends::emulated_dequantize_bf16(eb, shifts, 1, static_cast<uint16_t*>(b16), nullptr); });
  const double t_host = median_us([&] { lt.matmul(host_alpha, ws, 32u << 20, nullptr); });
  const double t_dev = median_us([&] { lt.matmul(dev_alpha, ws, 32u << 20, nullptr); });
  const double t_all = median_us([&] { h.gemm(g, nullptr); });
  // The same four launches back to back, as Handle::gemm issues them: the difference to the sum of the
  // isolated stages is what running them in sequence costs (caches, clocks), not host work.
  const double t_seq = median_us([&] {
    backends::emulated_prepare(ea, eb, shifts, nullptr);
    backends::emulated_dequantize_bf16(ea, shifts, 0, static_cast<uint16_t*>(a16), nullptr);
    backends::emulated_dequantize_bf16(eb, shifts, 1, static_cast<uint16_t*>(b16), nullptr);
    lt.matmul(host_alpha, ws, 32u << 20, nullptr);
  });
  if (split) split_stages(ea, eb, shifts, lt, host_alpha, ws, m, n, k, a16, b16);
  const double bytes_a = double(m * k) * (a.dtype == DType::kE2M1 ? 0.5 : 1.0) + double(m * k) * 2;
  const double bytes_b = double(n * k) * (b.dtype == DType::kE2M1 ? 0.5 : 1.0) + double(n * k) * 2;
  std::printf("| %s %lldx%lldx%lld | %.1f | %.1f (%.0f GB/s) | %.1f (%.0f GB/s) | %.1f | %.1f | %.1f | %.1f |\n",
              std::string(to_string(r)).c_str(), (long long)m, (long long)n, (long long)k, t_prep, t_da,
              bytes_a / t_da / 1e3, t_db, bytes_b / t_db / 1e3, t_host, t_dev, t_seq, t_all);
}

void sample_stage(int64_t m, int64_t n, int64_t k) {
  const Operand a = make(Recipe::kBlock1x128, m, k, 3), b = make(Recipe::kBlock128x128, n, k, 4);
  detail::DeviceBuffer d_mem(size_t(m * n) * 2);
  void* d = d_mem.p;
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
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  cudaDeviceProp p{};
  SCALEMM_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
  std::printf("bench_dispatch_stages on %s; CUDA-event medians of 30 after 5 warm-ups, microseconds\n\n", p.name);
  std::printf("| emulated case | prepare | dequant A | dequant B | BF16 GEMM host alpha | BF16 GEMM device alpha | stages back to back | Handle::gemm |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  if (argc == 5 && std::strcmp(argv[1], "--shape") == 0) {  // one shape, mxfp8 and nvfp4 (for profilers)
    const int64_t m = std::atoll(argv[2]), n = std::atoll(argv[3]), k = std::atoll(argv[4]);
    emulated_stages(Recipe::kMxfp8, m, n, k);
    emulated_stages(Recipe::kNvfp4, m, n, k);
    return 0;
  }
  emulated_stages(Recipe::kMxfp8, 128, 7168, 2048);
  emulated_stages(Recipe::kNvfp4, 128, 7168, 2048);
  emulated_stages(Recipe::kMxfp8, 4096, 4096, 4096);
  if (!quick) {
    emulated_stages(Recipe::kMxfp8, 8192, 8192, 8192, true);
    emulated_stages(Recipe::kNvfp4, 8192, 8192, 8192);
    std::printf("\n| mxfp8 8192^3, 300 calls per row (NVML SM clock and board power: medians of 200-us samples) "
                "| us per call | SM MHz | W |\n|---|---|---|---|\n");
    for (const auto& l : g_split_lines) std::printf("%s\n", l.c_str());
  }
  std::printf("\n| sample verification | GEMM | sample check (enqueue + kernels) | overhead |\n|---|---|---|---|\n");
  sample_stage(4096, 4096, 4096);
  return 0;
}
