// Helpers shared by the emulation tests (host .cpp files and the [gpu] .cu file).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "scalemm/emulation/compare.hpp"
#include "scalemm/emulation/emulation.hpp"
#include "scalemm/formats.hpp"
#include "scalemm/layouts/scale_layout.hpp"
#include "support/test_support.hpp"

namespace emu_test {

using namespace scalemm;
using namespace scalemm::emulation;
using layouts::ScaleLayout;
namespace fmt = scalemm::formats;

inline const char* recipe_name(Recipe r) { return to_string(r).data(); }
inline const char* format_name(ScaleFormat f) { return f == ScaleFormat::kCompact ? "compact" : "cublaslt"; }

inline DType elem_of(Recipe r, DType fp8 = DType::kE4M3) { return r == Recipe::kNvfp4 ? DType::kE2M1 : fp8; }

inline QuantizeConfig make_cfg(Recipe r, ScaleFormat f = ScaleFormat::kCompact, bool rowwise = true,
                               bool columnwise = false, ScaleMode mode = ScaleMode::kDefault,
                               DType fp8 = DType::kE4M3) {
  QuantizeConfig c;
  c.recipe = r;
  c.format = f;
  c.rowwise = rowwise;
  c.columnwise = columnwise;
  c.mode = mode;
  c.data_dtype = elem_of(r, fp8);
  return c;
}

/// Whether NVFP4 can quantize an (R, C) source in directions `dirs` (1 rowwise, 2 columnwise): its
/// elements pack in pairs along the quantized direction, so C (rowwise) and R (columnwise) must be even.
inline bool shape_fits(Recipe r, int dirs, int64_t R, int64_t C) {
  return r != Recipe::kNvfp4 || !(((dirs & 1) && C % 2) || ((dirs & 2) && R % 2));
}

/// The scale mode of the byte-identity sweeps: the recipe's default (alt == 0), or its other mode
/// (NVFP4 two-level, MX E8M0 floor, the fp32 recipes' power-of-two amax scales).
inline ScaleMode sweep_mode(Recipe r, int alt) {
  if (alt != 1) return ScaleMode::kDefault;
  return r == Recipe::kNvfp4                                  ? ScaleMode::kNvfp4TwoLevel
         : (r == Recipe::kMxfp8 || r == Recipe::kMxfp8_32x32) ? ScaleMode::kE8M0Floor
                                                              : ScaleMode::kAmaxPow2;
}

/// Host buffers of one quantize call.
struct HostQuant {
  SourceMatrix src;
  QuantizeConfig cfg;
  std::vector<uint8_t> data, scales, data_t, scales_t;
  float global = -1.0f;

  QuantizeOutputs outputs() {
    QuantizeOutputs o;
    if (cfg.rowwise) {
      o.data = data.data();
      o.scales = scales.data();
    }
    if (cfg.columnwise) {
      o.data_t = data_t.data();
      o.scales_t = scales_t.data();
    }
    o.global_scale = &global;
    return o;
  }
  QuantizedTensor rowwise() { return rowwise_operand(src, cfg, outputs()); }
  QuantizedTensor columnwise() { return columnwise_operand(src, cfg, outputs()); }
};

/// Allocates the outputs (scale buffers pre-filled with `poison` to catch unwritten padding) and runs
/// quantize_host.
inline HostQuant quantize_h(const float* x, int64_t rows, int64_t cols, const QuantizeConfig& cfg,
                            uint8_t poison = 0xA5, DType src_dtype = DType::kF32, const float* amax = nullptr) {
  HostQuant q;
  q.src = SourceMatrix{x, src_dtype, rows, cols, amax};
  q.cfg = cfg;
  const int64_t db = data_bytes(cfg, rows, cols);
  if (cfg.rowwise) {
    q.data.assign(size_t(db), 0xEE);
    q.scales.assign(size_t(rowwise_layout(cfg, rows, cols).bytes()), poison);
  }
  if (cfg.columnwise) {
    q.data_t.assign(size_t(db), 0xEE);
    q.scales_t.assign(size_t(columnwise_layout(cfg, rows, cols).bytes()), poison);
  }
  quantize_host(q.src, cfg, q.outputs());
  return q;
}

inline std::vector<float> random_normal(std::mt19937_64& g, int64_t n, float sigma = 1.0f) {
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}

inline std::vector<float> transpose(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<float> t(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = x[size_t(r * cols + c)];
  return t;
}

/// fp64 product D = A * B^T of unquantized inputs.
inline std::vector<double> ref_product(const std::vector<float>& a, const std::vector<float>& b, int64_t m, int64_t n,
                                       int64_t k) {
  std::vector<double> d(size_t(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t kk = 0; kk < k; ++kk) s += double(a[size_t(i * k + kk)]) * double(b[size_t(j * k + kk)]);
      d[size_t(i * n + j)] = s;
    }
  return d;
}

// ---- exact-by-construction operands ------------------------------------------------------------

enum class Pattern { kSmallInts, kIdentity, kOnes, kOnesOneBlockX2 };

/// A quantized operand built byte by byte: data drawn from values exactly representable in the
/// element type, scales powers of two (negative fp32 scales too, where `negative_scales`), every scale
/// written through ScaleLayout::offset. `values` receives the exact dequantized matrix (rows x k).
struct ExactOperand {
  ScaleLayout layout;
  DType dtype;
  std::vector<uint8_t> data, scales;
  float global = 1.0f;
  std::vector<double> values;

  QuantizedTensor tensor() const {
    QuantizedTensor t;
    t.data = data.data();
    t.dtype = dtype;
    t.ld = layout.k;
    t.scales = scales.data();
    t.layout = layout;
    t.global_scale = layout.recipe == Recipe::kNvfp4 ? &global : nullptr;
    return t;
  }
};

inline ExactOperand make_exact(Recipe recipe, int64_t rows, int64_t k, ScaleFormat f, Pattern p, std::mt19937_64& g,
                               bool negative_scales = true) {
  ExactOperand o;
  o.layout = ScaleLayout(recipe, rows, k, f);
  o.dtype = elem_of(recipe);
  const bool fp4 = o.dtype == DType::kE2M1;
  o.data.assign(size_t(dtype_storage_bytes(o.dtype, rows * k)), 0);
  o.scales.assign(size_t(o.layout.bytes()), 0);
  if (recipe == Recipe::kNvfp4) o.global = 0.5f;
  // Scales per logical block (grid row, kb), written to every data row of the block.
  std::uniform_int_distribution<int> pe(-2, 2), coin(0, 1);
  std::vector<double> block_scale(size_t(o.layout.logical_size()));
  for (int64_t gr = 0; gr < o.layout.grid_rows(); ++gr)
    for (int64_t kb = 0; kb < o.layout.kblocks(); ++kb) {
      int e = (p == Pattern::kSmallInts) ? pe(g) : 0;
      double s = std::ldexp(1.0, e);
      if (p == Pattern::kOnesOneBlockX2 && gr == 0 && kb == o.layout.kblocks() - 1) s = 2.0;
      const bool neg = p == Pattern::kSmallInts && negative_scales && o.layout.scale_dtype() == DType::kF32 && coin(g);
      if (neg) s = -s;
      block_scale[size_t(gr * o.layout.kblocks() + kb)] = s;
      const int64_t r0 = gr * o.layout.block_rows();
      const int64_t r1 = std::min(rows, r0 + o.layout.block_rows());
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t off = o.layout.offset(r, kb);
        switch (o.layout.scale_dtype()) {
          case DType::kF32: {
            const float sf = float(s);
            std::memcpy(&o.scales[size_t(off * 4)], &sf, 4);
            break;
          }
          case DType::kE8M0: o.scales[size_t(off)] = uint8_t(127 + e + (s == 2.0 && e == 0 ? 1 : 0)); break;
          default: o.scales[size_t(off)] = fmt::encode_ue4m3(float(s)); break;
        }
      }
    }
  static const float grid8[] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f};
  std::uniform_int_distribution<int> pick(0, 12);
  o.values.assign(size_t(rows * k), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t kk = 0; kk < k; ++kk) {
      float v = 0.0f;
      switch (p) {
        case Pattern::kSmallInts: v = grid8[pick(g)]; break;
        case Pattern::kIdentity: v = r == kk ? 1.0f : 0.0f; break;
        default: v = 1.0f; break;
      }
      const int64_t i = r * k + kk;
      if (fp4)
        fmt::set_e2m1(o.data.data(), i, fmt::encode_e2m1(v));
      else
        o.data[size_t(i)] = fmt::encode_e4m3(v);
      const double s = block_scale[size_t((r / o.layout.block_rows()) * o.layout.kblocks() + kk / o.layout.block_k())];
      o.values[size_t(i)] = double(v) * s * (recipe == Recipe::kNvfp4 ? double(o.global) : 1.0);
    }
  return o;
}

/// Exact D = alpha * A * B^T (+ bias) in double (all test values keep this exact).
inline std::vector<double> exact_product(const ExactOperand& a, const ExactOperand& b, double alpha,
                                         const float* bias) {
  const int64_t m = a.layout.rows, n = b.layout.rows, k = a.layout.k;
  std::vector<double> d(size_t(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t kk = 0; kk < k; ++kk) s += a.values[size_t(i * k + kk)] * b.values[size_t(j * k + kk)];
      s *= alpha;
      if (bias) s += bias[j];
      d[size_t(i * n + j)] = s;
    }
  return d;
}

/// Expected output bytes of an exact result in out_dtype.
inline std::vector<uint8_t> encode_out(const std::vector<double>& d, DType out) {
  const int bytes = dtype_bits(out) / 8;
  std::vector<uint8_t> v(d.size() * size_t(bytes));
  for (size_t i = 0; i < d.size(); ++i) {
    const float f = float(d[i]);
    if (out == DType::kF32) std::memcpy(&v[i * 4], &f, 4);
    else {
      const uint16_t h = out == DType::kBF16 ? fmt::encode_bf16(f) : fmt::encode_f16(f);
      std::memcpy(&v[i * 2], &h, 2);
    }
  }
  return v;
}

}  // namespace emu_test
