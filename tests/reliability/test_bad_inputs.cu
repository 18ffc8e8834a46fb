// The bad-input catalogue (docs/reliability.md): every named precondition violation of the C++ API and
// the C ABI, one table row each. A row breaks one valid call in one way; the harness checks that the
// call returns the row's status (no crash, no other status), that the message names the argument and
// holds the row's substrings (the rule, the expected and the actual value), that the output, poisoned
// beforehand, is untouched, and, for device rows, that no CUDA error is pending or sticky afterwards.
// Host rows run everywhere; device rows ([gpu]) need a CUDA device.
//
// `test_reliability "[.catalogue]"` prints the table as Markdown for docs/reliability.md.
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "dispatch/device_buffer.hpp"
#include "dispatch/test_operands.hpp"
#include "scalemm/emulation/emulation.hpp"
#include "scalemm/gemm.hpp"
#include "scalemm/layouts/validate.hpp"
#include "scalemm/scalemm.h"
#include "scalemm/detail/cuda_check.hpp"

using namespace scalemm;
using scalemm::testing::Dev;
using scalemm::testing::HostOperand;

namespace {

constexpr size_t kOutBytes = 64 * 128 * 4;  // room for the largest output of any row (f32 64 x 128)

// A valid call, in host or device memory, with a poisoned output; rows break a copy of `base`.
struct Ctx {
  bool device = false;
  std::mt19937_64 rng{0xBAD1};
  std::deque<HostOperand> host_ops;
  std::deque<std::unique_ptr<Dev>> dev;
  std::vector<uint8_t> d_host = std::vector<uint8_t>(kOutBytes, 0xFF);
  std::vector<uint8_t> d_alt = std::vector<uint8_t>(kOutBytes, 0xFF);  // a host output for device rows
  void* d = nullptr;
  float* scal = nullptr;  // two aligned floats (d_scale, d_amax) in the call's memory space
  float host_scal[4] = {1.0f, 0.0f, 0.0f, 0.0f};
  GemmArgs base;

  explicit Ctx(bool on_device) : device(on_device) {
    if (device) {
      dev.push_back(std::make_unique<Dev>(kOutBytes));
      d = dev.back()->p;
      dev.push_back(std::make_unique<Dev>(host_scal, sizeof(host_scal)));
      scal = dev.back()->as<float>();
    } else {
      d = d_host.data();
      scal = host_scal;
    }
    base.m = 32, base.n = 64, base.k = 256;
    base.a = operand(Recipe::kBlock1x128, 32, 256);
    base.b = operand(Recipe::kBlock128x128, 64, 256);
    base.d = d;
    base.d_dtype = DType::kBF16;
    base.space = device ? MemorySpace::kDevice : MemorySpace::kHost;
    poison();
  }

  // A valid operand in this context's memory space (the host copy stays in host_ops).
  GemmOperand operand(Recipe r, int64_t rows, int64_t k, ScaleFormat f = ScaleFormat::kCompact) {
    host_ops.push_back(scalemm::testing::exact_operand(r, rows, k, f, rng));
    const HostOperand& h = host_ops.back();
    GemmOperand op = h.view();
    if (device) {
      // 32 spare bytes: rows may shift a pointer off its alignment without leaving the allocation.
      dev.push_back(std::make_unique<Dev>(h.data.size() + 32));
      SCALEMM_CUDA_CHECK(cudaMemcpy(dev.back()->p, h.data.data(), h.data.size(), cudaMemcpyHostToDevice));
      op.data = dev.back()->p;
      dev.push_back(std::make_unique<Dev>(h.scales.size() + 32));
      SCALEMM_CUDA_CHECK(cudaMemcpy(dev.back()->p, h.scales.data(), h.scales.size(), cudaMemcpyHostToDevice));
      op.scale = dev.back()->p;
    }
    return op;
  }
  // A host copy of an operand (pageable memory), whatever the context.
  const HostOperand& host_operand(Recipe r, int64_t rows, int64_t k, ScaleFormat f = ScaleFormat::kCompact) {
    host_ops.push_back(scalemm::testing::exact_operand(r, rows, k, f, rng));
    return host_ops.back();
  }
  // A device buffer of `bytes` (device rows only).
  void* device_buffer(size_t bytes) {
    dev.push_back(std::make_unique<Dev>(bytes));
    SCALEMM_CUDA_CHECK(cudaMemset(dev.back()->p, 0xFF, bytes));
    return dev.back()->p;
  }

  void poison() {
    std::memset(d_host.data(), 0xFF, kOutBytes);
    std::memset(d_alt.data(), 0xFF, kOutBytes);
    if (device) {
      SCALEMM_CUDA_CHECK(cudaMemset(d, 0xFF, kOutBytes));
      SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
    }
  }
  bool untouched() {
    std::vector<uint8_t> out = d_host;
    if (device) SCALEMM_CUDA_CHECK(cudaMemcpy(out.data(), d, kOutBytes, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < kOutBytes; ++i)
      if (out[i] != 0xFF || d_alt[i] != 0xFF || d_host[i] != 0xFF) return false;
    return true;
  }
};

Status capture(const std::function<void()>& f) {
  try {
    f();
    return {};
  } catch (const Error& e) {
    return e.status();
  } catch (const std::exception& e) {
    return {StatusCode::kInternal, std::string("a non-scalemm exception: ") + e.what()};
  }
}

Status cpp_gemm(const GemmArgs& x, PlanOptions po = {}) {
  HandleOptions ho;
  ho.plan = po;
  ho.verify = VerifyMode::kOff;
  return capture([&] {
    Handle h(ho);
    h.gemm(x, nullptr);
  });
}

scalemm_gemm_t to_c(const GemmArgs& x) {
  scalemm_gemm_t g;
  std::memset(&g, 0, sizeof(g));
  g.struct_size = sizeof(g);
  g.m = x.m, g.n = x.n, g.k = x.k;
  g.a = {x.a.data, int32_t(x.a.dtype), int32_t(x.a.recipe), x.a.scale, int32_t(x.a.scale_format), x.a.global_scale};
  g.b = {x.b.data, int32_t(x.b.dtype), int32_t(x.b.recipe), x.b.scale, int32_t(x.b.scale_format), x.b.global_scale};
  g.d = x.d;
  g.d_dtype = int32_t(x.d_dtype);
  g.bias = x.bias;
  g.alpha = x.alpha;
  g.memory_space = int32_t(x.space);
  g.d_scale = x.d_scale;
  g.d_amax = x.d_amax;
  return g;
}

Status from_c(int rc) { return {StatusCode(rc), rc ? scalemm_last_error_message() : ""}; }

Status c_gemm(const scalemm_gemm_t& g, int strict = 0, int force = -1) {
  scalemm_handle_options_t o;
  std::memset(&o, 0, sizeof(o));
  o.struct_size = sizeof(o);
  o.strict = strict;
  o.force_backend = force;
  o.autotune = 1;
  scalemm_handle_t h = nullptr;
  const int created = scalemm_handle_create(&h, &o);
  if (created != SCALEMM_STATUS_OK) return from_c(created);
  const Status s = from_c(scalemm_gemm(h, &g, nullptr));  // read the message before destroy clears it
  scalemm_handle_destroy(h);
  return s;
}

Status validate_scale_of(const HostOperand& h, const char* arg, layouts::ValidateOptions opt = {}) {
  TensorRef t;
  t.data = const_cast<uint8_t*>(h.scales.data());
  const auto l = h.layout();
  t.dtype = l.scale_dtype();
  t.rank = 1;
  t.shape[0] = l.size();
  t.strides[0] = 1;
  t.space = MemorySpace::kHost;
  return capture([&] { throw_if_any(layouts::validate_scale(t, l, arg, opt)); });
}

void put_f32(HostOperand& h, int64_t index, float v) { std::memcpy(h.scales.data() + index * 4, &v, 4); }

Status quantize(Recipe r, DType dt, int64_t rows, int64_t cols, bool null_data = false, DType src_dtype = DType::kF32) {
  std::vector<float> src(size_t(std::max<int64_t>(rows * cols, 1)), 1.0f);
  emulation::QuantizeConfig cfg;
  cfg.recipe = r;
  cfg.data_dtype = dt;
  std::vector<uint8_t> data(size_t(std::max<int64_t>(rows * cols, 1))), scales(4096);
  float gs = 0.0f;
  emulation::QuantizeOutputs out;
  out.data = null_data ? nullptr : data.data();
  out.scales = scales.data();
  out.global_scale = &gs;
  return capture([&] { emulation::quantize_host({src.data(), src_dtype, rows, cols}, cfg, out); });
}

struct Row {
  const char* name;
  const char* api;
  StatusCode status;
  std::vector<std::string> contains;  // the argument first, then the rule / expected / actual
  const char* checks;
  std::function<Status(Ctx&)> run;
  bool skip_on_native_mx = false;  // a row about sm_90's missing native MX path: skipped on sm_100+
};

constexpr auto kArg = StatusCode::kInvalidArgument;
constexpr auto kLayout = StatusCode::kInvalidLayout;
constexpr auto kUnsup = StatusCode::kUnsupported;
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// Rows shared by the host and the device tables: they break the call the same way in either space.
std::vector<Row> common_rows(const char* api) {
  std::vector<Row> r;
  auto gemm = [](std::function<void(Ctx&, GemmArgs&)> edit, PlanOptions po = {}) {
    return [edit, po](Ctx& c) {
      GemmArgs x = c.base;
      edit(c, x);
      return cpp_gemm(x, po);
    };
  };
  r.push_back({"M = 0", api, kArg, {"m", "expected >= 1, got 0", "positive-extent"}, "extent",
               gemm([](Ctx&, GemmArgs& x) { x.m = 0; })});
  r.push_back({"N negative", api, kArg, {"n", "got -5"}, "extent", gemm([](Ctx&, GemmArgs& x) { x.n = -5; })});
  r.push_back({"K = 0", api, kArg, {"k", "expected >= 1"}, "extent", gemm([](Ctx&, GemmArgs& x) { x.k = 0; })});
  r.push_back({"M*K overflows the 64-bit offsets", api, kArg, {"m", "extent-overflow", "2^50"}, "extent",
               gemm([](Ctx&, GemmArgs& x) { x.m = int64_t(1) << 40, x.k = int64_t(1) << 30; })});
  r.push_back({"A data dtype f32", api, kArg, {"a", "data-dtype", "got f32"}, "dtype",
               gemm([](Ctx&, GemmArgs& x) { x.a.dtype = DType::kF32; })});
  r.push_back({"B data dtype e8m0 (a scale type)", api, kArg, {"b", "data-dtype", "got e8m0"}, "dtype",
               gemm([](Ctx&, GemmArgs& x) { x.b.dtype = DType::kE8M0; })});
  r.push_back({"A e2m1 data with a block1x128 recipe", api, kArg, {"a", "recipe-dtype", "got e2m1"}, "dtype/recipe",
               gemm([](Ctx&, GemmArgs& x) { x.a.dtype = DType::kE2M1; })});
  r.push_back({"B nvfp4 recipe with e4m3 data", api, kArg, {"b", "recipe-dtype", "expected e2m1"}, "dtype/recipe",
               gemm([](Ctx& c, GemmArgs& x) {
                 x.a = c.operand(Recipe::kNvfp4, 32, 256);
                 x.b = c.operand(Recipe::kNvfp4, 64, 256);
                 x.b.dtype = DType::kE4M3;
               })});
  r.push_back({"nvfp4 with odd K", api, kArg, {"k", "fp4-k-even", "got 255"}, "shape",
               gemm([](Ctx& c, GemmArgs& x) {
                 x.a = c.operand(Recipe::kNvfp4, 32, 256);
                 x.b = c.operand(Recipe::kNvfp4, 64, 256);
                 x.k = 255;
               })});
  r.push_back({"A data null", api, kArg, {"a", "null-pointer", "got nullptr"}, "null pointer",
               gemm([](Ctx&, GemmArgs& x) { x.a.data = nullptr; })});
  r.push_back({"B data null", api, kArg, {"b", "null-pointer"}, "null pointer",
               gemm([](Ctx&, GemmArgs& x) { x.b.data = nullptr; })});
  r.push_back({"scale_a null", api, kArg, {"scale_a", "scale-null"}, "null pointer",
               gemm([](Ctx&, GemmArgs& x) { x.a.scale = nullptr; })});
  r.push_back({"scale_b null", api, kArg, {"scale_b", "scale-null"}, "null pointer",
               gemm([](Ctx&, GemmArgs& x) { x.b.scale = nullptr; })});
  r.push_back({"D null", api, kArg, {"d", "null-pointer"}, "null pointer",
               gemm([](Ctx&, GemmArgs& x) { x.d = nullptr; })});
  r.push_back({"cuBLASLt-format scale_b 4 bytes past 16-byte alignment", api, kArg,
               {"scale_b", "scale-alignment-16", "4 mod 16"}, "scale alignment",
               gemm([](Ctx& c, GemmArgs& x) {
                 x.b = c.operand(Recipe::kBlock128x128, 64, 256, ScaleFormat::kCublasLt);
                 x.b.scale = static_cast<const char*>(x.b.scale) + 4;
               })});
  r.push_back({"output dtype e2m1", api, kArg, {"d_dtype", "out-dtype", "got e2m1"}, "dtype",
               gemm([](Ctx&, GemmArgs& x) { x.d_dtype = DType::kE2M1; })});
  r.push_back({"output dtype u8", api, kArg, {"d_dtype", "got u8"}, "dtype",
               gemm([](Ctx&, GemmArgs& x) { x.d_dtype = DType::kU8; })});
  r.push_back({"FP8 output without d_scale", api, kArg, {"d_scale", "fp8-out-d-scale", "got nullptr"}, "null pointer",
               gemm([](Ctx&, GemmArgs& x) { x.d_dtype = DType::kE4M3; })});
  r.push_back({"d_scale with bf16 output", api, kArg, {"d_scale", "d-scale-without-fp8-out"}, "dtype",
               gemm([](Ctx& c, GemmArgs& x) { x.d_scale = c.scal; })});
  r.push_back({"d_amax with f32 output", api, kArg, {"d_amax", "d-scale-without-fp8-out"}, "dtype",
               gemm([](Ctx& c, GemmArgs& x) {
                 x.d_dtype = DType::kF32;
                 x.d_amax = c.scal + 1;
               })});
  r.push_back({"d_scale not 4-byte aligned", api, kArg, {"d_scale", "scalar-alignment", "1 bytes past 4"}, "alignment",
               gemm([](Ctx& c, GemmArgs& x) {
                 x.d_dtype = DType::kE4M3;
                 x.d_scale = reinterpret_cast<const float*>(reinterpret_cast<const char*>(c.scal) + 1);
               })});
  r.push_back({"d_amax not 4-byte aligned", api, kArg, {"d_amax", "scalar-alignment", "2 bytes past 4"}, "alignment",
               gemm([](Ctx& c, GemmArgs& x) {
                 x.d_dtype = DType::kE5M2;
                 x.d_scale = c.scal;
                 x.d_amax = reinterpret_cast<float*>(reinterpret_cast<char*>(c.scal) + 6);
               })});
  r.push_back({"alpha NaN", api, kArg, {"alpha", "finite-alpha", "got nan"}, "non-finite scalar",
               gemm([](Ctx&, GemmArgs& x) { x.alpha = kNaN; })});
  r.push_back({"alpha -Inf", api, kArg, {"alpha", "finite-alpha"}, "non-finite scalar",
               gemm([](Ctx&, GemmArgs& x) { x.alpha = -kInf; })});
  auto nvfp4 = [](float ga, float gb) {
    return [ga, gb](Ctx& c, GemmArgs& x) {
      x.a = c.operand(Recipe::kNvfp4, 32, 256);
      x.b = c.operand(Recipe::kNvfp4, 64, 256);
      x.a.global_scale = ga;
      x.b.global_scale = gb;
    };
  };
  r.push_back({"nvfp4 global scale 0", api, kArg, {"a", "global-scale", "expected > 0 and finite"}, "non-positive scale",
               gemm(nvfp4(0.0f, 1.0f))});
  r.push_back({"nvfp4 global scale negative", api, kArg, {"b", "global-scale", "got -2"}, "non-positive scale",
               gemm(nvfp4(1.0f, -2.0f))});
  r.push_back({"nvfp4 global scale NaN", api, kArg, {"b", "global-scale", "got nan"}, "non-finite scale",
               gemm(nvfp4(1.0f, kNaN))});
  r.push_back({"nvfp4 global scale +Inf", api, kArg, {"a", "global-scale", "got inf"}, "non-finite scale",
               gemm(nvfp4(kInf, 1.0f))});
  r.push_back({"recipe value 0 (outside the enum)", api, kArg, {"a", "recipe-enum", "got 0"}, "enum",
               gemm([](Ctx&, GemmArgs& x) { x.a.recipe = Recipe(0); })});
  r.push_back({"recipe value 42 (outside the enum)", api, kArg, {"b", "recipe-enum", "got 42"}, "enum",
               gemm([](Ctx&, GemmArgs& x) { x.b.recipe = Recipe(42); })});
  r.push_back({"scale format value 9", api, kArg, {"a", "scale-format-enum", "got 9"}, "enum",
               gemm([](Ctx&, GemmArgs& x) { x.a.scale_format = ScaleFormat(9); })});
  r.push_back({"memory space value 7", api, kArg, {"space", "memory-space-enum", "got 7"}, "enum",
               gemm([](Ctx&, GemmArgs& x) { x.space = MemorySpace(7); })});
  r.push_back({"two violations at once (A null, scale_b null)", api, kArg, {"a: data pointer is null", "scale_b"},
               "every diagnostic reported", gemm([](Ctx&, GemmArgs& x) { x.a.data = nullptr, x.b.scale = nullptr; })});
  PlanOptions strict;
  strict.strict = true;
  r.push_back({"strict mode, a pair no native path runs (tensorwise x block128x128)", api, kUnsup,
               {"in strict mode", "tensorwise", "block128x128"}, "unsupported recipe pair",
               gemm([](Ctx& c, GemmArgs& x) { x.a = c.operand(Recipe::kTensorwise, 32, 256); }, strict)});
  PlanOptions native;
  native.force = Backend::kNative;
  r.push_back({"native forced on an unsupported pair (rowwise x block128x128)", api, kUnsup,
               {"forced to native", "rowwise"}, "unsupported recipe pair",
               gemm([](Ctx& c, GemmArgs& x) { x.a = c.operand(Recipe::kRowwise, 32, 256); }, native)});
  PlanOptions convert;
  convert.force = Backend::kConvertNative;
  r.push_back({"convert-native forced on an unsupported pair (tensorwise x block128x128)", api, kUnsup,
               {"forced to convert-native"}, "unsupported recipe pair",
               gemm([](Ctx& c, GemmArgs& x) { x.a = c.operand(Recipe::kTensorwise, 32, 256); }, convert)});
  return r;
}

// C ABI rows that break the same calls through scalemm_gemm (both spaces).
std::vector<Row> c_rows(const char* api) {
  std::vector<Row> r;
  auto cg = [](std::function<void(Ctx&, scalemm_gemm_t&)> edit, int strict = 0, int force = -1) {
    return [edit, strict, force](Ctx& c) {
      scalemm_gemm_t g = to_c(c.base);
      edit(c, g);
      return c_gemm(g, strict, force);
    };
  };
  r.push_back({"C: M = 0", api, kArg, {"m", "expected >= 1, got 0"}, "extent",
               cg([](Ctx&, scalemm_gemm_t& g) { g.m = 0; })});
  r.push_back({"C: scale_a null", api, kArg, {"scale_a", "scale-null"}, "null pointer",
               cg([](Ctx&, scalemm_gemm_t& g) { g.a.scale = nullptr; })});
  r.push_back({"C: D null", api, kArg, {"d", "null-pointer"}, "null pointer",
               cg([](Ctx&, scalemm_gemm_t& g) { g.d = nullptr; })});
  r.push_back({"C: a.dtype 99", api, kArg, {"gemm.a.dtype", "value 99 is outside the enum"}, "enum",
               cg([](Ctx&, scalemm_gemm_t& g) { g.a.dtype = 99; })});
  r.push_back({"C: b.recipe 0", api, kArg, {"gemm.b.recipe", "value 0 is outside the enum [1, 7]"}, "enum",
               cg([](Ctx&, scalemm_gemm_t& g) { g.b.recipe = 0; })});
  r.push_back({"C: a.scale_format 2", api, kArg, {"gemm.a.scale_format", "value 2"}, "enum",
               cg([](Ctx&, scalemm_gemm_t& g) { g.a.scale_format = 2; })});
  r.push_back({"C: d_dtype -1", api, kArg, {"gemm.d_dtype", "value -1"}, "enum",
               cg([](Ctx&, scalemm_gemm_t& g) { g.d_dtype = -1; })});
  r.push_back({"C: memory_space 2", api, kArg, {"gemm.memory_space", "value 2"}, "enum",
               cg([](Ctx&, scalemm_gemm_t& g) { g.memory_space = 2; })});
  r.push_back({"C: struct_size 0", api, kArg, {"gemm.struct_size", "set it to sizeof(scalemm_gemm_t)"}, "struct version",
               cg([](Ctx&, scalemm_gemm_t& g) { g.struct_size = 0; })});
  r.push_back({"C: FP8 output with a 0.1 struct_size (d_scale not read)", api, kArg, {"d_scale", "fp8-out-d-scale"},
               "struct version",
               cg([](Ctx& c, scalemm_gemm_t& g) {
                 g.struct_size = offsetof(scalemm_gemm_t, memory_space) + sizeof(int32_t);
                 g.d_dtype = SCALEMM_DTYPE_E4M3;
                 g.d_scale = c.scal;  // present, but outside the declared struct
               })});
  r.push_back({"C: nvfp4 global scale NaN", api, kArg, {"a", "global-scale"}, "non-finite scale",
               cg([](Ctx& c, scalemm_gemm_t& g) {
                 GemmArgs x = c.base;
                 x.a = c.operand(Recipe::kNvfp4, 32, 256);
                 x.b = c.operand(Recipe::kNvfp4, 64, 256);
                 x.a.global_scale = kNaN;
                 g = to_c(x);
               })});
  r.push_back({"C: strict mode, tensorwise x block128x128", api, kUnsup, {"in strict mode"}, "unsupported recipe pair",
               cg([](Ctx& c, scalemm_gemm_t& g) {
                 GemmArgs x = c.base;
                 x.a = c.operand(Recipe::kTensorwise, 32, 256);
                 g = to_c(x);
               }, 1)});
  r.push_back({"C: native forced, rowwise x block128x128", api, kUnsup, {"forced to native"}, "unsupported recipe pair",
               cg([](Ctx& c, scalemm_gemm_t& g) {
                 GemmArgs x = c.base;
                 x.a = c.operand(Recipe::kRowwise, 32, 256);
                 g = to_c(x);
               }, 0, SCALEMM_BACKEND_NATIVE)});
  r.push_back({"C: plan_explain with K = 0", api, kArg, {"k", "expected >= 1"}, "extent", [](Ctx& c) {
                 scalemm_handle_t h = nullptr;
                 REQUIRE(scalemm_handle_create(&h, nullptr) == SCALEMM_STATUS_OK);
                 scalemm_gemm_t g = to_c(c.base);
                 g.k = 0;
                 char buf[64];
                 int32_t backend = -1;
                 const Status s = from_c(scalemm_plan_explain(h, &g, &backend, buf, sizeof(buf), nullptr));
                 scalemm_handle_destroy(h);
                 return s;
               }});
  return r;
}

// Host-only rows: the C ABI's own arguments, the scale-layout contract and the quantizers.
std::vector<Row> host_only_rows() {
  std::vector<Row> r;
  // A D scale in host memory is read at validation (a device one only by the kernel, so these rows
  // are host rows): D = fp8(d_scale * result) with 0, a negative value, NaN or inf cannot be meant.
  for (auto [name, c_name, value, actual] :
       {std::tuple{"D scale 0", "C: D scale 0", 0.0f, "got 0.0"}, {"D scale negative", "C: D scale negative", -2.0f, "got -2"},
        {"D scale NaN", "C: D scale NaN", kNaN, "got nan"}, {"D scale +Inf", "C: D scale +Inf", kInf, "got inf"}}) {
    const float v = value;
    r.push_back({name, "C++ Handle::gemm (host memory)", kArg, {"d_scale", "d-scale-value", actual},
                 "non-positive or non-finite scale", [v](Ctx& c) {
                   GemmArgs x = c.base;
                   x.d_dtype = DType::kE4M3;
                   c.scal[0] = v;
                   x.d_scale = c.scal;
                   return cpp_gemm(x);
                 }});
    r.push_back({c_name, "C ABI scalemm_gemm (host memory)", kArg,
                 {"d_scale", "d-scale-value"}, "non-positive or non-finite scale", [v](Ctx& c) {
                   scalemm_gemm_t g = to_c(c.base);
                   g.d_dtype = SCALEMM_DTYPE_E4M3;
                   c.scal[0] = v;
                   g.d_scale = c.scal;
                   return c_gemm(g);
                 }});
  }
  r.push_back({"C: scalemm_gemm with a null handle", "C ABI scalemm_gemm", kArg, {"handle: null"}, "null pointer",
               [](Ctx& c) {
                 scalemm_gemm_t g = to_c(c.base);
                 return from_c(scalemm_gemm(nullptr, &g, nullptr));
               }});
  r.push_back({"C: scalemm_gemm with a null descriptor", "C ABI scalemm_gemm", kArg, {"gemm: null descriptor"},
               "null pointer", [](Ctx&) {
                 scalemm_handle_t h = nullptr;
                 REQUIRE(scalemm_handle_create(&h, nullptr) == SCALEMM_STATUS_OK);
                 const Status s = from_c(scalemm_gemm(h, nullptr, nullptr));
                 scalemm_handle_destroy(h);
                 return s;
               }});
  r.push_back({"C: handle_create with a null output", "C ABI scalemm_handle_create", kArg, {"handle: null output pointer"},
               "null pointer", [](Ctx&) { return from_c(scalemm_handle_create(nullptr, nullptr)); }});
  auto create = [](int32_t size, int32_t force, int32_t autotune) {
    return [=](Ctx&) {
      scalemm_handle_options_t o;
      std::memset(&o, 0, sizeof(o));
      o.struct_size = size_t(size);
      o.force_backend = force;
      o.autotune = autotune;
      scalemm_handle_t h = nullptr;
      const Status s = from_c(scalemm_handle_create(&h, &o));
      if (h) scalemm_handle_destroy(h);
      return s;
    };
  };
  r.push_back({"C: handle options struct_size 0", "C ABI scalemm_handle_create", kArg, {"options.struct_size"},
               "struct version", create(0, -1, 0)});
  r.push_back({"C: force_backend 9", "C ABI scalemm_handle_create", kArg, {"options.force_backend", "value 9"}, "enum",
               create(int32_t(sizeof(scalemm_handle_options_t)), 9, 0)});
  r.push_back({"C: autotune 5", "C ABI scalemm_handle_create", kArg, {"options.autotune", "value 5"}, "enum",
               create(int32_t(sizeof(scalemm_handle_options_t)), -1, 5)});
  r.push_back({"C: plan_explain with a null handle", "C ABI scalemm_plan_explain", kArg, {"handle: null"}, "null pointer",
               [](Ctx& c) {
                 scalemm_gemm_t g = to_c(c.base);
                 return from_c(scalemm_plan_explain(nullptr, &g, nullptr, nullptr, 0, nullptr));
               }});

  const char* vs = "C++ layouts::validate_scale";
  r.push_back({"E8M0 NaN scale (0xFF)", vs, kLayout, {"scale_a", "e8m0-nan"}, "NaN E8M0 scale", [](Ctx& c) {
                 HostOperand h = c.host_operand(Recipe::kMxfp8, 32, 256);
                 h.scales[3] = formats::kE8M0Nan;
                 return validate_scale_of(h, "scale_a");
               }});
  r.push_back({"UE4M3 NaN scale (0x7F)", vs, kLayout, {"scale_b", "ue4m3-nan"}, "NaN UE4M3 scale", [](Ctx& c) {
                 HostOperand h = c.host_operand(Recipe::kNvfp4, 64, 256);
                 h.scales[5] = 0x7F;
                 return validate_scale_of(h, "scale_b");
               }});
  r.push_back({"fp32 scale zero", vs, kLayout, {"scale_a", "f32-scale-non-positive"}, "non-positive scale", [](Ctx& c) {
                 HostOperand h = c.host_operand(Recipe::kBlock1x128, 32, 256);
                 put_f32(h, 1, 0.0f);
                 return validate_scale_of(h, "scale_a");
               }});
  r.push_back({"fp32 scale negative", vs, kLayout, {"scale_a", "f32-scale-non-positive"}, "non-positive scale",
               [](Ctx& c) {
                 HostOperand h = c.host_operand(Recipe::kRowwise, 32, 256);
                 put_f32(h, 7, -0.5f);
                 return validate_scale_of(h, "scale_a");
               }});
  r.push_back({"fp32 scale NaN", vs, kLayout, {"scale_b", "f32-scale-non-finite"}, "non-finite scale", [](Ctx& c) {
                 HostOperand h = c.host_operand(Recipe::kBlock128x128, 256, 256);
                 put_f32(h, 2, kNaN);
                 return validate_scale_of(h, "scale_b");
               }});
  r.push_back({"fp32 tensorwise scale +Inf", vs, kLayout, {"scale_a", "f32-scale-non-finite"}, "non-finite scale",
               [](Ctx& c) {
                 HostOperand h = c.host_operand(Recipe::kTensorwise, 32, 256);
                 put_f32(h, 0, kInf);
                 return validate_scale_of(h, "scale_a");
               }});
  r.push_back({"nonzero padding in a cuBLASLt-format MXFP8 buffer", vs, kLayout, {"scale_a", "scale-padding-nonzero"},
               "padding content", [](Ctx& c) {
                 HostOperand h = c.host_operand(Recipe::kMxfp8, 33, 256, ScaleFormat::kCublasLt);
                 h.scales.back() = 0x7F;  // the last 128x4 tile's last byte lies in the row padding (33 of 128)
                 return validate_scale_of(h, "scale_a");
               }});
  r.push_back({"mxfp8-32x32 cuBLASLt buffer whose replicated rows differ", vs, kLayout,
               {"scale_b", "mxfp8-32x32-replica-mismatch"}, "padding/replica content", [](Ctx& c) {
                 HostOperand h = c.host_operand(Recipe::kMxfp8_32x32, 64, 256, ScaleFormat::kCublasLt);
                 const auto l = h.layout();
                 h.scales[size_t(l.offset(5, 1))] = uint8_t(h.scales[size_t(l.offset(5, 1))] + 1);
                 return validate_scale_of(h, "scale_b");
               }});
  r.push_back({"scale tensor of dtype f16 for fp32 scales", vs, kLayout, {"scale_a", "scale-dtype", "got f16"}, "dtype",
               [](Ctx& c) {
                 const HostOperand& h = c.host_operand(Recipe::kBlock1x128, 32, 256);
                 TensorRef t = TensorRef::contiguous(const_cast<uint8_t*>(h.scales.data()), DType::kF16,
                                                     {h.layout().size()});
                 return capture([&] { throw_if_any(layouts::validate_scale(t, h.layout(), "scale_a")); });
               }});
  r.push_back({"scale tensor one element short", vs, kLayout, {"scale_a", "scale-element-count"}, "scale size",
               [](Ctx& c) {
                 const HostOperand& h = c.host_operand(Recipe::kMxfp8, 32, 256);
                 TensorRef t = TensorRef::contiguous(const_cast<uint8_t*>(h.scales.data()), DType::kE8M0,
                                                     {h.layout().size() - 1});
                 return capture([&] { throw_if_any(layouts::validate_scale(t, h.layout(), "scale_a")); });
               }});
  r.push_back({"host scale tensor where device memory is required", vs, kLayout, {"scale_b", "scale-memory-space"},
               "host/device mix-up", [](Ctx& c) {
                 const HostOperand& h = c.host_operand(Recipe::kMxfp8, 64, 256);
                 layouts::ValidateOptions o;
                 o.required_space = MemorySpace::kDevice;
                 return validate_scale_of(h, "scale_b", o);
               }});
  const char* vg = "C++ layouts::validate_gemm";
  auto gemm_rule = [](Recipe ra, Recipe rb, int64_t m, int64_t n, int64_t k) {
    return [=](Ctx&) { return capture([&] { throw_if_any(layouts::validate_gemm(ra, rb, m, n, k)); }); };
  };
  r.push_back({"cuBLASLt: block128x128 x block128x128", vg, kLayout, {"blk128-both-operands"}, "unsupported recipe pair",
               gemm_rule(Recipe::kBlock128x128, Recipe::kBlock128x128, 128, 128, 256)});
  r.push_back({"cuBLASLt: tensorwise x mxfp8", vg, kLayout, {"gemm-recipe-pair"}, "unsupported recipe pair",
               gemm_rule(Recipe::kTensorwise, Recipe::kMxfp8, 128, 128, 256)});
  r.push_back({"cuBLASLt: FP8 K not a multiple of 16", vg, kLayout, {"fp8-k-multiple-16"}, "K granularity",
               gemm_rule(Recipe::kTensorwise, Recipe::kTensorwise, 128, 128, 40)});
  r.push_back({"cuBLASLt: FP4 K not a multiple of 32", vg, kLayout, {"fp4-k-multiple-32"}, "K granularity",
               gemm_rule(Recipe::kNvfp4, Recipe::kNvfp4, 128, 128, 48)});
  r.push_back({"cuBLASLt: block1x128 with M = 7", vg, kLayout, {"vec128-outer-multiple-4"}, "outer granularity",
               gemm_rule(Recipe::kBlock1x128, Recipe::kBlock128x128, 7, 128, 256)});
  const char* q = "C++ emulation::quantize_host";
  r.push_back({"quantizer: nvfp4 with an odd column count", q, kArg, {"even column count", "got 33"}, "shape",
               [](Ctx&) { return quantize(Recipe::kNvfp4, DType::kE2M1, 4, 33); }});
  r.push_back({"quantizer: mxfp8 with e2m1 data", q, kArg, {"mxfp8 data dtype must be e4m3 or e5m2, got e2m1"}, "dtype",
               [](Ctx&) { return quantize(Recipe::kMxfp8, DType::kE2M1, 4, 64); }});
  r.push_back({"quantizer: nvfp4 with e4m3 data", q, kArg, {"nvfp4 data dtype must be e2m1, got e4m3"}, "dtype",
               [](Ctx&) { return quantize(Recipe::kNvfp4, DType::kE4M3, 4, 64); }});
  r.push_back({"quantizer: null data output", q, kArg, {"rowwise output needs data and scales", "data = null"}, "null pointer",
               [](Ctx&) { return quantize(Recipe::kBlock1x128, DType::kE4M3, 4, 128, true); }});
  r.push_back({"quantizer: u8 source", q, kArg, {"source dtype must be f32, bf16 or f16, got u8"}, "dtype",
               [](Ctx&) { return quantize(Recipe::kTensorwise, DType::kE4M3, 4, 64, false, DType::kU8); }});
  r.push_back({"quantizer: negative row count", q, kArg, {"source shape must be non-negative", "got -1x64"}, "extent",
               [](Ctx&) { return quantize(Recipe::kRowwise, DType::kE4M3, -1, 64); }});
  return r;
}

// Device-only rows: pointers in the wrong memory space and device alignment.
std::vector<Row> device_only_rows() {
  std::vector<Row> r;
  const char* api = "C++ Handle::gemm";
  auto gemm = [](std::function<void(Ctx&, GemmArgs&)> edit, PlanOptions po = {}) {
    return [edit, po](Ctx& c) {
      GemmArgs x = c.base;
      edit(c, x);
      return cpp_gemm(x, po);
    };
  };
  r.push_back({"A data in pageable host memory, space device", api, kArg, {"a", "pointer-memory-space", "got pageable host memory"},
               "host/device mix-up", gemm([](Ctx& c, GemmArgs& x) {
                 x.a.data = c.host_operand(Recipe::kBlock1x128, 32, 256).data.data();
               })});
  r.push_back({"scale_b in pageable host memory, space device", api, kArg, {"scale_b", "pointer-memory-space"},
               "host/device mix-up", gemm([](Ctx& c, GemmArgs& x) {
                 x.b.scale = c.host_operand(Recipe::kBlock128x128, 64, 256).scales.data();
               })});
  r.push_back({"D in pageable host memory, space device", api, kArg, {"d", "pointer-memory-space"}, "host/device mix-up",
               gemm([](Ctx& c, GemmArgs& x) { x.d = c.d_alt.data(); })});
  r.push_back({"bias in pageable host memory, space device", api, kArg, {"bias", "pointer-memory-space"},
               "host/device mix-up", gemm([](Ctx& c, GemmArgs& x) { x.bias = c.d_alt.data(); })});
  r.push_back({"d_scale in pageable host memory, space device", api, kArg, {"d_scale", "pointer-memory-space"},
               "host/device mix-up", gemm([](Ctx& c, GemmArgs& x) {
                 x.d_dtype = DType::kE4M3;
                 x.d_scale = c.host_scal;
               })});
  r.push_back({"A data in device memory, space host", api, kArg, {"a", "pointer-memory-space", "got device memory"},
               "host/device mix-up", gemm([](Ctx& c, GemmArgs& x) {
                 const HostOperand& ha = c.host_operand(Recipe::kBlock1x128, 32, 256);
                 const HostOperand& hb = c.host_operand(Recipe::kBlock128x128, 64, 256);
                 x.space = MemorySpace::kHost;
                 x.a = ha.view();
                 x.b = hb.view();
                 x.d = c.d_alt.data();
                 x.a.data = c.device_buffer(ha.data.size());
               })});
  r.push_back({"D in device memory, space host", api, kArg, {"d", "pointer-memory-space"}, "host/device mix-up",
               gemm([](Ctx& c, GemmArgs& x) {
                 const HostOperand& ha = c.host_operand(Recipe::kBlock1x128, 32, 256);
                 const HostOperand& hb = c.host_operand(Recipe::kBlock128x128, 64, 256);
                 x.space = MemorySpace::kHost;
                 x.a = ha.view();
                 x.b = hb.view();
                 x.d = c.d;  // the poisoned device output: must stay untouched
               })});
  r.push_back({"A device data 1 byte past 16-byte alignment", api, kArg, {"a", "data-alignment", "1 bytes past 16"},
               "data alignment", gemm([](Ctx&, GemmArgs& x) { x.a.data = static_cast<const char*>(x.a.data) + 1; })});
  r.push_back({"B device data 8 bytes past 16-byte alignment", api, kArg, {"b", "data-alignment", "8 bytes past 16"},
               "data alignment", gemm([](Ctx&, GemmArgs& x) { x.b.data = static_cast<const char*>(x.b.data) + 8; })});
  PlanOptions strict;
  strict.strict = true;
  Row mx{"strict mode, mxfp8 x mxfp8 on a device without native MXFP8 (sm_90)", api, kUnsup,
         {"in strict mode", "mxfp8"}, "unsupported architecture in strict mode",
         gemm([](Ctx& c, GemmArgs& x) {
           x.a = c.operand(Recipe::kMxfp8, 32, 256);
           x.b = c.operand(Recipe::kMxfp8, 64, 256);
         }, strict)};
  mx.skip_on_native_mx = true;
  r.push_back(mx);
  r.push_back({"C: A data in pageable host memory, space device", "C ABI scalemm_gemm", kArg,
               {"a", "pointer-memory-space"}, "host/device mix-up", [](Ctx& c) {
                 scalemm_gemm_t g = to_c(c.base);
                 g.a.data = c.host_operand(Recipe::kBlock1x128, 32, 256).data.data();
                 return c_gemm(g);
               }});
  r.push_back({"C: B device data 4 bytes past 16-byte alignment", "C ABI scalemm_gemm", kArg,
               {"b", "data-alignment"}, "data alignment", [](Ctx& c) {
                 scalemm_gemm_t g = to_c(c.base);
                 g.b.data = static_cast<const char*>(g.b.data) + 4;
                 return c_gemm(g);
               }});
  return r;
}

std::vector<Row> host_table() {
  std::vector<Row> r = common_rows("C++ Handle::gemm (host memory)");
  for (auto& x : c_rows("C ABI scalemm_gemm (host memory)")) r.push_back(std::move(x));
  for (auto& x : host_only_rows()) r.push_back(std::move(x));
  return r;
}

std::vector<Row> device_table() {
  std::vector<Row> r = common_rows("C++ Handle::gemm (device memory)");
  for (auto& x : c_rows("C ABI scalemm_gemm (device memory)")) r.push_back(std::move(x));
  for (auto& x : device_only_rows()) r.push_back(std::move(x));
  return r;
}

// Runs every row; returns the number that passed all checks (*skipped: rows that do not apply here).
int run_table(const std::vector<Row>& rows, bool device, int* skipped) {
  int passed = 0;
  *skipped = 0;
  bool native_mx = false;
  if (device) native_mx = DeviceTarget::current().sm >= 100;
  for (const Row& row : rows) {
    if (row.skip_on_native_mx && native_mx) {
      std::printf("row skipped on this device (native MXFP8): %s\n", row.name);
      ++*skipped;
      continue;
    }
    Ctx c(device);
    // The baseline of the row's context is a valid call that succeeds (and writes D).
    if (&row == &rows.front()) {
      CHECK(cpp_gemm(c.base).ok());
      c.poison();
    }
    const Status s = row.run(c);
    const std::string msg = s.to_string();
    CAPTURE(row.name, row.api, msg);
    bool ok = true;
    CHECK(s.code == row.status);
    ok &= s.code == row.status;
    for (const auto& sub : row.contains) {
      CAPTURE(sub);
      const bool has = msg.find(sub) != std::string::npos;
      CHECK(has);
      ok &= has;
    }
    const bool untouched = c.untouched();
    CHECK(untouched);
    ok &= untouched;
    if (device) {
      const cudaError_t last = cudaGetLastError();
      const cudaError_t sync = cudaDeviceSynchronize();
      CHECK(last == cudaSuccess);
      CHECK(sync == cudaSuccess);
      ok &= last == cudaSuccess && sync == cudaSuccess;
    }
    passed += ok;
  }
  return passed;
}

}  // namespace

TEST_CASE("bad-input catalogue, host memory: each row returns its status, names the argument, writes nothing",
          "[reliability][catalogue]") {
  const auto rows = host_table();
  int skipped = 0;
  const int passed = run_table(rows, false, &skipped);
  std::printf("bad-input catalogue (host): %d of %zu rows pass\n", passed, rows.size());
  CHECK(size_t(passed) == rows.size());
}

TEST_CASE("bad-input catalogue, device memory: each row returns its status, writes nothing, leaves no CUDA error",
          "[gpu][reliability][catalogue]") {
  const auto rows = device_table();
  int skipped = 0;
  const int passed = run_table(rows, true, &skipped);
  std::printf("bad-input catalogue (device): %d of %zu rows pass, %d skipped on this device\n", passed, rows.size(),
              skipped);
  CHECK(size_t(passed + skipped) == rows.size());  // the strict-MX row is skipped on sm_100+
}

TEST_CASE("print the bad-input catalogue as Markdown", "[.catalogue]") {
  std::printf("| # | Row | API | Status | Checks |\n|---|---|---|---|---|\n");
  int i = 0;
  auto print = [&](const std::vector<Row>& rows, const char* where) {
    for (const Row& r : rows) {
      std::string subs;
      for (const auto& s : r.contains) subs += (subs.empty() ? "" : ", ") + ("`" + s + "`");
      std::printf("| %d | %s | %s | `%s` | %s (%s); message holds %s |\n", ++i, r.name, r.api,
                  status_code_name(r.status), r.checks, where, subs.c_str());
    }
  };
  print(host_table(), "host");
  print(device_table(), "device, [gpu]");
}
