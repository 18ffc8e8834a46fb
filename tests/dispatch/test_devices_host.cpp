// Several GPUs in one process, without a GPU: a Handle on a simulated two-device machine (sm_90 as
// device 0, sm_100 as device 1) plans for the device of each call, keeps the plans of the two devices
// apart, asks each stream's device once, and refuses device memory of another device by name before
// anything runs. The same contract on real devices: test_multi_gpu.cu.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dispatch/devices.hpp"
#include "grouped_inputs.hpp"
#include "test_operands.hpp"
#include "scalemm/grouped.hpp"
#include "support/test_support.hpp"

using namespace scalemm;

namespace {

// Stream handles of the simulated machine: never dereferenced.
const Stream kStream0 = reinterpret_cast<Stream>(uintptr_t(0x5000));
const Stream kStream1 = reinterpret_cast<Stream>(uintptr_t(0x6000));

// Simulated device memory: addresses in [base, base + 1 MiB) belong to device (base >> 24) - 1.
constexpr uintptr_t kDevice0 = uintptr_t(1) << 24, kDevice1 = uintptr_t(2) << 24, kManaged = uintptr_t(3) << 24;
const void* at(uintptr_t base, uintptr_t offset) { return reinterpret_cast<const void*>(base + offset); }

struct Machine {
  int stream_queries = 0;
  std::map<const void*, int> pointer_queries;
  std::map<const void*, int> reused;  // addresses freed and allocated again, on this device
  std::vector<Stream> capturing;      // streams in a graph capture

  dispatch::SimulatedDevices sim(int current = 0) {
    dispatch::SimulatedDevices s;
    s.devices = {DeviceTarget::simulated(90, 130100, 0), DeviceTarget::simulated(100, 130100, 1)};
    s.current = current;
    s.stream_device = [this](Stream st) {
      ++stream_queries;
      return st == kStream1 ? 1 : 0;
    };
    s.capturing = [this](Stream st) { return std::find(capturing.begin(), capturing.end(), st) != capturing.end(); };
    s.pointer = [this](const void* p) {
      ++pointer_queries[p];
      if (auto it = reused.find(p); it != reused.end()) return dispatch::PointerInfo{dispatch::PointerInfo::kDevice, it->second};
      const uintptr_t base = reinterpret_cast<uintptr_t>(p) & ~((uintptr_t(1) << 24) - 1);
      if (base == kDevice0) return dispatch::PointerInfo{dispatch::PointerInfo::kDevice, 0};
      if (base == kDevice1) return dispatch::PointerInfo{dispatch::PointerInfo::kDevice, 1};
      if (base == kManaged) return dispatch::PointerInfo{dispatch::PointerInfo::kAnyDevice, -1};
      return dispatch::PointerInfo{dispatch::PointerInfo::kPageable, -1};
    };
    return s;
  }
};

// An MXFP8 x MXFP8 call (emulated on sm_90, native on sm_100) with every pointer on `base`.
GemmArgs mxfp8_call(uintptr_t base) {
  GemmArgs a;
  a.m = a.n = 256, a.k = 512;
  a.a = {at(base, 0x00000), DType::kE4M3, Recipe::kMxfp8, at(base, 0x40000), ScaleFormat::kCompact, 1.0f};
  a.b = {at(base, 0x80000), DType::kE4M3, Recipe::kMxfp8, at(base, 0xC0000), ScaleFormat::kCompact, 1.0f};
  a.d = const_cast<void*>(at(base, 0xE0000));
  a.d_dtype = DType::kBF16;
  a.space = MemorySpace::kDevice;
  return a;
}

std::string error_of(const std::function<void()>& f, StatusCode* code = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (code) *code = e.code();
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a simulated device describes itself deterministically, with its ordinal", "[dispatch][devices]") {
  CHECK(DeviceTarget::simulated(100, 130100, 1).describe() == "device 1: sm_100 (simulated, 0 SMs), cuBLASLt 13.1.0");
  CHECK(DeviceTarget::simulated(90, 130100).describe() == "sm_90 (simulated, 0 SMs), cuBLASLt 13.1.0");
  CHECK(DeviceTarget::simulated(90, 130100).ordinal == -1);
  CHECK(DeviceTarget::simulated(0, 130100, 3).ordinal == -1);  // no GPU is no device
  const Plan p = plan(GemmProblem::from(mxfp8_call(kDevice0)), DeviceTarget::simulated(100, 130100, 1));
  CHECK_THAT(p.explain(), Catch::EndsWith("\n  planned for device 1: sm_100 (simulated, 0 SMs), cuBLASLt 13.1.0"));
}

TEST_CASE("plans are made for the device of the call and cached per device", "[dispatch][devices]") {
  Machine m;
  Handle h;
  dispatch::simulate_devices(h, m.sim(/*current=*/0));
  const GemmArgs args = mxfp8_call(kDevice0);

  const Plan on0 = h.plan(args, kStream0);
  const Plan on1 = h.plan(args, kStream1);
  CHECK(on0.backend == Backend::kEmulated);  // sm_90: no MXFP8 kernel
  CHECK(on1.backend == Backend::kNative);    // sm_100: VEC32_UE8M0
  CHECK_THAT(on0.explain(), Catch::Contains("planned for device 0: sm_90"));
  CHECK_THAT(on1.explain(), Catch::Contains("planned for device 1: sm_100"));
  // The cache keeps them apart, whichever device asked first.
  CHECK(h.plan(args, kStream0).backend == Backend::kEmulated);
  CHECK(h.plan(args, kStream1).backend == Backend::kNative);
  // The default stream plans for the current device.
  CHECK(h.plan(args).backend == Backend::kEmulated);
  CHECK(h.plan(args, reinterpret_cast<Stream>(uintptr_t(0x2))).backend == Backend::kEmulated);  // per-thread
  CHECK(h.target().ordinal == 0);
  CHECK(h.target().sm == 90);

  Handle h1;
  dispatch::simulate_devices(h1, m.sim(/*current=*/1));
  CHECK(h1.plan(args).backend == Backend::kNative);
  CHECK(h1.plan(args, reinterpret_cast<Stream>(uintptr_t(0x1))).backend == Backend::kNative);  // legacy
  CHECK(h1.target().ordinal == 1);
  CHECK_THAT(h1.plan(args).explain(), Catch::Contains("planned for device 1"));
}

TEST_CASE("a stream's device is asked once, and a plan key holds the device", "[dispatch][devices]") {
  Machine m;
  Handle h;
  dispatch::simulate_devices(h, m.sim());
  const GemmArgs args = mxfp8_call(kDevice0);
  for (int i = 0; i < 5; ++i) {
    h.plan(args, kStream0);
    h.plan(args, kStream1);
    h.plan(args);  // the default stream is never asked: it is the current device's
  }
  CHECK(m.stream_queries == 2);

  dispatch::PlanKey k0{GemmProblem::from(args), 0}, k1{GemmProblem::from(args), 1};
  CHECK_FALSE(k0 == k1);
  CHECK(k0 == dispatch::PlanKey{GemmProblem::from(args), 0});
  CHECK(dispatch::PlanKeyHash{}(k0) != dispatch::PlanKeyHash{}(k1));
  CHECK(dispatch::is_default_stream(nullptr));
  CHECK(dispatch::is_default_stream(reinterpret_cast<Stream>(uintptr_t(0x1))));
  CHECK(dispatch::is_default_stream(reinterpret_cast<Stream>(uintptr_t(0x2))));
  CHECK_FALSE(dispatch::is_default_stream(kStream0));
}

TEST_CASE("the pointer-device error names the argument, both devices and the fix", "[dispatch][devices]") {
  const Diagnostic d = dispatch::pointer_device_mismatch("scale_b", 1, 0);
  CHECK(d.argument == "scale_b");
  CHECK(d.rule == "pointer-device");
  CHECK(d.expected == "memory of device 0");
  CHECK(d.actual == "memory of device 1");
  CHECK_THAT(d.message, Catch::Contains("scale_b is memory of device 1, but the call runs on device 0"));
  CHECK_THAT(d.fix, Catch::Contains("stream of device 1"));
  CHECK_THAT(d.fix, Catch::Contains("copy scale_b to device 0"));
}

TEST_CASE("device memory of another device than the stream's is refused by name before anything runs",
          "[dispatch][devices]") {
  Machine m;
  Handle h;
  dispatch::simulate_devices(h, m.sim());
  StatusCode code = StatusCode::kOk;

  SECTION("one operand on the other device") {
    GemmArgs args = mxfp8_call(kDevice0);
    args.a.data = at(kDevice1, 0);
    const std::string e = error_of([&] { h.gemm(args, kStream0); }, &code);
    CHECK(code == StatusCode::kInvalidArgument);
    CHECK_THAT(e, Catch::Contains("pointer-device"));
    CHECK_THAT(e, Catch::Contains("a is memory of device 1, but the call runs on device 0"));
    CHECK_THAT(e, Catch::Contains("memory of device 0"));
    // Asked once per address: a second call asks again only for the refused one.
    const std::string again = error_of([&] { h.gemm(args, kStream0); });
    CHECK(again == e);
    CHECK(m.pointer_queries[args.a.scale] == 1);
    CHECK(m.pointer_queries[args.d] == 1);
    CHECK(m.pointer_queries[args.a.data] == 2);
  }
  SECTION("every pointer of device 1 on a stream of device 0: each one named") {
    const GemmArgs args = mxfp8_call(kDevice1);
    const std::string e = error_of([&] { h.gemm(args, kStream0); }, &code);
    CHECK(code == StatusCode::kInvalidArgument);
    for (const char* name : {"a is", "scale_a is", "b is", "scale_b is", "d is"}) CHECK_THAT(e, Catch::Contains(name));
  }
  SECTION("the default stream runs on the current device") {
    const std::string e = error_of([&] { h.gemm(mxfp8_call(kDevice1)); }, &code);
    CHECK(code == StatusCode::kInvalidArgument);
    CHECK_THAT(e, Catch::Contains("but the call runs on device 0"));
  }
  SECTION("an address once seen on device 0 is refused on a stream of device 1") {
    GemmArgs args = mxfp8_call(kDevice1);
    args.d = const_cast<void*>(at(kDevice0, 0xE0000));
    const std::string e = error_of([&] { h.gemm(args, kStream1); });
    CHECK_THAT(e, Catch::Contains("d is memory of device 0, but the call runs on device 1"));
    CHECK_THAT(e, !Catch::Contains("a is"));
    // The same d, now on a stream of device 0 with the rest of device 1: the others are named.
    const std::string f = error_of([&] { h.gemm(args, kStream0); });
    CHECK_THAT(f, Catch::Contains("a is memory of device 1, but the call runs on device 0"));
    CHECK_THAT(f, !Catch::Contains("d is"));
  }
  SECTION("managed memory is readable from every device and not refused") {
    GemmArgs args = mxfp8_call(kDevice0);
    args.a.data = at(kManaged, 0);
    args.b.data = at(kDevice1, 0x80000);
    const std::string e = error_of([&] { h.gemm(args, kStream0); });
    CHECK_THAT(e, Catch::Contains("b is memory of device 1"));
    CHECK_THAT(e, !Catch::Contains("a is"));
  }
}

TEST_CASE("during a graph capture nothing is asked, and a stale record of another device is not refused",
          "[dispatch][devices]") {
  // Caching allocators give memory back to CUDA: an address recorded as device 0's can come back as
  // device 1's. A capture asks CUDA nothing, so the record cannot be checked there: the address is
  // left unchecked (as a new one is) and its record dropped; outside the capture it is asked again.
  Machine m;
  Handle h;
  dispatch::simulate_devices(h, m.sim());
  GemmArgs on0 = mxfp8_call(kDevice0);
  const void* p = on0.a.data;
  CHECK_THAT(error_of([&] { h.gemm(on0, kStream0); }), Catch::Contains("simulated machine"));  // recorded: device 0
  REQUIRE(m.pointer_queries[p] == 1);
  m.reused[p] = 1;  // freed, then allocated again on device 1
  GemmArgs on1 = mxfp8_call(kDevice1);
  on1.a.data = p;
  const void* fresh = at(kDevice1, 0xF0000);
  on1.d = const_cast<void*>(fresh);  // never seen before
  m.capturing = {kStream1};
  // Past the checks a simulated machine refuses to run (the same on a machine with a GPU).
  CHECK_THAT(error_of([&] { h.gemm(on1, kStream1); }), Catch::Contains("simulated machine") && !Catch::Contains("pointer-"));
  CHECK(m.pointer_queries[p] == 1);   // not asked while capturing
  CHECK(m.pointer_queries.count(fresh) == 0);
  m.capturing.clear();
  CHECK_THAT(error_of([&] { h.gemm(on1, kStream1); }), Catch::Contains("simulated machine") && !Catch::Contains("pointer-"));
  CHECK(m.pointer_queries[p] == 2);   // asked again: device 1's now
  CHECK(m.pointer_queries[fresh] == 1);
  // Outside a capture a pointer of the wrong device is still refused (a new handle: nothing recorded).
  m.reused[p] = 0;
  Handle h2;
  dispatch::simulate_devices(h2, m.sim());
  CHECK_THAT(error_of([&] { h2.gemm(on1, kStream1); }),
             Catch::Contains("a is memory of device 0, but the call runs on device 1"));
}

TEST_CASE("a grouped call with a tensor on another device is refused before any group runs",
          "[dispatch][devices][grouped]") {
  Machine m;
  Handle h;
  dispatch::simulate_devices(h, m.sim());
  const int64_t sizes[] = {128, 0, 128};
  GroupedGemmArgs g;
  g.group_dim = GroupDim::kM;
  g.groups = 3;
  g.group_sizes = sizes;
  g.m = 256, g.n = 256, g.k = 512;
  g.a = {at(kDevice0, 0x00000), DType::kE4M3, Recipe::kMxfp8, at(kDevice0, 0x40000), ScaleFormat::kCompact, 1.0f};
  g.b = {at(kDevice1, 0x00000), DType::kE4M3, Recipe::kMxfp8, at(kDevice0, 0x80000), ScaleFormat::kCompact, 1.0f};
  g.d = const_cast<void*>(at(kDevice0, 0xC0000));
  g.d_dtype = DType::kBF16;
  g.space = MemorySpace::kDevice;
  StatusCode code = StatusCode::kOk;
  std::string e = error_of([&] { h.grouped_gemm(g, kStream0); }, &code);
  CHECK(code == StatusCode::kInvalidArgument);
  CHECK_THAT(e, Catch::Contains("b is memory of device 1, but the call runs on device 0"));
  g.group_dim = GroupDim::kK;
  g.m = 256, g.k = 512;
  const int64_t ksizes[] = {256, 0, 256};
  g.group_sizes = ksizes;
  e = error_of([&] { h.grouped_gemm(g, kStream0); }, &code);
  CHECK(code == StatusCode::kInvalidArgument);
  CHECK_THAT(e, Catch::Contains("b is memory of device 1, but the call runs on device 0"));
  // Every group's plan is made for the device of the call.
  g.group_dim = GroupDim::kM;
  g.group_sizes = sizes;
  CHECK_THAT(h.explain(g), Catch::Contains("planned for device 0: sm_90"));
}

TEST_CASE("host calls on a simulated two-device machine run the host reference, planned per device",
          "[dispatch][devices]") {
  Machine m;
  auto rng = scalemm::testing::rng(0xDE71);
  const auto a = scalemm::testing::exact_operand(Recipe::kMxfp8, 4, 64, ScaleFormat::kCompact, rng);
  const auto b = scalemm::testing::exact_operand(Recipe::kMxfp8, 8, 64, ScaleFormat::kCompact, rng);
  GemmArgs args;
  args.m = 4, args.n = 8, args.k = 64;
  args.a = a.view(), args.b = b.view();
  args.d_dtype = DType::kF32;
  args.space = MemorySpace::kHost;
  std::vector<float> d0(32, -1.0f), d1(32, -2.0f);
  Handle h;
  dispatch::simulate_devices(h, m.sim());
  args.d = d0.data();
  h.gemm(args, kStream0);
  args.d = d1.data();
  h.gemm(args, kStream1);
  CHECK(d0 == d1);  // the host reference, whatever the device
  CHECK_THAT(h.plan(args, kStream1).explain(), Catch::Contains("planned for device 1"));
  CHECK(h.plan(args, kStream1).backend == Backend::kReference);
}

TEST_CASE("per-device values are made once per device, apart from each other, and again after a failure",
          "[dispatch][devices]") {
  // The cache behind kernel attributes, occupancies and SM counts (scalemm/detail/device_state.hpp):
  // CUDA keeps a function's attributes per device, so a value set for device 0 must not stand for
  // device 1 (the quantizer's shared-memory limit once did).
  scalemm::detail::PerDevice<int, 4> cache;
  std::map<int, int> made;
  auto make = [&](int d) {
    ++made[d];
    return 100 + d;
  };
  CHECK(cache.get(1, make) == 101);
  CHECK(cache.get(0, make) == 100);
  CHECK(cache.get(1, make) == 101);
  CHECK(cache.get(0, make) == 100);
  CHECK(made == std::map<int, int>{{0, 1}, {1, 1}});
  // Ordinals past the table are computed every time, never mixed into a slot.
  CHECK(cache.get(7, make) == 107);
  CHECK(cache.get(7, make) == 107);
  CHECK(made[7] == 2);
  // A failed make leaves the slot empty: the next call tries again.
  int calls = 0;
  auto failing = [&](int) -> int {
    if (++calls == 1) throw Error(StatusCode::kCudaError, "first try fails");
    return 42;
  };
  CHECK_THROWS_AS(cache.get(2, failing), Error);
  CHECK(cache.get(2, failing) == 42);
  CHECK(cache.get(2, failing) == 42);
  CHECK(calls == 2);
}
