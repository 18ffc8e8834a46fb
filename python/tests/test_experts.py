"""Float8GroupedExperts: the MoE expert layer in FP8 (blockwise), forward and backward against a bf16
reference (torch._grouped_mm where this torch has it) with SQNR bounds, host and device group sizes,
empty experts, and CUDA-graph capture; argument errors by name on the host."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import scalemm  # noqa: E402
import scalemm.torch as st  # noqa: E402
from scalemm import _scalemm  # noqa: E402
from scalemm.torch.quantizers import _quantize_grouped_cuda, _tokens_padded  # noqa: E402
from oracle import seed  # noqa: E402

GPU = torch.cuda.is_available() and scalemm.has_gpu()
needs_gpu = pytest.mark.skipif(not GPU, reason="no usable CUDA device (torch.cuda.is_available() = "
                               f"{torch.cuda.is_available()}, scalemm: {scalemm.device()})")


def sqnr(ref, got):
    ref, got = ref.double(), got.double()
    return (10 * torch.log10(ref.square().sum() / (ref - got).square().sum().clamp_min(1e-300))).item()


def reference(x, w, sizes):
    """bf16 grouped GEMM, Y_e = X_e W_e^T: torch._grouped_mm, or a loop of bf16 matmuls without it."""
    offs = torch.tensor(sizes, device=x.device).cumsum(0).to(torch.int32)
    if hasattr(torch, "_grouped_mm"):
        try:
            return torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
        except RuntimeError:
            pass
    outs, r = [], 0
    for e, m in enumerate(sizes):
        outs.append(x[r:r + m] @ w[e].t())
        r += m
    return torch.cat(outs)


def test_arguments_are_checked_by_name():
    with pytest.raises(scalemm.InvalidArgumentError, match="in_features"):
        st.Float8GroupedExperts(4, 100, 256, device="meta")
    with pytest.raises(scalemm.InvalidArgumentError, match="recipe"):
        st.Float8GroupedExperts(4, 128, 256, recipe="tensorwise", device="meta")
    m = st.Float8GroupedExperts(4, 128, 256, device="meta")
    assert m.weight.shape == (4, 256, 128)
    with pytest.raises(scalemm.InvalidArgumentError, match="group_sizes"):
        m(torch.empty(8, 128, device="meta"), [8, 0, 0])
    with pytest.raises(scalemm.InvalidArgumentError, match="x"):
        m(torch.empty(8, 64, device="meta"), [8, 0, 0, 0])


@needs_gpu
@pytest.mark.parametrize("sizes", [[300, 0, 17, 1, 128, 250, 0, 64], [0, 0, 0, 5], [1024]])
def test_forward_and_backward_against_bf16(sizes):
    g = torch.Generator().manual_seed(seed(f"experts {sizes}"))
    e, k, n = len(sizes), 256, 384
    x = torch.randn(sum(sizes), k, generator=g).cuda().to(torch.bfloat16)
    w = (torch.randn(e, n, k, generator=g) / k ** 0.5).cuda().to(torch.bfloat16)
    dy = torch.randn(sum(sizes), n, generator=g).cuda().to(torch.bfloat16)
    layer = st.Float8GroupedExperts(e, k, n, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(w)
    xf = x.clone().requires_grad_()
    out = layer(xf, sizes)
    out.backward(dy)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    ref = reference(xr, wr, sizes)
    ref.backward(dy)
    assert out.shape == ref.shape and out.dtype == torch.bfloat16
    assert layer.weight.grad.dtype == torch.bfloat16
    s_out, s_dx, s_dw = sqnr(ref, out), sqnr(xr.grad, xf.grad), sqnr(wr.grad, layer.weight.grad)
    print(f"EXPERTS sizes={sizes}: SQNR out {s_out:.1f} dB, dx {s_dx:.1f} dB, dw {s_dw:.1f} dB")
    assert s_out >= 27 and s_dx >= 26
    for i, m in enumerate(sizes):
        if m == 0:
            assert torch.count_nonzero(layer.weight.grad[i]) == 0  # an expert with no tokens: zero gradient
        else:
            assert sqnr(wr.grad[i], layer.weight.grad[i]) >= 26
    # Device-side sizes (int32 and int64) give the same bits as host sizes.
    for dt in (torch.int32, torch.int64):
        xd = x.clone().requires_grad_()
        layer.weight.grad = None
        od = layer(xd, torch.tensor(sizes, dtype=dt, device="cuda"))
        od.backward(dy)
        assert torch.equal(od, out) and torch.equal(xd.grad, xf.grad)


@needs_gpu
def test_cuda_graph_capture_with_device_sizes():
    e, k, n, t = 4, 128, 256, 512
    layer = st.Float8GroupedExperts(e, k, n, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
    sizes = torch.tensor([100, 0, 300, 112], device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            layer(x, sizes)  # warm-up on the capture stream
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=s):
            out = layer(x, sizes)
    torch.cuda.current_stream().wait_stream(s)
    for split in ([512, 0, 0, 0], [1, 2, 3, 506], [128, 128, 128, 128]):
        sizes.copy_(torch.tensor(split))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, layer(x, split)), split


@needs_gpu
def test_token_quantization_equals_quantizing_the_aligned_copy():
    """The experts' one-read quantization of the tokens (x rowwise; x^T with every expert from a
    128-column boundary) has the bytes of quantize() on x and on the 128-row-aligned copy of x, on the
    GPU kernel and through the op's torch path on the host."""
    g = torch.Generator().manual_seed(seed("token quantization"))
    sizes = [300, 0, 17, 1, 128, 250, 0, 64]
    t, k = sum(sizes), 384
    x = torch.randn(t, k, generator=g).to(torch.bfloat16).cuda()
    sz = torch.tensor(sizes, dtype=torch.int64, device="cuda")
    rows = _scalemm.padded_token_rows(t, len(sizes)) + 128  # slack after the last expert stays zero
    assert rows - 128 == (t + 127 * len(sizes) + 127) // 128 * 128  # the layer's own formula
    got = _quantize_grouped_cuda(x, sz, rows, "block1x128", "e4m3", "compact")
    xq, xs = st.quantize(x, "block1x128")
    _, _, xtq, xts = st.quantize(_tokens_padded(x, sz, rows), "block1x128", columnwise=True)
    host = torch.ops.scalemm.quantize_grouped(x.cpu(), sz.cpu(), rows, "block1x128", "e4m3", "compact")
    for name, a, b, h in zip(("data", "scales", "data_t", "scales_t"), got, (xq, xs, xtq, xts), host):
        assert a.shape == b.shape == h.shape, name
        assert torch.equal(a.view(torch.uint8) if a.element_size() == 1 else a,
                           b.view(torch.uint8) if b.element_size() == 1 else b), name
        assert torch.equal(a.cpu().view(torch.uint8) if a.element_size() == 1 else a.cpu(),
                           h.view(torch.uint8) if h.element_size() == 1 else h), name
    with pytest.raises(scalemm.InvalidArgumentError, match="sizes"):
        _quantize_grouped_cuda(x, sz.to(torch.int32), rows, "block1x128", "e4m3", "compact")
    with pytest.raises(scalemm.InvalidArgumentError, match="padded_rows"):
        _quantize_grouped_cuda(x, sz, rows - 256, "block1x128", "e4m3", "compact")


@needs_gpu
def test_backward_holds_one_fp8_weight_copy_and_frees_x_transposed_after_wgrad():
    e, k, n, sizes = 4, 2048, 1024, [1000, 0, 2000, 1096]
    g = torch.Generator().manual_seed(seed("experts keep_saved"))
    x = torch.randn(sum(sizes), k, generator=g).cuda().to(torch.bfloat16).requires_grad_()
    dy = torch.randn(sum(sizes), n, generator=g).cuda().to(torch.bfloat16)
    layer = st.Float8GroupedExperts(e, k, n, device="cuda", dtype=torch.bfloat16)

    def step(retain=False):
        x.grad, layer.weight.grad = None, None
        y = layer(x, sizes)
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        y.backward(dy, retain_graph=retain)
        torch.cuda.synchronize()
        return y, held, torch.cuda.max_memory_allocated() - held

    peaks, grads = {}, {}
    for keep in (True, False):
        layer.keep_saved = keep
        step()
        _, held, peaks[keep] = step()
        grads[keep] = (x.grad.clone(), layer.weight.grad.clone())
    print(f"EXPERTS KEEP_SAVED: backward peak {peaks[True] / 2**20:.1f} MiB kept, {peaks[False] / 2**20:.1f} MiB freed")
    # x^T in the aligned layout: (k, padded rows) FP8 bytes, freed before dgrad allocates dX.
    rows = (sum(sizes) + 127 * e + 127) // 128 * 128
    assert peaks[True] - peaks[False] >= k * rows
    assert all(torch.equal(a, b) for a, b in zip(grads[True], grads[False]))
    layer.keep_saved = False
    y, _, _ = step(retain=True)
    with pytest.raises(RuntimeError, match="keep_saved"):
        y.backward(dy)
    layer.keep_saved = True
    y, _, _ = step(retain=True)
    y.backward(dy)
    assert torch.equal(x.grad, 2 * grads[True][0])
