// GemmProblem, DeviceTarget and argument validation.
#include <cuda_runtime_api.h>

#include <sstream>
#include <tuple>

#include "base/capabilities.hpp"
#include "dispatch/devices.hpp"
#include "scalemm/device.hpp"
#include "scalemm/gemm.hpp"
#include "scalemm/layouts/scale_layout.hpp"
#include "scalemm/layouts/validate.hpp"

namespace scalemm {

GemmProblem GemmProblem::from(const GemmArgs& a) {
  GemmProblem p;
  p.m = a.m;
  p.n = a.n;
  p.k = a.k;
  p.a_dtype = a.a.dtype;
  p.b_dtype = a.b.dtype;
  p.a_recipe = a.a.recipe;
  p.b_recipe = a.b.recipe;
  p.a_format = a.a.scale_format;
  p.b_format = a.b.scale_format;
  p.d_dtype = a.d_dtype;
  p.has_bias = a.bias != nullptr;
  p.has_amax = a.d_amax != nullptr;
  p.space = a.space;
  p.fast_accum = a.fast_accum;
  return p;
}

bool GemmProblem::operator==(const GemmProblem& o) const {
  return m == o.m && n == o.n && k == o.k && a_dtype == o.a_dtype && b_dtype == o.b_dtype &&
         a_recipe == o.a_recipe && b_recipe == o.b_recipe && a_format == o.a_format && b_format == o.b_format &&
         d_dtype == o.d_dtype && has_bias == o.has_bias && has_amax == o.has_amax && space == o.space &&
         fast_accum == o.fast_accum;
}

std::string GemmProblem::to_string() const {
  std::ostringstream os;
  os << scalemm::to_string(a_recipe) << '(' << scalemm::to_string(a_dtype) << ")\xC3\x97"
     << scalemm::to_string(b_recipe) << '(' << scalemm::to_string(b_dtype) << ") -> "
     << scalemm::to_string(d_dtype) << (has_amax ? " +amax" : "") << (has_bias ? " +bias" : "") << (fast_accum ? " +fast-accum" : "") << ", M=" << m << " N=" << n << " K=" << k;
  return os.str();
}

std::string DeviceTarget::to_string() const {
  std::ostringstream os;
  if (!has_gpu()) {
    os << "no GPU";
  } else {
    os << "sm_" << sm;
    if (!name.empty() || multiprocessors) os << " (" << (name.empty() ? "simulated" : name) << ", " << multiprocessors << " SMs)";
  }
  os << ", cuBLASLt " << base::cublaslt_version_string(cublaslt_version);
  return os.str();
}

std::string DeviceTarget::describe() const {
  return ordinal >= 0 ? "device " + std::to_string(ordinal) + ": " + to_string() : to_string();
}

const std::vector<DeviceTarget>& DeviceTarget::all() {
  static const std::vector<DeviceTarget> table = [] {
    std::vector<DeviceTarget> out;
    const DeviceQuery q = query_devices();
    for (const DeviceInfo& info : q.devices) {
      DeviceTarget d;
      d.sm = info.sm;
      d.multiprocessors = info.multiprocessors;
      d.name = info.name;
      d.ordinal = info.ordinal;
      d.cublaslt_version = q.cublaslt_version;
      out.push_back(std::move(d));
    }
    return out;
  }();
  return table;
}

namespace {

// The target of a machine without a usable device: only the cuBLASLt version is known.
const DeviceTarget& no_gpu_target() {
  static const DeviceTarget t = [] {
    DeviceTarget d;
    d.cublaslt_version = query_devices().cublaslt_version;
    return d;
  }();
  return t;
}

}  // namespace

namespace dispatch {

const DeviceTarget& target_in(const std::vector<DeviceTarget>& table, int ordinal) {
  for (const DeviceTarget& t : table)
    if (t.ordinal == ordinal) return t;
  if (table.empty()) return no_gpu_target();
  throw Error(StatusCode::kInvalidArgument,
              "device " + std::to_string(ordinal) + ": no such CUDA device in this process (" +
                  std::to_string(table.size()) + " device(s))");
}

}  // namespace dispatch

DeviceTarget DeviceTarget::current() {
  const std::vector<DeviceTarget>& table = all();
  if (table.empty()) return no_gpu_target();
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    device = table.front().ordinal;
  }
  return dispatch::target_in(table, device);
}

DeviceTarget DeviceTarget::of_device(int ordinal) {
  if (all().empty())
    throw Error(StatusCode::kInvalidArgument, "device " + std::to_string(ordinal) + ": this process has no CUDA device");
  return dispatch::target_in(all(), ordinal);
}

DeviceTarget DeviceTarget::simulated(int sm, size_t cublaslt_version, int ordinal) {
  DeviceTarget d;
  d.sm = sm;
  d.cublaslt_version = cublaslt_version;
  d.name = sm ? "simulated" : "";
  d.ordinal = sm ? ordinal : -1;
  return d;
}

namespace {

void add(Diagnostics& out, std::string arg, std::string rule, std::string msg, std::string expected,
         std::string actual, std::string fix) {
  out.push_back({std::move(arg), std::move(rule), std::move(msg), std::move(expected), std::move(actual), std::move(fix)});
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

void check_operand(Diagnostics& out, const char* name, const char* scale_name, const GemmOperand& op, int64_t rows,
                   int64_t k, MemorySpace space) {
  const bool fp4_recipe = op.recipe == Recipe::kNvfp4;
  const bool fp4_data = op.dtype == DType::kE2M1;
  if (fp4_recipe != fp4_data)
    add(out, name, "recipe-dtype", "nvfp4 goes with e2m1 data and every other recipe with e4m3/e5m2",
        fp4_recipe ? "e2m1" : "e4m3 or e5m2", std::string(to_string(op.dtype)),
        "Quantize with the recipe that matches the data type.");
  else if (!fp4_data && op.dtype != DType::kE4M3 && op.dtype != DType::kE5M2)
    add(out, name, "data-dtype", "data must be FP8 (e4m3/e5m2) or packed FP4 (e2m1)", "e4m3, e5m2 or e2m1",
        std::string(to_string(op.dtype)), "");
  if (fp4_data && k % 2 != 0)
    add(out, "k", "fp4-k-even", "packed FP4 rows hold two elements per byte, so K must be even", "even K",
        std::to_string(k), "Pad K to a multiple of 32.");
  if (!op.data) add(out, name, "null-pointer", "data pointer is null", "a valid pointer", "nullptr", "");
  if (op.data && space == MemorySpace::kDevice && !aligned16(op.data))
    add(out, name, "data-alignment", "device data must start 16-byte aligned (tensor-core loads are 16 bytes wide)",
        "address % 16 == 0", std::to_string(reinterpret_cast<uintptr_t>(op.data) % 16) + " bytes past 16",
        "Pass a tensor whose storage offset is a multiple of 16 bytes, or copy it.");
  // The scale buffer goes through the layout contract (null, alignment of cuBLASLt-format buffers).
  // It is given as a pointer, so it is viewed as the flat buffer of layout.size() elements the
  // contract describes; content checks stay opt-in (layouts::check_content / gpu::check_content_async).
  const layouts::ScaleLayout layout(op.recipe, rows, k, op.scale_format);
  TensorRef view;
  view.data = const_cast<void*>(op.scale);
  view.dtype = layout.scale_dtype();
  view.rank = 1;
  view.shape[0] = layout.size();
  view.strides[0] = 1;
  view.space = space;
  layouts::ValidateOptions options;
  options.check_content = false;
  const Diagnostics d = layouts::validate_scale(view, layout, scale_name, options);
  out.insert(out.end(), d.begin(), d.end());
  if (!(op.global_scale > 0.0f) || op.global_scale == __builtin_huge_valf())
    add(out, name, "global-scale", "global scale must be a positive finite number", "> 0 and finite",
        std::to_string(op.global_scale), "");
}

}  // namespace

Diagnostics validate(const GemmArgs& a) {
  Diagnostics out;
  if (a.m < 1) add(out, "m", "positive-extent", "M must be at least 1", ">= 1", std::to_string(a.m), "");
  if (a.n < 1) add(out, "n", "positive-extent", "N must be at least 1", ">= 1", std::to_string(a.n), "");
  if (a.k < 1) add(out, "k", "positive-extent", "K must be at least 1", ">= 1", std::to_string(a.k), "");
  if (!out.empty()) return out;
  // Element counts must fit the 64-bit offsets every layout computes (a larger M, N or K is a
  // corrupted size, and its offsets would wrap around).
  constexpr int64_t kMaxElements = int64_t(1) << 50;
  for (auto [name, rows, cols] : {std::tuple<const char*, int64_t, int64_t>{"m", a.m, a.k}, {"n", a.n, a.k}, {"m", a.m, a.n}})
    if (rows > kMaxElements / cols) {
      add(out, name, "extent-overflow", "the operand or output has too many elements",
          "M*K, N*K and M*N at most 2^50", std::to_string(rows) + " x " + std::to_string(cols), "Check the sizes passed.");
      return out;
    }
  // Enum values outside their range (a C++ caller casting an integer) would index layout tables.
  for (auto [name, op] : {std::pair<const char*, const GemmOperand*>{"a", &a.a}, {"b", &a.b}}) {
    if (uint8_t(op->recipe) < uint8_t(Recipe::kTensorwise) || uint8_t(op->recipe) > uint8_t(Recipe::kNvfp4))
      add(out, name, "recipe-enum", "recipe is not a scalemm::Recipe value", "1..7",
          std::to_string(int(op->recipe)), "");
    if (uint8_t(op->scale_format) > uint8_t(ScaleFormat::kCublasLt))
      add(out, name, "scale-format-enum", "scale format is not a scalemm::ScaleFormat value", "0 (compact) or 1 (cublaslt)",
          std::to_string(int(op->scale_format)), "");
  }
  if (uint8_t(a.space) > uint8_t(MemorySpace::kDevice))
    add(out, "space", "memory-space-enum", "memory space is not a scalemm::MemorySpace value", "0 (host) or 1 (device)",
        std::to_string(int(a.space)), "");
  if (!out.empty()) return out;
  check_operand(out, "a", "scale_a", a.a, a.m, a.k, a.space);
  check_operand(out, "b", "scale_b", a.b, a.n, a.k, a.space);
  const bool fp8_out = is_fp8_output(a.d_dtype);
  if (a.d_dtype != DType::kBF16 && a.d_dtype != DType::kF16 && a.d_dtype != DType::kF32 && !fp8_out)
    add(out, "d_dtype", "out-dtype", "output must be bf16, f16, f32, or e4m3/e5m2 with a D scale",
        "bf16, f16, f32, e4m3 or e5m2", std::string(to_string(a.d_dtype)), "");
  if (fp8_out && !a.d_scale)
    add(out, "d_scale", "fp8-out-d-scale", "FP8 output needs a D scale (D = fp8(d_scale * result))",
        "a pointer to one fp32 scale", "nullptr",
        "Pass d_scale (e.g. 448 / amax of the previous step's output), or ask for bf16 output.");
  if (!fp8_out && (a.d_scale || a.d_amax))
    add(out, a.d_scale ? "d_scale" : "d_amax", "d-scale-without-fp8-out",
        "a D scale and a D amax only apply to FP8 output", "e4m3 or e5m2 output with d_scale",
        std::string(to_string(a.d_dtype)) + " output with " + (a.d_scale ? "d_scale" : "d_amax") + " set",
        "Set d_dtype to e4m3/e5m2, or leave d_scale and d_amax null.");
  for (auto [name, ptr] : {std::pair<const char*, const void*>{"d_scale", a.d_scale}, {"d_amax", a.d_amax}})
    if (ptr && (reinterpret_cast<uintptr_t>(ptr) & 3u) != 0)
      add(out, name, "scalar-alignment", std::string(name) + " must be 4-byte aligned (one fp32)", "address % 4 == 0",
          std::to_string(reinterpret_cast<uintptr_t>(ptr) % 4) + " bytes past 4", "Point it at a float.");
  // A host D scale is read here; a device one is read by the kernel (reading it would cost a sync).
  // D = fp8(d_scale * result): 0 writes all zeros, a negative value flips every sign, NaN or inf
  // writes NaN or saturates everything, so none of them can be what the caller meant.
  if (fp8_out && a.d_scale && a.space == MemorySpace::kHost && (reinterpret_cast<uintptr_t>(a.d_scale) & 3u) == 0 &&
      !(*a.d_scale > 0.0f && *a.d_scale < __builtin_huge_valf()))
    add(out, "d_scale", "d-scale-value", "the D scale must be a positive finite number (D = fp8(d_scale * result))",
        "> 0 and finite", std::to_string(*a.d_scale),
        "Pass d_scale = 448 / amax (e4m3) or 57344 / amax (e5m2) of the expected output, or ask for bf16 output.");
  if (auto d = base::fast_accum_refusal(a.fast_accum, a.a.recipe, a.b.recipe)) out.push_back(std::move(*d));
  if (!a.d) add(out, "d", "null-pointer", "output pointer is null", "a valid pointer", "nullptr", "");
  if (!(a.alpha == a.alpha) || a.alpha == __builtin_huge_valf() || a.alpha == -__builtin_huge_valf())
    add(out, "alpha", "finite-alpha", "alpha must be finite", "a finite float", std::to_string(a.alpha), "");
  return out;
}

}  // namespace scalemm
