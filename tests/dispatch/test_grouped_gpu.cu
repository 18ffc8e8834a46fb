// Grouped GEMMs on the GPU: every recipe pair and both groupings against each group's exact product,
// bit-identity with the same dense calls, and a forward + dgrad + wgrad grouped step captured in one
// CUDA graph and replayed.
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>

#include "device_buffer.hpp"
#include "grouped_inputs.hpp"
#include "support/test_support.hpp"

using namespace scalemm;
using scalemm::testing::Dev;
using scalemm::testing::GroupedInputs;

namespace {

// A grouped problem's operands on the device.
struct DeviceGrouped {
  const GroupedInputs& in;
  Dev ad, as, bd, bs;
  explicit DeviceGrouped(const GroupedInputs& i)
      : in(i), ad(i.a_data), as(i.a_scale), bd(i.b_data), bs(i.b_scale) {}
  GroupedGemmArgs args(void* d, DType out) const {
    GroupedGemmArgs g = in.args(d, ad.p, as.p, bd.p, bs.p, MemorySpace::kDevice);
    g.d_dtype = out;
    return g;
  }
};

std::vector<float> download_f32(const Dev& d, size_t count) {
  std::vector<float> h(count);
  CUDA_OK(cudaMemcpy(h.data(), d.p, count * 4, cudaMemcpyDeviceToHost));
  return h;
}

bool pair_allowed(Recipe ra, Recipe rb) { return (ra == Recipe::kNvfp4) == (rb == Recipe::kNvfp4); }

}  // namespace

TEST_CASE("grouped GEMMs on the GPU equal each group's exact product for every recipe pair", "[gpu][dispatch][grouped]") {
  auto rng = scalemm::testing::rng(0x6B0);
  Handle h;
  int pairs = 0;
  for (Recipe ra : kAllRecipes)
    for (Recipe rb : kAllRecipes) {
      if (!pair_allowed(ra, rb)) continue;
      for (GroupDim dim : {GroupDim::kM, GroupDim::kK})
        for (ScaleFormat f : {ScaleFormat::kCompact, ScaleFormat::kCublasLt}) {
          const int64_t s = scalemm::testing::k_split(ra, rb);
          const auto in = dim == GroupDim::kM
                              ? scalemm::testing::make_grouped(dim, ra, rb, f, f, {7, 0, 1, 129}, 640, 256, rng)
                              : scalemm::testing::make_grouped(dim, ra, rb, f, f, {s, 0, 2 * s, 3 * s}, 64, 256, rng);
          DeviceGrouped dg(in);
          Dev d(in.expected.size() * 4);
          CUDA_OK(cudaMemset(d.p, 0xFF, d.bytes));  // NaN poison
          h.grouped_gemm(dg.args(d.p, DType::kF32));
          CUDA_OK(cudaDeviceSynchronize());
          const auto got = download_f32(d, in.expected.size());
          int64_t bad = 0;
          for (size_t i = 0; i < got.size(); ++i) bad += got[i] != float(in.expected[i]);
          CAPTURE(to_string(ra), to_string(rb), to_string(dim), to_string(f));
          CHECK(bad == 0);
        }
      ++pairs;
    }
  CHECK(pairs == 37);
}

TEST_CASE("grouped GEMMs on the GPU are bit-identical to the same dense calls (G = 16, 64)", "[gpu][dispatch][grouped]") {
  auto rng = scalemm::testing::rng(0x6B1);
  Handle h;
  struct Case {
    std::vector<int64_t> sizes;
    Recipe ra, rb;
  };
  std::vector<int64_t> decode(64, 8);
  decode[3] = 0, decode[17] = 1, decode[40] = 7;
  const Case cases[] = {{{3, 0, 5, 1, 0, 0, 128, 200, 1, 1, 9, 0, 4, 4, 7, 129}, Recipe::kBlock1x128, Recipe::kBlock128x128},
                        {decode, Recipe::kBlock1x128, Recipe::kBlock128x128},
                        {{64, 0, 33, 96}, Recipe::kMxfp8, Recipe::kMxfp8},
                        {{16, 48, 0, 80}, Recipe::kRowwise, Recipe::kRowwise}};
  for (const Case& c : cases) {
    const auto in = scalemm::testing::make_grouped(GroupDim::kM, c.ra, c.rb, ScaleFormat::kCompact,
                                                   ScaleFormat::kCompact, c.sizes, 512, 256, rng);
    DeviceGrouped dg(in);
    const size_t bytes = in.expected.size() * 2;
    Dev grouped(bytes), dense(bytes);
    CUDA_OK(cudaMemset(grouped.p, 0xFF, bytes));
    CUDA_OK(cudaMemset(dense.p, 0xFF, bytes));
    const GroupedGemmArgs ga = dg.args(grouped.p, DType::kBF16);
    h.grouped_gemm(ga);
    const std::vector<int64_t> offs = grouped_scale_offsets(ga);
    int64_t r0 = 0;
    for (size_t g = 0; g < c.sizes.size(); ++g) {
      if (c.sizes[g] == 0) continue;
      GemmArgs d;
      d.m = c.sizes[g], d.n = in.n, d.k = in.k;
      d.a = ga.a, d.b = ga.b;
      d.a.data = dg.ad.as<uint8_t>() + r0 * dtype_storage_bytes(in.da, in.k);
      d.a.scale = dg.as.as<uint8_t>() + offs[g];
      d.b.data = dg.bd.as<uint8_t>() + int64_t(g) * in.n * dtype_storage_bytes(in.db, in.k);
      d.b.scale = dg.bs.as<uint8_t>() + int64_t(g) * grouped_b_scale_stride(ga);
      d.d = dense.as<uint16_t>() + r0 * in.n;
      d.d_dtype = DType::kBF16;
      h.gemm(d);
      r0 += c.sizes[g];
    }
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint8_t> hg(bytes), hd(bytes);
    CUDA_OK(cudaMemcpy(hg.data(), grouped.p, bytes, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(hd.data(), dense.p, bytes, cudaMemcpyDeviceToHost));
    CAPTURE(c.sizes.size(), to_string(c.ra));
    CHECK(hg == hd);
  }
}

TEST_CASE("a grouped forward, dgrad and wgrad captured in one CUDA graph replay 100 times identically",
          "[gpu][dispatch][grouped]") {
  auto rng = scalemm::testing::rng(0x6B2);
  Handle h;
  // Forward and dgrad are m-grouped (different shapes), wgrad is k-grouped (it stages its columns).
  const auto fwd = scalemm::testing::make_grouped(GroupDim::kM, Recipe::kBlock1x128, Recipe::kBlock128x128,
                                                  ScaleFormat::kCompact, ScaleFormat::kCompact, {64, 0, 192, 128}, 512,
                                                  256, rng);
  const auto dgrad = scalemm::testing::make_grouped(GroupDim::kM, Recipe::kBlock1x128, Recipe::kBlock128x128,
                                                    ScaleFormat::kCompact, ScaleFormat::kCompact, {64, 0, 192, 128},
                                                    256, 512, rng);
  const auto wgrad = scalemm::testing::make_grouped(GroupDim::kK, Recipe::kBlock1x128, Recipe::kBlock1x128,
                                                    ScaleFormat::kCompact, ScaleFormat::kCompact, {128, 0, 256, 128},
                                                    256, 512, rng);
  const GroupedInputs* all[3] = {&fwd, &dgrad, &wgrad};
  std::vector<std::unique_ptr<DeviceGrouped>> ops;
  std::vector<std::unique_ptr<Dev>> outs;
  for (const GroupedInputs* in : all) {
    ops.push_back(std::make_unique<DeviceGrouped>(*in));
    outs.push_back(std::make_unique<Dev>(in->expected.size() * 4));
  }
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto step = [&] {
    for (size_t i = 0; i < 3; ++i) h.grouped_gemm(ops[i]->args(outs[i]->p, DType::kF32), s);
  };
  step();  // warm-up: plans, scratch and staging exist before capture
  CUDA_OK(cudaStreamSynchronize(s));
  std::vector<std::vector<float>> eager;
  for (size_t i = 0; i < 3; ++i) {
    eager.push_back(download_f32(*outs[i], all[i]->expected.size()));
    int64_t bad = 0;
    for (size_t e = 0; e < eager[i].size(); ++e) bad += eager[i][e] != float(all[i]->expected[e]);
    CHECK(bad == 0);
  }
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  step();
  CUDA_OK(cudaStreamEndCapture(s, &g));
  CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
  int identical = 0;
  for (int r = 0; r < 100; ++r) {
    for (auto& o : outs) CUDA_OK(cudaMemsetAsync(o->p, 0xFF, o->bytes, s));
    CUDA_OK(cudaGraphLaunch(ge, s));
    CUDA_OK(cudaStreamSynchronize(s));
    bool same = true;
    for (size_t i = 0; i < 3; ++i) same = same && download_f32(*outs[i], all[i]->expected.size()) == eager[i];
    identical += same;
  }
  CHECK(identical == 100);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
}

// cuBLASLt fails at matmul on a scale pointer off 16 bytes; compact scales need only 4-byte alignment
// (an m-grouped call's per-group tensorwise scales sit 4 bytes apart). The native paths copy such a
// buffer to an aligned slice.
TEST_CASE("compact scales off 16-byte alignment run natively and exactly", "[gpu][dispatch]") {
  auto rng = scalemm::testing::rng(0x6B3);
  Handle h;
  for (auto [ra, rb] : {std::pair{Recipe::kTensorwise, Recipe::kTensorwise}, {Recipe::kRowwise, Recipe::kRowwise},
                        {Recipe::kTensorwise, Recipe::kRowwise}, {Recipe::kRowwise, Recipe::kTensorwise}})
    for (int64_t m : {1, 8}) {
      const int64_t n = 256, k = 640;
      auto a = scalemm::testing::exact_operand(ra, m, k, ScaleFormat::kCompact, rng);
      auto b = scalemm::testing::exact_operand(rb, n, k, ScaleFormat::kCompact, rng);
      Dev ad(a.data), bd(b.data), d(size_t(m * n) * 4);
      Dev as(a.scales.size() + 16), bs(b.scales.size() + 16);
      CUDA_OK(cudaMemcpy(as.as<uint8_t>() + 8, a.scales.data(), a.scales.size(), cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemcpy(bs.as<uint8_t>() + 4, b.scales.data(), b.scales.size(), cudaMemcpyHostToDevice));
      GemmArgs g;
      g.m = m, g.n = n, g.k = k;
      g.a = a.view(), g.a.data = ad.p, g.a.scale = as.as<uint8_t>() + 8;
      g.b = b.view(), g.b.data = bd.p, g.b.scale = bs.as<uint8_t>() + 4;
      g.d = d.p, g.d_dtype = DType::kF32;
      CAPTURE(to_string(ra), to_string(rb), m);
      const Plan p = h.plan(g);
      CHECK((p.backend == Backend::kNative || p.backend == Backend::kConvertNative));
      h.gemm(g);
      CUDA_OK(cudaDeviceSynchronize());
      const auto got = download_f32(d, size_t(m * n));
      int64_t bad = 0;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double acc = 0.0;
          for (int64_t kk = 0; kk < k; ++kk) acc += scalemm::testing::dequant(a, i, kk) * scalemm::testing::dequant(b, j, kk);
          bad += got[size_t(i * n + j)] != float(acc);
        }
      CHECK(bad == 0);
    }
}
