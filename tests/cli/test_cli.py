#!/usr/bin/env python3
"""End-to-end tests of the `scalemm` CLI: run the built binary, check exit codes, outputs and files.

Usage: test_cli.py SCALEMM_BINARY CASE      run one case (CTest registers each case under a sentence)
       test_cli.py SCALEMM_BINARY --list    list the cases
       test_cli.py SCALEMM_BINARY --regen   rewrite the `layout explain` goldens (review them by hand!)

The layout formulas below are written from the cuBLAS documentation ("block scaling factors layout",
1D/2D block scaling) on purpose: they are an independent check of the library, not a copy of it.
"""
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

import ml_dtypes
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "golden")
BIN = None

RECIPES = ["tensorwise", "rowwise", "block1x128", "block128x128", "mxfp8", "mxfp8-32x32", "nvfp4"]
# (rows, cols) per recipe for the explain goldens: a tiny operand, a ragged one, an aligned one.
GOLDEN_SHAPES = [(4, 256), (130, 520), (256, 1024)]


# ---- running the binary ----------------------------------------------------------------------------

def run(*args, expect=None):
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=300)
    assert p.returncode >= 0, f"scalemm {' '.join(map(str, args))} died with signal {-p.returncode}\n{p.stderr}"
    if expect is not None:
        assert p.returncode == expect, (f"scalemm {' '.join(map(str, args))}: exit {p.returncode}, wanted {expect}\n"
                                        f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


class Tmp:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="scalemm-cli-")
        atexit.register(shutil.rmtree, self.dir, True)

    def path(self, name):
        return os.path.join(self.dir, name)

    def save(self, name, arr):
        path = self.path(name)
        np.save(path, arr)
        return path

    def files(self):
        return sorted(os.listdir(self.dir))


# ---- independent layout model ------------------------------------------------------------------------

def cdiv(a, b):
    return -(-a // b)


def rup(a, b):
    return cdiv(a, b) * b


def block(recipe, rows, k):
    """(block rows, block k) of a recipe."""
    return {"tensorwise": (max(rows, 1), max(k, 1)), "rowwise": (1, max(k, 1)), "block1x128": (1, 128),
            "block128x128": (128, 128), "mxfp8": (1, 32), "mxfp8-32x32": (32, 32), "nvfp4": (1, 16)}[recipe]


def grid_shape(recipe, rows, k):
    br, bk = block(recipe, rows, k)
    return cdiv(rows, br), cdiv(k, bk)


def scale_np_dtype(recipe):
    return np.uint8 if recipe in ("mxfp8", "mxfp8-32x32", "nvfp4") else np.float32


def tiled(grid_per_row):
    """128x4-tiled buffer (cuBLAS docs) of a per-row grid (R, S)."""
    r, s = grid_per_row.shape
    rp, s4 = rup(r, 128), rup(s, 4)
    buf = np.zeros(rp * s4, grid_per_row.dtype)
    for i in range(r):
        for j in range(s):
            off = ((i // 128) * (s4 // 4) + j // 4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4
            buf[off] = grid_per_row[i, j]
    return buf


def cublaslt_from_compact(recipe, rows, k, g):
    """The buffer cuBLASLt reads, from the compact grid g (grid_rows, kblocks), per the cuBLAS docs."""
    gr, L = g.shape
    if recipe in ("tensorwise", "rowwise"):
        return g.reshape(-1).copy()
    if recipe == "block1x128":  # VEC128_32F: outer-major, outer dim padded to 4
        r4 = rup(rows, 4)
        buf = np.zeros(L * r4, g.dtype)
        for kb in range(L):
            buf[kb * r4:kb * r4 + rows] = g[:, kb]
        return buf
    if recipe == "block128x128":  # BLK128x128_32F: K-major, K-block stride padded to 4
        l4 = rup(L, 4)
        buf = np.zeros(gr * l4, g.dtype)
        for i in range(gr):
            buf[i * l4:i * l4 + L] = g[i]
        return buf
    if recipe == "mxfp8-32x32":
        return tiled(np.repeat(g, 32, axis=0)[:rows])
    return tiled(g)


def random_scales(rng, recipe, shape):
    if recipe in ("mxfp8", "mxfp8-32x32"):
        return rng.integers(118, 136, size=shape, dtype=np.uint8)  # 2^-9 .. 2^8
    if recipe == "nvfp4":
        return rng.integers(0x20, 0x58, size=shape, dtype=np.uint8)  # positive normal UE4M3
    return (rng.random(shape, dtype=np.float32) * 3 + 0.25).astype(np.float32)


def decode_scales(recipe, g):
    if recipe in ("mxfp8", "mxfp8-32x32"):
        return np.exp2(g.astype(np.float64) - 127)
    if recipe == "nvfp4":
        return (g & 0x7F).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return g.astype(np.float64)


def expand(recipe, rows, k, g):
    """Per-element scale (rows, k) from the compact grid."""
    br, bk = block(recipe, rows, k)
    s = decode_scales(recipe, g)
    return np.repeat(np.repeat(s, br, axis=0), bk, axis=1)[:rows, :k]


def random_operand(rng, recipe, rows, k, fp8="e4m3"):
    """(stored uint8 data, float64 decoded values)."""
    if recipe == "nvfp4":
        codes = rng.integers(0, 16, size=(rows, k), dtype=np.uint8)
        packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
        vals = _e2m1_table()[codes]
        return packed, vals
    t = ml_dtypes.float8_e4m3fn if fp8 == "e4m3" else ml_dtypes.float8_e5m2
    x = (rng.standard_normal((rows, k)) * 4).astype(t)
    return x.view(np.uint8), x.astype(np.float64)


def _e2m1_table():
    mags = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    return np.array(mags + [-m for m in mags])


# ---- cases -----------------------------------------------------------------------------------------

CASES = {}


def case(name):
    def deco(fn):
        CASES[fn.__name__] = (name, fn)
        return fn
    return deco


def golden_path(recipe, rows, cols):
    return os.path.join(GOLDEN, f"explain_{recipe}_{rows}x{cols}.txt")


def explain_golden(recipe):
    for rows, cols in GOLDEN_SHAPES:
        out = run("layout", "explain", "--recipe", recipe, "--rows", rows, "--cols", cols, expect=0).stdout
        with open(golden_path(recipe, rows, cols)) as f:
            want = f.read()
        assert out == want, f"explain {recipe} {rows}x{cols} differs from {golden_path(recipe, rows, cols)}:\n{out}"


for _r in RECIPES:
    def _mk(r):
        def fn():
            explain_golden(r)
        fn.__name__ = "explain_golden_" + r.replace("-", "_")
        case(f"layout explain for {r} matches the reviewed golden output")(fn)
    _mk(_r)


@case("layout explain --json gives shapes and sizes that agree with the cuBLAS layouts")
def explain_json():
    for recipe in RECIPES:
        for rows, cols in [(130, 520), (7, 40), (256, 1024)]:
            j = json.loads(run("layout", "explain", "--recipe", recipe, "--rows", rows, "--cols", cols,
                               "--json", expect=0).stdout)
            g = grid_shape(recipe, rows, cols)
            assert j["recipe"] == recipe and j["grid"] == list(g), j
            assert j["compact"]["elements"] == g[0] * g[1] and j["compact"]["padding_elements"] == 0
            ref = cublaslt_from_compact(recipe, rows, cols, np.ones(g, scale_np_dtype(recipe)))
            assert j["cublaslt"]["elements"] == ref.size, (recipe, rows, cols, j["cublaslt"], ref.size)
            assert j["cublaslt"]["bytes"] == ref.nbytes
            assert j["cublaslt"]["padding_elements"] == ref.size - np.count_nonzero(ref), (recipe, rows, cols)


@case("layout convert produces the cuBLAS-documented buffer and round-trips back to the compact grid")
def convert_round_trip():
    rng = np.random.default_rng(1)
    t = Tmp()
    for recipe in RECIPES:
        for rows, cols in [(130, 520), (4, 256), (256, 1024), (33, 96)]:
            g = random_scales(rng, recipe, grid_shape(recipe, rows, cols))
            src = t.save("compact.npy", g)
            lt, back = t.path("lt.npy"), t.path("back.npy")
            common = ["--recipe", recipe, "--rows", rows, "--cols", cols]
            run("layout", "convert", *common, "--from", "compact", "--to", "cublaslt", "--in", src, "--out", lt,
                expect=0)
            buf = np.load(lt)
            want = cublaslt_from_compact(recipe, rows, cols, g)
            assert buf.ndim == 1 and buf.dtype == want.dtype, (recipe, buf.shape, buf.dtype)
            assert np.array_equal(buf.view(np.uint8), want.view(np.uint8)), (recipe, rows, cols)
            run("layout", "check", *common, "--format", "cublaslt", "--scales", lt, expect=0)
            run("layout", "convert", *common, "--from", "cublaslt", "--to", "compact", "--in", lt, "--out", back,
                expect=0)
            b = np.load(back)
            assert b.shape == g.shape and b.dtype == g.dtype and np.array_equal(b.view(np.uint8), g.view(np.uint8))
    assert t.files() == ["back.npy", "compact.npy", "lt.npy"], t.files()  # no temporaries left


@case("layout convert refuses an invalid input and writes nothing")
def convert_refuses_invalid():
    t = Tmp()
    bad = t.save("bad.npy", np.full((4, 8), 0xFF, np.uint8))
    out = t.path("out.npy")
    p = run("layout", "convert", "--recipe", "mxfp8", "--rows", 4, "--cols", 256, "--from", "compact", "--to",
            "cublaslt", "--in", bad, "--out", out, expect=1)
    assert "e8m0-nan" in p.stderr
    wrong = t.save("wrong.npy", np.ones((3, 8), np.uint8))
    p = run("layout", "convert", "--recipe", "mxfp8", "--rows", 4, "--cols", 256, "--from", "compact", "--to",
            "cublaslt", "--in", wrong, "--out", out, expect=1)
    assert "scale-shape" in p.stderr, p.stderr
    with open(t.path("junk.npy"), "wb") as f:
        f.write(b"not a numpy file")
    run("layout", "convert", "--recipe", "mxfp8", "--rows", 4, "--cols", 256, "--from", "compact", "--to",
        "cublaslt", "--in", t.path("junk.npy"), "--out", out, expect=1)
    assert t.files() == ["bad.npy", "junk.npy", "wrong.npy"], t.files()


def check(recipe, rows, cols, fmt, arr, expect, rule=None):
    t = Tmp()
    path = t.save("s.npy", arr)
    p = run("layout", "check", "--recipe", recipe, "--rows", rows, "--cols", cols, "--format", fmt, "--scales",
            path, expect=expect)
    j = json.loads(run("layout", "check", "--recipe", recipe, "--rows", rows, "--cols", cols, "--format", fmt,
                       "--scales", path, "--json", expect=expect).stdout)
    assert j["valid"] == (expect == 0)
    if rule:
        assert f"[{rule}]" in p.stdout, f"wanted diagnostic {rule}:\n{p.stdout}"
        assert rule in [d["rule"] for d in j["diagnostics"]], j
        for d in j["diagnostics"]:
            assert d["message"] and d["expected"] and d["actual"], d
        assert "expected:" in p.stdout and "actual:" in p.stdout and "fix:" in p.stdout
    return p


@case("layout check rejects an unpadded block128x128 K-block stride")
def check_blk128_stride():
    # K=640 -> 5 K-blocks, cuBLASLt wants a stride of 8.
    check("block128x128", 256, 640, "cublaslt", np.ones(10, np.float32), 1, "blk128-kblock-stride")
    check("block128x128", 256, 640, "cublaslt", np.ones((2, 5), np.float32), 1, "blk128-kblock-stride")
    check("block128x128", 256, 640, "cublaslt",
          cublaslt_from_compact("block128x128", 256, 640, np.ones((2, 5), np.float32)), 0)


@case("layout check rejects a K-major block1x128 buffer")
def check_vec128_k_major():
    g = np.ones((64, 3), np.float32)  # what a per-token-group quantizer writes: row-major (R, L)
    check("block1x128", 64, 384, "cublaslt", g, 1, "vec128-k-major")
    check("block1x128", 64, 384, "compact", g, 0)
    check("block1x128", 64, 384, "cublaslt", cublaslt_from_compact("block1x128", 64, 384, g), 0)
    check("block1x128", 64, 384, "cublaslt", np.ascontiguousarray(g.T), 0)  # the (L, R) view is the buffer


@case("layout check rejects NaN (0xFF) E8M0 scales")
def check_e8m0_nan():
    g = np.full((4, 8), 127, np.uint8)
    check("mxfp8", 4, 256, "compact", g, 0)
    g[2, 5] = 0xFF
    p = check("mxfp8", 4, 256, "compact", g, 1, "e8m0-nan")
    assert "data row 2, K-block 5" in p.stdout, p.stdout
    lt = cublaslt_from_compact("mxfp8", 4, 256, g)
    check("mxfp8", 4, 256, "cublaslt", lt, 1, "e8m0-nan")


@case("layout check rejects wrong sizes, shapes and dtypes")
def check_sizes_dtypes():
    g = np.full((4, 8), 127, np.uint8)
    check("mxfp8", 4, 256, "cublaslt", g.reshape(-1), 1, "scale-element-count")  # the compact grid, unpadded
    check("mxfp8", 4, 256, "cublaslt", g, 1, "scale-shape")
    check("mxfp8", 4, 256, "compact", np.ones((4, 8), np.float32), 1, "scale-dtype")
    check("block1x128", 64, 384, "compact", np.ones((64, 3), np.float64), 1, "scale-dtype")
    check("block1x128", 64, 384, "compact", np.ones((64, 3), np.float16), 1, "scale-dtype")
    check("rowwise", 64, 384, "compact", np.ones(63, np.float32), 1, "scale-element-count")
    check("block1x128", 64, 384, "compact", np.ones((64, 3, 1), np.float32), 1, "scale-shape")


@case("layout check rejects bad content: nonzero padding and non-positive fp32 scales")
def check_content_rules():
    lt = cublaslt_from_compact("mxfp8", 4, 256, np.full((4, 8), 127, np.uint8))
    pad = np.flatnonzero(lt == 0)[0]
    lt[pad] = 3
    check("mxfp8", 4, 256, "cublaslt", lt, 1, "scale-padding-nonzero")
    g = np.ones((64, 3), np.float32)
    g[5, 1] = -1.0
    check("block1x128", 64, 384, "compact", g, 1, "f32-scale-non-positive")
    g[5, 1] = np.nan
    check("block1x128", 64, 384, "compact", g, 1, "f32-scale-non-finite")


GEMM_CASES = [
    # recipe_a, recipe_b, m, n, k, a_dtype, b_dtype
    ("tensorwise", "tensorwise", 16, 24, 64, "e4m3", "e4m3"),
    ("rowwise", "rowwise", 20, 12, 96, "e4m3", "e5m2"),
    ("block1x128", "block128x128", 36, 136, 384, "e4m3", "e4m3"),
    ("block1x128", "block1x128", 8, 16, 256, "e5m2", "e4m3"),
    ("mxfp8", "mxfp8", 40, 24, 128, "e4m3", "e4m3"),
    ("mxfp8-32x32", "mxfp8", 64, 40, 96, "e4m3", "e4m3"),
    ("nvfp4", "nvfp4", 24, 16, 64, None, None),
    ("tensorwise", "mxfp8", 8, 8, 64, "e4m3", "e4m3"),
]


def gemm_inputs(t, rng, ra, rb, m, n, k, ta, tb):
    a, av = random_operand(rng, ra, m, k, ta or "e4m3")
    b, bv = random_operand(rng, rb, n, k, tb or "e4m3")
    sa = random_scales(rng, ra, grid_shape(ra, m, k))
    sb = random_scales(rng, rb, grid_shape(rb, n, k))
    ref_a = av * expand(ra, m, k, sa)
    ref_b = bv * expand(rb, n, k, sb)
    files = {"--a": t.save("a.npy", a), "--b": t.save("b.npy", b), "--scale-a": t.save("sa.npy", sa),
             "--scale-b": t.save("sb.npy", sb)}
    return files, ref_a, ref_b, (sa, sb)


def gemm_args(ra, rb, k, files, out, ta, tb, *extra):
    args = ["gemm", "--recipe-a", ra, "--recipe-b", rb, "--k", k, "--out", out]
    for flag, path in files.items():
        args += [flag, path]
    if ta:
        args += ["--a-dtype", ta]
    if tb:
        args += ["--b-dtype", tb]
    return args + list(extra)


@case("gemm --backend reference agrees with a NumPy float64 computation for every recipe")
def gemm_matches_numpy():
    rng = np.random.default_rng(7)
    for ra, rb, m, n, k, ta, tb in GEMM_CASES:
        t = Tmp()
        files, A, B, _ = gemm_inputs(t, rng, ra, rb, m, n, k, ta, tb)
        alpha = 0.75
        want = alpha * (A @ B.T)
        bound = 4 * k * 2.0 ** -24 * alpha * (np.abs(A) @ np.abs(B).T) + 1e-30
        out = t.path("d.npy")
        p = run(*gemm_args(ra, rb, k, files, out, ta, tb, "--backend", "reference", "--out-dtype", "f32",
                           "--alpha", alpha), expect=0)
        assert "reference" in p.stdout and "plan:" in p.stdout, p.stdout
        d = np.load(out)
        assert d.dtype == np.float32 and d.shape == (m, n), (d.dtype, d.shape)
        err = np.abs(d.astype(np.float64) - want)
        assert np.all(err <= bound), f"{ra}x{rb}: max err {err.max()} (bound {bound[np.argmax(err - bound)]})"
        # bf16 and f16 outputs: the f32 result rounded (within one unit of the output type).
        for od, check_dtype in (("bf16", np.uint16), ("f16", np.float16)):
            # The reference backend again: on a GPU, auto would pick native FP8 kernels, whose Hopper
            # accumulation precision is outside this fp32-accumulation bound (docs/dispatch.md).
            run(*gemm_args(ra, rb, k, files, out, ta, tb, "--backend", "reference", "--out-dtype", od,
                           "--alpha", alpha), expect=0)
            e = np.load(out)
            assert e.dtype == check_dtype and e.shape == (m, n), (od, e.dtype)
            if od == "bf16":
                vals = (e.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
                u = 2.0 ** -8
            else:
                vals = e.astype(np.float64)
                u = 2.0 ** -11
            fin = np.isfinite(vals)
            assert np.all(np.abs(vals - want)[fin] <= (u * np.abs(want) + bound + 2.0 ** -24)[fin]), (ra, rb, od)
        assert sorted(os.listdir(t.dir)) == ["a.npy", "b.npy", "d.npy", "sa.npy", "sb.npy"], os.listdir(t.dir)


@case("gemm reads cublaslt-format scales to the same result as compact ones")
def gemm_cublaslt_scales():
    rng = np.random.default_rng(11)
    for ra, rb, m, n, k, ta, tb in GEMM_CASES:
        t = Tmp()
        files, _, _, (sa, sb) = gemm_inputs(t, rng, ra, rb, m, n, k, ta, tb)
        run(*gemm_args(ra, rb, k, files, t.path("d1.npy"), ta, tb, "--out-dtype", "f32"), expect=0)
        files["--scale-a"] = t.save("la.npy", cublaslt_from_compact(ra, m, k, sa))
        files["--scale-b"] = t.save("lb.npy", cublaslt_from_compact(rb, n, k, sb))
        run(*gemm_args(ra, rb, k, files, t.path("d2.npy"), ta, tb, "--out-dtype", "f32", "--scale-format",
                       "cublaslt"), expect=0)
        assert np.array_equal(np.load(t.path("d1.npy")).view(np.uint32), np.load(t.path("d2.npy")).view(np.uint32))


@case("gemm rejects invalid operands and scales with diagnostics and writes nothing")
def gemm_rejects_invalid():
    rng = np.random.default_rng(3)
    t = Tmp()
    files, _, _, (sa, sb) = gemm_inputs(t, rng, "mxfp8", "mxfp8", 32, 32, 128, "e4m3", "e4m3")
    out = t.path("d.npy")
    base = dict(files)
    # wrong data dtype
    files["--a"] = t.save("af.npy", np.ones((32, 128), np.float32))
    p = run(*gemm_args("mxfp8", "mxfp8", 128, files, out, None, None), expect=1)
    assert "data-dtype" in p.stderr, p.stderr
    # K disagrees with the data
    p = run(*gemm_args("mxfp8", "mxfp8", 256, base, out, None, None), expect=1)
    assert "data-shape" in p.stderr, p.stderr
    # NaN scale
    files = dict(base)
    bad = sa.copy()
    bad[1, 1] = 0xFF
    files["--scale-a"] = t.save("nan.npy", bad)
    p = run(*gemm_args("mxfp8", "mxfp8", 128, files, out, None, None), expect=1)
    assert "e8m0-nan" in p.stderr and "scale_a" in p.stderr, p.stderr
    # compact scales declared as cublaslt
    p = run(*gemm_args("mxfp8", "mxfp8", 128, base, out, None, None, "--scale-format", "cublaslt"), expect=1)
    assert "scale-" in p.stderr, p.stderr
    # missing file
    files = dict(base)
    files["--b"] = t.path("missing.npy")
    run(*gemm_args("mxfp8", "mxfp8", 128, files, out, None, None), expect=1)
    assert not os.path.exists(out) and not any(f.startswith("d.npy") for f in t.files()), t.files()


@case("gemm without a GPU refuses a forced GPU backend and writes nothing")
def gemm_forced_backend_without_gpu():
    info = json.loads(run("info", "--json", expect=0).stdout)
    if info["devices"]:
        return  # only meaningful on a machine without a CUDA device
    rng = np.random.default_rng(5)
    t = Tmp()
    files, _, _, _ = gemm_inputs(t, rng, "mxfp8", "mxfp8", 32, 32, 128, "e4m3", "e4m3")
    for backend in ("native", "emulated", "contiguous"):
        p = run(*gemm_args("mxfp8", "mxfp8", 128, files, t.path("d.npy"), None, None, "--backend", backend),
                expect=1)
        assert "no backend can run" in p.stderr, p.stderr
    assert not os.path.exists(t.path("d.npy"))


def make_dump(t, rng, ra="mxfp8", rb="mxfp8", m=32, n=24, k=128):
    """A dump directory as verify::dump_call writes it, with d computed by `scalemm gemm`."""
    files, _, _, (sa, sb) = gemm_inputs(t, rng, ra, rb, m, n, k, "e4m3", "e4m3")
    run(*gemm_args(ra, rb, k, files, t.path("d.npy"), None, None, "--out-dtype", "bf16"), expect=0)
    d = t.path("dump")
    os.mkdir(d)
    np.save(os.path.join(d, "a.npy"), np.load(files["--a"]))
    np.save(os.path.join(d, "b.npy"), np.load(files["--b"]))
    np.save(os.path.join(d, "scale_a.npy"), sa.reshape(-1))
    np.save(os.path.join(d, "scale_b.npy"), sb.reshape(-1))
    np.save(os.path.join(d, "d.npy"), np.load(t.path("d.npy")))
    call = {"m": m, "n": n, "k": k, "alpha": 1.0,
            "a": {"recipe": ra, "dtype": "e4m3", "scale_format": "compact", "global_scale": 1.0},
            "b": {"recipe": rb, "dtype": "e4m3", "scale_format": "compact", "global_scale": 1.0},
            "d_dtype": "bf16", "bias": False, "backend": "native", "plan": "test dump", "note": "made by test_cli.py"}
    with open(os.path.join(d, "call.json"), "w") as f:
        json.dump(call, f)
    return d


@case("replay re-runs a dumped call, shows the plan and compares it with the reference")
def replay_agrees():
    t = Tmp()
    d = make_dump(t, np.random.default_rng(9))
    p = run("replay", d, expect=0)
    assert "recorded plan (native)" in p.stdout and "plan on this machine" in p.stdout, p.stdout
    assert "agrees" in p.stdout, p.stdout
    j = json.loads(run("replay", d, "--json", expect=0).stdout)
    assert j["agree"] and j["comparisons"][0]["comparison"]["within_tolerance"], j


@case("replay reports a wrong dumped result with its worst elements")
def replay_disagrees():
    t = Tmp()
    d = make_dump(t, np.random.default_rng(10))
    res = np.load(os.path.join(d, "d.npy"))
    vals = (res.astype(np.uint32) << 16).view(np.float32)
    wrong = np.float32(-4 * np.abs(vals).max())  # far outside any accumulation-order tolerance
    bad = res.copy()
    bad[3, 7] = np.uint16(wrong.view(np.uint32) >> 16)
    np.save(os.path.join(d, "d.npy"), bad)
    p = run("replay", d, expect=1)
    assert "DISAGREES" in p.stdout and "D[3, 7]" in p.stdout, p.stdout
    j = json.loads(run("replay", d, "--json", expect=1).stdout)
    w = j["comparisons"][0]["worst"][0]
    assert (w["row"], w["col"]) == (3, 7), w


@case("replay rejects an incomplete or malformed dump")
def replay_bad_dump():
    t = Tmp()
    d = make_dump(t, np.random.default_rng(12))
    os.remove(os.path.join(d, "scale_b.npy"))
    run("replay", d, expect=1)
    d2 = make_dump(Tmp(), np.random.default_rng(12))
    with open(os.path.join(d2, "call.json"), "w") as f:
        f.write("{ not json")
    run("replay", d2, expect=1)
    d3 = make_dump(Tmp(), np.random.default_rng(12))
    np.save(os.path.join(d3, "scale_a.npy"), np.ones(5, np.uint8))
    p = run("replay", d3, expect=1)
    assert "scale-element-count" in p.stderr, p.stderr
    run("replay", t.path("does-not-exist"), expect=1)


@case("gemm with an FP8 output applies --d-scale, saturates, and names a missing or misplaced D scale")
def gemm_fp8_output():
    rng = np.random.default_rng(21)
    t = Tmp()
    m, n, k = 16, 32, 128
    files, A, B, _ = gemm_inputs(t, rng, "mxfp8", "mxfp8", m, n, k, "e4m3", "e4m3")
    ref = t.path("ref.npy")
    run(*gemm_args("mxfp8", "mxfp8", k, files, ref, None, None, "--backend", "reference", "--out-dtype", "f32"),
        expect=0)
    v = np.load(ref).astype(np.float32)
    for od, np_t, fmax in (("e4m3", ml_dtypes.float8_e4m3fn, 448.0), ("e5m2", ml_dtypes.float8_e5m2, 57344.0)):
        for ds in (fmax / float(np.abs(v).max()), 4 * fmax / float(np.abs(v).max())):  # in range; saturating
            out = t.path(f"d_{od}.npy")
            p = run(*gemm_args("mxfp8", "mxfp8", k, files, out, None, None, "--backend", "reference",
                               "--out-dtype", od, "--d-scale", ds), expect=0)
            assert "FP8 raw bits" in p.stdout, p.stdout
            d = np.load(out)
            assert d.dtype == np.uint8 and d.shape == (m, n), (d.dtype, d.shape)
            # The f32 reference scaled, saturated at the largest finite value, rounded to nearest even.
            want = np.clip(np.float32(ds) * v, -fmax, fmax).astype(np_t).view(np.uint8)
            assert np.array_equal(d, want), (od, ds, int(np.sum(d != want)))
    out = t.path("d_bad.npy")
    p = run(*gemm_args("mxfp8", "mxfp8", k, files, out, None, None, "--out-dtype", "e4m3"), expect=1)
    assert "fp8-out-d-scale" in p.stderr, p.stderr
    p = run(*gemm_args("mxfp8", "mxfp8", k, files, out, None, None, "--out-dtype", "bf16", "--d-scale", 2), expect=1)
    assert "d-scale-without-fp8-out" in p.stderr, p.stderr
    assert not os.path.exists(out)


@case("replay re-runs a dumped FP8-output call with its recorded D scale")
def replay_fp8_output():
    t = Tmp()
    rng = np.random.default_rng(22)
    d = make_dump(t, rng)
    files = {"--a": os.path.join(d, "a.npy"), "--b": os.path.join(d, "b.npy")}
    sa, sb = np.load(os.path.join(d, "scale_a.npy")), np.load(os.path.join(d, "scale_b.npy"))
    files["--scale-a"] = t.save("sa2.npy", sa.reshape(32, -1))
    files["--scale-b"] = t.save("sb2.npy", sb.reshape(24, -1))
    run(*gemm_args("mxfp8", "mxfp8", 128, files, t.path("d8.npy"), None, None, "--out-dtype", "e4m3",
                   "--d-scale", 0.5), expect=0)
    np.save(os.path.join(d, "d.npy"), np.load(t.path("d8.npy")))
    with open(os.path.join(d, "call.json")) as f:
        call = json.load(f)
    call["d_dtype"], call["d_scale"] = "e4m3", 0.5
    with open(os.path.join(d, "call.json"), "w") as f:
        json.dump(call, f)
    j = json.loads(run("replay", d, "--json", expect=0).stdout)
    assert j["agree"] and j["comparisons"][0]["comparison"]["within_tolerance"], j
    # A D scale the output was not made with is a disagreement, not a crash.
    call["d_scale"] = 4.0
    with open(os.path.join(d, "call.json"), "w") as f:
        json.dump(call, f)
    run("replay", d, expect=1)


@case("gemm and replay refuse a D scale of 0, negative, NaN, inf or beyond float32 and write nothing")
def d_scale_values():
    rng = np.random.default_rng(23)
    t = Tmp()
    files, _, _, _ = gemm_inputs(t, rng, "mxfp8", "mxfp8", 16, 32, 128, "e4m3", "e4m3")
    out = t.path("d8.npy")
    for bad in ("0", "-1", "-0", "nan", "inf", "-inf", "1e39"):
        refused(gemm_args("mxfp8", "mxfp8", 128, files, out, None, None, "--out-dtype", "e4m3", "--d-scale", bad), 2,
                "--d-scale", "expected a positive finite number", "got " + bad)
    assert not os.path.exists(out)
    # A subnormal D scale is a number, if a poor one: accepted (its outputs are mostly zero).
    run(*gemm_args("mxfp8", "mxfp8", 128, files, out, None, None, "--out-dtype", "e4m3", "--d-scale", "1e-40"),
        expect=0)
    # call.json's d_scale goes through the library's check (validate): named, nothing run.
    d = make_dump(t, rng)
    np.save(os.path.join(d, "d.npy"), np.zeros((32, 24), np.uint8))  # an e4m3 D, as an FP8 dump holds
    with open(os.path.join(d, "call.json")) as f:
        call = json.load(f)
    for bad in (0.0, -0.5, 1e39):
        call["d_dtype"], call["d_scale"] = "e4m3", bad
        with open(os.path.join(d, "call.json"), "w") as f:
            json.dump(call, f)
        p = run("replay", d, expect=1)
        assert ("d-scale-value" if bad < 1e38 else "d_scale") in p.stderr, p.stderr
        assert "comparisons" not in p.stdout, p.stdout


@case("layout render writes an SVG that parses and covers the buffer")
def render_svg():
    t = Tmp()
    for recipe in RECIPES:
        for fmt in ("compact", "cublaslt"):
            out = t.path(f"{recipe}-{fmt}.svg")
            run("layout", "render", "--recipe", recipe, "--rows", 130, "--cols", 520, "--format", fmt, "--out", out,
                expect=0)
            root = ET.parse(out).getroot()
            assert root.tag == "{http://www.w3.org/2000/svg}svg", root.tag
            rects = [r for r in root.findall("{http://www.w3.org/2000/svg}rect") if r.get("class") == "cell"]
            j = json.loads(run("layout", "explain", "--recipe", recipe, "--rows", 130, "--cols", 520, "--json",
                               expect=0).stdout)
            assert len(rects) == min(j[fmt]["elements"], 8192), (recipe, fmt, len(rects))
    assert all(f.endswith(".svg") for f in t.files()), t.files()


@case("info prints versions and the support matrix, and --sm/--cublas ask about another machine")
def info_matrix():
    p = run("info", expect=0)
    assert "scalemm" in p.stdout and "support matrix" in p.stdout, p.stdout
    j = json.loads(run("info", "--json", expect=0).stdout)
    assert len(j["support"]) == 49 and j["native_pairs"], j.keys()
    # Every device has its capability row and its own matrix (none without a GPU).
    for d in j["devices"]:
        assert d["target"].startswith(f"device {d['ordinal']}: sm_{d['sm']}"), d
        assert d["capabilities"].endswith("of 49 pairs") and len(d["support"]) == 49, d
        assert f"\n  {d['target']}: {d['capabilities']}\n" in p.stdout, (d["target"], p.stdout)

    def backend(js, a, b):
        return next(r["backend"] for r in js["support"] if r["a"] == a and r["b"] == b)

    h = json.loads(run("info", "--sm", 90, "--json", expect=0).stdout)
    assert h["target"]["simulated"] and h["target"]["sm"] == 90
    assert backend(h, "block1x128", "block128x128") == "native"
    assert backend(h, "tensorwise", "rowwise") == "convert-native"
    assert backend(h, "mxfp8", "mxfp8") == "emulated"
    assert backend(h, "block128x128", "block128x128") == "reference"
    b = json.loads(run("info", "--sm", 100, "--cublas", "13.4", "--json", expect=0).stdout)
    assert b["target"]["cublaslt"] == 130400
    assert backend(b, "mxfp8", "mxfp8") == "native" and backend(b, "nvfp4", "nvfp4") == "native"
    assert backend(b, "block1x128", "block1x128") != "native"
    old = json.loads(run("info", "--sm", 90, "--cublas", "12.8", "--json", expect=0).stdout)
    assert backend(old, "block1x128", "block1x128") != "native"
    txt = run("info", "--sm", 90, expect=0).stdout
    assert "block1x128 x block128x128" in txt and "not native" in txt, txt
    # cuBLASLt's grouped API: probed on this machine, version-gated on a simulated one; never used.
    g = j["cublaslt_grouped_api"]
    assert g["version"] == j["cublaslt"] and g["used"] is False, g
    if j["cublaslt"] < 130200:
        assert g["present"] is False and g["supports"] == [], g
    assert "cuBLASLt grouped API: " in p.stdout and "per-group backend" in p.stdout, p.stdout
    g = json.loads(run("info", "--sm", 90, "--cublas", "13.4", "--json", expect=0).stdout)["cublaslt_grouped_api"]
    assert g["present"] and g["simulated"] and g["supports"] == ["blockwise"], g
    assert any("CUDA graph" in h for h in g["hazards"]), g
    g = json.loads(run("info", "--sm", 90, "--cublas", "13.1", "--json", expect=0).stdout)["cublaslt_grouped_api"]
    assert not g["present"] and g["supports"] == [], g
    txt = run("info", "--sm", 90, "--cublas", "13.2", expect=0).stdout
    assert "cuBLASLt grouped API [simulated: present from 13.2]: present (cuBLASLt 13.2.0)" in txt, txt
    assert "hazard: cuBLAS 13.2: wrong wgrad" in txt, txt


SUBCOMMANDS = [[], ["info"], ["layout"], ["layout", "explain"], ["layout", "check"], ["layout", "convert"],
               ["layout", "render"], ["gemm"], ["replay"], ["demo"]]


@case("every subcommand answers --help with its usage")
def help_everywhere():
    for sub in SUBCOMMANDS:
        p = run(*sub, "--help", expect=0)
        assert "Usage" in p.stdout or "usage" in p.stdout.lower(), (sub, p.stdout)
        assert "--help" in p.stdout, (sub, p.stdout)
    g = run("gemm", "--help", expect=0).stdout
    for flag in ["--recipe-a", "--recipe-b", "--a", "--b", "--scale-a", "--scale-b", "--k", "--out", "--scale-format",
                 "--out-dtype", "--backend", "--alpha", "--a-dtype", "--b-dtype"]:
        assert flag in g, flag


@case("bad arguments give exit 2 with a usage message, never a crash")
def usage_errors():
    t = Tmp()
    s = t.save("s.npy", np.ones((4, 8), np.uint8))
    bad = [
        [],
        ["frobnicate"],
        ["layout"],
        ["layout", "explain"],
        ["layout", "explain", "--recipe", "mxfp9", "--rows", 4, "--cols", 32],
        ["layout", "explain", "--recipe", "mxfp8", "--rows", -4, "--cols", 32],
        ["layout", "explain", "--recipe", "mxfp8", "--rows", "four", "--cols", 32],
        ["layout", "explain", "--recipe", "mxfp8", "--rows", 10 ** 12, "--cols", 10 ** 12],
        ["layout", "explain", "--recipe", "mxfp8", "--rows", 4, "--cols", 32, "--bogus"],
        ["layout", "check", "--recipe", "mxfp8", "--rows", 4, "--cols", 256, "--format", "tiled", "--scales", s],
        ["layout", "check", "--recipe", "mxfp8", "--rows", 4, "--cols", 256, "--scales", s],
        ["layout", "convert", "--recipe", "mxfp8", "--rows", 4, "--cols", 256, "--from", "compact", "--in", s,
         "--out", t.path("o.npy")],
        ["layout", "render", "--recipe", "mxfp8", "--rows", 4, "--cols", 256],
        ["gemm", "--recipe-a", "mxfp8"],
        ["gemm", "--recipe-a", "mxfp8", "--recipe-b", "mxfp8", "--a", s, "--b", s, "--scale-a", s, "--scale-b", s,
         "--k", 0, "--out", t.path("o.npy")],
        ["gemm", "--recipe-a", "mxfp8", "--recipe-b", "mxfp8", "--a", s, "--b", s, "--scale-a", s, "--scale-b", s,
         "--k", 32, "--out", t.path("o.npy"), "--backend", "fastest"],
        ["gemm", "--recipe-a", "mxfp8", "--recipe-b", "mxfp8", "--a", s, "--b", s, "--scale-a", s, "--scale-b", s,
         "--k", 32, "--out", t.path("o.npy"), "--out-dtype", "f64"],
        ["gemm", "--recipe-a", "nvfp4", "--recipe-b", "nvfp4", "--a", s, "--b", s, "--scale-a", s, "--scale-b", s,
         "--k", 32, "--out", t.path("o.npy"), "--a-dtype", "e4m3"],
        ["gemm", "--recipe-a", "wat", "--recipe-b", "mxfp8", "--a", s, "--b", s, "--scale-a", s, "--scale-b", s,
         "--k", 32, "--out", t.path("o.npy")],
        ["replay"],
        ["info", "--sm", "ninety"],
        ["info", "--cublas", "13.1"],
        ["info", "--sm", 90, "--cublas", "thirteen"],
    ]
    for args in bad:
        p = run(*args, expect=2)
        assert p.stderr.strip(), f"{args}: no message on stderr"
        assert "--help" in p.stderr or "sage" in p.stderr or "scalemm:" in p.stderr, (args, p.stderr)
    assert t.files() == ["s.npy"], t.files()


SVG = "{http://www.w3.org/2000/svg}"


@case("layout render sizes its canvas to its text, wraps long lines and labels the offset column")
def render_fits_text():
    t = Tmp()
    # A narrow grid with a long formula (the cuBLASLt tile formula), a wide grid, a tiny buffer, and
    # labels wider than the default cell.
    shapes = [("mxfp8", 4, 64, "cublaslt"), ("nvfp4", 130, 520, "cublaslt"), ("block1x128", 300, 2048, "cublaslt"),
              ("tensorwise", 1, 16, "compact"), ("block128x128", 256, 640, "cublaslt"),
              ("mxfp8", 40000, 64, "compact")]
    for recipe, rows, cols, fmt in shapes:
        out = t.path(f"{recipe}-{rows}-{fmt}.svg")
        run("layout", "render", "--recipe", recipe, "--rows", rows, "--cols", cols, "--format", fmt, "--out", out,
            expect=0)
        root = ET.parse(out).getroot()
        width, height = float(root.get("width")), float(root.get("height"))
        base = float(root.get("font-size"))
        texts = []

        def walk(el, size):
            size = float(el.get("font-size", size))
            if el.tag == SVG + "text":
                texts.append((el, size))
            for c in el:
                walk(c, size)

        walk(root, base)
        for el, size in texts:
            # A monospace glyph advances at most 0.61 em (DejaVu Sans Mono 0.602).
            right = float(el.get("x")) + len(el.text or "") * 0.61 * size
            assert right <= width, (recipe, rows, fmt, el.text, right, width)
            assert float(el.get("y")) <= height, (recipe, el.text)
            assert len(el.text or "") <= 200, (recipe, "a line is not wrapped", el.text)
        words = " ".join(el.text or "" for el, _ in texts)
        assert "offset" in [el.text for el, _ in texts], (recipe, "the offset column has no label")
        assert "zero padding" in words, (recipe, "the legend is missing")
        # The whole formula is drawn (wrapped), not clipped: every word of it appears.
        j = json.loads(run("layout", "explain", "--recipe", recipe, "--rows", rows, "--cols", cols, "--json",
                           expect=0).stdout)
        for word in j[fmt]["offset"].split():
            assert word in words, (recipe, fmt, word)
        cells = [r for r in root.iter(SVG + "rect") if r.get("class") == "cell"]
        assert cells and all(float(r.get("x")) + float(r.get("width")) <= width for r in cells), recipe
        assert all(float(r.get("y")) + float(r.get("height")) <= height for r in cells), recipe


def refused(args, expect, *needles, absent=()):
    """Runs a bad command line; checks the exit code, that stderr says each needle and none of absent."""
    p = run(*args, expect=expect)
    for n in needles:
        assert n in p.stderr, (args, n, p.stderr)
    for n in absent:
        assert n not in p.stderr + p.stdout, (args, n, p.stderr)
    return p


@case("bad numbers name the option, the expected range and the given value")
def errors_numbers():
    t = Tmp()
    s = t.save("s.npy", np.ones((4, 8), np.uint8))
    gemm = ["gemm", "--recipe-a", "mxfp8", "--recipe-b", "mxfp8", "--a", s, "--b", s, "--scale-a", s, "--scale-b", s,
            "--out", t.path("o.npy")]
    clutter = ("1797693", "0.000000", "not in range", "out of range")
    refused(gemm + ["--k", 0], 2, "--k", "expected a whole number from 1 to 2^31", "got 0", absent=clutter)
    refused(gemm + ["--k", 99999999999], 2, "--k", "got 99999999999", absent=clutter)
    refused(gemm + ["--k", "1e3"], 2, "--k", "not a whole number", absent=clutter)
    for opt in ("--rows", "--cols"):
        args = {"--rows": 4, "--cols": 32}
        args[opt] = "abc"
        refused(["layout", "explain", "--recipe", "mxfp8", "--rows", args["--rows"], "--cols", args["--cols"]], 2,
                opt, "got 'abc' (not a whole number)", absent=clutter)
        args[opt] = 0
        p = refused(["layout", "explain", "--recipe", "mxfp8", "--rows", args["--rows"], "--cols", args["--cols"]], 2,
                    opt, "from 1 to 2^31", "got 0", absent=clutter)
        assert p.stdout == "", p.stdout
    refused(["layout", "render", "--recipe", "mxfp8", "--rows", 0, "--cols", 32, "--out", t.path("r.svg")], 2,
            "--rows", "got 0")
    p = refused(["info", "--sm", 7], 2, "--sm", "got 7", "major*10+minor", absent=clutter)
    assert "sm_7" not in p.stdout, p.stdout
    refused(["info", "--sm", 1000], 2, "--sm", "got 1000")
    refused(["info", "--cublas", "13.1"], 2, "--cublas", "--sm")
    refused(["demo", "--m", 0], 2, "--m", "got 0", absent=clutter)
    assert t.files() == ["s.npy"], t.files()


@case("an unknown command is named, with the commands that exist")
def errors_unknown_command():
    p = refused(["frobnicate"], 2, "unknown command 'frobnicate'", "info", "layout", "gemm", "replay", "demo",
                absent=("A subcommand is required",))
    p = refused(["layout", "explian", "--recipe", "mxfp8"], 2, "unknown command 'explian'", "explain", "check",
                "convert", "render", absent=("A subcommand is required",))
    # Missing commands still say that one is needed.
    refused([], 2, "subcommand")
    refused(["layout"], 2, "subcommand")


@case("a bad output path is refused before any work, naming --out")
def errors_out_path():
    rng = np.random.default_rng(11)
    t = Tmp()
    files, _, _, _ = gemm_inputs(t, rng, "mxfp8", "mxfp8", 32, 32, 128, "e4m3", "e4m3")
    missing = os.path.join(t.dir, "no-such-folder", "d.npy")
    p = refused(gemm_args("mxfp8", "mxfp8", 128, files, missing, None, None), 1, "--out", "no-such-folder",
                "does not exist")
    assert "plan:" not in p.stdout and "machine:" not in p.stdout, ("the GEMM ran before the check", p.stdout)
    refused(gemm_args("mxfp8", "mxfp8", 128, files, t.dir, None, None), 1, "--out", "folder")
    refused(["layout", "render", "--recipe", "mxfp8", "--rows", 4, "--cols", 64, "--out",
             os.path.join(t.dir, "no-such-folder", "r.svg")], 1, "--out", "does not exist")
    sa = t.save("compact.npy", np.full((4, 2), 127, np.uint8))
    refused(["layout", "convert", "--recipe", "mxfp8", "--rows", 4, "--cols", 64, "--from", "compact", "--to",
             "cublaslt", "--in", sa, "--out", os.path.join(t.dir, "no-such-folder", "o.npy")], 1, "--out",
            "does not exist")
    assert not os.path.exists(os.path.join(t.dir, "no-such-folder"))


@case("an output that is a device, FIFO, dangling link, /proc file or an input is refused before any work")
def errors_out_special_files():
    rng = np.random.default_rng(12)
    t = Tmp()
    files, _, _, _ = gemm_inputs(t, rng, "mxfp8", "mxfp8", 32, 32, 128, "e4m3", "e4m3")
    before = {f: open(p, "rb").read() for f, p in files.items()}
    fifo = t.path("fifo.npy")
    os.mkfifo(fifo)
    os.symlink(t.path("missing-folder/d.npy"), t.path("dangling.npy"))
    for out, needle in (("/dev/null", "device node"), (fifo, "FIFO"), (t.path("dangling.npy"), "symlink"),
                        ("/proc/self/comm", "/proc, /sys"), ("/proc/d.npy", "/proc, /sys"),
                        (files["--scale-b"], "same file as the input " + files["--scale-b"]),
                        (files["--a"], "same file as the input " + files["--a"])):
        p = refused(gemm_args("mxfp8", "mxfp8", 128, files, out, None, None), 1, "--out", needle)
        assert "plan:" not in p.stdout and "machine:" not in p.stdout, ("the GEMM ran before the check", out, p.stdout)
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")
    assert {f: open(p, "rb").read() for f, p in files.items()} == before, "an input was overwritten"
    # layout convert: --out the same file as --in (through a symlink) is refused, the file kept.
    sa = t.save("compact.npy", np.full((4, 2), 127, np.uint8))
    os.symlink(sa, t.path("alias.npy"))
    refused(["layout", "convert", "--recipe", "mxfp8", "--rows", 4, "--cols", 64, "--from", "compact", "--to",
             "cublaslt", "--in", sa, "--out", t.path("alias.npy")], 1, "--out", "same file as the input")
    assert np.array_equal(np.load(sa), np.full((4, 2), 127, np.uint8))
    refused(["layout", "render", "--recipe", "mxfp8", "--rows", 4, "--cols", 64, "--out", "/dev/null"], 1,
            "device node")
    refused(["layout", "render", "--recipe", "mxfp8", "--rows", 4, "--cols", 64, "--out", fifo], 1, "FIFO")


@case("an output through a symlink replaces its target, and a file with the old temporary name is kept")
def out_through_symlink():
    rng = np.random.default_rng(13)
    t = Tmp()
    files, _, _, _ = gemm_inputs(t, rng, "mxfp8", "mxfp8", 32, 24, 128, "e4m3", "e4m3")
    os.mkdir(t.path("real"))
    target = t.path("real/d.npy")
    np.save(target, np.zeros(1, np.uint8))
    os.symlink(target, t.path("link.npy"))
    mine = t.path("link.npy.tmp-scalemm")
    with open(mine, "w") as f:
        f.write("a file of the user's")
    run(*gemm_args("mxfp8", "mxfp8", 128, files, t.path("link.npy"), None, None, "--backend", "reference"), expect=0)
    assert os.path.islink(t.path("link.npy")), "the symlink was replaced by a file"
    assert np.load(target).shape == (32, 24)
    assert open(mine).read() == "a file of the user's"
    assert sorted(os.listdir(t.path("real"))) == ["d.npy"], os.listdir(t.path("real"))
    svg = t.path("real/r.svg")
    os.symlink(svg, t.path("r.svg"))
    with open(svg, "w") as f:
        f.write("old")
    run("layout", "render", "--recipe", "mxfp8", "--rows", 4, "--cols", 64, "--out", t.path("r.svg"), expect=0)
    assert os.path.islink(t.path("r.svg")) and ET.parse(svg).getroot().tag.endswith("svg")


@case("fix lines give the scalemm command first, then the C++ function, and the command works")
def errors_fix_lines_cli_first():
    t = Tmp()
    g = np.arange(1, 11, dtype=np.float32).reshape(2, 5)
    s = t.save("s.npy", g)
    p = run("layout", "check", "--recipe", "block128x128", "--rows", 256, "--cols", 640, "--format", "cublaslt",
            "--scales", s, expect=1)
    fix = next(l for l in p.stdout.splitlines() if l.strip().startswith("fix:"))
    cmd = "scalemm layout convert --recipe block128x128 --rows 256 --cols 640 --from compact --to cublaslt"
    assert cmd in fix and "layouts::to_cublaslt" in fix, fix
    assert fix.index("scalemm layout convert") < fix.index("layouts::to_cublaslt"), fix
    # Run the suggested command as printed; its output passes the check that failed.
    argv = fix[fix.index("`") + 1:fix.rindex("`")].split()
    assert argv[0] == "scalemm" and f"--in {s}" in " ".join(argv), argv
    run(*argv[1:], expect=0)
    out = argv[argv.index("--out") + 1]
    run("layout", "check", "--recipe", "block128x128", "--rows", 256, "--cols", 640, "--format", "cublaslt",
        "--scales", out, expect=0)
    j = json.loads(run("layout", "check", "--recipe", "block128x128", "--rows", 256, "--cols", 640, "--format",
                       "cublaslt", "--scales", s, "--json", expect=1).stdout)
    assert all(d["fix"].startswith("Convert with `scalemm layout convert") for d in j["diagnostics"]), j
    # gemm: compact scales declared as cublaslt name the command for that operand's scale file.
    rng = np.random.default_rng(3)
    files, _, _, _ = gemm_inputs(t, rng, "block1x128", "block1x128", 8, 16, 256, "e4m3", "e4m3")
    p = run(*gemm_args("block1x128", "block1x128", 256, files, t.path("d.npy"), None, None, "--scale-format",
                       "cublaslt"), expect=1)
    fixes = [l for l in p.stderr.splitlines() if l.strip().startswith("fix:") and "layouts::" in l]
    assert fixes and all("scalemm layout convert" in l and l.index("scalemm") < l.index("layouts::")
                         for l in fixes), p.stderr
    assert any(f"--in {files['--scale-a']}" in l for l in fixes), p.stderr


@case("a wrong-size scale buffer is not sent to a layout convert that would refuse it, and the printed command runs")
def errors_fix_wrong_size():
    t = Tmp()
    for fmt in ("compact", "cublaslt"):
        s = t.save(f"s-{fmt}.npy", np.ones(7, np.float32))  # neither 2x5 (compact) nor the tiled size
        p = run("layout", "check", "--recipe", "block128x128", "--rows", 256, "--cols", 640, "--format", fmt,
                "--scales", s, expect=1)
        fixes = [l for l in p.stdout.splitlines() if l.strip().startswith("fix:")]
        assert fixes and not any("layout convert" in l for l in fixes), p.stdout
        assert any("neither format" in l for l in fixes), p.stdout
        for line in fixes:  # every command a fix line prints runs as printed
            if "`scalemm " in line:
                argv = line[line.index("`") + 1:line.rindex("`")].split()
                run(*argv[1:], expect=0)


@case("without a CUDA device, info and the demo say so in words and what runs instead")
def info_no_device():
    j = json.loads(run("info", "--json", expect=0).stdout)
    if j["devices"]:
        return  # only meaningful on a machine without a CUDA device
    assert j["no_device_reason"].startswith(("no CUDA device", "no usable CUDA device")), j["no_device_reason"]
    for sub in (["info"], ["demo", "--m", 8, "--n", 8, "--k", 64, "--seed", 1]):
        out = run(*sub, expect=0).stdout
        line = next(l for l in out.splitlines() if l.startswith("devices:"))
        assert "no CUDA device" in line and "host reference emulator" in line, line
        assert "cudaError" not in out and "InsufficientDriver" not in out, out
        # The planner's consequence of having no GPU ("host pointers") is not presented as a fault.
        assert "needs device memory" not in out, out


@case("the demo on a host says what passed checks there and when it reduced the shape")
def demo_host_meaning():
    j = json.loads(run("info", "--json", expect=0).stdout)
    if j["devices"]:
        return  # only meaningful on a machine without a CUDA device
    out = run("demo", "--m", 8, "--n", 8, "--k", 64, "--seed", 1, expect=0).stdout
    assert "(shape 8x8x64)" in out and "reduced" not in out, out
    assert "nothing to verify it against without a GPU" in out.splitlines()[-1], out
    out = run("demo", "--m", 100, "--n", 8, "--k", 64, "--seed", 1, expect=0).stdout
    assert "shape reduced to 64x8x64: on a host M, N and K are at most 64, 128 and 512" in out, out


@case("the worked gemm run of docs/cli.md runs as written and its result is 2 A B^T")
def docs_worked_run():
    with open(os.path.join(HERE, "..", "..", "docs", "cli.md")) as f:
        doc = f.read()
    start = doc.index("```sh\n", doc.index("A worked run")) + len("```sh\n")
    script = doc[start:doc.index("```", start)]
    t = Tmp()
    bindir = t.path("bin")
    os.mkdir(bindir)
    os.symlink(os.path.abspath(BIN), os.path.join(bindir, "scalemm"))
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    p = subprocess.run(["bash", "-e", "-c", script], cwd=t.dir, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "wrote d.npy: float32[32, 16]" in p.stdout, p.stdout
    last = p.stdout.strip().splitlines()[-1]
    assert last.startswith("(32, 16) max |D - 2 A B^T| / max |2 A B^T| ="), last
    # The host emulator is exact here; Hopper's FP8 tensor cores accumulate in fewer bits than fp32
    # (about 1e-4 of the largest output: docs/dispatch.md), so the bound is relative.
    assert float(last.split("=")[1]) < 1e-3, last


@case("gemm --json prints the plan, backend, reasons, timings and an output summary")
def gemm_json():
    rng = np.random.default_rng(13)
    t = Tmp()
    m, n, k = 24, 16, 128
    files, _, _, _ = gemm_inputs(t, rng, "mxfp8", "mxfp8", m, n, k, "e4m3", "e4m3")
    out = t.path("d.npy")
    p = run(*gemm_args("mxfp8", "mxfp8", k, files, out, None, None, "--out-dtype", "f32", "--json"), expect=0)
    j = json.loads(p.stdout)  # stdout is the JSON object alone
    assert j["ok"] is True and (j["m"], j["n"], j["k"]) == (m, n, k), j
    assert j["backend"] == j["plan"]["backend"] and j["backend"] in ("native", "convert-native", "emulated",
                                                                      "reference"), j
    assert isinstance(j["plan"]["reasons"], list) and j["plan"]["reasons"], j["plan"]
    assert j["plan"]["explain"] and j["problem"] and j["machine"], j
    for key in ("read_and_check", "plan", "gemm", "run", "write", "total"):
        assert isinstance(j["timings_ms"][key], (int, float)) and j["timings_ms"][key] >= 0, (key, j["timings_ms"])
    assert j["timings_ms"]["total"] >= j["timings_ms"]["gemm"], j["timings_ms"]
    d = np.load(out)
    o = j["output"]
    assert o["file"] == out and o["dtype"] == "f32" and o["shape"] == [m, n], o
    v = o["values"]
    assert v["elements"] == m * n and v["nan"] == 0 and v["inf"] == 0, v
    assert np.isclose(v["min"], d.min()) and np.isclose(v["max"], d.max()), (v, d.min(), d.max())
    assert np.isclose(v["mean"], d.mean(), rtol=1e-5, atol=1e-6), (v, d.mean())
    # Invalid input: still one JSON object on stdout, with the diagnostics; exit 1, nothing written.
    os.remove(out)
    p = run(*gemm_args("mxfp8", "mxfp8", 256, files, out, None, None, "--json"), expect=1)
    j = json.loads(p.stdout)
    assert j["ok"] is False and any(d["rule"] == "data-shape" for d in j["diagnostics"]), j
    assert not os.path.exists(out)


# ---- grouped gemm -----------------------------------------------------------------------------------

def grouped_scale_file(recipe, groups_rows, k, fmt, rng):
    """A grouped operand's scale buffer as docs/grouped.md defines it: each group's own buffer in order
    (cuBLASLt format: each starting on a 16-byte boundary). Returns (flat buffer, per-group grids)."""
    parts, grids = [], []
    for rows in groups_rows:
        g = random_scales(rng, recipe, grid_shape(recipe, rows, k)) if rows else np.zeros((0, 0), scale_np_dtype(recipe))
        grids.append(g)
        buf = cublaslt_from_compact(recipe, rows, k, g) if (fmt == "cublaslt" and rows) else g.reshape(-1)
        if fmt == "cublaslt":
            pad = (-sum(p.nbytes for p in parts)) % 16
            parts.append(np.zeros(pad // buf.itemsize, buf.dtype))
        parts.append(buf)
    return np.concatenate(parts) if parts else np.zeros(0, np.float32), grids


GROUPED_M_CASES = [  # recipe_a, recipe_b, sizes, n, k, fmt
    ("tensorwise", "tensorwise", [3, 0, 5, 1], 24, 64, "compact"),
    ("mxfp8", "mxfp8", [7, 0, 1, 9], 16, 96, "cublaslt"),
    ("block1x128", "block128x128", [4, 129, 0], 136, 256, "compact"),
    ("nvfp4", "nvfp4", [2, 0, 6], 16, 64, "compact"),
]


@case("gemm --group-dim m runs every expert on its rows and agrees with a NumPy float64 computation")
def gemm_grouped_m():
    rng = np.random.default_rng(21)
    for ra, rb, sizes, n, k, fmt in GROUPED_M_CASES:
        t = Tmp()
        G, M = len(sizes), sum(sizes)
        a, av = random_operand(rng, ra, M, k)
        sa, ga = grouped_scale_file(ra, sizes, k, fmt, rng)
        bs, bvals = [], []
        for _ in range(G):
            b, bv = random_operand(rng, rb, n, k)
            bs.append(b)
            bvals.append(bv)
        sb, gb = grouped_scale_file(rb, [n] * G, k, fmt, rng)
        want = np.zeros((M, n))
        r0 = 0
        for g, mg in enumerate(sizes):
            if mg:
                A = av[r0:r0 + mg] * expand(ra, mg, k, ga[g])
                B = bvals[g] * expand(rb, n, k, gb[g])
                want[r0:r0 + mg] = A @ B.T
            r0 += mg
        out = t.path("d.npy")
        args = ["gemm", "--recipe-a", ra, "--recipe-b", rb, "--k", k, "--out", out, "--out-dtype", "f32",
                "--backend", "reference", "--scale-format", fmt, "--group-dim", "m",
                "--group-sizes", ",".join(map(str, sizes)), "--a", t.save("a.npy", a),
                "--b", t.save("b.npy", np.stack(bs)), "--scale-a", t.save("sa.npy", sa), "--scale-b", t.save("sb.npy", sb)]
        p = run(*args, expect=0)
        assert "distinct group shape" in p.stdout, p.stdout
        d = np.load(out).astype(np.float64)
        assert d.shape == (M, n), d.shape
        bound = 4 * k * 2.0 ** -24 * np.abs(want).max() + 1e-30
        assert np.all(np.abs(d - want) <= bound * 4), (ra, rb, np.abs(d - want).max())
        # The same sizes from a .npy of int64.
        run(*[x if x != ",".join(map(str, sizes)) else t.save("sizes.npy", np.array(sizes, np.int64)) for x in args],
            expect=0)
        assert np.array_equal(np.load(out).view(np.uint32), d.astype(np.float32).view(np.uint32))


@case("gemm --group-dim k writes (G, M, N) with zero for an empty group and names a K split off a block")
def gemm_grouped_k():
    rng = np.random.default_rng(22)
    ra, rb, m, n, sizes = "block1x128", "block1x128", 8, 16, [128, 0, 256]
    k = sum(sizes)
    t = Tmp()
    a, av = random_operand(rng, ra, m, k)
    b, bv = random_operand(rng, rb, n, k)
    sa = random_scales(rng, ra, grid_shape(ra, m, k))
    sb = random_scales(rng, rb, grid_shape(rb, n, k))
    A, B = av * expand(ra, m, k, sa), bv * expand(rb, n, k, sb)
    files = ["--a", t.save("a.npy", a), "--b", t.save("b.npy", b), "--scale-a", t.save("sa.npy", sa),
             "--scale-b", t.save("sb.npy", sb)]
    out = t.path("dw.npy")
    base = ["gemm", "--recipe-a", ra, "--recipe-b", rb, "--k", k, "--out", out, "--out-dtype", "f32",
            "--backend", "reference", "--group-dim", "k"] + files
    run(*base, "--group-sizes", "128,0,256", expect=0)
    d = np.load(out).astype(np.float64)
    assert d.shape == (3, m, n), d.shape
    k0 = 0
    for g, kg in enumerate(sizes):
        want = A[:, k0:k0 + kg] @ B[:, k0:k0 + kg].T
        assert np.all(np.abs(d[g] - want) <= 1e-5 * (np.abs(A[:, k0:k0 + kg]) @ np.abs(B[:, k0:k0 + kg]).T) + 1e-30), g
        k0 += kg
    assert np.all(d[1] == 0)
    os.remove(out)
    p = run(*base, "--group-sizes", "100,0,284", expect=1)
    assert "group_sizes[0]" in p.stderr and "group-k-block" in p.stderr and "K_g = 128" in p.stderr, p.stderr
    assert not os.path.exists(out)


@case("gemm rejects bad group sizes and grouped scale files by name and writes nothing")
def gemm_grouped_rejects():
    rng = np.random.default_rng(23)
    t = Tmp()
    sizes, n, k = [3, 5], 16, 64
    a, _ = random_operand(rng, "mxfp8", 8, k)
    b = np.stack([random_operand(rng, "mxfp8", n, k)[0] for _ in sizes])
    sa, _ = grouped_scale_file("mxfp8", sizes, k, "compact", rng)
    sb, _ = grouped_scale_file("mxfp8", [n] * 2, k, "compact", rng)
    out = t.path("d.npy")
    files = {"--a": t.save("a.npy", a), "--b": t.save("b.npy", b), "--scale-a": t.save("sa.npy", sa),
             "--scale-b": t.save("sb.npy", sb)}

    def go(sizes_text, **over):
        f = dict(files, **over)
        args = ["gemm", "--recipe-a", "mxfp8", "--recipe-b", "mxfp8", "--k", k, "--out", out, "--group-sizes",
                sizes_text]
        for flag, path in f.items():
            args += [flag, path]
        return run(*args)

    for text, needle in (("3,4", "group-size-sum"), ("9,-1", "group-size-negative"), ("3,x", "whole numbers"),
                         ("3,0,5", "grouped-b-shape")):
        p = go(text)
        assert p.returncode in (1, 2) and needle in p.stderr, (text, p.returncode, p.stderr)
        assert not os.path.exists(out), text
    p = go("3,5", **{"--scale-a": t.save("short.npy", sa[:-1])})
    assert p.returncode == 1 and "grouped-scale-size" in p.stderr and "scale_a" in p.stderr, p.stderr
    assert not os.path.exists(out)
    # The fix names the command that prints the buffers this call expects, and it runs as printed.
    fix = next(l for l in p.stderr.splitlines() if l.strip().startswith("fix:") and "layout explain" in l)
    argv = fix[fix.index("`") + 1:fix.rindex("`")].split()
    assert argv[:3] == ["scalemm", "layout", "explain"] and "--group-sizes" in argv, argv
    run(*argv[1:], expect=0)


@case("layout explain --group-sizes gives each group's scale buffer, 16-byte aligned in cublaslt format")
def explain_grouped():
    p = run("layout", "explain", "--recipe", "block128x128", "--rows", 137, "--cols", 640, "--group-sizes",
            "7,0,1,129", "--format", "cublaslt", "--json", expect=0)
    j = json.loads(p.stdout)
    assert [g["byte_offset"] for g in j["groups"]] == [0, 32, 32, 64] and j["bytes"] == 128, j
    assert [g["rows"] for g in j["groups"]] == [[0, 7], [7, 7], [7, 8], [8, 137]], j
    p = run("layout", "explain", "--recipe", "mxfp8", "--rows", 8, "--cols", 64, "--group-sizes", "3,4")
    assert p.returncode != 0 and "add up to 7" in p.stderr, p.stderr


@case("layout render --group-sizes draws each group's buffer under its caption")
def render_grouped():
    t = Tmp()
    out = t.path("g.svg")
    run("layout", "render", "--recipe", "block1x128", "--rows", 9, "--cols", 384, "--group-sizes", "3,0,6",
        "--format", "cublaslt", "--out", out, expect=0)
    root = ET.parse(out).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    groups = [e.text for e in root.iter(ns + "text") if e.get("class") == "group"]
    assert groups == ["group 0: rows [0, 3), bytes [0, 48)", "group 1: rows [3, 3), bytes [48, 48) (empty)",
                      "group 2: rows [3, 9), bytes [48, 144)"], groups
    cells = [e for e in root.iter(ns + "rect") if e.get("class") == "cell"]
    assert len(cells) == 4 * 3 + 8 * 3, len(cells)  # VEC128: roundup(rows, 4) x 3 K-blocks per group
    labels = {e.text for e in root.iter(ns + "text")}
    assert "8:2" in labels and "offset" in labels, sorted(labels)[:20]


@case("layout render --group-sizes caps the whole picture: 10^6 one-row groups give a small SVG")
def render_grouped_total_cap():
    t = Tmp()
    sizes = t.save("sizes.npy", np.ones(10 ** 6, np.int64))
    out = t.path("g.svg")
    p = run("layout", "render", "--recipe", "block1x128", "--rows", 10 ** 6, "--cols", 128, "--group-sizes", sizes,
            "--out", out, expect=0)
    assert os.path.getsize(out) < 4 << 20, os.path.getsize(out)
    root = ET.parse(out).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    groups = [e for e in root.iter(ns + "text") if e.get("class") == "group"]
    assert len(groups) == 256, len(groups)
    more = [e.text for e in root.iter(ns + "text") if e.get("class") == "more-groups"]
    assert more and more[0].startswith("... groups 256 to 999999 (rows [256, 1000000)"), more
    assert "1000000 groups" in p.stdout, p.stdout


# ---- bad-input catalogue ----------------------------------------------------------------------------
# docs/reliability.md, "Bad-input catalogue": each row breaks one valid call in one way. The harness
# checks the exit code (docs/cli.md: 1 invalid input, 2 usage error), that stderr holds each needle (the
# argument or file, the rule, the expected and actual values), that the process was not killed by a
# signal, that no file appeared or changed in the row's folder (no output, no temporary file), and, for
# rows with --out, that an output file poisoned beforehand keeps its bytes.

POISON = b"\xff" * 64


def _npy_bytes(arr):
    import io
    f = io.BytesIO()
    np.save(f, arr)
    return f.getvalue()


def _npy_header_len(raw):
    return 10 + int.from_bytes(raw[8:10], "little")


def _write(t, name, data):
    with open(t.path(name), "wb") as f:
        f.write(data)
    return t.path(name)


def _with_shape(raw, old, new):
    """The .npy bytes with the header's shape text replaced (same header length: padded with spaces)."""
    n = _npy_header_len(raw)
    hdr = raw[10:n].replace(old.encode(), new.encode())
    hdr = hdr.rstrip(b"\n ")
    hdr = hdr + b" " * (n - 10 - len(hdr) - 1) + b"\n"
    assert len(hdr) == n - 10, "the new shape does not fit in the header"
    return raw[:10] + hdr + raw[n:]


def _cat_gemm(t, ra="mxfp8", rb="mxfp8", m=32, n=24, k=128):
    """A valid gemm call (which the row then breaks): (files, scale grids, argv builder)."""
    files, _, _, grids = gemm_inputs(t, np.random.default_rng(31), ra, rb, m, n, k, "e4m3", "e4m3")

    def argv(kk=k, out=None, **over):
        f = dict(files)
        f.update({"--" + key.replace("_", "-"): v for key, v in over.items()})
        return gemm_args(ra, rb, kk, f, out or t.path("d.npy"), None, None, "--backend", "reference")
    return files, grids, argv


def _cat_replay(t, **change):
    d = make_dump(t, np.random.default_rng(32))
    path = os.path.join(d, "call.json")
    with open(path) as f:
        call = json.load(f)
    for key, v in change.items():
        if v is None:
            del call[key]
        else:
            call[key] = v
    with open(path, "w") as f:
        json.dump(call, f)
    return ["replay", d]


def _cat_grouped(t, sizes_text, dim="m"):
    rng = np.random.default_rng(33)
    if dim == "m":
        sizes, n, k = [3, 5], 16, 64
        a, _ = random_operand(rng, "mxfp8", 8, k)
        b = np.stack([random_operand(rng, "mxfp8", n, k)[0] for _ in sizes])
        sa, _ = grouped_scale_file("mxfp8", sizes, k, "compact", rng)
        sb, _ = grouped_scale_file("mxfp8", [n] * 2, k, "compact", rng)
        recipe = "mxfp8"
    else:
        m, n, k, recipe = 8, 16, 384, "block1x128"
        a, _ = random_operand(rng, recipe, m, k)
        b, _ = random_operand(rng, recipe, n, k)
        sa = random_scales(rng, recipe, grid_shape(recipe, m, k))
        sb = random_scales(rng, recipe, grid_shape(recipe, n, k))
    return ["gemm", "--recipe-a", recipe, "--recipe-b", recipe, "--k", k, "--out", t.path("d.npy"), "--backend",
            "reference", "--group-dim", dim, "--group-sizes", sizes_text, "--a", t.save("a.npy", a),
            "--b", t.save("b.npy", b), "--scale-a", t.save("sa.npy", sa), "--scale-b", t.save("sb.npy", sb)]


def _row_truncated_header(t):
    _, _, argv = _cat_gemm(t)
    bad = _write(t, "cut.npy", _npy_bytes(np.zeros((32, 128), np.uint8))[:40])
    return argv(a=bad), 1, ["SCALEMM_STATUS_IO_ERROR", "--a: ", "cut.npy", "truncated header"]


def _row_header_lies_shape(t):
    files, _, argv = _cat_gemm(t)
    raw = _npy_bytes(np.load(files["--b"]))
    bad = _write(t, "lies.npy", _with_shape(raw, "(24, 128)", "(48, 128)"))
    return argv(b=bad), 1, ["lies.npy", "truncated data", "declares 6144 bytes for uint8[48, 128]", "holds 3072"]


def _row_data_cut_short(t):
    files, _, argv = _cat_gemm(t)
    bad = _write(t, "short.npy", _npy_bytes(np.load(files["--a"]))[:-100])
    return argv(a=bad), 1, ["short.npy", "truncated data", "declares 4096 bytes", "holds 3996"]


def _row_bad_magic(t):
    _, _, argv = _cat_gemm(t)
    bad = _write(t, "junk.npy", b"not a numpy file at all")
    return argv(scale_a=bad), 1, ["junk.npy", "not a .npy file (bad magic)"]


def _row_empty_file(t):
    _, _, argv = _cat_gemm(t)
    return argv(scale_b=_write(t, "empty.npy", b"")), 1, ["empty.npy", "bad magic"]


def _row_shape_too_large(t):
    files, _, argv = _cat_gemm(t)
    raw = _npy_bytes(np.load(files["--a"]))
    bad = _write(t, "huge.npy", _with_shape(raw, "(32, 128)", "(99999999999, 99999999999)"))
    return argv(a=bad), 1, ["huge.npy", "shape (99999999999, 99999999999) is too large"]


def _row_fortran_order(t):
    files, _, argv = _cat_gemm(t)
    bad = t.save("fortran.npy", np.asfortranarray(np.load(files["--a"])))
    return argv(a=bad), 1, ["fortran.npy", "Fortran-order arrays are not supported"]


def _row_big_endian(t):
    files, _, argv = _cat_gemm(t, "rowwise", "rowwise")
    bad = t.save("be.npy", np.load(files["--scale-a"]).astype(">f4"))
    return argv(scale_a=bad), 1, ["be.npy", "big-endian data (>f4) is not supported"]


def _row_data_dtype(t):
    files, _, argv = _cat_gemm(t)
    bad = t.save("a16.npy", np.load(files["--a"]).astype(np.uint16))
    return argv(a=bad), 1, ["[data-dtype] a:", "expected: uint8", "actual:   uint16"]


def _row_scale_dtype(t):
    _, (sa, _), argv = _cat_gemm(t)
    bad = t.save("sf32.npy", sa.astype(np.float32))
    return argv(scale_a=bad), 1, ["[scale-dtype] scale_a:", "expected: e8m0", "actual:   f32"]


def _row_scale_shape(t):
    _, (_, sb), argv = _cat_gemm(t)
    bad = t.save("sb3.npy", sb[:, :3].copy())
    return argv(scale_b=bad), 1, ["[scale-shape] scale_b:", "expected: (24, 4)", "actual:   [24, 3]"]


def _row_scale_count(t):
    _, (sa, _), argv = _cat_gemm(t, "rowwise", "rowwise")
    bad = t.save("sa31.npy", sa.reshape(-1)[:31].copy())
    return argv(scale_a=bad), 1, ["[scale-element-count] scale_a:", "expected: 32", "actual:   31"]


def _row_e8m0_nan(t):
    _, (sa, _), argv = _cat_gemm(t)
    bad = sa.copy()
    bad[3, 2] = 0xFF
    return argv(scale_a=t.save("nan.npy", bad)), 1, ["[e8m0-nan] scale_a:", "data row 3, K-block 2"]


def _row_f32_negative(t):
    _, (sa, _), argv = _cat_gemm(t, "rowwise", "rowwise")
    bad = sa.copy()
    bad.reshape(-1)[31] = -2.0
    return argv(scale_a=t.save("neg.npy", bad)), 1, ["[f32-scale-non-positive] scale_a:", "data row 31"]


def _row_f32_nan(t):
    _, (_, sb), argv = _cat_gemm(t, "block1x128", "block128x128", 32, 24, 256)
    bad = sb.copy()
    bad.reshape(-1)[1] = np.nan
    return argv(scale_b=t.save("fnan.npy", bad)), 1, ["[f32-scale-non-finite] scale_b:"]


def _row_unknown_recipe(t):
    _, _, argv = _cat_gemm(t)
    args = argv()
    args[args.index("--recipe-a") + 1] = "mxfp9"
    return args, 2, ["--recipe-a", "unknown recipe 'mxfp9'", "expected one of: tensorwise"]


def _row_k_off_width(t):
    _, _, argv = _cat_gemm(t)
    return argv(kk=64), 1, ["[data-shape] a:", "expected: (M, 64)", "actual:   uint8[32, 128]", "[data-shape] b:"]


def _row_fp8_out_without_d_scale(t):
    _, _, argv = _cat_gemm(t)
    return argv() + ["--out-dtype", "e4m3"], 1, ["d_scale", "fp8-out-d-scale"]


def _row_missing_input(t):
    _, _, argv = _cat_gemm(t)
    return argv(b=t.path("missing.npy")), 1, ["--b: ", "missing.npy", "cannot open for reading"]


def _row_out_parent_is_a_file(t):
    files, _, argv = _cat_gemm(t)
    out = os.path.join(files["--a"], "d.npy")
    return argv(out=out), 1, ["--out", "cannot write " + out]


def _row_d_scale_zero(t):
    _, _, argv = _cat_gemm(t)
    return argv() + ["--out-dtype", "e4m3", "--d-scale", "0"], 2, ["--d-scale", "expected a positive finite number",
                                                                   "got 0"]


def _row_d_scale_nan(t):
    _, _, argv = _cat_gemm(t)
    return argv() + ["--out-dtype", "e5m2", "--d-scale", "nan"], 2, ["--d-scale", "got nan"]


def _row_out_is_an_input(t):
    files, _, argv = _cat_gemm(t)
    return argv(out=files["--scale-a"]), 1, ["--out", "same file as the input " + files["--scale-a"]]


def _row_replay_d_scale_negative(t):
    args = _cat_replay(t)
    d = args[1]
    np.save(os.path.join(d, "d.npy"), np.zeros((32, 24), np.uint8))
    path = os.path.join(d, "call.json")
    with open(path) as f:
        call = json.load(f)
    call["d_dtype"], call["d_scale"] = "e4m3", -1.0
    with open(path, "w") as f:
        json.dump(call, f)
    return args, 1, ["d_scale", "d-scale-value", "actual:   -1.0"]


def _row_replay_m(t):
    return _cat_replay(t, m=64), 1, ["[data-shape] a: a.npy has M rows", "expected: 64", "actual:   uint8[32, 128]",
                                      "[scale-element-count] scale_a"]


def _row_replay_k(t):
    return _cat_replay(t, k=256), 1, ["[data-shape] a:", "expected: (M, 256)", "[data-shape] b:"]


def _row_replay_n(t):
    return _cat_replay(t, n=25), 1, ["[data-shape] b: b.npy has N rows", "expected: 25", "actual:   uint8[24, 128]"]


def _row_replay_m_not_integer(t):
    return _cat_replay(t, m=32.5), 1, ["call.json", "m must be an integer"]


def _row_replay_m_negative(t):
    return _cat_replay(t, m=-1), 1, ["call.json", "m, n, k must be in [1, 2^31]", "got m=-1"]


def _row_replay_missing_k(t):
    return _cat_replay(t, k=None), 1, ["call.json: k: expected an integer in [1, 2^31], got no such field (missing)",
                                        "[call-json-field]"]


def _row_replay_unknown_recipe(t):
    args = _cat_replay(t)
    path = os.path.join(args[1], "call.json")
    with open(path) as f:
        call = json.load(f)
    call["a"]["recipe"] = "mxfp9"
    with open(path, "w") as f:
        json.dump(call, f)
    return args, 1, ["call.json", "a.recipe: unknown recipe 'mxfp9'"]


def _row_npy_names_option(t):
    _, _, argv = _cat_gemm(t)
    bad = _write(t, "sb_cut.npy", _npy_bytes(np.zeros((24, 4), np.uint8))[:40])
    return argv(scale_b=bad), 1, ["SCALEMM_STATUS_IO_ERROR", "--scale-b: ", "sb_cut.npy: truncated header",
                                  "The file given to --scale-b must be a complete", "numpy.save", "[npy-file]"]


def _row_npy_bad_shape_text(t):
    files, _, argv = _cat_gemm(t)
    raw = _npy_bytes(np.load(files["--a"]))
    bad = _write(t, "x1x8.npy", _with_shape(raw, "(32, 128)", "(32, 1x8)"))
    return argv(a=bad), 1, ["--a: ", "x1x8.npy: bad shape (32, 1x8): dimension 1",
                            "expected a non-negative integer", "got '1x8'", "[npy-shape]"]


def _row_replay_missing_scale_format(t):
    args = _cat_replay(t)
    path = os.path.join(args[1], "call.json")
    with open(path) as f:
        call = json.load(f)
    del call["b"]["scale_format"]
    with open(path, "w") as f:
        json.dump(call, f)
    return args, 1, ["call.json: b.scale_format: expected \"compact\" or \"cublaslt\"", "got no such field",
                     "[call-json-field]"]


def _row_group_sum(t):
    return _cat_grouped(t, "3,4"), 1, ["group-size-sum"]


def _row_group_negative(t):
    return _cat_grouped(t, "9,-1"), 1, ["group-size-negative"]


def _row_group_not_a_number(t):
    return _cat_grouped(t, "3,x"), 2, ["--group-sizes", "whole numbers"]


def _row_group_k_off_block(t):
    return _cat_grouped(t, "100,0,284", "k"), 1, ["group_sizes[0]", "group-k-block", "K_g = 128"]


# (name, row) in the order of docs/reliability.md; rows marked "also" repeat a check of an older case.
CLI_CATALOGUE = [
    ("gemm: .npy header cut short", _row_truncated_header),
    ("gemm: .npy header declares more rows than the file holds", _row_header_lies_shape),
    ("gemm: .npy data cut short", _row_data_cut_short),
    ("gemm: not a .npy file (bad magic)", _row_bad_magic),
    ("gemm: empty scale file", _row_empty_file),
    ("gemm: .npy header declares a 10^22-element shape", _row_shape_too_large),
    ("gemm: Fortran-order data", _row_fortran_order),
    ("gemm: big-endian fp32 scales", _row_big_endian),
    ("gemm: data saved as uint16 (also gemm_rejects_invalid: float32)", _row_data_dtype),
    ("gemm: mxfp8 scales saved as float32", _row_scale_dtype),
    ("gemm: scale grid one K-block short", _row_scale_shape),
    ("gemm: rowwise scales one element short", _row_scale_count),
    ("gemm: NaN E8M0 scale (also gemm_rejects_invalid)", _row_e8m0_nan),
    ("gemm: negative fp32 scale", _row_f32_negative),
    ("gemm: NaN fp32 scale", _row_f32_nan),
    ("gemm: unknown recipe name (also usage_errors)", _row_unknown_recipe),
    ("gemm: --k off the data's width (also gemm_rejects_invalid)", _row_k_off_width),
    ("gemm: FP8 output without --d-scale (also gemm_fp8_output)", _row_fp8_out_without_d_scale),
    ("gemm: missing input file (also gemm_rejects_invalid)", _row_missing_input),
    ("gemm: --out under a regular file", _row_out_parent_is_a_file),
    ("replay: call.json m disagrees with a.npy", _row_replay_m),
    ("replay: call.json k disagrees with the data", _row_replay_k),
    ("replay: call.json n disagrees with b.npy", _row_replay_n),
    ("replay: call.json m not an integer", _row_replay_m_not_integer),
    ("replay: call.json m negative", _row_replay_m_negative),
    ("replay: call.json without k", _row_replay_missing_k),
    ("replay: call.json with an unknown recipe", _row_replay_unknown_recipe),
    ("gemm: a truncated .npy names the option it was given to (--scale-b)", _row_npy_names_option),
    ("gemm: .npy header shape (32, 1x8) is not a tuple of integers", _row_npy_bad_shape_text),
    ("replay: call.json without b.scale_format", _row_replay_missing_scale_format),
    ("grouped gemm: group sizes do not add up to M (also gemm_grouped_rejects)", _row_group_sum),
    ("grouped gemm: negative group size (also gemm_grouped_rejects)", _row_group_negative),
    ("grouped gemm: --group-sizes not numbers (also gemm_grouped_rejects)", _row_group_not_a_number),
    ("grouped gemm: K_g off the 128 block (also gemm_grouped_k)", _row_group_k_off_block),
    ("gemm: --d-scale 0 (also d_scale_values)", _row_d_scale_zero),
    ("gemm: --d-scale nan (also d_scale_values)", _row_d_scale_nan),
    ("gemm: --out is one of the inputs (also errors_out_special_files)", _row_out_is_an_input),
    ("replay: call.json d_scale negative (also d_scale_values)", _row_replay_d_scale_negative),
]


def _snapshot(folder):
    snap = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                snap[os.path.relpath(path, folder)] = f.read()
    return snap


@case("bad-input catalogue: every CLI row exits with its code, names the input and writes nothing")
def catalogue_cli():
    failures = []
    for name, row in CLI_CATALOGUE:
        t = Tmp()
        args, expect, needles = row(t)
        try:
            for poisoned in (False, True):
                out = args[args.index("--out") + 1] if "--out" in args else None
                if poisoned and (out is None or not os.path.isdir(os.path.dirname(out))):
                    continue
                if poisoned:
                    with open(out, "wb") as f:
                        f.write(POISON)
                before = _snapshot(t.dir)
                p = run(*args)  # asserts that no signal ended it
                assert p.returncode == expect, f"exit {p.returncode}, wanted {expect}\n{p.stderr}"
                for needle in needles:
                    assert needle in p.stderr, f"stderr lacks {needle!r}:\n{p.stderr}"
                after = _snapshot(t.dir)
                assert after == before, f"files changed: {sorted(set(after) ^ set(before))} or contents"
        except AssertionError as e:
            failures.append(f"{name}: {e}")
    assert not failures, f"{len(failures)} of {len(CLI_CATALOGUE)} rows failed:\n" + "\n".join(failures)
    print(f"{len(CLI_CATALOGUE)} rows pass")


def main():
    global BIN
    BIN = sys.argv[1]
    what = sys.argv[2]
    if what == "--list":
        for key, (name, _) in CASES.items():
            print(f"{key}\t{name}")
        return 0
    if what == "--regen":
        os.makedirs(GOLDEN, exist_ok=True)
        for recipe in RECIPES:
            for rows, cols in GOLDEN_SHAPES:
                out = run("layout", "explain", "--recipe", recipe, "--rows", rows, "--cols", cols, expect=0).stdout
                with open(golden_path(recipe, rows, cols), "w") as f:
                    f.write(out)
        return 0
    CASES[what][1]()
    print(f"ok: {CASES[what][0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
