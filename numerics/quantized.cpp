// The quantization contract (scalemm/numerics/quantized.hpp): scale-mode names, output layouts,
// validation of a request, operand views.
#include <cstring>
#include <string>

#include "scalemm/numerics/quantized.hpp"
#include "scalemm/status.hpp"

namespace scalemm::numerics {

namespace {

bool is_mx(Recipe r) { return r == Recipe::kMxfp8 || r == Recipe::kMxfp8_32x32; }

[[noreturn]] void invalid(const std::string& what) {
  throw Error(StatusCode::kInvalidArgument, "emulation: " + what);
}

}  // namespace

ScaleMode resolve_scale_mode(Recipe recipe, ScaleMode mode) {
  if (mode != ScaleMode::kDefault) return mode;
  if (recipe == Recipe::kNvfp4) return ScaleMode::kNvfp4TwoLevel;
  if (is_mx(recipe)) return ScaleMode::kE8M0Rceil;
  return ScaleMode::kAmax;
}

const char* to_string(ScaleMode mode) {
  switch (mode) {
    case ScaleMode::kDefault: return "default";
    case ScaleMode::kAmax: return "amax";
    case ScaleMode::kAmaxPow2: return "amax-pow2";
    case ScaleMode::kE8M0Floor: return "e8m0-floor";
    case ScaleMode::kE8M0Rceil: return "e8m0-rceil";
    case ScaleMode::kNvfp4TwoLevel: return "nvfp4";
  }
  return "unknown";
}

bool parse_scale_mode(const char* name, ScaleMode* out) {
  static const ScaleMode all[] = {ScaleMode::kDefault, ScaleMode::kAmax, ScaleMode::kAmaxPow2,
                                  ScaleMode::kE8M0Floor, ScaleMode::kE8M0Rceil, ScaleMode::kNvfp4TwoLevel};
  if (!name) return false;
  for (ScaleMode m : all)
    if (std::strcmp(name, to_string(m)) == 0) {
      if (out) *out = m;
      return true;
    }
  if (std::strcmp(name, "floor") == 0 || std::strcmp(name, "rceil") == 0) {
    if (out) *out = name[0] == 'f' ? ScaleMode::kE8M0Floor : ScaleMode::kE8M0Rceil;
    return true;
  }
  return false;
}

layouts::ScaleLayout rowwise_layout(const QuantizeConfig& cfg, int64_t rows, int64_t cols) {
  return layouts::ScaleLayout(cfg.recipe, rows, cols, cfg.format);
}
layouts::ScaleLayout columnwise_layout(const QuantizeConfig& cfg, int64_t rows, int64_t cols) {
  return layouts::ScaleLayout(cfg.recipe, cols, rows, cfg.format);
}

int64_t data_bytes(const QuantizeConfig& cfg, int64_t rows, int64_t cols) {
  return dtype_storage_bytes(element_dtype(cfg), rows * cols);
}

void validate(const SourceMatrix& src, const QuantizeConfig& cfg, const QuantizeOutputs& out) {
  if (src.rows < 0 || src.cols < 0)
    invalid("source shape must be non-negative, got " + std::to_string(src.rows) + "x" + std::to_string(src.cols));
  if (src.dtype != DType::kF32 && src.dtype != DType::kBF16 && src.dtype != DType::kF16)
    invalid("source dtype must be f32, bf16 or f16, got " + std::string(to_string(src.dtype)));
  if (src.rows * src.cols > 0 && !src.data) invalid("source data is null");
  if (!cfg.rowwise && !cfg.columnwise) invalid("neither rowwise nor columnwise output requested");
  const ScaleMode mode = resolve_scale_mode(cfg.recipe, cfg.mode);
  if (cfg.recipe == Recipe::kNvfp4) {
    if (cfg.data_dtype != DType::kE2M1)
      invalid("nvfp4 data dtype must be e2m1, got " + std::string(to_string(cfg.data_dtype)));
    if (mode != ScaleMode::kNvfp4TwoLevel) invalid("nvfp4 takes scale mode nvfp4");
    if (cfg.rowwise && src.cols % 2)
      invalid("nvfp4 rowwise output needs an even column count (packed pairs), got " + std::to_string(src.cols));
    if (cfg.columnwise && src.rows % 2)
      invalid("nvfp4 columnwise output needs an even row count (packed pairs), got " + std::to_string(src.rows));
    if (!out.global_scale) invalid("nvfp4 needs outputs.global_scale for the global decode scale");
  } else {
    if (cfg.data_dtype != DType::kE4M3 && cfg.data_dtype != DType::kE5M2)
      invalid(std::string(to_string(cfg.recipe)) + " data dtype must be e4m3 or e5m2, got " +
              std::string(to_string(cfg.data_dtype)));
    if (is_mx(cfg.recipe) && mode != ScaleMode::kE8M0Floor && mode != ScaleMode::kE8M0Rceil)
      invalid("mx recipes take scale mode e8m0-floor or e8m0-rceil, got " + std::string(to_string(mode)));
    if (!is_mx(cfg.recipe) && mode != ScaleMode::kAmax && mode != ScaleMode::kAmaxPow2)
      invalid("fp32-scale recipes take scale mode amax or amax-pow2, got " + std::string(to_string(mode)));
  }
  if (src.amax && cfg.recipe != Recipe::kTensorwise && cfg.recipe != Recipe::kNvfp4)
    invalid("source amax is given, but " + std::string(to_string(cfg.recipe)) +
            " computes an amax per row or block, not per tensor; pass amax only with tensorwise or nvfp4");
  if (!(cfg.eps >= 0.0f)) invalid("eps must be >= 0");
  const bool any = src.rows * src.cols > 0;
  if (cfg.rowwise && any && (!out.data || !out.scales))
    invalid(std::string("rowwise output needs data and scales, got ") + (out.data ? "data" : "data = null") + ", " +
            (out.scales ? "scales" : "scales = null"));
  if (cfg.columnwise && any && (!out.data_t || !out.scales_t))
    invalid(std::string("columnwise output needs data_t and scales_t, got ") + (out.data_t ? "data_t" : "data_t = null") +
            ", " + (out.scales_t ? "scales_t" : "scales_t = null"));
}

namespace {
QuantizedTensor operand_of(const QuantizeConfig& cfg, void* data, void* scales, int64_t ld,
                           const layouts::ScaleLayout& layout, float* global_scale) {
  QuantizedTensor t;
  t.data = data;
  t.dtype = element_dtype(cfg);
  t.ld = ld;
  t.scales = scales;
  t.layout = layout;
  t.global_scale = cfg.recipe == Recipe::kNvfp4 ? global_scale : nullptr;
  return t;
}
}  // namespace

QuantizedTensor rowwise_operand(const SourceMatrix& src, const QuantizeConfig& cfg, const QuantizeOutputs& out) {
  return operand_of(cfg, out.data, out.scales, src.cols, rowwise_layout(cfg, src.rows, src.cols), out.global_scale);
}

QuantizedTensor columnwise_operand(const SourceMatrix& src, const QuantizeConfig& cfg, const QuantizeOutputs& out) {
  return operand_of(cfg, out.data_t, out.scales_t, src.rows, columnwise_layout(cfg, src.rows, src.cols),
                    out.global_scale);
}

void check_operand(const QuantizedTensor& t, const char* name) {
  if (t.rows() < 0 || t.k() < 0) invalid(std::string(name) + ": negative shape");
  if (t.rows() * t.k() == 0) return;
  if (!t.data || !t.scales) invalid(std::string(name) + ": data or scales are null");
  if (t.row_stride() < t.k()) invalid(std::string(name) + ": row stride is smaller than K");
  if (t.dtype == DType::kE2M1 && t.row_stride() % 2) invalid(std::string(name) + ": E2M1 needs an even row stride");
  switch (t.dtype) {
    case DType::kE4M3: case DType::kE5M2: case DType::kE2M1: case DType::kF32: case DType::kBF16: case DType::kF16:
      break;
    default: invalid(std::string(name) + ": unsupported data dtype " + std::string(to_string(t.dtype)));
  }
}

void check_dequantize_args(const QuantizedTensor& t, const void* out, DType out_dtype) {
  check_operand(t, "dequantize");
  if (out_dtype != DType::kF32 && out_dtype != DType::kBF16 && out_dtype != DType::kF16)
    invalid("dequantize output dtype must be f32, bf16 or f16");
  if (t.rows() * t.k() > 0 && !out) invalid("dequantize output is null");
}

}  // namespace scalemm::numerics
