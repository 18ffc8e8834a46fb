// GPU scale conversions and content checks. The large conversions run specialised kernels shaped after
// their structure (see "specialised kernels" below: an affine fp32 tile transpose, 128-row strips of
// 128x4 tiles, tiled fills from tiny sources); launch_special() picks one on the host. Every other
// conversion runs one generic tile kernel:
//
//  * it walks the DESTINATION's padded grid in tiles of (2^log_tr stored rows) x (2^log_tk K-blocks),
//    asking a detail::*Op for the source index of each position (or -1 = padding, written as 0) and
//    ScaleLayout::padded_offset() for the destination index: the same per-element rule as the host
//    loops in layouts/convert.cpp, hence byte-identical results;
//  * for bandwidth it stages through shared memory where the layouts allow it, and checks that at
//    run time for every tile, falling back to direct global access where they do not:
//      - src staging: the tile's source indices span at most kTile(+slack) elements -> one vectorized
//        coalesced load of that span;
//      - dst staging: the tile's destination indices are exactly [base, base + n) (the padded grid maps
//        one-to-one onto the buffer, so n indices in a range of n cover it) -> one vectorized store;
//      - tile transpose: neither side stages and the two sides have different fast axes (VEC128's
//        outer-major vs compact's K-major) -> gather into a padded shared tile, then scatter;
//  * the recipe is a template parameter so that offset()'s switches and divisions fold to constants.
// Nothing is allocated and nothing synchronizes: every entry point is graph-capturable.
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>
#include <string>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "scalemm/layouts/convert_cuda.hpp"
#include "scalemm/layouts/detail/convert_ops.hpp"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/detail/device_state.hpp"

using scalemm::detail::cuda_check;

// Kernel launches go through one macro so that tests/layouts/emu can compile this file as plain C++
// against a cooperative-thread CPU emulation of the CUDA subset used here.
#if defined(__CUDACC__)
#define SCALEMM_LAUNCH(kernel, grid, block, stream) kernel<<<grid, block, 0, stream>>>
#else
#define SCALEMM_LAUNCH(kernel, grid, block, stream) ::emu::launch(kernel, grid, block, 0, stream)
#endif

namespace scalemm::layouts::gpu {
namespace {

constexpr int kThreads = 256;
// Blocks per SM each kernel is compiled for (__launch_bounds__) and launched with (grid_x). The
// affine and strip kernels issue all four 16-byte loads of a thread before using any (64 KB in flight
// per SM); that needs 64 registers without spilling, so 4 blocks per SM (measured against 6 blocks of
// 40 registers: up to 1.3x faster cuBLASLt -> compact, within 3-6% elsewhere). The grouped fill kernel
// computes its words before its stores and keeps 6.
constexpr int kGenericPerSm = 2, kAffinePerSm = 4, kTiledPerSm = 6, kRelayoutPerSm = 4;
constexpr int kTile = 4096;              // elements per tile
constexpr int kItems = kTile / kThreads;  // elements per thread
constexpr int kTransposePad = 128;

void require(bool cond, const std::string& msg) {
  if (!cond) throw Error(StatusCode::kInvalidArgument, msg);
}

enum class Kind { kRelayout, kTranspose, kBroadcast };

/// Launch plan, computed on the host from the layouts (through offset() only).
struct Plan {
  int log_tr = 0, log_tk = 0;
  bool map_pfast = false;  // thread mapping of the main path: stored rows fastest (else K-blocks)
  bool src_pfast = false, dst_pfast = false;
  bool stage_src = false, stage_dst = false, transpose_tile = false;
};

// ---- device helpers ------------------------------------------------------------------------------
// Grouped launches deal the work units of all groups over a 1-D grid in one flat order (group 0's
// units, then group 1's, ...): block b takes units b, b + gridDim.x, ..., so every block gets the same
// share however ragged the groups are (a grid per group left SMs idle behind the largest group: 45%
// achieved occupancy under ncu). A block finds the group of its next unit in a window of kThreads
// groups kept in shared memory (each group's first flat unit, buffer bases and rows), built from the
// row offsets by one load per thread and a block-wide scan. A block's units only increase, so it
// walks the windows once: G / kThreads passes, never per element.

struct GroupWindow {
  int64_t first[kThreads + 1];  // flat index of group g0 + i's first unit; [n]: the window's end
  int64_t src[kThreads + 1];    // element offset of group g0 + i's source buffer; [n]: the next group's
  int64_t dst[kThreads + 1];
  int64_t rows[kThreads];
  int64_t warp_sums[kThreads / 32][3];
  int g0, n;
};

// Inclusive sums over the block of three values per thread, through warp butterflies (xor shuffles
// only) and the warps' totals; every thread must call it.
__device__ __forceinline__ void block_scan3(int64_t v[3], GroupWindow& w) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int64_t seg[3] = {v[0], v[1], v[2]};
  for (int o = 1; o < 32; o <<= 1)
    for (int j = 0; j < 3; ++j) {
      const int64_t other = __shfl_xor_sync(0xffffffffu, seg[j], o);
      if (lane & o) v[j] += other;
      seg[j] += other;
    }
  if (lane == 31)
    for (int j = 0; j < 3; ++j) w.warp_sums[warp][j] = v[j];
  __syncthreads();
  for (int x = 0; x < warp; ++x)
    for (int j = 0; j < 3; ++j) v[j] += w.warp_sums[x][j];
}

// Moves the window on to the groups that follow it (the first window when `first`): groups
// [g0, g0 + kThreads), fewer at the end. Everything it needs between windows lives in the window
// itself, which keeps the kernels' loop state to two registers.
template <class Units>
__device__ void next_window(bool first, int groups, const int64_t* row_offsets, const ScaleLayout& from,
                            const ScaleLayout& to, Units units, GroupWindow& w) {
  __syncthreads();  // the previous window may still be in use
  const int g0 = first ? 0 : w.g0 + w.n;
  int64_t base[3] = {0, 0, 0};  // where group g0 starts: flat unit, source and destination offsets
  if (!first) {
    base[0] = w.first[w.n];
    base[1] = w.src[w.n];
    base[2] = w.dst[w.n];
  }
  __syncthreads();  // read by every thread before anyone overwrites it
  const int i = threadIdx.x, g = g0 + i;
  ScaleLayout f = from, t = to;
  f.rows = t.rows = g < groups ? row_offsets[g + 1] - row_offsets[g] : 0;
  const int64_t own[3] = {g < groups ? units(f, t) : 0, f.size(), t.size()};
  int64_t incl[3] = {own[0], own[1], own[2]};
  block_scan3(incl, w);
  w.first[i] = base[0] + incl[0] - own[0];
  w.src[i] = base[1] + incl[1] - own[1];
  w.dst[i] = base[2] + incl[2] - own[2];
  w.rows[i] = f.rows;
  if (i == kThreads - 1) {
    w.first[kThreads] = base[0] + incl[0];
    w.src[kThreads] = base[1] + incl[1];
    w.dst[kThreads] = base[2] + incl[2];
  }
  if (i == 0) {
    w.g0 = g0;
    w.n = groups - g0 < kThreads ? groups - g0 : kThreads;
  }
  __syncthreads();
}

// Runs body(f, t, src_base, dst_base, unit) for every work unit this block owns. A single operand
// (row_offsets == nullptr) has units(from, to) units and bases 0. Grouped: f and t carry the group's
// row count, the bases are element offsets of the group's buffers, and `unit` counts within the group.
// The block's threads call it together (the window and the bodies synchronize).
template <class Units, class Body>
__device__ __forceinline__ void for_each_unit(const ScaleLayout& from, const ScaleLayout& to, const int64_t* row_offsets,
                                              int groups, GroupWindow& w, Units units, Body body) {
  // One loop (and one inlined copy of the body) for both cases.
  const int64_t n = row_offsets ? 0 : units(from, to);
  if (row_offsets) {
    if (groups <= 0) return;
    next_window(true, groups, row_offsets, from, to, units, w);
  }
  int gi = 0;  // grouped: group w.g0 + gi
  for (int64_t u = blockIdx.x;; u += gridDim.x) {
    ScaleLayout f = from, t = to;
    int64_t sb = 0, db = 0, local = u;
    if (row_offsets) {
      while (u >= w.first[w.n]) {  // past this window (uniform over the block)
        if (w.g0 + w.n >= groups) return;
        next_window(false, groups, row_offsets, from, to, units, w);
        gi = 0;
      }
      while (u >= w.first[gi + 1]) ++gi;
      f.rows = t.rows = w.rows[gi];
      sb = w.src[gi];
      db = w.dst[gi];
      local = u - w.first[gi];
    } else if (u >= n) {
      return;
    }
    body(f, t, sb, db, local);
  }
}

struct Shared {
  alignas(16) unsigned char src_img[kTile * 4 + 32];
  alignas(16) unsigned char dst_img[(kTile + kTransposePad) * 4 + 32];
  unsigned long long lo, hi;
  GroupWindow gw;
  int in_range;
};

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

// Thread mapping of tile element e. pfast: stored rows fastest. Otherwise K-blocks fastest in runs of
// 2^lb (32 bytes of the global side: a whole sector), then rows: a warp touches 32/2^lb rows, which
// keeps global accesses sector-sized while spreading shared-memory accesses of the tiled image (whose
// K-columns are 512 bytes apart, i.e. in one bank) over several rows.
__device__ __forceinline__ void tile_coords(int e, bool pfast, int log_tr, int log_tk, int lb, int64_t p0, int64_t c0,
                                            int64_t& p, int64_t& c) {
  if (pfast) {
    p = p0 + (e & ((1 << log_tr) - 1));
    c = c0 + (e >> log_tr);
  } else {
    const int rest = e >> lb;
    p = p0 + (rest & ((1 << log_tr) - 1));
    c = c0 + (((rest >> log_tr) << lb) | (e & ((1 << lb) - 1)));
  }
}

// Copies nbytes from global g into shared s so that s[shift + i] == g[i] with shift = g % 16;
// interior 16-byte chunks move as uint4, the edges byte by byte (never touching bytes outside g).
__device__ void load_span(const unsigned char* g, int64_t nbytes, unsigned char* s, int& shift) {
  const int mis = int(reinterpret_cast<uintptr_t>(g) & 15);
  shift = mis;
  const int64_t chunks = (mis + nbytes + 15) / 16;
  const unsigned char* ga = g - mis;
  for (int64_t j = threadIdx.x; j < chunks; j += blockDim.x) {
    const int64_t lo = j * 16 - mis, hi = lo + 16;
    if (lo >= 0 && hi <= nbytes) {
      *reinterpret_cast<uint4*>(s + j * 16) = __ldg(reinterpret_cast<const uint4*>(ga + j * 16));
    } else {
      for (int b = 0; b < 16; ++b) {
        const int64_t i = lo + b;
        if (i >= 0 && i < nbytes) s[j * 16 + b] = __ldg(g + i);
      }
    }
  }
}

// Stores nbytes from shared s (s[shift + i] is byte i, shift = g % 16) to global g.
__device__ void store_span(unsigned char* g, int64_t nbytes, const unsigned char* s) {
  const int mis = int(reinterpret_cast<uintptr_t>(g) & 15);
  const int64_t chunks = (mis + nbytes + 15) / 16;
  unsigned char* ga = g - mis;
  for (int64_t j = threadIdx.x; j < chunks; j += blockDim.x) {
    const int64_t lo = j * 16 - mis, hi = lo + 16;
    if (lo >= 0 && hi <= nbytes) {
      *reinterpret_cast<uint4*>(ga + j * 16) = *reinterpret_cast<const uint4*>(s + j * 16);
    } else {
      for (int b = 0; b < 16; ++b) {
        const int64_t i = lo + b;
        if (i >= 0 && i < nbytes) g[i] = s[j * 16 + b];
      }
    }
  }
}

template <typename T>
__device__ __forceinline__ T ldg_t(const T* p) {
  return __ldg(p);
}

// Value transform: bit copy, or fp32 -> E8M0 for the broadcast.
template <Kind K, typename Ts, typename Td>
__device__ __forceinline__ Td transform(Ts v, bool* exact) {
  if constexpr (K == Kind::kBroadcast) {
    const uint8_t code = detail::e8m0_from_pow2(v, exact);
    if constexpr (sizeof(Td) == 4) return Td(code) * 0x01010101u;  // one code for four K-blocks
    else return code;
  } else {
    *exact = true;
    return Td(v);
  }
}

// Views of an op over the destination's padded grid. Elem: one scale per position. Quad: four
// consecutive K-blocks per position, moved as one 32-bit word; used for one-byte scales when every
// aligned quad of K-blocks is contiguous and 4-aligned on both sides (the host checks the first quad
// through offset(); offset() is strictly increasing along K, a property the host tests check).
template <class Op>
struct Elem {
  Op op;
  SCALEMM_HD int64_t rows() const { return op.to.padded_rows(); }
  SCALEMM_HD int64_t cols() const { return op.to.padded_kblocks(); }
  SCALEMM_HD int64_t dst(int64_t p, int64_t c) const { return op.to.padded_offset(p, c); }
  SCALEMM_HD int64_t src(int64_t p, int64_t c) const { return op.src(p, c); }
  SCALEMM_HD static constexpr int cols_per_unit() { return 1; }
};
// kShared: a broadcast whose four destination K-blocks per word share one source scale (a 1x32 quad
// of mxfp8 lies inside one 128-wide block), so the source index is the fp32 scale's own index.
template <class Op, bool kShared = false>
struct Quad {
  Op op;
  SCALEMM_HD int64_t rows() const { return op.to.padded_rows(); }
  SCALEMM_HD int64_t cols() const { return op.to.padded_kblocks() >> 2; }
  SCALEMM_HD int64_t dst(int64_t p, int64_t q) const { return op.to.padded_offset(p, 4 * q) >> 2; }
  SCALEMM_HD int64_t src(int64_t p, int64_t q) const {
    const int64_t s = op.src(p, 4 * q);
    if constexpr (kShared) return s;
    return s < 0 ? -1 : s >> 2;
  }
  SCALEMM_HD static constexpr int cols_per_unit() { return 4; }
};
template <Kind K, bool kQuad, class Op>
using ViewFor = std::conditional_t<!kQuad, Elem<Op>, Quad<Op, K == Kind::kBroadcast>>;

template <Kind K, class W, typename Ts, typename Td>
__device__ void run_tile(const W& op, const Ts* __restrict__ src, Td* __restrict__ dst, int64_t p0, int64_t c0,
                         const Plan& pl, Shared& sh, unsigned long long* inexact_count) {
  const int64_t P = op.rows(), C = op.cols();
  const int tid = threadIdx.x;
  const int tr = 1 << pl.log_tr, tk = 1 << pl.log_tk;
  const int64_t n_in = imin(tr, P - p0) * imin(tk, C - c0);
  int inexact = 0;

  auto count_inexact = [&](bool exact, int64_t p, int64_t c) {
    if constexpr (K == Kind::kBroadcast) {
      const ScaleLayout& to = op.op.to;
      const bool first = (p * to.row_step()) % op.op.from.block_rows() == 0 &&
                         (c * W::cols_per_unit() * to.block_k()) % op.op.from.block_k() == 0;
      if (!exact && first) ++inexact;
    }
  };

  if (pl.transpose_tile) {
    // Gather with the source's fast axis into a padded tile, scatter with the destination's.
    Td* tile = reinterpret_cast<Td*>(sh.dst_img);
    const int ld = tk + 1;
#pragma unroll 4
    for (int i = 0; i < kItems; ++i) {
      int64_t p, c;
      tile_coords(i * kThreads + tid, pl.src_pfast, pl.log_tr, pl.log_tk, pl.log_tk, p0, c0, p, c);
      if (p < P && c < C) {
        const int64_t s = op.src(p, c);
        bool exact = true;
        const Td v = s < 0 ? Td(0) : transform<K, Ts, Td>(ldg_t(src + s), &exact);
        if (s >= 0) count_inexact(exact, p, c);
        tile[int(p - p0) * ld + int(c - c0)] = v;
      }
    }
    __syncthreads();
#pragma unroll 4
    for (int i = 0; i < kItems; ++i) {
      int64_t p, c;
      tile_coords(i * kThreads + tid, pl.dst_pfast, pl.log_tr, pl.log_tk, pl.log_tk, p0, c0, p, c);
      if (p < P && c < C) dst[op.dst(p, c)] = tile[int(p - p0) * ld + int(c - c0)];
    }
    __syncthreads();
  } else {
    constexpr int kRunLog = (sizeof(Ts) == 1 || sizeof(Td) == 1) ? 5 : 3;  // 32 bytes along K
    const int lb = pl.log_tk < kRunLog ? pl.log_tk : kRunLog;
    int64_t soff[kItems], doff[kItems];
    unsigned long long lo = ~0ull, hi = 0;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      int64_t p, c;
      tile_coords(i * kThreads + tid, pl.map_pfast, pl.log_tr, pl.log_tk, lb, p0, c0, p, c);
      const bool in = p < P && c < C;
      soff[i] = in ? op.src(p, c) : -1;
      doff[i] = in ? op.dst(p, c) : -1;
      if (soff[i] >= 0) {
        lo = min(lo, (unsigned long long)soff[i]);
        hi = max(hi, (unsigned long long)soff[i]);
      }
    }
    // ---- source staging
    bool src_staged = false;
    int sshift = 0;
    if (pl.stage_src) {
      for (int o = 16; o > 0; o >>= 1) {
        lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
        hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
      }
      if (tid == 0) {
        sh.lo = ~0ull;
        sh.hi = 0;
      }
      __syncthreads();
      if ((tid & 31) == 0) {
        atomicMin(&sh.lo, lo);
        atomicMax(&sh.hi, hi);
      }
      __syncthreads();
      lo = sh.lo;
      hi = sh.hi;
      src_staged = hi >= lo && hi - lo + 1 <= (unsigned long long)kTile;
      if (src_staged) {
        load_span(reinterpret_cast<const unsigned char*>(src + lo), int64_t(hi - lo + 1) * sizeof(Ts), sh.src_img,
                  sshift);
        __syncthreads();
      }
    }
    // ---- destination staging: are the tile's destination indices exactly [base, base + n)?
    bool dst_staged = false;
    const int64_t dbase = op.dst(p0, c0);
    if (pl.stage_dst) {
      int mine = 0;
#pragma unroll
      for (int i = 0; i < kItems; ++i)
        if (doff[i] >= 0 && uint64_t(doff[i] - dbase) < uint64_t(n_in)) ++mine;
      for (int o = 16; o > 0; o >>= 1) mine += __shfl_xor_sync(0xffffffffu, mine, o);
      if (tid == 0) sh.in_range = 0;
      __syncthreads();
      if ((tid & 31) == 0) atomicAdd(&sh.in_range, mine);
      __syncthreads();
      dst_staged = int64_t(sh.in_range) == n_in;
    }
    const int dmis = int(reinterpret_cast<uintptr_t>(dst + dbase) & 15);
    Td* dimg = reinterpret_cast<Td*>(sh.dst_img + dmis);
    const Ts* simg = reinterpret_cast<const Ts*>(sh.src_img + sshift);
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      if (doff[i] < 0) continue;
      const int64_t s = soff[i];
      bool exact = true;
      Td v = Td(0);
      if (s >= 0) {
        const Ts raw = src_staged ? simg[s - int64_t(lo)] : ldg_t(src + s);
        v = transform<K, Ts, Td>(raw, &exact);
        if constexpr (K == Kind::kBroadcast) {
          int64_t p, c;
          tile_coords(i * kThreads + tid, pl.map_pfast, pl.log_tr, pl.log_tk, lb, p0, c0, p, c);
          count_inexact(exact, p, c);
        }
      }
      if (dst_staged)
        dimg[doff[i] - dbase] = v;
      else
        dst[doff[i]] = v;
    }
    if (dst_staged) {
      __syncthreads();
      store_span(reinterpret_cast<unsigned char*>(dst + dbase), n_in * int64_t(sizeof(Td)), sh.dst_img);
    }
    __syncthreads();  // shared buffers are reused by the next tile
  }
  if constexpr (K == Kind::kBroadcast) {
    for (int o = 16; o > 0; o >>= 1) inexact += __shfl_xor_sync(0xffffffffu, inexact, o);
    if ((tid & 31) == 0 && inexact > 0 && inexact_count != nullptr)
      atomicAdd(inexact_count, (unsigned long long)inexact);
  }
}

template <Kind K, Recipe RF, Recipe RT>
struct OpFor;
template <Recipe RF, Recipe RT>
struct OpFor<Kind::kRelayout, RF, RT> {
  using type = detail::RelayoutOp;
};
template <Recipe RF, Recipe RT>
struct OpFor<Kind::kTranspose, RF, RT> {
  using type = detail::TransposeOp;
};
template <Recipe RF, Recipe RT>
struct OpFor<Kind::kBroadcast, RF, RT> {
  using type = detail::BroadcastOp;
};

// One kernel for single operands (row_offsets == nullptr: `from`/`to` as given) and for grouped
// operands (for_each_unit deals every group's tiles; each group's layouts and bases come from row_offsets).
template <Kind K, Recipe RF, Recipe RT, bool kQuad, typename Ts, typename Td>
__global__ void __launch_bounds__(kThreads, kGenericPerSm) convert_kernel(ScaleLayout from, const Ts* src, ScaleLayout to, Td* dst,
                                                           Plan pl, const int64_t* row_offsets, int groups,
                                                           unsigned long long* inexact_count) {
  __shared__ Shared sh;
  from.recipe = RF;  // compile-time recipes: offset() folds to shifts and multiplies
  to.recipe = RT;
  using Op = typename OpFor<K, RF, RT>::type;
  using View = ViewFor<K, kQuad, Op>;
  const auto units = [&](const ScaleLayout& f, const ScaleLayout& t) {
    const View op{Op{f, t}};
    return ceil_div(op.rows(), int64_t(1) << pl.log_tr) * ceil_div(op.cols(), int64_t(1) << pl.log_tk);
  };
  for_each_unit(from, to, row_offsets, groups, sh.gw, units, [&](const ScaleLayout& f, const ScaleLayout& t,
                                                                 int64_t sb, int64_t db, int64_t tile) {
    // Group buffers start at multiples of 4 elements whenever quads are in use (launch() checks).
    const Ts* s = src + sb / (kQuad ? 4 : 1);
    Td* d = dst + db / (kQuad ? 4 : 1);
    const View op{Op{f, t}};
    const int64_t tiles_c = ceil_div(op.cols(), int64_t(1) << pl.log_tk);
    const int64_t tp = tile / tiles_c, tc = tile - tp * tiles_c;
    run_tile<K>(op, s, d, tp << pl.log_tr, tc << pl.log_tk, pl, sh, inexact_count);
  });
}

// ---- specialised kernels ----------------------------------------------------------------------------
// The large conversions have a simple structure that the generic tile kernel cannot see; these
// kernels exploit it. Each takes its bases and strides from offset() calls (per block or per tile) and
// states below which property of offset() it relies on; tests/layouts checks each property on the
// host. Inside a tile, index math is 32-bit; only bases are 64-bit. Every global access is a 16-byte
// vector where the address and the extents allow it (checked per access, so odd pitches, misaligned
// pointers and partial tiles take a byte or word path without leaving the kernel).

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }
__device__ __forceinline__ int iclamp(int64_t v, int hi) { return v < 0 ? 0 : v > hi ? hi : int(v); }

// ---- affine 2-D copy of fp32 scales (block1x128, block128x128: relayouts and transposes) ------------
// Relies on: for these recipes padded_offset(p, c) = padded_offset(0, 0) + p*dp + c*dc over the
// padded grid (an affine map; strides read off padded_offset(1,0) and (0,1)). block1x128 compact <->
// cublaslt is then a plain 2-D transpose (dc == 1 on one side, dp == 1 on the other), block128x128
// a pitched copy or a transpose. Classic shared-memory tile: 64x64 fp32 (+1 column against bank
// conflicts), loaded with float4 along the source's unit-stride axis, stored with float4 along the
// destination's; 16 KB per tile and four 16-byte loads per thread in flight. Six blocks per SM (40
// registers, 8-24 bytes spilled since the group window): at the default 88 registers only two fit, and the transpose ran at 0.45-0.69
// of copy for want of loads in flight.
constexpr int kAT = 64;
constexpr int kALd = kAT + 1;

template <Kind K, Recipe R>
__global__ void __launch_bounds__(kThreads, kAffinePerSm) affine_kernel(ScaleLayout from, const uint32_t* src, ScaleLayout to,
                                                          uint32_t* dst, const int64_t* row_offsets, int groups) {
  __shared__ uint32_t tile[kAT * kALd];
  __shared__ GroupWindow gw;
  from.recipe = R;
  to.recipe = R;
  const auto units = [](const ScaleLayout&, const ScaleLayout& t) {
    return ceil_div(t.padded_rows(), int64_t(kAT)) * ceil_div(t.padded_kblocks(), int64_t(kAT));
  };
  for_each_unit(from, to, row_offsets, groups, gw, units, [&](const ScaleLayout& f, const ScaleLayout& t, int64_t sb,
                                                              int64_t db, int64_t u) {
    const uint32_t* s = src + sb;
    uint32_t* d = dst + db;
    // Source position of destination grid position (p, c): (p, c), or (c, p) for a transpose.
    auto soff = [&](int64_t p, int64_t c) { return K == Kind::kTranspose ? f.padded_offset(c, p) : f.padded_offset(p, c); };
    const int64_t s00 = soff(0, 0), d00 = t.padded_offset(0, 0);
    const int64_t sp = soff(1, 0) - s00, sc = soff(0, 1) - s00;
    const int64_t dp = t.padded_offset(1, 0) - d00, dc = t.padded_offset(0, 1) - d00;
    const int64_t P = t.padded_rows(), C = t.padded_kblocks();
    const int64_t Pr = t.real_rows(), Cr = t.kblocks();  // is_real(p, c) <=> p < Pr && c < Cr
    // Vectors run along the unit-stride axis (the longer one when both are, e.g. L == 1).
    const bool s_cfast = sc == 1 && (sp != 1 || C >= P), s_vec = sc == 1 || sp == 1;
    const bool d_cfast = dc == 1 && (dp != 1 || C >= P), d_vec = dc == 1 || dp == 1;
    const int64_t tiles_c = ceil_div(C, kAT);
    const int64_t tp = u / tiles_c, p0 = tp * kAT, c0 = (u - tp * tiles_c) * kAT;
    const int rp = iclamp(Pr - p0, kAT), rc = iclamp(Cr - c0, kAT);  // real extent of the tile
    const int np = iclamp(P - p0, kAT), nc = iclamp(C - c0, kAT);    // destination extent
    // Load: 4 consecutive elements along the source's unit-stride axis per step; zero outside the
    // real region, so that the store writes destination padding as zero.
    if (rp > 0 && rc > 0) {
      const uint32_t* sb = s + (s00 + p0 * sp + c0 * sc);
      // Every load of the tile is issued before the first shared store: a store waits for its load,
      // and one load in flight per thread is too few bytes in flight to approach the copy's bandwidth.
      constexpr int kIt = kAT * kAT / 4 / kThreads;
      uint32_t v[kIt][4];
      #pragma unroll
      for (int it = 0; it < kIt; ++it) {
        const int i = it * kThreads + threadIdx.x;
        const int a = (i & 15) * 4, b = i >> 4;
        const int pp = s_cfast ? b : a, cc = s_cfast ? a : b;
        const uint32_t* gp = sb + (int64_t(pp) * sp + int64_t(cc) * sc);
        if (s_vec && (s_cfast ? pp < rp && cc + 4 <= rc : cc < rc && pp + 4 <= rp) && aligned16(gp)) {
          const uint4 w = __ldg(reinterpret_cast<const uint4*>(gp));
          v[it][0] = w.x, v[it][1] = w.y, v[it][2] = w.z, v[it][3] = w.w;
        } else {
          for (int k = 0; k < 4; ++k) {
            const int kp = pp + (s_cfast ? 0 : k), kc = cc + (s_cfast ? k : 0);
            v[it][k] = kp < rp && kc < rc ? __ldg(sb + (int64_t(kp) * sp + int64_t(kc) * sc)) : 0u;
          }
        }
      }
      #pragma unroll
      for (int it = 0; it < kIt; ++it) {
        const int i = it * kThreads + threadIdx.x;
        const int a = (i & 15) * 4, b = i >> 4;
        const int pp = s_cfast ? b : a, cc = s_cfast ? a : b;
        for (int k = 0; k < 4; ++k) tile[(pp + (s_cfast ? 0 : k)) * kALd + cc + (s_cfast ? k : 0)] = v[it][k];
      }
    } else {
      for (int i = threadIdx.x; i < kAT * kALd; i += kThreads) tile[i] = 0;
    }
    __syncthreads();
    // Store: 4 consecutive elements along the destination's unit-stride axis per step.
    uint32_t* db_ = d + (d00 + p0 * dp + c0 * dc);
    #pragma unroll
    for (int it = 0; it < kAT * kAT / 4 / kThreads; ++it) {
      const int i = it * kThreads + threadIdx.x;
      const int a = (i & 15) * 4, b = i >> 4;
      const int pp = d_cfast ? b : a, cc = d_cfast ? a : b;
      if (pp >= np || cc >= nc) continue;
      uint32_t v[4];
      for (int k = 0; k < 4; ++k) v[k] = tile[(pp + (d_cfast ? 0 : k)) * kALd + cc + (d_cfast ? k : 0)];
      uint32_t* gp = db_ + (int64_t(pp) * dp + int64_t(cc) * dc);
      if (d_vec && (d_cfast ? cc + 4 <= nc : pp + 4 <= np) && aligned16(gp)) {
        *reinterpret_cast<uint4*>(gp) = uint4{v[0], v[1], v[2], v[3]};
      } else {
        for (int k = 0; k < 4; ++k) {
          const int kp = pp + (d_cfast ? 0 : k), kc = cc + (d_cfast ? k : 0);
          if (kp < np && kc < nc) db_[int64_t(kp) * dp + int64_t(kc) * dc] = v[k];
        }
      }
    }
    __syncthreads();
  });
}

// ---- 128x4-tiled one-byte scales ---------------------------------------------------------------------
// Relies on (tiled side): for p0 % 128 == 0 and c0 % 4 == 0, padded_offset(p0 + t + 32j, c0 + 4q + i)
// == padded_offset(p0, c0) + 512q + 16t + 4j + i for t < 32, j < 4, i < 4 and every q with
// c0 + 4q < padded_kblocks(): a 128-row strip is one contiguous run of 512-byte tiles, and lane t of
// a warp owns the 16 bytes of rows {t, t+32, t+64, t+96} x 4 scales of tile q.
// Relies on (compact side): padded_offset(p, c) = padded_offset(0, 0) + p*pitch + c (row-major).
// A unit is one strip of 128 rows x kChunk scale columns: kChunk/4 whole tiles, 16 KB.
constexpr int kStrip = 128;
constexpr int kChunk = 128;
constexpr int kWide = kChunk / 4 + 4;  // words of a staged row: the unit's 32 + 4 for unaligned compact rows
constexpr int kWLd = kWide + 1;         // +1 (odd): both access patterns conflict-free

// Little-endian word of 4 bytes b[0..3], bytes at or past n read as zero.
__device__ __forceinline__ uint32_t load_word(const uint8_t* b, int n) {
  uint32_t w = 0;
  for (int i = 0; i < 4 && i < n; ++i) w |= uint32_t(__ldg(b + i)) << (8 * i);
  return w;
}
// 16 bytes from g (n of them real, the rest zero) as four words.
__device__ __forceinline__ void load16(const uint8_t* g, int n, uint32_t w[4]) {
  if (n >= 16 && aligned16(g)) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(g));
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else {
    for (int k = 0; k < 4; ++k) w[k] = load_word(g + 4 * k, n - 4 * k);
  }
}
// The first n (<= 16) of the 16 bytes w[0..3] to g.
__device__ __forceinline__ void store16(uint8_t* g, int n, const uint32_t w[4]) {
  if (n >= 16 && aligned16(g)) {
    *reinterpret_cast<uint4*>(g) = uint4{w[0], w[1], w[2], w[3]};
  } else {
    for (int b = 0; b < n && b < 16; ++b) g[b] = uint8_t(w[b >> 2] >> (8 * (b & 3)));
  }
}

// Compact rows that are not 16-byte aligned (pitch % 16 != 0, e.g. 515 scales per row) still move in
// aligned 16-byte chunks, including the chunk where one row ends and the next begins (written whole
// by the unit that holds the row's end; see the write loop). In memory a row's chunk
// boundaries fall at columns c with c == c0 + h (mod 16), h = (16 - addr(row, c0) % 16) % 16, the same
// for every unit of the row since c0 % 16 == 0. Writing, a unit owns the chunks that start in
// [c0 + h, c0 + h + 128): columns up to c0 + 143, i.e. 4 staged words past the unit's 32. Reading,
// a unit loads the 9 chunks that cover [c0, c0 + 128), starting at column c0 + h - 16 (or c0 when
// h == 0), and shifts each staged word into place.
__device__ __forceinline__ uint32_t shifted_word(const uint32_t* raw, int byte_off) {
  const int q = byte_off >> 2, sh = 8 * (byte_off & 3);
  return sh ? __funnelshift_r(raw[q], raw[q + 1], sh) : raw[q];
}
// Bytes of a word at or past n (columns outside the row) as zero.
__device__ __forceinline__ uint32_t keep_bytes(uint32_t w, int n) {
  return n >= 4 ? w : n <= 0 ? 0u : w & ((1u << (8 * n)) - 1u);
}
// Bytes [off, off + 4) of the 16 bytes w[0..3] (-16 < off < 16; bytes outside them read as zero). The
// word index is selected, not used as an array index, so w stays in registers.
__device__ __forceinline__ uint32_t word_at(const uint32_t w[4], int off) {
  const int q = off >> 2;  // floor
  const auto pick = [&](int i) { return i == 0 ? w[0] : i == 1 ? w[1] : i == 2 ? w[2] : i == 3 ? w[3] : 0u; };
  return __funnelshift_r(pick(q), pick(q + 1), 8 * (off & 3));
}
// Byte b of a staged row (byte b % 4 of word b / 4).
__device__ __forceinline__ uint8_t staged_byte(const uint32_t* row, int b) { return uint8_t(row[b >> 2] >> (8 * (b & 3))); }
struct StripUnit {
  int64_t p0, c0;
  int rows, cols, tiles;  // real compact rows and columns in the unit, tiles (4 columns each) to write
};
__device__ __forceinline__ StripUnit strip_unit(int64_t u, int64_t chunks, int64_t R, int64_t S, int64_t S4) {
  StripUnit su;
  const int64_t strip = u / chunks;
  su.p0 = strip * kStrip;
  su.c0 = (u - strip * chunks) * kChunk;
  su.rows = iclamp(R - su.p0, kStrip);
  su.cols = iclamp(S - su.c0, kChunk);
  su.tiles = iclamp(S4 - su.c0, kChunk) / 4;
  return su;
}

// mxfp8 / nvfp4 compact (R, S) <-> 128x4 tiles. kToTiled: stage 128 rows x 128 bytes of the compact
// rows with 16-byte loads, then write 32 whole tiles with 16-byte stores (rows >= R and columns >= S
// as zero); otherwise the inverse.
template <bool kToTiled, Recipe R>
__global__ void __launch_bounds__(kThreads, kRelayoutPerSm) tiled_relayout_kernel(ScaleLayout from, const uint8_t* src, ScaleLayout to,
                                                                  uint8_t* dst, const int64_t* row_offsets, int groups) {
  __shared__ uint32_t stage[kStrip * kWLd];
  __shared__ int row_first[kStrip];  // unaligned compact rows: column (from c0) of a row's first raw chunk
  __shared__ GroupWindow gw;
  from.recipe = R;
  to.recipe = R;
  const auto units = [](const ScaleLayout& f, const ScaleLayout& t) {
    const ScaleLayout& tl = kToTiled ? t : f;
    return (tl.padded_rows() / kStrip) * ceil_div(tl.padded_kblocks(), int64_t(kChunk));
  };
  for_each_unit(from, to, row_offsets, groups, gw, units, [&](const ScaleLayout& f, const ScaleLayout& t, int64_t sb,
                                                              int64_t db, int64_t u) {
    const uint8_t* s = src + sb;
    uint8_t* d = dst + db;
    const ScaleLayout& cl = kToTiled ? f : t;  // compact side
    const ScaleLayout& tl = kToTiled ? t : f;  // tiled side
    const int64_t pitch = cl.padded_offset(1, 0) - cl.padded_offset(0, 0);
    const int64_t Rr = cl.padded_rows(), S = cl.kblocks(), S4 = tl.padded_kblocks();
    const int64_t chunks = ceil_div(S4, kChunk);
    const StripUnit su = strip_unit(u, chunks, Rr, S, S4);
    const int64_t cbase = cl.padded_offset(su.p0, su.c0), tbase = tl.padded_offset(su.p0, su.c0);
    // Compact granule i: row i / 8, bytes 16*(i % 8) ..; a warp covers 4 rows x 128 bytes.
    // Tiled word i: tile i / 32, lane i % 32; a warp writes one 512-byte tile.
    // Compact rows that do not start 16-byte aligned move in the row's own aligned chunks (above).
    const bool rows16 = pitch % 16 == 0 && aligned16(kToTiled ? s + cbase : d + cbase);
    const int remaining = iclamp(S - su.c0, 4 * kWide);  // real columns of the rows from c0 on (unaligned rows)
    if (kToTiled) {
      const uint8_t* cb = s + cbase;
      if (rows16) {
        constexpr int kIt = kStrip * kChunk / 16 / kThreads;
        uint32_t w[kIt][4];
        #pragma unroll
        for (int it = 0; it < kIt; ++it) {  // all loads first (see affine_kernel)
          const int i = it * kThreads + threadIdx.x;
          const int rr = i >> 3, cc = (i & 7) * 16;
          for (int k = 0; k < 4; ++k) w[it][k] = 0;
          if (rr < su.rows && cc < su.cols) load16(cb + (int64_t(rr) * pitch + cc), su.cols - cc, w[it]);
        }
        #pragma unroll
        for (int it = 0; it < kIt; ++it) {
          const int i = it * kThreads + threadIdx.x;
          const int rr = i >> 3, cc = (i & 7) * 16;
          for (int k = 0; k < 4; ++k) stage[rr * kWLd + cc / 4 + k] = w[it][k];
        }
      } else {
        // Raw chunks k < 9 of each row from column c0 + first (first = h - 16, or 0), in 16-byte loads
        // unless a chunk leaves the operand's buffer. Bytes outside the row are dropped below.
        const uint8_t* lo = s;
        const uint8_t* hi = s + cl.size();
        constexpr int kIt = (kStrip * 9 + kThreads - 1) / kThreads;
        uint32_t w[kIt][4];
        #pragma unroll
        for (int it = 0; it < kIt; ++it) {  // all loads first (see affine_kernel)
          const int i = it * kThreads + threadIdx.x, rr = i / 9, k = i - rr * 9;
          for (int m = 0; m < 4; ++m) w[it][m] = 0;
          if (i >= kStrip * 9 || rr >= su.rows) continue;
          const uint8_t* row = cb + int64_t(rr) * pitch;
          const int h = int((16 - (reinterpret_cast<uintptr_t>(row) & 15)) & 15);
          const int first = h ? h - 16 : 0;
          if (k == 0) row_first[rr] = first;
          const int o = first + 16 * k;
          if (o >= su.cols) continue;
          const uint8_t* g = row + o;
          if (g >= lo && g + 16 <= hi) {
            const uint4 v = __ldg(reinterpret_cast<const uint4*>(g));
            w[it][0] = v.x, w[it][1] = v.y, w[it][2] = v.z, w[it][3] = v.w;
          } else {
            for (int b = 0; b < 16; ++b)
              if (g + b >= lo && g + b < hi) w[it][b >> 2] |= uint32_t(__ldg(g + b)) << (8 * (b & 3));
          }
        }
        #pragma unroll
        for (int it = 0; it < kIt; ++it) {
          const int i = it * kThreads + threadIdx.x, rr = i / 9, k = i - rr * 9;
          if (i < kStrip * 9 && rr < su.rows)
            for (int m = 0; m < 4; ++m) stage[rr * kWLd + 4 * k + m] = w[it][m];
        }
      }
      __syncthreads();
      uint8_t* tb = d + tbase;
      #pragma unroll
      for (int it = 0; it < kStrip * kChunk / 16 / kThreads; ++it) {
        const int i = it * kThreads + threadIdx.x;
        const int q = i >> 5, lane = i & 31;
        if (q >= su.tiles) continue;
        uint32_t w[4];
        for (int j = 0; j < 4; ++j) {
          const int rr = lane + 32 * j;
          if (rows16)
            w[j] = stage[rr * kWLd + q];
          else
            w[j] = rr < su.rows ? keep_bytes(shifted_word(stage + rr * kWLd, 4 * q - row_first[rr]), su.cols - 4 * q) : 0u;
        }
        store16(tb + (q * 512 + lane * 16), 16, w);
      }
    } else {
      const uint8_t* tb = s + tbase;
      const int tiles = rows16 ? su.tiles : iclamp(S4 - su.c0, 4 * kWide) / 4;  // unaligned: 4 more
      // The unit's own 32 tiles with all loads first (see affine_kernel); unaligned rows' 4 more after.
      constexpr int kIt = kChunk / 4 * 32 / kThreads;
      uint32_t w[kIt][4];
      #pragma unroll
      for (int it = 0; it < kIt; ++it) {
        const int i = it * kThreads + threadIdx.x;
        if (i < tiles * 32) load16(tb + ((i >> 5) * 512 + (i & 31) * 16), 16, w[it]);
      }
      #pragma unroll
      for (int it = 0; it < kIt; ++it) {
        const int i = it * kThreads + threadIdx.x;
        if (i < tiles * 32)
          for (int j = 0; j < 4; ++j) stage[((i & 31) + 32 * j) * kWLd + (i >> 5)] = w[it][j];
      }
      for (int i = kIt * kThreads + threadIdx.x; i < tiles * 32; i += kThreads) {
        uint32_t x[4];
        load16(tb + ((i >> 5) * 512 + (i & 31) * 16), 16, x);
        for (int j = 0; j < 4; ++j) stage[((i & 31) + 32 * j) * kWLd + (i >> 5)] = x[j];
      }
      __syncthreads();
      uint8_t* cb = d + cbase;
      if (rows16) {
        #pragma unroll
        for (int it = 0; it < kStrip * kChunk / 16 / kThreads; ++it) {
          const int i = it * kThreads + threadIdx.x;
          const int rr = i >> 3, cc = (i & 7) * 16;
          if (rr >= su.rows || cc >= su.cols) continue;
          uint32_t w[4];
          for (int k = 0; k < 4; ++k) w[k] = stage[rr * kWLd + cc / 4 + k];
          store16(cb + (int64_t(rr) * pitch + cc), su.cols - cc, w);
        }
      } else {
        // The unit's chunks of row rr start at columns c0 + h + 16k, k < 8. The chunk holding the
        // row's end also holds the head of the next row (dense rows: the next row starts h' = 16 - a
        // bytes before the next aligned address, a = the row's bytes in the chunk), so its owner
        // writes it whole, reading those h' bytes from the next row's first four tiles (columns
        // 0..15; L2-resident: the next row's first unit reads them too). Only the operand's first
        // head and last tail (the neighbours are not ours) and rows of under 16 scales go byte by byte.
        const bool splice = S >= 16 && pitch == S;
        for (int i = threadIdx.x; i < kStrip * 8; i += kThreads) {
          const int rr = i >> 3, k = i & 7;
          if (rr >= su.rows) continue;
          const int64_t r = su.p0 + rr;
          uint8_t* row = cb + int64_t(rr) * pitch;
          const int h = int((16 - (reinterpret_cast<uintptr_t>(row) & 15)) & 15);
          const uint32_t* sr = stage + rr * kWLd;
          const int o = h + 16 * k;
          if (o + 16 <= remaining) {
            uint32_t w[4];
            for (int m = 0; m < 4; ++m) w[m] = shifted_word(sr, o + 4 * m);
            *reinterpret_cast<uint4*>(row + o) = uint4{w[0], w[1], w[2], w[3]};
          } else if (o < remaining && splice && r + 1 < Rr) {
            const uint8_t* next = s + tl.padded_offset(r + 1, 0);  // tiles 0..3 of the next row: 512 B apart
            uint32_t nw[4], w[4];
            for (int m = 0; m < 4; ++m)  // a misaligned source pointer reads bytes
              nw[m] = (reinterpret_cast<uintptr_t>(next) & 3) == 0 ? __ldg(reinterpret_cast<const uint32_t*>(next + 512 * m))
                                                                   : load_word(next + 512 * m, 4);
            const int a = remaining - o;  // 1..15 bytes of this row, then the next row's
            for (int m = 0; m < 4; ++m) {
              const uint32_t mine = keep_bytes(0xFFFFFFFFu, a - 4 * m);
              w[m] = (shifted_word(sr, o + 4 * m) & mine) | (word_at(nw, 4 * m - a) & ~mine);
            }
            *reinterpret_cast<uint4*>(row + o) = uint4{w[0], w[1], w[2], w[3]};
          } else {
            for (int b = o; b < remaining && b < o + 16; ++b) row[b] = staged_byte(sr, b);
          }
          if (su.c0 == 0 && k == 0 && (r == 0 || !splice))
            for (int b = 0; b < h && b < remaining; ++b) row[b] = staged_byte(sr, b);
        }
      }
    }
    __syncthreads();
  });
}

// The word of four destination scales (K-blocks c..c+3 of the 32-row group starting at stored row p),
// n of them real (n <= 0: padding, zero). An inexact broadcast source scale is counted once, at the
// first destination block it covers (as the host counts it).
template <Kind K, class Op>
__device__ __forceinline__ uint32_t fill_word(const Op& op, const ScaleLayout& f, const ScaleLayout& t, const uint8_t* s,
                                              int64_t p, int64_t c, int n, int& inexact) {
  const int64_t si = n > 0 ? op.src(p, c) : -1;  // -1: padding row or column
  if (si < 0) return 0u;
  if constexpr (K == Kind::kBroadcast) {
    bool exact = true;
    const uint32_t code = detail::e8m0_from_pow2(__ldg(reinterpret_cast<const uint32_t*>(s) + si), &exact);
    if (!exact && (p * t.row_step()) % f.block_rows() == 0 && (c * t.block_k()) % f.block_k() == 0) ++inexact;
    return keep_bytes(code * 0x01010101u, n);
  } else {
    const uint8_t* b = s + si;
    return n >= 4 && (reinterpret_cast<uintptr_t>(b) & 3) == 0 ? __ldg(reinterpret_cast<const uint32_t*>(b)) : load_word(b, n);
  }
}

// 128x4-tiled destinations computed from a tiny source: mxfp8-32x32 compact -> cublaslt (each scale
// replicated to its 32 rows) and block128x128 -> mxfp8 / mxfp8-32x32 cublaslt (broadcast, E8M0). The
// write is all that matters. Relies on the tiled property above and on the source: a 32-row group
// starting at a multiple of 32 reads one source row (offset(r, kb) == offset(r - r % 32, kb) for
// block_rows() >= 32), and four K-blocks c..c+3 (c % 4 == 0) read consecutive source bytes (compact:
// offset(r, c + i) = offset(r, c) + i) or one source scale (broadcast: the host checks that
// 4 * to.block_k() divides from.block_k()). So a unit has only 4 x 32 distinct 32-bit words: 128
// threads compute them (source index from Op::src, i.e. offset()) into shared memory, then every lane
// writes whole 16-byte words (rows lane + 32j, j < 4), zeroing rows >= R. Grouped operands only:
// single operands take tiled_fill_flat_kernel (below).
template <Kind K, Recipe RF, Recipe RT>
__global__ void __launch_bounds__(kThreads, kTiledPerSm) tiled_fill_kernel(ScaleLayout from, const void* src, ScaleLayout to,
                                                              uint8_t* dst, const int64_t* row_offsets, int groups,
                                                              unsigned long long* inexact_count) {
  __shared__ uint32_t words[4 * 32];
  __shared__ GroupWindow gw;
  from.recipe = RF;
  to.recipe = RT;
  int inexact = 0;
  const auto units = [](const ScaleLayout&, const ScaleLayout& t) {
    return (t.padded_rows() / kStrip) * ceil_div(t.padded_kblocks(), int64_t(kChunk));
  };
  for_each_unit(from, to, row_offsets, groups, gw, units, [&](const ScaleLayout& f, const ScaleLayout& t, int64_t sb,
                                                              int64_t db, int64_t u) {
    const uint8_t* s = static_cast<const uint8_t*>(src) + sb * f.scale_bytes();
    uint8_t* d = dst + db;
    using Op = typename OpFor<K, RF, RT>::type;
    const Op op{f, t};
    const int64_t S = t.kblocks(), S4 = t.padded_kblocks(), Rr = t.real_rows();
    const int64_t chunks = ceil_div(S4, kChunk);
    const StripUnit su = strip_unit(u, chunks, Rr, S, S4);
    // Stage the unit's distinct words: row group j (rows p0 + 32j ..) x tile q, 4 scales each.
    if (threadIdx.x < 4 * kChunk / 4) {
      const int j = threadIdx.x >> 5, q = threadIdx.x & 31;
      const uint32_t w = fill_word<K>(op, f, t, s, su.p0 + 32 * j, su.c0 + 4 * q, q < su.tiles ? su.cols - 4 * q : 0,
                                      inexact);
      words[j * 32 + q] = w;
    }
    __syncthreads();
    uint8_t* tb = d + t.padded_offset(su.p0, su.c0);
#pragma unroll
    for (int it = 0; it < kStrip * kChunk / 16 / kThreads; ++it) {
      const int i = it * kThreads + threadIdx.x;
      const int q = i >> 5, lane = i & 31;
      if (q >= su.tiles) continue;
      uint32_t w[4];
      for (int j = 0; j < 4; ++j) w[j] = su.p0 + lane + 32 * j < Rr ? words[j * 32 + q] : 0u;
      store16(tb + (q * 512 + lane * 16), 16, w);
    }
    __syncthreads();
  });
  if constexpr (K == Kind::kBroadcast) {
    for (int o = 16; o > 0; o >>= 1) inexact += __shfl_xor_sync(0xffffffffu, inexact, o);
    if ((threadIdx.x & 31) == 0 && inexact > 0 && inexact_count != nullptr)
      atomicAdd(inexact_count, (unsigned long long)inexact);
  }
}

// Single operands: the same words and stores as tiled_fill_kernel, scheduled as a memset is. A warp
// owns 8 consecutive tiles of one strip (4 KB of output): lane l computes the word (row group l / 8,
// tile l % 8) and the lanes exchange them by shuffles, so there is no shared memory, no barrier and no
// loop over units; the grid has exactly one warp per 8 tiles and the hardware deals the short blocks
// over the SMs as they free up. (The unit loop of tiled_fill_kernel left a block 2 or 3 units of 16 KB
// with a load latency in front of each.)
template <Kind K, Recipe RF, Recipe RT>
__global__ void __launch_bounds__(kThreads) tiled_fill_flat_kernel(ScaleLayout from, const void* src, ScaleLayout to,
                                                                   uint8_t* dst, unsigned long long* inexact_count) {
  from.recipe = RF;
  to.recipe = RT;
  using Op = typename OpFor<K, RF, RT>::type;
  const Op op{from, to};
  const int lane = int(threadIdx.x) & 31;
  // Tiles per strip and 8-tile groups per strip; 32-bit: a strip has at most 2^31 / 512 tiles.
  const uint32_t t4 = uint32_t(to.padded_kblocks() / 4), gps = (t4 + 7) / 8;
  const uint32_t wu = blockIdx.x * (kThreads / 32) + (threadIdx.x >> 5), strip = wu / gps, q0 = (wu - strip * gps) * 8;
  const bool live = int64_t(strip) * kStrip < to.padded_rows();  // the last block's spare warps
  const int64_t p0 = int64_t(strip) * kStrip, Rr = to.real_rows();
  int inexact = 0;
  const uint32_t q = q0 + (lane & 7);
  const int64_t c = 4 * int64_t(q);
  const int n = live && q < t4 ? int(to.kblocks() - c < 4 ? to.kblocks() - c : 4) : 0;
  const uint32_t word = fill_word<K>(op, from, to, static_cast<const uint8_t*>(src), p0 + 32 * (lane >> 3), c, n, inexact);
  uint8_t* tb = live ? dst + to.padded_offset(p0, 0) + int64_t(q0) * 512 + lane * 16 : nullptr;
#pragma unroll
  for (int k = 0; k < 8; ++k) {  // shuffles by every lane (the whole warp takes part)
    uint32_t w[4];
    for (int j = 0; j < 4; ++j) {
      w[j] = __shfl_sync(0xffffffffu, word, 8 * j + k);
      if (p0 + lane + 32 * j >= Rr) w[j] = 0u;
    }
    if (live && q0 + k < t4) store16(tb + k * 512, 16, w);
  }
  if constexpr (K == Kind::kBroadcast) {
    for (int o = 16; o > 0; o >>= 1) inexact += __shfl_xor_sync(0xffffffffu, inexact, o);
    if (lane == 0 && inexact > 0 && inexact_count != nullptr) atomicAdd(inexact_count, (unsigned long long)inexact);
  }
}

// ---- host planning ---------------------------------------------------------------------------------
int log2_ceil(int64_t v) {
  int l = 0;
  while ((int64_t(1) << l) < v) ++l;
  return l;
}

template <class W>
Plan make_plan(const W& w) {
  const ScaleLayout& from = w.op.from;
  const ScaleLayout& to = w.op.to;
  const int64_t P = w.rows(), C = w.cols();
  Plan pl;
  pl.dst_pfast = P > 1 && w.dst(1, 0) - w.dst(0, 0) == 1 && !(C > 1 && w.dst(0, 1) - w.dst(0, 0) == 1);
  if (w.src(0, 0) >= 0 && w.src(1, 0) >= 0) {
    const bool row_unit = w.src(1, 0) - w.src(0, 0) == 1;
    const bool kb_unit = C > 1 && w.src(0, 1) >= 0 && w.src(0, 1) - w.src(0, 0) == 1;
    pl.src_pfast = row_unit && !kb_unit;
  }
  const bool tiled = (recipe_is_tiled(from.recipe) && from.format == ScaleFormat::kCublasLt) ||
                     (recipe_is_tiled(to.recipe) && to.format == ScaleFormat::kCublasLt);
  int log_tr, log_tk;
  if (tiled) {
    // A 128-row band of 128x4 tiles; quads make each K-column four K-blocks wide.
    log_tr = log2_ceil(std::max<int64_t>(1, 128 / to.row_step()));
    log_tk = 12 - log_tr;
    if (log_tr >= 7) log_tk = 5;  // 128 rows x 32 columns: 8 (or 32 with quads) whole 128x4 tiles
  } else if (pl.src_pfast != pl.dst_pfast) {
    log_tr = 7;
    log_tk = 5;
  } else if (pl.dst_pfast) {
    log_tr = std::min(12, log2_ceil(P));
    log_tk = 12 - log_tr;
  } else {
    log_tk = std::min(12, log2_ceil(C));
    log_tr = 12 - log_tk;
  }
  pl.log_tr = log_tr;
  pl.log_tk = log_tk;

  // Examine the first tile on the host (through offset()) to decide what is worth staging; the
  // kernel re-checks every tile and falls back to direct access where a tile does not qualify.
  const int64_t tr = std::min<int64_t>(int64_t(1) << log_tr, P), tk = std::min<int64_t>(int64_t(1) << log_tk, C);
  int64_t lo = INT64_MAX, hi = -1, dlo = INT64_MAX, dhi = -1;
  for (int64_t p = 0; p < tr; ++p)
    for (int64_t c = 0; c < tk; ++c) {
      const int64_t s = w.src(p, c);
      if (s >= 0) {
        lo = std::min(lo, s);
        hi = std::max(hi, s);
      }
      const int64_t d = w.dst(p, c);
      dlo = std::min(dlo, d);
      dhi = std::max(dhi, d);
    }
  pl.stage_src = hi >= lo && hi - lo + 1 <= kTile;
  pl.stage_dst = dhi - dlo + 1 == tr * tk && dlo == w.dst(0, 0);
  pl.map_pfast = pl.stage_dst ? pl.src_pfast : pl.dst_pfast;
  pl.transpose_tile = !pl.stage_src && !pl.stage_dst && pl.src_pfast != pl.dst_pfast && log_tr <= 7;
  return pl;
}

/// Quads apply to one-byte scales when the K-blocks of both buffers come in whole, contiguous,
/// 4-aligned groups of four (padded_kblocks % 4 == 0 on both sides, first quad checked through
/// offset()) and both pointers are 4-byte aligned.
template <class Op>
bool quads_apply(const Op& op, const void* src, const void* dst) {
  const ScaleLayout& to = op.to;
  if (to.scale_bytes() != 1 || op.from.scale_bytes() != 1) return false;
  if (to.kblocks() % 4 != 0 || to.padded_kblocks() % 4 != 0 || to.kblocks() < 4) return false;
  if ((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 3) return false;
  if (to.padded_offset(0, 0) % 4 != 0 || to.padded_offset(0, 3) - to.padded_offset(0, 0) != 3) return false;
  const int64_t s0 = op.src(0, 0), s3 = op.src(0, 3);
  return s0 >= 0 && s0 % 4 == 0 && s3 - s0 == 3;
}

// Cached per device (the caller made the stream's device current: see launch()).
int sm_count() { return scalemm::detail::sm_count(scalemm::detail::current_device()); }

// Plans depend only on the kind of operation, the two layouts and the quad choice. Planning walks one
// tile on the host (up to 4096 offset() pairs), too slow to repeat for every launch: keep them.
// Bounded, thread-safe.
struct PlanKey {
  int kind;
  bool quad;
  ScaleLayout from, to;
  bool operator<(const PlanKey& o) const {
    auto t = [](const PlanKey& k) {
      return std::make_tuple(k.kind, k.quad, int(k.from.recipe), k.from.rows, k.from.k, int(k.from.format),
                             int(k.to.recipe), k.to.rows, k.to.k, int(k.to.format));
    };
    return t(*this) < t(o);
  }
};

template <class W>
Plan cached_plan(int kind, bool quad, const W& view) {
  static std::mutex mu;
  static std::map<PlanKey, Plan> cache;
  const PlanKey key{kind, quad, view.op.from, view.op.to};
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  const Plan pl = make_plan(view);
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() >= 512) cache.clear();
  cache[key] = pl;
  return pl;
}

// 1-D grids; the kernels loop over the units for_each_unit deals them. At most as many blocks as fit
// on the GPU at once (per_sm: the kernel's __launch_bounds__ minimum, which its registers meet), so
// no block waits for a second wave. Trimming the grid so that every block gets the same number of
// units measured no different (H100, every bench_layouts case, twice). A grouped launch does not
// know its groups' sizes on the host: it sizes the grid for `groups` groups of the average size plus
// one 128-row strip of padding each (blocks past the real total leave after their first window).
unsigned grid_x(int64_t units, int per_sm) {
  const int64_t cap = int64_t(sm_count()) * per_sm;
  return unsigned(std::max<int64_t>(1, std::min(units, cap)));
}// The layout a grid is sized for and how many of it: the operand itself, or an average group.
int64_t sizing_rows(const ScaleLayout& l, const int64_t* row_offsets, int groups, int64_t rows_hint) {
  return row_offsets ? std::max<int64_t>(1, rows_hint / std::max(1, groups)) + 128 : l.rows;
}
int64_t sizing_count(const int64_t* row_offsets, int groups) { return row_offsets ? groups : 1; }

template <Kind K, Recipe RF, Recipe RT, bool kQuad, typename Ts, typename Td, class Op>
void launch_view(const Op& op, const void* src, void* dst, const int64_t* row_offsets, int groups, int64_t rows_hint,
                 unsigned long long* inexact_count, cudaStream_t stream) {
  using View = ViewFor<K, kQuad, Op>;
  const Plan pl = cached_plan(int(K), kQuad, View{op});
  ScaleLayout f = op.from, t = op.to;
  f.rows = t.rows = sizing_rows(op.to, row_offsets, groups, rows_hint);
  const View sv{Op{f, t}};
  const int64_t tiles = ceil_div(sv.rows(), int64_t(1) << pl.log_tr) * ceil_div(sv.cols(), int64_t(1) << pl.log_tk);
  auto* kernel = &convert_kernel<K, RF, RT, kQuad, Ts, Td>;
  SCALEMM_LAUNCH(kernel, dim3(grid_x(tiles * sizing_count(row_offsets, groups), kGenericPerSm)), dim3(kThreads), stream)(
      op.from, static_cast<const Ts*>(src), op.to, static_cast<Td*>(dst), pl, row_offsets, groups, inexact_count);
  cuda_check(cudaGetLastError(), "scalemm layouts conversion kernel launch");
}

/// Launches the specialised kernel for this conversion if there is one; false: use the tile kernel.
template <Kind K, Recipe RF, Recipe RT, typename Ts, typename Td, class Op>
bool launch_special(const Op& op, const void* src, void* dst, const int64_t* row_offsets, int groups,
                    int64_t rows_hint, unsigned long long* inexact_count, cudaStream_t stream) {
  ScaleLayout to = op.to;  // sizes the grid
  to.rows = sizing_rows(op.to, row_offsets, groups, rows_hint);
  const int64_t n = sizing_count(row_offsets, groups);
  const bool to_tiled = to.format == ScaleFormat::kCublasLt;
  const int64_t tiled_units = ceil_div(to.padded_rows(), kStrip) * ceil_div(to.padded_kblocks(), kChunk);
  if constexpr (K != Kind::kBroadcast && RF == RT && (RT == Recipe::kBlock1x128 || RT == Recipe::kBlock128x128) &&
                sizeof(Ts) == 4 && sizeof(Td) == 4) {
    const dim3 grid(grid_x(n * ceil_div(to.padded_rows(), kAT) * ceil_div(to.padded_kblocks(), kAT), kAffinePerSm));
    auto* kernel = &affine_kernel<K, RT>;
    SCALEMM_LAUNCH(kernel, grid, dim3(kThreads), stream)(op.from, static_cast<const uint32_t*>(src), op.to,
                                                         static_cast<uint32_t*>(dst), row_offsets, groups);
    return true;
  } else if constexpr (K == Kind::kRelayout && RF == RT && (RT == Recipe::kMxfp8 || RT == Recipe::kNvfp4)) {
    if (op.from.format == op.to.format) return false;
    const ScaleLayout tiled = to.with_format(ScaleFormat::kCublasLt);
    const dim3 grid(grid_x(n * ceil_div(tiled.padded_rows(), kStrip) * ceil_div(tiled.padded_kblocks(), kChunk), kRelayoutPerSm));
    auto* kernel = to_tiled ? &tiled_relayout_kernel<true, RT> : &tiled_relayout_kernel<false, RT>;
    SCALEMM_LAUNCH(kernel, grid, dim3(kThreads), stream)(op.from, static_cast<const uint8_t*>(src), op.to,
                                                         static_cast<uint8_t*>(dst), row_offsets, groups);
    return true;
  } else if constexpr ((K == Kind::kRelayout && RT == Recipe::kMxfp8_32x32) || K == Kind::kBroadcast) {
    if (!to_tiled || (K == Kind::kRelayout && op.from.format != ScaleFormat::kCompact)) return false;
    // Broadcast words: the four K-blocks of a word must share one source scale.
    if (K == Kind::kBroadcast && op.from.block_k() % (4 * op.to.block_k()) != 0) return false;
    if (row_offsets == nullptr) {
      const int64_t warps = ceil_div(to.padded_rows(), kStrip) * ceil_div(to.padded_kblocks() / 4, int64_t(8));
      auto* kernel = &tiled_fill_flat_kernel<K, RF, RT>;
      SCALEMM_LAUNCH(kernel, dim3(unsigned(ceil_div(warps, int64_t(kThreads / 32)))), dim3(kThreads), stream)(
          op.from, src, op.to, static_cast<uint8_t*>(dst), inexact_count);
      return true;
    }
    auto* kernel = &tiled_fill_kernel<K, RF, RT>;
    SCALEMM_LAUNCH(kernel, dim3(grid_x(n * tiled_units, kTiledPerSm)), dim3(kThreads), stream)(
        op.from, src, op.to, static_cast<uint8_t*>(dst), row_offsets, groups, inexact_count);
    return true;
  }
  (void)to_tiled;
  (void)tiled_units;
  (void)n;
  (void)inexact_count;
  return false;
}

template <Kind K, Recipe RF, Recipe RT, typename Ts, typename Td, class Op>
void launch(const Op& op, const void* src, void* dst, const int64_t* row_offsets, int groups, int64_t rows_hint,
            unsigned long long* inexact_count, cudaStream_t stream) {
  if (row_offsets ? groups <= 0 : op.to.size() == 0) return;
  // Launches go to the stream's device, whichever device the calling thread has current.
  const scalemm::detail::DeviceScope scope(scalemm::detail::stream_device(stream));
  if (launch_special<K, RF, RT, Ts, Td>(op, src, dst, row_offsets, groups, rows_hint, inexact_count, stream)) {
    cuda_check(cudaGetLastError(), "scalemm layouts conversion kernel launch");
    return;
  }
  if constexpr (K == Kind::kBroadcast) {
    // Four E8M0 codes per word when each aligned quad of K-blocks lies in one source block.
    const ScaleLayout& to = op.to;
    if (to.kblocks() % 4 == 0 && to.padded_kblocks() % 4 == 0 && to.kblocks() >= 4 &&
        (reinterpret_cast<uintptr_t>(dst) & 3) == 0 && to.padded_offset(0, 0) % 4 == 0 &&
        to.padded_offset(0, 3) - to.padded_offset(0, 0) == 3 && op.src(0, 0) >= 0 && op.src(0, 0) == op.src(0, 3) &&
        (4 * to.block_k()) <= op.from.block_k() && op.from.block_k() % (4 * to.block_k()) == 0)
      return launch_view<K, RF, RT, true, Ts, uint32_t>(op, src, dst, row_offsets, groups, rows_hint, inexact_count,
                                                         stream);
  }
  if constexpr (sizeof(Ts) == 1 && sizeof(Td) == 1 && K == Kind::kRelayout) {
    // Grouped: every group's buffer must start 4-aligned too; compact and tiled sizes are multiples
    // of kblocks (% 4 == 0) or of 512, which quads_apply's kblocks check guarantees.
    if (quads_apply(op, src, dst))
      return launch_view<K, RF, RT, true, uint32_t, uint32_t>(op, src, dst, row_offsets, groups, rows_hint,
                                                               inexact_count, stream);
  }
  launch_view<K, RF, RT, false, Ts, Td>(op, src, dst, row_offsets, groups, rows_hint, inexact_count, stream);
}

template <Kind K, class Op>
void launch_by_recipe(const Op& op, const void* src, void* dst, const int64_t* row_offsets, int groups,
                      int64_t rows_hint, cudaStream_t stream) {
  using R = Recipe;
  switch (op.to.recipe) {
    case R::kTensorwise:
      return launch<K, R::kTensorwise, R::kTensorwise, uint32_t, uint32_t>(op, src, dst, row_offsets, groups, rows_hint, nullptr, stream);
    case R::kRowwise:
      return launch<K, R::kRowwise, R::kRowwise, uint32_t, uint32_t>(op, src, dst, row_offsets, groups, rows_hint, nullptr, stream);
    case R::kBlock1x128:
      return launch<K, R::kBlock1x128, R::kBlock1x128, uint32_t, uint32_t>(op, src, dst, row_offsets, groups, rows_hint, nullptr, stream);
    case R::kBlock128x128:
      return launch<K, R::kBlock128x128, R::kBlock128x128, uint32_t, uint32_t>(op, src, dst, row_offsets, groups, rows_hint, nullptr, stream);
    case R::kMxfp8:
      return launch<K, R::kMxfp8, R::kMxfp8, uint8_t, uint8_t>(op, src, dst, row_offsets, groups, rows_hint, nullptr, stream);
    case R::kMxfp8_32x32:
      return launch<K, R::kMxfp8_32x32, R::kMxfp8_32x32, uint8_t, uint8_t>(op, src, dst, row_offsets, groups, rows_hint, nullptr, stream);
    case R::kNvfp4:
      return launch<K, R::kNvfp4, R::kNvfp4, uint8_t, uint8_t>(op, src, dst, row_offsets, groups, rows_hint, nullptr, stream);
  }
}

// ---- content check -----------------------------------------------------------------------------------
__global__ void __launch_bounds__(kThreads) content_kernel(ScaleLayout l, const unsigned char* buf, int64_t limit,
                                                           ContentReport* rep) {
  const int64_t P = l.padded_rows(), C = l.padded_kblocks();
  const DType dt = l.scale_dtype();
  const int eb = l.scale_bytes();
  const bool replicated = l.format == ScaleFormat::kCublasLt && l.recipe == Recipe::kMxfp8_32x32;
  auto load = [&](int64_t o) -> uint32_t {
    return eb == 4 ? __ldg(reinterpret_cast<const uint32_t*>(buf) + o) : uint32_t(__ldg(buf + o));
  };
  for (int64_t p = int64_t(blockIdx.y) * 8 + threadIdx.y; p < P; p += int64_t(gridDim.y) * 8)
    for (int64_t kb = int64_t(blockIdx.x) * 32 + threadIdx.x; kb < C; kb += int64_t(gridDim.x) * 32) {
      const int64_t o = l.padded_offset(p, kb);
      if (o >= limit) continue;
      const uint32_t v = load(o);
      int rule = -1, rule2 = -1;
      if (!l.is_real(p, kb)) {
        if (v != 0) rule = int(ContentRule::kPaddingNonzero);
      } else {
        rule = content_violation(dt, v);
        if (replicated && p % 32 != 0) {
          const int64_t o0 = l.padded_offset(p - p % 32, kb);
          if (o0 < limit && load(o0) != v) rule2 = int(ContentRule::kReplicaMismatch);
        }
      }
      const int hits[2] = {rule, rule2};
      for (int h = 0; h < 2; ++h) {
        const int r = hits[h];
        if (r < 0) continue;
        atomicAdd(&rep->count[r], 1ull);
        atomicMin(&rep->first_offset[r], (unsigned long long)o);
        atomicExch(&rep->any, 1u);
      }
    }
}

void launch_content(const ScaleLayout& l, const void* scales, int64_t limit, ContentReport* rep, cudaStream_t stream) {
  require(rep != nullptr, "layouts::gpu::check_content_async: report is null");
  const scalemm::detail::DeviceScope scope(scalemm::detail::stream_device(stream));
  cuda_check(cudaMemsetAsync(rep, 0, sizeof(ContentReport), stream), "cudaMemsetAsync(report)");
  cuda_check(cudaMemsetAsync(rep->first_offset, 0xFF, sizeof(rep->first_offset), stream), "cudaMemsetAsync(report)");
  if (l.size() == 0) return;
  require(scales != nullptr, "layouts::gpu::check_content_async: scales is null");
  const int64_t gx = std::min<int64_t>(ceil_div(l.padded_kblocks(), 32), 64);
  const int64_t gy = std::min<int64_t>(ceil_div(l.padded_rows(), 8), std::max<int64_t>(1, int64_t(sm_count()) * 16 / gx));
  auto* kernel = &content_kernel;
  SCALEMM_LAUNCH(kernel, dim3(unsigned(gx), unsigned(std::min<int64_t>(gy, 65535))), dim3(32, 8), stream)(
      l, static_cast<const unsigned char*>(scales), limit, rep);
  cuda_check(cudaGetLastError(), "scalemm layouts content-check kernel launch");
}

}  // namespace

void convert(const ScaleLayout& from, const void* src, const ScaleLayout& to, void* dst, cudaStream_t stream) {
  require(from.recipe == to.recipe && from.rows == to.rows && from.k == to.k,
          "layouts::gpu::convert: 'to' must describe the same operand as 'from': " + from.to_string() + " vs " +
              to.to_string());
  require(from.rows >= 0 && from.k >= 0, "layouts::gpu::convert: negative extent");
  require((src && dst) || to.size() == 0, "layouts::gpu::convert: null buffer");
  launch_by_recipe<Kind::kRelayout>(detail::RelayoutOp{from, to}, src, dst, nullptr, 0, 0, stream);
}

void to_cublaslt(const ScaleLayout& compact, const void* src, void* dst, cudaStream_t stream) {
  require(compact.format == ScaleFormat::kCompact, "layouts::gpu::to_cublaslt: source must be compact");
  convert(compact, src, compact.with_format(ScaleFormat::kCublasLt), dst, stream);
}

void to_compact(const ScaleLayout& cublaslt, const void* src, void* dst, cudaStream_t stream) {
  require(cublaslt.format == ScaleFormat::kCublasLt, "layouts::gpu::to_compact: source must be in cublaslt format");
  convert(cublaslt, src, cublaslt.with_format(ScaleFormat::kCompact), dst, stream);
}

void transpose(const ScaleLayout& from, const void* src, const ScaleLayout& to, void* dst, cudaStream_t stream) {
  require(to == transposed(from, to.format), "layouts::gpu::transpose: 'to' must be transposed(from)");
  require((src && dst) || to.size() == 0, "layouts::gpu::transpose: null buffer");
  const detail::TransposeOp op{from, to};
  if (from.recipe == Recipe::kBlock128x128)
    launch<Kind::kTranspose, Recipe::kBlock128x128, Recipe::kBlock128x128, uint32_t, uint32_t>(op, src, dst, nullptr, 0, 0,
                                                                                             nullptr, stream);
  else
    launch<Kind::kTranspose, Recipe::kMxfp8_32x32, Recipe::kMxfp8_32x32, uint8_t, uint8_t>(op, src, dst, nullptr, 0, 0,
                                                                                         nullptr, stream);
}

void broadcast_block128_to_mxfp8(const ScaleLayout& from, const float* src, const ScaleLayout& to, uint8_t* dst,
                                 unsigned long long* inexact_count, cudaStream_t stream) {
  require(to == mxfp8_layout_for(from, to.recipe, to.format),
          "layouts::gpu::broadcast_block128_to_mxfp8: 'to' must be the mxfp8 layout of the same operand");
  require((src && dst) || to.size() == 0, "layouts::gpu::broadcast_block128_to_mxfp8: null buffer");
  const detail::BroadcastOp op{from, to};
  if (to.recipe == Recipe::kMxfp8)
    launch<Kind::kBroadcast, Recipe::kBlock128x128, Recipe::kMxfp8, uint32_t, uint8_t>(op, src, dst, nullptr, 0, 0,
                                                                                     inexact_count, stream);
  else
    launch<Kind::kBroadcast, Recipe::kBlock128x128, Recipe::kMxfp8_32x32, uint32_t, uint8_t>(op, src, dst, nullptr, 0, 0,
                                                                                           inexact_count, stream);
}

void convert_grouped(Recipe recipe, int64_t k, const int64_t* row_offsets, int groups, int64_t rows_hint,
                     ScaleFormat from, const void* src, ScaleFormat to, void* dst, cudaStream_t stream) {
  require(groups >= 0, "layouts::gpu::convert_grouped: negative group count");
  if (groups == 0) return;
  require(row_offsets != nullptr && src != nullptr && dst != nullptr, "layouts::gpu::convert_grouped: null pointer");
  require(k >= 0, "layouts::gpu::convert_grouped: negative k");
  // The plan depends on recipe, formats and k only; a representative group stands in for all.
  const int64_t rep_rows = std::max<int64_t>(256, rows_hint / groups);
  const detail::RelayoutOp op{ScaleLayout(recipe, rep_rows, k, from), ScaleLayout(recipe, rep_rows, k, to)};
  launch_by_recipe<Kind::kRelayout>(op, src, dst, row_offsets, groups, rows_hint, stream);
}

void check_content_async(const ScaleLayout& layout, const void* scales, ContentReport* report, cudaStream_t stream) {
  launch_content(layout, scales, layout.size(), report, stream);
}

Diagnostics validate_device(const TensorRef& t, const ScaleLayout& l, std::string_view argument,
                            ContentReport* workspace, cudaStream_t stream, const ValidateOptions& options) {
  ValidateOptions structural = options;
  structural.check_content = false;
  Diagnostics out = validate_scale(t, l, argument, structural);
  if (!options.check_content || !out.empty() || t.space != MemorySpace::kDevice || t.data == nullptr) return out;
  int64_t limit = l.size();
  if (t.rank > 0) {
    int64_t hi = 0;
    for (int i = 0; i < t.rank; ++i) hi += (t.shape[i] - 1) * t.strides[i];
    limit = std::min<int64_t>(limit, hi + 1);
  }
  launch_content(l, t.data, limit, workspace, stream);
  ContentReport rep = ContentReport::empty();
  cuda_check(cudaMemcpyAsync(&rep, workspace, sizeof(rep), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync(report)");
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return content_diagnostics(l, rep, argument);
}

}  // namespace scalemm::layouts::gpu
