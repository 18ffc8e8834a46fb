// Elementwise activations fused into the 1D-block quantizer (quantize_activation, quantize_swiglu and
// their gradients), and the kernel that applies one alone (apply_activation, apply_swiglu).
// Included by fast_quantizers.cu only (one translation unit: the kernels compile once).
#pragma once

#include "quantize_common.cuh"

namespace scalemm::quantize::kernels {

// ACT (FusedActivation): the value quantized at each element, from the source v and TileArgs::aux (a), aux2 (b):
//   kGelu          gelu_tanh(v)
//   kGeluGrad      v * gelu_tanh'(a)                       (v: the output gradient, a: GELU's input)
//   kSwiglu        silu(v) * a                             (v: gate, a: up)
//   kSwigluGate    silu'(a) * (v * b)                      (v: the output gradient, a: gate, b: up)
//   kSwigluUp      v * silu(a)                             (v: the output gradient, a: gate)
// Every intermediate a framework writes in the source's 16-bit type (silu(gate), the product's
// gradient) and the result are rounded to that type, so the bytes are those of quantizing what its
// elementwise kernels write. The arithmetic is spelled out with explicit roundings and fused
// multiply-adds where a compiler that contracts (PyTorch's kernels are built with -fmad=true) fuses
// them; this file itself is compiled with -fmad=false.
constexpr bool act_needs_aux(int act) { return act != kGelu; }
constexpr bool act_needs_aux2(int act) { return act == kSwigluGate; }

constexpr float kGeluBeta = float(0.79788456080286535588);  // sqrt(2 / pi)
constexpr float kGeluKappa = float(0.044715);

__device__ __forceinline__ float gelu_tanh(float x) {
  const float x_cube = __fmul_rn(__fmul_rn(x, x), x);
  const float inner = __fmul_rn(kGeluBeta, __fmaf_rn(kGeluKappa, x_cube, x));
  return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(inner)));
}

__device__ __forceinline__ float gelu_tanh_grad(float dy, float x) {
  const float x_sq = __fmul_rn(x, x);
  const float inner = __fmul_rn(kGeluBeta, __fmaf_rn(kGeluKappa, __fmul_rn(x_sq, x), x));
  const float t = tanhf(inner);
  const float left = __fmul_rn(0.5f, x);
  const float right = __fadd_rn(1.0f, t);
  const float tanh_derivative = __fmaf_rn(-t, t, 1.0f);
  const float inner_derivative = __fmul_rn(kGeluBeta, __fmaf_rn(3.0f * kGeluKappa, x_sq, 1.0f));
  const float right_derivative = __fmul_rn(__fmul_rn(left, tanh_derivative), inner_derivative);
  return __fmul_rn(dy, __fmaf_rn(0.5f, right, right_derivative));
}

__device__ __forceinline__ float silu(float x) { return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x))); }

__device__ __forceinline__ float silu_grad(float dy, float x) {
  const float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x)));
  return __fmul_rn(__fmul_rn(dy, s), __fmaf_rn(x, __fsub_rn(1.0f, s), 1.0f));
}

/// fp32 -> the 16-bit source type, to nearest even (the hardware conversion), NaN as the quiet NaN
/// with the input's sign that a framework's conversion writes.
template <int S>
__device__ __forceinline__ uint32_t round16(float v) {
  const uint32_t b = fmt::float_bits(v);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return ((b >> 16) & 0x8000u) | (S == 1 ? 0x7FC0u : 0x7E00u);
  if constexpr (S == 1) return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  else return __half_as_ushort(__float2half_rn(v));
}

/// One element through activation ACT, rounded to the source type (see FusedActivation).
template <int S, int ACT>
__device__ __forceinline__ uint32_t activate1(float v, float a, float b) {
  const auto r = [](float x) { return decode16<S>(round16<S>(x)); };  // a framework's 16-bit intermediate
  if constexpr (ACT == kGelu) return round16<S>(gelu_tanh(v));
  else if constexpr (ACT == kGeluGrad) return round16<S>(gelu_tanh_grad(v, a));
  else if constexpr (ACT == kSwiglu) return round16<S>(__fmul_rn(r(silu(v)), a));
  else if constexpr (ACT == kSwigluGate) return round16<S>(silu_grad(r(__fmul_rn(v, b)), a));
  else return round16<S>(__fmul_rn(v, r(silu(a))));
}

/// Four 16-bit source codes through the activation (aux, aux2: the further inputs' codes).
template <int S, int ACT>
__device__ __forceinline__ uint2 activate4(uint2 v, uint2 aux, uint2 aux2) {
  const uint32_t w[2] = {v.x, v.y}, x[2] = {aux.x, aux.y}, y[2] = {aux2.x, aux2.y};
  uint32_t o[2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
    o[i] = activate1<S, ACT>(half_value<S>(w[i], 0), half_value<S>(x[i], 0), half_value<S>(y[i], 0)) |
           (activate1<S, ACT>(half_value<S>(w[i], 1), half_value<S>(x[i], 1), half_value<S>(y[i], 1)) << 16);
  return make_uint2(o[0], o[1]);
}

/// The activation alone (apply_activation, apply_swiglu, apply_swiglu_grad): act(src[i]) rounded to the source type.
template <int S, int ACT>
__global__ void __launch_bounds__(256) activation_kernel(const uint16_t* src, const uint16_t* aux,
                                                         const uint16_t* aux2, int64_t n, uint16_t* out) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = uint16_t(activate1<S, ACT>(decode16<S>(src[i]), act_needs_aux(ACT) ? decode16<S>(aux[i]) : 0.0f,
                                        act_needs_aux2(ACT) ? decode16<S>(aux2[i]) : 0.0f));
}

}  // namespace scalemm::quantize::kernels
