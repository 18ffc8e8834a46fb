"""Trains a small byte-level transformer language model on text every machine has, the Python standard
library's own .py sources, once in bf16 and once per FP8 recipe through scalemm.torch.convert_to_float8,
from the same initial weights on the same batches, and compares the loss curves.

    python examples/train_lm.py                                # GPU: 1000 steps each, bf16 blockwise rowwise mxfp8
    python examples/train_lm.py --steps 200 --recipes bf16,blockwise --json lm.json
    python examples/train_lm.py --plot lm.json lm.png          # matplotlib; no GPU needed

Model: 6 pre-norm blocks, d 1024, 16 heads, SwiGLU MLP (f 2816), causal attention through SDPA, byte
vocabulary (256), untied embedding and head (both stay bf16: 256-wide layers are below FP8's break-even);
AdamW (lr 6e-4, cosine to 10%, 50 warm-up steps), batch 16 x 512 bytes. The text: every .py file under
the standard library's directory, concatenated in sorted order (several MB on any CPython install); the
last 5% are held out and the final line reports the held-out loss too.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import sysconfig
import time

RECIPES = ["bf16", "blockwise", "rowwise", "mxfp8"]


def corpus(limit_mb: float = 64.0) -> bytes:
    root = sysconfig.get_paths()["stdlib"]
    parts, total = [], 0
    for dirpath, dirnames, files in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "__pycache__"))
        for f in sorted(files):
            if f.endswith(".py"):
                with open(os.path.join(dirpath, f), "rb") as fh:
                    b = fh.read()
                parts.append(b)
                total += len(b)
                if total > limit_mb * 2**20:
                    return b"\n".join(parts)
    return b"\n".join(parts)


def build(torch, d=1024, layers=6, heads=16, f=2816):
    import torch.nn.functional as F

    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = nn.RMSNorm(d), nn.RMSNorm(d)
            self.qkv, self.o = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
            self.gate, self.up, self.down = (nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False),
                                             nn.Linear(f, d, bias=False))

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.n1(x)).view(b, s, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
            h = self.n2(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(256, d)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.norm = nn.RMSNorm(d)
            self.head = nn.Linear(d, 256, bias=False)

        def forward(self, tokens):
            return self.head(self.norm(self.blocks(self.embed(tokens))))

    torch.manual_seed(0)
    return LM()


def train(torch, model, data, args, label):
    import torch.nn.functional as F

    n = len(data)
    split = int(n * 0.95)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps))))
    gen = torch.Generator().manual_seed(args.seed)  # the same batches for every recipe
    losses, t0 = [], time.time()
    for step in range(args.steps):
        idx = torch.randint(0, split - args.seq - 1, (args.batch,), generator=gen)
        chunk = torch.stack([data[i:i + args.seq + 1] for i in idx]).cuda().long()
        logits = model(chunk[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, 256), chunk[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % max(1, args.steps // 50) == 0 or step == args.steps - 1:
            done = (step + 1) / args.steps
            bar = "#" * int(30 * done) + "." * (30 - int(30 * done))
            print(f"\r{label:<10} [{bar}] step {step + 1}/{args.steps} loss {losses[-1]:.4f} "
                  f"({time.time() - t0:.0f} s)", end="", flush=True)
    print()
    model.eval()
    held, g2 = [], torch.Generator().manual_seed(12345)
    with torch.no_grad():
        for _ in range(8):
            idx = torch.randint(split, n - args.seq - 1, (args.batch,), generator=g2)
            chunk = torch.stack([data[i:i + args.seq + 1] for i in idx]).cuda().long()
            held.append(F.cross_entropy(model(chunk[:, :-1]).float().reshape(-1, 256), chunk[:, 1:].reshape(-1)).item())
    return losses, sum(held) / len(held), time.time() - t0


def plot(path, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = json.load(open(path))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, r in res["runs"].items():
        l = r["losses"]
        w = 20  # moving average over 20 steps
        sm = [sum(l[max(0, i - w + 1):i + 1]) / len(l[max(0, i - w + 1):i + 1]) for i in range(len(l))]
        ax.plot(range(1, len(sm) + 1), sm, label=f"{name} (final {r['final']:.3f}, held-out {r['held_out']:.3f})")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats/byte, 20-step average)")
    ax.set_ylim(top=min(3.0, ax.get_ylim()[1]))
    ax.set_title(f"byte-level LM on the Python stdlib, {res['device']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", nargs=2, metavar=("JSON", "PNG"))
    args = ap.parse_args()
    if args.plot:
        return plot(*args.plot)
    import torch

    import scalemm.torch as st

    if not torch.cuda.is_available():
        print("train_lm.py: needs a CUDA device (the FP8 layers run on the GPU)")
        return 1
    text = corpus()
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    print(f"corpus: {len(text) / 2**20:.1f} MB of .py sources from {sysconfig.get_paths()['stdlib']}; "
          f"seed {args.seed}; {args.steps} steps of {args.batch} x {args.seq} bytes; {torch.cuda.get_device_name()}")
    base = build(torch).cuda().to(torch.bfloat16)
    runs = {}
    for recipe in args.recipes.split(","):
        model = copy.deepcopy(base)
        if recipe != "bf16":
            # The 256-wide head stays bf16 (far below FP8's break-even); the embedding is no nn.Linear.
            st.convert_to_float8(model, recipe=recipe, module_filter=lambda fqn, m: fqn != "head")
        losses, held, secs = train(torch, model, data, args, recipe)
        final = sum(losses[-50:]) / len(losses[-50:])
        runs[recipe] = dict(losses=losses, final=final, held_out=held, seconds=secs)
        del model
        torch.cuda.empty_cache()
    ref = runs.get("bf16")
    print(f"{'recipe':<10} {'final loss':>10} {'held-out':>9} {'vs bf16':>8} {'s':>6}  (final: mean of the last 50 steps)")
    for name, r in runs.items():
        rel = f"{(r['final'] / ref['final'] - 1) * 100:+.2f}%" if ref else "-"
        print(f"{name:<10} {r['final']:10.4f} {r['held_out']:9.4f} {rel:>8} {r['seconds']:6.0f}")
    if args.json:
        json.dump({"device": torch.cuda.get_device_name(), "steps": args.steps, "runs": runs}, open(args.json, "w"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
