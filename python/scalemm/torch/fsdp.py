"""FSDP2's FP8 weight all-gather: Float8AllGatherWeight (the sharded parameter, high precision to
everything but the all-gather) and _GatheredFloat8Weight (the unsharded FP8 weight the layers read)."""

from __future__ import annotations

import torch

from .. import _core
from .. import _scalemm as _C
from .. import layouts as _layouts
from .._arrays import DTYPE_CODE, torch_names
from ._autograd import _quantize_parts, _transpose_2d, _transpose_fp8
from ._runtime import _direct, _name, _stream
from .config import _FSDP_FP8_BLOCK, LINEAR_RECIPES

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
            if transposed:
                data, scales, rows, k = _transpose_fp8(data), _transpose_2d(scales), k, rows
            return data, (_layouts.to_cublaslt(scales, self._wrecipe, rows, k) if to else scales)
        stream = _stream(data.device.index)
        if transposed:  # one kernel each: the bytes, and the scale grid into its transposed layout
            out = torch.empty(_core.scale_shape(r, k, rows, to), dtype=scales.dtype, device=scales.device)
            _C.transpose_scales(r, rows, k, 0, scales.data_ptr(), to, out.data_ptr(), stream)
            return _transpose_fp8(data), out
        out = torch.empty(_core.scale_shape(r, rows, k, to), dtype=scales.dtype, device=scales.device)
        _C.convert(r, rows, k, 0, scales.data_ptr(), DTYPE_CODE[torch_names()[scales.dtype]], list(scales.shape),
                         list(scales.stride()), to, out.data_ptr(), 1, stream)
        return data, out



def _plain(w: torch.Tensor) -> torch.Tensor:
    """The high-precision tensor of a weight (Float8AllGatherWeight wraps one until FSDP2 shards it)."""
    return w._tensor if isinstance(w, Float8AllGatherWeight) else w
