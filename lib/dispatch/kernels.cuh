// Small device helpers of the dispatch layer (declared here, defined in kernels.cu).
#pragma once

#include <cstdint>

#include "scalemm/gemm.hpp"

namespace scalemm::dispatch {

/// dst[i] = *src for i < n (tensorwise scale broadcast to a rowwise vector).
void broadcast_scalar(const float* src, float* dst, int64_t n, Stream stream);

/// dst[i] = float(src[i]) for a bf16 vector (bias for the f32 reference path).
void bf16_to_f32(const uint16_t* src, float* dst, int64_t n, Stream stream);

/// Writes {value, 0.0f} to dst (device alpha/beta pair).
void write_alpha_beta(float* dst, float value, Stream stream);

}  // namespace scalemm::dispatch
