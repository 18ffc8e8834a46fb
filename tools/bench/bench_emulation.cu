// Benchmarks of the reference emulator on the GPU: quantizer and dequantizer bandwidth against a
// same-run cudaMemcpy D2D anchor moving the same bytes, and the reference GEMM at 8192^3.
//
// Usage: bench_emulation [--size S] [--gemm G] [--reps N] [--gemm-reps N] [--only SUBSTRING]
//   --size S   quantizer matrix is S x S (default 8192)
//   --gemm G   reference GEMM is G x G x G (default 8192; 0 skips it)
// Timing: CUDA events around each repetition on one stream, 3 warm-up runs, median of --reps (>= 30)
// repetitions; the 8192^3 reference GEMM uses 1 warm-up and the median of --gemm-reps (>= 5).
// Bytes: read + written by the operation, counted once (input once, data outputs, scale buffers).
// The anchor copies half that many bytes D2D, so it also reads + writes the same total.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "scalemm/emulation/emulation.hpp"
#include "scalemm/formats.hpp"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/detail/device_buffer.hpp"
#include "scalemm/quantize.hpp"

using scalemm::detail::cuda_check;

using namespace scalemm;
using namespace scalemm::emulation;

namespace {


using Buf = scalemm::detail::DeviceBuffer;

/// Median milliseconds of fn() over reps, each bracketed by events on `s`, after `warm` warm-ups.
double median_ms(cudaStream_t s, int warm, int reps, const std::function<void()>& fn) {
  cudaEvent_t a, b;
  cuda_check(cudaEventCreate(&a), "event");
  cuda_check(cudaEventCreate(&b), "event");
  for (int i = 0; i < warm; ++i) fn();
  cuda_check(cudaStreamSynchronize(s), "warm-up");
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    cuda_check(cudaEventRecord(a, s), "record");
    fn();
    cuda_check(cudaEventRecord(b, s), "record");
    cuda_check(cudaEventSynchronize(b), "sync");
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, a, b), "elapsed");
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void row(const std::string& name, double bytes, double ms, double anchor_ms) {
  const double gbs = bytes / (ms * 1e-3) / 1e9, anchor = bytes / (anchor_ms * 1e-3) / 1e9;
  std::printf("| %-44s | %10.1f | %9.3f | %8.1f | %8.1f | %6.1f%% |\n", name.c_str(), bytes / 1e6, ms, gbs, anchor,
              100.0 * gbs / anchor);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t S = 8192, G = 8192;
  int reps = 30, gemm_reps = 5;
  std::string only;  // --only: the quantizer cases whose name contains it, nothing else (profiling)
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--size")) S = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--gemm")) G = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::max(30, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--gemm-reps")) gemm_reps = std::max(5, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--only")) only = argv[i + 1];
  }
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("bench_emulation on %s (sm_%d%d, %d SMs); quantizer %lldx%lld bf16 source; median of %d\n", prop.name,
              prop.major, prop.minor, prop.multiProcessorCount, (long long)S, (long long)S, reps);
  cudaStream_t s;
  cuda_check(cudaStreamCreate(&s), "stream");

  // Source: bf16 normal data, generated on the host once.
  std::vector<uint16_t> hx(size_t(S * S));
  std::mt19937 g(1234);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : hx) v = formats::encode_bf16(nd(g));
  Buf x(hx.size() * 2);
  cuda_check(cudaMemcpy(x.p, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice), "upload");
  const SourceMatrix src{x.p, DType::kBF16, S, S};

  std::printf("\n| %-44s | %10s | %9s | %8s | %8s | %7s |\n", "operation", "MB r+w", "ms", "GB/s", "memcpy", "of cpy");
  std::printf("|%s|%s|%s|%s|%s|%s|\n", std::string(46, '-').c_str(), std::string(12, '-').c_str(),
              std::string(11, '-').c_str(), std::string(10, '-').c_str(), std::string(10, '-').c_str(),
              std::string(9, '-').c_str());

  Buf anchor_src(size_t(S * S) * 4), anchor_dst(size_t(S * S) * 4);
  auto anchor_ms = [&](double bytes) {
    const size_t n = size_t(bytes / 2);
    return median_ms(s, 3, reps, [&] { cuda_check(cudaMemcpyAsync(anchor_dst.p, anchor_src.p, n, cudaMemcpyDeviceToDevice, s), "memcpy"); });
  };

  struct QCase {
    Recipe r;
    bool rowwise, columnwise;
    ScaleMode mode;
    bool given_amax = false;  ///< the tensor amax supplied (one read of the source instead of two)
  };
  const QCase qcases[] = {
      {Recipe::kTensorwise, true, false, ScaleMode::kAmax},
      {Recipe::kRowwise, true, false, ScaleMode::kAmax},
      {Recipe::kBlock1x128, true, false, ScaleMode::kAmax},
      {Recipe::kBlock1x128, true, true, ScaleMode::kAmax},
      {Recipe::kBlock128x128, true, true, ScaleMode::kAmax},
      {Recipe::kMxfp8, true, false, ScaleMode::kE8M0Rceil},
      {Recipe::kMxfp8, true, true, ScaleMode::kE8M0Rceil},
      {Recipe::kMxfp8_32x32, true, true, ScaleMode::kE8M0Rceil},
      {Recipe::kNvfp4, true, false, ScaleMode::kNvfp4TwoLevel},
      {Recipe::kNvfp4, true, true, ScaleMode::kNvfp4TwoLevel},
      {Recipe::kTensorwise, true, false, ScaleMode::kAmax, true},
      {Recipe::kNvfp4, true, false, ScaleMode::kNvfp4TwoLevel, true},
      {Recipe::kNvfp4, true, true, ScaleMode::kNvfp4TwoLevel, true},
  };
  // The given amax: the true one, as a fused producer would have computed it.
  float amax_h = 0.0f;
  for (uint16_t b : hx) amax_h = std::max(amax_h, std::fabs(formats::decode_bf16(b)));
  Buf amax_d(4);
  cuda_check(cudaMemcpy(amax_d.p, &amax_h, 4, cudaMemcpyHostToDevice), "upload amax");
  Buf data(size_t(S * S)), data_t(size_t(S * S)), gscale(4);
  for (const auto& c : qcases) {
    QuantizeConfig cfg;
    cfg.recipe = c.r;
    cfg.data_dtype = c.r == Recipe::kNvfp4 ? DType::kE2M1 : DType::kE4M3;
    cfg.mode = c.mode;
    cfg.format = ScaleFormat::kCublasLt;
    cfg.rowwise = c.rowwise;
    cfg.columnwise = c.columnwise;
    const auto lr = rowwise_layout(cfg, S, S), lc = columnwise_layout(cfg, S, S);
    Buf sr(size_t(lr.bytes())), sc(size_t(lc.bytes()));
    const size_t ws_bytes = scalemm::quantize::workspace_bytes(src, cfg);
    Buf ws(ws_bytes);
    QuantizeOutputs out{data.p, sr.p, c.columnwise ? data_t.p : nullptr, c.columnwise ? sc.p : nullptr,
                        static_cast<float*>(gscale.p)};
    const std::string name = std::string("quantize ") + std::string(to_string(c.r)) +
                             (c.columnwise ? " row+col" : " rowwise") + " (" + to_string(c.mode) +
                             (c.given_amax ? ", given amax" : "") + ")";
    if (!only.empty() && name.find(only) == std::string::npos) continue;
    const double db = double(data_bytes(cfg, S, S));
    const double bytes = double(S * S) * 2 + (c.rowwise ? db + lr.bytes() : 0) + (c.columnwise ? db + lc.bytes() : 0);
    SourceMatrix qsrc = src;
    if (c.given_amax) qsrc.amax = static_cast<const float*>(amax_d.p);
    const double ms = median_ms(s, 3, reps, [&] { scalemm::quantize::quantize(qsrc, cfg, out, ws.p, ws_bytes, s); });
    row(name, bytes, ms, anchor_ms(bytes));
  }
  if (!only.empty()) return 0;

  // Dequantize an MXFP8 operand to fp32.
  {
    QuantizeConfig cfg;
    cfg.recipe = Recipe::kMxfp8;
    cfg.format = ScaleFormat::kCublasLt;
    const auto lr = rowwise_layout(cfg, S, S);
    Buf sr(size_t(lr.bytes())), out(size_t(S * S) * 4);
    QuantizeOutputs o{data.p, sr.p, nullptr, nullptr, nullptr};
    scalemm::quantize::quantize(src, cfg, o, nullptr, 0, s);
    const auto t = rowwise_operand(src, cfg, o);
    const double bytes = double(S * S) * (1 + 4) + double(lr.bytes());
    const double ms = median_ms(s, 3, reps, [&] { scalemm::quantize::dequantize(t, out.p, DType::kF32, s); });
    row("dequantize mxfp8 -> f32", bytes, ms, anchor_ms(bytes));
  }

  if (G > 0) {
    // Reference GEMM, MXFP8 operands (G, G) x (G, G)^T, fp32 accumulation, bf16 output.
    std::printf("\nreference GEMM %lldx%lldx%lld (mxfp8 operands, bf16 out), 1 warm-up, median of %d\n",
                (long long)G, (long long)G, (long long)G, gemm_reps);
    std::vector<uint16_t> hb(size_t(G * G));
    for (auto& v : hb) v = formats::encode_bf16(nd(g));
    Buf xa(hb.size() * 2), xb(hb.size() * 2);
    cuda_check(cudaMemcpy(xa.p, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice), "upload");
    for (auto& v : hb) v = formats::encode_bf16(nd(g));
    cuda_check(cudaMemcpy(xb.p, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice), "upload");
    QuantizeConfig cfg;
    cfg.recipe = Recipe::kMxfp8;
    cfg.format = ScaleFormat::kCublasLt;
    const auto lay = rowwise_layout(cfg, G, G);
    Buf qa(size_t(G * G)), qb(size_t(G * G)), sa(size_t(lay.bytes())), sb(size_t(lay.bytes()));
    const SourceMatrix srca{xa.p, DType::kBF16, G, G}, srcb{xb.p, DType::kBF16, G, G};
    QuantizeOutputs oa{qa.p, sa.p, nullptr, nullptr, nullptr}, ob{qb.p, sb.p, nullptr, nullptr, nullptr};
    scalemm::quantize::quantize(srca, cfg, oa, nullptr, 0, s);
    scalemm::quantize::quantize(srcb, cfg, ob, nullptr, 0, s);
    const auto ta = rowwise_operand(srca, cfg, oa), tb = rowwise_operand(srcb, cfg, ob);
    const size_t ws_bytes = gemm_device_workspace_bytes(ta, tb);
    Buf ws(ws_bytes), d(size_t(G * G) * 2);
    GemmOptions opt;
    opt.out_dtype = DType::kBF16;
    const double ms = median_ms(s, 1, gemm_reps, [&] { gemm_device(ta, tb, d.p, opt, ws.p, ws_bytes, s); });
    const float* fa = static_cast<const float*>(ws.p);
    const float* fb = reinterpret_cast<const float*>(static_cast<const char*>(ws.p) + (ws_bytes / 2));
    const double ms_sgemm =
        median_ms(s, 1, gemm_reps, [&] { sgemm_nt_device(fa, fb, d.p, G, G, G, opt, s); });
    const double flops = 2.0 * double(G) * double(G) * double(G);
    std::printf("| %-44s | %9s | %8s |\n", "operation", "ms", "TFLOP/s");
    std::printf("| %-44s | %9.2f | %8.2f |\n", "gemm_device (dequantize A, B + SGEMM)", ms, flops / (ms * 1e-3) / 1e12);
    std::printf("| %-44s | %9.2f | %8.2f |\n", "sgemm_nt_device alone (fp32, 128x128x8 tiles)", ms_sgemm,
                flops / (ms_sgemm * 1e-3) / 1e12);
    std::printf("target: 8192^3 reference GEMM under 1000 ms: %s\n",
                G == 8192 ? (ms < 1000 ? "met" : "NOT met") : "(not measured at 8192)");
  }
  cuda_check(cudaStreamDestroy(s), "stream destroy");
  return 0;
}
