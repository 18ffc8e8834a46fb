// The library's quantizers and dequantizer on the GPU (declared in fast_quantizers.hpp; reached
// through scalemm::quantize, quantize/api.cu): the host launchers, which choose a kernel and its grid.
// The kernels are in one header per family (quantize_*.cuh), included here only, so the build
// compiles them once. Their arithmetic is numerics/detail/functors.hpp, the reference emulator's too,
// so their bytes equal the host emulator's; the tests in tests/emulation check that byte for byte.
// Compiled with -fmad=false like the emulator.
#include "fast_quantizers.hpp"
// The kernels, one header per family (each includes what it builds on; quantize_common.cuh first):
#include "quantize_activations.cuh"
#include "quantize_amax.cuh"
#include "quantize_common.cuh"
#include "quantize_dequantize.cuh"
#include "quantize_rc1d.cuh"
#include "quantize_rc2d.cuh"
#include "quantize_tiles.cuh"
#include "quantize_transpose.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "detail/driver.hpp"
#include "detail/fast_codecs.cuh"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/detail/device_state.hpp"
#include "scalemm/status.hpp"

namespace scalemm::quantize::kernels {

using scalemm::detail::cuda_check;

using scalemm::detail::PerDevice;

namespace {
/// SM count of the current device (the caller made the stream's device current).
int sm_count() { return scalemm::detail::sm_count(scalemm::detail::current_device()); }

/// Blocks of `kernel` (256 threads, no dynamic shared memory) resident per SM on the current device.
template <class Kernel>
int blocks_per_sm(PerDevice<int>& cache, Kernel kernel) {
  return cache.get(scalemm::detail::current_device(), [&](int) {
    int n = 0;
    cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, 256, 0), "occupancy");
    return std::max(n, 1);
  });
}
}  // namespace

void dequantize(const QuantizedTensor& q, void* out, DType out_dtype, cudaStream_t st) {
  check_dequantize_args(q, out, out_dtype);
  const int64_t R = q.rows(), K = q.k();
  if (R * K == 0) return;
  const int64_t groups = layouts::ceil_div(layouts::ceil_div(K, kTile), kUnits);
  const int64_t blocks = layouts::ceil_div(R * groups, 8);
  SCALEMM_EXPECTS(blocks <= int64_t(0x7FFFFFFF), StatusCode::kUnsupported, "quantize::dequantize: matrix too large");
  const bool wide = out_dtype == DType::kF32;
  const bool vec_out = K % 4 == 0 && reinterpret_cast<uintptr_t>(out) % (wide ? 16 : 8) == 0;
  const bool vec_in = q.row_stride() % 4 == 0 && reinterpret_cast<uintptr_t>(q.data) % 4 == 0;
  const auto v = numerics::detail::view_of(q);
  if (q.dtype == DType::kE4M3) dequant_kernel<0><<<unsigned(blocks), 256, 0, st>>>(v, out, out_dtype, groups, vec_out, vec_in);
  else if (q.dtype == DType::kE5M2) dequant_kernel<1><<<unsigned(blocks), 256, 0, st>>>(v, out, out_dtype, groups, vec_out, vec_in);
  else dequant_kernel<2><<<unsigned(blocks), 256, 0, st>>>(v, out, out_dtype, groups, vec_out, vec_in);
  cuda_check(cudaGetLastError(), "dequant_kernel launch");
}

void transpose_bytes(const void* src, int64_t batch, int64_t rows, int64_t cols, void* dst, cudaStream_t st) {
  SCALEMM_EXPECTS(batch >= 0 && rows >= 0 && cols >= 0, StatusCode::kInvalidArgument,
                  "quantize::transpose: batch, rows and cols must be >= 0");
  if (batch * rows * cols == 0) return;
  SCALEMM_EXPECTS(src != nullptr && dst != nullptr, StatusCode::kInvalidArgument,
                  "quantize::transpose: src and dst must be device pointers, got null");
  const dim3 grid(unsigned(layouts::ceil_div(cols, kTT)), unsigned(layouts::ceil_div(rows, kTT)), unsigned(batch));
  SCALEMM_EXPECTS(layouts::ceil_div(rows, kTT) <= 65535 && batch <= 65535, StatusCode::kUnsupported,
                  "quantize::transpose: at most 65535 matrices of at most 4194240 rows");
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec_in = cols % 16 == 0 && aligned(src), vec_out = rows % 16 == 0 && aligned(dst);
  transpose_bytes_kernel<<<grid, 256, 0, st>>>(static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), rows,
                                               cols, vec_in, vec_out);
  cuda_check(cudaGetLastError(), "transpose_bytes_kernel launch");
}

FastPlan plan_fast(const SourceMatrix& src, const QuantizeConfig& cfg) {
  FastPlan p;
  const int64_t R = src.rows, C = src.cols;
  if (cfg.recipe == Recipe::kTensorwise || cfg.recipe == Recipe::kNvfp4) p.n_part = kAmaxBlocks;
  if (cfg.recipe == Recipe::kTensorwise) p.n_pm_r = p.n_pm_c = 1;
  if (cfg.recipe == Recipe::kRowwise) {
    p.n_pm_r = cfg.rowwise ? R : 0;
    if (cfg.columnwise) {
      p.n_pm_c = C;
      p.chunks = layouts::ceil_div(R, kColChunk);
      p.n_colpart = p.chunks * C;
    }
  }
  return p;
}

template <int S, int E>
void launch_all(TileArgs a, const FastPlan& p, float* scratch, const float* src_amax, float* global_out, int64_t tiles,
                cudaStream_t st) {
  float* part = scratch;
  float* g = part + p.n_part;
  float* pm_r = g + 4;
  float* pm_c = pm_r + p.n_pm_r;
  float* colpart = pm_c + p.n_pm_c;
  const int64_t n = a.rows * a.cols;
  const Recipe recipe = a.lr.recipe;
  if (recipe == Recipe::kTensorwise || recipe == Recipe::kNvfp4) {
    float* gout = recipe == Recipe::kNvfp4 ? global_out : nullptr;
    float* pm = recipe == Recipe::kTensorwise ? pm_r : nullptr;  // tensorwise: the scale too
    if (src_amax && recipe == Recipe::kNvfp4) {  // given: no amax pass, the source is read once, and
      a.amax_in = src_amax;                         // no launch: the kernels derive the global scalars
      a.global_out = gout;
    } else if (src_amax) {
      finish_global_kernel<<<1, 32, 0, st>>>(src_amax, 1, g, gout, a, pm);
    } else {
      const int blocks = int(std::min<int64_t>(kAmaxBlocks, std::max<int64_t>(1, layouts::ceil_div(n, 256 * 16))));
      global_amax_kernel<S><<<blocks, 256, 0, st>>>(a.src, n, a.vec_in, part);
      finish_global_kernel<<<1, 1024, 0, st>>>(part, blocks, g, gout, a, pm);
    }
    a.g = g;
  }
  if (recipe == Recipe::kTensorwise) {
    a.pm_r = pm_r;
    a.pm_c = pm_r;  // one multiplier for both directions
    a.pm_step = 0;
  }
  if (recipe == Recipe::kRowwise && !a.columnwise && a.cols <= kFusedCols) {
    SCALEMM_EXPECTS(a.rows <= int64_t(0x7FFFFFFF), StatusCode::kUnsupported, "quantize::quantize: matrix too large");
    row_fused_kernel<S, E><<<unsigned(a.rows), 256, 0, st>>>(a);
    cuda_check(cudaGetLastError(), "quantizer kernel launch");
    return;
  }
  if (recipe == Recipe::kRowwise) {
    if (a.rowwise) row_amax_kernel<S><<<unsigned(layouts::ceil_div(a.rows, 8)), 256, 0, st>>>(a, pm_r);
    if (a.columnwise) {
      const dim3 grid(unsigned(layouts::ceil_div(a.cols, 256)), unsigned(p.chunks));
      col_amax_partial_kernel<S><<<grid, 256, 0, st>>>(a, colpart);
      col_amax_finish_kernel<<<unsigned(layouts::ceil_div(a.cols, 256)), 256, 0, st>>>(a, colpart, p.chunks, pm_c);
    }
    a.pm_r = pm_r;
    a.pm_c = pm_c;
    a.pm_step = 1;
  }
  if (!a.columnwise && a.kind != kBlocks2D) {
    // One block per lane in row_direct_kernel's scale step (FP8 1D blocks are 32 or 128 wide).
    SCALEMM_EXPECTS(a.kind != kBlocks1D || kRowUnits<E> / kRowRounds<E> * (kTile / a.bk) <= 32, StatusCode::kInternal,
                    "quantize::quantize: block width " + std::to_string(a.bk) + " too small for the row kernel");
    const int64_t segs = layouts::ceil_div(a.cols, kTile), groups = layouts::ceil_div(segs, kRowUnits<E>);
    // 1D blocks: one wave, as many blocks as fit on the GPU at once, each warp looping over items.
    const int64_t items_blocks = std::min<int64_t>(layouts::ceil_div(a.rows * groups, 8), 0x7FFFFFFF);
    if constexpr (E == 2 && S != 0) {  // NVFP4 from 16-bit sources: 8 elements per lane
      static PerDevice<int> occupancy;
      const int nv_per_sm = blocks_per_sm(occupancy, row_nvfp4_kernel<S>);
      const int64_t blocks = std::min<int64_t>(items_blocks, int64_t(nv_per_sm) * sm_count());
      row_nvfp4_kernel<S><<<unsigned(std::max<int64_t>(blocks, 1)), 256, 0, st>>>(a, groups);
    } else {
      static PerDevice<int> occupancy;
      const int per_sm = blocks_per_sm(occupancy, row_direct_kernel<S, E>);
      // The precomputed kind (tensorwise, long rowwise rows) has no per-item scale step to amortise
      // and measured faster with a warp per item (H100: 90-91% of copy against 85-87%).
      // (Any grid size is correct: warps step through the items by the grid's warp count.)
      const int64_t blocks =
          a.kind == kPrecomputed ? items_blocks : std::min<int64_t>(items_blocks, int64_t(per_sm) * sm_count());
      row_direct_kernel<S, E><<<unsigned(std::max<int64_t>(blocks, 1)), 256, 0, st>>>(a, groups);
    }
    cuda_check(cudaGetLastError(), "quantizer kernel launch");
    return;
  }
  if constexpr (S != 0) {  // bf16 / f16: 2D blocks from registers, 1D blocks with a 16-bit tile
    if (E != 2 && a.kind == kBlocks2D) {  // E2M1 is NVFP4: 1D blocks only
      SCALEMM_EXPECTS(a.bk == 32 || a.bk == 128, StatusCode::kInternal,
                      "quantize::quantize: no 2D-block kernel for block side " + std::to_string(a.bk));
      if constexpr (E != 2) {
        if (a.bk == 32) rc2d_kernel<S, E, 32><<<unsigned(tiles), kQThreads, 0, st>>>(a);
        else rc2d_kernel<S, E, 128><<<unsigned(tiles), kQThreads, 0, st>>>(a);
      }
      cuda_check(cudaGetLastError(), "quantizer kernel launch");
      return;
    }
    if (a.kind == kBlocks1D) {
      SCALEMM_EXPECTS(E == 2 ? a.bk == 16 : (a.bk == 32 || a.bk == 128), StatusCode::kInternal,
                      "quantize::quantize: no 1D-block kernel for block width " + std::to_string(a.bk));
      if constexpr (E == 2) rc1d_kernel<S, E, 16><<<unsigned(tiles), kQThreads, 0, st>>>(a);
      else if (a.bk == 32) rc1d_kernel<S, E, 32><<<unsigned(tiles), kQThreads, 0, st>>>(a);
      else rc1d_kernel<S, E, 128><<<unsigned(tiles), kQThreads, 0, st>>>(a);
      cuda_check(cudaGetLastError(), "quantizer kernel launch");
      return;
    }
  }
  // A function attribute is per device: set once on each device the kernel runs on.
  static PerDevice<bool> smem_set;
  smem_set.get(scalemm::detail::current_device(), [](int) {
    cuda_check(cudaFuncSetAttribute(quant_tile_kernel<S, E>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(kTileSmem)),
               "cudaFuncSetAttribute(quant_tile_kernel)");
    return true;
  });
  quant_tile_kernel<S, E><<<unsigned(tiles), kQThreads, kTileSmem, st>>>(a);
  cuda_check(cudaGetLastError(), "quantizer kernel launch");
}

template <int S>
void launch_elem(int e, const TileArgs& a, const FastPlan& p, float* scratch, const float* src_amax, float* global_out,
                 int64_t tiles, cudaStream_t st) {
  if (e == 2) launch_all<S, 2>(a, p, scratch, src_amax, global_out, tiles, st);
  else if (e == 1) launch_all<S, 1>(a, p, scratch, src_amax, global_out, tiles, st);
  else launch_all<S, 0>(a, p, scratch, src_amax, global_out, tiles, st);
}

/// The kernels' arguments for a (src.rows, src.cols) source whose columnwise output has R rows (R =
/// src.rows but for grouped tokens).
TileArgs tile_args(const SourceMatrix& src, const QuantizeConfig& cfg, const QuantizeOutputs& out, int64_t R) {
  const int64_t C = src.cols;
  TileArgs a{};
  a.src = src.data;
  a.rows = R;
  a.cols = C;
  a.tiles_c = layouts::ceil_div(C, kTile);
  a.rowwise = cfg.rowwise;
  a.columnwise = cfg.columnwise;
  a.lr = rowwise_layout(cfg, src.rows, C);
  a.lc = columnwise_layout(cfg, R, C);
  a.scales_r = out.scales;
  a.scales_c = out.scales_t;
  a.mode = int(resolve_scale_mode(cfg.recipe, cfg.mode));
  a.elem = element_dtype(cfg);
  a.eps = cfg.eps;
  a.out_r = static_cast<uint8_t*>(out.data);
  a.out_c = static_cast<uint8_t*>(out.data_t);
  a.ld_src = a.ld_aux = C;
  switch (cfg.recipe) {
    case Recipe::kTensorwise:
    case Recipe::kRowwise: a.kind = kPrecomputed; a.bk = kTile; break;
    case Recipe::kBlock128x128:
    case Recipe::kMxfp8_32x32: a.kind = kBlocks2D; a.bk = int(a.lr.block_k()); break;
    default: a.kind = kBlocks1D; a.bk = int(a.lr.block_k()); break;
  }
  const int esize = src.dtype == DType::kF32 ? 4 : 2;
  a.vec_in = C % 4 == 0 && reinterpret_cast<uintptr_t>(src.data) % size_t(4 * esize) == 0;
  a.vec_out_r = C % 4 == 0 && reinterpret_cast<uintptr_t>(out.data) % 4 == 0;
  a.vec_out_c = R % 4 == 0 && reinterpret_cast<uintptr_t>(out.data_t) % 4 == 0;
  return a;
}

// The 1D-block kernels of one tile per CTA (rc1d_kernel and its fused variants), each as a launcher
// of its instantiation <S, E, BK>, so that one function picks S (bf16 / f16), E (e4m3 / e5m2) and BK
// (32 / 128) for all of them.
struct Rc1dKernel {
  template <int S, int E, int BK>
  static void launch(const TileArgs& a, unsigned grid, cudaStream_t st) {
    rc1d_kernel<S, E, BK><<<grid, kQThreads, 0, st>>>(a);
  }
};
template <int ACT>
struct Rc1dActKernel {
  template <int S, int E, int BK>
  static void launch(const TileArgs& a, unsigned grid, cudaStream_t st) {
    rc1d_act_kernel<S, E, BK, ACT><<<grid, kQThreads, 0, st>>>(a);
  }
};
template <int ACT, int ACT2>
struct Rc1dGroupedActKernel {
  template <int S, int E, int BK>
  static void launch(const TileArgs& a, unsigned grid, cudaStream_t st) {
    rc1d_grouped_act_kernel<S, E, BK, ACT, ACT2><<<grid, kQThreads, 0, st>>>(a);
  }
};

template <class K, int S, int E>
void launch_rc1d(const TileArgs& a, int64_t tiles, cudaStream_t st) {
  if (a.bk == 32) K::template launch<S, E, 32>(a, unsigned(tiles), st);
  else K::template launch<S, E, 128>(a, unsigned(tiles), st);
  cuda_check(cudaGetLastError(), "quantizer kernel launch");
}

/// Launches kernel family K on one CTA per tile, instantiated for the source type, element and block.
template <class K>
void launch_rc1d(const TileArgs& a, DType src_dtype, int64_t tiles, cudaStream_t st) {
  const bool e5m2 = a.elem == DType::kE5M2;
  if (src_dtype == DType::kBF16) e5m2 ? launch_rc1d<K, 1, 1>(a, tiles, st) : launch_rc1d<K, 1, 0>(a, tiles, st);
  else e5m2 ? launch_rc1d<K, 2, 1>(a, tiles, st) : launch_rc1d<K, 2, 0>(a, tiles, st);
}

void quantize_grouped(const SourceMatrix& src, const QuantizeConfig& cfg, const int64_t* group_sizes, int64_t groups,
                      int64_t padded_rows, const GatherRows& gather, const QuantizeOutputs& out, cudaStream_t st) {
  const int64_t tiles = padded_rows / kTile * layouts::ceil_div(src.cols, kTile);
  SCALEMM_EXPECTS(tiles <= int64_t(0x7FFFFFFF), StatusCode::kUnsupported, "quantize::quantize_grouped: matrix too large");
  if (tiles == 0) return;
  TileArgs a = tile_args(src, cfg, out, padded_rows);
  a.group_sizes = group_sizes;
  a.groups = groups;
  a.src_rows = src.rows;
  a.gather = gather.index;
  a.gather_rows = gather.source_rows;
  a.row_weight = gather.row_weight;
  launch_rc1d<Rc1dKernel>(a, src.dtype, tiles, st);
}

template <int S, int ACT>
void launch_reference(const void* src, const void* aux, const void* aux2, int64_t n, void* out, cudaStream_t st) {
  const unsigned blocks = unsigned(std::min<int64_t>((n + 255) / 256, int64_t(sm_count()) * 8));
  activation_kernel<S, ACT><<<blocks, 256, 0, st>>>(static_cast<const uint16_t*>(src), static_cast<const uint16_t*>(aux),
                                                    static_cast<const uint16_t*>(aux2), n, static_cast<uint16_t*>(out));
}

template <int S>
void launch_reference(int act, const void* src, const void* aux, const void* aux2, int64_t n, void* out, cudaStream_t st) {
  switch (act) {
    case kGelu: launch_reference<S, kGelu>(src, aux, aux2, n, out, st); break;
    case kGeluGrad: launch_reference<S, kGeluGrad>(src, aux, aux2, n, out, st); break;
    case kSwiglu: launch_reference<S, kSwiglu>(src, aux, aux2, n, out, st); break;
    case kSwigluGate: launch_reference<S, kSwigluGate>(src, aux, aux2, n, out, st); break;
    default: launch_reference<S, kSwigluUp>(src, aux, aux2, n, out, st); break;
  }
}

void apply_activation(int act, const void* src, const void* aux, const void* aux2, int64_t n, DType dtype, void* out,
                      cudaStream_t st) {
  if (n <= 0) return;
  if (dtype == DType::kBF16) launch_reference<1>(act, src, aux, aux2, n, out, st);
  else launch_reference<2>(act, src, aux, aux2, n, out, st);
  cuda_check(cudaGetLastError(), "activation kernel launch");
}

void quantize_activation(int act, const SourceMatrix& src, const void* aux, const void* aux2, const QuantizeConfig& cfg,
                         const QuantizeOutputs& out, cudaStream_t st) {
  const int64_t tiles = layouts::ceil_div(src.rows, kTile) * layouts::ceil_div(src.cols, kTile);
  SCALEMM_EXPECTS(tiles <= int64_t(0x7FFFFFFF), StatusCode::kUnsupported, "quantize::quantize_activation: matrix too large");
  if (tiles == 0) return;
  TileArgs a = tile_args(src, cfg, out, src.rows);
  a.aux = aux;
  a.aux2 = aux2;
  // The vector path needs every source aligned.
  for (const void* p : {aux, aux2}) a.vec_in = a.vec_in && reinterpret_cast<uintptr_t>(p) % 8 == 0;
  switch (act) {
    case kGelu: launch_rc1d<Rc1dActKernel<kGelu>>(a, src.dtype, tiles, st); break;
    case kGeluGrad: launch_rc1d<Rc1dActKernel<kGeluGrad>>(a, src.dtype, tiles, st); break;
    case kSwiglu: launch_rc1d<Rc1dActKernel<kSwiglu>>(a, src.dtype, tiles, st); break;
    case kSwigluGate: launch_rc1d<Rc1dActKernel<kSwigluGate>>(a, src.dtype, tiles, st); break;
    default: launch_rc1d<Rc1dActKernel<kSwigluUp>>(a, src.dtype, tiles, st); break;
  }
}

/// The fast path; false when it does not apply (empty shapes), then the generic functors run.
bool quantize(const SourceMatrix& src, const QuantizeConfig& cfg, const QuantizeOutputs& out, float* scratch,
              cudaStream_t st) {
  const int64_t R = src.rows, C = src.cols;
  if (R <= 0 || C <= 0) return false;
  const int64_t tiles = layouts::ceil_div(R, kTile) * layouts::ceil_div(C, kTile);
  if (tiles > int64_t(0x7FFFFFFF)) return false;
  const TileArgs a = tile_args(src, cfg, out, R);
  const FastPlan p = plan_fast(src, cfg);
  const int e = a.elem == DType::kE2M1 ? 2 : a.elem == DType::kE5M2 ? 1 : 0;
  switch (src.dtype) {
    case DType::kBF16: launch_elem<1>(e, a, p, scratch, src.amax, out.global_scale, tiles, st); break;
    case DType::kF16: launch_elem<2>(e, a, p, scratch, src.amax, out.global_scale, tiles, st); break;
    default: launch_elem<0>(e, a, p, scratch, src.amax, out.global_scale, tiles, st); break;
  }
  return true;
}

void quantize_grouped_swiglu(bool grad, const SourceMatrix& src, int64_t ld_src, const void* gate_up, int64_t inter,
                             const QuantizeConfig& cfg, const int64_t* group_sizes, int64_t groups, int64_t padded_rows,
                             const QuantizeOutputs& out, cudaStream_t st) {
  const int64_t tiles = padded_rows / kTile * layouts::ceil_div(src.cols, kTile);
  SCALEMM_EXPECTS(tiles <= int64_t(0x7FFFFFFF), StatusCode::kUnsupported, "quantize::quantize_grouped_swiglu: matrix too large");
  if (tiles == 0) return;
  TileArgs a = tile_args(src, cfg, out, padded_rows);
  a.group_sizes = group_sizes;
  a.groups = groups;
  a.src_rows = src.rows;
  a.ld_src = ld_src;
  a.ld_aux = 2 * inter;
  const auto* gu = static_cast<const uint16_t*>(gate_up);
  a.aux = grad ? gu : gu + inter;  // forward: src is the gate half, aux the up half
  a.aux2 = gu + inter;
  a.split = grad ? inter : 0;
  for (const void* p : {a.src, a.aux, a.aux2}) a.vec_in = a.vec_in && reinterpret_cast<uintptr_t>(p) % 8 == 0;
  a.vec_in = a.vec_in && ld_src % 4 == 0 && inter % 4 == 0;
  if (grad) launch_rc1d<Rc1dGroupedActKernel<kSwigluGate, kSwigluUp>>(a, src.dtype, tiles, st);
  else launch_rc1d<Rc1dGroupedActKernel<kSwiglu, 0>>(a, src.dtype, tiles, st);
}

}  // namespace scalemm::quantize::kernels
