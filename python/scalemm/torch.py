"""PyTorch integration: custom ops with fake implementations, and FP8 linear layers with autograd.

    torch.ops.scalemm.scaled_mm     D = A B^T (what scalemm.scaled_mm runs for torch tensors under
                                    torch.compile; eager calls skip the dispatcher for speed)
    torch.ops.scalemm.scaled_grouped_mm
                                    the grouped (MoE) GEMM, group sizes as a list of ints in the graph
    torch.ops.scalemm.quantize      (data, scales, data_t, scales_t) of a (rows, K) tensor, FP8 recipes
    torch.ops.scalemm.quantize_nvfp4
                                    (data, scales, global, data_t, scales_t) for nvfp4
    Float8Linear                    nn.Linear in FP8 for one recipe: blockwise, rowwise, tensorwise, mxfp8
    Float8BlockwiseLinear, MXLinear Float8Linear with the recipe fixed (blockwise, mxfp8)
    Float8GroupedExperts            MoE experts (E, out, in) in blockwise FP8, group sizes on host or device
    convert_to_float8, conversion_report
                                    swap a model's nn.Linear layers in place, and say what became of each
    Float8AllGatherWeight           a layer weight that FSDP2 all-gathers in FP8 (convert_to_float8(...,
                                    fsdp_float8_all_gather=True))

Every op runs on its tensors' device and that device's current stream.

The fake implementations compute output shapes from the scale-layout contract, so
torch.compile(fullgraph=True) traces models that use these without graph breaks. Every call runs on
torch's current CUDA stream and allocates through torch, so CUDA-graph capture works once each shape
has run on the capture stream (the library allocates per-stream workspaces on first use; a call new
to a capturing stream raises UnsupportedError instead of breaking the capture).
"""

from __future__ import annotations

import contextlib
from typing import List, Optional, Tuple

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook as _register_step_hook

from . import _core
from . import _scalemm as _C
from ._arrays import torch_dtype

_OUT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def _out_name(out_dtype) -> str:
    return _core.choice(_core.OUT_DTYPES, out_dtype, "out_dtype", "output dtype")


# ---- scaled_mm ------------------------------------------------------------------------------------------

@torch.library.custom_op("scalemm::scaled_mm", mutates_args=())
def _scaled_mm_op(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, recipe_a: str,
                  recipe_b: str, out_dtype: str, scale_format: str, bias: Optional[torch.Tensor], backend: str,
                  dtype_a: Optional[str], dtype_b: Optional[str], global_a: float,
                  global_b: float, fast_accum: bool = False) -> torch.Tensor:
    sa = (scale_a, global_a) if recipe_a == "nvfp4" else scale_a
    sb = (scale_b, global_b) if recipe_b == "nvfp4" else scale_b
    return _fast(a, b, sa, sb, recipe_a, recipe_b, out_dtype, scale_format, bias, backend, dtype_a, dtype_b, False,
                 fast_accum)


@_scaled_mm_op.register_fake
def _(a, b, scale_a, scale_b, recipe_a, recipe_b, out_dtype, scale_format, bias, backend, dtype_a, dtype_b,
      global_a, global_b, fast_accum=False):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=_OUT[_out_name(out_dtype)])


def _split_global(s, recipe):
    if isinstance(s, tuple) and len(s) == 2:
        g = s[1]
        if isinstance(g, torch.Tensor):
            if g.is_cuda:
                # Same rule as the eager path: the library takes it by value.
                _core.global_value(g, "scale")
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
        if len(_prepared) >= 4096:
            _prepared.clear()
        _prepared[key] = p
    run, shape, dtype, device, index = p
    d = torch.empty(shape, dtype=dtype, device=device)
    run(a.data_ptr(), scale_a.data_ptr(), b.data_ptr(), scale_b.data_ptr(), d.data_ptr(),
        0 if bias is None else bias.data_ptr(), 0 if index < 0 else _stream(index))
    return d


def _prepare(a, b, scale_a, scale_b, recipe_a, recipe_b, out_dtype, scale_format, bias, backend, dtype_a, dtype_b,
             fast_accum=False):
    od = _out_name(out_dtype)
    h = _core.handle(backend)
    va, m, n, k, op_a, op_b, bias_ptr, keep = _core.gemm_inputs(a, b, scale_a, scale_b, recipe_a, recipe_b,
                                                                 scale_format, bias, dtype_a, dtype_b)
    if bias is not None and keep is not bias:
        return None
    from ._arrays import DTYPE_CODE

    # The run makes the operands' device current, so their device's default stream is the one used.
    prepared = h.prepare(m, n, k, op_a, op_b, DTYPE_CODE[od], bias is not None, 1.0, va.space,
                         va.device if va.space == 1 else -1, fast_accum)
    return prepared.run, (m, n), _OUT[od], a.device, (va.device if va.space == 1 else -1)


def _via_op(a, b, scale_a, scale_b, recipe_a, recipe_b, out_dtype, scale_format, bias, backend, dtype_a, dtype_b,
            fast_accum=False):
    sa, ga = _split_global(scale_a, recipe_a)
    sb, gb = _split_global(scale_b, recipe_b)
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
    sa = (scale_a, global_a) if recipe_a == "nvfp4" else scale_a
    sb = (scale_b, global_b) if recipe_b == "nvfp4" else scale_b
    sizes = group_sizes_device if group_sizes_device is not None else list(group_sizes)
    return _core.scaled_grouped_mm_impl(a, b, sa, sb, sizes, group_dim, recipe_a, recipe_b, out_dtype,
                                         scale_format, backend, dtype_a, dtype_b, grouped_backend, fast_accum)


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
        sa, ga = _split_global(scale_a, recipe_a)
        sb, gb = _split_global(scale_b, recipe_b)
        od = out_dtype if isinstance(out_dtype, str) else _out_name(out_dtype)
        return torch.ops.scalemm.scaled_grouped_mm(a, b, sa, sb, [int(x) for x in sizes], group_dim, recipe_a,
                                                   recipe_b, od, scale_format, backend, dtype_a, dtype_b, ga, gb, dev,
                                                   grouped_backend, fast_accum)
    return _fast_grouped(a, b, scale_a, scale_b, group_sizes, group_dim, recipe_a, recipe_b, out_dtype, scale_format,
                         backend, dtype_a, dtype_b, grouped_backend, fast_accum)


_prepared_grouped: dict = {}


def _fast_grouped(a, b, scale_a, scale_b, group_sizes, group_dim, recipe_a, recipe_b, out_dtype, scale_format,
                  backend, dtype_a, dtype_b, grouped_backend, fast_accum=False):
    """The eager path of grouped calls on CUDA tensors, as _fast is for dense ones: the first call of a
    signature validates and prepares (Handle.prepare_grouped); later ones read the addresses and run.
    Host sizes belong to the signature; device-side sizes are passed by address."""
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
        va, dim, sizes, m, n, k, op_a, op_b, out_shape = _core.grouped_inputs(
            a, b, scale_a, scale_b, group_sizes, group_dim, recipe_a, recipe_b, scale_format, dtype_a, dtype_b)
        gb = _core.choice(_core.GROUPED_BACKENDS, grouped_backend, "grouped_backend", "grouped backend")
        from ._arrays import DTYPE_CODE

        with _core.naming_backend(backend):
            prepared = h.prepare_grouped(dim, *_core.sizes_args(sizes), m, n, k, op_a, op_b, DTYPE_CODE[od], 1.0,
                                         va.space, gb, va.device, fast_accum)
        p = (prepared.run, out_shape, _OUT[od], a.device, va.device)
        if len(_prepared_grouped) >= 4096:
            _prepared_grouped.clear()
        _prepared_grouped[key] = p
    run, shape, dtype, device, index = p
    d = torch.empty(shape, dtype=dtype, device=device)
    run(a.data_ptr(), scale_a.data_ptr(), b.data_ptr(), scale_b.data_ptr(), d.data_ptr(), sizes_ptr, _stream(index))
    return d


# ---- quantize --------------------------------------------------------------------------------------------

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


@torch.library.custom_op("scalemm::quantize", mutates_args=())
def _quantize_op(x: torch.Tensor, recipe: str, dtype: str, scale_format: str,
                 columnwise: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if recipe == "nvfp4":
        raise _core.invalid("recipe", "torch.ops.scalemm.quantize covers the FP8 recipes (nvfp4 has a global scale "
                            "too)", "an FP8 recipe", "nvfp4", "Call torch.ops.scalemm.quantize_nvfp4, or "
                            "scalemm.torch.quantize, which takes every recipe.")
    # A compiled graph calls this at run time on real tensors: the prepared path, as eager calls take
    # (the general one validates everything on every call, about as long as the kernel at these sizes).
    out = _fast_quantize(x, recipe, dtype, scale_format, columnwise) if _direct(x) else \
        _core.quantize_impl(x, recipe, dtype, scale_format, columnwise)
    if not columnwise:
        out = tuple(out) + (x.new_empty((0,), dtype=out[0].dtype), x.new_empty((0,), dtype=out[1].dtype))
    return out


@_quantize_op.register_fake
def _(x, recipe, dtype, scale_format, columnwise):
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


def quantize(x, recipe, *, dtype="e4m3", scale_format="compact", columnwise=False):
    """Quantizes x (rows, K) along K; with columnwise=True also x^T (K, rows) along rows, from one read
    of x (for the square-block weight recipes the columnwise output is the exact transpose). Every
    recipe: nvfp4 returns its scales as scalemm.quantize does, (block_scales, global_decode_scale)
    with the global a 0-d float32 tensor on x's device."""
    if recipe != "nvfp4" and _direct(x):
        return _fast_quantize(x, recipe, dtype, scale_format, columnwise)
    if recipe == "nvfp4":
        return _nvfp4_pairs(torch.ops.scalemm.quantize_nvfp4(x, scale_format, columnwise), columnwise)
    out = torch.ops.scalemm.quantize(x, recipe, dtype, scale_format, columnwise)
    return out if columnwise else out[:2]


_current_device = torch.cuda.current_device


def _direct(x) -> bool:
    """Whether an FP8 quantization may skip the dispatcher: an eager call (nothing traces) on a plain
    CUDA tensor of the current device (whose default stream is the one torch uses for it)."""
    return (type(x) in _PLAIN and x.is_cuda and not _is_compiling() and not _dispatch_modes()
            and x.device.index == _current_device())


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _on_device(x):
    """x's device made current for a library call (its stream argument then names the right device)."""
    return contextlib.nullcontext() if x.device.index == _current_device() else torch.cuda.device(x.device)



_prepared_quantize: dict = {}


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
        from ._arrays import DTYPE_CODE

        dt = "e5m2" if out[0].dtype == torch.float8_e5m2 else "e4m3"
        codes = (_core.recipe_code(recipe, "recipe"), DTYPE_CODE[dt], _core.SCALE_FORMATS[scale_format],
                 DTYPE_CODE[_name(x.dtype)], x.shape[0], x.shape[1])
        # Scratch through torch's caching allocator (the amax recipes need some; block recipes none).
        ws = _C.quantize_workspace_bytes(codes[3], codes[4], codes[5], codes[0], codes[1], codes[2], rowwise,
                                               columnwise) if recipe in ("tensorwise", "rowwise") else 0
        if len(_prepared_quantize) >= 4096:
            _prepared_quantize.clear()
        _prepared_quantize[key] = (codes, tuple((t.shape, t.dtype) for t in out), ws)
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


_layer_gemms: dict = {}


def _layer_gemm(a, b, sa, sb, ra, rb, od, fmt, fast_accum=False):
    """scaled_mm of the layers' own operands. They come from this module's quantizers (contiguous data,
    scale tensors that follow from the shapes, recipe and format), so a prepared call is keyed by far
    less than _fast's signature: recipes, format, output dtype, the two data shapes and the device."""
    if not _direct(a):
        return scaled_mm(a, b, sa, sb, recipe_a=ra, recipe_b=rb, out_dtype=od, scale_format=fmt, fast_accum=fast_accum)
    key = (ra, rb, od, fmt, fast_accum, a.shape, b.shape, a.dtype, b.dtype, a.device)
    p = _layer_gemms.get(key)
    if p is None:
        d = scaled_mm(a, b, sa, sb, recipe_a=ra, recipe_b=rb, out_dtype=od, scale_format=fmt,
                      fast_accum=fast_accum)  # validates
        with _core.naming_backend("auto"):
            p = _prepare(a, b, sa, sb, ra, rb, od, fmt, None, "auto", None, None, fast_accum)
        if len(_layer_gemms) >= 4096:
            _layer_gemms.clear()
        _layer_gemms[key] = p
        return d
    run, shape, dtype, device, index = p
    d = torch.empty(shape, dtype=dtype, device=device)
    run(a.data_ptr(), sa.data_ptr(), b.data_ptr(), sb.data_ptr(), d.data_ptr(), 0, _stream(index))
    return d


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    """t as a contiguous (rows, last dimension) matrix."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.is_contiguous() else t2.contiguous()


def _wgrad(a, b, sa, sb, act, fmt, w_dtype):
    """dW = a . b^T of two activation-recipe operands, written by the GEMM in the weight's dtype where
    it can (else fp32, then cast): the bits of an fp32 dW rounded afterwards."""
    od = w_dtype if w_dtype in _NAMES else torch.float32
    dw = _layer_gemm(a, b, sa, sb, act, act, _name(od), fmt)
    return dw if dw.dtype == w_dtype else dw.to(w_dtype)


def _quantize_parts(x, recipe, fmt, rowwise, columnwise):
    """The layers' quantization: (data, scales) for rowwise, (data_t, scales_t) for columnwise only, or all
    four. Eager calls write only what is asked for; traced ones run the op (both directions)."""
    if _direct(x):
        return _fast_quantize(x, recipe, "e4m3", fmt, columnwise, rowwise)
    out = torch.ops.scalemm.quantize(x, recipe, "e4m3", fmt, columnwise)
    return out if rowwise and columnwise else (out[:2] if rowwise else out[2:])


def _transpose_fp8(t: torch.Tensor) -> torch.Tensor:
    """The last two dimensions swapped, contiguous (bytes moved as uint8: every FP8 type). Eager CUDA
    tensors go through the library's tiled kernel (about 5x torch's strided copy for 1-byte elements)."""
    if t.is_contiguous() and t.numel() and _direct(t):
        out = torch.empty((*t.shape[:-2], t.shape[-1], t.shape[-2]), dtype=t.dtype, device=t.device)
        _C.transpose_bytes(t.data_ptr(), t.numel() // (t.shape[-1] * t.shape[-2]), t.shape[-2], t.shape[-1],
                                 out.data_ptr(), _stream(t.device.index))
        return out
    return t.view(torch.uint8).transpose(-1, -2).contiguous().view(t.dtype)


def _transpose_2d(t: torch.Tensor) -> torch.Tensor:
    """A 2-D scale grid transposed, contiguous (1-byte scale types moved as uint8)."""
    return _transpose_fp8(t) if t.element_size() == 1 else t.t().contiguous()


def _release(ctx, *tensors):
    """Frees FP8 copies saved for backward once their last GEMM has run: saved tensors otherwise live
    until backward returns, beside the gradients it allocates next. Eager CUDA tensors only (a traced
    graph plans its own buffers); the ctx remembers it, so a second backward through the same graph
    stops with a named error instead of reading freed memory."""
    if ctx.keep_saved or _is_compiling() or _dispatch_modes():
        return
    for t in tensors:
        if type(t) is torch.Tensor and t.is_cuda:
            t.data = torch.empty(0, dtype=t.dtype, device=t.device)
            ctx.released = True


def _check_not_released(ctx, layer: str):
    if getattr(ctx, "released", False):
        raise RuntimeError(
            f"{layer}: backward ran a second time through the same graph (retain_graph=True), but the FP8 "
            "copies saved by the forward were freed after the first backward used them. Set keep_saved = True "
            "on the layer to keep them until the graph is freed (a higher peak), or run the forward again.")


# ---- linear layers ----------------------------------------------------------------------------------------

# The recipes a layer runs: (activations and gradients, weights). Rowwise and tensorwise run the
# forward GEMM with fast accumulation (their convention in torch and torchao: the output tolerates it,
# the gradients do not) and dgrad and wgrad exactly; block recipes accumulate exactly everywhere.
LINEAR_RECIPES = {"blockwise": ("block1x128", "block128x128"), "rowwise": ("rowwise", "rowwise"),
                  "tensorwise": ("tensorwise", "tensorwise"), "mxfp8": ("mxfp8", "mxfp8-32x32")}
_FAST_ACCUM_RECIPES = ("rowwise", "tensorwise")
# Feature counts a recipe's three GEMMs take: each is the K of one GEMM (in: forward, out: dgrad) and a
# row count of another, and cuBLASLt's FP8 kernels want K in multiples of 16; MX blocks are 32 wide.
_FEATURE_MULTIPLE = {"blockwise": 16, "rowwise": 16, "tensorwise": 16, "mxfp8": 32}


class _ScaledLinearFn(torch.autograd.Function):
    """Y = X W^T (+ b) with the three GEMMs of a training step in FP8 (see include/scalemm/linear.hpp):
    forward  Y  (M, N) = X (act, along K)      . W (weight recipe, along K)
    dgrad    dX (M, K) = dY (act, along N)     . W^T (weight recipe, along N; the columnwise output)
    wgrad    dW (N, K) = dY^T (act, along M)   . X^T (act, along M), written in W's dtype
    `wq` is W's (data, scales) when the layer has them cached, else None. Saved for backward: X^T in FP8
    and the weight itself (the parameter, no copy), quantized along N when dgrad runs: nothing of the
    weight's size is held between forward and backward.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, act, wgt, wq, fmt, fast_accum, keep_saved=False):
        x2 = _as_rows(x)
        if ctx.needs_input_grad[1]:
            xq, xs, xtq, xts = _quantize_parts(x2, act, fmt, True, True)
        else:  # a frozen weight (adapters, inference under autograd): no wgrad, so no X^T to write or keep
            (xq, xs), xtq, xts = _quantize_parts(x2, act, fmt, True, False), None, None
        if isinstance(weight, _GatheredFloat8Weight):  # FSDP2 gathered it in FP8
            wq, ws = weight.operand(fmt)
        else:
            wq, ws = wq if wq is not None else _quantize_parts(_plain(weight), wgt, fmt, True, False)
        out_dtype = x.dtype if x.dtype in _NAMES else torch.bfloat16
        y = _layer_gemm(xq, wq, xs, ws, act, wgt, _name(out_dtype), fmt, fast_accum)
        if bias is not None:
            y = y + bias.to(y.dtype)
        ctx.save_for_backward(xtq, xts, weight)
        ctx.keep_saved = keep_saved
        ctx.recipes = (act, wgt, fmt)
        ctx.shapes = (x.shape, x.dtype, weight.dtype, None if bias is None else bias.dtype)
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        _check_not_released(ctx, "Float8Linear")
        xtq, xts, weight = ctx.saved_tensors
        act, wgt, fmt = ctx.recipes
        x_shape, x_dtype, w_dtype, bias_dtype = ctx.shapes
        dy2 = _as_rows(dy)
        # dY along N for dgrad, dY^T for wgrad: only the directions a gradient asked for are written.
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dyq = dys = dytq = dyts = None
        if need_x and need_w:
            dyq, dys, dytq, dyts = _quantize_parts(dy2, act, fmt, True, True)
        elif need_x:
            dyq, dys = _quantize_parts(dy2, act, fmt, True, False)
        elif need_w:
            dytq, dyts = _quantize_parts(dy2, act, fmt, False, True)
        dx = dw = db = None
        # wgrad first, so that dY^T's FP8 copy is freed before dgrad allocates dX: the same GEMMs on the
        # same bytes, with one activation-sized buffer less at the step's peak.
        if ctx.needs_input_grad[1]:
            dw = _wgrad(dytq, xtq, dyts, xts, act, fmt, w_dtype)
        del dytq, dyts
        _release(ctx, xtq, xts)  # X^T's last use: not held while dX is allocated
        if ctx.needs_input_grad[0]:
            if isinstance(weight, _GatheredFloat8Weight):  # the exact transpose of the gathered blocks
                wtq, wts = weight.operand(fmt, transposed=True)
            else:
                wtq, wts = _quantize_parts(_plain(weight), wgt, fmt, False, True)
            dx = _layer_gemm(dyq, wtq, dys, wts, act, wgt, _name(x_dtype), fmt)
            dx = dx.reshape(x_shape)
        if bias_dtype is not None and ctx.needs_input_grad[2]:
            db = dy2.float().sum(0).to(bias_dtype)
        return dx, dw, db, None, None, None, None, None, None


_NAMES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}


def _plain(w: torch.Tensor) -> torch.Tensor:
    """The high-precision tensor of a weight (Float8AllGatherWeight wraps one until FSDP2 shards it)."""
    return w._tensor if isinstance(w, Float8AllGatherWeight) else w


def _name(dt) -> str:
    return _NAMES[dt]


def _recipe_name(recipe) -> str:
    if recipe not in LINEAR_RECIPES:
        raise _core.invalid("recipe", "a training recipe", ", ".join(f'"{r}"' for r in LINEAR_RECIPES), repr(recipe),
                            "Pick one of the names; each sets both the activation and the weight recipe.")
    return recipe


# Optimizer steps seen in this process: a cached weight quantization is kept only within one. The version
# counter alone misses fused optimizer kernels (AdamW(fused=True) updates parameters without bumping it).
_optimizer_steps = [0]


def _count_step(optimizer, args, kwargs):
    _optimizer_steps[0] += 1


_register_step_hook(_count_step)


class Float8Linear(torch.nn.Module):
    """nn.Linear whose forward, dgrad and wgrad GEMMs run in FP8 through scalemm, for one recipe:

        "blockwise"   activations and gradients 1x128 blocks, weights 128x128 (DeepSeek-V3), fp32 scales
        "rowwise"     a scale per row of each operand (per token, per output/input channel), fp32
        "tensorwise"  one fp32 scale per tensor
        "mxfp8"       1x32 blocks, weights 32x32, E8M0 scales (exact emulation on Hopper)

    E4M3 everywhere; every GEMM accumulates in fp32, except that rowwise and tensorwise run the forward
    GEMM with fast accumulation (cuBLASLt's FAST_ACCUM, as torch and torchao do for the output; set
    `fast_accum = False` on the layer for exact accumulation there too). Same parameters and initialisation as nn.Linear;
    `from_linear` shares an existing layer's parameters. Inputs of any leading shape (..., in); the output
    and dX in the input's dtype, dW in the weight's.

    Memory: backward keeps X^T in FP8 (1 byte per element, where bf16 keeps X in 2) and quantizes the
    weight along N from the parameter itself when dgrad runs, so nothing of the weight's size is held
    between forward and backward. Backward runs wgrad first and frees X^T's copy before dgrad allocates
    dX; a second backward through the same graph (retain_graph=True) then needs `keep_saved = True`
    on the layer (it stops with a named error otherwise). With a frozen weight (requires_grad False)
    the forward writes no X^T at all.

    cache_weight (off by default): keep the forward's weight quantization (1 byte per parameter) until
    the next optimizer step (any torch.optim optimizer, fused ones included) or an in-place update that
    bumps the weight's version counter (load_state_dict, copy_ under no_grad), so that gradient-
    accumulation micro-steps, activation recomputation and inference quantize the weight once. Writing
    through `weight.data` outside an optimizer step is not seen (nor is FSDP2 refilling an unsharded
    weight in place: it holds the same values until the optimizer steps). Not used under
    torch.compile (the quantization is in the graph) nor while a CUDA graph is being captured (a cached
    copy would not be requantized when the graph replays).

    scale_format: "cublaslt" (default) has the quantizers write every scale tensor in the layout
    cuBLASLt reads, so no GEMM converts one; "compact" keeps the quantizers' compact grids (the same
    products, bit for bit).
    """

    recipe = "blockwise"
    cache_weight = False
    scale_format = "cublaslt"
    min_gflop = 0.0  # calls whose GEMMs are smaller run F.linear in the weight's dtype (convert_to_float8 "auto")
    fast_accum = True  # rowwise, tensorwise: fast accumulation in the forward GEMM (False: exact everywhere)
    keep_saved = False  # True: keep X^T's FP8 copy until the graph is freed (a second backward, retain_graph)

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *,
                 recipe: str = "blockwise"):
        super().__init__()
        self.recipe = _recipe_name(recipe)
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        torch.nn.Linear.reset_parameters(self)  # same initialisation as nn.Linear

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, *, recipe: Optional[str] = None):
        """A layer with the weights (shared, not copied) of an nn.Linear."""
        m = cls.__new__(cls)
        torch.nn.Module.__init__(m)
        if recipe is not None:
            m.recipe = _recipe_name(recipe)
        m.in_features, m.out_features = linear.in_features, linear.out_features
        m.weight, m.bias = linear.weight, linear.bias
        return m

    def _cached_weight(self, wgt):
        w = self.weight
        if (not self.cache_weight or _is_compiling() or type(w) is not torch.nn.Parameter or not w.is_cuda
                or _dispatch_modes() or torch.cuda.is_current_stream_capturing()):
            return None  # a captured step quantizes in the graph: a cache hit would replay a stale weight
        key = (_optimizer_steps[0], w._version, w.data_ptr(), w.dtype, tuple(w.shape), w.device, wgt,
               self.scale_format)
        c = self.__dict__.get("_weight_q")
        if c is None or c[0] != key:
            with torch.no_grad():
                c = (key, _quantize_parts(w.detach(), wgt, self.scale_format, True, False))
            self.__dict__["_weight_q"] = c
        return c[1]

    def forward(self, x):
        if self.min_gflop and 2e-9 * (x.numel() // self.in_features) * self.in_features * self.out_features \
                < self.min_gflop:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        act, wgt = LINEAR_RECIPES[self.recipe]
        return _ScaledLinearFn.apply(x, self.weight, self.bias, act, wgt, self._cached_weight(wgt), self.scale_format,
                                     self.fast_accum and self.recipe in _FAST_ACCUM_RECIPES, self.keep_saved)

    def extra_repr(self):
        act, wgt = LINEAR_RECIPES[self.recipe]
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"recipe={self.recipe} (activations {act}, weights {wgt})")


class Float8BlockwiseLinear(Float8Linear):
    """Float8Linear(recipe="blockwise"): activations and gradients 1x128 blocks, weights 128x128 blocks,
    fp32 scales; forward, dgrad and wgrad native cuBLASLt on sm_90."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device, dtype, recipe="blockwise")


class MXLinear(Float8Linear):
    """Float8Linear(recipe="mxfp8"): activations and gradients 1x32 blocks, weights 32x32 blocks, E8M0
    scales; on Hopper every GEMM runs the exact emulated path (dequantize to BF16, BF16 GEMM)."""

    recipe = "mxfp8"

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device, dtype, recipe="mxfp8")


# ---- FSDP2: FP8 weight all-gather ----------------------------------------------------------------------

# Recipes whose weight can travel in FP8: each block of the weight lies within one shard when the shard
# rows are a multiple of the block, so quantizing a shard gives the bytes of quantizing the whole weight,
# and the dgrad operand (W along N) is the exact transpose of the gathered blocks. Rowwise weights need
# a scale per column of W for dgrad (not derivable from the gathered rows) and tensorwise an amax all-
# reduce before quantizing: those stay bf16 all-gathers.
_FSDP_FP8_BLOCK = {"blockwise": 128, "mxfp8": 128}  # shard rows: 128 for both (mxfp8-32x32's 128x4 tiles)

_aten = torch.ops.aten
# Ops FSDP2 runs on the parameter while sharding it (padding, narrowing, copies, views): their results
# stay wrapped, so that the sharded parameter keeps fsdp_pre_all_gather.
_SHARD_OPS_KEEP = {_aten.empty_like.default, _aten.new_zeros.default, _aten.slice.Tensor, _aten.copy_.default,
                   _aten.view.default, _aten.as_strided.default, _aten._to_copy.default, _aten._pin_memory.default,
                   _aten.split.Tensor, _aten.clone.default, _aten.detach.default, _aten.alias.default}


def _wrapper_like(cls, t: torch.Tensor, dtype=None):
    return torch.Tensor._make_wrapper_subclass(cls, t.size(), strides=t.stride(), storage_offset=t.storage_offset(),
                                               dtype=dtype or t.dtype, layout=t.layout, device=t.device,
                                               requires_grad=t.requires_grad)


class Float8AllGatherWeight(torch.Tensor):
    """A Float8Linear weight that FSDP2 (fully_shard) all-gathers in FP8: the weight recipe's data
    (1 byte per element) and compact scales travel instead of the high-precision shard, and the layer
    runs its forward and dgrad GEMMs on the gathered bytes. convert_to_float8(...,
    fsdp_float8_all_gather=True) installs it before fully_shard; everything else (optimizer, state dict
    of the shard, checkpoints) sees the high-precision tensor it wraps.

    The gathered weight equals, bit for bit, what the layer would quantize from the whole weight (each
    block lies within one shard). When a shard's rows are not a multiple of 128 (uneven sharding, small
    layers), and on a one-rank mesh, the all-gather moves the wrapped dtype, padded as FSDP2 pads."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, tensor: torch.Tensor, recipe: str):
        return _wrapper_like(cls, tensor)

    def __init__(self, tensor: torch.Tensor, recipe: str):
        self._tensor, self._recipe = tensor, recipe

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        recipe = None

        def unwrap(t):
            nonlocal recipe
            recipe = t._recipe
            return t._tensor

        args, kwargs = torch.utils._pytree.tree_map_only(cls, unwrap, (args, kwargs or {}))
        out = func(*args, **kwargs)
        if func not in _SHARD_OPS_KEEP:
            return out
        return torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: cls(t, recipe), out)

    def __tensor_flatten__(self):
        return ["_tensor"], self._recipe

    @staticmethod
    def __tensor_unflatten__(inner, recipe, outer_size, outer_stride):
        return Float8AllGatherWeight(inner["_tensor"], recipe)

    def __repr__(self):
        return f"Float8AllGatherWeight(recipe={self._recipe}, {self._tensor!r})"

    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        shards = mesh.size()
        rows = -(-outer_size[0] // shards)  # FSDP2's (padded) shard rows
        dtype = getattr(mp_policy, "param_dtype", None) or self._tensor.dtype
        w = self._tensor
        with torch.no_grad():
            # One rank has nothing to communicate (and FSDP2 then copies only the first all-gather input).
            if shards > 1 and outer_size[0] % (shards * _FSDP_FP8_BLOCK[self._recipe]) == 0 and w.is_cuda:
                _, wgt = LINEAR_RECIPES[self._recipe]
                data, scales = _quantize_parts(w.contiguous(), wgt, "compact", True, False)
                return (data, scales), (wgt,)
            t = w.to(dtype)
            if t.shape[0] < rows:
                t = torch.nn.functional.pad(t, (0, 0, 0, rows - t.shape[0]))
            return (t.contiguous(),), None

    def fsdp_post_all_gather(self, outputs, metadata, param_dtype, *, out=None):
        if out is not None:
            return  # FSDP2 refilled the same storages in place
        if metadata is None:
            (t,) = outputs
            return t, (t,)
        data, scales = outputs
        return _GatheredFloat8Weight(data, scales, metadata[0], param_dtype), (data, scales)


class _GatheredFloat8Weight(torch.Tensor):
    """The unsharded weight FSDP2 builds from the FP8 all-gather: (N, K) in the parameter's dtype to
    autograd and FSDP2, FP8 data and compact scales inside. Float8Linear reads the bytes; any other op
    sees the dequantized values."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, data, scales, recipe, dtype):
        return _wrapper_like(cls, data, dtype)

    def __init__(self, data, scales, recipe, dtype):
        self._data, self._scales, self._wrecipe = data, scales, recipe

    def _same(self):
        return _GatheredFloat8Weight(self._data, self._scales, self._wrecipe, self.dtype)

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        kwargs = kwargs or {}
        w = args[0] if args and isinstance(args[0], cls) else None
        if w is not None and func in (_aten.detach.default, _aten.alias.default):
            return w._same()
        if w is not None and func in (_aten.as_strided.default, _aten.view.default) and \
                tuple(args[1]) == tuple(w.shape):
            offset = args[3] if len(args) > 3 else kwargs.get("storage_offset")
            if func is _aten.view.default or (tuple(args[2]) == tuple(w.stride()) and not offset):
                return w._same()  # FSDP2's as_strided to the parameter's own size
        args, kwargs = torch.utils._pytree.tree_map_only(cls, lambda t: t.dequantized(), (args, kwargs))
        return func(*args, **kwargs)

    def __tensor_flatten__(self):
        return ["_data", "_scales"], (self._wrecipe, self.dtype)

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return _GatheredFloat8Weight(inner["_data"], inner["_scales"], meta[0], meta[1])

    def __repr__(self):
        return f"_GatheredFloat8Weight({self._wrecipe}, shape={tuple(self.shape)}, dtype={self.dtype})"

    def dequantized(self) -> torch.Tensor:
        return _core.dequantize(self._data, self._scales, self._wrecipe, out_dtype=_name(self.dtype))

    def operand(self, fmt: str, transposed: bool = False):
        """(data, scales) of W (along K) or, transposed, of W^T (along N: the dgrad operand), in fmt."""
        data, scales = self._data, self._scales
        rows, k = data.shape
        to = _core.SCALE_FORMATS[fmt]
        if not transposed and to == 0:
            return data, scales
        r = _core.recipe_code(self._wrecipe, "recipe")
        if not _direct(data):  # traced or off the current device: the general calls
            from . import layouts

            if transposed:
                data, scales, rows, k = _transpose_fp8(data), _transpose_2d(scales), k, rows
            return data, (layouts.to_cublaslt(scales, self._wrecipe, rows, k) if to else scales)
        stream = _stream(data.device.index)
        if transposed:  # one kernel each: the bytes, and the scale grid into its transposed layout
            out = torch.empty(_core.scale_shape(r, k, rows, to), dtype=scales.dtype, device=scales.device)
            _C.transpose_scales(r, rows, k, 0, scales.data_ptr(), to, out.data_ptr(), stream)
            return _transpose_fp8(data), out
        from ._arrays import DTYPE_CODE, torch_names

        out = torch.empty(_core.scale_shape(r, rows, k, to), dtype=scales.dtype, device=scales.device)
        _C.convert(r, rows, k, 0, scales.data_ptr(), DTYPE_CODE[torch_names()[scales.dtype]], list(scales.shape),
                         list(scales.stride()), to, out.data_ptr(), 1, stream)
        return data, out


# ---- model conversion -----------------------------------------------------------------------------------

# module_filter="auto" (docs/python.md, "Training with scalemm"; numbers from python/benchmarks/training.py,
# H100, eager): FP8 pays a fixed cost per GEMM (quantizing both operands, host work) that a small GEMM
# does not earn back. MLP blocks measured faster than bf16 at 2*M*N*K = 962 and 481 GFLOP per GEMM and
# slower at 137 GFLOP (1.66 against 1.40 ms a step). So "auto" leaves layers with fewer than
# AUTO_MIN_FEATURES inputs or outputs in bf16, and converted layers run a call in FP8 only when its GEMMs
# reach AUTO_MIN_GFLOP (the token count is known per call), else through F.linear in the weight's dtype.
AUTO_MIN_FEATURES = 1024
AUTO_MIN_GFLOP = 256.0


def _ineligible(linear: torch.nn.Linear, recipe: str) -> Optional[str]:
    """Why `recipe` cannot take this layer's shapes, or None."""
    mult = _FEATURE_MULTIPLE[recipe]
    for name in ("in_features", "out_features"):
        v = getattr(linear, name)
        if v % mult:
            return f"{name} = {v} is not a multiple of {mult} ({recipe}: each is the K of one of the three GEMMs)"
    if linear.weight.dtype not in _NAMES:
        return f"weight dtype {linear.weight.dtype} (FP8 layers take bf16, f16 or f32 weights)"
    return None


def _auto_skip(linear: torch.nn.Linear) -> Optional[str]:
    i, o = linear.in_features, linear.out_features
    if min(i, o) < AUTO_MIN_FEATURES:
        return (f"auto: {i} x {o} has fewer than {AUTO_MIN_FEATURES} features on one side; its GEMMs are too small "
                f"to earn back FP8's per-call cost (measured slower than bf16)")
    return None


def convert_to_float8(model: torch.nn.Module, *, recipe: str = "blockwise", module_filter=None,
                      fsdp_float8_all_gather: bool = False) -> torch.nn.Module:
    """Swaps every eligible nn.Linear of `model` in place for a Float8Linear of `recipe` ("blockwise",
    "rowwise", "tensorwise" or "mxfp8") holding the same parameters (same device and dtype, not copied),
    and returns the model. A layer whose shapes the recipe cannot take stays nn.Linear.

    module_filter: None (every eligible layer), a callable (fqn, module) -> bool that says which to
    convert, or "auto": skip what was measured slower in FP8 than in bf16: layers with fewer than
    AUTO_MIN_FEATURES inputs or outputs stay nn.Linear, and converted layers run a call in FP8 only when
    its GEMMs reach AUTO_MIN_GFLOP (Float8Linear.min_gflop), else in the weight's dtype.
    conversion_report(model) lists every linear layer, what it became and why.
    Only exact nn.Linear instances are converted (subclasses may carry behaviour a swap would lose).

    fsdp_float8_all_gather (blockwise and mxfp8): each converted layer's weight becomes a
    Float8AllGatherWeight, so that FSDP2 (fully_shard, applied afterwards) all-gathers the FP8 weight and
    its scales instead of the high-precision shard: about half the bytes of a bf16 all-gather, the same
    products bit for bit. Layers whose shards are not a multiple of 128 rows are gathered as before."""
    recipe = _recipe_name(recipe)
    if fsdp_float8_all_gather and recipe not in _FSDP_FP8_BLOCK:
        raise _core.invalid("fsdp_float8_all_gather", f"FP8 all-gather for recipe {recipe!r}",
                            " or ".join(f'recipe="{r}"' for r in _FSDP_FP8_BLOCK), f'recipe="{recipe}"',
                            "A rowwise weight's dgrad needs a scale per column of W (not in the gathered rows) and a "
                            "tensorwise one an amax over every shard; gather those in bf16 (the default).")
    if not (module_filter is None or module_filter == "auto" or callable(module_filter)):
        raise _core.invalid("module_filter", "which layers to convert", 'None, "auto" or a callable (fqn, module) -> bool',
                            repr(module_filter))
    if not isinstance(model, torch.nn.Module):
        raise _core.invalid("model", "a module to convert", "a torch.nn.Module", type(model).__name__)
    if isinstance(model, torch.nn.Linear) and type(model) is torch.nn.Linear:
        raise _core.invalid("model", "a model that contains linear layers (a bare nn.Linear cannot be swapped in "
                            "place)", "a container module", "nn.Linear", "Use Float8Linear.from_linear(layer, "
                            "recipe=...) instead.")
    swaps = {}  # id(old layer) -> its Float8Linear; decided once per layer, in module order
    for fqn, child in model.named_modules():
        if type(child) is not torch.nn.Linear:
            continue
        reason = _ineligible(child, recipe)
        if reason is None and module_filter == "auto":
            reason = _auto_skip(child)
        elif reason is None and module_filter is not None and not module_filter(fqn, child):
            reason = "module_filter returned False"
        if reason is None:
            swaps[id(child)] = new = Float8Linear.from_linear(child, recipe=recipe)
            if fsdp_float8_all_gather:
                w = child.weight
                new.weight = torch.nn.Parameter(Float8AllGatherWeight(w.data, recipe), requires_grad=w.requires_grad)
            if module_filter == "auto":
                new.min_gflop = AUTO_MIN_GFLOP
        else:
            child._scalemm_not_converted = reason
    for parent in list(model.modules()):  # every place a layer is reachable from (a shared layer too)
        for name, child in list(parent.named_children()):
            if id(child) in swaps:
                setattr(parent, name, swaps[id(child)])
    return model


class ConversionReport(list):
    """conversion_report's rows (dicts: name, in_features, out_features, layer, recipe, reason); str() is a table."""

    def __str__(self):
        head = ("layer", "in x out", "is now", "why")
        rows = [(r["name"], f"{r['in_features']} x {r['out_features']}", r["layer"], r["reason"]) for r in self]
        w = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
        line = lambda cells: "  ".join(str(c).ljust(n) for c, n in zip(cells, w)).rstrip()  # noqa: E731
        return "\n".join([line(head), line(["-" * n for n in w])] + [line(r) for r in rows])


def conversion_report(model: torch.nn.Module) -> ConversionReport:
    """Every linear layer of `model` (nn.Linear, Float8Linear and subclasses of both) with what it is now
    and why: converted to which recipe, or the reason convert_to_float8 left it in high precision."""
    out = ConversionReport()
    for name, m in model.named_modules():
        if isinstance(m, Float8Linear):
            act, wgt = LINEAR_RECIPES[m.recipe]
            why = f"FP8 {m.recipe}: activations {act}, weights {wgt}"
            if m.min_gflop:
                why += f"; calls below {m.min_gflop:g} GFLOP per GEMM run in {m.weight.dtype} (auto)"
            if isinstance(m.weight, Float8AllGatherWeight) or isinstance(getattr(m.weight, "_local_tensor", None),
                                                                         Float8AllGatherWeight):
                why += "; FSDP2 all-gathers its weight in FP8"
            out.append(dict(name=name or "(model)", in_features=m.in_features, out_features=m.out_features,
                            layer=type(m).__name__, recipe=m.recipe, reason=why))
        elif isinstance(m, torch.nn.Linear):
            why = getattr(m, "_scalemm_not_converted", None)
            if why is None:
                why = ("a subclass of nn.Linear: not converted" if type(m) is not torch.nn.Linear
                       else "not converted (convert_to_float8 has not seen it)")
            out.append(dict(name=name or "(model)", in_features=m.in_features, out_features=m.out_features,
                            layer=type(m).__name__, recipe=None, reason=why))
    return out


# ---- MoE experts ------------------------------------------------------------------------------------------

_EXPERT_RECIPES = {"blockwise": ("block1x128", "block128x128")}


def _padded_sizes(sizes: torch.Tensor, rows: int) -> torch.Tensor:
    """Each expert's token count rounded up to 128 on the device (no synchronisation), the last one
    extended so that they sum to `rows` (scalemm._scalemm.padded_token_rows: a bound for any sizes
    that sum to T): the k-grouped sizes of the wgrad, whose 1x128 blocks along the tokens then never
    straddle two experts."""
    padded = (sizes + 127) // 128 * 128
    padded[-1] += rows - padded.sum()
    return padded


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
    from ._arrays import DTYPE_CODE

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


def _quantize_tokens(x: torch.Tensor, sizes: torch.Tensor, rows: int, recipe: str):
    """The experts' quantization of x: (x rowwise, x^T in the aligned k-grouped layout), eager calls
    straight to the kernel, traced ones through the op."""
    x = x.contiguous()
    if _direct(x) and x.dtype in (torch.bfloat16, torch.float16):
        return _quantize_grouped_cuda(x, sizes, rows, recipe, "e4m3", "compact")
    return torch.ops.scalemm.quantize_grouped(x, sizes, rows, recipe, "e4m3", "compact")


class _GroupedExpertsFn(torch.autograd.Function):
    """Y_e = X_e W_e^T for every expert e in FP8, tokens as given (sorted by expert, any counts):
    forward  m-grouped   Y  (T, N) = X (act, along K)  . W_e (weight block, along K)
    dgrad    m-grouped   dX (T, K) = dY (act, along N) . W_e^T (the exact transpose of W_e's blocks)
    wgrad    k-grouped   dW_e (N, K) = dY_e^T (act, along tokens) . X_e^T (act, along tokens)
    X^T and dY^T are written with every expert's tokens from a 128-column boundary (zeros between),
    so that wgrad's 1x128 blocks along the tokens stay inside one expert; X and dY stay as they are.
    """

    @staticmethod
    def forward(ctx, x, weight, sizes, padded, rows, act, wgt, keep_saved=False):
        k = x.shape[1]
        e, n, _ = weight.shape
        xq, xs, xtq, xts = _quantize_tokens(x, sizes, rows, act)
        wq, ws = quantize(weight.reshape(e * n, k), wgt)
        wq, ws = wq.view(e, n, k), ws.view(e, n // 128, k // 128)
        od = _name(x.dtype if x.dtype in _NAMES else torch.bfloat16)
        y = scaled_grouped_mm(xq, wq, xs, ws, sizes, recipe_a=act, recipe_b=wgt, out_dtype=od)
        # dgrad's operand, the exact transpose of W_e's blocks, is what backward keeps: W's FP8 copy is
        # freed here, so that the two are never held together.
        wtq = wts = None
        if ctx.needs_input_grad[0]:
            wtq, wts = _transpose_fp8(wq), ws.transpose(1, 2).contiguous()
        del wq, ws
        ctx.save_for_backward(xtq, xts, wtq, wts, sizes, padded)
        ctx.keep_saved = keep_saved
        ctx.meta = (rows, act, wgt, x.dtype, weight.dtype)
        return y

    @staticmethod
    def backward(ctx, dy):
        _check_not_released(ctx, "Float8GroupedExperts")
        xtq, xts, wtq, wts, sizes, padded = ctx.saved_tensors
        rows, act, wgt, x_dtype, w_dtype = ctx.meta
        dyq, dys, dytq, dyts = _quantize_tokens(dy, sizes, rows, act)
        dx = dw = None
        # wgrad first, so that dY^T's FP8 copy is freed before dgrad allocates its outputs (as in
        # _ScaledLinearFn: the same GEMMs on the same bytes, a lower peak).
        if ctx.needs_input_grad[1]:
            od = w_dtype if w_dtype in _NAMES else torch.float32
            dw = scaled_grouped_mm(dytq, xtq, dyts, xts, padded, group_dim="k", recipe_a=act, recipe_b=act,
                                   out_dtype=_name(od))
            if dw.dtype != w_dtype:
                dw = dw.to(w_dtype)
        del dytq, dyts
        _release(ctx, xtq, xts)  # X^T's last use: not held while dX is allocated
        if ctx.needs_input_grad[0]:
            dx = scaled_grouped_mm(dyq, wtq, dys, wts, sizes, recipe_a=act, recipe_b=wgt,
                                   out_dtype=_name(x_dtype))
        return dx, dw, None, None, None, None, None, None


class Float8GroupedExperts(torch.nn.Module):
    """The experts of an MoE layer in FP8: weight (E, out_features, in_features), forward(x, group_sizes)
    with x (T, in_features) sorted by expert and group_sizes the E token counts, as host ints or a CUDA
    int32/int64 tensor (read on the device: no synchronisation, CUDA-graph capturable). Returns
    (T, out_features). Forward and dgrad are m-grouped, wgrad k-grouped, all through
    scaled_grouped_mm; experts with no tokens get zero weight gradients.

    recipe "blockwise": 1x128 activations and gradients, 128x128 weights (DeepSeek-V3); in_features and
    out_features multiples of 128. Forward and dgrad run on the tokens as given; for wgrad, x^T and dy^T
    are quantized with every expert's tokens from a 128-column boundary (zeros in between, written by
    the quantizer from one read of the tokens), so that its 1x128 blocks along the tokens stay inside
    one expert.

    Memory: backward keeps x^T (aligned, FP8) and the transpose of W's FP8 blocks (dgrad's operand;
    W's own FP8 copy is freed after the forward GEMM), and frees x^T once wgrad has run. A second
    backward through the same graph (retain_graph=True) needs `keep_saved = True`.
    """

    keep_saved = False  # True: keep x^T's FP8 copy until the graph is freed (a second backward, retain_graph)

    def __init__(self, num_experts: int, in_features: int, out_features: int, *, recipe: str = "blockwise",
                 device=None, dtype=None):
        super().__init__()
        if recipe not in _EXPERT_RECIPES:
            raise _core.invalid("recipe", "a recipe Float8GroupedExperts runs", " or ".join(_EXPERT_RECIPES),
                                str(recipe))
        for name, v in (("in_features", in_features), ("out_features", out_features)):
            if v <= 0 or v % 128:
                raise _core.invalid(name, "128x128 weight blocks that do not straddle two experts",
                                    "a positive multiple of 128", str(v), "Pad the layer to a multiple of 128.")
        if num_experts <= 0:
            raise _core.invalid("num_experts", "at least one expert", ">= 1", str(num_experts))
        self.num_experts, self.in_features, self.out_features, self.recipe = (num_experts, in_features,
                                                                              out_features, recipe)
        self.weight = torch.nn.Parameter(torch.empty(num_experts, out_features, in_features, device=device,
                                                     dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self):
        bound = 1.0 / (self.in_features ** 0.5)  # nn.Linear's default, per expert
        torch.nn.init.uniform_(self.weight, -bound, bound)

    def forward(self, x: torch.Tensor, group_sizes) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] != self.in_features:
            raise _core.invalid("x", "tokens sorted by expert", f"(T, {self.in_features})", str(tuple(x.shape)))
        if isinstance(group_sizes, torch.Tensor):
            sizes = group_sizes if group_sizes.device == x.device else group_sizes.to(x.device, non_blocking=True)
        else:
            sizes = torch.tensor([int(v) for v in group_sizes], dtype=torch.int64).to(x.device, non_blocking=True)
        if sizes.dim() != 1 or sizes.shape[0] != self.num_experts:
            raise _core.invalid("group_sizes", "one token count per expert", f"{self.num_experts} counts",
                                f"shape {tuple(sizes.shape)}")
        act, wgt = _EXPERT_RECIPES[self.recipe]
        sizes = sizes.to(torch.int64)
        # scalemm::quantize::padded_token_rows, in Python so that a traced (symbolic) token count passes.
        rows = (x.shape[0] + 127 * self.num_experts + 127) // 128 * 128
        return _GroupedExpertsFn.apply(x, self.weight, sizes, _padded_sizes(sizes, rows), rows, act, wgt,
                                       self.keep_saved)

    def extra_repr(self):
        return (f"num_experts={self.num_experts}, in_features={self.in_features}, "
                f"out_features={self.out_features}, recipe={self.recipe}")


# ---- the MLP block with its activation fused into the quantizers -----------------------------------------

_ACTIVATIONS = {"gelu_tanh": 1}  # scalemm::quantize::Activation
_MLP_ACTIVATIONS = ("gelu_tanh", "swiglu")  # Float8MLP: GELU between two projections, or SwiGLU's three
_SWIGLU_PARTS = {"forward": 0, "gate": 1, "up": 2}
_MLP_RECIPES = ("blockwise", "mxfp8")  # activations in 1D blocks: the fused quantizer's recipes


def _activation_code(activation) -> int:
    if activation not in _ACTIVATIONS:
        raise _core.invalid("activation", "an activation the quantizers fuse", " or ".join(f'"{a}"' for a in _ACTIVATIONS),
                            repr(activation))
    return _ACTIVATIONS[activation]


def _activation_torch(x, x_input, activation):
    """The unfused path: the activation (x_input None) or its input gradient x * act'(x_input) through torch."""
    if x_input is None:
        return torch.nn.functional.gelu(x, approximate="tanh")
    return torch.ops.aten.gelu_backward(x, x_input, approximate="tanh")


def _quantize_activation_cuda(x, x_input, activation, recipe, dtype, scale_format):
    from ._arrays import DTYPE_CODE

    if x.dim() != 2 or not x.is_contiguous():
        raise _core.invalid("x", "the activation's (rows, features) source", "a contiguous 2-D tensor",
                            f"{tuple(x.shape)} with strides {x.stride()}")
    if x_input is not None and (x_input.shape != x.shape or x_input.dtype != x.dtype or x_input.device != x.device
                                or not x_input.is_contiguous()):
        raise _core.invalid("x_input", "the activation's input, laid out as its output gradient x",
                            f"a contiguous {x.dtype} tensor of shape {tuple(x.shape)} on {x.device}",
                            f"{x_input.dtype} {tuple(x_input.shape)} on {x_input.device}"
                            f"{'' if x_input.is_contiguous() else ' (not contiguous)'}")
    r, fmt, out = _quantize_outputs(x, recipe, dtype, scale_format)
    rows, k = x.shape
    with _on_device(x):
        _C.quantize_activation(x.data_ptr(), DTYPE_CODE[_name(x.dtype)], rows, k, r, DTYPE_CODE[dtype], fmt,
                               _activation_code(activation), 0 if x_input is None else x_input.data_ptr(),
                               *(t.data_ptr() for t in out), _stream(x.device.index))
    return out


@torch.library.custom_op("scalemm::quantize_activation", mutates_args=())
def _quantize_activation_op(x: torch.Tensor, x_input: Optional[torch.Tensor], activation: str, recipe: str,
                            dtype: str, scale_format: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                     torch.Tensor]:
    """quantize(act(x)), or with x_input (the activation's input) quantize(x * act'(x_input)), in both
    directions: (data, scales, data_t, scales_t) as torch.ops.scalemm.quantize(..., columnwise=True).
    The activation's result is rounded to x's dtype first, so the bytes are those of quantizing what
    torch's activation writes, up to the activation's own arithmetic (tests/test_training.py compares
    it with torch's on every bf16 input). On CUDA with a 1D-block recipe (block1x128, mxfp8) and a
    bf16/f16 x it is one kernel that never writes the activation in high precision; elsewhere the
    activation runs through torch, then the quantizer."""
    _activation_code(activation)
    if x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and recipe in ("block1x128", "mxfp8"):
        return _quantize_activation_cuda(x.contiguous(), None if x_input is None else x_input.contiguous(),
                                         activation, recipe, dtype, scale_format)
    return torch.ops.scalemm.quantize(_activation_torch(x, x_input, activation).contiguous(), recipe, dtype,
                                      scale_format, True)


@_quantize_activation_op.register_fake
def _(x, x_input, activation, recipe, dtype, scale_format):
    return _quantize_outputs(x, recipe, dtype, scale_format)[2]


def quantize_activation(x: torch.Tensor, recipe: str, *, activation: str = "gelu_tanh", x_input=None,
                        dtype: str = "e4m3", scale_format: str = "compact"):
    """(data, scales, data_t, scales_t) of act(x), or of x * act'(x_input) when x_input is given (the
    activation's backward: x its output gradient, x_input its input), quantized along K and, transposed,
    along the rows, without writing the activation's result (see torch.ops.scalemm.quantize_activation)."""
    return torch.ops.scalemm.quantize_activation(x, x_input, activation, recipe, dtype, scale_format)


def _swiglu_torch(x, a, b, part):
    """The unfused path of quantize_swiglu, as torch's eager kernels round it."""
    F = torch.nn.functional
    if part == "forward":
        return F.silu(x) * a  # x: gate, a: up
    if part == "gate":
        return torch.ops.aten.silu_backward(x * b, a)  # x: the product's gradient, a: gate, b: up
    return x * F.silu(a)


def _quantize_swiglu_cuda(x, a, b, part, recipe, dtype, scale_format):
    from ._arrays import DTYPE_CODE

    for name, t in (("a", a), ("b", b)):
        if t is not None and (t.shape != x.shape or t.dtype != x.dtype or t.device != x.device or not t.is_contiguous()):
            raise _core.invalid(name, "a SwiGLU input laid out as the source", f"a contiguous {x.dtype} tensor of shape "
                                f"{tuple(x.shape)} on {x.device}", f"{t.dtype} {tuple(t.shape)} on {t.device}")
    if x.dim() != 2 or not x.is_contiguous():
        raise _core.invalid("x", "the (rows, features) source", "a contiguous 2-D tensor", str(tuple(x.shape)))
    r, fmt, out = _quantize_outputs(x, recipe, dtype, scale_format)
    rows, k = x.shape
    with _on_device(x):
        _C.quantize_swiglu(_SWIGLU_PARTS[part], x.data_ptr(), DTYPE_CODE[_name(x.dtype)], rows, k, r, DTYPE_CODE[dtype],
                           fmt, a.data_ptr(), 0 if b is None else b.data_ptr(), *(t.data_ptr() for t in out),
                           _stream(x.device.index))
    return out


@torch.library.custom_op("scalemm::quantize_swiglu", mutates_args=())
def _quantize_swiglu_op(x: torch.Tensor, a: torch.Tensor, b: Optional[torch.Tensor], part: str, recipe: str,
                        dtype: str, scale_format: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """SwiGLU in the quantizer, both directions (data, scales, data_t, scales_t):
    part "forward": quantize(silu(x) * a), x the gate and a the up projection's output;
    part "gate":    quantize(silu'(a) * (x * b)), x the product's gradient, a gate, b up;
    part "up":      quantize(x * silu(a)).
    Intermediates rounded to x's dtype as torch's eager kernels write them. On CUDA with a 1D-block
    recipe and bf16/f16 inputs one kernel; elsewhere torch's kernels, then the quantizer."""
    if part not in _SWIGLU_PARTS:
        raise _core.invalid("part", "which SwiGLU quantity to quantize", '"forward", "gate" or "up"', repr(part))
    if part == "gate" and b is None:
        raise _core.invalid("b", "the up projection's output, for the gate's gradient", "a tensor", "None")
    if x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and recipe in ("block1x128", "mxfp8"):
        return _quantize_swiglu_cuda(x.contiguous(), a.contiguous(), None if b is None else b.contiguous(), part,
                                     recipe, dtype, scale_format)
    return torch.ops.scalemm.quantize(_swiglu_torch(x, a, b, part).contiguous(), recipe, dtype, scale_format, True)


@_quantize_swiglu_op.register_fake
def _(x, a, b, part, recipe, dtype, scale_format):
    return _quantize_outputs(x, recipe, dtype, scale_format)[2]


def quantize_swiglu(x: torch.Tensor, a: torch.Tensor, recipe: str, *, part: str = "forward", b=None,
                    dtype: str = "e4m3", scale_format: str = "compact"):
    """(data, scales, data_t, scales_t) of SwiGLU's product (part "forward": x gate, a up) or of one
    input's gradient (part "gate" / "up": x the product's gradient, a gate, b up), without writing it in
    high precision (see torch.ops.scalemm.quantize_swiglu)."""
    return torch.ops.scalemm.quantize_swiglu(x, a, b, part, recipe, dtype, scale_format)


def _mlp_swiglu(x, a, b, part, act, fmt):
    if _direct(x) and x.dtype in (torch.bfloat16, torch.float16):
        return _quantize_swiglu_cuda(x, a, b, part, act, "e4m3", fmt)
    return torch.ops.scalemm.quantize_swiglu(x, a, b, part, act, "e4m3", fmt)


def _mlp_quantize_activation(h, h_input, act, fmt):
    if _direct(h) and h.dtype in (torch.bfloat16, torch.float16):
        return _quantize_activation_cuda(h, h_input, "gelu_tanh", act, "e4m3", fmt)
    return torch.ops.scalemm.quantize_activation(h, h_input, "gelu_tanh", act, "e4m3", fmt)


class _Float8MLPFn(torch.autograd.Function):
    """Y = act(X W1^T + b1) W2^T + b2 with the six GEMMs in FP8 and the activation inside the quantizers:
    forward  H = X W1^T (+ b1); G = act(H) quantized both ways from H (G never written in bf16); Y = G W2^T
    backward dG = dY W2 (dgrad of the down projection); dH = dG * act'(H) quantized both ways from dG and H
             (dH never written, unless b1 needs its sum); wgrad and dgrad of the up projection from it.
    Saved: X^T and G^T in FP8, H (the activation's input, as bf16 saves it), the weights themselves."""

    @staticmethod
    def forward(ctx, x, w1, w2, b1, b2, act, wgt, fmt, keep_saved):
        xq, xs, xtq, xts = _quantize_parts(_as_rows(x), act, fmt, True, True)
        w1q, w1s = _quantize_parts(_plain(w1), wgt, fmt, True, False)
        od = _name(x.dtype if x.dtype in _NAMES else torch.bfloat16)
        h = _layer_gemm(xq, w1q, xs, w1s, act, wgt, od, fmt)
        del xq, xs, w1q, w1s
        if b1 is not None:
            h = h + b1.to(h.dtype)
        gq, gs, gtq, gts = _mlp_quantize_activation(h, None, act, fmt)
        w2q, w2s = _quantize_parts(_plain(w2), wgt, fmt, True, False)
        y = _layer_gemm(gq, w2q, gs, w2s, act, wgt, od, fmt)
        if b2 is not None:
            y = y + b2.to(y.dtype)
        ctx.save_for_backward(xtq, xts, h, gtq, gts, w1, w2)
        ctx.keep_saved = keep_saved
        ctx.meta = (act, wgt, fmt, x.shape, x.dtype, w1.dtype, w2.dtype, None if b1 is None else b1.dtype,
                    None if b2 is None else b2.dtype)
        return y.reshape(*x.shape[:-1], w2.shape[0])

    @staticmethod
    def backward(ctx, dy):
        _check_not_released(ctx, "Float8MLP")
        xtq, xts, h, gtq, gts, w1, w2 = ctx.saved_tensors
        act, wgt, fmt, x_shape, x_dtype, w1_dtype, w2_dtype, b1_dtype, b2_dtype = ctx.meta
        dy2 = _as_rows(dy)
        dyq, dys, dytq, dyts = _quantize_parts(dy2, act, fmt, True, True)

        dw1 = dw2 = db1 = db2 = dx = None
        if ctx.needs_input_grad[2]:
            dw2 = _wgrad(dytq, gtq, dyts, gts, act, fmt, w2_dtype)
        del dytq, dyts
        _release(ctx, gtq, gts)
        if b2_dtype is not None and ctx.needs_input_grad[4]:
            db2 = dy2.float().sum(0).to(b2_dtype)
        w2tq, w2ts = _quantize_parts(_plain(w2), wgt, fmt, False, True)
        dg = _layer_gemm(dyq, w2tq, dys, w2ts, act, wgt, _name(h.dtype), fmt)
        del dyq, dys, w2tq, w2ts
        if b1_dtype is not None:  # b1's gradient needs dH itself: written once, then quantized as any gradient
            dh = _activation_torch(dg, h, "gelu_tanh")
            db1 = dh.float().sum(0).to(b1_dtype) if ctx.needs_input_grad[3] else None
            dhq, dhs, dhtq, dhts = _quantize_parts(dh, act, fmt, True, True)
            del dh
        else:
            dhq, dhs, dhtq, dhts = _mlp_quantize_activation(dg, h, act, fmt)
        del dg
        _release(ctx, h)
        if ctx.needs_input_grad[1]:
            dw1 = _wgrad(dhtq, xtq, dhts, xts, act, fmt, w1_dtype)
        del dhtq, dhts
        _release(ctx, xtq, xts)
        if ctx.needs_input_grad[0]:
            w1tq, w1ts = _quantize_parts(_plain(w1), wgt, fmt, False, True)
            dx = _layer_gemm(dhq, w1tq, dhs, w1ts, act, wgt, _name(x_dtype), fmt).reshape(x_shape)
        return dx, dw1, dw2, db1, db2, None, None, None, None


class _Float8SwigluMLPFn(torch.autograd.Function):
    """Y = (silu(X Wg^T) * (X Wu^T)) Wd^T with the nine GEMMs in FP8 and SwiGLU inside the quantizers:
    X is quantized once for both projections; P = silu(G) * U is quantized both ways from G and U; in
    backward, dG and dU are each quantized both ways from dP, G and U (none of P, dG, dU, silu(G) is
    written in bf16), and dX = dG Wg + dU Wu. Saved: X^T and P^T in FP8, G and U (bf16 keeps them too)."""

    @staticmethod
    def forward(ctx, x, wg, wu, wd, act, wgt, fmt, keep_saved):
        xq, xs, xtq, xts = _quantize_parts(_as_rows(x), act, fmt, True, True)
        od = _name(x.dtype if x.dtype in _NAMES else torch.bfloat16)
        wgq, wgs = _quantize_parts(_plain(wg), wgt, fmt, True, False)
        g = _layer_gemm(xq, wgq, xs, wgs, act, wgt, od, fmt)
        del wgq, wgs
        wuq, wus = _quantize_parts(_plain(wu), wgt, fmt, True, False)
        u = _layer_gemm(xq, wuq, xs, wus, act, wgt, od, fmt)
        del xq, xs, wuq, wus
        pq, ps, ptq, pts = _mlp_swiglu(g, u, None, "forward", act, fmt)
        wdq, wds = _quantize_parts(_plain(wd), wgt, fmt, True, False)
        y = _layer_gemm(pq, wdq, ps, wds, act, wgt, od, fmt)
        ctx.save_for_backward(xtq, xts, g, u, ptq, pts, wg, wu, wd)
        ctx.keep_saved = keep_saved
        ctx.meta = (act, wgt, fmt, x.shape, x.dtype, wg.dtype, wu.dtype, wd.dtype)
        return y.reshape(*x.shape[:-1], wd.shape[0])

    @staticmethod
    def backward(ctx, dy):
        _check_not_released(ctx, "Float8MLP")
        xtq, xts, g, u, ptq, pts, wg, wu, wd = ctx.saved_tensors
        act, wgt, fmt, x_shape, x_dtype, wg_dtype, wu_dtype, wd_dtype = ctx.meta
        dy2 = _as_rows(dy)
        dyq, dys, dytq, dyts = _quantize_parts(dy2, act, fmt, True, True)

        dwg = dwu = dwd = dx = None
        if ctx.needs_input_grad[3]:
            dwd = _wgrad(dytq, ptq, dyts, pts, act, fmt, wd_dtype)
        del dytq, dyts
        _release(ctx, ptq, pts)
        wdtq, wdts = _quantize_parts(_plain(wd), wgt, fmt, False, True)
        dp = _layer_gemm(dyq, wdtq, dys, wdts, act, wgt, _name(g.dtype), fmt)
        del dyq, dys, wdtq, wdts
        dgq, dgs, dgtq, dgts = _mlp_swiglu(dp, g, u, "gate", act, fmt)
        duq, dus, dutq, duts = _mlp_swiglu(dp, g, None, "up", act, fmt)
        del dp
        _release(ctx, g, u)
        if ctx.needs_input_grad[1]:
            dwg = _wgrad(dgtq, xtq, dgts, xts, act, fmt, wg_dtype)
        if ctx.needs_input_grad[2]:
            dwu = _wgrad(dutq, xtq, duts, xts, act, fmt, wu_dtype)
        del dgtq, dgts, dutq, duts
        _release(ctx, xtq, xts)
        if ctx.needs_input_grad[0]:
            wgtq, wgts = _quantize_parts(_plain(wg), wgt, fmt, False, True)
            dx = _layer_gemm(dgq, wgtq, dgs, wgts, act, wgt, _name(x_dtype), fmt)
            del wgtq, wgts
            wutq, wuts = _quantize_parts(_plain(wu), wgt, fmt, False, True)
            dx = (dx + _layer_gemm(duq, wutq, dus, wuts, act, wgt, _name(x_dtype), fmt)).reshape(x_shape)
        return dx, dwg, dwu, dwd, None, None, None, None


class _Projection(torch.nn.Module):
    """One projection of a Float8MLP: nn.Linear's parameters (and state_dict keys) without its forward,
    so that convert_to_float8 leaves it alone."""

    def __init__(self, in_features, out_features, bias, device, dtype):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) if bias else None
        torch.nn.Linear.reset_parameters(self)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Float8MLP(torch.nn.Module):
    """An MLP block in FP8 with its activation fused into the quantizers (scalemm::quantize::
    quantize_activation, quantize_swiglu), for two patterns:

        activation="gelu_tanh"  down(gelu(up(x), approximate="tanh"))
        activation="swiglu"     down(silu(gate(x)) * up(x))            (Llama-style gated MLP)

    Forward: the activation's output is quantized for the down projection straight from the
    projections' outputs, and never written in high precision. Backward: the up projection's (and the
    gate's) output gradients are quantized straight from the down projection's dgrad and the saved
    projection outputs, never written either (except where a bias needs their sum). SwiGLU's X is
    quantized once for both projections. One or two passes over the (tokens, hidden) tensors less in
    each direction.

    The same FP8 GEMMs as Float8Linear layers around torch's activation, on bytes that equal theirs
    wherever the fused arithmetic equals torch's elementwise kernels (compared on every bf16 input in
    tests/test_training.py). recipe "blockwise" (1x128 activations, 128x128 weights) or "mxfp8".
    Parameters up.weight, (gate.weight,) down.weight and, for GELU blocks, optional biases, named as
    the layers they replace; `from_linears` shares existing layers' parameters. Saved for backward: X^T
    and the activation's output transposed in FP8, and the projections' outputs (which bf16 keeps too);
    FP8 copies are freed once their last GEMM has run (`keep_saved = True` keeps them for a second
    backward through the same graph).
    """

    keep_saved = False
    scale_format = "cublaslt"

    def __init__(self, in_features: int, hidden_features: int, out_features: Optional[int] = None, *,
                 activation: str = "gelu_tanh", bias: bool = False, recipe: str = "blockwise", device=None,
                 dtype=None):
        super().__init__()
        self._configure(activation, recipe, bias)
        out_features = in_features if out_features is None else out_features
        if activation == "swiglu":
            self.gate = _Projection(in_features, hidden_features, bias, device, dtype)
        self.up = _Projection(in_features, hidden_features, bias, device, dtype)
        self.down = _Projection(hidden_features, out_features, bias, device, dtype)

    def _configure(self, activation, recipe, bias):
        if activation not in _MLP_ACTIVATIONS:
            raise _core.invalid("activation", "an activation the quantizers fuse",
                                " or ".join(f'"{a}"' for a in _MLP_ACTIVATIONS), repr(activation))
        if recipe not in _MLP_RECIPES:
            raise _core.invalid("recipe", "a recipe whose activations the fused quantizer writes (1D blocks)",
                                " or ".join(f'"{r}"' for r in _MLP_RECIPES), repr(recipe),
                                "Other recipes: Float8Linear layers around the activation.")
        if activation == "swiglu" and bias:
            raise _core.invalid("bias", "SwiGLU blocks as Llama-style models have them", "no biases", "bias",
                                "Use Float8Linear layers around the activation for biased gated MLPs.")
        self.activation, self.recipe = activation, recipe

    @classmethod
    def from_linears(cls, up: torch.nn.Linear, down: torch.nn.Linear, *, gate: Optional[torch.nn.Linear] = None,
                     activation: str = "gelu_tanh", recipe: str = "blockwise"):
        """A block with the parameters (shared, not copied) of existing linear layers: down(act(up(x))),
        or with activation="swiglu" down(silu(gate(x)) * up(x))."""
        if (gate is None) != (activation != "swiglu"):
            raise _core.invalid("gate", f'the gate projection of activation "{activation}"',
                                "a linear layer" if activation == "swiglu" else "None",
                                "None" if gate is None else type(gate).__name__)
        if up.out_features != down.in_features or (gate is not None and (gate.out_features, gate.in_features) !=
                                                   (up.out_features, up.in_features)):
            raise _core.invalid("down" if up.out_features != down.in_features else "gate",
                                "layers that chain: up and gate (in, hidden), down (hidden, out)",
                                f"hidden = {up.out_features}",
                                f"down.in_features = {down.in_features}" + (
                                    "" if gate is None else f", gate {gate.in_features} -> {gate.out_features}"))
        m = cls.__new__(cls)
        torch.nn.Module.__init__(m)
        layers = (("gate", gate), ("up", up), ("down", down))
        m._configure(activation, recipe, any(lin is not None and lin.bias is not None for _, lin in layers))
        for name, lin in layers:
            if lin is None:
                continue
            p = _Projection.__new__(_Projection)
            torch.nn.Module.__init__(p)
            p.in_features, p.out_features = lin.in_features, lin.out_features
            p.weight, p.bias = lin.weight, lin.bias
            setattr(m, name, p)
        return m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act, wgt = LINEAR_RECIPES[self.recipe]
        if self.activation == "swiglu":
            return _Float8SwigluMLPFn.apply(x, self.gate.weight, self.up.weight, self.down.weight, act, wgt,
                                            self.scale_format, self.keep_saved)
        return _Float8MLPFn.apply(x, self.up.weight, self.down.weight, self.up.bias, self.down.bias, act, wgt,
                                  self.scale_format, self.keep_saved)

    def extra_repr(self):
        return f"activation={self.activation}, recipe={self.recipe}"


__all__ = ["scaled_mm", "scaled_grouped_mm", "quantize", "quantize_activation", "quantize_swiglu", "Float8MLP", "Float8Linear", "Float8BlockwiseLinear", "MXLinear",
           "Float8GroupedExperts", "convert_to_float8", "conversion_report", "ConversionReport", "Float8AllGatherWeight",
           "LINEAR_RECIPES", "AUTO_MIN_FEATURES",
           "AUTO_MIN_GFLOP"]
