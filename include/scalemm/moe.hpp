// Token dispatch and combine of an MoE layer (quantize/moe_dispatch.cu): the index math that puts the
// (token, k) pairs of a router's top-k choice into expert-major order, and the weighted sum that brings
// the experts' rows back, both on the device without synchronisation (capturable in a CUDA graph) and
// deterministic. The rows themselves are gathered by the grouped quantizer (quantize::quantize_grouped
// with TokenGroups::gather), so the gathered high-precision copy is never written.
//
// Every function takes a MemorySpace: kDevice enqueues on `stream`; kHost runs the same arithmetic on the
// calling thread over host memory (the reference the tests compare the kernels with).
#pragma once

#include <cstddef>
#include <cstdint>

#include "scalemm/types.hpp"

namespace scalemm::moe {

/// A router's choice: top_k_index (tokens, top_k) row-major int64 expert ids. Ids outside [0, experts)
/// are expert-parallel sentinels (another rank's experts): they contribute nothing.
struct TopK {
  const int64_t* index = nullptr;
  int64_t tokens = 0, top_k = 0, experts = 0;  ///< experts >= 1
  SCALEMM_HD int64_t pairs() const { return tokens * top_k; }
};

/// The pair's bucket: its expert, or `experts` for a sentinel (sorted after every expert).
SCALEMM_HD inline int64_t expert_bucket(int64_t id, int64_t experts) { return id >= 0 && id < experts ? id : experts; }

/// Device scratch bytes of route() (per-chunk counts; 0 on the host).
size_t route_workspace_bytes(int64_t pairs, int64_t experts);

/// The stable counting sort of the M = tokens top_k pairs p = t top_k + j by bucket:
///   row_pair[r] (M): the pair at sorted row r (pairs of one expert in increasing p), -1 for the
///     sentinels' rows, which follow every expert's;
///   pos[p] (M): the sorted row of pair p, -1 for a sentinel pair;
///   sizes[e] (experts): expert e's rows; the last expert's count includes the sentinels' rows, so the
///     sizes sum to M (the m-grouped GEMMs' contract; those rows are zero and never read back).
/// `workspace`: route_workspace_bytes() of device scratch (kDevice), or null on the host.
void route(const TopK& topk, int64_t* pos, int64_t* row_pair, int64_t* sizes, void* workspace, size_t workspace_bytes,
           MemorySpace space, Stream stream);

/// out[t, :] = sum over j < top_k, in j order, of w[t, j] * y[pos[t, j], :] (w = 1 where weights is
/// null), each product and each sum rounded to fp32, a sentinel (pos < 0) adding +0; the sum rounded to
/// `dtype` (to nearest even). y (rows, hidden) and out (tokens, hidden) row-major of dtype (bf16, f16,
/// f32); pos (tokens, top_k) int64, values < rows; weights (tokens, top_k) fp32.
void combine(const void* y, DType dtype, int64_t rows, int64_t hidden, const int64_t* pos, int64_t tokens,
             int64_t top_k, const float* weights, void* out, MemorySpace space, Stream stream);

/// The routing weights' gradient of combine(): dw[t, j] = sum over c of dout[t, c] * y[pos[t, j], c],
/// products and sums in fp64 (in an order of the implementation's), rounded to fp32; 0 for a sentinel.
/// dout (tokens, hidden) and y (rows, hidden) of dtype; dw (tokens, top_k) fp32.
void combine_weight_grad(const void* dout, const void* y, DType dtype, int64_t rows, int64_t hidden,
                         const int64_t* pos, int64_t tokens, int64_t top_k, float* dw, MemorySpace space,
                         Stream stream);

}  // namespace scalemm::moe
