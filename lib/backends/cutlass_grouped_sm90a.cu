// The CUTLASS grouped kernels (cutlass_grouped.hpp): what they run (blocker, workspace) and their
// launch, with the set-up kernel that builds the pointer-array kernels' per-group arguments on the
// device. The backend object that the handle's table holds is in cutlass_grouped.cpp.
//
// Blockwise scales: the kernel reads each group's scale grid as a packed CuTe layout of that group's
// own extents (cp.async, element by element), K-major or M/N-major by instantiation.
//  * m-grouped: the compact grids (sum M_g, ceil(K/128)) and, per expert, (ceil(N/128) or N,
//    ceil(K/128)) are K-major and packed for every group (all share K): read in place, no conversion.
//  * k-grouped: a group's K-blocks are a column window of (M, sum K_g/128), not packed in K-major;
//    transposed once to (sum K_g/128, M) they are (M-major, base at the group's first K-block). One
//    transpose launch for both operands, whatever the sizes, so device-side sizes work unchanged.
// Rowwise scales never enter the mainloop: the epilogue multiplies by A's row scale and B's column
// scale through per-group pointers into the caller's vectors, so nothing is converted.
#include "backends/cutlass_grouped.hpp"
#include "backends/cutlass_overlapped_mainloop.hpp"
#include "support/tool_marks.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <cub/block/block_scan.cuh>
#include <mutex>
#include <sstream>
#include <vector>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/detail/device_state.hpp"
#include "scalemm/layouts/scale_layout.hpp"
#include "scalemm/status.hpp"

namespace scalemm::backends::cutlass_grouped {
namespace {

using namespace cute;
using detail::cuda_check;

// Groups whose sizes travel inside the set-up kernel's parameters (host sizes): 16 KB of int32.
constexpr int64_t kMaxHostGroups = 4096;
constexpr int64_t kMaxGroups = 1 << 20;
constexpr int kSetupThreads = 256;

using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
using Problem = ProblemShape::UnderlyingProblemShape;

// The kernels: A block1x128 (GranM 1, GranK 128) with B at N granularity 128 (block128x128 weights) or
// 1 (block1x128); scale grids K-major (m-grouped) or M/N-major (k-grouped). 128x128x128 tiles, clusters
// of two along N (A tiles multicast), cooperative schedule, bf16 D stored with TMA, no C operand. The
// mainloop is CUTLASS's with the promotion of each K block overlapped with the next block's WGMMAs
// (cutlass_overlapped_mainloop.hpp).
using TileShape = Shape<_128, _128, _128>;
using ClusterShape = Shape<_1, _2, _1>;
using ElementA = cutlass::float_e4m3_t;
using ElementB = cutlass::float_e4m3_t;
using ElementD = cutlass::bfloat16_t;
using LayoutA = cutlass::layout::RowMajor;     // A (M, K), K contiguous
using LayoutB = cutlass::layout::ColumnMajor;  // B as CUTLASS's (K, N) = ours (N, K), K contiguous
using LayoutD = cutlass::layout::RowMajor;     // D (M, N)
constexpr int kAlignAB = 16, kAlignD = 8;
// The epilogue is common to every configuration (declared at namespace scope: inside a class template
// the host compiler cannot parse the builder's nested types).
using Epilogue = cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlignD, ElementD, LayoutD*, kAlignD,
    cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
    cutlass::epilogue::fusion::LinearCombination<ElementD, float, void, float>>::CollectiveOp;

#define SCALEMM_CUTLASS_GROUPED_CONFIG(NAME, GRAN_N, MAJOR)                                                      \
  struct NAME {                                                                                                 \
    static constexpr bool kBlockwise = true;                                                                    \
    using ElementA = cutlass_grouped::ElementA;                                                                 \
    using ElementB = cutlass_grouped::ElementB;                                                                 \
    using ElementD = cutlass_grouped::ElementD;                                                                 \
    using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, GRAN_N, 128, MAJOR, MAJOR>;                \
    using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());                                                \
    using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());                                                \
    using Mainloop = OverlappedPromotionMainloop<cutlass::gemm::collective::CollectiveBuilder<                  \
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, cute::tuple<LayoutA*, LayoutSFA*>,       \
        kAlignAB, ElementB, cute::tuple<LayoutB*, LayoutSFB*>, kAlignAB, float, TileShape, ClusterShape,        \
        cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(Epilogue::SharedStorage))>,  \
        cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise>::CollectiveOp>;                 \
    using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;                  \
    using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;                                       \
    using StrideA = GemmKernel::InternalStrideA;                                                                \
    using StrideB = GemmKernel::InternalStrideB;                                                                \
    using StrideD = GemmKernel::InternalStrideD;                                                                \
  }

// The instantiations: m-grouped (K-major scales) with either B, k-grouped (M/N-major) with block1x128 B.
SCALEMM_CUTLASS_GROUPED_CONFIG(MGrouped128, 128, cute::GMMA::Major::K);
SCALEMM_CUTLASS_GROUPED_CONFIG(MGrouped1, 1, cute::GMMA::Major::K);
SCALEMM_CUTLASS_GROUPED_CONFIG(KGrouped1, 1, cute::GMMA::Major::MN);
#undef SCALEMM_CUTLASS_GROUPED_CONFIG

// Rowwise x rowwise, both groupings: the plain FP8 pointer-array mainloop (fp32 promotion of the tensor
// cores' partial sums every 4 MMAs, as cuBLASLt's default) and an epilogue tree that computes
// alpha * (scale_b[n] * (scale_a[m] * acc)) with both vectors read through per-group pointers.
namespace rowwise_tree {
using namespace cutlass::epilogue::fusion;
template <class Out>
using Mul = Sm90Compute<cutlass::multiplies, Out, float, cutlass::FloatRoundStyle::round_to_nearest>;
template <class Tile>
using ScaleA = Sm90ColBroadcast<0, Tile, float*, float, Stride<_1, _0, _0>>;  // float*: one pointer per group
template <class Tile>
using ScaleB = Sm90RowBroadcast<0, Tile, float*, float, Stride<_0, _1, _0>>;
template <class Tile>
using Tree = Sm90EVT<Mul<ElementD>, Sm90ScalarBroadcast<float>,
                     Sm90EVT<Mul<float>, ScaleB<Tile>, Sm90EVT<Mul<float>, ScaleA<Tile>, Sm90AccFetch>>>;
}  // namespace rowwise_tree
template <class Tile, class Cluster>
using RowwiseEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlignD, ElementD, LayoutD*, kAlignD,
    cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative, rowwise_tree::Tree<Tile>>::CollectiveOp;
// Mainloops: exact (promotion every 4 MMAs) and, for fast_accum, CUTLASS's FP8 fast-accumulation
// schedule (the tensor cores' own accumulator over all of K, as cuBLASLt's FAST_ACCUM and torch's
// use_fast_accum=True grouped kernel). Fast accumulation over many rows per group takes 256 x 128
// tiles (wide_fast_accum()): with no promotion each consumer warpgroup holds a 128 x 128 accumulator,
// and each B tile crossing from L2 serves twice the rows. In clusters of two N tiles sharing A, as the
// 128 x 128 ones: against those (H100, interleaved, the same bits) 0.92-0.94x the time at
// 8 x 2048 x 4096 x 7168, 32 x 1024 x 2048 x 7168 and 16 x 512 x 4096 x 7168, 0.94-0.96x at 256 rows
// per group, 0.97-0.99x with grouped.py's uneven sizes; 1.04-1.32x below 256 rows per group on
// average. Two M tiles sharing B (2 x 1) took 1.10-2.7x wherever groups end inside tiles, 2 x 2 1.04-2.1x.
#define SCALEMM_CUTLASS_ROWWISE_CONFIG(NAME, SCHEDULE, TILE, CLUSTER)                                            \
  struct NAME {                                                                                                 \
    static constexpr bool kBlockwise = false;                                                                   \
    using ElementA = cutlass_grouped::ElementA;                                                                 \
    using ElementB = cutlass_grouped::ElementB;                                                                 \
    using ElementD = cutlass_grouped::ElementD;                                                                 \
    using LayoutSFA = int32_t; /* no scale grids: the per-group arrays keep their slots unused */               \
    using LayoutSFB = int32_t;                                                                                  \
    using Epilogue = RowwiseEpilogue<TILE, CLUSTER>;                                                            \
    using Mainloop = cutlass::gemm::collective::CollectiveBuilder<                                              \
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA*, kAlignAB, ElementB, LayoutB*,  \
        kAlignAB, float, TILE, CLUSTER,                                                                         \
        cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>, \
        SCHEDULE>::CollectiveOp;                                                                                \
    using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;                  \
    using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;                                       \
    using StrideA = GemmKernel::InternalStrideA;                                                                \
    using StrideB = GemmKernel::InternalStrideB;                                                                \
    using StrideD = GemmKernel::InternalStrideD;                                                                \
  }
SCALEMM_CUTLASS_ROWWISE_CONFIG(Rowwise, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative, TileShape, ClusterShape);
SCALEMM_CUTLASS_ROWWISE_CONFIG(RowwiseFastAccum, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8FastAccum,
                               TileShape, ClusterShape);
using WideTileShape = Shape<_256, _128, _128>;
SCALEMM_CUTLASS_ROWWISE_CONFIG(RowwiseFastAccumWide, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8FastAccum,
                               WideTileShape, ClusterShape);
#undef SCALEMM_CUTLASS_ROWWISE_CONFIG

// The per-group argument arrays, carved from the workspace in this order (each 256-byte aligned),
// then the k-grouped transposed scales and the kernel's own workspace.
template <class C>
struct Arrays {
  Problem* shapes;
  const typename C::ElementA** a;
  const typename C::ElementB** b;
  typename C::ElementD** d;
  const float** sfa;
  const float** sfb;
  typename C::StrideA* stride_a;
  typename C::StrideB* stride_b;
  typename C::StrideD* stride_d;
  typename C::LayoutSFA* layout_sfa;
  typename C::LayoutSFB* layout_sfb;
  int32_t* empty;  // k-grouped: 1 for a group whose D[g] must be zeroed
  float* sa_t;     // k-grouped: A's scales transposed, (sum K_g/128, M)
  float* sb_t;     // k-grouped: B's scales transposed, (sum K_g/128, N)
  char* kernel_workspace;

  static size_t al(size_t b) { return (b + 255) / 256 * 256; }
  // Lays the arrays out from `base` (nullptr: only counts) and returns the bytes used.
  size_t carve(char* base, int64_t groups, size_t transposed_a, size_t transposed_b, size_t kernel_bytes) {
    size_t off = 0;
    auto take = [&](auto*& p, size_t bytes) {
      p = reinterpret_cast<std::remove_reference_t<decltype(p)>>(base ? base + off : nullptr);
      off += al(bytes);
    };
    const size_t g = size_t(groups);
    take(shapes, g * sizeof(Problem));
    take(a, g * sizeof(void*));
    take(b, g * sizeof(void*));
    take(d, g * sizeof(void*));
    take(sfa, g * sizeof(void*));
    take(sfb, g * sizeof(void*));
    take(stride_a, g * sizeof(typename C::StrideA));
    take(stride_b, g * sizeof(typename C::StrideB));
    take(stride_d, g * sizeof(typename C::StrideD));
    take(layout_sfa, g * sizeof(typename C::LayoutSFA));
    take(layout_sfb, g * sizeof(typename C::LayoutSFB));
    take(empty, g * sizeof(int32_t));
    take(sa_t, transposed_a * sizeof(float));
    take(sb_t, transposed_b * sizeof(float));
    kernel_workspace = base ? base + off : nullptr;
    return off + al(kernel_bytes);
  }
};

// What the set-up kernel needs: the call's base pointers and extents, and the sizes (host sizes by
// value, so a captured graph replays them; device sizes by pointer, read when the kernel runs). The
// host sizes' array comes in a few capacities, so that a call with few groups passes few bytes.
struct SetupBase {
  const uint8_t* a;
  const uint8_t* b;
  const float* sa;  // m-grouped: the user's compact grids; k-grouped: the transposed copies
  const float* sb;
  uint8_t* d;
  int64_t m, n, k;  // as in GroupedGemmArgs
  int64_t groups;
  bool k_grouped;
  int64_t sb_group_stride;  // floats between two experts' B scale grids (m-grouped)
  int gran_n;
  int k_align;  // k-grouped: every K_g is a multiple of this (128: the blockwise kernels' K blocks)
  const void* device_sizes;
  bool device_sizes_int64;
  int32_t* device_status;
};
template <int kCap>
struct SetupParams : SetupBase {
  int32_t host_sizes[kCap];
};

template <class C>
__device__ void write_group(const SetupBase& p, const Arrays<C>& out, int64_t g, int64_t size, int64_t start,
                            bool valid) {
  int m, k;
  const int n = int(p.n);
  out.stride_a[g] = typename C::StrideA{};
  out.stride_b[g] = typename C::StrideB{};
  out.stride_d[g] = typename C::StrideD{};
  get<0>(out.stride_a[g]) = p.k;
  get<0>(out.stride_b[g]) = p.k;
  get<0>(out.stride_d[g]) = p.n;
  if (!p.k_grouped) {  // rows [start, start + size) of A and D; expert g of B
    m = valid ? int(size) : 0;
    k = int(p.k);
    const int64_t kb = layouts::ceil_div(p.k, 128);
    out.a[g] = reinterpret_cast<const typename C::ElementA*>(p.a + start * p.k);
    out.b[g] = reinterpret_cast<const typename C::ElementB*>(p.b + g * p.n * p.k);
    out.d[g] = reinterpret_cast<typename C::ElementD*>(p.d + start * p.n * 2);
    out.sfa[g] = p.sa + start * (C::kBlockwise ? kb : 1);  // rowwise: one scale per row
    out.sfb[g] = p.sb + g * p.sb_group_stride;
    out.empty[g] = 0;
  } else {  // K columns [start, start + size) of A and B; D[g]
    m = valid && size > 0 ? int(p.m) : 0;  // an empty group runs no tile; its D[g] is zeroed apart
    k = int(size);
    const int64_t kb0 = start / 128;
    out.a[g] = reinterpret_cast<const typename C::ElementA*>(p.a + start);
    out.b[g] = reinterpret_cast<const typename C::ElementB*>(p.b + start);
    out.d[g] = reinterpret_cast<typename C::ElementD*>(p.d + g * p.m * p.n * 2);
    out.sfa[g] = C::kBlockwise ? p.sa + kb0 * p.m : p.sa;  // rowwise: the same (M,) and (N,) for every group
    out.sfb[g] = C::kBlockwise ? p.sb + kb0 * layouts::ceil_div(p.n, p.gran_n) : p.sb;
    out.empty[g] = valid && size == 0;
  }
  out.shapes[g] = Problem(m, n, k);
  if constexpr (C::kBlockwise) {  // what the kernel derives from the shape itself (read only on other paths)
    out.layout_sfa[g] = C::ScaleConfig::tile_atom_to_shape_SFA(make_shape(m, n, k, 1));
    out.layout_sfb[g] = C::ScaleConfig::tile_atom_to_shape_SFB(make_shape(m, n, k, 1));
  }
}

// One block: validates the sizes, takes their exclusive prefix sum and fills every group's arguments.
// Invalid sizes leave every group empty (nothing is written) and set *device_status.
template <class C, int kCap>
__global__ void __launch_bounds__(kSetupThreads) setup_kernel(const __grid_constant__ SetupParams<kCap> p,
                                                              Arrays<C> out) {
  using Scan = cub::BlockScan<int64_t, kSetupThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int64_t carry;
  __shared__ int32_t first_bad;
  auto size_of = [&](int64_t g) -> int64_t {
    if (!p.device_sizes) return p.host_sizes[g];
    return p.device_sizes_int64 ? static_cast<const int64_t*>(p.device_sizes)[g]
                                : static_cast<const int32_t*>(p.device_sizes)[g];
  };
  if (threadIdx.x == 0) carry = 0, first_bad = INT32_MAX;
  __syncthreads();
  // Pass 1: validity and the total.
  for (int64_t base = 0; base < p.groups; base += kSetupThreads) {
    const int64_t g = base + threadIdx.x;
    const int64_t s = g < p.groups ? size_of(g) : 0;
    if (g < p.groups && (s < 0 || (p.k_grouped && s % p.k_align != 0))) atomicMin(&first_bad, int32_t(g));
    int64_t ignored, total;
    Scan(scan_storage).ExclusiveSum(s < 0 ? 0 : s, ignored, total);
    __syncthreads();
    if (threadIdx.x == 0) carry += total;
    __syncthreads();
  }
  const int64_t want = p.k_grouped ? p.k : p.m;
  const bool valid = first_bad == INT32_MAX && carry == want;
  if (threadIdx.x == 0 && p.device_status)
    *p.device_status = valid ? 0 : first_bad != INT32_MAX ? first_bad + 1 : int32_t(p.groups + 1);
  __syncthreads();
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  // Pass 2: starts and arguments.
  for (int64_t base = 0; base < p.groups; base += kSetupThreads) {
    const int64_t g = base + threadIdx.x;
    const int64_t s = g < p.groups && valid ? size_of(g) : 0;
    int64_t start, total;
    Scan(scan_storage).ExclusiveSum(s, start, total);
    if (g < p.groups) write_group<C>(p, out, g, s, start + carry, valid);
    __syncthreads();
    if (threadIdx.x == 0) carry += total;
    __syncthreads();
  }
}

// k-grouped blockwise scales: a compact (rows, kb) grid transposed to (kb, rows). 32x32 tiles;
// blockIdx.z picks A's job or B's.
struct ScaleJob {
  const float* src;
  float* dst;  // nullptr: nothing to do
  int64_t rows, cols;  // the grid (rows, kb)
};
__global__ void prepare_scales_kernel(ScaleJob ja, ScaleJob jb) {
  const ScaleJob& j = blockIdx.z == 0 ? ja : jb;
  __shared__ float tile[32][33];
  const int64_t c0 = int64_t(blockIdx.x) * 32, r0 = int64_t(blockIdx.y) * 32;
  if (!j.dst || r0 >= j.rows || c0 >= j.cols) return;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < j.rows && c < j.cols) tile[i][threadIdx.x] = j.src[r * j.cols + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (r < j.rows && c < j.cols) j.dst[c * j.rows + r] = tile[threadIdx.x][i];
  }
}

// k-grouped: D[g] = 0 for every empty group (the kernel runs no tile for it).
__global__ void zero_empty_kernel(const int32_t* empty, uint8_t* d, int64_t group_bytes) {
  const int64_t g = blockIdx.y;
  if (!empty[g]) return;
  uint4* out = reinterpret_cast<uint4*>(d + g * group_bytes);
  const int64_t n16 = group_bytes / 16;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n16; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = make_uint4(0, 0, 0, 0);
}

int sm_count() { return scalemm::detail::sm_count(scalemm::detail::current_device()); }

template <class C>
typename C::Gemm::Arguments kernel_arguments(const GroupedGemmArgs& a, const Arrays<C>& arr) {
  cutlass::KernelHardwareInfo hw;
  cuda_check(cudaGetDevice(&hw.device_id), "cutlass_grouped: current device");
  hw.sm_count = sm_count();
  if constexpr (!C::kBlockwise) {
    typename C::Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGrouped,
                                     {int(a.groups), arr.shapes, nullptr},
                                     {arr.a, arr.stride_a, arr.b, arr.stride_b},
                                     {{}, nullptr, arr.stride_d, arr.d, arr.stride_d},
                                     hw};
    // The tree's arguments nest as it does: {alpha, {scale_b, {scale_a, acc, *}, *}, *}.
    auto& t = args.epilogue.thread;
    t.op_0.scalars[0] = a.alpha;
    t.op_0.scalar_ptrs[0] = nullptr;
    t.op_1.op_0.ptr_row = arr.sfb;
    t.op_1.op_1.op_0.ptr_col = arr.sfa;
    return args;
  } else {
  typename C::Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {int(a.groups), arr.shapes, nullptr},
      {arr.a, arr.stride_a, arr.b, arr.stride_b, arr.sfa, arr.layout_sfa, arr.sfb, arr.layout_sfb},
      {{}, nullptr, arr.stride_d, arr.d, arr.stride_d},
      hw};
  auto& f = args.epilogue.thread;
  f.alpha = a.alpha;
  f.beta = 0.0f;
  f.alpha_ptr = nullptr;
  f.beta_ptr = nullptr;
  f.alpha_ptr_array = nullptr;
  f.beta_ptr_array = nullptr;
  f.dAlpha = {_0{}, _0{}, 0};
  f.dBeta = {_0{}, _0{}, 0};
  return args;
  }
}

int gran_n(const GroupedGemmArgs& a) { return a.b.recipe == Recipe::kBlock128x128 ? 128 : 1; }

bool rowwise(const GroupedGemmArgs& a) { return a.a.recipe == Recipe::kRowwise; }

// The prepared scale grid of each operand (ScaleJob): only k-grouped block scales need one.
ScaleJob job_a(const GroupedGemmArgs& a, float* dst) {
  if (a.group_dim != GroupDim::kK || rowwise(a)) return {};
  return {static_cast<const float*>(a.a.scale), dst, a.m, layouts::ceil_div(a.k, 128)};
}
ScaleJob job_b(const GroupedGemmArgs& a, float* dst) {
  if (a.group_dim != GroupDim::kK || rowwise(a)) return {};
  return {static_cast<const float*>(a.b.scale), dst, layouts::ceil_div(a.n, gran_n(a)), layouts::ceil_div(a.k, 128)};
}
size_t transposed_a(const GroupedGemmArgs& a) {
  const ScaleJob j = job_a(a, nullptr);
  return j.src ? size_t(j.rows * j.cols) : 0;
}
size_t transposed_b(const GroupedGemmArgs& a) {
  const ScaleJob j = job_b(a, nullptr);
  return j.src ? size_t(j.rows * j.cols) : 0;
}

template <class C>
size_t carve(const GroupedGemmArgs& a, Arrays<C>& arr, char* base) {
  Arrays<C> probe{};
  const size_t kernel = C::Gemm::get_workspace_size(kernel_arguments<C>(a, probe));
  return arr.carve(base, a.groups, transposed_a(a), transposed_b(a), kernel);
}

// The kernel's launch parameters (TMA descriptors, scheduler, grid) depend on the arrays' and the
// kernel workspace's addresses, G and alpha, not on the sizes or extents: kept per stream workspace, so a warm call skips CUTLASS's host-side
// initialisation (descriptor encoding, smem attribute) and only launches. Its workspace needs no
// per-call initialisation (the kernel rewrites its tensor maps per group).
template <class C>
struct ParamCache {
  struct Key {
    const void* arrays;            // the per-group arrays (their layout depends on G only)
    uint64_t generation;           // the workspace's allocation (an address can be handed out again)
    const void* kernel_workspace;  // after the prepared scales, whose size depends on the extents
    int64_t groups;
    float alpha;
    int device;
    bool operator<(const Key& o) const {
      return std::tie(arrays, generation, kernel_workspace, groups, alpha, device) <
             std::tie(o.arrays, o.generation, o.kernel_workspace, o.groups, o.alpha, o.device);
    }
  };
  std::mutex mu;
  std::map<Key, typename C::Gemm::Params> params;
  static ParamCache& get() {
    static ParamCache* c = new ParamCache;  // never destroyed: calls may come from static destructors
    return *c;
  }
};

template <class C, int kCap>
void launch_setup(const GroupedGemmArgs& a, const SetupBase& base, const Arrays<C>& arr, Stream stream) {
  SetupParams<kCap> p;
  static_cast<SetupBase&>(p) = base;
  if (!a.group_sizes_device)
    for (int64_t g = 0; g < a.groups; ++g) p.host_sizes[g] = int32_t(a.group_sizes[g]);
  setup_kernel<C, kCap><<<1, kSetupThreads, 0, stream>>>(p, arr);
}

template <class C>
void run_with(const GroupedGemmArgs& a, Stream stream, char* workspace, size_t bytes, uint64_t generation) {
  Arrays<C> arr{};
  if (carve<C>(a, arr, workspace) > bytes) throw Error(StatusCode::kInternal, "cutlass_grouped: workspace smaller than planned");
  const bool kg = a.group_dim == GroupDim::kK;
  SetupBase p{};
  p.a = static_cast<const uint8_t*>(a.a.data);
  p.b = static_cast<const uint8_t*>(a.b.data);
  p.d = static_cast<uint8_t*>(a.d);
  p.m = a.m, p.n = a.n, p.k = a.k, p.groups = a.groups;
  p.k_grouped = kg;
  p.gran_n = gran_n(a);
  p.k_align = C::kBlockwise ? 128 : 16;
  p.sb_group_stride = kg ? 0 : grouped_b_scale_stride(a) / int64_t(sizeof(float));
  p.device_sizes = a.group_sizes_device;
  p.device_sizes_int64 = a.group_sizes_int64;
  p.device_status = a.device_status;
  bool any_empty = a.group_sizes_device != nullptr;
  for (int64_t g = 0; !a.group_sizes_device && g < a.groups; ++g) any_empty |= a.group_sizes[g] == 0;
  const ScaleJob ja = job_a(a, arr.sa_t), jb = job_b(a, arr.sb_t);
  if (ja.dst || jb.dst) {
    const int64_t rows = std::max(ja.dst ? ja.rows : 0, jb.dst ? jb.rows : 0);
    const int64_t cols = layouts::ceil_div(a.k, 128);
    const dim3 grid(unsigned(layouts::ceil_div(cols, 32)), unsigned(layouts::ceil_div(rows, 32)), 2);
    prepare_scales_kernel<<<grid, dim3(32, 8), 0, stream>>>(ja, jb);
    cuda_check(cudaGetLastError(), "cutlass_grouped: scale preparation");
  }
  p.sa = ja.dst ? ja.dst : static_cast<const float*>(a.a.scale);
  p.sb = jb.dst ? jb.dst : static_cast<const float*>(a.b.scale);
  if (a.group_sizes_device || a.groups <= 64) launch_setup<C, 64>(a, p, arr, stream);
  else if (a.groups <= 1024) launch_setup<C, 1024>(a, p, arr, stream);
  else launch_setup<C, kMaxHostGroups>(a, p, arr, stream);
  cuda_check(cudaGetLastError(), "cutlass_grouped: set-up kernel launch");
  if (kg && any_empty) {
    const int64_t group_bytes = a.m * a.n * 2;
    const int64_t blocks = std::min<int64_t>(layouts::ceil_div(group_bytes / 16, 256), 64);
    zero_empty_kernel<<<dim3(unsigned(blocks), unsigned(a.groups)), 256, 0, stream>>>(
        arr.empty, static_cast<uint8_t*>(a.d), group_bytes);
    cuda_check(cudaGetLastError(), "cutlass_grouped: zeroing empty groups");
  }

  auto check = [](cutlass::Status s, const char* what) {
    if (s != cutlass::Status::kSuccess)
      throw Error(StatusCode::kInternal, std::string("cutlass_grouped: ") + what + ": " + cutlassGetStatusString(s));
  };
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cutlass_grouped: current device");
  ParamCache<C>& cache = ParamCache<C>::get();
  const typename ParamCache<C>::Key key{workspace, generation, arr.kernel_workspace, a.groups, a.alpha, device};
  typename C::Gemm::Params params;
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    auto it = cache.params.find(key);
    if (it == cache.params.end()) {
      typename C::Gemm gemm;
      const auto args = kernel_arguments<C>(a, arr);
      // The kernel fills its tensor-map workspace with tensormap instructions, which compute-sanitizer's
      // initcheck does not see as writes: zeroed once per allocation here, its reads are not reported
      // (11,328 reports on one test with the workspace as allocated, 0 zeroed) and nothing else changes.
      cuda_check(cudaMemsetAsync(arr.kernel_workspace, 0, C::Gemm::get_workspace_size(args), stream),
                 "cutlass_grouped: clear the kernel workspace");
      check(gemm.can_implement(args), "the kernel refused a planned call");
      check(gemm.initialize(args, arr.kernel_workspace, stream), "kernel initialisation");
      if (cache.params.size() >= 256) cache.params.clear();  // bounded: workspaces of streams long gone
      it = cache.params.emplace(key, gemm.params()).first;
    }
    params = it->second;
  }
  check(C::Gemm::run(params, stream), "kernel launch");
  cuda_check(cudaGetLastError(), "cutlass_grouped: kernel launch");
  // D is stored through TMA (see tool_marks.hpp): every row of it, (ΣM_g, N) or (G, M, N), is written.
  mark_initialized(a.d, static_cast<size_t>((kg ? a.groups * a.m : a.m) * a.n * 2), stream);
}

}  // namespace

bool built() { return true; }

std::string blocker(const GroupedGemmArgs& a, const DeviceTarget& t) {
  if (a.space != MemorySpace::kDevice) return "host memory";
  if (t.sm != 90) return "the CUTLASS grouped kernel is built for sm_90a; this device is sm_" + std::to_string(t.sm);
  const bool rw = a.a.recipe == Recipe::kRowwise && a.b.recipe == Recipe::kRowwise;
  if (!rw && (a.a.recipe != Recipe::kBlock1x128 ||
                   (a.b.recipe != Recipe::kBlock128x128 && a.b.recipe != Recipe::kBlock1x128)))
    return "the CUTLASS grouped kernel runs block1x128 x block128x128, block1x128 x block1x128 and rowwise x rowwise";
  if (a.group_dim == GroupDim::kK && a.b.recipe == Recipe::kBlock128x128)
    return "the CUTLASS k-grouped kernel is built for block1x128 x block1x128 and rowwise x rowwise";
  if (rw && a.group_dim == GroupDim::kK) {  // each group's K columns start on a TMA-aligned byte
    if (a.group_sizes_device) return "rowwise k-grouped sizes on the device may break the kernel's 16-byte K alignment";
    for (int64_t g = 0; g < a.groups && a.group_sizes; ++g)
      if (a.group_sizes[g] % 16 != 0) return "a rowwise K_g that is not a multiple of 16 (group " + std::to_string(g) + ")";
  }
  if (a.a.dtype != DType::kE4M3 || a.b.dtype != DType::kE4M3) return "the CUTLASS grouped kernel is built for e4m3 x e4m3";
  if (a.d_dtype != DType::kBF16) return "the CUTLASS grouped kernel is built for bf16 output";
  if (a.a.scale_format != ScaleFormat::kCompact || a.b.scale_format != ScaleFormat::kCompact)
    return "the CUTLASS grouped kernel reads compact scales (pass scale_format compact)";
  if (a.k % 16 != 0 || a.n % 8 != 0)
    return "the CUTLASS grouped kernel needs K % 16 == 0 and N % 8 == 0 (TMA row alignment)";
  if (a.m > INT32_MAX || a.n > INT32_MAX || a.k > INT32_MAX) return "an extent beyond 2^31";
  if (a.groups > kMaxGroups || (!a.group_sizes_device && a.groups > kMaxHostGroups))
    return "more than " + std::to_string(a.group_sizes_device ? kMaxGroups : kMaxHostGroups) + " groups";
  return {};
}

// The one choice of kernel configuration, for workspace_bytes() and run() alike: calls `f` with a
// value of ConfigTag<C> for the configuration that runs `a`.
template <class C>
struct ConfigTag {
  using type = C;
};
template <class F>
decltype(auto) with_config(const GroupedGemmArgs& a, F&& f) {
  if (wide_fast_accum(a)) return f(ConfigTag<RowwiseFastAccumWide>{});
  if (rowwise(a)) return a.fast_accum ? f(ConfigTag<RowwiseFastAccum>{}) : f(ConfigTag<Rowwise>{});
  if (a.group_dim == GroupDim::kK) return f(ConfigTag<KGrouped1>{});
  return gran_n(a) == 128 ? f(ConfigTag<MGrouped128>{}) : f(ConfigTag<MGrouped1>{});
}

// Functors rather than generic lambdas: nvcc 13.0's front end has tripped on lambdas in these files.
struct WorkspaceOf {
  const GroupedGemmArgs& a;
  template <class T>
  size_t operator()(T) const {
    Arrays<typename T::type> arr{};
    return carve<typename T::type>(a, arr, nullptr);
  }
};

struct RunWith {
  const GroupedGemmArgs& a;
  Stream stream;
  char* workspace;
  size_t bytes;
  uint64_t generation;
  template <class T>
  void operator()(T) const {
    run_with<typename T::type>(a, stream, workspace, bytes, generation);
  }
};

size_t workspace_bytes(const GroupedGemmArgs& a, const DeviceTarget&) { return with_config(a, WorkspaceOf{a}); }

void run(const GroupedGemmArgs& a, Stream stream, char* workspace, size_t bytes, uint64_t generation) {
  with_config(a, RunWith{a, stream, workspace, bytes, generation});
}

std::string describe(const GroupedGemmArgs& a) {
  std::ostringstream os;
  os << "CUTLASS sm_90a pointer-array kernel, one launch for all " << a.groups << " groups: FP8 "
     << (rowwise(a) ? std::string("rowwise")
                    : std::string("blockwise 1x128 x ") + (gran_n(a) == 128 ? "128x128" : "1x128"))
     << (wide_fast_accum(a) ? ", 256x128x128 tiles, 1x2 clusters, cooperative"
                            : ", 128x128x128 tiles, 1x2 clusters, cooperative")
     << "; shapes and pointers built on the device from "
     << (a.group_sizes_device ? "device-side" : "host") << " sizes; "
     << (rowwise(a) ? std::string("row and column scales applied in the epilogue, read in place") +
                          (a.fast_accum ? "; fast accumulation (no promotion of the tensor cores' partial sums)"
                                        : "; exact accumulation (fp32 promotion every 4 MMAs)")
         : a.group_dim == GroupDim::kK ? "scales transposed to M/N-major in one launch"
                                       : "compact scales read in place");
  return os.str();
}

}  // namespace scalemm::backends::cutlass_grouped
