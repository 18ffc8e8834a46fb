"""Scale layouts: the library's contract for each recipe's scale buffer, from Python.

compact: the dense grid quantizers and checkpoints produce; cublaslt: exactly the (padded, possibly
128x4-tiled) buffer cuBLASLt reads. rows is the operand's row count (M for A, N for B) and k its K.
"""

from __future__ import annotations

from collections import namedtuple

from . import _scalemm as _C
from ._arrays import DTYPE_CODE, empty, hand_back, ptr_of, stream_of, view
from ._core import SCALE_FORMATS, choice, layout, scale_code, scale_dtype_name, recipe_code, scale_shape
from ._errors import invalid

Diagnostic = namedtuple("Diagnostic", "argument rule message expected actual fix text")
Diagnostic.__doc__ = "One broken rule of a scale tensor; `text` is the library's one-line form."


def _scale_view(scales, recipe: int, argument: str):
    v = view(scales, argument)
    code = scale_code(v, recipe, argument, check=False)
    shape, strides = (v.shape, v.strides) if v.shape else ((1,), (1,))
    return v, code, list(shape), list(strides)


def _dims(rows, k):
    for name, val in (("rows", rows), ("k", k)):
        if not isinstance(val, int) or val < 1:
            raise invalid(name, "operand extent", "an int >= 1", repr(val))


def _convert(scales, recipe, rows, k, src_fmt, dst_fmt):
    r = recipe_code(recipe, "recipe")
    _dims(rows, k)
    v, code, shape, strides = _scale_view(scales, r, "scales")
    out = empty(v, scale_shape(r, rows, k, dst_fmt), scale_dtype_name(r) if code != DTYPE_CODE["u8"] else "u8")
    _C.convert(r, rows, k, src_fmt, v.ptr, code, shape, strides, dst_fmt, ptr_of(out), v.space, stream_of(v))
    return hand_back(v, out)


def to_cublaslt(scales, recipe, rows, k):
    """Compact scales of a (rows, k) operand -> a new flat buffer in cuBLASLt's layout (padding zero).
    Runs on the scales' device (GPU kernel, current stream) or on the host."""
    return _convert(scales, recipe, rows, k, 0, 1)


def from_cublaslt(scales, recipe, rows, k):
    """cuBLASLt-layout scales of a (rows, k) operand -> a new compact array (the CLI's shapes)."""
    return _convert(scales, recipe, rows, k, 1, 0)


def check(scales, recipe, rows, k, *, scale_format="compact", content=True):
    """Every rule the scale tensor breaks, as Diagnostic tuples; [] when it is valid.

    Structural rules (element type, shape, strides, alignment) always; content rules (NaN/negative
    scales, nonzero padding) when `content`. For device arrays the content check runs on the device
    and synchronises the current stream."""
    r = recipe_code(recipe, "recipe")
    _dims(rows, k)
    fmt = choice(SCALE_FORMATS, scale_format, "scale_format", "scale format")
    v, code, shape, strides = _scale_view(scales, r, "scales")
    if code < 0:
        return [Diagnostic("scales", "scale-dtype", "scale element type of this recipe",
                           scale_dtype_name(r), v.dtype, "", f"scales: scale element type: expected "
                           f"{scale_dtype_name(r)}, got {v.dtype}")]
    return [Diagnostic(*d) for d in _C.check(r, rows, k, fmt, v.ptr, code, shape, strides, v.space, bool(content),
                                             "scales", stream_of(v))]


def describe(recipe, rows, k, *, scale_format="compact") -> str:
    """One line: the layout's element type, padded shape and bytes."""
    r = recipe_code(recipe, "recipe")
    _dims(rows, k)
    return layout(r, rows, k, choice(SCALE_FORMATS, scale_format, "scale_format", "scale format")).description


def shape(recipe, rows, k, *, scale_format="compact") -> tuple:
    """The shape of the scale array scalemm produces (and the CLI writes) for a (rows, k) operand."""
    r = recipe_code(recipe, "recipe")
    _dims(rows, k)
    return scale_shape(r, rows, k, choice(SCALE_FORMATS, scale_format, "scale_format", "scale format"))
