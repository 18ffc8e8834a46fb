"""The GEMM custom ops and their eager fast paths:

    torch.ops.scalemm.scaled_mm          D = A B^T
    torch.ops.scalemm.scaled_grouped_mm  the grouped (MoE) GEMM, group sizes as a list of ints in the graph
                                         (or a device tensor read by the kernel)

scaled_mm and scaled_grouped_mm call the op while anything traces (torch.compile, tensor subclasses,
dispatch modes) and go straight to a prepared library call otherwise. The op bodies themselves, which a
compiled graph calls at run time on real tensors, take the same prepared paths (_fast, _fast_grouped):
both ops are symmetric, so a compiled step pays the host cost of an eager one, not a full validation
per call. The fake implementations compute output shapes from the scale-layout contract, so
torch.compile(fullgraph=True) traces them without graph breaks.
"""

from __future__ import annotations

from typing import List, Optional

import torch

from .. import _core
from .._arrays import DTYPE_CODE
from ._runtime import _OUT, BoundedLRU, _dispatch_modes, _is_compiling, _out_name, _stream

# ---- scaled_mm ------------------------------------------------------------------------------------------

@torch.library.custom_op("scalemm::scaled_mm", mutates_args=())
def _scaled_mm_op(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, recipe_a: str,
                  recipe_b: str, out_dtype: str, scale_format: str, bias: Optional[torch.Tensor], backend: str,
                  dtype_a: Optional[str], dtype_b: Optional[str], global_a: float,
                  global_b: float, fast_accum: bool = False) -> torch.Tensor:
    """Runs on real tensors (eager dispatch, or a compiled graph at run time) through the prepared path;
    nvfp4 pairs and biases that need converting fall to the general call there."""
    sa = (scale_a, global_a) if recipe_a == "nvfp4" else scale_a
    sb = (scale_b, global_b) if recipe_b == "nvfp4" else scale_b
    return _fast(a, b, sa, sb, recipe_a, recipe_b, out_dtype, scale_format, bias, backend, dtype_a, dtype_b, False,
                 fast_accum)


@_scaled_mm_op.register_fake
def _(a, b, scale_a, scale_b, recipe_a, recipe_b, out_dtype, scale_format, bias, backend, dtype_a, dtype_b,
      global_a, global_b, fast_accum=False):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=_OUT[_out_name(out_dtype)])


def _split_global(s, recipe, argument):
    if isinstance(s, tuple) and len(s) == 2:
        g = s[1]
        if isinstance(g, torch.Tensor):
            if g.is_cuda:
                # Same rule as the eager path: the library takes it by value.
                _core.global_value(g, "scale")
            g = float(g)
        return s[0], float(g)
    if recipe == "nvfp4":  # the eager path refuses a bare nvfp4 scale in _core; so does the op path
        raise _core.pair_refused(argument, s)
    return s, 1.0


# The prepared calls of each signature: (Prepared.run, output shape, dtype, device, device index).
_prepared = BoundedLRU()


def _fast(a, b, scale_a, scale_b, recipe_a, recipe_b, out_dtype, scale_format, bias, backend, dtype_a, dtype_b,
          traced=True, fast_accum=False):
    """The eager path for torch tensors (and, with traced, the custom op while tracing: see scaled_mm):
    the first call of a signature validates everything and prepares the library call (Handle.prepare);
    later calls read six addresses, allocate D through torch and run. The cache key holds what the
    validation depended on except addresses and the devices of b and the scales, which Handle::gemm
    checks on every call (a pointer of another device or of host memory is a named error)."""
    if traced and (_is_compiling() or type(a) is not torch.Tensor or _dispatch_modes()):
        return _via_op(a, b, scale_a, scale_b, recipe_a, recipe_b, out_dtype, scale_format, bias, backend, dtype_a,
                       dtype_b, fast_accum)
    T = torch.Tensor
    if not (isinstance(b, T) and isinstance(scale_a, T) and isinstance(scale_b, T)
            and (bias is None or isinstance(bias, T))):
        # NVFP4 (scales, global) pairs, and anything else the general path names an error for.
        return _core.scaled_mm_impl(a, b, scale_a, scale_b, recipe_a, recipe_b, out_dtype, scale_format, bias,
                                     backend, dtype_a, dtype_b, fast_accum=fast_accum)
    key = (recipe_a, recipe_b, out_dtype, scale_format, backend, dtype_a, dtype_b, fast_accum, a.dtype, b.dtype,
           scale_a.dtype,
           scale_b.dtype, a.shape, b.shape, a.stride(), b.stride(), scale_a.shape, scale_b.shape, scale_a.stride(),
           scale_b.stride(), a.device, None if bias is None else (bias.dtype, bias.shape, bias.stride()))
    p = _prepared.get(key)
    if p is None:
        with _core.naming_backend(backend):
            p = _prepare(a, b, scale_a, scale_b, recipe_a, recipe_b, out_dtype, scale_format, bias, backend, dtype_a,
                         dtype_b, fast_accum)
        if p is None:  # a bias that needs converting: the general path
            return _core.scaled_mm_impl(a, b, scale_a, scale_b, recipe_a, recipe_b, out_dtype, scale_format, bias,
                                         backend, dtype_a, dtype_b, fast_accum=fast_accum)
        _prepared.put(key, p)
    run, shape, dtype, device, index = p
    d = torch.empty(shape, dtype=dtype, device=device)
    run(a.data_ptr(), scale_a.data_ptr(), b.data_ptr(), scale_b.data_ptr(), d.data_ptr(),
        0 if bias is None else bias.data_ptr(), 0 if index < 0 else _stream(index))
    return d


def _prepare(a, b, scale_a, scale_b, recipe_a, recipe_b, out_dtype, scale_format, bias, backend, dtype_a, dtype_b,
             fast_accum=False):
    od = _out_name(out_dtype)
    h = _core.handle(backend)
    c = _core.gemm_inputs(a, b, scale_a, scale_b, recipe_a, recipe_b, scale_format, bias, dtype_a, dtype_b)
    if bias is not None and c.bias_keep is not bias:
        return None
    # The run makes the operands' device current, so their device's default stream is the one used.
    device = c.view.device if c.view.space == 1 else -1
    prepared = h.prepare(c.m, c.n, c.k, c.a, c.b, DTYPE_CODE[od], bias is not None, 1.0, c.view.space, device,
                         fast_accum)
    return prepared.run, (c.m, c.n), _OUT[od], a.device, device


def _via_op(a, b, scale_a, scale_b, recipe_a, recipe_b, out_dtype, scale_format, bias, backend, dtype_a, dtype_b,
            fast_accum=False):
    sa, ga = _split_global(scale_a, recipe_a, "scale_a")
    sb, gb = _split_global(scale_b, recipe_b, "scale_b")
    od = out_dtype if isinstance(out_dtype, str) else _out_name(out_dtype)
    return torch.ops.scalemm.scaled_mm(a, b, sa, sb, recipe_a, recipe_b, od, scale_format, bias, backend, dtype_a,
                                       dtype_b, ga, gb, fast_accum)


def scaled_mm(a, b, scale_a, scale_b, *, recipe_a, recipe_b, out_dtype="bf16", scale_format="compact", bias=None,
              backend="auto", dtype_a=None, dtype_b=None, fast_accum=False):
    """scalemm.scaled_mm for torch tensors: the custom op while compiling or for tensor subclasses
    (fake, functional, traced tensors: the dispatcher routes those) and under a dispatch mode
    (make_fx, FakeTensorMode), a direct call otherwise."""
    return _fast(a, b, scale_a, scale_b, recipe_a, recipe_b, out_dtype, scale_format, bias, backend, dtype_a, dtype_b,
                 fast_accum=_core.flag(fast_accum, "fast_accum"))


# ---- scaled_grouped_mm ------------------------------------------------------------------------------------

@torch.library.custom_op("scalemm::scaled_grouped_mm", mutates_args=())
def _scaled_grouped_mm_op(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                          group_sizes: List[int], group_dim: str, recipe_a: str, recipe_b: str, out_dtype: str,
                          scale_format: str, backend: str, dtype_a: Optional[str], dtype_b: Optional[str],
                          global_a: float, global_b: float, group_sizes_device: Optional[torch.Tensor] = None,
                          grouped_backend: str = "auto", fast_accum: bool = False) -> torch.Tensor:
    """Runs on real tensors (eager dispatch, or a compiled graph at run time) through the prepared path,
    as the dense op does: nvfp4 pairs, host tensors and host-tensor sizes fall to the general call there."""
    sa = (scale_a, global_a) if recipe_a == "nvfp4" else scale_a
    sb = (scale_b, global_b) if recipe_b == "nvfp4" else scale_b
    sizes = group_sizes_device if group_sizes_device is not None else list(group_sizes)
    return _fast_grouped(a, b, sa, sb, sizes, group_dim, recipe_a, recipe_b, out_dtype, scale_format, backend,
                         dtype_a, dtype_b, grouped_backend, fast_accum)


@_scaled_grouped_mm_op.register_fake
def _(a, b, scale_a, scale_b, group_sizes, group_dim, recipe_a, recipe_b, out_dtype, scale_format, backend, dtype_a,
      dtype_b, global_a, global_b, group_sizes_device=None, grouped_backend="auto", fast_accum=False):
    groups = len(group_sizes) if group_sizes_device is None else group_sizes_device.shape[0]
    shape = _core.grouped_out_shape(a.shape, b.shape, groups, group_dim)
    return a.new_empty(shape, dtype=_OUT[_out_name(out_dtype)])


def scaled_grouped_mm(a, b, scale_a, scale_b, group_sizes, *, group_dim="m", recipe_a, recipe_b, out_dtype="bf16",
                      scale_format="compact", backend="auto", dtype_a=None, dtype_b=None, grouped_backend="auto",
                      fast_accum=False):
    """scalemm.scaled_grouped_mm for torch tensors: the custom op while tracing (torch.compile, tensor
    subclasses, dispatch modes), a direct call otherwise. group_sizes: host integers, or a CUDA int32/int64
    tensor read on the device."""
    fast_accum = _core.flag(fast_accum, "fast_accum")
    if _is_compiling() or type(a) is not torch.Tensor or _dispatch_modes():
        on_device = isinstance(group_sizes, torch.Tensor) and group_sizes.device.type != "cpu"
        if on_device:
            sizes, dev = [], group_sizes
        else:
            sizes = group_sizes if isinstance(group_sizes, (list, tuple)) else _core.group_size_list(group_sizes)
            dev = None
        sa, ga = _split_global(scale_a, recipe_a, "scale_a")
        sb, gb = _split_global(scale_b, recipe_b, "scale_b")
        od = out_dtype if isinstance(out_dtype, str) else _out_name(out_dtype)
        return torch.ops.scalemm.scaled_grouped_mm(a, b, sa, sb, [int(x) for x in sizes], group_dim, recipe_a,
                                                   recipe_b, od, scale_format, backend, dtype_a, dtype_b, ga, gb, dev,
                                                   grouped_backend, fast_accum)
    return _fast_grouped(a, b, scale_a, scale_b, group_sizes, group_dim, recipe_a, recipe_b, out_dtype, scale_format,
                         backend, dtype_a, dtype_b, grouped_backend, fast_accum)


_prepared_grouped = BoundedLRU()


def _fast_grouped(a, b, scale_a, scale_b, group_sizes, group_dim, recipe_a, recipe_b, out_dtype, scale_format,
                  backend, dtype_a, dtype_b, grouped_backend, fast_accum=False):
    """The eager path of grouped calls on CUDA tensors, and the op's body, as _fast is for dense ones: the
    first call of a signature validates and prepares (Handle.prepare_grouped); later ones read the
    addresses and run. Host sizes belong to the signature; device-side sizes are passed by address."""
    T = torch.Tensor
    general = lambda: _core.scaled_grouped_mm_impl(  # noqa: E731
        a, b, scale_a, scale_b, group_sizes, group_dim, recipe_a, recipe_b, out_dtype, scale_format, backend, dtype_a,
        dtype_b, grouped_backend, fast_accum)
    if not (a.is_cuda and isinstance(b, T) and isinstance(scale_a, T) and isinstance(scale_b, T)):
        return general()
    if isinstance(group_sizes, T):
        if group_sizes.device.type == "cpu":
            return general()
        sizes_key, sizes_ptr = (group_sizes.dtype, group_sizes.shape, group_sizes.stride(), group_sizes.device), \
            group_sizes.data_ptr()
    elif isinstance(group_sizes, (list, tuple)) and all(type(x) is int for x in group_sizes):
        sizes_key, sizes_ptr = tuple(group_sizes), 0
    else:
        return general()
    key = (group_dim, recipe_a, recipe_b, out_dtype, scale_format, backend, dtype_a, dtype_b, grouped_backend,
           fast_accum, sizes_key, a.dtype, b.dtype, scale_a.dtype, scale_b.dtype, a.shape, b.shape, a.stride(), b.stride(),
           scale_a.shape, scale_b.shape, scale_a.stride(), scale_b.stride(), a.device, b.device, scale_a.device,
           scale_b.device)
    p = _prepared_grouped.get(key)
    if p is None:
        od = _out_name(out_dtype)
        h = _core.handle(backend)
        c = _core.grouped_inputs(a, b, scale_a, scale_b, group_sizes, group_dim, recipe_a, recipe_b, scale_format,
                                 dtype_a, dtype_b)
        gb = _core.choice(_core.GROUPED_BACKENDS, grouped_backend, "grouped_backend", "grouped backend")
        with _core.naming_backend(backend):
            prepared = h.prepare_grouped(c.dim, *_core.sizes_args(c.sizes), c.m, c.n, c.k, c.a, c.b, DTYPE_CODE[od],
                                         1.0, c.view.space, gb, c.view.device, fast_accum)
        p = (prepared.run, c.out_shape, _OUT[od], a.device, c.view.device)
        _prepared_grouped.put(key, p)
    run, shape, dtype, device, index = p
    d = torch.empty(shape, dtype=dtype, device=device)
    run(a.data_ptr(), scale_a.data_ptr(), b.data_ptr(), scale_b.data_ptr(), d.data_ptr(), sizes_ptr, _stream(index))
    return d

