"""NumPy arrays through the host reference emulator, judged against a float64 NumPy oracle."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

import scalemm
from oracle import bound, dequant, gemm64, seed

FP8_RECIPES = ["tensorwise", "rowwise", "block1x128", "block128x128", "mxfp8", "mxfp8-32x32"]
ALL_RECIPES = FP8_RECIPES + ["nvfp4"]


def _operand(rng, rows, k, recipe, dtype="e4m3", fmt="compact", spread=True):
    x = rng.standard_normal((rows, k)).astype(np.float32)
    if spread:  # different magnitudes per row and per column block, so wrong scale indexing shows
        x *= np.exp2(rng.integers(-4, 5, size=(rows, 1))).astype(np.float32)
        x *= np.exp2(rng.integers(-3, 4, size=(1, k))).astype(np.float32)
    data, scales = scalemm.quantize(x, recipe, dtype=dtype, scale_format=fmt)
    return x, data, scales


def _value(data, scales, recipe, dtype, rows, k):
    return dequant(data, scales, recipe, "e2m1" if recipe == "nvfp4" else dtype, rows, k)


def _check(d, a64, b64, k, out_dtype):
    d64 = gemm64(a64, b64)
    d = np.asarray(d, dtype=np.float64)
    if out_dtype == "f16":  # f16 overflows to inf from 65520 on: required beyond it, allowed near it
        lim0 = bound(a64, b64, k, "f32")
        isinf = np.isinf(d)
        assert np.all(isinf[np.abs(d64) - lim0 > 65520]), "finite where the value is beyond f16's range"
        assert np.all(np.abs(d64[isinf]) + lim0[isinf] >= 65520), "inf where the value is within f16's range"
        assert np.all(np.sign(d[isinf]) == np.sign(d64[isinf]))
        d64 = np.where(isinf, 0, d64)
        d = np.where(isinf, 0, d)
    err = np.abs(d - d64)
    lim = bound(a64, b64, k, out_dtype)
    worst = np.unravel_index(np.argmax(err - lim), err.shape)
    assert np.all(err <= lim), (f"max excess at {worst}: got {d[worst]}, "
                                f"float64 {d64[worst]}, bound {lim[worst]}")


def _pairs():
    fp8 = [(a, b) for a, b in itertools.product(FP8_RECIPES, FP8_RECIPES)]
    return fp8 + [("nvfp4", "nvfp4"), ("nvfp4", "mxfp8"), ("mxfp8", "nvfp4")]


@pytest.mark.parametrize("ra,rb", _pairs())
def test_every_recipe_pair_against_float64(ra, rb):
    rng = np.random.default_rng(seed(f"{ra} x {rb}"))
    m, n, k = 37, 45, 320  # K/128 = 2.5 (a partial block), M and N not multiples of 4
    _, da, sa = _operand(rng, m, k, ra)
    _, db, sb = _operand(rng, n, k, rb)
    a64 = _value(da, sa, ra, "e4m3", m, k)
    b64 = _value(db, sb, rb, "e4m3", n, k)
    try:
        d = scalemm.scaled_mm(da, db, sa, sb, recipe_a=ra, recipe_b=rb, out_dtype="f32", backend="reference")
    except scalemm.InvalidArgumentError as e:  # pairs the library refuses must say so by name
        assert "recipe" in e.message, e.message
        pytest.skip(f"library refuses {ra} x {rb}: {e.message.splitlines()[0]}")
    assert isinstance(d, np.ndarray) and d.shape == (m, n) and d.dtype == np.float32
    _check(d, a64, b64, k, "f32")


@pytest.mark.parametrize("out_dtype", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("m,n,k", [(1, 1, 32), (3, 5, 96), (129, 7, 384), (5, 130, 4 * 128 + 32), (64, 64, 640)])
def test_odd_shapes_and_out_dtypes(m, n, k, out_dtype):
    rng = np.random.default_rng(seed(f"{m}x{n}x{k} {out_dtype}"))
    for ra, rb in [("block1x128", "block128x128"), ("mxfp8", "mxfp8-32x32"), ("rowwise", "rowwise")]:
        _, da, sa = _operand(rng, m, k, ra)
        _, db, sb = _operand(rng, n, k, rb, dtype="e5m2")
        d = scalemm.scaled_mm(da, db, sa, sb, recipe_a=ra, recipe_b=rb, out_dtype=out_dtype)  # backend auto
        want = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32}[out_dtype]
        assert d.dtype == want and d.shape == (m, n)
        _check(d, _value(da, sa, ra, "e4m3", m, k), _value(db, sb, rb, "e5m2", n, k), k, out_dtype)


def test_raw_uint8_data_with_explicit_dtypes_and_bias():
    rng = np.random.default_rng(seed("uint8 + bias"))
    m, n, k = 8, 12, 256
    _, da, sa = _operand(rng, m, k, "block1x128")
    _, db, sb = _operand(rng, n, k, "block128x128", dtype="e5m2")
    bias = rng.standard_normal(n).astype(np.float32)
    d = scalemm.scaled_mm(da.view(np.uint8), db.view(np.uint8), sa, sb, recipe_a="block1x128",
                          recipe_b="block128x128", dtype_a="e4m3", dtype_b="e5m2", bias=bias, out_dtype="f32")
    a64 = _value(da, sa, "block1x128", "e4m3", m, k)
    b64 = _value(db, sb, "block128x128", "e5m2", n, k)
    bias64 = bias.astype(ml_dtypes.bfloat16).astype(np.float64)  # the library's bias is bf16
    d64 = gemm64(a64, b64) + bias64
    assert np.all(np.abs(d - d64) <= bound(a64, b64, k, "f32") + np.abs(bias64) * 2.0**-23)


@pytest.mark.parametrize("recipe", ALL_RECIPES)
@pytest.mark.parametrize("rows,k", [(1, 32), (37, 320), (130, 96)])
def test_quantize_dequantize_exact_against_oracle(recipe, rows, k):
    rng = np.random.default_rng(seed(f"quantize {recipe} {rows}x{k}"))
    x, data, scales = _operand(rng, rows, k, recipe)
    if recipe == "nvfp4":
        assert data.dtype == np.uint8 and data.shape == (rows, k // 2)
        assert isinstance(scales, tuple) and isinstance(scales[1], float)
    else:
        assert data.dtype == ml_dtypes.float8_e4m3fn and data.shape == (rows, k)
        assert scales.shape == scalemm.layouts.shape(recipe, rows, k)
    v64 = _value(data, scales, recipe, "e4m3", rows, k)
    deq = scalemm.dequantize(data, scales, recipe)
    assert deq.dtype == np.float32 and deq.shape == (rows, k)
    # One fp32 rounding of an exact product: the oracle rounded to fp32 is bit-identical.
    np.testing.assert_array_equal(deq, v64.astype(np.float32))
    # And the quantization is sane: the relative error norm stays within the element format's precision
    # (a wrong scale index gives errors near 100%). MX scales are powers of two that map a block's amax
    # into [256, 512), so elements above E4M3's 448 clamp, by up to 2^-3: a (1, 32) row of a random
    # seed measured 5.2% there, so MX recipes are held to 2^-3, the others to 0.05 as before.
    rel = np.linalg.norm(v64 - x) / np.linalg.norm(x)
    limit = 0.2 if recipe == "nvfp4" else 2.0**-3 if recipe.startswith("mxfp8") else 0.05
    assert rel < limit, (recipe, rel)


@pytest.mark.parametrize("recipe", ALL_RECIPES)
def test_layout_roundtrip_and_cublaslt_gemm(recipe):
    rng = np.random.default_rng(seed(f"layouts {recipe}"))
    rows, k = 37, 320
    _, data, scales = _operand(rng, rows, k, recipe)
    s = scales[0] if recipe == "nvfp4" else scales
    lt = scalemm.layouts.to_cublaslt(s, recipe, rows, k)
    assert lt.ndim == 1 and scalemm.layouts.check(lt, recipe, rows, k, scale_format="cublaslt") == []
    back = scalemm.layouts.from_cublaslt(lt, recipe, rows, k)
    np.testing.assert_array_equal(back.reshape(-1).view(np.uint8), np.asarray(s).reshape(-1).view(np.uint8))
    assert scalemm.layouts.check(s, recipe, rows, k) == []
    # The quantizer writes the cuBLASLt layout directly, byte for byte the same as the conversion.
    _, data2, scales2 = _operand(np.random.default_rng(0), rows, k, recipe, fmt="cublaslt")
    _, data1, scales1 = _operand(np.random.default_rng(0), rows, k, recipe)
    s1 = scales1[0] if recipe == "nvfp4" else scales1
    s2 = scales2[0] if recipe == "nvfp4" else scales2
    np.testing.assert_array_equal(np.asarray(s2).reshape(-1).view(np.uint8),
                                  scalemm.layouts.to_cublaslt(s1, recipe, rows, k).reshape(-1).view(np.uint8))


def test_cublaslt_format_gemm_matches_compact():
    rng = np.random.default_rng(seed("cublaslt gemm"))
    m, n, k = 20, 36, 384
    _, da, sa = _operand(rng, m, k, "block1x128")
    _, db, sb = _operand(rng, n, k, "block128x128")
    d1 = scalemm.scaled_mm(da, db, sa, sb, recipe_a="block1x128", recipe_b="block128x128", out_dtype="f32")
    la = scalemm.layouts.to_cublaslt(sa, "block1x128", m, k)
    lb = scalemm.layouts.to_cublaslt(sb, "block128x128", n, k)
    d2 = scalemm.scaled_mm(da, db, la, lb, recipe_a="block1x128", recipe_b="block128x128", out_dtype="f32",
                           scale_format="cublaslt")
    np.testing.assert_array_equal(d1, d2)


def test_explain_names_the_backend():
    rng = np.random.default_rng(seed("explain"))
    _, da, sa = _operand(rng, 16, 128, "mxfp8")
    _, db, sb = _operand(rng, 16, 128, "mxfp8")
    text = scalemm.explain(da, db, sa, sb, recipe_a="mxfp8", recipe_b="mxfp8")
    assert isinstance(text, str) and "reference" in text
    text = scalemm.explain(da, db, sa, sb, recipe_a="mxfp8", recipe_b="mxfp8", backend="reference")
    assert "reference" in text


def test_scale_shapes_match_the_library_layouts():
    from scalemm import _core, _scalemm

    for name, r in _core.RECIPES.items():
        for rows in (1, 3, 4, 31, 32, 33, 127, 128, 129, 257):
            for k in (16, 32, 96, 128, 320, 640, 1000):
                grid, kb, _pr, _pk, size, _b, _dt, _ = _scalemm.layout_info(r, rows, k, 0)
                compact = _core.scale_shape(r, rows, k, 0)
                assert int(np.prod(compact)) == size, (name, rows, k)
                if len(compact) == 2 and name != "rowwise":
                    assert compact == (grid, kb)
                assert _core.scale_shape(r, rows, k, 1) == (_scalemm.layout_info(r, rows, k, 1)[4],), (name, rows, k)


def test_layout_objects_name_the_library_layout_facts():
    """The package sizes scale arrays from the recipe rules (LAYOUTS, read from the library's
    ScaleLayout) and reads concrete layouts by name: both agree with ScaleLayout at every extent."""
    from scalemm import _core

    for name, r in _core.RECIPES.items():
        rule = _core.LAYOUTS[r]
        assert rule.name == name and rule.recipe == r
        for rows in (1, 2, 5, 31, 33, 100, 127, 129, 200, 513):
            for k in (1, 15, 16, 17, 33, 127, 129, 500, 1024):
                for fmt in (0, 1):
                    lay = _core.layout(r, rows, k, fmt)
                    assert (lay.recipe, lay.rows, lay.k, lay.format) == (r, rows, k, fmt)
                    assert lay.scale_dtype_name == rule.scale_dtype_name == _core.scale_dtype_name(r)
                    assert lay.bytes == lay.size * lay.scale_bytes
                    assert int(np.prod(_core.scale_shape(r, rows, k, fmt))) == lay.size, (name, rows, k, fmt)
                    if fmt == 0 and not rule.scalar:
                        assert _core.scale_shape(r, rows, k, 0) == (lay.grid_rows, lay.kblocks), (name, rows, k)
                    assert lay.tiled == (fmt == 1 and rule.lt_tiled)
                    assert lay.description in repr(lay)


def test_torch_style_scale_forms_are_accepted():
    """The scale forms torch._scaled_mm takes give the same result as the compact ones."""
    rng = np.random.default_rng(seed("torch forms"))
    m, n, k = 8, 256, 512
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    for ra, forms in (("tensorwise", lambda s, t: [(s.reshape(1), t.reshape(1)), (s.reshape(1, 1), t.reshape(1, 1))]),
                      ("rowwise", lambda s, t: [(s.reshape(-1), t.reshape(-1)), (s, t.reshape(1, n))])):
        xq, xs = scalemm.quantize(x, ra)
        wq, ws = scalemm.quantize(w, ra)
        want = scalemm.scaled_mm(xq, wq, xs, ws, recipe_a=ra, recipe_b=ra, out_dtype="f32")
        for sa, sb in forms(xs, ws):
            got = scalemm.scaled_mm(xq, wq, sa, sb, recipe_a=ra, recipe_b=ra, out_dtype="f32")
            np.testing.assert_array_equal(got, want)
    # torch's outer-dim-major 1x128 scales are the cuBLASLt layout when M % 4 == 0 (and K/128 % 4 == 0
    # makes the 128x128 compact grid the cuBLASLt one too).
    xq, xs = scalemm.quantize(x, "block1x128")
    wq, ws = scalemm.quantize(w, "block128x128")
    want = scalemm.scaled_mm(xq, wq, xs, ws, recipe_a="block1x128", recipe_b="block128x128", out_dtype="f32")
    got = scalemm.scaled_mm(xq, wq, np.asfortranarray(xs), ws, recipe_a="block1x128", recipe_b="block128x128",
                            out_dtype="f32", scale_format="cublaslt")
    np.testing.assert_array_equal(got, want)
    with pytest.raises(scalemm.InvalidLayoutError, match="scale-major-order"):
        scalemm.scaled_mm(xq, wq, np.asfortranarray(xs), ws, recipe_a="block1x128", recipe_b="block128x128")


def test_fast_accum_is_a_permission_the_host_reference_does_not_take():
    rng = np.random.default_rng(seed("fast accum host"))
    _, da, sa = _operand(rng, 9, 256, "rowwise")
    _, db, sb = _operand(rng, 12, 256, "rowwise")
    exact = scalemm.scaled_mm(da, db, sa, sb, recipe_a="rowwise", recipe_b="rowwise", out_dtype="f32")
    fast = scalemm.scaled_mm(da, db, sa, sb, recipe_a="rowwise", recipe_b="rowwise", out_dtype="f32", fast_accum=True)
    np.testing.assert_array_equal(exact, fast)  # the host reference accumulates exactly
    text = scalemm.explain(da, db, sa, sb, recipe_a="rowwise", recipe_b="rowwise", fast_accum=True)
    assert "+fast-accum" in text and "accumulates exactly" in text
    _, ba, bsa = _operand(rng, 9, 256, "block1x128")
    with pytest.raises(scalemm.InvalidArgumentError, match="fast_accum"):
        scalemm.scaled_mm(ba, db, bsa, sb, recipe_a="block1x128", recipe_b="rowwise", fast_accum=True)
    with pytest.raises(scalemm.InvalidArgumentError, match="fast_accum"):
        scalemm.scaled_mm(da, db, sa, sb, recipe_a="rowwise", recipe_b="rowwise", fast_accum="yes")
