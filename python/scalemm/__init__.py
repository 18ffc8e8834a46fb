"""scalemm: low-precision scaled matrix multiplication (FP8/FP4 data with scale tensors).

    D = scalemm.scaled_mm(a, b, scale_a, scale_b, recipe_a="block1x128", recipe_b="block128x128")

Arrays in, arrays out, zero copies: NumPy (host reference emulator), PyTorch, CuPy, and anything with
DLPack or __cuda_array_interface__ (device: the caller's current stream). See docs/python.md.
"""

from . import _errors
from ._errors import (CublasError, CudaError, Error, GroupedGemmNotImplementedError, InternalError,
                      InvalidArgumentError, InvalidLayoutError, IoError, OutOfMemoryError, UnsupportedError,
                      VerificationFailedError)
from . import _scalemm

_scalemm.set_error_classes([Error] + _errors.BY_CODE[1:])

from ._core import dequantize, explain, quantize, scaled_grouped_mm, scaled_mm  # noqa: E402
from . import layouts  # noqa: E402

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
