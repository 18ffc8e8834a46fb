#include "cublaslt/cublaslt_grouped.hpp"

#include <cublasLt.h>
#include <dlfcn.h>

#include "base/capabilities.hpp"

namespace scalemm::backends {

using base::cublaslt_version;
using base::cublaslt_version_string;

size_t lt_grouped_min_version() { return cublaslt_version(13, 2); }

std::string LtGroupedApi::summary() const {
  std::string s = present ? "present" : "absent";
  s += " (cuBLASLt " + cublaslt_version_string(version);
  if (!present)
    s += version >= lt_grouped_min_version() ? "; no cublasLtGroupedMatrixLayoutCreate exported"
                                             : "; the API arrived in " + cublaslt_version_string(lt_grouped_min_version());
  s += ")";
  if (present) {
    const std::string where = sm > 0 ? "sm_" + std::to_string(sm) : "no device";
    if (supports.empty()) {
      s += ": no scaled FP8/FP4 recipe on " + where;
    } else {
      s += ": ";
      for (size_t i = 0; i < supports.size(); ++i) s += (i ? ", " : "") + supports[i];
      s += " on " + where;
    }
  }
  return s + "; not used: grouped GEMMs run on the CUTLASS grouped kernel or the per-group backend";
}

LtGroupedApi lt_grouped_api(bool present, size_t version, int sm) {
  LtGroupedApi g;
  g.present = present;
  g.version = version;
  g.sm = sm;
  if (!present) {
    g.note = version >= lt_grouped_min_version()
                 ? "the library does not export cublasLtGroupedMatrixLayoutCreate"
                 : "cuBLASLt " + cublaslt_version_string(version) + " has no grouped matmul API (cuBLAS 13.2 added it)";
    return g;
  }
  const int major = sm / 10;
  if (sm == 90) {
    if (version >= cublaslt_version(13, 4)) g.supports.push_back("blockwise");
    if (version >= cublaslt_version(13, 5)) g.supports.push_back("tensorwise");
    g.note = "sm_90: FP8 block scaling (VEC128_32F, BLK128x128_32F) from cuBLAS 13.4, tensorwise from 13.5 "
             "(TransformerEngine cublaslt_grouped_gemm.cu gates, PR #2971, #3181)";
  } else if (major == 10 || major == 11) {
    if (version >= cublaslt_version(13, 3)) {
      g.supports.push_back("tensorwise");
      g.supports.push_back("mxfp8");
    }
    if (version >= cublaslt_version(13, 4)) g.supports.push_back("nvfp4");
    g.note = "sm_" + std::to_string(sm) + ": tensorwise and MXFP8 from cuBLAS 13.3, NVFP4 from 13.4; FP8 block "
             "scaling is Hopper-only (TransformerEngine gates, PR #2748, #2971)";
  } else {
    g.note = sm > 0 ? "sm_" + std::to_string(sm) + " is not among the grouped API's architectures (9.0, 10.x, 11.0 "
                                                   "in the cuBLAS docs)"
                    : "no device";
  }
  g.hazards.push_back("experimental API: argument validation is very limited, invalid arguments are undefined "
                      "behaviour (cuBLAS docs, cublasLtMatmul)");
  if (version < cublaslt_version(13, 3))
    g.hazards.push_back("cuBLAS 13.2: wrong wgrad (k-grouped) result when a group is empty");
  if (version <= cublaslt_version(13, 7, 99))
    g.hazards.push_back("stale workspace state across two grouped GEMMs in one replayed CUDA graph: a deadlock on "
                        "the 2nd replay (13.6), the last expert's wgrad corrupted before 13.6; needs one persistent "
                        "workspace per grouped GEMM (cuBLAS <= 13.7; TransformerEngine PR #3171)");
  if (sm == 90)
    g.hazards.push_back("sm_90: one alpha and beta for all groups (ALPHA/BETA_BATCH_STRIDE must be 0)");
  return g;
}

LtGroupedApi probe_lt_grouped_api(int sm) {
  const size_t version = cublasLtGetVersion();
  bool present = false;
  // The library that holds cublasLtGetVersion is the one this process loaded (the Python module loads it
  // RTLD_LOCAL, so RTLD_DEFAULT may not see it): reopen it by name without loading anything new.
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cublasLtGetVersion), &info) != 0 && info.dli_fname) {
    if (void* h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD)) {
      present = dlsym(h, "cublasLtGroupedMatrixLayoutCreate") != nullptr;
      dlclose(h);
    }
  }
  if (!present) present = dlsym(RTLD_DEFAULT, "cublasLtGroupedMatrixLayoutCreate") != nullptr;
  return lt_grouped_api(present, version, sm);
}

}  // namespace scalemm::backends
