// cuBLASLt's grouped matmul API (cublasLtGroupedMatrixLayoutCreate, CUBLASLT_BATCH_MODE_GROUPED): found
// at run time in the loaded libcublasLt and reported (`scalemm info`, docs/grouped.md), never called.
// Grouped GEMMs run on the CUTLASS grouped kernel or the per-group backend whatever this says.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace scalemm::backends {

/// What the grouped API of one cuBLASLt version would offer on one device.
struct LtGroupedApi {
  bool present = false;  ///< the library exports cublasLtGroupedMatrixLayoutCreate
  size_t version = 0;    ///< cublasLtGetVersion() form (130100 = 13.1.0)
  int sm = 0;            ///< the device asked about (major*10+minor; 0: none)
  /// Scaled-FP8/FP4 recipes it would run on that device: "blockwise" (block1x128/block128x128),
  /// "tensorwise", "mxfp8", "nvfp4"; empty: none.
  std::vector<std::string> supports;
  std::vector<std::string> hazards;  ///< known bugs and traps of this version, each with its source
  std::string note;                  ///< why `supports` is empty, or what the gates are
  /// One line: "absent (cuBLASLt 13.1.0; the API arrived in 13.2)" or "present (cuBLASLt 13.4.0): blockwise on
  /// sm_90", followed by "; not used: grouped GEMMs run on the CUTLASS grouped kernel or the per-group backend".
  std::string summary() const;
};

/// The first cuBLASLt version that exports the grouped API.
size_t lt_grouped_min_version();

/// Pure: what a library of `version` that does (`present`) or does not export the API offers on sm.
/// Version gates (TransformerEngine's run-time checks, cublaslt_grouped_gemm.cu, and the cuBLAS docs;
/// /docs/grouped.md): API from 13.2; Hopper (sm_90) FP8 block scaling from 13.4, tensorwise from 13.5;
/// sm_100/sm_103/sm_110 MXFP8 and tensorwise from 13.3, NVFP4 from 13.4; no FP8 block scaling off Hopper;
/// other architectures (sm_89, sm_12x) are not listed by the docs.
LtGroupedApi lt_grouped_api(bool present, size_t version, int sm);

/// The loaded libcublasLt, asked: its version (cublasLtGetVersion) and whether it exports
/// cublasLtGroupedMatrixLayoutCreate (dlsym on the library that holds cublasLtGetVersion). Needs no GPU.
LtGroupedApi probe_lt_grouped_api(int sm);

}  // namespace scalemm::backends
