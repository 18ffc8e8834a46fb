"""MoE experts in FP8: Float8GroupedExperts and its autograd function, forward and dgrad m-grouped and
wgrad k-grouped through scaled_grouped_mm, the tokens quantized by torch.ops.scalemm.quantize_grouped."""

from __future__ import annotations

import torch

from .. import _core
from ._autograd import _check_not_released, _release, _transpose_fp8
from ._runtime import _NAMES, _direct, _name
from .config import _EXPERT_RECIPES
from .ops import scaled_grouped_mm
from .quantizers import _quantize_grouped_cuda, quantize

def _padded_sizes(sizes: torch.Tensor, rows: int) -> torch.Tensor:
    """Each expert's token count rounded up to 128 on the device (no synchronisation), the last one
    extended so that they sum to `rows` (scalemm._scalemm.padded_token_rows: a bound for any sizes
    that sum to T): the k-grouped sizes of the wgrad, whose 1x128 blocks along the tokens then never
    straddle two experts."""
    padded = (sizes + 127) // 128 * 128
    padded[-1] += rows - padded.sum()
    return padded


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

