// libFuzzer target: bytes -> (recipe, format, rows, K, a scale view over a byte buffer, alignment,
// options) -> layouts::validate_scale, check_content, the host conversions and transposes, and
// layouts::validate_gemm over the whole int64 range.
// Properties: nothing crashes (the view never reaches past the buffer it describes, so any read
// outside it is the library's); every diagnostic names its argument and rule; a host buffer that
// validation accepts (content checked, view covering the whole buffer) converts to the other format
// with clean content and back to the same bytes, and transposes (exact recipes) round-trip too;
// conversions between layouts that disagree throw Error(kInvalidArgument).
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "scalemm/layouts/convert.hpp"
#include "scalemm/layouts/scale_layout.hpp"
#include "scalemm/layouts/validate.hpp"
#include "scalemm/status.hpp"

#include "fuzz_check.hpp"

using namespace scalemm;
using layouts::ScaleLayout;

namespace {

int64_t pick_extent(FuzzedDataProvider& in, const ScaleLayout& l) {
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0: return l.real_rows();
    case 1: return l.padded_rows();
    case 2: return l.kblocks();
    case 3: return l.padded_kblocks();
    case 4: return l.size();
    default: return in.ConsumeIntegralInRange<int64_t>(0, 70);
  }
}

int64_t pick_stride(FuzzedDataProvider& in, const ScaleLayout& l) {
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0: return 1;
    case 1: return l.padded_kblocks();
    case 2: return l.padded_rows();
    case 3: return l.kblocks();
    case 4: return l.real_rows();
    default: return in.ConsumeIntegralInRange<int64_t>(-3, 70);
  }
}

// Elements the view reaches (max offset + 1), or -1 when it could reach outside [0, n) of a buffer.
int64_t view_reach(const TensorRef& t) {
  int64_t hi = 0;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] < 0) return -1;
    if (t.shape[i] == 0) return 0;
    if (t.shape[i] > 1 && t.strides[i] < 0) return -1;
    int64_t step = 0;
    if (t.shape[i] > 1 && (__builtin_mul_overflow(t.shape[i] - 1, t.strides[i], &step) ||
                           __builtin_add_overflow(hi, step, &hi)))
      return -1;
  }
  return hi + 1;
}

void fuzz_gemm_rules(FuzzedDataProvider& in) {
  const Recipe ra = kAllRecipes[in.ConsumeIntegralInRange<size_t>(0, 6)];
  const Recipe rb = kAllRecipes[in.ConsumeIntegralInRange<size_t>(0, 6)];
  int64_t d[3];
  for (auto& v : d) {
    switch (in.ConsumeIntegralInRange<int>(0, 3)) {
      case 0: v = in.ConsumeIntegralInRange<int64_t>(-2, 300); break;
      case 1: v = in.ConsumeIntegral<int64_t>(); break;
      case 2: v = INT64_MAX - in.ConsumeIntegralInRange<int64_t>(0, 200); break;
      default: v = (int64_t(1) << in.ConsumeIntegralInRange<int>(0, 62)) + in.ConsumeIntegralInRange<int64_t>(-3, 3);
    }
  }
  for (const Diagnostic& g : layouts::validate_gemm(ra, rb, d[0], d[1], d[2])) FUZZ_CHECK(!g.rule.empty());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  if (in.ConsumeBool()) {
    fuzz_gemm_rules(in);
    return 0;
  }
  const Recipe recipe = kAllRecipes[in.ConsumeIntegralInRange<size_t>(0, 6)];
  const ScaleFormat format = in.ConsumeBool() ? ScaleFormat::kCublasLt : ScaleFormat::kCompact;
  const bool large = in.ConsumeIntegralInRange<int>(0, 7) == 0;
  const int64_t rows = large ? in.ConsumeIntegralInRange<int64_t>(0, int64_t(1) << 31)
                             : in.ConsumeIntegralInRange<int64_t>(0, 300);
  const int64_t k = large ? in.ConsumeIntegralInRange<int64_t>(0, int64_t(1) << 31)
                          : in.ConsumeIntegralInRange<int64_t>(0, 700);
  const ScaleLayout l(recipe, rows, k, format);
  FUZZ_CHECK(l.size() >= 0 && l.size() >= l.logical_size());

  TensorRef t;
  t.rank = in.ConsumeIntegralInRange<int>(0, 4);
  if (t.rank == 1) {
    t.shape[0] = pick_extent(in, l);
    t.strides[0] = in.ConsumeBool() ? 1 : pick_stride(in, l);
  } else {
    for (int i = 0; i < t.rank; ++i) {
      t.shape[i] = pick_extent(in, l);
      t.strides[i] = pick_stride(in, l);
    }
    if (t.rank == 2 && in.ConsumeBool()) {  // often the contiguous row-major view of its shape
      t.strides[0] = t.shape[1];
      t.strides[1] = 1;
    }
  }
  const uint8_t dt = in.ConsumeIntegralInRange<uint8_t>(0, 9);
  t.dtype = dt >= kDTypeCount ? l.scale_dtype() : static_cast<DType>(dt);
  t.space = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? MemorySpace::kDevice : MemorySpace::kHost;
  layouts::ValidateOptions opt;
  opt.check_content = in.ConsumeIntegralInRange<int>(0, 7) != 0;
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) opt.require_alignment = in.ConsumeBool();
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0)
    opt.required_space = in.ConsumeBool() ? MemorySpace::kDevice : MemorySpace::kHost;
  const size_t misalign = in.ConsumeIntegralInRange<size_t>(0, 15);
  const bool null_data = in.ConsumeIntegralInRange<int>(0, 15) == 0;

  // The buffer: the rest of the input, repeated to cover what the view reaches (capped).
  const int eb = l.scale_bytes();
  const int64_t reach = t.rank == 0 ? 1 : view_reach(t);
  constexpr int64_t kMaxElems = int64_t(1) << 16;
  if (reach < 0 || reach > kMaxElems) return 0;  // the view would describe memory we do not own
  const int64_t elems = std::max<int64_t>(reach, l.size() <= kMaxElems ? l.size() : 0);
  const std::vector<uint8_t> tail = in.ConsumeRemainingBytes<uint8_t>();
  std::vector<uint8_t> storage(static_cast<size_t>(elems * eb) + 16 + 16, 0);
  uint8_t* base = storage.data() + (16 - reinterpret_cast<uintptr_t>(storage.data()) % 16) % 16 + misalign;
  if (!tail.empty())
    for (int64_t i = 0; i < elems * eb; ++i) base[i] = tail[static_cast<size_t>(i) % tail.size()];
  t.data = null_data ? nullptr : base;

  const Diagnostics diags = layouts::validate_scale(t, l, "scale", opt);
  for (const Diagnostic& g : diags) {
    FUZZ_CHECK(g.argument == "scale");
    FUZZ_CHECK(!g.rule.empty() && !g.message.empty());
  }
  const bool covers = t.rank == 0 ? l.size() == 1 : reach >= l.size();
  if (!diags.empty() || !opt.check_content || t.space != MemorySpace::kHost || null_data || !covers ||
      l.size() > kMaxElems || t.dtype != l.scale_dtype())
    return 0;

  // Accepted: the buffer's content is clean, so it converts and round-trips.
  const ScaleLayout other = l.with_format(format == ScaleFormat::kCompact ? ScaleFormat::kCublasLt
                                                                          : ScaleFormat::kCompact);
  FUZZ_CHECK(!layouts::check_content(l, base).any);
  std::vector<uint8_t> there(static_cast<size_t>(other.bytes()) + 1), back(static_cast<size_t>(l.bytes()) + 1);
  layouts::convert(l, base, other, there.data());
  FUZZ_CHECK(!layouts::check_content(other, there.data()).any);
  layouts::convert(other, there.data(), l, back.data());
  FUZZ_CHECK(std::memcmp(back.data(), base, static_cast<size_t>(l.bytes())) == 0);

  if (layouts::recipe_transposes_exactly(recipe)) {
    const ScaleLayout tl = layouts::transposed(l, format);
    std::vector<uint8_t> tr(static_cast<size_t>(tl.bytes()) + 1), tr_back(static_cast<size_t>(l.bytes()) + 1);
    layouts::transpose(l, base, tl, tr.data());
    FUZZ_CHECK(!layouts::check_content(tl, tr.data()).any);
    layouts::transpose(tl, tr.data(), l, tr_back.data());
    FUZZ_CHECK(std::memcmp(tr_back.data(), base, static_cast<size_t>(l.bytes())) == 0);
  }

  // A destination layout that disagrees on recipe, rows or k must be refused, not written.
  const ScaleLayout wrong(kAllRecipes[(static_cast<int>(recipe) + rows) % 7], rows + (k & 1), k + 1, other.format);
  if (wrong.bytes() <= 4 * kMaxElems) {
    std::vector<uint8_t> sink(static_cast<size_t>(wrong.bytes()) + 1);
    try {
      layouts::convert(l, base, wrong, sink.data());
      FUZZ_CHECK(false && "convert accepted mismatched layouts");
    } catch (const Error& e) {
      FUZZ_CHECK(e.code() == StatusCode::kInvalidArgument);
    }
  }
  return 0;
}
