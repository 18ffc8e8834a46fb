// CUDA graphs and threads (docs/reliability.md): two different GEMMs captured in one graph, each with
// its own handle, stream and workspace, replayed 100 times bit-identically to eager; the linear layer's
// forward + backward captured and replayed; 8 threads x 100 calls on one handle, each on its own
// stream, and threads racing on the first use of one plan key, bit-identical to serial calls.
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "dispatch/device_buffer.hpp"
#include "dispatch/linear_inputs.hpp"
#include "dispatch/test_operands.hpp"
#include "scalemm/gemm.hpp"
#include "scalemm/linear.hpp"
#include "quiet_options.hpp"
#include "support/test_support.hpp"
#include "scalemm/detail/cuda_check.hpp"

using namespace scalemm;
using scalemm::testing::Dev;
using scalemm::testing::HostOperand;
using scalemm::testing::quiet;

namespace {

struct DeviceOperand {
  Dev data, scales;
  GemmOperand op;
  explicit DeviceOperand(const HostOperand& h) : data(h.data), scales(h.scales), op(h.view()) {
    op.data = data.p;
    op.scale = scales.p;
  }
};

struct StreamHolder {
  cudaStream_t s{};
  StreamHolder() { SCALEMM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~StreamHolder() { cudaStreamDestroy(s); }
  Stream get() const { return reinterpret_cast<Stream>(s); }
};

std::vector<uint8_t> download(const void* p, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  SCALEMM_CUDA_CHECK(cudaMemcpy(out.data(), p, bytes, cudaMemcpyDeviceToHost));
  return out;
}

// One GEMM with its device operands and output.
struct Job {
  std::unique_ptr<DeviceOperand> a, b;
  std::unique_ptr<Dev> d;
  GemmArgs args;
  size_t bytes = 0;
  Job(Recipe ra, Recipe rb, int64_t m, int64_t n, int64_t k, DType out, std::mt19937_64& rng) {
    a = std::make_unique<DeviceOperand>(scalemm::testing::random_operand(ra, m, k, ScaleFormat::kCompact, rng));
    b = std::make_unique<DeviceOperand>(scalemm::testing::random_operand(rb, n, k, ScaleFormat::kCublasLt, rng));
    bytes = size_t(m * n) * (out == DType::kF32 ? 4 : 2);
    d = std::make_unique<Dev>(bytes);
    args.m = m, args.n = n, args.k = k;
    args.a = a->op, args.b = b->op, args.d = d->p, args.d_dtype = out;
  }
};

}  // namespace

TEST_CASE("two different GEMMs with their own handles, streams and workspaces replay from one graph 100 times "
          "bit-identically to eager",
          "[gpu][reliability][graph]") {
  auto rng = scalemm::testing::rng(0x6A2);
  // Blockwise FP8 on the planner's choice (native on sm_90) and MXFP8 forced through the emulated
  // backend (fp32 output): different backends, plans and scratch.
  Job j1(Recipe::kBlock1x128, Recipe::kBlock128x128, 256, 384, 1024, DType::kBF16, rng);
  Job j2(Recipe::kMxfp8, Recipe::kMxfp8_32x32, 192, 256, 512, DType::kF32, rng);
  Handle h1(quiet()), h2(quiet(Backend::kEmulated));
  StreamHolder s1, s2;
  // Eager (also the warm-up: plans, heuristics, per-stream workspaces and scratch exist before capture).
  h1.gemm(j1.args, s1.get());
  h2.gemm(j2.args, s2.get());
  SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
  const auto e1 = download(j1.d->p, j1.bytes), e2 = download(j2.d->p, j2.bytes);
  INFO("plans: " << h1.plan(j1.args).explain() << " | " << h2.plan(j2.args).explain());

  cudaEvent_t fork, join;
  SCALEMM_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  SCALEMM_CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  SCALEMM_CUDA_CHECK(cudaStreamBeginCapture(s1.s, cudaStreamCaptureModeGlobal));
  SCALEMM_CUDA_CHECK(cudaEventRecord(fork, s1.s));
  SCALEMM_CUDA_CHECK(cudaStreamWaitEvent(s2.s, fork, 0));
  h1.gemm(j1.args, s1.get());
  h2.gemm(j2.args, s2.get());
  SCALEMM_CUDA_CHECK(cudaEventRecord(join, s2.s));
  SCALEMM_CUDA_CHECK(cudaStreamWaitEvent(s1.s, join, 0));
  SCALEMM_CUDA_CHECK(cudaStreamEndCapture(s1.s, &graph));
  SCALEMM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  int identical = 0;
  for (int i = 0; i < 100; ++i) {
    SCALEMM_CUDA_CHECK(cudaMemsetAsync(j1.d->p, 0xFF, j1.bytes, s1.s));  // poison both outputs before each replay
    SCALEMM_CUDA_CHECK(cudaMemsetAsync(j2.d->p, 0xFF, j2.bytes, s1.s));
    SCALEMM_CUDA_CHECK(cudaGraphLaunch(exec, s1.s));
    SCALEMM_CUDA_CHECK(cudaStreamSynchronize(s1.s));
    identical += download(j1.d->p, j1.bytes) == e1 && download(j2.d->p, j2.bytes) == e2;
  }
  CHECK(identical == 100);
  CHECK(cudaGetLastError() == cudaSuccess);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaEventDestroy(fork);
  cudaEventDestroy(join);
}

TEST_CASE("two different GEMMs on one handle and one stream replay from one graph 100 times bit-identically",
          "[gpu][reliability][graph]") {
  auto rng = scalemm::testing::rng(0x6A3);
  Job j1(Recipe::kBlock1x128, Recipe::kBlock128x128, 128, 256, 512, DType::kBF16, rng);
  Job j2(Recipe::kNvfp4, Recipe::kNvfp4, 64, 384, 512, DType::kF16, rng);
  Handle h(quiet());
  StreamHolder s;
  h.gemm(j1.args, s.get());
  h.gemm(j2.args, s.get());
  SCALEMM_CUDA_CHECK(cudaStreamSynchronize(s.s));
  const auto e1 = download(j1.d->p, j1.bytes), e2 = download(j2.d->p, j2.bytes);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  SCALEMM_CUDA_CHECK(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeGlobal));
  h.gemm(j1.args, s.get());
  h.gemm(j2.args, s.get());
  SCALEMM_CUDA_CHECK(cudaStreamEndCapture(s.s, &graph));
  SCALEMM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  int identical = 0;
  for (int i = 0; i < 100; ++i) {
    SCALEMM_CUDA_CHECK(cudaMemsetAsync(j1.d->p, 0xFF, j1.bytes, s.s));
    SCALEMM_CUDA_CHECK(cudaMemsetAsync(j2.d->p, 0xFF, j2.bytes, s.s));
    SCALEMM_CUDA_CHECK(cudaGraphLaunch(exec, s.s));
    SCALEMM_CUDA_CHECK(cudaStreamSynchronize(s.s));
    identical += download(j1.d->p, j1.bytes) == e1 && download(j2.d->p, j2.bytes) == e2;
  }
  CHECK(identical == 100);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST_CASE("the linear layer's forward + backward, captured after a warm-up, replays 100 times bit-identically",
          "[gpu][reliability][graph]") {
  const int64_t m = 256, n = 384, k = 512;
  for (LinearRecipe recipe : {LinearRecipe::kBlockwiseFp8, LinearRecipe::kMxfp8}) {
    auto rng = scalemm::testing::rng(0x1A + uint64_t(recipe));
    const auto x = scalemm::testing::make_input(m, k, false, rng);
    const auto w = scalemm::testing::make_input(n, k, false, rng);
    const auto dy = scalemm::testing::make_input(m, n, false, rng);
    Dev dx_in(x), dw_in(w), ddy(dy);
    Dev y(size_t(m * n) * 2), dx(size_t(m * k) * 2), dw(size_t(n * k) * 4);
    Handle h(quiet());
    StreamHolder s;
    ScaledLinear layer(h, recipe, n, k);
    layer.set_weight(dw_in.as<float>(), s.get());
    auto step = [&] {
      layer.forward(dx_in.as<float>(), m, y.as<uint16_t>(), s.get());
      layer.backward(ddy.as<float>(), dx.as<uint16_t>(), dw.as<float>(), s.get());
    };
    step();  // warm-up: buffers for M tokens, plans, workspaces
    SCALEMM_CUDA_CHECK(cudaStreamSynchronize(s.s));
    const auto ey = download(y.p, y.bytes), edx = download(dx.p, dx.bytes), edw = download(dw.p, dw.bytes);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    SCALEMM_CUDA_CHECK(cudaStreamBeginCapture(s.s, cudaStreamCaptureModeGlobal));
    step();
    SCALEMM_CUDA_CHECK(cudaStreamEndCapture(s.s, &graph));
    SCALEMM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    int identical = 0;
    for (int i = 0; i < 100; ++i) {
      SCALEMM_CUDA_CHECK(cudaMemsetAsync(y.p, 0xFF, y.bytes, s.s));
      SCALEMM_CUDA_CHECK(cudaMemsetAsync(dx.p, 0xFF, dx.bytes, s.s));
      SCALEMM_CUDA_CHECK(cudaMemsetAsync(dw.p, 0xFF, dw.bytes, s.s));
      SCALEMM_CUDA_CHECK(cudaGraphLaunch(exec, s.s));
      SCALEMM_CUDA_CHECK(cudaStreamSynchronize(s.s));
      identical += download(y.p, y.bytes) == ey && download(dx.p, dx.bytes) == edx && download(dw.p, dw.bytes) == edw;
    }
    CAPTURE(to_string(recipe));
    CHECK(identical == 100);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
}

TEST_CASE("8 threads x 100 calls on one handle, each thread on its own stream with its own recipe pair, are "
          "bit-identical to serial calls",
          "[gpu][reliability][threads]") {
  auto rng = scalemm::testing::rng(0x7E8);
  const std::pair<Recipe, Recipe> pairs[] = {{Recipe::kBlock1x128, Recipe::kBlock128x128},
                                             {Recipe::kMxfp8, Recipe::kMxfp8},
                                             {Recipe::kTensorwise, Recipe::kTensorwise},
                                             {Recipe::kNvfp4, Recipe::kNvfp4},
                                             {Recipe::kRowwise, Recipe::kRowwise},
                                             {Recipe::kMxfp8, Recipe::kMxfp8_32x32},
                                             {Recipe::kBlock128x128, Recipe::kBlock1x128},
                                             {Recipe::kTensorwise, Recipe::kRowwise}};
  std::vector<std::unique_ptr<Job>> jobs;
  for (int t = 0; t < 8; ++t)
    jobs.push_back(std::make_unique<Job>(pairs[t].first, pairs[t].second, 128 + 8 * t, 256, 512,
                                         t % 2 ? DType::kF32 : DType::kBF16, rng));
  std::vector<std::vector<uint8_t>> serial;
  {
    Handle hs(quiet());
    for (auto& j : jobs) {
      SCALEMM_CUDA_CHECK(cudaMemset(j->d->p, 0xFF, j->bytes));
      hs.gemm(j->args, nullptr);
      SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
      serial.push_back(download(j->d->p, j->bytes));
    }
  }
  Handle h(quiet());
  std::atomic<int> identical{0}, errors{0}, ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      try {
        StreamHolder s;
        Job& j = *jobs[size_t(t)];
        std::vector<uint8_t> got(j.bytes);
        ++ready;
        while (ready.load() < 8) std::this_thread::yield();  // start together
        for (int i = 0; i < 100; ++i) {
          if (cudaMemsetAsync(j.d->p, 0xFF, j.bytes, s.s) != cudaSuccess) ++errors;
          h.gemm(j.args, s.get());
          if (cudaMemcpyAsync(got.data(), j.d->p, j.bytes, cudaMemcpyDeviceToHost, s.s) != cudaSuccess) ++errors;
          if (cudaStreamSynchronize(s.s) != cudaSuccess) ++errors;
          identical += got == serial[size_t(t)];
        }
      } catch (const std::exception& e) {
        std::printf("thread %d: %s\n", t, e.what());
        ++errors;
      }
    });
  for (auto& th : threads) th.join();
  CHECK(errors == 0);
  CHECK(identical == 800);
}

TEST_CASE("threads racing on the first use of one plan key get one plan and serial results", "[gpu][reliability][threads]") {
  auto rng = scalemm::testing::rng(0x7E9);
  // Each round: a fresh handle, 8 threads released together, the same problem (one plan key) with
  // their own outputs and streams: the plan cache, the per-stream arenas and the scratch are all
  // created under the race.
  for (auto [ra, rb] : {std::pair{Recipe::kBlock1x128, Recipe::kBlock128x128}, {Recipe::kMxfp8, Recipe::kMxfp8}}) {
    Job proto(ra, rb, 129, 264, 640, DType::kBF16, rng);
    std::vector<uint8_t> serial;
    {
      Handle hs(quiet());
      hs.gemm(proto.args, nullptr);
      SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
      serial = download(proto.d->p, proto.bytes);
    }
    std::vector<std::unique_ptr<Dev>> outs;
    for (int t = 0; t < 8; ++t) outs.push_back(std::make_unique<Dev>(proto.bytes));
    int identical_total = 0, errors_total = 0;
    for (int round = 0; round < 10; ++round) {
      Handle h(quiet());
      std::atomic<int> identical{0}, errors{0}, ready{0};
      std::vector<Backend> backends(8, Backend::kReference);
      std::vector<std::thread> threads;
      for (int t = 0; t < 8; ++t)
        threads.emplace_back([&, t] {
          try {
            StreamHolder s;
            GemmArgs args = proto.args;
            args.d = outs[size_t(t)]->p;
            if (cudaMemsetAsync(args.d, 0xFF, proto.bytes, s.s) != cudaSuccess) ++errors;
            if (cudaStreamSynchronize(s.s) != cudaSuccess) ++errors;
            ++ready;
            while (ready.load() < 8) std::this_thread::yield();
            h.gemm(args, s.get());
            backends[size_t(t)] = h.plan(args).backend;
            std::vector<uint8_t> got(proto.bytes);
            if (cudaMemcpyAsync(got.data(), args.d, proto.bytes, cudaMemcpyDeviceToHost, s.s) != cudaSuccess) ++errors;
            if (cudaStreamSynchronize(s.s) != cudaSuccess) ++errors;
            identical += got == serial;
          } catch (const std::exception& e) {
            std::printf("thread %d: %s\n", t, e.what());
            ++errors;
          }
        });
      for (auto& th : threads) th.join();
      for (int t = 1; t < 8; ++t) CHECK(backends[size_t(t)] == backends[0]);
      identical_total += identical.load();
      errors_total += errors.load();
    }
    CAPTURE(to_string(ra), to_string(rb));
    CHECK(errors_total == 0);
    CHECK(identical_total == 80);
  }
}
