"""experts_forward (scalemm.torch.moe): routing index math on the host; forward and every gradient against a
float64 torch reference with SQNR bounds (on the host through the library's emulator, and on the GPU);
sentinels, empty experts, biases, transposed weights, a custom gate, power-of-two scales; on the GPU the
fused dispatch/combine against the torch index ops byte for byte, CUDA-graph replay, torch.compile
(fullgraph) and a sync-free step (torch.cuda.set_sync_debug_mode("error"))."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import scalemm  # noqa: E402
import scalemm.torch as st  # noqa: E402
from scalemm.torch import moe  # noqa: E402
from scalemm.torch import moe_ops as ops  # noqa: E402
from oracle import seed  # noqa: E402
from torch_support import run_without_syncs  # noqa: E402

GPU = torch.cuda.is_available() and scalemm.has_gpu()
needs_gpu = pytest.mark.skipif(not GPU, reason="no usable CUDA device (torch.cuda.is_available() = "
                               f"{torch.cuda.is_available()}, scalemm: {scalemm.device()})")
_C = scalemm._scalemm


def sqnr(ref, got):
    ref, got = ref.double(), got.double()
    return (10 * torch.log10(ref.square().sum() / (ref - got).square().sum().clamp_min(1e-300))).item()


def route_loop(idx, e):
    """The routing contract spelled out: pairs in token order, bucketed by expert, sentinels last."""
    t, k = idx.shape
    flat = [int(v) for v in idx.reshape(-1)]
    key = [v if 0 <= v < e else e for v in flat]
    order = [p for b in range(e + 1) for p in range(t * k) if key[p] == b]
    pos = [0] * (t * k)
    for r, p in enumerate(order):
        pos[p] = r if key[p] < e else -1
    sizes = [key.count(b) for b in range(e)]
    sizes[-1] += key.count(e)
    row_pair = [p if key[p] < e else -1 for p in order]
    return torch.tensor(pos).view(t, k), torch.tensor(row_pair), torch.tensor(sizes)


CASES = [(37, 2, 4, 0.0), (64, 8, 16, 0.2), (5, 3, 1, 0.5), (50, 4, 8, 1.0), (0, 2, 3, 0.0)]


@pytest.mark.parametrize("t,k,e,sentinel", CASES)
def test_routing_index_math_on_host(t, k, e, sentinel):
    g = torch.Generator().manual_seed(seed(f"route {t} {k} {e} {sentinel}"))
    idx = torch.randint(0, max(e // 2, 1), (t, k), generator=g)  # the upper experts stay empty
    mask = torch.rand(t, k, generator=g) < sentinel
    idx = torch.where(mask, e + torch.randint(0, 3, (t, k), generator=g), idx)
    want = route_loop(idx, e)
    got = ops.route_torch(idx, e)
    for a, b in zip(want, got):
        assert torch.equal(a, b)
    pos, row_pair, sizes = got
    assert int(sizes.sum()) == t * k and bool((sizes[e // 2 or 1:-1] == 0).all())
    if hasattr(_C, "moe_route"):  # the library's counting sort, its host branch
        for a, b in zip(got, ops._route_host(idx, e)):
            assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_combine_and_its_weight_gradient_on_host_equal_the_torch_ops(dtype):
    if not hasattr(_C, "moe_combine"):
        pytest.skip("this extension has no moe_combine")
    g = torch.Generator().manual_seed(seed(f"combine {dtype}"))
    t, k, e, h = 33, 3, 5, 200
    idx = torch.randint(0, e + 1, (t, k), generator=g)  # id e: a sentinel
    pos, _, _ = ops.route_torch(idx, e)
    y = torch.randn(t * k, h, generator=g).to(dtype)
    w = torch.rand(t, k, generator=g)
    for weights in (w, None):
        assert torch.equal(ops._host_kernels(y, pos, weights), ops.combine_torch(y, pos, weights))
    dout = torch.randn(t, h, generator=g).to(dtype)
    got, want = ops._host_kernels(y, pos, dout=dout), ops.combine_weight_grad_torch(dout, y, pos)
    assert bool((got[pos < 0] == 0).all())
    torch.testing.assert_close(got, want, rtol=2e-7, atol=0)  # fp64 sums in two orders, rounded to fp32


def test_padded_sizes_hold_every_expert_on_a_128_boundary():
    sizes = torch.tensor([0, 1, 128, 129, 0, 300])
    m = int(sizes.sum())
    rows = (m + 127 * 6 + 127) // 128 * 128
    padded = moe._padded(sizes, rows)
    assert int(padded.sum()) == rows and bool((padded[:-1] % 128 == 0).all())
    assert padded.tolist()[:-1] == [0, 128, 128, 256, 0]


def reference(x, idx, w, w1, w2, e, b1=None, b2=None, gate=None, transposed=False):
    """float64 experts: out[t] = sum over real experts of w[t, j] * down(gate(up(x[t]))), an expert at a time."""
    gate = gate or moe._default_gate
    if transposed:
        w1, w2 = w1.transpose(1, 2), w2.transpose(1, 2)
    out = torch.zeros(x.shape, dtype=torch.float64)
    for ex in range(e):
        tok, j = (idx == ex).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        up = x[tok].double() @ w1[ex].double().t()
        if b1 is not None:
            up = up + b1[ex].double()
        y = gate(up) @ w2[ex].double().t()
        if b2 is not None:
            y = y + b2[ex].double()
        out = out.index_add(0, tok, w[tok, j].double()[:, None] * y)
    return out


def problem(name, t, h, i, e, k, dtype=torch.bfloat16, sentinel=0.1, empty=1, transposed=False, bias=False,
            device="cpu"):
    g = torch.Generator().manual_seed(seed(name))
    x = torch.randn(t, h, generator=g).to(dtype)
    idx = torch.randint(0, e - empty, (t, k), generator=g)
    idx = torch.where(torch.rand(t, k, generator=g) < sentinel, e + 1, idx)
    idx[0] = e  # a token routed to sentinels only
    w = torch.rand(t, k, generator=g)
    w1 = (torch.randn(e, 2 * i, h, generator=g) / h ** 0.5).to(dtype)
    w2 = (torch.randn(e, h, i, generator=g) / i ** 0.5).to(dtype)
    if transposed:
        w1, w2 = w1.transpose(1, 2).contiguous(), w2.transpose(1, 2).contiguous()
    b1 = (torch.randn(e, 2 * i, generator=g) * 0.1).to(dtype) if bias else None
    b2 = (torch.randn(e, h, generator=g) * 0.1).to(dtype) if bias else None
    dout = torch.randn(t, h, generator=g).to(dtype)
    mv = lambda v: None if v is None else v.to(device).requires_grad_()  # noqa: E731
    return dict(x=mv(x), idx=idx.to(device), w=mv(w), w1=mv(w1), w2=mv(w2), b1=mv(b1), b2=mv(b2),
                dout=dout.to(device), e=e)


def run_both(p, transposed=False, gate=None, pow2=False, fused=None, recipe="blockwise"):
    """(scalemm's out and grads, the float64 reference's out and grads)."""
    names = [n for n in ("x", "w", "w1", "w2", "b1", "b2") if p[n] is not None]
    out = moe._forward(p["x"], p["idx"], p["w"], p["w1"], p["w2"], num_experts=p["e"], gate_up_bias=p["b1"],
                       down_bias=p["b2"], apply_gate=gate, is_transposed=transposed, power_of_two_scales=pow2,
                       fused=fused, recipe=recipe)
    got = [out] + list(torch.autograd.grad(out, [p[n] for n in names], p["dout"]))
    leaves = {n: p[n].detach().cpu().double().requires_grad_() for n in names}
    ref_out = reference(leaves["x"], p["idx"].cpu(), leaves["w"], leaves["w1"], leaves["w2"], p["e"],
                        leaves.get("b1"), leaves.get("b2"), gate, transposed)
    ref = [ref_out] + list(torch.autograd.grad(ref_out, [leaves[n] for n in names], p["dout"].cpu().double()))
    return dict(zip(["out"] + names, got)), dict(zip(["out"] + names, ref))


def check(got, ref, p, label, bound=21.0):
    """SQNR bounds for two FP8 GEMMs in a chain (measured on the host: 23-26 dB, the routing weights'
    gradient 22.7-23.4), then sentinels and empty experts exactly."""
    e = p["e"]
    for n in got:
        s = sqnr(ref[n], got[n].cpu())
        print(f"MOE {label}: {n} SQNR {s:.1f} dB")
        assert s >= (bound if n != "w" else bound - 2), (n, s)
    assert got["out"].dtype == p["x"].dtype and got["w1"].dtype == p["w1"].dtype
    assert torch.count_nonzero(got["out"][0]) == 0 and torch.count_nonzero(got["x"][0]) == 0  # sentinels only
    assert torch.count_nonzero(got["w"][0]) == 0
    assert torch.count_nonzero(got["w1"][e - 1]) == 0 and torch.count_nonzero(got["w2"][e - 1]) == 0  # empty


HOST = dict(t=48, h=128, i=128, e=4, k=2)


def test_forward_and_gradients_on_host_against_float64():
    p = problem("moe host", **HOST)
    got, ref = run_both(p)
    check(got, ref, p, "host")


@pytest.mark.parametrize("recipe", ["rowwise", "mxfp8"])
@pytest.mark.parametrize("transposed,bias,pow2", [(False, False, False), (True, True, True)])
def test_rowwise_and_mxfp8_on_host_against_float64(recipe, transposed, bias, pow2):
    """The other recipes through the same engine: rowwise (a scale per row, wgrad's a scale per feature over
    every token), mxfp8 (1x32 E8M0 blocks, weights 32x32): the same bounds as blockwise."""
    p = problem(f"moe host {recipe} {transposed}", **HOST, transposed=transposed, bias=bias)
    got, ref = run_both(p, transposed=transposed, pow2=pow2, recipe=recipe)
    check(got, ref, p, f"host {recipe} transposed={transposed} pow2={pow2}", bound=20.0 if pow2 else 21.0)


def test_biases_transposed_weights_and_a_custom_gate_on_host():
    p = problem("moe host gpt-oss", **HOST, transposed=True, bias=True)

    def clamped(x):  # GPT-OSS-like: interleaved halves, clamped
        gate, up = x[..., ::2].clamp(max=7.0), x[..., 1::2].clamp(-7.0, 7.0)
        return (up + 1) * gate * torch.sigmoid(gate * 1.702)

    got, ref = run_both(p, transposed=True, gate=clamped)
    check(got, ref, p, "host gpt-oss")
    assert torch.count_nonzero(got["b1"][p["e"] - 1]) == 0


def test_power_of_two_scales_on_host():
    if not hasattr(_C, "quantize_mode"):
        pytest.skip("this extension has no scale-mode quantizer (quantize_mode)")
    x = torch.randn(256, 256, dtype=torch.bfloat16) * 3
    for recipe in ("block1x128", "block128x128"):
        q, s = ops._quantize_dense(x, recipe, True)
        m, e = torch.frexp(s)
        assert bool((m == 0.5).all()), recipe  # every scale a power of two
        q0, s0 = ops._quantize_dense(x, recipe, False)
        assert not torch.equal(s, s0)
    p = problem("moe host pow2", **HOST)
    got, ref = run_both(p, pow2=True)
    check(got, ref, p, "host pow2", bound=20.0)


def _weight_pair_both_ways(monkeypatch, device):
    """W and W^T of each square-block recipe in one pass per expert against W's pass plus a byte transpose:
    the same bytes (data and scales), with and without power-of-two scales."""
    monkeypatch.setattr(ops, "_PAIR_MIN_ELEMENTS", 0)  # the small test weights take the one-pass form
    g = torch.Generator().manual_seed(seed("moe weight pair"))
    for e, n, k in ((3, 256, 384), (1, 128, 128)):
        w = (torch.randn(e, n, k, generator=g) * torch.logspace(-3, 3, k)).to(torch.bfloat16).to(device)
        for recipe in moe._SQUARE:
            for pow2 in (False, True):
                cfg = ("block1x128", recipe, pow2)
                pair = ops.quantize_weight_pair(w, recipe, pow2)
                assert pair is not None
                monkeypatch.setattr(ops, "_PAIR_MAX_EXPERTS", -1)  # the two-pass form
                want = moe._weight_operands(w, cfg, True)
                monkeypatch.setattr(ops, "_PAIR_MAX_EXPERTS", 32)
                for got_t, want_t in zip([*pair[0], *pair[1]], [*want[0], *want[1]]):
                    assert got_t.shape == want_t.shape and got_t.dtype == want_t.dtype
                    assert torch.equal(got_t.view(torch.uint8) if got_t.element_size() == 1 else got_t,
                                       want_t.view(torch.uint8) if want_t.element_size() == 1 else want_t), \
                        (e, n, k, recipe, pow2)


def test_weight_pair_in_one_pass_on_host(monkeypatch):
    _weight_pair_both_ways(monkeypatch, "cpu")


@needs_gpu
def test_gpu_weight_pair_in_one_pass(monkeypatch):
    _weight_pair_both_ways(monkeypatch, "cuda")


@needs_gpu
def test_gpu_weight_operands_under_compile_are_the_eager_bytes(monkeypatch):
    """torch.compile(fullgraph=True) of the experts' weight quantization: the one-pass pair (custom op) and the
    two-pass form's byte transpose (custom op) give the eager bytes."""
    torch._dynamo.reset()
    monkeypatch.setattr(ops, "_PAIR_MIN_ELEMENTS", 0)
    g = torch.Generator().manual_seed(seed("moe weight pair compiled"))
    w = (torch.randn(3, 256, 384, generator=g) * torch.logspace(-3, 3, 384)).to(torch.bfloat16).cuda()
    u8 = lambda t: t.view(torch.uint8) if t.element_size() == 1 else t  # noqa: E731
    for recipe in moe._SQUARE:
        cfg = ("block1x128", recipe, False)
        for pair_max in (32, -1):  # the one-pass pair, then the quantizer pass plus the byte transpose
            monkeypatch.setattr(ops, "_PAIR_MAX_EXPERTS", pair_max)
            want = moe._weight_operands(w, cfg, True)
            torch._dynamo.reset()
            got = torch.compile(lambda w: moe._weight_operands(w, cfg, True), fullgraph=True)(w)
            for a, b in zip([*got[0], *got[1]], [*want[0], *want[1]]):
                assert a.shape == b.shape and a.dtype == b.dtype and torch.equal(u8(a), u8(b)), (recipe, pair_max)


def test_grouped_swiglu_quantizer_names_a_bad_intermediate_size():
    """Validation runs before any device work: an intermediate size off the 128-column blocks is refused by name."""
    if not hasattr(_C, "quantize_grouped_swiglu"):
        pytest.skip("this extension has no quantize_grouped_swiglu")
    from scalemm._arrays import DTYPE_CODE
    fake = 256  # never dereferenced: the arguments are refused first
    with pytest.raises(scalemm.InvalidArgumentError, match="gate_up.cols"):
        _C.quantize_grouped_swiglu(0, fake, DTYPE_CODE["bf16"], 4, 100, 3, DTYPE_CODE["e4m3"], 0, 0, fake, fake, 2, 512,
                                   fake, fake, fake, fake, 0)


def test_arguments_are_checked_by_name():
    p = problem("moe args", **HOST)
    with pytest.raises(scalemm.InvalidArgumentError, match="recipe"):
        moe.experts_forward(p["x"], p["idx"], p["w"], p["w1"], p["w2"], num_experts=4, recipe="nvfp4")
    with pytest.raises(scalemm.InvalidArgumentError, match="gate_up_proj"):
        moe.experts_forward(p["x"], p["idx"], p["w"], p["w1"], p["w2"], num_experts=3)
    with pytest.raises(scalemm.InvalidArgumentError, match="down_proj"):
        moe.experts_forward(p["x"], p["idx"], p["w"], p["w1"], p["w2"][:, :, :64], num_experts=4)
    with pytest.raises(scalemm.InvalidArgumentError, match="top_k_weights"):
        moe.experts_forward(p["x"], p["idx"], p["w"][:, :1], p["w1"], p["w2"], num_experts=4)


# ---- GPU --------------------------------------------------------------------------------------------

DEV = dict(t=512, h=256, i=256, e=8, k=4)


@needs_gpu
@pytest.mark.parametrize("fused", [True, False])
def test_gpu_forward_and_gradients_against_float64(fused):
    p = problem(f"moe gpu {fused}", **DEV, device="cuda")
    got, ref = run_both(p, fused=fused)
    check(got, ref, p, f"gpu fused={fused}")


@needs_gpu
@pytest.mark.parametrize("recipe", ["rowwise", "mxfp8"])
@pytest.mark.parametrize("transposed,bias,pow2", [(False, False, False), (True, True, True)])
def test_gpu_rowwise_and_mxfp8_against_float64(recipe, transposed, bias, pow2):
    """rowwise: forward and dgrad on the CUTLASS grouped kernel with device-side sizes, wgrad with the
    sizes read back; mxfp8: the per-group backend (on Hopper the exact emulation). Fused and unfused
    dispatch/combine give the same bytes (but d top_k_weights' fp64 sums, to fp32's last bit)."""
    p = problem(f"moe gpu {recipe} {transposed}", **DEV, transposed=transposed, bias=bias, device="cuda")
    got, ref = run_both(p, transposed=transposed, pow2=pow2, recipe=recipe)
    check(got, ref, p, f"gpu {recipe} transposed={transposed} pow2={pow2}", bound=20.0 if pow2 else 21.0)
    unfused, _ = run_both(p, transposed=transposed, pow2=pow2, recipe=recipe, fused=False)
    for n in got:
        if n == "w":
            torch.testing.assert_close(got[n], unfused[n], rtol=2e-7, atol=0)
        else:
            assert torch.equal(got[n], unfused[n]), n


@needs_gpu
def test_gpu_biases_transposed_and_pow2():
    p = problem("moe gpu gpt-oss", **DEV, transposed=True, bias=True, device="cuda")
    got, ref = run_both(p, transposed=True, pow2=True)
    check(got, ref, p, "gpu gpt-oss pow2", bound=20.0)


@needs_gpu
@pytest.mark.parametrize("transposed,bias,pow2", [(False, False, False), (True, True, True)])
def test_gpu_fused_dispatch_and_combine_equal_the_torch_ops_bytes(transposed, bias, pow2):
    p = problem(f"moe bytes {bias}", **DEV, transposed=transposed, bias=bias, device="cuda")
    got_f, _ = run_both(p, transposed=transposed, pow2=pow2, fused=True)
    got_u, _ = run_both(p, transposed=transposed, pow2=pow2, fused=False)
    for n in got_f:
        if n == "w":  # <dout, y> as fp64 sums in two orders, rounded to fp32
            torch.testing.assert_close(got_f[n], got_u[n], rtol=2e-7, atol=0)
        else:
            assert torch.equal(got_f[n], got_u[n]), n
    # The ops one by one: routing, the gathered (and row-weighted) quantization, combine.
    e, idx, x = p["e"], p["idx"], p["dout"]
    fused_route, torch_route = ops._route_impl(idx, e, True), ops.route_torch(idx, e)
    for a, b in zip(fused_route, torch_route):
        assert torch.equal(a, b)
    pos, row_pair, sizes = fused_route
    k = idx.shape[1]
    row_token = torch.where(row_pair >= 0, row_pair // k, -1)
    rows = (row_pair.numel() + 127 * e + 127) // 128 * 128
    row_w = torch.rand(row_pair.numel(), device="cuda")
    for weights in (None, row_w):
        a = ops._quantize_tokens_impl(x, row_token, weights, sizes, rows, "block1x128", pow2, True)
        b = ops._quantize_tokens_impl(x, row_token, weights, sizes, rows, "block1x128", pow2, False)
        for u, v in zip(a, b):
            assert torch.equal(u.view(torch.uint8), v.view(torch.uint8)) if u.element_size() == 1 else torch.equal(u, v)
    y = torch.randn(row_pair.numel(), x.shape[1], device="cuda").to(x.dtype)
    w = torch.rand(idx.shape, device="cuda")
    for weights in (w, None):
        assert torch.equal(ops._combine_impl(y, pos, weights, True), ops.combine_torch(y, pos, weights))


@needs_gpu
@pytest.mark.parametrize("pow2", [False, True])
def test_gpu_swiglu_in_the_grouped_quantizer_equals_torch_bytes(pow2):
    """The fused kernel (moe_quantize_swiglu) against torch's SwiGLU (and its backward) then the grouped
    quantizer, byte for byte, over uneven groups (an empty one, one of 1 row, one past 128), both
    directions; then a whole call against autograd through the gate."""
    g = torch.Generator().manual_seed(seed(f"moe swiglu op {pow2}"))
    sizes = torch.tensor([0, 1, 200, 77, 0, 129], device="cuda")
    m, i = int(sizes.sum()), 384
    rows = (m + 127 * sizes.numel() + 127) // 128 * 128
    gate_up = (torch.randn(m, 2 * i, generator=g) * 3).to(torch.bfloat16).cuda()
    dh = torch.randn(m, i, generator=g).to(torch.bfloat16).cuda()
    assert ops.swiglu_fused_applies(gate_up, "block1x128")
    for grad in (None, dh):
        a = ops._quantize_swiglu_impl(gate_up, grad, sizes, rows, "block1x128", pow2, True)
        b = ops._quantize_swiglu_impl(gate_up, grad, sizes, rows, "block1x128", pow2, False)
        for u, v in zip(a, b):
            assert torch.equal(u.view(torch.uint8), v.view(torch.uint8)) if u.element_size() == 1 else torch.equal(u, v)


@needs_gpu
def test_gpu_pow2_quantizers_equal_the_host_emulator():
    g = torch.Generator().manual_seed(seed("pow2 gpu"))
    x = (torch.randn(384, 512, generator=g) * 5).to(torch.bfloat16)
    for recipe in ("block1x128", "block128x128"):
        dev = ops._quantize_dense(x.cuda(), recipe, True, True, recipe == "block1x128")
        host = ops._quantize_dense(x, recipe, True, True, recipe == "block1x128")
        for a, b in zip(dev, host):
            assert torch.equal(a.cpu().view(torch.uint8), b.view(torch.uint8)) if a.element_size() == 1 else \
                torch.equal(a.cpu(), b)
    sizes = torch.tensor([100, 0, 200, 84])
    rows = (384 + 127 * 4 + 127) // 128 * 128
    grouped = ops._quantize_tokens_impl(x.cuda(), None, None, sizes.cuda(), rows, "block1x128", True, True)
    host = ops._quantize_tokens_impl(x, None, None, sizes, rows, "block1x128", True, False)
    for a, b in zip(grouped, host):
        assert torch.equal(a.cpu().view(torch.uint8), b.view(torch.uint8)) if a.element_size() == 1 else \
            torch.equal(a.cpu(), b)


def _step(p, names, recipe="blockwise"):
    out = moe.experts_forward(p["x"], p["idx"], p["w"], p["w1"], p["w2"], num_experts=p["e"], recipe=recipe)
    return [out] + list(torch.autograd.grad(out, [p[n] for n in names], p["dout"]))


@needs_gpu
def test_gpu_cuda_graph_replays_bit_identically():
    p = problem("moe graph", **DEV, device="cuda")
    names = ["x", "w", "w1", "w2"]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            _step(p, names)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        static = _step(p, names)
    g = torch.Generator().manual_seed(seed("moe graph replays"))
    for trial in range(4):
        new_idx = torch.randint(0, p["e"] + 1 - trial % 2, p["idx"].shape, generator=g)  # some sentinels, some not
        p["idx"].copy_(new_idx)
        graph.replay()
        eager = _step(p, names)
        for a, b in zip(static, eager):
            assert torch.equal(a, b), trial


@needs_gpu
def test_gpu_torch_compile_fullgraph():
    p = problem("moe compile", **DEV, device="cuda")
    names = ["x", "w", "w1", "w2"]
    torch._dynamo.reset()
    f = torch.compile(lambda x, idx, w, w1, w2: moe.experts_forward(x, idx, w, w1, w2, num_experts=p["e"]),
                      fullgraph=True)
    out = f(p["x"], p["idx"], p["w"], p["w1"], p["w2"])
    got = [out] + list(torch.autograd.grad(out, [p[n] for n in names], p["dout"]))
    _, ref = run_both(p)
    check(dict(zip(["out"] + names, got)), ref, p, "compiled")


@needs_gpu
@pytest.mark.parametrize("recipe", [r if not moe.HOST_SIZES[r] else pytest.param(
    r, marks=pytest.mark.skip(reason=f"{r} reads its group sizes back by design: {moe.HOST_SIZES_REASON[r]}"))
    for r in moe.RECIPES])
def test_gpu_step_never_synchronises(recipe):
    p = problem("moe sync", **DEV, device="cuda", bias=True)
    names = ["x", "w", "w1", "w2", "b1", "b2"]

    def step():
        out = moe.experts_forward(p["x"], p["idx"], p["w"], p["w1"], p["w2"], num_experts=p["e"],
                                  gate_up_bias=p["b1"], down_bias=p["b2"], recipe=recipe)
        return torch.autograd.grad(out, [p[n] for n in names], p["dout"])

    run_without_syncs(step)  # the first call prepares the library's calls


@pytest.mark.parametrize("recipe", list(moe.RECIPES))
def test_torch_compile_fullgraph_traces_the_ops_on_host(recipe):
    """The fake implementations and the Functions under dynamo and AOTAutograd (aot_eager: the graph runs
    the ops themselves, so it must give the eager bytes). rowwise and mxfp8: the traced call hands the
    device sizes to the library, the eager one host sizes it read back; the same bytes."""
    p = problem("moe compile host", **HOST)
    names = ["x", "w", "w1", "w2"]
    torch._dynamo.reset()
    f = torch.compile(lambda x, idx, w, w1, w2: moe.experts_forward(x, idx, w, w1, w2, num_experts=p["e"],
                                                                    recipe=recipe),
                      fullgraph=True, backend="aot_eager")
    out = f(p["x"], p["idx"], p["w"], p["w1"], p["w2"])
    got = [out] + list(torch.autograd.grad(out, [p[n] for n in names], p["dout"]))
    assert st.experts_forward is moe.experts_forward
    want = _step(p, names, recipe)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
