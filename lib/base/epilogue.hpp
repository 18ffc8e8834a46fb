// Device passes around a backend's GEMM: the staged FP8 output of every backend but cuBLASLt's own
// FP8 epilogue, and the f32 bias of the reference backend.
#pragma once

#include <cstdint>

#include "scalemm/gemm.hpp"

namespace scalemm::base {

/// dst[i] = float(src[i]) for a bf16 vector.
void bf16_to_f32(const uint16_t* src, float* dst, int64_t n, Stream stream);

/// FP8 output of a staged GEMM: d[i] = fp8(*d_scale * src[i]) (round to nearest even, saturating to
/// the largest finite value, NaN to NaN), and *d_amax = max |src[i]| when d_amax is set.
void finish_fp8_output(const float* src, void* d, DType d_dtype, int64_t count, const float* d_scale, float* d_amax,
                       Stream stream);

}  // namespace scalemm::base
