// Several GPUs in one process, on real devices. [gpu] cases need one device; [gpu][multi-gpu] cases
// need two and are skipped with that reason otherwise (tests/support/test_main.cpp). The same
// contract on a simulated two-device machine, without a GPU: test_devices_host.cpp.
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "device_buffer.hpp"
#include "grouped_inputs.hpp"
#include "test_operands.hpp"
#include "scalemm/emulation/emulation.hpp"
#include "scalemm/grouped.hpp"
#include "scalemm/scalemm.h"
#include "support/test_support.hpp"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/quantize.hpp"

using namespace scalemm;
using scalemm::testing::HostOperand;

namespace {

struct DeviceGuard {  // makes `d` current for a scope
  int prev = 0;
  explicit DeviceGuard(int d) {
    SCALEMM_CUDA_CHECK(cudaGetDevice(&prev));
    SCALEMM_CUDA_CHECK(cudaSetDevice(d));
  }
  ~DeviceGuard() { cudaSetDevice(prev); }
};

// One dense problem's operands and output on one device.
struct DenseOnDevice {
  std::unique_ptr<testing::Dev> a, sa, b, sb, d;
  GemmArgs args;
  DenseOnDevice(const HostOperand& ha, const HostOperand& hb, int device) {
    DeviceGuard g(device);
    a = std::make_unique<testing::Dev>(ha.data);
    sa = std::make_unique<testing::Dev>(ha.scales);
    b = std::make_unique<testing::Dev>(hb.data);
    sb = std::make_unique<testing::Dev>(hb.scales);
    d = std::make_unique<testing::Dev>(size_t(ha.rows * hb.rows) * 4);
    args.m = ha.rows, args.n = hb.rows, args.k = ha.k;
    args.a = ha.view(), args.b = hb.view();
    args.a.data = a->p, args.a.scale = sa->p, args.b.data = b->p, args.b.scale = sb->p;
    args.d = d->p, args.d_dtype = DType::kF32;
  }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> out(d->bytes);
    SCALEMM_CUDA_CHECK(cudaMemcpy(out.data(), d->p, d->bytes, cudaMemcpyDeviceToHost));
    return out;
  }
};

// One m-grouped problem on one device.
struct GroupedOnDevice {
  std::unique_ptr<testing::Dev> a, sa, b, sb, d;
  GroupedGemmArgs args;
  GroupedOnDevice(const testing::GroupedInputs& in, int device, DType out = DType::kF32) {
    DeviceGuard g(device);
    a = std::make_unique<testing::Dev>(in.a_data);
    sa = std::make_unique<testing::Dev>(in.a_scale);
    b = std::make_unique<testing::Dev>(in.b_data);
    sb = std::make_unique<testing::Dev>(in.b_scale);
    d = std::make_unique<testing::Dev>(in.expected.size() * 4);
    args = in.args(d->p, a->p, sa->p, b->p, sb->p, MemorySpace::kDevice);
    args.d_dtype = out;
  }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> out(d->bytes);
    SCALEMM_CUDA_CHECK(cudaMemcpy(out.data(), d->p, d->bytes, cudaMemcpyDeviceToHost));
    return out;
  }
};

// The calls of one device: dense blockwise, dense MXFP8 (emulated below sm_100), forced emulated
// MXFP8, an m-grouped tensorwise call, and an m-grouped blockwise call whose shape takes the contiguous
// kernel's B-sharing cluster configuration on sm_90 (its resident-cluster count is cached per device).
struct Work {
  DenseOnDevice block, mx, emulated;
  GroupedOnDevice grouped, grouped_block;
  cudaStream_t stream = nullptr;
  int device;
  Work(const HostOperand& ba, const HostOperand& bb, const HostOperand& ma, const HostOperand& mb,
       const testing::GroupedInputs& g, const testing::GroupedInputs& gb, int dev)
      : block(ba, bb, dev), mx(ma, mb, dev), emulated(ma, mb, dev), grouped(g, dev), grouped_block(gb, dev, DType::kBF16),
        device(dev) {
    DeviceGuard guard(dev);
    SCALEMM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  ~Work() {
    DeviceGuard guard(device);
    cudaStreamDestroy(stream);
  }
  void run(Handle& h, Handle& forced_emulated) {
    h.gemm(block.args, stream);
    h.gemm(mx.args, stream);
    forced_emulated.gemm(emulated.args, stream);
    h.grouped_gemm(grouped.args, stream);
    h.grouped_gemm(grouped_block.args, stream);
  }
  std::vector<std::vector<uint8_t>> results() {
    DeviceGuard guard(device);
    SCALEMM_CUDA_CHECK(cudaStreamSynchronize(stream));
    return {block.download(), mx.download(), emulated.download(), grouped.download(), grouped_block.download()};
  }
};

HandleOptions forced(Backend b) {
  HandleOptions o;
  o.plan.force = b;
  return o;
}

struct Inputs {
  HostOperand ba, bb, ma, mb;
  testing::GroupedInputs g, gb;
  Inputs() {
    auto rng = testing::rng(0x2D3F);
    ba = testing::random_operand(Recipe::kBlock1x128, 256, 512, ScaleFormat::kCompact, rng);
    bb = testing::random_operand(Recipe::kBlock128x128, 256, 512, ScaleFormat::kCompact, rng);
    ma = testing::random_operand(Recipe::kMxfp8, 256, 512, ScaleFormat::kCompact, rng);
    mb = testing::random_operand(Recipe::kMxfp8, 256, 512, ScaleFormat::kCompact, rng);
    g = testing::make_grouped(GroupDim::kM, Recipe::kTensorwise, Recipe::kTensorwise, ScaleFormat::kCompact,
                              ScaleFormat::kCompact, {64, 0, 128, 64}, 256, 128, rng);
    // >= 256 rows per group at K >= 4096: wide tiles in clusters sharing B (contiguous_grouped::shared_b);
    // seven M tiles fill less than a wave, so 128 x 160 ones (narrow_tiles), a configuration measured on two GPUs.
    gb = testing::make_grouped(GroupDim::kM, Recipe::kBlock1x128, Recipe::kBlock128x128, ScaleFormat::kCompact,
                               ScaleFormat::kCompact, {512, 0, 384}, 4096, 256, rng);
  }
};

}  // namespace

TEST_CASE("on one GPU a call on a created stream plans for device 0 and names it", "[gpu][dispatch][devices]") {
  int count = 0;
  SCALEMM_CUDA_CHECK(cudaGetDeviceCount(&count));
  REQUIRE(DeviceTarget::all().size() == size_t(count));
  CHECK(DeviceTarget::all().front().ordinal == 0);
  CHECK_THROWS_AS(DeviceTarget::of_device(count), Error);
  DeviceGuard g(0);
  Inputs in;
  Handle h;
  CHECK(h.target().ordinal == 0);
  Work w(in.ba, in.bb, in.ma, in.mb, in.g, in.gb, 0);
  const Plan p = h.plan(w.mx.args, reinterpret_cast<Stream>(w.stream));
  CHECK_THAT(p.explain(), Catch::Contains("planned for device 0: sm_" + std::to_string(DeviceTarget::all()[0].sm)));
  Handle forced_emulated(forced(Backend::kEmulated));
  w.run(h, forced_emulated);
  const auto on_stream = w.results();
  // The same calls on the default stream, through another handle: bit-identical.
  Work again(in.ba, in.bb, in.ma, in.mb, in.g, in.gb, 0);
  Handle h2, f2(forced(Backend::kEmulated));
  const cudaStream_t own = again.stream;
  again.stream = nullptr;
  again.run(h2, f2);
  SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
  again.stream = own;
  CHECK(again.results() == on_stream);
  if (DeviceTarget::all()[0].sm == 90)
    CHECK_THAT(h.explain(w.grouped_block.args), Catch::Contains("clusters of 2 M tiles (B multicast within a group)"));
}

TEST_CASE("one Handle serves streams of device 0 and device 1 from two threads at once, bit-identical to "
          "single-device runs (dense, grouped, emulated)",
          "[gpu][multi-gpu][dispatch][devices]") {
  Inputs in;
  // Single-device runs: a fresh handle per device, one thread.
  std::vector<std::vector<std::vector<uint8_t>>> single;
  for (int dev : {0, 1}) {
    DeviceGuard g(dev);
    Work w(in.ba, in.bb, in.ma, in.mb, in.g, in.gb, dev);
    Handle h, f(forced(Backend::kEmulated));
    w.run(h, f);
    single.push_back(w.results());
  }
  // One handle (and one forced-emulated handle) for both devices, two threads at once, both with
  // device 0 current: thread 1's calls go to device 1 through its stream alone.
  Work w0(in.ba, in.bb, in.ma, in.mb, in.g, in.gb, 0), w1(in.ba, in.bb, in.ma, in.mb, in.g, in.gb, 1);
  Handle shared, shared_emulated(forced(Backend::kEmulated));
  std::string errors[2];
  auto body = [&](Work& w, std::string& error) {
    try {  // no Catch2 assertion off the main thread
      if (cudaSetDevice(0) != cudaSuccess) {
        error = "cudaSetDevice(0) failed";
        return;
      }
      for (int i = 0; i < 20; ++i) w.run(shared, shared_emulated);
    } catch (const std::exception& e) {
      error = e.what();
    }
  };
  std::thread t0(body, std::ref(w0), std::ref(errors[0])), t1(body, std::ref(w1), std::ref(errors[1]));
  t0.join();
  t1.join();
  CHECK(errors[0].empty());
  CHECK(errors[1].empty());
  CAPTURE(errors[0], errors[1]);
  CHECK(w0.results() == single[0]);
  CHECK(w1.results() == single[1]);
  // Each device got a plan of its own (the key holds the device).
  CHECK_THAT(shared.plan(w1.mx.args, reinterpret_cast<Stream>(w1.stream)).explain(),
             Catch::Contains("planned for device 1"));
  CHECK_THAT(shared.plan(w0.mx.args, reinterpret_cast<Stream>(w0.stream)).explain(),
             Catch::Contains("planned for device 0"));
  if (DeviceTarget::of_device(0).sm == DeviceTarget::of_device(1).sm) CHECK(single[0] == single[1]);
  if (DeviceTarget::of_device(1).sm == 90) {  // the B-sharing configuration ran on device 1 too
    DeviceGuard g(1);
    CHECK_THAT(shared.explain(w1.grouped_block.args), Catch::Contains("clusters of 2 M tiles (B multicast within a group)"));
  }
}

TEST_CASE("a handle destroyed while the other device is current frees each device's resources there",
          "[gpu][multi-gpu][serial][dispatch][devices]") {
  Inputs in;
  auto free_on = [](int dev) {
    DeviceGuard g(dev);
    SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
    size_t free = 0, total = 0;
    SCALEMM_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return free;
  };
  Work w0(in.ba, in.bb, in.ma, in.mb, in.g, in.gb, 0), w1(in.ba, in.bb, in.ma, in.mb, in.g, in.gb, 1);
  {  // a first handle loads every kernel module on both devices (lazy loading keeps them resident)
    DeviceGuard g(0);
    Handle warm, warm_emulated(forced(Backend::kEmulated));
    w0.run(warm, warm_emulated);
    w1.run(warm, warm_emulated);
    w0.results();
    w1.results();
  }
  const size_t before0 = free_on(0), before1 = free_on(1);
  {
    DeviceGuard g(0);
    auto h = std::make_unique<Handle>();
    auto f = std::make_unique<Handle>(forced(Backend::kEmulated));
    w0.run(*h, *f);
    w1.run(*h, *f);  // device 0 current, a stream of device 1
    w0.results();
    w1.results();
    // Each device holds at least one 32 MiB cuBLASLt workspace of this handle.
    CHECK(free_on(0) + (size_t(32) << 20) <= before0);
    CHECK(free_on(1) + (size_t(32) << 20) <= before1);
    SCALEMM_CUDA_CHECK(cudaSetDevice(1));
    h.reset();
    f.reset();
    CHECK(cudaGetLastError() == cudaSuccess);
    int current = -1;
    SCALEMM_CUDA_CHECK(cudaGetDevice(&current));
    CHECK(current == 1);  // destruction restores the caller's device
  }
  // Freed on their own devices (4 MiB of slack for the runtime's own allocations, against the 32 MiB
  // workspace each device held).
  CHECK(free_on(0) + (size_t(4) << 20) >= before0);
  CHECK(free_on(1) + (size_t(4) << 20) >= before1);
}

TEST_CASE("device memory of device 1 on a stream of device 0 is refused by name, in C++ and through the C ABI",
          "[gpu][multi-gpu][dispatch][devices]") {
  Inputs in;
  Work w0(in.ba, in.bb, in.ma, in.mb, in.g, in.gb, 0);
  DenseOnDevice on1(in.ma, in.mb, 1);
  GemmArgs args = w0.mx.args;
  args.b.data = on1.args.b.data;  // B of device 1, everything else of device 0
  const std::vector<uint8_t> before = w0.mx.download();
  Handle h;
  try {
    h.gemm(args, reinterpret_cast<Stream>(w0.stream));
    FAIL("a pointer of device 1 ran on device 0");
  } catch (const Error& e) {
    CHECK(e.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(e.what(), Catch::Contains("pointer-device"));
    CHECK_THAT(e.what(), Catch::Contains("b is memory of device 1, but the call runs on device 0"));
  }
  // The default stream with device 1 current: A, scales and D of device 0 are named.
  {
    DeviceGuard g(1);
    try {
      h.gemm(args, nullptr);
      FAIL("pointers of device 0 ran on device 1");
    } catch (const Error& e) {
      CHECK_THAT(e.what(), Catch::Contains("a is memory of device 0, but the call runs on device 1"));
      CHECK_THAT(e.what(), !Catch::Contains("b: b is memory"));  // B is device 1's
    }
  }
  // The C ABI says the same.
  scalemm_handle_t ch = nullptr;
  REQUIRE(scalemm_handle_create(&ch, nullptr) == SCALEMM_STATUS_OK);
  scalemm_gemm_t g{};
  g.struct_size = sizeof(g);
  g.m = args.m, g.n = args.n, g.k = args.k;
  g.a = {args.a.data, int32_t(args.a.dtype), int32_t(args.a.recipe), args.a.scale, int32_t(args.a.scale_format), 1.0f};
  g.b = {args.b.data, int32_t(args.b.dtype), int32_t(args.b.recipe), args.b.scale, int32_t(args.b.scale_format), 1.0f};
  g.d = args.d;
  g.d_dtype = int32_t(args.d_dtype);
  g.alpha = 1.0f;
  g.memory_space = SCALEMM_MEMORY_DEVICE;
  CHECK(scalemm_gemm(ch, &g, w0.stream) == SCALEMM_STATUS_INVALID_ARGUMENT);
  CHECK_THAT(std::string(scalemm_last_error_message()), Catch::Contains("pointer-device"));
  CHECK(scalemm_handle_destroy(ch) == SCALEMM_STATUS_OK);
  SCALEMM_CUDA_CHECK(cudaStreamSynchronize(w0.stream));
  CHECK(w0.mx.download() == before);  // nothing ran
}

namespace {

// Every recipe quantized (both directions; f32 and bf16 sources: the f32 path has the dynamic-shared-
// memory kernel, whose attribute is per device) on a stream of each device in `order`, with the other
// device current, against the host emulator's bytes; then the dense and grouped calls of Work on the
// same devices, against single-device runs. Each case is its own process (ctest), so `order` decides
// which device every per-device cache and attribute meets first.
void every_recipe_on(std::initializer_list<int> order) {
  using namespace scalemm::emulation;
  const int64_t R = 256, C = 384;
  auto rng = testing::rng(0x51D3);
  std::vector<float> x(size_t(R * C));
  for (auto& v : x) v = std::ldexp(float(rng() % 2001) / 1000.0f - 1.0f, int(rng() % 9) - 4);
  std::vector<uint16_t> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &x[i], 4);
    xb[i] = uint16_t(u >> 16);  // truncation: any bf16 will do, the host quantizes the same bits
  }
  Inputs in;
  for (int dev : order) {
    const int other = 1 - dev;
    for (Recipe r : {Recipe::kTensorwise, Recipe::kRowwise, Recipe::kBlock1x128, Recipe::kBlock128x128,
                     Recipe::kMxfp8, Recipe::kMxfp8_32x32, Recipe::kNvfp4})
      for (DType src_dtype : {DType::kF32, DType::kBF16}) {
        INFO("device " << dev << " (device " << other << " current), " << to_string(r) << " from "
                       << to_string(src_dtype));
        QuantizeConfig cfg;
        cfg.recipe = r;
        cfg.rowwise = cfg.columnwise = true;
        if (r == Recipe::kNvfp4) cfg.data_dtype = DType::kE2M1;
        const void* hx = src_dtype == DType::kF32 ? static_cast<const void*>(x.data()) : xb.data();
        const size_t src_bytes = x.size() * (src_dtype == DType::kF32 ? 4 : 2);
        const int64_t db = data_bytes(cfg, R, C);
        const size_t sb = size_t(rowwise_layout(cfg, R, C).bytes()), stb = size_t(columnwise_layout(cfg, R, C).bytes());
        std::vector<uint8_t> hd(static_cast<size_t>(db)), hs(sb), hdt(static_cast<size_t>(db)), hst(stb);
        float hg = 0;
        quantize_host(SourceMatrix{hx, src_dtype, R, C}, cfg, QuantizeOutputs{hd.data(), hs.data(), hdt.data(), hst.data(), &hg});
        std::unique_ptr<testing::Dev> src, d, s, dt, st, g;
        cudaStream_t stream = nullptr;
        {
          DeviceGuard on(dev);
          src = std::make_unique<testing::Dev>(hx, src_bytes);
          d = std::make_unique<testing::Dev>(size_t(db));
          s = std::make_unique<testing::Dev>(sb);
          dt = std::make_unique<testing::Dev>(size_t(db));
          st = std::make_unique<testing::Dev>(stb);
          g = std::make_unique<testing::Dev>(size_t(4));
          SCALEMM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        }
        DeviceGuard current(other);
        scalemm::quantize::quantize(SourceMatrix{src->p, src_dtype, R, C}, cfg,
                        QuantizeOutputs{d->p, s->p, dt->p, st->p, static_cast<float*>(g->p)}, nullptr, 0, stream);
        int now = -1;
        SCALEMM_CUDA_CHECK(cudaGetDevice(&now));
        CHECK(now == other);  // the call restored the caller's device
        SCALEMM_CUDA_CHECK(cudaStreamSynchronize(stream));
        const auto get = [](const testing::Dev& b) {
          std::vector<uint8_t> v(b.bytes);
          SCALEMM_CUDA_CHECK(cudaMemcpy(v.data(), b.p, b.bytes, cudaMemcpyDeviceToHost));
          return v;
        };
        CHECK(get(*d) == hd);
        CHECK(get(*s) == hs);
        CHECK(get(*dt) == hdt);
        CHECK(get(*st) == hst);
        if (r == Recipe::kNvfp4) {
          float gd = 0;
          SCALEMM_CUDA_CHECK(cudaMemcpy(&gd, g->p, 4, cudaMemcpyDeviceToHost));
          CHECK(gd == hg);
        }
        SCALEMM_CUDA_CHECK(cudaStreamDestroy(stream));
      }
    // Dense (native blockwise, MXFP8, forced emulated) and grouped, the other device current.
    std::vector<std::vector<uint8_t>> single;
    {
      DeviceGuard g(0);
      Work w(in.ba, in.bb, in.ma, in.mb, in.g, in.gb, 0);
      Handle h, f(forced(Backend::kEmulated));
      w.run(h, f);
      single = w.results();
    }
    Work w(in.ba, in.bb, in.ma, in.mb, in.g, in.gb, dev);
    DeviceGuard current(other);
    Handle h, f(forced(Backend::kEmulated));
    w.run(h, f);
    if (DeviceTarget::of_device(0).sm == DeviceTarget::of_device(dev).sm) CHECK(w.results() == single);
  }
}

}  // namespace

TEST_CASE("every recipe's quantizer and the dense and grouped calls run on device 1, then device 0, each "
          "with the other device current",
          "[gpu][multi-gpu][dispatch][devices]") {
  every_recipe_on({1, 0});
}

TEST_CASE("every recipe's quantizer and the dense and grouped calls run on device 0, then device 1, each "
          "with the other device current",
          "[gpu][multi-gpu][dispatch][devices]") {
  every_recipe_on({0, 1});
}
