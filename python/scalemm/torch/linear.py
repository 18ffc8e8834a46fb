"""FP8 linear layers: Float8Linear (one recipe of config.LINEAR_RECIPES, its options a Float8LinearConfig),
Float8BlockwiseLinear and MXLinear, and the autograd function of their three GEMMs."""

from __future__ import annotations

from typing import Optional

import torch

from .. import _core
from ._autograd import _as_rows, _check_not_released, _layer_gemm, _quantize_parts, _release, _wgrad
from ._runtime import _NAMES, _dispatch_modes, _is_compiling, _name
from .config import DEFAULTS, Float8LinearConfig, _recipe_name
from .fsdp import _GatheredFloat8Weight, _plain

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
    def forward(ctx, x, weight, bias, act, wgt, wq, fmt, fast_accum, keep_saved=False, pow2=False):
        x2 = _as_rows(x)
        if ctx.needs_input_grad[1]:
            xq, xs, xtq, xts = _quantize_parts(x2, act, fmt, True, True, pow2)
        else:  # a frozen weight (adapters, inference under autograd): no wgrad, so no X^T to write or keep
            (xq, xs), xtq, xts = _quantize_parts(x2, act, fmt, True, False, pow2), None, None
        if isinstance(weight, _GatheredFloat8Weight):  # FSDP2 gathered it in FP8
            if pow2:
                raise _core.invalid("power_of_two_scales", "power-of-two scales on every operand", "False with an "
                                    "FP8 all-gathered weight", "True", "The gathered weight's scales are the "
                                    "default mode's; convert with fsdp_float8_all_gather=False for power-of-two "
                                    "scales.")
            wq, ws = weight.operand(fmt)
        else:
            wq, ws = wq if wq is not None else _quantize_parts(_plain(weight), wgt, fmt, True, False, pow2)
        out_dtype = x.dtype if x.dtype in _NAMES else torch.bfloat16
        y = _layer_gemm(xq, wq, xs, ws, act, wgt, _name(out_dtype), fmt, fast_accum)
        if bias is not None:
            y = y + bias.to(y.dtype)
        ctx.save_for_backward(xtq, xts, weight)
        ctx.keep_saved = keep_saved
        ctx.recipes = (act, wgt, fmt, pow2)
        ctx.shapes = (x.shape, x.dtype, weight.dtype, None if bias is None else bias.dtype)
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        _check_not_released(ctx, "Float8Linear")
        xtq, xts, weight = ctx.saved_tensors
        act, wgt, fmt, pow2 = ctx.recipes
        x_shape, x_dtype, w_dtype, bias_dtype = ctx.shapes
        dy2 = _as_rows(dy)
        # dY along N for dgrad, dY^T for wgrad: only the directions a gradient asked for are written.
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dyq = dys = dytq = dyts = None
        if need_x and need_w:
            dyq, dys, dytq, dyts = _quantize_parts(dy2, act, fmt, True, True, pow2)
        elif need_x:
            dyq, dys = _quantize_parts(dy2, act, fmt, True, False, pow2)
        elif need_w:
            dytq, dyts = _quantize_parts(dy2, act, fmt, False, True, pow2)
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
                wtq, wts = _quantize_parts(_plain(weight), wgt, fmt, False, True, pow2)
            dx = _layer_gemm(dyq, wtq, dys, wts, act, wgt, _name(x_dtype), fmt)
            dx = dx.reshape(x_shape)
        if bias_dtype is not None and ctx.needs_input_grad[2]:
            db = dy2.float().sum(0).to(bias_dtype)
        return dx, dw, db, None, None, None, None, None, None, None


# Optimizer steps seen in this process: a cached weight quantization is kept only within one. The version
# counter alone misses fused optimizer kernels (AdamW(fused=True) updates parameters without bumping it).
_optimizer_steps = [0]
_step_hook = []  # the counter's hook handle, once the weight cache is first used


def _count_step(optimizer, args, kwargs):
    _optimizer_steps[0] += 1


def _count_optimizer_steps():
    """Registers the step counter on the weight cache's first use, not at import: a process that never
    caches a weight keeps torch's global optimizer hooks as they were (no cached copy exists before the
    first use, so the steps before it need no counting)."""
    if not _step_hook:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _step_hook.append(register_optimizer_step_post_hook(_count_step))


# One Float8LinearConfig per set of option values (a process has a handful): a forward reads its layer's
# config without building one (a frozen dataclass takes microseconds to construct).
_configs: dict = {}


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

    power_of_two_scales (off by default): every scale of the three GEMMs' operands a power of two (the
    library's amax-pow2 mode; TransformerEngine's Float8BlockScaling constraint), the bytes of
    scalemm.torch.quantize(..., power_of_two_scales=True); MX scales are powers of two already.

    Options: recipe, scale_format, cache_weight, min_gflop, fast_accum, keep_saved and power_of_two_scales are class
    attributes with config.Float8LinearConfig's defaults, set on a layer or a class; `layer.config`
    returns them as one frozen Float8LinearConfig, which the forward reads.
    """

    # The options (config.Float8LinearConfig, where each is described): class attributes that a layer or a
    # subclass overrides, read together as `config` on every forward.
    recipe = DEFAULTS.recipe
    cache_weight = DEFAULTS.cache_weight
    scale_format = DEFAULTS.scale_format
    min_gflop = DEFAULTS.min_gflop
    fast_accum = DEFAULTS.fast_accum
    keep_saved = DEFAULTS.keep_saved
    power_of_two_scales = DEFAULTS.power_of_two_scales

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

    @property
    def config(self) -> Float8LinearConfig:
        """The layer's options as one value, read from its attributes (its own, else its class's)."""
        values = (self.recipe, self.scale_format, self.cache_weight, self.min_gflop, self.fast_accum, self.keep_saved,
                  self.power_of_two_scales)
        if _is_compiling():  # traced: a constant of the graph, and no guard on the module's dict of configs
            return Float8LinearConfig(*values)
        c = _configs.get(values)
        if c is None:
            c = Float8LinearConfig(*values)
            if len(_configs) < 1024:
                _configs[values] = c
        return c

    def _cached_weight(self, config: Float8LinearConfig, wgt):
        w = self.weight
        if (not config.cache_weight or _is_compiling() or type(w) is not torch.nn.Parameter or not w.is_cuda
                or _dispatch_modes() or torch.cuda.is_current_stream_capturing()):
            return None  # a captured step quantizes in the graph: a cache hit would replay a stale weight
        _count_optimizer_steps()
        key = (_optimizer_steps[0], w._version, w.data_ptr(), w.dtype, tuple(w.shape), w.device, wgt,
               config.scale_format, config.power_of_two_scales)
        c = self.__dict__.get("_weight_q")
        if c is None or c[0] != key:
            with torch.no_grad():
                c = (key, _quantize_parts(w.detach(), wgt, config.scale_format, True, False, config.power_of_two_scales))
            self.__dict__["_weight_q"] = c
        return c[1]

    def forward(self, x):
        c = self.config
        if c.min_gflop and 2e-9 * (x.numel() // self.in_features) * self.in_features * self.out_features \
                < c.min_gflop:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        act, wgt = c.recipes
        return _ScaledLinearFn.apply(x, self.weight, self.bias, act, wgt, self._cached_weight(c, wgt), c.scale_format,
                                     c.forward_fast_accum, c.keep_saved, c.power_of_two_scales)

    def extra_repr(self):
        act, wgt = self.config.recipes
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

