"""The custom ops of the FP8 experts (scalemm.torch.moe), each with a fake implementation:

    torch.ops.scalemm.moe_route             (pos (T, k), row_pair (M,), sizes (E,)) of top_k_index (T, k):
                                            the pairs p = t k + j sorted by expert, stable; pos[t, j] the
                                            sorted row of pair (t, j), -1 for a sentinel (id outside
                                            [0, E)); row_pair[r] the pair of sorted row r, -1 for the
                                            sentinels' rows (after every expert's); sizes[e] expert e's
                                            rows, the last one counting the sentinels' rows too (M = T k)
    torch.ops.scalemm.moe_quantize_tokens   rowwise (M, C) + columnwise (C, rows) FP8 of the sorted rows:
                                            x's rows as given, or x[gather[r]] (zero for gather -1) times
                                            row_weight[r] rounded to x's type; the grouped quantizer's bytes
    torch.ops.scalemm.moe_quantize_swiglu   moe_quantize_tokens of silu(gate) * up of a (M, 2I) [gate | up]
                                            output, or of [d gate | d up] from the product's gradient
                                            (the default gate fused into the quantizer)
    torch.ops.scalemm.moe_quantize_weights  (data, scales) of a dense (R, K) weight
    torch.ops.scalemm.moe_combine           out[t] = sum_j w[t, j] y[pos[t, j]] (w = 1 without weights),
                                            fp32 in j order, +0 for sentinels, rounded to y's type
    torch.ops.scalemm.moe_combine_weight_grad
                                            dw[t, j] = <dout[t], y[pos[t, j]]> (fp64 sums, fp32), 0 for sentinels

`fused` picks the library's kernels (CUDA tensors) over torch index ops; both write the same bytes
(up to the last bit of the fp64 sums of moe_combine_weight_grad). CPU tensors run the torch ops and
the host quantizer. Eager calls skip the dispatcher; traced ones go through the ops.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .. import _core
from .. import _scalemm as _C
from .._arrays import DTYPE_CODE, torch_dtype
from .._errors import UnsupportedError
from ._autograd import _transpose_fp8
from ._runtime import _dispatch_modes, _is_compiling
from ._runtime import _stream as _stream_of
from .quantizers import _tokens_padded

_MODE = {False: 0, True: 2}  # numerics::ScaleMode kDefault, kAmaxPow2
_GROUPED_RECIPES = ("block1x128", "mxfp8")  # quantize::quantize_grouped's: 1D blocks along the tokens


def _mode(recipe: str, pow2: bool) -> int:
    """The scale mode of power_of_two_scales: MX scales are E8M0, powers of two already (their default mode)."""
    return _MODE[bool(pow2) and not recipe.startswith("mxfp8")]
_FMT = 0  # compact scales
_SRC = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}


def _tracing() -> bool:
    return _is_compiling() or _dispatch_modes()


def _stream(t: torch.Tensor) -> int:
    return _stream_of(t.device.index)


def fused_applies(x: torch.Tensor) -> bool:
    """Whether the fused kernels run for activations x: CUDA, 16-bit, and a library that has them."""
    return x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and hasattr(_C, "moe_route")


def _outputs(x, rows_m, cols, rows, recipe, rowwise=True, columnwise=True):
    r = _core.recipe_code(recipe, "recipe")
    sdt = torch_dtype(_core.scale_dtype_name(r))
    out = ()
    if rowwise:
        out += (x.new_empty((rows_m, cols), dtype=torch.float8_e4m3fn),
                x.new_empty(_core.scale_shape(r, rows_m, cols, _FMT), dtype=sdt))
    if columnwise:
        out += (x.new_empty((cols, rows), dtype=torch.float8_e4m3fn),
                x.new_empty(_core.scale_shape(r, cols, rows, _FMT), dtype=sdt))
    return r, out


def _ptr(t: Optional[torch.Tensor]) -> int:
    return 0 if t is None else t.data_ptr()


# ---- routing ---------------------------------------------------------------------------------------------

def route_torch(top_k_index: torch.Tensor, num_experts: int):
    """moe_route in torch index ops (the reference of the kernel's stable counting sort)."""
    t, k = top_k_index.shape
    flat = top_k_index.reshape(-1).long()
    valid = (flat >= 0) & (flat < num_experts)
    key = torch.where(valid, flat, num_experts)
    order = torch.argsort(key, stable=True)
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=flat.device).scatter_add_(0, key,
                                                                                            torch.ones_like(key))
    sizes = torch.cat([counts[:num_experts - 1], counts[num_experts - 1:num_experts] + counts[num_experts:]])
    pos = torch.empty_like(flat).scatter_(0, order, torch.arange(t * k, device=flat.device))
    pos = torch.where(valid, pos, -1).view(t, k)
    row_pair = torch.where(valid[order], order, -1)
    return pos, row_pair, sizes


_ROUTE_MAX_EXPERTS = 4096  # moe::route keeps a cursor per expert in shared memory


def _route_impl(top_k_index, num_experts, fused):
    if not (fused and top_k_index.is_cuda and num_experts <= _ROUTE_MAX_EXPERTS):
        return route_torch(top_k_index, num_experts)
    t, k = top_k_index.shape
    idx = top_k_index.to(torch.int64).contiguous()
    pos = torch.empty((t, k), dtype=torch.int64, device=idx.device)
    row_pair = torch.empty((t * k,), dtype=torch.int64, device=idx.device)
    sizes = torch.empty((num_experts,), dtype=torch.int64, device=idx.device)
    ws = torch.empty((_C.moe_route_workspace_bytes(t * k, num_experts),), dtype=torch.uint8, device=idx.device)
    _C.moe_route(idx.data_ptr(), t, k, num_experts, pos.data_ptr(), row_pair.data_ptr(), sizes.data_ptr(),
                 ws.data_ptr(), ws.numel(), 1, _stream(idx))
    return pos, row_pair, sizes


def _route_host(top_k_index, num_experts):
    """The library's counting sort on host memory (moe::route's host branch): the kernel's arithmetic."""
    t, k = top_k_index.shape
    idx = top_k_index.to(torch.int64).contiguous()
    pos, row_pair = torch.empty((t, k), dtype=torch.int64), torch.empty((t * k,), dtype=torch.int64)
    sizes = torch.empty((num_experts,), dtype=torch.int64)
    _C.moe_route(idx.data_ptr(), t, k, num_experts, pos.data_ptr(), row_pair.data_ptr(), sizes.data_ptr(), 0, 0, 0,
                 0)
    return pos, row_pair, sizes


def _host_kernels(y, pos, weights=None, dout=None):
    """moe::combine (or, with dout, combine_weight_grad) on host tensors: the kernels' arithmetic."""
    t, k = pos.shape
    code = DTYPE_CODE[_SRC[y.dtype]]
    if dout is None:
        out = torch.empty((t, y.shape[1]), dtype=y.dtype)
        _C.moe_combine(y.data_ptr(), code, y.shape[0], y.shape[1], pos.data_ptr(), t, k, _ptr(weights),
                       out.data_ptr(), 0, 0)
        return out
    dw = torch.empty((t, k), dtype=torch.float32)
    _C.moe_combine_weight_grad(dout.data_ptr(), y.data_ptr(), code, y.shape[0], y.shape[1], pos.data_ptr(), t, k,
                               dw.data_ptr(), 0, 0)
    return dw


@torch.library.custom_op("scalemm::moe_route", mutates_args=())
def _route_op(top_k_index: torch.Tensor, num_experts: int, fused: bool) -> Tuple[torch.Tensor, torch.Tensor,
                                                                                  torch.Tensor]:
    return _route_impl(top_k_index, num_experts, fused)


@_route_op.register_fake
def _(top_k_index, num_experts, fused):
    t, k = top_k_index.shape
    i64 = dict(dtype=torch.int64)
    return (top_k_index.new_empty((t, k), **i64), top_k_index.new_empty((t * k,), **i64),
            top_k_index.new_empty((num_experts,), **i64))


def route(top_k_index, num_experts, fused):
    return (_route_op if _tracing() else _route_impl)(top_k_index, num_experts, fused)


# ---- quantizers ----------------------------------------------------------------------------------------

def _quantize_dense(x, recipe, pow2, rowwise=True, columnwise=False):
    """The library's quantizer (host emulator for CPU tensors) in the given scale mode."""
    x = x.contiguous()
    rows, cols = x.shape
    r, out = _outputs(x, rows, cols, rows, recipe, rowwise, columnwise)
    if not hasattr(_C, "quantize_mode"):
        if pow2:
            raise UnsupportedError("power_of_two_scales: this build of the extension has no scale-mode quantizer "
                                   "(quantize_mode). Rebuild the extension from this checkout.")
        full = _core.quantize_impl(x, recipe, "e4m3", "compact", columnwise)
        return tuple(full) if rowwise and columnwise else (full[:2] if rowwise else full[2:])
    d = list(out) if rowwise else [None, None] + list(out)
    if not columnwise:
        d += [None, None]
    ctx = torch.cuda.device(x.device) if x.is_cuda else _nullctx()
    with ctx:
        _C.quantize_mode(x.data_ptr(), DTYPE_CODE[_SRC[x.dtype]], rows, cols, r, DTYPE_CODE["e4m3"], _FMT,
                         _mode(recipe, pow2), *(_ptr(t) for t in d), 1 if x.is_cuda else 0, _stream(x) if x.is_cuda else 0)
    return out


class _nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def gather_rows(x, gather, row_weight):
    """x[gather[r]] (zero rows for gather -1), times row_weight[r] in fp32 rounded to x's type."""
    g = x[gather.clamp(min=0)]
    if row_weight is not None:
        g = (g.float() * row_weight[:, None]).to(x.dtype)
    return torch.where((gather >= 0)[:, None], g, torch.zeros((), dtype=x.dtype, device=x.device))


def _quantize_tokens_impl(x, gather, row_weight, sizes, rows, recipe, pow2, fused):
    x = x.contiguous()
    grouped = (x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and recipe in _GROUPED_RECIPES
               and hasattr(_C, "quantize_grouped_rows"))
    if gather is not None and not (fused and grouped):
        x, gather, row_weight = gather_rows(x, gather, row_weight), None, None
    rows_m, cols = (gather.shape[0] if gather is not None else x.shape[0]), x.shape[1]
    if not grouped:  # host, rowwise (its columnwise scales span every token: no grouped kernel) or an older
        # extension: the grouped quantizer's contract, two dense calls
        rowwise = _quantize_dense(x, recipe, pow2)
        return tuple(rowwise) + tuple(_quantize_dense(_tokens_padded(x, sizes, rows), recipe, pow2, False, True))
    r, out = _outputs(x, rows_m, cols, rows, recipe)
    with torch.cuda.device(x.device):
        _C.quantize_grouped_rows(x.data_ptr(), DTYPE_CODE[_SRC[x.dtype]], rows_m, cols, r, DTYPE_CODE["e4m3"], _FMT,
                                 _mode(recipe, pow2), sizes.data_ptr(), sizes.shape[0], rows, _ptr(gather), x.shape[0],
                                 _ptr(row_weight), *(t.data_ptr() for t in out), _stream(x))
    return out


@torch.library.custom_op("scalemm::moe_quantize_tokens", mutates_args=())
def _quantize_tokens_op(x: torch.Tensor, gather: Optional[torch.Tensor], row_weight: Optional[torch.Tensor],
                        sizes: torch.Tensor, rows: int, recipe: str, power_of_two: bool,
                        fused: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _quantize_tokens_impl(x, gather, row_weight, sizes, rows, recipe, power_of_two, fused)


@_quantize_tokens_op.register_fake
def _(x, gather, row_weight, sizes, rows, recipe, power_of_two, fused):
    return _outputs(x, gather.shape[0] if gather is not None else x.shape[0], x.shape[1], rows, recipe)[1]


def quantize_tokens(x, gather, row_weight, sizes, rows, recipe, pow2, fused):
    if row_weight is not None:
        row_weight = row_weight.float().contiguous()
    return (_quantize_tokens_op if _tracing() else _quantize_tokens_impl)(x, gather, row_weight, sizes, rows, recipe,
                                                                         pow2, fused)


def swiglu_fused_applies(x: torch.Tensor, recipe: str) -> bool:
    """Whether the default gate runs inside the grouped quantizers (moe_quantize_swiglu): CUDA 16-bit
    activations, a 1D-block recipe and a library that has the kernel. Otherwise torch's SwiGLU
    kernels run between the projections and autograd differentiates them (the same bytes)."""
    return fused_applies(x) and recipe in ("block1x128", "mxfp8") and hasattr(_C, "quantize_grouped_swiglu")


def swiglu_torch(gate_up, grad):
    """silu(gate) * up of gate_up's [gate | up] halves, or with grad (the product's gradient) the cat of
    both halves' gradients, as torch's eager kernels (and autograd through them) round it."""
    gate, up = gate_up.chunk(2, -1)
    if grad is None:
        return torch.nn.functional.silu(gate) * up
    return torch.cat([torch.ops.aten.silu_backward(grad * up, gate), grad * torch.nn.functional.silu(gate)], -1)


def _quantize_swiglu_impl(gate_up, grad, sizes, rows, recipe, pow2, fused):
    gate_up = gate_up.contiguous()
    grad = None if grad is None else grad.contiguous()
    if not (fused and swiglu_fused_applies(gate_up, recipe)):
        return _quantize_tokens_impl(swiglu_torch(gate_up, grad), None, None, sizes, rows, recipe, pow2, fused)
    src = gate_up if grad is None else grad
    rows_m, inter = gate_up.shape[0], gate_up.shape[1] // 2
    r, out = _outputs(gate_up, rows_m, inter if grad is None else 2 * inter, rows, recipe)
    with torch.cuda.device(gate_up.device):
        _C.quantize_grouped_swiglu(0 if grad is None else 1, src.data_ptr(), DTYPE_CODE[_SRC[src.dtype]], rows_m, inter,
                                   r, DTYPE_CODE["e4m3"], _FMT, _mode(recipe, pow2), gate_up.data_ptr(), sizes.data_ptr(),
                                   sizes.shape[0], rows, *(t.data_ptr() for t in out), _stream(gate_up))
    return out


@torch.library.custom_op("scalemm::moe_quantize_swiglu", mutates_args=())
def _quantize_swiglu_op(gate_up: torch.Tensor, grad: Optional[torch.Tensor], sizes: torch.Tensor, rows: int,
                        recipe: str, power_of_two: bool,
                        fused: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _quantize_swiglu_impl(gate_up, grad, sizes, rows, recipe, power_of_two, fused)


@_quantize_swiglu_op.register_fake
def _(gate_up, grad, sizes, rows, recipe, power_of_two, fused):
    cols = gate_up.shape[1] // 2 if grad is None else gate_up.shape[1]
    return _outputs(gate_up, gate_up.shape[0], cols, rows, recipe)[1]


def quantize_swiglu_tokens(gate_up, grad, sizes, rows, recipe, pow2, fused):
    """moe_quantize_tokens of silu(gate) * up (grad None) or of [d gate | d up] (grad: the product's
    gradient dh (M, I)), gate_up the gate_up projection's (M, 2I) output, without writing either."""
    return (_quantize_swiglu_op if _tracing() else _quantize_swiglu_impl)(gate_up, grad, sizes, rows, recipe, pow2,
                                                                         fused)


@torch.library.custom_op("scalemm::moe_quantize_weights", mutates_args=())
def _quantize_weights_op(w: torch.Tensor, recipe: str, power_of_two: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    return tuple(_quantize_dense(w, recipe, power_of_two))


@_quantize_weights_op.register_fake
def _(w, recipe, power_of_two):
    return _outputs(w, w.shape[0], w.shape[1], w.shape[0], recipe, True, False)[1]


def quantize_weights(w, recipe, pow2):
    return (_quantize_weights_op if _tracing() else _quantize_dense)(w, recipe, pow2)


# W and W^T of a square-block weight recipe in one pass per expert: the 2D quantizer writes a block's
# columnwise copy from the tile it already holds (the same bytes as W's transpose: one scale per block).
# One launch per expert, so only where the experts are few and each one's matrix fills the GPU.
_PAIR_MAX_EXPERTS = 32
_PAIR_MIN_ELEMENTS = 1 << 22


def _pair_applies(w) -> bool:
    e, n, k = w.shape
    return hasattr(_C, "quantize_mode") and e <= _PAIR_MAX_EXPERTS and n * k >= _PAIR_MIN_ELEMENTS


def _quantize_pair_impl(w, recipe, pow2):
    e, n, k = w.shape
    w = w.contiguous()
    r = _core.recipe_code(recipe, "recipe")
    wq, ws, wtq, wts = _pair_outputs(w, recipe)
    src, mode = DTYPE_CODE[_SRC[w.dtype]], _mode(recipe, pow2)
    cuda, stream = (1, _stream(w)) if w.is_cuda else (0, 0)
    with torch.cuda.device(w.device) if w.is_cuda else _nullctx():
        for i in range(e):
            _C.quantize_mode(w[i].data_ptr(), src, n, k, r, DTYPE_CODE["e4m3"], _FMT, mode, wq[i].data_ptr(),
                             ws[i].data_ptr(), wtq[i].data_ptr(), wts[i].data_ptr(), cuda, stream)
    return wq, ws, wtq, wts


def _pair_outputs(w, recipe):
    e, n, k = w.shape
    r = _core.recipe_code(recipe, "recipe")
    sdt = torch_dtype(_core.scale_dtype_name(r))
    f8 = torch.float8_e4m3fn
    return (w.new_empty((e, n, k), dtype=f8), w.new_empty((e, *_core.scale_shape(r, n, k, _FMT)), dtype=sdt),
            w.new_empty((e, k, n), dtype=f8), w.new_empty((e, *_core.scale_shape(r, k, n, _FMT)), dtype=sdt))


# Traced (torch.compile), the pair runs as this op. The unfused form there (a quantizer pass, then a byte
# transpose) became inductor's strided copy: 5.6 ms for Mixtral's gate_up weights, of a 21 ms layer step.
@torch.library.custom_op("scalemm::moe_quantize_weight_pair", mutates_args=())
def _quantize_pair_op(w: torch.Tensor, recipe: str,
                      power_of_two: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _quantize_pair_impl(w, recipe, power_of_two)


@_quantize_pair_op.register_fake
def _(w, recipe, power_of_two):
    return _pair_outputs(w, recipe)


def quantize_weight_pair(w, recipe, pow2):
    """((W, W scales), (W^T, W^T scales)) FP8 operands of (E, N, K) weights, W^T (E, K, N), each expert's
    scales a compact grid; None where the one-pass form does not apply (many or small experts)."""
    if not _pair_applies(w):
        return None
    wq, ws, wtq, wts = (_quantize_pair_op if _tracing() else _quantize_pair_impl)(w, recipe, pow2)
    return (wq, ws), (wtq, wts)


@torch.library.custom_op("scalemm::transpose_bytes", mutates_args=())
def _transpose_op(t: torch.Tensor) -> torch.Tensor:
    return _transpose_fp8(t.contiguous())


@_transpose_op.register_fake
def _(t):
    return t.new_empty((*t.shape[:-2], t.shape[-1], t.shape[-2]))


def transpose_fp8(t):
    """The last two dimensions of a 1-byte tensor swapped, contiguous: the library's tiled kernel, also when
    traced (inductor's strided copy of 1-byte elements ran at a fraction of the bandwidth)."""
    return _transpose_op(t) if _tracing() and t.is_cuda else _transpose_fp8(t)


# ---- combine -------------------------------------------------------------------------------------------

def combine_torch(y, pos, weights):
    t, k = pos.shape
    valid = (pos >= 0)[..., None]
    g = y[pos.clamp(min=0)]
    acc = torch.zeros((t, y.shape[1]), dtype=torch.float32, device=y.device)
    for j in range(k):  # k order, one rounding per product and per sum (the kernel's arithmetic)
        term = g[:, j].float() if weights is None else g[:, j].float() * weights[:, j, None]
        acc = acc + torch.where(valid[:, j], term, 0.0)
    return acc.to(y.dtype)


def _combine_impl(y, pos, weights, fused):
    if not (fused and y.is_cuda):
        return combine_torch(y, pos, weights)
    y, pos = y.contiguous(), pos.contiguous()
    t, k = pos.shape
    out = torch.empty((t, y.shape[1]), dtype=y.dtype, device=y.device)
    _C.moe_combine(y.data_ptr(), DTYPE_CODE[_SRC[y.dtype]], y.shape[0], y.shape[1], pos.data_ptr(), t, k,
                   _ptr(weights), out.data_ptr(), 1, _stream(y))
    return out


@torch.library.custom_op("scalemm::moe_combine", mutates_args=())
def _combine_op(y: torch.Tensor, pos: torch.Tensor, weights: Optional[torch.Tensor], fused: bool) -> torch.Tensor:
    return _combine_impl(y, pos, weights, fused)


@_combine_op.register_fake
def _(y, pos, weights, fused):
    return y.new_empty((pos.shape[0], y.shape[1]))


def combine(y, pos, weights, fused):
    if weights is not None:
        weights = weights.float().contiguous()
    return (_combine_op if _tracing() else _combine_impl)(y, pos, weights, fused)


def combine_weight_grad_torch(dout, y, pos):
    g = y[pos.clamp(min=0)].double()
    dw = (g * dout.double()[:, None, :]).sum(-1).float()
    return torch.where(pos >= 0, dw, 0.0)


def _weight_grad_impl(dout, y, pos, fused):
    if not (fused and y.is_cuda):
        return combine_weight_grad_torch(dout, y, pos)
    dout, y, pos = dout.contiguous(), y.contiguous(), pos.contiguous()
    t, k = pos.shape
    dw = torch.empty((t, k), dtype=torch.float32, device=y.device)
    _C.moe_combine_weight_grad(dout.data_ptr(), y.data_ptr(), DTYPE_CODE[_SRC[y.dtype]], y.shape[0], y.shape[1],
                               pos.data_ptr(), t, k, dw.data_ptr(), 1, _stream(y))
    return dw


@torch.library.custom_op("scalemm::moe_combine_weight_grad", mutates_args=())
def _weight_grad_op(dout: torch.Tensor, y: torch.Tensor, pos: torch.Tensor, fused: bool) -> torch.Tensor:
    return _weight_grad_impl(dout, y, pos, fused)


@_weight_grad_op.register_fake
def _(dout, y, pos, fused):
    return y.new_empty(tuple(pos.shape), dtype=torch.float32)


def combine_weight_grad(dout, y, pos, fused):
    return (_weight_grad_op if _tracing() else _weight_grad_impl)(dout, y, pos, fused)
