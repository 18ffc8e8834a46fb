"""Float8MLP: an MLP block in FP8 (GELU between two projections, or SwiGLU's three) with its activation
fused into the quantizers (activations.py), and the autograd functions of its GEMMs."""

from __future__ import annotations

from typing import Optional

import torch

from .. import _core
from ._autograd import _as_rows, _check_not_released, _layer_gemm, _quantize_parts, _release, _wgrad
from ._runtime import _NAMES, _direct, _name
from .activations import _activation_torch, _quantize_activation_cuda, _quantize_swiglu_cuda
from .config import _MLP_ACTIVATIONS, _MLP_RECIPES, LINEAR_RECIPES
from .fsdp import _plain

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
    tests/test_mlp.py). recipe "blockwise" (1x128 activations, 128x128 weights) or "mxfp8".
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

