"""fp8_dot_general: a dense layer's three GEMMs in FP8, as scalemm.torch.Float8Linear runs them.

    forward  Y  (M, N) = X (act, along K)      . W (weight recipe, along K)
    dgrad    dX (M, K) = dY (act, along N)     . W^T (weight recipe, along N)
    wgrad    dW (N, K) = dY^T (act, along M)   . X^T (act, along M), written in W's dtype; run as
             dW^T (K, N) = X^T . dY^T with the same two operands swapped: the kernel's own layout

Flax's kernel is (K, N) = W^T, so W along K is the kernel's columnwise quantization and W^T along N its
rowwise one: the same blocks, hence the same bytes as Float8Linear's quantizations of W. Saved for
backward: X^T in FP8 (the forward's columnwise output) and W^T in FP8 (the kernel's rowwise output, from
the forward's one quantizer pass over the kernel)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .._errors import invalid
from ._ops import quantize_parts, scaled_mm_impl

# (activations and gradients, weights): Float8Linear's table.
LINEAR_RECIPES = {"blockwise": ("block1x128", "block128x128"), "rowwise": ("rowwise", "rowwise"),
                  "tensorwise": ("tensorwise", "tensorwise"), "mxfp8": ("mxfp8", "mxfp8-32x32")}
_FAST_ACCUM_RECIPES = ("rowwise", "tensorwise")
_NAMES = {jnp.dtype(jnp.bfloat16): "bf16", jnp.dtype(jnp.float16): "f16", jnp.dtype(jnp.float32): "f32"}


def _out_name(dtype, fallback="bf16") -> str:
    return _NAMES.get(jnp.dtype(dtype), fallback)


def _quantize(x, recipe, fmt, rowwise, columnwise, partitioned=True):
    return quantize_parts(x, recipe, "e4m3", fmt, rowwise, columnwise, partitioned)


def _forward(x, kernel, act, wgt, fmt, fast, save):
    k, n = kernel.shape
    x2 = x.reshape(-1, k)
    xq, xs, xtq, xts, _ = _quantize(x2, act, fmt, True, save)
    # W (N, K) along K; when training also W^T (K, N) along N for dgrad, from the same read of the kernel
    wtq, wts, wq, ws, _ = _quantize(kernel, wgt, fmt, save, True)
    y = scaled_mm_impl(xq, wq, xs, ws, act, wgt, _out_name(x.dtype), fmt, fast)
    return y.reshape(*x.shape[:-1], n), (xtq, xts, wtq, wts, jnp.zeros((0,), kernel.dtype),
                                         jnp.zeros((0,), x.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def _linear(x, kernel, act, wgt, fmt, fast):
    return _forward(x, kernel, act, wgt, fmt, fast, False)[0]


def _linear_fwd(x, kernel, act, wgt, fmt, fast):
    return _forward(x, kernel, act, wgt, fmt, fast, True)


def _linear_bwd(act, wgt, fmt, fast, res, dy):
    xtq, xts, wtq, wts, k_proto, x_proto = res
    k, n = wtq.shape[0], dy.shape[-1]
    dy2 = dy.reshape(-1, n)
    dyq, dys, dytq, dyts, _ = _quantize(dy2, act, fmt, True, True)
    # dW^T = X^T . dY: the wgrad's operands swapped, so the GEMM writes the kernel's (K, N) layout itself.
    # A transpose after it would be fused by XLA into the optimizer's update of the kernel as a strided
    # read, measured at 1.6 ms per 4096 x 14336 kernel against 0.36 ms for the update alone.
    dk = scaled_mm_impl(xtq, dytq, xts, dyts, act, act, _out_name(k_proto.dtype, "f32"), fmt)  # (K, N)
    dx = scaled_mm_impl(dyq, wtq, dys, wts, act, wgt, _out_name(x_proto.dtype), fmt)
    return dx.reshape(*dy.shape[:-1], k).astype(x_proto.dtype), dk.astype(k_proto.dtype)


_linear.defvjp(_linear_fwd, _linear_bwd)


def linear(x, kernel, recipe="blockwise", *, scale_format="cublaslt", fast_accum=True):
    """Y (..., N) = X (..., K) . kernel (K, N) with the forward, dgrad and wgrad GEMMs in FP8."""
    act, wgt = LINEAR_RECIPES[_recipe_name(recipe)]
    return _linear(x, kernel, act, wgt, scale_format, bool(fast_accum and recipe in _FAST_ACCUM_RECIPES))


def _recipe_name(recipe) -> str:
    if recipe not in LINEAR_RECIPES:
        raise invalid("recipe", "a training recipe", ", ".join(f'"{r}"' for r in LINEAR_RECIPES), repr(recipe),
                      "Pick one of the names; each sets both the activation and the weight recipe.")
    return recipe


def fp8_dot_general(recipe="blockwise", *, scale_format="cublaslt", fast_accum=True, mesh=None, batch_axis="data"):
    """A dot_general for flax.linen.Dense(dot_general=...) and flax.nnx.Linear(dot_general=...): the
    layer's forward, dgrad and wgrad GEMMs in FP8 through scalemm, for one recipe ("blockwise",
    "rowwise", "tensorwise", "mxfp8"; Float8Linear's table). Rowwise and tensorwise run the forward GEMM
    with fast accumulation (fast_accum=False: exact everywhere), as Float8Linear does. The output and
    dX come in the input's dtype, dW in the kernel's (Dense(dtype=jnp.bfloat16) hands both over in
    bf16). scale_format: where the quantizers write the scales ("cublaslt", read by the GEMMs in
    place; "compact": the same products, bit for bit).

    mesh, batch_axis: with a jax.sharding.Mesh, each device runs its shard of the batch (the leading
    dimension split over the mesh axis or axes `batch_axis`) and only the kernel is gathered and dW
    summed (see _sharding.py); without one, a sharded batch is gathered to run the custom calls."""
    _recipe_name(recipe)
    act, wgt = LINEAR_RECIPES[recipe]
    fast = bool(fast_accum and recipe in _FAST_ACCUM_RECIPES)

    def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **_unused):
        (lc, rc), (lb, rb) = dimension_numbers
        if tuple(lb) or tuple(rb) or jnp.ndim(rhs) != 2 or tuple(lc) != (jnp.ndim(lhs) - 1,) or tuple(rc) != (0,):
            raise invalid("dimension_numbers", "fp8_dot_general runs a dense layer's contraction",
                          "(((lhs.ndim - 1,), (0,)), ((), ())) with a 2-D (in, out) kernel",
                          f"{dimension_numbers} with a kernel of rank {jnp.ndim(rhs)}",
                          "Use it as the dot_general of flax.linen.Dense or flax.nnx.Linear.")
        if mesh is not None:
            from ._sharding import sharded_linear

            y = sharded_linear(lhs, rhs, act, wgt, scale_format, fast, mesh, batch_axis)
        else:
            y = _linear(lhs, rhs, act, wgt, scale_format, fast)
        return y if preferred_element_type is None else y.astype(preferred_element_type)

    dot_general.recipe = recipe
    return dot_general
