// `scalemm gemm` and `scalemm replay`.
//
// gemm: D = alpha * A * B^T from .npy files. A (M, K) and B (N, K) are uint8 raw FP8 bits (NVFP4:
// packed (M, K/2), (N, K/2), element 2i in the low nibble); scales as `layout check` takes them.
// On a machine with a CUDA device the call goes through a Handle with device buffers (the backend
// chosen by the planner, or forced with --backend); without one, through a Handle with host pointers,
// which runs the host reference emulator.
//
// replay: re-runs a call that verify mode dumped (verify::dump_call's files), shows the recorded and
// the local plan, and compares the dumped D and every feasible local backend with the reference.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <tuple>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "dispatch/verify.hpp"
#include "cli_io.hpp"
#include "commands.hpp"
#include "scalemm/emulation/compare.hpp"
#include "scalemm/formats.hpp"
#include "scalemm/gemm.hpp"
#include "scalemm/grouped.hpp"
#include "scalemm/io/call_record.hpp"
#include "scalemm/io/npy.hpp"
#include "scalemm/layouts/scale_layout.hpp"
#include "scalemm/layouts/validate.hpp"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/detail/device_buffer.hpp"

using scalemm::detail::cuda_check;

namespace scalemm::cli {
namespace {

// ---- device buffers ---------------------------------------------------------------------------------


using scalemm::detail::DeviceBuffer;

size_t out_bytes(DType t) { return size_t(dtype_storage_bytes(t, 1)); }  // outputs are never packed FP4

/// .npy element type of an output: f32 <f4, f16 <f2, bf16 raw bits <u2, FP8 raw bits |u1.
std::string out_descr(DType t) {
  return t == DType::kF32 ? "<f4" : t == DType::kF16 ? "<f2" : is_fp8_output(t) ? "|u1" : "<u2";
}

struct HostCall {
  GemmArgs args;               ///< host pointers into the vectors below (space = host)
  std::vector<uint8_t> a, b;   ///< data bytes
  std::vector<uint8_t> sa, sb;  ///< scale buffers, layout.bytes() each
  std::vector<uint8_t> bias;   ///< bf16 bits, or empty
  float d_scale = 1.0f;        ///< FP8 output: the D scale (args.d_scale points here on the host)
};

struct RunResult {
  Plan plan;
  std::vector<uint8_t> d;
  double plan_ms = 0, gemm_ms = 0;  ///< planning; the GEMM (on a GPU up to its synchronization)
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

/// Plans and runs `call` with output type `d_dtype`: through device buffers when `gpu`, else through
/// host pointers (the host reference). Throws scalemm::Error (kUnsupported when `force` cannot run).
RunResult run_call(const HostCall& call, DType d_dtype, std::optional<Backend> force, bool gpu) {
  HandleOptions options;
  options.plan.force = force;
  Handle handle(options);
  GemmArgs args = call.args;
  args.d_dtype = d_dtype;
  float d_scale = call.d_scale;
  args.d_scale = is_fp8_output(d_dtype) ? &d_scale : nullptr;  // f32 reference runs carry no D scale
  args.d_amax = nullptr;
  RunResult r;
  r.d.assign(size_t(args.m * args.n) * out_bytes(d_dtype), 0);
  if (!gpu) {
    args.space = MemorySpace::kHost;
    args.d = r.d.data();
    auto t0 = std::chrono::steady_clock::now();
    r.plan = handle.plan(args);
    r.plan_ms = ms_since(t0);
    t0 = std::chrono::steady_clock::now();
    handle.gemm(args);
    r.gemm_ms = ms_since(t0);
    return r;
  }
  DeviceBuffer a, b, sa, sb, bias, d, ds;
  args.space = MemorySpace::kDevice;
  args.a.data = a.upload(call.a.data(), call.a.size());
  args.b.data = b.upload(call.b.data(), call.b.size());
  args.a.scale = sa.upload(call.sa.data(), call.sa.size());
  args.b.scale = sb.upload(call.sb.data(), call.sb.size());
  args.bias = call.bias.empty() ? nullptr : bias.upload(call.bias.data(), call.bias.size());
  args.d = d.alloc(r.d.size());
  if (args.d_scale) args.d_scale = static_cast<const float*>(ds.upload(&d_scale, sizeof(float)));
  auto t0 = std::chrono::steady_clock::now();
  r.plan = handle.plan(args);
  r.plan_ms = ms_since(t0);
  t0 = std::chrono::steady_clock::now();
  handle.gemm(args, nullptr);
  cuda_check(cudaDeviceSynchronize(), "GEMM");
  r.gemm_ms = ms_since(t0);
  handle.check_verification();  // SCALEMM_VERIFY=sample judges asynchronously: collect its verdict
  cuda_check(cudaMemcpy(r.d.data(), d.p, r.d.size(), cudaMemcpyDeviceToHost), "copy D to the host");
  return r;
}

bool have_gpu() { return DeviceTarget::current().has_gpu(); }

// ---- input checks -----------------------------------------------------------------------------------

void data_diagnostics(Diagnostics& out, const io::NpyArray& arr, const std::string& name, DType dtype, int64_t k) {
  if (arr.descr != "|u1" && arr.descr != "<u1")
    out.push_back({name, "data-dtype", "operand data is stored as uint8 raw bits", "uint8",
                   io::npy_type_name(arr.descr), "Save FP8/FP4 data as its raw bytes (numpy .view(np.uint8))."});
  const bool fp4 = dtype == DType::kE2M1;
  if (fp4 && k % 2 != 0) {
    for (const auto& d : out)
      if (d.rule == "fp4-k-even") return;  // said once for both operands
    out.push_back({"k", "fp4-k-even", "packed FP4 rows hold two elements per byte, so K must be even", "even K",
                   std::to_string(k), "Pad K to a multiple of 32."});
    return;
  }
  const int64_t cols = fp4 ? k / 2 : k;
  const std::string want = std::string("(") + (name == "a" ? "M" : "N") + ", " + std::to_string(cols) + ")" +
                           (fp4 ? " (K/2 bytes of packed FP4 per row)" : "");
  if (arr.shape.size() != 2 || arr.shape[1] != cols || arr.shape[0] < 1)
    out.push_back({name, "data-shape", name == "a" ? "A is (M, K) row-major" : "B is (N, K) row-major (D = A B^T)",
                   want, arr.describe(), "Check --k and the operand's orientation."});
  else if (arr.shape[0] > (int64_t(1) << 31) || arr.data.size() != size_t(arr.shape[0]) * size_t(cols))
    out.push_back({name, "data-shape", "the file holds rows x K bytes of data, at most 2^31 rows",
                   std::to_string(arr.shape[0]) + " x " + std::to_string(cols) + " bytes",
                   std::to_string(arr.data.size()) + " bytes", ""});
}

nlohmann::json comparison_json(const emulation::Comparison& c) {
  return {{"count", c.count},          {"bit_mismatches", c.bit_mismatches}, {"max_abs_err", c.max_abs_err},
          {"max_abs_index", c.max_abs_index}, {"max_rel_err", c.max_rel_err}, {"sqnr_db", std::isfinite(c.sqnr_db) ? nlohmann::json(c.sqnr_db) : nlohmann::json("inf")},
          {"violations", c.violations}, {"nonfinite_mismatches", c.nonfinite_mismatches},
          {"within_tolerance", c.within_tolerance()}, {"summary", c.to_string()}};
}

/// D as floats; FP8 outputs are divided by their D scale (the unscaled domain verify compares in).
std::vector<float> widen(const std::vector<uint8_t>& d, DType t, float d_scale = 1.0f) {
  const size_t n = d.size() / out_bytes(t);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (is_fp8_output(t)) {
      out[i] = (t == DType::kE4M3 ? formats::decode_e4m3(d[i]) : formats::decode_e5m2(d[i])) / d_scale;
    } else if (t == DType::kF32) {
      std::memcpy(&out[i], d.data() + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, d.data() + 2 * i, 2);
      out[i] = t == DType::kBF16 ? formats::decode_bf16(h) : formats::decode_f16(h);
    }
  }
  return out;
}

// ---- gemm -------------------------------------------------------------------------------------------

struct GemmCli {
  std::string recipe_a, recipe_b, a, b, scale_a, scale_b, out;
  int64_t k = 0;
  std::string scale_format = "compact", out_dtype = "bf16", backend = "auto", a_dtype = "e4m3", b_dtype = "e4m3";
  float alpha = 1.0f;
  float d_scale = 1.0f;
  bool json = false;
  std::string group_sizes, group_dim = "m";  ///< grouped calls: "3,0,5" or a .npy of int32/int64
  CLI::Option* d_scale_opt = nullptr;
  CLI::Option* a_dtype_opt = nullptr;
  CLI::Option* b_dtype_opt = nullptr;
};

DType operand_dtype(Recipe r, const std::string& flag_value, const CLI::Option* opt, const char* flag) {
  if (r == Recipe::kNvfp4) {
    if (opt && opt->count() > 0)
      throw Error(StatusCode::kInvalidArgument, std::string(flag) + ": nvfp4 data is always e2m1 (packed FP4)");
    return DType::kE2M1;
  }
  return parse_dtype_or_throw(flag_value, flag);
}

/// Summary of D's values as stored (FP8 outputs decoded, not divided by the D scale).
nlohmann::json output_summary(const std::vector<float>& v) {
  double lo = INFINITY, hi = -INFINITY, sum = 0, abs_max = 0;
  int64_t finite = 0, nan = 0, inf = 0, zero = 0;
  for (float x : v) {
    if (std::isnan(x)) { ++nan; continue; }
    if (std::isinf(x)) { ++inf; continue; }
    ++finite;
    lo = std::min(lo, double(x));
    hi = std::max(hi, double(x));
    sum += x;
    abs_max = std::max(abs_max, std::fabs(double(x)));
    zero += x == 0;
  }
  nlohmann::json j{{"elements", v.size()}, {"nan", nan}, {"inf", inf}, {"zeros", zero}};
  if (finite) {
    j["min"] = lo;
    j["max"] = hi;
    j["mean"] = sum / double(finite);
    j["abs_max"] = abs_max;
  } else {
    j["min"] = j["max"] = j["mean"] = j["abs_max"] = nullptr;
  }
  return j;
}

/// With --json, a refusal is a JSON object on stdout too: {"ok": false, ...}.
[[noreturn]] void refuse_json(const std::string& error, const Diagnostics& diags) {
  nlohmann::json j{{"ok", false}, {"error", error}, {"diagnostics", diagnostics_json(diags)}};
  std::cout << j.dump(2) << '\n';
  std::cout.flush();
  throw Exit{kExitInvalidInput};
}

void run_grouped(const GemmCli& g);

/// The recipes, data types, scale format and output type that --recipe-a/-b, --a-dtype/--b-dtype,
/// --scale-format and --out-dtype name (dense and grouped calls alike).
std::tuple<Recipe, Recipe, DType, DType, ScaleFormat, DType> parse_types(const GemmCli& g) {
  const Recipe ra = parse_recipe_or_throw(g.recipe_a, "--recipe-a");
  const Recipe rb = parse_recipe_or_throw(g.recipe_b, "--recipe-b");
  return {ra, rb, operand_dtype(ra, g.a_dtype, g.a_dtype_opt, "--a-dtype"),
          operand_dtype(rb, g.b_dtype, g.b_dtype_opt, "--b-dtype"),
          parse_scale_format_or_throw(g.scale_format, "--scale-format"), parse_dtype_or_throw(g.out_dtype, "--out-dtype")};
}

/// Refuses the call when `diags` is not empty: the diagnostics on stderr (or as JSON), exit 1,
/// nothing written.
/// A backend that cannot run the call (a forced one, say) refuses it like invalid input: exit 1,
/// nothing written. Other errors propagate.
[[noreturn]] void refuse_unsupported(const Error& e, bool json) {
  if (e.code() != StatusCode::kUnsupported) throw e;
  if (json) refuse_json(e.what(), {});
  std::fprintf(stderr, "scalemm gemm: %s\nnothing written\n", e.what());
  throw Exit{kExitInvalidInput};
}

void refuse_if_any(const Diagnostics& diags, const char* what, bool json) {
  if (diags.empty()) return;
  if (json) refuse_json(what, diags);
  std::fprintf(stderr, "scalemm gemm: %s (%zu problem(s)); nothing written\n", what, diags.size());
  print_diagnostics(stderr, diags);
  throw Exit{kExitInvalidInput};
}

void run_gemm(const GemmCli& g) {
  if (!g.group_sizes.empty()) {
    run_grouped(g);
    return;
  }
  const auto t_start = std::chrono::steady_clock::now();
  const auto [ra, rb, ta, tb, fmt, td] = parse_types(g);
  std::optional<Backend> force;
  if (g.backend != "auto") force = parse_backend(g.backend);
  check_output_path(g.out, "--out", {g.a, g.b, g.scale_a, g.scale_b});  // before any input is read

  const io::NpyArray a = read_npy_option(g.a, "--a"), b = read_npy_option(g.b, "--b");
  Diagnostics diags;
  data_diagnostics(diags, a, "a", ta, g.k);
  data_diagnostics(diags, b, "b", tb, g.k);
  refuse_if_any(diags, "invalid operands", g.json);
  HostCall call;
  const int64_t m = a.shape[0], n = b.shape[0];
  const layouts::ScaleLayout la(ra, m, g.k, fmt), lb(rb, n, g.k, fmt);
  check_layout_extent(la);
  check_layout_extent(lb);
  LoadedScales sa = load_scales(read_npy_option(g.scale_a, "--scale-a"), la, "scale_a", true, g.scale_a);
  LoadedScales sb = load_scales(read_npy_option(g.scale_b, "--scale-b"), lb, "scale_b", true, g.scale_b);
  diags.insert(diags.end(), sa.diagnostics.begin(), sa.diagnostics.end());
  diags.insert(diags.end(), sb.diagnostics.begin(), sb.diagnostics.end());
  call.a = a.data;
  call.b = b.data;
  call.sa = std::move(sa.buffer);
  call.sb = std::move(sb.buffer);
  GemmArgs& args = call.args;
  args.m = m;
  args.n = n;
  args.k = g.k;
  args.a = GemmOperand{call.a.data(), ta, ra, call.sa.data(), fmt, 1.0f};
  args.b = GemmOperand{call.b.data(), tb, rb, call.sb.data(), fmt, 1.0f};
  args.d_dtype = td;
  args.alpha = g.alpha;
  args.space = MemorySpace::kHost;
  call.d_scale = g.d_scale;
  args.d_scale = g.d_scale_opt && g.d_scale_opt->count() ? &call.d_scale : nullptr;
  static uint8_t placeholder_d[16];
  args.d = placeholder_d;  // replaced by run_call; validate() wants a pointer
  if (diags.empty()) {
    const Diagnostics v = validate(args);
    diags.insert(diags.end(), v.begin(), v.end());
  }
  refuse_if_any(diags, "invalid inputs", g.json);
  const bool gpu = have_gpu();
  const std::string problem = GemmProblem::from(args).to_string();
  const std::string machine = DeviceTarget::current().to_string() + (gpu ? "" : " (host reference emulator)");
  if (!g.json) {
    std::printf("%s\n", problem.c_str());
    std::printf("machine: %s\n", machine.c_str());
    std::fflush(stdout);
  }
  const double read_ms = ms_since(t_start);
  RunResult r;
  const auto t_run = std::chrono::steady_clock::now();
  try {
    r = run_call(call, td, force, gpu);
  } catch (const Error& e) {
    refuse_unsupported(e, g.json);
  }
  const double run_ms = ms_since(t_run);
  if (!g.json) std::printf("plan: %s\n", r.plan.explain().c_str());
  io::NpyArray d;
  d.descr = out_descr(td);
  d.shape = {m, n};
  d.data = std::move(r.d);
  const auto t_write = std::chrono::steady_clock::now();
  io::write_npy(g.out, d, "--out");
  const double write_ms = ms_since(t_write);
  const char* raw = td == DType::kBF16 ? " (bf16 raw bits)" : is_fp8_output(td) ? " (FP8 raw bits)" : "";
  if (!g.json) {
    std::printf("wrote %s: %s%s\n", g.out.c_str(), d.describe().c_str(), raw);
    return;
  }
  nlohmann::json j;
  j["ok"] = true;
  j["problem"] = problem;
  j["m"] = m;
  j["n"] = n;
  j["k"] = g.k;
  j["machine"] = machine;
  j["gpu"] = gpu;
  nlohmann::json conversions = nlohmann::json::array();
  for (const auto& c : r.plan.conversions) conversions.push_back({{"what", c.what}, {"output_bytes", c.output_bytes}});
  j["plan"] = {{"backend", std::string(to_string(r.plan.backend))},
               {"forced", force.has_value()},
               {"reasons", r.plan.reasons},
               {"conversions", conversions},
               {"workspace_bytes", r.plan.workspace_bytes},
               {"explain", r.plan.explain()}};
  j["backend"] = std::string(to_string(r.plan.backend));
  // gemm: the call itself (on a GPU up to its synchronization); run: also the uploads and the download.
  j["timings_ms"] = {{"read_and_check", read_ms}, {"plan", r.plan_ms}, {"gemm", r.gemm_ms},
                     {"run", run_ms},             {"write", write_ms}, {"total", ms_since(t_start)}};
  nlohmann::json out{{"file", g.out}, {"dtype", std::string(to_string(td))}, {"npy", d.describe() + raw},
                     {"shape", {m, n}}};
  out["values"] = output_summary(widen(d.data, td));
  j["output"] = out;
  std::cout << j.dump(2) << '\n';
}

// ---- grouped gemm ---------------------------------------------------------------------------------

/// Scale file of a grouped operand: raw bytes of the expected element type and total size.
std::vector<uint8_t> grouped_scales(const std::string& path, const char* arg, DType scale_dtype, int64_t want_bytes,
                                    const std::string& what, const std::string& fix, Diagnostics& diags) {
  io::NpyArray arr = read_npy_option(path, std::string(arg) == "scale_a" ? "--scale-a" : "--scale-b");
  const bool f32 = scale_dtype == DType::kF32;
  const bool type_ok = f32 ? arr.descr == "<f4" : arr.descr == "|u1" || arr.descr == "<u1";
  if (!type_ok)
    diags.push_back({arg, "scale-dtype", "scale elements of this recipe", f32 ? "float32" : "uint8",
                     io::npy_type_name(arr.descr), ""});
  else if (int64_t(arr.data.size()) != want_bytes)
    diags.push_back({arg, "grouped-scale-size", what, std::to_string(want_bytes) + " bytes",
                     std::to_string(arr.data.size()) + " bytes (" + arr.describe() + ")", fix});
  return std::move(arr.data);
}

void run_grouped(const GemmCli& g) {
  const auto [ra, rb, ta, tb, fmt, td] = parse_types(g);
  if (g.group_dim != "m" && g.group_dim != "k")
    throw Error(StatusCode::kInvalidArgument, "--group-dim: expected m or k, got '" + g.group_dim + "'");
  const GroupDim dim = g.group_dim == "m" ? GroupDim::kM : GroupDim::kK;
  std::optional<Backend> force;
  if (g.backend != "auto") force = parse_backend(g.backend);
  check_output_path(g.out, "--out", {g.a, g.b, g.scale_a, g.scale_b, g.group_sizes});
  const std::vector<int64_t> sizes = parse_group_sizes(g.group_sizes);
  const int64_t groups = int64_t(sizes.size());

  io::NpyArray a = read_npy_option(g.a, "--a"), b = read_npy_option(g.b, "--b");
  Diagnostics diags;
  data_diagnostics(diags, a, "a", ta, g.k);
  if (dim == GroupDim::kM) {  // B is (G, N, K): checked as the (G*N, K) rows it holds
    if (b.shape.size() != 3 || b.shape[0] != groups)
      diags.push_back({"b", "grouped-b-shape", "B of an m-grouped call holds one (N, K) operand per group",
                       "(" + std::to_string(groups) + ", N, K" + (tb == DType::kE2M1 ? "/2" : "") + ")", b.describe(),
                       "Stack the experts' weights along a first axis of G = the number of group sizes."});
    else
      b.shape = {b.shape[0] * b.shape[1], b.shape[2]};
  }
  if (diags.empty()) data_diagnostics(diags, b, "b", tb, g.k);
  refuse_if_any(diags, "invalid operands", g.json);
  GroupedGemmArgs ga;
  ga.group_dim = dim;
  ga.groups = groups;
  ga.group_sizes = sizes.data();
  ga.m = a.shape[0];
  ga.n = dim == GroupDim::kM ? b.shape[0] / std::max<int64_t>(groups, 1) : b.shape[0];
  ga.k = g.k;
  ga.d_dtype = td;
  ga.alpha = g.alpha;
  ga.space = MemorySpace::kHost;
  // The scale buffers' sizes depend on the group sizes: check those first (validate stops there).
  GroupedGemmArgs sizes_only = ga;
  static uint8_t placeholder[16];
  sizes_only.a = {placeholder, ta, ra, placeholder, fmt, 1.0f};
  sizes_only.b = sizes_only.a, sizes_only.b.dtype = tb, sizes_only.b.recipe = rb;
  sizes_only.d = placeholder;
  Diagnostics size_diags;
  for (const auto& d : validate(sizes_only))
    if (d.argument.rfind("group", 0) == 0 || d.argument == "d_dtype") size_diags.push_back(d);
  std::vector<uint8_t> sa, sb;
  if (size_diags.empty()) {
    const layouts::ScaleLayout la(ra, ga.m, ga.k, fmt), lb(rb, ga.n, ga.k, fmt);
    const int64_t a_bytes = dim == GroupDim::kM ? grouped_scale_offsets(sizes_only).back() : la.bytes();
    const int64_t b_bytes = dim == GroupDim::kM ? groups * grouped_b_scale_stride(sizes_only) : lb.bytes();
    // The fix names a command that runs for this call: the m-grouped A's buffers have their own
    // `layout explain --group-sizes`; every other operand is one layout of its whole tensor.
    const auto explain = [&](Recipe r, int64_t rows, const std::string& extra) {
      return "See docs/grouped.md for the per-group scale layouts; `scalemm layout explain --recipe " +
             std::string(to_string(r)) + " --rows " + std::to_string(rows) + " --cols " + std::to_string(ga.k) +
             " --format " + g.scale_format + extra + "` prints " + (extra.empty() ? "the layout." : "each group's.");
    };
    const bool text_sizes = g.group_sizes.find(' ') == std::string::npos;
    sa = grouped_scales(g.scale_a, "scale_a", la.scale_dtype(), a_bytes,
                        dim == GroupDim::kM ? "each group's scale buffer for its rows, in group order"
                                            : "the whole (M, sum K_g) tensor's scales",
                        explain(ra, ga.m, dim == GroupDim::kM && text_sizes ? " --group-sizes " + g.group_sizes : ""),
                        diags);
    sb = grouped_scales(g.scale_b, "scale_b", lb.scale_dtype(), b_bytes,
                        dim == GroupDim::kM ? "one (N, K) scale buffer per expert, stacked"
                                            : "the whole (N, sum K_g) tensor's scales",
                        explain(rb, ga.n, ""), diags);
  }
  diags.insert(diags.begin(), size_diags.begin(), size_diags.end());
  std::vector<uint8_t> out_bytes_host(size_t((dim == GroupDim::kM ? ga.m : groups * ga.m) * ga.n) * out_bytes(td));
  ga.a = {a.data.data(), ta, ra, sa.data(), fmt, 1.0f};
  ga.b = {b.data.data(), tb, rb, sb.data(), fmt, 1.0f};
  ga.d = out_bytes_host.data();
  if (diags.empty()) diags = validate(ga);
  refuse_if_any(diags, "invalid inputs", g.json);
  const bool gpu = have_gpu();
  HandleOptions options;
  options.plan.force = force;
  Handle handle(options);
  std::string plan;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    if (!gpu) {
      plan = handle.explain(ga);
      handle.grouped_gemm(ga);
    } else {
      DeviceBuffer da, db, dsa, dsb, dd;
      GroupedGemmArgs dev = ga;
      dev.space = MemorySpace::kDevice;
      dev.a.data = da.upload(a.data.data(), a.data.size());
      dev.b.data = db.upload(b.data.data(), b.data.size());
      dev.a.scale = dsa.upload(sa.data(), sa.size());
      dev.b.scale = dsb.upload(sb.data(), sb.size());
      dev.d = dd.alloc(out_bytes_host.size());
      plan = handle.explain(dev);
      handle.grouped_gemm(dev, nullptr);
      cuda_check(cudaDeviceSynchronize(), "grouped GEMM");
      cuda_check(cudaMemcpy(out_bytes_host.data(), dev.d, out_bytes_host.size(), cudaMemcpyDeviceToHost),
                 "copy D to the host");
    }
  } catch (const Error& e) {
    refuse_unsupported(e, g.json);
  }
  const double run_ms = ms_since(t0);
  io::NpyArray d;
  d.descr = out_descr(td);
  d.shape = dim == GroupDim::kM ? std::vector<int64_t>{ga.m, ga.n} : std::vector<int64_t>{groups, ga.m, ga.n};
  d.data = std::move(out_bytes_host);
  io::write_npy(g.out, d, "--out");
  const std::string machine = DeviceTarget::current().to_string() + (gpu ? "" : " (host reference emulator)");
  if (!g.json) {
    std::printf("machine: %s\n%s\nwrote %s: %s\n", machine.c_str(), plan.c_str(), g.out.c_str(),
                d.describe().c_str());
    return;
  }
  nlohmann::json j{{"ok", true},        {"group_dim", g.group_dim}, {"group_sizes", sizes}, {"m", ga.m},
                   {"n", ga.n},         {"k", ga.k},                {"machine", machine},   {"gpu", gpu},
                   {"plan", plan},      {"timings_ms", {{"run", run_ms}}}};
  nlohmann::json out{{"file", g.out}, {"dtype", std::string(to_string(td))}, {"npy", d.describe()}, {"shape", d.shape}};
  out["values"] = output_summary(widen(d.data, td));
  j["output"] = out;
  std::cout << j.dump(2) << '\n';
}

// ---- replay -----------------------------------------------------------------------------------------

struct Worst {
  int64_t index;
  double test, ref, err;
};

std::vector<Worst> worst_elements(const std::vector<float>& ref, const std::vector<float>& test, size_t count) {
  std::vector<Worst> all;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double r = ref[i], t = test[i];
    double err;
    if (std::isnan(r) && std::isnan(t)) err = 0;
    else if (std::isfinite(r) && std::isfinite(t)) err = std::fabs(t - r);
    else err = r == t ? 0 : INFINITY;
    if (err > 0) all.push_back({int64_t(i), t, r, err});
  }
  const size_t k = std::min(count, all.size());
  std::partial_sort(all.begin(), all.begin() + long(k), all.end(),
                    [](const Worst& x, const Worst& y) { return x.err > y.err || (x.err == y.err && x.index < y.index); });
  all.resize(k);
  return all;
}

struct Outcome {
  std::string name;
  bool feasible = true;
  std::string note;  // plan or why not feasible
  std::optional<emulation::Comparison> cmp;
  emulation::Tolerance tol;
  std::vector<Worst> worst;
  int64_t bit_diffs = -1;  ///< elements whose bits differ from the reference rounded to d_dtype
  bool ok() const { return !feasible || (cmp && cmp->within_tolerance()); }
};

Outcome compare_with(const std::string& name, const std::string& note, const GemmArgs& args, Backend backend,
                     const std::vector<float>& ref, double ref_scale, const std::vector<uint8_t>& ref_out,
                     const std::vector<uint8_t>& d) {
  Outcome o;
  o.name = name;
  o.note = note;
  Plan p;
  p.backend = backend;
  o.tol = verify::tolerance_for(args, p, ref_scale);
  const std::vector<float> test = widen(d, args.d_dtype, args.d_scale ? *args.d_scale : 1.0f);
  o.cmp = emulation::compare(ref.data(), test.data(), int64_t(ref.size()), &o.tol);
  o.worst = worst_elements(ref, test, 5);
  o.bit_diffs = emulation::compare(ref_out.data(), d.data(), args.d_dtype, int64_t(ref.size())).bit_mismatches;
  return o;
}

void run_replay(const std::string& dir, bool json_out) {
  const io::CallRecord record = io::read_call_record(dir);
  HostCall call;
  GemmArgs& args = call.args;
  args.m = record.m, args.n = record.n, args.k = record.k;
  args.alpha = record.alpha;
  for (auto [op, r] : {std::pair<GemmOperand*, const io::CallRecord::Operand*>{&args.a, &record.a}, {&args.b, &record.b}}) {
    op->recipe = r->recipe;
    op->dtype = r->dtype;
    op->scale_format = r->scale_format;
    op->global_scale = r->global_scale;
  }
  args.d_dtype = record.d_dtype;
  if (record.d_scale) {  // FP8 output: the D scale's value at the time of the dump
    call.d_scale = *record.d_scale;
    args.d_scale = &call.d_scale;
  }
  const bool has_bias = record.bias;
  const std::string& recorded_backend = record.backend;
  const std::string& recorded_plan = record.plan;

  Diagnostics diags;
  const io::NpyArray a = read_npy_option(dir + "/a.npy", "DIR"), b = read_npy_option(dir + "/b.npy", "DIR");
  data_diagnostics(diags, a, "a", args.a.dtype, args.k);
  data_diagnostics(diags, b, "b", args.b.dtype, args.k);
  if (diags.empty()) {
    if (a.shape[0] != args.m)
      diags.push_back({"a", "data-shape", "a.npy has M rows", std::to_string(args.m), a.describe(), ""});
    if (b.shape[0] != args.n)
      diags.push_back({"b", "data-shape", "b.npy has N rows", std::to_string(args.n), b.describe(), ""});
  }
  const layouts::ScaleLayout la(args.a.recipe, args.m, args.k, args.a.scale_format),
      lb(args.b.recipe, args.n, args.k, args.b.scale_format);
  check_layout_extent(la);
  check_layout_extent(lb);
  // Content problems (NaN scales, ...) are what a dump may be about: report them, replay anyway.
  LoadedScales sa = load_scales(read_npy_option(dir + "/scale_a.npy", "DIR"), la, "scale_a", false);
  LoadedScales sb = load_scales(read_npy_option(dir + "/scale_b.npy", "DIR"), lb, "scale_b", false);
  diags.insert(diags.end(), sa.diagnostics.begin(), sa.diagnostics.end());
  diags.insert(diags.end(), sb.diagnostics.begin(), sb.diagnostics.end());
  const io::NpyArray d = read_npy_option(dir + "/d.npy", "DIR");
  const std::string want_d = out_descr(args.d_dtype);
  if (d.descr != want_d || d.shape != std::vector<int64_t>{args.m, args.n})
    diags.push_back({"d", "data-shape", "d.npy is the (M, N) result in d_dtype",
                     io::npy_type_name(want_d) + "[" + std::to_string(args.m) + ", " + std::to_string(args.n) + "]",
                     d.describe(), ""});
  if (has_bias) {
    call.bias = read_npy_option(dir + "/bias.npy", "DIR").data;
    if (call.bias.size() != size_t(args.n) * 2)
      diags.push_back({"bias", "data-shape", "bias.npy is N bf16 values (uint16 bits)", std::to_string(args.n * 2) + " bytes",
                       std::to_string(call.bias.size()) + " bytes", ""});
  }
  if (!diags.empty()) {
    std::fprintf(stderr, "scalemm replay: %s is not a complete dump (%zu problem(s))\n", dir.c_str(), diags.size());
    print_diagnostics(stderr, diags);
    throw Exit{kExitInvalidInput};
  }
  call.a = a.data;
  call.b = b.data;
  call.sa = std::move(sa.buffer);
  call.sb = std::move(sb.buffer);
  args.a.data = call.a.data();
  args.b.data = call.b.data();
  args.a.scale = call.sa.data();
  args.b.scale = call.sb.data();
  args.bias = call.bias.empty() ? nullptr : call.bias.data();
  args.space = MemorySpace::kHost;
  static uint8_t placeholder_d[16];
  args.d = placeholder_d;
  const Diagnostics content = [&] {
    Diagnostics c = layouts::content_diagnostics(la, layouts::check_content(la, call.sa.data()), "scale_a");
    Diagnostics cb = layouts::content_diagnostics(lb, layouts::check_content(lb, call.sb.data()), "scale_b");
    c.insert(c.end(), cb.begin(), cb.end());
    return c;
  }();
  const Diagnostics invalid = validate(args);
  if (!invalid.empty()) {
    std::fprintf(stderr, "scalemm replay: the dumped call is not valid\n");
    print_diagnostics(stderr, invalid);
    throw Exit{kExitInvalidInput};
  }

  const bool gpu = have_gpu();
  // The reference: host emulator through host pointers, f32 output (as verify mode compares).
  const RunResult ref_run = run_call(call, DType::kF32, Backend::kReference, false);
  std::vector<float> ref = widen(ref_run.d, DType::kF32);
  if (is_fp8_output(args.d_dtype)) {  // an FP8 output saturates at the format's largest finite value
    const float lim = fp8_output_max(args.d_dtype) / call.d_scale;
    for (float& v : ref) v = std::isfinite(v) ? std::min(lim, std::max(-lim, v)) : v;
  }
  const std::vector<uint8_t> ref_out = run_call(call, args.d_dtype, Backend::kReference, false).d;
  double ref_scale = 0;
  for (float v : ref)
    if (std::isfinite(v)) ref_scale = std::max(ref_scale, double(std::fabs(v)));

  std::string local_plan;
  {
    GemmArgs probe = args;
    probe.space = gpu ? MemorySpace::kDevice : MemorySpace::kHost;
    try {
      local_plan = plan(GemmProblem::from(probe), DeviceTarget::current()).explain();
    } catch (const Error& e) {
      local_plan = std::string("no plan: ") + e.what();
    }
  }

  std::vector<Outcome> outcomes;
  const Backend rec = parse_backend(recorded_backend).value_or(Backend::kReference);
  outcomes.push_back(compare_with("dumped d (" + recorded_backend + ")", recorded_plan, args, rec, ref, ref_scale,
                                  ref_out, d.data));
  if (gpu) {
    for (Backend be : {Backend::kContiguous, Backend::kNative, Backend::kConvertNative, Backend::kEmulated,
                       Backend::kReference}) {
      const std::string name = "this machine: " + std::string(to_string(be));
      try {
        const RunResult r = run_call(call, args.d_dtype, be, true);
        outcomes.push_back(compare_with(name, r.plan.explain(), args, be, ref, ref_scale, ref_out, r.d));
      } catch (const Error& e) {
        Outcome o;
        o.name = name;
        o.feasible = e.code() != StatusCode::kUnsupported;
        o.note = e.what();
        outcomes.push_back(o);
      }
    }
  }
  bool all_ok = true;
  for (const auto& o : outcomes) all_ok = all_ok && o.ok();

  if (json_out) {
    nlohmann::json out;
    out["problem"] = GemmProblem::from(args).to_string();
    out["recorded_backend"] = recorded_backend;
    out["recorded_plan"] = recorded_plan;
    out["machine"] = DeviceTarget::current().to_string();
    out["plan"] = local_plan;
    out["scale_content"] = diagnostics_json(content);
    out["agree"] = all_ok;
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& o : outcomes) {
      nlohmann::json e{{"name", o.name}, {"feasible", o.feasible}, {"note", o.note}};
      if (o.cmp) {
        e["tolerance"] = o.tol.to_string();
        e["comparison"] = comparison_json(*o.cmp);
        e["bit_mismatches_vs_reference_in_d_dtype"] = o.bit_diffs;
        nlohmann::json w = nlohmann::json::array();
        for (const auto& x : o.worst)
          w.push_back({{"row", x.index / args.n}, {"col", x.index % args.n}, {"test", x.test}, {"reference", x.ref},
                       {"abs_err", std::isfinite(x.err) ? nlohmann::json(x.err) : nlohmann::json("inf")}});
        e["worst"] = w;
      } else if (o.feasible) {
        e["error"] = o.note;
      }
      arr.push_back(e);
    }
    out["comparisons"] = arr;
    std::cout << out.dump(2) << '\n';
  } else {
    std::printf("replay of %s\n  %s\n", dir.c_str(), GemmProblem::from(args).to_string().c_str());
    std::printf("recorded plan (%s):\n  %s\n", recorded_backend.c_str(), recorded_plan.c_str());
    std::printf("plan on this machine (%s):\n  %s\n", DeviceTarget::current().to_string().c_str(), local_plan.c_str());
    if (!content.empty()) {
      std::printf("scale content problems:\n");
      std::fflush(stdout);
      print_diagnostics(stdout, content);
    }
    std::printf("comparisons against the host reference (f32 accumulation, %s)%s:\n",
                gpu ? "every backend forced in turn" : "no CUDA device: only the dumped result",
                "");
    for (const auto& o : outcomes) {
      if (!o.cmp) {
        std::printf("  %s: %s: %s\n", o.name.c_str(), o.feasible ? "FAILED" : "not feasible", o.note.c_str());
        continue;
      }
      std::printf("  %s: %s\n    tolerance %s\n    vs f32 reference: %s\n    vs reference rounded to %s: %s\n",
                  o.name.c_str(), o.cmp->within_tolerance() ? "agrees" : "DISAGREES", o.tol.to_string().c_str(),
                  o.cmp->to_string().c_str(), std::string(to_string(args.d_dtype)).c_str(),
                  o.bit_diffs == 0 ? "bitwise identical"
                                   : (std::to_string(o.bit_diffs) + " of " + std::to_string(ref.size()) +
                                      " elements differ in bits").c_str());
      if (!o.worst.empty()) std::printf("    worst elements:\n");
      for (const auto& x : o.worst)
        std::printf("      D[%lld, %lld] = %.9g  reference %.9g  |err| %.3g  (allowed %.3g)\n",
                    static_cast<long long>(x.index / args.n), static_cast<long long>(x.index % args.n), x.test, x.ref,
                    x.err, o.tol.atol + o.tol.rtol * std::fabs(x.ref));
    }
    std::printf("%s\n", all_ok ? "all results agree with the reference" : "MISMATCH: see above");
  }
  std::fflush(stdout);
  if (!all_ok) throw Exit{kExitInvalidInput};
}

}  // namespace

void register_gemm_commands(CLI::App& app) {
  static GemmCli g;
  auto* gemm = app.add_subcommand(
      "gemm", "D = alpha * A * B^T from .npy files (A (M,K), B (N,K) uint8 raw bits; NVFP4 packed (M,K/2)); "
              "prints the plan; without a GPU it runs the host reference");
  gemm->add_option("--recipe-a", g.recipe_a, "Recipe of A: " + all_recipe_names())->required();
  gemm->add_option("--recipe-b", g.recipe_b, "Recipe of B: " + all_recipe_names())->required();
  gemm->add_option("--a", g.a, "A (.npy uint8, (M, K); nvfp4 (M, K/2))")->required();
  gemm->add_option("--b", g.b, "B (.npy uint8, (N, K); nvfp4 (N, K/2))")->required();
  gemm->add_option("--scale-a", g.scale_a, "Scales of A (.npy float32 or uint8)")->required();
  gemm->add_option("--scale-b", g.scale_b, "Scales of B (.npy float32 or uint8)")->required();
  gemm->add_option("--k", g.k, "Reduction length K in elements")
      ->required()
      ->check(whole_number(1, kMaxExtent, "the reduction length K in elements"));
  gemm->add_option("--out", g.out, "Output D (.npy (M, N): f32 <f4, f16 <f2, bf16 <u2 raw bits, e4m3/e5m2 |u1 raw bits)")
      ->required();
  gemm->add_option("--scale-format", g.scale_format, "Format of both scale files (default compact)")
      ->check(CLI::IsMember({"compact", "cublaslt"}));
  gemm->add_option("--out-dtype", g.out_dtype, "Output type (default bf16; e4m3/e5m2 need --d-scale)")
      ->check(CLI::IsMember({"bf16", "f16", "f32", "e4m3", "e5m2"}));
  g.d_scale_opt = gemm->add_option("--d-scale", g.d_scale,
                                   "FP8 output only: D = fp8(d_scale * alpha * A * B^T), saturating")
                      ->check(positive_finite("the FP8 output's scale: D = fp8(d_scale * alpha * A * B^T)"));
  gemm->add_option("--backend", g.backend, "Backend (default auto; contiguous: scalemm's blockwise kernel)")
      ->check(CLI::IsMember({"auto", "native", "emulated", "reference", "contiguous"}));
  gemm->add_option("--alpha", g.alpha, "Scalar alpha (default 1; fold NVFP4 global scales in here)");
  g.a_dtype_opt = gemm->add_option("--a-dtype", g.a_dtype, "FP8 type of A (default e4m3; nvfp4 is always e2m1)")
                      ->check(CLI::IsMember({"e4m3", "e5m2"}));
  g.b_dtype_opt = gemm->add_option("--b-dtype", g.b_dtype, "FP8 type of B (default e4m3; nvfp4 is always e2m1)")
                      ->check(CLI::IsMember({"e4m3", "e5m2"}));
  gemm->add_flag("--json", g.json, "Print the plan, backend, reasons, timings and an output summary as JSON");
  gemm->add_option("--group-sizes", g.group_sizes,
                   "Grouped GEMM: the G group sizes, \"3,0,5\" or a .npy of int32/int64 (M_g with --group-dim m, "
                   "K_g with --group-dim k); see docs/grouped.md");
  gemm->add_option("--group-dim", g.group_dim,
                   "Grouped GEMM: m (A rows grouped, --b (G, N, K), scales stacked per expert) or k (A (M, sum K_g), "
                   "B (N, sum K_g), --out (G, M, N)); default m")
      ->check(CLI::IsMember({"m", "k"}));
  gemm->callback([] { run_gemm(g); });

  static std::string replay_dir;
  static bool replay_json = false;
  auto* replay = app.add_subcommand(
      "replay", "Re-run a call dumped by verify mode, show the plan, compare backends with the reference");
  replay->add_option("DIR", replay_dir, "Dump directory (a.npy, scale_a.npy, b.npy, scale_b.npy, [bias.npy], d.npy, call.json)")
      ->required();
  replay->add_flag("--json", replay_json, "Print the comparison as JSON");
  replay->callback([] { run_replay(replay_dir, replay_json); });
}

}  // namespace scalemm::cli
