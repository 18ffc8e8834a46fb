// scalemm::moe (include/scalemm/moe.hpp): routing as a stable counting sort, combine and its weights'
// gradient, on the device and, for the same arithmetic on host memory, on the host. Compiled with
// -fmad=false (and no host contraction) so that both write the same bytes as torch's separate
// multiply and add kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/detail/device_state.hpp"
#include "scalemm/moe.hpp"
#include "scalemm/status.hpp"

namespace scalemm::moe {

using scalemm::detail::cuda_check;

namespace {
constexpr int64_t kChunk = 2048;      // pairs per block of the counting passes
constexpr int64_t kMaxExperts = 4096;  // the scatter pass keeps a cursor per bucket in shared memory

int64_t chunks_of(int64_t pairs) { return std::max<int64_t>(1, (pairs + kChunk - 1) / kChunk); }

// ---- element codecs (S: 0 f32, 1 bf16, 2 f16), host and device alike ------------------------------------
template <int S>
SCALEMM_HD float load(const void* p, int64_t i) {
  if constexpr (S == 0) return static_cast<const float*>(p)[i];
  else if constexpr (S == 1) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  else return __half2float(static_cast<const __half*>(p)[i]);
}
template <int S>
SCALEMM_HD void store(void* p, int64_t i, float v) {
  if constexpr (S == 0) static_cast<float*>(p)[i] = v;
  else if constexpr (S == 1) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  else static_cast<__half*>(p)[i] = __float2half_rn(v);
}

/// The term pair (t, j) adds to column c of combine(): +0 for a sentinel (or a row outside y).
template <int S>
SCALEMM_HD float combine_term(const void* y, int64_t rows, int64_t hidden, int64_t p, const float* w, int64_t pj,
                              int64_t c) {
  if (p < 0 || p >= rows) return 0.0f;
  const float v = load<S>(y, p * hidden + c);
  return w ? v * w[pj] : v;  // one rounding (no contraction in this file)
}

// ---- routing kernels ------------------------------------------------------------------------------------
__global__ void count_kernel(TopK tk, int64_t* counts) {
  extern __shared__ int bucket_count[];
  const int64_t b_n = tk.experts + 1;
  for (int64_t b = threadIdx.x; b < b_n; b += blockDim.x) bucket_count[b] = 0;
  __syncthreads();
  const int64_t p0 = int64_t(blockIdx.x) * kChunk, p1 = min(p0 + kChunk, tk.pairs());
  for (int64_t p = p0 + threadIdx.x; p < p1; p += blockDim.x) atomicAdd(&bucket_count[expert_bucket(tk.index[p], tk.experts)], 1);
  __syncthreads();  // integer counts: the same whatever the order of the adds
  for (int64_t b = threadIdx.x; b < b_n; b += blockDim.x) counts[int64_t(blockIdx.x) * b_n + b] = bucket_count[b];
}

/// counts[c][b] -> the first sorted row of chunk c's pairs of bucket b (bucket-major, then chunk), and
/// the experts' sizes. One block: each thread scans its buckets' chunks, then the buckets' totals are
/// scanned across the block.
__global__ void __launch_bounds__(1024) scan_kernel(int64_t experts, int64_t chunks, int64_t* counts, int64_t* sizes) {
  __shared__ int64_t part[1024];
  const int64_t b_n = experts + 1, per = (b_n + blockDim.x - 1) / blockDim.x;
  const int64_t b0 = min(int64_t(threadIdx.x) * per, b_n), b1 = min(b0 + per, b_n);
  int64_t mine = 0;
  for (int64_t b = b0; b < b1; ++b)
    for (int64_t c = 0; c < chunks; ++c) mine += counts[c * b_n + b];
  part[threadIdx.x] = mine;
  __syncthreads();
  for (int off = 1; off < int(blockDim.x); off <<= 1) {  // inclusive scan of the threads' totals
    const int64_t v = threadIdx.x >= unsigned(off) ? part[threadIdx.x - off] : 0;
    __syncthreads();
    part[threadIdx.x] += v;
    __syncthreads();
  }
  int64_t base = part[threadIdx.x] - mine;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t first = base;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t v = counts[c * b_n + b];
      counts[c * b_n + b] = base;
      base += v;
    }
    const int64_t total = base - first;
    if (b < experts - 1) sizes[b] = total;
    else if (b == experts - 1) atomicAdd(reinterpret_cast<unsigned long long*>(&sizes[b]), (unsigned long long)total);
    else atomicAdd(reinterpret_cast<unsigned long long*>(&sizes[experts - 1]), (unsigned long long)total);
  }
}

/// One warp per chunk, 32 pairs at a time in pair order: lanes of one bucket take consecutive rows in
/// lane order (__match_any_sync), so the sort is stable.
__global__ void __launch_bounds__(32) scatter_kernel(TopK tk, const int64_t* counts, int64_t* pos, int64_t* row_pair) {
  extern __shared__ int64_t cursor[];
  const int64_t b_n = tk.experts + 1;
  const int lane = int(threadIdx.x);
  for (int64_t b = lane; b < b_n; b += 32) cursor[b] = counts[int64_t(blockIdx.x) * b_n + b];
  __syncwarp();
  const int64_t p0 = int64_t(blockIdx.x) * kChunk, p1 = min(p0 + kChunk, tk.pairs());
  for (int64_t base = p0; base < p1; base += 32) {
    const int64_t p = base + lane;
    const bool active = p < p1;
    const int b = active ? int(expert_bucket(tk.index[p], tk.experts)) : -1;
    const unsigned same = __match_any_sync(0xFFFFFFFFu, b);
    const int64_t r = active ? cursor[b] + __popc(same & ((1u << lane) - 1u)) : 0;
    __syncwarp();
    if (active && lane == __ffs(int(same)) - 1) cursor[b] += __popc(same);
    __syncwarp();
    if (active) {
      const bool real = b < tk.experts;
      pos[p] = real ? r : -1;
      row_pair[r] = real ? p : -1;
    }
  }
}

void route_host(const TopK& tk, int64_t* pos, int64_t* row_pair, int64_t* sizes) {
  std::vector<int64_t> cursor(size_t(tk.experts + 1), 0);
  for (int64_t p = 0; p < tk.pairs(); ++p) ++cursor[size_t(expert_bucket(tk.index[p], tk.experts))];
  for (int64_t e = 0; e < tk.experts; ++e) sizes[e] = cursor[size_t(e)];
  sizes[tk.experts - 1] += cursor[size_t(tk.experts)];
  int64_t base = 0;
  for (auto& c : cursor) {
    const int64_t v = c;
    c = base;
    base += v;
  }
  for (int64_t p = 0; p < tk.pairs(); ++p) {
    const int64_t b = expert_bucket(tk.index[p], tk.experts), r = cursor[size_t(b)]++;
    pos[p] = b < tk.experts ? r : -1;
    row_pair[r] = b < tk.experts ? p : -1;
  }
}

// ---- combine ------------------------------------------------------------------------------------------
template <int S>
__global__ void __launch_bounds__(256) combine_kernel(const void* y, int64_t rows, int64_t hidden, const int64_t* pos,
                                                      int64_t top_k, const float* w, void* out) {
  const int64_t t = blockIdx.x;
  for (int64_t c = threadIdx.x; c < hidden; c += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < top_k; ++j) acc = acc + combine_term<S>(y, rows, hidden, pos[t * top_k + j], w, t * top_k + j, c);
    store<S>(out, t * hidden + c, acc);
  }
}

template <int S>
void combine_host(const void* y, int64_t rows, int64_t hidden, const int64_t* pos, int64_t tokens, int64_t top_k,
                  const float* w, void* out) {
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = 0; c < hidden; ++c) {
      float acc = 0.0f;
      for (int64_t j = 0; j < top_k; ++j) acc = acc + combine_term<S>(y, rows, hidden, pos[t * top_k + j], w, t * top_k + j, c);
      store<S>(out, t * hidden + c, acc);
    }
}

/// One warp per pair: lane-strided fp64 partial sums, then a fixed butterfly (deterministic).
template <int S>
__global__ void __launch_bounds__(256) weight_grad_kernel(const void* dout, const void* y, int64_t rows, int64_t hidden,
                                                          const int64_t* pos, int64_t pairs, int64_t top_k, float* dw) {
  const int64_t pj = int64_t(blockIdx.x) * 8 + (threadIdx.x >> 5);
  const int lane = int(threadIdx.x) & 31;
  if (pj >= pairs) return;  // warp-uniform
  const int64_t p = pos[pj], t = pj / top_k;
  double acc = 0.0;
  if (p >= 0 && p < rows)
    for (int64_t c = lane; c < hidden; c += 32) acc += double(load<S>(dout, t * hidden + c)) * double(load<S>(y, p * hidden + c));
  for (int off = 16; off; off >>= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, off);
  if (lane == 0) dw[pj] = float(acc);
}

template <int S>
void weight_grad_host(const void* dout, const void* y, int64_t rows, int64_t hidden, const int64_t* pos, int64_t pairs,
                      int64_t top_k, float* dw) {
  for (int64_t pj = 0; pj < pairs; ++pj) {
    const int64_t p = pos[pj], t = pj / top_k;
    double lane_sum[32] = {};
    if (p >= 0 && p < rows)
      for (int64_t c = 0; c < hidden; ++c)
        lane_sum[c % 32] += double(load<S>(dout, t * hidden + c)) * double(load<S>(y, p * hidden + c));
    for (int off = 16; off; off >>= 1)  // the kernel's butterfly: lane 0's value after each step
      for (int l = 0; l < 32; ++l)
        if (l < off) lane_sum[l] += lane_sum[l + off];
    dw[pj] = float(lane_sum[0]);
  }
}

template <class F>
void by_dtype(DType dtype, F&& f) {
  if (dtype == DType::kBF16) f(std::integral_constant<int, 1>{});
  else if (dtype == DType::kF16) f(std::integral_constant<int, 2>{});
  else f(std::integral_constant<int, 0>{});
}

void check_rows(Diagnostics& d, DType dtype, int64_t rows, int64_t hidden, int64_t tokens, int64_t top_k) {
  if (dtype != DType::kBF16 && dtype != DType::kF16 && dtype != DType::kF32)
    d.push_back({"dtype", "moe-rows-dtype", "the experts' rows are 16- or 32-bit floats", "bf16, f16 or f32",
                 std::string(to_string(dtype)), {}});
  if (rows < 0 || hidden < 0 || tokens < 0 || top_k < 1)
    d.push_back({"shape", "moe-shape", "non-negative sizes and at least one choice per token",
                 "rows, hidden, tokens >= 0 and top_k >= 1",
                 std::to_string(rows) + ", " + std::to_string(hidden) + ", " + std::to_string(tokens) + ", " +
                     std::to_string(top_k), {}});
}
}  // namespace

size_t route_workspace_bytes(int64_t pairs, int64_t experts) {
  return size_t(chunks_of(pairs) * (std::max<int64_t>(experts, 0) + 1)) * sizeof(int64_t);
}

void route(const TopK& tk, int64_t* pos, int64_t* row_pair, int64_t* sizes, void* workspace, size_t workspace_bytes,
           MemorySpace space, cudaStream_t stream) {
  Diagnostics d;
  if (tk.experts < 1 || tk.experts > kMaxExperts)
    d.push_back({"experts", "moe-experts", "a bucket per expert in shared memory", "1 .. " + std::to_string(kMaxExperts),
                 std::to_string(tk.experts), {}});
  if (tk.tokens < 0 || tk.top_k < 1)
    d.push_back({"top_k_index", "moe-top-k", "a (tokens, top_k) choice", "tokens >= 0 and top_k >= 1",
                 std::to_string(tk.tokens) + " x " + std::to_string(tk.top_k), {}});
  if (tk.pairs() > 0 && (!tk.index || !pos || !row_pair)) d.push_back({"buffers", "moe-route-buffers", "index, pos and row_pair", "non-null", "null", {}});
  if (!sizes) d.push_back({"sizes", "moe-route-buffers", "one count per expert", "non-null", "null", {}});
  if (space == MemorySpace::kDevice && (!workspace || workspace_bytes < route_workspace_bytes(tk.pairs(), tk.experts)))
    d.push_back({"workspace", "moe-route-workspace", "per-chunk counts", std::to_string(route_workspace_bytes(tk.pairs(), tk.experts)) + " bytes",
                 std::to_string(workspace_bytes) + (workspace ? " bytes" : " (null)"), "Use route_workspace_bytes()."});
  throw_if_any(d, StatusCode::kInvalidArgument);
  if (space == MemorySpace::kHost) return route_host(tk, pos, row_pair, sizes);
  const scalemm::detail::DeviceScope scope(scalemm::detail::stream_device(stream));
  const int64_t chunks = chunks_of(tk.pairs()), b_n = tk.experts + 1;
  auto* counts = static_cast<int64_t*>(workspace);
  SCALEMM_EXPECTS(chunks <= int64_t(0x7FFFFFFF), StatusCode::kUnsupported, "moe::route: too many pairs");
  cuda_check(cudaMemsetAsync(sizes + tk.experts - 1, 0, sizeof(int64_t), stream), "moe::route sizes");
  count_kernel<<<unsigned(chunks), 256, size_t(b_n) * sizeof(int), stream>>>(tk, counts);
  scan_kernel<<<1, 1024, 0, stream>>>(tk.experts, chunks, counts, sizes);
  if (tk.pairs() > 0) scatter_kernel<<<unsigned(chunks), 32, size_t(b_n) * sizeof(int64_t), stream>>>(tk, counts, pos, row_pair);
  cuda_check(cudaGetLastError(), "moe::route launch");
}

void combine(const void* y, DType dtype, int64_t rows, int64_t hidden, const int64_t* pos, int64_t tokens,
             int64_t top_k, const float* weights, void* out, MemorySpace space, cudaStream_t stream) {
  Diagnostics d;
  check_rows(d, dtype, rows, hidden, tokens, top_k);
  if (tokens * hidden > 0 && (!out || !pos || (rows > 0 && !y)))
    d.push_back({"buffers", "moe-combine-buffers", "y, pos and out", "non-null", "null", {}});
  throw_if_any(d, StatusCode::kInvalidArgument);
  if (tokens * hidden == 0) return;
  by_dtype(dtype, [&](auto s) {
    constexpr int S = decltype(s)::value;
    if (space == MemorySpace::kHost) return combine_host<S>(y, rows, hidden, pos, tokens, top_k, weights, out);
    const scalemm::detail::DeviceScope scope(scalemm::detail::stream_device(stream));
    SCALEMM_EXPECTS(tokens <= int64_t(0x7FFFFFFF), StatusCode::kUnsupported, "moe::combine: too many tokens");
    combine_kernel<S><<<unsigned(tokens), 256, 0, stream>>>(y, rows, hidden, pos, top_k, weights, out);
    cuda_check(cudaGetLastError(), "moe::combine launch");
  });
}

void combine_weight_grad(const void* dout, const void* y, DType dtype, int64_t rows, int64_t hidden, const int64_t* pos,
                         int64_t tokens, int64_t top_k, float* dw, MemorySpace space, cudaStream_t stream) {
  Diagnostics d;
  check_rows(d, dtype, rows, hidden, tokens, top_k);
  if (tokens > 0 && (!dw || !pos || (hidden > 0 && (!dout || (rows > 0 && !y)))))
    d.push_back({"buffers", "moe-combine-buffers", "dout, y, pos and dw", "non-null", "null", {}});
  throw_if_any(d, StatusCode::kInvalidArgument);
  const int64_t pairs = tokens * top_k;
  if (pairs == 0) return;
  by_dtype(dtype, [&](auto s) {
    constexpr int S = decltype(s)::value;
    if (space == MemorySpace::kHost) return weight_grad_host<S>(dout, y, rows, hidden, pos, pairs, top_k, dw);
    const scalemm::detail::DeviceScope scope(scalemm::detail::stream_device(stream));
    const int64_t blocks = (pairs + 7) / 8;
    SCALEMM_EXPECTS(blocks <= int64_t(0x7FFFFFFF), StatusCode::kUnsupported, "moe::combine_weight_grad: too many pairs");
    weight_grad_kernel<S><<<unsigned(blocks), 256, 0, stream>>>(dout, y, rows, hidden, pos, pairs, top_k, dw);
    cuda_check(cudaGetLastError(), "moe::combine_weight_grad launch");
  });
}

}  // namespace scalemm::moe
