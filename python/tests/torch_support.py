"""What the torch test files share: the GPU condition, the layer recipes, and small helpers. Imported
after each file's own `pytest.importorskip("torch")`, so that a machine without torch skips them."""

from __future__ import annotations

import pytest
import torch

import scalemm
from oracle import dequant

GPU = torch.cuda.is_available() and scalemm.has_gpu()
needs_gpu = pytest.mark.skipif(not GPU, reason="no usable CUDA device (torch.cuda.is_available() = "
                               f"{torch.cuda.is_available()}, scalemm: {scalemm.device()})")
SM = torch.cuda.get_device_capability() if torch.cuda.is_available() else (0, 0)
RECIPES = ["blockwise", "rowwise", "tensorwise", "mxfp8"]


def _q(x, recipe, dtype="e4m3"):
    return scalemm.quantize(x, recipe, dtype=dtype)


def _host64(data, scales, recipe, dtype="e4m3"):
    rows = data.shape[0]
    d = data.cpu().view(torch.uint8).numpy()
    if isinstance(scales, tuple):
        s = (scales[0].cpu().view(torch.uint8).numpy() if scales[0].element_size() == 1 else scales[0].cpu().numpy(),
             float(scales[1]))
    else:
        s = scales.cpu()
        s = s.view(torch.uint8).numpy() if s.element_size() == 1 else s.numpy()
    k = d.shape[1] * (2 if recipe == "nvfp4" else 1)
    return dequant(d, s, recipe, "e2m1" if recipe == "nvfp4" else dtype, rows, k)


def _sqnr(ref, got):
    ref, got = ref.double(), got.double()
    return (10 * torch.log10(ref.square().sum() / (ref - got).square().sum().clamp_min(1e-300))).item()


def run_without_syncs(step):
    """step() once to prepare its calls, then again under torch.cuda.set_sync_debug_mode("error"), so that
    any host synchronisation in the second call raises."""
    step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
