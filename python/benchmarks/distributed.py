"""scalemm FP8 layers under torch.distributed (NCCL): data parallel (DDP), fully sharded (FSDP2) and expert
parallel MoE, each checked against the same training on one GPU with the same global batch.

    torchrun --nproc-per-node 2 python/benchmarks/distributed.py ddp|fsdp2|fsdp2-fp8|ep|ep-fp8 [--steps N] [--json FILE]

ddp, fsdp2, fsdp2-fp8: an MLP stack (d -> f -> d blocks, GELU, residual) in Float8BlockwiseLinear, trained with SGD on
    a fixed random regression task. Rank 0 first trains a copy on one GPU with the whole global batch;
    then every rank trains its share of each global batch. The per-step losses must match within
    LOSS_RTOL (the FP8 math is the same per token; only the order of the gradient sums differs). Then
    the step time of the training benchmark's dense block (models.py "block": a Llama-3-8B-sized
    transformer block, 8192 tokens, every projection in blockwise FP8): one GPU against every GPU with
    that batch each (tokens/s, weak scaling). fsdp2-fp8 is fsdp2 with the weights all-gathered in FP8
    (convert_to_float8(..., fsdp_float8_all_gather=True)); both FSDP2 modes report the all-gather bytes.
ep: an MoE layer whose experts are split over the ranks: tokens go to their expert's rank with
    all_to_all_single, local experts run in Float8GroupedExperts (scaled_grouped_mm with the counts on
    the device), and come back. Outputs, input and weight gradients against the same layer on one GPU.
ep-fp8: the same layer as scalemm.torch.ExpertParallelExperts, its tokens (and in backward dY) dispatched in
    FP8 (1x128 blocks, scales packed into each row), combined in bf16: outputs and gradients against the layer
    on one GPU (bit-identical), out and dX against bf16 dispatch (bit-identical), the bytes each rank sends to
    the others (dispatch alone, and all of a step's exchanges) and the step time, both against bf16 dispatch.

NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1): set here before
NCCL starts, and inherited by anything this process starts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import scalemm.torch as st  # noqa: E402
from models import build  # noqa: E402

LOSS_RTOL = 1e-2  # per-step loss, multi-GPU against one GPU (measured differences are printed)
EP_SHAPE = (8, 1024, 1024, 4096)  # ep, ep-fp8: experts, hidden, intermediate, tokens per rank


class Block(torch.nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.up = torch.nn.Linear(d, f, bias=False)
        self.down = torch.nn.Linear(f, d, bias=False)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(x), approximate="tanh"))


def mlp(d, f, layers, device, fp8_gather=False):
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[Block(d, f) for _ in range(layers)]).to(device, torch.bfloat16)
    return st.convert_to_float8(m, recipe="blockwise", fsdp_float8_all_gather=fp8_gather)


def batch(step, tokens, d, device):
    """The global batch of a step (the same on every rank; each rank takes its rows)."""
    g = torch.Generator(device="cpu").manual_seed(1000 + step)
    x = torch.randn(tokens, d, generator=g).to(device, torch.bfloat16)
    y = torch.randn(tokens, d, generator=g).to(device, torch.bfloat16) * 0.5
    return x, y


def train(model, steps, tokens, d, device, rows=slice(None)):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for s in range(steps):
        x, y = batch(s, tokens, d, device)
        loss = F.mse_loss(model(x[rows]).float(), y[rows].float())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return losses


def step_ms(model, x, iters=10):
    """Median CUDA-event time of a forward + backward + SGD step on the batch x."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-6, foreach=True)
    times = []
    for i in range(iters + 3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        model(x).float().square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        b.record()
        b.synchronize()
        if i >= 3:
            times.append(a.elapsed_time(b))
    return statistics.median(times)


def dense_block(device, fp8_gather=False):
    block, make_input = build(torch, "block")
    block = st.convert_to_float8(block.to(device, torch.bfloat16), recipe="blockwise",
                                 fsdp_float8_all_gather=fp8_gather)
    return block, make_input()


class GatherBytes:
    """Counts what this rank receives through torch.distributed.all_gather_into_tensor (FSDP2's weight
    all-gathers: each call's input is this rank's share, received by the other ranks) while open."""

    def __init__(self):
        self.received, self.calls = 0, 0
        self.original = dist.all_gather_into_tensor

        def counted(output_tensor, input_tensor, *args, **kwargs):
            self.calls += 1
            self.received += output_tensor.numel() * output_tensor.element_size() - \
                input_tensor.numel() * input_tensor.element_size()
            return self.original(output_tensor, input_tensor, *args, **kwargs)

        dist.all_gather_into_tensor = counted

    def close(self):
        dist.all_gather_into_tensor = self.original


def data_parallel(mode, args, rank, world, device):
    d, f, layers, tokens = 1024, 4096, 2, 4096 * world
    share = tokens // world
    rows = slice(rank * share, (rank + 1) * share)
    ref = None
    if rank == 0:
        ref = torch.stack(train(mlp(d, f, layers, device), args.steps, tokens, d, device)).float().cpu()
    dist.barrier()
    model = mlp(d, f, layers, device, fp8_gather=mode == "fsdp2-fp8")
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, device_ids=[device.index])
    else:
        from torch.distributed.fsdp import fully_shard

        for b in model:
            fully_shard(b)
        fully_shard(model)
    losses = torch.stack(train(model, args.steps, tokens, d, device, rows)).float()
    dist.all_reduce(losses)  # equal shares: the mean of the ranks' losses is the global batch's
    losses = (losses / world).cpu()
    result = {"mode": mode, "world": world, "steps": args.steps}
    if rank == 0:
        rel = ((losses - ref).abs() / ref.abs()).max().item()
        result.update(loss_one_gpu=ref[-1].item(), loss_multi_gpu=losses[-1].item(), max_rel_loss_diff=rel)
        print(f"{mode}: loss after {args.steps} steps: one GPU {ref[-1].item():.6f}, {world} GPUs "
              f"{losses[-1].item():.6f}; max relative difference over the steps {rel:.2e} (bound {LOSS_RTOL})")
        assert rel <= LOSS_RTOL, f"{mode}: losses differ by {rel:.3e} > {LOSS_RTOL}"
    # Step time of the training benchmark's dense block, 8192 tokens per GPU (weak scaling).
    single = None
    if rank == 0:
        block, x = dense_block(device)
        single = step_ms(block, x)
        del block, x
        torch.cuda.empty_cache()
    dist.barrier()
    block, x = dense_block(device, fp8_gather=mode == "fsdp2-fp8")
    params = sum(p.numel() for p in block.parameters())
    bf16_bytes = sum(p.numel() * p.element_size() for p in block.parameters())
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        block = DDP(block, device_ids=[device.index], gradient_as_bucket_view=True)
    else:
        from torch.distributed.fsdp import fully_shard

        fully_shard(block)
        counter = GatherBytes()
        step_ms(block, x, iters=1)  # 4 steps: the all-gather bytes each rank receives per step
        counter.close()
        per_step = counter.received / 4 if counter.calls else float("nan")  # nan: FSDP2 gathered another way
        # A bf16 weight gathered once per step (the root module keeps its gathered weights for backward).
        bf16_step = bf16_bytes / world * (world - 1)
    multi = step_ms(block, x)
    bf16_gather = None
    if mode == "fsdp2-fp8":  # the same block with bf16 all-gathers, in this process: the step-time comparison
        from torch.distributed.fsdp import fully_shard

        del block
        torch.cuda.empty_cache()
        plain, _ = dense_block(device)
        fully_shard(plain)
        bf16_gather = step_ms(plain, x)
        del plain
    if rank == 0:
        tokens_per_gpu = x.numel() // x.shape[-1]
        speedup = world * single / multi
        result.update(step_ms_one_gpu=single, step_ms_multi_gpu=multi, tokens_per_s_ratio=speedup,
                      tokens_per_gpu=tokens_per_gpu)
        print(f"{mode}: Llama-3-8B-sized block, {tokens_per_gpu} tokens per GPU: one GPU {single:.2f} ms, {world} GPUs "
              f"{multi:.2f} ms per step; tokens/s {speedup:.2f}x one GPU's")
        if bf16_gather is not None:
            result["step_ms_multi_gpu_bf16_gather"] = bf16_gather
            print(f"{mode}: the same FSDP2 block with bf16 all-gathers: {bf16_gather:.2f} ms per step "
                  f"(FP8 all-gathers: {multi / bf16_gather:.3f}x its step time)")
        if mode != "ddp":
            result.update(allgather_bytes_per_step=per_step, allgather_calls=counter.calls,
                          bf16_weight_share_bytes=bf16_step, allgather_ratio_to_bf16_weights=per_step / bf16_step,
                          params=params)
            print(f"{mode}: all-gathers received {per_step / 2**20:.1f} MiB per rank per step in {counter.calls / 4:g} "
                  f"calls ({per_step / bf16_step:.3f}x the other ranks' bf16 weights, {bf16_step / 2**20:.1f} MiB)")
    return result


def ep_setup(world, device):
    """ep's and ep-fp8's layer: the router, every expert's weights, and each rank's tokens."""
    experts, d, f, tokens = EP_SHAPE
    torch.manual_seed(0)
    router = torch.randn(experts, d, device=device, dtype=torch.bfloat16)
    w_up = torch.randn(experts, f, d, device=device, dtype=torch.bfloat16) / d ** 0.5
    w_down = torch.randn(experts, d, f, device=device, dtype=torch.bfloat16) / f ** 0.5
    xs = []
    for r in range(world):
        g = torch.Generator(device="cpu").manual_seed(77 + r)
        xs.append(torch.randn(tokens, d, generator=g).to(device, torch.bfloat16))
    return router, w_up, w_down, xs


def expert_parallel(args, rank, world, device):
    experts, d, f, tokens = EP_SHAPE
    local = experts // world
    router, w_up, w_down, xs = ep_setup(world, device)

    def moe(x, up, down, exchange):
        expert = (x @ router.t()).argmax(-1)
        order = torch.argsort(expert, stable=True)
        counts = torch.bincount(expert, minlength=experts)
        xs_sorted = x.index_select(0, order)
        if exchange:
            from torch.distributed.nn.functional import all_to_all_single

            recv_counts = torch.empty_like(counts)
            dist.all_to_all_single(recv_counts, counts)  # [r * local + j]: rank r's tokens for my expert j
            send = counts.view(world, local).sum(1).tolist()  # the one host read: NCCL's split sizes
            recv = recv_counts.view(world, local).sum(1).tolist()
            got = all_to_all_single(xs_sorted.new_empty((sum(recv), d)), xs_sorted, recv, send)
            ids = torch.arange(local, device=device).repeat(world)
            ids = torch.repeat_interleave(ids, recv_counts, output_size=sum(recv))
            perm = torch.argsort(ids, stable=True)  # by local expert, then source rank
            sizes = recv_counts.view(world, local).sum(0)  # on the device
            h = got.index_select(0, perm)
        else:
            h, sizes = xs_sorted, counts
        y = down(F.gelu(up(h, sizes), approximate="tanh"), sizes)
        if exchange:
            y = y.index_select(0, torch.argsort(perm))
            y = all_to_all_single(y.new_empty((sum(send), d)), y, send, recv)
        return y.index_select(0, torch.argsort(order))

    def layer(n, w_a, w_b):
        up = st.Float8GroupedExperts(n, d, f, device=device, dtype=torch.bfloat16)
        down = st.Float8GroupedExperts(n, f, d, device=device, dtype=torch.bfloat16)
        with torch.no_grad():
            up.weight.copy_(w_a)
            down.weight.copy_(w_b)
        return up, down

    mine = slice(rank * local, (rank + 1) * local)
    up, down = layer(local, w_up[mine], w_down[mine])
    x = xs[rank].clone().requires_grad_()
    out = moe(x, up, down, True)
    out.float().square().sum().backward()
    result = {"mode": "ep", "world": world}
    if rank == 0:
        ups, downs = layer(experts, w_up, w_down)
        xr = torch.cat(xs).requires_grad_()
        ref = moe(xr, ups, downs, False)
        ref.float().square().sum().backward()
        result["ref"] = (ref.detach(), xr.grad, ups.weight.grad, downs.weight.grad)
    # Gather every rank's pieces on rank 0.
    pieces = [out.detach(), x.grad, up.weight.grad, down.weight.grad]
    gathered = []
    for p in pieces:
        bufs = [torch.empty_like(p) for _ in range(world)]
        dist.all_gather(bufs, p.contiguous())
        gathered.append(torch.cat(bufs))
    if rank == 0:
        ref = result.pop("ref")
        report = {}
        for name, a, b in zip(["out", "dx", "dw_up", "dw_down"], gathered, ref):
            a, b = a.double(), b.double()
            err = (a - b).norm() / b.norm()
            report[name] = {"bit_identical": bool(torch.equal(a, b)), "rel_error": err.item()}
            print(f"ep: {name}: relative error {err.item():.2e} against one GPU"
                  f"{' (bit-identical)' if torch.equal(a, b) else ''}")
            assert err.item() <= 1e-2, f"ep: {name} differs from the one-GPU layer: {err.item():.3e}"
        result["compare"] = report
    return result


class ExchangeBytes:
    """Bytes this rank sends to the other ranks through torch.distributed.all_to_all_single while open (its
    own share of each exchange stays on the GPU and is not counted)."""

    def __init__(self, rank, world):
        self.sent, self.calls = 0, 0
        self.original = dist.all_to_all_single

        def counted(output, input, output_split_sizes=None, input_split_sizes=None, *args, **kwargs):
            own = input_split_sizes[rank] if input_split_sizes else input.shape[0] // world
            self.calls += 1
            self.sent += (input.shape[0] - own) * (input[0].numel() * input.element_size() if input.shape[0] else 0)
            return self.original(output, input, output_split_sizes, input_split_sizes, *args, **kwargs)

        dist.all_to_all_single = counted

    def close(self):
        dist.all_to_all_single = self.original
        return self.sent


def expert_parallel_fp8(args, rank, world, device):
    """ep's layer as ExpertParallelExperts with FP8 dispatch, against one GPU and against bf16 dispatch."""
    from scalemm.torch import ep

    experts, d, f, tokens = EP_SHAPE
    router, w_up, w_down, xs = ep_setup(world, device)
    # Routed per rank (the one-GPU layer takes the same ids: a GEMM over more rows may round differently).
    ids = [(x @ router.t()).argmax(-1) for x in xs]
    solo = dist.new_group([0])  # rank 0 alone: the layer holding every expert, no exchange

    def layer(fp8, group=None):
        m = st.ExpertParallelExperts(experts, d, f, group=group, fp8_dispatch=fp8, device=device,
                                     dtype=torch.bfloat16)
        mine = slice(m.first_expert, m.first_expert + m.num_local_experts)
        with torch.no_grad():
            m.up_weight.copy_(w_up[mine])
            m.down_weight.copy_(w_down[mine])
        return m

    def run(m, x, ids):
        x = x.clone().requires_grad_()
        out = m(x, ids)
        out.float().square().sum().backward()
        return [out.detach(), x.grad, m.up_weight.grad, m.down_weight.grad]

    def layer_ms(m, x, ids, iters=10):
        x, times = x.clone().requires_grad_(), []
        for i in range(iters + 3):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            m(x, ids).float().square().mean().backward()
            b.record()
            b.synchronize()
            if i >= 3:
                times.append(a.elapsed_time(b))
        return statistics.median(times)

    names = ["out", "dx", "dw_up", "dw_down"]
    result = {"mode": "ep-fp8", "world": world}
    got = {fp8: run(layer(fp8), xs[rank], ids[rank]) for fp8 in (True, False)}
    gathered = {}
    for fp8, pieces in got.items():
        gathered[fp8] = []
        for p in pieces:
            bufs = [torch.empty_like(p) for _ in range(world)]
            dist.all_gather(bufs, p.contiguous())
            gathered[fp8].append(torch.cat(bufs))
    if rank == 0:
        report = {}
        for fp8 in (True, False):
            one = run(layer(fp8, solo), torch.cat(xs), torch.cat(ids))
            for name, a, b in zip(names, gathered[fp8], one):
                same, err = torch.equal(a, b), ((a.double() - b.double()).norm() / b.double().norm()).item()
                report[f"{name}, {'fp8' if fp8 else 'bf16'} dispatch, against one GPU"] = {
                    "bit_identical": same, "rel_error": err}
                print(f"ep-fp8: {name} ({'FP8' if fp8 else 'bf16'} dispatch): relative error {err:.2e} against one "
                      f"GPU{' (bit-identical)' if same else ''}")
                assert same, f"ep-fp8: {name} differs from the one-GPU layer: {err:.3e}"
        for name, a, b in zip(names, gathered[True], gathered[False]):
            same, err = torch.equal(a, b), ((a.double() - b.double()).norm() / b.double().norm()).item()
            report[f"{name}, fp8 against bf16 dispatch"] = {"bit_identical": same, "rel_error": err}
            print(f"ep-fp8: {name}: FP8 against bf16 dispatch: relative difference {err:.2e}"
                  f"{' (bit-identical)' if same else ''}")
            # out and dX see the same FP8 bytes; dW's token-major operands are rounded twice under FP8 dispatch.
            assert same if name in ("out", "dx") else err <= 0.1, f"ep-fp8: {name} against bf16 dispatch: {err:.3e}"
        result["compare"] = report
    dist.barrier()
    # Bytes sent to the other ranks: the forward dispatch alone, and every exchange of a step.
    x = xs[rank]
    order, counts = ep.route(ids[rank], experts)
    plan = ep.plan_dispatch(counts, experts // world)
    rows = x.index_select(0, order[:plan.tokens])
    sent = {}
    for fp8 in (True, False):
        counter = ExchangeBytes(rank, world)
        (ep.dispatch_fp8 if fp8 else ep.dispatch_rows)(rows, plan)
        dispatch = counter.close()
        m = layer(fp8)
        counter = ExchangeBytes(rank, world)
        run(m, x, ids[rank])
        sent[fp8] = (dispatch, counter.close())
    ms = {fp8: layer_ms(layer(fp8), x, ids[rank]) for fp8 in (True, False)}
    totals = torch.tensor([[*sent[True], *sent[False], ms[True], ms[False]]], dtype=torch.float64, device=device)
    every = [torch.empty_like(totals) for _ in range(world)]
    dist.all_gather(every, totals)
    if rank == 0:
        every = torch.cat(every).cpu()
        fd, fs, bd, bs = (every[:, i].sum().item() for i in range(4))
        fms, bms = every[:, 4].max().item(), every[:, 5].max().item()
        result.update(dispatch_bytes_fp8=fd, dispatch_bytes_bf16=bd, dispatch_ratio=fd / bd, step_bytes_fp8=fs,
                      step_bytes_bf16=bs, step_ratio=fs / bs, step_ms_fp8=fms, step_ms_bf16=bms)
        print(f"ep-fp8: dispatch sent to other ranks, all ranks: FP8 {fd / 2**20:.2f} MiB, bf16 {bd / 2**20:.2f} MiB "
              f"({fd / bd:.3f}x, target <= 0.55x); a step's exchanges (dispatch, combine, their backward, counts): "
              f"{fs / bs:.3f}x")
        print(f"ep-fp8: forward + backward, slowest rank: FP8 dispatch {fms:.2f} ms, bf16 dispatch {bms:.2f} ms "
              f"({fms / bms:.3f}x)")
        assert fd / bd <= 0.55, f"ep-fp8: dispatch bytes {fd / bd:.3f}x bf16's"
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["ddp", "fsdp2", "fsdp2-fp8", "ep", "ep-fp8"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    try:
        if args.mode == "ep":
            result = expert_parallel(args, rank, world, device)
        elif args.mode == "ep-fp8":
            result = expert_parallel_fp8(args, rank, world, device)
        else:
            result = data_parallel(args.mode, args, rank, world, device)
        if rank == 0:
            print(f"{args.mode}: PASSED on {world} GPUs ({torch.cuda.get_device_name(device)})")
            if args.json:
                with open(args.json, "w") as fh:
                    json.dump(result, fh, indent=1)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
