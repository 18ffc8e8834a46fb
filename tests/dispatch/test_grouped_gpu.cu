// Grouped GEMMs on the GPU: every recipe pair and both groupings against each group's exact product,
// bit-identity of the per-group backend with the same dense calls, the CUTLASS grouped kernel (exact
// products, device-side sizes, sizes changing between graph replays, invalid device sizes), and a
// forward + dgrad + wgrad grouped step captured in one CUDA graph and replayed.
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "backends/contiguous_grouped.hpp"
#include "backends/cutlass_grouped.hpp"
#include "device_buffer.hpp"
#include "grouped_inputs.hpp"
#include "scalemm/formats.hpp"
#include "support/test_support.hpp"
#include "scalemm/detail/cuda_check.hpp"

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
  SCALEMM_CUDA_CHECK(cudaMemcpy(h.data(), d.p, count * 4, cudaMemcpyDeviceToHost));
  return h;
}

bool pair_allowed(Recipe ra, Recipe rb) { return (ra == Recipe::kNvfp4) == (rb == Recipe::kNvfp4); }

std::vector<uint8_t> download(const Dev& d) {
  std::vector<uint8_t> h(d.bytes);
  SCALEMM_CUDA_CHECK(cudaMemcpy(h.data(), d.p, d.bytes, cudaMemcpyDeviceToHost));
  return h;
}

// Elements of an f32 D that differ from the exact products.
int64_t f32_mismatches(const Dev& d, const std::vector<double>& expected) {
  const auto got = download_f32(d, expected.size());
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) bad += got[i] != float(expected[i]);
  return bad;
}

// Elements of a bf16 D that differ from the exact products rounded to bf16.
int64_t bf16_mismatches(const Dev& d, const std::vector<double>& expected) {
  std::vector<uint16_t> got(expected.size());
  SCALEMM_CUDA_CHECK(cudaMemcpy(got.data(), d.p, got.size() * 2, cudaMemcpyDeviceToHost));
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) bad += got[i] != formats::encode_bf16(float(expected[i]));
  return bad;
}

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
          SCALEMM_CUDA_CHECK(cudaMemset(d.p, 0xFF, d.bytes));  // NaN poison
          h.grouped_gemm(dg.args(d.p, DType::kF32));
          SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
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
    SCALEMM_CUDA_CHECK(cudaMemset(grouped.p, 0xFF, bytes));
    SCALEMM_CUDA_CHECK(cudaMemset(dense.p, 0xFF, bytes));
    GroupedGemmArgs ga = dg.args(grouped.p, DType::kBF16);
    ga.backend = GroupedBackend::kPerGroup;  // the CUTLASS kernel runs blockwise bf16 otherwise
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
    SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint8_t> hg(bytes), hd(bytes);
    SCALEMM_CUDA_CHECK(cudaMemcpy(hg.data(), grouped.p, bytes, cudaMemcpyDeviceToHost));
    SCALEMM_CUDA_CHECK(cudaMemcpy(hd.data(), dense.p, bytes, cudaMemcpyDeviceToHost));
    CAPTURE(c.sizes.size(), to_string(c.ra));
    CHECK(hg == hd);
  }
}

TEST_CASE("the per-group backend's streams fork from and join back to the caller's stream",
          "[gpu][dispatch][grouped]") {
  // On the caller's stream: poison D, the grouped call (its groups spread over forked streams), then
  // a copy of D. Only a fork that waits for the poison and a join that the copy waits behind give the
  // exact products in the copy; the caller's stream alone is synchronised.
  auto rng = scalemm::testing::rng(0x6B5);
  Handle h;
  cudaStream_t s = nullptr;
  SCALEMM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (GroupDim dim : {GroupDim::kM, GroupDim::kK}) {
    const Recipe rb = dim == GroupDim::kM ? Recipe::kBlock128x128 : Recipe::kBlock1x128;
    const int64_t ks = scalemm::testing::k_split(Recipe::kBlock1x128, rb);
    const auto in = dim == GroupDim::kM
                        ? scalemm::testing::make_grouped(dim, Recipe::kBlock1x128, rb, ScaleFormat::kCompact,
                                                         ScaleFormat::kCompact,
                                                         {129, 0, 7, 200, 1, 64, 150, 0, 33, 8, 100, 2}, 640, 256, rng)
                        : scalemm::testing::make_grouped(dim, Recipe::kBlock1x128, rb, ScaleFormat::kCompact,
                                                         ScaleFormat::kCompact,
                                                         {ks, 0, 4 * ks, 2 * ks, ks, 0, 3 * ks, ks}, 128, 256, rng);
    DeviceGrouped dg(in);
    Dev d(in.expected.size() * 4), copy(in.expected.size() * 4);
    for (int rep = 0; rep < 3; ++rep) {
      SCALEMM_CUDA_CHECK(cudaMemsetAsync(d.p, 0xFF, d.bytes, s));  // NaN poison, on the caller's stream
      GroupedGemmArgs ga = dg.args(d.p, DType::kF32);
      ga.backend = GroupedBackend::kPerGroup;
      h.grouped_gemm(ga, s);
      SCALEMM_CUDA_CHECK(cudaMemcpyAsync(copy.p, d.p, d.bytes, cudaMemcpyDeviceToDevice, s));
      SCALEMM_CUDA_CHECK(cudaStreamSynchronize(s));
      const auto got = download_f32(copy, in.expected.size());
      int64_t bad = 0;
      for (size_t i = 0; i < got.size(); ++i) bad += got[i] != float(in.expected[i]);
      CAPTURE(to_string(dim), rep);
      CHECK(bad == 0);
    }
  }
  SCALEMM_CUDA_CHECK(cudaStreamDestroy(s));
}

namespace {
// Kernel nodes of what `enqueue` puts on a fresh stream, captured into a graph (after one eager call:
// plans and scratch exist first).
template <class F>
size_t kernel_nodes(F enqueue) {
  cudaStream_t s;
  SCALEMM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  enqueue(s);
  SCALEMM_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaGraph_t g;
  SCALEMM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  enqueue(s);
  SCALEMM_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  size_t count = 0;
  SCALEMM_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  SCALEMM_CUDA_CHECK(cudaGraphGetNodes(g, nodes.data(), &count));
  size_t kernels = 0;
  for (cudaGraphNode_t n : nodes) {
    cudaGraphNodeType t;
    SCALEMM_CUDA_CHECK(cudaGraphNodeGetType(n, &t));
    kernels += t == cudaGraphNodeTypeKernel;
  }
  SCALEMM_CUDA_CHECK(cudaGraphDestroy(g));
  SCALEMM_CUDA_CHECK(cudaStreamDestroy(s));
  return kernels;
}
}  // namespace

TEST_CASE("the per-group backend converts every group's scales in one launch", "[gpu][dispatch][grouped]") {
  // Compact block1x128 scales need cuBLASLt's layout, so each group's dense call would convert its
  // own. The grouped call must launch exactly one conversion besides each group's GEMM kernels, which
  // are those of the same dense call given cuBLASLt-format scales (a dense call that converts nothing).
  auto rng = scalemm::testing::rng(0x6B6);
  Handle h;
  for (GroupDim dim : {GroupDim::kM, GroupDim::kK}) {
    const Recipe rb = dim == GroupDim::kM ? Recipe::kBlock128x128 : Recipe::kBlock1x128;
    const std::vector<int64_t> sizes = dim == GroupDim::kM ? std::vector<int64_t>{64, 64, 0, 64, 64, 64, 64, 64, 64}
                                                           : std::vector<int64_t>{128, 128, 0, 128, 128, 128, 128};
    const auto in = scalemm::testing::make_grouped(dim, Recipe::kBlock1x128, rb, ScaleFormat::kCompact,
                                                   ScaleFormat::kCompact, sizes, 256, 256, rng);
    const auto lt = scalemm::testing::make_grouped(dim, Recipe::kBlock1x128, rb, ScaleFormat::kCublasLt,
                                                   ScaleFormat::kCublasLt, sizes, 256, 256, rng);
    DeviceGrouped dg(in), dl(lt);
    Dev d(in.expected.size() * 4);
    GroupedGemmArgs ga = dg.args(d.p, DType::kF32);  // f32 out: the per-group backend
    CHECK(h.explain(ga).find("per-group backend") != std::string::npos);
    // One group alone, as a dense call with cuBLASLt-format scales (the first group's shape).
    GemmArgs one;
    one.m = dim == GroupDim::kM ? sizes[0] : in.m, one.n = in.n, one.k = dim == GroupDim::kM ? in.k : sizes[0];
    const layouts::ScaleLayout sa(Recipe::kBlock1x128, one.m, one.k, ScaleFormat::kCublasLt),
        sb(rb, one.n, one.k, ScaleFormat::kCublasLt);
    Dev oa(size_t(one.m * one.k)), ob(size_t(one.n * one.k)), osa(size_t(sa.bytes())), osb(size_t(sb.bytes()));
    SCALEMM_CUDA_CHECK(cudaMemset(oa.p, 0, oa.bytes));
    SCALEMM_CUDA_CHECK(cudaMemset(ob.p, 0, ob.bytes));
    SCALEMM_CUDA_CHECK(cudaMemset(osa.p, 0, osa.bytes));
    SCALEMM_CUDA_CHECK(cudaMemset(osb.p, 0, osb.bytes));
    one.a = {oa.p, in.da, Recipe::kBlock1x128, osa.p, ScaleFormat::kCublasLt};
    one.b = {ob.p, in.db, rb, osb.p, ScaleFormat::kCublasLt};
    one.d = d.p, one.d_dtype = DType::kF32;
    const size_t dense = kernel_nodes([&](cudaStream_t s) { h.gemm(one, s); });
    const size_t busy = size_t(std::count_if(sizes.begin(), sizes.end(), [](int64_t x) { return x > 0; }));
    const size_t grouped = kernel_nodes([&](cudaStream_t s) { h.grouped_gemm(ga, s); });
    const size_t grouped_lt = kernel_nodes([&](cudaStream_t s) { h.grouped_gemm(dl.args(d.p, DType::kF32), s); });
    CAPTURE(to_string(dim), dense, busy);
    CHECK(dense >= 1);
    CHECK(grouped == busy * dense + 1);
    // Given cuBLASLt's layout, m-grouped needs no conversion; k-grouped still slices each group's K.
    CHECK(grouped_lt == busy * dense + (dim == GroupDim::kM ? 0 : 1));
    SCALEMM_CUDA_CHECK(cudaMemset(d.p, 0xFF, d.bytes));
    h.grouped_gemm(ga);
    SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(f32_mismatches(d, in.expected) == 0);
  }
}

TEST_CASE("graph_replay captures a per-group call once and replays it while the call repeats",
          "[gpu][dispatch][grouped]") {
  // The replay must read the buffers' current contents, follow new sizes with a new capture, and
  // never replay a graph captured before a stream buffer was reallocated (any handle's growth).
  auto rng = scalemm::testing::rng(0x6B7);
  Handle h;
  cudaStream_t s;
  SCALEMM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (GroupDim dim : {GroupDim::kM, GroupDim::kK}) {
    const Recipe rb = dim == GroupDim::kM ? Recipe::kBlock128x128 : Recipe::kBlock1x128;
    const int64_t ks = scalemm::testing::k_split(Recipe::kBlock1x128, rb);
    const std::vector<int64_t> split1 = dim == GroupDim::kM ? std::vector<int64_t>{129, 0, 7, 64, 200, 8}
                                                            : std::vector<int64_t>{ks, 0, 3 * ks, 2 * ks};
    const std::vector<int64_t> split2 = dim == GroupDim::kM ? std::vector<int64_t>{8, 200, 64, 7, 0, 129}
                                                            : std::vector<int64_t>{2 * ks, ks, 0, 3 * ks};
    auto make = [&](const std::vector<int64_t>& sizes) {
      return scalemm::testing::make_grouped(dim, Recipe::kBlock1x128, rb, ScaleFormat::kCompact, ScaleFormat::kCompact,
                                            sizes, dim == GroupDim::kM ? 384 : 96, 256, rng);
    };
    const auto first = make(split1), second = make(split1), other = make(split2);
    DeviceGrouped dg(first);
    Dev d(first.expected.size() * 4);
    auto run = [&](const GroupedInputs& in, const std::vector<int64_t>& sizes) {
      SCALEMM_CUDA_CHECK(cudaMemsetAsync(d.p, 0xFF, d.bytes, s));  // NaN poison
      GroupedGemmArgs ga = dg.args(d.p, DType::kF32);   // f32 out: the per-group backend
      ga.group_sizes = sizes.data();
      ga.graph_replay = true;
      h.grouped_gemm(ga, s);
      SCALEMM_CUDA_CHECK(cudaStreamSynchronize(s));
      const auto got = download_f32(d, in.expected.size());
      int64_t bad = 0;
      for (size_t i = 0; i < got.size(); ++i) bad += got[i] != float(in.expected[i]);
      return bad;
    };
    auto upload = [&](const GroupedInputs& in) {  // new contents, same buffers
      SCALEMM_CUDA_CHECK(cudaMemcpy(dg.ad.p, in.a_data.data(), in.a_data.size(), cudaMemcpyHostToDevice));
      SCALEMM_CUDA_CHECK(cudaMemcpy(dg.as.p, in.a_scale.data(), in.a_scale.size(), cudaMemcpyHostToDevice));
      SCALEMM_CUDA_CHECK(cudaMemcpy(dg.bd.p, in.b_data.data(), in.b_data.size(), cudaMemcpyHostToDevice));
      SCALEMM_CUDA_CHECK(cudaMemcpy(dg.bs.p, in.b_scale.data(), in.b_scale.size(), cudaMemcpyHostToDevice));
    };
    CAPTURE(to_string(dim));
    const Handle::GraphCounts c0 = h.grouped_graph_counts();
    CHECK(run(first, split1) == 0);  // runs, then captures
    CHECK(h.grouped_graph_counts().captures == c0.captures + 1);
    for (int r = 0; r < 3; ++r) CHECK(run(first, split1) == 0);
    CHECK(h.grouped_graph_counts().replays == c0.replays + 3);
    CHECK(h.grouped_graph_counts().captures == c0.captures + 1);
    upload(second);  // the replay reads what the buffers hold now
    CHECK(run(second, split1) == 0);
    CHECK(h.grouped_graph_counts().replays == c0.replays + 4);
    // Other sizes are another call: captured on their own, the first graph kept.
    upload(other);
    CHECK(run(other, split2) == 0);
    CHECK(h.grouped_graph_counts().captures == c0.captures + 2);
    upload(second);
    CHECK(run(second, split1) == 0);
    CHECK(h.grouped_graph_counts().replays == c0.replays + 5);
    // A reallocation anywhere (here: another handle's first call on this stream) retires every graph.
    {
      Handle other_handle;
      GroupedGemmArgs ga = dg.args(d.p, DType::kF32);
      ga.group_sizes = split1.data();
      other_handle.grouped_gemm(ga, s);
      SCALEMM_CUDA_CHECK(cudaStreamSynchronize(s));
    }
    CHECK(run(second, split1) == 0);
    CHECK(h.grouped_graph_counts().captures == c0.captures + 3);
    // The default stream cannot be captured: the call runs as usual.
    GroupedGemmArgs ga = dg.args(d.p, DType::kF32);
    ga.group_sizes = split1.data();
    ga.graph_replay = true;
    h.grouped_gemm(ga);
    SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(h.grouped_graph_counts().captures == c0.captures + 3);
  }
  SCALEMM_CUDA_CHECK(cudaStreamDestroy(s));
}

TEST_CASE("a grouped forward, dgrad and wgrad captured in one CUDA graph replay 100 times identically",
          "[gpu][dispatch][grouped]") {
  // f32 output runs the per-group backend (cuBLASLt per group, k-grouped staging); bf16 the
  // contiguous kernel (forward, dgrad: one launch, no workspace) and the CUTLASS kernel (wgrad: set-up
  // kernel, scale transposes, one launch), each call in the graph on its own arguments.
  const DType out = GENERATE(DType::kF32, DType::kBF16);
  const size_t ob = out == DType::kF32 ? 4 : 2;
  CAPTURE(to_string(out));
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
    outs.push_back(std::make_unique<Dev>(in->expected.size() * ob));
  }
  cudaStream_t s;
  SCALEMM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto step = [&] {
    for (size_t i = 0; i < 3; ++i) h.grouped_gemm(ops[i]->args(outs[i]->p, out), s);
  };
  step();  // warm-up: plans, scratch and staging exist before capture
  SCALEMM_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<std::vector<uint8_t>> eager;
  for (size_t i = 0; i < 3; ++i) {
    eager.push_back(download(*outs[i]));
    if (out == DType::kBF16) {
      CHECK(h.explain(ops[i]->args(outs[i]->p, out)).find(i < 2 ? "contiguous grouped backend" : "CUTLASS grouped backend") !=
            std::string::npos);
      CHECK(bf16_mismatches(*outs[i], all[i]->expected) == 0);
      continue;
    }
    const auto f = download_f32(*outs[i], all[i]->expected.size());
    int64_t bad = 0;
    for (size_t e = 0; e < f.size(); ++e) bad += f[e] != float(all[i]->expected[e]);
    CHECK(bad == 0);
  }
  cudaGraph_t g;
  cudaGraphExec_t ge;
  SCALEMM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  step();
  SCALEMM_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  SCALEMM_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  int identical = 0;
  for (int r = 0; r < 100; ++r) {
    for (auto& o : outs) SCALEMM_CUDA_CHECK(cudaMemsetAsync(o->p, 0xFF, o->bytes, s));
    SCALEMM_CUDA_CHECK(cudaGraphLaunch(ge, s));
    SCALEMM_CUDA_CHECK(cudaStreamSynchronize(s));
    bool same = true;
    for (size_t i = 0; i < 3; ++i) same = same && download(*outs[i]) == eager[i];
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
      SCALEMM_CUDA_CHECK(cudaMemcpy(as.as<uint8_t>() + 8, a.scales.data(), a.scales.size(), cudaMemcpyHostToDevice));
      SCALEMM_CUDA_CHECK(cudaMemcpy(bs.as<uint8_t>() + 4, b.scales.data(), b.scales.size(), cudaMemcpyHostToDevice));
      GemmArgs g;
      g.m = m, g.n = n, g.k = k;
      g.a = a.view(), g.a.data = ad.p, g.a.scale = as.as<uint8_t>() + 8;
      g.b = b.view(), g.b.data = bd.p, g.b.scale = bs.as<uint8_t>() + 4;
      g.d = d.p, g.d_dtype = DType::kF32;
      CAPTURE(to_string(ra), to_string(rb), m);
      const Plan p = h.plan(g);
      CHECK((p.backend == Backend::kNative || p.backend == Backend::kConvertNative));
      h.gemm(g);
      SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
      const auto got = download_f32(d, size_t(m * n));
      int64_t bad = 0;
      const std::vector<double> av = scalemm::testing::dequant_rows(a), bv = scalemm::testing::dequant_rows(b);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) bad += got[size_t(i * n + j)] != float(scalemm::testing::exact_dot(av, bv, k, i, j, 0, k));
      CHECK(bad == 0);
    }
}

// Found by scalemm_fuzz --grouped: with K x element size not a multiple of 16, a group after an odd
// number of rows (and an expert after an odd N) starts off 16-byte alignment; such groups run on
// aligned copies. And an expert's MX scale grid then starts at any byte (7 bytes per expert at
// K = 208), which the emulated backend must read byte by byte.
TEST_CASE("m-grouped groups that start off 16-byte alignment run on aligned copies, exactly", "[gpu][dispatch][grouped]") {
  auto rng = scalemm::testing::rng(0x6B4);
  Handle h;
  struct Case {
    Recipe ra, rb;
    std::vector<int64_t> sizes;
    int64_t k, n;
    bool staged;
  };
  for (const Case& c : {Case{Recipe::kRowwise, Recipe::kRowwise, {1, 3, 0, 5}, 568, 7, true},
                        Case{Recipe::kTensorwise, Recipe::kTensorwise, {7, 1}, 8, 32, true},
                        Case{Recipe::kMxfp8, Recipe::kMxfp8_32x32, {0, 7, 33, 7, 33, 1, 16}, 208, 32, false}}) {
    const auto in = scalemm::testing::make_grouped(GroupDim::kM, c.ra, c.rb, ScaleFormat::kCompact,
                                                   ScaleFormat::kCompact, c.sizes, c.k, c.n, rng);
    DeviceGrouped dg(in);
    Dev d(in.expected.size() * 4);
    SCALEMM_CUDA_CHECK(cudaMemset(d.p, 0xFF, d.bytes));
    GroupedGemmArgs ga = dg.args(d.p, DType::kF32);
    const std::string plan = h.explain(ga);
    CAPTURE(to_string(c.ra), to_string(c.rb), c.k, c.n, plan);
    CHECK((plan.find("run on aligned copies") != std::string::npos) == c.staged);
    h.grouped_gemm(ga);
    SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(f32_mismatches(d, in.expected) == 0);
    CHECK(cudaGetLastError() == cudaSuccess);
  }
}

// ---- the CUTLASS grouped kernel ----------------------------------------------------------------------

namespace {
// G = 16, uneven with empty groups and groups past a 128-row tile.
std::vector<int64_t> uneven16() { return {3, 0, 5, 1, 0, 0, 128, 200, 1, 1, 9, 0, 4, 4, 7, 129}; }
// G = 64 decode-like: 8 rows each, one empty group, two short ones.
std::vector<int64_t> decode64() {
  std::vector<int64_t> d(64, 8);
  d[3] = 0, d[17] = 1, d[40] = 7;
  return d;
}
}  // namespace

TEST_CASE("the CUTLASS grouped kernel equals each group's exact product (G = 1, 4, 16, 64; m- and k-grouped; rowwise)",
          "[gpu][dispatch][grouped][cutlass]") {
  auto rng = scalemm::testing::rng(0x6C0);
  Handle h;
  const std::vector<int64_t> g16 = uneven16(), decode = decode64();
  struct Case {
    GroupDim dim;
    Recipe rb;
    std::vector<int64_t> sizes;
    int64_t m_or_k, n;
    Recipe ra = Recipe::kBlock1x128;
  };
  const Case cases[] = {
      {GroupDim::kM, Recipe::kRowwise, {7, 0, 1, 129}, 704, 264, Recipe::kRowwise},     // rowwise, K and N tails
      {GroupDim::kM, Recipe::kRowwise, g16, 512, 256, Recipe::kRowwise},                // rowwise, G = 16
      {GroupDim::kM, Recipe::kRowwise, decode, 256, 384, Recipe::kRowwise},             // rowwise, G = 64
      {GroupDim::kM, Recipe::kRowwise, {1}, 16, 8, Recipe::kRowwise},                   // rowwise, smallest
      {GroupDim::kK, Recipe::kRowwise, {128, 0, 384}, 136, 256, Recipe::kRowwise},      // rowwise wgrad
      {GroupDim::kK, Recipe::kRowwise, {48, 0, 16, 80}, 7, 264, Recipe::kRowwise},      // K_g off 128, M = 7
      {GroupDim::kM, Recipe::kBlock128x128, {129}, 640, 256},               // G = 1
      {GroupDim::kM, Recipe::kBlock128x128, {7, 0, 1, 129}, 704, 264},      // K tail (704 = 5.5 x 128), N tail
      {GroupDim::kM, Recipe::kBlock128x128, g16, 512, 256},                 // G = 16, uneven and empty
      {GroupDim::kM, Recipe::kBlock128x128, decode, 512, 384},              // G = 64, decode-like
      {GroupDim::kM, Recipe::kBlock1x128, {64, 0, 33, 96}, 384, 256},       // 1x128 x 1x128
      {GroupDim::kK, Recipe::kBlock1x128, {128, 0, 256, 384}, 136, 256},    // wgrad, an empty group, M tail
      {GroupDim::kK, Recipe::kBlock1x128, {1024}, 64, 128},                 // wgrad, G = 1
  };
  for (const Case& c : cases) {
    const auto in = scalemm::testing::make_grouped(c.dim, c.ra, c.rb, ScaleFormat::kCompact, ScaleFormat::kCompact,
                                                   c.sizes, c.m_or_k, c.n, rng);
    DeviceGrouped dg(in);
    Dev d(in.expected.size() * 2);
    SCALEMM_CUDA_CHECK(cudaMemset(d.p, 0xFF, d.bytes));  // NaN poison: every element must be written
    GroupedGemmArgs ga = dg.args(d.p, DType::kBF16);
    ga.backend = GroupedBackend::kCutlass;
    CAPTURE(to_string(c.dim), to_string(c.ra), to_string(c.rb), c.sizes.size(), in.m, in.n, in.k);
    CHECK(h.explain(ga).find("CUTLASS grouped backend") != std::string::npos);
    h.grouped_gemm(ga);
    SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(bf16_mismatches(d, in.expected) == 0);
  }
}

TEST_CASE("the contiguous grouped kernel equals each group's exact product, and the CUTLASS kernel bit for bit "
          "in every tile configuration",
          "[gpu][dispatch][grouped][contiguous]") {
  namespace cg = backends::contiguous_grouped;
  auto rng = scalemm::testing::rng(0x6C8);
  Handle h;
  const int sms = h.target().multiprocessors;
  const std::vector<int64_t> g16 = uneven16(), decode = decode64();
  struct Case {
    std::vector<int64_t> sizes;
    int64_t k, n;
    const char* tiles = "";  // what explain() names the tile configuration on 132 SMs (H100, H200)
  };
  const Case cases[] = {
      {{129}, 640, 256},                  // G = 1, one row past a tile
      {{7, 0, 1, 129}, 704, 264},         // K tail (704 = 5.5 x 128), N tail, tiles straddling groups
      {g16, 512, 256},                    // G = 16, uneven and empty
      {decode, 512, 384},                 // G = 64, decode-like
      {{0, 300, 0}, 256, 8},              // empty first and last groups, N = 8
      {{1}, 16, 8},                       // smallest
      // One M tile (a dense call at small M): only A's rows are loaded (a 16-row box, a 112-row one
      // split 56 + 56 between a pair); K tail, N tail
      {{7}, 704, 264},
      {{100}, 4112, 392},
      {{1000, 24, 0, 513}, 1024, 1024},   // several tiles per group, more tiles than SMs
      // Few rows per group over a long K: wide tiles, 160 columns (one wave either way) in clusters
      // sharing A; K tail, N = 12.85 (10.7) tiles, starting at 0, 32, 64 and 96 (0 and 64) within a
      // scale block, the last one's second block past N
      {{64, 0, 1, 17, 63, 40}, 4112, 2056, "128x160x128 tiles in clusters of 2 (A multicast)"},
      // Many rows per group over a long K: wide tiles in clusters of two M tiles sharing B, stored
      // through TMA where whole, copied out of shared memory where a group ends inside; K tail, N =
      // 1.25 (1.04) tiles; nine M tiles: the pair over the first group's last tile and the second's
      // first loads B twice, the last tile's peer lies past M
      {{520, 504}, 4112, 200, "128x160x128 tiles in clusters of 2 M tiles (B multicast"},
      // The same with an empty group and a one-row tile: pairs within a group share B, the pair over
      // groups 0 and 2 does not; N = 2.45 (2.04) tiles
      {{600, 0, 300, 129}, 4096, 392, "128x160x128 tiles in clusters of 2 M tiles (B multicast"},
      // More tiles than SMs, 192 columns: 12 experts of few rows x 11 N tiles fill one wave, x 13 of
      // 160 columns would take two
      {{1, 5, 64, 33, 0, 2, 17, 8, 40, 3, 1, 12, 20}, 4096, 2056, "128x192x128 tiles without clusters"},
      // Many rows per group over a short K: 31 M tiles x 4 of 160 columns fill one wave, x 5 of 128 two
      {{1900, 0, 1940}, 256, 640, "128x160x128 tiles in clusters of 2 M tiles (B multicast"},
  };
  for (const Case& c : cases) {
    auto in = scalemm::testing::make_grouped(GroupDim::kM, Recipe::kBlock1x128, Recipe::kBlock128x128,
                                             ScaleFormat::kCompact, ScaleFormat::kCompact, c.sizes, c.k, c.n, rng);
    CAPTURE(c.sizes.size(), in.m, in.n, in.k);
    const size_t bytes = in.expected.size() * 2;
    Dev d(bytes), ref(bytes);
    {
      DeviceGrouped dg(in);
      SCALEMM_CUDA_CHECK(cudaMemset(d.p, 0xFF, bytes));  // NaN poison: every element must be written
      GroupedGemmArgs ga = dg.args(d.p, DType::kBF16);
      ga.backend = GroupedBackend::kContiguous;
      const std::string plan = h.explain(ga);
      CAPTURE(plan);
      CHECK(plan.find("contiguous grouped backend: " + cg::describe(ga, cg::tiles(ga, sms))) != std::string::npos);
      if (sms == 132) CHECK(plan.find(c.tiles) != std::string::npos);
      h.grouped_gemm(ga);
      SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
      CHECK(bf16_mismatches(d, in.expected) == 0);
    }
    {
      // cuBLASLt-format scales, read in place: B's per-expert buffers, and A's where there is one group.
      const ScaleFormat fa = c.sizes.size() == 1 ? ScaleFormat::kCublasLt : ScaleFormat::kCompact;
      auto lt = scalemm::testing::make_grouped(GroupDim::kM, Recipe::kBlock1x128, Recipe::kBlock128x128, fa,
                                               ScaleFormat::kCublasLt, c.sizes, c.k, c.n, rng);
      DeviceGrouped dl(lt);
      SCALEMM_CUDA_CHECK(cudaMemset(d.p, 0xFF, bytes));
      GroupedGemmArgs ga = dl.args(d.p, DType::kBF16);
      ga.backend = GroupedBackend::kContiguous;
      CAPTURE(to_string(fa));
      CHECK(h.explain(ga).find("contiguous grouped backend: ") != std::string::npos);
      h.grouped_gemm(ga);
      SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
      CHECK(bf16_mismatches(d, lt.expected) == 0);
    }
    // Arbitrary values (every finite e4m3 byte, scales spread over two octaves): the same promotion
    // order as CUTLASS's kernel, so the same bits.
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto* data : {&in.a_data, &in.b_data})
      for (uint8_t& v : *data)
        do v = uint8_t(byte(rng)); while ((v & 0x7F) == 0x7F);
    std::uniform_real_distribution<float> scale(1.0f / 512, 1.0f / 128);
    for (auto* sc : {&in.a_scale, &in.b_scale})
      for (size_t i = 0; i + 4 <= sc->size(); i += 4) {
        const float f = scale(rng);
        std::memcpy(sc->data() + i, &f, 4);
      }
    DeviceGrouped dg(in);
    for (GroupedBackend backend : {GroupedBackend::kContiguous, GroupedBackend::kCutlass}) {
      Dev& out = backend == GroupedBackend::kContiguous ? d : ref;
      SCALEMM_CUDA_CHECK(cudaMemset(out.p, 0xFF, bytes));
      GroupedGemmArgs ga = dg.args(out.p, DType::kBF16);
      ga.backend = backend;
      ga.alpha = 0.75f;
      h.grouped_gemm(ga);
    }
    SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint8_t> want = download(ref);
    CHECK(download(d) == want);
    // Every tile configuration, whichever the rule picks here: the same bits.
    for (cg::Tiles t : {cg::Tiles::k128SharedA, cg::Tiles::k160SharedA, cg::Tiles::k160SharedB, cg::Tiles::k192,
                        cg::Tiles::k192SharedB, cg::Tiles::k64, cg::Tiles::k96}) {
      CAPTURE(cg::describe(dg.args(d.p, DType::kBF16), t));
      SCALEMM_CUDA_CHECK(cudaMemset(d.p, 0xFF, bytes));
      GroupedGemmArgs ga = dg.args(d.p, DType::kBF16);
      ga.alpha = 0.75f;
      cg::run(ga, nullptr, t);
      SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
      CHECK(download(d) == want);
    }
    // D off 16-byte alignment (4 or 2 bytes): nothing is staged, every tile stores from the registers
    // (bf16 pairs, or single elements); the same bits, and nothing written outside D.
    for (size_t shift : {4, 2}) {
      CAPTURE(shift);
      Dev off(bytes + 16, 0xFF);
      GroupedGemmArgs ga = dg.args(static_cast<uint8_t*>(off.p) + shift, DType::kBF16);
      ga.alpha = 0.75f;
      cg::run(ga, nullptr, cg::tiles(ga, sms));
      SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<uint8_t> all = download(off);
      CHECK(std::vector<uint8_t>(all.begin() + std::ptrdiff_t(shift), all.begin() + std::ptrdiff_t(shift + bytes)) == want);
      CHECK(std::count(all.begin(), all.begin() + std::ptrdiff_t(shift), uint8_t(0xFF)) == std::ptrdiff_t(shift));
      CHECK(std::count(all.begin() + std::ptrdiff_t(shift + bytes), all.end(), uint8_t(0xFF)) == std::ptrdiff_t(16 - shift));
    }
  }
}

TEST_CASE("the CUTLASS rowwise grouped kernel with fast_accum stays within bf16 rounding of the exact product",
          "[gpu][dispatch][grouped][cutlass]") {
  // fast_accum runs the fast-accumulation mainloop (no promotion of the tensor cores' partial sums):
  // not bit-exact by contract, so each element is held to twice bf16's rounding of the exact product
  // (plus 2^-20 of the largest, for sums that cancel) on m- and k-grouped calls with K and N tails,
  // empty groups and G = 64; the third case has 256 or more rows per group on average, which takes the
  // 256 x 128 tiles (groups ending inside them, one of a single row).
  auto rng = scalemm::testing::rng(0x6C1);
  Handle h;
  std::vector<int64_t> decode(64, 8);
  decode[3] = 0, decode[17] = 1;
  struct Case {
    GroupDim dim;
    std::vector<int64_t> sizes;
    int64_t m_or_k, n;
  };
  const Case cases[] = {{GroupDim::kM, {7, 0, 1, 129}, 704, 264},
                        {GroupDim::kM, decode, 2048, 384},
                        {GroupDim::kM, {513, 0, 1, 700, 300}, 704, 264},
                        {GroupDim::kK, {128, 0, 384}, 136, 256},
                        {GroupDim::kK, {48, 0, 16, 80}, 7, 264}};
  for (const Case& c : cases) {
    const auto in = scalemm::testing::make_grouped(c.dim, Recipe::kRowwise, Recipe::kRowwise, ScaleFormat::kCompact,
                                                   ScaleFormat::kCompact, c.sizes, c.m_or_k, c.n, rng);
    DeviceGrouped dg(in);
    Dev d(in.expected.size() * 2);
    SCALEMM_CUDA_CHECK(cudaMemset(d.p, 0xFF, d.bytes));
    GroupedGemmArgs ga = dg.args(d.p, DType::kBF16);
    ga.backend = GroupedBackend::kCutlass;
    ga.fast_accum = true;
    CAPTURE(to_string(c.dim), c.sizes.size(), in.m, in.n, in.k);
    const std::string plan = h.explain(ga);
    CAPTURE(plan);
    CHECK(plan.find("fast accumulation") != std::string::npos);
    CHECK((plan.find("256x128x128 tiles") != std::string::npos) == backends::cutlass_grouped::wide_fast_accum(ga));
    CHECK(backends::cutlass_grouped::wide_fast_accum(ga) == (c.dim == GroupDim::kM && c.sizes.size() == 5));
    h.grouped_gemm(ga);
    SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> got(in.expected.size());
    SCALEMM_CUDA_CHECK(cudaMemcpy(got.data(), d.p, got.size() * 2, cudaMemcpyDeviceToHost));
    double top = 0.0;
    for (double e : in.expected) top = std::max(top, std::fabs(e));
    int64_t bad = 0, first = -1;
    for (size_t i = 0; i < got.size(); ++i) {
      const double g = formats::decode_bf16(got[i]), e = in.expected[i];
      if (!(std::fabs(g - e) <= std::ldexp(std::fabs(e), -7) + std::ldexp(top, -20))) {
        if (first < 0) first = int64_t(i);
        ++bad;
      }
    }
    CAPTURE(first, top);
    CHECK(bad == 0);
  }
}

TEST_CASE("auto leaves large even rowwise groups with host sizes to the per-group backend (blockwise: the contiguous kernel); asking for the CUTLASS kernel still gets it",
          "[gpu][dispatch][grouped][cutlass]") {
  auto rng = scalemm::testing::rng(0x6C4);
  Handle h;
  struct Case {
    Recipe ra, rb;
    std::vector<int64_t> sizes;
  };
  for (const Case& c : {Case{Recipe::kRowwise, Recipe::kRowwise, {1024, 0, 1040}},
                        Case{Recipe::kBlock1x128, Recipe::kBlock128x128, {2048, 2048}}}) {
    const auto in = scalemm::testing::make_grouped(GroupDim::kM, c.ra, c.rb, ScaleFormat::kCompact,
                                                   ScaleFormat::kCompact, c.sizes, 256, 128, rng);
    DeviceGrouped dg(in);
    for (GroupedBackend backend : {GroupedBackend::kAuto, GroupedBackend::kCutlass}) {
      Dev d(in.expected.size() * 2);
      SCALEMM_CUDA_CHECK(cudaMemset(d.p, 0xFF, d.bytes));
      GroupedGemmArgs ga = dg.args(d.p, DType::kBF16);
      ga.backend = backend;
      const std::string plan = h.explain(ga);
      CAPTURE(to_string(c.ra), plan);
      const bool rowwise = c.ra == Recipe::kRowwise;
      if (backend == GroupedBackend::kCutlass) CHECK(plan.find("CUTLASS grouped backend") != std::string::npos);
      else if (rowwise) CHECK(plan.find("measured faster as one cuBLASLt call per group") != std::string::npos);
      else CHECK(plan.find("contiguous grouped backend") != std::string::npos);
      h.grouped_gemm(ga);
      SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
      CHECK(bf16_mismatches(d, in.expected) == 0);
    }
    // Device-side sizes keep a one-launch kernel: the per-group backend would read them back synchronously.
    Dev d(in.expected.size() * 2);
    GroupedGemmArgs ga = dg.args(d.p, DType::kBF16);
    std::vector<int32_t> s32(c.sizes.begin(), c.sizes.end());
    Dev sizes(s32);
    ga.group_sizes = nullptr;
    ga.group_sizes_device = sizes.p;
    CHECK(h.explain(ga).find(c.ra == Recipe::kRowwise ? "CUTLASS grouped backend" : "contiguous grouped backend") !=
          std::string::npos);
  }
}

TEST_CASE("the one-launch grouped kernels read device-side sizes (int32, int64) with the same bits as host sizes",
          "[gpu][dispatch][grouped][cutlass]") {
  auto rng = scalemm::testing::rng(0x6C1);
  Handle h;
  // m-grouped blockwise, k-grouped blockwise, m-grouped rowwise; m-grouped blockwise on the contiguous kernel
  for (int variant = 0; variant < 4; ++variant) {
    const GroupDim dim = variant == 1 ? GroupDim::kK : GroupDim::kM;
    const GroupedBackend backend = variant == 3 ? GroupedBackend::kContiguous : GroupedBackend::kAuto;
    const std::vector<int64_t> sizes = dim == GroupDim::kM ? std::vector<int64_t>{40, 0, 1, 215, 8}
                                                           : std::vector<int64_t>{256, 0, 128, 128, 384};
    const Recipe ra = variant == 2 ? Recipe::kRowwise : Recipe::kBlock1x128;
    const Recipe rb = variant == 2 ? Recipe::kRowwise : variant == 1 ? Recipe::kBlock1x128 : Recipe::kBlock128x128;
    const auto in = scalemm::testing::make_grouped(dim, ra, rb, ScaleFormat::kCompact, ScaleFormat::kCompact, sizes,
                                                   256, 256, rng);
    DeviceGrouped dg(in);
    const size_t bytes = in.expected.size() * 2;
    Dev ref(bytes), got(bytes), status(4);
    SCALEMM_CUDA_CHECK(cudaMemset(ref.p, 0xFF, bytes));
    h.grouped_gemm(dg.args(ref.p, DType::kBF16));
    SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(bf16_mismatches(ref, in.expected) == 0);
    std::vector<int32_t> s32(sizes.begin(), sizes.end());
    Dev d32(s32), d64(sizes);
    for (bool wide : {false, true}) {
      SCALEMM_CUDA_CHECK(cudaMemset(got.p, 0xFF, bytes));
      SCALEMM_CUDA_CHECK(cudaMemset(status.p, 0x7F, 4));
      GroupedGemmArgs ga = dg.args(got.p, DType::kBF16);
      ga.group_sizes = nullptr;
      ga.group_sizes_device = wide ? d64.p : d32.p;
      ga.group_sizes_int64 = wide;
      ga.device_status = status.as<int32_t>();
      ga.backend = backend;
      CAPTURE(variant, wide);
      CHECK(h.explain(ga).find("device-side sizes") != std::string::npos);
      h.grouped_gemm(ga);
      SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
      CHECK(download(got) == download(ref));
      int32_t st = -1;
      SCALEMM_CUDA_CHECK(cudaMemcpy(&st, status.p, 4, cudaMemcpyDeviceToHost));
      CHECK(st == 0);
    }
  }
}

TEST_CASE("invalid device-side sizes make the one-launch grouped kernels write nothing and set device_status",
          "[gpu][dispatch][grouped][cutlass]") {
  auto rng = scalemm::testing::rng(0x6C2);
  Handle h;
  const auto in = scalemm::testing::make_grouped(GroupDim::kM, Recipe::kBlock1x128, Recipe::kBlock128x128,
                                                 ScaleFormat::kCompact, ScaleFormat::kCompact, {64, 64, 128}, 256, 256,
                                                 rng);
  DeviceGrouped dg(in);
  const size_t bytes = in.expected.size() * 2;
  Dev d(bytes), status(4);
  struct Bad {
    std::vector<int32_t> sizes;
    int32_t status;
  };
  for (const Bad& b : {Bad{{64, -1, 193}, 2}, Bad{{64, 64, 127}, 4}, Bad{{256, 0, 1}, 4}})
  for (GroupedBackend backend : {GroupedBackend::kAuto, GroupedBackend::kContiguous}) {
    Dev sizes(b.sizes);
    SCALEMM_CUDA_CHECK(cudaMemset(d.p, 0xFF, bytes));
    GroupedGemmArgs ga = dg.args(d.p, DType::kBF16);
    ga.group_sizes = nullptr;
    ga.group_sizes_device = sizes.p;
    ga.device_status = status.as<int32_t>();
    ga.backend = backend;
    h.grouped_gemm(ga);
    SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = download(d);
    CAPTURE(b.sizes[0], b.sizes[1], b.sizes[2], to_string(backend));
    CHECK(std::all_of(got.begin(), got.end(), [](uint8_t v) { return v == 0xFF; }));
    int32_t st = 0;
    SCALEMM_CUDA_CHECK(cudaMemcpy(&st, status.p, 4, cudaMemcpyDeviceToHost));
    CHECK(st == b.status);
  }
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("m-grouped with device-side sizes changing between graph replays is correct on every replay",
          "[gpu][dispatch][grouped][cutlass]") {
  // A block1x128 A's compact scales concatenate its rows' scales, so any split of its 512 rows into
  // experts is a valid call over the same buffers: the router's counts change, the graph does not.
  auto rng = scalemm::testing::rng(0x6C3);
  Handle h;
  const int64_t G = 8;
  for (GroupedBackend backend : {GroupedBackend::kAuto, GroupedBackend::kContiguous}) {
  CAPTURE(to_string(backend));
  const auto in = scalemm::testing::make_grouped(GroupDim::kM, Recipe::kBlock1x128, Recipe::kBlock128x128,
                                                 ScaleFormat::kCompact, ScaleFormat::kCompact,
                                                 std::vector<int64_t>(size_t(G), 64), 512, 256, rng);
  DeviceGrouped dg(in);
  const size_t bytes = in.expected.size() * 2;
  Dev got(bytes), want(bytes), status(4);
  Dev sizes(size_t(G) * 4);
  cudaStream_t s;
  SCALEMM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  GroupedGemmArgs ga = dg.args(got.p, DType::kBF16);
  ga.group_sizes = nullptr;
  ga.group_sizes_device = sizes.p;
  ga.device_status = status.as<int32_t>();
  ga.backend = backend;
  std::vector<int32_t> split(size_t(G), 64);
  SCALEMM_CUDA_CHECK(cudaMemcpy(sizes.p, split.data(), sizes.bytes, cudaMemcpyHostToDevice));
  h.grouped_gemm(ga, s);  // warm-up: the stream's staging exists before capture
  SCALEMM_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  SCALEMM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  h.grouped_gemm(ga, s);  // a host synchronisation here would end the capture with an error
  SCALEMM_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  SCALEMM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  std::mt19937_64 r2(0x6C4);
  int correct = 0, replays = 20;
  for (int r = 0; r < replays; ++r) {
    // A random split of 512 rows, with empty experts.
    std::vector<int64_t> cuts = {0, 512};
    for (int64_t i = 0; i < G - 1; ++i) cuts.push_back(int64_t(r2() % 513));
    std::sort(cuts.begin(), cuts.end());
    std::vector<int64_t> host(static_cast<size_t>(G));
    for (int64_t g = 0; g < G; ++g) host[size_t(g)] = cuts[size_t(g) + 1] - cuts[size_t(g)];
    std::vector<int32_t> h32(host.begin(), host.end());
    SCALEMM_CUDA_CHECK(cudaMemcpyAsync(sizes.p, h32.data(), sizes.bytes, cudaMemcpyHostToDevice, s));
    SCALEMM_CUDA_CHECK(cudaMemsetAsync(got.p, 0xFF, bytes, s));
    SCALEMM_CUDA_CHECK(cudaGraphLaunch(exec, s));
    // The same split as an eager call with host sizes.
    SCALEMM_CUDA_CHECK(cudaMemsetAsync(want.p, 0xFF, bytes, s));
    GroupedGemmArgs eager = dg.args(want.p, DType::kBF16);
    eager.group_sizes = host.data();
    h.grouped_gemm(eager, s);
    SCALEMM_CUDA_CHECK(cudaStreamSynchronize(s));
    int32_t st = -1;
    SCALEMM_CUDA_CHECK(cudaMemcpy(&st, status.p, 4, cudaMemcpyDeviceToHost));
    const auto a = download(got), b = download(want);
    std::vector<uint16_t> elems(a.size() / 2);
    std::memcpy(elems.data(), a.data(), a.size());
    const bool all_written = std::none_of(elems.begin(), elems.end(), [](uint16_t v) { return v == 0xFFFF; });
    CAPTURE(r, st, a == b, all_written);
    CHECK(a == b);
    correct += a == b && st == 0 && all_written;
  }
  CHECK(correct == replays);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
  }
}

TEST_CASE("SCALEMM_VERIFY full covers grouped calls on the CUTLASS kernel", "[gpu][dispatch][grouped][cutlass]") {
  auto rng = scalemm::testing::rng(0x6C5);
  HandleOptions o;
  o.verify = VerifyMode::kFull;
  Handle h(o);
  for (GroupDim dim : {GroupDim::kM, GroupDim::kK}) {
    const auto in = scalemm::testing::make_grouped(
        dim, Recipe::kBlock1x128, dim == GroupDim::kM ? Recipe::kBlock128x128 : Recipe::kBlock1x128,
        ScaleFormat::kCompact, ScaleFormat::kCompact,
        dim == GroupDim::kM ? std::vector<int64_t>{7, 0, 129} : std::vector<int64_t>{128, 0, 256}, 256, 256, rng);
    DeviceGrouped dg(in);
    Dev d(in.expected.size() * 2);
    CAPTURE(to_string(dim));
    CHECK_NOTHROW(h.grouped_gemm(dg.args(d.p, DType::kBF16)));
    CHECK(bf16_mismatches(d, in.expected) == 0);
  }
}
