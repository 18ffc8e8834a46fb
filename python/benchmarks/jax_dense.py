"""scalemm.jax against JAX's own paths, in one process on one device.

  gemm   a jitted scalemm.jax.scaled_mm at M=N=K (default 8192), blockwise (1x128 x 128x128) and
         tensorwise, against the C++ Handle::gemm time of the same call (CUDA events, from C++; needs
         torch on the GPU to build the operands)
  dense  one Dense layer forward + backward (tokens x in -> out, default 8192 x 4096 -> 14336) from a
         fixed output gradient: flax.linen.Dense in bf16, with Flax's nn.Fp8DotGeneralOp, and with
         scalemm.jax.fp8_dot_general (blockwise and the other recipes); whether an FP8 type is left in
         each compiled program
  train  a jitted Flax MLP training step (up, GELU, down; optax adamw), bf16 against FP8

Timing: jax.block_until_ready after `--iters` back-to-back calls (dispatch is asynchronous, so the
host's per-call time hides behind the device's), 3 warm-up calls after compilation, the median of
`--reps` repetitions ("wall"). The gemm suite also gives the device's time per call from JAX's profiler
over `--iters` back-to-back calls ("device"), the quantity the C++ side's CUDA events measure.

    python benchmarks/jax_dense.py [--suite gemm,dense,train] [--size 8192] [--tokens 8192 --din 4096
                                   --dout 14336] [--recipes blockwise,rowwise,tensorwise,mxfp8] [--json out.json]
    python benchmarks/jax_dense.py --profile 5 --hlo DIR   each case's kernels per call, and its compiled
                                                    program's text
    python benchmarks/jax_dense.py --small          a quick run at small sizes (any device; the host
                                                    emulator on a CPU)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import scalemm.jax as sj
from _jax_profile import kernel_table, print_table

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))


def bench(f, *args, iters=20, reps=7):
    jax.block_until_ready(f(*args))  # compile
    for _ in range(3):
        jax.block_until_ready(f(*args))
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(iters):
            out = f(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t) / iters * 1e3)
    return statistics.median(times)


def report(a, name, f, *args):
    """--profile: the kernels of one call; --hlo DIR: the compiled program's text."""
    if a.profile:
        print_table(name, kernel_table(f, *args, calls=a.profile))
    if a.hlo:
        os.makedirs(a.hlo, exist_ok=True)
        with open(os.path.join(a.hlo, name.replace("/", "_") + ".txt"), "w") as fh:
            fh.write(f.lower(*args).compile().as_text())


def has_fp8(compiled_text: str) -> bool:
    return any(t in compiled_text for t in ("f8e4m3", "f8e5m2"))


def cpp_gemm_ms(size, ra, rb, iters):
    """Handle::gemm of the same call timed from C++ (CUDA events), or None without torch CUDA."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
    except ImportError:
        return None
    import scalemm.torch as st
    from scalemm import _core
    from scalemm._arrays import DTYPE_CODE

    x = torch.randn(size, size, device="cuda")
    (qa, sa), (qb, sb) = st.quantize(x, ra), st.quantize(x, rb)
    _, m, n, k, op_a, op_b, _, _ = _core.gemm_inputs(qa, qb, sa, sb, ra, rb, "compact", None, None, None)
    d = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    return _core.handle("auto").time_gemm(m, n, k, op_a, op_b, d.data_ptr(), DTYPE_CODE["bf16"], 0, 1.0, stream, iters)


def suite_gemm(a, out):
    s = a.size
    x = jax.random.normal(jax.random.key(0), (s, s), jnp.float32)
    for ra, rb in (("block1x128", "block128x128"), ("tensorwise", "tensorwise")):
        (qa, sa), (qb, sb) = sj.quantize(x, ra), sj.quantize(x, rb)
        f = jax.jit(lambda a, b, sa, sb, ra=ra, rb=rb: sj.scaled_mm(a, b, sa, sb, recipe_a=ra, recipe_b=rb))
        ms = bench(f, qa, qb, sa, sb, iters=a.iters, reps=a.reps)
        # The device's time per call over back-to-back jitted calls (the profiler's span: first kernel's start
        # to last kernel's end, gaps between calls included), what the C++ CUDA events measure; three rounds
        # alternating with the C++ timing (the clocks drift by several percent over a run), medians.
        devs, cpps = [], []
        for _ in range(3):
            devs.append(kernel_table(f, qa, qb, sa, sb, calls=a.iters)[2] / 1e3)
            cpps.append(cpp_gemm_ms(s, ra, rb, a.iters) if jax.default_backend() == "gpu" else None)
        dev = statistics.median(devs) or None
        cpp = statistics.median(cpps) if None not in cpps else None
        tf = 2 * s ** 3 / (dev or ms) / 1e9
        ratio = f"  C++ Handle::gemm {cpp:.3f} ms, jit/C++ {dev / cpp:.3f} (device), {ms / cpp:.3f} (wall)" \
            if cpp and dev else ""
        print(f"gemm {s}^3 {ra} x {rb}: jit {ms:.3f} ms wall, {dev or float('nan'):.3f} ms device "
              f"({tf:.0f} TF/s){ratio}")
        out[f"gemm/{ra}"] = {"ms": ms, "device_ms": dev, "tflops": tf, "cpp_ms": cpp}
        report(a, f"gemm/{ra}", f, qa, qb, sa, sb)


def suite_dense(a, out):
    import flax.linen as nn

    m, kin, kout = a.tokens, a.din, a.dout
    flops = 3 * 2 * m * kin * kout
    key = jax.random.key(1)
    x = jax.random.normal(key, (m, kin), jnp.bfloat16)
    g = jax.random.normal(jax.random.fold_in(key, 1), (m, kout), jnp.bfloat16)
    layers = {"bf16": nn.Dense(kout, use_bias=False, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)}
    if hasattr(nn, "Fp8DotGeneralOp"):
        layers["flax-fp8"] = nn.Dense(kout, use_bias=False, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16,
                                      dot_general_cls=nn.Fp8DotGeneralOp)
    for r in a.recipes:
        layers[f"scalemm-{r}"] = nn.Dense(kout, use_bias=False, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16,
                                          dot_general=sj.fp8_dot_general(r))
    base = None
    for name, layer in layers.items():
        params = layer.init(jax.random.key(2), x)

        def fwd_bwd(p, x, g, layer=layer):
            y, vjp = jax.vjp(lambda p, x: layer.apply(p, x), p, x)
            return y, vjp(g)  # y returned: without it XLA drops the forward GEMM

        f = jax.jit(fwd_bwd)
        fp8 = has_fp8(f.lower(params, x, g).compile().as_text())
        ms = bench(f, params, x, g, iters=a.iters, reps=a.reps)
        base = base or ms
        print(f"dense {m}x{kin}->{kout} fwd+bwd {name:20s} {ms:8.3f} ms {flops / ms / 1e9:7.0f} TF/s "
              f"{base / ms:5.2f}x bf16  FP8 in program: {fp8}")
        out[f"dense/{name}"] = {"ms": ms, "tflops": flops / ms / 1e9, "speedup": base / ms, "fp8_in_program": fp8}
        report(a, f"dense/{name}", f, params, x, g)


def suite_train(a, out):
    import optax
    from train_flax import MLP

    m, d, f = a.tokens, a.din, a.dout
    flops = 2 * 3 * 2 * m * d * f
    x = jax.random.normal(jax.random.key(3), (m, d), jnp.bfloat16)
    y = jax.random.normal(jax.random.key(4), (m, d), jnp.float32)
    base = None
    for name, recipe in [("bf16", None)] + [(r, r) for r in a.recipes[:1]]:
        model = MLP(d, f, recipe, jnp.bfloat16)
        params = model.init(jax.random.key(5), x[:1])
        opt = optax.adamw(1e-4)
        state = opt.init(params)

        @jax.jit
        def step(p, s, x, y, model=model, opt=opt):
            loss, gr = jax.value_and_grad(lambda p: jnp.mean((model.apply(p, x).astype(jnp.float32) - y) ** 2))(p)
            upd, s = opt.update(gr, s, p)
            return optax.apply_updates(p, upd), s, loss

        ms = bench(lambda p, s: step(p, s, x, y), params, state, iters=a.iters, reps=a.reps)
        base = base or ms
        print(f"train step MLP {m}x{d}x{f} adamw {name:12s} {ms:8.3f} ms {flops / ms / 1e9:7.0f} TF/s "
              f"{base / ms:5.2f}x bf16")
        out[f"train/{name}"] = {"ms": ms, "speedup": base / ms}
        report(a, f"train/{name}", step, params, state, x, y)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="gemm,dense,train")
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--din", type=int, default=4096)
    ap.add_argument("--dout", type=int, default=14336)
    ap.add_argument("--recipes", default="blockwise,rowwise,tensorwise,mxfp8")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--small", action="store_true", help="small sizes, few repetitions (a smoke run)")
    ap.add_argument("--json")
    ap.add_argument("--profile", type=int, default=0, metavar="CALLS",
                    help="print each case's kernels over CALLS calls (JAX's profiler)")
    ap.add_argument("--hlo", metavar="DIR", help="write each case's compiled program to DIR")
    a = ap.parse_args()
    a.recipes = [r for r in a.recipes.split(",") if r]
    if a.small:
        a.size, a.tokens, a.din, a.dout, a.iters, a.reps = 256, 256, 128, 256, 2, 2
    print(f"device: {jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}")
    out = {"device": jax.devices()[0].device_kind, "jax": jax.__version__}
    for s in a.suite.split(","):
        {"gemm": suite_gemm, "dense": suite_dense, "train": suite_train}[s](a, out)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
