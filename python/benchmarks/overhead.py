"""Host overhead and large-shape time of scalemm.scaled_mm on torch tensors, in one process.

1. Tiny shape (launch-bound): torch._scaled_mm and scalemm.scaled_mm on the same FP8 tensors; per call
   the CPU time (time.perf_counter over a loop, no synchronisation inside) and the device time between
   CUDA events around the same loop. Contract: scalemm's host overhead <= torch._scaled_mm's. The
   blockwise case runs twice: with the scales in cuBLASLt's layout, the inputs torch._scaled_mm itself
   takes (like for like), and with compact scales, which scalemm converts in one extra launch.
   A breakdown of scalemm's call (signature lookup, output allocation, the library call) follows.
2. Large shapes: scalemm.scaled_mm from Python against the same GEMM issued from C++ in a loop
   (Handle::gemm, CUDA events; scalemm._scalemm.Handle.time_gemm) and against torch._scaled_mm.
   The three are sampled in turn (rotating order, after a warm-up that brings the clocks to their
   loaded state), so that clock and power drift falls on all of them alike. Contract: within 2% of
   the C++ call.

    python benchmarks/overhead.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import scalemm
from scalemm import _core


def loop_times(fn, iters: int, reps: int = 5, hold: bool = False):
    """(CPU microseconds per call, device microseconds per call), medians over `reps` loops. hold: a
    1-ms spin kernel goes first, so that the loop's calls queue behind it and the events time the
    device work alone, without the host's time to issue the first call."""
    cpu, dev = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if hold:
            torch.cuda._sleep(2_000_000)
        start.record()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        t1 = time.perf_counter()
        stop.record()
        stop.synchronize()
        cpu.append((t1 - t0) / iters * 1e6)
        dev.append(start.elapsed_time(stop) / iters * 1e3)
    return statistics.median(cpu), statistics.median(dev)


def interleaved(fns: dict, iters: int, rounds: int = 11) -> dict:
    """Median CPU and device us per call of each function, their loops taken in turn round by round
    (rotating order), so that drift in the host's speed falls on all of them alike."""
    names = list(fns)
    cpu = {n: [] for n in names}
    dev = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            c, d = loop_times(fns[n], iters, reps=1)
            cpu[n].append(c)
            dev[n].append(d)
    return {n: (statistics.median(cpu[n]), statistics.median(dev[n])) for n in names}


def operands(m, n, k, ra, rb):
    x = torch.randn(m, k, device="cuda")
    w = torch.randn(n, k, device="cuda")
    xq, xs = scalemm.quantize(x, ra)
    wq, ws = scalemm.quantize(w, rb)
    return xq, wq, xs, ws


def torch_args(ra, rb, xq, wq, xs, ws):
    n = wq.shape[0]
    if ra == "rowwise":
        return xs, ws.reshape(1, n)
    if ra == "block1x128":
        return xs.t().contiguous().t(), ws.t()
    return xs, ws


def breakdown(iters: int) -> dict:
    """CPU time of the parts of one eager scalemm.scaled_mm call: the whole call, the output allocation
    (torch.empty) and the prepared library call on a preallocated output; the rest is the signature
    lookup in Python."""
    from scalemm.torch import _runtime, ops

    m = n = k = 128
    xq, wq, xs, ws = operands(m, n, k, "block1x128", "block128x128")
    call = lambda: scalemm.scaled_mm(xq, wq, xs, ws, recipe_a="block1x128", recipe_b="block128x128")  # noqa: E731
    ops._prepared.clear()
    call()
    (run, shape, dtype, device, index), = ops._prepared.values()
    d = torch.empty(shape, dtype=dtype, device=device)
    stream = _runtime._stream(index)
    parts = {
        "whole call": call,
        "output allocation (torch.empty)": lambda: torch.empty(shape, dtype=dtype, device=device),
        "current stream": lambda: _runtime._stream(index),
        "library call (Prepared.run)": lambda: run(xq.data_ptr(), xs.data_ptr(), wq.data_ptr(), ws.data_ptr(),
                                                   d.data_ptr(), 0, stream),
    }
    for fn in parts.values():
        for _ in range(20):
            fn()
    out = {name: cpu for name, (cpu, _dev) in interleaved(parts, iters).items()}
    out["the rest (signature lookup, addresses)"] = (out["whole call"] - out["output allocation (torch.empty)"] -
                                                     out["current stream"] - out["library call (Prepared.run)"])
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    p.add_argument("--iters", type=int, default=200)
    args = p.parse_args()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, scalemm {scalemm.__version__}")
    print(f"scalemm plans for: {scalemm.device()}")
    results = {"tiny": [], "large": []}

    print("\n== host overhead, tiny shape (median of 11 loops of", args.iters, "calls, torch and scalemm in turn) ==")
    print(f"{'case':<44} {'torch cpu us':>13} {'scalemm cpu us':>15} {'torch dev us':>13} {'scalemm dev us':>15}  verdict")
    for ra, rb, (m, n, k), fmt in [("tensorwise", "tensorwise", (16, 16, 32), "compact"),
                                   ("rowwise", "rowwise", (16, 16, 32), "compact"),
                                   ("block1x128", "block128x128", (128, 128, 128), "cublaslt"),
                                   ("block1x128", "block128x128", (128, 128, 128), "compact")]:
        xq, wq, xs, ws = operands(m, n, k, ra, rb)
        tsa, tsb = torch_args(ra, rb, xq, wq, xs, ws)
        wt = wq.t()
        if fmt == "cublaslt":
            xs = scalemm.layouts.to_cublaslt(xs, ra, m, k)
            ws = scalemm.layouts.to_cublaslt(ws, rb, n, k)

        def t_call():
            torch._scaled_mm(xq, wt, scale_a=tsa, scale_b=tsb, out_dtype=torch.bfloat16)

        def s_call():
            scalemm.scaled_mm(xq, wq, xs, ws, recipe_a=ra, recipe_b=rb, scale_format=fmt)

        for _ in range(20):
            s_call()
        try:
            for _ in range(20):
                t_call()
            times = interleaved({"torch": t_call, "scalemm": s_call}, args.iters)
            (tc, td), (sc, sd) = times["torch"], times["scalemm"]
        except Exception as e:  # noqa: BLE001
            tc = td = float("nan")
            print(f"  torch._scaled_mm refuses {ra} x {rb} {m}x{n}x{k}: {str(e).splitlines()[0][:100]}")
            sc, sd = loop_times(s_call, args.iters)
        verdict = "n/a" if tc != tc else ("PASS" if sc <= tc else "FAIL (scalemm slower on the host)")
        name = f"{ra} x {rb} {m}x{n}x{k}" + (f" ({fmt})" if ra.startswith("block") else "")
        print(f"{name:<44} {tc:>13.2f} {sc:>15.2f} {td:>13.2f} {sd:>15.2f}  {verdict}")
        results["tiny"].append(dict(case=name, torch_cpu_us=tc, scalemm_cpu_us=sc, torch_dev_us=td,
                                    scalemm_dev_us=sd, verdict=verdict))

    print("\n== where scalemm's host time goes (blockwise 128x128x128, compact scales; CPU us per call) ==")
    results["breakdown"] = breakdown(args.iters)
    for key, value in results["breakdown"].items():
        print(f"  {key:<40} {value:8.2f}")

    print("\n== large shapes: Python call vs the C++ call (CUDA events, ms per GEMM) ==")
    print(f"{'case':<44} {'C++ ms':>9} {'python ms':>10} {'diff':>7} {'torch ms':>9}  verdict")
    for ra, rb, (m, n, k) in [("tensorwise", "tensorwise", (8192, 8192, 8192)),
                              ("block1x128", "block128x128", (8192, 8192, 8192)),
                              ("block1x128", "block128x128", (4096, 7168, 2048)),
                              ("mxfp8", "mxfp8-32x32", (4096, 4096, 4096))]:
        xq, wq, xs, ws = operands(m, n, k, ra, rb)
        d = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        iters = 40
        va, mm, nn, kk, op_a, op_b, _bias, _keep = _core.gemm_inputs(xq, wq, xs, ws, ra, rb, "compact", None,
                                                                       None, None)
        h = _core.handle("auto")
        stream = torch.cuda.current_stream().cuda_stream
        tsa, tsb = torch_args(ra, rb, xq, wq, xs, ws)
        wt = wq.t()

        def s_call():
            scalemm.scaled_mm(xq, wq, xs, ws, recipe_a=ra, recipe_b=rb)

        def t_call():
            torch._scaled_mm(xq, wt, scale_a=tsa, scale_b=tsb, out_dtype=torch.bfloat16)

        try:
            t_call()
        except Exception:  # noqa: BLE001
            t_call = None
        samplers = {
            "cpp": lambda: (torch.cuda.synchronize(), torch.cuda._sleep(2_000_000),
                            h.time_gemm(mm, nn, kk, op_a, op_b, d.data_ptr(), 2, 0, 1.0, stream, iters))[-1],
            "python": lambda: loop_times(s_call, iters, reps=1, hold=True)[1] / 1e3,
        }
        if t_call is not None:
            samplers["torch"] = lambda: loop_times(t_call, iters, reps=1, hold=True)[1] / 1e3
        warm_end = time.perf_counter() + 2.0  # loaded clocks before the first sample
        while time.perf_counter() < warm_end:
            for _ in range(10):
                s_call()
            torch.cuda.synchronize()
        samples = {key: [] for key in samplers}
        order = list(samplers)
        for rep in range(9):
            for key in order[rep % len(order):] + order[:rep % len(order)]:
                samples[key].append(samplers[key]())
        cpp, py = statistics.median(samples["cpp"]), statistics.median(samples["python"])
        tt = statistics.median(samples["torch"]) if "torch" in samples else float("nan")
        diff = (py - cpp) / cpp
        verdict = "PASS" if diff <= 0.02 else "FAIL (more than 2% slower than C++)"
        name = f"{ra} x {rb} {m}x{n}x{k}"
        print(f"{name:<44} {cpp:>9.4f} {py:>10.4f} {diff * 100:>6.2f}% {tt:>9.4f}  {verdict}")
        results["large"].append(dict(case=name, cpp_ms=cpp, python_ms=py, diff=diff, torch_ms=tt, verdict=verdict,
                                    samples=samples))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
