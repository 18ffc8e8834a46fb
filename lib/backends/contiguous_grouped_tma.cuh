// The contiguous grouped kernel's TMA descriptors: encoding one (a driver call, on the host) and the
// cache that lets a call repeating its buffers and extents reuse the last encoding.
// Included by contiguous_grouped_sm90a.cu only.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "cutlass/cuda_host_adapter.hpp"
#include "scalemm/status.hpp"

namespace scalemm::backends::contiguous_grouped::impl {

// A row-major (rows, cols) map with the rows of its box (128 bytes, or 64) swizzled: the operands
// (bytes, box 128 columns) and the staged output (bf16, box 64 or 32 columns).
inline CUtensorMap tensor_map(const void* base, int64_t rows, int64_t cols, int box_rows, bool bf16 = false, int box_bytes = 128) {
  CUtensorMap map;
  const int elem_bytes = bf16 ? 2 : 1;
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(cols * elem_bytes)};  // bytes between rows
  const cuuint32_t box[2] = {cuuint32_t(box_bytes / elem_bytes), cuuint32_t(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r = cutlass::call_cuTensorMapEncodeTiled(
      &map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims,
      strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, box_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
      bf16 ? CU_TENSOR_MAP_L2_PROMOTION_NONE : CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error(StatusCode::kInternal, "contiguous_grouped: cuTensorMapEncodeTiled failed (" + std::to_string(int(r)) + ")");
  return map;
}

// Tensor maps are encoded on the host (a driver call); a call that repeats its buffers and extents
// reuses the last encoding.
struct MapCache {
  struct Key {
    const void* a;
    const void* b;
    const void* d;  // null where D is not stored through TMA
    int64_t m, n, k, groups;
    bool operator<(const Key& o) const {
      return std::tie(a, b, d, m, n, k, groups) < std::tie(o.a, o.b, o.d, o.m, o.n, o.k, o.groups);
    }
  };
  struct Maps {
    CUtensorMap a, b, d;
  };
  std::mutex mu;
  std::map<Key, Maps> maps;
};

}  // namespace scalemm::backends::contiguous_grouped::impl
