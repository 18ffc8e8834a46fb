"""What every module of scalemm.torch asks of the running process: the current stream, whether anything
traces, torch dtypes by the library's names, and the one bounded cache the prepared calls keep."""

from __future__ import annotations

import contextlib
from collections import OrderedDict

import torch

from .. import _core

_OUT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
_NAMES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}


def _out_name(out_dtype) -> str:
    return _core.choice(_core.OUT_DTYPES, out_dtype, "out_dtype", "output dtype")


def _name(dt) -> str:
    return _NAMES[dt]


# ---- streams and tracing ------------------------------------------------------------------------------------

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


_current_device = torch.cuda.current_device
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _direct(x) -> bool:
    """Whether an FP8 quantization may skip the dispatcher: an eager call (nothing traces) on a plain
    CUDA tensor of the current device (whose default stream is the one torch uses for it)."""
    return (type(x) in _PLAIN and x.is_cuda and not _is_compiling() and not _dispatch_modes()
            and x.device.index == _current_device())


def _on_device(x):
    """x's device made current for a library call (its stream argument then names the right device)."""
    return contextlib.nullcontext() if x.device.index == _current_device() else torch.cuda.device(x.device)


# ---- the prepared calls' cache ------------------------------------------------------------------------------

class BoundedLRU:
    """A mapping of at most `limit` entries that drops the least recently used one when full: the prepared
    calls of one signature each (a model runs a few hundred; a sweep over shapes must not grow without
    bound, and the signatures still in use stay prepared). Values are never None (get's miss)."""

    __slots__ = ("_d", "limit")

    def __init__(self, limit: int = 4096):
        self._d: OrderedDict = OrderedDict()
        self.limit = limit

    def get(self, key):
        d = self._d
        v = d.get(key)
        if v is not None:
            d.move_to_end(key)
        return v

    def put(self, key, value) -> None:
        d = self._d
        d[key] = value
        d.move_to_end(key)
        if len(d) > self.limit:
            d.popitem(last=False)

    def clear(self) -> None:
        self._d.clear()

    def values(self):
        return self._d.values()

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, key) -> bool:
        return key in self._d
