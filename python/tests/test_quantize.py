"""The quantizer custom ops (scalemm.torch.quantizers): on a GPU every recipe's bytes, layouts and
dequantization equal the host's, the eager fast path writes the custom op's bytes, nvfp4 through the
torch quantize and its op; nvfp4's fake shapes on the host."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import scalemm  # noqa: E402
import scalemm.torch as st  # noqa: E402
from oracle import seed  # noqa: E402
from torch_support import needs_gpu  # noqa: E402


def test_nvfp4_fake_shapes_on_the_host():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(64, 256)
        data, (scales, g), data_t, (scales_t, g2) = st.quantize(x, "nvfp4", columnwise=True)
        assert data.shape == (64, 128) and data_t.shape == (256, 32) and g.shape == () and g2 is g
        assert scales.shape[0] == 64 and scales_t.shape[0] == 256


@needs_gpu
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "block1x128", "block128x128", "mxfp8", "mxfp8-32x32",
                                    "nvfp4"])
def test_device_quantize_layouts_dequantize_match_the_host_bytes(recipe):
    """The GPU quantizer, layout conversion and dequantization give the host's bytes exactly."""
    rows, k = 130, 320
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(seed(f"device bytes {recipe}")))

    def raw(t):
        t = t[0] if isinstance(t, tuple) else t
        return t.cpu().reshape(-1).view(torch.uint8)  # the bytes, whatever the element type

    dh, sh = scalemm.quantize(x, recipe)
    dd, sd = scalemm.quantize(x.cuda(), recipe)
    assert torch.equal(raw(dd), raw(dh)) and torch.equal(raw(sd), raw(sh))
    if recipe == "nvfp4":
        assert float(sd[1]) == sh[1]
    s_host = sh[0] if recipe == "nvfp4" else sh
    s_dev = sd[0] if recipe == "nvfp4" else sd
    lt_h = scalemm.layouts.to_cublaslt(s_host, recipe, rows, k)
    lt_d = scalemm.layouts.to_cublaslt(s_dev, recipe, rows, k)
    assert lt_d.is_cuda and torch.equal(raw(lt_d), raw(lt_h))
    assert torch.equal(raw(scalemm.layouts.from_cublaslt(lt_d, recipe, rows, k)), raw(s_host))
    assert scalemm.layouts.check(lt_d, recipe, rows, k, scale_format="cublaslt") == []
    deq_h = scalemm.dequantize(dh, sh, recipe)
    deq_d = scalemm.dequantize(dd, sd, recipe)
    assert torch.equal(deq_d.cpu(), deq_h)


@needs_gpu
@pytest.mark.parametrize("fmt", ["compact", "cublaslt"])
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "block1x128", "block128x128", "mxfp8", "mxfp8-32x32"])
def test_eager_quantize_skips_the_dispatcher_with_the_custom_ops_bytes(recipe, fmt):
    x = torch.randn(200, 384, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):  # the first call of a signature takes the general path, the second the prepared one
        got = st.quantize(x, recipe, scale_format=fmt, columnwise=True)
    want = torch.ops.scalemm.quantize(x, recipe, "e4m3", fmt, True)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert torch.equal(g.view(torch.uint8) if g.element_size() == 1 else g, w.view(torch.uint8) if w.element_size() == 1 else w)
    assert len(st.quantize(x, recipe, scale_format=fmt)) == 2


@needs_gpu
def test_nvfp4_through_the_torch_quantize_and_its_custom_op():
    x = torch.randn(64, 256, device="cuda")
    data, (scales, g) = st.quantize(x, "nvfp4")
    d2, (s2, g2) = scalemm.quantize(x, "nvfp4")
    assert torch.equal(data.view(torch.uint8), d2.view(torch.uint8)) and torch.equal(scales.view(torch.uint8), s2.view(torch.uint8))
    assert g.dim() == 0 and g.is_cuda and float(g) == float(g2)
    cols = st.quantize(x, "nvfp4", columnwise=True)
    assert cols[2].shape == (256, 32) and cols[3][1] is cols[1][1]
    out = torch.ops.scalemm.quantize_nvfp4(x, "compact", False)
    assert len(out) == 5 and torch.equal(out[0].view(torch.uint8), data.view(torch.uint8))
    compiled = torch.compile(lambda t: st.quantize(t, "nvfp4")[0], fullgraph=True)
    assert torch.equal(compiled(x).view(torch.uint8), data.view(torch.uint8))


# ---- power_of_two_scales ----------------------------------------------------------------------------------

POW2_RECIPES = ["tensorwise", "rowwise", "block1x128", "block128x128"]


def _pow2_reference(x, recipe):
    """amax-pow2 in torch (docs/emulation.md, "Scale modes"): q = 448 / max(amax, 1e-12) in fp32 with its
    mantissa bits cleared, data = e4m3(x q), stored scale 1/q, per the recipe's blocks along K."""
    rows, k = x.shape
    br, bc = {"tensorwise": (rows, k), "rowwise": (1, k), "block1x128": (1, 128), "block128x128": (128, 128)}[recipe]
    xf = x.float()
    pr, pc = -rows % br, -k % bc
    blocks = torch.nn.functional.pad(xf.abs(), (0, pc, 0, pr)).reshape((rows + pr) // br, br, (k + pc) // bc, bc)
    amax = blocks.amax(dim=(1, 3))
    q = torch.tensor(448.0) / amax.clamp_min(1e-12)
    mant, exp = torch.frexp(q)
    q = torch.ldexp(torch.ones_like(q), exp - 1)  # rounded down to a power of two
    qe = q.repeat_interleave(br, 0)[:rows].repeat_interleave(bc, 1)[:, :k]
    data = (xf * qe).to(torch.float8_e4m3fn)
    scales = 1.0 / q
    return data, scales.reshape(()) if recipe == "tensorwise" else scales


@pytest.mark.parametrize("recipe", POW2_RECIPES)
def test_power_of_two_scales_on_the_host_follow_the_amax_pow2_rule(recipe):
    """scalemm.torch.quantize(..., power_of_two_scales=True) on host tensors (the emulator) against the rule
    spelled out in torch; both directions; the scales differ from the default mode's."""
    g = torch.Generator().manual_seed(seed(f"pow2 host {recipe}"))
    x = (torch.randn(256, 384, generator=g) * 3).to(torch.bfloat16)
    data, scales, data_t, scales_t = st.quantize(x, recipe, columnwise=True, power_of_two_scales=True)
    for (d, s), src in (((data, scales), x), ((data_t, scales_t), x.t().contiguous())):
        want_d, want_s = _pow2_reference(src, recipe)
        if recipe == "block128x128" and src is not x:  # the columnwise output is the exact transpose
            want_d, want_s = _pow2_reference(x, recipe)
            want_d, want_s = want_d.t(), want_s.t()
        assert torch.equal(d.view(torch.uint8), want_d.contiguous().view(torch.uint8)), recipe
        assert torch.equal(s.reshape(want_s.shape), want_s), recipe
    default = st.quantize(x, recipe)
    assert not torch.equal(default[1], scales)
    with pytest.raises(scalemm.InvalidArgumentError, match="power_of_two_scales"):
        st.quantize(x, "nvfp4", power_of_two_scales=True)
    mx = st.quantize(x, "mxfp8", power_of_two_scales=True)  # E8M0: powers of two as they are
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(mx, st.quantize(x, "mxfp8")))


@pytest.mark.parametrize("device", [pytest.param("cpu", id="host"), pytest.param("cuda", marks=needs_gpu, id="gpu")])
def test_power_of_two_scales_reach_the_layers_and_the_converted_model(device):
    """A layer's forward and dgrad are the GEMMs of scalemm.torch.quantize(..., power_of_two_scales=True)'s
    operands, bit for bit; convert_to_float8 sets the option and reports it."""
    from scalemm.torch.config import Float8LinearConfig

    layer = st.Float8Linear(256, 128, recipe="blockwise", dtype=torch.bfloat16, device=device)
    assert layer.config == Float8LinearConfig() and not layer.config.power_of_two_scales
    x = torch.randn(64, 256, dtype=torch.bfloat16, device=device, requires_grad=True)
    y0 = layer(x)
    layer.power_of_two_scales = True
    assert layer.config == Float8LinearConfig(power_of_two_scales=True)
    y = layer(x)
    assert not torch.equal(y, y0)
    # The forward GEMM on the pow2 operands, as the layer's own quantizations write them.
    xq, xs = st.quantize(x.detach(), "block1x128", scale_format="cublaslt", power_of_two_scales=True)
    wq, ws = st.quantize(layer.weight.detach(), "block128x128", scale_format="cublaslt", power_of_two_scales=True)
    want = st.scaled_mm(xq, wq, xs, ws, recipe_a="block1x128", recipe_b="block128x128", scale_format="cublaslt")
    assert torch.equal(y, want + layer.bias.to(want.dtype))
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed("pow2 dgrad"))).to(device, y.dtype)
    (dx,) = torch.autograd.grad(y, [x], dy)
    dyq, dys = st.quantize(dy, "block1x128", scale_format="cublaslt", power_of_two_scales=True)
    wtq, wts = st.quantize(layer.weight.detach(), "block128x128", scale_format="cublaslt", columnwise=True,
                           power_of_two_scales=True)[2:]
    assert torch.equal(dx, st.scaled_mm(dyq, wtq, dys, wts, recipe_a="block1x128", recipe_b="block128x128",
                                        scale_format="cublaslt"))
    if device != "cpu":
        return
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 128))
    st.convert_to_float8(model, recipe="rowwise", power_of_two_scales=True)
    assert all(m.power_of_two_scales for m in model)
    assert all(r["reason"].endswith("power-of-two scales") for r in st.conversion_report(model))
    with pytest.raises(scalemm.InvalidArgumentError, match="power_of_two_scales"):
        st.convert_to_float8(torch.nn.Sequential(torch.nn.Linear(256, 256)), power_of_two_scales=True,
                             fsdp_float8_all_gather=True)


@needs_gpu
@pytest.mark.parametrize("fmt", ["compact", "cublaslt"])
@pytest.mark.parametrize("recipe", POW2_RECIPES)
def test_device_power_of_two_scales_equal_the_host_and_the_grouped_quantizer(recipe, fmt):
    """The device quantizer in amax-pow2 mode gives the emulator's bytes (both directions); the experts'
    grouped quantizer (scalemm::moe_quantize_tokens, power_of_two) writes the dense quantizer's rowwise bytes."""
    from scalemm.torch import moe_ops

    g = torch.Generator().manual_seed(seed(f"pow2 device {recipe} {fmt}"))
    x = (torch.randn(384, 512, generator=g) * 5).to(torch.bfloat16)
    dev = st.quantize(x.cuda(), recipe, scale_format=fmt, columnwise=True, power_of_two_scales=True)
    host = st.quantize(x, recipe, scale_format=fmt, columnwise=True, power_of_two_scales=True)
    for a, b in zip(dev, host):
        assert torch.equal(a.cpu().reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), recipe
    if recipe == "block1x128" and fmt == "compact":
        sizes = torch.tensor([100, 0, 200, 84], device="cuda")
        rows = (384 + 127 * 4 + 127) // 128 * 128
        grouped = moe_ops._quantize_tokens_impl(x.cuda(), None, None, sizes, rows, recipe, True, True)
        assert torch.equal(grouped[0].view(torch.uint8), dev[0].view(torch.uint8))
        assert torch.equal(grouped[1], dev[1])
