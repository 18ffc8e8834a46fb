// The library's quantizers as an API of their own: FP8 / FP4 data and the scale tensors of every
// recipe, written on the GPU by the fast kernels of quantize/ (byte for byte what the reference
// emulator, scalemm/emulation/emulation.hpp, computes: tests/emulation checks every recipe, mode,
// format and direction). The emulator is the oracle; these are what the library and its layers run.
//
// Requests and outputs are described with the types of the quantization contract
// (scalemm/numerics/quantized.hpp: SourceMatrix, QuantizeConfig, QuantizeOutputs, QuantizedTensor),
// which the emulator takes too, so that a host reference call and a device call take the same
// arguments. Every function runs on its stream's device, enqueues work without synchronising, and
// names what is wrong with a request (scalemm::Error) before anything is enqueued.
#pragma once

#include <cstddef>
#include <cstdint>

#include "scalemm/numerics/quantized.hpp"

namespace scalemm::quantize {

using numerics::QuantizeConfig;
using numerics::QuantizedTensor;
using numerics::QuantizeOutputs;
using numerics::SourceMatrix;

/// Device scratch bytes quantize() needs for this request (amax partials; 0 for block recipes).
size_t workspace_bytes(const SourceMatrix& src, const QuantizeConfig& cfg);

/// Quantizes a device (R, C) source into `out` (rowwise and/or columnwise, cfg) on `stream`.
/// `workspace` (workspace_bytes(), or null: a stream-ordered allocation of the call's own).
void quantize(const SourceMatrix& src, const QuantizeConfig& cfg, const QuantizeOutputs& out, void* workspace,
              size_t workspace_bytes, Stream stream);

/// The values a device operand stands for, as a row-major (rows, k) matrix of out_dtype (f32, bf16, f16).
void dequantize(const QuantizedTensor& t, void* out, DType out_dtype, Stream stream);

/// The FP8 data of an exact-transpose recipe (block128x128, mxfp8-32x32) for the other GEMM: each of
/// `batch` packed row-major (rows, cols) matrices of 1-byte elements written as its (cols, rows)
/// transpose (the scales: layouts::gpu::transpose). Bytes are moved, never decoded.
void transpose(const void* src, int64_t batch, int64_t rows, int64_t cols, void* dst, Stream stream);

}  // namespace scalemm::quantize
