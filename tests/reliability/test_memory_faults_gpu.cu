// GPU memory faults (docs/reliability.md, "GPU memory faults"): every device allocation a call makes
// (the cuBLASLt workspace, the plan's scratch, grouped staging, forked streams' arenas, verification
// buffers) is made to fail in turn through the test hook detail::fail_device_allocation. Each failure
// must be Error(kOutOfMemory) naming what was allocated and its size, must leave a dense call's output
// untouched, and the same handle must then run the call correctly; repeating it must not leak.
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dispatch/device_buffer.hpp"
#include "dispatch/grouped_inputs.hpp"
#include "dispatch/test_operands.hpp"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/detail/device_alloc.hpp"
#include "scalemm/gemm.hpp"
#include "scalemm/grouped.hpp"
#include "quiet_options.hpp"
#include "support/test_support.hpp"

using namespace scalemm;
using scalemm::testing::Dev;
using scalemm::testing::quiet;

namespace {

std::vector<uint8_t> download(const Dev& d) {
  std::vector<uint8_t> h(d.bytes);
  SCALEMM_CUDA_CHECK(cudaMemcpy(h.data(), d.p, d.bytes, cudaMemcpyDeviceToHost));
  return h;
}

struct DenseCall {
  scalemm::testing::HostOperand ha, hb;
  Dev a, sa, b, sb, d;
  GemmArgs args;
  DenseCall(Recipe ra, Recipe rb, int64_t m, int64_t n, int64_t k, std::mt19937_64& rng)
      : ha(scalemm::testing::random_operand(ra, m, k, ScaleFormat::kCompact, rng)),
        hb(scalemm::testing::random_operand(rb, n, k, ScaleFormat::kCompact, rng)),
        a(ha.data), sa(ha.scales), b(hb.data), sb(hb.scales), d(size_t(m * n) * 4) {
    args.m = m, args.n = n, args.k = k;
    args.a = ha.view(), args.b = hb.view();
    args.a.data = a.p, args.a.scale = sa.p, args.b.data = b.p, args.b.scale = sb.p;
    args.d = d.p, args.d_dtype = DType::kF32;
  }
};

// For nth = 1, 2, ...: a fresh Handle of `opts`, the nth device allocation from now made to fail,
// `call(handle)`; `after(handle)` checks each failure (and runs the call again on the same handle).
// Stops at the first nth whose call makes no failing allocation and returns how many allocations a
// first call makes.
// `prepare(handle)` runs on each fresh handle before the hook is armed (a warm-up call, so that the
// failures hit a call that grows buffers rather than one that makes them).
template <typename Prepare, typename Call, typename After>
int fail_each_allocation_after(const HandleOptions& opts, Prepare&& prepare, Call&& call, After&& after) {
  for (int nth = 1; nth < 64; ++nth) {
    Handle h(opts);
    prepare(h);
    const int64_t failed_before = detail::failed_device_allocations();
    detail::fail_device_allocation(nth);
    std::string message;
    StatusCode code = StatusCode::kOk;
    try {
      call(h);
      SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
    } catch (const Error& e) {
      code = e.code();
      message = e.what();
    }
    detail::fail_device_allocation(0);
    if (detail::failed_device_allocations() == failed_before) {
      CHECK(code == StatusCode::kOk);
      return nth - 1;
    }
    INFO("allocation " << nth << ": " << message);
    CHECK(code == StatusCode::kOutOfMemory);
    CHECK(message.find("cudaErrorMemoryAllocation") != std::string::npos);
    // The size of what was being allocated: "(N B)" of the arenas, "cudaMalloc of N bytes" of buffers.
    CHECK((message.find(" B)") != std::string::npos || message.find(" bytes") != std::string::npos));
    CHECK(cudaGetLastError() == cudaSuccess);       // nothing sticky left for the next CUDA call
    after(h, message);
  }
  FAIL("a call made more than 63 device allocations");
  return 0;
}

template <typename Call, typename After>
int fail_each_allocation(const HandleOptions& opts, Call&& call, After&& after) {
  return fail_each_allocation_after(opts, [](Handle&) {}, std::forward<Call>(call), std::forward<After>(after));
}

size_t free_device_bytes() {
  size_t free = 0, total = 0;
  SCALEMM_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

}  // namespace

// [serial]: the leak check reads the device's free memory, which another test process would move.
TEST_CASE("a dense call whose workspace or scratch allocation fails raises out-of-memory, writes nothing and "
          "leaves the handle usable",
          "[gpu][reliability][memory][serial]") {
  auto rng = scalemm::testing::rng(0x0A11);
  // MXFP8 on the emulated backend needs scratch for the dequantized operands; blockwise on the
  // planner's choice needs the cuBLASLt workspace.
  for (auto [ra, rb, force] : {std::tuple{Recipe::kMxfp8, Recipe::kMxfp8, std::optional<Backend>(Backend::kEmulated)},
                               {Recipe::kBlock1x128, Recipe::kBlock128x128, std::optional<Backend>()}}) {
    DenseCall c(ra, rb, 256, 384, 512, rng);
    std::vector<uint8_t> want;
    {
      Handle ref(quiet(force));
      ref.gemm(c.args);
      SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
      want = download(c.d);
    }
    CAPTURE(to_string(ra), to_string(rb));
    const int allocations = fail_each_allocation(
        quiet(force),
        [&](Handle& h) {
          SCALEMM_CUDA_CHECK(cudaMemset(c.d.p, 0xFF, c.d.bytes));
          h.gemm(c.args);
        },
        [&](Handle& h, const std::string&) {
          CHECK(download(c.d) == std::vector<uint8_t>(c.d.bytes, 0xFF));  // D untouched
          SCALEMM_CUDA_CHECK(cudaMemset(c.d.p, 0, c.d.bytes));
          h.gemm(c.args);  // the same handle runs the call
          SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
          CHECK(download(c.d) == want);
        });
    CHECK(allocations >= 1);  // at least the cuBLASLt workspace of the stream
    // No leak: the same failure and recovery on fresh handles leaves the free memory where it was.
    const size_t before = free_device_bytes();
    for (int i = 0; i < 5; ++i) {
      Handle h(quiet(force));
      detail::fail_device_allocation(2);
      try {
        h.gemm(c.args);
      } catch (const Error&) {
      }
      detail::fail_device_allocation(0);
      h.gemm(c.args);
      SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
    }
    // Within 4 MiB (the driver's page granularity); one leaked cuBLASLt workspace alone is 32 MiB.
    const size_t after = free_device_bytes();
    CHECK(after + (size_t(4) << 20) >= before);
  }
}

TEST_CASE("a grouped call whose staging or per-stream allocation fails raises out-of-memory and leaves the "
          "handle usable",
          "[gpu][reliability][memory]") {
  auto rng = scalemm::testing::rng(0x0A12);
  for (GroupDim dim : {GroupDim::kM, GroupDim::kK}) {
    const auto in = dim == GroupDim::kM
                        ? scalemm::testing::make_grouped(dim, Recipe::kBlock1x128, Recipe::kBlock128x128,
                                                         ScaleFormat::kCompact, ScaleFormat::kCompact, {7, 0, 129, 64},
                                                         512, 256, rng)
                        : scalemm::testing::make_grouped(dim, Recipe::kBlock1x128, Recipe::kBlock128x128,
                                                         ScaleFormat::kCompact, ScaleFormat::kCompact,
                                                         {128, 0, 256, 384}, 64, 256, rng);
    Dev ad(in.a_data), as(in.a_scale), bd(in.b_data), bs(in.b_scale), d(in.expected.size() * 4);
    const GroupedGemmArgs args = in.args(d.p, ad.p, as.p, bd.p, bs.p, MemorySpace::kDevice);
    CAPTURE(to_string(dim));
    for (const char* backend : {"auto", "per-group"}) {
      CAPTURE(backend);
      GroupedGemmArgs call = args;
      if (std::string(backend) == "per-group") call.backend = GroupedBackend::kPerGroup;
      const int allocations = fail_each_allocation(
          quiet(),
          [&](Handle& h) {
            SCALEMM_CUDA_CHECK(cudaMemset(d.p, 0xFF, d.bytes));
            h.grouped_gemm(call);
          },
          [&](Handle& h, const std::string&) {
            SCALEMM_CUDA_CHECK(cudaMemset(d.p, 0xFF, d.bytes));
            h.grouped_gemm(call);  // the same handle runs the call, exactly
            SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
            std::vector<float> got(in.expected.size());
            SCALEMM_CUDA_CHECK(cudaMemcpy(got.data(), d.p, d.bytes, cudaMemcpyDeviceToHost));
            int64_t bad = 0;
            for (size_t i = 0; i < got.size(); ++i) bad += got[i] != float(in.expected[i]);
            CHECK(bad == 0);
          });
      CHECK(allocations >= 1);
    }
  }
}

// Every allocation of a grouped call in turn: the cold call (the caller's and each forked stream's
// cuBLASLt workspace, scratch and staging), and the same call after a smaller one warmed the handle up
// (the buffers grow instead). D must be exactly as it was (every byte still the poison): the call
// allocates everything before its first launch.
TEST_CASE("a grouped call whose allocation fails at any point writes nothing to D and leaves the handle usable",
          "[gpu][reliability][memory]") {
  auto rng = scalemm::testing::rng(0x0A14);
  struct Config {
    GroupDim dim;
    Recipe ra, rb;
    std::vector<int64_t> sizes, warm_sizes;
    int64_t m_or_k;
  };
  const Config configs[] = {
      {GroupDim::kM, Recipe::kBlock1x128, Recipe::kBlock128x128, {7, 0, 129, 64, 300}, {1, 1, 1, 1, 1}, 512},
      {GroupDim::kM, Recipe::kRowwise, Recipe::kRowwise, {33, 0, 257, 64}, {1, 1, 1, 1}, 256},
      {GroupDim::kK, Recipe::kBlock1x128, Recipe::kBlock128x128, {128, 0, 256, 384}, {128, 0, 128, 128}, 64},
      {GroupDim::kK, Recipe::kTensorwise, Recipe::kTensorwise, {16, 48, 0, 80}, {16, 16, 0, 16}, 96},
  };
  for (const Config& cf : configs) {
    const auto in = scalemm::testing::make_grouped(cf.dim, cf.ra, cf.rb, ScaleFormat::kCompact, ScaleFormat::kCompact,
                                                   cf.sizes, cf.m_or_k, 256, rng);
    const auto warm_in = scalemm::testing::make_grouped(cf.dim, cf.ra, cf.rb, ScaleFormat::kCompact,
                                                        ScaleFormat::kCompact, cf.warm_sizes, cf.m_or_k, 256, rng);
    Dev ad(in.a_data), as(in.a_scale), bd(in.b_data), bs(in.b_scale), d(in.expected.size() * 4);
    Dev wad(warm_in.a_data), was(warm_in.a_scale), wbd(warm_in.b_data), wbs(warm_in.b_scale),
        wd(warm_in.expected.size() * 4);
    const GroupedGemmArgs args = in.args(d.p, ad.p, as.p, bd.p, bs.p, MemorySpace::kDevice);
    const GroupedGemmArgs warm_args = warm_in.args(wd.p, wad.p, was.p, wbd.p, wbs.p, MemorySpace::kDevice);
    CAPTURE(to_string(cf.dim), to_string(cf.ra), to_string(cf.rb));
    for (const char* backend : {"auto", "per-group"})
      for (bool warm : {false, true}) {
        CAPTURE(backend, warm);
        GroupedGemmArgs call = args, warm_call = warm_args;
        if (std::string(backend) == "per-group") call.backend = warm_call.backend = GroupedBackend::kPerGroup;
        // A stream of its own: the groups fork from it, as they do in a model.
        cudaStream_t stream = nullptr;
        SCALEMM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        const int allocations = fail_each_allocation_after(
            quiet(),
            [&](Handle& h) {
              if (!warm) return;
              h.grouped_gemm(warm_call, stream);
              SCALEMM_CUDA_CHECK(cudaStreamSynchronize(stream));
            },
            [&](Handle& h) {
              SCALEMM_CUDA_CHECK(cudaMemset(d.p, 0xFF, d.bytes));
              SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());  // the poison lands before the call's stream runs
              h.grouped_gemm(call, stream);
              SCALEMM_CUDA_CHECK(cudaStreamSynchronize(stream));
            },
            [&](Handle& h, const std::string& message) {
              SCALEMM_CUDA_CHECK(cudaStreamSynchronize(stream));
              CHECK(download(d) == std::vector<uint8_t>(d.bytes, 0xFF));  // nothing of D written
              // The message names what was being allocated.
              CHECK((message.find("scalemm scratch") != std::string::npos ||
                     message.find("scalemm staging") != std::string::npos ||
                     message.find("cuBLASLt workspace") != std::string::npos));
              h.grouped_gemm(call, stream);  // the same handle runs the call, exactly
              SCALEMM_CUDA_CHECK(cudaStreamSynchronize(stream));
              std::vector<float> got(in.expected.size());
              SCALEMM_CUDA_CHECK(cudaMemcpy(got.data(), d.p, d.bytes, cudaMemcpyDeviceToHost));
              int64_t bad = 0;
              for (size_t i = 0; i < got.size(); ++i) bad += got[i] != float(in.expected[i]);
              CHECK(bad == 0);
            });
        SCALEMM_CUDA_CHECK(cudaStreamDestroy(stream));
        if (!warm) CHECK(allocations >= 1);  // at least the caller stream's cuBLASLt workspace
      }
  }
}

TEST_CASE("a verification buffer that cannot be allocated raises out-of-memory naming verification, and the "
          "handle stays usable",
          "[gpu][reliability][memory]") {
  auto rng = scalemm::testing::rng(0x0A13);
  DenseCall c(Recipe::kBlock1x128, Recipe::kBlock128x128, 128, 256, 512, rng);
  for (VerifyMode mode : {VerifyMode::kSample, VerifyMode::kFull}) {
    CAPTURE(int(mode));
    bool saw_verify = false;
    const int allocations = fail_each_allocation(
        quiet(std::nullopt, mode),
        [&](Handle& h) {
          SCALEMM_CUDA_CHECK(cudaMemset(c.d.p, 0xFF, c.d.bytes));
          h.gemm(c.args);
          h.check_verification();
        },
        [&](Handle& h, const std::string& message) {
          if (message.find("verify") != std::string::npos) {
            saw_verify = true;
            // Sample mode allocates its buffers before the launch: D untouched. Full mode after it.
            if (mode == VerifyMode::kSample) CHECK(download(c.d) == std::vector<uint8_t>(c.d.bytes, 0xFF));
          }
          h.gemm(c.args);
          h.check_verification();
          SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
        });
    CHECK(allocations >= 2);
    CHECK(saw_verify);
  }
  // The full mode's own buffers: the call ran, its check could not, and the message says what D holds.
  Handle warm(quiet(std::nullopt, VerifyMode::kFull));
  warm.gemm(c.args);  // workspace and scratch exist now: the next allocation is verification's
  SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
  detail::fail_device_allocation(1);
  std::string message;
  try {
    warm.gemm(c.args);
  } catch (const Error& e) {
    CHECK(e.code() == StatusCode::kOutOfMemory);
    message = e.what();
  }
  detail::fail_device_allocation(0);
  CHECK(message.find("SCALEMM_VERIFY=full could not check the call") != std::string::npos);
  CHECK(message.find("verify: ") != std::string::npos);
  CHECK(message.find("unverified") != std::string::npos);
  warm.gemm(c.args);
  SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
}

TEST_CASE("the allocation-failure hook fails exactly the chosen allocation, once", "[reliability][memory]") {
  // Host-side contract of the hook itself (no device needed: the failing allocation never reaches CUDA).
  const int64_t before = detail::failed_device_allocations();
  detail::fail_device_allocation(1);
  void* p = reinterpret_cast<void*>(0x1);
  CHECK(detail::device_malloc(&p, 64) == cudaErrorMemoryAllocation);
  CHECK(p == nullptr);
  CHECK(detail::failed_device_allocations() == before + 1);
  detail::fail_device_allocation(0);
  std::string message;
  try {
    detail::fail_device_allocation(1);
    detail::DeviceBuffer b(4096, -1, "test buffer");
  } catch (const Error& e) {
    CHECK(e.code() == StatusCode::kOutOfMemory);
    message = e.what();
  }
  detail::fail_device_allocation(0);
  CHECK(message.find("test buffer: cudaMalloc of 4096 bytes") != std::string::npos);
}
