// scalemm_fuzz: differential fuzzing of Handle::gemm on the GPU against the reference emulator.
//
//   scalemm_fuzz [--configs N] [--seed S] [--only ID] [--max-seconds T] [--verbose] [--host]
//
// Configuration ID of seed S is drawn from its own generator (seed, ID), so `--seed S --only ID`
// reproduces one configuration exactly. Each configuration draws: a recipe pair (all 49 pairs the
// dense call accepts), data dtypes (e4m3/e5m2, e2m1 for nvfp4), M and N (1, 7, 129, ...), K (multiples
// of the block size and tails), the scale format of each operand, the output dtype (bf16, f16, f32,
// e4m3/e5m2 with a D scale and optional amax), bias, alpha, a magnitude regime and a backend (the
// planner's choice, or native / convert-native / emulated / reference forced; a forced backend that
// cannot run the problem is skipped and counted by reason). Checks, outputs NaN-poisoned before each
// call (0xFF bytes: NaN in every output type):
//   tolerance   every element within verify::tolerance_for(args, plan, ref_scale) of the reference
//               (emulation::gemm_device on the same quantized inputs, rounded to the output dtype),
//               ref_scale = |alpha| * sum_k max_i |A_ik| * max_j |B_jk| + max |bias| (a bound on
//               sum_k |A_ik B_jk|); FP8 output: within one FP8 step of fp8_satfinite(d_scale * ref)
//               plus d_scale times the tolerance, and the amax within the tolerance of max |ref|;
//   non-finite  exactly the reference's NaN positions are NaN and its Inf positions Inf of the same
//               sign (no spurious NaN/Inf, none missing: "NaN propagates to the rows/cols it should");
//   determinism a second identical call gives the same bytes (D and amax);
//   agreement   when the backend that ran is native or convert-native (output not FP8), the forced
//               emulated backend on the same inputs, where it runs the problem too (MX and NVFP4 pairs
//               on devices with native MX; on sm_90 the emulated backend runs only pairs that have no
//               native path), else the forced reference backend, agrees with it within the sum of both
//               backends' tolerances; an emulated result likewise agrees with the reference backend.
//
// --grouped draws grouped calls instead (Handle::grouped_gemm): m- or k-grouped, G in {1, ..., 64} with
// empty and odd-sized groups, any recipe pair (weighted to the CUTLASS kernel's), host or device-side
// sizes, the automatic choice or a forced grouped backend; on a GPU, 2% of the m-grouped draws take a
// long K (4096 and tails) with 512-600 rows per group over blockwise operands, the contiguous
// kernel's wide tiles in clusters sharing B (160 columns with host sizes, 192 with device sizes). Each group's rows are checked against a
// float64 product of the dequantized operands within the tolerance of the dense plan that group runs
// (the native tier's for the CUTLASS kernel), an empty k-group's D[g] must be exactly zero, two calls
// must give the same bytes, device_status must say 0, and a CUTLASS result must agree with the
// per-group backend's on the same inputs.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "dispatch/verify.hpp"
#include "scalemm/emulation/compare.hpp"
#include "scalemm/emulation/emulation.hpp"
#include "scalemm/formats.hpp"
#include "scalemm/gemm.hpp"
#include "scalemm/grouped.hpp"
#include "scalemm/layouts/scale_layout.hpp"
#include "scalemm/detail/cuda_check.hpp"

using namespace scalemm;

namespace {

// A CUDA failure of the harness itself ends the run (exit 2): it is not one of the library's errors
// under test, which the fuzzer catches and judges.
void harness_check(cudaError_t e, const char* call) {
  try {
    scalemm::detail::cuda_check(e, call);
  } catch (const scalemm::Error& x) {
    std::fprintf(stderr, "scalemm_fuzz: %s\n", x.what());
    std::exit(2);
  }
}
#define FUZZ_CUDA(x) harness_check((x), #x)

enum class Regime : int { kNormal = 0, kTiny = 1, kNearMax = 2, kZeroBlocks = 3, kNonFinite = 4 };
constexpr int kRegimeCount = 5;
const char* regime_name(Regime r) {
  switch (r) {
    case Regime::kNormal: return "normal";
    case Regime::kTiny: return "tiny";
    case Regime::kNearMax: return "near-max";
    case Regime::kZeroBlocks: return "zero-blocks";
    case Regime::kNonFinite: return "nan-inf";
  }
  return "?";
}

struct Config {
  uint64_t id = 0;
  Recipe ra = Recipe::kTensorwise, rb = Recipe::kTensorwise;
  DType da = DType::kE4M3, db = DType::kE4M3;
  ScaleFormat fa = ScaleFormat::kCompact, fb = ScaleFormat::kCompact;
  int64_t m = 0, n = 0, k = 0;
  DType out = DType::kBF16;
  bool bias = false, amax = false;
  float alpha = 1.0f;
  Regime regime = Regime::kNormal;
  int backend = -1;  // -1: the planner's choice; else the forced Backend
  uint64_t data_seed = 0;
  static constexpr bool kGrouped = false;

  std::string describe() const {
    std::ostringstream os;
    os << to_string(ra) << '(' << to_string(da) << ")x" << to_string(rb) << '(' << to_string(db) << ") "
       << to_string(fa) << '/' << to_string(fb) << " M=" << m << " N=" << n << " K=" << k << " out=" << to_string(out)
       << (bias ? " +bias" : "") << (amax ? " +amax" : "") << " alpha=" << alpha << " regime=" << regime_name(regime)
       << " backend=" << (backend < 0 ? std::string("auto") : std::string(to_string(Backend(backend))));
    return os.str();
  }
};

template <class T, size_t N>
T pick(std::mt19937_64& g, const T (&v)[N]) {
  return v[std::uniform_int_distribution<size_t>(0, N - 1)(g)];
}
int64_t uni(std::mt19937_64& g, int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(g); }
double unif(std::mt19937_64& g) { return std::uniform_real_distribution<double>(0.0, 1.0)(g); }

std::mt19937_64 config_rng(uint64_t seed, uint64_t id) {
  std::seed_seq sq{uint32_t(seed), uint32_t(seed >> 32), uint32_t(id), uint32_t(id >> 32), 0x5ca1e33u};
  return std::mt19937_64(sq);
}

// Data types (e4m3 with probability `e4m3`, else e5m2; e2m1 for nvfp4) and scale formats (compact
// with probability `compact`, else cuBLASLt's), per operand.
template <class C>
void draw_types(std::mt19937_64& g, C& c, double e4m3, double compact) {
  auto data_dtype = [&](Recipe r) {
    if (r == Recipe::kNvfp4) return DType::kE2M1;
    return unif(g) < e4m3 ? DType::kE4M3 : DType::kE5M2;
  };
  c.da = data_dtype(c.ra);
  c.db = data_dtype(c.rb);
  c.fa = unif(g) < compact ? ScaleFormat::kCompact : ScaleFormat::kCublasLt;
  c.fb = unif(g) < compact ? ScaleFormat::kCompact : ScaleFormat::kCublasLt;
}

Config draw(uint64_t seed, uint64_t id) {
  auto g = config_rng(seed, id);
  Config c;
  c.id = id;
  // 70%: a pair that some device runs natively or through the emulated backend (the paths with most
  // code); 30%: any of the 49 pairs (the others run on the reference backend).
  static const std::pair<Recipe, Recipe> accelerated[] = {
      {Recipe::kTensorwise, Recipe::kTensorwise},     {Recipe::kRowwise, Recipe::kRowwise},
      {Recipe::kTensorwise, Recipe::kRowwise},        {Recipe::kRowwise, Recipe::kTensorwise},
      {Recipe::kBlock1x128, Recipe::kBlock1x128},     {Recipe::kBlock1x128, Recipe::kBlock128x128},
      {Recipe::kBlock128x128, Recipe::kBlock1x128},   {Recipe::kMxfp8, Recipe::kMxfp8},
      {Recipe::kMxfp8, Recipe::kMxfp8_32x32},         {Recipe::kMxfp8_32x32, Recipe::kMxfp8},
      {Recipe::kMxfp8_32x32, Recipe::kMxfp8_32x32},   {Recipe::kNvfp4, Recipe::kNvfp4},
      {Recipe::kMxfp8, Recipe::kNvfp4},               {Recipe::kNvfp4, Recipe::kMxfp8},
      {Recipe::kMxfp8_32x32, Recipe::kNvfp4},         {Recipe::kNvfp4, Recipe::kMxfp8_32x32}};
  if (unif(g) < 0.7) {
    const auto p = pick(g, accelerated);
    c.ra = p.first, c.rb = p.second;
  } else {
    c.ra = kAllRecipes[size_t(uni(g, 0, 6))];
    c.rb = kAllRecipes[size_t(uni(g, 0, 6))];
  }
  draw_types(g, c, 0.7, 0.5);
  static const int64_t dims[] = {1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 96, 127, 128, 129, 192, 256, 264};
  // Half the extents from the sizes native kernels take (multiples of 16), half from all of them.
  static const int64_t aligned[] = {16, 32, 64, 96, 128, 192, 256};
  c.m = unif(g) < 0.5 ? pick(g, aligned) : pick(g, dims);
  c.n = unif(g) < 0.5 ? pick(g, aligned) : pick(g, dims);
  const bool fp4 = c.ra == Recipe::kNvfp4 || c.rb == Recipe::kNvfp4;
  const double kmode = unif(g);
  if (kmode < 0.4) c.k = 128 * uni(g, 1, 5);               // whole 128-blocks
  else if (kmode < 0.75) c.k = (fp4 ? 32 : 16) * uni(g, 1, 24);  // the recipe's own granularity
  else c.k = 8 * uni(g, 1, 80);                            // tails: partial 16/32/128 blocks
  const double o = unif(g);
  c.out = o < 0.3 ? DType::kBF16 : o < 0.5 ? DType::kF16 : o < 0.8 ? DType::kF32 : o < 0.9 ? DType::kE4M3 : DType::kE5M2;
  c.bias = unif(g) < 0.2;
  c.amax = is_fp8_output(c.out) && unif(g) < 0.5;
  static const float alphas[] = {1.0f, 1.0f, 1.0f, 0.5f, 2.0f, 0.75f, -1.25f};
  c.alpha = pick(g, alphas);
  const double r = unif(g);
  c.regime = r < 0.4 ? Regime::kNormal : r < 0.55 ? Regime::kTiny : r < 0.7 ? Regime::kNearMax
           : r < 0.85 ? Regime::kZeroBlocks : Regime::kNonFinite;
  // NaN/Inf inputs with FP8 output: the saturating conversion's treatment of Inf is a separate
  // contract; the non-finite regime checks bf16/f16/f32 outputs.
  if (c.regime == Regime::kNonFinite && is_fp8_output(c.out)) {
    c.out = DType::kF32;
    c.amax = false;
  }
  const double b = unif(g);
  // Forced contiguous (scalemm's blockwise kernel as one group) runs blockwise pairs at any shape the
  // kernel takes; auto takes it at M <= 256 over wide N and for the largest outputs.
  c.backend = b < 0.5 ? -1 : b < 0.66 ? int(Backend::kNative) : b < 0.76 ? int(Backend::kConvertNative)
            : b < 0.86 ? int(Backend::kEmulated) : b < 0.93 ? int(Backend::kReference) : int(Backend::kContiguous);
  c.data_seed = g();
  return c;
}


// ---- grouped configurations (--grouped) ------------------------------------------------------------

struct GroupedConfig {
  uint64_t id = 0;
  GroupDim dim = GroupDim::kM;
  Recipe ra = Recipe::kRowwise, rb = Recipe::kRowwise;
  DType da = DType::kE4M3, db = DType::kE4M3;
  ScaleFormat fa = ScaleFormat::kCompact, fb = ScaleFormat::kCompact;
  std::vector<int64_t> sizes;  // M_g (m-grouped) or K_g (k-grouped)
  int64_t m_or_k = 0, n = 0;   // m-grouped: K; k-grouped: M
  DType out = DType::kBF16;
  float alpha = 1.0f;
  Regime regime = Regime::kNormal;
  GroupedBackend backend = GroupedBackend::kAuto;
  int device_sizes = 0;  // 0: host sizes; 1: device int32; 2: device int64
  uint64_t data_seed = 0;
  static constexpr bool kGrouped = true;

  std::string describe() const {
    std::ostringstream os;
    os << to_string(dim) << "-grouped G=" << sizes.size() << " sizes=";
    for (size_t i = 0; i < sizes.size(); ++i) os << (i ? "," : "") << sizes[i];
    os << ' ' << to_string(ra) << '(' << to_string(da) << ")x" << to_string(rb) << '(' << to_string(db) << ") "
       << to_string(fa) << '/' << to_string(fb) << (dim == GroupDim::kM ? " K=" : " M=") << m_or_k << " N=" << n
       << " out=" << to_string(out) << " alpha=" << alpha << " regime=" << regime_name(regime)
       << " backend=" << to_string(backend)
       << (device_sizes ? device_sizes == 2 ? " sizes=device-int64" : " sizes=device-int32" : "");
    return os.str();
  }
};

// K granularity of a k-grouped split for one recipe (its K block; 16 keeps FP8 rows 16-byte aligned).
int64_t k_granule(Recipe r) {
  switch (r) {
    case Recipe::kBlock1x128:
    case Recipe::kBlock128x128: return 128;
    case Recipe::kMxfp8:
    case Recipe::kMxfp8_32x32: return 32;
    default: return 16;
  }
}

// --host runs every call on host memory (the host reference backend against emulation::gemm_host):
// the generators and checks of this program, testable without a GPU.
bool g_host = false;

GroupedConfig draw_grouped(uint64_t seed, uint64_t id) {
  auto g = config_rng(seed ^ 0x6A09E667F3BCC908ull, id);  // a stream of its own: ids do not collide with dense ones
  GroupedConfig c;
  c.id = id;
  c.dim = unif(g) < 0.7 ? GroupDim::kM : GroupDim::kK;
  // 55%: a pair the CUTLASS grouped kernels take; 30%: the pairs dense calls accelerate; 15%: any.
  static const std::pair<Recipe, Recipe> kernel_pairs[] = {{Recipe::kRowwise, Recipe::kRowwise},
                                                          {Recipe::kBlock1x128, Recipe::kBlock128x128},
                                                          {Recipe::kBlock1x128, Recipe::kBlock1x128}};
  static const std::pair<Recipe, Recipe> accelerated[] = {
      {Recipe::kTensorwise, Recipe::kTensorwise}, {Recipe::kTensorwise, Recipe::kRowwise},
      {Recipe::kBlock128x128, Recipe::kBlock1x128}, {Recipe::kMxfp8, Recipe::kMxfp8},
      {Recipe::kMxfp8, Recipe::kMxfp8_32x32},     {Recipe::kNvfp4, Recipe::kNvfp4}};
  const double p = unif(g);
  std::pair<Recipe, Recipe> pr = p < 0.55 ? pick(g, kernel_pairs) : p < 0.85 ? pick(g, accelerated)
                                 : std::pair<Recipe, Recipe>{kAllRecipes[size_t(uni(g, 0, 6))], kAllRecipes[size_t(uni(g, 0, 6))]};
  c.ra = pr.first, c.rb = pr.second;
  // 2% of m-grouped draws: a long K over blockwise 1x128 x 128x128 with 512 rows or more per group,
  // where the contiguous kernel runs wide tiles in clusters of two M tiles sharing B (contiguous_grouped.hpp,
  // shared_b; an odd tile count leaves the last tile's peer past M): these few tiles fill less than a
  // wave, so 160 columns with host sizes (narrow_tiles), 192 with device sizes; about
  // 1100 rows x 264 columns at most, so that the float64 reference stays near a second (GPU runs only:
  // under --host the reference backend's own GEMM takes seconds more, and no kernel is under test).
  const bool long_k = !g_host && c.dim == GroupDim::kM && unif(g) < 0.02;
  if (long_k) c.ra = Recipe::kBlock1x128, c.rb = Recipe::kBlock128x128;
  draw_types(g, c, 0.8, 0.75);
  static const int64_t dims[] = {1, 2, 3, 7, 8, 16, 17, 31, 32, 33, 64, 65, 96, 127, 128, 129, 192, 256, 264};
  static const int64_t aligned[] = {16, 32, 64, 96, 128, 192, 256};
  c.n = unif(g) < 0.6 ? pick(g, aligned) : pick(g, dims);
  const bool fp4 = c.ra == Recipe::kNvfp4 || c.rb == Recipe::kNvfp4;
  if (long_k) {
    // N 136 and 200 end inside a wide tile; 200's and 264's second tile starts 64 (192-wide) or 32
    // (160-wide) columns into a scale block.
    static const int64_t wide_n[] = {64, 136, 200, 264}, wide_rows[] = {512, 520, 600}, k_tails[] = {0, 16, 128, 144};
    c.n = pick(g, wide_n);
    const int64_t G = uni(g, 1, 2);
    for (int64_t i = 0; i < G; ++i) c.sizes.push_back(pick(g, wide_rows));
    c.m_or_k = 4096 + pick(g, k_tails);
  } else if (c.dim == GroupDim::kM) {
    static const int64_t groups[] = {1, 2, 3, 4, 7, 16, 64};
    const int64_t G = pick(g, groups);
    // Totals stay near 1024 rows at most (the float64 reference runs on the host).
    static const int64_t few[] = {0, 1, 7, 16, 33, 64, 129, 200}, some[] = {0, 1, 7, 16, 33, 64}, many[] = {0, 1, 8, 16};
    const bool equal = unif(g) < 0.15;
    const int64_t first = G <= 4 ? pick(g, few) : G <= 16 ? pick(g, some) : pick(g, many);
    for (int64_t i = 0; i < G; ++i)
      c.sizes.push_back(equal ? first : G <= 4 ? pick(g, few) : G <= 16 ? pick(g, some) : pick(g, many));
    if (std::all_of(c.sizes.begin(), c.sizes.end(), [](int64_t v) { return v == 0; })) c.sizes[0] = 7;
    const double kmode = unif(g);
    if (kmode < 0.45) c.m_or_k = 128 * uni(g, 1, 5);
    else if (kmode < 0.8) c.m_or_k = (fp4 ? 32 : 16) * uni(g, 1, 24);
    else c.m_or_k = 8 * uni(g, 1, 80);
  } else {
    static const int64_t groups[] = {1, 2, 3, 4, 7};
    const int64_t G = pick(g, groups);
    const int64_t gran = std::max(k_granule(c.ra), k_granule(c.rb));
    // Per-row and per-tensor pairs have no K blocks: K_g may be any multiple of 8 there.
    const bool free_k = gran == 16 && !fp4 && unif(g) < 0.3;
    for (int64_t i = 0; i < G; ++i) c.sizes.push_back(free_k ? 8 * uni(g, 0, 12) : gran * uni(g, 0, 3));
    if (std::all_of(c.sizes.begin(), c.sizes.end(), [](int64_t v) { return v == 0; })) c.sizes[0] = gran;
    c.m_or_k = unif(g) < 0.5 ? pick(g, aligned) : pick(g, dims);
  }
  const double o = unif(g);
  c.out = o < 0.6 ? DType::kBF16 : o < 0.8 ? DType::kF16 : DType::kF32;
  static const float alphas[] = {1.0f, 1.0f, 1.0f, 0.5f, 2.0f, -1.25f};
  c.alpha = pick(g, alphas);
  const double r = unif(g);
  c.regime = r < 0.45 ? Regime::kNormal : r < 0.6 ? Regime::kTiny : r < 0.75 ? Regime::kNearMax
           : r < 0.9 ? Regime::kZeroBlocks : Regime::kNonFinite;
  const double b = unif(g);
  c.backend = b < 0.6    ? GroupedBackend::kAuto
              : b < 0.75 ? GroupedBackend::kPerGroup
              : b < 0.9  ? GroupedBackend::kCutlass
                         : GroupedBackend::kContiguous;
  if (long_k && unif(g) < 0.5) c.backend = GroupedBackend::kContiguous, c.out = DType::kBF16;
  // Device-side sizes where A's scales do not depend on them: m-grouped A needs a per-row recipe in
  // compact format (grouped.hpp); k-grouped scales are whole-tensor ones.
  const bool per_row_a = c.fa == ScaleFormat::kCompact && (c.ra == Recipe::kRowwise || c.ra == Recipe::kBlock1x128 ||
                                                           c.ra == Recipe::kMxfp8 || c.ra == Recipe::kNvfp4);
  const bool sizes_may_move = c.dim == GroupDim::kK || per_row_a;
  if (!g_host && unif(g) < (c.dim == GroupDim::kM ? 0.3 : 0.1) && sizes_may_move) c.device_sizes = unif(g) < 0.5 ? 1 : 2;
  c.data_seed = g();
  return c;
}

// ---- operands --------------------------------------------------------------------------------------

struct HostOp {
  Recipe recipe = Recipe::kTensorwise;
  DType dtype = DType::kE4M3;
  ScaleFormat format = ScaleFormat::kCompact;
  int64_t rows = 0, k = 0;
  std::vector<uint8_t> data, scales;
  float gs = 1.0f;
  layouts::ScaleLayout layout() const { return layouts::ScaleLayout(recipe, rows, k, format); }
};

float data_max(DType t) {
  return t == DType::kE2M1 ? formats::kE2M1Max : t == DType::kE5M2 ? formats::kE5M2Max : formats::kE4M3Max;
}

void set_code(HostOp& op, int64_t i, uint8_t code) {
  if (op.dtype == DType::kE2M1) formats::set_e2m1(op.data.data(), i, uint8_t(code & 0xF));
  else op.data[size_t(i)] = code;
}

// Writes one logical scale (grid row gr, K-block kb) at every buffer position that holds it.
void set_scale(HostOp& op, int64_t gr, int64_t kb, float value, int raw_code = -1) {
  const auto l = op.layout();
  const int64_t r0 = gr * l.block_rows(), r1 = std::min(op.rows, r0 + l.block_rows());
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t o = l.offset(r, kb);
    switch (l.scale_dtype()) {
      case DType::kE8M0: op.scales[size_t(o)] = raw_code >= 0 ? uint8_t(raw_code) : formats::encode_e8m0(value); break;
      case DType::kUE4M3: op.scales[size_t(o)] = raw_code >= 0 ? uint8_t(raw_code) : formats::encode_ue4m3(value); break;
      default: std::memcpy(op.scales.data() + o * 4, &value, 4); break;
    }
  }
}

// Quantizes a float source with the library's quantizer (default scale mode of the recipe).
HostOp quantized_op(Recipe r, DType dt, ScaleFormat f, int64_t rows, int64_t k, const std::vector<float>& src) {
  emulation::QuantizeConfig cfg;
  cfg.recipe = r;
  cfg.data_dtype = dt;
  cfg.format = f;
  HostOp op;
  op.recipe = r, op.dtype = dt, op.format = f, op.rows = rows, op.k = k;
  op.data.assign(size_t(emulation::data_bytes(cfg, rows, k)), 0);
  op.scales.assign(size_t(emulation::rowwise_layout(cfg, rows, k).bytes()), 0);
  emulation::QuantizeOutputs out;
  out.data = op.data.data();
  out.scales = op.scales.data();
  out.global_scale = &op.gs;
  emulation::quantize_host(emulation::SourceMatrix{src.data(), DType::kF32, rows, k}, cfg, out);
  return op;
}

// Builds an operand code by code: tiny (subnormal data codes, small scales) or near-max (data within
// a factor 4 of the format's largest value, scales chosen so that sum_k |a b| stays near 2^target_exp).
HostOp coded_op(Recipe r, DType dt, ScaleFormat f, int64_t rows, int64_t k, Regime regime, int scale_exp,
                std::mt19937_64& g) {
  HostOp op;
  op.recipe = r, op.dtype = dt, op.format = f, op.rows = rows, op.k = k;
  const int64_t n = rows * k;
  op.data.assign(size_t(dtype_storage_bytes(dt, n)), 0);
  op.scales.assign(size_t(op.layout().bytes()), 0);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t sign = unif(g) < 0.5 ? 0 : 1;
    uint8_t mag;
    if (dt == DType::kE2M1) mag = regime == Regime::kTiny ? uint8_t(uni(g, 0, 1)) : uint8_t(uni(g, 5, 7));
    else if (dt == DType::kE5M2) mag = regime == Regime::kTiny ? uint8_t(uni(g, 0, 3)) : uint8_t(uni(g, 0x74, 0x7B));
    else mag = regime == Regime::kTiny ? uint8_t(uni(g, 0, 7)) : uint8_t(uni(g, 0x70, 0x7E));
    set_code(op, i, dt == DType::kE2M1 ? uint8_t(mag | (sign << 3)) : uint8_t(mag | (sign << 7)));
  }
  const auto l = op.layout();
  for (int64_t gr = 0; gr < l.grid_rows(); ++gr)
    for (int64_t kb = 0; kb < l.kblocks(); ++kb) {
      if (l.scale_dtype() == DType::kUE4M3) {
        // UE4M3 block scales: subnormal codes (tiny) or 128..448 (near max); the rest of the
        // magnitude goes into the global scale below.
        set_scale(op, gr, kb, 0.0f, regime == Regime::kTiny ? int(uni(g, 1, 7)) : int(uni(g, 0x70, 0x7E)));
      } else {
        const int e = scale_exp - int(uni(g, 0, 2));
        const float v = l.scale_dtype() == DType::kE8M0 ? std::ldexp(1.0f, e)
                                                        : std::ldexp(float(0.5 + 0.5 * unif(g)), e + 1);
        set_scale(op, gr, kb, v);
      }
    }
  if (r == Recipe::kNvfp4) op.gs = std::ldexp(1.0f, regime == Regime::kTiny ? scale_exp : scale_exp - 9);
  return op;
}

std::vector<float> source(int64_t rows, int64_t k, std::mt19937_64& g) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> src(size_t(rows * k));
  const int e = int(uni(g, -6, 6));
  for (int64_t r = 0; r < rows; ++r) {
    const float row_scale = std::ldexp(1.0f, e + int(uni(g, -3, 3)));
    for (int64_t i = 0; i < k; ++i) src[size_t(r * k + i)] = nd(g) * row_scale;
  }
  return src;
}

HostOp make_op(Recipe r, DType dt, ScaleFormat f, int64_t rows, int64_t k, Regime regime, int scale_exp,
               std::mt19937_64& g) {
  if (regime == Regime::kTiny || regime == Regime::kNearMax) return coded_op(r, dt, f, rows, k, regime, scale_exp, g);
  std::vector<float> src = source(rows, k, g);
  if (regime == Regime::kZeroBlocks) {
    const double whole = unif(g);
    if (whole < 0.05) std::fill(src.begin(), src.end(), 0.0f);
    // Zero 32-element K chunks across all rows (whole 16/32-blocks, parts of 128-blocks), a whole
    // 128-block, and some whole rows.
    for (int64_t c = 0; c * 32 < k; ++c)
      if (unif(g) < 0.3)
        for (int64_t row = 0; row < rows; ++row)
          for (int64_t i = c * 32; i < std::min(k, c * 32 + 32); ++i) src[size_t(row * k + i)] = 0.0f;
    if (k >= 128 && unif(g) < 0.5) {
      const int64_t b = uni(g, 0, k / 128 - 1);
      for (int64_t row = 0; row < rows; ++row)
        for (int64_t i = b * 128; i < b * 128 + 128; ++i) src[size_t(row * k + i)] = 0.0f;
    }
    for (int64_t row = 0; row < rows; ++row)
      if (unif(g) < 0.2) std::fill(src.begin() + row * k, src.begin() + (row + 1) * k, 0.0f);
  }
  HostOp op = quantized_op(r, dt, f, rows, k, src);
  if (regime == Regime::kNonFinite) {
    // Data codes the element type defines as NaN/Inf (E2M1 has none), and NaN block scales where the
    // scale type has a NaN code (E8M0 0xFF, UE4M3 0x7F; fp32 scales are preconditions, not data).
    const int64_t hits = uni(g, 1, 3);
    for (int64_t h = 0; h < hits && dt != DType::kE2M1; ++h) {
      const int64_t i = uni(g, 0, rows * k - 1);
      static const uint8_t e4m3[] = {0x7F, 0xFF};
      static const uint8_t e5m2[] = {0x7C, 0xFC, 0x7E, 0x7C, 0xFC};
      set_code(op, i, dt == DType::kE4M3 ? pick(g, e4m3) : pick(g, e5m2));
    }
    const auto l = op.layout();
    if ((l.scale_dtype() != DType::kF32 && unif(g) < 0.6) || dt == DType::kE2M1) {
      if (l.scale_dtype() != DType::kF32)
        set_scale(op, uni(g, 0, l.grid_rows() - 1), uni(g, 0, l.kblocks() - 1), 0.0f,
                  l.scale_dtype() == DType::kE8M0 ? 0xFF : 0x7F);
    }
  }
  return op;
}

std::vector<float> dequant(const HostOp& op) {
  emulation::QuantizedTensor t;
  t.data = op.data.data();
  t.dtype = op.dtype;
  t.scales = op.scales.data();
  t.layout = op.layout();
  t.global_scale = &op.gs;
  std::vector<float> out(size_t(op.rows * op.k));
  emulation::dequantize_host(t, out.data(), DType::kF32);
  return out;
}

// ---- device buffers --------------------------------------------------------------------------------


struct Buf {
  void* p = nullptr;
  size_t cap = 0;
  std::vector<uint64_t> host;
  void* need(size_t bytes) {
    bytes = std::max<size_t>(bytes, 256);
    if (bytes > cap) {
      cap = std::max(bytes, cap * 2);
      if (g_host) {
        host.assign((cap + 7) / 8, 0);
        p = host.data();
      } else {
        if (p) FUZZ_CUDA(cudaFree(p));
        FUZZ_CUDA(cudaMalloc(&p, cap));
      }
    }
    return p;
  }
  ~Buf() {
    if (p && !g_host) cudaFree(p);
  }
};

void copy_async(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  if (g_host) std::memcpy(dst, src, bytes);
  else FUZZ_CUDA(cudaMemcpyAsync(dst, src, bytes, kind, s));
}
void fill_async(void* dst, int value, size_t bytes, cudaStream_t s) {
  if (g_host) std::memset(dst, value, bytes);
  else FUZZ_CUDA(cudaMemsetAsync(dst, value, bytes, s));
}

size_t elem_bytes(DType t) { return size_t(dtype_bits(t) / 8); }

float widen_one(const uint8_t* raw, size_t i, DType t) {
  switch (t) {
    case DType::kF32: {
      float v;
      std::memcpy(&v, raw + 4 * i, 4);
      return v;
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, raw + 2 * i, 2);
      return formats::decode_bf16(h);
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, raw + 2 * i, 2);
      return formats::decode_f16(h);
    }
    case DType::kE4M3: return formats::decode_e4m3(raw[i]);
    case DType::kE5M2: return formats::decode_e5m2(raw[i]);
    default: return std::nanf("");
  }
}

// The reference (f32, alpha and bias applied) rounded to a bf16/f16/f32 output as the output would be.
float round_to(float x, DType t) {
  if (t == DType::kBF16) return formats::decode_bf16(formats::encode_bf16(x));
  if (t == DType::kF16) return formats::decode_f16(formats::encode_f16(x));
  return x;
}

struct Stats {
  int64_t run = 0, failed = 0, drawn = 0;
  int64_t tolerance_checks = 0, determinism_checks = 0, agreement_checks = 0, nonfinite_outputs = 0;
  std::map<std::string, int64_t> skipped;
  int64_t by_backend[kBackendCount] = {};
  int64_t by_regime[kRegimeCount] = {};
  std::map<std::string, int64_t> by_out;
  std::map<std::string, int64_t> agreement;
  std::map<std::string, int64_t> grouped_paths;  // --grouped: "cutlass" / "contiguous" / "per-group", m or k, size source
};

class Fuzzer {
 public:
  explicit Fuzzer(uint64_t seed, bool verbose) : seed_(seed), verbose_(verbose) {
    if (!g_host) FUZZ_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    HandleOptions ho;
    ho.verify = VerifyMode::kOff;
    ho.autotune = Autotune::kOff;
    auto_ = std::make_unique<Handle>(ho);
    for (int b = 0; b < kBackendCount; ++b) {
      HandleOptions f = ho;
      f.plan.force = Backend(b);
      forced_[b] = std::make_unique<Handle>(f);
    }
  }
  ~Fuzzer() {
    if (!g_host) cudaStreamDestroy(stream_);
  }

  // Runs one configuration; returns false when it was skipped.
  bool run(const Config& c, Stats& st);
  bool run_grouped(const GroupedConfig& c, Stats& st);

 private:
  template <class C>
  void fail(const C& c, Stats& st, const std::string& what) {
    if (!failed_now_) ++st.failed;
    failed_now_ = true;
    if (st.failed <= 50 || verbose_)
      std::printf("FAIL seed=%" PRIu64 " id=%" PRIu64 ": %s\n  config: %s\n  reproduce: scalemm_fuzz --seed %" PRIu64
                  " --only %" PRIu64 "%s%s\n",
                  seed_, c.id, what.c_str(), c.describe().c_str(), seed_, c.id, c.kGrouped ? " --grouped" : "",
                  g_host ? " --host" : "");
  }

  // Waits for the calls; a CUDA error there (a fault that ends the context) stops the run with the
  // configuration's reproduction.
  template <class C>
  void sync_or_exit(const C& c) {
    const cudaError_t sync = g_host ? cudaSuccess : cudaStreamSynchronize(stream_);
    if (sync == cudaSuccess) return;
    std::printf("FATAL seed=%" PRIu64 " id=%" PRIu64 ": CUDA error %s after the calls\n  config: %s\n  reproduce: "
                "scalemm_fuzz%s --seed %" PRIu64 " --only %" PRIu64 "\n",
                seed_, c.id, cudaGetErrorString(sync), c.describe().c_str(), c.kGrouped ? " --grouped" : "", seed_,
                c.id);
    std::exit(3);
  }

  // Copies `bytes` from the host into `buf` (grown as needed) on the fuzzer's stream.
  void* upload(Buf& buf, const void* host, size_t bytes) {
    void* p = buf.need(bytes);
    if (bytes) copy_async(p, host, bytes, cudaMemcpyHostToDevice, stream_);
    return p;
  }

  uint64_t seed_;
  bool verbose_;
  bool failed_now_ = false;
  cudaStream_t stream_{};
  std::unique_ptr<Handle> auto_, forced_[kBackendCount];
  Buf da_, db_, sa_, sb_, bias_, biasf_, d1_, d2_, d3_, ref_, ws_, scal_, sizes_;
};

bool Fuzzer::run(const Config& c, Stats& st) {
  failed_now_ = false;
  Handle& h = c.backend < 0 ? *auto_ : *forced_[c.backend];
  {
    // The plan depends on the problem only: a forced backend that cannot run it is skipped before
    // any operand is made (plan() reads no pointer; non-null placeholders mark bias and amax).
    static const char placeholder[16] = {};
    GemmArgs probe;
    probe.m = c.m, probe.n = c.n, probe.k = c.k;
    probe.a.dtype = c.da, probe.a.recipe = c.ra, probe.a.scale_format = c.fa;
    probe.b.dtype = c.db, probe.b.recipe = c.rb, probe.b.scale_format = c.fb;
    probe.d_dtype = c.out;
    probe.bias = c.bias ? placeholder : nullptr;
    probe.d_amax = c.amax ? reinterpret_cast<float*>(const_cast<char*>(placeholder)) : nullptr;
    probe.space = g_host ? MemorySpace::kHost : MemorySpace::kDevice;
    try {
      (void)h.plan(probe);
    } catch (const Error& e) {
      if (e.code() == StatusCode::kUnsupported && c.backend >= 0) {
        ++st.skipped[std::string("forced ") + std::string(to_string(Backend(c.backend))) + " cannot run the problem"];
        return false;
      }
      fail(c, st, std::string("plan() threw ") + e.what());
      return true;
    }
  }
  auto g = std::mt19937_64(c.data_seed);
  // Near-max scale exponents: keep sum_k |a b| near 2^target (f16 output: 2^14, below its 65504).
  int ea = 0, eb = 0;
  if (c.regime == Regime::kNearMax) {
    const int target = c.out == DType::kF16 ? 13 : is_fp8_output(c.out) ? 20 : 100;
    const int e_total = target - int(std::ceil(std::log2(double(c.k) * data_max(c.da) * data_max(c.db))));
    ea = e_total / 2;
    eb = e_total - ea;
  } else if (c.regime == Regime::kTiny) {
    ea = -int(uni(g, 10, 40));
    eb = -int(uni(g, 10, 40));
  }
  const HostOp a = make_op(c.ra, c.da, c.fa, c.m, c.k, c.regime, ea, g);
  const HostOp b = make_op(c.rb, c.db, c.fb, c.n, c.k, c.regime, eb, g);

  // A bound on sum_k |A_ik B_jk| from the dequantized operands (non-finite entries left out).
  const std::vector<float> fa = dequant(a), fb = dequant(b);
  std::vector<double> ca(size_t(c.k), 0.0), cb(size_t(c.k), 0.0);
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t kk = 0; kk < c.k; ++kk) {
      const float v = std::fabs(fa[size_t(i * c.k + kk)]);
      if (std::isfinite(v)) ca[size_t(kk)] = std::max(ca[size_t(kk)], double(v));
    }
  for (int64_t j = 0; j < c.n; ++j)
    for (int64_t kk = 0; kk < c.k; ++kk) {
      const float v = std::fabs(fb[size_t(j * c.k + kk)]);
      if (std::isfinite(v)) cb[size_t(kk)] = std::max(cb[size_t(kk)], double(v));
    }
  double bound = 0.0;
  for (int64_t kk = 0; kk < c.k; ++kk) bound += ca[size_t(kk)] * cb[size_t(kk)];
  // Keep the result inside the output's range (an f16 overflow near 65504 would turn a rounding
  // difference into Inf vs finite): alpha shrinks by a power of two where needed.
  float alpha = c.alpha;
  const double limit = c.out == DType::kF16 ? 16384.0 : 1e36;
  while (bound * std::fabs(alpha) > limit) alpha *= 0.5f;
  std::vector<uint16_t> bias_h;
  std::vector<float> bias_f;
  double bias_max = 0.0;
  if (c.bias) {
    const double mag = std::max(bound * std::fabs(alpha), 1e-30) * 0.25;
    for (int64_t j = 0; j < c.n; ++j) {
      const uint16_t h = formats::encode_bf16(float(mag * (2.0 * unif(g) - 1.0)));
      bias_h.push_back(h);
      bias_f.push_back(formats::decode_bf16(h));
      bias_max = std::max(bias_max, double(std::fabs(bias_f.back())));
    }
  }
  const double ref_scale = std::fabs(alpha) * bound + bias_max;
  float d_scale = 1.0f;
  if (is_fp8_output(c.out) && ref_scale > 0.0) {
    // Map the bound to the format's maximum, times 2^[-1, 3]: some outputs saturate.
    d_scale = float(double(fp8_output_max(c.out)) / ref_scale * std::ldexp(1.0, int(uni(g, -1, 3))));
    if (!(d_scale > 0.0f) || !std::isfinite(d_scale)) d_scale = 1.0f;
  }

  const cudaStream_t s = stream_;
  auto up = [&](Buf& buf, const void* host, size_t bytes) { return upload(buf, host, bytes); };
  GemmArgs args;
  args.m = c.m, args.n = c.n, args.k = c.k;
  args.a.data = up(da_, a.data.data(), a.data.size());
  args.a.dtype = a.dtype, args.a.recipe = a.recipe, args.a.scale_format = a.format, args.a.global_scale = a.gs;
  args.a.scale = up(sa_, a.scales.data(), a.scales.size());
  args.b.data = up(db_, b.data.data(), b.data.size());
  args.b.dtype = b.dtype, args.b.recipe = b.recipe, args.b.scale_format = b.format, args.b.global_scale = b.gs;
  args.b.scale = up(sb_, b.scales.data(), b.scales.size());
  args.d_dtype = c.out;
  args.alpha = alpha;
  args.space = g_host ? MemorySpace::kHost : MemorySpace::kDevice;
  // Self-test of the checks: SCALEMM_FUZZ_PERTURB=x runs the library with alpha * (1 + x) against the
  // reference with alpha; with x = 1e-2 nearly every configuration with a nonzero result must fail.
  static const double perturb = std::getenv("SCALEMM_FUZZ_PERTURB") ? std::atof(std::getenv("SCALEMM_FUZZ_PERTURB")) : 0.0;
  args.alpha = float(double(alpha) * (1.0 + perturb));
  if (c.bias) {
    args.bias = up(bias_, bias_h.data(), bias_h.size() * 2);
    up(biasf_, bias_f.data(), bias_f.size() * 4);
  }
  const float scal_init[2] = {d_scale, -1.0f};
  float* scal = static_cast<float*>(scal_.need(8));
  if (is_fp8_output(c.out)) {
    args.d_scale = scal;
    if (c.amax) args.d_amax = scal + 1;
  }
  const size_t count = size_t(c.m * c.n), out_bytes = count * elem_bytes(c.out);
  void* d1 = d1_.need(out_bytes);
  void* d2 = d2_.need(out_bytes);
  args.d = d1;

  Plan plan;
  try {
    plan = h.plan(args);
  } catch (const Error& e) {
    fail(c, st, std::string("plan() threw after a successful plan of the same problem: ") + e.what());
    return true;
  }
  if (verbose_) std::printf("plan: %s\n", plan.explain().c_str());

  // Two identical calls, each into a poisoned D (and a reset amax).
  auto call = [&](Handle& hh, void* d) -> bool {
    fill_async(d, 0xFF, out_bytes, s);
    copy_async(scal, scal_init, sizeof(scal_init), cudaMemcpyHostToDevice, s);
    GemmArgs x = args;
    x.d = d;
    try {
      hh.gemm(x, reinterpret_cast<Stream>(s));
    } catch (const Error& e) {
      fail(c, st, std::string("gemm() threw on valid input: ") + e.what());
      return false;
    }
    return true;
  };
  float amax1 = 0.0f, amax2 = 0.0f;
  if (!call(h, d1)) return true;
  copy_async(&amax1, scal + 1, 4, cudaMemcpyDeviceToHost, s);
  if (!call(h, d2)) return true;
  copy_async(&amax2, scal + 1, 4, cudaMemcpyDeviceToHost, s);

  // The agreement run: a native or convert-native result against the emulated backend where it runs
  // the problem too (MX/NVFP4 pairs on devices with native MX), else against the reference backend
  // (the GPU emulator behind Handle::gemm); an emulated result against the reference backend.
  Plan emu_plan;
  bool agree_ran = false;
  Backend partner = Backend::kReference;
  void* d3 = nullptr;
  if (plan.backend != Backend::kReference && !is_fp8_output(c.out)) {
    std::vector<Backend> partners;
    if (plan.backend != Backend::kEmulated) partners.push_back(Backend::kEmulated);
    partners.push_back(Backend::kReference);
    for (Backend pb : partners) {
      try {
        emu_plan = forced_[int(pb)]->plan(args);
      } catch (const Error& e) {
        if (e.code() != StatusCode::kUnsupported) {
          fail(c, st, std::string("forced ") + std::string(to_string(pb)) + " plan() threw " + e.what());
          return true;
        }
        continue;
      }
      partner = pb;
      d3 = d3_.need(out_bytes);
      agree_ran = call(*forced_[int(pb)], d3);
      if (!agree_ran) return true;
      break;
    }
  }

  // The reference: emulation::gemm_device on the same device operands, f32 out, alpha (with NVFP4's
  // global scales folded in) and bias applied.
  emulation::QuantizedTensor qa, qb;
  qa.data = args.a.data, qa.dtype = a.dtype, qa.scales = args.a.scale, qa.layout = a.layout();
  qb.data = args.b.data, qb.dtype = b.dtype, qb.scales = args.b.scale, qb.layout = b.layout();
  emulation::GemmOptions opt;
  opt.alpha = alpha * a.gs * b.gs;
  opt.out_dtype = DType::kF32;
  opt.bias = c.bias ? static_cast<const float*>(biasf_.p) : nullptr;
  const size_t ws_bytes = g_host ? 0 : emulation::gemm_device_workspace_bytes(qa, qb);
  void* ref = ref_.need(count * 4);
  try {
    if (g_host) emulation::gemm_host(qa, qb, ref, opt);
    else {
      void* w = ws_.need(ws_bytes);  // before reading ws_.cap: need() may grow it
      emulation::gemm_device(qa, qb, ref, opt, w, ws_.cap, reinterpret_cast<Stream>(s));
    }
  } catch (const Error& e) {
    fail(c, st, std::string("the reference threw: ") + e.what());
    return true;
  }
  sync_or_exit(c);
  std::vector<uint8_t> r1(out_bytes), r2(out_bytes), r3;
  std::vector<float> rf(count);
  copy_async(r1.data(), d1, out_bytes, cudaMemcpyDeviceToHost, s);
  copy_async(r2.data(), d2, out_bytes, cudaMemcpyDeviceToHost, s);
  copy_async(rf.data(), ref, count * 4, cudaMemcpyDeviceToHost, s);
  if (agree_ran) {
    r3.resize(out_bytes);
    copy_async(r3.data(), d3, out_bytes, cudaMemcpyDeviceToHost, s);
  }

  ++st.by_backend[int(plan.backend)];
  ++st.by_regime[int(c.regime)];
  ++st.by_out[std::string(to_string(c.out))];

  // Determinism.
  ++st.determinism_checks;
  int64_t first = -1;
  if (!emulation::bitwise_equal(r1.data(), r2.data(), out_bytes, &first))
    fail(c, st, "two identical calls differ (first differing byte " + std::to_string(first) + ") on backend " +
                    std::string(to_string(plan.backend)));
  if (c.amax && std::memcmp(&amax1, &amax2, 4) != 0)
    fail(c, st, "two identical calls give different amax: " + std::to_string(amax1) + " vs " + std::to_string(amax2));

  // Tolerance and non-finite pattern.
  GemmArgs tol_args = args;
  if (is_fp8_output(c.out)) tol_args.d_dtype = DType::kF32;
  const emulation::Tolerance tol = verify::tolerance_for(tol_args, plan, ref_scale);
  ++st.tolerance_checks;
  for (float v : rf) st.nonfinite_outputs += !std::isfinite(v);
  if (!is_fp8_output(c.out)) {
    std::vector<float> want(count), got(count);
    for (size_t i = 0; i < count; ++i) {
      want[i] = round_to(rf[i], c.out);
      got[i] = widen_one(r1.data(), i, c.out);
    }
    const emulation::Comparison cmp = emulation::compare(want.data(), got.data(), int64_t(count), &tol);
    if (verbose_) std::printf("vs reference: %s (tolerance %s)\n", cmp.to_string().c_str(), tol.to_string().c_str());
    if (!cmp.within_tolerance()) {
      const int64_t w = cmp.nonfinite_mismatches ? -1 : cmp.first_violation;
      std::ostringstream os;
      os << "backend " << to_string(plan.backend) << " vs reference: " << cmp.violations << " outside tolerance "
         << tol.to_string() << ", " << cmp.nonfinite_mismatches << " NaN/Inf mismatches (ref nan " << cmp.nan_ref
         << " inf " << cmp.inf_ref << ", got nan " << cmp.nan_test << " inf " << cmp.inf_test << ")";
      if (w >= 0)
        os << "; first D[" << w / c.n << ',' << w % c.n << "] = " << got[size_t(w)] << " vs " << want[size_t(w)];
      fail(c, st, os.str());
    }
    if (agree_ran) {
      ++st.agreement_checks;
      ++st.agreement[std::string(to_string(plan.backend)) + "/" + std::string(to_string(partner))];
      const emulation::Tolerance te = verify::tolerance_for(args, emu_plan, ref_scale);
      const emulation::Tolerance both{tol.atol + te.atol, tol.rtol + te.rtol};
      std::vector<float> emu(count);
      for (size_t i = 0; i < count; ++i) emu[i] = widen_one(r3.data(), i, c.out);
      const emulation::Comparison ac = emulation::compare(emu.data(), got.data(), int64_t(count), &both);
      if (!ac.within_tolerance())
        fail(c, st, std::string(to_string(plan.backend)) + "/" + std::string(to_string(partner)) +
                        " disagreement beyond " + both.to_string() + ": " + ac.to_string());
    }
  } else {
    const float fmax = fp8_output_max(c.out);
    const double step = c.out == DType::kE4M3 ? 0.125 : 0.25;
    const double minsub = c.out == DType::kE4M3 ? std::ldexp(1.0, -9) : std::ldexp(1.0, -16);
    int64_t bad = 0, bad_first = -1;
    double ref_amax = 0.0;
    bool ref_nan = false;
    for (size_t i = 0; i < count; ++i) {
      const float r = rf[i];
      const float vg = widen_one(r1.data(), i, c.out);
      bool ok;
      if (std::isnan(r)) {
        ref_nan = true;
        ok = std::isnan(vg);
      } else if (!std::isfinite(vg)) {
        ok = false;
      } else {
        ref_amax = std::max(ref_amax, double(std::fabs(r)));
        const double x = std::clamp(double(d_scale) * double(r), -double(fmax), double(fmax));
        const double lim = step * std::max(std::fabs(double(vg)), std::fabs(x)) +
                           double(d_scale) * (tol.atol + tol.rtol * std::fabs(double(r))) + minsub;
        ok = std::fabs(double(vg) - x) <= lim;
      }
      if (!ok) {
        if (bad_first < 0) bad_first = int64_t(i);
        ++bad;
      }
    }
    if (bad) {
      std::ostringstream os;
      os << "backend " << to_string(plan.backend) << " FP8 output: " << bad << " elements beyond one FP8 step + "
         << "d_scale x tolerance " << tol.to_string() << " (d_scale " << d_scale << "); first D[" << bad_first / c.n
         << ',' << bad_first % c.n << "] = " << widen_one(r1.data(), size_t(bad_first), c.out) << " vs d_scale x ref "
         << double(d_scale) * rf[size_t(bad_first)];
      fail(c, st, os.str());
    }
    if (c.amax && !ref_nan && !(std::fabs(double(amax1) - ref_amax) <= tol.atol + tol.rtol * ref_amax))
      fail(c, st, "amax " + std::to_string(amax1) + " vs reference " + std::to_string(ref_amax) + " (tolerance " +
                      tol.to_string() + ")");
  }
  return true;
}

bool Fuzzer::run_grouped(const GroupedConfig& c, Stats& st) {
  failed_now_ = false;
  const bool mg = c.dim == GroupDim::kM;
  const int64_t G = int64_t(c.sizes.size());
  int64_t total = 0;
  for (int64_t v : c.sizes) total += v;
  const int64_t M = mg ? total : c.m_or_k, K = mg ? c.m_or_k : total, N = c.n;
  // (--host with the CUTLASS kernel asked for: host memory, so the refusal path below is what runs.)
  auto g = std::mt19937_64(c.data_seed);
  int ea = 0, eb = 0;
  if (c.regime == Regime::kNearMax) {
    const int target = c.out == DType::kF16 ? 13 : 100;
    const int e_total = target - int(std::ceil(std::log2(double(K) * data_max(c.da) * data_max(c.db))));
    ea = e_total / 2;
    eb = e_total - ea;
  } else if (c.regime == Regime::kTiny) {
    ea = -int(uni(g, 10, 40));
    eb = -int(uni(g, 10, 40));
  }
  // Operands: m-grouped, each group's A rows and each expert's B quantized on their own (as a caller's
  // per-group quantizer does); k-grouped, A (M, sum K_g) and B (N, sum K_g) whole.
  std::vector<HostOp> as, bs;
  if (mg) {
    for (int64_t i = 0; i < G; ++i) {
      as.push_back(c.sizes[size_t(i)] ? make_op(c.ra, c.da, c.fa, c.sizes[size_t(i)], K, c.regime, ea, g) : HostOp{});
      bs.push_back(make_op(c.rb, c.db, c.fb, N, K, c.regime, eb, g));
    }
  } else {
    as.push_back(make_op(c.ra, c.da, c.fa, M, K, c.regime, ea, g));
    bs.push_back(make_op(c.rb, c.db, c.fb, N, K, c.regime, eb, g));
  }
  // NVFP4's global decode scale is one per operand: every group takes the first one's.
  auto share_gs = [](std::vector<HostOp>& ops) {
    float gs = 1.0f;
    for (const HostOp& o : ops)
      if (!o.data.empty()) {
        gs = o.gs;
        break;
      }
    for (HostOp& o : ops) o.gs = gs;
    return gs;
  };
  const float gsa = share_gs(as), gsb = share_gs(bs);
  // The buffers a caller passes: groups' data back to back; scale buffers in group order, each on a
  // 16-byte boundary in cublaslt format, an empty group's buffer empty.
  auto concat = [&](const std::vector<HostOp>& ops, Recipe r, ScaleFormat f, std::vector<uint8_t>& data,
                    std::vector<uint8_t>& scales) {
    for (const HostOp& o : ops) {
      data.insert(data.end(), o.data.begin(), o.data.end());
      if (f == ScaleFormat::kCublasLt) scales.resize(size_t(layouts::round_up(int64_t(scales.size()), 16)), 0);
      if (o.data.empty()) scales.resize(scales.size() + size_t(layouts::ScaleLayout(r, 0, K, f).bytes()), 0);
      else scales.insert(scales.end(), o.scales.begin(), o.scales.end());
    }
  };
  std::vector<uint8_t> a_data, a_scales, b_data, b_scales;
  concat(as, c.ra, c.fa, a_data, a_scales);
  concat(bs, c.rb, c.fb, b_data, b_scales);

  // The float64 reference of each group from the dequantized operands, and a bound on
  // sum_k |A_ik B_jk| per group (non-finite entries left out) for its tolerance.
  const size_t count = size_t(mg ? M * N : G * M * N);
  std::vector<double> ref(count, 0.0), bound(size_t(G), 0.0);
  {
    std::vector<float> fa_all, fb_all;
    if (!mg) fa_all = dequant(as[0]), fb_all = dequant(bs[0]);
    int64_t start = 0;
    for (int64_t gi = 0; gi < G; ++gi) {
      const int64_t sz = c.sizes[size_t(gi)];
      if (sz == 0) continue;
      std::vector<float> fa_g, fb_g;
      if (mg) fa_g = dequant(as[size_t(gi)]), fb_g = dequant(bs[size_t(gi)]);
      const float* fa = mg ? fa_g.data() : fa_all.data();
      const float* fb = mg ? fb_g.data() : fb_all.data();
      const int64_t k0 = mg ? 0 : start, kn = mg ? K : sz, rows = mg ? sz : M;
      std::vector<double> ca(size_t(kn), 0.0), cb(size_t(kn), 0.0);
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t kk = 0; kk < kn; ++kk) {
          const float v = std::fabs(fa[size_t(i * K + k0 + kk)]);
          if (std::isfinite(v)) ca[size_t(kk)] = std::max(ca[size_t(kk)], double(v));
        }
      for (int64_t j = 0; j < N; ++j)
        for (int64_t kk = 0; kk < kn; ++kk) {
          const float v = std::fabs(fb[size_t(j * K + k0 + kk)]);
          if (std::isfinite(v)) cb[size_t(kk)] = std::max(cb[size_t(kk)], double(v));
        }
      for (int64_t kk = 0; kk < kn; ++kk) bound[size_t(gi)] += ca[size_t(kk)] * cb[size_t(kk)];
      double* out = ref.data() + (mg ? start * N : gi * M * N);
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double acc = 0.0;
          const float* ai = fa + i * K + k0;
          const float* bj = fb + j * K + k0;
          for (int64_t kk = 0; kk < kn; ++kk) acc += double(ai[kk]) * double(bj[kk]);
          out[i * N + j] = acc;
        }
      start += sz;
    }
  }
  float alpha = c.alpha;
  const double bmax = *std::max_element(bound.begin(), bound.end());
  while (bmax * std::fabs(alpha) > (c.out == DType::kF16 ? 16384.0 : 1e36)) alpha *= 0.5f;

  const cudaStream_t s = stream_;
  auto up = [&](Buf& buf, const void* host, size_t bytes) { return upload(buf, host, bytes); };
  GroupedGemmArgs ga;
  ga.group_dim = c.dim;
  ga.groups = G;
  ga.group_sizes = c.sizes.data();
  ga.m = M, ga.n = N, ga.k = K;
  ga.a.data = up(da_, a_data.data(), a_data.size());
  ga.a.dtype = c.da, ga.a.recipe = c.ra, ga.a.scale_format = c.fa, ga.a.global_scale = gsa;
  ga.a.scale = up(sa_, a_scales.data(), a_scales.size());
  ga.b.data = up(db_, b_data.data(), b_data.size());
  ga.b.dtype = c.db, ga.b.recipe = c.rb, ga.b.scale_format = c.fb, ga.b.global_scale = gsb;
  ga.b.scale = up(sb_, b_scales.data(), b_scales.size());
  ga.d_dtype = c.out;
  static const double perturb = std::getenv("SCALEMM_FUZZ_PERTURB") ? std::atof(std::getenv("SCALEMM_FUZZ_PERTURB")) : 0.0;
  ga.alpha = float(double(alpha) * (1.0 + perturb));
  ga.space = g_host ? MemorySpace::kHost : MemorySpace::kDevice;
  ga.backend = c.backend;
  int32_t* status = nullptr;
  if (c.device_sizes) {
    std::vector<int32_t> s32(c.sizes.begin(), c.sizes.end());
    ga.group_sizes = nullptr;
    ga.group_sizes_int64 = c.device_sizes == 2;
    ga.group_sizes_device = c.device_sizes == 2 ? up(sizes_, c.sizes.data(), c.sizes.size() * 8)
                                                : up(sizes_, s32.data(), s32.size() * 4);
    status = static_cast<int32_t*>(scal_.need(8));
    ga.device_status = status;
    if (!g_host) FUZZ_CUDA(cudaStreamSynchronize(s));  // s32 leaves scope: its upload must be done
  }
  const size_t out_bytes = count * elem_bytes(c.out);
  void* d1 = d1_.need(out_bytes);
  void* d2 = d2_.need(out_bytes);
  ga.d = d1;
  std::string how;
  try {
    how = auto_->explain(ga);
  } catch (const Error& e) {
    // A forced grouped backend that cannot run the call: explain() gives the call's own refusal,
    // and the call itself must refuse the same way, writing nothing.
    if (e.code() == StatusCode::kUnsupported && c.backend != GroupedBackend::kAuto) {
      fill_async(d1, 0xFF, out_bytes, s);
      try {
        auto_->grouped_gemm(ga, reinterpret_cast<Stream>(s));
        fail(c, st, std::string("explain() refused a forced backend but grouped_gemm() ran: ") + e.what());
        return true;
      } catch (const Error& e2) {
        if (e2.code() != StatusCode::kUnsupported) {
          fail(c, st, std::string("explain() refused with UNSUPPORTED, grouped_gemm() with another status: ") + e2.what());
          return true;
        }
      }
      sync_or_exit(c);
      std::vector<uint8_t> r(out_bytes);
      copy_async(r.data(), d1, out_bytes, cudaMemcpyDeviceToHost, s);
      if (!g_host) FUZZ_CUDA(cudaStreamSynchronize(s));
      if (std::any_of(r.begin(), r.end(), [](uint8_t v) { return v != 0xFF; })) {
        fail(c, st, "a refused grouped call wrote to D");
        return true;
      }
      ++st.skipped["forced grouped backend cannot run the call (refused)"];
      return false;
    }
    fail(c, st, std::string("explain() threw on valid input: ") + e.what());
    return true;
  }
  // A one-launch kernel ran (CUTLASS's or the contiguous one): it is compared with the per-group backend.
  const char* kernel = how.find("CUTLASS grouped backend") != std::string::npos      ? "cutlass"
                       : how.find("contiguous grouped backend") != std::string::npos ? "contiguous"
                                                                                      : nullptr;
  if (verbose_) std::printf("plan: %s\n", how.c_str());

  auto call = [&](GroupedGemmArgs x, void* d) -> bool {
    fill_async(d, 0xFF, out_bytes, s);
    if (x.device_status) fill_async(x.device_status, 0x7F, 4, s);
    x.d = d;
    try {
      auto_->grouped_gemm(x, reinterpret_cast<Stream>(s));
    } catch (const Error& e) {
      fail(c, st, std::string("grouped_gemm() threw on valid input: ") + e.what());
      return false;
    }
    return true;
  };
  int32_t status1 = 0;
  if (!call(ga, d1)) return true;
  if (status) copy_async(&status1, status, 4, cudaMemcpyDeviceToHost, s);
  if (!call(ga, d2)) return true;
  void* d3 = nullptr;
  if (kernel) {  // the same inputs on the per-group backend (cuBLASLt or the dense plans)
    GroupedGemmArgs x = ga;
    x.backend = GroupedBackend::kPerGroup;
    d3 = d3_.need(out_bytes);
    if (!call(x, d3)) return true;
  }
  sync_or_exit(c);
  std::vector<uint8_t> r1(out_bytes), r2(out_bytes), r3(d3 ? out_bytes : 0);
  copy_async(r1.data(), d1, out_bytes, cudaMemcpyDeviceToHost, s);
  copy_async(r2.data(), d2, out_bytes, cudaMemcpyDeviceToHost, s);
  if (d3) copy_async(r3.data(), d3, out_bytes, cudaMemcpyDeviceToHost, s);
  if (!g_host) FUZZ_CUDA(cudaStreamSynchronize(s));

  ++st.by_regime[int(c.regime)];
  ++st.by_out[std::string(to_string(c.out))];
  ++st.grouped_paths[std::string(kernel ? kernel : "per-group") + (mg ? " m" : " k") +
                     (c.device_sizes ? " device-sizes" : "")];
  if (status && status1 != 0) fail(c, st, "device_status " + std::to_string(status1) + " after valid device-side sizes");
  ++st.determinism_checks;
  int64_t first = -1;
  if (!emulation::bitwise_equal(r1.data(), r2.data(), out_bytes, &first))
    fail(c, st, "two identical grouped calls differ (first differing byte " + std::to_string(first) + ")");

  // Each group against the reference, within the tolerance of what ran it: the CUTLASS kernel (the
  // native tier's) or the dense plan of that group on the per-group backend.
  ++st.tolerance_checks;
  if (d3) ++st.agreement_checks, ++st.agreement["cutlass/per-group"];
  int64_t start = 0;
  for (int64_t gi = 0; gi < G; ++gi) {
    const int64_t sz = c.sizes[size_t(gi)];
    const size_t lo = size_t(mg ? start * N : gi * M * N), hi = size_t(mg ? (start + sz) * N : (gi + 1) * M * N);
    start += sz;
    if (lo == hi) continue;
    if (sz == 0) {  // an empty k-group: D[g] is zero
      for (size_t i = lo; i < hi; ++i)
        if (widen_one(r1.data(), i, c.out) != 0.0f) {
          fail(c, st, "empty group " + std::to_string(gi) + ": D[g] is not zero at element " + std::to_string(i - lo));
          break;
        }
      continue;
    }
    GemmArgs probe;
    probe.m = mg ? sz : M, probe.n = N, probe.k = mg ? K : sz;
    probe.a.dtype = c.da, probe.a.recipe = c.ra, probe.a.scale_format = c.fa;
    probe.b.dtype = c.db, probe.b.recipe = c.rb, probe.b.scale_format = c.fb;
    probe.d_dtype = c.out;
    probe.space = ga.space;
    Plan plan;
    plan.backend = Backend::kNative;
    if (!kernel) {
      try {
        plan = auto_->plan(probe);
      } catch (const Error& e) {
        fail(c, st, "group " + std::to_string(gi) + ": plan() of its dense call threw " + e.what());
        continue;
      }
    }
    const double ref_scale = std::fabs(alpha) * bound[size_t(gi)];
    const emulation::Tolerance tol = verify::tolerance_for(probe, plan, ref_scale);
    const size_t n = hi - lo;
    std::vector<float> want(n), got(n);
    for (size_t i = 0; i < n; ++i) {
      want[i] = round_to(float(double(alpha) * ref[lo + i]), c.out);
      got[i] = widen_one(r1.data(), lo + i, c.out);
    }
    for (float v : want) st.nonfinite_outputs += !std::isfinite(v);
    const emulation::Comparison cmp = emulation::compare(want.data(), got.data(), int64_t(n), &tol);
    if (!cmp.within_tolerance()) {
      const int64_t w = cmp.nonfinite_mismatches ? -1 : cmp.first_violation;
      std::ostringstream os;
      os << "group " << gi << " (" << (kernel ? std::string(kernel) + " kernel" : std::string(to_string(plan.backend))) << ") vs reference: "
         << cmp.violations << " outside tolerance " << tol.to_string() << ", " << cmp.nonfinite_mismatches
         << " NaN/Inf mismatches (ref nan " << cmp.nan_ref << " inf " << cmp.inf_ref << ", got nan " << cmp.nan_test
         << " inf " << cmp.inf_test << ")";
      if (w >= 0) os << "; first at element " << w << " of the group: " << got[size_t(w)] << " vs " << want[size_t(w)];
      fail(c, st, os.str());
    }
    if (d3) {
      std::vector<float> other(n);
      for (size_t i = 0; i < n; ++i) other[i] = widen_one(r3.data(), lo + i, c.out);
      Plan dense;
      try {
        dense = auto_->plan(probe);
      } catch (const Error& e) {
        fail(c, st, "group " + std::to_string(gi) + ": plan() of its dense call threw " + e.what());
        continue;
      }
      const emulation::Tolerance td = verify::tolerance_for(probe, dense, ref_scale);
      const emulation::Tolerance both{tol.atol + td.atol, tol.rtol + td.rtol};
      const emulation::Comparison ac = emulation::compare(other.data(), got.data(), int64_t(n), &both);
      if (!ac.within_tolerance())
        fail(c, st, "group " + std::to_string(gi) + ": CUTLASS kernel and per-group backend disagree beyond " +
                        both.to_string() + ": " + ac.to_string());
    }
  }
  return true;
}

void usage() {
  std::printf("usage: scalemm_fuzz [--configs N] [--seed S] [--only ID] [--max-seconds T] [--verbose] [--host] [--grouped]\n"
              "  --configs N  configurations to run (default 6000; skipped draws do not count)\n"
              "  --seed S     seed of the run (default 1)\n"
              "  --only ID    run configuration ID of seed S only (the reproduction of a failure)\n"
              "  --max-seconds T  stop drawing after T seconds (the summary says so; exit status 1)\n"
              "  --plan-sm SM     draw N configurations and only plan them for a simulated sm_SM: the backends\n"
              "                   they would reach there (no GPU needed)\n"
              "  --host       host memory: the host reference backend against emulation::gemm_host\n"
              "  --grouped    grouped calls (Handle::grouped_gemm) against a float64 reference per group\n");
}

}  // namespace

int main(int argc, char** argv) {
  int64_t configs = 6000;
  uint64_t seed = 1;
  int64_t only = -1;
  double max_seconds = 0.0;
  int plan_sm = 0;
  bool verbose = false, grouped = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        usage();
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--configs") configs = std::strtoll(value(), nullptr, 0);
    else if (a == "--seed") seed = std::strtoull(value(), nullptr, 0);
    else if (a == "--only") only = std::strtoll(value(), nullptr, 0);
    else if (a == "--verbose") verbose = true;
    else if (a == "--host") g_host = true;
    else if (a == "--grouped") grouped = true;
    else if (a == "--max-seconds") max_seconds = std::strtod(value(), nullptr);
    else if (a == "--plan-sm") plan_sm = int(std::strtol(value(), nullptr, 0));
    else {
      usage();
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  if (plan_sm > 0) {
    // The draws and the planner only, on a simulated device (cuBLASLt 13.1): which backends the first
    // N configurations that run would reach there. No operand is made and nothing runs.
    const DeviceTarget target = DeviceTarget::simulated(plan_sm, 130100);
    std::map<std::string, int64_t> count;
    int64_t run = 0, drawn = 0;
    for (uint64_t id = 0; run < configs && drawn < 20 * configs; ++id, ++drawn) {
      const Config c = draw(seed, id);
      GemmProblem p;
      p.m = c.m, p.n = c.n, p.k = c.k;
      p.a_dtype = c.da, p.b_dtype = c.db, p.a_recipe = c.ra, p.b_recipe = c.rb, p.a_format = c.fa, p.b_format = c.fb;
      p.d_dtype = c.out, p.has_bias = c.bias, p.has_amax = c.amax;
      PlanOptions o;
      if (c.backend >= 0) o.force = Backend(c.backend);
      try {
        ++count[std::string(to_string(plan(p, target, o).backend))];
        ++run;
      } catch (const Error&) {
        ++count["skipped: forced " + std::string(to_string(Backend(c.backend)))];
      }
    }
    std::printf("planner on simulated sm_%d, seed %" PRIu64 ", %" PRId64 " configurations that run:\n", plan_sm, seed,
                run);
    for (auto& kv : count) std::printf("  %-32s %" PRId64 "\n", kv.first.c_str(), kv.second);
    return 0;
  }
  int ndev = 0;
  cudaDeviceProp prop{};
  if (g_host) {
    std::snprintf(prop.name, sizeof(prop.name), "the host (--host: host reference backend only)");
  } else {
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
      std::printf("scalemm_fuzz: no CUDA device (--host runs the host reference backend only)\n");
      return 77;
    }
    FUZZ_CUDA(cudaGetDeviceProperties(&prop, 0));
  }
  const auto t0 = std::chrono::steady_clock::now();
  Fuzzer fz(seed, verbose || only >= 0);
  Stats st;
  if (only >= 0 && grouped) {
    const GroupedConfig c = draw_grouped(seed, uint64_t(only));
    std::printf("grouped config %" PRId64 ": %s\n", only, c.describe().c_str());
    const bool ran = fz.run_grouped(c, st);
    std::printf("%s\n", !ran ? "skipped" : st.failed ? "FAILED" : "passed");
    for (auto& kv : st.skipped) std::printf("  skipped: %s\n", kv.first.c_str());
    return st.failed ? 1 : 0;
  }
  if (only >= 0) {
    const Config c = draw(seed, uint64_t(only));
    std::printf("config %" PRId64 ": %s\n", only, c.describe().c_str());
    const bool ran = fz.run(c, st);
    std::printf("%s\n", !ran ? "skipped" : st.failed ? "FAILED" : "passed");
    for (auto& kv : st.skipped) std::printf("  skipped: %s\n", kv.first.c_str());
    return st.failed ? 1 : 0;
  }
  uint64_t id = 0;
  bool out_of_time = false;
  while (st.run < configs && st.drawn < 20 * configs) {
    if (max_seconds > 0.0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > max_seconds) {
      out_of_time = true;
      break;
    }
    ++st.drawn;
    if (grouped ? fz.run_grouped(draw_grouped(seed, id++), st) : fz.run(draw(seed, id++), st)) ++st.run;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t skipped = 0;
  for (auto& kv : st.skipped)
    if (kv.first.rfind("forced", 0) == 0) skipped += kv.second;
  if (grouped) {
    std::printf("grouped paths that ran:");
    for (auto& kv : st.grouped_paths) std::printf(" %s %" PRId64 ";", kv.first.c_str(), kv.second);
    std::printf("\n");
  } else {
    std::printf("backends that ran:");
    for (int b = 0; b < kBackendCount; ++b)
      std::printf(" %s %" PRId64, std::string(to_string(Backend(b))).c_str(), st.by_backend[b]);
    std::printf("\n");
  }
  std::printf("regimes:");
  for (int r = 0; r < kRegimeCount; ++r) std::printf(" %s %" PRId64, regime_name(Regime(r)), st.by_regime[r]);
  std::printf("\noutputs:");
  for (auto& kv : st.by_out) std::printf(" %s %" PRId64, kv.first.c_str(), kv.second);
  std::printf("\nagreement between backends:");
  for (auto& kv : st.agreement) std::printf(" %s %" PRId64, kv.first.c_str(), kv.second);
  std::printf("\nchecks: tolerance+NaN/Inf %" PRId64 ", determinism %" PRId64 ", agreement between backends %" PRId64
              ", reference NaN/Inf outputs %" PRId64 "\n",
              st.tolerance_checks, st.determinism_checks, st.agreement_checks, st.nonfinite_outputs);
  for (auto& kv : st.skipped) std::printf("skipped: %" PRId64 " x %s\n", kv.second, kv.first.c_str());
  std::printf("scalemm_fuzz%s: seed %" PRIu64 ", %" PRId64 " configurations run, %" PRId64 " skipped, %" PRId64
              " failed, %.1f s on %s\n",
              grouped ? " --grouped" : "", seed, st.run, skipped, st.failed, secs, prop.name);
  if (st.run < configs) {
    std::printf("scalemm_fuzz: only %" PRId64 " of %" PRId64 " configurations ran (%s)\n", st.run, configs,
                out_of_time ? "stopped at --max-seconds" : "the other draws were skipped");
    return 1;
  }
  return st.failed ? 1 : 0;
}
