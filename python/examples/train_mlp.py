"""Trains the same small MLP three times, with nn.Linear in BF16, scalemm.torch.Float8BlockwiseLinear and
scalemm.torch.MXLinear, on a fixed regression task (a random teacher network), and prints the loss curves
side by side. Same initial weights, same data, same optimizer for all three.

    python examples/train_mlp.py                   # GPU: 300 steps, 256 -> 1024 -> 1024 -> 256
    python examples/train_mlp.py --device cpu --steps 20 --width 256   # the host reference emulator (slow)
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

import scalemm.torch as st


def make_mlp(d_in: int, width: int, d_out: int, linear) -> torch.nn.Module:
    return torch.nn.Sequential(linear(d_in, width), torch.nn.GELU(), linear(width, width), torch.nn.GELU(),
                               linear(width, d_out))


def swap_linears(model: torch.nn.Module, cls) -> torch.nn.Module:
    """A copy of `model` whose nn.Linear layers are `cls` layers holding copies of the same weights."""
    model = copy.deepcopy(model)
    for i, m in enumerate(model):
        if isinstance(m, torch.nn.Linear):
            model[i] = cls.from_linear(m)
    return model


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--every", type=int, default=25)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--compile", action="store_true", help="torch.compile(fullgraph=True) each model")
    args = p.parse_args()
    print(f"seed {args.seed}, device {args.device}, {args.steps} steps, batch {args.batch}, "
          f"MLP {args.dim} -> {args.width} -> {args.width} -> {args.dim}")

    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    teacher = make_mlp(args.dim, args.width, args.dim, torch.nn.Linear).to(dev)
    base = make_mlp(args.dim, args.width, args.dim, torch.nn.Linear).to(dev)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    ref_name = ("bf16" if dtype == torch.bfloat16 else "f32") + " nn.Linear"
    models = {ref_name: copy.deepcopy(base).to(dtype),
              "Float8BlockwiseLinear": swap_linears(base, st.Float8BlockwiseLinear).to(dtype),
              "MXLinear": swap_linears(base, st.MXLinear).to(dtype)}
    if args.compile:
        models = {k: torch.compile(m, fullgraph=True) for k, m in models.items()}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=args.lr) for k, m in models.items()}
    gen = torch.Generator(device=dev).manual_seed(args.seed + 1)
    losses = {k: [] for k in models}
    times = {k: 0.0 for k in models}
    print(f"{'step':>5}  " + "  ".join(f"{k:>22}" for k in models))
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch, args.dim, generator=gen, device=dev)
        with torch.no_grad():
            y = teacher(x)
        for k, m in models.items():
            t0 = time.perf_counter()
            out = m(x.to(dtype))
            loss = torch.nn.functional.mse_loss(out.float(), y)
            opts[k].zero_grad(set_to_none=True)
            loss.backward()
            opts[k].step()
            losses[k].append(loss.detach())
            if dev.type == "cuda":
                torch.cuda.synchronize()
            times[k] += time.perf_counter() - t0
        if step % args.every == 0 or step == 1 or step == args.steps:
            print(f"{step:>5}  " + "  ".join(f"{losses[k][-1].item():>22.6f}" for k in models), flush=True)
    final = {k: torch.stack(v[-10:]).mean().item() for k, v in losses.items()}
    ref = final[ref_name]
    print("mean loss of the last 10 steps: " + ", ".join(f"{k} {v:.6f} ({v / ref:.3f}x {ref_name.split()[0]})"
                                                        for k, v in final.items()))
    print("seconds per step: " + ", ".join(f"{k} {times[k] / args.steps:.4f}" for k in models))


if __name__ == "__main__":
    main()
