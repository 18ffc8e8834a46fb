"""What the layers' autograd functions share: their GEMM on the module's own quantized operands, their
quantization, the FP8 byte transpose, and the release of saved FP8 copies after their last use."""

from __future__ import annotations

import torch

from .. import _core
from .. import _scalemm as _C
from ._runtime import _NAMES, BoundedLRU, _direct, _dispatch_modes, _is_compiling, _name, _stream
from .ops import _prepare, scaled_mm
from .quantizers import _MX, _fast_quantize, _quantize_pow2

# The layers' prepared GEMMs, keyed by what their operands' layouts follow from.
_layer_gemms = BoundedLRU()


def _layer_gemm(a, b, sa, sb, ra, rb, od, fmt, fast_accum=False):
    """scaled_mm of the layers' own operands. They come from this module's quantizers (contiguous data,
    scale tensors that follow from the shapes, recipe and format), so a prepared call is keyed by far
    less than _fast's signature: recipes, format, output dtype, the two data shapes and the device."""
    if not _direct(a):
        return scaled_mm(a, b, sa, sb, recipe_a=ra, recipe_b=rb, out_dtype=od, scale_format=fmt, fast_accum=fast_accum)
    key = (ra, rb, od, fmt, fast_accum, a.shape, b.shape, a.dtype, b.dtype, a.device)
    p = _layer_gemms.get(key)
    if p is None:
        d = scaled_mm(a, b, sa, sb, recipe_a=ra, recipe_b=rb, out_dtype=od, scale_format=fmt,
                      fast_accum=fast_accum)  # validates
        with _core.naming_backend("auto"):
            p = _prepare(a, b, sa, sb, ra, rb, od, fmt, None, "auto", None, None, fast_accum)
        _layer_gemms.put(key, p)
        return d
    run, shape, dtype, device, index = p
    d = torch.empty(shape, dtype=dtype, device=device)
    run(a.data_ptr(), sa.data_ptr(), b.data_ptr(), sb.data_ptr(), d.data_ptr(), 0, _stream(index))
    return d


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    """t as a contiguous (rows, last dimension) matrix."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.is_contiguous() else t2.contiguous()


def _wgrad(a, b, sa, sb, act, fmt, w_dtype):
    """dW = a . b^T of two activation-recipe operands, written by the GEMM in the weight's dtype where
    it can (else fp32, then cast): the bits of an fp32 dW rounded afterwards."""
    od = w_dtype if w_dtype in _NAMES else torch.float32
    dw = _layer_gemm(a, b, sa, sb, act, act, _name(od), fmt)
    return dw if dw.dtype == w_dtype else dw.to(w_dtype)


def _quantize_parts(x, recipe, fmt, rowwise, columnwise, pow2=False):
    """The layers' quantization: (data, scales) for rowwise, (data_t, scales_t) for columnwise only, or all
    four. Eager calls write only what is asked for; traced ones run the op (both directions). pow2: the
    layer's power_of_two_scales (amax-pow2 scales; MX scales are powers of two as they are)."""
    if pow2 and recipe not in _MX:
        if _direct(x):
            return _quantize_pow2(x, recipe, "e4m3", fmt, columnwise, rowwise)
        out = torch.ops.scalemm.quantize(x, recipe, "e4m3", fmt, columnwise, True)
        return out if rowwise and columnwise else (out[:2] if rowwise else out[2:])
    if _direct(x):
        return _fast_quantize(x, recipe, "e4m3", fmt, columnwise, rowwise)
    out = torch.ops.scalemm.quantize(x, recipe, "e4m3", fmt, columnwise)
    return out if rowwise and columnwise else (out[:2] if rowwise else out[2:])


def _transpose_fp8(t: torch.Tensor) -> torch.Tensor:
    """The last two dimensions swapped, contiguous (bytes moved as uint8: every FP8 type). Eager CUDA
    tensors go through the library's tiled kernel (about 5x torch's strided copy for 1-byte elements)."""
    if t.is_contiguous() and t.numel() and _direct(t):
        out = torch.empty((*t.shape[:-2], t.shape[-1], t.shape[-2]), dtype=t.dtype, device=t.device)
        _C.transpose_bytes(t.data_ptr(), t.numel() // (t.shape[-1] * t.shape[-2]), t.shape[-2], t.shape[-1],
                                 out.data_ptr(), _stream(t.device.index))
        return out
    return t.view(torch.uint8).transpose(-1, -2).contiguous().view(t.dtype)


def _transpose_2d(t: torch.Tensor) -> torch.Tensor:
    """A 2-D scale grid transposed, contiguous (1-byte scale types moved as uint8)."""
    return _transpose_fp8(t) if t.element_size() == 1 else t.t().contiguous()


def _release(ctx, *tensors):
    """Frees FP8 copies saved for backward once their last GEMM has run: saved tensors otherwise live
    until backward returns, beside the gradients it allocates next. Eager CUDA tensors only (a traced
    graph plans its own buffers); the ctx remembers it, so a second backward through the same graph
    stops with a named error instead of reading freed memory."""
    if ctx.keep_saved or _is_compiling() or _dispatch_modes():
        return
    for t in tensors:
        if type(t) is torch.Tensor and t.is_cuda:
            t.data = torch.empty(0, dtype=t.dtype, device=t.device)
            ctx.released = True


def _check_not_released(ctx, layer: str):
    if getattr(ctx, "released", False):
        raise RuntimeError(
            f"{layer}: backward ran a second time through the same graph (retain_graph=True), but the FP8 "
            "copies saved by the forward were freed after the first backward used them. Set keep_saved = True "
            "on the layer to keep them until the graph is freed (a higher peak), or run the forward again.")

