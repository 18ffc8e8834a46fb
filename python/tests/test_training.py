"""Whole training steps across the layers (Float8Linear for every recipe, its weight cache, Float8MLP,
Float8GroupedExperts): on a GPU one step captured in a CUDA graph replays the eager steps bit for bit."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import scalemm.torch as st  # noqa: E402
from oracle import seed  # noqa: E402
from torch_support import RECIPES, needs_gpu  # noqa: E402


def _graph_model(case):
    """(model, forward) for one capture case, with the same initial weights on every call."""
    torch.manual_seed(0)
    kw = dict(device="cuda", dtype=torch.bfloat16)
    if case.startswith("linear"):
        m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(approximate="tanh"),
                                torch.nn.Linear(512, 256, bias=False)).to(**kw)
        st.convert_to_float8(m, recipe=case.split("-")[1])
        for layer in m:
            if isinstance(layer, st.Float8Linear):
                layer.cache_weight = case.endswith("cached")
        return m, m
    if case.startswith("mlp"):
        m = st.Float8MLP(256, 512, activation="gelu_tanh" if case == "mlp-gelu" else "swiglu", **kw)
        return m, m
    m = st.Float8GroupedExperts(4, 256, 384, **kw)
    sizes = torch.tensor([100, 0, 300, 112], device="cuda")  # on the device: nothing read on the host
    return m, lambda x: m(x, sizes)


@needs_gpu
@pytest.mark.parametrize("case", [f"linear-{r}" for r in RECIPES] + ["linear-blockwise-cached", "mlp-gelu",
                                                                     "mlp-swiglu", "experts"])
def test_a_whole_training_step_captured_in_a_cuda_graph_replays_the_eager_steps(case):
    """Forward, backward and an SGD update captured once (torch.cuda.graph, after a warm-up on the capture
    stream) and replayed: every replay leaves the parameters and the input's gradient bit-identical to
    an eager step from the same state. With cache_weight on, the captured forward still quantizes the
    weight (a cached copy would replay stale after the update)."""
    g = torch.Generator().manual_seed(seed("graph step " + case))
    (ma, fa), (mb, fb) = _graph_model(case), _graph_model(case)
    x = torch.randn(512, 256, generator=g).to(torch.bfloat16).cuda().requires_grad_()
    with torch.no_grad():
        dy = (torch.randn(fa(x).shape, generator=g) * 0.1).to(torch.bfloat16).cuda()
    xb = x.detach().clone().requires_grad_()
    oa = torch.optim.SGD(ma.parameters(), lr=1e-2, foreach=True)
    ob = torch.optim.SGD(mb.parameters(), lr=1e-2, foreach=True)

    def eager():
        oa.zero_grad(set_to_none=True)
        x.grad = None
        fa(x).backward(dy)
        oa.step()

    def step_b():
        fb(xb).backward(dy)
        ob.step()

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # every call's first run on the capture stream, outside the capture
            ob.zero_grad(set_to_none=True)
            xb.grad = None
            step_b()
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(2):
        eager()
    ob.zero_grad(set_to_none=True)
    xb.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        step_b()
    for i in range(3):
        before = [p.detach().clone() for p in mb.parameters()]
        eager()
        graph.replay()
        torch.cuda.synchronize()
        for (n, pa), pb, p0 in zip(ma.named_parameters(), mb.parameters(), before):
            assert not torch.equal(pb, p0), f"{case}: step {i} left {n} unchanged"
            assert torch.equal(pa, pb), f"{case}: step {i}: {n} differs from the eager step"
        assert torch.equal(x.grad, xb.grad), f"{case}: step {i}: the input's gradient differs"
