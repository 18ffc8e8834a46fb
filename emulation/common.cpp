// Plain host code of the emulator: operand slices and the GEMM argument checks.
#include <cstring>
#include <string>

#include "checks.hpp"
#include "scalemm/emulation/emulation.hpp"
#include "scalemm/status.hpp"

namespace scalemm::emulation {

namespace {

[[noreturn]] void invalid(const std::string& what) {
  throw Error(StatusCode::kInvalidArgument, "emulation: " + what);
}

}  // namespace

namespace {
const void* advance(const void* p, DType t, int64_t elements) {
  if (t == DType::kE2M1) {
    if (elements % 2) invalid("an E2M1 view must start at an even element");
    return static_cast<const uint8_t*>(p) + elements / 2;
  }
  return static_cast<const uint8_t*>(p) + elements * (dtype_bits(t) / 8);
}
}  // namespace

QuantizedTensor row_slice(const QuantizedTensor& t, int64_t r0, int64_t r1, const void* scales) {
  if (r0 < 0 || r1 < r0 || r1 > t.rows()) invalid("row_slice range out of bounds");
  QuantizedTensor s = t;
  s.data = advance(t.data, t.dtype, r0 * t.row_stride());
  s.ld = t.row_stride();
  s.scales = scales;
  s.layout = layouts::ScaleLayout(t.layout.recipe, r1 - r0, t.k(), t.layout.format);
  return s;
}

QuantizedTensor k_slice(const QuantizedTensor& t, int64_t k0, int64_t k1, const void* scales) {
  if (k0 < 0 || k1 < k0 || k1 > t.k()) invalid("k_slice range out of bounds");
  QuantizedTensor s = t;
  s.data = advance(t.data, t.dtype, k0);
  s.ld = t.row_stride();
  s.scales = scales;
  s.layout = layouts::ScaleLayout(t.layout.recipe, t.rows(), k1 - k0, t.layout.format);
  return s;
}

void check_gemm_args(const QuantizedTensor& a, const QuantizedTensor& b, const void* d, const GemmOptions& opt) {
  if (a.k() != b.k())
    invalid("A and B disagree on K: " + std::to_string(a.k()) + " vs " + std::to_string(b.k()));
  if (opt.out_dtype != DType::kF32 && opt.out_dtype != DType::kBF16 && opt.out_dtype != DType::kF16)
    invalid("output dtype must be f32, bf16 or f16");
  if (a.rows() * b.rows() > 0 && !d) invalid("output is null");
  if (opt.ldd != 0 && opt.ldd < b.rows()) invalid("ldd must be >= N");
  numerics::check_operand(a, "A");
  numerics::check_operand(b, "B");
}

}  // namespace scalemm::emulation
