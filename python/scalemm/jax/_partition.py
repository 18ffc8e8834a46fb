"""Sharding rules of scaled_mm (custom_partitioning): a sharded program runs each device's rows locally.

D (M, N) = A (M, K) B (N, K)^T splits along M with A and along N with B, wherever each operand's scales
split with its rows: per-row recipes in compact format (rowwise, block1x128, mxfp8, nvfp4: the grid's
rows are the operand's) and tensorwise (one scale, replicated). K is never split (the GEMM would need a
sum across devices); an operand whose scales do not split with its rows (128x128 grids, cublaslt
buffers) is replicated. Each device's product of its rows is the unsharded call's, bit for bit.

vmap of the partitioned call maps the plain custom call sequentially (custom_partitioning has no
batching rule of its own)."""

from __future__ import annotations

import functools

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec as P

from .. import _core

def _per_row(recipe: int) -> bool:
    """One scale row per data row (rowwise, block1x128, mxfp8, nvfp4): the compact grid splits with the rows."""
    return _core.LAYOUTS[recipe].block_rows == 1


def scale_kind(recipe: int, fmt: int) -> str:
    """How an operand's scales follow its rows: "grid" (split with them), "scalar" (replicated), "none"."""
    if _core.LAYOUTS[recipe].scalar:
        return "scalar"
    return "grid" if _per_row(recipe) and fmt == 0 else "none"


def _rule(call, kind_a, kind_b, mesh, operand_types, result_types):
    """The Shardy rule: m and n pass from A and B to D; every other factor (K, the scales' other
    dimensions) needs replication. Factors are numbered in order of appearance, as Shardy wants them."""
    ranks = [len(t.shape) for t in operand_types]
    replicated = []

    def fresh():
        replicated.append(f"f{len(replicated)}")
        return replicated[-1]

    def scale(kind, rows, rank):
        return f"{rows} {fresh()}" if kind == "grid" and rank == 2 else " ".join(fresh() for _ in range(rank))

    k = fresh()
    parts = [f"m {k}", f"n {k}", scale(kind_a, "m", ranks[2]), scale(kind_b, "n", ranks[3]), "", ""]
    return f"{', '.join(parts)} -> m n", {"need_replication_factors": tuple(replicated)}


def _axes(shape, dim, mesh):
    """The mesh axes dimension `dim` of a sharded argument is split over, when they divide it evenly."""
    spec = getattr(shape.sharding, "spec", None)
    if spec is None or len(spec) <= dim or spec[dim] is None:
        return None
    ax = spec[dim]
    size = 1
    for a in (ax if isinstance(ax, tuple) else (ax,)):
        size *= mesh.shape[a]
    return ax if shape.shape[dim] % size == 0 else None


def _names(ax):
    return set(ax) if isinstance(ax, tuple) else {ax}


def _partition(call, kind_a, kind_b, mesh, arg_shapes, result_shape):
    m_ax = _axes(arg_shapes[0], 0, mesh) if kind_a != "none" else None
    n_ax = _axes(arg_shapes[1], 0, mesh) if kind_b != "none" else None
    if m_ax is not None and n_ax is not None and _names(m_ax) & _names(n_ax):
        n_ax = None

    def scale(kind, ax, shape):
        return P(ax, None) if kind == "grid" and len(shape.shape) == 2 else P()

    specs = (P(m_ax, None), P(n_ax, None), scale(kind_a, m_ax, arg_shapes[2]), scale(kind_b, n_ax, arg_shapes[3]),
             P(), P())
    return (mesh, lambda *args: call(*args), NamedSharding(mesh, P(m_ax, n_ax)),
            tuple(NamedSharding(mesh, s) for s in specs))


@functools.partial(custom_partitioning, static_argnums=(6, 7, 8))
def _partitioned(a, b, sa, sb, ga, gb, call, kind_a, kind_b):
    return call(a, b, sa, sb, ga, gb)


_partitioned.def_partition(partition=_partition, sharding_rule=_rule)


def _quantize_rule(call, mesh, operand_types, result_types):
    """x's rows pass to the rowwise data and scales where they split with them; all else replicated."""
    split = _splits_rows(call)
    ranks = [len(t.shape) for t in result_types]
    names = iter(f"f{i}" for i in range(16))
    fresh = lambda: next(names)  # noqa: E731
    k = fresh()
    rows = "m" if split else fresh()
    outs = [f"{rows} {k}" if ranks[0] == 2 else fresh(),
            f"{rows} {fresh()}" if split else " ".join(fresh() for _ in range(ranks[1]))]
    outs += [" ".join(fresh() for _ in range(r)) for r in ranks[2:]]
    used = [f for f in " ".join([f"{rows} {k}"] + outs).split() if f != "m"]
    return f"{rows} {k} -> {', '.join(outs)}", {"need_replication_factors": tuple(dict.fromkeys(used))}


def _splits_rows(call) -> bool:
    """A rowwise-only quantization whose every row's bytes and scales depend on that row alone."""
    return (call.rowwise and not call.columnwise and call.format == 0 and _per_row(call.recipe)
            and not _core.LAYOUTS[call.recipe].two_level)  # nvfp4's global scale is the whole tensor's


def _quantize_partition(call, mesh, arg_shapes, result_shape):
    ax = _axes(arg_shapes[0], 0, mesh) if _splits_rows(call) else None
    rows = NamedSharding(mesh, P(ax, None))
    rep = NamedSharding(mesh, P())
    return mesh, call, (rows, rows if ax is not None else rep, rep, rep, rep), (rows,)


@functools.partial(custom_partitioning, static_argnums=(1,))
def _quantize(x, call):
    return call(x)


_quantize.def_partition(partition=_quantize_partition, sharding_rule=_quantize_rule)


def quantize_rows(call, x):
    """call(x) -> (data, scales, data_t, scales_t, global), with the quantizer's sharding rule above."""
    @jax.custom_batching.custom_vmap
    def f(x):
        return _quantize(x, call)

    @f.def_vmap
    def _(axis_size, in_batched, x):
        return jax.vmap(call)(x), (True,) * 5

    return f(x)


def gemm(call, kind_a: str, kind_b: str, *args):
    """call(a, b, scale_a, scale_b, global_a, global_b) -> D, with the sharding rules above."""
    @jax.custom_batching.custom_vmap
    def f(*arrays):
        return _partitioned(*arrays, call, kind_a, kind_b)

    @f.def_vmap
    def _(axis_size, in_batched, *arrays):
        return jax.vmap(call, in_axes=tuple(0 if b else None for b in in_batched))(*arrays), True

    return f(*args)
