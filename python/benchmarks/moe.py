"""transformers' MoE experts in bf16 (its grouped_mm) against scalemm's FP8 experts, in one process on one GPU.

Suites:
  layer   one experts call (transformers' experts module, its own parameters), forward + backward from a fixed
          output gradient, at
            dsv3     DeepSeek-V3's expert shape: 32768 routed rows (16384 tokens, top-2), 8 experts, I 2048, H 7168
            mixtral  Mixtral-8x7B: 8 experts, top-2, H 4096, I 14336, 4096 tokens
            qwen3    Qwen3-30B-A3B: 128 experts, top-8, H 2048, I 768, 4096 tokens
          routing: k distinct experts per token, uniformly at random (balanced on average)
  model   MixtralForCausalLM and Qwen3MoeForCausalLM at their real widths, 2 layers, random init, 2 x 2048 tokens:
          forward, loss, backward and a fused AdamW step
  loss    a small Mixtral LM (2 layers, h 512, 8 experts top-2) trained --loss-steps (200) AdamW steps on fresh
          bigram-chain batches from the same initial weights: the last ten steps' mean loss against bf16's
Recipes: bf16 (experts_implementation="grouped_mm", nn.Linear in bf16); "R" (convert_to_float8(model, recipe=R):
the experts and every eligible nn.Linear in FP8); "R-experts" (only the experts: set_experts_implementation);
"R+auto" (convert_to_float8(..., module_filter="auto")). R is each recipe scalemm's experts engine runs
(mxfp8 only when --recipes names it, on a GPU where its experts run the emulation).
CUDA-event median of --steps steps after 3 warm-up steps; peak memory over the timed steps
(torch.cuda.max_memory_allocated: parameters, gradients, optimizer state and inputs included). Modes: eager,
compiled (torch.compile of the model or layer), graphed (the step captured in one CUDA graph after the
warm-up and replayed: forward, backward and, for models, the capturable fused AdamW; where a model's code
cannot be captured the row says what stopped it).

    python benchmarks/moe.py [--suite layer,model] [--cases dsv3,mixtral,qwen3] [--recipes bf16,blockwise,...]
                             [--modes eager,compiled,graphed] [--steps 20] [--json out.json]
    python benchmarks/moe.py --suite loss [--loss-steps 200]     the 200-step loss check
    python benchmarks/moe.py --plot out.json moe.png             the speed-ups of a --json file (no GPU)
    python benchmarks/moe.py --profile [--cases mixtral] [--modes compiled]   kernel-by-kernel breakdown of one
                                                           MoE layer step (router + experts, forward + backward;
                                                           eager, or in the first of --modes)
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import statistics
import sys

from _timing import event_times, profiled

LAYERS = {  # name: (model type, experts, top-k, hidden, intermediate, tokens)
    "dsv3": ("deepseek_v3", 8, 2, 7168, 2048, 16384),
    "mixtral": ("mixtral", 8, 2, 4096, 14336, 4096),
    "qwen3": ("qwen3_moe", 128, 8, 2048, 768, 4096),
}
MODELS = {"mixtral": "MixtralForCausalLM 2 layers", "qwen3": "Qwen3MoeForCausalLM 2 layers"}
BATCH, SEQ = 2, 2048
DEVICE = "cuda"  # where the builders put models and inputs


def config(tf, kind, experts, top_k, hidden, inter, layers=2):
    common = dict(num_hidden_layers=layers, hidden_size=hidden, num_experts_per_tok=top_k)
    if kind == "mixtral":
        return tf.MixtralConfig(**common, intermediate_size=inter, num_local_experts=experts)
    if kind == "qwen3_moe":
        return tf.Qwen3MoeConfig(**common, moe_intermediate_size=inter, num_experts=experts, head_dim=128)
    return tf.DeepseekV3Config(**common, moe_intermediate_size=inter, n_routed_experts=experts, n_group=1,
                               topk_group=1, first_k_dense_replace=0)


def experts_module(torch, tf, case):
    """(experts module, inputs) for one layer case: the model type's own experts class, bf16 on the GPU."""
    kind, e, k, h, i, t = LAYERS[case]
    cfg = config(tf, kind, e, k, h, i, layers=1)
    cfg._experts_implementation = "grouped_mm"
    mod = {"mixtral": tf.models.mixtral.modeling_mixtral.MixtralExperts,
           "qwen3_moe": tf.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeExperts,
           "deepseek_v3": tf.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3Experts}[kind]
    g = torch.Generator(device=DEVICE).manual_seed(0)
    with torch.device(DEVICE):
        m = mod(cfg).to(torch.bfloat16)
        with torch.no_grad():
            for p in m.parameters():
                p.normal_(0, p.shape[-1] ** -0.5, generator=g)
        x = torch.randn(t, h, dtype=torch.bfloat16, generator=g)
        idx = torch.rand(t, e, generator=g).topk(k, dim=-1).indices
        w = torch.softmax(torch.randn(t, k, generator=g), -1).to(torch.bfloat16)
        dy = torch.randn(t, h, dtype=torch.bfloat16, generator=g)
    return m, (x, idx, w, dy), 3 * 2 * t * k * 3 * h * i


def causal_lm(torch, tf, case):
    if case == "mixtral":
        cfg = config(tf, "mixtral", 8, 2, 4096, 14336)
    else:
        cfg = config(tf, "qwen3_moe", 128, 8, 2048, 768)
    torch.manual_seed(0)
    with torch.device(DEVICE):
        m = tf.AutoModelForCausalLM.from_config(cfg, experts_implementation="grouped_mm", dtype=torch.bfloat16)
    ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ), device=DEVICE,
                        generator=torch.Generator(DEVICE).manual_seed(1))
    return m, ids


def apply_recipe(st, model, recipe):
    """The model (a copy) in `recipe`; None where it does not apply."""
    name, auto, _ = recipe.partition("+auto")
    name, only, _ = name.partition("-experts")
    if name == "bf16":
        return model
    if hasattr(model, "set_experts_implementation") and only:
        model.set_experts_implementation(f"scalemm_{name}")
        return model
    if only:  # a bare experts module
        model.config._experts_implementation = f"scalemm_{name}"
        return model
    return st.convert_to_float8(model, recipe=name, module_filter="auto" if auto else None)


def timed(torch, step, steps):
    """(median ms, peak GiB) of `steps` calls of step() after 3 warm-up calls."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = event_times(torch, step, steps)
    return statistics.median(times), torch.cuda.max_memory_allocated() / 2**30


def graphed(torch, clear, body):
    """body() captured in one CUDA graph after three warm-up steps on the capture stream, gradients cleared
    before each (so the graph writes them fresh on every replay); the step is the graph's replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            clear()
            body()
        clear()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        body()
    graph.replay()
    torch.cuda.synchronize()
    return graph.replay


def layer_step(torch, m, inputs, mode):
    x, idx, w, dy = inputs
    x = x.detach().requires_grad_()
    w = w.detach().requires_grad_()
    fn = torch.compile(m) if mode == "compiled" else m

    def clear():
        x.grad = w.grad = None
        for p in m.parameters():
            p.grad = None

    def body():
        fn(x, idx, w).backward(dy)

    if mode == "graphed":
        return graphed(torch, clear, body)

    def step():
        clear()
        body()

    return step


def model_step(torch, m, ids, mode):
    fn = torch.compile(m) if mode == "compiled" else m
    # capturable: the fused AdamW keeps its step count on the device, which a graph replay needs
    opt = torch.optim.AdamW(m.parameters(), lr=1e-5, fused=True, capturable=mode == "graphed")

    def body():
        fn(input_ids=ids, labels=ids).loss.backward()
        opt.step()

    if mode == "graphed":
        return graphed(torch, lambda: opt.zero_grad(set_to_none=True), body)

    def step():
        body()
        opt.zero_grad(set_to_none=True)

    return step


def run_suites(torch, tf, st, args, recipes):
    rows = []
    print(f"{'case':<34} {'recipe':<20} {'mode':<9} {'ms':>8} {'TFLOP/s':>8} {'tokens/s':>10} {'peak GiB':>9} "
          f"{'vs bf16':>8}")
    for suite in args.suite.split(","):
        for case in args.cases.split(","):
            if suite == "model" and case not in MODELS:
                continue
            for mode in args.modes.split(","):
                ref = None
                for recipe in recipes:
                    if suite == "layer" and "-experts" in recipe:  # the same as the recipe for a bare module
                        continue
                    torch._dynamo.reset()
                    torch.cuda.empty_cache()
                    if suite == "layer":
                        base, inputs, flop = experts_module(torch, tf, case)
                        label = f"layer {case} " + "x".join(map(str, LAYERS[case][1:]))
                        tokens = inputs[0].shape[0]
                    else:
                        base, ids = causal_lm(torch, tf, case)
                        label, flop, tokens = MODELS[case], None, ids.numel()
                    try:
                        m = apply_recipe(st, base, recipe)
                        step = layer_step(torch, m, inputs, mode) if suite == "layer" else \
                            model_step(torch, m, ids, mode)
                        ms, peak = timed(torch, step, args.steps)
                    except Exception as e:  # a recipe that fails here is reported, not hidden
                        print(f"{label:<34} {recipe:<20} {mode:<9} FAILED: {type(e).__name__}: {str(e)[:300]}")
                        rows.append(dict(suite=suite, case=case, recipe=recipe, mode=mode, error=str(e)[:800]))
                        continue
                    status = sorted({str(st.hf_experts.experts_status(x)) for x in m.modules()
                                     if st.hf_experts.is_experts(x)})
                    ref = ms if recipe == "bf16" else ref
                    sp = ref / ms if ref else float("nan")
                    tf_s = flop / ms / 1e9 if flop else float("nan")
                    print(f"{label:<34} {recipe:<20} {mode:<9} {ms:8.3f} {tf_s:8.0f} {tokens / ms * 1e3:10.0f} "
                          f"{peak:9.2f} {sp:7.2f}x  {status if recipe != 'bf16' else ''}", flush=True)
                    rows.append(dict(suite=suite, case=case, label=label, recipe=recipe, mode=mode, ms=ms,
                                     tflops=tf_s if flop else None, tokens_per_s=tokens / ms * 1e3, peak_gib=peak,
                                     speedup=sp, experts=status))
                    m = base = step = None  # free the model before the next one is built
    return rows


def bigram_batches(torch, vocab, batches, batch, seq, seed=3):
    """Token batches from a fixed random bigram chain (each token followed by one of four successors), so a
    small LM's loss falls from log(vocab) towards the chain's entropy, log(4) = 1.386, within a few hundred
    steps."""
    g = torch.Generator().manual_seed(seed)
    succ = torch.randint(0, vocab, (vocab, 4), generator=g)
    out = []
    for _ in range(batches):
        t = torch.empty(batch, seq, dtype=torch.long)
        t[:, 0] = torch.randint(0, vocab, (batch,), generator=g)
        for j in range(1, seq):
            t[:, j] = succ[t[:, j - 1], torch.randint(0, 4, (batch,), generator=g)]
        out.append(t.to(DEVICE))
    return out


def loss_run(torch, tf, st, recipes, steps):
    """A small Mixtral LM (2 layers, h 512, 8 experts top-2, i 1792, vocab 2048) trained `steps` AdamW steps
    on the same fresh bigram batches from the same initial weights, bf16 against each recipe: the loss curve and
    the last ten steps' mean loss against bf16's."""
    cfg = tf.MixtralConfig(num_hidden_layers=2, hidden_size=512, intermediate_size=1792, num_local_experts=8,
                           num_experts_per_tok=2, num_attention_heads=8, num_key_value_heads=4, vocab_size=2048,
                           max_position_embeddings=512)
    data = bigram_batches(torch, cfg.vocab_size, steps, 8, 256)  # a fresh batch every step: no memorizing
    torch.manual_seed(0)
    with torch.device(DEVICE):
        init = tf.AutoModelForCausalLM.from_config(cfg, experts_implementation="grouped_mm", dtype=torch.bfloat16)
    rows, ref = [], None
    for recipe in recipes:
        m = apply_recipe(st, copy.deepcopy(init), recipe)  # each recipe trains its own copy of the same weights
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, fused=True)
        losses = []
        for i in range(steps):
            loss = m(input_ids=data[i % len(data)], labels=data[i % len(data)]).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.detach())
        losses = [float(v) for v in torch.stack(losses).cpu()]
        last = statistics.mean(losses[-10:])
        ref = last if recipe == "bf16" else ref
        rel = (last - ref) / ref if ref else float("nan")
        print(f"loss {steps} steps {recipe:<16} first {losses[0]:.4f}  last-10 mean {last:.4f}  "
              f"vs bf16 {100 * rel:+.2f}%", flush=True)
        rows.append(dict(suite="loss", recipe=recipe, steps=steps, losses=losses, final=last, rel_to_bf16=rel))
        m = opt = None
    return rows


def plot(path, out):
    """Speed-up over bf16 per case and mode from a --json file (matplotlib; no GPU needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.load(open(path))
    rows = [r for r in data["rows"] if "ms" in r]
    cases = list(dict.fromkeys(f"{r['suite']} {r['case']}" for r in rows))
    recipes = [x for x in dict.fromkeys(r["recipe"] for r in rows) if x != "bf16"]
    modes = [m for m in ("eager", "compiled", "graphed") if any(r["mode"] == m for r in rows)]
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes) + 1, 4.5), sharey=True, squeeze=False)
    for ax, mode in zip(axes[0], modes):
        for i, rec in enumerate(recipes):
            ys = [next((r["speedup"] for r in rows if f"{r['suite']} {r['case']}" == c and r["recipe"] == rec
                        and r["mode"] == mode), 0) for c in cases]
            ax.bar([j + i * 0.8 / len(recipes) for j in range(len(cases))], ys, 0.8 / len(recipes), label=rec)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks([j + 0.4 - 0.4 / len(recipes) for j in range(len(cases))])
        ax.set_xticklabels(cases, rotation=20, ha="right", fontsize=8)
        ax.set_title(f"{mode}: speed-up over bf16 grouped_mm")
    axes[0][0].set_ylabel("bf16 time / FP8 time")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"MoE training steps, {data.get('device', '')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def kind_of(name):
    """The part of an MoE layer step a kernel belongs to, from its name."""
    n = name.lower()
    table = [
        ("GEMM", ("gemm", "sm90_xmma", "cutlass", "nvjet", "wgmma", "matmul", "grouped_mm", "contiguous_grouped")),
        ("combine", ("combine_kernel", "weight_grad_kernel", "reduce", "sum_", "index_add")),
        ("routing", ("topk", "softmax", "moe::", "histc", "histogram", "cumsum", "scan", "searchsorted", "scatter")),
        ("sort", ("sort", "radix")),
        ("quantize", ("quant", "amax", "rc1d", "rc2d", "row_direct", "transpose_fp8", "transpose_bytes")),
        ("gather", ("gather", "index", "take")),
        ("activation", ("silu", "sigmoid", "gelu", "clamp", "mul", "add")),
        ("padding/copy/fill", ("memcpy", "memset", "copy", "fill", "zero", "cat", "pad")),
    ]
    for kind, keys in table:
        if any(k in n for k in keys):
            return kind
    return "other"


def profile(torch, tf, st, cases, recipes, mode="eager"):
    """One MoE layer step (router + experts, forward + backward) under torch.profiler: device time per part
    of the step, the launches, the largest gaps, and the idle time (step - kernels)."""

    out = []
    for case in cases:
        kind, e, k, h, i, t = LAYERS[case]
        for recipe in recipes:
            cfg = config(tf, kind, e, k, h, i, layers=1)
            torch.manual_seed(0)
            with torch.device("cuda"):
                lm = tf.AutoModelForCausalLM.from_config(cfg, experts_implementation="grouped_mm",
                                                         dtype=torch.bfloat16)
            lm = apply_recipe(st, lm, recipe if recipe == "bf16" else f"{recipe}-experts")
            block = lm.model.layers[0].mlp
            fn = torch.compile(block) if mode == "compiled" else block
            x = torch.randn(1, t, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            dy = torch.randn(1, t, h, device="cuda", dtype=torch.bfloat16)

            def step():  # gradients cleared as an optimizer's zero_grad(set_to_none=True) would
                x.grad = None
                for q in block.parameters():
                    q.grad = None
                o = fn(x)
                (o[0] if isinstance(o, tuple) else o).backward(dy)

            for _ in range(3):
                step()
            torch.cuda.synchronize()
            step_ms, p = profiled(torch, step)
            kernels = sorted((ev for ev in p.events() if ev.device_type.name == "CUDA"
                              and "#" not in ev.name.split("<")[0]), key=lambda ev: ev.time_range.start)
            per, names = collections.defaultdict(lambda: [0.0, 0]), collections.defaultdict(lambda: [0.0, 0])
            for ev in kernels:
                ms = (ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total) / 1e3
                kd = kind_of(ev.name)
                per[kd][0] += ms
                per[kd][1] += 1
                names[(kd, ev.name[:90])][0] += ms
                names[(kd, ev.name[:90])][1] += 1
            busy = sum(v[0] for v in per.values())
            print(f"\n== MoE layer {case} ({kind}: {e} experts top-{k}, H {h}, I {i}, {t} tokens) {recipe} {mode}: "
                  f"step {step_ms:.3f} ms, kernels {busy:.3f} ms, idle {step_ms - busy:.3f} ms")
            for kd, (ms, n) in sorted(per.items(), key=lambda kv: -kv[1][0]):
                print(f"   {kd:<18} {ms:8.3f} ms  {n:4d} launches  {100 * ms / step_ms:5.1f}%")
            for (kd, n), (ms, c) in sorted(names.items(), key=lambda kv: -kv[1][0])[:14]:
                print(f"      {ms:8.3f} ms x{c:<3d} [{kd}] {n}")
            gaps = sorted(((b2.time_range.start - a2.time_range.end) / 1e3, a2.name[:50], b2.name[:50])
                          for a2, b2 in zip(kernels, kernels[1:]))[-4:]
            for gap, a2, b2 in reversed(gaps):
                print(f"      gap {gap:7.3f} ms after {a2} before {b2}")
            out.append(dict(case=case, recipe=recipe, step_ms=step_ms, busy_ms=busy,
                            parts={kd: v[0] for kd, v in per.items()},
                            launches={kd: v[1] for kd, v in per.items()}))
            lm = block = None
            torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", default="layer,model")
    ap.add_argument("--cases", default="dsv3,mixtral,qwen3")
    ap.add_argument("--recipes", default=None, help="default: bf16 and, per engine recipe R, R, R-experts, R+auto")
    ap.add_argument("--modes", default="eager")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--loss-steps", type=int, default=200, help="steps of the loss suite")
    ap.add_argument("--plot", nargs=2, metavar=("JSON", "PNG"), help="plot a --json file's speed-ups and exit")
    args = ap.parse_args()
    if args.plot:
        plot(*args.plot)
        return 0
    import torch

    if not torch.cuda.is_available():
        print("moe.py: skipped: no CUDA device")
        return 0
    import transformers as tf

    import scalemm
    import scalemm.torch as st

    runs = st.hf_experts.registered()
    # By default, the recipes "auto" would convert (hf_experts.AUTO_SLOWER): on Hopper mxfp8's experts run the
    # exact emulation, minutes per step at these shapes; name it in --recipes to time it anyway.
    slow = ["mxfp8"] if "mxfp8" in runs and st.hf_experts._auto_reason("mxfp8") else []
    if slow and not args.recipes:
        print(f"moe.py: {', '.join(slow)} left out by default ({st.hf_experts._auto_reason(slow[0])}); "
              "--recipes names it to time it")
    recipes = args.recipes.split(",") if args.recipes else \
        ["bf16"] + [v for r in runs if r not in slow for v in (r, f"{r}-experts", f"{r}+auto")]
    dev = torch.cuda.get_device_name()
    print(f"moe.py on {dev}, torch {torch.__version__}, transformers {tf.__version__}, scalemm {scalemm.__version__}; "
          f"scalemm experts: {', '.join(runs)}")
    meta = {"device": dev, "torch": torch.__version__, "transformers": tf.__version__, "steps": args.steps}
    if args.profile:
        rows = profile(torch, tf, st, args.cases.split(","), [r for r in recipes if "+" not in r
                                                             and "-" not in r], args.modes.split(",")[0])
        meta["profile"] = rows
    else:
        suites = args.suite.split(",")
        if any(x != "loss" for x in suites):
            args.suite = ",".join(x for x in suites if x != "loss")
            meta["rows"] = run_suites(torch, tf, st, args, recipes)
        if "loss" in suites:
            meta["loss"] = loss_run(torch, tf, st, [r for r in recipes if "-experts" not in r and "+" not in r],
                                    args.loss_steps)
    if args.json:
        json.dump(meta, open(args.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
