#include "base/capabilities.hpp"

#include <sstream>

#include "scalemm/layouts/scale_layout.hpp"

namespace scalemm::base {
namespace {

constexpr const char* kDocsModes = "cuBLAS docs 'Narrow precision data types usage' scaling-mode table";
constexpr const char* kMeasured90 = "measured on H200 sm_90 with cuBLASLt 13.1 (docs/dispatch.md)";

constexpr size_t kAnyVersion = 0;

// Recipe pairs, user A x user B. Rows are scanned in order; the first row that names the pair decides.
const NativePair kPairs[] = {
    {Recipe::kTensorwise, Recipe::kTensorwise, true, 89, 1000, cublaslt_version(12, 0),
     "SCALAR_32F: FP8 on sm_89+ (cuBLAS docs scaling-mode table; LtFp8Matmul sample)"},
    {Recipe::kRowwise, Recipe::kRowwise, true, 90, 90, cublaslt_version(12, 9),
     "OUTER_VEC_32F: sm_90 only, cuBLAS >= 12.9 (cuBLAS docs outer-vector scaling; NOT_SUPPORTED on sm_120 per "
     "pytorch#192707)"},
    {Recipe::kBlock1x128, Recipe::kBlock1x128, true, 90, 90, cublaslt_version(12, 9),
     "VEC128_32F x VEC128_32F: Hopper only, cuBLAS >= 12.9 (cuBLAS docs 1D/2D block scaling; CUDALibrarySamples#270: "
     "not on sm_100+)"},
    {Recipe::kBlock1x128, Recipe::kBlock128x128, true, 90, 90, cublaslt_version(12, 9),
     "VEC128_32F x BLK128x128_32F: Hopper only, cuBLAS >= 12.9 (cuBLAS docs 1D/2D block scaling)"},
    {Recipe::kBlock128x128, Recipe::kBlock1x128, true, 90, 90, cublaslt_version(12, 9),
     "BLK128x128_32F x VEC128_32F: Hopper only, cuBLAS >= 12.9 (cuBLAS docs 1D/2D block scaling)"},
    {Recipe::kBlock128x128, Recipe::kBlock128x128, false, 0, 0, kAnyVersion,
     "BLK128x128_32F x BLK128x128_32F is not supported by cuBLASLt (cuBLAS docs; NOT_SUPPORTED measured on sm_90)"},
    {Recipe::kMxfp8, Recipe::kMxfp8, true, 100, 1000, cublaslt_version(12, 8),
     "VEC32_UE8M0: sm_100+, cuBLAS >= 12.8 (cuBLAS docs scaling-mode table; NOT_SUPPORTED measured on sm_90)"},
    {Recipe::kMxfp8, Recipe::kMxfp8_32x32, true, 100, 1000, cublaslt_version(12, 8),
     "VEC32_UE8M0 with the 32x32 scales replicated to 1x32 (cuBLAS docs scaling-mode table)"},
    {Recipe::kMxfp8_32x32, Recipe::kMxfp8, true, 100, 1000, cublaslt_version(12, 8),
     "VEC32_UE8M0 with the 32x32 scales replicated to 1x32 (cuBLAS docs scaling-mode table)"},
    {Recipe::kMxfp8_32x32, Recipe::kMxfp8_32x32, true, 100, 1000, cublaslt_version(12, 8),
     "VEC32_UE8M0 with the 32x32 scales replicated to 1x32 (cuBLAS docs scaling-mode table)"},
    {Recipe::kNvfp4, Recipe::kNvfp4, true, 100, 1000, cublaslt_version(12, 8),
     "VEC16_UE4M3: sm_100+ and sm_12x, cuBLAS >= 12.8 (cuBLAS docs; NOT_SUPPORTED measured on sm_90)"},
};

bool is_fp8(DType t) { return t == DType::kE4M3 || t == DType::kE5M2; }
bool is_block_fp32(Recipe r) {
  return r == Recipe::kRowwise || r == Recipe::kBlock1x128 || r == Recipe::kBlock128x128;
}

std::string pair_name(const GemmProblem& p) {
  std::ostringstream os;
  os << to_string(p.a_recipe) << "\xC3\x97" << to_string(p.b_recipe);
  return os.str();
}

}  // namespace

const char* scale_mode_name(int mode) {
  switch (mode) {
    case kScalar32F: return "SCALAR_32F";
    case kVec16UE4M3: return "VEC16_UE4M3";
    case kVec32UE8M0: return "VEC32_UE8M0";
    case kOuterVec32F: return "OUTER_VEC_32F";
    case kVec128_32F: return "VEC128_32F";
    case kBlk128x128_32F: return "BLK128x128_32F";
  }
  return "unknown";
}

int recipe_scale_mode(Recipe r) {
  switch (r) {
    case Recipe::kTensorwise: return kScalar32F;
    case Recipe::kRowwise: return kOuterVec32F;
    case Recipe::kBlock1x128: return kVec128_32F;
    case Recipe::kBlock128x128: return kBlk128x128_32F;
    case Recipe::kMxfp8:
    case Recipe::kMxfp8_32x32: return kVec32UE8M0;
    case Recipe::kNvfp4: return kVec16UE4M3;
  }
  return -1;
}

const NativePair* native_pairs(size_t* count) {
  *count = sizeof(kPairs) / sizeof(kPairs[0]);
  return kPairs;
}

std::string cublaslt_version_string(size_t v) {
  std::ostringstream os;
  os << v / 10000 << '.' << (v / 100) % 100 << '.' << v % 100;
  return os.str();
}

std::string native_blocker(const GemmProblem& p, const DeviceTarget& t) {
  const std::string pair = pair_name(p);
  if (p.space == MemorySpace::kHost) return "host pointers: cuBLASLt needs device memory";
  if (!t.has_gpu()) return "no CUDA device";

  const NativePair* row = nullptr;
  for (const auto& r : kPairs)
    if (r.a == p.a_recipe && r.b == p.b_recipe) row = &r;
  if (!row) {
    return pair + ": cuBLASLt has no scale mode pairing " + scale_mode_name(recipe_scale_mode(p.a_recipe)) +
           " with " + scale_mode_name(recipe_scale_mode(p.b_recipe)) +
           " (A and B must use the same mode, except VEC128_32F with BLK128x128_32F; cuBLAS docs)";
  }
  const std::string mode = std::string(scale_mode_name(recipe_scale_mode(p.b_recipe))) + "\xC3\x97" +
                           scale_mode_name(recipe_scale_mode(p.a_recipe));
  if (!row->supported) return pair + ": " + row->source;
  if (t.sm < row->min_sm || t.sm > row->max_sm) {
    std::ostringstream os;
    os << pair << " on sm_" << t.sm << ": cuBLASLt " << scale_mode_name(recipe_scale_mode(p.a_recipe)) << " needs ";
    if (row->min_sm == row->max_sm) os << "sm_" << row->min_sm;
    else os << "sm_" << row->min_sm << '+';
    os << " (" << row->source << ')';
    return os.str();
  }
  if (t.cublaslt_version < row->min_cublaslt)
    return pair + ": needs cuBLASLt >= " + cublaslt_version_string(row->min_cublaslt) + ", this is " +
           cublaslt_version_string(t.cublaslt_version) + " (" + row->source + ")";

  // Data types.
  const bool fp4 = p.a_recipe == Recipe::kNvfp4;
  if (fp4) {
    if (p.a_dtype != DType::kE2M1 || p.b_dtype != DType::kE2M1)
      return "nvfp4 needs E2M1 data for both operands, got " + std::string(to_string(p.a_dtype)) + "\xC3\x97" +
             std::string(to_string(p.b_dtype)) + " (cuBLAS docs: VEC16_UE4M3 is the FP4 scale mode)";
  } else {
    if (!is_fp8(p.a_dtype) || !is_fp8(p.b_dtype))
      return pair + " needs FP8 (e4m3/e5m2) data, got " + std::string(to_string(p.a_dtype)) + "\xC3\x97" +
             std::string(to_string(p.b_dtype));
    if (p.a_dtype == DType::kE5M2 && p.b_dtype == DType::kE5M2)
      return "e5m2\xC3\x97" "e5m2 is not supported by cuBLASLt (cuBLAS docs FP8 type table; " + std::string(kMeasured90) + ")";
  }
  if (is_fp8_output(p.d_dtype)) {
    if (p.a_recipe != Recipe::kTensorwise || p.b_recipe != Recipe::kTensorwise)
      return "FP8 output with " + mode + " scales: cuBLASLt takes an E4M3/E5M2 D only with tensorwide (SCALAR_32F) "
             "scales on both operands (cuBLAS docs output types; D=E4M3 with VEC128 INVALID_VALUE " +
             std::string(kMeasured90) + ")";
    if (p.d_dtype == DType::kE5M2 && p.a_dtype != DType::kE5M2 && p.b_dtype != DType::kE5M2)
      return "E5M2 output needs an E5M2 input (cuBLAS docs FP8 type table: e4m3 x e4m3 gives e4m3 D)";
  } else if (p.d_dtype != DType::kBF16 && p.d_dtype != DType::kF16 && p.d_dtype != DType::kF32) {
    return "output " + std::string(to_string(p.d_dtype)) + ": scalemm runs bf16, f16, f32 or FP8 outputs";
  }
  if (fp4 && p.d_dtype == DType::kF16)
    return "nvfp4 with f16 output is not supported (TransformerEngine: 'FP4 GEMM does not support FP16 output')";

  // Shapes, in the user's terms. cuBLASLt sees m = N, n = M after the row-major swap.
  if (!fp4 && p.k % 16 != 0)
    return "K=" + std::to_string(p.k) + " is not a multiple of 16: FP8 tensor-core GEMMs need 16-byte aligned K "
           "(cuBLAS docs tensor-core usage; K=520 NOT_SUPPORTED " + std::string(kMeasured90) + ")";
  if (fp4 && p.k % 32 != 0)
    return "K=" + std::to_string(p.k) + " is not a multiple of 32: packed FP4 rows must be 16-byte aligned";
  const int64_t n_align = p.d_dtype == DType::kF32 ? 4 : is_fp8_output(p.d_dtype) ? 16 : 8;
  if (p.n % n_align != 0)
    return "N=" + std::to_string(p.n) + " is not a multiple of " + std::to_string(n_align) + ": " +
           std::string(to_string(p.d_dtype)) + " output rows must be 16-byte aligned (cuBLASLt m = N; M=260 with BF16 "
           "D NOT_SUPPORTED " + kMeasured90 + ")";
  if (is_block_fp32(p.a_recipe) && p.a_recipe != Recipe::kRowwise && (p.m % 4 != 0 || p.n % 4 != 0))
    return mode + " needs M and N multiples of 4, got M=" + std::to_string(p.m) + " N=" + std::to_string(p.n) +
           " (cuBLAS docs 'scaling factors layouts'; N=130 NOT_SUPPORTED " + kMeasured90 + ")";
  if (p.has_bias && p.d_dtype == DType::kF16)
    return "bias with f16 output: scalemm passes a bf16 bias, which cuBLASLt pairs with bf16 or f32 output";
  return "";
}

bool exact_in_bf16(const GemmProblem& p, std::string* why_not) {
  auto mx_or_nv = [](Recipe r) {
    return r == Recipe::kMxfp8 || r == Recipe::kMxfp8_32x32 || r == Recipe::kNvfp4;
  };
  if (!mx_or_nv(p.a_recipe) || !mx_or_nv(p.b_recipe)) {
    if (why_not)
      *why_not = pair_name(p) +
                 ": fp32 scales are arbitrary reals, so dequantized values need up to 28 significant bits and BF16 "
                 "holds 8: no exact BF16 emulation";
    return false;
  }
  return true;
}

std::optional<Diagnostic> fast_accum_refusal(bool fast_accum, Recipe a, Recipe b) {
  const auto amax_recipe = [](Recipe r) { return r == Recipe::kTensorwise || r == Recipe::kRowwise; };
  if (!fast_accum || (amax_recipe(a) && amax_recipe(b))) return std::nullopt;
  return Diagnostic{"fast_accum", "fast-accum-recipe",
                    "fast accumulation applies to tensorwise and rowwise operands (block recipes promote per K block)",
                    "tensorwise or rowwise on both operands",
                    std::string(to_string(a)) + " x " + std::string(to_string(b)),
                    "Leave fast_accum off for this recipe pair."};
}

}  // namespace scalemm::base
