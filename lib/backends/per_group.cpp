// The per-group grouped backend (backends/per_group.hpp): one dense call per non-empty group, each
// planned (cached per distinct group shape) and run by the dense backends, so every group is
// bit-identical to the same dense call and every recipe pair the dense call accepts works grouped.
// The handle's grouped entry points (dispatch/grouped_handle.cpp) choose it when the CUTLASS grouped
// kernel cannot run a call. It needs the sizes on the host.
//  * A device call's groups are spread over up to four streams forked from the caller's (events, so
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
#include <memory>
#include <sstream>
#include <tuple>

#include "backends/grouped_backend.hpp"
#include "backends/per_group.hpp"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/grouped.hpp"
#include "scalemm/layouts/convert.hpp"
#include "scalemm/layouts/convert_cuda.hpp"

namespace scalemm::backends {
namespace per_group {

// Streams the per-group backend spreads a device call's groups over (each with its own workspace).
// Four keep a few small GEMMs in flight at once; more add fork/join work without filling the GPU more.
constexpr size_t kPerGroupStreams = 4;

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
    op->scale_format = to.format;  // what the call's plan reads; the buffer follows in run()
    bytes_ += (size_t(to.bytes()) + 255) / 256 * 256;
  }
  size_t bytes() const { return bytes_; }
  size_t count() const { return items_.size(); }
  // Converts into `region` (bytes() long) on `stream` and points each operand at its buffer.
  void run(char* region, Stream stream) {
    for (size_t i = 0; i < items_.size(); ++i) {
      items_[i].dst = region + offsets_[i];
      ops_[i]->scale = items_[i].dst;
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

namespace {

// Every non-empty group's dense call, on host sizes, after validation. Everything the call allocates
// (the caller's staging, each forked stream's staging and workspace) is allocated before anything is
// enqueued: a device out-of-memory then leaves D as it was, not with some groups written.
void run_groups(const GroupedGemmArgs& a, Stream stream, GroupedServices& svc) {
  const bool host = a.space == MemorySpace::kHost;
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
    if (!p) p = &svc.dense_plan(mg ? m_group_view(a, first, offs, g) : c, stream);
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
  // The dense plan each group runs: that of the call as it runs, its scales in the layout the batch
  // gives them (a plan depends on the formats, not on the addresses), looked up once per shape.
  std::vector<const Plan*> plan_of(size_t(a.groups), nullptr);
  std::map<std::pair<int64_t, std::pair<ScaleFormat, ScaleFormat>>, const Plan*> by_shape;
  for (int64_t g : order) {
    const GemmArgs& c = calls[size_t(g)];
    const auto key = std::make_pair(a.group_sizes[g], std::make_pair(c.a.scale_format, c.b.scale_format));
    const Plan*& p = by_shape[key];
    if (!p) p = &svc.dense_plan(c, stream);
    plan_of[size_t(g)] = p;
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
  StagingScratch caller_scratch;
  std::vector<uint8_t> host_stage;
  char* caller_stage = nullptr;
  if (host) {
    host_stage.resize(need);
    caller_stage = reinterpret_cast<char*>(host_stage.data());
  } else if (batch.count() > 0 || (need > 0 && one_lane)) {
    caller_scratch = svc.staging(stream, batch.bytes() + (one_lane ? need : 0));
    caller_stage = caller_scratch.ptr + batch.bytes();
  }
  // Each stream takes the next-largest group while it has the least work (M_g or K_g: the work of a
  // group is proportional to it), so the last stream to finish finishes early.
  const std::unique_ptr<ForkedStreams> forked = svc.fork(stream, lanes);
  std::vector<Stream> streams = forked->streams;
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
  std::vector<StagingScratch> scratch;  // locked in stream order: no two calls deadlock
  std::vector<char*> base;
  if (streams.size() == 1) {
    base.push_back(caller_stage);
  } else if (need > 0) {
    for (Stream s : streams) {
      scratch.push_back(svc.staging(s, need));
      base.push_back(scratch.back().ptr);
    }
  }
  if (!host) {  // each stream's workspace, grown to its largest group's
    std::vector<size_t> lane_work(streams.size(), 0);
    for (int64_t g : order) {
      size_t& w = lane_work[size_t(lane_of[size_t(g)])];
      w = std::max(w, plan_of[size_t(g)]->workspace_bytes);
    }
    for (size_t i = 0; i < streams.size(); ++i) svc.reserve_dense(streams[i], lane_work[i]);
  }
  // Everything is allocated: from here on the call only enqueues. Empty k-groups first, on the
  // caller's stream (an empty reduction makes D[g] = 0), then the batch; the fork follows both, so
  // every stream sees the conversions.
  const size_t d_bytes = size_t(dtype_storage_bytes(a.d_dtype, a.m * a.n));
  for (int64_t g = 0; !mg && g < a.groups; ++g) {
    if (a.group_sizes[g] != 0) continue;
    uint8_t* dg = static_cast<uint8_t*>(a.d) + size_t(g) * d_bytes;
    if (host) std::memset(dg, 0, d_bytes);
    else detail::cuda_check(cudaMemsetAsync(dg, 0, d_bytes, stream), "grouped_gemm: zero D[g] of an empty group");
  }
  if (batch.count() > 0) batch.run(caller_scratch.ptr, stream);
  forked->begin();
  for (int64_t g : order) {
    const size_t lane = size_t(lane_of[size_t(g)]);
    if (mg) {
      if (need > 0) stage_m_data(calls[size_t(g)], base[lane], streams[lane]);
      svc.run_dense(calls[size_t(g)], *plan_of[size_t(g)], streams[lane]);
      continue;
    }
    if (host) {
      svc.run_dense(stage_k_group(a, g, first[size_t(g)], base[lane], streams[lane]), *plan_of[size_t(g)], streams[lane]);
      continue;
    }
    stage_k_data(a, first[size_t(g)], base[lane], streams[lane], calls[size_t(g)]);
    svc.run_dense(calls[size_t(g)], *plan_of[size_t(g)], streams[lane]);
  }
}


std::string explain_groups(Handle& h, const GroupedGemmArgs& a, const std::string& why) {
  std::ostringstream os;
  // One plan per distinct group shape (what the plan cache holds), with the groups that share it.
  std::map<int64_t, std::vector<int64_t>> by_size;
  for (int64_t g = 0; g < a.groups; ++g) by_size[a.group_sizes[g]].push_back(g);
  const int64_t busy = a.groups - (by_size.count(0) ? int64_t(by_size[0].size()) : 0);
  os << "per-group backend: one dense call per non-empty group, " << by_size.size() << " distinct group shape(s)"
     << " (" << why << ")";
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
        const Plan p = h.plan(c);
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
    os << h.plan(c).explain();
  }
  return os.str();
}

class PerGroup final : public GroupedBackendImpl {
 public:
  GroupedBackend id() const override { return GroupedBackend::kPerGroup; }
  // Every call that validates: each group is a dense call, which takes every recipe pair.
  Verdict plan(const GroupedGemmArgs&, const DeviceTarget&, const PlanOptions&) const override {
    return {true, "one dense call per non-empty group"};
  }
  bool one_launch() const override { return false; }
  void run(const GroupedGemmArgs& a, const GroupedRunContext& ctx) const override {
    run_groups(a, ctx.stream, *ctx.services);
  }
  std::string explain(Handle& h, const GroupedGemmArgs& a, const std::string& passed_over) const override {
    if (!a.group_sizes_device) return explain_groups(h, a, passed_over);
    return "per-group backend (" + passed_over + "): the device-side sizes are copied to the host at each call (one "
           "stream synchronisation), then each non-empty group runs its dense plan";
  }
};

}  // namespace
}  // namespace per_group

const GroupedBackendImpl& per_group_backend() {
  static const per_group::PerGroup b;
  return b;
}

}  // namespace scalemm::backends
