"""Training steps in bf16 and in FP8 through scalemm, in one process on one GPU.

Suites (each model built once per recipe from the same bf16 weights; FP8 through convert_to_float8):
  mlp     MLP blocks (up, GELU, down; bias-free) at tokens x d x f: 8192x4096x14336, 16384x7168x2048,
          4096x2048x8192
  block   a Llama-3-8B-sized transformer block: d 4096, f 14336 (SwiGLU), 32 heads (8 KV heads), sequence
          2048, batch 4; RMSNorm and attention (SDPA, causal) in bf16, every projection converted
  moe     a DeepSeek-V3-like MoE block: d 7168, 16 experts of f 2048 (SwiGLU), top-4 of 8192 tokens with
          uneven routing; experts in Float8GroupedExperts against bf16 torch._grouped_mm
Recipe "blockwise-mlp": the MLP (mlp) or the block's gated MLP (block) as one Float8MLP, GELU or SwiGLU
fused into the quantizers (the block's other projections blockwise Float8Linear).
A step is forward + backward (from a fixed output gradient) + an SGD update (so FP8 weights are
requantized every step, as in training). CUDA-event median of --steps steps after 3 warm-up steps; peak
memory over the timed steps (torch.cuda.max_memory_allocated, parameters and inputs included). Modes:
eager, compiled (torch.compile), reduce-overhead (torch.compile's CUDA-graph trees for forward and
backward; the optimizer eager), graphed (the whole step captured in one CUDA graph and replayed: the
device-bound speed, with no host time; models that read routing on the host cannot be captured).

    python benchmarks/training.py [--suite mlp,block,moe] [--recipes bf16,blockwise,rowwise,tensorwise,mxfp8]
                                  [--modes eager,compiled,reduce-overhead,graphed] [--steps 20] [--json out.json]
    python benchmarks/training.py --profile [--suite mlp]   kernel-by-kernel breakdown of one step
    python benchmarks/training.py --plot out.json plot.png  (matplotlib; no GPU needed)
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import statistics
import sys

from _timing import event_times, profiled
from models import MLP_SHAPES, build

RECIPES = ["bf16", "blockwise", "rowwise", "tensorwise", "mxfp8", "blockwise-mlp"]


def convert(torch, model, suite, recipe):
    """A converted copy of `model`; "RECIPE@compact" keeps compact scale grids (Float8Linear.scale_format),
    "RECIPE+auto" converts with module_filter="auto"."""
    import scalemm.torch as st

    recipe, _, fmt = recipe.partition("@")
    recipe, auto, _ = recipe.partition("+auto")
    model = copy.deepcopy(model)
    if recipe == "bf16":
        return model
    if recipe == "blockwise-mlp":  # the MLP in one Float8MLP (activation fused into the quantizers)
        if suite == "mlp":
            return st.Float8MLP.from_linears(model.up, model.down, activation="gelu_tanh")
        if suite != "block":
            return None
        mlp = model.mlp
        model.mlp = st.Float8MLP.from_linears(mlp.up, mlp.down, gate=mlp.gate, activation="swiglu")
        return st.convert_to_float8(model, recipe="blockwise")  # q, k, v, o
    if suite == "moe":
        if recipe != "blockwise":
            return None  # Float8GroupedExperts runs blockwise
        return model.to_fp8(model)  # the router (d x 16) stays bf16
    model = st.convert_to_float8(model, recipe=recipe, module_filter="auto" if auto else None)
    if fmt:
        for m in model.modules():
            if isinstance(m, st.Float8Linear):
                m.scale_format = fmt
    return model


def warm_step(torch, model, make_input, mode="eager"):
    """The step every mode times: forward, backward from a fixed output gradient (so no loss kernels
    run), an SGD update; run three times to warm up. Returns (step, x). Mode "compiled" runs the model
    through torch.compile; "graphed" captures the whole step in one CUDA graph after the warm-up (on
    the capture stream) and the step is its replay: no host time at all, the device-bound speed."""
    x = make_input().requires_grad_()
    fn = torch.compile(model) if mode == "compiled" else \
        torch.compile(model, mode="reduce-overhead") if mode == "reduce-overhead" else model
    opt = torch.optim.SGD(model.parameters(), lr=1e-6, foreach=True)
    with torch.no_grad():
        g = torch.randn_like(model(x)) * 1e-3

    def step():
        if mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's graph outputs are done with
        fn(x).backward(g)
        opt.step()
        opt.zero_grad(set_to_none=True)
        x.grad = None

    if mode != "graphed":
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        return step, x
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):  # gradients written fresh by every replay, then applied
        fn(x).backward(g)
        opt.step()
    graph.replay()
    torch.cuda.synchronize()
    return graph.replay, x


def time_steps(torch, model, make_input, steps, mode):
    """(median ms, peak GiB, tokens). The peak is over the timed steps, and for the modes that replay
    CUDA graphs over the warm-up and the capture as well (a graph's memory pool is taken then, not
    during replays)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    step, x = warm_step(torch, model, make_input, mode)
    if mode not in ("graphed", "reduce-overhead"):
        torch.cuda.reset_peak_memory_stats()
    times = event_times(torch, step, steps)
    return statistics.median(times), torch.cuda.max_memory_allocated() / 2**30, x.numel() // x.shape[-1]


def _annotation(name):
    """A user annotation on the device timeline (Optimizer.step#SGD.step), not a kernel: kernels carry
    '#' only inside their template arguments ({lambda()#1})."""
    return "#" in name.split("<")[0]


def profile(torch, suites, recipes, mode="eager"):
    """One step under torch.profiler (in `mode`: the first of --modes): device time per kernel class and
    the host gap, per model."""

    def kind(name):
        n = name.lower()
        if any(s in n for s in ("gemm", "sm90_xmma", "cutlass", "nvjet", "wgmma", "matmul")):
            return "GEMM"
        if "quant" in n or "rc1d" in n or "rc2d" in n or "row_direct" in n or "amax" in n:
            return "quantize"
        if "scale" in n and "layout" in n or "convert" in n:
            return "scale layout"
        if "flash" in n or "fmha" in n or "attention" in n:
            return "attention"
        if "memcpy" in n or "memset" in n or "copy" in n or "fill" in n or "zero" in n:
            return "copy/fill"
        return "elementwise/other"

    rows = []
    for suite, shape in suites:
        base, make_input = build(torch, suite, shape)
        base = base.cuda().to(torch.bfloat16)
        for recipe in recipes:
            model = convert(torch, base, suite, recipe)
            if model is None:
                continue
            torch._dynamo.reset()
            step, _ = warm_step(torch, model, make_input, mode)
            step_ms, p = profiled(torch, step)
            per = collections.defaultdict(lambda: [0.0, 0])
            names = collections.defaultdict(lambda: [0.0, 0])
            for ev in p.events():
                if ev.device_type.name != "CUDA" or _annotation(ev.name):
                    continue
                t = ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
                k = kind(ev.name)
                per[k][0] += t / 1e3
                per[k][1] += 1
                names[(k, ev.name[:90])][0] += t / 1e3
                names[(k, ev.name[:90])][1] += 1
            # CUDA runtime and driver calls on the host, by total time: a blocking one (a synchronisation,
            # a synchronous copy, an allocation) shows up here as the cause of device idle time.
            api = collections.defaultdict(lambda: [0.0, 0])
            for ev in p.events():
                if ev.device_type.name == "CPU" and (ev.name.startswith("cuda") or ev.name.startswith("cu")) \
                        and not ev.name.startswith("cutlass"):
                    api[ev.name][0] += ev.cpu_time_total / 1e3
                    api[ev.name][1] += 1
            syncs = {k: f"{v[0]:.3f} ms x{v[1]}" for k, v in sorted(api.items(), key=lambda kv: -kv[1][0])[:6]}
            busy = sum(v[0] for v in per.values())
            label = f"{suite} {'x'.join(map(str, shape)) if shape else ''} {recipe} {mode}".replace("  ", " ")
            print(f"\n== {label}: step {step_ms:.3f} ms, kernels {busy:.3f} ms, idle {step_ms - busy:.3f} ms")
            print(f"   host CUDA API calls (top by time): {syncs or 'none recorded'}")
            for k, (t, n) in sorted(per.items(), key=lambda kv: -kv[1][0]):
                print(f"   {k:<18} {t:8.3f} ms  {n:4d} launches  {100 * t / step_ms:5.1f}%")
            for (k, n), (t, c) in sorted(names.items(), key=lambda kv: -kv[1][0])[:12]:
                print(f"      {t:8.3f} ms x{c:<3d} [{k}] {n}")
            # Where the device waits: the largest gaps between consecutive kernels, with their neighbours.
            ks = sorted((ev for ev in p.events() if ev.device_type.name == "CUDA" and not _annotation(ev.name)),
                        key=lambda ev: ev.time_range.start)
            gaps = sorted(((b.time_range.start - a.time_range.end, a.name[:50], b.name[:50])
                           for a, b in zip(ks, ks[1:])), reverse=True)[:4]
            for gap, a, b in gaps:
                print(f"      gap {gap / 1e3:7.3f} ms after {a} before {b}")
            rows.append(dict(suite=suite, shape=shape, recipe=recipe, step_ms=step_ms, busy_ms=busy,
                             classes={k: v[0] for k, v in per.items()}))
    return rows


def host_profile(torch, shape, recipes, steps=5):
    """Host (CPU) time to enqueue one step while the GPU is kept busy (so nothing waits for it), and
    the Python functions that take it (cProfile, by own time)."""
    import cProfile
    import pstats
    import time

    base, make_input = build(torch, "mlp", shape)
    base = base.cuda().to(torch.bfloat16)
    for recipe in recipes:
        model = convert(torch, base, "mlp", recipe)
        step, _ = warm_step(torch, model, make_input)
        torch.cuda._sleep(1_000_000_000)  # about half a second of GPU time: the queue never drains
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        host = (time.perf_counter() - t0) / steps * 1e3
        torch.cuda.synchronize()
        pr = cProfile.Profile()
        torch.cuda._sleep(1_000_000_000)
        pr.enable()
        for _ in range(steps):
            step()
        pr.disable()
        torch.cuda.synchronize()
        print(f"\n== host: mlp {'x'.join(map(str, shape))} {recipe}: {host:.3f} ms to enqueue a step "
              f"(forward, backward, SGD)")
        st = pstats.Stats(pr)
        st.sort_stats("tottime").print_stats(18)


def plot(path, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = json.load(open(path))["rows"]
    cases = list(dict.fromkeys(r["case"] for r in rows))
    recipes = [r for r in RECIPES if r != "bf16" and any(x["recipe"] == r for x in rows)]
    modes = [m for m in ("eager", "compiled", "reduce-overhead", "graphed") if any(r.get("mode") == m for r in rows)]
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes) + 1, 4.5), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, mode in zip(axes, modes):
        for i, rec in enumerate(recipes):
            ys = []
            for c in cases:
                base = next((r for r in rows if r["case"] == c and r["recipe"] == "bf16" and r["mode"] == mode), None)
                me = next((r for r in rows if r["case"] == c and r["recipe"] == rec and r["mode"] == mode), None)
                ys.append(base["ms"] / me["ms"] if base and me and "ms" in me else 0)
            ax.bar([j + i * 0.8 / len(recipes) for j in range(len(cases))], ys, 0.8 / len(recipes), label=rec)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks([j + 0.4 - 0.4 / len(recipes) for j in range(len(cases))])
        ax.set_xticklabels(cases, rotation=20, ha="right", fontsize=8)
        ax.set_title(f"{mode}: speedup over bf16 (step time)")
    axes[0].set_ylabel("bf16 time / FP8 time")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", default="mlp,block,moe")
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--modes", default="eager,compiled")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--mlp-shapes", default=None, help="e.g. 8192x4096x14336,4096x2048x8192")
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--host", action="store_true", help="host time per step and its Python breakdown (mlp shapes)")
    ap.add_argument("--plot", nargs=2, metavar=("JSON", "PNG"))
    args = ap.parse_args()
    if args.plot:
        return plot(*args.plot)
    import torch

    if not torch.cuda.is_available():
        print("training.py: skipped: no CUDA device")
        return 0
    shapes = MLP_SHAPES if not args.mlp_shapes else [tuple(int(v) for v in s.split("x"))
                                                      for s in args.mlp_shapes.split(",")]
    suites = []
    for s in args.suite.split(","):
        suites += [("mlp", sh) for sh in shapes] if s == "mlp" else [(s, None)]
    recipes = args.recipes.split(",")
    dev = torch.cuda.get_device_name()
    print(f"training.py on {dev}, torch {torch.__version__}")
    if args.host:
        for sh in shapes:
            host_profile(torch, sh, recipes)
        return 0
    if args.profile:
        rows = profile(torch, suites, recipes, args.modes.split(",")[0])
        if args.json:
            json.dump({"device": dev, "profile": rows}, open(args.json, "w"), indent=1)
        return 0
    rows = []
    print(f"{'case':<28} {'recipe':<11} {'mode':<15} {'ms/step':>8} {'tokens/s':>12} {'peak GiB':>9} {'vs bf16':>8}")
    for suite, shape in suites:
        base, make_input = build(torch, suite, shape)
        base = base.cuda().to(torch.bfloat16)
        case = f"mlp {shape[0]}x{shape[1]}x{shape[2]}" if suite == "mlp" else \
            ("llama3-8b block" if suite == "block" else "moe 16x top4 d7168")
        for mode in args.modes.split(","):
            ref = None
            for recipe in recipes:
                model = convert(torch, base, suite, recipe)
                if model is None:
                    continue
                torch._dynamo.reset()
                try:
                    ms, peak, tokens = time_steps(torch, model, make_input, args.steps, mode)
                except Exception as e:  # a recipe that fails here is reported, not hidden
                    print(f"{case:<28} {recipe:<11} {mode:<15} FAILED: {type(e).__name__}: {str(e)[:200]}")
                    rows.append(dict(case=case, recipe=recipe, mode=mode, error=str(e)[:500]))
                    continue
                if recipe == "bf16":
                    ref = ms
                sp = ref / ms if ref else float("nan")
                print(f"{case:<28} {recipe:<11} {mode:<15} {ms:8.3f} {tokens / ms * 1e3:12.0f} {peak:9.2f} {sp:7.2f}x",
                      flush=True)
                rows.append(dict(case=case, recipe=recipe, mode=mode, ms=ms, tokens_per_s=tokens / ms * 1e3,
                                 peak_gib=peak, speedup=sp))
                del model
                torch.cuda.empty_cache()
    if args.json:
        json.dump({"device": dev, "torch": torch.__version__, "steps": args.steps, "rows": rows},
                  open(args.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
