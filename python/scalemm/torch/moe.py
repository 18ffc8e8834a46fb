"""FP8 experts of an MoE layer in the shape transformers' experts functions take:

    experts_forward(hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj, *, num_experts,
                    recipe="blockwise", apply_gate=None, gate_up_bias=None, down_bias=None,
                    is_transposed=False, power_of_two_scales=False) -> Tensor (T, H)

hidden_states (T, H); top_k_index (T, k) integer expert ids; top_k_weights (T, k) routing weights (any
float dtype; their gradient comes back in that dtype). gate_up_proj (E, 2I, H) ((E, H, 2I) when
is_transposed), down_proj (E, H, I) ((E, I, H) when is_transposed): the master weights, any of bf16, f16,
f32, used as they are (same parameters, same optimizer); H and I multiples of 128. gate_up_bias (E, 2I)
and down_bias (E, H) optional. apply_gate(gate_up_out (R, 2I)) -> (R, I): default SiLU(gate) * up on the
halves [gate | up] (transformers' default `_apply_gate`); any function of torch ops (differentiated by
autograd). Returns out[t] = sum_k w[t, k] * expert_{id[t, k]}(x[t]) in hidden_states.dtype.

recipe (RECIPES): "blockwise" (1x128 activations and gradients, 128x128 weights), "rowwise" (a scale per
row; wgrad's columnwise operands a scale per feature over every token; dgrad's W^T requantized from the
master weights along N) or "mxfp8" (1x32 E8M0 blocks, 32x32 weights). What runs, per call:
  1. routing: the T k (token, k) pairs sorted by expert, stable (pairs of one expert keep token order),
     on the device; ids outside [0, num_experts) are expert-parallel sentinels, sorted after every
     expert: their rows are zero, counted in the last expert's group (the grouped GEMMs' sizes then sum
     to T k) and never read back, so they contribute exactly 0 to the output and to every gradient;
  2. dispatch: the tokens' rows gathered into that expert-major order and quantized, rowwise for the
     forward GEMM and columnwise (each expert's rows from a 128-column boundary) for wgrad;
  3. up = X W1_e^T (m-grouped FP8 GEMM, bf16 out) [+ gate_up_bias], h = apply_gate(up);
  4. y = h W2_e^T (m-grouped FP8 GEMM) [+ down_bias];
  5. combine: out[t] = sum_k w[t, k] y[pos(t, k)], in fp32 in k order, no atomics (deterministic).
  Backward: dgrad m-grouped and wgrad k-grouped (group sizes read on the device) of both projections
  in FP8; the down projection's output gradient is the gathered, routing-weighted dout (w[t, k] dout[t]
  rounded to dout's type) quantized in one pass; d top_k_weights[t, k] = <dout[t], y[pos(t, k)]>
  (fp64 sums, rounded to fp32); d hidden_states[t] = sum_k dX[pos(t, k)] (fp32, k order). Experts with
  no tokens get zero weight gradients.

Fused (CUDA tensors, 16-bit activations): routing is one stable counting sort (scalemm::moe_route),
the dispatch gather happens inside the grouped quantizer (scalemm::moe_quantize_tokens with a gather
index and optional row weights), combine and the weights' gradient are one kernel each (moe_combine,
moe_combine_weight_grad). Elsewhere (CPU tensors: the library's host emulator) the same ops run as torch
index ops with the same bytes. fp32 hidden states are cast to bf16 on the way in (the quantizer's source
type) and the output cast back. Weights given transposed are transposed (a copy) before quantization.

Blockwise: no host synchronisation anywhere (sizes stay on the device), so a call is CUDA-graph capturable after
one eager warm-up of its shapes on the capturing stream, and every op has a fake implementation, so
torch.compile(fullgraph=True) traces it (tested on the GPU: set_sync_debug_mode("error") over forward
and backward, graph replays bit-identical to eager calls, a compiled step; fused and unfused calls
write the same bytes, but for d top_k_weights, whose fp64 sums may differ in fp32's last bit).
rowwise and mxfp8 read the sizes back once per call where the library's grouped backends for them take
host sizes only (HOST_SIZES, HOST_SIZES_REASON): not capturable, not sync-free; traced calls hand the
device sizes to the library, which reads them itself.
Deterministic: no floating-point atomics (the biases' gradients go through torch's sorted index_put).
power_of_two_scales=True rounds every scale of the call (both projections, forward and backward) to a
power of two (TransformerEngine's Float8BlockScaling constraint; the library's "amax-pow2" scale mode;
mxfp8's E8M0 scales are powers of two as they are).

Memory kept for backward: per projection the FP8 columnwise copy of its input (x^T, h^T: rows padded
per expert to 128) and the FP8 transpose of its weight; the down projection's bf16 output y (M, H),
for d top_k_weights; whatever apply_gate's autograd keeps (the default: gate_up_out (M, 2I)). A second
backward through one graph (retain_graph=True) works: nothing is freed early.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from .. import _core
from . import moe_ops as ops
from .ops import scaled_grouped_mm

# recipe: (activations and gradients, weights), the dense layers' pairs (config.LINEAR_RECIPES).
RECIPES = {"blockwise": ("block1x128", "block128x128"), "rowwise": ("rowwise", "rowwise"),
           "mxfp8": ("mxfp8", "mxfp8-32x32")}
_SQUARE = ("block128x128", "mxfp8-32x32")  # weight recipes whose dgrad operand is the exact transpose of W's
# The grouped GEMM forms (m: forward and dgrad, k: wgrad) whose backend in the library needs the group
# sizes on the host, per recipe, and why (on sm_90; docs/grouped.md): those the engine reads back once
# per call (see HOST_SIZES_REASON). Blockwise runs all three on device-side sizes.
HOST_SIZES = {"blockwise": "", "rowwise": "k", "mxfp8": "mk"}
HOST_SIZES_REASON = {
    "blockwise": None,
    "rowwise": "rowwise wgrad (k-grouped) runs the CUTLASS grouped kernel with the sizes on the host (it takes "
               "no device-side sizes for rowwise k-grouped calls): backward reads the padded sizes back once "
               "per call, one synchronisation; forward and dgrad (m-grouped) stay on device-side sizes",
    "mxfp8": "mxfp8 grouped GEMMs run the per-group backend (on Hopper the exact emulation), which takes the "
             "sizes on the host: the first GEMM of a call reads them back, one synchronisation per call",
}


def _default_gate(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, -1)
    return torch.nn.functional.silu(gate) * up


def _check(hidden, top_k_index, top_k_weights, w1, w2, num_experts, recipe, is_transposed):
    if recipe not in RECIPES:
        raise _core.invalid("recipe", "a recipe experts_forward runs", " or ".join(RECIPES), str(recipe))
    if hidden.dim() != 2:
        raise _core.invalid("hidden_states", "tokens as rows", "(T, H)", str(tuple(hidden.shape)))
    t, h = hidden.shape
    if top_k_index.dim() != 2 or top_k_index.shape[0] != t or top_k_index.is_floating_point():
        raise _core.invalid("top_k_index", "k integer expert ids per token", f"an integer ({t}, k) tensor",
                            f"{top_k_index.dtype} {tuple(top_k_index.shape)}")
    if tuple(top_k_weights.shape) != tuple(top_k_index.shape):
        raise _core.invalid("top_k_weights", "one routing weight per (token, k)", str(tuple(top_k_index.shape)),
                            str(tuple(top_k_weights.shape)))
    if num_experts < 1:
        raise _core.invalid("num_experts", "at least one expert", ">= 1", str(num_experts))
    if w1.dim() != 3 or w1.shape[0] != num_experts or w1.shape[1 if is_transposed else 2] != h:
        want = f"({num_experts}, {h}, 2I)" if is_transposed else f"({num_experts}, 2I, {h})"
        raise _core.invalid("gate_up_proj", "the experts' stacked gate and up projections", want,
                            str(tuple(w1.shape)))
    two_i = w1.shape[2 if is_transposed else 1]
    want = (num_experts, two_i // 2, h) if is_transposed else (num_experts, h, two_i // 2)
    if two_i % 2 or tuple(w2.shape) != want:
        raise _core.invalid("down_proj", "the experts' down projections", str(want), str(tuple(w2.shape)))
    for name, v in (("hidden size H", h), ("intermediate size I", two_i // 2)):
        if v % 128 or v == 0:
            raise _core.invalid("gate_up_proj" if "I" in name else "hidden_states",
                                f"128x128 weight blocks: the {name} a multiple of 128", "a positive multiple of 128",
                                str(v), "Pad the experts to a multiple of 128.")


def _cfg(recipe, pow2, fused, host=None):
    """What a call's two Functions share, as constants (torch.compile traces them as such):
    (activation recipe, weight recipe, power-of-two scales, fused kernels, the call's _HostSizes or None)."""
    act, wgt = RECIPES[recipe]
    return act, wgt, pow2, fused, host


class _HostSizes:
    """A call's group sizes (m-grouped GEMMs) and padded sizes (k-grouped) as host integers for the forms
    in `forms`, read back when a GEMM of those forms first runs (one synchronisation for the call),
    kept for the call's backward. Eager calls only: a traced call hands the library the device sizes."""

    __slots__ = ("sizes", "padded", "forms", "lists")

    def __init__(self, sizes, padded, forms):
        self.sizes, self.padded, self.forms, self.lists = sizes, padded, forms, None

    def of(self, group_dim, device_sizes):
        if group_dim not in self.forms:
            return device_sizes
        if self.lists is None:
            both = torch.cat([self.sizes, self.padded]).tolist()
            e = self.sizes.shape[0]
            self.lists = (both[:e], both[e:])
        return self.lists[0 if group_dim == "m" else 1]


def _tok(cfg):
    """quantize_tokens' (recipe, power_of_two, fused) of a call's constants."""
    return cfg[0], cfg[2], cfg[3]


def _weight_operands(w, cfg, dgrad):
    """(W, W^T) FP8 operands of (E, N, K) master weights: W for the forward GEMM, the exact transpose
    of its 128x128 blocks for dgrad (None when no dgrad runs)."""
    e, n, k = w.shape
    pair = ops.quantize_weight_pair(w, cfg[1], cfg[2]) if dgrad and cfg[1] in _SQUARE else None
    if pair is not None:
        return pair
    wq, ws = ops.quantize_weights(w.reshape(e * n, k), cfg[1], cfg[2])
    wq, ws = wq.view(e, n, k), ws.view(e, ws.shape[0] // e, *ws.shape[1:])  # (G, one expert's scale grid)
    if not dgrad:
        return (wq, ws), None
    if cfg[1] in _SQUARE:
        wts = ops.transpose_fp8(ws) if ws.element_size() == 1 else ws.transpose(1, 2).contiguous()  # E8M0 as bytes
        return (wq, ws), (ops.transpose_fp8(wq), wts)
    # Scales along K (rowwise): W^T's, along N, are not W's; quantize the transposed master weights.
    wtq, wts = ops.quantize_weights(w.transpose(1, 2).reshape(e * k, n), cfg[1], cfg[2])
    return (wq, ws), (wtq.view(e, k, n), wts.view(e, wts.shape[0] // e, *wts.shape[1:]))


def _grouped(a, b, sa, sb, sizes, cfg, od, group_dim="m"):
    ra, rb = (cfg[0], cfg[1]) if group_dim == "m" else (cfg[0], cfg[0])
    if cfg[4] is not None:
        sizes = cfg[4].of(group_dim, sizes)
    return scaled_grouped_mm(a, b, sa, sb, sizes, group_dim=group_dim, recipe_a=ra, recipe_b=rb, out_dtype=od)


def _od(dt) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}[dt]


def _wgrad(dyt, xt, padded, cfg, w_dtype):
    od = w_dtype if w_dtype in (torch.bfloat16, torch.float16, torch.float32) else torch.float32
    dw = _grouped(dyt[0], xt[0], dyt[1], xt[1], padded, cfg, _od(od), group_dim="k")
    return dw if dw.dtype == w_dtype else dw.to(w_dtype)


class _UpFn(torch.autograd.Function):
    """Dispatch and the gate_up projection: up (M, N) = X[rows] W1_e^T, X's rows gathered by row_token.
    Backward: d hidden_states = combine of dX's rows with unit weights, dW1 k-grouped."""

    @staticmethod
    def forward(ctx, x, w, row_token, pos, sizes, padded, rows, cfg):
        xq, xs, xtq, xts = ops.quantize_tokens(x, row_token, None, sizes, rows, *_tok(cfg))
        (wq, ws), wt = _weight_operands(w, cfg, ctx.needs_input_grad[0])
        up = _grouped(xq, wq, xs, ws, sizes, cfg, _od(x.dtype))
        del wq, ws
        ctx.save_for_backward(xtq, xts, *(wt or (None, None)), pos, sizes, padded)
        ctx.meta = (rows, cfg, w.dtype, x.dtype)
        return up

    @staticmethod
    def backward(ctx, dup):
        xtq, xts, wtq, wts, pos, sizes, padded = ctx.saved_tensors
        rows, cfg, w_dtype, x_dtype = ctx.meta
        dyq, dys, dytq, dyts = ops.quantize_tokens(dup.contiguous(), None, None, sizes, rows, *_tok(cfg))
        dw = _wgrad((dytq, dyts), (xtq, xts), padded, cfg, w_dtype) if ctx.needs_input_grad[1] else None
        del dytq, dyts, xtq, xts
        dx = None
        if ctx.needs_input_grad[0]:
            dx_rows = _grouped(dyq, wtq, dys, wts, sizes, cfg, _od(x_dtype))
            dx = ops.combine(dx_rows, pos, None, cfg[3])
        return dx, dw, None, None, None, None, None, None


class _DownFn(torch.autograd.Function):
    """The down projection and combine: out[t] = sum_k w[t, k] (h W2_e^T)[pos(t, k)]. Backward: the
    routing-weighted gathered dout quantized in one pass (dgrad, wgrad), d w from <dout[t], y[pos]>."""

    @staticmethod
    def forward(ctx, h, w, weights, row_pair, row_token, pos, sizes, padded, rows, cfg):
        hq, hs, htq, hts = ops.quantize_tokens(h, None, None, sizes, rows, *_tok(cfg))
        (wq, ws), wt = _weight_operands(w, cfg, ctx.needs_input_grad[0])
        y = _grouped(hq, wq, hs, ws, sizes, cfg, _od(h.dtype))
        del wq, ws, hq, hs
        out = ops.combine(y, pos, weights, cfg[3])
        ctx.save_for_backward(htq, hts, *(wt or (None, None)), y, weights, row_pair, row_token, pos, sizes, padded)
        ctx.meta = (rows, cfg, w.dtype, h.dtype)
        return out

    @staticmethod
    def backward(ctx, dout):
        htq, hts, wtq, wts, y, weights, row_pair, row_token, pos, sizes, padded = ctx.saved_tensors
        rows, cfg, w_dtype, h_dtype = ctx.meta
        dout = dout.contiguous()
        if dout.dtype != y.dtype:
            dout = dout.to(y.dtype)
        dweights = ops.combine_weight_grad(dout, y, pos, cfg[3]) if ctx.needs_input_grad[2] else None
        row_w = torch.where(row_pair >= 0, weights.reshape(-1)[row_pair.clamp(min=0)], 0.0)
        dyq, dys, dytq, dyts = ops.quantize_tokens(dout, row_token, row_w, sizes, rows, *_tok(cfg))
        dw = _wgrad((dytq, dyts), (htq, hts), padded, cfg, w_dtype) if ctx.needs_input_grad[1] else None
        del dytq, dyts, htq, hts
        dh = _grouped(dyq, wtq, dys, wts, sizes, cfg, _od(h_dtype)) if ctx.needs_input_grad[0] else None
        return dh, dw, dweights, None, None, None, None, None, None, None


def _padded(sizes, rows):
    """wgrad's k-grouped sizes: each expert's rows rounded up to 128, the last extended to `rows`."""
    padded = (sizes + 127) // 128 * 128
    return torch.cat([padded[:-1], padded[-1:] + (rows - padded.sum())])


def _row_bias(bias, sizes, rows_m):
    """bias[e(r)] for every sorted row r (E, C) -> (M, C): each row's expert from the group sizes."""
    ends = torch.cumsum(sizes, 0)
    expert = torch.searchsorted(ends, torch.arange(rows_m, device=sizes.device), right=True)
    return bias[expert.clamp_(max=sizes.shape[0] - 1)]


def experts_forward(hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                    gate_up_proj: torch.Tensor, down_proj: torch.Tensor, *, num_experts: int,
                    recipe: str = "blockwise", apply_gate: Optional[Callable] = None,
                    gate_up_bias: Optional[torch.Tensor] = None, down_bias: Optional[torch.Tensor] = None,
                    is_transposed: bool = False, power_of_two_scales: bool = False) -> torch.Tensor:
    """The experts of an MoE layer in FP8 from transformers' experts arguments: see the module docstring
    (scalemm.torch.moe) for shapes, what runs and what is fused."""
    return _forward(hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj, num_experts=num_experts,
                    recipe=recipe, apply_gate=apply_gate, gate_up_bias=gate_up_bias, down_bias=down_bias,
                    is_transposed=is_transposed, power_of_two_scales=power_of_two_scales, fused=None)


def _forward(hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj, *, num_experts, recipe="blockwise",
             apply_gate=None, gate_up_bias=None, down_bias=None, is_transposed=False, power_of_two_scales=False,
             fused=None):
    """experts_forward with the fused kernels chosen explicitly (fused=None: where they apply, see
    ops.fused_applies; False: the torch index ops), for tests that compare the two."""
    _check(hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj, num_experts, recipe, is_transposed)
    t, k = top_k_index.shape
    x = hidden_states if hidden_states.dtype in (torch.bfloat16, torch.float16) else hidden_states.to(torch.bfloat16)
    pow2 = _core.flag(power_of_two_scales, "power_of_two_scales")
    fused = ops.fused_applies(x) if fused is None else bool(fused)
    pos, row_pair, sizes = ops.route(top_k_index, num_experts, fused)
    row_token = torch.where(row_pair >= 0, torch.div(row_pair, k, rounding_mode="floor"), -1)
    m = t * k
    # scalemm::quantize::padded_token_rows, in Python so that a traced (symbolic) token count passes.
    rows = (m + 127 * num_experts + 127) // 128 * 128
    padded = _padded(sizes, rows)
    host = _HostSizes(sizes, padded, HOST_SIZES[recipe]) if HOST_SIZES[recipe] and not ops._tracing() else None
    cfg = _cfg(recipe, pow2, fused, host)
    w1 = gate_up_proj.transpose(1, 2).contiguous() if is_transposed else gate_up_proj
    w2 = down_proj.transpose(1, 2).contiguous() if is_transposed else down_proj
    up = _UpFn.apply(x, w1, row_token, pos, sizes, padded, rows, cfg)
    if gate_up_bias is not None:
        up = up + _row_bias(gate_up_bias, sizes, m).to(up.dtype)
    h = (apply_gate if apply_gate is not None else _default_gate)(up)  # no truth value of a bound method (fullgraph)
    if h.dtype != x.dtype:
        h = h.to(x.dtype)
    weights = top_k_weights.float()
    out = _DownFn.apply(h.contiguous(), w2, weights, row_pair, row_token, pos, sizes, padded, rows, cfg)
    if down_bias is not None:  # sum_k w[t, k] b[id[t, k]] over the real experts (linear in both)
        ids = top_k_index.long()
        valid = (ids >= 0) & (ids < num_experts)
        b = down_bias[ids.clamp(0, num_experts - 1)].float()
        out = out + (torch.where(valid, weights, 0.0)[..., None] * b).sum(1).to(out.dtype)
    return out if out.dtype == hidden_states.dtype else out.to(hidden_states.dtype)


__all__ = ["experts_forward", "RECIPES", "HOST_SIZES", "HOST_SIZES_REASON"]
