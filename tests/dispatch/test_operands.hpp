// Test operands: random or exact-by-construction quantized matrices in host memory, and their upload.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "scalemm/emulation/emulation.hpp"
#include "scalemm/formats.hpp"
#include "scalemm/gemm.hpp"
#include "scalemm/layouts/scale_layout.hpp"

namespace scalemm::testing {

struct HostOperand {
  Recipe recipe = Recipe::kTensorwise;
  DType dtype = DType::kE4M3;
  ScaleFormat format = ScaleFormat::kCompact;
  int64_t rows = 0, k = 0;
  std::vector<uint8_t> data;
  std::vector<uint8_t> scales;
  float global_scale = 1.0f;

  layouts::ScaleLayout layout() const { return layouts::ScaleLayout(recipe, rows, k, format); }
  GemmOperand view() const {
    GemmOperand op;
    op.data = data.data();
    op.dtype = dtype;
    op.recipe = recipe;
    op.scale = scales.data();
    op.scale_format = format;
    op.global_scale = global_scale;
    return op;
  }
  emulation::QuantizedTensor quantized() const {
    emulation::QuantizedTensor t;
    t.data = data.data();
    t.dtype = dtype;
    t.scales = scales.data();
    t.layout = layout();
    return t;
  }
};

inline DType default_dtype(Recipe r) { return r == Recipe::kNvfp4 ? DType::kE2M1 : DType::kE4M3; }

/// Quantizes seeded random normal data with the recipe's default scale mode.
inline HostOperand random_operand(Recipe r, int64_t rows, int64_t k, ScaleFormat f, std::mt19937_64& rng,
                                  DType dtype = DType::kU8) {
  if (dtype == DType::kU8) dtype = default_dtype(r);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> src(static_cast<size_t>(rows * k));
  for (auto& v : src) v = nd(rng);
  emulation::SourceMatrix s{src.data(), DType::kF32, rows, k};
  emulation::QuantizeConfig cfg;
  cfg.recipe = r;
  cfg.data_dtype = dtype;
  cfg.format = f;
  HostOperand op;
  op.recipe = r;
  op.dtype = dtype;
  op.format = f;
  op.rows = rows;
  op.k = k;
  op.data.assign(static_cast<size_t>(emulation::data_bytes(cfg, rows, k)), 0);
  const auto l = emulation::rowwise_layout(cfg, rows, k);
  op.scales.assign(static_cast<size_t>(l.bytes()), 0);
  emulation::QuantizeOutputs out;
  out.data = op.data.data();
  out.scales = op.scales.data();
  out.global_scale = &op.global_scale;
  emulation::quantize_host(s, cfg, out);
  return op;
}

/// Exact by construction: data in {-2,-1,0,1,2} (exact in E4M3/E5M2/E2M1), scales powers of two in
/// [2^-3, 2^3] (E8M0/UE4M3/fp32 all exact), so every product and every partial sum of a small-K GEMM
/// is exactly representable in fp32, whatever the accumulation order.
inline HostOperand exact_operand(Recipe r, int64_t rows, int64_t k, ScaleFormat f, std::mt19937_64& rng) {
  HostOperand op;
  op.recipe = r;
  op.dtype = default_dtype(r);
  op.format = f;
  op.rows = rows;
  op.k = k;
  const int64_t n = rows * k;
  const bool fp4 = op.dtype == DType::kE2M1;
  op.data.assign(static_cast<size_t>(fp4 ? (n + 1) / 2 : n), 0);
  std::uniform_int_distribution<int> val(-2, 2), ex(-3, 3);
  for (int64_t i = 0; i < n; ++i) {
    const float v = float(val(rng));
    if (fp4) formats::set_e2m1(op.data.data(), i, formats::encode_e2m1(v));
    else op.data[size_t(i)] = op.dtype == DType::kE5M2 ? formats::encode_e5m2(v) : formats::encode_e4m3(v);
  }
  const auto l = op.layout();
  op.scales.assign(static_cast<size_t>(l.bytes()), 0);
  // Fill each logical scale once, at every position offset() gives for it (replicas included).
  std::vector<float> grid(static_cast<size_t>(l.grid_rows() * l.kblocks()));
  for (auto& g : grid) g = std::ldexp(1.0f, ex(rng));
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t kb = 0; kb < l.kblocks(); ++kb) {
      const float s = grid[size_t((row / l.block_rows()) * l.kblocks() + kb)];
      const int64_t o = l.offset(row, kb);
      switch (l.scale_dtype()) {
        case DType::kE8M0: op.scales[size_t(o)] = formats::encode_e8m0(s); break;
        case DType::kUE4M3: op.scales[size_t(o)] = formats::encode_ue4m3(s); break;
        default: std::memcpy(op.scales.data() + o * 4, &s, 4); break;
      }
    }
  return op;
}

/// The exact value of element (r, kk) of an operand: decoded data times its scale and global scale.
inline double dequant(const HostOperand& op, int64_t r, int64_t kk) {
  double v;
  const int64_t i = r * op.k + kk;
  switch (op.dtype) {
    case DType::kE4M3: v = formats::decode_e4m3(op.data[size_t(i)]); break;
    case DType::kE5M2: v = formats::decode_e5m2(op.data[size_t(i)]); break;
    default: v = formats::decode_e2m1(formats::get_e2m1(op.data.data(), i)); break;
  }
  const auto l = op.layout();
  const int64_t o = l.offset_of_element(r, kk);
  double s;
  switch (l.scale_dtype()) {
    case DType::kE8M0: s = formats::decode_e8m0(op.scales[size_t(o)]); break;
    case DType::kUE4M3: s = formats::decode_ue4m3(op.scales[size_t(o)]); break;
    default: {
      float f;
      std::memcpy(&f, op.scales.data() + o * 4, 4);
      s = f;
    }
  }
  return v * s * op.global_scale;
}

/// Every element's dequant() value, row-major (rows, k): decoded once, so that an fp64 oracle over
/// large operands is one dot product per output instead of two decodes per product.
inline std::vector<double> dequant_rows(const HostOperand& op) {
  std::vector<double> out(static_cast<size_t>(op.rows * op.k));
  for (int64_t r = 0; r < op.rows; ++r)
    for (int64_t kk = 0; kk < op.k; ++kk) out[static_cast<size_t>(r * op.k + kk)] = dequant(op, r, kk);
  return out;
}

/// The sum over kk in [k0, k1) of a(i, kk) * b(j, kk) in kk order, for dequant_rows() values of two
/// operands of k columns: the same products in the same order as summing dequant() directly.
inline double exact_dot(const std::vector<double>& a, const std::vector<double>& b, int64_t k, int64_t i, int64_t j,
                        int64_t k0, int64_t k1) {
  const double* x = a.data() + i * k;
  const double* y = b.data() + j * k;
  double acc = 0.0;
  for (int64_t kk = k0; kk < k1; ++kk) acc += x[kk] * y[kk];
  return acc;
}

}  // namespace scalemm::testing
