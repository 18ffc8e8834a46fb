"""The quantizers with an activation fused in (what Float8MLP runs between its projections):

    torch.ops.scalemm.quantize_activation  quantize(gelu_tanh(x)), or of its input gradient, both directions
    torch.ops.scalemm.quantize_swiglu      quantize(silu(gate) * up), or of either input's gradient

On CUDA with a 1D-block recipe (block1x128, mxfp8) and bf16/f16 inputs each is one kernel that never
writes the activation in high precision; elsewhere torch's kernels, then the quantizer (the same bytes
wherever the fused arithmetic equals torch's elementwise kernels).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .. import _core
from .. import _scalemm as _C
from .._arrays import DTYPE_CODE
from ._runtime import _name, _on_device, _stream
from .quantizers import _quantize_outputs

_ACTIVATIONS = {"gelu_tanh": 1}  # scalemm::quantize::Activation
_SWIGLU_PARTS = {"forward": 0, "gate": 1, "up": 2}



def _activation_code(activation) -> int:
    if activation not in _ACTIVATIONS:
        raise _core.invalid("activation", "an activation the quantizers fuse", " or ".join(f'"{a}"' for a in _ACTIVATIONS),
                            repr(activation))
    return _ACTIVATIONS[activation]


def _activation_torch(x, x_input, activation):
    """The unfused path: the activation (x_input None) or its input gradient x * act'(x_input) through torch."""
    if x_input is None:
        return torch.nn.functional.gelu(x, approximate="tanh")
    return torch.ops.aten.gelu_backward(x, x_input, approximate="tanh")


def _quantize_activation_cuda(x, x_input, activation, recipe, dtype, scale_format):
    if x.dim() != 2 or not x.is_contiguous():
        raise _core.invalid("x", "the activation's (rows, features) source", "a contiguous 2-D tensor",
                            f"{tuple(x.shape)} with strides {x.stride()}")
    if x_input is not None and (x_input.shape != x.shape or x_input.dtype != x.dtype or x_input.device != x.device
                                or not x_input.is_contiguous()):
        raise _core.invalid("x_input", "the activation's input, laid out as its output gradient x",
                            f"a contiguous {x.dtype} tensor of shape {tuple(x.shape)} on {x.device}",
                            f"{x_input.dtype} {tuple(x_input.shape)} on {x_input.device}"
                            f"{'' if x_input.is_contiguous() else ' (not contiguous)'}")
    r, fmt, out = _quantize_outputs(x, recipe, dtype, scale_format)
    rows, k = x.shape
    with _on_device(x):
        _C.quantize_activation(x.data_ptr(), DTYPE_CODE[_name(x.dtype)], rows, k, r, DTYPE_CODE[dtype], fmt,
                               _activation_code(activation), 0 if x_input is None else x_input.data_ptr(),
                               *(t.data_ptr() for t in out), _stream(x.device.index))
    return out


@torch.library.custom_op("scalemm::quantize_activation", mutates_args=())
def _quantize_activation_op(x: torch.Tensor, x_input: Optional[torch.Tensor], activation: str, recipe: str,
                            dtype: str, scale_format: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                     torch.Tensor]:
    """quantize(act(x)), or with x_input (the activation's input) quantize(x * act'(x_input)), in both
    directions: (data, scales, data_t, scales_t) as torch.ops.scalemm.quantize(..., columnwise=True).
    The activation's result is rounded to x's dtype first, so the bytes are those of quantizing what
    torch's activation writes, up to the activation's own arithmetic (tests/test_mlp.py compares
    it with torch's on every bf16 input). On CUDA with a 1D-block recipe (block1x128, mxfp8) and a
    bf16/f16 x it is one kernel that never writes the activation in high precision; elsewhere the
    activation runs through torch, then the quantizer."""
    _activation_code(activation)
    if x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and recipe in ("block1x128", "mxfp8"):
        return _quantize_activation_cuda(x.contiguous(), None if x_input is None else x_input.contiguous(),
                                         activation, recipe, dtype, scale_format)
    return torch.ops.scalemm.quantize(_activation_torch(x, x_input, activation).contiguous(), recipe, dtype,
                                      scale_format, True)


@_quantize_activation_op.register_fake
def _(x, x_input, activation, recipe, dtype, scale_format):
    return _quantize_outputs(x, recipe, dtype, scale_format)[2]


def quantize_activation(x: torch.Tensor, recipe: str, *, activation: str = "gelu_tanh", x_input=None,
                        dtype: str = "e4m3", scale_format: str = "compact"):
    """(data, scales, data_t, scales_t) of act(x), or of x * act'(x_input) when x_input is given (the
    activation's backward: x its output gradient, x_input its input), quantized along K and, transposed,
    along the rows, without writing the activation's result (see torch.ops.scalemm.quantize_activation)."""
    return torch.ops.scalemm.quantize_activation(x, x_input, activation, recipe, dtype, scale_format)


def _swiglu_torch(x, a, b, part):
    """The unfused path of quantize_swiglu, as torch's eager kernels round it."""
    F = torch.nn.functional
    if part == "forward":
        return F.silu(x) * a  # x: gate, a: up
    if part == "gate":
        return torch.ops.aten.silu_backward(x * b, a)  # x: the product's gradient, a: gate, b: up
    return x * F.silu(a)


def _quantize_swiglu_cuda(x, a, b, part, recipe, dtype, scale_format):
    for name, t in (("a", a), ("b", b)):
        if t is not None and (t.shape != x.shape or t.dtype != x.dtype or t.device != x.device or not t.is_contiguous()):
            raise _core.invalid(name, "a SwiGLU input laid out as the source", f"a contiguous {x.dtype} tensor of shape "
                                f"{tuple(x.shape)} on {x.device}", f"{t.dtype} {tuple(t.shape)} on {t.device}")
    if x.dim() != 2 or not x.is_contiguous():
        raise _core.invalid("x", "the (rows, features) source", "a contiguous 2-D tensor", str(tuple(x.shape)))
    r, fmt, out = _quantize_outputs(x, recipe, dtype, scale_format)
    rows, k = x.shape
    with _on_device(x):
        _C.quantize_swiglu(_SWIGLU_PARTS[part], x.data_ptr(), DTYPE_CODE[_name(x.dtype)], rows, k, r, DTYPE_CODE[dtype],
                           fmt, a.data_ptr(), 0 if b is None else b.data_ptr(), *(t.data_ptr() for t in out),
                           _stream(x.device.index))
    return out


@torch.library.custom_op("scalemm::quantize_swiglu", mutates_args=())
def _quantize_swiglu_op(x: torch.Tensor, a: torch.Tensor, b: Optional[torch.Tensor], part: str, recipe: str,
                        dtype: str, scale_format: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """SwiGLU in the quantizer, both directions (data, scales, data_t, scales_t):
    part "forward": quantize(silu(x) * a), x the gate and a the up projection's output;
    part "gate":    quantize(silu'(a) * (x * b)), x the product's gradient, a gate, b up;
    part "up":      quantize(x * silu(a)).
    Intermediates rounded to x's dtype as torch's eager kernels write them. On CUDA with a 1D-block
    recipe and bf16/f16 inputs one kernel; elsewhere torch's kernels, then the quantizer."""
    if part not in _SWIGLU_PARTS:
        raise _core.invalid("part", "which SwiGLU quantity to quantize", '"forward", "gate" or "up"', repr(part))
    if part == "gate" and b is None:
        raise _core.invalid("b", "the up projection's output, for the gate's gradient", "a tensor", "None")
    if x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and recipe in ("block1x128", "mxfp8"):
        return _quantize_swiglu_cuda(x.contiguous(), a.contiguous(), None if b is None else b.contiguous(), part,
                                     recipe, dtype, scale_format)
    return torch.ops.scalemm.quantize(_swiglu_torch(x, a, b, part).contiguous(), recipe, dtype, scale_format, True)


@_quantize_swiglu_op.register_fake
def _(x, a, b, part, recipe, dtype, scale_format):
    return _quantize_outputs(x, recipe, dtype, scale_format)[2]


def quantize_swiglu(x: torch.Tensor, a: torch.Tensor, recipe: str, *, part: str = "forward", b=None,
                    dtype: str = "e4m3", scale_format: str = "compact"):
    """(data, scales, data_t, scales_t) of SwiGLU's product (part "forward": x gate, a up) or of one
    input's gradient (part "gate" / "up": x the product's gradient, a gate, b up), without writing it in
    high precision (see torch.ops.scalemm.quantize_swiglu)."""
    return torch.ops.scalemm.quantize_swiglu(x, a, b, part, recipe, dtype, scale_format)

