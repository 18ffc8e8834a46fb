// GPU scale conversions and content checks (compiled into scalemm::scalemm from layouts/cuda/).
//
// Including this header needs no nvcc and no CUDA headers. Every function enqueues work on `stream`
// and returns without synchronizing (except validate_device, which says so), allocates nothing
// (callers provide outputs and workspaces) and is safe to call during CUDA graph capture. Results
// are byte-identical to the host functions of scalemm/layouts/convert.hpp. Pointers are device
// pointers. CUDA launch failures throw scalemm::Error(kCudaError); mismatched layouts throw
// Error(kInvalidArgument) before anything is enqueued.
#pragma once

#include <cstdint>
#include <string_view>

#include "scalemm/layouts/convert.hpp"
#include "scalemm/layouts/validate.hpp"

namespace scalemm::layouts::gpu {

/// GPU form of layouts::convert (same recipe, rows and k on both sides).
void convert(const ScaleLayout& from, const void* src, const ScaleLayout& to, void* dst, Stream stream);
void to_cublaslt(const ScaleLayout& compact, const void* src, void* dst, Stream stream);
void to_compact(const ScaleLayout& cublaslt, const void* src, void* dst, Stream stream);

/// GPU form of layouts::transpose (block128x128, mxfp8-32x32; to == transposed(from, to.format)).
void transpose(const ScaleLayout& from, const void* src, const ScaleLayout& to, void* dst, Stream stream);

/// GPU form of layouts::broadcast_block128_to_mxfp8. When `inexact_count` (device) is not null, the
/// number of source scales that are not a power of two is ADDED to it (zero it first). Inexact
/// scales are written as 0xFF, as on the host.
void broadcast_block128_to_mxfp8(const ScaleLayout& from, const float* src, const ScaleLayout& to, uint8_t* dst,
                                 unsigned long long* inexact_count, Stream stream);

/// GPU form of layouts::convert_grouped, in ONE launch. `row_offsets` (groups+1 entries) lives in
/// device memory, so the group sizes may come from a device-side router; element offsets of each
/// group's buffers are computed on the device from ScaleLayout::size(). `rows_hint` (e.g. the total
/// row count, or 0) only sizes the launch.
void convert_grouped(Recipe recipe, int64_t k, const int64_t* row_offsets, int groups, int64_t rows_hint,
                     ScaleFormat from, const void* src, ScaleFormat to, void* dst, Stream stream);

/// Content rules on a device buffer of layout.size() elements: resets *report (device memory) and
/// counts violations into it; report->any is the error flag. No synchronization, no device assert.
void check_content_async(const ScaleLayout& layout, const void* scales, ContentReport* report,
                         Stream stream);

/// validate_scale for a tensor in device memory, content included: runs the structural rules on the
/// host, then check_content_async with `workspace` (one device ContentReport), copies the report
/// back and SYNCHRONIZES `stream`.
Diagnostics validate_device(const TensorRef& scale, const ScaleLayout& layout, std::string_view argument,
                            ContentReport* workspace, Stream stream, const ValidateOptions& options = {});

/// One scale-buffer conversion: the same recipe, rows and K in another format.
struct ScaleConversion {
  ScaleLayout from, to;
  const void* src;
  void* dst;
  int64_t kb0 = 0;  ///< first K-block of `from` (a K slice, as layouts::slice_kblocks; 0 otherwise)
};

/// Destination elements up to which convert_small is the faster path: below it a GEMM's scale
/// conversions are launch-bound, and one launch for both operands halves what they cost.
constexpr int64_t kSmallConversionElements = int64_t(1) << 18;

/// One or two conversions in one launch (element by element through offset(); padding written as
/// zero). Byte-identical to convert(), or to slice_kblocks() for a conversion with kb0 > 0.
void convert_small(const ScaleConversion* conv, int count, Stream stream);

/// Any number of conversions in as few launches as their sizes allow: whole buffers of more than
/// kSmallConversionElements destination elements each through the bandwidth kernels (convert()),
/// the rest (K slices of any size included) together, up to 256 per launch. A dense GEMM's scale
/// conversions, or every group's of a grouped call. Byte-identical to convert() / slice_kblocks().
void convert_batch(const ScaleConversion* conv, int count, Stream stream);

/// tensorwise -> rowwise: dst[i] = *src for i < rows (the single fp32 scale broadcast to a vector).
void broadcast_tensorwise(const float* src, float* dst, int64_t rows, Stream stream);

}  // namespace scalemm::layouts::gpu
