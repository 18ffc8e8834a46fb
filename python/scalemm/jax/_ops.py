"""The ops as XLA custom calls: trace-time checks (the library's rules, through the extension's
ffi_check_* builders, which the handlers run again on the real buffers), then one jax.ffi.ffi_call.

vmap: every op maps over a batch axis sequentially (one call per element: vmap_method="sequential"),
the semantics of a Python loop over the batch."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

import jax
import jax.numpy as jnp

from .. import _core
from .. import _scalemm as C
from .._arrays import DTYPE_CODE, View, _NUMPY_NAMES, _np_dtype
from .._errors import invalid



def _register():
    for name, (host, cuda) in C.ffi_targets().items():
        jax.ffi.register_ffi_target(name, host, platform="cpu")
        jax.ffi.register_ffi_target(name, cuda, platform="CUDA")


_register()


def _call(name, results, *args, **attrs):
    attrs = {k: (v if isinstance(v, bool) else np.int64(v)) for k, v in attrs.items()}
    return jax.ffi.ffi_call(name, results, vmap_method="sequential")(*args, **attrs)


def view(x, argument: str) -> View:
    """Shape and element type of a JAX array or tracer (XLA buffers are dense row-major)."""
    try:
        shape, dt = tuple(int(s) for s in x.shape), np.dtype(x.dtype)
    except (AttributeError, TypeError):
        raise invalid(argument, "an array is expected", "a JAX array (or anything jnp.asarray takes)",
                      type(x).__name__) from None
    strides, acc = [], 1
    for n in reversed(shape):
        strides.insert(0, acc)
        acc *= n
    return View("jax", x, 0, shape, tuple(strides), _NUMPY_NAMES.get(dt.name, dt.name), 0, None)


def _struct(shape, name):
    return jax.ShapeDtypeStruct(tuple(shape), _np_dtype(name))


def _scale(s, recipe: int, argument: str):
    """(scale array, its dtype code, shape, global decode scale array) of one operand."""
    glob = None
    if isinstance(s, tuple):
        if not _core.LAYOUTS[recipe].two_level or len(s) != 2:
            raise invalid(argument, "a (scales, global_scale) pair is only for nvfp4", "one scale array",
                          f"a tuple of {len(s)}")
        s, glob = s
        gv = view(jnp.asarray(glob), argument + "[1]")
        if int(np.prod(gv.shape)) != 1:
            raise invalid(argument + "[1]", "the NVFP4 global decode scale is one number", "1 element",
                          str(int(np.prod(gv.shape))))
        glob = jnp.asarray(glob, jnp.float32).reshape(())
    v = view(s, argument)
    code = _core.scale_code(v, recipe, argument)
    return s, code, list(v.shape), jnp.ones((), jnp.float32) if glob is None else glob


def _operand(x, recipe: int, argument: str, rows_name: str):
    v = view(x, argument)
    t = _core._operand_dtype(v, recipe, None, argument, "dtype_" + argument)
    rows, k = _core._data_shape(v, t, argument, rows_name)
    return v, t, rows, k


# ---- scaled_mm --------------------------------------------------------------------------------------------

def scaled_mm(a, b, scale_a, scale_b, *, recipe_a, recipe_b, out_dtype="bf16", scale_format="compact"):
    """D (M, N) = A (M, K) . B (N, K)^T with each operand dequantized by its recipe's scales (as
    scalemm.scaled_mm): a, b FP8 (or packed-FP4 uint8 for nvfp4), scales in `scale_format`, nvfp4
    scales as (block_scales, global_decode_scale)."""
    return scaled_mm_impl(a, b, scale_a, scale_b, recipe_a, recipe_b, out_dtype, scale_format)


def scaled_mm_impl(a, b, scale_a, scale_b, recipe_a, recipe_b, out_dtype, scale_format, fast_accum=False,
                   partitioned=True):
    """scaled_mm; partitioned: with the sharding rules of _partition.py (off inside shard_map, whose
    bodies are already per device)."""
    ra, rb = _core.recipe_code(recipe_a, "recipe_a"), _core.recipe_code(recipe_b, "recipe_b")
    fmt = _core.choice(_core.SCALE_FORMATS, scale_format, "scale_format", "scale format")
    od = _core.choice(_core.OUT_DTYPES, out_dtype, "out_dtype", "output dtype")
    _, ta, m, ka = _operand(a, ra, "a", "M")
    _, tb, n, kb = _operand(b, rb, "b", "N")
    if ka != kb:
        raise invalid("b", "A (M, K) and B (N, K) share K (D = A B^T)", f"K = {ka}", f"K = {kb}",
                      "B is given as (N, K), the weight of a linear layer; transpose a (K, N) B first.")
    sa, ca, sha, ga = _scale(scale_a, ra, "scale_a")
    sb, cb, shb, gb = _scale(scale_b, rb, "scale_b")
    C.ffi_check_gemm(m, n, ka, (DTYPE_CODE[ta], ra, ca, sha), (DTYPE_CODE[tb], rb, cb, shb), fmt, DTYPE_CODE[od],
                     fast_accum)
    call = GemmCall(od, (("recipe_a", ra), ("recipe_b", rb), ("dtype_a", DTYPE_CODE[ta]), ("dtype_b", DTYPE_CODE[tb]),
                         ("sdtype_a", ca), ("sdtype_b", cb), ("format", fmt), ("d_dtype", DTYPE_CODE[od]),
                         ("fast_accum", bool(fast_accum))))
    if not partitioned:
        return call(a, b, sa, sb, ga, gb)
    from ._partition import gemm, scale_kind

    return gemm(call, scale_kind(ra, fmt), scale_kind(rb, fmt), a, b, sa, sb, ga, gb)


class GemmCall(NamedTuple):
    """The custom call of one checked scaled_mm, on whatever rows it is handed (a device's shard)."""
    out_dtype: str
    attrs: tuple

    def __call__(self, a, b, sa, sb, ga, gb):
        return _call("scalemm_scaled_mm", _struct((a.shape[0], b.shape[0]), self.out_dtype), a, b, sa, sb, ga, gb,
                     **dict(self.attrs))


# ---- quantize ---------------------------------------------------------------------------------------------

def _source(x):
    v = view(x, "x")
    if v.dtype not in ("f32", "bf16", "f16"):
        raise invalid("x", "the source of a quantization is high precision", "float32, bfloat16 or float16",
                      v.dtype, "Convert it (x.astype(jnp.float32)).")
    if len(v.shape) != 2:
        raise invalid("x", "a 2-D (rows, K) array is quantized along its last dimension", "rank 2",
                      f"shape {v.shape}", "Reshape it to (-1, K).")
    return v


def quantize_parts(x, recipe, dtype="e4m3", scale_format="compact", rowwise=True, columnwise=False,
                   partitioned=True):
    """(data, scales, data_t, scales_t, global) of one quantizer call; directions not asked for are (0,)
    arrays, and global is NVFP4's decode scale (a 0-d float32; not written for the other recipes).
    partitioned: with the sharding rules of _partition.py (off inside shard_map)."""
    r = _core.recipe_code(recipe, "recipe")
    fmt = _core.choice(_core.SCALE_FORMATS, scale_format, "scale_format", "scale format")
    v = _source(x)
    rows, k = v.shape
    if _core.LAYOUTS[r].packed_fp4:
        dt = "e2m1x2"
        if k % 2:
            raise invalid("x", "nvfp4 packs two values per byte", "an even K", str(k))
    else:
        dt = _core.choice({"e4m3": "e4m3", "float8_e4m3fn": "e4m3", "e5m2": "e5m2", "float8_e5m2": "e5m2"}, dtype,
                          "dtype", "FP8 data type")
    C.ffi_check_quantize(DTYPE_CODE[v.dtype], rows, k, r, DTYPE_CODE[dt], fmt, rowwise, columnwise)
    call = QuantizeCall(r, dt, fmt, rowwise, columnwise)
    if not partitioned:
        return call(x)
    from ._partition import quantize_rows

    return quantize_rows(call, x)


class QuantizeCall(NamedTuple):
    """The custom call of one checked quantization, on whatever rows it is handed (a device's shard)."""
    recipe: int
    data_dtype: str
    format: int
    rowwise: bool
    columnwise: bool

    def __call__(self, x):
        r, dt, fmt = self.recipe, self.data_dtype, self.format
        rows, k = x.shape
        src = DTYPE_CODE[view(x, "x").dtype]
        sdt, half, none = _core.scale_dtype_name(r), 2 if _core.LAYOUTS[r].packed_fp4 else 1, (0,)
        ws = C.quantize_workspace_bytes(src, rows, k, r, DTYPE_CODE[dt], fmt, self.rowwise, self.columnwise)
        results = [_struct((rows, k // half) if self.rowwise else none, dt),
                   _struct(_core.scale_shape(r, rows, k, fmt) if self.rowwise else none, sdt),
                   _struct((k, rows // half) if self.columnwise else none, dt),
                   _struct(_core.scale_shape(r, k, rows, fmt) if self.columnwise else none, sdt),
                   _struct((), "f32"), _struct((ws,), "u8")]
        out = _call("scalemm_quantize", results, x, recipe=r, data_dtype=DTYPE_CODE[dt], format=fmt,
                    rowwise=self.rowwise, columnwise=self.columnwise)
        return tuple(out[:5])  # the workspace is the call's own


def quantize(x, recipe, *, dtype="e4m3", scale_format="compact", columnwise=False):
    """Quantizes x (rows, K) along K: (data, scales); with columnwise=True also x^T (K, rows) along the
    rows: (data, scales, data_t, scales_t), as scalemm.torch.quantize. nvfp4 returns its scales as
    (block_scales, global_decode_scale), the global a 0-d float32 array."""
    columnwise = _core.flag(columnwise, "columnwise")
    data, scales, data_t, scales_t, glob = quantize_parts(x, recipe, dtype, scale_format, True, columnwise)
    if _core.LAYOUTS[_core.recipe_code(recipe, "recipe")].two_level:
        scales, scales_t = (scales, glob), (scales_t, glob)
    return (data, scales, data_t, scales_t) if columnwise else (data, scales)


def dequantize(data, scales, recipe, *, scale_format="compact", out_dtype="f32"):
    """The values a quantized operand stands for: (rows, K) of out_dtype (as scalemm.dequantize)."""
    r = _core.recipe_code(recipe, "recipe")
    fmt = _core.choice(_core.SCALE_FORMATS, scale_format, "scale_format", "scale format")
    od = _core.choice(_core.OUT_DTYPES, out_dtype, "out_dtype", "output dtype")
    _, t, rows, k = _operand(data, r, "data", "rows")
    s, code, shape, glob = _scale(scales, r, "scales")
    C.ffi_check_scale(r, rows, k, fmt, code, shape, "scales")
    return _call("scalemm_dequantize", _struct((rows, k), od), data, s, glob, dtype=DTYPE_CODE[t], recipe=r,
                 scale_dtype=code, format=fmt, out_dtype=DTYPE_CODE[od])


# ---- scaled_grouped_mm ------------------------------------------------------------------------------------

def _sizes(group_sizes):
    if isinstance(group_sizes, (list, tuple)):
        for i, x in enumerate(group_sizes):
            if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
                raise invalid(f"group_sizes[{i}]", "group sizes are integers", "an int", repr(x))
        group_sizes = np.asarray(group_sizes, np.int32)
    v = view(group_sizes, "group_sizes")
    if v.dtype not in ("i32", "i64"):
        raise invalid("group_sizes", "group sizes are integers", "an int32 or int64 array", v.dtype)
    if len(v.shape) != 1:
        raise invalid("group_sizes", "one size per group", "a 1-D array", f"shape {v.shape}")
    if v.shape[0] == 0:
        raise invalid("group_sizes", "a grouped GEMM needs at least one group", "G >= 1 sizes", "none")
    return group_sizes, v.shape[0], v.dtype == "i64"


def scaled_grouped_mm(a, b, scale_a, scale_b, group_sizes, *, group_dim="m", recipe_a, recipe_b, out_dtype="bf16"):
    """Grouped (MoE) scaled GEMM, as scalemm.scaled_grouped_mm, with the G group sizes a device array
    (int32 or int64; read where the call runs: no host synchronisation on the kernels that read them on
    the GPU). group_dim "m": a (sum M_g, K), b (G, N, K), D (sum M_g, N); "k": a (M, sum K_g),
    b (N, sum K_g), D (G, M, N). Compact scales of the whole tensors: A's of an m-grouped call in a
    per-row recipe (rowwise, block1x128, mxfp8), whose grid does not depend on the split; B's the
    experts' stacked (m) or the whole tensor's (k)."""
    dim = _core.choice(_core.GROUP_DIMS, group_dim, "group_dim", 'grouped dimension ("m": row groups, MoE forward; '
                       '"k": weight gradient)')
    ra, rb = _core.recipe_code(recipe_a, "recipe_a"), _core.recipe_code(recipe_b, "recipe_b")
    od = _core.choice(_core.OUT_DTYPES, out_dtype, "out_dtype", "output dtype")
    for r, arg in ((ra, "recipe_a"), (rb, "recipe_b")):
        if _core.LAYOUTS[r].two_level:
            raise invalid(arg, "grouped calls from JAX take the FP8 and MX recipes", "an FP8 or MX recipe", "nvfp4",
                          "Run nvfp4 groups as scaled_mm calls (its global decode scales are per group).")
    sizes, groups, int64 = _sizes(group_sizes)
    _, ta, m, ka = _operand(a, ra, "a", "sum M_g" if dim == 0 else "M")
    vb = view(b, "b")
    tb = _core._operand_dtype(vb, rb, None, "b", "dtype_b")
    if dim == 0:
        if len(vb.shape) != 3 or vb.shape[0] != groups:
            raise invalid("b", "m-grouped B holds one (N, K) operand per group", f"shape ({groups}, N, K)",
                          f"shape {vb.shape}")
        n, kb = vb.shape[1], vb.shape[2]
        out_shape = (m, n)
    else:
        n, kb = _core._data_shape(vb, tb, "b", "N")
        out_shape = (groups, m, n)
    if ka != kb:
        what = "A (sum M_g, K) and B (G, N, K) share K" if dim == 0 else "A (M, sum K_g) and B (N, sum K_g) share K"
        raise invalid("b", what, f"K = {ka}", f"K = {kb}")
    sa, ca, sha, _ = _scale(scale_a, ra, "scale_a")
    sb, cb, shb, _ = _scale(scale_b, rb, "scale_b")
    C.ffi_check_grouped(dim, groups, int64, m, n, ka, (DTYPE_CODE[ta], ra, ca, sha), (DTYPE_CODE[tb], rb, cb, shb), 0,
                        DTYPE_CODE[od], 0)
    return _call("scalemm_scaled_grouped_mm", _struct(out_shape, od), a, b, sa, sb, jnp.asarray(sizes),
                 group_dim=dim, recipe_a=ra, recipe_b=rb, dtype_a=DTYPE_CODE[ta], dtype_b=DTYPE_CODE[tb], sdtype_a=ca,
                 sdtype_b=cb, format=0, d_dtype=DTYPE_CODE[od], backend=0)
