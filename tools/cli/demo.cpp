// `scalemm info` and `scalemm demo`.
//
// The demo sends every recipe through the library the way a framework would: quantize random
// activations and weights, validate the scale buffers against their layout contract, convert them to
// the cuBLASLt layout and back, run D = X W^T through a Handle (verification on: every GPU call is
// checked against the reference emulator), and report which backend served each call, why, and the
// recipe's quality against the unquantized fp64 product.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cli_io.hpp"
#include "commands.hpp"
#include "scalemm/device.hpp"
#include "scalemm/emulation/compare.hpp"
#include "scalemm/emulation/emulation.hpp"
#include "scalemm/gemm.hpp"
#include "scalemm/layouts/convert.hpp"
#include "scalemm/layouts/convert_cuda.hpp"
#include "scalemm/layouts/validate.hpp"
#include "scalemm/version.hpp"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/detail/device_buffer.hpp"

using scalemm::detail::cuda_check;

namespace scalemm::cli {
namespace {

std::string version_string(long long v, int major_div, int minor_div) {
  if (v <= 0) return "none";
  return std::to_string(v / major_div) + "." + std::to_string((v % major_div) / minor_div);
}

void run_info() {
  const DeviceQuery q = query_devices();
  std::printf("scalemm %s\n", SCALEMM_VERSION_STRING);
  std::printf("CUDA runtime %s, driver %s, cuBLASLt %s (%zu)\n", version_string(q.runtime_version, 1000, 10).c_str(),
              version_string(q.driver_version, 1000, 10).c_str(),
              version_string(static_cast<long long>(q.cublaslt_version), 10000, 100).c_str(), q.cublaslt_version);
  if (q.devices.empty()) {
    std::printf("devices: %s; GEMMs run on the host reference emulator instead (slower; layout "
                "commands are unaffected)\n", q.reason.c_str());
  }
  for (const auto& d : q.devices)
    std::printf("device %d: %s, sm_%d, %d SMs, %.1f GiB\n", d.ordinal, d.name.c_str(), d.sm, d.multiprocessors,
                d.global_memory_bytes / double(1ull << 30));
}


// A device copy of host bytes (null src: uninitialised).
struct DeviceBytes : scalemm::detail::DeviceBuffer {
  DeviceBytes(const void* src, size_t n) : DeviceBuffer(n) {
    if (src) SCALEMM_CUDA_CHECK(cudaMemcpy(p, src, n, cudaMemcpyHostToDevice));
  }
};

struct Quantized {
  emulation::QuantizeConfig cfg;
  std::vector<uint8_t> data, scales;
  float global_scale = 1.0f;
  layouts::ScaleLayout layout;
};

Quantized quantize(const std::vector<float>& src, int64_t rows, int64_t k, Recipe r) {
  Quantized q;
  q.cfg.recipe = r;
  q.cfg.data_dtype = r == Recipe::kNvfp4 ? DType::kE2M1 : DType::kE4M3;
  q.layout = emulation::rowwise_layout(q.cfg, rows, k);
  q.data.assign(size_t(emulation::data_bytes(q.cfg, rows, k)), 0);
  q.scales.assign(size_t(q.layout.bytes()), 0);
  emulation::QuantizeOutputs out;
  out.data = q.data.data();
  out.scales = q.scales.data();
  out.global_scale = &q.global_scale;
  emulation::quantize_host(emulation::SourceMatrix{src.data(), DType::kF32, rows, k}, q.cfg, out);
  return q;
}

// Validates the compact buffer, converts it to the cuBLASLt layout and back (on the GPU when there
// is one), and checks the round trip is the identity. Returns "" or what went wrong.
std::string check_layout(const Quantized& q, const char* name, bool gpu) {
  TensorRef t = TensorRef::contiguous(const_cast<uint8_t*>(q.scales.data()), q.layout.scale_dtype(),
                                      {q.layout.grid_rows(), q.layout.kblocks()});
  if (q.layout.recipe == Recipe::kTensorwise) t = TensorRef::contiguous(t.data, t.dtype, {1});
  if (q.layout.recipe == Recipe::kRowwise) t = TensorRef::contiguous(t.data, t.dtype, {q.layout.rows});
  Diagnostics d = layouts::validate_scale(t, q.layout, name);
  const auto content = layouts::content_diagnostics(q.layout, layouts::check_content(q.layout, q.scales.data()), name);
  d.insert(d.end(), content.begin(), content.end());
  if (!d.empty()) return to_string(d);
  const auto lt = q.layout.with_format(ScaleFormat::kCublasLt);
  std::vector<uint8_t> back(q.scales.size());
  if (gpu) {
    DeviceBytes src(q.scales.data(), q.scales.size()), mid(nullptr, size_t(lt.bytes())), dst(nullptr, back.size());
    layouts::gpu::to_cublaslt(q.layout, src.p, mid.p, nullptr);
    layouts::gpu::to_compact(lt, mid.p, dst.p, nullptr);
    cuda_check(cudaMemcpy(back.data(), dst.p, back.size(), cudaMemcpyDeviceToHost), "download");
  } else {
    const auto mid = layouts::to_cublaslt(q.layout, q.scales.data());
    back = layouts::to_compact(lt, mid.data());
  }
  if (back != q.scales) return std::string(name) + ": compact -> cublaslt -> compact is not the identity";
  return "";
}

struct Pair {
  Recipe a, b;
};

int run_demo(int64_t m, int64_t n, int64_t k, uint64_t seed) {
  run_info();
  std::string why;
  const bool gpu = cuda_device_available(&why);
  if (!gpu) {
    const bool clamped = m > 64 || n > 128 || k > 512;
    m = std::min<int64_t>(m, 64), n = std::min<int64_t>(n, 128), k = std::min<int64_t>(k, 512);
    std::printf("no GPU: every call runs on the host reference emulator (%s %lldx%lldx%lld%s)\n",
                clamped ? "shape reduced to" : "shape", (long long)m, (long long)n, (long long)k,
                clamped ? ": on a host M, N and K are at most 64, 128 and 512" : "");
  }
  // Every GPU call is cross-checked against the reference emulator.
  setenv("SCALEMM_VERIFY", "full", 0);
  std::printf("seed %llu (rerun with --seed %llu); D(%lld x %lld) = X(%lld x %lld) * W(%lld x %lld)^T, bf16 out, "
              "SCALEMM_VERIFY=%s\n\n",
              (unsigned long long)seed, (unsigned long long)seed, (long long)m, (long long)n, (long long)m,
              (long long)k, (long long)n, (long long)k, std::getenv("SCALEMM_VERIFY"));

  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(m * k)), w(size_t(n * k));
  for (auto& v : x) v = nd(rng);
  for (auto& v : w) v = nd(rng);
  // fp64 product of the unquantized inputs: the yardstick for each recipe's quality.
  std::vector<double> exact(size_t(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t kk = 0; kk < k; ++kk) acc += double(x[size_t(i * k + kk)]) * w[size_t(j * k + kk)];
      exact[size_t(i * n + j)] = acc;
    }

  const Pair pairs[] = {{Recipe::kTensorwise, Recipe::kTensorwise},  {Recipe::kRowwise, Recipe::kRowwise},
                        {Recipe::kTensorwise, Recipe::kRowwise},     {Recipe::kBlock1x128, Recipe::kBlock1x128},
                        {Recipe::kBlock1x128, Recipe::kBlock128x128}, {Recipe::kBlock128x128, Recipe::kBlock1x128},
                        {Recipe::kBlock128x128, Recipe::kBlock128x128}, {Recipe::kMxfp8, Recipe::kMxfp8},
                        {Recipe::kMxfp8, Recipe::kMxfp8_32x32},      {Recipe::kNvfp4, Recipe::kNvfp4}};
  Handle handle;
  int passed = 0, failed = 0;
  std::printf("%-28s %-15s %9s  %s\n", "X recipe x W recipe", "backend", "SQNR dB", "why / result");
  for (const auto& p : pairs) {
    const std::string label = std::string(to_string(p.a)) + " x " + std::string(to_string(p.b));
    try {
      const Quantized qa = quantize(x, m, k, p.a), qb = quantize(w, n, k, p.b);
      for (auto [q, name] : {std::pair{&qa, "scale_x"}, {&qb, "scale_w"}}) {
        const std::string err = check_layout(*q, name, gpu);
        if (!err.empty()) throw Error(StatusCode::kInvalidLayout, err);
      }
      std::vector<uint16_t> d(size_t(m * n));
      GemmArgs args;
      args.m = m, args.n = n, args.k = k;
      args.a = {qa.data.data(), qa.cfg.data_dtype, p.a, qa.scales.data(), ScaleFormat::kCompact, qa.global_scale};
      args.b = {qb.data.data(), qb.cfg.data_dtype, p.b, qb.scales.data(), ScaleFormat::kCompact, qb.global_scale};
      args.d_dtype = DType::kBF16;
      Plan plan;
      if (gpu) {
        DeviceBytes da(qa.data.data(), qa.data.size()), sa(qa.scales.data(), qa.scales.size());
        DeviceBytes db(qb.data.data(), qb.data.size()), sb(qb.scales.data(), qb.scales.size());
        DeviceBytes dd(nullptr, d.size() * 2);
        args.a.data = da.p, args.a.scale = sa.p, args.b.data = db.p, args.b.scale = sb.p, args.d = dd.p;
        plan = handle.plan(args);
        handle.gemm(args, nullptr);  // verified against the reference inside
        cuda_check(cudaMemcpy(d.data(), dd.p, d.size() * 2, cudaMemcpyDeviceToHost), "download");
      } else {
        args.d = d.data();
        args.space = MemorySpace::kHost;
        plan = handle.plan(args);
        handle.gemm(args, nullptr);
      }
      std::vector<float> got(d.size());
      for (size_t i = 0; i < d.size(); ++i) got[i] = formats::decode_bf16(d[i]);
      const double sqnr = emulation::sqnr_db(exact.data(), got.data(), int64_t(got.size()));
      // reasons = {problem, why earlier backends were passed over (native's among them), ..., why this backend}.
      std::string reason;
      for (size_t i = 1; i + 1 < plan.reasons.size(); ++i)
        if (plan.reasons[i].rfind("native: ", 0) == 0) reason = plan.reasons[i];
      // Without a GPU the planner's reason ("host pointers") is a consequence, not news: say why once.
      std::printf("%-28s %-15s %9.1f  %s%s\n", label.c_str(), std::string(to_string(plan.backend)).c_str(), sqnr,
                  plan.backend == Backend::kNative || !gpu ? "" : ("fallback: " + reason + "; ").c_str(),
                  gpu ? "verified against the reference" : "host reference (no CUDA device)");
      ++passed;
    } catch (const Error& e) {
      std::printf("%-28s FAILED: %s\n", label.c_str(), e.what());
      ++failed;
    }
  }
  // "passed" means different things: on a GPU each call was verified against the reference emulator;
  // on a host the reference is what ran, so a pass says only that the call was accepted and ran.
  std::printf("\ndemo: %d passed, %d failed (%s)\n", passed, failed,
              gpu ? "passed: the call ran and SCALEMM_VERIFY=full found it within tolerance of the reference emulator"
                  : "passed: the call was accepted and ran on the host reference; nothing to verify it against "
                    "without a GPU, and the SQNR column is against the fp64 product of the unquantized inputs");
  return failed ? kExitInvalidInput : kExitOk;
}

}  // namespace

void register_info_command(CLI::App& app) {
  auto* info = app.add_subcommand("info", "Library version, devices and library versions on this machine");
  extend_info_command(info, [] { run_info(); });
}

void register_demo_command(CLI::App& app) {
  static int64_t m = 1024, n = 2048, k = 4096;
  static uint64_t seed = 0;
  auto* demo = app.add_subcommand("demo", "Send every recipe through the library with verification");
  // The demo computes an fp64 reference of each product on the host: keep it to minutes.
  demo->add_option("--m", m, "Rows of X (tokens)")->check(whole_number(1, 16384, "rows of X"));
  demo->add_option("--n", n, "Rows of W (output features)")->check(whole_number(1, 16384, "rows of W"));
  demo->add_option("--k", k, "Reduction length")->check(whole_number(1, 16384, "the reduction length K"));
  demo->add_option("--seed", seed, "Random seed (default: fresh)");
  demo->callback([] {
    const uint64_t s = seed ? seed : uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
    const int rc = run_demo(m, n, k, s);
    if (rc != kExitOk) throw Exit{rc};
  });
}

}  // namespace scalemm::cli
