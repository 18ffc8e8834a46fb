// plan(): the backend table walked in order, each entry either taken or passed over with its reason.
#include <algorithm>
#include <sstream>

#include "capabilities.hpp"
#include "scalemm/gemm.hpp"
#include "scalemm/layouts/scale_layout.hpp"

namespace scalemm {

namespace {

constexpr const char* kArrow = " \xE2\x86\x92 ";  // " → "

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

// True when two layouts of one operand place every scale at the same offset in buffers of the same
// size (e.g. block128x128 with a K-block count divisible by 4: compact and cuBLASLt coincide). Walks
// the grid through offset() once per plan; the first difference ends it.
bool same_buffer(const layouts::ScaleLayout& x, const layouts::ScaleLayout& y) {
  if (x.size() != y.size()) return false;
  for (int64_t g = 0; g < x.grid_rows(); ++g) {
    const int64_t r = g * x.block_rows();
    for (int64_t kb = 0; kb < x.kblocks(); ++kb)
      if (x.offset(r, kb) != y.offset(r, kb)) return false;
  }
  return true;
}

// Adds the scale-format conversions a cuBLASLt call needs; returns their workspace bytes.
size_t add_scale_conversions(const GemmProblem& p, Plan& plan) {
  size_t ws = 0;
  struct Side {
    const char* name;
    Recipe recipe;
    ScaleFormat format;
    int64_t rows;
    bool* flag;
  } sides[] = {{"scale_a", p.a_recipe, p.a_format, p.m, &plan.convert_scale_a},
               {"scale_b", p.b_recipe, p.b_format, p.n, &plan.convert_scale_b}};
  for (const auto& s : sides) {
    if (s.format == ScaleFormat::kCublasLt) continue;
    const layouts::ScaleLayout compact(s.recipe, s.rows, p.k, ScaleFormat::kCompact);
    const layouts::ScaleLayout lt = compact.with_format(ScaleFormat::kCublasLt);
    if (same_buffer(compact, lt)) continue;
    *s.flag = true;
    plan.conversions.push_back({std::string(s.name) + ": " + std::string(to_string(s.recipe)) +
                                    " compact -> cublaslt " + lt.shape_stride_string(),
                                lt.bytes()});
    ws += align256(static_cast<size_t>(lt.bytes()));
  }
  return ws;
}

struct Candidate {
  bool ok = false;
  std::string reason;  // why taken, or why passed over
};

Candidate try_native(const GemmProblem& p, const DeviceTarget& t, Plan& plan) {
  const std::string blocker = dispatch::native_blocker(p, t);
  if (!blocker.empty()) return {false, blocker};
  plan.workspace_bytes = add_scale_conversions(p, plan);
  // cuBLASLt's A is the user's B (and vice versa) after the row-major swap.
  plan.cublas_scale_mode_a = dispatch::recipe_scale_mode(p.b_recipe);
  plan.cublas_scale_mode_b = dispatch::recipe_scale_mode(p.a_recipe);
  return {true, std::string("native: cuBLASLt ") + dispatch::scale_mode_name(plan.cublas_scale_mode_a) +
                    "\xC3\x97" + dispatch::scale_mode_name(plan.cublas_scale_mode_b) + " on " + t.to_string()};
}

bool block_fp32(Recipe r) { return r == Recipe::kBlock1x128 || r == Recipe::kBlock128x128; }

// VEC128/BLK128x128 need M and N multiples of 4. M = 1..3 (decoding) pads exactly: zero rows of A give
// zero rows of D, and A's scale buffer in cuBLASLt format already has roundup(M, 4) rows (VEC128:
// kb * roundup(M,4) + r; BLK128x128: one grid row per 128 rows), so only A's data and D are copied.
Candidate try_pad_m(const GemmProblem& p, const DeviceTarget& t, Plan& plan) {
  GemmProblem q = p;
  q.m = layouts::round_up(p.m, 4);
  const std::string blocker = dispatch::native_blocker(q, t);
  if (!blocker.empty()) return {false, "padded to M=" + std::to_string(q.m) + ": " + blocker};
  const layouts::ScaleLayout a_lt(p.a_recipe, p.m, p.k, ScaleFormat::kCublasLt);
  if (a_lt.size() != layouts::ScaleLayout(p.a_recipe, q.m, p.k, ScaleFormat::kCublasLt).size())
    return {false, "scale_a's cuBLASLt buffer does not cover M=" + std::to_string(q.m)};
  plan.workspace_bytes = add_scale_conversions(p, plan);
  const size_t a_bytes = static_cast<size_t>(q.m * p.k), d_bytes = static_cast<size_t>(dtype_storage_bytes(p.d_dtype, q.m * p.n));
  plan.conversions.push_back({"a: M=" + std::to_string(p.m) + " -> " + std::to_string(q.m) + " rows (zero rows appended)",
                              int64_t(a_bytes)});
  plan.conversions.push_back({"d: first " + std::to_string(p.m) + " of " + std::to_string(q.m) + " rows copied out",
                              int64_t(d_bytes)});
  plan.workspace_bytes += align256(a_bytes) + align256(d_bytes);
  plan.padded_m = q.m;
  plan.cublas_scale_mode_a = dispatch::recipe_scale_mode(p.b_recipe);
  plan.cublas_scale_mode_b = dispatch::recipe_scale_mode(p.a_recipe);
  return {true, "convert-then-native: A padded to M=" + std::to_string(q.m) + " with zero rows (exact), cuBLASLt " +
                    dispatch::scale_mode_name(plan.cublas_scale_mode_a) + "\xC3\x97" +
                    dispatch::scale_mode_name(plan.cublas_scale_mode_b)};
}

// Recipe conversions that turn an unsupported pair into a native one, exactly.
Candidate try_convert_native(const GemmProblem& p, const DeviceTarget& t, Plan& plan) {
  if (block_fp32(p.a_recipe) && block_fp32(p.b_recipe) && p.m % 4 != 0 && p.space == MemorySpace::kDevice &&
      t.has_gpu())
    return try_pad_m(p, t, plan);
  // tensorwise x rowwise (either way): broadcast the single scale to a vector -> OUTER_VEC_32F pair.
  const bool tw_rw = (p.a_recipe == Recipe::kTensorwise && p.b_recipe == Recipe::kRowwise) ||
                     (p.a_recipe == Recipe::kRowwise && p.b_recipe == Recipe::kTensorwise);
  if (!tw_rw) return {false, "no exact recipe conversion makes " + std::string(to_string(p.a_recipe)) +
                                 "\xC3\x97" + std::string(to_string(p.b_recipe)) + " native"};
  GemmProblem q = p;
  q.a_recipe = q.b_recipe = Recipe::kRowwise;
  const std::string blocker = dispatch::native_blocker(q, t);
  if (!blocker.empty()) return {false, "as rowwise\xC3\x97rowwise: " + blocker};
  const bool a_is_tw = p.a_recipe == Recipe::kTensorwise;
  const int64_t len = a_is_tw ? p.m : p.n;
  plan.conversions.push_back({std::string(a_is_tw ? "scale_a" : "scale_b") +
                                  ": tensorwise -> rowwise (broadcast to " + std::to_string(len) + " rows)",
                              len * 4});
  plan.workspace_bytes = align256(static_cast<size_t>(len) * 4);
  plan.cublas_scale_mode_a = plan.cublas_scale_mode_b = dispatch::kOuterVec32F;
  return {true, "convert-then-native: tensorwise broadcast to rowwise (exact), cuBLASLt OUTER_VEC_32F"};
}

Candidate try_emulated(const GemmProblem& p, const DeviceTarget& t, Plan& plan) {
  if (p.space == MemorySpace::kHost) return {false, "host pointers"};
  if (!t.has_gpu()) return {false, "no CUDA device"};
  std::string why;
  if (!dispatch::exact_in_bf16(p, &why)) return {false, why};
  if (p.d_dtype != DType::kBF16 && p.d_dtype != DType::kF16 && p.d_dtype != DType::kF32)
    return {false, "output " + std::string(to_string(p.d_dtype)) + " is not bf16/f16/f32"};  // FP8: staged
  if (p.k % 8 != 0)
    return {false, "the exact BF16 dequantization writes 16-byte rows: K must be a multiple of 8, got K=" +
                       std::to_string(p.k)};
  const size_t a_bytes = static_cast<size_t>(p.m * p.k) * 2, b_bytes = static_cast<size_t>(p.n * p.k) * 2;
  plan.conversions.push_back({"a: " + std::string(to_string(p.a_recipe)) + " -> bf16 (exact)", int64_t(a_bytes)});
  plan.conversions.push_back({"b: " + std::string(to_string(p.b_recipe)) + " -> bf16 (exact)", int64_t(b_bytes)});
  plan.workspace_bytes = align256(a_bytes) + align256(b_bytes) + 256;  // + device alpha
  return {true, "emulated: exact dequantization to BF16 + cuBLASLt BF16 GEMM with fp32 accumulation"};
}

Candidate try_reference(const GemmProblem& p, const DeviceTarget& t, Plan& plan) {
  if (p.space == MemorySpace::kDevice && !t.has_gpu())
    return {false, "device pointers but no CUDA device to run on"};
  if (p.space == MemorySpace::kDevice) {
    const size_t bytes = static_cast<size_t>(p.m * p.k + p.n * p.k) * 4;
    plan.conversions.push_back({"a, b: dequantize to f32", int64_t(bytes)});
    plan.workspace_bytes = align256(static_cast<size_t>(p.m * p.k) * 4) + align256(static_cast<size_t>(p.n * p.k) * 4);
    return {true, "reference: GPU dequantization to f32 + tiled f32 GEMM (the verification oracle)"};
  }
  return {true, "reference: host emulator (fp32 accumulation)"};
}

using TryFn = Candidate (*)(const GemmProblem&, const DeviceTarget&, Plan&);
struct BackendEntry {
  Backend backend;
  TryFn try_fn;
};
// The backend table, tried in order.
constexpr BackendEntry kBackends[] = {
    {Backend::kNative, try_native},
    {Backend::kConvertNative, try_convert_native},
    {Backend::kEmulated, try_emulated},
    {Backend::kReference, try_reference},
};

}  // namespace

std::string_view to_string(Backend b) {
  switch (b) {
    case Backend::kNative: return "native";
    case Backend::kConvertNative: return "convert-native";
    case Backend::kEmulated: return "emulated";
    case Backend::kReference: return "reference";
  }
  return "unknown";
}

std::optional<Backend> parse_backend(std::string_view s) {
  for (Backend b : {Backend::kNative, Backend::kConvertNative, Backend::kEmulated, Backend::kReference})
    if (to_string(b) == s) return b;
  return std::nullopt;
}

std::string Plan::explain() const {
  std::ostringstream os;
  for (size_t i = 0; i < reasons.size(); ++i) os << (i ? kArrow : "") << reasons[i];
  for (const auto& c : conversions) os << "\n  convert " << c.what << " (" << c.output_bytes << " B)";
  if (workspace_bytes) os << "\n  workspace " << workspace_bytes << " B";
  return os.str();
}

Plan plan(const GemmProblem& p, const DeviceTarget& t, const PlanOptions& options) {
  Plan result;
  std::vector<std::string> passed;
  const bool fp8_out = is_fp8_output(p.d_dtype);
  for (const auto& entry : kBackends) {
    if (options.force && *options.force != entry.backend) continue;
    Plan attempt;
    // FP8 output beyond the native path: the backend writes an fp32 D, one pass quantizes it.
    // The native entry first tries cuBLASLt's own FP8 epilogue (tensorwise pairs only).
    GemmProblem q = p;
    bool staged = fp8_out && entry.backend != Backend::kNative;
    if (staged) q.d_dtype = DType::kF32, q.has_amax = false;
    Candidate c = entry.try_fn(q, t, attempt);
    if (!c.ok && fp8_out && entry.backend == Backend::kNative) {
      q.d_dtype = DType::kF32, q.has_amax = false;
      Plan retry;
      Candidate f32 = entry.try_fn(q, t, retry);
      if (f32.ok) {
        attempt = std::move(retry);
        f32.reason = c.reason + "; " + f32.reason;
        c = std::move(f32);
        staged = true;
      }
    }
    if (c.ok && staged) {
      attempt.staged_output_bytes = static_cast<size_t>(p.m * p.n) * 4;
      attempt.workspace_bytes += align256(attempt.staged_output_bytes);
      attempt.conversions.push_back({"d: f32 -> " + std::string(to_string(p.d_dtype)) + " with d_scale" +
                                         (p.has_amax ? " and amax" : "") + " (one pass)",
                                     p.m * p.n});
      c.reason += "; fp32 D, then " + std::string(to_string(p.d_dtype)) + " with d_scale";
    }
    if (c.ok && options.strict && entry.backend != Backend::kNative) {
      passed.push_back("strict mode refuses " + std::string(to_string(entry.backend)));
      break;
    }
    if (!c.ok) {
      passed.push_back(std::string(to_string(entry.backend)) + ": " + c.reason);
      continue;
    }
    result = std::move(attempt);
    result.backend = entry.backend;
    result.reasons = {p.to_string()};
    for (auto& r : passed) result.reasons.push_back(std::move(r));
    result.reasons.push_back(c.reason);
    return result;
  }
  std::ostringstream os;
  os << "no backend can run " << p.to_string() << " on " << t.to_string();
  if (options.strict) os << " in strict mode";
  if (options.force) os << " with backend forced to " << to_string(*options.force);
  for (const auto& r : passed) os << kArrow << r;
  throw Error(StatusCode::kUnsupported, os.str());
}

}  // namespace scalemm
