"""Float8Linear (scalemm.torch.linear): forward and backward on CPU tensors, torch.compile(fullgraph=True);
on a GPU each recipe's forward and gradients against float64, the weight cache against requantizing every
call, dW written in the weight's dtype bit-identical to an fp32 dW rounded afterwards, fast accumulation in
the forward only, the saved FP8 copies freed before dgrad, and gradients not asked for not computed."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import scalemm.torch as st  # noqa: E402
from oracle import seed  # noqa: E402
from torch_support import RECIPES, _sqnr, needs_gpu  # noqa: E402


def test_linear_layers_forward_backward_cpu():
    torch.manual_seed(seed("linear cpu"))
    for cls in (st.Float8BlockwiseLinear, st.MXLinear):
        lin = cls(128, 64)
        ref = torch.nn.Linear(128, 64)
        ref.load_state_dict(lin.state_dict())
        x = torch.randn(16, 128, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        y = lin(x)
        y2 = ref(x2)
        assert y.shape == (16, 64)
        rel = ((y - y2).norm() / y2.norm()).item()
        assert rel < 0.1, (cls.__name__, rel)
        y.square().sum().backward()
        y2.square().sum().backward()
        for got, want, name in ((x.grad, x2.grad, "dx"), (lin.weight.grad, ref.weight.grad, "dw"),
                                (lin.bias.grad, ref.bias.grad, "db")):
            rel = ((got - want).norm() / want.norm()).item()
            assert rel < 0.15, (cls.__name__, name, rel)


def test_compile_fullgraph_cpu():
    torch.manual_seed(seed("compile cpu"))
    model = torch.nn.Sequential(st.Float8BlockwiseLinear(128, 128), torch.nn.GELU(), st.MXLinear(128, 64))
    x = torch.randn(32, 128)
    want = model(x)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    got = compiled(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    got.sum().backward()


@needs_gpu
@pytest.mark.parametrize("cls", ["Float8BlockwiseLinear", "MXLinear"])
def test_compile_fullgraph_linear_gpu(cls):
    torch.manual_seed(seed(f"compile {cls}"))
    layer = getattr(st, cls)
    model = torch.nn.Sequential(layer(512, 1024), torch.nn.GELU(), layer(1024, 512)).cuda().to(torch.bfloat16)
    x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    want = model(x)
    want.float().square().mean().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    got = compiled(x)
    got.float().square().mean().backward()
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g, rtol=5e-2, atol=5e-3)


@needs_gpu
@pytest.mark.parametrize("recipe", RECIPES)
def test_each_recipe_forward_and_gradients_against_float64(recipe):
    g = torch.Generator().manual_seed(seed(f"training {recipe}"))
    x = torch.randn(264, 512, generator=g).cuda().to(torch.bfloat16)
    lin = torch.nn.Linear(512, 384, device="cuda", dtype=torch.bfloat16)
    layer = st.Float8Linear.from_linear(lin, recipe=recipe)
    dy = torch.randn(264, 384, generator=g).cuda().to(torch.bfloat16)
    xf = x.clone().requires_grad_()
    y = layer(xf)
    y.backward(dy)
    x64, w64, b64 = x.double().requires_grad_(), lin.weight.detach().double().requires_grad_(), lin.bias.detach().double()
    y64 = x64 @ w64.t() + b64
    y64.backward(dy.double())
    s = (_sqnr(y64, y), _sqnr(x64.grad, xf.grad), _sqnr(w64.grad, lin.weight.grad))
    print(f"TRAINING {recipe}: SQNR against float64: y {s[0]:.1f} dB, dx {s[1]:.1f} dB, dw {s[2]:.1f} dB")
    # E4M3's 3 mantissa bits bound one quantization at about 30 dB; tensorwise pays for the spread of
    # magnitudes across the whole tensor.
    assert min(s) >= {"tensorwise": 20, "mxfp8": 23}.get(recipe, 25)
    assert lin.weight.grad.dtype == torch.bfloat16 and lin.bias.grad is not None


@needs_gpu
@pytest.mark.parametrize("opt", ["sgd-foreach", "adamw-fused", "load_state_dict", "no_grad copy_"])
def test_the_weight_cache_follows_every_in_place_update(opt):
    torch.manual_seed(1)
    lin = torch.nn.Linear(256, 256, bias=False, device="cuda", dtype=torch.bfloat16)
    cached = st.Float8Linear.from_linear(lin)
    cached.cache_weight = True
    fresh = st.Float8Linear.from_linear(lin)
    assert fresh.cache_weight is False  # off by default: no weight-sized memory held between steps
    x = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(cached(x), fresh(x))
    first = cached.__dict__["_weight_q"]
    assert torch.equal(cached(x), fresh(x)) and cached.__dict__["_weight_q"] is first  # no change: reused
    if opt == "sgd-foreach":
        cached(x).float().sum().backward()
        torch.optim.SGD([lin.weight], lr=0.1, foreach=True).step()
    elif opt == "adamw-fused":
        cached(x).float().sum().backward()
        torch.optim.AdamW([lin.weight], lr=0.1, fused=True).step()
    elif opt == "load_state_dict":
        lin.load_state_dict({"weight": torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)})
    else:
        with torch.no_grad():
            lin.weight.copy_(torch.randn(256, 256, device="cuda", dtype=torch.bfloat16))
    assert torch.equal(cached(x), fresh(x)), f"a stale quantized weight after {opt}"
    assert cached.__dict__["_weight_q"] is not first


def _cuda_layer(recipe, inp, out, tokens, seed):
    """A bias-free bf16 nn.Linear, its Float8Linear (shared weight) and an input of `tokens` rows."""
    torch.manual_seed(seed)
    lin = torch.nn.Linear(inp, out, bias=False, device="cuda", dtype=torch.bfloat16)
    return lin, st.Float8Linear.from_linear(lin, recipe=recipe), torch.randn(tokens, inp, device="cuda",
                                                                             dtype=torch.bfloat16)


@needs_gpu
@pytest.mark.parametrize("recipe", ["blockwise", "rowwise"])
def test_wgrad_in_the_weight_dtype_is_the_rounded_fp32_wgrad(recipe):
    act, _ = st.LINEAR_RECIPES[recipe]
    lin, layer, x = _cuda_layer(recipe, 256, 384, 512, seed=2)
    dy = torch.randn(512, 384, device="cuda", dtype=torch.bfloat16)
    layer(x).backward(dy)
    _, _, xtq, xts = st.quantize(x, act, columnwise=True)
    _, _, dytq, dyts = st.quantize(dy, act, columnwise=True)
    ref = st.scaled_mm(dytq, xtq, dyts, xts, recipe_a=act, recipe_b=act, out_dtype="f32").to(torch.bfloat16)
    assert torch.equal(lin.weight.grad, ref)


@needs_gpu
@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise"])
def test_rowwise_and_tensorwise_layers_use_fast_accumulation_in_the_forward_only(recipe):
    act, wgt = st.LINEAR_RECIPES[recipe]
    lin, layer, x = _cuda_layer(recipe, 4096, 256, 512, seed=3)
    assert layer.fast_accum is True
    xq, xs = st.quantize(x, act)
    wq, ws = st.quantize(lin.weight.detach(), wgt)
    ops = dict(recipe_a=act, recipe_b=wgt, scale_format="compact")
    fast = st.scaled_mm(xq, wq, xs, ws, fast_accum=True, **ops)
    exact = st.scaled_mm(xq, wq, xs, ws, **ops)
    layer.scale_format = "compact"
    assert torch.equal(layer(x), fast)
    layer.fast_accum = False
    assert torch.equal(layer(x), exact)


def _backward_peak(layer, x, dy, retain=False):
    """Bytes allocated at backward's peak above what was allocated before it."""
    y = layer(x)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    y.backward(dy, retain_graph=retain)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before, y


@needs_gpu
@pytest.mark.parametrize("recipe", ["blockwise", "rowwise"])
def test_backward_frees_x_transposed_before_dgrad_and_keep_saved_keeps_it(recipe):
    # M x K = 4096 x 4096, N = 1024: dgrad's dX (32 MiB) is the backward's largest allocation, after
    # wgrad has used X^T's FP8 copy (16 MiB); freeing that copy first lowers the peak by its size.
    g = torch.Generator().manual_seed(seed(f"keep_saved {recipe}"))
    x = torch.randn(4096, 4096, generator=g).cuda().to(torch.bfloat16).requires_grad_()
    dy = torch.randn(4096, 1024, generator=g).cuda().to(torch.bfloat16)
    layer = st.Float8Linear(4096, 1024, bias=False, device="cuda", dtype=torch.bfloat16, recipe=recipe)
    peaks, grads = {}, {}
    for keep in (True, False):
        layer.keep_saved = keep
        x.grad, layer.weight.grad = None, None
        _backward_peak(layer, x, dy)  # warm: prepared calls and the caching allocator's blocks
        x.grad, layer.weight.grad = None, None
        peaks[keep], _ = _backward_peak(layer, x, dy)
        grads[keep] = (x.grad.clone(), layer.weight.grad.clone())
    print(f"KEEP_SAVED {recipe}: backward peak {peaks[True] / 2**20:.1f} MiB kept, {peaks[False] / 2**20:.1f} MiB freed")
    assert peaks[True] - peaks[False] >= 4096 * 4096  # X^T's FP8 bytes
    assert all(torch.equal(a, b) for a, b in zip(grads[True], grads[False]))  # the same GEMMs on the same bytes
    # A second backward through the same graph: a named error after the copy was freed, the same
    # gradients again (accumulated) when it was kept.
    layer.keep_saved = False
    x.grad, layer.weight.grad = None, None
    _, y = _backward_peak(layer, x, dy, retain=True)
    with pytest.raises(RuntimeError, match="keep_saved"):
        y.backward(dy)
    layer.keep_saved = True
    x.grad, layer.weight.grad = None, None
    _, y = _backward_peak(layer, x, dy, retain=True)
    y.backward(dy)
    assert torch.equal(x.grad, 2 * grads[True][0])


@needs_gpu
@pytest.mark.parametrize("recipe", RECIPES)
def test_gradients_not_asked_for_are_not_computed_and_the_rest_unchanged(recipe):
    # A frozen weight writes and keeps no X^T and quantizes dY for dgrad only; an input without grad
    # quantizes dY for wgrad only. The gradients that are asked for keep their bits.
    g = torch.Generator().manual_seed(seed(f"frozen weight {recipe}"))
    x = torch.randn(1024, 2048, generator=g).cuda().to(torch.bfloat16)
    dy = torch.randn(1024, 512, generator=g).cuda().to(torch.bfloat16)
    layer = st.Float8Linear(2048, 512, bias=False, device="cuda", dtype=torch.bfloat16, recipe=recipe)
    held, grads = {}, {}
    for case in ("both", "frozen", "both", "no dx"):
        layer.weight.requires_grad_(case != "frozen")
        xin = x.clone().requires_grad_(case != "no dx")
        layer.weight.grad = None
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        y = layer(xin)
        held[case] = torch.cuda.memory_allocated() - before  # Y and what backward keeps
        y.backward(dy)
        grads[case] = (xin.grad, layer.weight.grad)
        assert (layer.weight.grad is None) == (case == "frozen") and (xin.grad is None) == (case == "no dx")
        del y
    assert held["both"] - held["frozen"] >= 1024 * 2048  # X^T's FP8 bytes
    assert torch.equal(grads["frozen"][0], grads["both"][0])  # dX
    assert torch.equal(grads["no dx"][1], grads["both"][1])  # dW


# ---- the layer's options and the weight cache's step hook ------------------------------------------------------

def test_config_reads_the_layer_and_class_attributes():
    import dataclasses

    from scalemm.torch.config import Float8LinearConfig

    a, b = st.Float8Linear(128, 64, recipe="rowwise"), st.Float8Linear(128, 64)
    assert a.config == Float8LinearConfig(recipe="rowwise") and b.config == Float8LinearConfig()
    assert st.MXLinear(128, 64).config.recipes == ("mxfp8", "mxfp8-32x32")
    assert a.config.forward_fast_accum and not b.config.forward_fast_accum
    a.keep_saved, a.fast_accum = True, False
    assert a.config.keep_saved and not a.config.forward_fast_accum and not b.config.keep_saved
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.config.keep_saved = False
    saved = st.Float8Linear.min_gflop
    st.Float8Linear.min_gflop = 1e9  # a class attribute: every layer without its own value
    try:
        assert b.config.min_gflop == 1e9 and st.MXLinear(128, 64).config.min_gflop == 1e9
        x = torch.randn(4, 128, generator=torch.Generator().manual_seed(seed("config min_gflop")))
        # Below min_gflop the forward is F.linear in the weight's dtype: the forward reads the config.
        assert torch.equal(b(x), torch.nn.functional.linear(x, b.weight, b.bias))
    finally:
        st.Float8Linear.min_gflop = saved
    assert b.config.min_gflop == 0.0


_HOOKS = ("import torch, torch.optim.optimizer as o, scalemm.torch as st\n"
          "hooks = lambda: len(o._global_optimizer_post_hooks)\n")


def _run(code):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _HOOKS + code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_importing_registers_no_optimizer_hook():
    _run("assert hooks() == 0, hooks()\n"
         "st.Float8Linear(128, 64)(torch.randn(4, 128))  # no weight cache: still none\n"
         "assert hooks() == 0, hooks()\n")


@needs_gpu
def test_the_weight_cache_registers_the_step_hook_on_first_use():
    _run("from scalemm.torch import linear\n"
         "m = st.Float8Linear(256, 256, device='cuda', dtype=torch.bfloat16)\n"
         "x = torch.randn(8, 256, device='cuda', dtype=torch.bfloat16)\n"
         "m(x)\n"
         "assert hooks() == 0, hooks()\n"
         "m.cache_weight = True\n"
         "m(x)\n"
         "assert hooks() == 1, hooks()\n"
         "first = m.__dict__['_weight_q']\n"
         "opt = torch.optim.AdamW(m.parameters(), fused=True)\n"
         "m(x).float().sum().backward()\n"
         "opt.step()\n"
         "assert linear._optimizer_steps[0] == 1 and hooks() == 1\n"
         "m(x)\n"
         "assert m.__dict__['_weight_q'] is not first  # the step requantized it\n")
