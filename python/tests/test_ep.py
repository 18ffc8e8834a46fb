"""Expert parallelism with FP8 token dispatch (scalemm.torch.ep): the exchange logic (routing to ranks,
counts, splits, permutations, sentinels, empty experts and ranks) exact; the FP8 rows received equal
to quantizing the received bf16 rows, byte for byte; the dispatch bytes counted at all_to_all_single;
the layer's output and every gradient bit-identical to one process holding all experts, out and dX
bit-identical to Float8GroupedExperts, and dW (whose token-major operands are rebuilt from the FP8
rows) within a bound of its error. Ranks are fresh processes (gloo on the CPU, the FP8 GEMMs through
the host emulator; NCCL on two GPUs where there are two), run by this file as a script."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import scalemm  # noqa: E402
import scalemm.torch as st  # noqa: E402
from scalemm.torch import ep  # noqa: E402
from scalemm.torch.experts import _quantize_tokens  # noqa: E402

E, D, FF = 4, 256, 256  # experts, hidden, intermediate
WORKER_TIMEOUT_S = 300
COUNT = torch.cuda.device_count() if torch.cuda.is_available() else 0
GPU = COUNT > 0 and scalemm.has_gpu()
needs_gpu = pytest.mark.skipif(not GPU, reason=f"no usable CUDA device (torch sees {COUNT}, scalemm: "
                               f"{scalemm.device()})")
needs_two = pytest.mark.skipif(COUNT < 2 or not GPU, reason=f"needs 2 CUDA devices, this process has {COUNT}")
FP8_ROW_RATIO = (D + D // 32) / (2 * D)  # K data bytes + K/128 fp32 scales against 2K bf16 bytes


def case(world, rank, device="cpu"):
    """Rank `rank`'s tokens: x (T, D), ids (T, k) with sentinels (-1), expert 3 chosen by nobody (so one
    rank of four receives nothing), rank 1 of four routing nothing; k = 2 with routing weights on four
    ranks, k = 1 without on two. Seeded per (world, rank); printed by the tests that use it."""
    g = torch.Generator().manual_seed(900 + 10 * world + rank)
    t, k = [64, 96, 128, 80][rank], (2 if world == 4 else 1)
    x = torch.randn(t, D, generator=g).to(torch.bfloat16)
    ids = torch.randint(0, E, (t, k), generator=g)
    ids[ids == 3] = 2
    ids[::7, 0] = -1
    if world == 4 and rank == 1:
        ids[:] = -1
    w = torch.rand(t, k, generator=g) if k == 2 else None
    return x.to(device), ids.to(device), None if w is None else w.to(device)


def weights(device="cpu"):
    g = torch.Generator().manual_seed(5)
    up = (torch.randn(E, FF, D, generator=g) / D ** 0.5).to(torch.bfloat16)
    down = (torch.randn(E, D, FF, generator=g) / FF ** 0.5).to(torch.bfloat16)
    return up.to(device), down.to(device)


def sorted_rows(x, ids):
    """The layer's rows of one rank: its pairs that name an expert, sorted by expert (route's order)."""
    order, counts = ep.route(ids, E)
    k = ids.shape[1]
    return x.unsqueeze(1).expand(-1, k, -1).reshape(-1, x.shape[1])[order[:int(counts.sum())]], counts


class Bytes:
    """Bytes this rank hands to all_to_all_single (its own share included) while open."""

    def __init__(self):
        self.sent, self.original = 0, dist.all_to_all_single

        def counted(output, input, *args, **kwargs):
            self.sent += input.numel() * input.element_size()
            return self.original(output, input, *args, **kwargs)

        dist.all_to_all_single = counted

    def close(self):
        dist.all_to_all_single = self.original
        return self.sent


def run_layer(m, x, ids, w):
    x = x.clone().requires_grad_()
    out = m(x, ids, w)
    out.float().square().sum().backward()
    return [out.detach(), x.grad, m.up_weight.grad, m.down_weight.grad]


def worker(rank, world, init, backend, out_dir):
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"file://{init}", rank=rank, world_size=world)
    try:
        x, ids, w = case(world, rank, device)
        xs, counts = sorted_rows(x, ids)
        plan = ep.plan_dispatch(counts, E // world)
        res = {"plan": {f: getattr(plan, f) for f in ("send_splits", "recv_splits", "recv_counts", "sizes", "perm")}}
        res["rows"] = ep.dispatch_rows(xs, plan)
        res["round_trip"] = ep.combine_rows(res["rows"], plan)
        counter = Bytes()
        q, s = ep.dispatch_fp8(xs, plan)
        fp8_bytes = counter.close()
        counter = Bytes()
        rows = ep.dispatch_rows(xs, plan)
        res["bytes"] = (fp8_bytes, counter.close())
        res["fp8"] = (q.view(torch.uint8), s)
        if plan.received:  # what Float8GroupedExperts writes for the received rows (rowwise), and quantize's
            res["after"] = _quantize_tokens(rows, plan.sizes, plan.rows, "block1x128")[:2]
            res["after_quantize"] = st.quantize(rows, "block1x128")
        up, down = weights(device)
        mine = slice(rank * (E // world), (rank + 1) * (E // world))
        for fp8 in (True, False):
            m = ep.ExpertParallelExperts(E, D, FF, fp8_dispatch=fp8, device=device, dtype=torch.bfloat16)
            with torch.no_grad():
                m.up_weight.copy_(up[mine])
                m.down_weight.copy_(down[mine])
            counter = Bytes()
            res[f"layer_fp8={fp8}"] = run_layer(m, x, ids, w)
            res[f"layer_bytes_fp8={fp8}"] = counter.close()
        torch.save({k: _cpu(v) for k, v in res.items()}, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()  # every rank done before any tears its connections down
    finally:
        dist.destroy_process_group()


def _cpu(v):
    if isinstance(v, torch.Tensor):
        return v.detach().cpu()
    if isinstance(v, (list, tuple)):
        return type(v)(_cpu(t) for t in v)
    if isinstance(v, dict):
        return {k: _cpu(t) for k, t in v.items()}
    return v


def launch(world, backend, tmp_path):
    """world fresh processes of this file, one per rank; their results, by rank."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [os.path.dirname(os.path.dirname(
        scalemm.__file__)), os.environ.get("PYTHONPATH")] if p), OMP_NUM_THREADS="1")
    init = tmp_path / "init"
    procs = [subprocess.Popen([sys.executable, __file__, str(r), str(world), str(init), backend, str(tmp_path)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    start, logs = time.time(), []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=max(1, WORKER_TIMEOUT_S - (time.time() - start)))[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"{world} ranks did not finish within {WORKER_TIMEOUT_S} s")
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {r} of {world} exited {p.returncode}:\n{log[-4000:]}"
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]


# ---- the references: one process holding every expert ---------------------------------------------------

def everything(world, device="cpu"):
    parts = [case(world, r, device) for r in range(world)]
    x = torch.cat([p[0] for p in parts])
    ids = torch.cat([p[1] for p in parts])
    w = None if parts[0][2] is None else torch.cat([p[2] for p in parts])
    return x, ids, w


def one_process(world, fp8, device="cpu"):
    assert not (dist.is_available() and dist.is_initialized()), "the reference needs no process group"
    x, ids, w = everything(world, device)
    m = ep.ExpertParallelExperts(E, D, FF, fp8_dispatch=fp8, device=device, dtype=torch.bfloat16)
    up, down = weights(device)
    with torch.no_grad():
        m.up_weight.copy_(up)
        m.down_weight.copy_(down)
    return run_layer(m, x, ids, w)


def grouped_experts(world, device="cpu"):
    """The same layer with Float8GroupedExperts (bf16 tokens quantized where the experts are)."""
    x, ids, w = everything(world, device)
    x = x.clone().requires_grad_()
    upw, downw = weights(device)
    up, down = (st.Float8GroupedExperts(E, a, b, device=device, dtype=torch.bfloat16) for a, b in ((D, FF), (FF, D)))
    with torch.no_grad():
        up.weight.copy_(upw)
        down.weight.copy_(downw)
    order, counts = ep.route(ids, E)
    pairs = order[:int(counts.sum())]
    t, k = ids.shape
    xs = x.unsqueeze(1).expand(t, k, D).reshape(t * k, D).index_select(0, pairs)
    y = down(F.gelu(up(xs, counts), approximate="tanh"), counts)
    full = y.new_zeros((t * k, D)).index_copy(0, pairs, y).view(t, k, D)
    out = full[:, 0] if w is None else (full.float() * w.float().unsqueeze(-1)).sum(1).to(x.dtype)
    out.float().square().sum().backward()
    return [out.detach(), x.grad, up.weight.grad, down.weight.grad]


def float64(world):
    """The layer in float64 on the same bf16 inputs: the error reference of the weight gradients."""
    x, ids, w = everything(world)
    x = x.double().requires_grad_()
    up, down = (t.double().requires_grad_() for t in weights())
    order, counts = ep.route(ids, E)
    pairs = order[:int(counts.sum())]
    t, k = ids.shape
    eid = ids.reshape(-1)[pairs]
    xs = x.unsqueeze(1).expand(t, k, D).reshape(t * k, D)[pairs]
    h = F.gelu(torch.einsum("tk,tfk->tf", xs, up[eid]), approximate="tanh")
    y = torch.einsum("tf,tdf->td", h, down[eid])
    full = y.new_zeros((t * k, D)).index_copy(0, pairs, y).view(t, k, D)
    out = full[:, 0] if w is None else (full * w.double().unsqueeze(-1)).sum(1)
    out.square().sum().backward()
    return up.grad, down.grad


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


# ---- the exchange, on one process -------------------------------------------------------------------------

def test_route_sorts_pairs_by_expert_and_drops_sentinels():
    ids = torch.tensor([[2, -1], [0, 2], [5, 0], [2, 2]])
    order, counts = ep.route(ids, 3)
    assert order.tolist()[:6] == [2, 5, 0, 3, 6, 7] and sorted(order.tolist()[6:]) == [1, 4]
    assert counts.tolist() == [2, 0, 4]


def test_one_process_plan_is_the_identity_exchange():
    counts = torch.tensor([3, 0, 5, 2])
    plan = ep.plan_dispatch(counts, 4)
    assert (plan.world, plan.send_splits, plan.recv_splits, plan.tokens) == (1, [10], [10], 10)
    assert plan.sizes.tolist() == [3, 0, 5, 2] and plan.perm.tolist() == list(range(10))
    assert plan.rows == (10 + 127 * 4 + 127) // 128 * 128 and plan.padded.tolist() == [128, 0, 128, plan.rows - 256]


def test_bad_input_is_refused_by_name():
    with pytest.raises(scalemm.InvalidArgumentError, match="counts"):
        ep.plan_dispatch(torch.tensor([1, 2, 3]), 4)
    with pytest.raises(scalemm.InvalidArgumentError, match="expert_ids"):
        ep.route(torch.zeros(4, 2), 4)
    with pytest.raises(scalemm.InvalidArgumentError, match="hidden_features"):
        ep.ExpertParallelExperts(4, 200, 256)
    plan = ep.plan_dispatch(torch.tensor([3, 1]), 2)
    with pytest.raises(scalemm.InvalidArgumentError, match="4 rows"):
        ep.dispatch_rows(torch.zeros(5, 256, dtype=torch.bfloat16), plan)
    m = ep.ExpertParallelExperts(4, 256, 128, dtype=torch.bfloat16)
    with pytest.raises(scalemm.InvalidArgumentError, match="x"):
        m(torch.zeros(4, 128, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.int64))
    with pytest.raises(scalemm.InvalidArgumentError, match="fp8_dispatch"):
        ep.ExpertParallelExperts(4, 256, 256, fp8_dispatch=1)


def test_rebuilt_wgrad_operand_carries_two_roundings():
    """wgrad's x^T from the FP8 rows (dequantized, requantized along tokens) against x^T quantized from
    bf16: a second rounding, so its error is larger, but within sqrt(2) and 10% of it (seed 11)."""
    torch.manual_seed(11)
    x = torch.randn(300, D).to(torch.bfloat16)
    plan = ep.plan_dispatch(torch.tensor([120, 0, 100, 80]), 4)
    direct = _quantize_tokens(x, plan.sizes, plan.rows, "block1x128")[2:]
    rebuilt = ep._columnwise(*st.quantize(x, "block1x128"), plan, torch.bfloat16)
    xt = torch.zeros(D, plan.rows)
    starts = [0, 128, 128, 256]
    for e, (a, n) in enumerate(zip([0, 120, 120, 220], [120, 0, 100, 80])):
        xt[:, starts[e]:starts[e] + n] = x[a:a + n].float().t()
    errs = [rel(ep._dequantize(q, s, torch.float32), xt) for q, s in (direct, rebuilt)]
    print(f"x^T relative error: quantized from bf16 {errs[0]:.4f}, rebuilt from FP8 rows {errs[1]:.4f}")
    assert errs[0] < errs[1] <= 1.1 * 2 ** 0.5 * errs[0]


# ---- several ranks ----------------------------------------------------------------------------------------

def check_exchange(world, results):
    """Every rank's plan and received rows against the ones computed from all ranks' routing."""
    local = E // world
    counts = torch.stack([sorted_rows(*case(world, r)[:2])[1] for r in range(world)])  # (source, expert)
    rows = [sorted_rows(*case(world, r)[:2])[0] for r in range(world)]
    starts = torch.cumsum(counts, 1) - counts  # where expert e's rows start in source r's sorted rows
    for q, res in enumerate(results):
        p, mine = res["plan"], slice(q * local, (q + 1) * local)
        assert p["send_splits"] == counts[q].view(world, local).sum(1).tolist()
        assert p["recv_splits"] == counts[:, mine].sum(1).tolist()
        assert p["recv_counts"].tolist() == counts[:, mine].reshape(-1).tolist()
        assert p["sizes"].tolist() == counts[:, mine].sum(0).tolist()
        # received buffer: by source rank, then local expert; the experts' order: by expert, then source
        offsets = (torch.cumsum(counts[:, mine].reshape(-1), 0) - counts[:, mine].reshape(-1)).view(world, local)
        perm = [i for j in range(local) for r in range(world)
                for i in range(offsets[r, j], offsets[r, j] + counts[r, q * local + j])]
        assert p["perm"].tolist() == perm
        want = [rows[r][starts[r, q * local + j]:starts[r, q * local + j] + counts[r, q * local + j]]
                for j in range(local) for r in range(world)]
        assert torch.equal(res["rows"], torch.cat(want))
        assert torch.equal(res["round_trip"], rows[q]), f"rank {q}: combine(dispatch(x)) is not x"
    return counts


@pytest.mark.parametrize("world", [2, 4])
def test_expert_parallel_on_gloo(world, tmp_path):
    print(f"seeds: tokens 900 + 10 * {world} + rank, weights 5")
    results = launch(world, "gloo", tmp_path)
    counts = check_exchange(world, results)
    if world == 4:  # the edge cases the case promises: one rank routes nothing, one receives nothing
        assert counts[1].sum() == 0 and counts[:, 3].sum() == 0 and results[3]["plan"]["recv_splits"] == [0] * 4
    # FP8 dispatch: the received bytes are those of quantizing the received bf16 rows.
    for q, res in enumerate(results):
        data, scales = res["fp8"]
        assert data.shape == (sum(res["plan"]["recv_splits"]), D) and scales.shape == (data.shape[0], D // 128)
        if "after" in res:
            for got, want in ((data, res["after"][0]), (scales, res["after"][1])):
                assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), f"rank {q}"
            assert torch.equal(data, res["after_quantize"][0].view(torch.uint8))
            assert torch.equal(scales, res["after_quantize"][1])
    fp8_bytes = sum(r["bytes"][0] for r in results)
    bf16_bytes = sum(r["bytes"][1] for r in results)
    assert bf16_bytes == 2 * D * int(counts.sum()) and fp8_bytes == (D + D // 32) * int(counts.sum())
    assert fp8_bytes / bf16_bytes == FP8_ROW_RATIO <= 0.55
    layer = [sum(r[f"layer_bytes_fp8={f}"] for r in results) for f in (True, False)]
    print(f"dispatch bytes: FP8 {fp8_bytes} against bf16 {bf16_bytes} ({fp8_bytes / bf16_bytes:.4f}x); "
          f"the layer's four exchanges and counts: {layer[0]} against {layer[1]} ({layer[0] / layer[1]:.4f}x)")
    assert layer[0] < layer[1]
    # The layer: every rank's pieces against one process holding every expert.
    names = ["out", "dx", "dw_up", "dw_down"]
    grouped = grouped_experts(world)
    for fp8 in (True, False):
        got = [torch.cat([r[f"layer_fp8={fp8}"][i] for r in results]) for i in range(4)]
        for name, a, b in zip(names, got, one_process(world, fp8)):
            assert a.dtype == b.dtype == torch.bfloat16 and torch.equal(a, b), f"fp8={fp8} {name}: {rel(a, b):.3e}"
        exact = names if not fp8 else names[:2]  # bf16 dispatch is Float8GroupedExperts' arithmetic throughout
        for name, a, b in zip(names, got, grouped):
            if name in exact:
                assert torch.equal(a, b), f"fp8={fp8} {name} differs from Float8GroupedExperts: {rel(a, b):.3e}"
    # dW from the rebuilt operands: the error against float64 at most 1.25x the bf16 dispatch's.
    fp8_dw = [torch.cat([r["layer_fp8=True"][i] for r in results]) for i in (2, 3)]
    for name, a, b, ref in zip(names[2:], fp8_dw, grouped[2:], float64(world)):
        ea, eb = rel(a, ref), rel(b, ref)
        print(f"{name}: relative error against float64: FP8 dispatch {ea:.4f}, bf16 dispatch {eb:.4f}")
        assert ea <= 1.25 * eb and ea < 0.1, name


# ---- GPUs ------------------------------------------------------------------------------------------------

@needs_gpu
def test_fp8_dispatch_bytes_and_layer_on_one_gpu():
    """One process on a GPU: the FP8 rows (the fast quantizer) against the grouped quantizer's rowwise
    output, and the layer against Float8GroupedExperts (out and dX identical; with bf16 dispatch all)."""
    x, ids, _ = everything(2, "cuda")
    xs, counts = sorted_rows(x, ids)
    plan = ep.plan_dispatch(counts.cuda(), E)
    q, s = ep.dispatch_fp8(xs, plan)
    want = _quantize_tokens(xs, plan.sizes, plan.rows, "block1x128")[:2]
    assert torch.equal(q.view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(s, want[1])
    grouped = grouped_experts(2, "cuda")
    for fp8 in (True, False):
        got = one_process(2, fp8, "cuda")
        for name, a, b in list(zip(["out", "dx", "dw_up", "dw_down"], got, grouped))[:2 if fp8 else 4]:
            assert torch.equal(a, b), f"fp8={fp8} {name}: {rel(a, b):.3e}"


@needs_two
def test_expert_parallel_on_two_gpus(tmp_path):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    results = launch(2, "nccl", tmp_path)
    check_exchange(2, results)
    for fp8 in (True, False):
        got = [torch.cat([r[f"layer_fp8={fp8}"][i] for r in results]) for i in range(4)]
        for name, a, b in zip(["out", "dx", "dw_up", "dw_down"], got, one_process(2, fp8, "cuda")):
            assert torch.equal(a, b.cpu()), f"fp8={fp8} {name}: {rel(a, b.cpu()):.3e}"


if __name__ == "__main__":
    worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
