"""PyTorch integration: custom ops with fake implementations, and FP8 linear layers with autograd.

    torch.ops.scalemm.scaled_mm     D = A B^T (what scalemm.scaled_mm runs for torch tensors under
                                    torch.compile; eager calls skip the dispatcher for speed)
    torch.ops.scalemm.scaled_grouped_mm
                                    the grouped (MoE) GEMM, group sizes as a list of ints in the graph
    torch.ops.scalemm.quantize      (data, scales, data_t, scales_t) of a (rows, K) tensor
    Float8BlockwiseLinear           1x128 activations, 128x128 weights (DeepSeek-V3 / torchao's prototype)
    MXLinear                        MXFP8: 1x32 activations, 32x32 weights (emulated exactly on Hopper)

The fake implementations compute output shapes from the scale-layout contract, so
torch.compile(fullgraph=True) traces models that use these without graph breaks. Every call runs on
torch's current CUDA stream and allocates through torch, so CUDA-graph capture works once each shape
has run on the capture stream (the library allocates per-stream workspaces on first use; a call new
to a capturing stream raises UnsupportedError instead of breaking the capture).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from . import _core
from ._arrays import torch_dtype

_OUT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def _out_name(out_dtype) -> str:
    return _core._choice(_core.OUT_DTYPES, out_dtype, "out_dtype", "output dtype")


# ---- scaled_mm ------------------------------------------------------------------------------------------

@torch.library.custom_op("scalemm::scaled_mm", mutates_args=())
def _scaled_mm_op(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, recipe_a: str,
                  recipe_b: str, out_dtype: str, scale_format: str, bias: Optional[torch.Tensor], backend: str,
                  dtype_a: Optional[str], dtype_b: Optional[str], global_a: float,
                  global_b: float) -> torch.Tensor:
    sa = (scale_a, global_a) if recipe_a == "nvfp4" else scale_a
    sb = (scale_b, global_b) if recipe_b == "nvfp4" else scale_b
    return _fast(a, b, sa, sb, recipe_a, recipe_b, out_dtype, scale_format, bias, backend, dtype_a, dtype_b, False)


@_scaled_mm_op.register_fake
def _(a, b, scale_a, scale_b, recipe_a, recipe_b, out_dtype, scale_format, bias, backend, dtype_a, dtype_b,
      global_a, global_b):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=_OUT[_out_name(out_dtype)])


def _split_global(s, recipe):
    if isinstance(s, tuple) and len(s) == 2:
        g = s[1]
        if isinstance(g, torch.Tensor):
            if g.is_cuda:
                # Same rule as the eager path: the library takes it by value.
                _core._global_value(g, "scale")
            g = float(g)
        return s[0], float(g)
    return s, 1.0


_prepared: dict = {}
_get_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_is_compiling = torch.compiler.is_compiling
try:  # make_fx, FakeTensorMode, ... (infra modes included): the op must be traced, not run
    from torch.utils._python_dispatch import is_in_torch_dispatch_mode as _dispatch_modes
except ImportError:  # older torch
    def _dispatch_modes():
        return torch._C._len_torch_dispatch_stack() > 0


def _stream(device_index: int) -> int:
    if _get_stream is not None:
        return _get_stream(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


def _fast(a, b, scale_a, scale_b, recipe_a, recipe_b, out_dtype, scale_format, bias, backend, dtype_a, dtype_b,
          traced=True):
    """The eager path for torch tensors (and, with traced, the custom op while tracing: see scaled_mm):
    the first call of a signature validates everything and prepares the library call (Handle.prepare);
    later calls read six addresses, allocate D through torch and run. The cache key holds what the
    validation depended on except addresses and the devices of b and the scales, which Handle::gemm
    checks on every call (a pointer of another device or of host memory is a named error)."""
    if traced and (_is_compiling() or type(a) is not torch.Tensor or _dispatch_modes()):
        return _via_op(a, b, scale_a, scale_b, recipe_a, recipe_b, out_dtype, scale_format, bias, backend, dtype_a,
                       dtype_b)
    T = torch.Tensor
    if not (isinstance(b, T) and isinstance(scale_a, T) and isinstance(scale_b, T)
            and (bias is None or isinstance(bias, T))):
        # NVFP4 (scales, global) pairs, and anything else the general path names an error for.
        return _core._scaled_mm_impl(a, b, scale_a, scale_b, recipe_a, recipe_b, out_dtype, scale_format, bias,
                                     backend, dtype_a, dtype_b)
    key = (recipe_a, recipe_b, out_dtype, scale_format, backend, dtype_a, dtype_b, a.dtype, b.dtype, scale_a.dtype,
           scale_b.dtype, a.shape, b.shape, a.stride(), b.stride(), scale_a.shape, scale_b.shape, scale_a.stride(),
           scale_b.stride(), a.device, None if bias is None else (bias.dtype, bias.shape, bias.stride()))
    p = _prepared.get(key)
    if p is None:
        with _core.naming_backend(backend):
            p = _prepare(a, b, scale_a, scale_b, recipe_a, recipe_b, out_dtype, scale_format, bias, backend, dtype_a,
                         dtype_b)
        if p is None:  # a bias that needs converting: the general path
            return _core._scaled_mm_impl(a, b, scale_a, scale_b, recipe_a, recipe_b, out_dtype, scale_format, bias,
                                         backend, dtype_a, dtype_b)
        if len(_prepared) >= 4096:
            _prepared.clear()
        _prepared[key] = p
    run, shape, dtype, device, index = p
    d = torch.empty(shape, dtype=dtype, device=device)
    run(a.data_ptr(), scale_a.data_ptr(), b.data_ptr(), scale_b.data_ptr(), d.data_ptr(),
        0 if bias is None else bias.data_ptr(), 0 if index < 0 else _stream(index))
    return d


def _prepare(a, b, scale_a, scale_b, recipe_a, recipe_b, out_dtype, scale_format, bias, backend, dtype_a, dtype_b):
    od = _out_name(out_dtype)
    h = _core.handle(backend)
    va, m, n, k, op_a, op_b, bias_ptr, keep = _core._gemm_inputs(a, b, scale_a, scale_b, recipe_a, recipe_b,
                                                                 scale_format, bias, dtype_a, dtype_b)
    if bias is not None and keep is not bias:
        return None
    from ._arrays import DTYPE_CODE

    prepared = h.prepare(m, n, k, op_a, op_b, DTYPE_CODE[od], bias is not None, 1.0, va.space)
    return prepared.run, (m, n), _OUT[od], a.device, (va.device if va.space == 1 else -1)


def _via_op(a, b, scale_a, scale_b, recipe_a, recipe_b, out_dtype, scale_format, bias, backend, dtype_a, dtype_b):
    sa, ga = _split_global(scale_a, recipe_a)
    sb, gb = _split_global(scale_b, recipe_b)
    od = out_dtype if isinstance(out_dtype, str) else _out_name(out_dtype)
    return torch.ops.scalemm.scaled_mm(a, b, sa, sb, recipe_a, recipe_b, od, scale_format, bias, backend, dtype_a,
                                       dtype_b, ga, gb)


def scaled_mm(a, b, scale_a, scale_b, *, recipe_a, recipe_b, out_dtype="bf16", scale_format="compact", bias=None,
              backend="auto", dtype_a=None, dtype_b=None):
    """scalemm.scaled_mm for torch tensors: the custom op while compiling or for tensor subclasses
    (fake, functional, traced tensors: the dispatcher routes those) and under a dispatch mode
    (make_fx, FakeTensorMode), a direct call otherwise."""
    return _fast(a, b, scale_a, scale_b, recipe_a, recipe_b, out_dtype, scale_format, bias, backend, dtype_a, dtype_b)


# ---- scaled_grouped_mm ------------------------------------------------------------------------------------

@torch.library.custom_op("scalemm::scaled_grouped_mm", mutates_args=())
def _scaled_grouped_mm_op(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                          group_sizes: List[int], group_dim: str, recipe_a: str, recipe_b: str, out_dtype: str,
                          scale_format: str, backend: str, dtype_a: Optional[str], dtype_b: Optional[str],
                          global_a: float, global_b: float, group_sizes_device: Optional[torch.Tensor] = None,
                          grouped_backend: str = "auto") -> torch.Tensor:
    sa = (scale_a, global_a) if recipe_a == "nvfp4" else scale_a
    sb = (scale_b, global_b) if recipe_b == "nvfp4" else scale_b
    sizes = group_sizes_device if group_sizes_device is not None else list(group_sizes)
    return _core._scaled_grouped_mm_impl(a, b, sa, sb, sizes, group_dim, recipe_a, recipe_b, out_dtype,
                                         scale_format, backend, dtype_a, dtype_b, grouped_backend)


@_scaled_grouped_mm_op.register_fake
def _(a, b, scale_a, scale_b, group_sizes, group_dim, recipe_a, recipe_b, out_dtype, scale_format, backend, dtype_a,
      dtype_b, global_a, global_b, group_sizes_device=None, grouped_backend="auto"):
    groups = len(group_sizes) if group_sizes_device is None else group_sizes_device.shape[0]
    shape = _core.grouped_out_shape(a.shape, b.shape, groups, group_dim)
    return a.new_empty(shape, dtype=_OUT[_out_name(out_dtype)])


def scaled_grouped_mm(a, b, scale_a, scale_b, group_sizes, *, group_dim="m", recipe_a, recipe_b, out_dtype="bf16",
                      scale_format="compact", backend="auto", dtype_a=None, dtype_b=None, grouped_backend="auto"):
    """scalemm.scaled_grouped_mm for torch tensors: the custom op while tracing (torch.compile, tensor
    subclasses, dispatch modes), a direct call otherwise. group_sizes: host integers, or a CUDA int32/int64
    tensor read on the device."""
    if _is_compiling() or type(a) is not torch.Tensor or _dispatch_modes():
        on_device = isinstance(group_sizes, torch.Tensor) and group_sizes.device.type != "cpu"
        if on_device:
            sizes, dev = [], group_sizes
        else:
            sizes = group_sizes if isinstance(group_sizes, (list, tuple)) else _core.group_size_list(group_sizes)
            dev = None
        sa, ga = _split_global(scale_a, recipe_a)
        sb, gb = _split_global(scale_b, recipe_b)
        od = out_dtype if isinstance(out_dtype, str) else _out_name(out_dtype)
        return torch.ops.scalemm.scaled_grouped_mm(a, b, sa, sb, [int(x) for x in sizes], group_dim, recipe_a,
                                                   recipe_b, od, scale_format, backend, dtype_a, dtype_b, ga, gb, dev,
                                                   grouped_backend)
    return _fast_grouped(a, b, scale_a, scale_b, group_sizes, group_dim, recipe_a, recipe_b, out_dtype, scale_format,
                         backend, dtype_a, dtype_b, grouped_backend)


_prepared_grouped: dict = {}


def _fast_grouped(a, b, scale_a, scale_b, group_sizes, group_dim, recipe_a, recipe_b, out_dtype, scale_format,
                  backend, dtype_a, dtype_b, grouped_backend):
    """The eager path of grouped calls on CUDA tensors, as _fast is for dense ones: the first call of a
    signature validates and prepares (Handle.prepare_grouped); later ones read the addresses and run.
    Host sizes belong to the signature; device-side sizes are passed by address."""
    T = torch.Tensor
    general = lambda: _core._scaled_grouped_mm_impl(  # noqa: E731
        a, b, scale_a, scale_b, group_sizes, group_dim, recipe_a, recipe_b, out_dtype, scale_format, backend, dtype_a,
        dtype_b, grouped_backend)
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
           sizes_key, a.dtype, b.dtype, scale_a.dtype, scale_b.dtype, a.shape, b.shape, a.stride(), b.stride(),
           scale_a.shape, scale_b.shape, scale_a.stride(), scale_b.stride(), a.device, b.device, scale_a.device,
           scale_b.device)
    p = _prepared_grouped.get(key)
    if p is None:
        od = _out_name(out_dtype)
        h = _core.handle(backend)
        va, dim, sizes, m, n, k, op_a, op_b, out_shape = _core._grouped_inputs(
            a, b, scale_a, scale_b, group_sizes, group_dim, recipe_a, recipe_b, scale_format, dtype_a, dtype_b)
        gb = _core._choice(_core.GROUPED_BACKENDS, grouped_backend, "grouped_backend", "grouped backend")
        from ._arrays import DTYPE_CODE

        with _core.naming_backend(backend):
            prepared = h.prepare_grouped(dim, *_core._sizes_args(sizes), m, n, k, op_a, op_b, DTYPE_CODE[od], 1.0,
                                         va.space, gb)
        p = (prepared.run, out_shape, _OUT[od], a.device, va.device)
        if len(_prepared_grouped) >= 4096:
            _prepared_grouped.clear()
        _prepared_grouped[key] = p
    run, shape, dtype, device, index = p
    d = torch.empty(shape, dtype=dtype, device=device)
    run(a.data_ptr(), scale_a.data_ptr(), b.data_ptr(), scale_b.data_ptr(), d.data_ptr(), sizes_ptr, _stream(index))
    return d


# ---- quantize --------------------------------------------------------------------------------------------

@torch.library.custom_op("scalemm::quantize", mutates_args=())
def _quantize_op(x: torch.Tensor, recipe: str, dtype: str, scale_format: str,
                 columnwise: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if recipe == "nvfp4":
        raise _core.invalid("recipe", "torch.ops.scalemm.quantize covers the FP8 recipes", "an FP8 recipe",
                            "nvfp4", "Call scalemm.quantize eagerly for nvfp4.")
    out = _core._quantize_impl(x, recipe, dtype, scale_format, columnwise)
    if not columnwise:
        out = out + (x.new_empty((0,), dtype=out[0].dtype), x.new_empty((0,), dtype=out[1].dtype))
    return out


@_quantize_op.register_fake
def _(x, recipe, dtype, scale_format, columnwise):
    r = _core.recipe_code(recipe, "recipe")
    fmt = _core.SCALE_FORMATS[scale_format]
    rows, k = x.shape
    dt = torch_dtype(_core.DATA_DTYPES[dtype])
    st = torch_dtype(_core._scale_dtype_name(r))
    data = x.new_empty((rows, k), dtype=dt)
    scales = x.new_empty(_core.scale_shape(r, rows, k, fmt), dtype=st)
    if columnwise:
        return data, scales, x.new_empty((k, rows), dtype=dt), x.new_empty(_core.scale_shape(r, k, rows, fmt), dtype=st)
    return data, scales, x.new_empty((0,), dtype=dt), x.new_empty((0,), dtype=st)


def _traced_quantize(x, recipe, dtype, scale_format, columnwise):
    """scalemm.quantize on a torch tensor while tracing (torch.compile, make_fx, fake or functional
    tensors): the custom op, so the graph has no break. None when eager (the direct call runs)."""
    if _is_compiling() or type(x) is not torch.Tensor or _dispatch_modes():
        out = torch.ops.scalemm.quantize(x, recipe, dtype, scale_format, columnwise)
        return out if columnwise else out[:2]
    return None


def quantize(x, recipe, *, dtype="e4m3", scale_format="compact", columnwise=False):
    """Quantizes x (rows, K) along K; with columnwise=True also x^T (K, rows) along rows, from one read
    of x (for the square-block weight recipes the columnwise output is the exact transpose)."""
    out = torch.ops.scalemm.quantize(x, recipe, dtype, scale_format, columnwise)
    return out if columnwise else out[:2]


# ---- linear layers ----------------------------------------------------------------------------------------

class _ScaledLinearFn(torch.autograd.Function):
    """Y = X W^T (+ b) with the three GEMMs of a training step in FP8 (see include/scalemm/linear.hpp):
    forward  Y  (M, N) = X (act, along K)      . W (weight block, along K)
    dgrad    dX (M, K) = dY (act, along N)     . W^T (weight block, along N; the exact transpose)
    wgrad    dW (N, K) = dY^T (act, along M)   . X^T (act, along M)
    """

    @staticmethod
    def forward(ctx, x, weight, bias, act, wgt):
        k = x.shape[-1]
        x2 = x.reshape(-1, k)
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        xq, xs, xtq, xts = quantize(x2, act, columnwise=True)
        wq, ws, wtq, wts = quantize(weight, wgt, columnwise=True)
        out_dtype = x.dtype if x.dtype in (torch.bfloat16, torch.float16, torch.float32) else torch.bfloat16
        y = scaled_mm(xq, wq, xs, ws, recipe_a=act, recipe_b=wgt, out_dtype=_name(out_dtype))
        if bias is not None:
            y = y + bias.to(y.dtype)
        ctx.save_for_backward(xtq, xts, wtq, wts)
        ctx.recipes = (act, wgt)
        ctx.shapes = (x.shape, x.dtype, weight.dtype, None if bias is None else bias.dtype)
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        xtq, xts, wtq, wts = ctx.saved_tensors
        act, wgt = ctx.recipes
        x_shape, x_dtype, w_dtype, bias_dtype = ctx.shapes
        n = dy.shape[-1]
        dy2 = dy.reshape(-1, n)
        if not dy2.is_contiguous():
            dy2 = dy2.contiguous()
        dyq, dys, dytq, dyts = quantize(dy2, act, columnwise=True)
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = scaled_mm(dyq, wtq, dys, wts, recipe_a=act, recipe_b=wgt, out_dtype=_name(x_dtype))
            dx = dx.reshape(x_shape)
        if ctx.needs_input_grad[1]:
            dw = scaled_mm(dytq, xtq, dyts, xts, recipe_a=act, recipe_b=act, out_dtype="f32").to(w_dtype)
        if bias_dtype is not None and ctx.needs_input_grad[2]:
            db = dy2.float().sum(0).to(bias_dtype)
        return dx, dw, db, None, None


def _name(dt) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}[dt]


class _ScaledLinear(torch.nn.Module):
    _act = _wgt = ""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        torch.nn.Linear.reset_parameters(self)  # same initialisation as nn.Linear

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear):
        """A layer with the weights (shared, not copied) of an nn.Linear."""
        m = cls.__new__(cls)
        torch.nn.Module.__init__(m)
        m.in_features, m.out_features = linear.in_features, linear.out_features
        m.weight, m.bias = linear.weight, linear.bias
        return m

    def forward(self, x):
        return _ScaledLinearFn.apply(x, self.weight, self.bias, self._act, self._wgt)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"activations={self._act}, weights={self._wgt}")


class Float8BlockwiseLinear(_ScaledLinear):
    """nn.Linear in blockwise FP8 (E4M3): activations and gradients 1x128 blocks, weights 128x128
    blocks, fp32 scales; forward, dgrad and wgrad through scalemm (native cuBLASLt on sm_90)."""

    _act, _wgt = "block1x128", "block128x128"


class MXLinear(_ScaledLinear):
    """nn.Linear in MXFP8 (E4M3, E8M0 scales): activations and gradients 1x32 blocks, weights 32x32
    blocks; on Hopper every GEMM runs the exact emulated path (dequantize to BF16, BF16 GEMM)."""

    _act, _wgt = "mxfp8", "mxfp8-32x32"


__all__ = ["scaled_mm", "scaled_grouped_mm", "quantize", "Float8BlockwiseLinear", "MXLinear"]
