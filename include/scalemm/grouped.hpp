// Grouped (MoE) scaled GEMMs: many GEMMs of one recipe pair that share an operand's layout.
//
//  m-grouped (2D x 3D; forward and dgrad): A (sum M_g, K) with the rows of group g consecutive,
//    B (G, N, K), D (sum M_g, N): the D rows of group g = A rows of g * B[g]^T.
//  k-grouped (2D x 2D; weight gradient): A (M, sum K_g), B (N, sum K_g), D (G, M, N):
//    D[g] = A[:, K_g columns of g] * B[:, K_g columns of g]^T.
//
// Scales, in either format:
//  * m-grouped A: each group's own scale buffer for its (M_g, K) rows, concatenated in group order
//    (layouts::grouped_offsets). For per-row recipes in compact format (rowwise, block1x128, mxfp8,
//    nvfp4) that is exactly the whole tensor's compact scales; block128x128 and mxfp8-32x32 start a
//    new block grid at each group; tensorwise has one scale per group. An empty group's buffer is
//    empty, for every recipe.
//  * m-grouped B: stacked per expert, (G, *one (N, K) operand's buffer); tensorwise (G,).
//  * k-grouped A and B: the whole tensor's scales, (M, sum K_g) and (N, sum K_g): every K_g falls on
//    the K-block boundaries of both recipes, so each group's blocks are a column range of them.
//  * In cublaslt format every group's buffer starts on a 16-byte boundary, as cuBLASLt reads scales
//    (zero bytes pad a buffer whose size is not a multiple of 16: rowwise, tensorwise); compact
//    buffers follow each other directly. grouped_scale_offsets gives the byte offsets.
//  * NVFP4's global scale is one per operand (GemmOperand::global_scale), shared by the groups.
// Empty groups are legal: an m-grouped one has no D rows; a k-grouped one writes D[g] = 0.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scalemm/gemm.hpp"

namespace scalemm {

enum class GroupDim : uint8_t {
  kM = 0,  ///< m-grouped: A rows grouped, B (G, N, K)
  kK = 1,  ///< k-grouped: the reduction dimension grouped, D (G, M, N)
};
std::string_view to_string(GroupDim g);

/// Which grouped backend runs a call. kAuto takes the contiguous kernel wherever it can run the call
/// (m-grouped block1x128 x block128x128 FP8 on sm_90, compact scales, bf16 output; measured faster
/// than the CUTLASS kernel there), else a CUTLASS grouped kernel (blockwise or rowwise FP8 on sm_90,
/// bf16 output) except for large groups with host sizes, where the per-group backend measured
/// faster, else the per-group backend; the others insist, and a call the chosen one cannot run is
/// refused (kUnsupported) with the reason.
enum class GroupedBackend : uint8_t {
  kAuto = 0,
  kCutlass = 1,   ///< one launch of CUTLASS's Hopper pointer-array kernel for all groups
  kPerGroup = 2,  ///< one dense call per non-empty group (every recipe pair; bit-identical to dense calls)
  kContiguous = 3,  ///< one launch of scalemm's own Hopper kernel: m-grouped block1x128 x block128x128, bf16 out
};
std::string_view to_string(GroupedBackend b);

struct GroupedGemmArgs {
  GroupDim group_dim = GroupDim::kM;
  int64_t groups = 0;                 ///< G >= 1
  const int64_t* group_sizes = nullptr;  ///< G sizes in host memory: M_g (m-grouped) or K_g (k-grouped)
  /// Or the G sizes in device memory (int32 or int64; leave group_sizes null): the router's token
  /// counts as they are. The CUTLASS grouped backend reads them on the device, with no host
  /// synchronisation; any other backend copies them to the host first (one stream synchronisation,
  /// said in explain(), refused inside a graph capture). Sizes that turn out invalid on the device
  /// (negative, not summing to m or k, a K_g off a K-block boundary) make the call write nothing and
  /// set *device_status.
  const void* group_sizes_device = nullptr;
  bool group_sizes_int64 = false;     ///< element type of group_sizes_device: int64 (true) or int32
  /// Optional device word for calls with device-side sizes: set to 0 when the sizes were valid, else
  /// to 1 + the index of the first bad group (G + 1 when only their sum is wrong). Read it whenever
  /// the stream is next synchronised anyway.
  int32_t* device_status = nullptr;
  int64_t m = 0, n = 0, k = 0;        ///< m-grouped: m = sum M_g, k = K; k-grouped: k = sum K_g
  GemmOperand a, b;                   ///< as for a dense call; B of an m-grouped call holds G experts
  void* d = nullptr;
  DType d_dtype = DType::kBF16;       ///< bf16, f16 or f32
  float alpha = 1.0f;
  MemorySpace space = MemorySpace::kDevice;
  GroupedBackend backend = GroupedBackend::kAuto;
  /// GemmArgs::fast_accum for every group (tensorwise and rowwise): the per-group backend's cuBLASLt
  /// calls take it, and the CUTLASS rowwise kernel runs its fast-accumulation mainloop (explain() says
  /// which accumulation a call gets).
  bool fast_accum = false;
  /// Per-group backend: capture the whole call (its scale conversions, the fork, every group's
  /// launches, the join) as a CUDA graph the first time, and replay it while the call repeats
  /// exactly (the same sizes, shapes, pointers, alpha, stream and device), so a call costs one graph
  /// launch of host time. For loops with fixed sizes and fixed buffers (decoding); a call whose
  /// pointers or sizes change each time pays a capture on top of its run instead. The first call
  /// runs as usual, then captures; a graph is captured anew after any stream's buffers grew. The
  /// CUTLASS kernel is one launch already and ignores it, as does a call with host arrays, on the
  /// default stream (which cannot be captured), under SCALEMM_VERIFY, or inside the caller's own
  /// capture. Handle::grouped_graph_counts() says how often graphs were captured and replayed.
  bool graph_replay = false;
};

/// Checks everything that does not need a backend: G, the sizes (non-negative, summing to m or k),
/// K-block boundaries of k-grouped sizes (naming the group and what to pad to), dtypes, null
/// pointers. Each group's operands are then checked by the dense validate() when they run.
Diagnostics validate(const GroupedGemmArgs& args);

/// The part of validate() that concerns the call's arguments and its group sizes, without the
/// operand checks (cheap for any G); grouped_gemm() still runs the checks the chosen backend needs.
Diagnostics validate_sizes(const GroupedGemmArgs& args);

/// Byte offsets of each group's A scale buffer in an m-grouped call (G + 1 entries; the last is the
/// size of the whole buffer).
std::vector<int64_t> grouped_scale_offsets(const GroupedGemmArgs& args);

/// Bytes between two experts' scale buffers in B of an m-grouped call.
int64_t grouped_b_scale_stride(const GroupedGemmArgs& args);

}  // namespace scalemm
