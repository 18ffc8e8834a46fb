"""The Python rows of the bad-input catalogue (docs/reliability.md, "Bad-input catalogue").

Each row takes a valid call (the harness first checks that it succeeds) and breaks it in one way. The
harness checks the scalemm.Error subclass, its `.status` name, that the message holds the row's
substrings (the argument's name first, then the expected and actual values or the rule id), and that
every input array keeps its bytes (no API here takes an output buffer: results are new arrays).
Several rows repeat a check of test_errors.py or test_grouped.py so that the table is complete.
"""

from __future__ import annotations

import numpy as np
import pytest

import scalemm

BLK = dict(recipe_a="block1x128", recipe_b="block128x128")
MX = dict(recipe_a="mxfp8", recipe_b="mxfp8")
NV = dict(recipe_a="nvfp4", recipe_b="nvfp4")
STATUS = {
    scalemm.InvalidArgumentError: "SCALEMM_STATUS_INVALID_ARGUMENT",
    scalemm.InvalidLayoutError: "SCALEMM_STATUS_INVALID_LAYOUT",
    scalemm.UnsupportedError: "SCALEMM_STATUS_UNSUPPORTED",
}


def _q(rng, rows, k, recipe):
    return scalemm.quantize(rng.standard_normal((rows, k)).astype(np.float32), recipe)


class Ops:
    """Valid inputs of each call the rows break."""

    def __init__(self):
        rng = np.random.default_rng(41)
        self.da, self.sa = _q(rng, 8, 256, "block1x128")
        self.db, self.sb = _q(rng, 8, 256, "block128x128")
        self.xa, self.xsa = _q(rng, 8, 256, "mxfp8")
        self.xb, self.xsb = _q(rng, 16, 256, "mxfp8")
        self.src = rng.standard_normal((4, 64)).astype(np.float32)
        # m-grouped: A (6, 128) in groups [3, 3]; B (2, 8, 128), one block128x128 scale per expert.
        # In compact format the groups' buffers laid end to end are A's whole (6, 1) grid.
        self.ga, self.gsa = _q(rng, 6, 128, "block1x128")
        experts = [_q(rng, 8, 128, "block128x128") for _ in range(2)]
        self.gb = np.stack([d for d, _ in experts])
        self.gsb = np.concatenate([s.reshape(-1) for _, s in experts])
        # k-grouped: A (4, 256), B (5, 256), K split [128, 128].
        self.ka, self.ksa = _q(rng, 4, 256, "block1x128")
        self.kb, self.ksb = _q(rng, 5, 256, "block128x128")
        # nvfp4: (block scales, global decode scale) pairs.
        self.na, (self.nsa, self.nga) = _q(rng, 4, 64, "nvfp4")
        self.nb, (self.nsb, self.ngb) = _q(rng, 8, 64, "nvfp4")

    def arrays(self):
        return [v for v in vars(self).values() if isinstance(v, np.ndarray)]


def _with(arr, index, value):
    bad = arr.copy()
    bad.reshape(-1).view(np.uint8 if arr.dtype.itemsize == 1 else arr.dtype)[index] = value
    return bad


def _valid_calls(o):
    return [
        lambda: scalemm.scaled_mm(o.da, o.db, o.sa, o.sb, **BLK),
        lambda: scalemm.scaled_mm(o.xa, o.xb, o.xsa, o.xsb, **MX),
        lambda: scalemm.quantize(o.src, "nvfp4"),
        lambda: scalemm.scaled_mm(o.na, o.nb, (o.nsa, o.nga), (o.nsb, o.ngb), **NV),
        lambda: scalemm.layouts.check(o.sa, "block1x128", 8, 256),
        lambda: scalemm.scaled_grouped_mm(o.ga, o.gb, o.gsa, o.gsb, [3, 3], **BLK),
        lambda: scalemm.scaled_grouped_mm(o.ka, o.kb, o.ksa, o.ksb, [128, 128], group_dim="k", **BLK),
    ]


# (id, API, call breaking one valid call, error class, substrings of the message in order of mention)
ROWS = [
    ("float-data-without-dtype", "scaled_mm",
     lambda o: scalemm.scaled_mm(o.da.astype(np.float32), o.db, o.sa, o.sb, **BLK),
     scalemm.InvalidArgumentError, ["a:", "must be FP8 or packed FP4", "got f32", "scalemm.quantize"]),
    ("raw-bytes-without-dtype", "scaled_mm",
     lambda o: scalemm.scaled_mm(o.da.view(np.uint8), o.db, o.sa, o.sb, **BLK),
     scalemm.InvalidArgumentError, ["dtype_a:", "got None"]),
    ("scale-shape", "scaled_mm",
     lambda o: scalemm.scaled_mm(o.da, o.db, o.sa, o.sb[:, :1].copy(), **BLK),
     scalemm.InvalidLayoutError, ["scale_b:", "expected (1, 2)", "got [1, 1]", "[scale-shape]"]),
    ("k-mismatch", "scaled_mm",
     lambda o: scalemm.scaled_mm(o.da, o.db[:, :128].copy(), o.sa, o.sb, **BLK),
     scalemm.InvalidArgumentError, ["b:", "share K", "expected K = 256, got K = 128"]),
    ("e8m0-nan", "scaled_mm",
     lambda o: scalemm.scaled_mm(o.xa, o.xb, _with(o.xsa, 9, 0xFF), o.xsb, **MX),
     scalemm.InvalidLayoutError, ["scale_a:", "0xFF (NaN)", "data row 1, K-block 1", "[e8m0-nan]"]),
    ("f32-scale-negative", "scaled_mm",
     lambda o: scalemm.scaled_mm(o.da, o.db, _with(o.sa, 3, -1.0), o.sb, **BLK),
     scalemm.InvalidLayoutError, ["scale_a:", "zero or negative", "[f32-scale-non-positive]"]),
    ("f32-scale-nan", "scaled_mm",
     lambda o: scalemm.scaled_mm(o.da, o.db, o.sa, _with(o.sb, 1, np.nan), **BLK),
     scalemm.InvalidLayoutError, ["scale_b:", "[f32-scale-non-finite]"]),
    ("scale-dtype", "scaled_mm",
     lambda o: scalemm.scaled_mm(o.da, o.db, o.sa.astype(np.float16), o.sb, **BLK),
     scalemm.InvalidArgumentError, ["scale_a:", "expected float32, got f16"]),
    ("unknown-recipe", "scaled_mm",
     lambda o: scalemm.scaled_mm(o.da, o.db, o.sa, o.sb, recipe_a="blockwise", recipe_b="block128x128"),
     scalemm.InvalidArgumentError, ["recipe_a:", "unknown recipe", "got 'blockwise'"]),
    ("unknown-out-dtype", "scaled_mm",
     lambda o: scalemm.scaled_mm(o.da, o.db, o.sa, o.sb, out_dtype="f64", **BLK),
     scalemm.InvalidArgumentError, ["out_dtype:", "expected bf16", "got 'f64'"]),
    ("unknown-scale-format", "scaled_mm",
     lambda o: scalemm.scaled_mm(o.da, o.db, o.sa, o.sb, scale_format="tiled", **BLK),
     scalemm.InvalidArgumentError, ["scale_format:", "expected compact, cublaslt", "got 'tiled'"]),
    ("non-contiguous", "scaled_mm",
     lambda o: scalemm.scaled_mm(np.asfortranarray(o.da), o.db, o.sa, o.sb, **BLK),
     scalemm.InvalidArgumentError, ["a:", "row-major", "expected strides (256, 1), got strides (1, 8)"]),
    ("rank-1-data", "scaled_mm",
     lambda o: scalemm.scaled_mm(o.da.reshape(-1), o.db, o.sa, o.sb, **BLK),
     scalemm.InvalidArgumentError, ["rank 2"]),
    ("native-on-host-arrays", "scaled_mm",
     lambda o: scalemm.scaled_mm(o.da, o.db, o.sa, o.sb, backend="native", **BLK),
     scalemm.UnsupportedError, ["backend:", "expected a backend that can run it", "got 'native'",
                                "backend=\"auto\"", "forced to native", "host pointers"]),
    ("scale-byte-order", "scaled_mm",
     lambda o: scalemm.scaled_mm(o.da, o.db, o.sa.astype(">f4"), o.sb, **BLK),
     scalemm.InvalidArgumentError, ["scale_a:", "machine's byte order", "got dtype '>f4'", "newbyteorder('=')"]),
    ("nvfp4-scales-without-global", "scaled_mm",
     lambda o: scalemm.scaled_mm(o.na, o.nb, o.nsa, (o.nsb, o.ngb), **NV),
     scalemm.InvalidArgumentError, ["scale_a:", "(block_scales, global_decode_scale)", "expected a tuple"]),
    ("nvfp4-global-nan", "scaled_mm",
     lambda o: scalemm.scaled_mm(o.na, o.nb, (o.nsa, o.nga), (o.nsb, float("nan")), **NV),
     scalemm.InvalidArgumentError, ["scale_b[1]:", "positive finite float32", "got nan"]),
    ("nvfp4-global-zero", "scaled_mm",
     lambda o: scalemm.scaled_mm(o.na, o.nb, (o.nsa, 0.0), (o.nsb, o.ngb), **NV),
     scalemm.InvalidArgumentError, ["scale_a[1]:", "positive finite float32", "got 0.0"]),
    ("nvfp4-global-beyond-float32", "scaled_mm",
     lambda o: scalemm.scaled_mm(o.na, o.nb, (o.nsa, 1e39), (o.nsb, o.ngb), **NV),
     scalemm.InvalidArgumentError, ["scale_a[1]:", "at most 3.4e38", "got 1e+39"]),
    ("quantize-integer-source", "quantize",
     lambda o: scalemm.quantize(o.src.astype(np.uint8), "mxfp8"),
     scalemm.InvalidArgumentError, ["x:", "expected float32, bfloat16 or float16, got u8"]),
    ("quantize-nvfp4-odd-k", "quantize",
     lambda o: scalemm.quantize(o.src[:, :33].copy(), "nvfp4"),
     scalemm.InvalidArgumentError, ["x:", "expected an even K, got 33"]),
    ("quantize-unknown-recipe", "quantize",
     lambda o: scalemm.quantize(o.src, "mxfp9"),
     scalemm.InvalidArgumentError, ["recipe:", "got 'mxfp9'"]),
    ("quantize-unknown-dtype", "quantize",
     lambda o: scalemm.quantize(o.src, "mxfp8", dtype="e3m4"),
     scalemm.InvalidArgumentError, ["dtype:", "expected e4m3, e5m2", "got 'e3m4'"]),
    ("check-unknown-format", "layouts.check",
     lambda o: scalemm.layouts.check(o.sa, "block1x128", 8, 256, scale_format="tiled"),
     scalemm.InvalidArgumentError, ["scale_format:", "got 'tiled'"]),
    ("check-zero-rows", "layouts.check",
     lambda o: scalemm.layouts.check(o.sa, "block1x128", 0, 256),
     scalemm.InvalidArgumentError, ["rows:", "expected an int >= 1, got 0"]),
    ("group-sizes-sum", "scaled_grouped_mm",
     lambda o: scalemm.scaled_grouped_mm(o.ga, o.gb, o.gsa, o.gsb, [3, 4], **BLK),
     scalemm.InvalidArgumentError, ["group_sizes", "add up", "6"]),
    ("group-size-negative", "scaled_grouped_mm",
     lambda o: scalemm.scaled_grouped_mm(o.ga, o.gb, o.gsa, o.gsb, [7, -1], **BLK),
     scalemm.InvalidArgumentError, ["group_sizes[1]", "negative"]),
    ("group-sizes-float", "scaled_grouped_mm",
     lambda o: scalemm.scaled_grouped_mm(o.ga, o.gb, o.gsa, o.gsb, [3.0, 3], **BLK),
     scalemm.InvalidArgumentError, ["group_sizes"]),
    ("group-count-vs-experts", "scaled_grouped_mm",
     lambda o: scalemm.scaled_grouped_mm(o.ga, o.gb, o.gsa, o.gsb, [2, 2, 2], **BLK),
     scalemm.InvalidArgumentError, ["experts"]),
    ("group-k-off-block", "scaled_grouped_mm",
     lambda o: scalemm.scaled_grouped_mm(o.ka, o.kb, o.ksa, o.ksb, [128, 100, 28], group_dim="k", **BLK),
     scalemm.InvalidArgumentError, ["group_sizes[1]", "multiple of 128", "K_g = 128"]),
    ("group-scale-size", "scaled_grouped_mm",
     lambda o: scalemm.scaled_grouped_mm(o.ga, o.gb, o.gsa.reshape(-1)[:-1].copy(), o.gsb, [3, 3], **BLK),
     scalemm.InvalidLayoutError, ["scale_a", "bytes"]),
    ("group-dim", "scaled_grouped_mm",
     lambda o: scalemm.scaled_grouped_mm(o.ga, o.gb, o.gsa, o.gsb, [3, 3], group_dim="n", **BLK),
     scalemm.InvalidArgumentError, ["group_dim"]),
    ("group-native-on-host-arrays", "scaled_grouped_mm",
     lambda o: scalemm.scaled_grouped_mm(o.ga, o.gb, o.gsa, o.gsb, [3, 3], backend="native", **BLK),
     scalemm.UnsupportedError, ["backend:", "expected a backend that can run it", "got 'native'",
                                "device arrays on a GPU", "forced to native"]),
]


def test_the_valid_calls_succeed():
    o = Ops()
    for call in _valid_calls(o):
        call()


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_catalogue_row(row):
    name, api, call, cls, needles = row
    if name in ("native-on-host-arrays", "group-native-on-host-arrays") and scalemm.has_gpu():
        pytest.skip("with a GPU, host arrays forced to native are covered by the GPU tests")
    o = Ops()
    before = [a.tobytes() for a in o.arrays()]
    with pytest.raises(scalemm.Error) as e:
        call(o)
    err = e.value
    assert type(err) is cls, (name, type(err).__name__, err.message)
    assert err.status == STATUS[cls], (name, err.status)
    assert err.message and err.message in str(err), name
    for needle in needles:
        assert needle in err.message, (name, needle, err.message)
    assert [a.tobytes() for a in o.arrays()] == before, (name, "an input array changed")


def test_rows_name_every_api():
    assert {r[1] for r in ROWS} == {"scaled_mm", "quantize", "layouts.check", "scaled_grouped_mm"}
    assert len({r[0] for r in ROWS}) == len(ROWS)
