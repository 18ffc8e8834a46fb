// What the emulator's translation units share beyond its public header (defined in common.cpp).
#pragma once

#include "scalemm/emulation/emulation.hpp"

namespace scalemm::emulation {

/// Throws Error(kInvalidArgument) for malformed GEMM arguments.
void check_gemm_args(const QuantizedTensor& a, const QuantizedTensor& b, const void* d, const GemmOptions& opt);

}  // namespace scalemm::emulation
