"""scaled_mm, quantize, dequantize and explain over any supported array type.

Plan on the host, execute on the device: everything here reads array metadata, checks it and hands
addresses to the library, which validates the scale layouts by its own contract and runs on the
caller's current stream. Nothing synchronises, nothing is copied (except a bias that is not bf16, and
the NVFP4 global scale, which the library takes by value and therefore must be a host number).
"""

from __future__ import annotations

import contextlib
import threading
from collections import namedtuple

import numpy as np

from . import _scalemm as _C
from ._arrays import DTYPE_CODE, View, empty, hand_back, on_device, stream_of, view
from ._errors import InvalidArgumentError, UnsupportedError, invalid

RECIPES = dict(_C.recipe_names())  # "tensorwise" -> 1, ...
_RECIPE_ALIASES = {"mxfp8_32x32": "mxfp8-32x32", "blockwise1x128": "block1x128", "blockwise128x128": "block128x128"}
SCALE_FORMATS = {"compact": 0, "cublaslt": 1}
BACKENDS = {"auto": -1, "native": 0, "convert-native": 1, "emulated": 2, "reference": 3, "contiguous": 4}
OUT_DTYPES = {"bf16": "bf16", "bfloat16": "bf16", "f16": "f16", "float16": "f16", "fp16": "f16", "f32": "f32",
              "float32": "f32", "fp32": "f32"}
DATA_DTYPES = {"e4m3": "e4m3", "float8_e4m3fn": "e4m3", "e5m2": "e5m2", "float8_e5m2": "e5m2", "e2m1": "e2m1x2",
               "float4_e2m1fn_x2": "e2m1x2"}
_SCALE_DTYPES = {"f32": (0,), "e8m0": (6, 8), "ue4m3": (7, 8)}  # scale dtype -> accepted element types


def recipe_code(name, argument: str) -> int:
    if isinstance(name, str):
        key = _RECIPE_ALIASES.get(name, name)
        if key in RECIPES:
            return RECIPES[key]
    raise invalid(argument, "unknown recipe", ", ".join(RECIPES), repr(name),
                  "Recipes are explicit names; scalemm never infers them from shapes.")


def choice(table: dict, name, argument: str, what: str):
    key = name
    if not isinstance(name, str):  # torch.bfloat16 and friends
        key = str(name).replace("torch.", "")
    if key in table:
        return table[key]
    raise invalid(argument, f"unknown {what}", ", ".join(k for k in table if "_" not in k and "float" not in k),
                  repr(name))


@contextlib.contextmanager
def naming_backend(backend):
    """A forced backend that cannot run the call: the library's UnsupportedError ("no backend can run ...
    with backend forced to native -> native: host pointers: ...") reworded to name the `backend` argument
    first, with what it expected, what it got and the fix; the library's reasons follow."""
    try:
        yield
    except UnsupportedError as e:
        if backend == "auto" or "forced to" not in e.message:
            raise
        where = (" Host (NumPy) arrays run only on the reference backend; native, convert-native and emulated "
                 "need device arrays on a GPU." if "host pointers" in e.message else "")
        raise UnsupportedError(
            f"backend: the forced backend cannot run this call: expected a backend that can run it (\"auto\" "
            f"lets the planner choose one), got {backend!r}. Pass backend=\"auto\" or a backend the reasons "
            f"below allow.{where} Reasons: {e.message}") from None


_handles: dict = {}
_handles_lock = threading.Lock()


def handle(backend: str) -> "_C.Handle":
    """One library Handle per backend policy, shared by every thread (Handle is thread-safe)."""
    h = _handles.get(backend)
    if h is None:
        code = choice(BACKENDS, backend, "backend", "backend")
        with _handles_lock:
            h = _handles.get(backend)
            if h is None:
                h = _handles[backend] = _C.Handle(code)
    return h


# ---- the scale-layout rules -------------------------------------------------------------------------

# What each recipe's scale layout is at any size (block sizes, cuBLASLt padding, scale element type),
# read from the library's ScaleLayout once at import: the package keeps no copy of those rules.
LAYOUTS = {code: _C.recipe_layout(code) for code in RECIPES.values()}


def layout(recipe: int, rows: int, k: int, fmt: int) -> "_C.ScaleLayout":
    """The library's ScaleLayout of one (rows, k) operand: its sizes, padding and element type by name."""
    return _C.ScaleLayout(recipe, rows, k, fmt)


def _blocks(n, block):
    return 1 if block == 0 else (n + block - 1) // block  # block 0: one block spans all of n


def _round_up(n, multiple):
    return (n + multiple - 1) // multiple * multiple


def scale_shape(recipe: int, rows, k, fmt: int) -> tuple:
    """Shape of a scale array scalemm allocates: compact grids as the CLI writes them (tensorwise a
    0-d scalar, rowwise (rows, 1), block recipes (grid rows, K-blocks)); cublaslt as one flat buffer.

    Integer arithmetic on the recipe's LAYOUTS rule (no call into the library), so that torch's fake
    implementations can run it on symbolic sizes; tests check it against ScaleLayout for every recipe."""
    rule = LAYOUTS[recipe]
    kblocks = _blocks(k, rule.block_k)
    if fmt == 0:
        return () if rule.scalar else (_blocks(rows, rule.block_rows), kblocks)
    stored = _round_up(_blocks(rows, rule.lt_row_step), rule.lt_row_multiple)
    return (stored * _round_up(kblocks, rule.lt_kblock_multiple),)


def scale_dtype_name(recipe: int) -> str:
    return LAYOUTS[recipe].scale_dtype_name


_SCALE_DTYPE_WORDS = {"f32": "float32", "e8m0": "float8_e8m0fnu or uint8 (E8M0 bits)",
                      "ue4m3": "float8_e4m3fn or uint8 (UE4M3 bits)"}


def scale_code(v: View, recipe: int, argument: str, check: bool = True) -> int:
    """The library DType code of a scale array of this recipe (torch and ml_dtypes carry UE4M3 as
    float8_e4m3fn); with check, a type the recipe does not take is refused naming `argument`."""
    want = LAYOUTS[recipe].scale_dtype_name
    code = DTYPE_CODE.get(v.dtype, -1)
    if want == "ue4m3" and v.dtype == "e4m3":
        code = DTYPE_CODE["ue4m3"]
    if check and code not in _SCALE_DTYPES[want]:
        raise invalid(argument, "scale element type of this recipe", _SCALE_DTYPE_WORDS[want], v.dtype)
    return code


# ---- operands ---------------------------------------------------------------------------------------

def _operand_dtype(v: View, recipe: int, given, argument: str, dtype_argument: str) -> str:
    """The element type of operand data: from the array's own type, or `given` for raw uint8."""
    fp4 = LAYOUTS[recipe].packed_fp4
    want = None if given is None else choice(DATA_DTYPES, given, dtype_argument, "data dtype")
    if v.dtype in ("e4m3", "e5m2", "e2m1x2"):
        if want is not None and want != v.dtype:
            raise invalid(dtype_argument, f"disagrees with the element type of {argument}", v.dtype,
                          str(given), f"Leave {dtype_argument} unset for typed arrays.")
        have = v.dtype
    elif v.dtype == "u8":
        if want is None:
            if not fp4:
                raise invalid(dtype_argument, f"{argument} holds raw bytes (uint8), so its element type must be named",
                              '"e4m3", "e5m2" or "e2m1"', "None",
                              f"Pass {dtype_argument}=\"e4m3\" (or the type the bytes hold).")
            want = "e2m1x2"  # NVFP4 data is always packed E2M1
        have = want
    elif v.dtype == "e2m1-unpacked":
        raise invalid(argument, "FP4 data must be packed two values per byte", "uint8 (rows, K/2), element 2i in "
                      "the low nibble", "ml_dtypes.float4_e2m1fn, one value per byte",
                      "Pack it: (hi << 4) | lo of the 4-bit codes, as uint8.")
    else:
        raise invalid(argument, "operand data must be FP8 or packed FP4", "float8_e4m3fn, float8_e5m2, "
                      "float4_e2m1fn_x2, or uint8 with " + dtype_argument, v.dtype,
                      "Quantize it first (scalemm.quantize).")
    if fp4 != (have == "e2m1x2"):
        raise invalid(argument, "nvfp4 data is packed E2M1 and E2M1 data needs the nvfp4 recipe",
                      "e2m1 with nvfp4" if fp4 else "e4m3 or e5m2", have)
    return have


def _data_shape(v: View, dtype: str, argument: str, rows_name: str):
    if len(v.shape) != 2:
        raise invalid(argument, f"operand data is a 2-D ({rows_name}, K) row-major array", "rank 2",
                      f"shape {v.shape}")
    if not v.contiguous():
        raise invalid(argument, "operand data must be row-major with K contiguous", f"strides ({v.shape[1]}, 1)",
                      f"strides {v.strides}", "Call .contiguous() (torch) or numpy.ascontiguousarray.")
    rows, cols = v.shape
    return rows, cols * 2 if dtype == "e2m1x2" else cols


def pair_refused(argument: str, given) -> InvalidArgumentError:
    # Taken alone the block scales would decode with global = 1: a result off by the encode scale.
    return invalid(argument, "nvfp4 scales are the pair (block_scales, global_decode_scale)",
                   "a tuple (scales, global)", f"one {type(given).__name__}",
                   "Pass the pair scalemm.quantize returns for nvfp4; (scales, 1.0) states a global of 1.")


def _scale_operand(s, recipe: int, space: int, argument: str):
    """(View, dtype code, shape, strides, global scale) of one operand's scales; two-level recipes
    (nvfp4) take (scales, global decode scale)."""
    glob = 1.0
    two_level = LAYOUTS[recipe].two_level
    if isinstance(s, tuple):
        if not two_level or len(s) != 2:
            raise invalid(argument, "a (scales, global_scale) pair is only for nvfp4", "one scale array",
                          f"a tuple of {len(s)}")
        s, g = s
        glob = global_value(g, argument)
    elif two_level:
        raise pair_refused(argument, s)
    v = view(s, argument)
    if v.space != space:
        raise invalid(argument, "scales live with the data", "device" if space else "host memory",
                      "device" if v.space else "host memory", "Move the scales to the operand's device.")
    code = scale_code(v, recipe, argument)
    shape, strides = v.shape, v.strides
    if not shape:  # a 0-d scalar scale (torch's tensorwise form) is a buffer of one
        shape, strides = (1,), (1,)
    return v, code, shape, strides, glob


def global_value(g, argument: str) -> float:
    """The NVFP4 global decode scale as a float32 value: positive and finite (subnormal ones included:
    they are numbers a tensor's amax can produce), or a refusal naming `argument`[1]."""
    if isinstance(g, (float, int, np.floating, np.integer)):
        return _positive_finite_f32(float(g), argument + "[1]")
    try:
        v = view(g, argument + "[1]")
    except Exception:
        v = None
    if v is not None and v.space == 1:
        raise invalid(argument + "[1]", "the NVFP4 global decode scale is taken by value", "a host number",
                      "a device array", "Pass float(global_scale): one explicit synchronisation, outside any "
                      "graph capture.")
    a = np.asarray(g, dtype=np.float32).reshape(-1)
    if a.size != 1:
        raise invalid(argument + "[1]", "the NVFP4 global decode scale is one number", "1 element", str(a.size))
    return _positive_finite_f32(float(a[0]), argument + "[1]")


def _positive_finite_f32(value: float, argument: str) -> float:
    with np.errstate(over="ignore"):
        f = np.float32(value)
    if not (np.isfinite(f) and f > 0):
        raise invalid(argument, "the NVFP4 global decode scale must be a positive finite float32",
                      "> 0 and at most 3.4e38", repr(value),
                      "Pass the global scalemm.quantize returned (amax / (448 * 6) of the source tensor).")
    return float(f)


# A validated call: `view` is A's (kind, device, stream), `a` and `b` the binding's operand tuples
# (data, dtype, recipe, scale, scale dtype, shape, strides, format, global).
GemmCall = namedtuple("GemmCall", "view m n k a b bias_ptr bias_keep")
GroupedCall = namedtuple("GroupedCall", "view dim sizes m n k a b out_shape")


def operands(a, b, scale_a, scale_b, recipe_a, recipe_b, scale_format, dtype_a, dtype_b, group_dim=None, groups=0,
             device_sizes=False):
    """Both operands of a dense call (group_dim None) or a grouped one (0: m-grouped, 1: k-grouped):
    every check the package makes of them, in one place and in this order: recipes and scale format;
    the arrays, their device and element types; the data shapes and the shared K; the scales.
    Returns (view of a, m, n, k, operand tuple of a, of b). The library then judges the scale tensors
    by its layout contract (the binding's make_args / make_grouped)."""
    ra = recipe_code(recipe_a, "recipe_a")
    rb = recipe_code(recipe_b, "recipe_b")
    fmt = choice(SCALE_FORMATS, scale_format, "scale_format", "scale format")
    va, vb = view(a, "a"), view(b, "b")
    if va.space != vb.space or va.kind != vb.kind or va.device != vb.device:
        raise invalid("b", "both operands live on the same device and are the same kind of array",
                      f"{va.kind} on {'device ' + str(va.device) if va.space else 'the host'}",
                      f"{vb.kind} on {'device ' + str(vb.device) if vb.space else 'the host'}")
    ta = _operand_dtype(va, ra, dtype_a, "a", "dtype_a")
    tb = _operand_dtype(vb, rb, dtype_b, "b", "dtype_b")
    if device_sizes and va.space == 0:
        raise invalid("group_sizes", "a call on host arrays takes its group sizes from the host",
                      "a list, tuple or host array of the G sizes", "device-side sizes",
                      "Pass the sizes on the host (e.g. sizes.tolist()).")
    m, ka = _data_shape(va, ta, "a", "M" if group_dim != 0 else "sum M_g")
    if group_dim == 0:
        if len(vb.shape) != 3:
            raise invalid("b", "m-grouped B holds one (N, K) operand per group", f"shape ({groups}, N, K)",
                          f"shape {vb.shape}")
        if vb.shape[0] != groups:
            raise invalid("b", "m-grouped B holds one (N, K) operand per group",
                          f"{groups} experts (len(group_sizes))", f"{vb.shape[0]}")
        if not vb.contiguous():
            raise invalid("b", "operand data must be row-major with K contiguous", "a contiguous (G, N, K) array",
                          f"strides {vb.strides}", "Call .contiguous() (torch) or numpy.ascontiguousarray.")
        n, kb = vb.shape[1], vb.shape[2] * (2 if tb == "e2m1x2" else 1)
    else:
        n, kb = _data_shape(vb, tb, "b", "N")
    if ka != kb:
        if group_dim is None:
            raise invalid("b", "A (M, K) and B (N, K) share K (D = A B^T)", f"K = {ka}", f"K = {kb}",
                          "B is given as (N, K), the weight of a linear layer; transpose a (K, N) B first.")
        what = "A (sum M_g, K) and B (G, N, K) share K" if group_dim == 0 else \
            "A (M, sum K_g) and B (N, sum K_g) share K"
        raise invalid("b", what, f"K = {ka}", f"K = {kb}")
    sa, ca, sha, sta, ga = _scale_operand(scale_a, ra, va.space, "scale_a")
    sb, cb, shb, stb, gb = _scale_operand(scale_b, rb, va.space, "scale_b")
    return (va, m, n, ka, (va.ptr, DTYPE_CODE[ta], ra, sa.ptr, ca, sha, sta, fmt, ga),
            (vb.ptr, DTYPE_CODE[tb], rb, sb.ptr, cb, shb, stb, fmt, gb))


def gemm_inputs(a, b, scale_a, scale_b, recipe_a, recipe_b, scale_format, bias, dtype_a, dtype_b) -> GemmCall:
    va, m, n, k, op_a, op_b = operands(a, b, scale_a, scale_b, recipe_a, recipe_b, scale_format, dtype_a, dtype_b)
    bias_ptr, bias_keep = 0, None
    if bias is not None:
        bias_keep = _bias_bf16(bias, va, n)
        bias_ptr = view(bias_keep, "bias").ptr
    return GemmCall(va, m, n, k, op_a, op_b, bias_ptr, bias_keep)


def _bias_bf16(bias, like: View, n: int):
    """bias as a contiguous bf16 [N] array (converted when given in another type: one small copy)."""
    v = view(bias, "bias")
    if v.space != like.space:
        raise invalid("bias", "bias lives with the operands", "device" if like.space else "host memory",
                      "device" if v.space else "host memory")
    if v.shape != (n,):
        raise invalid("bias", "bias has one value per output column", f"shape ({n},)", f"shape {v.shape}")
    if v.dtype == "bf16" and v.contiguous():
        return bias
    if v.kind == "numpy":
        from ._arrays import _np_dtype

        return np.ascontiguousarray(bias.astype(np.float32).astype(_np_dtype("bf16")))
    if v.kind in ("torch", "dlpack"):
        import torch

        return v.obj.to(torch.bfloat16).contiguous()
    raise invalid("bias", "bias of a CuPy/CUDA-array-interface call must be bf16 bits", "uint16 (bf16 bits)",
                  v.dtype)


# ---- public calls -------------------------------------------------------------------------------------

def scaled_mm(a, b, scale_a, scale_b, *, recipe_a, recipe_b, out_dtype="bf16", scale_format="compact", bias=None,
              backend="auto", dtype_a=None, dtype_b=None, fast_accum=False):
    """D (M, N) = A (M, K) . B (N, K)^T with each operand dequantized by its recipe's scales.

    a, b: FP8 (or packed FP4 for nvfp4) data, row-major with K contiguous; uint8 arrays need
    dtype_a/dtype_b. scale_a, scale_b: the recipe's scales in `scale_format` ("compact": the shapes
    quantizers produce; "cublaslt": the padded buffer cuBLASLt reads). NVFP4 takes
    (scales, global_decode_scale). Runs on the caller's current CUDA stream; host arrays run the
    host reference emulator. Returns D of the inputs' array type.

    fast_accum (tensorwise and rowwise operands only; torch's use_fast_accum): cuBLASLt's FP8 kernels
    may skip the periodic fp32 promotion of their partial sums: faster, less exact for long K. Other
    backends accumulate exactly; explain() says which applies. Block recipes refuse it by name.
    """
    fast_accum = flag(fast_accum, "fast_accum")
    return scaled_mm_impl(a, b, scale_a, scale_b, recipe_a, recipe_b, out_dtype, scale_format, bias, backend,
                           dtype_a, dtype_b, fast_accum=fast_accum)


def flag(value, argument: str) -> bool:
    if not isinstance(value, bool):
        raise invalid(argument, "a switch", "True or False", repr(value))
    return value


def is_torch_call(a) -> bool:
    # A torch.Tensor (or subclass) without importing torch, and without reading sys.modules: torch.compile
    # traces this, and a dict that other threads' imports change is not safe for it to iterate.
    return any(c.__name__ == "Tensor" and c.__module__ == "torch" for c in type(a).__mro__)


def scaled_mm_impl(a, b, scale_a, scale_b, recipe_a, recipe_b, out_dtype, scale_format, bias, backend, dtype_a,
                    dtype_b, out=None, fast_accum=False):
    od = choice(OUT_DTYPES, out_dtype, "out_dtype", "output dtype")
    h = handle(backend)
    va, m, n, k, op_a, op_b, bias_ptr, _keep = gemm_inputs(a, b, scale_a, scale_b, recipe_a, recipe_b, scale_format,
                                                            bias, dtype_a, dtype_b)
    d = empty(va, (m, n), od) if out is None else out
    with on_device(va), naming_backend(backend):
        h.gemm(m, n, k, op_a, op_b, view(d, "out").ptr, DTYPE_CODE[od], bias_ptr, 1.0, va.space, stream_of(va),
               fast_accum)
    return hand_back(va, d)


def explain(a, b, scale_a, scale_b, *, recipe_a, recipe_b, out_dtype="bf16", scale_format="compact", bias=None,
            backend="auto", dtype_a=None, dtype_b=None, group_sizes=None, group_dim="m",
            grouped_backend="auto", fast_accum=False) -> str:
    """The plan scaled_mm would run for these arguments (backend, why, conversions), without running it.

    Takes exactly scaled_mm's arguments and validates them the same way. With group_sizes (and
    group_dim, grouped_backend), scaled_grouped_mm's arguments instead: the grouped backend and, for
    the per-group one, the plan of each distinct group shape."""
    od = choice(OUT_DTYPES, out_dtype, "out_dtype", "output dtype")
    fast_accum = flag(fast_accum, "fast_accum")
    h = handle(backend)
    if group_sizes is not None:
        if bias is not None:
            raise invalid("bias", "grouped GEMMs take no bias", "None", "a bias array")
        va, dim, sizes, m, n, k, op_a, op_b, _shape = grouped_inputs(a, b, scale_a, scale_b, group_sizes, group_dim,
                                                                      recipe_a, recipe_b, scale_format, dtype_a,
                                                                      dtype_b)
        gb = choice(GROUPED_BACKENDS, grouped_backend, "grouped_backend", "grouped backend")
        with on_device(va), naming_backend(backend):  # planned for the arrays' device
            return h.explain_grouped(dim, *sizes_args(sizes), m, n, k, op_a, op_b, DTYPE_CODE[od], 1.0, va.space, gb,
                                     fast_accum)
    va, m, n, k, op_a, op_b, bias_ptr, _keep = gemm_inputs(a, b, scale_a, scale_b, recipe_a, recipe_b, scale_format,
                                                            bias, dtype_a, dtype_b)
    with on_device(va), naming_backend(backend):  # planned for the arrays' device
        _backend, text = h.explain(m, n, k, op_a, op_b, DTYPE_CODE[od], bias_ptr, 1.0, va.space, fast_accum)
    return text


GROUP_DIMS = {"m": 0, "k": 1}
# Which grouped backend runs a call (include/scalemm/grouped.hpp GroupedBackend).
GROUPED_BACKENDS = {"auto": 0, "cutlass": 1, "per-group": 2, "contiguous": 3}


class DeviceSizes:
    """Group sizes that live in device memory (a CUDA torch tensor or a __cuda_array_interface__
    array, int32 or int64): passed to the library by address and read on the device."""

    def __init__(self, ptr: int, count: int, int64: bool, owner):
        self.ptr, self.count, self.int64, self.owner = ptr, count, int64, owner


def _device_sizes(group_sizes):
    """DeviceSizes for a device-side sizes array, None for a host one."""
    if is_torch_call(group_sizes):
        if group_sizes.device.type == "cpu":
            return None
        dt = str(group_sizes.dtype)
        if dt not in ("torch.int32", "torch.int64"):
            raise invalid("group_sizes", "group sizes are integers", "an int32 or int64 tensor", dt)
        if group_sizes.dim() != 1 or not group_sizes.is_contiguous():
            raise invalid("group_sizes", "one size per group", "a contiguous 1-D tensor",
                          f"shape {tuple(group_sizes.shape)}, strides {tuple(group_sizes.stride())}")
        return DeviceSizes(group_sizes.data_ptr(), int(group_sizes.shape[0]), dt == "torch.int64", group_sizes)
    cai = getattr(group_sizes, "__cuda_array_interface__", None)
    if cai is None:
        return None
    typestr, shape, strides = cai.get("typestr"), tuple(cai.get("shape", ())), cai.get("strides")
    if typestr not in ("<i4", "<i8"):
        raise invalid("group_sizes", "group sizes are integers", "an int32 or int64 array", str(typestr))
    if len(shape) != 1 or (strides is not None and strides[0] != int(typestr[2])):
        raise invalid("group_sizes", "one size per group", "a contiguous 1-D array", f"shape {shape}")
    return DeviceSizes(int(cai["data"][0]), int(shape[0]), typestr == "<i8", group_sizes)


def group_size_list(group_sizes) -> list:
    """The G group sizes as Python ints: from a list/tuple of ints, a 1-D NumPy integer array or a host
    torch tensor (int32/int64). Device-side sizes are not read here (see _device_sizes)."""
    if is_torch_call(group_sizes):
        if group_sizes.device.type != "cpu":
            raise invalid("group_sizes", "host group sizes are read here", "a host array or list",
                          f"a tensor on {group_sizes.device}")
        if str(group_sizes.dtype) not in ("torch.int32", "torch.int64"):
            raise invalid("group_sizes", "group sizes are integers", "an int32 or int64 tensor", str(group_sizes.dtype))
        if group_sizes.dim() != 1:
            raise invalid("group_sizes", "one size per group", "a 1-D tensor", f"shape {tuple(group_sizes.shape)}")
        return [int(x) for x in group_sizes.tolist()]
    if isinstance(group_sizes, np.ndarray):
        if group_sizes.dtype.kind not in "iu":
            raise invalid("group_sizes", "group sizes are integers", "an int32 or int64 array", str(group_sizes.dtype))
        if group_sizes.ndim != 1:
            raise invalid("group_sizes", "one size per group", "a 1-D array", f"shape {group_sizes.shape}")
        return [int(x) for x in group_sizes]
    if isinstance(group_sizes, (list, tuple)):
        out = []
        for i, x in enumerate(group_sizes):
            if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
                raise invalid(f"group_sizes[{i}]", "group sizes are integers", "an int", repr(x))
            out.append(int(x))
        return out
    raise invalid("group_sizes", "the G group sizes",
                  "a list, tuple, 1-D NumPy integer array, or an int32/int64 torch tensor (host or device)",
                  type(group_sizes).__name__)


def grouped_inputs(a, b, scale_a, scale_b, group_sizes, group_dim, recipe_a, recipe_b, scale_format, dtype_a,
                    dtype_b) -> GroupedCall:
    """A grouped call validated: the sizes (a list of host integers or a DeviceSizes), then both
    operands (`operands`), and D's shape."""
    dim = choice(GROUP_DIMS, group_dim, "group_dim", 'grouped dimension ("m": row groups, MoE forward; "k": '
                  "weight gradient)")
    dev = _device_sizes(group_sizes)
    sizes = group_size_list(group_sizes) if dev is None else dev
    g = len(sizes) if dev is None else dev.count
    if g == 0:
        raise invalid("group_sizes", "a grouped GEMM needs at least one group", "G >= 1 sizes", "none")
    va, m, n, k, op_a, op_b = operands(a, b, scale_a, scale_b, recipe_a, recipe_b, scale_format, dtype_a, dtype_b,
                                       group_dim=dim, groups=g, device_sizes=dev is not None)
    return GroupedCall(va, dim, sizes, m, n, k, op_a, op_b, (m, n) if dim == 0 else (g, m, n))


def sizes_args(sizes):
    """The binding's (host sizes, device address, int64, G) for host or device-side sizes."""
    if isinstance(sizes, DeviceSizes):
        return [], sizes.ptr, sizes.int64, sizes.count
    return sizes, 0, False, len(sizes)


def grouped_out_shape(a_shape, b_shape, groups: int, group_dim: str):
    """D's shape by the contract: m-grouped (sum M_g, N), k-grouped (G, M, N)."""
    return (a_shape[0], b_shape[1]) if group_dim == "m" else (groups, a_shape[0], b_shape[0])


def scaled_grouped_mm(a, b, scale_a, scale_b, group_sizes, *, group_dim="m", recipe_a, recipe_b, out_dtype="bf16",
                      scale_format="compact", backend="auto", dtype_a=None, dtype_b=None, grouped_backend="auto",
                      fast_accum=False):
    """Grouped (MoE) scaled GEMM: many GEMMs of one recipe pair (include/scalemm/grouped.hpp).

    group_dim="m" (MoE forward, dgrad): a (sum M_g, K) with group g's rows consecutive, b (G, N, K),
    D (sum M_g, N). group_dim="k" (weight gradient): a (M, sum K_g), b (N, sum K_g), D (G, M, N) with
    D[g] = A[:, K_g columns] B[:, K_g columns]^T; every K_g on the K-block boundary of both recipes.
    group_sizes: the G sizes M_g or K_g on the host (list, tuple, NumPy or CPU torch integer array), or
    on the device (a CUDA int32/int64 tensor, e.g. the router's counts): read on the GPU by the CUTLASS
    grouped kernel with no host synchronisation (blockwise FP8, bf16 out; see explain()); other calls
    copy them to the host first. Empty groups are allowed. Scales: m-grouped A is each group's scale buffer concatenated in group
    order, B the experts' buffers stacked (G, ...); k-grouped A and B are the whole tensors' scales;
    in "cublaslt" format each group's buffer is zero-padded to a multiple of 16 bytes. Any
    contiguous array of the right byte size is accepted (a flat 1-D buffer is simplest). NVFP4
    takes (scales, global) with one global decode scale per operand.
    grouped_backend: "auto" runs one launch for all groups where a kernel can: scalemm's own Hopper
    kernel ("contiguous": m-grouped block1x128 x block128x128, compact scales or cuBLASLt-format B
    scales (A's too with one group), e4m3, bf16 out, sm_90;
    no set-up launch, no workspace; bit-identical to the CUTLASS kernel and measured as fast or
    faster on every MoE shape), else a CUTLASS grouped kernel
    ("cutlass": block1x128 A with block128x128 or block1x128 B, or rowwise x rowwise; e4m3, bf16 out,
    sm_90) where the groups are not large (host sizes averaging >= 2048 rows blockwise or > 512
    rowwise measured faster per group), else "per-group", where each group runs the dense planner
    (`backend` forces it as in scaled_mm), so a group's rows are bit-identical to scaled_mm on that
    group.
    "cutlass", "contiguous" or "per-group" insist (UnsupportedError when the chosen one cannot run the
    call).
    fast_accum: as for scaled_mm (rowwise on the CUTLASS kernel: its fast-accumulation mainloop; on the
    per-group backend: cuBLASLt's FAST_ACCUM).
    """
    fast_accum = flag(fast_accum, "fast_accum")
    return scaled_grouped_mm_impl(a, b, scale_a, scale_b, group_sizes, group_dim, recipe_a, recipe_b, out_dtype,
                                   scale_format, backend, dtype_a, dtype_b, grouped_backend, fast_accum)


def scaled_grouped_mm_impl(a, b, scale_a, scale_b, group_sizes, group_dim, recipe_a, recipe_b, out_dtype,
                            scale_format, backend, dtype_a, dtype_b, grouped_backend="auto", fast_accum=False):
    od = choice(OUT_DTYPES, out_dtype, "out_dtype", "output dtype")
    gb = choice(GROUPED_BACKENDS, grouped_backend, "grouped_backend", "grouped backend")
    h = handle(backend)
    va, dim, sizes, m, n, k, op_a, op_b, out_shape = grouped_inputs(a, b, scale_a, scale_b, group_sizes, group_dim,
                                                                     recipe_a, recipe_b, scale_format, dtype_a,
                                                                     dtype_b)
    d = empty(va, out_shape, od)
    from ._arrays import ptr_of

    with on_device(va), naming_backend(backend):
        h.grouped_gemm(dim, *sizes_args(sizes), m, n, k, op_a, op_b, ptr_of(d), DTYPE_CODE[od], 1.0, va.space, gb,
                       stream_of(va), fast_accum)
    return hand_back(va, d)


def _source(x, argument: str):
    v = view(x, argument)
    if v.dtype not in ("f32", "bf16", "f16"):
        raise invalid(argument, "the source of a quantization is high precision", "float32, bfloat16 or "
                      "float16", v.dtype, "Convert it (x.float()).")
    if len(v.shape) != 2:
        raise invalid(argument, "a 2-D (rows, K) array is quantized along its last dimension", "rank 2",
                      f"shape {v.shape}", "Reshape it to (-1, K).")
    if not v.contiguous():
        raise invalid(argument, "source must be row-major contiguous", f"strides ({v.shape[1]}, 1)",
                      f"strides {v.strides}", "Call .contiguous() (torch) or numpy.ascontiguousarray.")
    return v


def quantize(x, recipe, *, dtype="e4m3", scale_format="compact", _columnwise=False):
    """Quantizes a (rows, K) float32/bfloat16/float16 array along K: returns (data, scales).

    data: (rows, K) FP8 (dtype "e4m3" or "e5m2"), or for nvfp4 (rows, K/2) packed E2M1 (dtype is
    ignored: E2M1 is nvfp4's only type). scales: in `scale_format`; for nvfp4 the pair
    (block_scales, global_decode_scale), the global a float for host arrays and a 0-d float32 device
    tensor for device arrays (no synchronisation; scaled_mm wants float() of it).
    The library's quantizers (amax scaling; MX: E8M0 round-up; NVFP4: the two-level recipe) run on the
    array's device, on the current stream.
    """
    return quantize_impl(x, recipe, dtype, scale_format, _columnwise)


def quantize_impl(x, recipe, dtype, scale_format, _columnwise):
    r = recipe_code(recipe, "recipe")
    fmt = choice(SCALE_FORMATS, scale_format, "scale_format", "scale format")
    v = _source(x, "x")
    rows, k = v.shape
    nvfp4 = LAYOUTS[r].packed_fp4  # and two_level: packed E2M1 data with a global decode scale
    if nvfp4:
        dt = "e2m1x2"
        if k % 2:
            raise invalid("x", "nvfp4 packs two values per byte", "an even K", str(k))
    else:
        dt = choice({"e4m3": "e4m3", "float8_e4m3fn": "e4m3", "e5m2": "e5m2", "float8_e5m2": "e5m2"}, dtype,
                     "dtype", "FP8 data type")
    data = empty(v, (rows, k // 2 if nvfp4 else k), dt)
    sdt = scale_dtype_name(r)
    scales = empty(v, scale_shape(r, rows, k, fmt), sdt)
    data_t = scales_t = None
    if _columnwise:
        data_t = empty(v, (k, rows // 2 if nvfp4 else rows), dt)
        scales_t = empty(v, scale_shape(r, k, rows, fmt), sdt)
    glob = empty(v, (), "f32") if nvfp4 else None
    from ._arrays import ptr_of

    with on_device(v):
        _C.quantize(v.ptr, DTYPE_CODE[v.dtype], rows, k, r, DTYPE_CODE[dt], fmt, ptr_of(data),
                    ptr_of(scales), ptr_of(data_t) if data_t is not None else 0,
                    ptr_of(scales_t) if scales_t is not None else 0, ptr_of(glob) if glob is not None else 0,
                    v.space, stream_of(v))
    if nvfp4:
        g = float(glob) if v.space == 0 else hand_back(v, glob)
        scales = (hand_back(v, scales), g)
        if _columnwise:
            scales_t = (hand_back(v, scales_t), g)
    else:
        scales = hand_back(v, scales)
    out = (hand_back(v, data), scales)
    if _columnwise:
        out = out + (hand_back(v, data_t), scales_t if nvfp4 else hand_back(v, scales_t))
    return out


def dequantize(data, scales, recipe, *, dtype=None, scale_format="compact", out_dtype="f32"):
    """The values a quantized operand stands for: (rows, K) of out_dtype ("f32", "bf16", "f16").

    data and scales as scaled_mm takes one operand (uint8 data needs dtype; nvfp4 scales are
    (block_scales, global_decode_scale))."""
    r = recipe_code(recipe, "recipe")
    fmt = choice(SCALE_FORMATS, scale_format, "scale_format", "scale format")
    od = choice(OUT_DTYPES, out_dtype, "out_dtype", "output dtype")
    v = view(data, "data")
    t = _operand_dtype(v, r, dtype, "data", "dtype")
    rows, k = _data_shape(v, t, "data", "rows")
    glob = None
    two_level = LAYOUTS[r].two_level
    if two_level and not (isinstance(scales, tuple) and len(scales) == 2):
        raise pair_refused("scales", scales)
    if two_level:
        scales, g = scales
        gv = None
        try:
            gv = view(g, "scales[1]")
        except Exception:
            pass
        if gv is not None and gv.space == v.space and len(gv.shape) <= 1 and gv.dtype == "f32":
            glob = g  # already an f32 in the right memory space: read in place, no synchronisation
        else:
            val = np.float32(global_value(g, "scales"))
            if v.space == 0:
                glob = np.array([val], dtype=np.float32)
            else:
                glob = empty(v, (1,), "f32")
                glob.fill_(float(val)) if hasattr(glob, "fill_") else glob.fill(val)
    sv = view(scales, "scales")
    if sv.space != v.space:
        raise invalid("scales", "scales live with the data", "device" if v.space else "host memory",
                      "device" if sv.space else "host memory")
    code = scale_code(sv, r, "scales", check=False)  # the library names a wrong type with its layout rule
    shape, strides = (sv.shape, sv.strides) if sv.shape else ((1,), (1,))
    out = empty(v, (rows, k), od)
    from ._arrays import ptr_of

    with on_device(v):
        _C.dequantize(v.ptr, DTYPE_CODE[t], r, rows, k, sv.ptr, code, list(shape), list(strides), fmt,
                      ptr_of(glob) if glob is not None else 0, ptr_of(out), DTYPE_CODE[od], v.space, stream_of(v))
    return hand_back(v, out)
