"""scalemm for JAX: the library's ops inside jax.jit, grad, vmap and sharded programs (XLA FFI).

    data, scales = scalemm.jax.quantize(x, "block1x128")
    d = scalemm.jax.scaled_mm(a, b, sa, sb, recipe_a="block1x128", recipe_b="block128x128")
    nn.Dense(4096, dot_general=scalemm.jax.fp8_dot_general("blockwise"))

Same names and semantics as scalemm.torch. Every call is checked when it is traced, with the library's
named errors (nothing runs for a refused call); it then runs as an XLA custom call: on the GPU on XLA's
stream, on the CPU through the library's host path (the reference emulator), bit for bit what
scalemm.scaled_mm gives on NumPy arrays. See docs/jax.md.
"""

from __future__ import annotations

from .._errors import UnsupportedError

# jaxlib releases whose XLA FFI (API 0.x, not ABI-stable) the handlers are known to work with.
SUPPORTED_JAXLIB = ((0, 10), (0, 12))  # [low, high)


class JaxUnavailableError(UnsupportedError, ImportError):
    """scalemm.jax cannot be used with this installation (no jax, an unsupported jaxlib, or an extension
    built without the XLA FFI handlers); the message says how to fix it."""


def _version(v: str):
    return tuple(int(p) for p in v.split(".")[:2])


def _check_install():
    try:
        import jax  # noqa: F401
        import jaxlib
    except ImportError as e:
        raise JaxUnavailableError(f"scalemm.jax: jax is not importable ({e}): expected jax and jaxlib "
                                  f">={'.'.join(map(str, SUPPORTED_JAXLIB[0]))},<"
                                  f"{'.'.join(map(str, SUPPORTED_JAXLIB[1]))}, got none. Fix: pip install "
                                  "'jax>=0.10,<0.12' (jax[cuda13] for GPUs), then reinstall scalemm so that its "
                                  "extension is built with the XLA FFI handlers.") from None
    have = _version(jaxlib.__version__)
    if not SUPPORTED_JAXLIB[0] <= have < SUPPORTED_JAXLIB[1]:
        raise JaxUnavailableError(f"scalemm.jax: unsupported jaxlib: expected >=0.10,<0.12, got {jaxlib.__version__}. "
                                  "Fix: pip install 'jax>=0.10,<0.12' (XLA's FFI is not ABI-stable across "
                                  "releases), then reinstall scalemm.")
    from .. import _scalemm as C

    if not hasattr(C, "ffi_targets"):
        raise JaxUnavailableError(f"scalemm.jax: {getattr(C, 'ffi_unavailable', 'no XLA FFI handlers in the extension')}: "
                                  "expected an extension built with jaxlib's FFI headers, got one without them. Fix: "
                                  "pip install 'jax>=0.10,<0.12', then reinstall scalemm (pip install "
                                  "--no-build-isolation ./python): its build takes the headers from "
                                  "jax.ffi.include_dir().")
    built = C.ffi_api_version()[2]
    if _version(built) != have:
        raise JaxUnavailableError(f"scalemm.jax: the extension's XLA FFI handlers were compiled against jaxlib {built}: "
                                  f"expected the same jaxlib release at run time, got {jaxlib.__version__}. Fix: "
                                  "reinstall scalemm with this jaxlib installed.")


_check_install()

from ._ops import dequantize, quantize, scaled_grouped_mm, scaled_mm  # noqa: E402
from ._dense import LINEAR_RECIPES, fp8_dot_general  # noqa: E402

__all__ = ["quantize", "dequantize", "scaled_mm", "scaled_grouped_mm", "fp8_dot_general", "LINEAR_RECIPES",
           "JaxUnavailableError", "SUPPORTED_JAXLIB"]
