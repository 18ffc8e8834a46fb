"""A float64 NumPy oracle, independent of scalemm: decodes FP8/FP4 data and every recipe's compact
scales with ml_dtypes and plain index arithmetic, then multiplies in float64."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np

BLOCK = {"tensorwise": None, "rowwise": None, "block1x128": (1, 128), "block128x128": (128, 128),
         "mxfp8": (1, 32), "mxfp8-32x32": (32, 32), "nvfp4": (1, 16)}

_E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)


def seed(request_name: str = "") -> int:
    """The test's random seed: SCALEMM_TEST_SEED or a fresh one, printed so a failure can be rerun."""
    s = int(os.environ.get("SCALEMM_TEST_SEED", np.random.SeedSequence().entropy % (2**31)))
    print(f"seed {s} {request_name} (rerun with SCALEMM_TEST_SEED={s})")
    return s


def decode_data(data: np.ndarray, dtype: str) -> np.ndarray:
    """(rows, K) float64 values of FP8 data (typed or uint8 bits) or packed E2M1 (uint8, (rows, K/2))."""
    if dtype == "e2m1":
        b = data.view(np.uint8)
        out = np.empty((b.shape[0], b.shape[1] * 2), dtype=np.float64)
        out[:, 0::2] = _E2M1[b & 0xF]
        out[:, 1::2] = _E2M1[b >> 4]
        return out
    t = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}[dtype]
    return data.view(np.uint8).view(t).astype(np.float64)


def decode_scales(scales, recipe: str) -> np.ndarray:
    """Compact scales as float64 (E8M0 2^(e-127); UE4M3 with the sign bit ignored)."""
    s = np.asarray(scales)
    if recipe in ("mxfp8", "mxfp8-32x32"):
        return np.ldexp(1.0, s.view(np.uint8).astype(np.int64) - 127).astype(np.float64)
    if recipe == "nvfp4":
        return (s.view(np.uint8) & 0x7F).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return s.astype(np.float64)


def expand(scales, recipe: str, rows: int, k: int) -> np.ndarray:
    """The (rows, K) matrix of the scale each element is multiplied by."""
    s = decode_scales(scales, recipe)
    if recipe == "tensorwise":
        return np.full((rows, k), s.reshape(-1)[0])
    if recipe == "rowwise":
        return np.repeat(s.reshape(rows, 1), k, axis=1)
    br, bk = BLOCK[recipe]
    s = s.reshape(-(-rows // br), -(-k // bk))
    return np.repeat(np.repeat(s, br, axis=0)[:rows], bk, axis=1)[:, :k]


def dequant(data, scales, recipe: str, dtype: str, rows: int, k: int) -> np.ndarray:
    glob = 1.0
    if isinstance(scales, tuple):
        scales, glob = scales
    return decode_data(data, dtype) * expand(scales, recipe, rows, k) * float(glob)


def gemm64(a, b):
    return a @ b.T


def bound(a64, b64, k, out_dtype: str) -> np.ndarray:
    """Elementwise error bound of an fp32 K-ordered accumulation (|a| |b|^T K 2^-24, with slack),
    plus the final rounding to out_dtype."""
    mag = np.abs(a64) @ np.abs(b64).T
    acc = mag * (k + 4) * 2.0**-24 + 1e-30
    ulp = {"f32": 2.0**-24, "f16": 2.0**-11, "bf16": 2.0**-8}[out_dtype]
    return acc * (1 + ulp) + np.abs(a64 @ b64.T) * ulp + (6e-8 if out_dtype == "f16" else 0)
