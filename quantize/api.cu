// scalemm::quantize (include/scalemm/quantize.hpp): the fast kernels of fast_quantizers.cu, on the
// stream's device; requests the fast path does not cover (empty shapes) run the shared functors
// (numerics/detail) on the device, which give the same bytes.
#include <cuda_runtime.h>

#include <algorithm>

#include "detail/device_exec.cuh"
#include "detail/driver.hpp"
#include "fast_quantizers.hpp"
#include "scalemm/detail/device_state.hpp"
#include "scalemm/quantize.hpp"

namespace scalemm::quantize {

using numerics::columnwise_layout;
using numerics::rowwise_layout;
using numerics::detail::DeviceExec;
using numerics::detail::round256;
using numerics::detail::Workspace;

size_t workspace_bytes(const SourceMatrix& src, const QuantizeConfig& cfg) {
  const int64_t generic = numerics::detail::plan_quantize(src, cfg).scratch_floats();
  const int64_t fast = kernels::plan_fast(src, cfg).floats();
  return round256(size_t(std::max(generic, fast)) * sizeof(float));
}

void quantize(const SourceMatrix& src, const QuantizeConfig& cfg, const QuantizeOutputs& out, void* workspace,
              size_t bytes, cudaStream_t stream) {
  numerics::validate(src, cfg, out);
  const scalemm::detail::DeviceScope scope(scalemm::detail::stream_device(stream));  // the stream's device
  DeviceExec ex{stream};
  if (src.rows > 0 && src.cols > 0) {
    // Scale buffers: padding must read as zero, so a cublaslt buffer with padding is cleared first
    // (the kernels write every real scale; without padding the clear would be a wasted pass and launch).
    const auto lr = rowwise_layout(cfg, src.rows, src.cols), lc = columnwise_layout(cfg, src.rows, src.cols);
    if (cfg.rowwise && lr.has_padding()) ex.zero(out.scales, size_t(lr.bytes()));
    if (cfg.columnwise && lc.has_padding()) ex.zero(out.scales_t, size_t(lc.bytes()));
    // The fast kernels use scratch only for the amax passes (tensorwise, rowwise, NVFP4's global):
    // block recipes allocate nothing per call (a stream-ordered allocation can stall when the pool
    // has been trimmed at a synchronisation).
    const bool amax = cfg.recipe == Recipe::kTensorwise || cfg.recipe == Recipe::kRowwise || cfg.recipe == Recipe::kNvfp4;
    Workspace ws(workspace, bytes, amax ? round256(size_t(kernels::plan_fast(src, cfg).floats()) * sizeof(float)) : 0,
                 stream);
    if (kernels::quantize(src, cfg, out, static_cast<float*>(ws.get()), stream)) return;
  }
  Workspace ws(workspace, bytes, workspace_bytes(src, cfg), stream);
  numerics::detail::run_quantize(ex, src, cfg, out, static_cast<float*>(ws.get()));
}

void dequantize(const QuantizedTensor& t, void* out, DType out_dtype, cudaStream_t stream) {
  const scalemm::detail::DeviceScope scope(scalemm::detail::stream_device(stream));
  kernels::dequantize(t, out, out_dtype, stream);
}

void transpose(const void* src, int64_t batch, int64_t rows, int64_t cols, void* dst, cudaStream_t stream) {
  const scalemm::detail::DeviceScope scope(scalemm::detail::stream_device(stream));
  kernels::transpose_bytes(src, batch, rows, cols, dst, stream);
}

}  // namespace scalemm::quantize
