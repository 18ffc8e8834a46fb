"""Array adapters: read address, shape, strides, element type and memory space off the caller's
arrays without copying them, and allocate outputs of the same kind.

Kinds: "numpy" (host), "torch" (CPU or CUDA), "cupy", "cai" (anything else with
``__cuda_array_interface__``) and "dlpack" (anything else with ``__dlpack__``, e.g. JAX, viewed
through torch.from_dlpack without a copy and handed back through its own ``from_dlpack``).

Element types use the library's names, plus "e2m1x2" (two packed FP4 values per byte, as torch's
float4_e2m1fn_x2) and "e2m1-unpacked" (ml_dtypes.float4_e2m1fn, one value per byte: refused).
"""

from __future__ import annotations

import contextlib
import sys

import numpy as np

from ._errors import invalid

# Library DType values (types.hpp; fixed by the C ABI).
DTYPE_CODE = {"f32": 0, "f16": 1, "bf16": 2, "e4m3": 3, "e5m2": 4, "e2m1": 5, "e8m0": 6, "ue4m3": 7, "u8": 8,
              "e2m1x2": 5}

_NUMPY_NAMES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "uint8": "u8", "float8_e4m3fn": "e4m3",
                "float8_e5m2": "e5m2", "float8_e8m0fnu": "e8m0", "float4_e2m1fn": "e2m1-unpacked",
                "float64": "f64", "int8": "i8", "uint16": "u16", "int32": "i32", "int64": "i64"}


def _np_dtype(name: str):
    """NumPy dtype for a library element type (ml_dtypes for bf16/FP8/E8M0; raw uint8 for packed FP4
    and UE4M3, which ml_dtypes has no packed/unsigned form of)."""
    import ml_dtypes

    return {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn,
            "e5m2": ml_dtypes.float8_e5m2, "e8m0": ml_dtypes.float8_e8m0fnu, "e2m1x2": np.uint8,
            "ue4m3": np.uint8, "u8": np.uint8}[name]


_torch_names = None


def torch_names():
    """torch.dtype -> element type name (only the dtypes the installed torch has)."""
    global _torch_names
    if _torch_names is None:
        import torch

        m = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.uint8: "u8",
             torch.float64: "f64", torch.int8: "i8", torch.int32: "i32", torch.int64: "i64"}
        for attr, name in (("float8_e4m3fn", "e4m3"), ("float8_e5m2", "e5m2"), ("float8_e8m0fnu", "e8m0"),
                           ("float4_e2m1fn_x2", "e2m1x2")):
            if hasattr(torch, attr):
                m[getattr(torch, attr)] = name
        _torch_names = m
    return _torch_names


def torch_dtype(name: str):
    import torch

    alt = {"e8m0": "float8_e8m0fnu", "e2m1x2": "float4_e2m1fn_x2"}
    if name in alt:  # older torch: raw bytes
        return getattr(torch, alt[name], torch.uint8)
    return {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn,
            "e5m2": torch.float8_e5m2, "ue4m3": torch.float8_e4m3fn, "u8": torch.uint8}[name]


class View:
    """What scalemm needs to know about one array. strides count elements of the array's own type."""

    __slots__ = ("kind", "obj", "ptr", "shape", "strides", "dtype", "space", "device", "owner")

    def __init__(self, kind, obj, ptr, shape, strides, dtype, space, device, owner=None):
        self.kind, self.obj, self.ptr, self.shape, self.strides = kind, obj, ptr, shape, strides
        self.dtype, self.space, self.device, self.owner = dtype, space, device, owner

    def contiguous(self) -> bool:
        if 0 in self.shape:  # no elements: any strides (NumPy and torch report 0 or arbitrary ones)
            return True
        expect = 1
        for n, s in zip(reversed(self.shape), reversed(self.strides)):
            if n != 1 and s != expect:
                return False
            expect *= n
        return True


def _is_torch(x) -> bool:
    t = sys.modules.get("torch")
    return t is not None and isinstance(x, t.Tensor)


def _cai_dtype(typestr: str, argument: str) -> str:
    m = {"<f4": "f32", "<f2": "f16", "|u1": "u8", "<u1": "u1", "|i1": "i8", "<u2": "u16", "<f8": "f64"}
    if typestr not in m:
        raise invalid(argument, "unsupported element type", "float32, float16 or uint8", typestr)
    return m[typestr] if m[typestr] != "u1" else "u8"


def _native_byte_order(dtype, argument: str):
    """Arrays are read as raw bytes: a float32 '>f4' scale of 1.0 would be taken as 4.6e-41. Refused,
    not converted, because a converted copy would no longer be the caller's array (its address is what
    the library reads, and an output would not land in it)."""
    if dtype.byteorder == ">" or (dtype.byteorder == "<" and sys.byteorder == "big"):
        raise invalid(argument, "array elements must be in the machine's byte order", f"{dtype.name} "
                      f"({sys.byteorder}-endian, dtype '{dtype.newbyteorder('=').str}')",
                      f"dtype '{dtype.str}' (the other byte order)",
                      "Convert it: x.astype(x.dtype.newbyteorder('=')).")


def view(x, argument: str) -> View:
    """A View of x, or InvalidArgumentError naming `argument` for anything that is not an array."""
    if _is_torch(x):
        names = torch_names()
        dt = names.get(x.dtype)
        if dt is None:
            raise invalid(argument, "unsupported torch dtype", "float32/float16/bfloat16/float8/float4/uint8",
                          str(x.dtype))
        cuda = x.is_cuda
        if not cuda and x.device.type != "cpu":
            raise invalid(argument, "tensor on an unsupported device", "cpu or cuda", str(x.device))
        return View("torch", x, x.data_ptr(), tuple(x.shape), tuple(x.stride()), dt, 1 if cuda else 0,
                    x.get_device() if cuda else None)
    if isinstance(x, np.ndarray):
        _native_byte_order(x.dtype, argument)
        dt = _NUMPY_NAMES.get(x.dtype.name, x.dtype.name)
        item = x.dtype.itemsize
        strides = tuple(s // item for s in x.strides)
        return View("numpy", x, x.ctypes.data if x.size else 0, tuple(x.shape), strides, dt, 0, None)
    mod = type(x).__module__.split(".")[0]
    if mod == "cupy":
        _native_byte_order(x.dtype, argument)
        dt = _NUMPY_NAMES.get(x.dtype.name, x.dtype.name)
        item = x.dtype.itemsize
        return View("cupy", x, x.data.ptr, tuple(x.shape), tuple(s // item for s in x.strides), dt, 1, x.device.id)
    if mod == "jax" and any(c.__name__ == "Tracer" for c in type(x).__mro__):
        # A traced JAX value has no memory to hand over; the FFI path runs the same ops inside jit.
        raise invalid(argument, "a JAX value being traced (inside jax.jit, grad or vmap)", "a concrete array",
                      type(x).__name__, "Inside jax.jit use scalemm.jax (scaled_mm, scaled_grouped_mm, quantize, "
                      "fp8_dot_general): the same ops through XLA's FFI (docs/jax.md).")
    if hasattr(x, "__dlpack__") and mod not in ("numpy",):
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None:
            t = torch.from_dlpack(x)  # zero copy; synchronises with torch's current stream by protocol
            v = view(t, argument)
            v.kind, v.owner = "dlpack", mod
            return v
    if hasattr(x, "__cuda_array_interface__"):
        ci = x.__cuda_array_interface__
        dt = _cai_dtype(ci["typestr"], argument)
        item = int(ci["typestr"][2:])
        shape = tuple(ci["shape"])
        if ci.get("strides") is None:
            strides, acc = [], 1
            for n in reversed(shape):
                strides.insert(0, acc)
                acc *= n
            strides = tuple(strides)
        else:
            strides = tuple(s // item for s in ci["strides"])
        return View("cai", x, ci["data"][0], shape, strides, dt, 1, None, owner=ci.get("stream"))
    if np.isscalar(x) or isinstance(x, (list, tuple)):
        raise invalid(argument, "an array is expected", "a NumPy array, a torch tensor or a DLPack/CUDA array",
                      type(x).__name__, "Wrap Python numbers and lists with numpy.asarray(..., dtype=...).")
    raise invalid(argument, "unsupported array type", "NumPy, torch, CuPy, or an object with __dlpack__ or "
                  "__cuda_array_interface__", type(x).__name__)


def on_device(v: View):
    """A context with the array's device current, for a call on several-GPU machines: the library runs
    on the stream's device, and the default stream of a framework is the current device's."""
    if v.space == 0 or v.device is None:
        return contextlib.nullcontext()
    if v.kind in ("torch", "dlpack"):
        import torch

        return torch.cuda.device(v.device)
    if v.kind == "cupy":
        import cupy

        return cupy.cuda.Device(v.device)
    return contextlib.nullcontext()


def stream_of(v: View) -> int:
    """The caller's current stream for a device array (0 = the legacy default stream)."""
    if v.space == 0:
        return 0
    if v.kind in ("torch", "dlpack"):
        import torch

        get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        return get(v.device) if get is not None else torch.cuda.current_stream(v.device).cuda_stream
    if v.kind == "cupy":
        import cupy

        return cupy.cuda.get_current_stream().ptr
    s = v.owner  # __cuda_array_interface__ v3: 1 = legacy default, 2 = per-thread default
    return 0 if s in (None, 1) else s


def empty(like: View, shape: tuple, dtype: str, what: str = "the output"):
    """A new array of the same kind and device as `like`. A device that has no room for it raises
    scalemm.OutOfMemoryError naming `what` and its size (the framework's own error is its cause)."""
    if like.kind in ("torch", "dlpack"):
        import torch

        try:
            return torch.empty(shape, dtype=torch_dtype(dtype), device=like.obj.device)
        except torch.OutOfMemoryError as e:
            raise _out_of_memory(what, shape, dtype, like.obj.device) from e
    if like.kind == "numpy":
        return np.empty(shape, dtype=_np_dtype(dtype))
    import cupy

    # CuPy has no bfloat16 or FP8 types: those come back as their raw bits.
    cp = {"f32": cupy.float32, "f16": cupy.float16, "bf16": cupy.uint16}.get(dtype, cupy.uint8)
    with cupy.cuda.Device(like.device if like.device is not None else cupy.cuda.Device().id):
        try:
            return cupy.empty(shape, dtype=cp)
        except cupy.cuda.memory.OutOfMemoryError as e:
            raise _out_of_memory(what, shape, dtype, f"cuda:{like.device}") from e


def _out_of_memory(what: str, shape: tuple, dtype: str, device):
    from ._errors import OutOfMemoryError

    count = 1
    for n in shape:
        count *= int(n)
    item = {"f32": 4, "f16": 2, "bf16": 2}.get(dtype, 1)
    return OutOfMemoryError(f"{what}: cannot allocate {count * item} bytes ({dtype}{list(shape)}) on {device}; "
                            "nothing was written and the handle stays usable. Free memory (or raise the "
                            "framework's memory limit) and call again.")


def hand_back(like: View, out):
    """Output in the caller's own array type (DLPack producers get theirs back, without a copy)."""
    if like.kind == "dlpack":
        if like.owner in ("jax", "jaxlib"):
            import jax.numpy as jnp

            return jnp.from_dlpack(out)
    return out


def ptr_of(x) -> int:
    if _is_torch(x):
        return x.data_ptr()
    if isinstance(x, np.ndarray):
        return x.ctypes.data
    if type(x).__module__.split(".")[0] == "cupy":
        return x.data.ptr
    return x.__cuda_array_interface__["data"][0]
