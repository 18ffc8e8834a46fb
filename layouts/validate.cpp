#include "scalemm/layouts/validate.hpp"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <utility>

namespace scalemm::layouts {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

std::string pair_str(int64_t a, int64_t b) { return '(' + str(a) + ", " + str(b) + ')'; }

Diagnostic make(std::string_view arg, const char* rule, std::string message, std::string expected,
                std::string actual, std::string fix) {
  return Diagnostic{std::string(arg), rule, std::move(message), std::move(expected), std::move(actual),
                    std::move(fix)};
}

std::string fix_for(const ScaleLayout& l) {
  return l.format == ScaleFormat::kCublasLt ? "Convert with layouts::to_cublaslt."
                                            : "Convert with layouts::to_compact.";
}

std::string what(const ScaleLayout& l) {
  return std::string(to_string(l.recipe)) + " in " + std::string(to_string(l.format)) + " format";
}

bool is_tiled_buffer(const ScaleLayout& l) {
  return l.format == ScaleFormat::kCublasLt && recipe_is_tiled(l.recipe);
}

// Strides of the stored-row and K-block axes, read off offset(). 0 = that axis has extent 1.
struct AxisStrides {
  int64_t row = 0;
  int64_t kb = 0;
};
AxisStrides strides_of(const ScaleLayout& l) {
  AxisStrides s;
  const int64_t o = l.padded_offset(0, 0);
  if (l.padded_rows() > 1) s.row = l.padded_offset(1, 0) - o;
  if (l.padded_kblocks() > 1) s.kb = l.padded_offset(0, 1) - o;
  return s;
}

// One reading of a rank-2 view: which view axis is the stored-row axis.
struct Reading {
  bool row_first;
  int64_t row_extent, kb_extent, row_stride, kb_stride;
};

bool extent_ok(int64_t e, int64_t real, int64_t padded) { return e == real || e == padded; }

// Largest element index a strided view reaches, plus one.
int64_t view_span(const TensorRef& t) {
  int64_t hi = 0;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] == 0) return 0;
    hi += (t.shape[i] - 1) * t.strides[i];
  }
  return hi + 1;
}

void check_structure(const TensorRef& t, const ScaleLayout& l, std::string_view arg, Diagnostics& out) {
  const int64_t size = l.size();
  // Built only when a diagnostic needs it: validate() runs on every GEMM call.
  const auto name = [&l] { return what(l); };
  const bool tiled = is_tiled_buffer(l);
  if (t.rank == 0) {
    if (size != 1)
      out.push_back(make(arg, rules::kShape, name() + " is a buffer of " + str(size) + " elements, not a scalar",
                         "rank 1 or 2", "rank 0", fix_for(l)));
    return;
  }
  if (t.rank == 1) {
    if (t.shape[0] > 1 && t.strides[0] != 1) {
      out.push_back(make(arg, rules::kStrides, name() + " as a flat buffer must be contiguous", "stride 1",
                         "stride " + str(t.strides[0]), "Pass a contiguous buffer."));
      return;
    }
    if (t.shape[0] == size) return;
    const ScaleLayout compact = l.with_format(ScaleFormat::kCompact);
    if (l.format == ScaleFormat::kCublasLt && l.recipe == Recipe::kBlock128x128 && t.shape[0] == compact.size()) {
      out.push_back(make(arg, rules::kBlk128KBlockStride,
                         name() + " needs its K-block stride padded to a multiple of 4 (K=" + str(l.k) + " -> " +
                             str(l.kblocks()) + " K-blocks -> " + str(l.padded_kblocks()) + ")",
                         str(size) + " elements", str(t.shape[0]), fix_for(l)));
      return;
    }
    std::string msg = name() + " (" + l.shape_stride_string() + ") holds " + str(size) + " elements";
    if (tiled && t.shape[0] == compact.size())
      msg += "; this looks like the compact grid: cuBLASLt needs full 128x4 tiles, zero-filled";
    out.push_back(make(arg, rules::kElementCount, msg, str(size), str(t.shape[0]), fix_for(l)));
    return;
  }
  if (t.rank != 2) {
    out.push_back(make(arg, rules::kShape, name() + " is a rank-1 or rank-2 tensor", "rank 1 or 2",
                       "rank " + str(t.rank) + " " + t.shape_string(), "Reshape the scale tensor."));
    return;
  }
  if (tiled) {
    const bool full = t.shape[0] == l.padded_rows() && t.shape[1] == l.padded_kblocks();
    if (full && t.is_contiguous()) return;
    if (full) {
      out.push_back(make(arg, rules::kStrides, name() + " (128x4 tiles) must be contiguous",
                         "strides (" + str(l.padded_kblocks()) + ", 1)",
                         "strides (" + str(t.strides[0]) + ", " + str(t.strides[1]) + ")", "Pass a contiguous buffer."));
      return;
    }
    std::string msg = name() + " needs full 128x4 tiles: rows rounded up to 128 and scale columns to 4";
    if (t.shape[0] == l.real_rows() && t.shape[1] == l.kblocks())
      msg += "; this is the shape of the compact grid";
    out.push_back(make(arg, rules::kShape, msg, pair_str(l.padded_rows(), l.padded_kblocks()), t.shape_string(),
                       fix_for(l)));
    return;
  }

  const AxisStrides want = strides_of(l);
  Reading readings[2];
  int n = 0;
  for (bool row_first : {true, false}) {
    const int64_t re = row_first ? t.shape[0] : t.shape[1];
    const int64_t ke = row_first ? t.shape[1] : t.shape[0];
    if (!extent_ok(re, l.real_rows(), l.padded_rows()) || !extent_ok(ke, l.kblocks(), l.padded_kblocks()))
      continue;
    readings[n++] = Reading{row_first, re, ke, row_first ? t.strides[0] : t.strides[1],
                            row_first ? t.strides[1] : t.strides[0]};
  }
  if (n == 0) {
    std::string expected = pair_str(l.real_rows(), l.kblocks());
    if (l.padded_rows() != l.real_rows() || l.padded_kblocks() != l.kblocks())
      expected += " or " + pair_str(l.padded_rows(), l.padded_kblocks());
    expected += " (stored rows x K-blocks, or its transpose)";
    out.push_back(make(arg, rules::kShape, name() + " is a grid of stored rows x K-blocks", expected, t.shape_string(),
                       fix_for(l)));
    return;
  }
  auto matches = [&](const Reading& r) {
    return (r.row_extent <= 1 || want.row == 0 || r.row_stride == want.row) &&
           (r.kb_extent <= 1 || want.kb == 0 || r.kb_stride == want.kb);
  };
  for (int i = 0; i < n; ++i)
    if (matches(readings[i])) return;

  const Reading& r = readings[0];
  const std::string got = "strides (" + str(t.strides[0]) + ", " + str(t.strides[1]) + ") for shape " + t.shape_string();
  const std::string expected_axes =
      "row stride " + str(want.row) + ", K-block stride " + str(want.kb);
  const std::string got_axes = "row stride " + str(r.row_stride) + ", K-block stride " + str(r.kb_stride);
  if (r.kb_stride == 1 && want.kb != 1 && want.row == 1) {
    const bool vec = l.recipe == Recipe::kBlock1x128;
    out.push_back(make(arg, vec ? rules::kVec128KMajor : rules::kMajorOrder,
                       name() + (vec ? " (VEC128_32F) is outer-major: scales of consecutive rows are adjacent, "
                                     "K-blocks " + str(want.kb) + " apart; this tensor is K-major (row-major (R, L), "
                                     "as a per-token-group quantizer writes it)"
                                   : " is outer-major; this tensor is K-major"),
                       expected_axes, got_axes, fix_for(l)));
    return;
  }
  if (r.row_stride == 1 && want.row != 1 && want.kb == 1) {
    const bool blk = l.recipe == Recipe::kBlock128x128;
    out.push_back(make(arg, blk ? rules::kBlk128MMajor : rules::kMajorOrder,
                       name() + (blk ? " (BLK128x128_32F) is K-major: the K-blocks of one 128-row block are adjacent; "
                                     "this tensor is M/N-major"
                                   : " is K-major; this tensor is outer-major"),
                       expected_axes, got_axes, fix_for(l)));
    return;
  }
  if (l.recipe == Recipe::kBlock128x128 && l.format == ScaleFormat::kCublasLt && r.kb_stride == 1 &&
      r.row_stride == l.kblocks() && want.row != r.row_stride) {
    out.push_back(make(arg, rules::kBlk128KBlockStride,
                       name() + " needs its K-block stride padded to a multiple of 4 (K=" + str(l.k) + " -> " +
                           str(l.kblocks()) + " K-blocks -> " + str(l.padded_kblocks()) + ")",
                       str(want.row), str(r.row_stride), fix_for(l)));
    return;
  }
  out.push_back(make(arg, rules::kStrides, name() + " (" + l.shape_stride_string() + ") has fixed strides",
                     expected_axes, got_axes + " (" + got + ")", fix_for(l)));
}

uint32_t load_bits(const void* p, int64_t i, int bytes) {
  if (bytes == 4) {
    uint32_t v;
    std::memcpy(&v, static_cast<const unsigned char*>(p) + i * 4, 4);
    return v;
  }
  return static_cast<const unsigned char*>(p)[i];
}

ContentReport check_content_limited(const ScaleLayout& l, const void* scales, int64_t limit) {
  ContentReport rep = ContentReport::empty();
  const DType dt = l.scale_dtype();
  const int eb = l.scale_bytes();
  const bool replicated = l.format == ScaleFormat::kCublasLt && l.recipe == Recipe::kMxfp8_32x32;
  // An empty buffer (K = 0 or rows = 0) has nothing to check: do not walk its 2^31 empty rows.
  if (l.size() == 0 || limit <= 0) return rep;
  auto hit = [&](int rule, int64_t o) {
    rep.count[rule]++;
    if (uint64_t(o) < rep.first_offset[rule]) rep.first_offset[rule] = uint64_t(o);
    rep.any = 1;
  };
  for (int64_t p = 0; p < l.padded_rows(); ++p) {
    for (int64_t kb = 0; kb < l.padded_kblocks(); ++kb) {
      const int64_t o = l.padded_offset(p, kb);
      if (o >= limit) continue;
      const uint32_t v = load_bits(scales, o, eb);
      if (!l.is_real(p, kb)) {
        if (v != 0) hit(int(ContentRule::kPaddingNonzero), o);
        continue;
      }
      const int rule = content_violation(dt, v);
      if (rule >= 0) hit(rule, o);
      if (replicated && p % 32 != 0) {
        const int64_t o0 = l.padded_offset(p - p % 32, kb);
        if (o0 < limit && load_bits(scales, o0, eb) != v) hit(int(ContentRule::kReplicaMismatch), o);
      }
    }
  }
  return rep;
}

// (stored row, K-block) of a buffer index, by walking the padded grid (diagnostics only).
std::pair<int64_t, int64_t> locate(const ScaleLayout& l, int64_t o) {
  for (int64_t p = 0; p < l.padded_rows(); ++p)
    for (int64_t kb = 0; kb < l.padded_kblocks(); ++kb)
      if (l.padded_offset(p, kb) == o) return {p, kb};
  return {-1, -1};
}

}  // namespace

const char* content_rule_id(ContentRule r) {
  switch (r) {
    case ContentRule::kPaddingNonzero: return rules::kPaddingNonzero;
    case ContentRule::kE8M0Nan: return rules::kE8M0Nan;
    case ContentRule::kUE4M3Nan: return rules::kUE4M3Nan;
    case ContentRule::kF32NonPositive: return rules::kF32NonPositive;
    case ContentRule::kF32NonFinite: return rules::kF32NonFinite;
    case ContentRule::kReplicaMismatch: return rules::kReplicaMismatch;
  }
  return "unknown";
}

ContentReport check_content(const ScaleLayout& layout, const void* scales) {
  return check_content_limited(layout, scales, layout.size());
}

Diagnostics content_diagnostics(const ScaleLayout& l, const ContentReport& rep, std::string_view arg) {
  Diagnostics out;
  const std::string name = what(l);
  for (int i = 0; i < kContentRuleCount; ++i) {
    if (rep.count[i] == 0) continue;
    const auto rule = ContentRule(i);
    std::string where = "first at buffer index " + std::to_string(rep.first_offset[i]);
    if (rep.first_offset[i] != ~0ull) {
      const auto pk = locate(l, int64_t(rep.first_offset[i]));
      if (pk.first >= 0)
        where += " (data row " + str(pk.first * l.row_step()) + ", K-block " + str(pk.second) + ")";
    }
    std::string msg, fix;
    switch (rule) {
      case ContentRule::kPaddingNonzero:
        msg = name + ": " + std::to_string(rep.count[i]) + " padding element(s) are not zero; " + where;
        fix = "Fill padding with zeros (layouts::to_cublaslt writes zero padding).";
        break;
      case ContentRule::kE8M0Nan:
        msg = name + ": " + std::to_string(rep.count[i]) + " E8M0 scale(s) are 0xFF (NaN); " + where;
        fix = "Requantize: a NaN scale turns its whole block into NaN.";
        break;
      case ContentRule::kUE4M3Nan:
        msg = name + ": " + std::to_string(rep.count[i]) + " UE4M3 scale(s) are NaN (0x7F); " + where;
        fix = "Requantize: a NaN scale turns its whole block into NaN.";
        break;
      case ContentRule::kF32NonPositive:
        msg = name + ": " + std::to_string(rep.count[i]) + " fp32 scale(s) are zero or negative; " + where;
        fix = "Scales must be positive: clamp amax away from zero when quantizing.";
        break;
      case ContentRule::kF32NonFinite:
        msg = name + ": " + std::to_string(rep.count[i]) + " fp32 scale(s) are NaN or Inf; " + where;
        fix = "Requantize the operand; check for Inf/NaN in the data.";
        break;
      case ContentRule::kReplicaMismatch:
        msg = name + ": " + std::to_string(rep.count[i]) +
              " scale(s) differ from the first row of their 32-row block (a 32x32 scale replicated to rows); " + where;
        fix = "Build the buffer with layouts::to_cublaslt from the compact 32x32 grid.";
        break;
    }
    out.push_back(make(arg, content_rule_id(rule), msg, "0", std::to_string(rep.count[i]), fix));
  }
  return out;
}

Diagnostics validate_scale(const TensorRef& t, const ScaleLayout& l, std::string_view arg,
                           const ValidateOptions& opt) {
  Diagnostics out;
  // Built only when a diagnostic needs it: validate() runs on every GEMM call.
  const auto name = [&l] { return what(l); };
  const DType want = l.scale_dtype();
  const bool dtype_ok = t.dtype == want || (l.scale_bytes() == 1 && t.dtype == DType::kU8);
  if (!dtype_ok)
    out.push_back(make(arg, rules::kDType, name() + " holds " + std::string(to_string(want)) + " scales",
                       std::string(to_string(want)), std::string(to_string(t.dtype)),
                       want == DType::kF32 ? "Pass float32 scales." : "Pass the raw scale bytes as " +
                                                                          std::string(to_string(want)) + " or u8."));
  const size_t before = out.size();
  check_structure(t, l, arg, out);
  const bool structure_ok = out.size() == before && dtype_ok;

  if (t.data == nullptr && l.size() > 0) {
    out.push_back(make(arg, rules::kNull, name() + " needs a buffer", "non-null pointer", "null", "Pass the scale buffer."));
    return out;
  }
  const bool need_align = opt.require_alignment.value_or(l.format == ScaleFormat::kCublasLt);
  const auto addr = reinterpret_cast<uintptr_t>(t.data);
  if (need_align && addr % 16 != 0) {
    std::ostringstream got;
    got << "address 0x" << std::hex << addr << " (" << std::dec << (addr % 16) << " mod 16)";
    out.push_back(make(arg, rules::kAlignment,
                       name() + " must start at a 16-byte aligned address (cuBLASLt accepts the heuristic "
                              "but fails at matmul otherwise)",
                       "0 mod 16", got.str(), "Allocate scales with cudaMalloc or copy them to an aligned buffer."));
  }
  if (opt.required_space && t.space != *opt.required_space)
    out.push_back(make(arg, rules::kMemorySpace, name() + " must be in " + std::string(to_string(*opt.required_space)) + " memory",
                       std::string(to_string(*opt.required_space)), std::string(to_string(t.space)),
                       t.space == MemorySpace::kHost ? "Copy the scales to the device." : "Copy the scales to the host."));

  if (opt.check_content && structure_ok && t.space == MemorySpace::kHost && t.data != nullptr) {
    const int64_t limit = t.rank == 0 ? 1 : std::min<int64_t>(view_span(t), l.size());
    const Diagnostics c = content_diagnostics(l, check_content_limited(l, t.data, limit), arg);
    out.insert(out.end(), c.begin(), c.end());
  }
  return out;
}

namespace {
bool is_fp8(Recipe r) { return r != Recipe::kNvfp4; }
// "Pad k with zero columns to 48." — the next multiple of `m`, or its name alone where v is so close
// to INT64_MAX that round_up would overflow.
std::string padded_to(int64_t v, int64_t m) {
  return v > INT64_MAX - m ? "a multiple of " + str(m) : str(round_up(v, m));
}
bool is_mx(Recipe r) { return r == Recipe::kMxfp8 || r == Recipe::kMxfp8_32x32; }
bool pair_supported(Recipe a, Recipe b) {
  if (is_mx(a) && is_mx(b)) return true;
  if (a == Recipe::kBlock1x128) return b == Recipe::kBlock1x128 || b == Recipe::kBlock128x128;
  if (a == Recipe::kBlock128x128) return b == Recipe::kBlock1x128;
  return a == b;
}
}  // namespace

Diagnostics validate_gemm(Recipe ra, Recipe rb, int64_t m, int64_t n, int64_t k) {
  Diagnostics out;
  for (auto [name, v] : {std::pair<const char*, int64_t>{"m", m}, {"n", n}, {"k", k}})
    if (v <= 0)
      out.push_back(make(name, rules::kDims, "GEMM dimensions must be positive", "> 0", str(v), ""));
  if (ra == Recipe::kBlock128x128 && rb == Recipe::kBlock128x128)
    out.push_back(make("scale_b", rules::kBlk128Both,
                       "cuBLASLt has no BLK128x128 x BLK128x128 mode: one operand must use block1x128",
                       "block1x128 for one operand", "block128x128 for both",
                       "Quantize the activation operand with 1x128 blocks."));
  else if (!pair_supported(ra, rb))
    out.push_back(make("scale_b", rules::kRecipePair,
                       "cuBLASLt has no mode scaling A with " + std::string(to_string(ra)) + " and B with " +
                           std::string(to_string(rb)),
                       "a supported pair (tensorwise/rowwise with themselves, block1x128 with block1x128 or "
                       "block128x128, mxfp8 family together, nvfp4 with nvfp4)",
                       std::string(to_string(ra)) + " x " + std::string(to_string(rb)), "Requantize one operand."));
  const bool fp4 = ra == Recipe::kNvfp4 || rb == Recipe::kNvfp4;
  if (fp4 && k > 0 && k % 32 != 0)
    out.push_back(make("k", rules::kFp4KMultiple32, "packed FP4 GEMMs need K a multiple of 32", "0 mod 32",
                       str(k) + " (" + str(k % 32) + " mod 32)", "Pad K with zero columns to " + padded_to(k, 32) + "."));
  if ((is_fp8(ra) || is_fp8(rb)) && !fp4 && k > 0 && k % 16 != 0)
    out.push_back(make("k", rules::kFp8KMultiple16, "FP8 GEMMs need K a multiple of 16 (16-byte rows)", "0 mod 16",
                       str(k) + " (" + str(k % 16) + " mod 16)", "Pad K with zero columns to " + padded_to(k, 16) + "."));
  for (int op = 0; op < 2; ++op) {
    const Recipe r = op == 0 ? ra : rb;
    const int64_t outer = op == 0 ? m : n;
    const char* dim = op == 0 ? "m" : "n";
    if (outer <= 0 || outer % 4 == 0) continue;
    if (r == Recipe::kBlock1x128)
      out.push_back(make(dim, rules::kVec128Outer4,
                         std::string("VEC128_32F scales need the outer dimension (") + dim + ") a multiple of 4",
                         "0 mod 4", str(outer), "Pad " + std::string(dim) + " to " + padded_to(outer, 4) + " rows."));
    if (r == Recipe::kBlock128x128)
      out.push_back(make(dim, rules::kBlk128Outer4,
                         std::string("BLK128x128_32F scales need the outer dimension (") + dim + ") a multiple of 4",
                         "0 mod 4", str(outer), "Pad " + std::string(dim) + " to " + padded_to(outer, 4) + " rows."));
  }
  return out;
}

}  // namespace scalemm::layouts
