// Grouped (MoE) GEMMs without Python: the contiguous and the CUTLASS grouped kernels (checked
// bit-identical), the per-group backend, and the per-group backend replaying its whole-call graph
// (graph_replay), on the MoE shapes of docs/benchmarks.md. block1x128 x block128x128 compact scales,
// bf16 out. CUDA events around 20 back-to-back calls on one stream (host time counts where it
// exceeds the GPU's), median of 9 samples. All four are timed interleaved (a sample of each in turn)
// after two seconds of calls: timed one after the other, whichever ran first on a cool GPU read up to
// 12% faster (H100).
// Usage: bench_grouped [--quick | --short-k] | --one G M_g N K (each one-launch kernel called twice,
// untimed: for a profiler). --short-k runs the shapes with K <= 2048 only.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/gemm.hpp"
#include "scalemm/grouped.hpp"
#include "scalemm/layouts/scale_layout.hpp"
#include "scalemm/detail/device_buffer.hpp"

using namespace scalemm;

namespace {

// Median microseconds per call of each of `calls_of` (sampled in turn: clock changes reach all alike),
// after `warm_s` seconds of calling them.
std::vector<double> interleaved_us_per_call(cudaStream_t s, const std::vector<std::function<void()>>& calls_of,
                                            double warm_s = 0.0, int calls = 20, int samples = 9) {
  cudaEvent_t a, b;
  SCALEMM_CUDA_CHECK(cudaEventCreate(&a));
  SCALEMM_CUDA_CHECK(cudaEventCreate(&b));
  for (const auto& call : calls_of)
    for (int i = 0; i < 3; ++i) call();
  SCALEMM_CUDA_CHECK(cudaEventRecord(a, s));
  for (size_t i = 0;; ++i) {
    calls_of[i % calls_of.size()]();
    if (i % 8 != 7) continue;
    SCALEMM_CUDA_CHECK(cudaEventRecord(b, s));
    SCALEMM_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    SCALEMM_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (ms >= warm_s * 1000.0) break;
  }
  std::vector<std::vector<float>> t(calls_of.size());
  for (int r = 0; r < samples; ++r)
    for (size_t c = 0; c < calls_of.size(); ++c) {
      SCALEMM_CUDA_CHECK(cudaEventRecord(a, s));
      for (int i = 0; i < calls; ++i) calls_of[c]();
      SCALEMM_CUDA_CHECK(cudaEventRecord(b, s));
      SCALEMM_CUDA_CHECK(cudaEventSynchronize(b));
      float ms = 0;
      SCALEMM_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
      t[c].push_back(ms * 1000.0f / float(calls));
    }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::vector<double> out;
  for (auto& x : t) {
    std::sort(x.begin(), x.end());
    out.push_back(x[x.size() / 2]);
  }
  return out;
}

using DevMem = scalemm::detail::DeviceBuffer;

struct Shape {
  int64_t g, mg, n, k;
  bool uneven;
};

// Sizes summing to g * mg: equal, or a fixed uneven split in multiples of 16 with empty experts.
std::vector<int64_t> split(const Shape& s, std::mt19937_64& rng) {
  std::vector<int64_t> sizes(size_t(s.g), s.mg);
  if (!s.uneven) return sizes;
  std::gamma_distribution<double> gamma(1.0, 1.0);
  std::vector<double> w(size_t(s.g));
  double sum = 0;
  for (auto& x : w) sum += (x = gamma(rng));
  const int64_t units = s.g * s.mg / 16;
  int64_t used = 0;
  for (size_t i = 0; i < w.size(); ++i) used += (sizes[i] = int64_t(w[i] / sum * double(units))) ;
  sizes[0] += units - used;
  for (auto& x : sizes) x *= 16;
  return sizes;
}

void run_shape(const Shape& sh, std::mt19937_64& rng, bool once = false) {
  const std::vector<int64_t> sizes = split(sh, rng);
  const int64_t m = sh.g * sh.mg, n = sh.n, k = sh.k;
  DevMem a(size_t(m * k)), b(size_t(sh.g * n * k)), d(size_t(m * n * 2));
  const layouts::ScaleLayout la(Recipe::kBlock1x128, m, k, ScaleFormat::kCompact);
  const layouts::ScaleLayout lb(Recipe::kBlock128x128, n, k, ScaleFormat::kCompact);
  DevMem sa(size_t(la.bytes())), sb(size_t(sh.g * lb.bytes()));
  {  // small finite E4M3 values and unit scales
    std::vector<uint8_t> h(size_t(std::max(m, sh.g * n) * k));
    for (auto& x : h) x = uint8_t(rng() & 0xB7);
    SCALEMM_CUDA_CHECK(cudaMemcpy(a.p, h.data(), size_t(m * k), cudaMemcpyHostToDevice));
    SCALEMM_CUDA_CHECK(cudaMemcpy(b.p, h.data(), size_t(sh.g * n * k), cudaMemcpyHostToDevice));
    std::vector<float> ones(size_t(std::max(la.size(), sh.g * lb.size())), 1.0f);
    SCALEMM_CUDA_CHECK(cudaMemcpy(sa.p, ones.data(), size_t(la.bytes()), cudaMemcpyHostToDevice));
    SCALEMM_CUDA_CHECK(cudaMemcpy(sb.p, ones.data(), size_t(sh.g * lb.bytes()), cudaMemcpyHostToDevice));
  }
  GroupedGemmArgs ga;
  ga.group_dim = GroupDim::kM;
  ga.groups = sh.g;
  ga.group_sizes = sizes.data();
  ga.m = m, ga.n = n, ga.k = k;
  ga.a = {a.p, DType::kE4M3, Recipe::kBlock1x128, sa.p, ScaleFormat::kCompact};
  ga.b = {b.p, DType::kE4M3, Recipe::kBlock128x128, sb.p, ScaleFormat::kCompact};
  ga.d = d.p;
  ga.d_dtype = DType::kBF16;
  cudaStream_t s;
  SCALEMM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Handle h;
  auto call = [&](GroupedBackend backend, bool graph) {
    GroupedGemmArgs c = ga;
    c.backend = backend;
    c.graph_replay = graph;
    return [&h, c, s] { h.grouped_gemm(c, s); };
  };
  if (once) {
    for (GroupedBackend backend : {GroupedBackend::kContiguous, GroupedBackend::kCutlass})
      for (int i = 0; i < 2; ++i) {
        GroupedGemmArgs c = ga;
        c.backend = backend;
        h.grouped_gemm(c, s);
      }
    SCALEMM_CUDA_CHECK(cudaStreamSynchronize(s));
    SCALEMM_CUDA_CHECK(cudaStreamDestroy(s));
    return;
  }
  const std::vector<double> us = interleaved_us_per_call(
      s, {call(GroupedBackend::kContiguous, false), call(GroupedBackend::kCutlass, false),
          call(GroupedBackend::kPerGroup, false), call(GroupedBackend::kPerGroup, true)}, 2.0);
  const double contiguous = us[0], cutlass = us[1], per_group = us[2], replay = us[3];
  bool same = true;
  {  // the two kernels' outputs, bit for bit
    std::vector<uint8_t> x(size_t(m * n * 2)), y(x.size());
    for (auto* out : {&x, &y}) {
      GroupedGemmArgs c = ga;
      c.backend = out == &x ? GroupedBackend::kCutlass : GroupedBackend::kContiguous;
      SCALEMM_CUDA_CHECK(cudaMemsetAsync(d.p, 0xFF, x.size(), s));
      h.grouped_gemm(c, s);
      SCALEMM_CUDA_CHECK(cudaMemcpyAsync(out->data(), d.p, x.size(), cudaMemcpyDeviceToHost, s));
      SCALEMM_CUDA_CHECK(cudaStreamSynchronize(s));
    }
    same = x == y;
  }
  const double flops = 2.0 * double(m) * double(n) * double(k);
  int64_t empty = 0;
  for (int64_t x : sizes) empty += x == 0;
  std::printf("| %lld | %lld | %lld | %lld | %s (%lld empty) | %.1f (%.0f) | %.1f (%.0f) | %.3f%s | %.1f (%.0f) | %.1f (%.0f) | %.2fx |\n",
              (long long)sh.g, (long long)sh.mg, (long long)n, (long long)k, sh.uneven ? "uneven" : "equal",
              (long long)empty, contiguous, flops / contiguous * 1e-6, cutlass, flops / cutlass * 1e-6,
              contiguous / cutlass, same ? "" : " (OUTPUTS DIFFER)", per_group, flops / per_group * 1e-6, replay,
              flops / replay * 1e-6, per_group / replay);
  std::fflush(stdout);
  SCALEMM_CUDA_CHECK(cudaStreamSynchronize(s));
  SCALEMM_CUDA_CHECK(cudaStreamDestroy(s));
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const bool short_k = argc > 1 && std::strcmp(argv[1], "--short-k") == 0;
  std::mt19937_64 rng(0x9E0);
  if (argc == 6 && std::strcmp(argv[1], "--one") == 0) {
    run_shape({std::atoll(argv[2]), std::atoll(argv[3]), std::atoll(argv[4]), std::atoll(argv[5]), false}, rng, true);
    return 0;
  }
  std::printf("bench_grouped: us per call (TF/s); block1x128 x block128x128, bf16 out, m-grouped\n");
  std::printf("| G | M_g | N | K | sizes | contiguous | CUTLASS | contiguous / CUTLASS time | per-group | per-group graph_replay | per-group / replay |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<Shape> shapes = {{8, 2048, 4096, 7168, false}, {8, 2048, 4096, 7168, true},
                               {32, 1024, 2048, 7168, false}, {32, 1024, 2048, 7168, true},
                               {16, 256, 2048, 2048, false}, {16, 256, 2048, 2048, true},
                               {64, 8, 4096, 7168, false},   {64, 8, 4096, 7168, true},
                               {64, 32, 4096, 7168, false},  {32, 16, 7168, 2048, false},
                               {8, 1024, 4096, 2048, false}, {32, 512, 7168, 2048, true}};
  if (quick) shapes = {shapes[4], shapes[5], shapes[6]};
  if (short_k) shapes.erase(std::remove_if(shapes.begin(), shapes.end(), [](const Shape& s) { return s.k > 2048; }), shapes.end());
  try {
    for (const Shape& s : shapes) run_shape(s, rng);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_grouped: %s\n", e.what());
    return 1;
  }
  return 0;
}
