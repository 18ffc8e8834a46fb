#!/usr/bin/env python3
"""scalemm and torch._scaled_mm on the same tensors, in one process, interleaved call by call.

run_bench.py measures scalemm (bench_gemm) and PyTorch in two processes, one after the other; a GPU at
its power limit runs the same cuBLASLt kernel at different clocks minutes apart, so cross-process
ratios move by several percent between runs. Here both libraries multiply the very same FP8 tensors
and scale buffers: scalemm through its C ABI (libscalemm_c.so, loaded with ctypes, the way a framework
would load a backend), PyTorch through torch._scaled_mm, on PyTorch's current stream. Calls alternate
torch, scalemm (cuBLASLt's heuristic choice), scalemm (autotuned), with the order rotated every round,
so that clocks and temperature drift cannot favour one of them. Each call is timed with CUDA events
and the host waits for its end event (as torch_anchor.py does); median of --iters. Operand sets are
rotated when one set fits in 2x L2. The heuristic-choice output is compared bit for bit with torch's.

--small-m: blockwise at M <= 256 on three decoding layers, torch on the scale layout it takes and scalemm
on the same buffers ("blockwise") or on the compact grids quantizers write ("blockwise-compact", which
`auto` runs on scalemm's own kernel). A call timed as above includes the host's time to issue it, which
dominates at these sizes; so each call is also timed queued behind a spin kernel (the events then bracket
the GPU's work alone: "device us"), and each library's host time per call is measured over 20 calls
issued behind a long spin ("host us").

    python3 tools/bench/torch_interleaved.py build-gpu/lib/libscalemm_c.so [--small-m] [--json out.json]
"""
import argparse
import ctypes
import json
import statistics
import sys
import time

import torch

from result_file import check_result_path, write_result

E4M3 = torch.float8_e4m3fn
FMAX = 448.0
ANCHORS = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 7168, 2048), (128, 7168, 2048), (2048, 2048, 7168)]
# Decoding layers: DeepSeek-V3 expert down and gate+up, Llama-3-70B qkv (as bench_gemm --small-m).
SMALL_M = [(m, n, k) for (n, k) in ((7168, 2048), (4096, 7168), (10240, 8192)) for m in (1, 16, 64, 128, 256)]
SPIN_CYCLES = 400_000  # about 0.2 ms: longer than any one call's host time here

# include/scalemm/scalemm.h
DTYPE_BF16, DTYPE_E4M3 = 2, 3
RECIPE = {"tensorwise": 1, "rowwise": 2, "block1x128": 3, "block128x128": 4}
FORMAT_COMPACT, FORMAT_CUBLASLT = 0, 1
BACKEND = {"native": 0, "convert-native": 1, "contiguous": 4}
MEMORY_DEVICE = 1


class Operand(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("recipe", ctypes.c_int32),
                ("scale", ctypes.c_void_p), ("scale_format", ctypes.c_int32), ("global_scale", ctypes.c_float)]


class Gemm(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("m", ctypes.c_int64), ("n", ctypes.c_int64),
                ("k", ctypes.c_int64), ("a", Operand), ("b", Operand), ("d", ctypes.c_void_p),
                ("d_dtype", ctypes.c_int32), ("bias", ctypes.c_void_p), ("alpha", ctypes.c_float),
                ("memory_space", ctypes.c_int32), ("d_scale", ctypes.c_void_p), ("d_amax", ctypes.c_void_p)]


class HandleOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("strict", ctypes.c_int32), ("force_backend", ctypes.c_int32),
                ("autotune", ctypes.c_int32)]


class Scalemm:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        L = self.lib
        L.scalemm_version.restype = ctypes.c_char_p
        L.scalemm_last_error_message.restype = ctypes.c_char_p
        L.scalemm_backend_name.restype = ctypes.c_char_p
        L.scalemm_handle_create.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(HandleOptions)]
        L.scalemm_handle_destroy.argtypes = [ctypes.c_void_p]
        L.scalemm_gemm.argtypes = [ctypes.c_void_p, ctypes.POINTER(Gemm), ctypes.c_void_p]
        L.scalemm_plan_explain.argtypes = [ctypes.c_void_p, ctypes.POINTER(Gemm), ctypes.POINTER(ctypes.c_int32),
                                           ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]
        self.version = L.scalemm_version().decode()

    def handle(self, autotune, force=-1):
        opt = HandleOptions(ctypes.sizeof(HandleOptions), 0, force, 2 if autotune else 1)
        h = ctypes.c_void_p()
        self.check(self.lib.scalemm_handle_create(ctypes.byref(h), ctypes.byref(opt)), "scalemm_handle_create")
        return h

    def check(self, status, what):
        if status != 0:
            raise RuntimeError(f"{what}: status {status}: {self.lib.scalemm_last_error_message().decode()}")

    def explain(self, h, g):
        backend = ctypes.c_int32()
        buf = ctypes.create_string_buffer(4096)
        self.check(self.lib.scalemm_plan_explain(h, ctypes.byref(g), ctypes.byref(backend), buf, 4096, None),
                   "scalemm_plan_explain")
        return self.lib.scalemm_backend_name(backend.value).decode(), buf.value.decode()


def operand(data, recipe, scale, fmt):
    return Operand(data.data_ptr(), DTYPE_E4M3, RECIPE[recipe], scale.data_ptr(), fmt, 1.0)


# Scale arguments torch._scaled_mm may accept for 1x128 x 128x128 (its expected layout has changed
# between releases); the first that runs and agrees with scalemm is kept, as in run_bench.py.
BLOCK_VARIANTS = ["a_outer_b_rowmajor_padK4", "a_outer_b_T", "a_outer_b_rowmajor", "a_rowmajor_b_rowmajor_padK4"]


def make_set(recipe, M, N, K, seed, variant=BLOCK_VARIANTS[0]):
    """FP8 operands, the torch call's scale arguments and the scalemm operand descriptors (the same
    buffers on both sides)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, K, device="cuda", generator=g)
    w = torch.randn(N, K, device="cuda", generator=g)
    if recipe == "tensorwise":
        sa, sb = (x.abs().max() / FMAX).float(), (w.abs().max() / FMAX).float()
        xq, wq = (x / sa).to(E4M3), (w / sb).to(E4M3)
        t_args = (sa, sb)
        ops = (operand(xq, "tensorwise", sa, FORMAT_COMPACT), operand(wq, "tensorwise", sb, FORMAT_COMPACT))
        keep = (sa, sb)
    elif recipe == "rowwise":
        sa, sb = (x.abs().amax(1, keepdim=True) / FMAX).float(), (w.abs().amax(1, keepdim=True) / FMAX).float()
        xq, wq = (x / sa).to(E4M3), (w / sb).to(E4M3)
        t_args = (sa, sb.t())
        ops = (operand(xq, "rowwise", sa, FORMAT_COMPACT), operand(wq, "rowwise", sb, FORMAT_COMPACT))
        keep = (sa, sb)
    else:  # blockwise: 1x128 activations x 128x128 weights; torch takes cuBLASLt's scale layout
        kb = K // 128
        xb = x.view(M, kb, 128)
        xs = (xb.abs().amax(-1).clamp(min=1e-12) / FMAX)
        xq = (xb / xs[..., None]).to(E4M3).view(M, K)
        wb = w.view(N // 128, 128, kb, 128)
        ws = (wb.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FMAX)
        wq = (wb / ws[:, None, :, None]).to(E4M3).view(N, K)
        xs_t = xs.t().contiguous()                     # (kb, M): torch's outer-major A scales
        m4 = (M + 3) // 4 * 4
        xs_pad = torch.zeros(kb, m4, device="cuda")    # VEC128: offset kb * roundup(M, 4) + r
        xs_pad[:, :M] = xs_t
        kb4 = (kb + 3) // 4 * 4
        ws_pad = torch.zeros(N // 128, kb4, device="cuda")  # BLK128x128 with the K-block stride padded to 4
        ws_pad[:, :kb] = ws
        t_args = {"a_outer_b_rowmajor_padK4": (xs_t.t(), ws_pad[:, :kb]), "a_outer_b_T": (xs_t.t(), ws.t()),
                  "a_outer_b_rowmajor": (xs_t.t(), ws.contiguous()),
                  "a_rowmajor_b_rowmajor_padK4": (xs.contiguous(), ws_pad[:, :kb])}[variant]
        if recipe == "blockwise-compact":  # the same bytes; scalemm reads the row-major grids quantizers write
            xs_c, ws_c = xs.contiguous(), ws.contiguous()
            ops = (operand(xq, "block1x128", xs_c, FORMAT_COMPACT), operand(wq, "block128x128", ws_c, FORMAT_COMPACT))
        else:
            xs_c = ws_c = None
            ops = (operand(xq, "block1x128", xs_pad, FORMAT_CUBLASLT), operand(wq, "block128x128", ws_pad, FORMAT_CUBLASLT))
        keep = (xs_t, xs_pad, ws_pad, ws, xs, xs_c, ws_c)
    del x, w
    d_smm = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    gemm = Gemm(ctypes.sizeof(Gemm), M, N, K, ops[0], ops[1], d_smm.data_ptr(), DTYPE_BF16, None, 1.0,
                MEMORY_DEVICE, None, None)
    return {"xq": xq, "wq": wq, "t_args": t_args, "keep": keep, "gemm": gemm, "d_torch": None, "d_smm": d_smm}


def held_times(fns, sets, rounds, stream):
    """Median device time per call of each fn: every call queued behind a spin kernel, so that the
    events bracket the GPU's work and not the host's time to issue it. Rotated order, as the main loop."""
    times, c = [[] for _ in fns], 0
    for it in range(rounds):
        for j in range(len(fns)):
            v = (it + j) % len(fns)
            if fns[v] is None:
                continue
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(SPIN_CYCLES)
            e0.record(stream)
            fns[v](sets[c % len(sets)])
            e1.record(stream)
            e1.synchronize()
            c += 1
            times[v].append(e0.elapsed_time(e1) * 1e3)
    return [statistics.median(t) if t else float("nan") for t in times]


def host_times(fns, sets, calls=20, reps=7):
    """Median host microseconds per call of each fn over `calls` calls issued behind a spin that outlasts
    them (so that no call waits for the device)."""
    out = []
    for fn in fns:
        if fn is None:
            out.append(float("nan"))
            continue
        r = []
        for _ in range(reps):
            torch.cuda.synchronize()
            torch.cuda._sleep(SPIN_CYCLES * calls)
            t0 = time.perf_counter()
            for i in range(calls):
                fn(sets[i % len(sets)])
            r.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
        out.append(statistics.median(r))
    return out


def sets_for(set_bytes, l2):
    if set_bytes >= 2 * l2:
        return 1
    return min(16, max(2, -(-3 * l2 // set_bytes)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("lib", help="path to libscalemm_c.so")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--recipes", default="", help="tensorwise,rowwise,blockwise (default), blockwise-compact")
    ap.add_argument("--shapes", default="", help="MxNxK,... (default: the five anchor shapes)")
    ap.add_argument("--small-m", action="store_true",
                    help="blockwise at M <= 256 on three decoding layers (cuBLASLt-layout and compact scales), with "
                         "device and host time per call")
    ap.add_argument("--force", choices=sorted(BACKEND), default=None,
                    help="scalemm's calls forced onto one backend (e.g. contiguous, with --recipes blockwise-compact)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if args.json:
        check_result_path(args.json)  # before the measuring, not after it

    smm = Scalemm(args.lib)
    if args.small_m:
        args.shapes = args.shapes or ",".join(f"{m}x{n}x{k}" for m, n, k in SMALL_M)
    args.recipes = args.recipes or ("blockwise,blockwise-compact" if args.small_m else "tensorwise,rowwise,blockwise")
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s] or ANCHORS
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    stream = torch.cuda.current_stream()
    force = BACKEND[args.force] if args.force else -1
    h_heur, h_auto = smm.handle(False, force), smm.handle(True, force)
    env = {"device": props.name, "torch": torch.__version__, "cuda": torch.version.cuda, "scalemm": smm.version,
           "iters": args.iters, "warm": args.warm, "force": args.force}
    print(f"# torch._scaled_mm vs scalemm (C ABI) interleaved in one process on {props.name}; torch {torch.__version__}, "
          f"scalemm {smm.version}; {args.warm} warm-up rounds, median of {args.iters}")
    extra = " torch device us | scalemm device us | device ratio | torch host us | scalemm host us |" if args.small_m else ""
    print("\n| M | N | K | recipe | sets | torch us | scalemm us | scalemm autotuned us | vs torch | vs torch (autotuned) "
          "| output vs torch | scalemm backend |" + extra)
    print("|---|---|---|---|---|---|---|---|---|---|---|---|" + "---|" * (5 if args.small_m else 0))
    rows = []
    for (M, N, K) in shapes:
        for recipe in args.recipes.split(","):
            row = {"m": M, "n": N, "k": K, "recipe": recipe}
            try:
                variant = BLOCK_VARIANTS[0]
                first = make_set(recipe, M, N, K, 1000)
                if recipe.startswith("blockwise"):  # the scale layout torch accepts: runs and agrees with scalemm
                    smm.check(smm.lib.scalemm_gemm(h_heur, ctypes.byref(first["gemm"]), ctypes.c_void_p(stream.cuda_stream)),
                              "scalemm_gemm")
                    ref, errs, variant = first["d_smm"].float(), {}, None
                    for v in BLOCK_VARIANTS:
                        try:
                            cand = make_set(recipe, M, N, K, 1000, v)
                            out = torch._scaled_mm(cand["xq"], cand["wq"].t(), scale_a=cand["t_args"][0],
                                                   scale_b=cand["t_args"][1], out_dtype=torch.bfloat16).float()
                            rel = ((out - ref).norm() / ref.norm()).item()
                            if rel < 1e-2:
                                variant, first = v, cand
                                break
                            errs[v] = f"relative difference {rel:.2e}"
                        except Exception as e:
                            errs[v] = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
                    if variant is None:
                        why = "torch accepts none of the blockwise scale layouts: " + "; ".join(
                            f"{k}: {v}" for k, v in errs.items())
                        if not args.small_m:
                            raise RuntimeError(why)
                        row["torch_refused"] = why  # scalemm is still timed
                    row["torch_variant"] = variant
                set_bytes = M * K + N * K + 2 * M * N * 2  # FP8 A, B; two bf16 outputs
                nsets = sets_for(set_bytes, l2)
                sets = [first] + [make_set(recipe, M, N, K, 1000 + s, variant or BLOCK_VARIANTS[0]) for s in range(1, nsets)]
                backend, plan = smm.explain(h_heur, first["gemm"])
                row.update(sets=nsets, backend=backend)

                def torch_call(s):  # allocates its output, as in torch_anchor.py
                    return torch._scaled_mm(s["xq"], s["wq"].t(), scale_a=s["t_args"][0], scale_b=s["t_args"][1],
                                            out_dtype=torch.bfloat16)

                def smm_call(h):
                    def f(s):
                        smm.check(smm.lib.scalemm_gemm(h, ctypes.byref(s["gemm"]), ctypes.c_void_p(stream.cuda_stream)),
                                  "scalemm_gemm")
                    return f

                refused = "torch_refused" in row
                fns = [None if refused else torch_call, smm_call(h_heur), smm_call(h_auto)]
                # Bit comparison on the first set, outputs poisoned first (0xFFFF: a bf16 NaN).
                first["d_smm"].view(torch.int16).fill_(-1)
                first["d_torch"] = first["d_smm"] if refused else fns[0](first)
                fns[1](first)
                torch.cuda.synchronize()
                dt, ds = first["d_torch"].float(), first["d_smm"].float()
                if refused:
                    row["output"] = "NaN in scalemm output" if torch.isnan(ds).any() else "torch refuses the call"
                elif torch.isnan(ds).any():
                    row["output"] = "NaN in scalemm output"
                elif torch.equal(first["d_torch"].view(torch.int16), first["d_smm"].view(torch.int16)):
                    row["output"] = "bit-identical"
                else:
                    rel = ((dt - ds).abs().max() / dt.abs().max().clamp(min=1e-30)).item()
                    row["output"] = f"max |diff| / max |torch| = {rel:.2e}"
                times = [[] for _ in fns]
                c = 0
                for it in range(args.warm + args.iters):
                    order = [(it + j) % len(fns) for j in range(len(fns))]
                    for v in order:
                        if fns[v] is None:
                            continue
                        s = sets[c % nsets]
                        c += 1
                        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        e0.record(stream)
                        fns[v](s)
                        e1.record(stream)
                        e1.synchronize()
                        if it >= args.warm:
                            times[v].append(e0.elapsed_time(e1) * 1e3)
                med = [statistics.median(t) if t else float("nan") for t in times]
                row.update(torch_us=med[0], scalemm_us=med[1], scalemm_autotuned_us=med[2],
                           vs_torch=med[0] / med[1], vs_torch_autotuned=med[0] / med[2],
                           torch_tflops=2 * M * N * K / med[0] / 1e6, scalemm_tflops=2 * M * N * K / med[1] / 1e6)
                line = (f"| {M} | {N} | {K} | {recipe} | {nsets} | {med[0]:.1f} | {med[1]:.1f} | {med[2]:.1f} | "
                        f"{row['vs_torch']:.3f} | {row['vs_torch_autotuned']:.3f} | {row['output']} | {backend} |")
                if args.small_m:
                    dev = held_times(fns[:2], sets, args.iters, stream)
                    host = host_times(fns[:2], sets)
                    row.update(torch_device_us=dev[0], scalemm_device_us=dev[1], vs_torch_device=dev[0] / dev[1],
                               torch_host_us=host[0], scalemm_host_us=host[1])
                    line += f" {dev[0]:.1f} | {dev[1]:.1f} | {dev[0] / dev[1]:.3f} | {host[0]:.1f} | {host[1]:.1f} |"
                print(line, flush=True)
                del sets, first
            except Exception as e:  # report the case and go on
                row["error"] = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
                print(f"| {M} | {N} | {K} | {recipe} | - | - | - | - | - | - | SKIPPED: {row['error']} | - |", flush=True)
            rows.append(row)
            torch.cuda.empty_cache()
    ok = [r for r in rows if r.get("vs_torch", float("nan")) == r.get("vs_torch", float("nan"))]
    if ok:
        worst = min(ok, key=lambda r: max(r["vs_torch"], r["vs_torch_autotuned"]))
        print(f"\nworst best-of-two ratio: {max(worst['vs_torch'], worst['vs_torch_autotuned']):.3f} "
              f"({worst['recipe']} {worst['m']}x{worst['n']}x{worst['k']}); "
              f"geometric mean vs torch: heuristic {statistics.geometric_mean([r['vs_torch'] for r in ok]):.3f}, "
              f"autotuned {statistics.geometric_mean([r['vs_torch_autotuned'] for r in ok]):.3f}")
    smm.lib.scalemm_handle_destroy(h_heur)
    smm.lib.scalemm_handle_destroy(h_auto)
    if args.json:
        write_result(args.json, json.dumps({"environment": env, "rows": rows}, indent=1))
    return 0 if ok and all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
