// The training linear layer (scalemm/linear.hpp) on the GPU: forward, dgrad and wgrad for blockwise
// FP8 and MXFP8 against the reference emulator on the same quantized operands (downloaded), bit for
// bit on exact inputs, the transposed weight against the transposed dequantized weight, SQNR against
// the unquantized fp64 products, and the unpadded-128x128-scale bug on the device.
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dispatch/verify.hpp"
#include "scalemm/emulation/compare.hpp"
#include "scalemm/emulation/emulation.hpp"
#include "scalemm/formats.hpp"
#include "scalemm/layouts/convert.hpp"
#include "scalemm/layouts/convert_cuda.hpp"
#include "scalemm/linear.hpp"
#include "device_buffer.hpp"
#include "linear_inputs.hpp"
#include "support/test_support.hpp"
#include "scalemm/detail/cuda_check.hpp"

using namespace scalemm;
using scalemm::testing::make_input;
using scalemm::testing::product;

namespace {

using scalemm::testing::Dev;

template <class T = uint8_t>
std::vector<T> download(const void* p, size_t count) {
  std::vector<T> out(count);
  if (count) REQUIRE(cudaMemcpy(out.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  return out;
}

/// One GEMM operand copied back from the device, as a host QuantizedTensor.
struct HostCopy {
  std::vector<uint8_t> data, scales;
  emulation::QuantizedTensor t;
  HostCopy(const GemmOperand& op, int64_t rows, int64_t k) {
    const layouts::ScaleLayout l(op.recipe, rows, k, op.scale_format);
    data = download(op.data, size_t(dtype_storage_bytes(op.dtype, rows * k)));
    scales = download(op.scale, size_t(l.bytes()));
    t.data = data.data();
    t.dtype = op.dtype;
    t.scales = scales.data();
    t.layout = l;
  }
};

std::vector<float> widen(const std::vector<uint16_t>& bf16) {
  std::vector<float> out(bf16.size());
  for (size_t i = 0; i < bf16.size(); ++i) out[i] = formats::decode_bf16(bf16[i]);
  return out;
}

struct GemmCheck {
  LinearGemm which;
  GemmArgs args;
  Backend backend;
  std::vector<float> gpu;   // D as fp32 values
  std::vector<float> ref;   // reference emulator on the downloaded operands, same out dtype
  std::vector<double> exact;  // fp64 product of the unquantized inputs
};

struct LayerRun {
  int64_t m, n, k;
  std::vector<float> x, w, dy;
  GemmCheck g[3];
};

// One set_weight + forward + backward on stream `s`; then every GEMM's operands are downloaded.
LayerRun run_layer(Handle& h, cudaStream_t s, LinearRecipe recipe, int64_t m, int64_t n, int64_t k, bool exact,
                   std::mt19937_64& rng, LinearOptions opt = {}) {
  LayerRun r;
  r.m = m, r.n = n, r.k = k;
  r.x = make_input(m, k, exact, rng);
  r.w = make_input(n, k, exact, rng);
  r.dy = make_input(m, n, exact, rng);
  Dev x(r.x), w(r.w), dy(r.dy);
  Dev y(size_t(m * n) * 2), dx(size_t(m * k) * 2), dw(size_t(n * k) * 4);
  SCALEMM_CUDA_CHECK(cudaMemset(y.p, 0xFF, y.bytes));
  SCALEMM_CUDA_CHECK(cudaMemset(dx.p, 0xFF, dx.bytes));
  SCALEMM_CUDA_CHECK(cudaMemset(dw.p, 0xFF, dw.bytes));
  ScaledLinear layer(h, recipe, n, k, opt);
  layer.set_weight(w.as<float>(), s);
  layer.forward(x.as<float>(), m, y.as<uint16_t>(), s);
  layer.backward(dy.as<float>(), dx.as<uint16_t>(), dw.as<float>(), s);
  SCALEMM_CUDA_CHECK(cudaStreamSynchronize(s));

  for (LinearGemm which : {LinearGemm::kForward, LinearGemm::kDgrad, LinearGemm::kWgrad}) {
    GemmCheck& c = r.g[int(which)];
    c.which = which;
    c.args = layer.gemm_args(which);
    c.backend = h.plan(c.args).backend;
    const GemmArgs& a = c.args;
    const size_t count = size_t(a.m * a.n);
    if (a.d_dtype == DType::kBF16) c.gpu = widen(download<uint16_t>(a.d, count));
    else c.gpu = download<float>(a.d, count);
    HostCopy ha(a.a, a.m, a.k), hb(a.b, a.n, a.k);
    emulation::GemmOptions go;
    go.out_dtype = a.d_dtype;
    if (a.d_dtype == DType::kBF16) {
      std::vector<uint16_t> raw(count);
      emulation::gemm_host(ha.t, hb.t, raw.data(), go);
      c.ref = widen(raw);
    } else {
      c.ref.resize(count);
      emulation::gemm_host(ha.t, hb.t, c.ref.data(), go);
    }
    switch (which) {
      case LinearGemm::kForward:  // Y (M,N) = X (M,K) W (N,K)^T
        c.exact = product(r.x, k, 1, r.w, k, 1, m, n, k);
        break;
      case LinearGemm::kDgrad:  // dX (M,K) = dY (M,N) W (N,K): b(c=kk, j=nn) = W[nn*K + kk]
        c.exact = product(r.dy, n, 1, r.w, 1, k, m, k, n);
        break;
      case LinearGemm::kWgrad:  // dW (N,K) = dY^T X: a(r=nn, j=mm) = dY[mm*N + nn], b(c=kk, j=mm) = X[mm*K + kk]
        c.exact = product(r.dy, 1, n, r.x, 1, k, n, k, m);
        break;
    }
    // The operand shapes are those of the table in linear.hpp.
    const Recipe act = layer.activation_recipe(), wt = layer.weight_recipe();
    CHECK(a.a.recipe == act);
    CHECK(a.b.recipe == (which == LinearGemm::kWgrad ? act : wt));
    CHECK(a.k == (which == LinearGemm::kForward ? k : which == LinearGemm::kDgrad ? n : m));
  }
  return r;
}

struct TestStream {
  cudaStream_t s = nullptr;
  TestStream() { SCALEMM_CUDA_CHECK(cudaStreamCreate(&s)); }
  ~TestStream() { cudaStreamDestroy(s); }
};

struct Case {
  int64_t m, n, k;
};
const Case kCases[] = {{128, 256, 512}, {256, 256, 512}, {264, 256, 512},
                       {128, 256, 640}, {256, 256, 640}, {264, 256, 640}};

}  // namespace

TEST_CASE("linear layer: forward, dgrad and wgrad equal the reference emulator on the same quantized operands",
          "[gpu][dispatch][linear]") {
  auto rng = scalemm::testing::rng(0x11A1);
  Handle h;
  TestStream s;
  for (LinearRecipe recipe : {LinearRecipe::kBlockwiseFp8, LinearRecipe::kMxfp8})
    for (const Case& cs : kCases) {
      const LayerRun r = run_layer(h, s.s, recipe, cs.m, cs.n, cs.k, false, rng);
      for (const GemmCheck& c : r.g) {
        double ref_scale = 0.0;
        for (float v : c.ref) ref_scale = std::max(ref_scale, double(std::fabs(v)));
        Plan plan;
        plan.backend = c.backend;
        const auto tol = verify::tolerance_for(c.args, plan, ref_scale);
        const auto impl = emulation::compare(c.ref.data(), c.gpu.data(), int64_t(c.ref.size()), &tol);
        const auto quality = emulation::compare(c.exact.data(), c.gpu.data(), int64_t(c.exact.size()));
        std::printf("linear %-13s M=%3lld N=%lld K=%lld %-7s %-10s vs reference %6.1f dB (%s), "
                    "vs unquantized fp64 %5.1f dB\n",
                    std::string(to_string(recipe)).c_str(), (long long)cs.m, (long long)cs.n, (long long)cs.k,
                    std::string(to_string(c.which)).c_str(), std::string(to_string(c.backend)).c_str(), impl.sqnr_db,
                    impl.within_tolerance() ? "within tolerance" : "OUTSIDE tolerance", quality.sqnr_db);
        CAPTURE(to_string(recipe), cs.m, cs.n, cs.k, to_string(c.which), to_string(c.backend));
        CAPTURE(impl.to_string(), tol.to_string(), quality.to_string());
        CHECK(impl.within_tolerance());
        CHECK(impl.nonfinite_mismatches == 0);
        CHECK(quality.sqnr_db >= 25.0);
      }
    }
}

TEST_CASE("linear layer: exact inputs give bit-identical GEMMs, equal to the unquantized product",
          "[gpu][dispatch][linear]") {
  auto rng = scalemm::testing::rng(0x11A2);
  Handle h;
  LinearOptions pow2;
  pow2.power_of_two_scales = true;  // fp32 amax scales 1/(448/amax) are not exact; powers of two are
  TestStream s;
  for (LinearRecipe recipe : {LinearRecipe::kBlockwiseFp8, LinearRecipe::kMxfp8})
    for (const Case& cs : kCases) {
      const LayerRun r = run_layer(h, s.s, recipe, cs.m, cs.n, cs.k, true, rng, pow2);
      for (const GemmCheck& c : r.g) {
        CAPTURE(to_string(recipe), cs.m, cs.n, cs.k, to_string(c.which), to_string(c.backend));
        const auto impl = emulation::compare(c.ref.data(), c.gpu.data(), int64_t(c.ref.size()));
        CAPTURE(impl.to_string());
        CHECK(impl.bitwise_equal());
        // Lossless quantization: the GEMM is the exact product, rounded once to the output type.
        int64_t off = 0;
        for (size_t i = 0; i < c.exact.size(); ++i) {
          float want = float(c.exact[i]);  // exact in fp32 by construction
          if (c.args.d_dtype == DType::kBF16) want = formats::decode_bf16(formats::encode_bf16(want));
          off += std::memcmp(&want, &c.gpu[i], 4) != 0;
        }
        CHECK(off == 0);
      }
    }
}

TEST_CASE("linear layer: W^T for dgrad is the exact transpose of W (bytes, scales, dequantized values)",
          "[gpu][dispatch][linear]") {
  auto rng = scalemm::testing::rng(0x11A3);
  Handle h;
  for (LinearRecipe recipe : {LinearRecipe::kBlockwiseFp8, LinearRecipe::kMxfp8})
    for (int64_t k : {512, 640}) {
      const int64_t n = 256, m = 128;
      CAPTURE(to_string(recipe), k);
      std::vector<float> hw = make_input(n, k, false, rng), hx = make_input(m, k, false, rng),
                         hdy = make_input(m, n, false, rng);
      for (int64_t i = 0; i < n; ++i)  // spread magnitudes across weight blocks
        for (int64_t j = 0; j < k; ++j) hw[size_t(i * k + j)] *= std::ldexp(1.0f, int((i / 32 + j / 32) % 9) - 4);
      Dev w(hw), x(hx), dy(hdy), y(size_t(m * n) * 2), dx(size_t(m * k) * 2);
      ScaledLinear layer(h, recipe, n, k);
      layer.set_weight(w.as<float>(), nullptr);
      layer.forward(x.as<float>(), m, y.as<uint16_t>(), nullptr);
      layer.backward(dy.as<float>(), dx.as<uint16_t>(), nullptr, nullptr);
      SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
      const GemmOperand wop = layer.gemm_args(LinearGemm::kForward).b;  // W (N, K)
      const GemmOperand wtop = layer.gemm_args(LinearGemm::kDgrad).b;   // W^T (K, N)
      HostCopy hwq(wop, n, k), hwt(wtop, k, n);
      // Bytes: W^T[kk][nn] == W[nn][kk].
      int64_t byte_mismatches = 0;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < k; ++j) byte_mismatches += hwt.data[size_t(j * n + i)] != hwq.data[size_t(i * k + j)];
      CHECK(byte_mismatches == 0);
      // Scales: byte-identical to the GPU scale-grid transpose of W's scales, and to the host one.
      const layouts::ScaleLayout lw = hwq.t.layout, lwt = hwt.t.layout;
      REQUIRE(lwt == layouts::transposed(lw, lwt.format));
      Dev gpu_t(size_t(lwt.bytes()));
      layouts::gpu::transpose(lw, wop.scale, lwt, gpu_t.p, nullptr);
      SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
      const auto via_gpu = download(gpu_t.p, size_t(lwt.bytes()));
      std::vector<uint8_t> via_host(size_t(lwt.bytes()));
      layouts::transpose(lw, hwq.scales.data(), lwt, via_host.data());
      CHECK(via_gpu == hwt.scales);
      CHECK(via_host == hwt.scales);
      // Values: dequant(W^T) == dequant(W)^T bit for bit.
      std::vector<float> dw_(size_t(n * k)), dwt(size_t(n * k));
      emulation::dequantize_host(hwq.t, dw_.data(), DType::kF32);
      emulation::dequantize_host(hwt.t, dwt.data(), DType::kF32);
      int64_t value_mismatches = 0;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < k; ++j) {
          const float a = dw_[size_t(i * k + j)], b = dwt[size_t(j * n + i)];
          value_mismatches += std::memcmp(&a, &b, 4) != 0;
        }
      CHECK(value_mismatches == 0);
    }
}

// [serial]: free device memory is device-wide, so another test process allocating at the same time
// would look like a leak here (it did once, by 2 MB, under ctest -j6).
TEST_CASE("linear layer: buffers are allocated once and reused for every M up to the largest",
          "[gpu][dispatch][linear][serial]") {
  auto rng = scalemm::testing::rng(0x11A4);
  Handle h;
  const int64_t n = 256, k = 512;
  std::vector<float> hw = make_input(n, k, false, rng), hx = make_input(264, k, false, rng),
                     hdy = make_input(264, n, false, rng);
  Dev w(hw), x(hx), dy(hdy), y(size_t(264 * n) * 2), dx(size_t(264 * k) * 2), dwb(size_t(n * k) * 4);
  ScaledLinear layer(h, LinearRecipe::kBlockwiseFp8, n, k);
  layer.set_weight(w.as<float>(), nullptr);
  layer.reserve(264);
  size_t free0 = 0, free1 = 0, total = 0;
  const void* ptrs0[6] = {};
  for (int iter = 0; iter < 3; ++iter)
    for (int64_t m : {264, 128, 256}) {
      layer.forward(x.as<float>(), m, y.as<uint16_t>(), nullptr);
      layer.backward(dy.as<float>(), dx.as<uint16_t>(), dwb.as<float>(), nullptr);
      SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
      const GemmArgs f = layer.gemm_args(LinearGemm::kForward), g = layer.gemm_args(LinearGemm::kWgrad);
      const void* ptrs[6] = {f.a.data, f.a.scale, f.b.data, g.a.data, g.b.data, g.b.scale};
      if (iter == 0 && m == 264) std::memcpy(ptrs0, ptrs, sizeof ptrs);
      for (int i = 0; i < 6; ++i) CHECK(ptrs[i] == ptrs0[i]);
      // After one pass over the shapes (the Handle's scratch and plan caches are warm), nothing more
      // is allocated.
      if (iter == 0 && m == 256) SCALEMM_CUDA_CHECK(cudaMemGetInfo(&free0, &total));
    }
  SCALEMM_CUDA_CHECK(cudaMemGetInfo(&free1, &total));
  CHECK(free1 >= free0);
}

TEST_CASE("linear layer: an unpadded 128x128 weight scale grid on the device is reported and visibly wrong",
          "[gpu][dispatch][linear]") {
  // torchao's bug: the (N/128, L) grid with K-block stride L = 5 passed where cuBLASLt's BLK128x128
  // buffer (stride L4 = 8) is expected. scalemm's layer never does this (its quantizer writes the
  // cuBLASLt layout), but a caller building GemmArgs by hand could: this is what catches it.
  auto rng = scalemm::testing::rng(0x11A5);
  Handle h;
  const int64_t m = 128, n = 256, k = 640;
  std::vector<float> hw = make_input(n, k, false, rng), hx = make_input(m, k, false, rng);
  for (int64_t i = 128; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) hw[size_t(i * k + j)] *= 64.0f;  // row block 1 on another scale
  Dev w(hw), x(hx), y(size_t(m * n) * 2), y_bad(size_t(m * n) * 2);
  ScaledLinear layer(h, LinearRecipe::kBlockwiseFp8, n, k);
  layer.set_weight(w.as<float>(), nullptr);
  layer.forward(x.as<float>(), m, y.as<uint16_t>(), nullptr);
  SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
  GemmArgs args = layer.gemm_args(LinearGemm::kForward);
  const layouts::ScaleLayout blk(Recipe::kBlock128x128, n, k, ScaleFormat::kCublasLt);
  REQUIRE(args.b.scale_format == ScaleFormat::kCublasLt);
  const auto padded = download<float>(args.b.scale, size_t(blk.size()));
  // The torchao buffer: row blocks packed with stride L, in a buffer of the full size.
  std::vector<float> unpadded(size_t(blk.size()), 0.0f);
  for (int64_t rb = 0; rb < blk.grid_rows(); ++rb)
    for (int64_t kb = 0; kb < blk.kblocks(); ++kb)
      unpadded[size_t(rb * blk.kblocks() + kb)] = padded[size_t(blk.offset(rb * 128, kb))];
  Dev bad(unpadded);

  auto rules_of = [](const Diagnostics& d) {
    std::string s;
    for (const auto& x : d) s += x.rule + " ";
    return s;
  };
  // Structure: a (2, 5) device tensor with strides (5, 1) is named at once.
  const TensorRef view = TensorRef::contiguous(bad.p, DType::kF32, {2, 5}, MemorySpace::kDevice);
  const auto structural = layouts::validate_scale(view, blk, "scale_b");
  std::printf("device (2,5) view: %s\n", to_string(structural).c_str());
  CHECK(rules_of(structural).find(layouts::rules::kBlk128KBlockStride) != std::string::npos);
  // Content: as a raw full-size buffer, the device check finds scales in the padding and zeros in
  // real slots.
  Dev report(sizeof(layouts::ContentReport));
  const TensorRef flat = TensorRef::contiguous(bad.p, DType::kF32, {blk.size()}, MemorySpace::kDevice);
  const auto content = layouts::gpu::validate_device(flat, blk, "scale_b", report.as<layouts::ContentReport>(), nullptr);
  std::printf("device content check: %s\n", to_string(content).c_str());
  CHECK(rules_of(content).find(layouts::rules::kPaddingNonzero) != std::string::npos);
  // Run anyway: visibly wrong against the correctly padded call.
  args.b.scale = bad.p;
  args.d = y_bad.p;
  h.gemm(args, nullptr);
  SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
  const auto good_v = widen(download<uint16_t>(y.p, size_t(m * n)));
  const auto bad_v = widen(download<uint16_t>(y_bad.p, size_t(m * n)));
  const auto cmp = emulation::compare(good_v.data(), bad_v.data(), m * n);
  std::printf("forward with the unpadded weight scales: %s\n", cmp.to_string().c_str());
  CHECK(cmp.sqnr_db < 10.0);
}
