// GEMM benchmark: scalemm against raw cuBLASLt (same problem, same algorithm) and against a BF16
// cuBLASLt GEMM, in one run on one GPU, with the same-run ceilings printed next to every result.
//
//   bench_gemm [--quick | --small-m | --contiguous] [--autotune] [--iters N>=30] [--ref-reps N>=5] [--json PATH]
//   (--small-m: only blockwise at M <= 256, with the contiguous grouped kernel as one group;
//    --contiguous: only blockwise at the large anchors and the MLP layers' forward and dgrad shapes, the same way)
//
// Sections (each prints a Markdown table on stdout as it goes; --json writes everything, rewritten
// after every section so a killed run still leaves what it measured):
//   ceilings   D2D copy of 1 GiB (TB/s, bytes read + written), BF16 and FP8-tensorwise cuBLASLt GEMMs
//              at 8192^3 (TFLOP/s). The floor of each later result is max(flops / peak, bytes / copy
//              bandwidth), with peak = the FP8 ceiling for FP8 data and the BF16 ceiling otherwise.
//   native     tensorwise, rowwise, blockwise (1x128 x 128x128) through Handle::gemm vs the library's
//              own cuBLASLt backend (backends::LtContext) called directly with scales already in
//              cuBLASLt format: same descriptors, same heuristic query, so the same algorithm (the
//              outputs are compared bit for bit to confirm it). Blockwise is timed twice through
//              scalemm: with compact scales (the library converts them per call) and with scales
//              already in cuBLASLt format. The variants of one case are timed interleaved, call by call;
//              blockwise at M <= 256 also times the contiguous grouped kernel as one group (a note).
//   emulated   MXFP8 and NVFP4 through the planner (on sm_90: exact dequantization to BF16 + cuBLASLt
//              BF16) vs a BF16 cuBLASLt GEMM of the same shape; the output is compared bit for bit
//              with the BF16 GEMM of the dequantized operands.
//   host       host time per call with a warm plan cache, tiny 128x128x256 blockwise GEMM: raw
//              cublasLtMatmul (descriptors and algorithm prepared once), LtContext::matmul, Handle::gemm
//              (cuBLASLt-format and compact scales). CPU clock over bursts of back-to-back calls, the
//              variants interleaved burst by burst; "over raw" is the median same-round difference.
//   verify     SCALEMM_VERIFY=off|sample|full at 4096^3 (a Handle constructed under each setting).
//   reference  emulation::gemm_device (and sgemm_nt_device alone) at 8192^3.
//
// Timing: CUDA events around each call, the host waiting for the end event before the next call
// (the PyTorch anchors' method, so host time per call shows on short kernels as it does for them);
// 5 warm-up calls, median of --iters (default 30). Operands are random normal data quantized on the
// GPU (never zeros); when one set of operands and output would fit in twice the L2 cache, several
// sets are made and rotated call by call.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cublaslt/cublaslt.hpp"
#include "base/capabilities.hpp"
#include "scalemm/emulation/emulation.hpp"
#include "scalemm/gemm.hpp"
#include "scalemm/io/output_file.hpp"
#include "scalemm/grouped.hpp"
#include "scalemm/layouts/convert_cuda.hpp"
#include "scalemm/layouts/scale_layout.hpp"
#include "scalemm/version.hpp"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/detail/device_buffer.hpp"
#include "scalemm/quantize.hpp"

using namespace scalemm;

namespace {

// ---- errors: a failed CUDA/cuBLASLt call throws; the case that made it is reported as skipped ----

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what); }

#define LTCK(x) scalemm::backends::cublas_check(int(x), #x)

// ---- settings and results ------------------------------------------------------------------------

int g_iters = 30;
int g_warm = 5;
int g_ref_reps = 5;
bool g_quick = false;
bool g_small_m = false;  // --small-m: blockwise at M <= 256 only (with the contiguous kernel), then stop
bool g_contiguous = false;  // --contiguous: blockwise at large M only (with the contiguous kernel), then stop
bool g_autotune = false;  // --autotune: scalemm and the raw calls share the tuned algorithm
size_t g_l2 = 50u << 20;
std::string g_json_path;
constexpr size_t kLtWorkspace = size_t(32) << 20;  // as HandleOptions::cublaslt_workspace_bytes

double g_copy_tbps = 0, g_bf16_tflops = 0, g_fp8_tflops = 0;

// Minimal JSON: every value is rendered when it is added.
std::string jstr(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\t': o += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          o += b;
        } else {
          o += c;
        }
    }
  }
  return o + "\"";
}
std::string jnum(double v) {
  if (!std::isfinite(v)) return "null";
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}
struct JObj {
  std::vector<std::pair<std::string, std::string>> kv;
  JObj& s(const std::string& k, const std::string& v) { kv.emplace_back(k, jstr(v)); return *this; }
  JObj& n(const std::string& k, double v) { kv.emplace_back(k, jnum(v)); return *this; }
  JObj& i(const std::string& k, long long v) { kv.emplace_back(k, std::to_string(v)); return *this; }
  JObj& b(const std::string& k, bool v) { kv.emplace_back(k, v ? "true" : "false"); return *this; }
  JObj& raw(const std::string& k, const std::string& v) { kv.emplace_back(k, v); return *this; }
  std::string str() const {
    std::string o = "{";
    for (size_t i = 0; i < kv.size(); ++i) o += (i ? ", " : "") + jstr(kv[i].first) + ": " + kv[i].second;
    return o + "}";
  }
};
std::string jarr(const std::vector<std::string>& v) {
  std::string o = "[";
  for (size_t i = 0; i < v.size(); ++i) o += (i ? ",\n  " : "\n  ") + v[i];
  return o + (v.empty() ? "]" : "\n ]");
}

JObj g_device, g_ceilings, g_host, g_reference;
std::vector<std::string> g_gemm, g_verify, g_skipped, g_targets;

void write_json() {
  if (g_json_path.empty()) return;
  JObj root;
  root.s("tool", "bench_gemm").s("scalemm_version", SCALEMM_VERSION_STRING);
  root.raw("device", g_device.str());
  root.raw("method", JObj()
                         .i("iters", g_iters)
                         .i("warmup", g_warm)
                         .i("reference_reps", g_ref_reps)
                         .b("quick", g_quick)
                         .b("autotune", g_autotune)
                         .s("timing", "CUDA events per call, host waits for each call's end event; median")
                         .s("rotation", "operand sets rotated when one set fits in 2x L2")
                         .str());
  root.raw("ceilings", g_ceilings.str());
  root.raw("gemm", jarr(g_gemm));
  root.raw("host_overhead", g_host.str());
  root.raw("verify", jarr(g_verify));
  root.raw("reference", g_reference.str());
  root.raw("targets", jarr(g_targets));
  root.raw("skipped", jarr(g_skipped));
  try {
    scalemm::io::write_output(g_json_path, {root.str(), "\n"}, "--json");
  } catch (const scalemm::Error& e) {
    std::fprintf(stderr, "bench_gemm: %s\n", e.what());
  }
}

// Inside a GEMM table a skipped case becomes a row of that table (14 columns), so the table stays whole.
bool g_in_table = false;

void skipped(const std::string& what, const std::string& why, std::vector<std::string>* deferred = nullptr) {
  std::string one_line = why;
  std::replace(one_line.begin(), one_line.end(), '\n', ' ');
  std::replace(one_line.begin(), one_line.end(), '|', '/');
  if (deferred || g_in_table) {
    const std::string row = "| " + what + " | | | | | | | | | | | | | SKIPPED: " + one_line + " |";
    if (deferred) deferred->push_back(row);
    else std::printf("%s\n", row.c_str());
  } else {
    std::printf("SKIPPED %s: %s\n", what.c_str(), one_line.c_str());
  }
  std::fflush(stdout);
  g_skipped.push_back(JObj().s("case", what).s("reason", why).str());
}

// ---- device memory and data ----------------------------------------------------------------------

using Dev = scalemm::detail::DeviceBuffer;

__device__ __forceinline__ uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Standard normal values (Box-Muller on a counter-based hash): different for every seed and index.
/// Launched by the host-time section: the host cost of one kernel launch, what the compact-scale
/// call adds (its one conversion launch).
__global__ void empty_kernel() {}

__global__ void fill_normal(float* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t h = splitmix(seed * 0xD1B54A32D192ED03ull + uint64_t(i));
    const float u1 = (float((h >> 40) & 0xFFFFFF) + 1.0f) * 0x1p-24f;  // (0, 1]
    const float u2 = float((h >> 8) & 0xFFFFFF) * 0x1p-24f;            // [0, 1)
    p[i] = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
  }
}

__global__ void f32_to_bf16(const float* s, __nv_bfloat16* d, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    d[i] = __float2bfloat16_rn(s[i]);
}

// counts[0]: elements that differ bit for bit; [1]: NaN in a; [2]: zeros in a.
__global__ void compare_bf16(const uint16_t* a, const uint16_t* b, int64_t n, unsigned long long* counts) {
  unsigned long long diff = 0, nan = 0, zero = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint16_t x = a[i];
    diff += x != b[i];
    nan += (x & 0x7F80u) == 0x7F80u && (x & 0x7Fu);
    zero += (x & 0x7FFFu) == 0;
  }
  if (diff) atomicAdd(&counts[0], diff);
  if (nan) atomicAdd(&counts[1], nan);
  if (zero) atomicAdd(&counts[2], zero);
}

unsigned grid_for(int64_t n) { return unsigned(std::min<int64_t>((n + 255) / 256, 132 * 16)); }

Dev g_src;  // f32 staging for the quantizers, grown on demand

float* normal_source(int64_t count, uint64_t seed, cudaStream_t st) {
  const size_t bytes = size_t(count) * 4;
  if (g_src.bytes < bytes) {
    SCALEMM_CUDA_CHECK(cudaStreamSynchronize(st));
    g_src = Dev();
    g_src = Dev(bytes);
  }
  auto* p = static_cast<float*>(g_src.p);
  fill_normal<<<grid_for(count), 256, 0, st>>>(p, count, seed);
  SCALEMM_CUDA_CHECK(cudaGetLastError());
  return p;
}

/// One quantized operand: data (rows, k), its compact scales, and (block recipes) the same scales in
/// cuBLASLt format, prepared once.
struct Operand {
  Recipe recipe = Recipe::kTensorwise;
  DType dtype = DType::kE4M3;
  int64_t rows = 0, k = 0;
  Dev data, scales, scales_lt;
  float global = 1.0f;
  int64_t data_bytes = 0, scale_bytes = 0;
  layouts::ScaleLayout layout{};

  const void* lt_scale() const { return scales_lt.p ? scales_lt.p : scales.p; }
  GemmOperand op(bool lt_format) const {
    GemmOperand o;
    o.data = data.p;
    o.dtype = dtype;
    o.recipe = recipe;
    o.scale = lt_format && scales_lt.p ? scales_lt.p : scales.p;
    o.scale_format = lt_format && scales_lt.p ? ScaleFormat::kCublasLt : ScaleFormat::kCompact;
    o.global_scale = global;
    return o;
  }
  emulation::QuantizedTensor quantized() const {
    emulation::QuantizedTensor t;
    t.data = data.p;
    t.dtype = dtype;
    t.scales = scales.p;
    t.layout = layout;
    return t;
  }
};

Operand make_operand(Recipe r, DType dt, int64_t rows, int64_t k, uint64_t seed, cudaStream_t st) {
  Operand o;
  o.recipe = r, o.dtype = dt, o.rows = rows, o.k = k;
  emulation::QuantizeConfig cfg;
  cfg.recipe = r;
  cfg.data_dtype = dt;
  cfg.format = ScaleFormat::kCompact;
  o.layout = emulation::rowwise_layout(cfg, rows, k);
  o.data_bytes = emulation::data_bytes(cfg, rows, k);
  o.scale_bytes = o.layout.bytes();
  o.data = Dev(size_t(o.data_bytes));
  o.scales = Dev(size_t(o.scale_bytes));
  Dev global;
  emulation::SourceMatrix src;
  src.data = normal_source(rows * k, seed, st);
  src.dtype = DType::kF32;
  src.rows = rows;
  src.cols = k;
  emulation::QuantizeOutputs out;
  out.data = o.data.p;
  out.scales = o.scales.p;
  if (r == Recipe::kNvfp4) {
    global = Dev(4);
    out.global_scale = static_cast<float*>(global.p);
  }
  scalemm::quantize::quantize(src, cfg, out, nullptr, 0, st);
  SCALEMM_CUDA_CHECK(cudaGetLastError());
  if (r != Recipe::kTensorwise && r != Recipe::kRowwise) {
    const layouts::ScaleLayout lt = o.layout.with_format(ScaleFormat::kCublasLt);
    o.scales_lt = Dev(size_t(lt.bytes()));
    layouts::gpu::convert(o.layout, o.scales.p, lt, o.scales_lt.p, st);
    SCALEMM_CUDA_CHECK(cudaGetLastError());
  }
  if (global.p) {
    SCALEMM_CUDA_CHECK(cudaMemcpyAsync(&o.global, global.p, 4, cudaMemcpyDeviceToHost, st));
  }
  SCALEMM_CUDA_CHECK(cudaStreamSynchronize(st));
  return o;
}

Dev make_bf16(int64_t rows, int64_t k, uint64_t seed, cudaStream_t st) {
  Dev d(size_t(rows * k) * 2);
  const float* src = normal_source(rows * k, seed, st);
  f32_to_bf16<<<grid_for(rows * k), 256, 0, st>>>(src, static_cast<__nv_bfloat16*>(d.p), rows * k);
  SCALEMM_CUDA_CHECK(cudaGetLastError());
  SCALEMM_CUDA_CHECK(cudaStreamSynchronize(st));
  return d;
}

/// How many operand sets to rotate so that a timed call does not find its inputs in L2.
int sets_for(size_t set_bytes) {
  if (set_bytes >= 2 * g_l2) return 1;
  return int(std::min<size_t>(16, (3 * g_l2 + set_bytes - 1) / set_bytes));
}

// ---- timing ----------------------------------------------------------------------------------------

struct Stat {
  double med_us = NAN, min_us = NAN, max_us = NAN;
  int n = 0;
};

/// CUDA events around each call; the host waits for each call's end before the next (as torch_anchor).
Stat time_calls(cudaStream_t st, int nsets, int warm, int iters, const std::function<void(int)>& fn) {
  cudaEvent_t a, b;
  SCALEMM_CUDA_CHECK(cudaEventCreate(&a));
  SCALEMM_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> t;
  try {
    for (int i = 0; i < warm; ++i) fn(i % nsets);
    SCALEMM_CUDA_CHECK(cudaStreamSynchronize(st));
    for (int i = 0; i < iters; ++i) {
      SCALEMM_CUDA_CHECK(cudaEventRecord(a, st));
      fn(i % nsets);
      SCALEMM_CUDA_CHECK(cudaEventRecord(b, st));
      SCALEMM_CUDA_CHECK(cudaEventSynchronize(b));
      float ms = 0;
      SCALEMM_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
      t.push_back(double(ms) * 1e3);
    }
  } catch (...) {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    throw;
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  Stat s;
  s.n = int(t.size());
  s.med_us = t[t.size() / 2];
  s.min_us = t.front();
  s.max_us = t.back();
  return s;
}

/// As time_calls for several variants of one problem, interleaved call by call (variant 0, 1, ..., 0,
/// 1, ...), so clock or thermal drift during the case cannot favour one of them. Call c uses operand set
/// c % nsets: consecutive calls never share a set, whichever variant makes them.
std::vector<Stat> time_interleaved(cudaStream_t st, int nsets, int warm, int iters,
                                   const std::vector<std::function<void(int)>>& fns) {
  const size_t V = fns.size();
  cudaEvent_t a, b;
  SCALEMM_CUDA_CHECK(cudaEventCreate(&a));
  SCALEMM_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<std::vector<double>> t(V);
  try {
    int c = 0;
    for (int i = 0; i < warm; ++i)
      for (size_t v = 0; v < V; ++v) fns[v](c++ % nsets);
    SCALEMM_CUDA_CHECK(cudaStreamSynchronize(st));
    for (int i = 0; i < iters; ++i)
      for (size_t v = 0; v < V; ++v) {
        SCALEMM_CUDA_CHECK(cudaEventRecord(a, st));
        fns[v](c++ % nsets);
        SCALEMM_CUDA_CHECK(cudaEventRecord(b, st));
        SCALEMM_CUDA_CHECK(cudaEventSynchronize(b));
        float ms = 0;
        SCALEMM_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        t[v].push_back(double(ms) * 1e3);
      }
  } catch (...) {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    throw;
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::vector<Stat> out(V);
  for (size_t v = 0; v < V; ++v) {
    std::sort(t[v].begin(), t[v].end());
    out[v].n = int(t[v].size());
    out[v].med_us = t[v][t[v].size() / 2];
    out[v].min_us = t[v].front();
    out[v].max_us = t[v].back();
  }
  return out;
}

double tflops(double flops, double us) { return flops / (us * 1e-6) / 1e12; }

struct Floor {
  double us = NAN;
  const char* bound = "";
};
Floor floor_of(double flops, double bytes, double peak_tflops) {
  Floor f;
  const double t_c = flops / (peak_tflops * 1e12) * 1e6, t_m = bytes / (g_copy_tbps * 1e12) * 1e6;
  f.us = std::max(t_c, t_m);
  f.bound = t_c >= t_m ? "compute" : "memory";
  return f;
}

struct Check {
  unsigned long long diff = 0, nan = 0, zero = 0, n = 0;
  std::string text() const {
    if (nan) return "NaN in " + std::to_string(nan) + " of " + std::to_string(n);
    if (zero * 2 > n) return "mostly zeros (" + std::to_string(zero) + " of " + std::to_string(n) + ")";
    if (diff) return "differs in " + std::to_string(diff) + " of " + std::to_string(n);
    return "bit-identical";
  }
};

Check compare(const void* a, const void* b, int64_t n, cudaStream_t st) {
  Dev c(3 * sizeof(unsigned long long));
  SCALEMM_CUDA_CHECK(cudaMemsetAsync(c.p, 0, 3 * sizeof(unsigned long long), st));
  compare_bf16<<<grid_for(n), 256, 0, st>>>(static_cast<const uint16_t*>(a), static_cast<const uint16_t*>(b), n,
                                           static_cast<unsigned long long*>(c.p));
  SCALEMM_CUDA_CHECK(cudaGetLastError());
  unsigned long long h[3];
  SCALEMM_CUDA_CHECK(cudaMemcpyAsync(h, c.p, sizeof h, cudaMemcpyDeviceToHost, st));
  SCALEMM_CUDA_CHECK(cudaStreamSynchronize(st));
  Check r;
  r.diff = h[0], r.nan = h[1], r.zero = h[2], r.n = (unsigned long long)n;
  return r;
}

// ---- shapes ----------------------------------------------------------------------------------------

struct Shape {
  std::string label;
  int64_t m, n, k;
};

std::string shape_str(const Shape& s) {
  return std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k);
}

std::vector<Shape> shapes(bool quick) {
  if (g_small_m) {
    std::vector<Shape> v;
    for (int64_t m : {1, 16, 64, 128, 256}) {
      v.push_back({"dsv3 expert down", m, 7168, 2048});
      v.push_back({"dsv3 expert gate+up", m, 4096, 7168});
      v.push_back({"llama3-70b qkv", m, 10240, 8192});
    }
    return v;
  }
  if (g_contiguous) {
    // The anchors with M >= 2048, and the forward (and, transposed, dgrad) GEMMs of the three MLP blocks
    // the training benchmark runs (tokens x d x f: up M x f x d, down M x d x f).
    std::vector<Shape> v = {{"anchor", 4096, 4096, 4096}, {"anchor", 8192, 8192, 8192},
                            {"anchor", 16384, 7168, 2048}, {"anchor", 2048, 2048, 7168}};
    for (const auto& b : {std::array<int64_t, 3>{8192, 4096, 14336}, {16384, 7168, 2048}, {4096, 2048, 8192}}) {
      const std::string l = "mlp " + std::to_string(b[0]) + "x" + std::to_string(b[1]) + "x" + std::to_string(b[2]);
      for (const Shape& c : {Shape{l + " up", b[0], b[2], b[1]}, Shape{l + " down", b[0], b[1], b[2]}}) {
        bool dup = false;
        for (const auto& x : v) dup |= x.m == c.m && x.n == c.n && x.k == c.k;
        if (!dup) v.push_back(c);
      }
    }
    return v;
  }
  std::vector<Shape> v = {{"anchor", 4096, 4096, 4096},
                          {"anchor", 8192, 8192, 8192},
                          {"anchor", 16384, 7168, 2048},
                          {"anchor", 128, 7168, 2048},
                          {"anchor", 2048, 2048, 7168}};
  if (quick) {
    v.push_back({"dsv3 expert down", 1, 7168, 2048});  // the five anchors plus the small-M rules
    v.push_back({"dsv3 expert down", 16, 7168, 2048});
    return v;
  }
  // DeepSeek-V3 (hidden 7168, MoE intermediate 2048, 128 heads x 128 v_head_dim) and Llama-3-70B
  // (hidden 8192, 8 KV heads, intermediate 28672) linear layers, Y = X W^T with W (N, K).
  const struct {
    const char* label;
    int64_t n, k;
  } layers[] = {{"dsv3 expert gate+up", 4096, 7168},
                {"dsv3 expert down", 7168, 2048},
                {"dsv3 attn out", 7168, 16384},
                {"llama3-70b qkv", 10240, 8192},
                {"llama3-70b mlp down", 8192, 28672}};
  for (const auto& l : layers)
    for (int64_t m : {1, 16, 128, 4096, 16384}) {
      bool dup = false;
      for (const auto& s : v) dup |= s.m == m && s.n == l.n && s.k == l.k;
      if (!dup) v.push_back({l.label, m, l.n, l.k});
    }
  return v;
}

// ---- the library's contexts shared by the sections ----------------------------------------------

struct Ctx {
  cudaStream_t st = nullptr;
  std::unique_ptr<Handle> handle;
  // Handles forced onto cuBLASLt (native; convert-native for M % 4 != 0): what a blockwise call that
  // auto sends to scalemm's own kernel would run otherwise.
  std::unique_ptr<Handle> native, padded;
  std::unique_ptr<backends::LtContext> lt;
  Dev lt_ws;
};

backends::LtCall bf16_call(int64_t m, int64_t n, int64_t k, const void* a, const void* b, void* d, float alpha = 1) {
  backends::LtCall c;
  c.m = m, c.n = n, c.k = k;
  c.a_dtype = c.b_dtype = DType::kBF16, c.d_dtype = DType::kBF16;
  c.a = a, c.b = b, c.d = d;
  c.alpha = alpha;
  return c;
}

backends::LtCall scaled_call(int64_t m, int64_t n, int64_t k, const Operand& a, const Operand& b, void* d) {
  backends::LtCall c;
  c.m = m, c.n = n, c.k = k;
  c.a_dtype = a.dtype, c.b_dtype = b.dtype, c.d_dtype = DType::kBF16;
  c.a_scale_mode = base::recipe_scale_mode(a.recipe);
  c.b_scale_mode = base::recipe_scale_mode(b.recipe);
  c.a = a.data.p, c.b = b.data.p, c.d = d;
  c.a_scale = a.lt_scale(), c.b_scale = b.lt_scale();
  c.alpha = a.global * b.global;
  return c;
}

// ---- ceilings -------------------------------------------------------------------------------------

void ceilings(Ctx& cx) {
  std::printf("\n## Ceilings (same run)\n\n| ceiling | measured | unit |\n|---|---|---|\n");
  {
    const size_t bytes = size_t(1) << 30;
    Dev a(bytes), b(bytes);
    SCALEMM_CUDA_CHECK(cudaMemsetAsync(a.p, 0x3C, bytes, cx.st));
    const Stat s = time_calls(cx.st, 1, g_warm, g_iters, [&](int) {
      SCALEMM_CUDA_CHECK(cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice, cx.st));
    });
    g_copy_tbps = 2.0 * double(bytes) / (s.med_us * 1e-6) / 1e12;
    std::printf("| D2D copy 1 GiB (read + write) | %.2f | TB/s |\n", g_copy_tbps);
  }
  const int64_t S = 8192;
  const double flops = 2.0 * S * S * S;
  {
    Dev a = make_bf16(S, S, 11, cx.st), b = make_bf16(S, S, 12, cx.st), d(size_t(S * S) * 2);
    const auto c = bf16_call(S, S, S, a.p, b.p, d.p);
    const Stat s = time_calls(cx.st, 1, g_warm, g_iters, [&](int) { cx.lt->matmul(c, cx.lt_ws.p, kLtWorkspace, cx.st); });
    g_bf16_tflops = tflops(flops, s.med_us);
    std::printf("| BF16 cuBLASLt GEMM 8192^3 | %.1f | TFLOP/s |\n", g_bf16_tflops);
  }
  {
    Operand a = make_operand(Recipe::kTensorwise, DType::kE4M3, S, S, 13, cx.st);
    Operand b = make_operand(Recipe::kTensorwise, DType::kE4M3, S, S, 14, cx.st);
    Dev d(size_t(S * S) * 2);
    const auto c = scaled_call(S, S, S, a, b, d.p);
    const Stat s = time_calls(cx.st, 1, g_warm, g_iters, [&](int) { cx.lt->matmul(c, cx.lt_ws.p, kLtWorkspace, cx.st); });
    g_fp8_tflops = tflops(flops, s.med_us);
    std::printf("| FP8 tensorwise cuBLASLt GEMM 8192^3 | %.1f | TFLOP/s |\n", g_fp8_tflops);
  }
  g_ceilings.n("d2d_copy_tbps", g_copy_tbps).n("bf16_gemm_8192_tflops", g_bf16_tflops).n("fp8_tensorwise_gemm_8192_tflops", g_fp8_tflops);
  std::printf("\nfloor = max(2MNK / peak, bytes / copy bandwidth); peak = FP8 ceiling for FP8 operands, BF16 ceiling\n"
              "otherwise; bytes = A + B + scales read once + D (bf16) written once. floor/time = fraction of the floor reached.\n");
  std::fflush(stdout);
}

// ---- per-shape GEMM cases ------------------------------------------------------------------------

struct RecipeCase {
  const char* name;
  Recipe a, b;
  DType dtype;
};

const RecipeCase kNative[] = {{"tensorwise", Recipe::kTensorwise, Recipe::kTensorwise, DType::kE4M3},
                              {"rowwise", Recipe::kRowwise, Recipe::kRowwise, DType::kE4M3},
                              {"blockwise", Recipe::kBlock1x128, Recipe::kBlock128x128, DType::kE4M3}};
const RecipeCase kEmulated[] = {{"mxfp8", Recipe::kMxfp8, Recipe::kMxfp8, DType::kE4M3},
                                {"nvfp4", Recipe::kNvfp4, Recipe::kNvfp4, DType::kE2M1}};

struct Row {
  std::string recipe, backend;
  int64_t m, n, k;
  double ratio, ratio_lt, vs_bf16;
};
std::vector<Row> g_rows;


std::vector<std::string> g_plan_notes;
// Blockwise at M <= 256: scalemm's own kernel against the cuBLASLt call on the same bytes, timed
// interleaved with the other variants: the contiguous backend where auto takes it (against the call
// forced onto cuBLASLt), else the contiguous grouped kernel at G = 1 (the measurement behind the rule).
std::vector<std::string> g_small_m_notes;

void print_native_header() {
  std::printf("\n## Native recipes: scalemm vs raw cuBLASLt (same problem, same algorithm)\n\n"
              "| shape | M | N | K | recipe | backend | scalemm us | TFLOP/s | raw cuBLASLt us | scalemm/raw | "
              "scalemm(lt scales)/raw | floor us | floor/time | output vs raw |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
}

void print_emulated_header() {
  std::printf("\n## BF16 and emulated recipes: scalemm vs a BF16 cuBLASLt GEMM of the same shape (emulated rows:\n"
              "the BF16 GEMM timed interleaved with them, call by call)\n\n"
              "| shape | M | N | K | recipe | backend | scalemm us | TFLOP/s | BF16 cuBLASLt us | BF16 TFLOP/s | "
              "rate vs BF16 | floor us | floor/time | output vs BF16 GEMM of dequantized inputs |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
}

/// BF16 cuBLASLt GEMM of the shape (the denominator of the emulated rows and the BF16 anchor).
double bf16_case(Ctx& cx, const Shape& sh, std::vector<std::string>& lines) {
  const int64_t M = sh.m, N = sh.n, K = sh.k;
  const size_t set_bytes = size_t((M + N) * K * 2 + M * N * 2);
  const int nsets = sets_for(set_bytes);
  std::vector<Dev> a, b, d;
  for (int s = 0; s < nsets; ++s) {
    a.push_back(make_bf16(M, K, 1000 + 2 * s, cx.st));
    b.push_back(make_bf16(N, K, 1001 + 2 * s, cx.st));
    d.push_back(Dev(size_t(M * N) * 2));
  }
  const Stat st = time_calls(cx.st, nsets, g_warm, g_iters, [&](int s) {
    cx.lt->matmul(bf16_call(M, N, K, a[size_t(s)].p, b[size_t(s)].p, d[size_t(s)].p), cx.lt_ws.p, kLtWorkspace, cx.st);
  });
  const double flops = 2.0 * M * N * K;
  const Floor fl = floor_of(flops, double(set_bytes), g_bf16_tflops);
  char line[512];
  std::snprintf(line, sizeof line, "| %s | %lld | %lld | %lld | bf16 | cuBLASLt | %.1f | %.1f | %.1f | %.1f | 1.00 | %.1f (%s) | %.2f | - |",
                sh.label.c_str(), (long long)M, (long long)N, (long long)K, st.med_us, tflops(flops, st.med_us),
                st.med_us, tflops(flops, st.med_us), fl.us, fl.bound, fl.us / st.med_us);
  lines.push_back(line);
  g_gemm.push_back(JObj()
                       .s("shape", sh.label).i("m", M).i("n", N).i("k", K)
                       .s("recipe", "bf16").s("backend", "cublaslt")
                       .i("sets", nsets)
                       .n("scalemm_us", NAN)
                       .n("bf16_us", st.med_us).n("bf16_tflops", tflops(flops, st.med_us))
                       .n("bf16_min_us", st.min_us).n("bf16_max_us", st.max_us)
                       .n("floor_us", fl.us).s("floor_bound", fl.bound)
                       .str());
  return st.med_us;
}

void native_case(Ctx& cx, const Shape& sh, const RecipeCase& rc) {
  const int64_t M = sh.m, N = sh.n, K = sh.k;
  const std::string what = std::string(rc.name) + " " + sh.label + " " + shape_str(sh);
  // One set, to size the rotation.
  std::vector<Operand> a, b;
  std::vector<Dev> d;
  a.push_back(make_operand(rc.a, rc.dtype, M, K, 2000, cx.st));
  b.push_back(make_operand(rc.b, rc.dtype, N, K, 2001, cx.st));
  d.push_back(Dev(size_t(M * N) * 2));
  const size_t in_bytes = size_t(a[0].data_bytes + a[0].scale_bytes + b[0].data_bytes + b[0].scale_bytes);
  const size_t set_bytes = in_bytes + size_t(M * N) * 2;
  const int nsets = sets_for(set_bytes);
  for (int s = 1; s < nsets; ++s) {
    a.push_back(make_operand(rc.a, rc.dtype, M, K, 2000 + 2 * uint64_t(s), cx.st));
    b.push_back(make_operand(rc.b, rc.dtype, N, K, 2001 + 2 * uint64_t(s), cx.st));
    d.push_back(Dev(size_t(M * N) * 2));
  }
  auto args = [&](int s, bool lt_format) {
    GemmArgs g;
    g.m = M, g.n = N, g.k = K;
    g.a = a[size_t(s)].op(lt_format);
    g.b = b[size_t(s)].op(lt_format);
    g.d = d[size_t(s)].p;
    g.d_dtype = DType::kBF16;
    return g;
  };
  const Plan plan = cx.handle->plan(args(0, false));
  const std::string backend(to_string(plan.backend));
  if (plan.backend != Backend::kNative) g_plan_notes.push_back(what + ": " + plan.explain());
  // Where auto runs scalemm's own kernel, the call through cuBLASLt (compact scales, as before) is
  // timed beside it in place of the grouped kernel (the same kernel), and the raw call is still there.
  const bool ours = plan.backend == Backend::kContiguous;
  Handle* lt_handle = nullptr;
  Backend lt_backend = plan.backend;
  if (ours) {
    for (Handle* h : {cx.native.get(), cx.padded.get()}) {
      try {
        lt_backend = h->plan(args(0, false)).backend;
        lt_handle = h;
        break;
      } catch (const Error&) {
      }
    }
  }
  auto lib_cublas = [&](int s) { lt_handle->gemm(args(s, false), cx.st); };

  auto lib = [&](int s) { cx.handle->gemm(args(s, false), cx.st); };
  auto lib_lt = [&](int s) { cx.handle->gemm(args(s, true), cx.st); };
  auto raw = [&](int s) {
    cx.lt->matmul(scaled_call(M, N, K, a[size_t(s)], b[size_t(s)], d[size_t(s)].p), cx.lt_ws.p, kLtWorkspace, cx.st);
  };
  // The contiguous grouped kernel as one group, compact scales (what it reads).
  std::vector<int64_t> one_group = {M};
  auto grouped_into = [&](int s, void* out) {
    GroupedGemmArgs g;
    g.group_dim = GroupDim::kM;
    g.groups = 1;
    g.group_sizes = one_group.data();
    g.m = M, g.n = N, g.k = K;
    g.a = a[size_t(s)].op(false);
    g.b = b[size_t(s)].op(false);
    g.d = out;
    g.d_dtype = DType::kBF16;
    g.backend = GroupedBackend::kContiguous;
    cx.handle->grouped_gemm(g, cx.st);
  };
  auto grouped = [&](int s) { grouped_into(s, d[size_t(s)].p); };
  bool with_grouped = rc.a == Recipe::kBlock1x128 && (M <= 256 || g_contiguous) && !ours;
  if (with_grouped) {
    try {
      grouped(0);
      SCALEMM_CUDA_CHECK(cudaStreamSynchronize(cx.st));
    } catch (const Error& e) {
      g_small_m_notes.push_back(what + ": the contiguous kernel does not take it: " + e.what());
      with_grouped = false;
    }
  }
  const bool block_scales = a[0].scales_lt.p || b[0].scales_lt.p;
  Stat t_s, t_slt, t_raw;
  std::string check = "-", lt_scales_error;
  Stat t_cublas;
  if (lt_backend == Backend::kNative) {
    bool with_lt = block_scales;
    if (with_lt) {
      try {
        lib_lt(0);
        SCALEMM_CUDA_CHECK(cudaStreamSynchronize(cx.st));
      } catch (const Error& e) {  // a scalemm refusal of cuBLASLt-format scales: report it, keep the case
        lt_scales_error = e.what();
        g_plan_notes.push_back(what + " with cuBLASLt-format scales: " + lt_scales_error);
        with_lt = false;
      }
    }
    std::vector<std::function<void(int)>> fns = {lib, raw};
    if (with_lt) fns.push_back(lib_lt);
    if (with_grouped) fns.push_back(grouped);
    if (lt_handle) fns.push_back(lib_cublas);
    const std::vector<Stat> t = time_interleaved(cx.st, nsets, g_warm, g_iters, fns);
    t_s = t[0], t_raw = t[1];
    if (with_lt) t_slt = t[2];
    if (lt_handle) {
      t_cublas = t.back();
      char line[512];
      std::snprintf(line, sizeof line, "%s: scalemm (contiguous) %.1f us, scalemm through cuBLASLt (%s, compact scales) "
                    "%.1f us, raw cuBLASLt %.1f us: contiguous / cuBLASLt-call time %.2f",
                    what.c_str(), t_s.med_us, std::string(to_string(lt_backend)).c_str(), t_cublas.med_us,
                    t_raw.med_us, t_s.med_us / t_cublas.med_us);
      g_small_m_notes.push_back(line);
    }
    if (with_grouped) {
      const Stat& tg = t.back();
      Dev d3(size_t(M * N) * 2);
      SCALEMM_CUDA_CHECK(cudaMemsetAsync(d[0].p, 0xFF, size_t(M * N) * 2, cx.st));
      SCALEMM_CUDA_CHECK(cudaMemsetAsync(d3.p, 0xFF, size_t(M * N) * 2, cx.st));
      cx.lt->matmul(scaled_call(M, N, K, a[0], b[0], d[0].p), cx.lt_ws.p, kLtWorkspace, cx.st);
      grouped_into(0, d3.p);
      char line[512];
      std::snprintf(line, sizeof line, "%s: contiguous kernel (G = 1) %.1f us, raw cuBLASLt %.1f us, scalemm %.1f us: "
                    "cuBLASLt / kernel time %.2f; output against cuBLASLt's: %s",
                    what.c_str(), tg.med_us, t_raw.med_us, t_s.med_us, t_raw.med_us / tg.med_us,
                    compare(d3.p, d[0].p, M * N, cx.st).text().c_str());
      g_small_m_notes.push_back(line);
    }
    // Same algorithm check: both outputs of set 0, poisoned first (0xFFFF is a bf16 NaN).
    Dev d2(size_t(M * N) * 2);
    SCALEMM_CUDA_CHECK(cudaMemsetAsync(d[0].p, 0xFF, size_t(M * N) * 2, cx.st));
    SCALEMM_CUDA_CHECK(cudaMemsetAsync(d2.p, 0xFF, size_t(M * N) * 2, cx.st));
    cx.handle->gemm(args(0, false), cx.st);
    cx.lt->matmul(scaled_call(M, N, K, a[0], b[0], d2.p), cx.lt_ws.p, kLtWorkspace, cx.st);
    check = compare(d[0].p, d2.p, M * N, cx.st).text();
  } else {
    // Not native: no raw cuBLASLt call exists for this problem; still check the output is written.
    if (lt_handle) {
      const std::vector<Stat> t = time_interleaved(cx.st, nsets, g_warm, g_iters, {lib, lib_cublas});
      t_s = t[0], t_cublas = t[1];
      char line[512];
      std::snprintf(line, sizeof line, "%s: scalemm (contiguous) %.1f us, scalemm through cuBLASLt (%s, compact scales) "
                    "%.1f us: contiguous / cuBLASLt-call time %.2f",
                    what.c_str(), t_s.med_us, std::string(to_string(lt_backend)).c_str(), t_cublas.med_us,
                    t_s.med_us / t_cublas.med_us);
      g_small_m_notes.push_back(line);
    } else if (with_grouped) {
      const std::vector<Stat> t = time_interleaved(cx.st, nsets, g_warm, g_iters, {lib, grouped});
      t_s = t[0];
      Dev d3(size_t(M * N) * 2);
      SCALEMM_CUDA_CHECK(cudaMemsetAsync(d[0].p, 0xFF, size_t(M * N) * 2, cx.st));
      SCALEMM_CUDA_CHECK(cudaMemsetAsync(d3.p, 0xFF, size_t(M * N) * 2, cx.st));
      cx.handle->gemm(args(0, false), cx.st);
      grouped_into(0, d3.p);
      char line[512];
      std::snprintf(line, sizeof line, "%s: contiguous kernel (G = 1) %.1f us, scalemm (%s) %.1f us: scalemm / kernel "
                    "time %.2f; output against scalemm's: %s",
                    what.c_str(), t[1].med_us, backend.c_str(), t_s.med_us, t_s.med_us / t[1].med_us,
                    compare(d3.p, d[0].p, M * N, cx.st).text().c_str());
      g_small_m_notes.push_back(line);
    } else {
      t_s = time_calls(cx.st, nsets, g_warm, g_iters, lib);
    }
    SCALEMM_CUDA_CHECK(cudaMemsetAsync(d[0].p, 0xFF, size_t(M * N) * 2, cx.st));
    cx.handle->gemm(args(0, false), cx.st);
    Check c = compare(d[0].p, d[0].p, M * N, cx.st);
    check = c.nan || c.zero * 2 > c.n ? c.text() : "written, no NaN";
  }
  SCALEMM_CUDA_CHECK(cudaStreamSynchronize(cx.st));
  const double flops = 2.0 * M * N * K;
  const Floor fl = floor_of(flops, double(set_bytes), g_fp8_tflops);
  const double ratio = t_s.med_us / t_raw.med_us, ratio_lt = t_slt.med_us / t_raw.med_us;
  auto f1 = [](double v) {
    char b[32];
    if (!std::isfinite(v)) return std::string("-");
    std::snprintf(b, sizeof b, "%.1f", v);
    return std::string(b);
  };
  auto f3 = [](double v) {
    char b[32];
    if (!std::isfinite(v)) return std::string("-");
    std::snprintf(b, sizeof b, "%.3f", v);
    return std::string(b);
  };
  std::printf("| %s | %lld | %lld | %lld | %s | %s | %.1f | %.1f | %s | %s | %s | %.1f (%s) | %.2f | %s |\n",
              sh.label.c_str(), (long long)M, (long long)N, (long long)K, rc.name, backend.c_str(), t_s.med_us,
              tflops(flops, t_s.med_us), f1(t_raw.med_us).c_str(), f3(ratio).c_str(), f3(ratio_lt).c_str(), fl.us,
              fl.bound, fl.us / t_s.med_us, check.c_str());
  std::fflush(stdout);
  g_rows.push_back({rc.name, backend, M, N, K, ratio, ratio_lt, NAN});
  g_gemm.push_back(JObj()
                       .s("shape", sh.label).i("m", M).i("n", N).i("k", K)
                       .s("recipe", rc.name).s("backend", backend).s("plan", plan.explain())
                       .i("sets", nsets)
                       .n("scalemm_us", t_s.med_us).n("scalemm_min_us", t_s.min_us).n("scalemm_max_us", t_s.max_us)
                       .n("scalemm_tflops", tflops(flops, t_s.med_us))
                       .n("scalemm_lt_scales_us", t_slt.med_us)
                       .n("scalemm_cublaslt_call_us", t_cublas.med_us)
                       .n("raw_us", t_raw.med_us).n("raw_min_us", t_raw.min_us).n("raw_max_us", t_raw.max_us)
                       .n("raw_tflops", tflops(flops, t_raw.med_us))
                       .n("ratio_scalemm_raw", ratio).n("ratio_scalemm_lt_scales_raw", ratio_lt)
                       .n("floor_us", fl.us).s("floor_bound", fl.bound).n("floor_over_time", fl.us / t_s.med_us)
                       .n("bytes", double(set_bytes)).n("flops", flops)
                       .s("output_check", check)
                       .s("lt_scales_error", lt_scales_error)
                       .str());
}

void emulated_case(Ctx& cx, const Shape& sh, const RecipeCase& rc, std::vector<std::string>& lines) {
  const int64_t M = sh.m, N = sh.n, K = sh.k;
  const std::string what = std::string(rc.name) + " " + sh.label + " " + shape_str(sh);
  std::vector<Operand> a, b;
  std::vector<Dev> d;
  a.push_back(make_operand(rc.a, rc.dtype, M, K, 3000, cx.st));
  b.push_back(make_operand(rc.b, rc.dtype, N, K, 3001, cx.st));
  d.push_back(Dev(size_t(M * N) * 2));
  const size_t set_bytes =
      size_t(a[0].data_bytes + a[0].scale_bytes + b[0].data_bytes + b[0].scale_bytes) + size_t(M * N) * 2;
  const int nsets = sets_for(set_bytes);
  for (int s = 1; s < nsets; ++s) {
    a.push_back(make_operand(rc.a, rc.dtype, M, K, 3000 + 2 * uint64_t(s), cx.st));
    b.push_back(make_operand(rc.b, rc.dtype, N, K, 3001 + 2 * uint64_t(s), cx.st));
    d.push_back(Dev(size_t(M * N) * 2));
  }
  auto args = [&](int s) {
    GemmArgs g;
    g.m = M, g.n = N, g.k = K;
    g.a = a[size_t(s)].op(false);
    g.b = b[size_t(s)].op(false);
    g.d = d[size_t(s)].p;
    g.d_dtype = DType::kBF16;
    return g;
  };
  const Plan plan = cx.handle->plan(args(0));
  const std::string backend(to_string(plan.backend));
  if (plan.backend != Backend::kEmulated) g_plan_notes.push_back(what + ": " + plan.explain());
  // Timed interleaved call by call with a BF16 cuBLASLt GEMM of the same shape on its own bf16
  // operands (rotated like the quantized sets): at the power limit the SM clock follows the GPU's
  // recent load, and a BF16 GEMM timed minutes earlier or later ran at another clock (docs/dispatch.md).
  std::vector<Dev> a_bf, b_bf, d_bf;
  for (int s = 0; s < nsets; ++s) {
    a_bf.push_back(make_bf16(M, K, 1000 + 2 * s, cx.st));
    b_bf.push_back(make_bf16(N, K, 1001 + 2 * s, cx.st));
    d_bf.push_back(Dev(size_t(M * N) * 2));
  }
  const std::vector<Stat> tv = time_interleaved(
      cx.st, nsets, g_warm, g_iters,
      {[&](int s) { cx.handle->gemm(args(s), cx.st); },
       [&](int s) {
         cx.lt->matmul(bf16_call(M, N, K, a_bf[size_t(s)].p, b_bf[size_t(s)].p, d_bf[size_t(s)].p), cx.lt_ws.p,
                       kLtWorkspace, cx.st);
       }});
  const Stat t_s = tv[0];
  const double bf16_us = tv[1].med_us;

  // Output check: the BF16 GEMM of the dequantized operands (what the emulated backend runs).
  std::string check;
  {
    Dev a16(size_t(M * K) * 2), b16(size_t(N * K) * 2), d2(size_t(M * N) * 2);
    scalemm::quantize::dequantize(a[0].quantized(), a16.p, DType::kBF16, cx.st);
    scalemm::quantize::dequantize(b[0].quantized(), b16.p, DType::kBF16, cx.st);
    SCALEMM_CUDA_CHECK(cudaGetLastError());
    SCALEMM_CUDA_CHECK(cudaMemsetAsync(d[0].p, 0xFF, size_t(M * N) * 2, cx.st));
    SCALEMM_CUDA_CHECK(cudaMemsetAsync(d2.p, 0xFF, size_t(M * N) * 2, cx.st));
    cx.handle->gemm(args(0), cx.st);
    cx.lt->matmul(bf16_call(M, N, K, a16.p, b16.p, d2.p, a[0].global * b[0].global), cx.lt_ws.p, kLtWorkspace, cx.st);
    check = compare(d[0].p, d2.p, M * N, cx.st).text();
  }
  const double flops = 2.0 * M * N * K;
  const Floor fl = floor_of(flops, double(set_bytes), g_fp8_tflops);
  const double vs = bf16_us / t_s.med_us;
  char line[640];
  std::snprintf(line, sizeof line, "| %s | %lld | %lld | %lld | %s | %s | %.1f | %.1f | %.1f | %.1f | %.3f | %.1f (%s) | %.2f | %s |",
                sh.label.c_str(), (long long)M, (long long)N, (long long)K, rc.name, backend.c_str(), t_s.med_us,
                tflops(flops, t_s.med_us), bf16_us, tflops(flops, bf16_us), vs, fl.us, fl.bound, fl.us / t_s.med_us,
                check.c_str());
  lines.push_back(line);
  g_rows.push_back({rc.name, backend, M, N, K, NAN, NAN, vs});
  g_gemm.push_back(JObj()
                       .s("shape", sh.label).i("m", M).i("n", N).i("k", K)
                       .s("recipe", rc.name).s("backend", backend).s("plan", plan.explain())
                       .i("sets", nsets)
                       .n("scalemm_us", t_s.med_us).n("scalemm_min_us", t_s.min_us).n("scalemm_max_us", t_s.max_us)
                       .n("scalemm_tflops", tflops(flops, t_s.med_us))
                       .n("bf16_us", bf16_us).n("rate_vs_bf16", vs)
                       .n("floor_us", fl.us).s("floor_bound", fl.bound).n("floor_over_time", fl.us / t_s.med_us)
                       .n("bytes", double(set_bytes)).n("flops", flops)
                       .s("output_check", check)
                       .str());
}

// ---- host time per call ------------------------------------------------------------------------------

struct RawLt {
  cublasLtHandle_t h = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~RawLt() {
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (h) cublasLtDestroy(h);
  }
};

/// Host time per call of several variants: rounds of one burst of `burst` back-to-back calls per variant
/// (device idle at the start of each burst, so the launch queue never throttles the host), the variants
/// interleaved round by round in rotating order so that drift in the host's clock or load during the
/// measurement cannot favour one of them. Per variant: the median over rounds of microseconds per call;
/// `paired[v]`: the median over rounds of (variant v - variant 0) in the same round.
struct HostTimes {
  std::vector<double> median, paired;
};
HostTimes host_us_per_call(cudaStream_t st, const std::vector<std::function<void()>>& fns, int rounds, int burst) {
  const size_t n = fns.size();
  for (const auto& fn : fns)
    for (int i = 0; i < 200; ++i) fn();
  SCALEMM_CUDA_CHECK(cudaStreamSynchronize(st));
  std::vector<std::vector<double>> per(n, std::vector<double>(size_t(rounds)));
  for (int r = 0; r < rounds; ++r)
    for (size_t j = 0; j < n; ++j) {
      const size_t v = (j + size_t(r)) % n;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < burst; ++i) fns[v]();
      const auto t1 = std::chrono::steady_clock::now();
      per[v][size_t(r)] = std::chrono::duration<double, std::micro>(t1 - t0).count() / burst;
      SCALEMM_CUDA_CHECK(cudaStreamSynchronize(st));
    }
  auto median = [](std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
  };
  HostTimes out;
  for (size_t v = 0; v < n; ++v) {
    out.median.push_back(median(per[v]));
    std::vector<double> diff(static_cast<size_t>(rounds));
    for (int r = 0; r < rounds; ++r) diff[size_t(r)] = per[v][size_t(r)] - per[0][size_t(r)];
    out.paired.push_back(median(diff));
  }
  return out;
}

/// The anchors' host-time method: N back-to-back calls, CPU clock, final synchronise included.
double backtoback_us_per_call(cudaStream_t st, const std::function<void()>& fn, int n) {
  SCALEMM_CUDA_CHECK(cudaStreamSynchronize(st));
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) fn();
  SCALEMM_CUDA_CHECK(cudaStreamSynchronize(st));
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / n;
}

void host_overhead(Ctx& cx) {
  const int64_t M = 128, N = 128, K = 256;
  std::printf("\n## Host time per call, warm plan cache (blockwise 1x128 x 128x128, %lldx%lldx%lld, bf16 out)\n\n",
              (long long)M, (long long)N, (long long)K);
  Operand a = make_operand(Recipe::kBlock1x128, DType::kE4M3, M, K, 4000, cx.st);
  Operand b = make_operand(Recipe::kBlock128x128, DType::kE4M3, N, K, 4001, cx.st);
  Dev d_raw(size_t(M * N) * 2), d_ctx(size_t(M * N) * 2), d_lt(size_t(M * N) * 2), d_cmp(size_t(M * N) * 2);

  // Raw cublasLtMatmul, prepared exactly as the library prepares it (TN, operands swapped).
  RawLt r;
  LTCK(cublasLtCreate(&r.h));
  LTCK(cublasLtMatmulDescCreate(&r.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  LTCK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  LTCK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  const int32_t mode_a = base::recipe_scale_mode(b.recipe), mode_b = base::recipe_scale_mode(a.recipe);
  LTCK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof mode_a));
  LTCK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof mode_b));
  const void* sa = b.lt_scale();
  const void* sb = a.lt_scale();
  LTCK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
  LTCK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb));
  LTCK(cublasLtMatrixLayoutCreate(&r.la, CUDA_R_8F_E4M3, uint64_t(K), uint64_t(N), int64_t(K)));
  LTCK(cublasLtMatrixLayoutCreate(&r.lb, CUDA_R_8F_E4M3, uint64_t(K), uint64_t(M), int64_t(K)));
  LTCK(cublasLtMatrixLayoutCreate(&r.ld, CUDA_R_16BF, uint64_t(N), uint64_t(M), int64_t(N)));
  {
    cublasLtMatmulPreference_t pref = nullptr;
    LTCK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = kLtWorkspace;
    LTCK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    // As the library does: the alignment classes of the pointers (cudaMalloc: 256 bytes).
    const uint32_t al = 256;
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      LTCK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof al));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(r.h, r.desc, r.la, r.lb, r.ld, r.ld, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (hs != CUBLAS_STATUS_SUCCESS || found == 0)
      fail("cublasLtMatmulAlgoGetHeuristic: status " + std::to_string(int(hs)) + ", " + std::to_string(found) + " found");
    r.algo = res.algo;
  }
  const float alpha = 1.0f, beta = 0.0f;
  Dev raw_ws(kLtWorkspace);
  auto raw = [&] {
    LTCK(cublasLtMatmul(r.h, r.desc, &alpha, b.data.p, r.la, a.data.p, r.lb, &beta, d_raw.p, r.ld, d_raw.p, r.ld,
                        &r.algo, raw_ws.p, kLtWorkspace, cx.st));
  };
  const backends::LtCall call = scaled_call(M, N, K, a, b, d_ctx.p);
  auto ctx = [&] { cx.lt->matmul(call, cx.lt_ws.p, kLtWorkspace, cx.st); };
  GemmArgs g;
  g.m = M, g.n = N, g.k = K;
  g.a = a.op(true), g.b = b.op(true), g.d = d_lt.p;
  GemmArgs gc = g;
  gc.a = a.op(false), gc.b = b.op(false), gc.d = d_cmp.p;
  auto lib_lt = [&] { cx.handle->gemm(g, cx.st); };
  auto lib_compact = [&] { cx.handle->gemm(gc, cx.st); };
  // The cuBLASLt-format call on a Handle that has run 256 other problems first (tensorwise, M = 144 ..
  // 4224), as a model with many layer shapes would: its plan and cuBLASLt caches then hold 257 entries,
  // and the warm lookups must not grow with them.
  HandleOptions ho;
  ho.autotune = g_autotune ? Autotune::kOn : Autotune::kOff;
  Handle many(ho);
  {
    const int64_t m_max = M + 16 * 256;
    Operand ta = make_operand(Recipe::kTensorwise, DType::kE4M3, m_max, K, 4100, cx.st);
    Operand tb = make_operand(Recipe::kTensorwise, DType::kE4M3, N, K, 4101, cx.st);
    Dev d_other(size_t(m_max * N) * 2);
    for (int i = 1; i <= 256; ++i) {
      GemmArgs other;
      other.m = M + 16 * i, other.n = N, other.k = K;
      other.a = ta.op(true), other.b = tb.op(true), other.d = d_other.p;
      many.gemm(other, cx.st);
    }
    SCALEMM_CUDA_CHECK(cudaStreamSynchronize(cx.st));
  }
  Dev d_many(size_t(M * N) * 2);
  GemmArgs gm = g;
  gm.d = d_many.p;
  auto lib_many = [&] { many.gemm(gm, cx.st); };

  const int bursts = g_quick ? 20 : 50, burst = 100, n_b2b = 5000;
  struct Row {
    const char* name;
    std::function<void()> fn;
    Dev* out;
    double host = NAN, b2b = NAN, gpu = NAN;
    std::string error;
  };
  std::vector<Row> rows = {{"raw cublasLtMatmul (prepared once)", raw, &d_raw},
                           {"LtContext::matmul (library backend)", ctx, &d_ctx},
                           {"Handle::gemm, cuBLASLt-format scales", lib_lt, &d_lt},
                           {"Handle::gemm, compact scales (converted per call)", lib_compact, &d_cmp},
                           {"Handle::gemm, cuBLASLt-format scales, 256 other problems run before", lib_many, &d_many}};
  // All must agree bit for bit (same algorithm, same inputs); a call that throws is reported.
  std::string check = "bit-identical";
  for (auto& row : rows) {
    try {
      SCALEMM_CUDA_CHECK(cudaMemsetAsync(row.out->p, 0xFF, size_t(M * N) * 2, cx.st));
      row.fn();
      const Check c = compare(row.out->p, d_raw.p, M * N, cx.st);
      const Check self = compare(row.out->p, row.out->p, M * N, cx.st);
      if (self.nan || self.zero * 2 > self.n) check = std::string(row.name) + ": " + self.text();
      else if (c.diff && check == "bit-identical") check = std::string(row.name) + " vs raw: " + c.text();
    } catch (const std::exception& e) {
      row.error = e.what();
    }
  }
  std::printf("| call | host us/call (median of %d rounds of %d calls) | - raw (paired median) | %d back-to-back incl. sync, us/call | GPU event us/call |\n"
              "|---|---|---|---|---|\n", bursts, burst, n_b2b);
  // The floor of the compact-scale row's extra cost: the host time of one launch of an empty kernel
  // on the same stream (no output to check).
  Row empty{"one empty kernel launch (the compact row's extra launch)", [&] { empty_kernel<<<1, 32, 0, cx.st>>>(); },
            nullptr};
  // Host time: every variant that ran its check, interleaved round by round (raw first in the list, so
  // "paired" is the same-round difference to raw).
  std::vector<Row*> timed;
  for (auto& row : rows)
    if (row.error.empty()) timed.push_back(&row);
  timed.push_back(&empty);
  std::vector<double> paired(timed.size(), NAN);
  if (rows[0].error.empty()) {
    try {
      std::vector<std::function<void()>> fns;
      for (Row* row : timed) fns.push_back(row->fn);
      const HostTimes ht = host_us_per_call(cx.st, fns, bursts, burst);
      for (size_t i = 0; i < timed.size(); ++i) timed[i]->host = ht.median[i], paired[i] = ht.paired[i];
    } catch (const std::exception& e) {
      for (auto& row : rows) row.error = e.what();
    }
  }
  for (Row* row : timed) {
    if (!row->error.empty()) continue;
    try {
      row->b2b = backtoback_us_per_call(cx.st, row->fn, n_b2b);
      row->gpu = time_calls(cx.st, 1, g_warm, g_iters, [&](int) { row->fn(); }).med_us;
    } catch (const std::exception& e) {
      row->error = e.what();
    }
  }
  for (size_t i = 0; i < timed.size(); ++i) {
    const Row& row = *timed[i];
    if (row.error.empty())
      std::printf("| %s | %.2f | %+.2f | %.2f | %.2f |\n", row.name, row.host, paired[i], row.b2b, row.gpu);
  }
  for (auto& row : rows)
    if (!row.error.empty()) std::printf("| %s | failed: %s | | | |\n", row.name, row.error.c_str());
  std::printf("\noutputs of the %zu calls: %s\n", rows.size(), check.c_str());
  std::fflush(stdout);
  std::vector<std::string> js;
  auto paired_of = [&](const Row& r) {
    for (size_t i = 0; i < timed.size(); ++i)
      if (timed[i] == &r) return paired[i];
    return double(NAN);
  };
  for (auto& row : rows)
    js.push_back(JObj().s("call", row.name).n("host_us", row.host).n("over_raw_us", paired_of(row))
                     .n("backtoback_us", row.b2b).n("gpu_event_us", row.gpu).s("error", row.error).str());
  g_host.n("empty_launch_host_us", empty.host).n("empty_launch_backtoback_us", empty.b2b);
  g_host.i("m", M).i("n", N).i("k", K).s("recipe", "blockwise").i("burst", burst).i("bursts", bursts)
      .i("backtoback_calls", n_b2b).s("output_check", check).raw("calls", jarr(js));
  const double over_lt = paired_of(rows[2]), over_c = paired_of(rows[3]), over_many = paired_of(rows[4]);
  g_targets.push_back(JObj().s("target", "host time per call <= raw cublasLtMatmul + 1.5 us (cuBLASLt-format scales, 256 other problems run before)")
                          .n("value", over_many).b("met", std::isfinite(over_many) && over_many <= 1.5).str());
  g_targets.push_back(JObj().s("target", "host time per call <= raw cublasLtMatmul + 1.5 us (cuBLASLt-format scales)")
                          .n("value", over_lt).b("met", std::isfinite(over_lt) && over_lt <= 1.5).str());
  g_targets.push_back(JObj().s("target", "host time per call <= raw cublasLtMatmul + 1.5 us (compact scales)")
                          .n("value", over_c).b("met", std::isfinite(over_c) && over_c <= 1.5).str());
}

// ---- verify-mode overhead ------------------------------------------------------------------------------

void verify_overhead(Ctx& cx) {
  const int64_t S = 4096;
  std::printf("\n## Verify-mode overhead at %lld^3 (a Handle constructed under each SCALEMM_VERIFY; off and sample\n"
              "timed interleaved)\n\n"
              "| recipe | backend | off us | sample us | sample overhead | full us | full overhead |\n"
              "|---|---|---|---|---|---|---|\n", (long long)S);
  std::fflush(stdout);
  const RecipeCase cases[] = {kNative[2], kNative[0], kEmulated[0]};
  for (const RecipeCase& rc : cases) {
    if (g_quick && rc.a != Recipe::kBlock1x128) continue;
    try {
      std::vector<Operand> a, b;
      std::vector<Dev> d;
      a.push_back(make_operand(rc.a, rc.dtype, S, S, 5000, cx.st));
      b.push_back(make_operand(rc.b, rc.dtype, S, S, 5001, cx.st));
      d.push_back(Dev(size_t(S * S) * 2));
      const size_t set_bytes = size_t(a[0].data_bytes + a[0].scale_bytes + b[0].data_bytes + b[0].scale_bytes + S * S * 2);
      const int nsets = sets_for(set_bytes);
      for (int s = 1; s < nsets; ++s) {
        a.push_back(make_operand(rc.a, rc.dtype, S, S, 5000 + 2 * uint64_t(s), cx.st));
        b.push_back(make_operand(rc.b, rc.dtype, S, S, 5001 + 2 * uint64_t(s), cx.st));
        d.push_back(Dev(size_t(S * S) * 2));
      }
      double t[3] = {NAN, NAN, NAN};
      std::string err[3];
      std::string backend;
      const char* modes[3] = {"off", "sample", "full"};
      auto args = [&](int s) {
        GemmArgs g;
        g.m = S, g.n = S, g.k = S;
        g.a = a[size_t(s)].op(false), g.b = b[size_t(s)].op(false), g.d = d[size_t(s)].p;
        return g;
      };
      auto handle_for = [&](const char* mode) {
        if (setenv("SCALEMM_VERIFY", mode, 1) != 0) fail("setenv SCALEMM_VERIFY");
        auto h = std::make_unique<Handle>();  // reads SCALEMM_VERIFY now
        setenv("SCALEMM_VERIFY", "off", 1);
        return h;
      };
      // off and sample timed interleaved call by call (the SM clock moves with the GPU's load over a
      // run, by more than the overhead measured); full alone, it is synchronous and slow.
      try {
        auto h_off = handle_for("off"), h_sample = handle_for("sample");
        backend = std::string(to_string(h_off->plan(args(0)).backend));
        const std::vector<Stat> tv =
            time_interleaved(cx.st, nsets, g_warm, g_iters,
                             {[&](int s) { h_off->gemm(args(s), cx.st); }, [&](int s) { h_sample->gemm(args(s), cx.st); }});
        h_sample->check_verification();
        t[0] = tv[0].med_us, t[1] = tv[1].med_us;
      } catch (const std::exception& e) {
        err[0] = err[1] = e.what();
      }
      try {
        auto h = handle_for("full");
        t[2] = time_calls(cx.st, nsets, g_warm, g_iters, [&](int s) { h->gemm(args(s), cx.st); }).med_us;
      } catch (const std::exception& e) {
        err[2] = e.what();
      }
      auto cell = [&](int m) {
        char b[64];
        if (!err[m].empty()) return std::string("failed");
        std::snprintf(b, sizeof b, "%.1f", t[m]);
        return std::string(b);
      };
      auto pct = [&](int m) {
        char b[64];
        if (!std::isfinite(t[m]) || !std::isfinite(t[0])) return std::string("-");
        std::snprintf(b, sizeof b, "%+.1f%%", 100.0 * (t[m] / t[0] - 1.0));
        return std::string(b);
      };
      std::printf("| %s | %s | %s | %s | %s | %s | %s |\n", rc.name, backend.c_str(), cell(0).c_str(), cell(1).c_str(),
                  pct(1).c_str(), cell(2).c_str(), pct(2).c_str());
      for (int m = 0; m < 3; ++m)
        if (!err[m].empty()) std::printf("  SCALEMM_VERIFY=%s failed: %s\n", modes[m], err[m].c_str());
      std::fflush(stdout);
      JObj j;
      j.s("recipe", rc.name).s("backend", backend).i("m", S).i("n", S).i("k", S).i("sets", nsets);
      for (int m = 0; m < 3; ++m) {
        j.n(std::string(modes[m]) + "_us", t[m]);
        if (m) j.n(std::string(modes[m]) + "_overhead", t[m] / t[0] - 1.0);
        if (!err[m].empty()) j.s(std::string(modes[m]) + "_error", err[m]);
      }
      g_verify.push_back(j.str());
      if (rc.a == Recipe::kBlock1x128 || rc.a == Recipe::kTensorwise) {
        const double ov = t[1] / t[0] - 1.0;
        g_targets.push_back(JObj().s("target", std::string("verify sample overhead <= 10% at 4096^3 (") + rc.name + ")")
                                .n("value", ov).b("met", std::isfinite(ov) && ov <= 0.10).str());
      }
    } catch (const std::exception& e) {
      skipped(std::string("verify ") + rc.name, e.what());
    }
  }
  setenv("SCALEMM_VERIFY", "off", 1);
}

// ---- reference emulator ----------------------------------------------------------------------------------

void reference(Ctx& cx) {
  const int64_t S = 8192;
  std::printf("\n## Reference emulator at %lld^3 (MXFP8 operands, bf16 out; 1 warm-up, median of %d)\n\n"
              "| call | ms | TFLOP/s | vs BF16 ceiling |\n|---|---|---|---|\n", (long long)S, g_ref_reps);
  std::fflush(stdout);
  Operand a = make_operand(Recipe::kMxfp8, DType::kE4M3, S, S, 6000, cx.st);
  Operand b = make_operand(Recipe::kMxfp8, DType::kE4M3, S, S, 6001, cx.st);
  Dev d(size_t(S * S) * 2);
  const auto qa = a.quantized(), qb = b.quantized();
  const size_t ws = emulation::gemm_device_workspace_bytes(qa, qb);
  Dev w(ws);
  emulation::GemmOptions opt;
  opt.out_dtype = DType::kBF16;
  const double flops = 2.0 * S * S * S;
  const Stat t = time_calls(cx.st, 1, 1, g_ref_reps, [&](int) { emulation::gemm_device(qa, qb, d.p, opt, w.p, ws, cx.st); });
  Check c;
  {
    SCALEMM_CUDA_CHECK(cudaMemsetAsync(d.p, 0xFF, size_t(S * S) * 2, cx.st));
    emulation::gemm_device(qa, qb, d.p, opt, w.p, ws, cx.st);
    c = compare(d.p, d.p, S * S, cx.st);
  }
  // SGEMM alone on f32 copies of the dequantized operands (the workspace holds them after a call).
  Dev fa(size_t(S * S) * 4), fb(size_t(S * S) * 4);
  scalemm::quantize::dequantize(qa, fa.p, DType::kF32, cx.st);
  scalemm::quantize::dequantize(qb, fb.p, DType::kF32, cx.st);
  SCALEMM_CUDA_CHECK(cudaGetLastError());
  const Stat t2 = time_calls(cx.st, 1, 1, g_ref_reps, [&](int) {
    emulation::sgemm_nt_device(static_cast<const float*>(fa.p), static_cast<const float*>(fb.p), d.p, S, S, S, opt, cx.st);
  });
  std::printf("| gemm_device (dequantize + fp32 SGEMM) | %.1f | %.2f | %.3f |\n", t.med_us / 1e3, tflops(flops, t.med_us),
              tflops(flops, t.med_us) / g_bf16_tflops);
  std::printf("| sgemm_nt_device alone | %.1f | %.2f | %.3f |\n", t2.med_us / 1e3, tflops(flops, t2.med_us),
              tflops(flops, t2.med_us) / g_bf16_tflops);
  const std::string check = c.nan || c.zero * 2 > c.n ? c.text() : "written, no NaN";
  std::printf("\nreference output: %s\n", check.c_str());
  std::fflush(stdout);
  g_reference.i("m", S).i("n", S).i("k", S).s("recipe", "mxfp8").i("reps", g_ref_reps)
      .n("gemm_device_ms", t.med_us / 1e3).n("gemm_device_tflops", tflops(flops, t.med_us))
      .n("sgemm_nt_device_ms", t2.med_us / 1e3).n("sgemm_nt_device_tflops", tflops(flops, t2.med_us))
      .s("output_check", check);
  g_targets.push_back(JObj().s("target", "reference emulator 8192^3 < 1 s").n("value", t.med_us / 1e6)
                          .b("met", t.med_us < 1e6).str());
}

// ---- targets over the GEMM rows ----------------------------------------------------------------------------

void gemm_targets() {
  double worst = 0, worst_lt = 0;
  std::string worst_at, worst_lt_at;
  double mx = NAN;
  for (const Row& r : g_rows) {
    const bool big = double(r.m) * double(r.n) * double(r.k) >= 4096.0 * 4096.0 * 4096.0;
    if (big && std::isfinite(r.ratio) && r.ratio > worst) {
      worst = r.ratio;
      worst_at = r.recipe + " " + std::to_string(r.m) + "x" + std::to_string(r.n) + "x" + std::to_string(r.k);
    }
    if (big && std::isfinite(r.ratio_lt) && r.ratio_lt > worst_lt) {
      worst_lt = r.ratio_lt;
      worst_lt_at = r.recipe + " " + std::to_string(r.m) + "x" + std::to_string(r.n) + "x" + std::to_string(r.k);
    }
    if (r.recipe == "mxfp8" && r.m == 8192 && r.n == 8192 && r.k == 8192) mx = r.vs_bf16;
  }
  if (worst > 0)
    g_targets.push_back(JObj().s("target", "scalemm/raw cuBLASLt <= 1.02 at >= 4096^3 (worst, compact scales)")
                            .n("value", worst).s("at", worst_at).b("met", worst <= 1.02).str());
  if (worst_lt > 0)
    g_targets.push_back(JObj().s("target", "scalemm/raw cuBLASLt <= 1.02 at >= 4096^3 (worst, cuBLASLt-format scales)")
                            .n("value", worst_lt).s("at", worst_lt_at).b("met", worst_lt <= 1.02).str());
  if (std::isfinite(mx))
    g_targets.push_back(JObj().s("target", "MXFP8 (emulated) >= 0.85x BF16 cuBLASLt rate at 8192^3")
                            .n("value", mx).b("met", mx >= 0.85).str());
}

void print_targets() {
  std::printf("\n## Targets (issue 5)\n\n");
  for (const std::string& t : g_targets) std::printf("- %s\n", t.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) g_quick = true;
    else if (!std::strcmp(argv[i], "--small-m")) g_small_m = true;
    else if (!std::strcmp(argv[i], "--contiguous")) g_contiguous = true;
    else if (!std::strcmp(argv[i], "--autotune")) g_autotune = true;
    else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) g_iters = std::max(30, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--ref-reps") && i + 1 < argc) g_ref_reps = std::max(5, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) g_json_path = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--quick | --small-m | --contiguous] [--autotune] [--iters N>=30] [--ref-reps N>=5] [--json PATH]\n", argv[0]);
      return 2;
    }
  }
  if (!g_json_path.empty()) {  // a bad --json path is refused before the hour of measuring, not after it
    try {
      scalemm::io::check_output(g_json_path, "--json");
    } catch (const scalemm::Error& e) {
      std::fprintf(stderr, "bench_gemm: %s\n", e.what());
      return 2;
    }
  }
  // The timed Handles must not verify, whatever the environment says (the verify section sets it).
  setenv("SCALEMM_VERIFY", "off", 1);

  int dev = 0, driver = 0, runtime = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    std::fprintf(stderr, "bench_gemm: no usable CUDA device\n");
    return 2;
  }
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  const size_t ltv = cublasLtGetVersion();
  g_l2 = size_t(prop.l2CacheSize);
  g_device.s("name", prop.name).i("sm", prop.major * 10 + prop.minor).i("multiprocessors", prop.multiProcessorCount)
      .i("l2_bytes", (long long)prop.l2CacheSize).n("memory_gib", double(prop.totalGlobalMem) / double(1 << 30))
      .i("cuda_driver", driver).i("cuda_runtime", runtime).i("cublaslt_version", (long long)ltv);
  std::printf("# bench_gemm (scalemm %s)%s%s\n\n%s (sm_%d%d, %d SMs, L2 %d MiB, %.0f GiB), CUDA driver %d, runtime %d, "
              "cuBLASLt %zu\nCUDA events per call (host waits for each), %d warm-up, median of %d; random normal data "
              "quantized on the GPU; operand sets rotated when one set fits in 2x L2.\n",
              SCALEMM_VERSION_STRING, g_quick ? " --quick" : "", g_autotune ? " --autotune" : "", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, double(prop.totalGlobalMem) / double(1 << 30), driver,
              runtime, ltv, g_warm, g_iters);

  Ctx cx;
  try {
    SCALEMM_CUDA_CHECK(cudaStreamCreateWithFlags(&cx.st, cudaStreamNonBlocking));
    HandleOptions ho;
    ho.autotune = g_autotune ? Autotune::kOn : Autotune::kOff;
    cx.handle = std::make_unique<Handle>(ho);
    HandleOptions forced = ho;
    forced.plan.force = Backend::kNative;
    cx.native = std::make_unique<Handle>(forced);
    forced.plan.force = Backend::kConvertNative;
    cx.padded = std::make_unique<Handle>(forced);
    cx.lt = std::make_unique<backends::LtContext>();
    cx.lt->set_autotune(g_autotune);  // the same process-wide choice as the Handle: the same algorithm
    cx.lt_ws = Dev(kLtWorkspace);
    g_device.s("planner_target", cx.handle->target().to_string());
    std::printf("planner target: %s\n", cx.handle->target().to_string().c_str());
    ceilings(cx);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gemm: setup failed: %s\n", e.what());
    skipped("setup", e.what());
    write_json();
    return 1;
  }
  write_json();

  auto sticky = [] {
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
      std::printf("FATAL: the device is in error (%s); stopping\n", cudaGetErrorString(e));
      write_json();
      std::exit(1);
    }
  };

  const auto shp = shapes(g_quick);
  std::vector<std::string> emu_lines;
  print_native_header();
  g_in_table = true;
  for (const Shape& sh : shp) {
    if (g_small_m || g_contiguous) {
      for (const RecipeCase& rc : kNative)
        if (rc.a == Recipe::kBlock1x128) native_case(cx, sh, rc);
      write_json();
      continue;
    }
    try {
      bf16_case(cx, sh, emu_lines);
    } catch (const std::exception& e) {
      skipped("bf16 " + sh.label + " " + shape_str(sh), e.what(), &emu_lines);
      sticky();
    }
    for (const RecipeCase& rc : kNative) {
      try {
        native_case(cx, sh, rc);
      } catch (const std::exception& e) {
        skipped(std::string(rc.name) + " " + sh.label + " " + shape_str(sh), e.what());
        sticky();
      }
    }
    for (const RecipeCase& rc : kEmulated) {
      try {
        emulated_case(cx, sh, rc, emu_lines);
      } catch (const std::exception& e) {
        skipped(std::string(rc.name) + " " + sh.label + " " + shape_str(sh), e.what(), &emu_lines);
        sticky();
      }
    }
    write_json();
  }
  g_in_table = false;
  print_emulated_header();
  for (const auto& l : emu_lines) std::printf("%s\n", l.c_str());
  if (!g_plan_notes.empty()) {
    std::printf("\nPlanner choices other than the recipe's expected backend:\n\n");
    for (const auto& n : g_plan_notes) std::printf("- %s\n", n.c_str());
  }
  if (!g_small_m_notes.empty()) {
    std::printf("\nBlockwise%s, scalemm's kernel (the contiguous backend, or the grouped kernel as one group) against "
                "the cuBLASLt call, interleaved with the above:\n\n", g_contiguous ? "" : " at M <= 256");
    for (const auto& n : g_small_m_notes) std::printf("- %s\n", n.c_str());
  }
  std::fflush(stdout);
  if (!g_small_m && !g_contiguous) {
    try {
      host_overhead(cx);
    } catch (const std::exception& e) {
      skipped("host overhead", e.what());
      sticky();
    }
    write_json();
    verify_overhead(cx);
    sticky();
    write_json();
    try {
      reference(cx);
    } catch (const std::exception& e) {
      skipped("reference emulator", e.what());
      sticky();
    }
    gemm_targets();
    print_targets();
  }
  write_json();
  cx.handle.reset();
  cx.native.reset();
  cx.padded.reset();
  cx.lt.reset();
  cx.lt_ws = Dev();
  g_src = Dev();
  cudaStreamDestroy(cx.st);
  std::printf("\n%zu case(s) skipped\n", g_skipped.size());
  return 0;
}
