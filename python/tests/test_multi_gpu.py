"""Several GPUs in one process: every op runs on its tensors' device and that device's current stream,
whatever device is current, and per-device state (kernel attributes, occupancies, workspaces, the
capture check) is kept per device, in either order of first use. Skipped with the reason on fewer
than two GPUs. The distributed set-ups (DDP, FSDP2, expert parallelism) are python/benchmarks/distributed.py,
run by python/tests/gpu-check.sh under torchrun on a machine with two GPUs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import scalemm  # noqa: E402
import scalemm.torch as st  # noqa: E402

COUNT = torch.cuda.device_count() if torch.cuda.is_available() else 0
needs_two = pytest.mark.skipif(COUNT < 2 or not scalemm.has_gpu(),
                               reason=f"needs 2 CUDA devices, this process has {COUNT}")

# One fresh process per order, so that the order decides which device every per-device cache meets
# first. Each device's results are checked against the host emulator (quantizer bytes) and against
# the same call made with that device current (GEMMs, grouped GEMMs, the linear layer: bit-identical).
_SCRIPT = textwrap.dedent(r"""
    import sys, torch, scalemm, scalemm.torch as st
    order = [int(c) for c in sys.argv[1].split(",")]
    checks = 0

    def raw(t):
        t = t[0] if isinstance(t, tuple) else t
        return t.detach().cpu().reshape(-1).view(torch.uint8)

    def same(a, b, what):
        global checks
        checks += 1
        if isinstance(a, (tuple, list)):
            for i, (x, y) in enumerate(zip(a, b)):
                same(x, y, f"{what}[{i}]")
            return
        if isinstance(a, float) or (isinstance(a, torch.Tensor) and a.dim() == 0):
            assert float(a) == float(b), f"{what}: {float(a)} != {float(b)}"
            return
        assert torch.equal(raw(a), raw(b)), what

    pairs = [("tensorwise", "tensorwise"), ("rowwise", "rowwise"), ("block1x128", "block128x128"),
             ("block1x128", "block1x128"), ("mxfp8", "mxfp8"), ("mxfp8", "mxfp8-32x32"), ("nvfp4", "nvfp4")]
    for dev in order:
        other = 1 - dev
        g = torch.Generator().manual_seed(1234 + dev)
        x_host = torch.randn(256, 384, generator=g)
        w_host = torch.randn(128, 384, generator=g)
        for recipe in ["tensorwise", "rowwise", "block1x128", "block128x128", "mxfp8", "mxfp8-32x32", "nvfp4"]:
            for dtype in (torch.float32, torch.bfloat16):
                xh = x_host.to(dtype)
                torch.cuda.set_device(other)
                xd = xh.to(f"cuda:{dev}")
                host = scalemm.quantize(xh, recipe)
                got = scalemm.quantize(xd, recipe)
                assert torch.cuda.current_device() == other
                assert raw(got[0]).numel() and got[0].device.index == dev
                same(got, host, f"scalemm.quantize {recipe} {dtype} on cuda:{dev}")
                cols = st.quantize(xd, recipe, columnwise=True)
                host_cols = scalemm.quantize(xh, recipe, _columnwise=True)
                same(cols, host_cols, f"scalemm.torch.quantize {recipe} {dtype} columnwise on cuda:{dev}")
        for ra, rb in pairs:
            torch.cuda.set_device(other)
            xq, xs = scalemm.quantize(x_host.to(f"cuda:{dev}"), ra)
            wq, ws = scalemm.quantize(w_host.to(f"cuda:{dev}"), rb)
            if ra == "nvfp4":
                xs, ws = (xs[0], float(xs[1])), (ws[0], float(ws[1]))
            d = scalemm.scaled_mm(xq, wq, xs, ws, recipe_a=ra, recipe_b=rb, out_dtype="f32")
            d2 = st.scaled_mm(xq, wq, xs, ws, recipe_a=ra, recipe_b=rb, out_dtype="f32")
            assert d.device.index == dev and torch.cuda.current_device() == other
            with torch.cuda.device(dev):
                ref = scalemm.scaled_mm(xq, wq, xs, ws, recipe_a=ra, recipe_b=rb, out_dtype="f32")
            torch.cuda.synchronize(dev)
            same(d, ref, f"scaled_mm {ra} x {rb} on cuda:{dev}")
            same(d2, ref, f"scalemm.torch.scaled_mm {ra} x {rb} on cuda:{dev}")
        # Grouped: m-grouped, host and device sizes, blockwise and rowwise. The second blockwise case
        # (>= 256 rows per group, K 4096) takes the contiguous kernel's B-sharing clusters on sm_90.
        for ra, rb, sizes, k in [("block1x128", "block128x128", [64, 0, 128, 64], 384),
                                 ("block1x128", "block128x128", [512, 0, 384], 4096),
                                 ("rowwise", "rowwise", [64, 0, 128, 64], 384)]:
            torch.cuda.set_device(other)
            xk = x_host if k == 384 else torch.randn(sum(sizes), k, generator=g)
            xq, xs = scalemm.quantize(xk.to(f"cuda:{dev}"), ra)
            experts = [scalemm.quantize(torch.randn(128, k, generator=g).to(f"cuda:{dev}"), rb)
                       for _ in range(len(sizes))]
            bq, bs = torch.stack([q for q, _ in experts]), torch.stack([s for _, s in experts])
            dev_sizes = torch.tensor(sizes, dtype=torch.int32, device=f"cuda:{dev}")
            outs = [st.scaled_grouped_mm(xq, bq, xs, bs, s, recipe_a=ra, recipe_b=rb) for s in (sizes, dev_sizes)]
            with torch.cuda.device(dev):
                ref = st.scaled_grouped_mm(xq, bq, xs, bs, sizes, recipe_a=ra, recipe_b=rb)
            torch.cuda.synchronize(dev)
            same(outs[0], ref, f"grouped {ra} host sizes on cuda:{dev}")
            same(outs[1], ref, f"grouped {ra} device sizes on cuda:{dev}")
        # The training layer, forward and backward.
        torch.cuda.set_device(other)
        lin = torch.nn.Linear(384, 256, bias=False, device=f"cuda:{dev}", dtype=torch.bfloat16)
        layer = st.Float8BlockwiseLinear.from_linear(lin)
        xin = x_host.to(f"cuda:{dev}", torch.bfloat16).requires_grad_()
        y = layer(xin)
        y.float().square().sum().backward()
        got = (y.detach(), xin.grad, lin.weight.grad)
        xin.grad = lin.weight.grad = None
        with torch.cuda.device(dev):
            y = layer(xin)
            y.float().square().sum().backward()
        same(got, (y.detach(), xin.grad, lin.weight.grad), f"Float8BlockwiseLinear on cuda:{dev}")
        # The MoE experts (the token quantizer, m- and k-grouped GEMMs), device sizes, forward and backward.
        torch.cuda.set_device(other)
        ex = st.Float8GroupedExperts(4, 256, 384, device=f"cuda:{dev}", dtype=torch.bfloat16)
        tok = torch.randn(300, 256, generator=g).to(f"cuda:{dev}", torch.bfloat16).requires_grad_()
        split = torch.tensor([100, 0, 150, 50], device=f"cuda:{dev}")
        y = ex(tok, split)
        y.float().square().sum().backward()
        assert y.device.index == dev and torch.cuda.current_device() == other
        got = (y.detach(), tok.grad, ex.weight.grad)
        tok.grad = ex.weight.grad = None
        with torch.cuda.device(dev):
            y = ex(tok, split)
            y.float().square().sum().backward()
        same(got, (y.detach(), tok.grad, ex.weight.grad), f"Float8GroupedExperts on cuda:{dev}")
    print(f"multi-gpu order {order}: {checks} checks passed")
""")


@needs_two
@pytest.mark.parametrize("order", ["1,0", "0,1"])
def test_every_op_on_either_device_first_in_a_fresh_process(order):
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    r = subprocess.run([sys.executable, "-c", _SCRIPT, order], capture_output=True, text=True, env=env, timeout=600)
    print(r.stdout[-2000:])
    assert r.returncode == 0, r.stderr[-4000:]
    assert "checks passed" in r.stdout


@needs_two
def test_operands_on_two_devices_are_refused_by_name():
    x = torch.randn(128, 256)
    xq0, xs0 = scalemm.quantize(x.to("cuda:0"), "block1x128")
    xq1, xs1 = scalemm.quantize(x.to("cuda:1"), "block1x128")
    wq1, ws1 = scalemm.quantize(torch.randn(128, 256).to("cuda:1"), "block128x128")
    with pytest.raises(scalemm.InvalidArgumentError, match=r"\bb\b"):
        scalemm.scaled_mm(xq0, wq1, xs0, ws1, recipe_a="block1x128", recipe_b="block128x128")
    with pytest.raises(scalemm.Error, match="scale_a"):
        scalemm.scaled_mm(xq1, wq1, xs0, ws1, recipe_a="block1x128", recipe_b="block128x128")
    assert scalemm.scaled_mm(xq1, wq1, xs1, ws1, recipe_a="block1x128", recipe_b="block128x128").device.index == 1


@needs_two
def test_graph_capture_on_the_second_device_while_the_first_is_current():
    torch.cuda.set_device(0)
    x = torch.randn(256, 512, device="cuda:1")
    w = torch.randn(256, 512, device="cuda:1")
    xq, xs = st.quantize(x, "block1x128")
    wq, ws = st.quantize(w, "block128x128")
    s = torch.cuda.Stream(device=1)
    with torch.cuda.device(1), torch.cuda.stream(s):
        eager = st.scaled_mm(xq, wq, xs, ws, recipe_a="block1x128", recipe_b="block128x128")  # warm-up on s
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=s):
            out = st.scaled_mm(xq, wq, xs, ws, recipe_a="block1x128", recipe_b="block128x128")
    graph.replay()
    torch.cuda.synchronize(1)
    assert torch.equal(out, eager)
