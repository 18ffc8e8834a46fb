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
