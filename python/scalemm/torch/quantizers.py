"""The quantizer custom ops and their eager fast path:

    torch.ops.scalemm.quantize          (data, scales, data_t, scales_t) of a (rows, K) tensor, FP8 recipes
    torch.ops.scalemm.quantize_nvfp4    (data, scales, global, data_t, scales_t) for nvfp4
    torch.ops.scalemm.quantize_grouped  MoE tokens rowwise, and transposed with every expert from a
                                        128-column boundary (the k-grouped wgrad's operand)

`quantize` takes every recipe. The ops and their fake implementations share one output contract
(_quantize_outputs), so traced graphs see the shapes the kernels write.
"""

from __future__ import annotations

import contextlib
from typing import Tuple

import torch

from .. import _core
from .. import _scalemm as _C
from .._arrays import DTYPE_CODE, torch_dtype
from ._runtime import BoundedLRU, _direct, _name, _on_device, _stream

def _quantize_outputs(x, recipe, dtype, scale_format, columnwise=True, t_cols=None):
    """(recipe code, format code, outputs) of a quantizer on x (rows, cols): (data, scales) along cols
    and, with columnwise, (data_t, scales_t) transposed along the rows, data_t (cols, t_cols) with t_cols
    the rows unless given (the experts' aligned layout). x.new_empty: real tensors on x's device, or
    fake ones while tracing, so the ops and their fake implementations share one contract."""
    r = _core.recipe_code(recipe, "recipe")
    fmt = _core.SCALE_FORMATS[scale_format]
    rows, k = x.shape
    dt = torch_dtype(_core.DATA_DTYPES[dtype])
    st_ = torch_dtype(_core.scale_dtype_name(r))
    out = (x.new_empty((rows, k), dtype=dt), x.new_empty(_core.scale_shape(r, rows, k, fmt), dtype=st_))
    if columnwise:
        t_cols = rows if t_cols is None else t_cols
        out += (x.new_empty((k, t_cols), dtype=dt), x.new_empty(_core.scale_shape(r, k, t_cols, fmt), dtype=st_))
    return r, fmt, out


_POW2_MODE = 2  # numerics::ScaleMode::kAmaxPow2
_MX = ("mxfp8", "mxfp8-32x32")  # E8M0 scales: powers of two already (their default mode)


def _pow2(recipe, power_of_two_scales) -> bool:
    """Whether a quantization runs the amax-pow2 scale mode: asked for, on an fp32-scale recipe. MX recipes
    take the flag as it is (their scales are powers of two); nvfp4's E4M3 block scales cannot be."""
    pow2 = _core.flag(power_of_two_scales, "power_of_two_scales")
    if pow2 and recipe == "nvfp4":
        raise _core.invalid("power_of_two_scales", "power-of-two scales of an fp32-scale or MX recipe",
                            "False for nvfp4", "True", "nvfp4's block scales are E4M3 values; leave the flag off.")
    return pow2 and recipe not in _MX


def _quantize_pow2(x, recipe, dtype, scale_format, columnwise, rowwise=True):
    """The library's quantizer in the amax-pow2 scale mode (TransformerEngine's power-of-two constraint):
    each scale 1/q with q = max / amax rounded down to a power of two. CUDA tensors run the device
    quantizer, host tensors the emulator (the same bytes). rowwise=False (with columnwise) writes only
    (data_t, scales_t)."""
    x = x if x.is_contiguous() else x.contiguous()
    r, fmt, out = _quantize_outputs(x, recipe, dtype, scale_format, columnwise)
    keep = list(out) if rowwise else [None, None] + list(out[2:])
    ptrs = [0 if t is None else t.data_ptr() for t in keep] + ([0, 0] if not columnwise else [])
    with (_on_device(x) if x.is_cuda else contextlib.nullcontext()):
        _C.quantize_mode(x.data_ptr(), DTYPE_CODE[_name(x.dtype)], x.shape[0], x.shape[1], r,
                         DTYPE_CODE[_core.DATA_DTYPES[dtype]], fmt,
                         _POW2_MODE, *ptrs, 1 if x.is_cuda else 0, _stream(x.device.index) if x.is_cuda else 0)
    return out if rowwise else out[2:]


@torch.library.custom_op("scalemm::quantize", mutates_args=())
def _quantize_op(x: torch.Tensor, recipe: str, dtype: str, scale_format: str,
                 columnwise: bool, power_of_two_scales: bool = False) -> Tuple[torch.Tensor, torch.Tensor,
                                                                               torch.Tensor, torch.Tensor]:
    if recipe == "nvfp4":
        raise _core.invalid("recipe", "torch.ops.scalemm.quantize covers the FP8 recipes (nvfp4 has a global scale "
                            "too)", "an FP8 recipe", "nvfp4", "Call torch.ops.scalemm.quantize_nvfp4, or "
                            "scalemm.torch.quantize, which takes every recipe.")
    # A compiled graph calls this at run time on real tensors: the prepared path, as eager calls take
    # (the general one validates everything on every call, about as long as the kernel at these sizes).
    if _pow2(recipe, power_of_two_scales):
        out = _quantize_pow2(x, recipe, dtype, scale_format, columnwise)
    elif _direct(x):
        out = _fast_quantize(x, recipe, dtype, scale_format, columnwise)
    else:
        out = _core.quantize_impl(x, recipe, dtype, scale_format, columnwise)
    if not columnwise:
        out = tuple(out) + (x.new_empty((0,), dtype=out[0].dtype), x.new_empty((0,), dtype=out[1].dtype))
    return out


@_quantize_op.register_fake
def _(x, recipe, dtype, scale_format, columnwise, power_of_two_scales=False):
    out = _quantize_outputs(x, recipe, dtype, scale_format, columnwise)[2]
    return out if columnwise else out + (x.new_empty((0,), dtype=out[0].dtype), x.new_empty((0,), dtype=out[1].dtype))


@torch.library.custom_op("scalemm::quantize_nvfp4", mutates_args=())
def _quantize_nvfp4_op(x: torch.Tensor, scale_format: str, columnwise: bool) -> Tuple[
        torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """NVFP4 (data, block scales, global decode scale, data_t, scales_t): the global scale is a 0-d
    float32 tensor on x's device (no synchronisation), shared by both directions."""
    out = _core.quantize_impl(x, "nvfp4", "e4m3", scale_format, columnwise)
    data, (scales, glob) = out[0], out[1]
    if not isinstance(glob, torch.Tensor):  # a host tensor's global comes back as a Python float
        glob = torch.tensor(glob, dtype=torch.float32)
    if columnwise:
        return data, scales, glob, out[2], out[3][0]
    return data, scales, glob, x.new_empty((0,), dtype=data.dtype), x.new_empty((0,), dtype=scales.dtype)


@_quantize_nvfp4_op.register_fake
def _(x, scale_format, columnwise):
    r = _core.recipe_code("nvfp4", "recipe")
    fmt = _core.SCALE_FORMATS[scale_format]
    rows, k = x.shape
    dt = torch_dtype("e2m1x2")
    st = torch_dtype(_core.scale_dtype_name(r))
    data = x.new_empty((rows, k // 2), dtype=dt)
    scales = x.new_empty(_core.scale_shape(r, rows, k, fmt), dtype=st)
    glob = x.new_empty((), dtype=torch.float32)
    if columnwise:
        return (data, scales, glob, x.new_empty((k, rows // 2), dtype=dt),
                x.new_empty(_core.scale_shape(r, k, rows, fmt), dtype=st))
    return data, scales, glob, x.new_empty((0,), dtype=dt), x.new_empty((0,), dtype=st)


def _nvfp4_pairs(out, columnwise):
    """The op's five tensors as scalemm.quantize returns nvfp4: (data, (scales, global)) [+ the transposed]."""
    data, scales, glob, data_t, scales_t = out
    if columnwise:
        return data, (scales, glob), data_t, (scales_t, glob)
    return data, (scales, glob)


def quantize(x, recipe, *, dtype="e4m3", scale_format="compact", columnwise=False, power_of_two_scales=False):
    """Quantizes x (rows, K) along K; with columnwise=True also x^T (K, rows) along rows, from one read
    of x (for the square-block weight recipes the columnwise output is the exact transpose). Every
    recipe: nvfp4 returns its scales as scalemm.quantize does, (block_scales, global_decode_scale)
    with the global a 0-d float32 tensor on x's device. power_of_two_scales=True: every scale a power of
    two (the library's amax-pow2 mode, TransformerEngine's Float8BlockScaling constraint) for the fp32-scale
    recipes; MX scales are powers of two already; refused for nvfp4."""
    pow2 = _pow2(recipe, power_of_two_scales)
    if recipe != "nvfp4" and _direct(x):
        if pow2:
            return _quantize_pow2(x, recipe, dtype, scale_format, columnwise)
        return _fast_quantize(x, recipe, dtype, scale_format, columnwise)
    if recipe == "nvfp4":
        return _nvfp4_pairs(torch.ops.scalemm.quantize_nvfp4(x, scale_format, columnwise), columnwise)
    out = torch.ops.scalemm.quantize(x, recipe, dtype, scale_format, columnwise, pow2)
    return out if columnwise else out[:2]


# The prepared quantizations of each signature: (library codes, the outputs' shapes and dtypes, scratch bytes).
_prepared_quantize = BoundedLRU()


def _fast_quantize(x, recipe, dtype, scale_format, columnwise, rowwise=True):
    """The eager FP8 quantization, as _fast is for scaled_mm: the first call of a signature runs the
    general path (which validates everything) and keeps the outputs' shapes and the library's codes;
    later calls allocate the outputs through torch and call the quantizer directly. The bytes are the
    custom op's (the same library call). rowwise=False (with columnwise) writes only x^T's operand:
    (data_t, scales_t)."""
    key = (recipe, dtype, scale_format, columnwise, rowwise, x.dtype, x.shape, x.stride(), x.device)
    p = _prepared_quantize.get(key)
    if p is None:
        out = _core.quantize_impl(x, recipe, dtype, scale_format, columnwise)
        dt = "e5m2" if out[0].dtype == torch.float8_e5m2 else "e4m3"
        codes = (_core.recipe_code(recipe, "recipe"), DTYPE_CODE[dt], _core.SCALE_FORMATS[scale_format],
                 DTYPE_CODE[_name(x.dtype)], x.shape[0], x.shape[1])
        # Scratch through torch's caching allocator (the amax recipes need some; block recipes none).
        ws = _C.quantize_workspace_bytes(codes[3], codes[4], codes[5], codes[0], codes[1], codes[2], rowwise,
                                               columnwise) if recipe in ("tensorwise", "rowwise") else 0
        _prepared_quantize.put(key, (codes, tuple((t.shape, t.dtype) for t in out), ws))
        return out if rowwise else out[2:]
    (r, dt, fmt, src, rows, k), metas, ws = p
    scratch = torch.empty(ws, dtype=torch.uint8, device=x.device) if ws else None
    wp = scratch.data_ptr() if ws else 0
    if not rowwise:
        (st_, tt), (ss, ts) = metas[2], metas[3]
        data_t, scales_t = torch.empty(st_, dtype=tt, device=x.device), torch.empty(ss, dtype=ts, device=x.device)
        _C.quantize(x.data_ptr(), src, rows, k, r, dt, fmt, 0, 0, data_t.data_ptr(), scales_t.data_ptr(), 0,
                          1, _stream(x.device.index), wp, ws)
        return data_t, scales_t
    out = tuple(torch.empty(shape, dtype=t, device=x.device) for shape, t in metas)
    _C.quantize(x.data_ptr(), src, rows, k, r, dt, fmt, out[0].data_ptr(), out[1].data_ptr(),
                      out[2].data_ptr() if columnwise else 0, out[3].data_ptr() if columnwise else 0, 0, 1,
                      _stream(x.device.index), wp, ws)
    return out


# ---- MoE tokens ------------------------------------------------------------------------------------------

def _tokens_padded(x: torch.Tensor, sizes: torch.Tensor, rows: int) -> torch.Tensor:
    """x's rows with each expert's starting on a 128-row boundary and zero rows in between: (rows, K),
    computed with torch ops on the device (the reference for quantize_grouped's columnwise output)."""
    e, tokens = sizes.shape[0], x.shape[0]
    padded = (sizes + 127) // 128 * 128
    ends, pends = torch.cumsum(sizes, 0), torch.cumsum(padded, 0)
    tok = torch.arange(tokens, device=x.device)
    expert = torch.searchsorted(ends, tok, right=True).clamp_(max=e - 1)
    dest = (pends - padded)[expert] + tok - (ends - sizes)[expert]
    return x.new_zeros((rows, x.shape[1])).index_copy_(0, dest, x)


@torch.library.custom_op("scalemm::quantize_grouped", mutates_args=())
def _quantize_grouped_op(x: torch.Tensor, sizes: torch.Tensor, rows: int, recipe: str, dtype: str,
                         scale_format: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """MoE tokens x (T, K) sorted by expert, `sizes` the experts' int64 counts on x's device: x rowwise
    (T, K) and x^T columnwise (K, rows) with every expert's tokens from a 128-column boundary (zeros
    in between and after the last), from one read of x (scalemm::quantize::quantize_grouped) for
    bf16/f16 CUDA tensors; other tensors through torch ops and quantize, with the same bytes."""
    if x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and x.is_contiguous():
        return _quantize_grouped_cuda(x, sizes, rows, recipe, dtype, scale_format)
    xq, xs = _quantize_op(x, recipe, dtype, scale_format, False)[:2]
    xtq, xts = _quantize_op(_tokens_padded(x, sizes, rows), recipe, dtype, scale_format, True)[2:]
    return xq, xs, xtq, xts


@_quantize_grouped_op.register_fake
def _(x, sizes, rows, recipe, dtype, scale_format):
    return _quantize_outputs(x, recipe, dtype, scale_format, t_cols=rows)[2]


def _quantize_grouped_cuda(x, sizes, rows, recipe, dtype, scale_format):
    if sizes.dtype != torch.int64 or sizes.device != x.device or not sizes.is_contiguous() or sizes.dim() != 1:
        raise _core.invalid("sizes", "the experts' token counts for the device kernel",
                            f"a contiguous 1-D int64 tensor on {x.device}",
                            f"{sizes.dtype} {tuple(sizes.shape)} on {sizes.device}")
    r, fmt, (xq, xs, xtq, xts) = _quantize_outputs(x, recipe, dtype, scale_format, t_cols=rows)
    tokens, k = x.shape
    # The library runs on the stream's device, and torch's default stream (the null stream) names none:
    # x's device is made current when it is not (the op path, where another device may be current).
    with _on_device(x):
        _C.quantize_grouped(x.data_ptr(), DTYPE_CODE[_name(x.dtype)], tokens, k, r, DTYPE_CODE[dtype], fmt,
                            sizes.data_ptr(), sizes.shape[0], rows, xq.data_ptr(), xs.data_ptr(), xtq.data_ptr(),
                            xts.data_ptr(), _stream(x.device.index))
    return xq, xs, xtq, xts

