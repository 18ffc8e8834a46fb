// The per-group grouped backend: a grouped GEMM (grouped.hpp) as one dense call per non-empty group,
// each planned (cached per distinct group shape) and run by the dense backends, so every group is
// bit-identical to the same dense call and every recipe pair the dense call accepts works grouped.
//  * m-grouped groups are views into A, B, their scales and D: nothing is copied.
//  * k-grouped groups gather their K columns of A and B and their K-blocks of the scales into the
//    stream's staging scratch first (one 2-D copy per operand, one launch for both scale buffers);
//    groups run one after another on the stream, so one staging buffer serves them all.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>
#include <tuple>

#include "dispatch/devices.hpp"
#include "dispatch/handle_scratch.hpp"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/grouped.hpp"
#include "scalemm/layouts/convert.hpp"
#include "scalemm/layouts/convert_cuda.hpp"

namespace scalemm {
namespace {

void add(Diagnostics& out, std::string arg, std::string rule, std::string msg, std::string expected, std::string actual,
         std::string fix) {
  out.push_back({std::move(arg), std::move(rule), std::move(msg), std::move(expected), std::move(actual), std::move(fix)});
}

// K granularity of a k-grouped split: the recipe's K-block (tensorwise and rowwise scale all of K).
int64_t k_granularity(Recipe r) {
  return r == Recipe::kTensorwise || r == Recipe::kRowwise ? 1 : layouts::ScaleLayout(r, 1, 1, ScaleFormat::kCompact).block_k();
}

size_t data_row_bytes(DType t, int64_t k) { return static_cast<size_t>(dtype_storage_bytes(t, k)); }


// Group g of an m-grouped call: views, no copies.
GemmArgs m_group_call(const GroupedGemmArgs& a, const std::vector<int64_t>& row_offs,
                      const std::vector<int64_t>& scale_offs, int64_t g) {
  GemmArgs c;
  c.m = a.group_sizes[g], c.n = a.n, c.k = a.k;
  c.a = a.a;
  c.a.data = static_cast<const uint8_t*>(a.a.data) + size_t(row_offs[size_t(g)]) * data_row_bytes(a.a.dtype, a.k);
  c.a.scale = static_cast<const uint8_t*>(a.a.scale) + size_t(scale_offs[size_t(g)]);
  c.b = a.b;
  c.b.data = static_cast<const uint8_t*>(a.b.data) + size_t(g) * size_t(a.n) * data_row_bytes(a.b.dtype, a.k);
  c.b.scale = static_cast<const uint8_t*>(a.b.scale) + size_t(g) * size_t(grouped_b_scale_stride(a));
  c.d = static_cast<uint8_t*>(a.d) + size_t(row_offs[size_t(g)]) * size_t(dtype_storage_bytes(a.d_dtype, a.n));
  c.d_dtype = a.d_dtype;
  c.alpha = a.alpha;
  c.space = a.space;
  return c;
}

// The staging of one k-grouped group: A (M, K_g) and B (N, K_g) with their scales in compact format.
struct KStage {
  size_t a_bytes, b_bytes, sa_bytes, sb_bytes;
  size_t total() const {
    auto al = [](size_t b) { return (b + 255) / 256 * 256; };
    return al(a_bytes) + al(b_bytes) + al(sa_bytes) + al(sb_bytes);
  }
};
KStage k_stage(const GroupedGemmArgs& a, int64_t kg) {
  return {size_t(a.m) * data_row_bytes(a.a.dtype, kg), size_t(a.n) * data_row_bytes(a.b.dtype, kg),
          size_t(layouts::ScaleLayout(a.a.recipe, a.m, kg, ScaleFormat::kCompact).bytes()),
          size_t(layouts::ScaleLayout(a.b.recipe, a.n, kg, ScaleFormat::kCompact).bytes())};
}

}  // namespace

Diagnostics validate(const GroupedGemmArgs& a) {
  Diagnostics out;
  const bool mg = a.group_dim == GroupDim::kM;
  if (a.group_dim != GroupDim::kM && a.group_dim != GroupDim::kK)
    add(out, "group_dim", "group-dim", "the grouped dimension must be m or k", "m or k",
        std::to_string(int(a.group_dim)), "");
  if (a.groups < 1)
    add(out, "groups", "group-count", "a grouped GEMM needs at least one group", ">= 1", std::to_string(a.groups),
        "Pass G = the number of experts (group_sizes has G entries).");
  if (!a.group_sizes && a.groups >= 1)
    add(out, "group_sizes", "null-pointer", "group sizes are null", "G sizes in host memory", "nullptr", "");
  if (a.n < 1) add(out, "n", "positive-extent", "N must be at least 1", ">= 1", std::to_string(a.n), "");
  if (mg ? a.k < 1 : a.m < 1)
    add(out, mg ? "k" : "m", "positive-extent", std::string(mg ? "K" : "M") + " must be at least 1", ">= 1",
        std::to_string(mg ? a.k : a.m), "");
  if (a.d_dtype != DType::kBF16 && a.d_dtype != DType::kF16 && a.d_dtype != DType::kF32)
    add(out, "d_dtype", "grouped-out-dtype", "grouped output must be bf16, f16 or f32", "bf16, f16 or f32",
        std::string(to_string(a.d_dtype)), "");
  if (!out.empty()) return out;

  int64_t sum = 0;
  const int64_t gran = mg ? 1 : std::max(k_granularity(a.a.recipe), k_granularity(a.b.recipe));
  for (int64_t g = 0; g < a.groups; ++g) {
    const int64_t s = a.group_sizes[g];
    const std::string arg = "group_sizes[" + std::to_string(g) + "]";
    if (s < 0) {
      add(out, arg, "group-size-negative", "a group size cannot be negative", ">= 0", std::to_string(s), "");
      continue;
    }
    if (!mg && s % gran != 0)
      add(out, arg, "group-k-block",
          "K_g must fall on the K-block boundaries of both recipes (" + std::string(to_string(a.a.recipe)) + ", " +
              std::string(to_string(a.b.recipe)) + ")",
          "a multiple of " + std::to_string(gran), std::to_string(s),
          "Pad group " + std::to_string(g) + " with zero columns in A and B to K_g = " +
              std::to_string(layouts::round_up(s, gran)) + ".");
    sum += s;
  }
  const int64_t want = mg ? a.m : a.k;
  if (out.empty() && sum != want)
    add(out, "group_sizes", "group-size-sum",
        std::string("the group sizes must add up to ") + (mg ? "M (the rows of A and D)" : "K (the columns of A and B)"),
        std::to_string(want), std::to_string(sum) + " over " + std::to_string(a.groups) + " groups",
        mg ? "Pass m = the sum of the group sizes (padding rows belong to a group)." : "");
  if (!out.empty()) return out;

  // The operands: m-grouped through each group's dense call (its scale slice, B[g]); k-grouped through
  // the whole (M, sum K) and (N, sum K) tensors, of which the groups are column ranges.
  auto prefixed = [&](const Diagnostics& d, const std::string& prefix) {
    for (auto x : d) {
      x.argument = prefix + x.argument;
      out.push_back(std::move(x));
    }
  };
  if (mg) {
    std::vector<int64_t> rows(size_t(a.groups) + 1, 0);
    for (int64_t g = 0; g < a.groups; ++g) rows[size_t(g) + 1] = rows[size_t(g)] + a.group_sizes[g];
    if (!a.a.scale || !a.b.scale || !a.a.data || !a.b.data || !a.d) {
      // The dense check names it; a null base pointer must not be offset first.
      GemmArgs c;
      c.m = std::max<int64_t>(a.m, 1), c.n = a.n, c.k = a.k;
      c.a = a.a, c.b = a.b, c.d = a.d, c.d_dtype = a.d_dtype, c.space = a.space;
      prefixed(validate(c), "");
      return out;
    }
    const std::vector<int64_t> offs = grouped_scale_offsets(a);
    for (int64_t g = 0; g < a.groups; ++g)
      if (a.group_sizes[g] > 0) prefixed(validate(m_group_call(a, rows, offs, g)), "group " + std::to_string(g) + ": ");
  } else {
    GemmArgs c;
    c.m = a.m, c.n = a.n, c.k = a.k;
    c.a = a.a, c.b = a.b, c.d = a.d, c.d_dtype = a.d_dtype, c.alpha = a.alpha, c.space = a.space;
    prefixed(validate(c), "");
  }
  return out;
}

void Handle::grouped_gemm(const GroupedGemmArgs& a, Stream stream) {
  throw_if_any(validate(a), StatusCode::kInvalidArgument);
  const bool host = a.space == MemorySpace::kHost;
  // The whole tensors' memory space and device, before any group runs (the groups are views into
  // them, and k-grouped groups read staged copies that the dense check never sees).
  const int device = dispatch::call_device(*impl_, stream);
  if (!host) {
    GemmArgs whole;
    whole.a = a.a, whole.b = a.b, whole.d = a.d, whole.space = a.space;
    throw_if_any(dispatch::check_pointers(*impl_, whole, stream, device), StatusCode::kInvalidArgument);
  }
  // Staging, its copies and every group's launches go to the stream's device.
  const dispatch::DeviceScope scope(host ? -1 : dispatch::scope_device(*impl_, stream, device));
  if (a.group_dim == GroupDim::kM) {
    std::vector<int64_t> rows(size_t(a.groups) + 1, 0);
    for (int64_t g = 0; g < a.groups; ++g) rows[size_t(g) + 1] = rows[size_t(g)] + a.group_sizes[g];
    const std::vector<int64_t> offs = grouped_scale_offsets(a);
    for (int64_t g = 0; g < a.groups; ++g)
      if (a.group_sizes[g] > 0) gemm(m_group_call(a, rows, offs, g), stream);
    return;
  }
  // k-grouped: stage each group's columns, then its dense call writes D[g].
  size_t need = 0;
  for (int64_t g = 0; g < a.groups; ++g) need = std::max(need, k_stage(a, a.group_sizes[g]).total());
  std::vector<uint8_t> host_stage;
  dispatch::StagingScratch scratch;
  char* base;
  if (host) {
    host_stage.resize(need);
    base = reinterpret_cast<char*>(host_stage.data());
  } else {
    scratch = dispatch::staging_scratch(*impl_, stream, need);
    base = scratch.ptr;
  }
  const size_t d_bytes = size_t(dtype_storage_bytes(a.d_dtype, a.m * a.n));
  const size_t a_row = data_row_bytes(a.a.dtype, a.k), b_row = data_row_bytes(a.b.dtype, a.k);
  const layouts::ScaleLayout la(a.a.recipe, a.m, a.k, a.a.scale_format), lb(a.b.recipe, a.n, a.k, a.b.scale_format);
  int64_t k0 = 0;
  for (int64_t g = 0; g < a.groups; ++g) {
    const int64_t kg = a.group_sizes[g];
    uint8_t* dg = static_cast<uint8_t*>(a.d) + size_t(g) * d_bytes;
    if (kg == 0) {  // an empty reduction: D[g] = 0
      if (host) std::memset(dg, 0, d_bytes);
      else detail::cuda_check(cudaMemsetAsync(dg, 0, d_bytes, stream), "grouped_gemm: zero D[g] of an empty group");
      continue;
    }
    const KStage st = k_stage(a, kg);
    auto al = [](size_t b) { return (b + 255) / 256 * 256; };
    char* pa = base;
    char* pb = pa + al(st.a_bytes);
    char* psa = pb + al(st.b_bytes);
    char* psb = psa + al(st.sa_bytes);
    const size_t a_off = size_t(dtype_storage_bytes(a.a.dtype, k0)), b_off = size_t(dtype_storage_bytes(a.b.dtype, k0));
    const size_t a_w = data_row_bytes(a.a.dtype, kg), b_w = data_row_bytes(a.b.dtype, kg);
    const layouts::ScaleLayout ga(a.a.recipe, a.m, kg, ScaleFormat::kCompact), gb(a.b.recipe, a.n, kg, ScaleFormat::kCompact);
    const int64_t kb0_a = a.a.recipe == Recipe::kTensorwise || a.a.recipe == Recipe::kRowwise ? 0 : k0 / la.block_k();
    const int64_t kb0_b = a.b.recipe == Recipe::kTensorwise || a.b.recipe == Recipe::kRowwise ? 0 : k0 / lb.block_k();
    if (host) {
      for (int64_t r = 0; r < a.m; ++r)
        std::memcpy(pa + size_t(r) * a_w, static_cast<const char*>(a.a.data) + size_t(r) * a_row + a_off, a_w);
      for (int64_t r = 0; r < a.n; ++r)
        std::memcpy(pb + size_t(r) * b_w, static_cast<const char*>(a.b.data) + size_t(r) * b_row + b_off, b_w);
      layouts::slice_kblocks(la, a.a.scale, kb0_a, ga, psa);
      layouts::slice_kblocks(lb, a.b.scale, kb0_b, gb, psb);
    } else {
      detail::cuda_check(cudaMemcpy2DAsync(pa, a_w, static_cast<const char*>(a.a.data) + a_off, a_row, a_w, size_t(a.m),
                                           cudaMemcpyDeviceToDevice, stream),
                         "grouped_gemm: gather A's K columns");
      detail::cuda_check(cudaMemcpy2DAsync(pb, b_w, static_cast<const char*>(a.b.data) + b_off, b_row, b_w, size_t(a.n),
                                           cudaMemcpyDeviceToDevice, stream),
                         "grouped_gemm: gather B's K columns");
      layouts::gpu::ScaleConversion conv[2] = {{la, ga, a.a.scale, psa, kb0_a}, {lb, gb, a.b.scale, psb, kb0_b}};
      layouts::gpu::convert_small(conv, 2, stream);
    }
    GemmArgs c;
    c.m = a.m, c.n = a.n, c.k = kg;
    c.a = a.a, c.a.data = pa, c.a.scale = psa, c.a.scale_format = ScaleFormat::kCompact;
    c.b = a.b, c.b.data = pb, c.b.scale = psb, c.b.scale_format = ScaleFormat::kCompact;
    c.d = dg, c.d_dtype = a.d_dtype, c.alpha = a.alpha, c.space = a.space;
    gemm(c, stream);
    k0 += kg;
  }
}

std::string Handle::explain(const GroupedGemmArgs& a) {
  throw_if_any(validate(a), StatusCode::kInvalidArgument);
  // One plan per distinct group shape (what the plan cache holds), with the groups that share it.
  std::map<int64_t, std::vector<int64_t>> by_size;
  for (int64_t g = 0; g < a.groups; ++g) by_size[a.group_sizes[g]].push_back(g);
  std::ostringstream os;
  os << "grouped (" << to_string(a.group_dim) << "), G=" << a.groups << ", per-group backend: one dense call per"
     << " non-empty group, " << by_size.size() << " distinct group shape(s)";
  for (const auto& [size, gs] : by_size) {
    os << "\n" << (a.group_dim == GroupDim::kM ? "M_g=" : "K_g=") << size << " (groups";
    for (size_t i = 0; i < gs.size() && i < 8; ++i) os << ' ' << gs[i];
    if (gs.size() > 8) os << " ... " << gs.size() << " in all";
    os << "): ";
    if (size == 0) {
      os << (a.group_dim == GroupDim::kM ? "no rows, nothing runs" : "D[g] set to zero");
      continue;
    }
    GemmArgs c;
    c.m = a.group_dim == GroupDim::kM ? size : a.m;
    c.n = a.n;
    c.k = a.group_dim == GroupDim::kM ? a.k : size;
    c.a = a.a, c.b = a.b, c.d_dtype = a.d_dtype, c.space = a.space;
    if (a.group_dim == GroupDim::kK) c.a.scale_format = c.b.scale_format = ScaleFormat::kCompact;
    os << plan(c).explain();
  }
  return os.str();
}

}  // namespace scalemm
