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
/// A source and outputs in pageable host memory are quantized on the calling thread before the call
/// returns (the same bytes; stream and workspace are not used): layers and tools that hold host
/// operands call the same function. Host and device pointers in one call are an error.
void quantize(const SourceMatrix& src, const QuantizeConfig& cfg, const QuantizeOutputs& out, void* workspace,
              size_t workspace_bytes, Stream stream);

/// Tokens of an MoE layer: a source of T rows whose G groups (experts) are consecutive row ranges
/// of `sizes[g]` rows, the sizes in device memory (read when the kernel runs: no synchronisation,
/// capturable in a CUDA graph).
struct TokenGroups {
  const int64_t* sizes = nullptr;  ///< G device int64 counts (negative counts are taken as 0)
  int64_t groups = 0;              ///< G >= 1
  int64_t padded_rows = 0;         ///< R: a multiple of 128, at least padded_token_rows(T, G)
  /// Optional dispatch gather (device int64, T entries): grouped row r is row gather[r] of the source,
  /// which then has `source_rows` rows (src.rows is T, the grouped rows); an index outside
  /// [0, source_rows) (-1: an expert-parallel sentinel) reads as a zero row. The outputs are those of
  /// the gathered (T, C) matrix, which is never written.
  const int64_t* gather = nullptr;
  int64_t source_rows = 0;
  /// Optional, with gather: row r is multiplied by row_weight[r] (device fp32) and rounded to the
  /// source type before it is quantized (MoE combine's backward: the routing-weighted output gradient).
  const float* row_weight = nullptr;
};

/// The row count that holds T tokens in G groups with every group padded to a 128-row boundary,
/// for any sizes that sum to T: ceil((T + 127 G) / 128) * 128.
int64_t padded_token_rows(int64_t tokens, int64_t groups);

/// Quantizes an expert layer's tokens (a device (T, C) bf16/f16 source, sorted by group) for its three
/// grouped GEMMs in one read, without gathering them into an aligned copy first:
///   rowwise (cfg.rowwise): (T, C) data with scales rowwise_layout(cfg, T, C), the m-grouped A of the
///     forward and dgrad (any group sizes);
///   columnwise (required): (C, R) data with scales columnwise_layout(cfg, R, C), group g's rows as
///     columns P_g .. P_g + M_g - 1 where P_g = sum over h < g of ceil(M_h / 128) * 128, zero columns
///     up to the next boundary and after the last group: the k-grouped operand of wgrad, whose blocks
///     along the tokens never straddle two groups (run it with those padded sizes, the last one
///     extended to R).
/// The bytes equal quantize() of the source rowwise and quantize() of the (R, C) matrix holding the
/// groups' rows at P_g (zero rows elsewhere) columnwise. 1D-block FP8 recipes along the tokens:
/// block1x128 and mxfp8 (the 128-row boundaries are block boundaries of both). Sizes that sum to
/// more than T, or padded sizes past R, lose the rows beyond; nothing outside the outputs is written.
void quantize_grouped(const SourceMatrix& src, const QuantizeConfig& cfg, const TokenGroups& groups,
                      const QuantizeOutputs& out, Stream stream);

/// Elementwise activations a quantizer can apply to its source on the way in, so that the
/// activation's output (or its input gradient) is never written in high precision: the MLP pattern
/// up projection -> activation -> down projection with the activation fused into the quantizer of the
/// down projection's input (forward) and of the up projection's output gradient (backward).
enum class Activation : int {
  /// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))): GELU's tanh approximation (PyTorch's
  /// gelu(approximate="tanh")).
  kGeluTanh = 1,
};

/// quantize() of act(src): each element of a device (R, C) bf16/f16 source goes through the
/// activation in fp32 and is rounded to the source's type (to nearest even) before it is quantized,
/// so the bytes are those of quantize() applied to the activation's output as a framework writes it.
/// 1D-block FP8 recipes (block1x128, mxfp8); the columnwise output is required (the down projection's
/// wgrad operand), the rowwise one optional.
void quantize_activation(const SourceMatrix& src, Activation act, const QuantizeConfig& cfg,
                         const QuantizeOutputs& out, Stream stream);

/// quantize() of the activation's input gradient grad * act'(input): `grad` (src, the gradient of the
/// activation's output) and `input` (the activation's input, saved by the forward) are device (R, C)
/// matrices of the same 16-bit type; the product is rounded to that type before it is quantized (the
/// bytes of quantize() applied to what a framework's activation backward writes). Recipes and
/// outputs as quantize_activation().
void quantize_activation_grad(const SourceMatrix& grad, const void* input, Activation act,
                              const QuantizeConfig& cfg, const QuantizeOutputs& out, Stream stream);

/// SwiGLU, silu(gate) * up (silu(x) = x / (1 + e^-x)), the gated MLP of Llama-style models, with its
/// two projections' outputs as separate device (R, C) matrices of one 16-bit type. quantize() of the
/// product as a framework's two elementwise kernels write it: silu(gate) rounded to that type, then the
/// product rounded again. `gate` is the source; recipes and outputs as quantize_activation().
void quantize_swiglu(const SourceMatrix& gate, const void* up, const QuantizeConfig& cfg, const QuantizeOutputs& out,
                     Stream stream);

/// Which input of SwiGLU a gradient is for.
enum class SwigluInput : int {
  kGate = 0,  ///< silu'(gate) * (grad * up), grad * up rounded first (the product's gradient)
  kUp = 1,    ///< grad * silu(gate), silu(gate) rounded first (as the forward saved it)
};

/// quantize() of SwiGLU's input gradient for `which` input: `grad` (the source) is the gradient of
/// the product, `gate` and `up` the forward's inputs (`up` is read for kGate only), all (R, C) of one
/// 16-bit type; intermediates and the result rounded as a framework's backward kernels write them.
void quantize_swiglu_grad(const SourceMatrix& grad, const void* gate, const void* up, SwigluInput which,
                          const QuantizeConfig& cfg, const QuantizeOutputs& out, Stream stream);

/// SwiGLU of an MoE layer's experts in the grouped-token layout (quantize_grouped's outputs, no gather):
/// `gate_up` is the gate_up projection's (M, 2I) output, the halves [gate | up] (I a multiple of 128),
/// and the outputs are those of quantize_grouped() of silu(gate) * up (M, I), rounded as
/// quantize_swiglu() rounds it; the product is never written.
void quantize_grouped_swiglu(const SourceMatrix& gate_up, const QuantizeConfig& cfg, const TokenGroups& groups,
                             const QuantizeOutputs& out, Stream stream);

/// Its backward: `grad` (M, I) the product's gradient, `gate_up` the forward's (M, 2I) input; the
/// outputs (M, 2I) are those of quantize_grouped() of [d gate | d up], each half rounded as
/// quantize_swiglu_grad() rounds it (the operand of the gate_up projection's dgrad and wgrad).
void quantize_grouped_swiglu_grad(const SourceMatrix& grad, const void* gate_up, const QuantizeConfig& cfg,
                                  const TokenGroups& groups, const QuantizeOutputs& out, Stream stream);

/// The activations alone, with the fused quantizers' arithmetic and roundings, written to `out` (the
/// source's shape and 16-bit type): quantize() of them gives the fused calls' bytes.
///   apply_activation: act(src), or src * act'(input) where `input` is not null;
///   apply_swiglu: silu(gate) * up; apply_swiglu_grad: the gradient for `which` input.
void apply_activation(const SourceMatrix& src, const void* input, Activation act, void* out, Stream stream);
void apply_swiglu(const SourceMatrix& gate, const void* up, void* out, Stream stream);
void apply_swiglu_grad(const SourceMatrix& grad, const void* gate, const void* up, SwigluInput which, void* out,
                       Stream stream);

/// The values a device operand stands for, as a row-major (rows, k) matrix of out_dtype (f32, bf16, f16).
void dequantize(const QuantizedTensor& t, void* out, DType out_dtype, Stream stream);

/// The FP8 data of an exact-transpose recipe (block128x128, mxfp8-32x32) for the other GEMM: each of
/// `batch` packed row-major (rows, cols) matrices of 1-byte elements written as its (cols, rows)
/// transpose (the scales: layouts::gpu::transpose). Bytes are moved, never decoded.
void transpose(const void* src, int64_t batch, int64_t rows, int64_t cols, void* dst, Stream stream);

}  // namespace scalemm::quantize
