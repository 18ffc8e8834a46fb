"""scalemm: low-precision scaled matrix multiplication (FP8/FP4 data with scale tensors).

    D = scalemm.scaled_mm(a, b, scale_a, scale_b, recipe_a="block1x128", recipe_b="block128x128")

Arrays in, arrays out, zero copies: NumPy (host reference emulator), PyTorch, CuPy, and anything with
DLPack or __cuda_array_interface__ (device: the caller's current stream). See docs/python.md.
"""

from . import _errors
from ._errors import (CublasError, CudaError, Error, GroupedGemmNotImplementedError, InternalError,
                      InvalidArgumentError, InvalidLayoutError, IoError, OutOfMemoryError, UnsupportedError,
                      VerificationFailedError)

def _preload_cuda_libraries(extra_dirs=()):
    """Loads libcudart/libcublasLt from the pip-installed NVIDIA packages (the copies torch uses) or
    from `extra_dirs`, so that the extension and torch share one copy whichever is imported first."""
    import ctypes
    import glob
    import importlib.util
    import os

    dirs = list(extra_dirs)
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    for base in (spec.submodule_search_locations or []) if spec else []:
        dirs += [os.path.join(base, sub, "lib") for sub in ("cu13", "cu12", "cuda_runtime", "cublas")]
    for name in ("libcudart.so.*[0-9]", "libcublasLt.so.*[0-9]"):
        for d in dirs:
            found = sorted(glob.glob(os.path.join(d, name)))
            if found:
                try:
                    ctypes.CDLL(found[0], mode=ctypes.RTLD_GLOBAL)
                    break
                except OSError:
                    pass


def _no_extension_here():
    """The ImportError for a package folder that holds no compiled _scalemm module: the source folder
    (python/scalemm) imported instead of the installed package, when Python runs from inside python/ or
    PYTHONPATH names it. Said so, because the CUDA-library advice would send the user the wrong way."""
    import importlib.machinery
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    if any(f.startswith("_scalemm") and f.endswith(tuple(suffixes)) for f in os.listdir(here)):
        return None
    return ImportError(f"scalemm: {here} holds no compiled extension (_scalemm{suffixes[0]}): this is the source "
                       "folder, which shadows an installed scalemm when Python runs from inside python/ or "
                       "PYTHONPATH names it. Run Python from another folder (the installed package is then "
                       "imported), or build the extension into this folder (tools/quickstart.sh)")


_preload_cuda_libraries()
try:
    from . import _scalemm
except ImportError as e:  # the CUDA libraries are not on the loader path: try the toolkit's
    # (An editable install finds the module elsewhere: the folder is judged only after a failure.)
    _missing = _no_extension_here()
    if _missing is not None:
        raise _missing from e
    import os as _os

    _home = _os.environ.get("CUDA_HOME") or _os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    _preload_cuda_libraries([_os.path.join(_home, "lib64"), _os.path.join(_home, "lib")])
    try:
        from . import _scalemm
    except ImportError:
        raise ImportError(f"scalemm: the extension could not be loaded ({e}); it needs the CUDA runtime and "
                          "cuBLASLt libraries (libcudart, libcublasLt) of the CUDA major version it was built "
                          "with: add their folder to LD_LIBRARY_PATH or set CUDA_HOME") from e

_scalemm.set_error_classes([Error] + _errors.BY_CODE[1:])

import functools as _functools  # noqa: E402

from . import _core  # noqa: E402
from ._core import dequantize, explain  # noqa: E402
from . import layouts  # noqa: E402

# The calls take NumPy, CuPy, DLPack and torch arrays. Torch tensors go to scalemm.torch (custom ops
# under tracing, prepared calls when eager), imported on the first one; everything else to _core.
# Routing lives here, above both, so that neither module imports the other's caller.
_torch_entry = None  # (torch.Tensor, scalemm.torch) once a torch tensor has been seen


def _torch_layer(a):
    t = _torch_entry
    if t is None and _core.is_torch_call(a):
        t = _load_torch_entry()
    return t[1] if t is not None and isinstance(a, t[0]) else None


def _load_torch_entry():
    global _torch_entry
    import torch

    from . import torch as st

    _torch_entry = (torch.Tensor, st)
    return _torch_entry


@_functools.wraps(_core.scaled_mm)
def scaled_mm(a, b, scale_a, scale_b, **kwargs):
    st = _torch_layer(a)
    return (st.scaled_mm if st is not None else _core.scaled_mm)(a, b, scale_a, scale_b, **kwargs)


@_functools.wraps(_core.scaled_grouped_mm)
def scaled_grouped_mm(a, b, scale_a, scale_b, group_sizes, **kwargs):
    st = _torch_layer(a)
    return (st.scaled_grouped_mm if st is not None else _core.scaled_grouped_mm)(a, b, scale_a, scale_b, group_sizes,
                                                                               **kwargs)


@_functools.wraps(_core.quantize)
def quantize(x, recipe, *, dtype="e4m3", scale_format="compact", _columnwise=False):
    st = _torch_layer(x)
    if st is not None:
        return st.quantize(x, recipe, dtype=dtype, scale_format=scale_format, columnwise=_columnwise)
    return _core.quantize(x, recipe, dtype=dtype, scale_format=scale_format, _columnwise=_columnwise)


__version__ = _scalemm.version()
RECIPES = ("tensorwise", "rowwise", "block1x128", "block128x128", "mxfp8", "mxfp8-32x32", "nvfp4")


def device() -> str:
    """The device scalemm plans for: "sm_90 (NVIDIA H100 ..., 132 SMs), cuBLASLt 13.1.0", or one
    without a GPU (then device arrays are refused and host arrays run the reference emulator)."""
    return _scalemm.device()[1]


def has_gpu() -> bool:
    return _scalemm.device()[0] > 0


def __getattr__(name):
    if name == "torch":  # scalemm.torch imports torch: only on first use
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'scalemm' has no attribute {name!r}")


__all__ = ["scaled_mm", "scaled_grouped_mm", "quantize", "dequantize", "explain", "layouts", "Error",
           "InvalidArgumentError", "InvalidLayoutError", "UnsupportedError", "CudaError", "CublasError",
           "OutOfMemoryError", "VerificationFailedError", "IoError", "InternalError",
           "GroupedGemmNotImplementedError", "device", "has_gpu", "RECIPES"]
