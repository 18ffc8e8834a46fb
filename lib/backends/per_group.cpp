// Grouped GEMMs (grouped.hpp): validation, the choice between the two grouped backends, and the
// per-group backend itself.
//  * The CUTLASS grouped kernels (backends/cutlass_grouped_sm90a.cu) run blockwise and rowwise FP8 on sm_90 in
//    one launch, with host or device-side sizes; `auto` takes them whenever they can run the call,
//    except large groups with host sizes, measured faster per group (slower_than_per_group()).
//  * Otherwise the per-group backend runs one dense call per non-empty group, each planned (cached per
//    distinct group shape) and run by the dense backends, so every group is bit-identical to the same
//    dense call and every recipe pair the dense call accepts works grouped. It needs the sizes on the
//    host: device-side sizes are copied over first (one synchronisation, refused during a capture).
//    A device call's groups are spread over up to four streams forked from the caller's (events, so
//    graph captures hold them), each with its own workspace, and joined back before the call returns.
//  * m-grouped groups are views into A, B, their scales and D: nothing is copied, except the A rows or
//    expert B of a group that starts off 16-byte alignment (K x element size not a multiple of 16),
//    copied into its stream's staging scratch for the dense call's tensor-core loads.
//  * k-grouped groups gather their K columns of A and B into their stream's staging scratch first
//    (one 2-D copy per operand); a stream runs its groups one after another, so one staging buffer
//    per stream serves them all.
//  * On the device, the scale conversions the groups' dense calls would each launch (to cuBLASLt's
//    layout, and every k-group's K slice) run for all groups in one launch before the fork
//    (ScaleBatch), into the caller stream's staging scratch.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <sstream>
#include <tuple>

#include "backends/cutlass_grouped.hpp"
#include "dispatch/capabilities.hpp"
#include "dispatch/devices.hpp"
#include "dispatch/handle_scratch.hpp"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/grouped.hpp"
#include "scalemm/layouts/convert.hpp"
#include "scalemm/layouts/convert_cuda.hpp"

namespace scalemm {
namespace {

// Streams the per-group backend spreads a device call's groups over (each with its own workspace).
// Four keep a few small GEMMs in flight at once; more add fork/join work without filling the GPU more.
constexpr size_t kPerGroupStreams = 4;

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
  c.fast_accum = a.fast_accum;
  return c;
}

// m-grouped groups whose A rows or expert B do not start 16-byte aligned on the device (K times the
// element size not a multiple of 16, after an odd number of rows) run on aligned copies of them: the
// dense call's tensor-core loads need aligned data. Bytes of each copy (0: read in place).
bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
std::pair<size_t, size_t> m_stage(const GemmArgs& c) {
  if (c.space == MemorySpace::kHost) return {0, 0};
  return {aligned16(c.a.data) ? 0 : size_t(c.m) * data_row_bytes(c.a.dtype, c.k),
          aligned16(c.b.data) ? 0 : size_t(c.n) * data_row_bytes(c.b.dtype, c.k)};
}
size_t al256(size_t b) { return (b + 255) / 256 * 256; }

// Group g's dense call as validation and planning see it: a staged operand at the tensor's own
// (aligned) address, where its copy will be.
GemmArgs m_group_view(const GroupedGemmArgs& a, const std::vector<int64_t>& rows, const std::vector<int64_t>& offs,
                      int64_t g) {
  GemmArgs c = m_group_call(a, rows, offs, g);
  const auto [ab, bb] = m_stage(c);
  if (ab) c.a.data = a.a.data;
  if (bb) c.b.data = a.b.data;
  return c;
}

// Copies what m_stage() names into `base` and points c at the copies.
void stage_m_data(GemmArgs& c, char* base, Stream stream) {
  const auto [ab, bb] = m_stage(c);
  if (ab) {
    detail::cuda_check(cudaMemcpyAsync(base, c.a.data, ab, cudaMemcpyDeviceToDevice, stream),
                       "grouped_gemm: align a group's A rows");
    c.a.data = base;
  }
  if (bb) {
    char* pb = base + al256(ab);
    detail::cuda_check(cudaMemcpyAsync(pb, c.b.data, bb, cudaMemcpyDeviceToDevice, stream),
                       "grouped_gemm: align an expert's B");
    c.b.data = pb;
  }
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

namespace {
// How far validate_grouped() goes: the arguments and sizes only (validate_sizes); the operands as whole
// tensors (A's (m, K), B's first expert: enough for the CUTLASS grouped kernel, whose blocker demands
// per-row compact A scales and 16-byte rows, and far cheaper for large G); or group by group as each
// group's dense call will see them (validate).
enum class Depth { kSizes, kWhole, kPerGroup };

Diagnostics validate_grouped(const GroupedGemmArgs& a, Depth depth) {
  Diagnostics out;
  const bool mg = a.group_dim == GroupDim::kM;
  if (a.group_dim != GroupDim::kM && a.group_dim != GroupDim::kK)
    add(out, "group_dim", "group-dim", "the grouped dimension must be m or k", "m or k",
        std::to_string(int(a.group_dim)), "");
  if (a.backend != GroupedBackend::kAuto && a.backend != GroupedBackend::kCutlass &&
      a.backend != GroupedBackend::kPerGroup)
    add(out, "backend", "grouped-backend", "unknown grouped backend", "auto, cutlass or per-group",
        std::to_string(int(a.backend)), "");
  if (a.groups < 1)
    add(out, "groups", "group-count", "a grouped GEMM needs at least one group", ">= 1", std::to_string(a.groups),
        "Pass G = the number of experts (group_sizes has G entries).");
  const bool dev_sizes = a.group_sizes_device != nullptr;
  if (!a.group_sizes && !dev_sizes && a.groups >= 1)
    add(out, "group_sizes", "null-pointer", "group sizes are null",
        "G sizes in host memory (group_sizes) or in device memory (group_sizes_device)", "nullptr", "");
  if (a.group_sizes && dev_sizes)
    add(out, "group_sizes_device", "group-sizes-twice", "group sizes are given twice", "group_sizes or group_sizes_device",
        "both", "Pass the sizes in one place: leave group_sizes null when they live on the device.");
  if (dev_sizes && a.space == MemorySpace::kHost)
    add(out, "group_sizes_device", "group-sizes-space", "a host-memory call takes its group sizes from the host",
        "group_sizes (host)", "group_sizes_device", "Pass the sizes in group_sizes.");
  if (dev_sizes && a.group_dim == GroupDim::kM &&
      !(a.a.scale_format == ScaleFormat::kCompact &&
        (a.a.recipe == Recipe::kRowwise || a.a.recipe == Recipe::kBlock1x128 || a.a.recipe == Recipe::kMxfp8 ||
         a.a.recipe == Recipe::kNvfp4)))
    add(out, "scale_a", "group-sizes-device-scales",
        "with device-side group sizes, A's scales must not depend on the sizes: a per-row recipe in compact format",
        "rowwise, block1x128, mxfp8 or nvfp4, compact",
        std::string(to_string(a.a.recipe)) + ", " + std::string(to_string(a.a.scale_format)),
        "Pass the sizes on the host (group_sizes), or quantize A per row.");
  if (a.n < 1) add(out, "n", "positive-extent", "N must be at least 1", ">= 1", std::to_string(a.n), "");
  if (mg ? a.k < 1 : a.m < 1)
    add(out, mg ? "k" : "m", "positive-extent", std::string(mg ? "K" : "M") + " must be at least 1", ">= 1",
        std::to_string(mg ? a.k : a.m), "");
  if (auto d = dispatch::fast_accum_refusal(a.fast_accum, a.a.recipe, a.b.recipe)) out.push_back(std::move(*d));
  if (a.d_dtype != DType::kBF16 && a.d_dtype != DType::kF16 && a.d_dtype != DType::kF32)
    add(out, "d_dtype", "grouped-out-dtype", "grouped output must be bf16, f16 or f32", "bf16, f16 or f32",
        std::string(to_string(a.d_dtype)), "");
  if (!out.empty() || (dev_sizes && depth == Depth::kSizes)) return out;
  const bool whole = dev_sizes || (depth == Depth::kWhole && a.group_dim == GroupDim::kM);
  if (whole && !dev_sizes) {  // the sizes first, as below
    int64_t sum = 0;
    for (int64_t g = 0; g < a.groups; ++g) {
      if (a.group_sizes[g] < 0) {
        add(out, "group_sizes[" + std::to_string(g) + "]", "group-size-negative", "a group size cannot be negative",
            ">= 0", std::to_string(a.group_sizes[g]), "");
        return out;
      }
      sum += a.group_sizes[g];
    }
    if (sum != a.m) {
      add(out, "group_sizes", "group-size-sum", "the group sizes must add up to M (the rows of A and D)",
          std::to_string(a.m), std::to_string(sum) + " over " + std::to_string(a.groups) + " groups",
          "Pass m = the sum of the group sizes (padding rows belong to a group).");
      return out;
    }
  }
  if (whole) {  // the sizes are checked on the device, or above; the operands as the whole tensors they are
    GemmArgs c;
    c.m = a.group_dim == GroupDim::kM ? std::max<int64_t>(a.m, 1) : a.m;
    c.n = a.n, c.k = a.k;
    c.a = a.a, c.b = a.b, c.d = a.d, c.d_dtype = a.d_dtype, c.alpha = a.alpha, c.space = a.space;
    for (auto x : validate(c)) out.push_back(std::move(x));
    return out;
  }

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
  if (!out.empty() || depth == Depth::kSizes) return out;

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
    // The whole tensors' own alignment is the caller's; a group that starts off it runs on a copy.
    GemmArgs whole;
    whole.m = std::max<int64_t>(a.m, 1), whole.n = a.n, whole.k = a.k;
    whole.a = a.a, whole.b = a.b, whole.d = a.d, whole.d_dtype = a.d_dtype, whole.space = a.space;
    for (const Diagnostic& x : validate(whole))
      if (x.rule == "data-alignment") out.push_back(x);
    if (!out.empty()) return out;
    for (int64_t g = 0; g < a.groups; ++g)
      if (a.group_sizes[g] > 0) prefixed(validate(m_group_view(a, rows, offs, g)), "group " + std::to_string(g) + ": ");
  } else {
    GemmArgs c;
    c.m = a.m, c.n = a.n, c.k = a.k;
    c.a = a.a, c.b = a.b, c.d = a.d, c.d_dtype = a.d_dtype, c.alpha = a.alpha, c.space = a.space;
    prefixed(validate(c), "");
  }
  return out;
}

}  // namespace

Diagnostics validate(const GroupedGemmArgs& a) { return validate_grouped(a, Depth::kPerGroup); }
Diagnostics validate_sizes(const GroupedGemmArgs& a) { return validate_grouped(a, Depth::kSizes); }

namespace {

// Why the CUTLASS grouped kernel does not run `a` (empty: it does).
std::string cutlass_blocker(const GroupedGemmArgs& a, const DeviceTarget& t, const PlanOptions& options) {
  if (a.backend == GroupedBackend::kPerGroup) return "the call asks for the per-group backend";
  if (!backends::cutlass_grouped::built())
    return "not built (CUTLASS's headers were not found at configure time: tools/fetch-cutlass.sh)";
  if (options.force && *options.force != Backend::kNative)
    return "the handle forces the " + std::string(to_string(*options.force)) + " backend";
  std::string why = backends::cutlass_grouped::blocker(a, t);
  if (why.empty() && a.backend == GroupedBackend::kAuto) why = backends::cutlass_grouped::slower_than_per_group(a);
  return why;
}

// The per-group backend needs the sizes on the host: one copy and one synchronisation.
std::vector<int64_t> sizes_to_host(const GroupedGemmArgs& a, const std::string& why, Stream stream) {
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  detail::cuda_check(cudaStreamIsCapturing(stream, &capturing), "grouped_gemm: capture status");
  if (capturing != cudaStreamCaptureStatusNone)
    throw Error(StatusCode::kUnsupported,
                "group_sizes_device: this call runs on the per-group backend, which needs the sizes on the host, "
                "and a graph capture cannot wait for them (CUTLASS grouped kernel passed over: " + why +
                    "). Fix: pass host sizes (group_sizes), or a call the CUTLASS kernel runs.");
  std::vector<int64_t> sizes(size_t(a.groups));
  std::vector<int32_t> s32(a.group_sizes_int64 ? 0 : sizes.size());
  void* dst = a.group_sizes_int64 ? static_cast<void*>(sizes.data()) : static_cast<void*>(s32.data());
  detail::cuda_check(cudaMemcpyAsync(dst, a.group_sizes_device, sizes.size() * (a.group_sizes_int64 ? 8 : 4),
                                     cudaMemcpyDeviceToHost, stream),
                     "grouped_gemm: copy device-side group sizes");
  detail::cuda_check(cudaStreamSynchronize(stream), "grouped_gemm: wait for device-side group sizes");
  std::copy(s32.begin(), s32.end(), sizes.begin());
  return sizes;
}

// First K-block of column k0 in a scale layout (tensorwise and rowwise scale all of K: 0).
int64_t first_kblock(const layouts::ScaleLayout& l, int64_t k0) {
  return l.recipe == Recipe::kTensorwise || l.recipe == Recipe::kRowwise ? 0 : k0 / l.block_k();
}

// The dense call of k-grouped group g before staging: its shape and D[g], with the whole tensors'
// operands (staging points them at the group's own columns and scales).
GemmArgs k_group_call(const GroupedGemmArgs& a, int64_t g) {
  GemmArgs c;
  c.m = a.m, c.n = a.n, c.k = a.group_sizes[g];
  c.a = a.a, c.a.scale_format = ScaleFormat::kCompact;
  c.b = a.b, c.b.scale_format = ScaleFormat::kCompact;
  c.d = static_cast<uint8_t*>(a.d) + size_t(g) * size_t(dtype_storage_bytes(a.d_dtype, a.m * a.n));
  c.d_dtype = a.d_dtype, c.alpha = a.alpha, c.space = a.space;
  c.fast_accum = a.fast_accum;
  return c;
}

// Gathers the K columns [k0, k0 + K_g) of A and B into `base` (KStage's first two slots) and points
// c's data at them.
void stage_k_data(const GroupedGemmArgs& a, int64_t k0, char* base, Stream stream, GemmArgs& c) {
  const int64_t kg = c.k;
  const KStage st = k_stage(a, kg);
  char* pa = base;
  char* pb = pa + (st.a_bytes + 255) / 256 * 256;
  const size_t a_row = data_row_bytes(a.a.dtype, a.k), b_row = data_row_bytes(a.b.dtype, a.k);
  const size_t a_off = size_t(dtype_storage_bytes(a.a.dtype, k0)), b_off = size_t(dtype_storage_bytes(a.b.dtype, k0));
  const size_t a_w = data_row_bytes(a.a.dtype, kg), b_w = data_row_bytes(a.b.dtype, kg);
  if (a.space == MemorySpace::kHost) {
    for (int64_t r = 0; r < a.m; ++r)
      std::memcpy(pa + size_t(r) * a_w, static_cast<const char*>(a.a.data) + size_t(r) * a_row + a_off, a_w);
    for (int64_t r = 0; r < a.n; ++r)
      std::memcpy(pb + size_t(r) * b_w, static_cast<const char*>(a.b.data) + size_t(r) * b_row + b_off, b_w);
  } else {
    detail::cuda_check(cudaMemcpy2DAsync(pa, a_w, static_cast<const char*>(a.a.data) + a_off, a_row, a_w, size_t(a.m),
                                         cudaMemcpyDeviceToDevice, stream),
                       "grouped_gemm: gather A's K columns");
    detail::cuda_check(cudaMemcpy2DAsync(pb, b_w, static_cast<const char*>(a.b.data) + b_off, b_row, b_w, size_t(a.n),
                                         cudaMemcpyDeviceToDevice, stream),
                       "grouped_gemm: gather B's K columns");
  }
  c.a.data = pa, c.b.data = pb;
}

// Stages k-grouped group g (columns [k0, k0 + K_g)) into `base`, its scales as compact slices in
// KStage's last two slots, and returns its dense call, writing D[g].
GemmArgs stage_k_group(const GroupedGemmArgs& a, int64_t g, int64_t k0, char* base, Stream stream) {
  GemmArgs c = k_group_call(a, g);
  stage_k_data(a, k0, base, stream, c);
  const int64_t kg = c.k;
  const KStage st = k_stage(a, kg);
  auto al = [](size_t b) { return (b + 255) / 256 * 256; };
  char* psa = base + al(st.a_bytes) + al(st.b_bytes);
  char* psb = psa + al(st.sa_bytes);
  const layouts::ScaleLayout la(a.a.recipe, a.m, a.k, a.a.scale_format), lb(a.b.recipe, a.n, a.k, a.b.scale_format);
  const layouts::ScaleLayout ga(a.a.recipe, a.m, kg, ScaleFormat::kCompact), gb(a.b.recipe, a.n, kg, ScaleFormat::kCompact);
  if (a.space == MemorySpace::kHost) {
    layouts::slice_kblocks(la, a.a.scale, first_kblock(la, k0), ga, psa);
    layouts::slice_kblocks(lb, a.b.scale, first_kblock(lb, k0), gb, psb);
  } else {
    layouts::gpu::ScaleConversion conv[2] = {{la, ga, a.a.scale, psa, first_kblock(la, k0)},
                                             {lb, gb, a.b.scale, psb, first_kblock(lb, k0)}};
    layouts::gpu::convert_small(conv, 2, stream);
  }
  c.a.scale = psa, c.b.scale = psb;
  return c;
}

// The scale buffers of a device call's groups, prepared for all of them at once. Where a group's
// dense plan would convert its scales to cuBLASLt's layout (or realign them: one launch per group
// and operand), and for every k-grouped group's K slice, the conversion joins one batch
// (layouts::gpu::convert_batch), run on the caller's stream before the groups fork, and the group's
// call takes the converted buffer. Bit-identical: the dense call would have converted the same bytes
// the same way.
class ScaleBatch {
 public:
  // `op` reads layout `to`, made from `from`'s K-blocks kb0 on, once run() has placed it.
  void add(const layouts::ScaleLayout& from, const void* src, int64_t kb0, const layouts::ScaleLayout& to,
           GemmOperand* op) {
    items_.push_back({from, to, src, nullptr, kb0});
    offsets_.push_back(bytes_);
    ops_.push_back(op);
    bytes_ += (size_t(to.bytes()) + 255) / 256 * 256;
  }
  size_t bytes() const { return bytes_; }
  size_t count() const { return items_.size(); }
  // Converts into `region` (bytes() long) on `stream` and points each operand at its buffer.
  void run(char* region, Stream stream) {
    for (size_t i = 0; i < items_.size(); ++i) {
      items_[i].dst = region + offsets_[i];
      ops_[i]->scale = items_[i].dst;
      ops_[i]->scale_format = items_[i].to.format;
    }
    layouts::gpu::convert_batch(items_.data(), int(items_.size()), stream);
  }

 private:
  std::vector<layouts::gpu::ScaleConversion> items_;
  std::vector<size_t> offsets_;
  std::vector<GemmOperand*> ops_;
  size_t bytes_ = 0;
};

// Whether `p` prepares the scales itself as cuBLASLt's layout (native::plan_scales: the native
// backend, and the convert-native one padding M): such a call takes cuBLASLt-format scales as they are.
bool takes_cublaslt_scales(const Plan& p) {
  return p.backend == Backend::kNative || (p.backend == Backend::kConvertNative && p.padded_m > 0);
}

// Whether the dense call of `p` would convert or realign the compact scales of `op` (A: is_a).
bool converts_scales(const Plan& p, const GemmOperand& op, bool is_a) {
  if (!takes_cublaslt_scales(p) || op.scale_format != ScaleFormat::kCompact) return false;
  return (is_a ? p.convert_scale_a : p.convert_scale_b) || (reinterpret_cast<uintptr_t>(op.scale) & 15u) != 0;
}

size_t k_stage_bytes(const GroupedGemmArgs& a) {
  size_t need = 0;
  for (int64_t g = 0; g < a.groups; ++g) need = std::max(need, k_stage(a, a.group_sizes[g]).total());
  return need;
}

// SCALEMM_VERIFY for a call the CUTLASS kernel ran: each group against the reference, as a dense call
// of the native tier's tolerance (synchronous, in both modes: the sizes may first have to be read).
void verify_cutlass_call(Handle::Impl& impl, const GroupedGemmArgs& in, verify::Mode mode, Stream stream) {
  std::vector<int64_t> host_sizes;
  GroupedGemmArgs a = in;
  if (a.group_sizes_device) {
    host_sizes = sizes_to_host(a, "", stream);
    a.group_sizes = host_sizes.data(), a.group_sizes_device = nullptr;
    if (!validate(a).empty()) return;  // invalid device sizes: the call wrote nothing, device_status says why
  }
  Plan plan;
  plan.backend = Backend::kNative;
  plan.reasons = {backends::cutlass_grouped::describe(in)};
  if (a.group_dim == GroupDim::kM) {
    std::vector<int64_t> rows(size_t(a.groups) + 1, 0);
    for (int64_t g = 0; g < a.groups; ++g) rows[size_t(g) + 1] = rows[size_t(g)] + a.group_sizes[g];
    const std::vector<int64_t> offs = grouped_scale_offsets(a);
    for (int64_t g = 0; g < a.groups; ++g)
      if (a.group_sizes[g] > 0) verify::check(m_group_call(a, rows, offs, g), plan, mode, stream);
    return;
  }
  dispatch::StagingScratch scratch = dispatch::staging_scratch(impl, stream, k_stage_bytes(a));
  const size_t d_bytes = size_t(dtype_storage_bytes(a.d_dtype, a.m * a.n));
  std::vector<uint8_t> dg(d_bytes);
  int64_t k0 = 0;
  for (int64_t g = 0; g < a.groups; ++g) {
    if (a.group_sizes[g] == 0) {  // D[g] must be zero
      detail::cuda_check(cudaMemcpy(dg.data(), static_cast<uint8_t*>(a.d) + size_t(g) * d_bytes, d_bytes,
                                    cudaMemcpyDeviceToHost), "verify: read D[g] of an empty group");
      if (std::any_of(dg.begin(), dg.end(), [](uint8_t v) { return v != 0; }))
        throw Error(StatusCode::kVerificationFailed,
                    "grouped_gemm verification: D[" + std::to_string(g) + "] of an empty k-group is not zero");
      continue;
    }
    verify::check(stage_k_group(a, g, k0, scratch.ptr, stream), plan, mode, stream);
    k0 += a.group_sizes[g];
  }
}

}  // namespace

namespace {

// The per-group backend on host sizes, after validation: every non-empty group's dense call.
void run_groups(Handle& h, Handle::Impl& impl, const GroupedGemmArgs& a, Stream stream) {
  const bool host = a.space == MemorySpace::kHost;
  // Empty k-groups first, on the caller's stream: an empty reduction makes D[g] = 0.
  const size_t d_bytes = size_t(dtype_storage_bytes(a.d_dtype, a.m * a.n));
  for (int64_t g = 0; a.group_dim == GroupDim::kK && g < a.groups; ++g) {
    if (a.group_sizes[g] != 0) continue;
    uint8_t* dg = static_cast<uint8_t*>(a.d) + size_t(g) * d_bytes;
    if (host) std::memset(dg, 0, d_bytes);
    else detail::cuda_check(cudaMemsetAsync(dg, 0, d_bytes, stream), "grouped_gemm: zero D[g] of an empty group");
  }
  // The non-empty groups, spread over a few streams (host arrays: one after another).
  std::vector<int64_t> order;
  for (int64_t g = 0; g < a.groups; ++g)
    if (a.group_sizes[g] > 0) order.push_back(g);
  const int lanes = host ? 1 : int(std::min<size_t>(order.size(), kPerGroupStreams));
  // Every group's dense call; on the device, the scale conversions they would each launch are
  // queued into one batch (plans looked up once per group size).
  const bool mg = a.group_dim == GroupDim::kM;
  std::vector<GemmArgs> calls(size_t(a.groups));
  ScaleBatch batch;
  std::map<int64_t, const Plan*> plans;
  std::vector<int64_t> first(size_t(a.groups) + 1, 0);  // m-grouped: first row; k-grouped: first column
  for (int64_t g = 0; g < a.groups; ++g) first[size_t(g) + 1] = first[size_t(g)] + a.group_sizes[g];
  std::vector<int64_t> offs;  // m-grouped: each group's offset into A's scales
  if (mg) offs = grouped_scale_offsets(a);
  const layouts::ScaleLayout la(a.a.recipe, a.m, a.k, a.a.scale_format), lb(a.b.recipe, a.n, a.k, a.b.scale_format);
  for (int64_t g : order) {
    GemmArgs& c = calls[size_t(g)] = mg ? m_group_call(a, first, offs, g) : k_group_call(a, g);
    if (host) continue;  // the host reference reads any layout; k-groups stage theirs below
    const Plan*& p = plans[a.group_sizes[g]];
    if (!p) p = &dispatch::cached_plan(impl, mg ? m_group_view(a, first, offs, g) : c, stream);
    const ScaleFormat to = takes_cublaslt_scales(*p) ? ScaleFormat::kCublasLt : ScaleFormat::kCompact;
    if (mg) {
      if (converts_scales(*p, c.a, true))
        batch.add(layouts::ScaleLayout(c.a.recipe, c.m, c.k, ScaleFormat::kCompact), c.a.scale, 0,
                  layouts::ScaleLayout(c.a.recipe, c.m, c.k, to), &c.a);
      if (converts_scales(*p, c.b, false))
        batch.add(layouts::ScaleLayout(c.b.recipe, c.n, c.k, ScaleFormat::kCompact), c.b.scale, 0,
                  layouts::ScaleLayout(c.b.recipe, c.n, c.k, to), &c.b);
    } else {  // the group's K slice of the whole tensors' scales, in the layout its plan reads
      batch.add(la, a.a.scale, first_kblock(la, first[size_t(g)]), layouts::ScaleLayout(a.a.recipe, a.m, c.k, to), &c.a);
      batch.add(lb, a.b.scale, first_kblock(lb, first[size_t(g)]), layouts::ScaleLayout(a.b.recipe, a.n, c.k, to), &c.b);
    }
  }
  // k-grouped groups gather their K columns into their stream's staging buffer: a stream runs its
  // groups one after another, so one buffer per stream serves them all. Without forked streams that
  // is the caller's, which also holds the batch.
  size_t need = mg ? 0 : k_stage_bytes(a);
  for (int64_t g : order) {
    if (!mg) break;
    const auto [ab, bb] = m_stage(calls[size_t(g)]);
    need = std::max(need, ab || bb ? al256(ab) + al256(bb) : 0);
  }
  const bool one_lane = lanes < 2;
  dispatch::StagingScratch caller_scratch;
  std::vector<uint8_t> host_stage;
  char* caller_stage = nullptr;
  if (host) {
    host_stage.resize(need);
    caller_stage = reinterpret_cast<char*>(host_stage.data());
  } else if (batch.count() > 0 || (need > 0 && one_lane)) {
    caller_scratch = dispatch::staging_scratch(impl, stream, batch.bytes() + (one_lane ? need : 0));
    batch.run(caller_scratch.ptr, stream);
    caller_stage = caller_scratch.ptr + batch.bytes();
  }
  // The fork follows the batch, so every stream sees its conversions. Each stream takes the
  // next-largest group while it has the least work (M_g or K_g: the work of a group is proportional
  // to it), so the last stream to finish finishes early.
  dispatch::ForkedStreams forked = dispatch::fork_streams(impl, stream, lanes);
  std::vector<Stream> streams = forked.streams;
  if (streams.empty()) streams.push_back(stream);
  std::vector<int> lane_of(size_t(a.groups), 0);
  if (streams.size() > 1) {
    std::sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
      return a.group_sizes[x] != a.group_sizes[y] ? a.group_sizes[x] > a.group_sizes[y] : x < y;
    });
    std::array<int64_t, kPerGroupStreams> load{};
    for (int64_t g : order) {
      const size_t lane = size_t(std::min_element(load.begin(), load.begin() + streams.size()) - load.begin());
      lane_of[size_t(g)] = int(lane);
      load[lane] += a.group_sizes[g];
    }
  }
  if (mg && need == 0) {
    for (int64_t g : order) h.gemm(calls[size_t(g)], streams[size_t(lane_of[size_t(g)])]);
    return;
  }
  std::vector<dispatch::StagingScratch> scratch;  // locked in stream order: no two calls deadlock
  std::vector<char*> base;
  if (streams.size() == 1) {
    base.push_back(caller_stage);
  } else {
    for (Stream s : streams) {
      scratch.push_back(dispatch::staging_scratch(impl, s, need));
      base.push_back(scratch.back().ptr);
    }
  }
  for (int64_t g : order) {
    const size_t lane = size_t(lane_of[size_t(g)]);
    if (mg) {
      stage_m_data(calls[size_t(g)], base[lane], streams[lane]);
      h.gemm(calls[size_t(g)], streams[lane]);
      continue;
    }
    if (host) {
      h.gemm(stage_k_group(a, g, first[size_t(g)], base[lane], streams[lane]), streams[lane]);
      continue;
    }
    stage_k_data(a, first[size_t(g)], base[lane], streams[lane], calls[size_t(g)]);
    h.gemm(calls[size_t(g)], streams[lane]);
  }
}

// What a call's launches bake in, as a key for its whole-call graph: the sizes, shapes, dtypes,
// recipes, pointers, alpha and global scales, the stream and the device.
std::string replay_key(const GroupedGemmArgs& a, Stream stream, int device) {
  std::string k;
  auto put = [&k](const auto& v) { k.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(a.group_dim), put(a.groups), put(a.m), put(a.n), put(a.k), put(a.d), put(a.d_dtype), put(a.alpha);
  for (const GemmOperand* op : {&a.a, &a.b})
    put(op->data), put(op->dtype), put(op->recipe), put(op->scale), put(op->scale_format), put(op->global_scale);
  put(stream), put(device);
  k.append(reinterpret_cast<const char*>(a.group_sizes), size_t(a.groups) * sizeof(int64_t));
  return k;
}

// Why a graph_replay call runs without its graph (empty: it can have one).
std::string graph_blocker(const GroupedGemmArgs& a, Stream stream, verify::Mode mode) {
  if (a.space == MemorySpace::kHost) return "host arrays";
  if (dispatch::is_default_stream(stream)) return "the default stream cannot be captured";
  if (mode != verify::Mode::kOff) return "SCALEMM_VERIFY checks each call";
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  detail::cuda_check(cudaStreamIsCapturing(stream, &capturing), "grouped_gemm: capture status");
  if (capturing != cudaStreamCaptureStatusNone) return "the caller is capturing the stream";
  return "";
}

}  // namespace

void Handle::grouped_gemm(const GroupedGemmArgs& a, Stream stream) {
  const bool host = a.space == MemorySpace::kHost;
  // The call's device (the stream's), then the backend for it (its blocker reads no buffer), so that
  // the checks fit what runs.
  const int device = host ? -1 : dispatch::call_device(*impl_, stream);
  const DeviceTarget& target = host ? this->target() : dispatch::device_target(*impl_, device);
  const std::string why = cutlass_blocker(a, target, dispatch::handle_options(*impl_).plan);
  throw_if_any(validate_grouped(a, why.empty() ? Depth::kWhole : Depth::kPerGroup), StatusCode::kInvalidArgument);
  // The whole tensors' memory space and device, before any group runs (the groups are views into
  // them, and k-grouped groups read staged copies that the dense check never sees).
  if (!host) {
    GemmArgs whole;
    whole.a = a.a, whole.b = a.b, whole.d = a.d, whole.space = a.space;
    throw_if_any(dispatch::check_pointers(*impl_, whole, stream, device), StatusCode::kInvalidArgument);
  }
  // Staging, its copies and every launch go to the stream's device.
  const dispatch::DeviceScope scope(host ? -1 : dispatch::scope_device(*impl_, stream, device));
  if (why.empty()) {
    const size_t need = backends::cutlass_grouped::workspace_bytes(a, target);
    {
      dispatch::StagingScratch scratch = dispatch::staging_scratch(*impl_, stream, need);
      backends::cutlass_grouped::run(a, stream, scratch.ptr, need, scratch.generation);
    }
    const verify::Mode mode = dispatch::handle_verify_mode(*impl_);
    if (mode != verify::Mode::kOff) verify_cutlass_call(*impl_, a, mode, stream);
    return;
  }
  if (a.backend == GroupedBackend::kCutlass)
    throw Error(StatusCode::kUnsupported, "backend: the CUTLASS grouped kernel cannot run this call: " + why +
                                              ". Fix: pass GroupedBackend::kAuto or kPerGroup.");
  if (a.group_sizes_device) {
    const std::vector<int64_t> sizes = sizes_to_host(a, why, stream);
    GroupedGemmArgs h = a;
    h.group_sizes = sizes.data(), h.group_sizes_device = nullptr, h.device_status = nullptr;
    throw_if_any(validate(h), StatusCode::kInvalidArgument);
    if (a.device_status)
      detail::cuda_check(cudaMemsetAsync(a.device_status, 0, sizeof(int32_t), stream), "grouped_gemm: device_status");
    grouped_gemm(h, stream);
    return;
  }
  if (a.graph_replay && graph_blocker(a, stream, dispatch::handle_verify_mode(*impl_)).empty()) {
    // Replayed while the call repeats exactly; otherwise run as usual (which allocates whatever the
    // call needs and computes D), then captured for the next time.
    const std::string key = replay_key(a, stream, device);
    if (dispatch::replay_graph(*impl_, key, stream)) return;
    run_groups(*this, *impl_, a, stream);
    const uint64_t epoch = dispatch::arena_epoch_now();
    cudaStream_t cs = reinterpret_cast<cudaStream_t>(stream);
    detail::cuda_check(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal), "grouped_gemm: graph capture");
    cudaGraph_t graph = nullptr;
    try {
      run_groups(*this, *impl_, a, stream);
    } catch (...) {
      cudaStreamEndCapture(cs, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    detail::cuda_check(cudaStreamEndCapture(cs, &graph), "grouped_gemm: graph capture");
    cudaGraphExec_t exec = nullptr;
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    detail::cuda_check(made, "grouped_gemm: graph instantiation");
    dispatch::keep_graph(*impl_, key, exec, epoch);
    return;
  }
  run_groups(*this, *impl_, a, stream);
}

std::string Handle::explain(const GroupedGemmArgs& a) {
  throw_if_any(validate(a), StatusCode::kInvalidArgument);
  std::ostringstream os;
  os << "grouped (" << to_string(a.group_dim) << "), G=" << a.groups << ", ";
  const std::string why = cutlass_blocker(a, target(), dispatch::handle_options(*impl_).plan);
  if (why.empty()) {
    os << "CUTLASS grouped backend: " << backends::cutlass_grouped::describe(a);
    if (a.graph_replay) os << " (graph_replay has no effect: the call is one launch already)";
    if (a.fast_accum) os << "; accumulates exactly (fast_accum applies to the per-group backend's cuBLASLt calls)";
    return os.str();
  }
  if (a.group_sizes_device) {
    os << "per-group backend (CUTLASS grouped kernel passed over: " << why << "): the device-side sizes are copied"
       << " to the host at each call (one stream synchronisation), then each non-empty group runs its dense plan";
    return os.str();
  }
  // One plan per distinct group shape (what the plan cache holds), with the groups that share it.
  std::map<int64_t, std::vector<int64_t>> by_size;
  for (int64_t g = 0; g < a.groups; ++g) by_size[a.group_sizes[g]].push_back(g);
  const int64_t busy = a.groups - (by_size.count(0) ? int64_t(by_size[0].size()) : 0);
  os << "per-group backend: one dense call per non-empty group, " << by_size.size() << " distinct group shape(s)"
     << " (CUTLASS grouped kernel passed over: " << why << ")";
  if (a.space == MemorySpace::kDevice && busy > 1)
    os << "; the groups run on " << std::min<int64_t>(busy, int64_t(kPerGroupStreams))
       << " streams forked from the caller's, each with its own workspace";
  if (a.space == MemorySpace::kDevice && busy > 0) {
    bool converts = a.group_dim == GroupDim::kK;  // every k-group's K slice of the scales
    int64_t staged = 0;
    if (!converts) {
      std::vector<int64_t> rows(size_t(a.groups) + 1, 0);
      for (int64_t g = 0; g < a.groups; ++g) rows[size_t(g) + 1] = rows[size_t(g)] + a.group_sizes[g];
      const std::vector<int64_t> offs = grouped_scale_offsets(a);
      for (int64_t g = 0; g < a.groups; ++g) {
        if (a.group_sizes[g] == 0) continue;
        const auto [ab, bb] = m_stage(m_group_call(a, rows, offs, g));
        staged += ab || bb;
        if (converts) continue;
        const GemmArgs c = m_group_view(a, rows, offs, g);
        const Plan p = plan(c);
        converts = converts_scales(p, c.a, true) || converts_scales(p, c.b, false);
      }
    }
    if (converts) os << "; every group's scale conversions run in one launch before the groups";
    if (staged)
      os << "; " << staged << " group(s) whose A rows or expert B start off 16-byte alignment (K x element size"
         << " not a multiple of 16) run on aligned copies";
    if (a.graph_replay)
      os << "; graph_replay: on a non-default stream the whole call is captured as a CUDA graph on its first run"
         << " and replayed while it repeats exactly";
  }
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
    c.a = a.a, c.b = a.b, c.d_dtype = a.d_dtype, c.space = a.space, c.fast_accum = a.fast_accum;
    if (a.group_dim == GroupDim::kK) c.a.scale_format = c.b.scale_format = ScaleFormat::kCompact;
    os << plan(c).explain();
  }
  return os.str();
}

#if !SCALEMM_HAVE_CUTLASS
// Without CUTLASS's headers the grouped kernel is absent; the per-group backend runs every call.
namespace backends::cutlass_grouped {
bool built() { return false; }
std::string blocker(const GroupedGemmArgs&, const DeviceTarget&) { return "not built"; }
std::string slower_than_per_group(const GroupedGemmArgs&) { return {}; }
size_t workspace_bytes(const GroupedGemmArgs&, const DeviceTarget&) { return 0; }
void run(const GroupedGemmArgs&, Stream, char*, size_t, uint64_t) {
  throw Error(StatusCode::kInternal, "cutlass_grouped: not built");
}
std::string describe(const GroupedGemmArgs&) { return "not built"; }
}  // namespace backends::cutlass_grouped
#endif

}  // namespace scalemm
