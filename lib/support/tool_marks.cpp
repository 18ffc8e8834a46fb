#include "support/tool_marks.hpp"

#include <cuda_runtime_api.h>
#include <nvtx3/nvToolsExtMemCudaRt.h>

namespace scalemm::backends {

void mark_initialized(const void* ptr, size_t bytes, Stream stream) {
  if (!ptr || bytes == 0) return;
  static const nvtxDomainHandle_t domain = nvtxDomainCreateA("scalemm");
  nvtxMemVirtualRangeDesc_t range{};
  range.ptr = ptr;
  range.size = bytes;
  nvtxMemMarkInitializedBatch_t batch{};
  batch.extCompatID = NVTX_EXT_COMPATID_MEM;
  batch.structSize = sizeof(batch);
  batch.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  batch.regionDescCount = 1;
  batch.regionDescElementSize = sizeof(range);
  batch.regionDescElements = &range;
  nvtxMemCudaMarkInitialized(domain, reinterpret_cast<cudaStream_t>(stream), 0, &batch);
}

}  // namespace scalemm::backends
