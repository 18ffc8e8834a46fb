"""fp8_dot_general over a mesh: each device runs its shard of the batch (shard_map), nothing of the
activations is gathered.

    forward  per device: Y_d = X_d . W (the kernel gathered first when it is FSDP-sharded: the weight,
             never the batch, moves), X_d^T saved in FP8 as the device's own shard
    backward per device: dX_d = dY_d . W^T; dW^T = psum over the batch axis of X_d^T . dY_d^T (fp32
             partial products, rounded to the kernel's dtype after the sum)

Quantization is per shard: recipes whose blocks lie along K of one row (the activations of blockwise,
rowwise and mxfp8) give each device the bytes the unsharded call gives its rows, so Y and dX are bit
for bit the unsharded ones; the along-M quantizations of wgrad (X^T, dY^T) and tensorwise amaxes are
taken over the device's tokens. Saved scale buffers travel flat, one piece per device, as only this
module's backward reads them."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from .._errors import invalid
from ._dense import _out_name, _quantize
from ._ops import scaled_mm_impl


def _local_forward(x2, kernel, act, wgt, fmt, fast):
    xq, xs, xtq, xts, _ = _quantize(x2, act, fmt, True, True, False)
    _, _, wq, ws, _ = _quantize(kernel, wgt, fmt, False, True, False)
    y = scaled_mm_impl(xq, wq, xs, ws, act, wgt, _out_name(x2.dtype), fmt, fast, partitioned=False)
    return y, xtq, xts.reshape(-1)


def _local_backward(dy2, xtq, xts_flat, kernel, x_proto, act, wgt, fmt, axis):
    from .. import _core

    k, n = kernel.shape
    m_local = dy2.shape[0]
    r = _core.recipe_code(act, "recipe")
    xts = xts_flat.reshape(_core.scale_shape(r, k, m_local, _core.SCALE_FORMATS[fmt]))
    dyq, dys, dytq, dyts, _ = _quantize(dy2, act, fmt, True, True, False)
    # dW^T (K, N) = X_d^T . dY_d^T: the kernel's own layout (as _dense.py's wgrad), no transpose after
    dk = jax.lax.psum(scaled_mm_impl(xtq, dytq, xts, dyts, act, act, "f32", fmt, partitioned=False), axis)
    wtq, wts, _, _, _ = _quantize(kernel, wgt, fmt, True, False, False)
    dx = scaled_mm_impl(dyq, wtq, dys, wts, act, wgt, _out_name(x_proto.dtype), fmt, partitioned=False)
    return dx, dk.astype(kernel.dtype)


def _specs(axis):
    return P(axis), P(None, axis)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5, 6, 7))
def sharded_linear(x, kernel, act, wgt, fmt, fast, mesh, axis):
    return _fwd(x, kernel, act, wgt, fmt, fast, mesh, axis)[0]


def _fwd(x, kernel, act, wgt, fmt, fast, mesh, axis):
    k, n = kernel.shape
    x2 = x.reshape(-1, k)
    size = mesh.shape[axis] if isinstance(axis, str) else int(jnp.prod(jnp.array([mesh.shape[a] for a in axis])))
    if x2.shape[0] % size:
        raise invalid("x", "the batch is split evenly over the mesh axis", f"a multiple of {size} rows (tokens)",
                      str(x2.shape[0]), "Pad the batch, or pass mesh=None to run the layer unsharded.")
    rows, cols = _specs(axis)
    f = jax.shard_map(functools.partial(_local_forward, act=act, wgt=wgt, fmt=fmt, fast=fast), mesh=mesh,
                      in_specs=(rows, P()), out_specs=(rows, cols, rows), check_vma=False)
    y, xtq, xts = f(x2, kernel)
    return y.reshape(*x.shape[:-1], n), (xtq, xts, kernel, jnp.zeros((0,), x.dtype))


def _bwd(act, wgt, fmt, fast, mesh, axis, res, dy):
    xtq, xts, kernel, x_proto = res
    k, n = kernel.shape
    rows, cols = _specs(axis)
    f = jax.shard_map(functools.partial(_local_backward, act=act, wgt=wgt, fmt=fmt, axis=axis), mesh=mesh,
                      in_specs=(rows, cols, rows, P(), P()), out_specs=(rows, P()), check_vma=False)
    dx, dk = f(dy.reshape(-1, n), xtq, xts, kernel, x_proto)
    return dx.reshape(*dy.shape[:-1], k).astype(x_proto.dtype), dk


sharded_linear.defvjp(_fwd, _bwd)
