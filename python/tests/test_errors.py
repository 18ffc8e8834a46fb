"""Bad inputs raise the named scalemm.Error subclass, carry the status name and the full message, and
write nothing."""

from __future__ import annotations

import numpy as np
import pytest

import scalemm


def _ops(m=8, n=8, k=256, ra="block1x128", rb="block128x128"):
    rng = np.random.default_rng(1)
    da, sa = scalemm.quantize(rng.standard_normal((m, k)).astype(np.float32), ra)
    db, sb = scalemm.quantize(rng.standard_normal((n, k)).astype(np.float32), rb)
    return da, db, sa, sb


def test_unknown_recipe_lists_the_names():
    da, db, sa, sb = _ops()
    with pytest.raises(scalemm.InvalidArgumentError) as e:
        scalemm.scaled_mm(da, db, sa, sb, recipe_a="blockwise", recipe_b="block128x128")
    assert e.value.status == "SCALEMM_STATUS_INVALID_ARGUMENT"
    assert "recipe_a" in e.value.message and "block1x128" in e.value.message
    assert isinstance(e.value, ValueError)


def test_wrong_scale_shape_is_a_layout_error_naming_the_argument():
    da, db, sa, sb = _ops()
    with pytest.raises(scalemm.InvalidLayoutError) as e:
        scalemm.scaled_mm(da, db, sa, sb[:, :1].copy(), recipe_a="block1x128", recipe_b="block128x128")
    assert e.value.status == "SCALEMM_STATUS_INVALID_LAYOUT"
    assert "scale_b" in str(e.value) and "expected" in str(e.value)


def test_transposed_blockwise_scales_are_caught():
    # The classic silent bug: (L, R) row-major handed over as (R, L) compact.
    da, db, sa, sb = _ops(m=16, k=512)
    bad = np.ascontiguousarray(sa.T).T  # right shape, wrong strides
    with pytest.raises(scalemm.InvalidLayoutError) as e:
        scalemm.scaled_mm(da, db, bad, sb, recipe_a="block1x128", recipe_b="block128x128")
    assert "scale_a" in e.value.message


def test_nan_and_negative_scales_are_caught_on_the_host():
    da, db, sa, sb = _ops()
    bad = sa.copy()
    bad[0, 0] = -1.0
    with pytest.raises(scalemm.Error) as e:
        scalemm.scaled_mm(da, db, bad, sb, recipe_a="block1x128", recipe_b="block128x128")
    assert "f32-scale-non-positive" in e.value.message
    assert "f32-scale-non-positive" in [d.rule for d in scalemm.layouts.check(bad, "block1x128", 8, 256)]


def test_k_mismatch_and_rank():
    da, db, sa, sb = _ops()
    with pytest.raises(scalemm.InvalidArgumentError, match="share K"):
        scalemm.scaled_mm(da, db[:, :128].copy(), sa, sb, recipe_a="block1x128", recipe_b="block128x128")
    with pytest.raises(scalemm.InvalidArgumentError, match="rank 2"):
        scalemm.scaled_mm(da.reshape(-1), db, sa, sb, recipe_a="block1x128", recipe_b="block128x128")


def test_raw_bytes_need_a_dtype():
    da, db, sa, sb = _ops()
    with pytest.raises(scalemm.InvalidArgumentError, match="dtype_a"):
        scalemm.scaled_mm(da.view(np.uint8), db, sa, sb, recipe_a="block1x128", recipe_b="block128x128")
    with pytest.raises(scalemm.InvalidArgumentError, match="dtype_b"):
        scalemm.scaled_mm(da, db, sa, sb, recipe_a="block1x128", recipe_b="block128x128", dtype_b="e5m2")


def test_non_contiguous_data_and_float_data():
    da, db, sa, sb = _ops()
    with pytest.raises(scalemm.InvalidArgumentError, match="contiguous"):
        scalemm.scaled_mm(np.asfortranarray(da), db, sa, sb, recipe_a="block1x128", recipe_b="block128x128")
    with pytest.raises(scalemm.InvalidArgumentError, match="Quantize"):
        scalemm.scaled_mm(np.zeros((8, 256), np.float32), db, sa, sb, recipe_a="block1x128",
                          recipe_b="block128x128")


def test_scale_dtype_and_bad_options():
    da, db, sa, sb = _ops()
    with pytest.raises(scalemm.InvalidArgumentError, match="float32"):
        scalemm.scaled_mm(da, db, sa.astype(np.float16), sb, recipe_a="block1x128", recipe_b="block128x128")
    with pytest.raises(scalemm.InvalidArgumentError, match="out_dtype"):
        scalemm.scaled_mm(da, db, sa, sb, recipe_a="block1x128", recipe_b="block128x128", out_dtype="f64")
    with pytest.raises(scalemm.InvalidArgumentError, match="backend"):
        scalemm.scaled_mm(da, db, sa, sb, recipe_a="block1x128", recipe_b="block128x128", backend="fast")
    with pytest.raises(scalemm.InvalidArgumentError, match="scale_format"):
        scalemm.scaled_mm(da, db, sa, sb, recipe_a="block1x128", recipe_b="block128x128", scale_format="tiled")


def test_native_backend_without_a_gpu_is_unsupported():
    if scalemm.has_gpu():
        pytest.skip("this machine has a GPU: host arrays still cannot run natively, covered by the GPU tests")
    da, db, sa, sb = _ops()
    with pytest.raises(scalemm.UnsupportedError) as e:
        scalemm.scaled_mm(da, db, sa, sb, recipe_a="block1x128", recipe_b="block128x128", backend="native")
    assert e.value.status == "SCALEMM_STATUS_UNSUPPORTED" and "native" in e.value.message


def test_k_not_multiple_of_16_is_refused_and_nothing_written():
    rng = np.random.default_rng(2)
    da, sa = scalemm.quantize(rng.standard_normal((4, 40)).astype(np.float32), "rowwise")
    db, sb = scalemm.quantize(rng.standard_normal((4, 40)).astype(np.float32), "rowwise")
    try:
        d = scalemm.scaled_mm(da, db, sa, sb, recipe_a="rowwise", recipe_b="rowwise", out_dtype="f32")
    except scalemm.Error as e:
        assert "k" in e.message
    else:  # the reference emulator may accept any K: then it must be right
        ref = da.astype(np.float64) * sa.astype(np.float64) @ (db.astype(np.float64) * sb.astype(np.float64)).T
        assert np.allclose(d, ref, rtol=1e-5, atol=1e-6)


def test_nvfp4_global_scale_forms():
    rng = np.random.default_rng(3)
    da, (sa, ga) = scalemm.quantize(rng.standard_normal((4, 64)).astype(np.float32), "nvfp4")
    db, (sb, gb) = scalemm.quantize(rng.standard_normal((4, 64)).astype(np.float32), "nvfp4")
    d1 = scalemm.scaled_mm(da, db, (sa, ga), (sb, gb), recipe_a="nvfp4", recipe_b="nvfp4", out_dtype="f32")
    d2 = scalemm.scaled_mm(da, db, (sa, np.float32(ga)), (sb, np.array([gb], np.float32)), recipe_a="nvfp4",
                           recipe_b="nvfp4", out_dtype="f32")
    np.testing.assert_array_equal(d1, d2)
    with pytest.raises(scalemm.InvalidArgumentError, match="only for nvfp4"):
        xa, sxa = scalemm.quantize(rng.standard_normal((4, 64)).astype(np.float32), "mxfp8")
        scalemm.scaled_mm(xa, db, (sxa, 1.0), (sb, gb), recipe_a="mxfp8", recipe_b="nvfp4")
    with pytest.raises(scalemm.InvalidArgumentError, match="nvfp4"):
        scalemm.scaled_mm(da, db, (sa, ga), (sb, gb), recipe_a="nvfp4", recipe_b="nvfp4", dtype_a="e4m3")


def test_quantize_rejects_bad_sources():
    with pytest.raises(scalemm.InvalidArgumentError, match="high precision"):
        scalemm.quantize(np.zeros((4, 32), np.uint8), "mxfp8")
    with pytest.raises(scalemm.InvalidArgumentError, match="rank 2"):
        scalemm.quantize(np.zeros(32, np.float32), "mxfp8")
    with pytest.raises(scalemm.InvalidArgumentError, match="dtype"):
        scalemm.quantize(np.zeros((4, 32), np.float32), "mxfp8", dtype="e3m4")
    with pytest.raises(scalemm.InvalidArgumentError, match="array"):
        scalemm.scaled_mm([[1]], [[1]], 1.0, 1.0, recipe_a="tensorwise", recipe_b="tensorwise")
