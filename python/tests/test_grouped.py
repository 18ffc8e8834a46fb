"""scaled_grouped_mm: m-grouped and k-grouped calls against the float64 oracle per group (NumPy, host
reference), the size rules by name, and on a GPU bit-identity with per-group scaled_mm calls and
torch.compile(fullgraph=True)."""

from __future__ import annotations

import numpy as np
import pytest

import scalemm
from oracle import bound, dequant, gemm64, seed



def _data_dtype(recipe):
    return "e2m1" if recipe == "nvfp4" else "e4m3"


def _x(rng, rows, k):
    """Values of different magnitudes per row and column, scaled so that max |x| = 1 exactly: every
    group and expert then has the same NVFP4 global scale, which grouped calls share per operand."""
    x = rng.standard_normal((rows, k)).astype(np.float32)
    x *= np.exp2(rng.integers(-4, 5, size=(rows, 1))).astype(np.float32)
    x *= np.exp2(rng.integers(-3, 4, size=(1, k))).astype(np.float32)
    if x.size:
        x /= np.abs(x).max()
        x[0, 0] = 1.0
    return x


def _quant(rng, rows, k, recipe, fmt="compact"):
    data, scales = scalemm.quantize(_x(rng, rows, k), recipe, scale_format=fmt)
    return data, scales


def _flat_bytes(scales):
    s = scales[0] if isinstance(scales, tuple) else scales
    return np.ascontiguousarray(s).reshape(-1).view(np.uint8)


def _empty_group_scales(recipe, k, fmt):
    """An empty group's own scale buffer (tensorwise: one scale; block recipes: none)."""
    from scalemm import _core, _scalemm

    n = _scalemm.layout_info(_core.RECIPES[recipe], 0, k, _core.SCALE_FORMATS[fmt])[4]  # elements
    one = {"mxfp8": 127, "mxfp8-32x32": 127, "nvfp4": 0x38}.get(recipe)
    if one is not None:
        return np.full(n, one, dtype=np.uint8)
    return np.ones(n, dtype=np.float32).view(np.uint8)


def _concat(buffers, fmt):
    """Group buffers in group order; in cublaslt format each is padded to a multiple of 16 bytes, so
    that the next starts on a 16-byte boundary (the last one too: the buffer's size is the contract's)."""
    out = []
    for buf in buffers:
        out.append(buf)
        if fmt == "cublaslt" and buf.size % 16:
            out.append(np.zeros(16 - buf.size % 16, dtype=np.uint8))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.uint8)


def _typed(raw, recipe):
    """A flat scale buffer as the recipe's scale element type."""
    if recipe in ("mxfp8", "mxfp8-32x32", "nvfp4"):
        return raw  # uint8 bits of E8M0 / UE4M3
    return raw.view(np.float32)


def _global(scales):
    return float(scales[1]) if isinstance(scales, tuple) else 1.0


def _check(d, a64, b64, k, out_dtype="f32"):
    d64 = gemm64(a64, b64)
    err = np.abs(np.asarray(d, dtype=np.float64) - d64)
    lim = bound(a64, b64, k, out_dtype)
    assert np.all(err <= lim), f"max excess {np.max(err - lim)}"


def m_grouped_inputs(rng, ra, rb, sizes, n, k, fmt="compact"):
    """A (sum M_g, K) quantized per group, its scales concatenated flat; B (G, N, K) with its scales
    stacked (G, *one expert's scales); and the float64 value of each group's operands."""
    a_data, a_scales, a64, b_data, b_scales, b64 = [], [], [], [], [], []
    ga = gb = None
    for mg in sizes:
        db, sb = _quant(rng, n, k, rb, fmt)
        b_data.append(db)
        b_scales.append(sb[0] if isinstance(sb, tuple) else sb)
        gb = _global(sb)
        if fmt == "compact":
            b64.append(dequant(db, sb, rb, _data_dtype(rb), n, k))
        if mg == 0:
            a_scales.append(_empty_group_scales(ra, k, fmt))
            a64.append(np.zeros((0, k)))
            continue
        da, sa = _quant(rng, mg, k, ra, fmt)
        assert ga is None or ga == _global(sa), "the test's groups must share the NVFP4 global scale"
        ga = _global(sa)
        a_data.append(da)
        a_scales.append(_flat_bytes(sa))
        if fmt == "compact":
            a64.append(dequant(da, sa, ra, _data_dtype(ra), mg, k))
    a = np.concatenate(a_data) if a_data else None
    b = np.stack(b_data)
    scale_a = _typed(_concat(a_scales, fmt), ra)
    # B's scales stacked (G, *one expert's scales); in cublaslt format each expert's buffer is padded.
    scale_b = np.stack(b_scales) if fmt == "compact" else _typed(_concat([_flat_bytes(s) for s in b_scales], fmt), rb)
    if ra == "nvfp4":
        scale_a = (scale_a, ga)
    if rb == "nvfp4":
        scale_b = (scale_b, gb)
    return a, b, scale_a, scale_b, a64, b64


M_PAIRS = [("nvfp4", "nvfp4"), ("mxfp8", "mxfp8-32x32"), ("mxfp8-32x32", "mxfp8-32x32"),
           ("block1x128", "block128x128"), ("block128x128", "block128x128"), ("tensorwise", "tensorwise"),
           ("rowwise", "rowwise")]


@pytest.mark.parametrize("ra,rb", M_PAIRS)
def test_m_grouped_against_float64_per_group(ra, rb):
    rng = np.random.default_rng(seed(f"m-grouped {ra} x {rb}"))
    sizes = [0, 1, 7, 40, 0, 3]
    n, k = 24, 288
    a, b, sa, sb, a64, b64 = m_grouped_inputs(rng, ra, rb, sizes, n, k)
    d = scalemm.scaled_grouped_mm(a, b, sa, sb, sizes, recipe_a=ra, recipe_b=rb, out_dtype="f32")
    assert isinstance(d, np.ndarray) and d.shape == (sum(sizes), n) and d.dtype == np.float32
    r0 = 0
    for g, mg in enumerate(sizes):
        if mg:
            _check(d[r0:r0 + mg], a64[g], b64[g], k)
        r0 += mg


@pytest.mark.parametrize("ra,rb", [("rowwise", "tensorwise"), ("mxfp8", "mxfp8-32x32"), ("nvfp4", "nvfp4")])
def test_m_grouped_cublaslt_format_matches_compact(ra, rb):
    """cuBLASLt-format group buffers (each 16-byte aligned) give the same D as compact ones."""
    s = seed(f"m-grouped cublaslt {ra} x {rb}")
    sizes = [3, 0, 5, 1]
    n, k = 16, 96
    a, b, sa, sb, _, _ = m_grouped_inputs(np.random.default_rng(s), ra, rb, sizes, n, k)
    a2, b2, sa2, sb2, _, _ = m_grouped_inputs(np.random.default_rng(s), ra, rb, sizes, n, k, fmt="cublaslt")
    assert np.array_equal(a.view(np.uint8), a2.view(np.uint8))
    d = scalemm.scaled_grouped_mm(a, b, sa, sb, np.array(sizes), recipe_a=ra, recipe_b=rb, out_dtype="f32")
    d2 = scalemm.scaled_grouped_mm(a2, b2, sa2, sb2, tuple(sizes), recipe_a=ra, recipe_b=rb, out_dtype="f32",
                                   scale_format="cublaslt")
    assert np.array_equal(d, d2)


K_PAIRS = [("nvfp4", "nvfp4", [16, 0, 48, 32]), ("mxfp8", "mxfp8-32x32", [0, 32, 96, 64, 0, 32]),
           ("block1x128", "block1x128", [128, 0, 256, 128]), ("block1x128", "block128x128", [256, 128, 0]),
           ("tensorwise", "tensorwise", [16, 0, 48, 16]), ("rowwise", "rowwise", [0, 16, 32, 80])]


@pytest.mark.parametrize("ra,rb,sizes", K_PAIRS)
def test_k_grouped_against_float64_per_group(ra, rb, sizes):
    rng = np.random.default_rng(seed(f"k-grouped {ra} x {rb}"))
    m, n, k = 21, 19, sum(sizes)
    da, sa = _quant(rng, m, k, ra)
    db, sb = _quant(rng, n, k, rb)
    a64 = dequant(da, sa, ra, _data_dtype(ra), m, k)
    b64 = dequant(db, sb, rb, _data_dtype(rb), n, k)
    # A's scales in their natural shape, B's as a flat buffer: both are accepted.
    flat_b = _typed(_flat_bytes(sb), rb)
    sb_flat = (flat_b, sb[1]) if isinstance(sb, tuple) else flat_b
    d = scalemm.scaled_grouped_mm(da, db, sa, sb_flat, sizes, group_dim="k", recipe_a=ra, recipe_b=rb,
                                  out_dtype="f32")
    assert isinstance(d, np.ndarray) and d.shape == (len(sizes), m, n) and d.dtype == np.float32
    k0 = 0
    for g, kg in enumerate(sizes):
        if kg == 0:
            assert np.all(d[g] == 0), "an empty k group writes D[g] = 0"
        else:
            _check(d[g], a64[:, k0:k0 + kg], b64[:, k0:k0 + kg], kg)
        k0 += kg


def test_out_dtypes_and_backend_forcing():
    rng = np.random.default_rng(seed("grouped out dtypes"))
    sizes = [2, 0, 5]
    a, b, sa, sb, _, _ = m_grouped_inputs(rng, "block1x128", "block128x128", sizes, 8, 256)
    kw = dict(recipe_a="block1x128", recipe_b="block128x128")
    ref = scalemm.scaled_grouped_mm(a, b, sa, sb, sizes, out_dtype="f32", backend="reference", **kw)
    for od in ("bf16", "f16"):
        d = scalemm.scaled_grouped_mm(a, b, sa, sb, sizes, out_dtype=od, **kw)
        assert d.shape == (7, 8)
        np.testing.assert_allclose(d.astype(np.float32), ref, rtol=1e-2, atol=1e-3)
    with pytest.raises(scalemm.UnsupportedError):  # a forced backend that cannot run host data says so
        scalemm.scaled_grouped_mm(a, b, sa, sb, sizes, backend="native", **kw)


def test_a_one_launch_kernel_asked_for_by_name_refuses_host_arrays_with_the_reason():
    rng = np.random.default_rng(seed("grouped kernels by name"))
    sizes = [2, 0, 5]
    a, b, sa, sb, _, _ = m_grouped_inputs(rng, "block1x128", "block128x128", sizes, 8, 256)
    kw = dict(recipe_a="block1x128", recipe_b="block128x128")
    for name, kernel in (("cutlass", "CUTLASS grouped kernel"), ("contiguous", "contiguous grouped kernel")):
        with pytest.raises(scalemm.UnsupportedError, match=f"{kernel} cannot run this call"):
            scalemm.scaled_grouped_mm(a, b, sa, sb, sizes, grouped_backend=name, **kw)
    with pytest.raises(scalemm.InvalidArgumentError, match="grouped_backend"):
        scalemm.scaled_grouped_mm(a, b, sa, sb, sizes, grouped_backend="deepgemm", **kw)


def test_explain_grouped():
    rng = np.random.default_rng(seed("grouped explain"))
    sizes = [2, 0, 5, 2]
    a, b, sa, sb, _, _ = m_grouped_inputs(rng, "mxfp8", "mxfp8-32x32", sizes, 8, 64)
    text = scalemm.explain(a, b, sa, sb, recipe_a="mxfp8", recipe_b="mxfp8-32x32", group_sizes=sizes)
    assert "G=4" in text and "M_g=0" in text, text
    forced = scalemm.explain(a, b, sa, sb, recipe_a="mxfp8", recipe_b="mxfp8-32x32", group_sizes=sizes,
                             backend="reference")
    assert "reference" in forced, forced


def test_m_grouped_with_every_group_empty():
    import ml_dtypes

    rng = np.random.default_rng(seed("all empty"))
    _, b, _, sb, _, _ = m_grouped_inputs(rng, "block1x128", "block128x128", [0, 0], 8, 128)
    a = np.zeros((0, 128), dtype=ml_dtypes.float8_e4m3fn)
    d = scalemm.scaled_grouped_mm(a, b, np.zeros(0, np.float32), sb, [0, 0], recipe_a="block1x128",
                                  recipe_b="block128x128")
    assert d.shape == (0, 8)


# ---- the size rules, by name ------------------------------------------------------------------------------

def _small_m(rng, sizes_built=(3, 3)):
    return m_grouped_inputs(rng, "block1x128", "block128x128", list(sizes_built), 8, 128)


def test_negative_group_size_is_named():
    a, b, sa, sb, _, _ = _small_m(np.random.default_rng(1))
    with pytest.raises(scalemm.InvalidArgumentError) as e:
        scalemm.scaled_grouped_mm(a, b, sa, sb, [7, -1], recipe_a="block1x128", recipe_b="block128x128")
    assert "group_sizes[1]" in e.value.message and "negative" in e.value.message, e.value.message


def test_group_sizes_that_do_not_add_up_are_named():
    a, b, sa, sb, _, _ = _small_m(np.random.default_rng(2))
    with pytest.raises(scalemm.InvalidArgumentError) as e:
        scalemm.scaled_grouped_mm(a, b, sa, sb, [3, 4], recipe_a="block1x128", recipe_b="block128x128")
    assert "group_sizes" in e.value.message and "add up" in e.value.message and "6" in e.value.message, e.value.message


def test_k_group_off_the_k_block_boundary_names_the_group_and_the_padding():
    rng = np.random.default_rng(3)
    da, sa = _quant(rng, 4, 256, "block1x128")
    db, sb = _quant(rng, 5, 256, "block128x128")
    with pytest.raises(scalemm.InvalidArgumentError) as e:
        scalemm.scaled_grouped_mm(da, db, sa, sb, [128, 100, 28], group_dim="k", recipe_a="block1x128",
                                  recipe_b="block128x128")
    msg = e.value.message
    assert "group_sizes[1]" in msg and "multiple of 128" in msg and "K_g = 128" in msg, msg


def test_wrong_scale_buffer_size_is_named():
    a, b, sa, sb, _, _ = _small_m(np.random.default_rng(4))
    with pytest.raises(scalemm.InvalidLayoutError) as e:
        scalemm.scaled_grouped_mm(a, b, sa[:-1], sb, [3, 3], recipe_a="block1x128", recipe_b="block128x128")
    assert "scale_a" in e.value.message and "bytes" in e.value.message, e.value.message


def test_bad_group_arguments():
    a, b, sa, sb, _, _ = _small_m(np.random.default_rng(5))
    kw = dict(recipe_a="block1x128", recipe_b="block128x128")
    with pytest.raises(scalemm.InvalidArgumentError, match="group_dim"):
        scalemm.scaled_grouped_mm(a, b, sa, sb, [3, 3], group_dim="n", **kw)
    with pytest.raises(scalemm.InvalidArgumentError, match="group_sizes"):
        scalemm.scaled_grouped_mm(a, b, sa, sb, [3.0, 3], **kw)
    with pytest.raises(scalemm.InvalidArgumentError, match="group_sizes"):
        scalemm.scaled_grouped_mm(a, b, sa, sb, np.array([3.0, 3.0]), **kw)
    with pytest.raises(scalemm.InvalidArgumentError, match="experts"):
        scalemm.scaled_grouped_mm(a, b, sa, sb, [2, 2, 2], **kw)


def test_device_group_sizes_with_host_operands_are_refused_by_name():
    class DeviceSizes:  # what a CUDA array looks like to scalemm, without needing one
        __cuda_array_interface__ = {"shape": (2,), "typestr": "<i8", "data": (0, False), "version": 3}

    a, b, sa, sb, _, _ = _small_m(np.random.default_rng(6))
    with pytest.raises(scalemm.InvalidArgumentError) as e:
        scalemm.scaled_grouped_mm(a, b, sa, sb, DeviceSizes(), recipe_a="block1x128", recipe_b="block128x128")
    assert "group_sizes" in e.value.message and "host" in e.value.message, e.value.message


def test_grouped_not_implemented_error_is_still_importable():
    from scalemm import GroupedGemmNotImplementedError

    assert issubclass(GroupedGemmNotImplementedError, scalemm.UnsupportedError)


# ---- torch ---------------------------------------------------------------------------------------------------

def _torch():
    return pytest.importorskip("torch", reason="torch is not installed")


def test_torch_cpu_tensors_and_host_tensor_sizes():
    torch = _torch()
    rng = np.random.default_rng(seed("grouped torch cpu"))
    sizes = [2, 0, 5]
    a, b, sa, sb, _, _ = m_grouped_inputs(rng, "block1x128", "block128x128", sizes, 8, 128)
    kw = dict(recipe_a="block1x128", recipe_b="block128x128", out_dtype="f32")
    want = scalemm.scaled_grouped_mm(a, b, sa, sb, sizes, **kw)
    ta, tb = torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn), torch.from_numpy(b.view(np.uint8)).view(
        torch.float8_e4m3fn)
    got = scalemm.scaled_grouped_mm(ta, tb, torch.from_numpy(sa), torch.from_numpy(sb),
                                    torch.tensor(sizes, dtype=torch.int32), **kw)
    assert isinstance(got, torch.Tensor) and np.array_equal(got.numpy(), want)
    with pytest.raises(scalemm.InvalidArgumentError) as e:
        scalemm.scaled_grouped_mm(ta, tb, torch.from_numpy(sa), torch.from_numpy(sb),
                                  torch.tensor(sizes, device="meta"), **kw)
    assert "group_sizes" in e.value.message and "tolist" in e.value.message, e.value.message


def test_torch_custom_op_fake_shapes():
    torch = _torch()
    from torch._subclasses.fake_tensor import FakeTensorMode

    import scalemm.torch  # noqa: F401  (registers the ops)

    with FakeTensorMode():
        a = torch.empty(10, 64, dtype=torch.float8_e4m3fn)
        b = torch.empty(3, 16, 64, dtype=torch.float8_e4m3fn)
        s = torch.empty(10, dtype=torch.float32)
        d = torch.ops.scalemm.scaled_grouped_mm(a, b, s, s, [4, 0, 6], "m", "rowwise", "rowwise", "bf16", "compact",
                                                "auto", None, None, 1.0, 1.0)
        assert d.shape == (10, 16) and d.dtype == torch.bfloat16
        bk = torch.empty(16, 64, dtype=torch.float8_e4m3fn)
        d = torch.ops.scalemm.scaled_grouped_mm(a, bk, s, s, [32, 32], "k", "rowwise", "rowwise", "f32", "compact",
                                                "auto", None, None, 1.0, 1.0)
        assert d.shape == (2, 10, 16) and d.dtype == torch.float32


def _torch_m_inputs(torch, ra, rb, sizes, n, k):
    a, b, sa, sb, _, _ = m_grouped_inputs(np.random.default_rng(seed(f"torch {ra} x {rb}")), ra, rb, sizes, n, k)

    def t(x):
        x = np.ascontiguousarray(x)
        if x.dtype == np.float32:
            return torch.from_numpy(x)
        u = torch.from_numpy(x.view(np.uint8))
        return u.view(torch.float8_e4m3fn) if x.dtype.name == "float8_e4m3fn" else u

    return t(a), t(b), t(sa), t(sb)


def test_torch_compile_fullgraph_cpu():
    """scalemm.scaled_grouped_mm in a compiled function (m- and k-grouped): the custom op, no break."""
    torch = _torch()
    ra, rb, sizes = "block1x128", "block128x128", [5, 0, 9, 2]
    a, b, sa, sb = _torch_m_inputs(torch, ra, rb, sizes, 16, 256)
    g = torch.Generator().manual_seed(0)
    xq, xs = scalemm.quantize(torch.randn(12, 384, generator=g), "mxfp8")
    yq, ys = scalemm.quantize(torch.randn(20, 384, generator=g), "mxfp8")
    k_sizes = [128, 0, 224, 32]

    def f(a, b, sa, sb, xq, yq, xs, ys):
        dm = scalemm.scaled_grouped_mm(a, b, sa, sb, sizes, recipe_a=ra, recipe_b=rb, out_dtype="f32")
        dk = scalemm.scaled_grouped_mm(xq, yq, xs, ys, k_sizes, group_dim="k", recipe_a="mxfp8", recipe_b="mxfp8",
                                       out_dtype="f32")
        return dm, dk

    want = f(a, b, sa, sb, xq, yq, xs, ys)
    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(a, b, sa, sb, xq, yq, xs, ys)
    assert got[0].shape == (16, 16) and got[1].shape == (4, 12, 20)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_torch_custom_op_passes_opcheck_on_cpu():
    torch = _torch()
    a, b, sa, sb = _torch_m_inputs(torch, "rowwise", "rowwise", [3, 0, 4], 8, 64)
    # test_schema is left out: its checker multiplies FP8 tensors, which torch's CPU kernels cannot.
    utils = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.scalemm.scaled_grouped_mm.default,
                          (a, b, sa, sb, [3, 0, 4], "m", "rowwise", "rowwise", "f32", "compact", "auto", None, None,
                           1.0, 1.0), test_utils=utils)


def _gpu():
    torch = _torch()
    if not (torch.cuda.is_available() and scalemm.has_gpu()):
        pytest.skip(f"no usable CUDA device (torch.cuda.is_available() = {torch.cuda.is_available()}, "
                    f"scalemm: {scalemm.device()})")
    return torch


def _bytes_cat(torch, tensors, stack=False):
    """torch.cat / torch.stack through uint8 views (FP8 and E8M0 tensors lack some CUDA kernels)."""
    u = [t.reshape(-1).view(torch.uint8) if not stack else t.view(torch.uint8) for t in tensors]
    out = torch.stack(u) if stack else torch.cat(u)
    return out.view(tensors[0].dtype)


def _cuda_m_operands(torch, a_parts, sa_parts, b_parts, sb_parts):
    """A (sum M_g, K) and its flat scales from the non-empty groups; B (G, N, K) and its stacked scales."""
    a = _bytes_cat(torch, [p for p in a_parts if p is not None])
    a = a.view(-1, a_parts[next(i for i, p in enumerate(a_parts) if p is not None)].shape[1])
    scale_a = _bytes_cat(torch, [s for s in sa_parts if s is not None])
    return a, _bytes_cat(torch, b_parts, stack=True), scale_a, _bytes_cat(torch, sb_parts, stack=True)


def _cuda_m_inputs(torch, ra, rb, sizes, n, k):
    gen = torch.Generator(device="cuda").manual_seed(0)
    m = sum(sizes)
    x = torch.randn(m, k, device="cuda", generator=gen)
    w = torch.randn(len(sizes), n, k, device="cuda", generator=gen)
    xs = list(torch.split(x, sizes))
    a_parts, sa_parts, b_parts, sb_parts = [], [], [], []
    for g, mg in enumerate(sizes):
        db, sb = scalemm.quantize(w[g].contiguous(), rb)
        b_parts.append(db)
        sb_parts.append(sb)
        if mg:
            da, sa = scalemm.quantize(xs[g].contiguous(), ra)
            a_parts.append(da)
            sa_parts.append(sa)
        else:
            a_parts.append(None)
            sa_parts.append(None)
    return a_parts, sa_parts, b_parts, sb_parts


@pytest.mark.parametrize("ra,rb", [("block1x128", "block128x128"), ("mxfp8", "mxfp8-32x32"), ("rowwise", "rowwise")])
def test_gpu_m_grouped_bit_identical_to_per_group_scaled_mm(ra, rb):
    torch = _gpu()
    sizes, n, k = [0, 1, 7, 130, 0, 33], 64, 256
    a_parts, sa_parts, b_parts, sb_parts = _cuda_m_inputs(torch, ra, rb, sizes, n, k)
    a, b, scale_a, scale_b = _cuda_m_operands(torch, a_parts, sa_parts, b_parts, sb_parts)
    d = scalemm.scaled_grouped_mm(a, b, scale_a, scale_b, sizes, recipe_a=ra, recipe_b=rb, grouped_backend="per-group")
    assert d.is_cuda and d.shape == (sum(sizes), n) and d.dtype == torch.bfloat16
    r0 = 0
    for g, mg in enumerate(sizes):
        if mg:
            want = scalemm.scaled_mm(a_parts[g], b_parts[g], sa_parts[g], sb_parts[g], recipe_a=ra, recipe_b=rb)
            assert torch.equal(d[r0:r0 + mg], want), f"group {g}"
        r0 += mg


@pytest.mark.parametrize("ra,rb,sizes", [("block1x128", "block1x128", [128, 0, 256, 128]),
                                         ("mxfp8", "mxfp8", [32, 0, 96, 64])])
def test_gpu_k_grouped_bit_identical_to_per_group_scaled_mm(ra, rb, sizes):
    torch = _gpu()
    m, n, k = 96, 80, sum(sizes)
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(m, k, device="cuda", generator=gen)
    y = torch.randn(n, k, device="cuda", generator=gen)
    da, sa = scalemm.quantize(x, ra)
    db, sb = scalemm.quantize(y, rb)
    d = scalemm.scaled_grouped_mm(da, db, sa, sb, sizes, group_dim="k", recipe_a=ra, recipe_b=rb, out_dtype="f32")
    assert d.shape == (len(sizes), m, n)
    k0 = 0
    for g, kg in enumerate(sizes):
        if kg == 0:
            assert torch.all(d[g] == 0)
        else:  # the group's columns quantized on their own carry the same blocks: the same dense call
            ga, gsa = scalemm.quantize(x[:, k0:k0 + kg].contiguous(), ra)
            gb, gsb = scalemm.quantize(y[:, k0:k0 + kg].contiguous(), rb)
            want = scalemm.scaled_mm(ga, gb, gsa, gsb, recipe_a=ra, recipe_b=rb, out_dtype="f32")
            assert torch.equal(d[g], want), f"group {g}"
        k0 += kg


def _sqnr_db(ref, got):
    ref, got = ref.double(), got.double()
    return float(10 * torch_log10((ref * ref).sum() / ((ref - got) ** 2).sum().clamp_min(1e-300)))


def torch_log10(x):
    import math
    return math.log10(float(x))


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_gpu_cutlass_kernel_with_device_sizes(dtype):
    """The CUTLASS grouped kernel (by name; auto runs the contiguous kernel here): device-side sizes give the bits of host sizes,
    and the result agrees with the per-group backend (cuBLASLt per group) to the native FP8 tier."""
    torch = _gpu()
    ra, rb = "block1x128", "block128x128"
    sizes, n, k = [0, 1, 7, 130, 0, 33], 64, 256
    a_parts, sa_parts, b_parts, sb_parts = _cuda_m_inputs(torch, ra, rb, sizes, n, k)
    a, b, scale_a, scale_b = _cuda_m_operands(torch, a_parts, sa_parts, b_parts, sb_parts)
    kw = dict(recipe_a=ra, recipe_b=rb, grouped_backend="cutlass")
    dev = torch.tensor(sizes, dtype=getattr(torch, dtype), device="cuda")
    assert "CUTLASS grouped backend" in scalemm.explain(a, b, scale_a, scale_b, group_sizes=dev, **kw)
    host = scalemm.scaled_grouped_mm(a, b, scale_a, scale_b, sizes, **kw)
    on_device = scalemm.scaled_grouped_mm(a, b, scale_a, scale_b, dev, **kw)
    assert torch.equal(host, on_device)
    per_group = scalemm.scaled_grouped_mm(a, b, scale_a, scale_b, sizes, **{**kw, "grouped_backend": "per-group"})
    assert _sqnr_db(per_group.float(), host.float()) >= 40.0  # both bf16-rounded: ~ 8 bits each


def test_gpu_device_sizes_on_the_per_group_backend():
    """A recipe the CUTLASS kernel does not run copies device-side sizes to the host: same bits."""
    torch = _gpu()
    ra, rb = "mxfp8", "mxfp8"
    sizes, n, k = [3, 0, 60, 1], 32, 128
    a_parts, sa_parts, b_parts, sb_parts = _cuda_m_inputs(torch, ra, rb, sizes, n, k)
    a, b, scale_a, scale_b = _cuda_m_operands(torch, a_parts, sa_parts, b_parts, sb_parts)
    kw = dict(recipe_a=ra, recipe_b=rb)
    dev = torch.tensor(sizes, dtype=torch.int32, device="cuda")
    assert "copied to the host" in scalemm.explain(a, b, scale_a, scale_b, group_sizes=dev, **kw)
    assert torch.equal(scalemm.scaled_grouped_mm(a, b, scale_a, scale_b, dev, **kw),
                       scalemm.scaled_grouped_mm(a, b, scale_a, scale_b, sizes, **kw))


def test_gpu_compile_fullgraph():
    torch = _gpu()
    ra, rb = "block1x128", "block128x128"
    sizes, n, k = [5, 0, 64, 3], 32, 256
    a_parts, sa_parts, b_parts, sb_parts = _cuda_m_inputs(torch, ra, rb, sizes, n, k)
    a, b, scale_a, scale_b = _cuda_m_operands(torch, a_parts, sa_parts, b_parts, sb_parts)

    def f(a, b, scale_a, scale_b):
        return scalemm.scaled_grouped_mm(a, b, scale_a, scale_b, sizes, recipe_a=ra, recipe_b=rb)

    eager = f(a, b, scale_a, scale_b)
    compiled = torch.compile(f, fullgraph=True)(a, b, scale_a, scale_b)
    assert torch.equal(eager, compiled)
