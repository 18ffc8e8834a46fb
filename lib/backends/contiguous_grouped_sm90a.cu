// The contiguous grouped kernel (contiguous_grouped.hpp): its host launch, blocker and description.
// The kernel is split as DeepGEMM splits its own, one way down:
//   contiguous_grouped_config.cuh   tile configurations, shared-memory layout, kernel parameters
//   contiguous_grouped_kernel.cuh   the device code (its structure, and why, at its head)
//   contiguous_grouped_tma.cuh      TMA descriptors and their cache (host)
//   this file                       launch (grid, clusters, parameters), blocker(), run(), describe()
// docs/history/performance-notes.md has what each choice measured, and what did not pay.
#include "backends/contiguous_grouped.hpp"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <mutex>
#include <sstream>

#include "backends/contiguous_grouped_config.cuh"
#include "backends/contiguous_grouped_kernel.cuh"
#include "backends/contiguous_grouped_tma.cuh"
#include "scalemm/detail/cuda_check.hpp"
#include "scalemm/detail/device_state.hpp"
#include "scalemm/layouts/scale_layout.hpp"
#include "scalemm/status.hpp"
#include "support/tool_marks.hpp"

namespace scalemm::backends::contiguous_grouped {
using namespace impl;
namespace {

using detail::cuda_check;

// Sets the kernel's shared memory limit and returns how many of its clusters fit on device `d` at once.
int resident_clusters(const void* kernel, cudaLaunchConfig_t config, int d) {
  cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(config.dynamicSmemBytes)),
             "contiguous_grouped: shared memory attribute");
  const int cluster = int(config.attrs[0].val.clusterDim.x);
  config.gridDim = dim3(unsigned(detail::sm_count(d) / cluster * cluster));
  int n = 0;
  cuda_check(cudaOccupancyMaxActiveClusters(&n, kernel, &config), "contiguous_grouped: resident clusters");
  return std::max(n, 1);
}

struct ResidentClusters {  // (a lambda here trips nvcc 13.0's front end)
  const void* kernel;
  cudaLaunchConfig_t config;
  int operator()(int d) const { return resident_clusters(kernel, config, d); }
};

// Whether tiles are staged in shared memory and stored from there: TMA and the 16-byte copy-out need D
// 16-byte aligned (its rows are: N % 8 == 0). Whole tiles then go through TMA, if there is one.
bool stages_tiles(const GroupedGemmArgs& a) { return reinterpret_cast<uintptr_t>(a.d) % 16 == 0; }
bool stores_through_tma(const GroupedGemmArgs& a) { return stages_tiles(a) && a.m >= kBlockM; }
// Params::a_rows: a multiple of 16, so that each CTA of a pair loads whole 8-row swizzle atoms of A.
int a_rows(const GroupedGemmArgs& a) {
  return a.groups == 1 && a.m < kBlockM ? int(layouts::round_up(std::max<int64_t>(a.m, 1), 16)) : kBlockM;
}

template <int kCap, class C>
void launch(const GroupedGemmArgs& a, Stream stream) {
  constexpr int kBlockN = C::kBlockN, kCluster = C::kCluster;
  // One cache per configuration (its boxes are fixed); never destroyed: calls may come from static destructors.
  static MapCache* cache = new MapCache;
  ParamsWith<kCap> p;
  p.a_rows = a_rows(a);
  p.staged = stages_tiles(a);
  p.tma_store = stores_through_tma(a);
  const MapCache::Key key{a.a.data, a.b.data, p.tma_store ? a.d : nullptr, a.m, a.n, a.k, a.groups};
  {
    std::lock_guard<std::mutex> lock(cache->mu);
    auto it = cache->maps.find(key);
    if (it == cache->maps.end()) {
      if (cache->maps.size() >= 256) cache->maps.clear();
      MapCache::Maps maps{tensor_map(a.a.data, a.m, a.k, C::kShareB ? p.a_rows : p.a_rows / kCluster),
                          tensor_map(a.b.data, a.groups * a.n, a.k, C::kShareB ? kBlockN / 2 : kBlockN), {}};
      if (p.tma_store) maps.d = tensor_map(a.d, a.m, a.n, kBlockM, /*bf16=*/true, C::kBoxCols * 2);
      it = cache->maps.emplace(key, maps).first;
    }
    p.a = it->second.a;
    p.b = it->second.b;
    p.dmap = it->second.d;
  }
  p.sa = static_cast<const float*>(a.a.scale);
  p.sb = static_cast<const float*>(a.b.scale);
  p.d = static_cast<__nv_bfloat16*>(a.d);
  const layouts::ScaleLayout la(a.a.recipe, a.m, a.k, a.a.scale_format), lb(a.b.recipe, a.n, a.k, a.b.scale_format);
  p.sa_row = la.offset(1, 0) - la.offset(0, 0), p.sa_kb = la.offset(0, 1) - la.offset(0, 0);
  p.sb_row = lb.offset(128, 0) - lb.offset(0, 0);
  p.sb_group = grouped_b_scale_stride(a) / int64_t(sizeof(float));
  p.m = int(a.m), p.n = int(a.n), p.kb = int(layouts::ceil_div(a.k, kBlockK)), p.groups = int(a.groups);
  p.n_tiles = int(layouts::ceil_div(a.n, kBlockN));
  p.alpha = a.alpha;
  p.device_sizes = a.group_sizes_device;
  p.sizes_int64 = a.group_sizes_int64;
  p.device_status = a.device_status;
  if (!a.group_sizes_device)
    for (int64_t g = 0; g < a.groups; ++g) p.host_sizes[g] = int32_t(a.group_sizes[g]);

  const int device = detail::current_device();
  constexpr int smem = int(sizeof(SharedStorage<C>)) + 1024;
  void (*kernel)(const ParamsWith<kCap>) = contiguous_grouped_kernel<kCap, C>;
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = kCluster, cluster.val.clusterDim.y = 1, cluster.val.clusterDim.z = 1;
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  // The clusters that fit on the device at once (a cluster's CTAs share a GPC, so fewer than
  // SMs / cluster on some parts): a persistent grid larger than that would run a second wave.
  static detail::PerDevice<int> resident;
  const int clusters = resident.get(device, ResidentClusters{reinterpret_cast<const void*>(kernel), config});
  // At most one partial M tile per group beyond floor(m / 128); an empty call still launches (it
  // validates device sizes and reports them).
  const int64_t m_tiles = a.m / kBlockM + a.groups;
  const int64_t units = C::kShareB ? (m_tiles + 1) / 2 * p.n_tiles : m_tiles * ((p.n_tiles + kCluster - 1) / kCluster);
  config.gridDim = dim3(unsigned(kCluster * std::max<int64_t>(1, std::min<int64_t>(clusters, units))));
  cuda_check(cudaLaunchKernelEx(&config, kernel, p), "contiguous_grouped: kernel launch");
  // Whole tiles are stored through TMA, which initcheck does not see (tool_marks.hpp); every row of D is written.
  mark_initialized(a.d, static_cast<size_t>(a.m * a.n * 2), stream);
}

}  // namespace

bool built() { return true; }

static std::string scale_formats(const GroupedGemmArgs& a) {
  return a.a.scale_format == a.b.scale_format
             ? std::string(to_string(a.a.scale_format))
             : "A " + std::string(to_string(a.a.scale_format)) + ", B " + std::string(to_string(a.b.scale_format));
}

std::string blocker(const GroupedGemmArgs& a, const DeviceTarget& t) {
  if (a.space != MemorySpace::kDevice) return "host memory";
  if (t.sm != 90) return "the contiguous grouped kernel is built for sm_90a; this device is sm_" + std::to_string(t.sm);
  if (a.group_dim != GroupDim::kM) return "the contiguous grouped kernel runs m-grouped calls";
  if (a.a.recipe != Recipe::kBlock1x128 || a.b.recipe != Recipe::kBlock128x128)
    return "the contiguous grouped kernel runs block1x128 x block128x128";
  if (a.a.dtype != DType::kE4M3 || a.b.dtype != DType::kE4M3) return "the contiguous grouped kernel is built for e4m3 x e4m3";
  if (a.d_dtype != DType::kBF16) return "the contiguous grouped kernel is built for bf16 output";
  // Every scale is read at a row term plus a K-block term (Params::sa, sb): true of both formats of
  // one buffer, and of B's per-expert buffers at a fixed stride; A's cuBLASLt-format buffers of several
  // groups are padded one by one (grouped_scale_offsets()), so A's row term is not one stride there.
  if (a.a.scale_format != ScaleFormat::kCompact && a.groups != 1)
    return "the contiguous grouped kernel reads A's scales of several groups in the compact format (its cuBLASLt "
           "format pads each group's buffer on its own); pass A's scales with scale_format compact";
  if (a.k % 16 != 0 || a.n % 8 != 0) return "the contiguous grouped kernel needs K % 16 == 0 and N % 8 == 0 (TMA row alignment)";
  if (a.groups > kMaxGroups) return "more than " + std::to_string(kMaxGroups) + " groups";
  if (a.m > INT32_MAX || a.k > INT32_MAX || a.groups * a.n > INT32_MAX) return "an extent beyond 2^31";
  return {};
}

template <class C>
void launch_for(const GroupedGemmArgs& a, Stream stream) {
  a.group_sizes_device || a.groups <= 64 ? launch<64, C>(a, stream) : launch<kMaxGroups, C>(a, stream);
}

void run(const GroupedGemmArgs& a, Stream stream, Tiles tiles) {
  switch (tiles) {
    case Tiles::k64: return launch_for<Config<64, 1>>(a, stream);
    case Tiles::k96: return launch_for<Config<96, 1>>(a, stream);
    case Tiles::k128SharedA: return launch_for<Config<128, 2>>(a, stream);
    case Tiles::k160SharedA: return launch_for<Config<160, 2>>(a, stream);
    case Tiles::k160SharedB: return launch_for<Config<160, 2, true>>(a, stream);
    case Tiles::k192: return launch_for<Config<192, 1>>(a, stream);
    case Tiles::k192SharedB: return launch_for<Config<192, 2, true>>(a, stream);
  }
  throw Error(StatusCode::kInternal, "contiguous_grouped: unknown tile configuration");
}

std::string describe(const GroupedGemmArgs& a, Tiles tiles) {
  const bool narrow = tiles == Tiles::k160SharedA || tiles == Tiles::k160SharedB;
  const std::string why = narrow ? std::string("; 160 columns fill the SMs' waves better here than ") +
                                       (wide_tiles(a) ? "192" : "128")
                                 : std::string();
  const char* rows = wide_tiles(a) ? "a long K with " : "";
  std::ostringstream os;
  os << "contiguous grouped kernel (sm_90a, ours), ";
  if (a.groups == 1) os << "the call as one group";
  else os << "one launch for all " << a.groups << " groups";
  os << ": FP8 blockwise 1x128 x 128x128, persistent, a TMA producer warp, a scale warp "
        "copying each stage's scales into shared memory and two WGMMA warpgroups, ";
  if (tiles == Tiles::k64)
    os << "128x64x128 tiles without clusters, promotion overlapped by two partial-sum fragments (128-wide tiles "
          "would fill at most half the SMs)";
  else if (tiles == Tiles::k96)
    os << "128x96x128 tiles without clusters, promotion overlapped by two partial-sum fragments (they fill one wave "
          "of the SMs fuller than 128-wide tiles; 64-wide ones would take two)";
  else if (tiles == Tiles::k128SharedA)
    os << "128x128x128 tiles in clusters of 2 (A multicast), promotion overlapped by two partial-sum fragments";
  else if (tiles == Tiles::k160SharedA)
    os << "128x160x128 tiles in clusters of 2 (A multicast), one partial-sum fragment (" << rows << "few rows per group"
       << why << ")";
  else if (tiles == Tiles::k160SharedB || tiles == Tiles::k192SharedB)
    os << "128x" << (narrow ? 160 : 192) << "x128 tiles in clusters of 2 M tiles (B multicast within a group), one "
       << "partial-sum fragment (" << rows << "many rows per group" << why << ")";
  else
    os << "128x192x128 tiles without clusters, one partial-sum fragment (a long K with few rows per group)";
  os << (stores_through_tma(a) ? ", tiles staged in shared memory and stored through TMA where whole"
                                 : stages_tiles(a) ? ", tiles staged in shared memory" : "")
     << (a_rows(a) < kBlockM ? "; A loaded as its M = " + std::to_string(a.m) + " rows (no zero fill past M)" : std::string())
     << (a.groups == 1 && a.m <= 64 ? "; the second warpgroup's rows lie past M: it skips its WGMMAs" : "")
     << "; one tensor map for A over all rows and one for B over all experts; group prefix scanned in each CTA from "
     << (a.group_sizes_device ? "device-side" : "host") << " sizes; " << scale_formats(a) << " scales read in place";
  return os.str();
}

}  // namespace scalemm::backends::contiguous_grouped
