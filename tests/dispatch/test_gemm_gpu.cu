// GEMMs on the GPU through every backend, against the host reference on identical quantized inputs.
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <thread>

#include "backends/emulated.hpp"
#include "dispatch/verify.hpp"
#include "device_buffer.hpp"
#include "test_operands.hpp"
#include "scalemm/emulation/compare.hpp"
#include "support/test_support.hpp"
#include "scalemm/detail/cuda_check.hpp"

using namespace scalemm;
using scalemm::testing::HostOperand;

namespace {

using scalemm::testing::Dev;

struct DeviceOperand {
  Dev data, scales;
  GemmOperand op;
  // scale_offset > 0 places the scales that many bytes past an aligned address.
  explicit DeviceOperand(const HostOperand& h, size_t scale_offset = 0)
      : data(h.data.data(), h.data.size()), scales(h.scales.size() + scale_offset), op(h.view()) {
    SCALEMM_CUDA_CHECK(cudaMemcpy(static_cast<char*>(scales.p) + scale_offset, h.scales.data(), h.scales.size(),
                       cudaMemcpyHostToDevice));
    SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());  // as Dev's upload: the copy has landed before any stream reads it
    op.data = data.p;
    op.scale = static_cast<char*>(scales.p) + scale_offset;
  }
};

size_t out_bytes(DType t) { return t == DType::kF32 ? 4 : 2; }

std::vector<float> widen(const std::vector<uint8_t>& raw, DType t) {
  const size_t n = raw.size() / out_bytes(t);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (t == DType::kF32) std::memcpy(&out[i], raw.data() + 4 * i, 4);
    else {
      uint16_t h;
      std::memcpy(&h, raw.data() + 2 * i, 2);
      out[i] = t == DType::kBF16 ? formats::decode_bf16(h) : formats::decode_f16(h);
    }
  }
  return out;
}

struct Result {
  Backend backend;
  std::vector<float> gpu, ref;
  emulation::Comparison cmp;
};

// Runs D = A * B^T on the GPU through `h` and on the host reference; compares.
Result run(Handle& h, const HostOperand& a, const HostOperand& b, DType out, const PlanOptions* opts = nullptr,
           float alpha = 1.0f, size_t scale_offset = 0, bool fast_accum = false) {
  DeviceOperand da(a, scale_offset), db(b, scale_offset);
  const size_t bytes = size_t(a.rows * b.rows) * out_bytes(out);
  Dev d(bytes);
  SCALEMM_CUDA_CHECK(cudaMemset(d.p, 0xFF, bytes));  // poison: NaN in every float type
  GemmArgs args;
  args.m = a.rows, args.n = b.rows, args.k = a.k;
  args.a = da.op, args.b = db.op, args.d = d.p, args.d_dtype = out, args.alpha = alpha;
  args.fast_accum = fast_accum;
  Result r;
  if (opts) {
    HandleOptions ho;
    ho.plan = *opts;
    Handle forced(ho);
    r.backend = forced.plan(args).backend;
    forced.gemm(args, nullptr);
  } else {
    r.backend = h.plan(args).backend;
    h.gemm(args, nullptr);
  }
  SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint8_t> raw(bytes);
  SCALEMM_CUDA_CHECK(cudaMemcpy(raw.data(), d.p, bytes, cudaMemcpyDeviceToHost));
  r.gpu = widen(raw, out);
  std::vector<uint8_t> ref_raw(bytes);
  emulation::GemmOptions opt;
  opt.alpha = alpha * a.global_scale * b.global_scale;
  opt.out_dtype = out;
  emulation::gemm_host(a.quantized(), b.quantized(), ref_raw.data(), opt);
  r.ref = widen(ref_raw, out);
  r.cmp = emulation::compare(r.ref.data(), r.gpu.data(), int64_t(r.ref.size()));
  return r;
}

struct Shape {
  int64_t m, n, k;
};

// Runs `args` on `s` once eagerly (so plans, heuristics and scratch exist before the capture), captures
// one call as a graph and replays it `times` times into a poisoned D (`bytes` long); returns how many
// replays gave the eager bytes.
int graph_replays_identical(Handle& h, const GemmArgs& args, cudaStream_t s, size_t bytes, int times) {
  h.gemm(args, s);
  SCALEMM_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<uint8_t> eager(bytes), replay(bytes);
  SCALEMM_CUDA_CHECK(cudaMemcpy(eager.data(), args.d, bytes, cudaMemcpyDeviceToHost));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  SCALEMM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  h.gemm(args, s);
  SCALEMM_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  SCALEMM_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  int identical = 0;
  for (int i = 0; i < times; ++i) {
    SCALEMM_CUDA_CHECK(cudaMemsetAsync(args.d, 0xFF, bytes, s));
    SCALEMM_CUDA_CHECK(cudaGraphLaunch(ge, s));
    SCALEMM_CUDA_CHECK(cudaStreamSynchronize(s));
    SCALEMM_CUDA_CHECK(cudaMemcpy(replay.data(), args.d, bytes, cudaMemcpyDeviceToHost));
    identical += replay == eager;
  }
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  return identical;
}

}  // namespace

TEST_CASE("every recipe pair on the GPU equals the host reference bit for bit on exact inputs", "[gpu][dispatch]") {
  auto rng = scalemm::testing::rng(0xE1AC7);
  Handle h;
  // Native-friendly shapes and odd ones that fall back (M=7, 129; N=33; K with a tail; K/128 = 5).
  const Shape shapes[] = {{128, 256, 512}, {264, 136, 640}, {8, 16, 576}, {7, 33, 160}, {129, 256, 640}};
  for (Recipe ra : kAllRecipes)
    for (Recipe rb : kAllRecipes) {
      if ((ra == Recipe::kNvfp4) != (rb == Recipe::kNvfp4)) continue;
      for (const auto& s : shapes)
        for (ScaleFormat f : {ScaleFormat::kCompact, ScaleFormat::kCublasLt})
          for (DType out : {DType::kF32, DType::kBF16}) {
            auto a = scalemm::testing::exact_operand(ra, s.m, s.k, f, rng);
            auto b = scalemm::testing::exact_operand(rb, s.n, s.k, f, rng);
            const Result r = run(h, a, b, out);
            CAPTURE(to_string(ra), to_string(rb), s.m, s.n, s.k, to_string(f), to_string(out), to_string(r.backend));
            CAPTURE(r.cmp.to_string());
            CHECK(r.cmp.bitwise_equal());
          }
    }
}

// Native FP8 kernels on Hopper accumulate each MMA's products with ~14 bits before the fp32
// accumulator (measured 77.8-78.3 dB vs an fp32 reference on H200, whatever the recipe), so their
// floor is 75 dB; the emulated BF16 path accumulates in fp32 and must reach 120 dB.
TEST_CASE("GEMMs on random data agree with the reference: 75 dB native FP8, 120 dB emulated", "[gpu][dispatch]") {
  auto rng = scalemm::testing::rng(0x5EED);
  Handle h;
  const std::pair<Recipe, Recipe> pairs[] = {{Recipe::kTensorwise, Recipe::kTensorwise},
                                             {Recipe::kRowwise, Recipe::kRowwise},
                                             {Recipe::kBlock1x128, Recipe::kBlock1x128},
                                             {Recipe::kBlock1x128, Recipe::kBlock128x128},
                                             {Recipe::kBlock128x128, Recipe::kBlock1x128},
                                             {Recipe::kTensorwise, Recipe::kRowwise},
                                             {Recipe::kMxfp8, Recipe::kMxfp8},
                                             {Recipe::kMxfp8, Recipe::kMxfp8_32x32},
                                             {Recipe::kNvfp4, Recipe::kNvfp4}};
  for (auto [ra, rb] : pairs)
    for (Shape s : {Shape{256, 512, 1024}, Shape{264, 136, 640}, Shape{128, 384, 576}}) {
      auto a = scalemm::testing::random_operand(ra, s.m, s.k, ScaleFormat::kCompact, rng);
      auto b = scalemm::testing::random_operand(rb, s.n, s.k, ScaleFormat::kCompact, rng);
      const Result r = run(h, a, b, DType::kF32);
      std::printf("agreement %-12s x %-12s %4lldx%4lldx%4lld %-14s sqnr %.1f dB, max rel %.2e\n",
                  std::string(to_string(ra)).c_str(), std::string(to_string(rb)).c_str(), (long long)s.m,
                  (long long)s.n, (long long)s.k, std::string(to_string(r.backend)).c_str(), r.cmp.sqnr_db,
                  r.cmp.max_rel_err);
      CAPTURE(to_string(ra), to_string(rb), s.m, s.n, s.k, to_string(r.backend), r.cmp.to_string());
      CHECK(r.cmp.sqnr_db >= (r.backend == Backend::kEmulated ? 120.0 : 75.0));
      // The verify-mode tolerance accepts the correct result.
      GemmArgs shape;
      shape.m = s.m, shape.n = s.n, shape.k = s.k;
      shape.a = a.view(), shape.b = b.view(), shape.d_dtype = DType::kF32;
      Plan plan;
      plan.backend = r.backend;
      double ref_scale = 0.0;
      for (float v : r.ref) ref_scale = std::max(ref_scale, double(std::fabs(v)));
      const auto tol = verify::tolerance_for(shape, plan, ref_scale);
      CHECK(emulation::compare(r.ref.data(), r.gpu.data(), int64_t(r.ref.size()), &tol).within_tolerance());
      CHECK(r.cmp.nonfinite_mismatches == 0);
    }
}

TEST_CASE("fast accumulation runs natively for tensorwise and rowwise and stays close to the reference",
          "[gpu][dispatch]") {
  // The same operands with and without FAST_ACCUM (K = 4096: many MMA steps between promotions). Both
  // against the host reference on identical quantized inputs; the exact call keeps its 75 dB.
  auto rng = scalemm::testing::rng(0xFA5);
  Handle h;
  for (auto [ra, rb] : {std::pair{Recipe::kTensorwise, Recipe::kTensorwise}, std::pair{Recipe::kRowwise, Recipe::kRowwise},
                        std::pair{Recipe::kTensorwise, Recipe::kRowwise}}) {
    auto a = scalemm::testing::random_operand(ra, 256, 4096, ScaleFormat::kCompact, rng);
    auto b = scalemm::testing::random_operand(rb, 512, 4096, ScaleFormat::kCompact, rng);
    const Result exact = run(h, a, b, DType::kF32);
    const Result fast = run(h, a, b, DType::kF32, nullptr, 1.0f, 0, true);
    size_t differ = 0;
    for (size_t i = 0; i < exact.gpu.size(); ++i) differ += exact.gpu[i] != fast.gpu[i];
    std::printf("fast accumulation %-10s x %-10s: exact %.1f dB, fast %.1f dB (%s), %zu of %zu outputs differ\n",
                std::string(to_string(ra)).c_str(), std::string(to_string(rb)).c_str(), exact.cmp.sqnr_db,
                fast.cmp.sqnr_db, std::string(to_string(fast.backend)).c_str(), differ, exact.gpu.size());
    CAPTURE(to_string(ra), to_string(rb), exact.cmp.to_string(), fast.cmp.to_string());
    CHECK(fast.backend != Backend::kReference);
    CHECK(exact.cmp.sqnr_db >= 75.0);
    CHECK(fast.cmp.sqnr_db >= 40.0);
    CHECK(fast.cmp.nonfinite_mismatches == 0);
  }
}

// K = 40 and 48 end in a partial 32-element block; 40 is not a multiple of 16 either.
TEST_CASE("the emulated backend equals the reference for mxfp8, mxfp8-32x32 and nvfp4", "[gpu][dispatch]") {
  auto rng = scalemm::testing::rng(0xE3);
  Handle h;
  for (auto [ra, rb] : {std::pair{Recipe::kMxfp8, Recipe::kMxfp8}, {Recipe::kMxfp8, Recipe::kMxfp8_32x32},
                        {Recipe::kMxfp8_32x32, Recipe::kMxfp8_32x32}, {Recipe::kNvfp4, Recipe::kNvfp4}})
    for (int64_t k : {512, 40, 48}) {
      auto a = scalemm::testing::exact_operand(ra, 256, k, ScaleFormat::kCompact, rng);
      auto b = scalemm::testing::exact_operand(rb, 384, k, ScaleFormat::kCublasLt, rng);
      const Result r = run(h, a, b, DType::kF32);
      CAPTURE(to_string(ra), to_string(rb), k, r.cmp.to_string());
      CHECK(r.backend == Backend::kEmulated);
      CHECK(r.cmp.bitwise_equal());
    }
}

TEST_CASE("a forced backend runs exactly that backend and still matches", "[gpu][dispatch]") {
  auto rng = scalemm::testing::rng(0xF0);
  Handle h;
  auto a = scalemm::testing::exact_operand(Recipe::kBlock1x128, 128, 512, ScaleFormat::kCompact, rng);
  auto b = scalemm::testing::exact_operand(Recipe::kBlock128x128, 256, 512, ScaleFormat::kCompact, rng);
  PlanOptions ref;
  ref.force = Backend::kReference;
  const Result r = run(h, a, b, DType::kBF16, &ref);
  CHECK(r.backend == Backend::kReference);
  CHECK(r.cmp.bitwise_equal());
}

TEST_CASE("a captured CUDA graph replays 100 times bit-identically", "[gpu][dispatch]") {
  auto rng = scalemm::testing::rng(0x6A);
  Handle h;
  for (auto [ra, rb] : {std::pair{Recipe::kBlock1x128, Recipe::kBlock128x128}, {Recipe::kMxfp8, Recipe::kMxfp8}}) {
    auto ha = scalemm::testing::random_operand(ra, 256, 1024, ScaleFormat::kCompact, rng);
    auto hb = scalemm::testing::random_operand(rb, 512, 1024, ScaleFormat::kCompact, rng);
    DeviceOperand a(ha), b(hb);
    const size_t bytes = 256 * 512 * 2;
    Dev d(bytes);
    cudaStream_t s;
    SCALEMM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    GemmArgs args;
    args.m = 256, args.n = 512, args.k = 1024;
    args.a = a.op, args.b = b.op, args.d = d.p, args.d_dtype = DType::kBF16;
    CAPTURE(to_string(ra), to_string(rb));
    CHECK(graph_replays_identical(h, args, s, bytes, 100) == 100);
    cudaStreamDestroy(s);
  }
}

TEST_CASE("8 threads x 100 calls on one handle are bit-identical to serial calls", "[gpu][dispatch]") {
  auto rng = scalemm::testing::rng(0x8);
  Handle h;
  struct Job {
    HostOperand a, b;
  };
  std::vector<Job> jobs;
  for (int t = 0; t < 8; ++t) {
    const Recipe ra = t % 2 ? Recipe::kBlock1x128 : Recipe::kMxfp8;
    const Recipe rb = t % 2 ? Recipe::kBlock128x128 : Recipe::kMxfp8;
    jobs.push_back({scalemm::testing::random_operand(ra, 128, 512, ScaleFormat::kCompact, rng),
                    scalemm::testing::random_operand(rb, 256, 512, ScaleFormat::kCompact, rng)});
  }
  const size_t bytes = 128 * 256 * 2;
  std::vector<std::vector<uint8_t>> serial(8, std::vector<uint8_t>(bytes));
  for (int t = 0; t < 8; ++t) {
    DeviceOperand a(jobs[t].a), b(jobs[t].b);
    Dev d(bytes);
    GemmArgs args;
    args.m = 128, args.n = 256, args.k = 512;
    args.a = a.op, args.b = b.op, args.d = d.p, args.d_dtype = DType::kBF16;
    h.gemm(args, nullptr);
    SCALEMM_CUDA_CHECK(cudaMemcpy(serial[t].data(), d.p, bytes, cudaMemcpyDeviceToHost));
  }
  std::atomic<int> identical{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      try {
        DeviceOperand a(jobs[t].a), b(jobs[t].b);
        Dev d(bytes);
        cudaStream_t s;
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        GemmArgs args;
        args.m = 128, args.n = 256, args.k = 512;
        args.a = a.op, args.b = b.op, args.d = d.p, args.d_dtype = DType::kBF16;
        std::vector<uint8_t> got(bytes);
        for (int i = 0; i < 100; ++i) {
          // Half the threads share the default stream, half have their own.
          const Stream st = t % 2 ? reinterpret_cast<Stream>(s) : nullptr;
          h.gemm(args, st);
          cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(st));
          cudaMemcpy(got.data(), d.p, bytes, cudaMemcpyDeviceToHost);
          identical += got == serial[t];
        }
        cudaStreamDestroy(s);
      } catch (...) {
        ++errors;
      }
    });
  for (auto& th : threads) th.join();
  CHECK(errors == 0);
  CHECK(identical == 800);
}

TEST_CASE("verification passes correct calls and names the worst element of a wrong one", "[gpu][dispatch]") {
  auto rng = scalemm::testing::rng(0x7E);
  auto ha = scalemm::testing::random_operand(Recipe::kBlock1x128, 128, 512, ScaleFormat::kCompact, rng);
  auto hb = scalemm::testing::random_operand(Recipe::kBlock128x128, 256, 512, ScaleFormat::kCompact, rng);
  DeviceOperand a(ha), b(hb);
  Dev d(128 * 256 * 4);
  GemmArgs args;
  args.m = 128, args.n = 256, args.k = 512;
  args.a = a.op, args.b = b.op, args.d = d.p, args.d_dtype = DType::kF32;
  Handle h;
  h.gemm(args, nullptr);
  const Plan p = h.plan(args);
  CHECK_NOTHROW(verify::check(args, p, verify::Mode::kFull, nullptr));
  CHECK_NOTHROW(verify::check(args, p, verify::Mode::kSample, nullptr));
  // Corrupt one output element that the sampled rows/columns also see: a whole row.
  std::vector<float> row(256, 1e6f);
  SCALEMM_CUDA_CHECK(cudaMemcpy(static_cast<float*>(d.p) + 5 * 256, row.data(), 256 * 4, cudaMemcpyHostToDevice));
  for (auto mode : {verify::Mode::kFull, verify::Mode::kSample}) {
    try {
      verify::check(args, p, mode, nullptr);
      FAIL("a corrupted output passed verification");
    } catch (const Error& e) {
      CHECK(e.code() == StatusCode::kVerificationFailed);
      CHECK_THAT(std::string(e.what()), Catch::Contains("D[5,"));
      CHECK_THAT(std::string(e.what()), Catch::Contains("native"));
    }
  }
}

// Every FP8 and E2M1 byte pattern, scale codes across their whole range (NaN included) and two shifts,
// K with and without a partial last block, through the emulated backend's dequantization, against
// formats.hpp: bf16(decode(x) * decode(scale) * 2^shift), bit for bit (NaN as NaN).
TEST_CASE("the emulated dequantization to bf16 equals formats.hpp for every data and scale code", "[gpu][dispatch]") {
  const int64_t rows = 3;
  for (auto [recipe, dtype] : {std::pair{Recipe::kMxfp8, DType::kE4M3}, {Recipe::kMxfp8, DType::kE5M2},
                               {Recipe::kNvfp4, DType::kE2M1}})
    for (int64_t k : {512, 520})  // 520: a partial last block
      for (ScaleFormat f : {ScaleFormat::kCompact, ScaleFormat::kCublasLt})
        for (int shift : {0, 3}) {
          const bool fp4 = dtype == DType::kE2M1;
          const layouts::ScaleLayout l(recipe, rows, k, f);
          const int64_t row_bytes = fp4 ? k / 2 : k;
          std::vector<uint8_t> data(size_t(rows * row_bytes)), scales(size_t(l.bytes()), 0);
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t i = 0; i < row_bytes; ++i) data[size_t(r * row_bytes + i)] = uint8_t(i + 37 * r);
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t kb = 0; kb < l.kblocks(); ++kb) {
              int c = int((kb * 29 + r * 101) % 256);  // E8M0 0..255 (255: NaN); UE4M3 below
              if (shift > 0 && c > 251 && c < 255) c -= 8;  // the prepare step never shifts past 2^127
              scales[size_t(l.offset(r, kb))] = uint8_t(fp4 ? c % 128 : c);
            }
          scales[size_t(l.offset(0, 1))] = fp4 ? 0x7F : 0xFF;  // a NaN scale code in every case
          Dev d_data(data), d_scales(scales), d_out(size_t(rows * k) * 2), d_shifts(sizeof(backends::EmulatedShifts));
          backends::EmulatedShifts sh{};
          sh.shift[0] = shift;
          SCALEMM_CUDA_CHECK(cudaMemcpy(d_shifts.p, &sh, sizeof sh, cudaMemcpyHostToDevice));
          SCALEMM_CUDA_CHECK(cudaMemset(d_out.p, 0xFF, d_out.bytes));
          const backends::EmulatedOperand op{d_data.p, dtype, d_scales.p, l};
          backends::emulated_dequantize_bf16(op, d_shifts.as<backends::EmulatedShifts>(), 0, d_out.as<uint16_t>(),
                                             nullptr);
          SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
          std::vector<uint16_t> got(size_t(rows * k));
          SCALEMM_CUDA_CHECK(cudaMemcpy(got.data(), d_out.p, d_out.bytes, cudaMemcpyDeviceToHost));
          int64_t wrong = 0, nan = 0;
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t kk = 0; kk < k; ++kk) {
              const uint8_t byte = data[size_t(r * row_bytes + (fp4 ? kk / 2 : kk))];
              const float x = fp4 ? formats::decode_e2m1(uint8_t(kk % 2 ? byte >> 4 : byte & 0xF))
                                  : dtype == DType::kE4M3 ? formats::decode_e4m3(byte) : formats::decode_e5m2(byte);
              const uint8_t code = scales[size_t(l.offset(r, kk / l.block_k()))];
              const float sc = fp4 ? formats::decode_ue4m3(code) : formats::decode_e8m0(code);
              const float want = x * sc * std::ldexp(1.0f, shift);
              const uint16_t g = got[size_t(r * k + kk)];
              const bool g_nan = (g & 0x7F80) == 0x7F80 && (g & 0x7F) != 0;
              if (std::isnan(want)) nan += 1, wrong += !g_nan;
              else wrong += g != formats::encode_bf16(want);
            }
          CAPTURE(to_string(dtype), k, to_string(f), shift, wrong);
          CHECK(wrong == 0);
          CHECK(nan > 0);  // the NaN codes (E8M0 255, FP8 NaN patterns, UE4M3 0x7F) took part
        }
}

// A compact mxfp8 operand of small E4M3 values (1..3, either sign; times 2^-9, subnormal, when asked)
// whose E8M0 scale codes are drawn from [lo_code, hi_code].
template <class Rng>
HostOperand mxfp8_coded(Rng& rng, int64_t rows, int64_t k, int lo_code, int hi_code, bool subnormal_data) {
  HostOperand op;
  op.recipe = Recipe::kMxfp8;
  op.dtype = DType::kE4M3;
  op.format = ScaleFormat::kCompact;
  op.rows = rows, op.k = k;
  std::uniform_int_distribution<int> mag(1, 3), sign(0, 1), code(lo_code, hi_code);
  op.data.resize(size_t(rows * k));
  for (auto& b : op.data) {
    const float v = float(mag(rng)) * (sign(rng) ? -1.0f : 1.0f) * (subnormal_data ? std::ldexp(1.0f, -9) : 1.0f);
    b = formats::encode_e4m3(v);
  }
  op.scales.assign(size_t(op.layout().bytes()), 0);
  for (auto& c : op.scales) c = uint8_t(code(rng));
  return op;
}

// E4M3 x 2^(c-127) is exact in BF16 only for E8M0 codes in [3, 246]: below, values fall under BF16's
// subnormal floor (2^-133) although fp32 (the reference) still holds them. The emulated backend must
// shift such an operand up by a power of two and fold the shift into alpha, and stay bit-exact.
TEST_CASE("the emulated backend stays exact when scale codes leave the BF16-exact range", "[gpu][dispatch]") {
  auto rng = scalemm::testing::rng(0xB16);
  const int64_t m = 256, n = 384, k = 512;
  // A: tiny values (m * 2^-9 with scale codes 0..2, i.e. down to 2^-136); B: large (codes 247..250).
  const HostOperand a = mxfp8_coded(rng, m, k, 0, 2, true), b = mxfp8_coded(rng, n, k, 247, 250, false);
  Handle h;
  const Result r = run(h, a, b, DType::kF32, nullptr, 0.75f);
  CAPTURE(r.cmp.to_string());
  CHECK(r.backend == Backend::kEmulated);
  CHECK(r.cmp.bitwise_equal());
  int64_t nonzero = 0;
  for (float v : r.ref) nonzero += v != 0.0f;
  CHECK(nonzero > int64_t(r.ref.size()) / 2);  // the test is not vacuous: the products are not all zero
}

// The prepare step scans compact MX scales 16 codes per 16-byte load when the buffer is aligned; at an
// odd address, and for the codes past the last whole 16 (7 x 3 = 21 codes here), it reads bytes. Codes
// 0..2 with subnormal data force both the per-block data check and a nonzero shift.
TEST_CASE("the emulated backend stays exact with compact MX scales at an odd address and a ragged code count",
          "[gpu][dispatch]") {
  auto rng = scalemm::testing::rng(0x0DD);
  const int64_t k = 96;
  const HostOperand a = mxfp8_coded(rng, 7, k, 0, 2, true), b = mxfp8_coded(rng, 33, k, 247, 250, false);
  for (size_t offset : {size_t(0), size_t(1), size_t(5)}) {
    Handle h;
    const Result r = run(h, a, b, DType::kF32, nullptr, 1.0f, offset);
    CAPTURE(offset, r.cmp.to_string());
    CHECK(r.backend == Backend::kEmulated);
    CHECK(r.cmp.bitwise_equal());
    int64_t nonzero = 0;
    for (float v : r.ref) nonzero += v != 0.0f;
    CHECK(nonzero > int64_t(r.ref.size()) / 2);
  }
}

// Scale grids whose rows share codes (mxfp8-32x32, cuBLASLt's tiles) are scanned row by row, four
// codes per 32-bit load where the four lie together: at a buffer address that is not 4-byte aligned
// the load must fall back to bytes (an expert's grid in a grouped call starts wherever the previous
// one ended: 7 bytes per expert here at K = 208).
TEST_CASE("the emulated backend reads MX scale grids at any byte address", "[gpu][dispatch]") {
  auto rng = scalemm::testing::rng(0x0DE);
  for (int64_t k : {int64_t(208), int64_t(640)}) {
    const HostOperand a = scalemm::testing::exact_operand(Recipe::kMxfp8, 7, k, ScaleFormat::kCompact, rng);
    const HostOperand b = scalemm::testing::exact_operand(Recipe::kMxfp8_32x32, 33, k, ScaleFormat::kCompact, rng);
    for (size_t offset : {size_t(0), size_t(1), size_t(3), size_t(7)}) {
      Handle h;
      const Result r = run(h, a, b, DType::kF32, nullptr, 1.0f, offset);
      CAPTURE(k, offset, r.cmp.to_string());
      CHECK(r.backend == Backend::kEmulated);
      CHECK(r.cmp.bitwise_equal());
      CHECK(cudaGetLastError() == cudaSuccess);
    }
  }
}

TEST_CASE("sample verification runs asynchronously and reports a wrong result at the next check",
          "[gpu][dispatch]") {
  auto rng = scalemm::testing::rng(0xA5);
  auto ha = scalemm::testing::random_operand(Recipe::kBlock1x128, 256, 1024, ScaleFormat::kCompact, rng);
  auto hb = scalemm::testing::random_operand(Recipe::kBlock128x128, 512, 1024, ScaleFormat::kCompact, rng);
  DeviceOperand a(ha), b(hb);
  Dev d(256 * 512 * 2);
  GemmArgs args;
  args.m = 256, args.n = 512, args.k = 1024;
  args.a = a.op, args.b = b.op, args.d = d.p, args.d_dtype = DType::kBF16;
  setenv("SCALEMM_VERIFY", "sample", 1);
  Handle h;
  unsetenv("SCALEMM_VERIFY");
  for (int i = 0; i < 20; ++i) h.gemm(args, nullptr);  // correct calls: nothing to report
  CHECK_NOTHROW(h.check_verification());

  // A wrong result (every element doubled) must be caught by the sampler.
  verify::AsyncSampler sampler;
  SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> host(256 * 512);
  SCALEMM_CUDA_CHECK(cudaMemcpy(host.data(), d.p, host.size() * 2, cudaMemcpyDeviceToHost));
  for (auto& v : host) v = formats::encode_bf16(2.0f * formats::decode_bf16(v) + 1.0f);
  SCALEMM_CUDA_CHECK(cudaMemcpy(d.p, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
  sampler.enqueue(args, h.plan(args), nullptr);
  try {
    sampler.drain();
    FAIL("a doubled output passed the sample check");
  } catch (const Error& e) {
    CHECK(e.code() == StatusCode::kVerificationFailed);
    CHECK_THAT(std::string(e.what()), Catch::Contains("sampled elements outside tolerance"));
  }
}

namespace {
// D = A * B^T on the GPU through `h` with device copies of the host operands; returns D's bytes.
std::vector<uint8_t> gpu_result(Handle& h, const HostOperand& ha, const HostOperand& hb, DType out) {
  DeviceOperand a(ha), b(hb);
  const size_t bytes = size_t(ha.rows * hb.rows) * out_bytes(out);
  Dev d(bytes);
  SCALEMM_CUDA_CHECK(cudaMemset(d.p, 0xFF, bytes));
  GemmArgs args;
  args.m = ha.rows, args.n = hb.rows, args.k = ha.k;
  args.a = a.op, args.b = b.op, args.d = d.p, args.d_dtype = out;
  h.gemm(args, nullptr);
  SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint8_t> raw(bytes);
  SCALEMM_CUDA_CHECK(cudaMemcpy(raw.data(), d.p, bytes, cudaMemcpyDeviceToHost));
  return raw;
}
}  // namespace

// Small compact scale buffers are converted for cuBLASLt by one fused launch, large ones by the
// bandwidth kernels of layouts::gpu; both must hand cuBLASLt exactly the buffer the host conversion
// makes, so the output equals the run with scales already in cuBLASLt format bit for bit.
TEST_CASE("compact blockwise scales, small and large, give the same output as cuBLASLt-format scales",
          "[gpu][dispatch]") {
  // A's 1x128 scales: 264 x 5 (fused path) and 8320 x 33 = 274560 elements (bandwidth path).
  for (Shape s : {Shape{264, 136, 640}, Shape{8320, 256, 4224}}) {
    auto r1 = scalemm::testing::rng(0xC0 + uint64_t(s.m));
    auto r2 = scalemm::testing::rng(0xC0 + uint64_t(s.m));
    const auto ac = scalemm::testing::exact_operand(Recipe::kBlock1x128, s.m, s.k, ScaleFormat::kCompact, r1);
    const auto bc = scalemm::testing::exact_operand(Recipe::kBlock128x128, s.n, s.k, ScaleFormat::kCompact, r1);
    const auto al = scalemm::testing::exact_operand(Recipe::kBlock1x128, s.m, s.k, ScaleFormat::kCublasLt, r2);
    const auto bl = scalemm::testing::exact_operand(Recipe::kBlock128x128, s.n, s.k, ScaleFormat::kCublasLt, r2);
    REQUIRE(ac.data == al.data);  // same seed: same values, different scale layout
    Handle h;
    const auto compact = gpu_result(h, ac, bc, DType::kBF16);
    const auto cublaslt = gpu_result(h, al, bl, DType::kBF16);
    CAPTURE(s.m, s.n, s.k);
    CHECK(compact == cublaslt);
  }
}

TEST_CASE("autotuned handles agree with the reference and with each other bit for bit", "[gpu][dispatch]") {
  auto rng = scalemm::testing::rng(0xA7);
  HandleOptions ho;
  ho.autotune = Autotune::kOn;
  for (auto [ra, rb] : {std::pair{Recipe::kTensorwise, Recipe::kTensorwise}, {Recipe::kRowwise, Recipe::kRowwise},
                        {Recipe::kMxfp8, Recipe::kMxfp8}}) {
    auto a = scalemm::testing::random_operand(ra, 512, 2048, ScaleFormat::kCompact, rng);
    auto b = scalemm::testing::random_operand(rb, 1024, 2048, ScaleFormat::kCompact, rng);
    Handle h1(ho), h2(ho);
    const Result r = run(h1, a, b, DType::kF32);
    CAPTURE(to_string(ra), to_string(r.backend), r.cmp.to_string());
    CHECK(r.cmp.sqnr_db >= (r.backend == Backend::kEmulated ? 120.0 : 75.0));
    // The second handle reuses the process-wide choice: same algorithm, same bits.
    CHECK(gpu_result(h1, a, b, DType::kBF16) == gpu_result(h2, a, b, DType::kBF16));
  }
}

TEST_CASE("blockwise GEMMs with M = 1, 2, 3, 5 run natively on A padded to 4 rows and equal the reference",
          "[gpu][dispatch]") {
  auto rng = scalemm::testing::rng(0xDEC0);
  Handle h;
  for (int64_t m : {1, 2, 3, 5})
    for (ScaleFormat f : {ScaleFormat::kCompact, ScaleFormat::kCublasLt})
      for (auto [ra, rb] : {std::pair{Recipe::kBlock1x128, Recipe::kBlock128x128}, {Recipe::kBlock1x128, Recipe::kBlock1x128}}) {
        auto a = scalemm::testing::exact_operand(ra, m, 640, f, rng);
        auto b = scalemm::testing::exact_operand(rb, 264, 640, f, rng);
        const Result r = run(h, a, b, DType::kBF16);
        CAPTURE(m, to_string(f), to_string(ra), to_string(rb), to_string(r.backend), r.cmp.to_string());
        CHECK(r.backend == Backend::kConvertNative);
        CHECK(r.cmp.bitwise_equal());
        // Random data: the native FP8 agreement floor, as for unpadded shapes.
        auto ra_ = scalemm::testing::random_operand(ra, m, 2048, f, rng);
        auto rb_ = scalemm::testing::random_operand(rb, 512, 2048, f, rng);
        const Result q = run(h, ra_, rb_, DType::kF32);
        CAPTURE(q.cmp.to_string());
        CHECK(q.cmp.sqnr_db >= 75.0);
      }
}

namespace {
// D in FP8 with a D scale (and amax) through `h` on the GPU and through the host reference.
struct Fp8Out {
  Backend backend;
  std::vector<uint8_t> gpu, ref;
  float gpu_amax = -1.0f, ref_amax = -1.0f;
};
Fp8Out run_fp8_out(Handle& h, const HostOperand& ha, const HostOperand& hb, DType out, float ds) {
  DeviceOperand a(ha), b(hb);
  const size_t count = size_t(ha.rows * hb.rows);
  Dev d(count), scal(2 * sizeof(float));
  SCALEMM_CUDA_CHECK(cudaMemset(d.p, 0xFF, count));  // poison (0xFF is NaN in e4m3 and e5m2)
  const float init[2] = {ds, -1.0f};
  SCALEMM_CUDA_CHECK(cudaMemcpy(scal.p, init, sizeof(init), cudaMemcpyHostToDevice));
  GemmArgs args;
  args.m = ha.rows, args.n = hb.rows, args.k = ha.k;
  args.a = a.op, args.b = b.op, args.d = d.p, args.d_dtype = out;
  args.d_scale = scal.as<float>(), args.d_amax = scal.as<float>() + 1;
  Fp8Out r;
  r.backend = h.plan(args).backend;
  h.gemm(args, nullptr);
  SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
  r.gpu.resize(count);
  SCALEMM_CUDA_CHECK(cudaMemcpy(r.gpu.data(), d.p, count, cudaMemcpyDeviceToHost));
  float back[2];
  SCALEMM_CUDA_CHECK(cudaMemcpy(back, scal.p, sizeof(back), cudaMemcpyDeviceToHost));
  r.gpu_amax = back[1];
  GemmArgs host = args;
  host.a = ha.view(), host.b = hb.view(), host.space = MemorySpace::kHost;
  r.ref.assign(count, 0);
  host.d = r.ref.data(), host.d_scale = &ds, host.d_amax = &r.ref_amax;
  Handle hh;
  hh.gemm(host);
  return r;
}
float fp8_value(uint8_t v, DType t) { return t == DType::kE4M3 ? formats::decode_e4m3(v) : formats::decode_e5m2(v); }
}  // namespace

// Exact inputs: every output and the amax are exact in fp32, so cuBLASLt's FP8 epilogue (tensorwise)
// and the staged fp32 D + conversion (other pairs) must give the host reference's bytes, saturation
// included: the second D scale is the power of two that takes the first run's amax to at least
// 2 x 448 (a fixed scale saturated nothing for some seeds' operands).
TEST_CASE("FP8 output with a D scale and amax equals the reference bit for bit on exact inputs", "[gpu][dispatch]") {
  auto rng = scalemm::testing::rng(0xF8);
  Handle h;
  const std::pair<Recipe, Recipe> pairs[] = {{Recipe::kTensorwise, Recipe::kTensorwise},
                                             {Recipe::kRowwise, Recipe::kRowwise},
                                             {Recipe::kBlock1x128, Recipe::kBlock128x128},
                                             {Recipe::kMxfp8, Recipe::kMxfp8}};
  for (auto [ra, rb] : pairs) {
    auto a = scalemm::testing::exact_operand(ra, 128, 512, ScaleFormat::kCompact, rng);
    auto b = scalemm::testing::exact_operand(rb, 256, 512, ScaleFormat::kCompact, rng);
    float amax = 0.0f;
    for (int pass = 0; pass < 2; ++pass) {
      const float ds = pass == 0 ? 0.5f : std::exp2(std::ceil(std::log2(2.0f * 448.0f / amax)));
      const Fp8Out r = run_fp8_out(h, a, b, DType::kE4M3, ds);
      amax = r.ref_amax;
      REQUIRE(amax > 0.0f);
      int64_t diff = 0, saturated = 0;
      for (size_t i = 0; i < r.gpu.size(); ++i) {
        diff += r.gpu[i] != r.ref[i];
        saturated += (r.ref[i] & 0x7F) == 0x7E;
      }
      CAPTURE(to_string(ra), to_string(rb), ds, to_string(r.backend), diff, saturated, r.gpu_amax, r.ref_amax);
      CHECK(r.backend == (ra == Recipe::kMxfp8 ? Backend::kEmulated : Backend::kNative));
      CHECK(diff == 0);
      CHECK(r.gpu_amax == r.ref_amax);
      if (pass == 1) CHECK(saturated > 0);
    }
  }
}

// Random data: native FP8 accumulation differs from the fp32 reference by ~2^-13 of the output's
// magnitude, so some outputs round to a neighbouring FP8 value. Bound per element, in the scaled
// domain (d_scale maps the amax to the format's maximum): one FP8 step at the element's magnitude
// (relative 2^-3 e4m3, 2^-2 e5m2) plus the accumulation bound 2^-10 of the maximum (near zero the FP8
// subnormal steps are finer than the accumulation difference).
TEST_CASE("FP8 output on random data is within one FP8 step plus the accumulation bound of the reference",
          "[gpu][dispatch]") {
  auto rng = scalemm::testing::rng(0xF9);
  Handle h;
  for (DType out : {DType::kE4M3, DType::kE5M2}) {
    auto a = scalemm::testing::random_operand(Recipe::kTensorwise, 256, 1024, ScaleFormat::kCompact, rng,
                                              out == DType::kE5M2 ? DType::kE5M2 : DType::kE4M3);
    auto b = scalemm::testing::random_operand(Recipe::kTensorwise, 512, 1024, ScaleFormat::kCompact, rng);
    // d_scale from the reference's amax, as current scaling would choose it.
    const Fp8Out probe = run_fp8_out(h, a, b, out, 1.0f);
    const float fmax = out == DType::kE4M3 ? 448.0f : 57344.0f;
    const float ds = fmax / probe.ref_amax;
    const Fp8Out r = run_fp8_out(h, a, b, out, ds);
    const double step = out == DType::kE4M3 ? 0.125 : 0.25, acc = std::ldexp(double(fmax), -10);
    int64_t differ = 0, worse = 0;
    double worst = 0.0;
    for (size_t i = 0; i < r.gpu.size(); ++i) {
      if (r.gpu[i] == r.ref[i]) continue;
      ++differ;
      const double vg = fp8_value(r.gpu[i], out), vr = fp8_value(r.ref[i], out);
      const double err = std::fabs(vg - vr), bound = step * std::max(std::fabs(vg), std::fabs(vr)) + acc;
      worst = std::max(worst, err / bound);
      worse += err > bound;
    }
    std::printf("FP8 output %s, %s: %lld of %zu outputs differ from the reference (worst at %.2f of the bound), "
                "amax %.6g vs %.6g\n",
                std::string(to_string(out)).c_str(), std::string(to_string(r.backend)).c_str(), (long long)differ,
                r.gpu.size(), worst, r.gpu_amax, r.ref_amax);
    CAPTURE(to_string(out), to_string(r.backend), differ, worse, worst);
    CHECK(r.backend == Backend::kNative);
    CHECK(worse == 0);
    CHECK(differ * 50 < int64_t(r.gpu.size()));  // under 2%
    CHECK(std::fabs(r.gpu_amax - r.ref_amax) <= 1e-3f * r.ref_amax);
  }
}

TEST_CASE("verification accepts correct FP8-output calls in full and sample mode", "[gpu][dispatch]") {
  auto rng = scalemm::testing::rng(0xFA);
  auto ha = scalemm::testing::random_operand(Recipe::kBlock1x128, 128, 1024, ScaleFormat::kCompact, rng);
  auto hb = scalemm::testing::random_operand(Recipe::kBlock128x128, 256, 1024, ScaleFormat::kCompact, rng);
  for (VerifyMode mode : {VerifyMode::kFull, VerifyMode::kSample}) {
    HandleOptions ho;
    ho.verify = mode;
    Handle h(ho);
    CHECK_NOTHROW(run_fp8_out(h, ha, hb, DType::kE4M3, 4.0f));
    CHECK_NOTHROW(h.check_verification());
  }
}

namespace {
// One blockwise call through `h` into D at `d_offset` bytes past an aligned buffer; D's bytes back.
std::vector<uint8_t> blockwise_d(Handle& h, const DeviceOperand& a, const DeviceOperand& b, int64_t m, int64_t n,
                                 int64_t k, size_t d_offset, cudaStream_t s = nullptr, Backend* ran = nullptr) {
  const size_t bytes = size_t(m * n) * 2;
  Dev d(bytes + d_offset);
  SCALEMM_CUDA_CHECK(cudaMemset(d.p, 0xFF, bytes + d_offset));
  GemmArgs args;
  args.m = m, args.n = n, args.k = k;
  args.a = a.op, args.b = b.op, args.d = static_cast<char*>(d.p) + d_offset, args.d_dtype = DType::kBF16;
  if (ran) *ran = h.plan(args, s).backend;
  h.gemm(args, s);
  SCALEMM_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint8_t> raw(bytes);
  SCALEMM_CUDA_CHECK(cudaMemcpy(raw.data(), static_cast<char*>(d.p) + d_offset, bytes, cudaMemcpyDeviceToHost));
  return raw;
}

// The same blockwise call through `h` (expected on the contiguous kernel) and through `native` (a
// handle forcing cuBLASLt): the two write the same bytes.
void check_equals_cublaslt(Handle& h, Handle& native, const DeviceOperand& a, const DeviceOperand& b, Shape s) {
  Backend ours = Backend::kReference, theirs = Backend::kReference;
  const auto mine = blockwise_d(h, a, b, s.m, s.n, s.k, 0, nullptr, &ours);
  const auto lts = blockwise_d(native, a, b, s.m, s.n, s.k, 0, nullptr, &theirs);
  size_t differ = 0;
  for (size_t i = 0; i < mine.size(); i += 2) differ += std::memcmp(&mine[i], &lts[i], 2) != 0;
  CAPTURE(s.m, s.n, s.k, differ);
  CHECK(ours == Backend::kContiguous);
  CHECK(theirs == Backend::kNative);
  CHECK(differ == 0);
}
}  // namespace

// The contiguous backend: dense blockwise calls at small M over wide N run scalemm's own kernel as one
// group, reading the scales in place in either format. Exact inputs give the reference's bytes; random
// ones the native FP8 agreement floor and cuBLASLt's bytes (the two promote each K block alike).
TEST_CASE("dense blockwise at small M runs scalemm's kernel, exact against the reference and cuBLASLt",
          "[gpu][dispatch][contiguous]") {
  auto rng = scalemm::testing::rng(0xC0DE);
  std::printf("contiguous dense: seed 0xC0DE\n");
  Handle h;
  {
    auto a = scalemm::testing::exact_operand(Recipe::kBlock1x128, 16, 512, ScaleFormat::kCompact, rng);
    auto b = scalemm::testing::exact_operand(Recipe::kBlock128x128, 7168, 512, ScaleFormat::kCompact, rng);
    if (run(h, a, b, DType::kBF16).backend != Backend::kContiguous) {
      GemmArgs probe;
      probe.m = 16, probe.n = 7168, probe.k = 512, probe.a = a.view(), probe.b = b.view();
      probe.space = MemorySpace::kDevice;
      WARN("SKIPPED: " << h.plan(probe).explain());
      REQUIRE_THAT(h.plan(probe).explain(), Catch::Contains("not built"));
      return;
    }
  }
  // M = 1, 7, 64 (the second warpgroup idle), 129, 256; a K tail (1040 = 8 blocks + 16), K / 128 = 5
  // (cuBLASLt's B scales padded to 8 K blocks); N off a 128 multiple. Compact and cuBLASLt-format scales
  // (A's column-major over M rounded up to 4, B's K blocks padded to a multiple of 4), and one of each.
  const ScaleFormat kC = ScaleFormat::kCompact, kLt = ScaleFormat::kCublasLt;
  for (auto [fa, fb] : {std::pair{kC, kC}, {kLt, kLt}, {kC, kLt}})
    for (Shape s : {Shape{1, 7168, 512}, Shape{7, 7176, 1040}, Shape{64, 7168, 640}, Shape{129, 6784, 640},
                    Shape{256, 7168, 512}}) {
      auto a = scalemm::testing::exact_operand(Recipe::kBlock1x128, s.m, s.k, fa, rng);
      auto b = scalemm::testing::exact_operand(Recipe::kBlock128x128, s.n, s.k, fb, rng);
      const Result r = run(h, a, b, DType::kBF16, nullptr, s.m == 7 ? 0.5f : 1.0f);
      CAPTURE(to_string(fa), to_string(fb), s.m, s.n, s.k, to_string(r.backend), r.cmp.to_string());
      CHECK(r.backend == Backend::kContiguous);
      CHECK(r.cmp.bitwise_equal());
    }
  // Random data: the native floor, and cuBLASLt's bytes (forced native, M % 4 == 0), in both formats.
  HandleOptions lt;
  lt.plan.force = Backend::kNative;
  Handle native(lt);
  for (ScaleFormat f : {kC, kLt})
    for (Shape s : {Shape{16, 7168, 2048}, Shape{128, 10240, 1024}}) {
      auto ha = scalemm::testing::random_operand(Recipe::kBlock1x128, s.m, s.k, f, rng);
      auto hb = scalemm::testing::random_operand(Recipe::kBlock128x128, s.n, s.k, f, rng);
      const Result r = run(h, ha, hb, DType::kBF16);
      CAPTURE(to_string(f), s.m, s.n, s.k, r.cmp.to_string());
      CHECK(r.backend == Backend::kContiguous);
      CHECK(r.cmp.sqnr_db >= 40.0);  // bf16 output: its rounding bounds the agreement
      check_equals_cublaslt(h, native, DeviceOperand(ha), DeviceOperand(hb), s);
    }
}

// Dense blockwise at the largest outputs (M >= 4096, N and K >= 2048, 2^25 output elements) also runs
// the kernel under auto; on random data it writes cuBLASLt's bytes, a K tail and both scale formats included.
TEST_CASE("dense blockwise at the largest outputs runs scalemm's kernel and equals cuBLASLt bit for bit",
          "[gpu][dispatch][contiguous]") {
  auto rng = scalemm::testing::rng(0xC0E0);
  std::printf("contiguous large: seed 0xC0E0\n");
  Handle h;
  HandleOptions lt;
  lt.plan.force = Backend::kNative;
  Handle native(lt);
  for (auto [s, f] : {std::pair{Shape{4096, 8192, 2048}, ScaleFormat::kCompact},
                      std::pair{Shape{4100, 8200, 2112}, ScaleFormat::kCublasLt}}) {
    auto ha = scalemm::testing::random_operand(Recipe::kBlock1x128, s.m, s.k, f, rng);
    auto hb = scalemm::testing::random_operand(Recipe::kBlock128x128, s.n, s.k, f, rng);
    DeviceOperand a(ha), b(hb);
    GemmArgs probe;
    probe.m = s.m, probe.n = s.n, probe.k = s.k, probe.a = a.op, probe.b = b.op;
    const Plan plan = h.plan(probe);
    if (plan.backend != Backend::kContiguous) {
      WARN("SKIPPED: " << plan.explain());
      REQUIRE_THAT(plan.explain(), Catch::Contains("not built"));
      return;
    }
    CAPTURE(to_string(f));
    check_equals_cublaslt(h, native, a, b, s);
  }
}

TEST_CASE("the contiguous backend forced at any shape, D off alignment, in a graph and verified",
          "[gpu][dispatch][contiguous]") {
  auto rng = scalemm::testing::rng(0xC0DF);
  std::printf("contiguous forced: seed 0xC0DF\n");
  HandleOptions ho;
  ho.plan.force = Backend::kContiguous;
  ho.verify = VerifyMode::kFull;  // every call checked against the reference inside gemm()
  Handle forced(ho);
  Handle h;
  const Shape s{300, 264, 640};  // auto keeps this on cuBLASLt
  auto ha = scalemm::testing::exact_operand(Recipe::kBlock1x128, s.m, s.k, ScaleFormat::kCompact, rng);
  auto hb = scalemm::testing::exact_operand(Recipe::kBlock128x128, s.n, s.k, ScaleFormat::kCompact, rng);
  GemmArgs probe;
  probe.m = s.m, probe.n = s.n, probe.k = s.k, probe.a = ha.view(), probe.b = hb.view();
  probe.space = MemorySpace::kDevice;
  std::string why;
  try {
    forced.plan(probe);
  } catch (const Error& e) {
    why = e.what();
  }
  if (!why.empty()) {
    WARN("SKIPPED: " << why);
    REQUIRE_THAT(why, Catch::Contains("not built"));
    return;
  }
  CHECK(h.plan(probe).backend == Backend::kNative);
  const Result r = run(forced, ha, hb, DType::kBF16, &ho.plan);
  CHECK(r.backend == Backend::kContiguous);
  CHECK(r.cmp.bitwise_equal());
  DeviceOperand a(ha), b(hb);
  const auto aligned = blockwise_d(forced, a, b, s.m, s.n, s.k, 0);
  for (size_t off : {2, 4, 6}) {
    CAPTURE(off);
    CHECK(blockwise_d(forced, a, b, s.m, s.n, s.k, off) == aligned);
  }
  // The other kinds of problem are refused with the reason.
  auto ta = scalemm::testing::exact_operand(Recipe::kTensorwise, 64, 256, ScaleFormat::kCompact, rng);
  auto tb = scalemm::testing::exact_operand(Recipe::kTensorwise, 64, 256, ScaleFormat::kCompact, rng);
  DeviceOperand dta(ta), dtb(tb);
  try {
    blockwise_d(forced, dta, dtb, 64, 64, 256, 0);
    FAIL("a forced contiguous backend ran tensorwise");
  } catch (const Error& e) {
    CHECK(e.code() == StatusCode::kUnsupported);
    CHECK_THAT(std::string(e.what()), Catch::Contains("contiguous: runs block1x128(e4m3) x block128x128(e4m3)"));
  }
  // Captured once (auto: M = 16 over N = 7168), replayed 20 times into a poisoned D: the eager bytes.
  auto ga = scalemm::testing::random_operand(Recipe::kBlock1x128, 16, 1024, ScaleFormat::kCompact, rng);
  auto gb = scalemm::testing::random_operand(Recipe::kBlock128x128, 7168, 1024, ScaleFormat::kCompact, rng);
  DeviceOperand da(ga), db(gb);
  cudaStream_t st;
  SCALEMM_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const size_t bytes = 16 * 7168 * 2;
  Dev d(bytes);
  GemmArgs args;
  args.m = 16, args.n = 7168, args.k = 1024, args.a = da.op, args.b = db.op, args.d = d.p;
  CHECK(h.plan(args, st).backend == Backend::kContiguous);
  CHECK(graph_replays_identical(h, args, st, bytes, 20) == 20);
  cudaStreamDestroy(st);
}
