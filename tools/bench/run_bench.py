#!/usr/bin/env python3
"""GEMM benchmark driver for the GPU machine: scalemm (bench_gemm) and the PyTorch anchors, one run, one GPU.

    python3 tools/bench/run_bench.py BUILD/tools/bench/bench_gemm OUTDIR [--quick] [--iters N] [--no-torch]

1. Runs the C++ benchmark (BENCH_EXE --json OUTDIR/bench_gemm.json), echoing and saving its Markdown
   (OUTDIR/bench_gemm.md). It measures scalemm vs raw cuBLASLt, the emulated recipes vs BF16, the host
   time per call, the verify-mode overhead and the reference emulator, with same-run ceilings.
2. Then, in this process on the same GPU, the PyTorch anchors on exactly the shapes the C++ run
   measured, with the same method (CUDA events per call, the host waiting for each call's end event,
   5 warm-ups, median of N, operand sets rotated when one set fits in 2x L2, random normal data):
   torch.matmul bf16, torch._scaled_mm tensorwise, rowwise and blockwise (1x128 x 128x128, in the
   scale layouts that give the expected SQNR against an fp32 reference), host time per call of a tiny
   _scaled_mm, and (full run) torch._scaled_grouped_mm / _grouped_mm on the grouped anchor shapes.
3. Merges everything into OUTDIR/results.json and OUTDIR/results.md (ratios scalemm/torch next to the
   absolute numbers) and, when matplotlib is importable, PNG plots OUTDIR/tflops_<recipe>.png.

Everything fits the 10-minute limit of the GPU machine: the C++ run gets --bench-timeout seconds (default
420, quick 150) and the torch part stops starting new shapes at --deadline seconds after start (default 560).
"""
import argparse
import datetime
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time

from result_file import write_result

T0 = time.monotonic()
REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def log(msg):
    print(f"[run_bench {time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def shapes(quick):
    """The C++ benchmark's shape list (used when its JSON is missing)."""
    if quick:
        return [("anchor", 4096, 4096, 4096), ("anchor", 8192, 8192, 8192), ("anchor", 16384, 7168, 2048),
                ("anchor", 128, 7168, 2048), ("anchor", 2048, 2048, 7168),
                ("dsv3 expert down", 1, 7168, 2048), ("dsv3 expert down", 16, 7168, 2048)]
    v = [("anchor", 4096, 4096, 4096), ("anchor", 8192, 8192, 8192), ("anchor", 16384, 7168, 2048),
         ("anchor", 128, 7168, 2048), ("anchor", 2048, 2048, 7168)]
    layers = [("dsv3 expert gate+up", 4096, 7168), ("dsv3 expert down", 7168, 2048), ("dsv3 attn out", 7168, 16384),
              ("llama3-70b qkv", 10240, 8192), ("llama3-70b mlp down", 8192, 28672)]
    for label, n, k in layers:
        for m in (1, 16, 128, 4096, 16384):
            if not any(s[1] == m and s[2] == n and s[3] == k for s in v):
                v.append((label, m, n, k))
    return v


def environment():
    env = {"date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    commit = os.environ.get("COMMIT")
    if not commit:
        try:
            commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True, timeout=10).stdout.strip() or None
            dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            if commit and dirty:
                commit += " (+local changes)"
        except Exception:
            commit = None
    env["commit"] = commit or "unknown"
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
        env["nvidia_smi"] = q.splitlines()[0] if q else None
        env["driver"] = q.split(",")[1].strip() if q else None
    except Exception as e:
        env["nvidia_smi"] = f"unavailable: {e}"
    try:
        env["nvcc"] = subprocess.run(["nvcc", "--version"], capture_output=True, text=True,
                                     timeout=20).stdout.strip().splitlines()[-1]
    except Exception:
        env["nvcc"] = None
    return env


def run_cpp(exe, outdir, quick, iters, timeout, autotune):
    json_path = os.path.join(outdir, "bench_gemm.json")
    md_path = os.path.join(outdir, "bench_gemm.md")
    if os.path.exists(json_path):
        os.remove(json_path)
    cmd = [exe, "--json", json_path] + (["--quick"] if quick else []) + (["--iters", str(iters)] if iters else []) \
        + (["--autotune"] if autotune else [])
    log("running " + " ".join(cmd))
    status = "ok"
    t = time.monotonic()
    try:
        with open(md_path, "w") as md:
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                 start_new_session=True)
            fired = threading.Event()

            def watchdog():  # ends the benchmark's own process group (it and any child it started)
                fired.set()
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    p.kill()

            timer = threading.Timer(timeout, watchdog)  # also ends a run that hangs without printing
            timer.start()
            try:
                for line in p.stdout:
                    md.write(line)
                    sys.stdout.write(line)
                    sys.stdout.flush()
                rc = p.wait()
            finally:
                timer.cancel()
            if fired.is_set():
                status = f"killed after {timeout:.0f} s (partial results kept)"
            elif rc != 0:
                status = f"exit {rc}"
    except OSError as e:
        status = f"could not run: {e}"
    log(f"bench_gemm: {status} in {time.monotonic() - t:.0f} s")
    data = None
    if os.path.exists(json_path):
        try:
            with open(json_path) as f:
                data = json.load(f)
        except Exception as e:
            status += f"; JSON unreadable: {e}"
    return data, status


# ---------------------------------------------------------------------------------------------------
# PyTorch anchors (torch imported only after the C++ run, so it holds no GPU memory during it)

def torch_anchors(cpp, quick, iters, deadline, outdir):
    import torch

    res = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "dense": [], "host": [], "grouped": [],
           "notes": []}
    if not torch.cuda.is_available():
        res["error"] = "torch sees no CUDA device"
        return res
    dev = "cuda"
    res["gpu"] = torch.cuda.get_device_name()
    if cpp and cpp.get("device", {}).get("name") and cpp["device"]["name"] != res["gpu"]:
        res["notes"].append(f"torch device {res['gpu']} differs from bench_gemm's {cpp['device']['name']}")
    l2 = (cpp or {}).get("device", {}).get("l2_bytes") or torch.cuda.get_device_properties(0).L2_cache_size
    E4M3 = torch.float8_e4m3fn
    FMAX = 448.0
    WARM = 5
    torch.backends.cuda.matmul.allow_tf32 = False

    def sets_for(set_bytes):
        if set_bytes >= 2 * l2:
            return 1
        return int(min(16, -(-3 * l2 // set_bytes)))

    def bench(fns):
        """Median microseconds; events per call, host waits for each (as torch_anchor.py); rotation."""
        for i in range(WARM):
            fns[i % len(fns)]()
        torch.cuda.synchronize()
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        ts = []
        for i in range(iters):
            f = fns[i % len(fns)]
            s.record()
            f()
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e) * 1e3)
        ts.sort()
        return ts[len(ts) // 2]

    def sqnr(ref, x):
        ref = ref.float()
        x = x.float()
        d = (ref - x).norm()
        return float("inf") if d == 0 else (20 * torch.log10(ref.norm() / d)).item()

    def quant_rows_1x128(x):
        R_, K = x.shape
        xb = x.view(R_, K // 128, 128)
        s = xb.abs().amax(-1).clamp(min=1e-12) / FMAX
        return (xb / s[..., None]).to(E4M3).view(R_, K), s

    def quant_128x128(w):
        N, K = w.shape
        wb = w.view(N // 128, 128, K // 128, 128)
        s = wb.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FMAX
        return (wb / s[:, None, :, None]).to(E4M3).view(N, K), s

    def deq_1x128(q, s):
        R_, K = q.shape
        return (q.float().view(R_, K // 128, 128) * s[..., None]).view(R_, K)

    def deq_128x128(q, s):
        N, K = q.shape
        return (q.float().view(N // 128, 128, K // 128, 128) * s[:, None, :, None]).view(N, K)

    def blk_variants(xs1, ws2, K, N):
        xs1_outer = xs1.t().contiguous().t()  # (M, K/128) with strides (1, M)
        kb = K // 128
        kb4 = (kb + 3) // 4 * 4
        ws2_pad = torch.zeros(N // 128, kb4, device=dev)
        ws2_pad[:, :kb] = ws2
        return [("a_outer_b_rowmajor_padK4", xs1_outer, ws2_pad[:, :kb]),
                ("a_outer_b_rowmajor", xs1_outer, ws2.contiguous()),
                ("a_outer_b_T", xs1_outer, ws2.t()),
                ("a_rowmajor_b_rowmajor_padK4", xs1.contiguous(), ws2_pad[:, :kb])]

    # Shapes exactly as the C++ run measured them (same order).
    sh = []
    if cpp and cpp.get("gemm"):
        for r in cpp["gemm"]:
            key = (r["shape"], r["m"], r["n"], r["k"])
            if key not in sh:
                sh.append(key)
    if not sh:
        sh = shapes(quick)

    blk_variant = None  # the first variant that works is kept for later shapes
    for (label, M, N, K) in sh:
        if time.monotonic() > deadline:
            res["notes"].append(f"deadline reached: torch anchors not measured from {label} {M}x{N}x{K} on")
            break
        row = {"shape": label, "m": M, "n": N, "k": K}
        flops = 2.0 * M * N * K
        tf = lambda us: flops / (us * 1e-6) / 1e12
        try:
            torch.manual_seed(0)
            # bf16
            nb = sets_for((M + N) * K * 2 + M * N * 2)
            xs = [torch.randn(M, K, device=dev, dtype=torch.bfloat16) for _ in range(nb)]
            ws = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) for _ in range(nb)]
            us = bench([lambda x=x, w=w: x @ w.t() for x, w in zip(xs, ws)])
            row["bf16_us"], row["bf16_tflops"] = us, tf(us)
            del xs, ws
            # FP8 sets: one f32 source per set, quantized per recipe.
            n8 = sets_for((M + N) * K + M * N * 2 + (M + N) * (K // 128) * 4)
            src = [(torch.randn(M, K, device=dev), torch.randn(N, K, device=dev)) for _ in range(n8)]
            try:
                fns = []
                for x, w in src:
                    sa = (x.abs().max() / FMAX).float()
                    sb = (w.abs().max() / FMAX).float()
                    xq, wq = (x / sa).to(E4M3), (w / sb).to(E4M3)
                    fns.append(lambda xq=xq, wq=wq, sa=sa, sb=sb: torch._scaled_mm(
                        xq, wq.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16))
                us = bench(fns)
                row["tensorwise_us"], row["tensorwise_tflops"] = us, tf(us)
            except Exception as e:
                row["tensorwise_err"] = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
            try:
                fns = []
                for x, w in src:
                    sa = (x.abs().amax(1, keepdim=True) / FMAX).float()
                    sb = (w.abs().amax(1, keepdim=True) / FMAX).float()
                    xq, wq = (x / sa).to(E4M3), (w / sb).to(E4M3)
                    fns.append(lambda xq=xq, wq=wq, sa=sa, sb=sb: torch._scaled_mm(
                        xq, wq.t(), scale_a=sa, scale_b=sb.t(), out_dtype=torch.bfloat16))
                us = bench(fns)
                row["rowwise_us"], row["rowwise_tflops"] = us, tf(us)
            except Exception as e:
                row["rowwise_err"] = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
            try:
                qs = []
                for x, w in src:
                    xq1, xs1 = quant_rows_1x128(x)
                    wq2, ws2 = quant_128x128(w)
                    qs.append((xq1, xs1, wq2, ws2))
                # Pick the scale layout torch accepts, checked against an fp32 reference on a few rows.
                xq1, xs1, wq2, ws2 = qs[0]
                r0 = min(M, 256)
                ref = deq_1x128(xq1[:r0], xs1[:r0]) @ deq_128x128(wq2, ws2).t()
                chosen, errs = None, {}
                order = blk_variants(xs1, ws2, K, N)
                if blk_variant:
                    order.sort(key=lambda v: v[0] != blk_variant)
                for name, A_s, B_s in order:
                    try:
                        out = torch._scaled_mm(xq1, wq2.t(), scale_a=A_s, scale_b=B_s, out_dtype=torch.bfloat16)
                        q = sqnr(ref, out[:r0])
                        if q > 30:
                            chosen = name
                            row["blockwise_sqnr_db"] = round(min(q, 999.0), 1)
                            break
                        errs[name] = f"SQNR {q:.1f} dB"
                    except Exception as e:
                        errs[name] = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
                del ref
                if chosen is None:
                    row["blockwise_err"] = "; ".join(f"{k}: {v}" for k, v in errs.items())[:600]
                else:
                    blk_variant = chosen
                    row["blockwise_variant"] = chosen
                    fns = []
                    for (xq1, xs1, wq2, ws2) in qs:
                        A_s, B_s = next((a, b) for n_, a, b in blk_variants(xs1, ws2, K, N) if n_ == chosen)
                        fns.append(lambda xq1=xq1, wq2=wq2, A_s=A_s, B_s=B_s: torch._scaled_mm(
                            xq1, wq2.t(), scale_a=A_s, scale_b=B_s, out_dtype=torch.bfloat16))
                    us = bench(fns)
                    row["blockwise_us"], row["blockwise_tflops"] = us, tf(us)
                del qs
            except Exception as e:
                row["blockwise_err"] = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
            del src
        except Exception as e:
            row["error"] = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
        torch.cuda.empty_cache()
        res["dense"].append(row)
        log("torch " + json.dumps({k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items()}))
        write_result(os.path.join(outdir, "torch_anchors.json"), json.dumps(res, indent=1))

    # Which cuBLASLt torch loaded (it may differ from the one bench_gemm links).
    try:
        import ctypes
        with open("/proc/self/maps") as f:
            libs = sorted({ln.split()[-1] for ln in f if "libcublasLt" in ln and ln.split()[-1].startswith("/")})
        for path in libs:
            h = ctypes.CDLL(path)
            h.cublasLtGetVersion.restype = ctypes.c_size_t
            res["cublaslt_version"] = int(h.cublasLtGetVersion())
            res["cublaslt_path"] = path
    except Exception as e:
        res["notes"].append(f"torch's cuBLASLt version not read: {e}")

    # MXFP8 through torch on this GPU (expected NOT_SUPPORTED on sm_90): record the answer once.
    try:
        M = N = K = 256
        x = torch.randn(M, K, device=dev).to(E4M3)
        w = torch.randn(N, K, device=dev).to(E4M3)
        xs = torch.full((M, K // 32), 127, dtype=torch.uint8, device=dev).view(torch.float8_e8m0fnu)
        ws_ = torch.full((N, K // 32), 127, dtype=torch.uint8, device=dev).view(torch.float8_e8m0fnu)
        torch._scaled_mm(x, w.t(), scale_a=xs.flatten(), scale_b=ws_.flatten(), out_dtype=torch.bfloat16)
        torch.cuda.synchronize()
        res["mxfp8_scaled_mm"] = "ran"
    except Exception as e:
        res["mxfp8_scaled_mm"] = (str(e).splitlines()[0][:300] if str(e) else type(e).__name__)

    # Host time per call of a tiny _scaled_mm (same method as bench_gemm's host section).
    try:
        M, N, K = 128, 128, 256
        x = torch.randn(M, K, device=dev)
        w = torch.randn(N, K, device=dev)
        sa = (x.abs().max() / FMAX).float()
        sb = (w.abs().max() / FMAX).float()
        xq, wq = (x / sa).to(E4M3), (w / sb).to(E4M3)
        calls = {"torch._scaled_mm tensorwise": lambda: torch._scaled_mm(xq, wq.t(), scale_a=sa, scale_b=sb,
                                                                          out_dtype=torch.bfloat16)}
        xq1, xs1 = quant_rows_1x128(x)
        wq2, ws2 = quant_128x128(w)
        for name, A_s, B_s in ([v for v in blk_variants(xs1, ws2, K, N) if v[0] == blk_variant] if blk_variant
                               else blk_variants(xs1, ws2, K, N)):
            try:
                torch._scaled_mm(xq1, wq2.t(), scale_a=A_s, scale_b=B_s, out_dtype=torch.bfloat16)
                calls["torch._scaled_mm blockwise"] = (lambda A_s=A_s, B_s=B_s: torch._scaled_mm(
                    xq1, wq2.t(), scale_a=A_s, scale_b=B_s, out_dtype=torch.bfloat16))
                break
            except Exception:
                continue
        burst, bursts, nb2b = 100, (20 if quick else 50), 5000
        for name, fn in calls.items():
            for _ in range(200):
                fn()
            torch.cuda.synchronize()
            per = []
            for _ in range(bursts):
                t = time.perf_counter()
                for _ in range(burst):
                    fn()
                per.append((time.perf_counter() - t) / burst * 1e6)
                torch.cuda.synchronize()
            per.sort()
            t = time.perf_counter()
            for _ in range(nb2b):
                fn()
            torch.cuda.synchronize()
            b2b = (time.perf_counter() - t) / nb2b * 1e6
            gpu = bench([fn])
            res["host"].append({"call": name, "host_us": per[len(per) // 2], "backtoback_us": b2b, "gpu_event_us": gpu})
            log(f"torch host: {name}: {per[len(per) // 2]:.2f} us/call")
    except Exception as e:
        res["notes"].append(f"host time per call not measured: {e}")

    # Grouped anchors (no scalemm counterpart yet): full runs only, time permitting.
    if not quick and hasattr(torch, "_scaled_grouped_mm"):
        for (G, Mt, N, K) in [(8, 16384, 4096, 7168), (32, 32768, 2048, 7168), (16, 4096, 2048, 2048)]:
            if time.monotonic() > deadline:
                res["notes"].append("deadline reached: grouped anchors skipped")
                break
            row = {"G": G, "M_total": Mt, "N": N, "K": K}
            try:
                torch.manual_seed(1)
                sizes = torch.distributions.Dirichlet(torch.ones(G)).sample() * Mt
                sizes = (sizes / 16).round().int() * 16
                sizes[-1] = Mt - sizes[:-1].sum()
                sizes = sizes.clamp(min=0)
                offs = torch.cumsum(sizes, 0).to(torch.int32).to(dev)
                x = torch.randn(Mt, K, device=dev)
                w = torch.randn(G, N, K, device=dev)
                sa = (x.abs().amax(1) / FMAX).float()
                sb = (w.abs().amax(2) / FMAX).float()
                xq = (x / sa[:, None]).to(E4M3)
                wq = (w / sb[:, :, None]).to(E4M3)
                fl = 2.0 * Mt * N * K
                try:
                    us = bench([lambda: torch._scaled_grouped_mm(xq, wq.transpose(-2, -1), sa, sb, offs=offs,
                                                                 out_dtype=torch.bfloat16)])
                    row["scaled_grouped_mm_tflops"] = fl / (us * 1e-6) / 1e12
                except Exception as e:
                    row["scaled_grouped_mm_err"] = str(e).splitlines()[0][:300]
                try:
                    xb, wb = x.bfloat16(), w.bfloat16()
                    us = bench([lambda: torch._grouped_mm(xb, wb.transpose(-2, -1), offs=offs)])
                    row["bf16_grouped_mm_tflops"] = fl / (us * 1e-6) / 1e12
                except Exception as e:
                    row["bf16_grouped_mm_err"] = str(e).splitlines()[0][:300]
            except Exception as e:
                row["error"] = str(e).splitlines()[0][:300]
            torch.cuda.empty_cache()
            res["grouped"].append(row)
            log("torch grouped " + json.dumps({k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items()}))
    return res


# ---------------------------------------------------------------------------------------------------
# Merge, Markdown, plots

TORCH_KEY = {"bf16": "bf16", "tensorwise": "tensorwise", "rowwise": "rowwise", "blockwise": "blockwise",
             "mxfp8": "bf16", "nvfp4": "bf16"}  # emulated recipes are compared with torch's bf16 matmul


def fmt(v, nd=1):
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:.{nd}f}"


def merge(cpp, tor):
    rows = []
    tdense = {(r["m"], r["n"], r["k"]): r for r in (tor or {}).get("dense", [])}
    for r in (cpp or {}).get("gemm", []):
        m = dict(r)
        rec = r["recipe"]
        rate = r.get("scalemm_tflops") if rec != "bf16" else r.get("bf16_tflops")
        m["rate_tflops"] = rate
        t = tdense.get((r["m"], r["n"], r["k"]))
        key = TORCH_KEY.get(rec)
        if t and key:
            m["torch_anchor"] = ("torch.matmul bf16" if key == "bf16" else f"torch._scaled_mm {key}")
            m["torch_us"] = t.get(f"{key}_us")
            m["torch_tflops"] = t.get(f"{key}_tflops")
            m["torch_err"] = t.get(f"{key}_err") or t.get("error")
            if m["torch_tflops"] and rate:
                m["ratio_vs_torch"] = rate / m["torch_tflops"]
        rows.append(m)
    return rows


def targets(cpp, rows, tor):
    out = list((cpp or {}).get("targets", []))
    anchors = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 7168, 2048), (128, 7168, 2048), (2048, 2048, 7168)]
    worst = None
    for r in rows:
        if r["recipe"] in ("tensorwise", "rowwise", "blockwise") and (r["m"], r["n"], r["k"]) in anchors \
                and r.get("ratio_vs_torch"):
            if worst is None or r["ratio_vs_torch"] < worst[0]:
                worst = (r["ratio_vs_torch"], f'{r["recipe"]} {r["m"]}x{r["n"]}x{r["k"]}')
    if worst:
        out.append({"target": ">= 1.0x torch._scaled_mm on the five anchor shapes (worst)", "value": worst[0],
                    "at": worst[1], "met": worst[0] >= 1.0})
    small = [r for r in rows if r["recipe"] in ("tensorwise", "rowwise", "blockwise") and r["m"] <= 128
             and r.get("ratio_vs_torch")]
    if small:
        w = min(small, key=lambda r: r["ratio_vs_torch"])
        out.append({"target": "small M (<= 128) >= 1.3x faster than torch._scaled_mm (worst)",
                    "value": w["ratio_vs_torch"], "at": f'{w["recipe"]} {w["m"]}x{w["n"]}x{w["k"]} ({w["backend"]})',
                    "met": w["ratio_vs_torch"] >= 1.3})
    return out


def markdown(env, cpp, tor, rows, tg, cpp_status):
    L = []
    dev = (cpp or {}).get("device", {})
    L.append(f"# GEMM benchmark: scalemm vs raw cuBLASLt vs PyTorch ({env['date_utc']})")
    L.append("")
    lt = dev.get("cublaslt_version")
    L.append(f"- device: {dev.get('name', (tor or {}).get('gpu', '?'))} (sm_{dev.get('sm', '?')}, "
             f"{dev.get('multiprocessors', '?')} SMs, L2 {int(dev.get('l2_bytes', 0)) >> 20} MiB); nvidia-smi: "
             f"{env.get('nvidia_smi')}")
    L.append(f"- driver {env.get('driver')}, CUDA runtime {dev.get('cuda_runtime')}, cuBLASLt {lt}, {env.get('nvcc')}")
    L.append(f"- PyTorch {(tor or {}).get('torch')} (CUDA {(tor or {}).get('torch_cuda')}, cuBLASLt "
             f"{(tor or {}).get('cublaslt_version', '?')}); scalemm "
             f"{(cpp or {}).get('scalemm_version')} commit {env['commit']}")
    meth = (cpp or {}).get("method", {})
    L.append(f"- method: CUDA events per call, host waits for each call's end event (as torch_anchor.py), "
             f"{meth.get('warmup', 5)} warm-ups, median of {meth.get('iters', '?')}; random normal data; operand sets "
             f"rotated when one set fits in 2x L2; {'--quick subset' if meth.get('quick') else 'full run'}; "
             f"cuBLASLt algorithm: {'autotuned (SCALEMM_AUTOTUNE=1), shared by scalemm and raw' if meth.get('autotune') else 'first heuristic choice'}; "
             f"bench_gemm: {cpp_status}")
    c = (cpp or {}).get("ceilings", {})
    L.append(f"- same-run ceilings: D2D copy {fmt(c.get('d2d_copy_tbps'), 2)} TB/s (read + write), BF16 cuBLASLt "
             f"8192^3 {fmt(c.get('bf16_gemm_8192_tflops'))} TFLOP/s, FP8 tensorwise cuBLASLt 8192^3 "
             f"{fmt(c.get('fp8_tensorwise_gemm_8192_tflops'))} TFLOP/s")
    L.append("")
    L.append("## Dense GEMM, bf16 output")
    L.append("")
    L.append("TFLOP/s = 2MNK / median time. scalemm/raw = time ratio against the library's cuBLASLt backend called "
             "directly (same algorithm; blockwise: compact scales, converted per call, and in brackets scales "
             "already in cuBLASLt format). vs torch = scalemm rate / torch rate (> 1: scalemm faster); the emulated "
             "MXFP8/NVFP4 rows show in the raw column the BF16 cuBLASLt GEMM of the same shape and their rate as a "
             "fraction of it, and, like the bf16 rows (raw cuBLASLt, no scalemm path), compare with torch.matmul bf16. "
             "floor/time = the same-run floor over the measured time.")
    L.append("")
    L.append("| shape | M | N | K | recipe | backend | scalemm us | TFLOP/s | raw cuBLASLt TFLOP/s | scalemm/raw | "
             "torch anchor | torch TFLOP/s | vs torch | floor/time | output check |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        rec = r["recipe"]
        us = r.get("scalemm_us") if rec != "bf16" else r.get("bf16_us")
        ratio = fmt(r.get("ratio_scalemm_raw"), 3)
        if r.get("ratio_scalemm_lt_scales_raw") is not None:
            ratio += f" ({fmt(r.get('ratio_scalemm_lt_scales_raw'), 3)})"
        raw = r.get("raw_tflops")
        if rec == "bf16":
            raw, ratio = r.get("bf16_tflops"), "-"
        elif rec in ("mxfp8", "nvfp4"):
            raw = 2.0 * r["m"] * r["n"] * r["k"] / (r["bf16_us"] * 1e-6) / 1e12 if r.get("bf16_us") else None
            ratio = f"{fmt(r.get('rate_vs_bf16'), 3)}x BF16 rate"
        torch_cell = fmt(r.get("torch_tflops")) if r.get("torch_tflops") else (
            "error" if r.get("torch_err") else "-")
        fot = r.get("floor_over_time")
        if fot is None and r.get("floor_us") and us:
            fot = r["floor_us"] / us
        L.append(f"| {r['shape']} | {r['m']} | {r['n']} | {r['k']} | {rec} | {r.get('backend')} | {fmt(us)} | "
                 f"{fmt(r.get('rate_tflops'))} | {fmt(raw)} | {ratio} | {r.get('torch_anchor', '-')} | {torch_cell} | "
                 f"{fmt(r.get('ratio_vs_torch'), 2)} | {fmt(fot, 2)} | {r.get('output_check', '-')} |")
    errs = [r for r in rows if r.get("torch_err")]
    if errs:
        L.append("")
        L.append("torch errors: " + "; ".join(sorted({f"{r['torch_anchor']} at M={r['m']}: {r['torch_err'][:160]}"
                                                      for r in errs})))
    plans = [r for r in rows if r.get("plan") and r.get("backend") not in ("native", "emulated", None)]
    if plans:
        L.append("")
        L.append("Planner choices other than native/emulated:")
        L.append("")
        for r in plans:
            L.append(f"- {r['recipe']} {r['m']}x{r['n']}x{r['k']}: {r['plan']}")
    h = (cpp or {}).get("host_overhead", {})
    if h.get("calls") or (tor or {}).get("host"):
        L.append("")
        L.append(f"## Host time per call, warm plan cache ({h.get('m', 128)}x{h.get('n', 128)}x{h.get('k', 256)} "
                 f"blockwise unless named)")
        L.append("")
        L.append(f"CPU clock; rounds of one burst of {h.get('burst', 100)} back-to-back calls per variant, started on an "
                 f"idle GPU, the variants interleaved round by round (median over {h.get('bursts', 50)} rounds; 'over raw' "
                 f"is the median of the same-round differences; torch rows: separate process, difference of medians), and "
                 f"{h.get('backtoback_calls', 5000)} back-to-back calls including the final synchronisation (the "
                 f"anchor's method). Output check of the scalemm/raw calls: {h.get('output_check', '-')}.")
        L.append("")
        L.append("| call | host us/call | over raw cublasLtMatmul | back-to-back us/call | GPU event us/call |")
        L.append("|---|---|---|---|---|")
        raw_host = None
        for x in h.get("calls", []):
            if x.get("error"):
                L.append(f"| {x['call']} | failed: {x['error'][:200]} | | | |")
                continue
            if raw_host is None and x["call"].startswith("raw"):
                raw_host = x.get("host_us")
            over = f"{x['over_raw_us']:+.2f}" if x.get("over_raw_us") is not None else "-"
            L.append(f"| {x['call']} | {fmt(x.get('host_us'), 2)} | {over} | {fmt(x.get('backtoback_us'), 2)} "
                     f"| {fmt(x.get('gpu_event_us'), 2)} |")
        if h.get("empty_launch_host_us") is not None:
            L.append(f"| one empty kernel launch (the compact row's extra launch) | {fmt(h['empty_launch_host_us'], 2)} "
                     f"| | {fmt(h.get('empty_launch_backtoback_us'), 2)} | |")
        for x in (tor or {}).get("host", []):
            over = f"{x['host_us'] - raw_host:+.2f}" if raw_host is not None else "-"
            L.append(f"| {x['call']} | {fmt(x['host_us'], 2)} | {over} | {fmt(x['backtoback_us'], 2)} | "
                     f"{fmt(x['gpu_event_us'], 2)} |")
    if (cpp or {}).get("verify"):
        L.append("")
        L.append("## Verify-mode overhead (SCALEMM_VERIFY, Handle constructed under each setting; off and sample timed interleaved)")
        L.append("")
        L.append("| recipe | M=N=K | backend | off us | sample us | sample overhead | full us | full overhead |")
        L.append("|---|---|---|---|---|---|---|---|")
        for v in cpp["verify"]:
            so, fo = v.get("sample_overhead"), v.get("full_overhead")
            L.append(f"| {v['recipe']} | {v['m']} | {v.get('backend')} | {fmt(v.get('off_us'))} | "
                     f"{fmt(v.get('sample_us'))} | {fmt(so * 100 if so is not None else None)}% | "
                     f"{fmt(v.get('full_us'))} | {fmt(fo * 100 if fo is not None else None)}% |")
    ref = (cpp or {}).get("reference", {})
    if ref:
        L.append("")
        L.append(f"## Reference emulator, {ref.get('m')}^3 {ref.get('recipe')} (median of {ref.get('reps')})")
        L.append("")
        L.append(f"emulation::gemm_device {fmt(ref.get('gemm_device_ms'))} ms ({fmt(ref.get('gemm_device_tflops'), 2)} "
                 f"TFLOP/s); sgemm_nt_device alone {fmt(ref.get('sgemm_nt_device_ms'))} ms "
                 f"({fmt(ref.get('sgemm_nt_device_tflops'), 2)} TFLOP/s); output {ref.get('output_check')}.")
    if (tor or {}).get("grouped"):
        L.append("")
        L.append("## Grouped anchors (PyTorch only: scalemm has no grouped GEMM yet), FP8 rowwise, bf16 out")
        L.append("")
        L.append("| G | M_total | N | K | torch._scaled_grouped_mm TFLOP/s | torch._grouped_mm bf16 TFLOP/s |")
        L.append("|---|---|---|---|---|---|")
        for g in tor["grouped"]:
            L.append(f"| {g['G']} | {g['M_total']} | {g['N']} | {g['K']} | "
                     f"{fmt(g.get('scaled_grouped_mm_tflops')) if g.get('scaled_grouped_mm_tflops') else g.get('scaled_grouped_mm_err', g.get('error', '-'))} | "
                     f"{fmt(g.get('bf16_grouped_mm_tflops')) if g.get('bf16_grouped_mm_tflops') else g.get('bf16_grouped_mm_err', '-')} |")
    if (tor or {}).get("mxfp8_scaled_mm"):
        L.append("")
        L.append(f"torch._scaled_mm with MXFP8 scales on this GPU: {tor['mxfp8_scaled_mm']}")
    if tg:
        L.append("")
        L.append("## Targets")
        L.append("")
        L.append("| target | value | where | met |")
        L.append("|---|---|---|---|")
        for t in tg:
            L.append(f"| {t['target']} | {fmt(t.get('value'), 3)} | {t.get('at', '')} | "
                     f"{'yes' if t.get('met') else '**no**'} |")
    sk = (cpp or {}).get("skipped", [])
    notes = (tor or {}).get("notes", [])
    if sk or notes or (tor or {}).get("error"):
        L.append("")
        L.append("## Skipped and notes")
        L.append("")
        for s in sk:
            L.append(f"- skipped {s['case']}: {s['reason']}")
        for n in notes:
            L.append(f"- {n}")
        if (tor or {}).get("error"):
            L.append(f"- torch anchors: {tor['error']}")
    return "\n".join(L) + "\n"


def plots(rows, outdir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        log(f"plots skipped: matplotlib not available ({e})")
        return []
    made = []
    for rec in ("bf16", "tensorwise", "rowwise", "blockwise", "mxfp8", "nvfp4"):
        rs = [r for r in rows if r["recipe"] == rec]
        if not rs:
            continue
        labels = [f"{r['m']}x{r['n']}x{r['k']}" for r in rs]
        series = []
        if rec == "bf16":
            series.append(("cuBLASLt bf16", [r.get("bf16_tflops") for r in rs]))
        else:
            series.append(("scalemm", [r.get("scalemm_tflops") for r in rs]))
            if rec in ("tensorwise", "rowwise", "blockwise"):
                series.append(("raw cuBLASLt", [r.get("raw_tflops") for r in rs]))
            else:
                series.append(("cuBLASLt bf16", [r.get("bf16_us") and 2.0 * r["m"] * r["n"] * r["k"] / (r["bf16_us"] * 1e-6) / 1e12 for r in rs]))
        anchor = "torch.matmul bf16" if TORCH_KEY[rec] == "bf16" else f"torch._scaled_mm {rec}"
        series.append((anchor, [r.get("torch_tflops") for r in rs]))
        fig, ax = plt.subplots(figsize=(max(8, 0.55 * len(rs) * len(series)), 5))
        w = 0.8 / len(series)
        for i, (name, ys) in enumerate(series):
            xs = [j + (i - (len(series) - 1) / 2) * w for j in range(len(rs))]
            ax.bar(xs, [y if y else 0 for y in ys], width=w, label=name)
        ax.set_xticks(range(len(rs)))
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("TFLOP/s (log)")
        ax.set_title(f"{rec}: TFLOP/s by shape (M x N x K), same run")
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        p = os.path.join(outdir, f"tflops_{rec}.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        made.append(p)
    log(f"plots: {', '.join(os.path.basename(p) for p in made)}")
    return made


def run_bandwidth(bench_dir, outdir, quick):
    """bench_layouts and bench_emulation (beside bench_gemm), same GPU, right after the GEMM part: their
    logs, the bandwidth-vs-copy plot and a Markdown section for results.md ("" when neither exists)."""
    logs = {}
    for name in ("bench_layouts", "bench_emulation"):
        exe = os.path.join(bench_dir, name)
        if not os.access(exe, os.X_OK):
            continue
        path = os.path.join(outdir, name + ".log")
        cmd = [exe] + (["--quick"] if quick else [])
        log("running " + " ".join(cmd))
        try:
            with open(path, "w") as f:
                rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=180).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout (180 s)"
        logs[name] = (path, rc)
    if not logs:
        return ""
    L = ["## Memory-bound kernels vs a same-run copy", ""]
    if len(logs) == 2:
        try:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import plot_bandwidth
            png = os.path.join(outdir, "bandwidth_vs_copy.png")
            plot_bandwidth.plot(logs["bench_layouts"][0], logs["bench_emulation"][0], png)
            L += ["![bandwidth vs copy](bandwidth_vs_copy.png)", ""]
        except Exception as e:  # matplotlib missing or a log cut short: the tables still stand
            L += [f"(plot skipped: {type(e).__name__}: {e})", ""]
    for name, (path, rc) in logs.items():
        with open(path) as f:
            text = f.read().rstrip()
        fence = name == "bench_layouts"  # bench_emulation prints Markdown tables itself
        L += [f"<details><summary>{name}{' --quick' if quick else ''} (exit {rc})</summary>", ""]
        L += (["```", text, "```"] if fence else [text]) + ["</details>", ""]
    return "\n".join(L)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bench", help="path to the bench_gemm executable")
    ap.add_argument("outdir", help="output directory (created)")
    ap.add_argument("--quick", action="store_true", help="small subset, for iteration (passed to bench_gemm)")
    ap.add_argument("--iters", type=int, default=None, help="timed calls per case (>= 30; default 30)")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch anchors")
    ap.add_argument("--no-bandwidth", action="store_true", help="skip bench_layouts and bench_emulation (run "
                    "after the GEMM part when they are built beside bench_gemm)")
    ap.add_argument("--no-autotune", action="store_true", help="scalemm and raw cuBLASLt on cuBLASLt's first "
                    "heuristic choice (default: both on the autotuned algorithm, HandleOptions::autotune)")
    ap.add_argument("--bench-timeout", type=float, default=None, help="seconds for bench_gemm (default 420, quick 150)")
    ap.add_argument("--deadline", type=float, default=560, help="seconds after start past which no new torch "
                                                                 "shape is started (default 560)")
    a = ap.parse_args()
    iters = max(30, a.iters) if a.iters else None
    os.makedirs(a.outdir, exist_ok=True)
    env = environment()
    log(f"commit {env['commit']}; {env.get('nvidia_smi')}")

    cpp, status = run_cpp(os.path.abspath(a.bench), a.outdir, a.quick, iters,
                          a.bench_timeout or (150 if a.quick else 420), not a.no_autotune)
    tor = None
    if not a.no_torch:
        try:
            tor = torch_anchors(cpp, a.quick, iters or 30, T0 + a.deadline, a.outdir)
        except ImportError as e:
            tor = {"error": f"PyTorch not importable: {e}", "dense": [], "host": [], "grouped": [], "notes": []}
        except Exception as e:
            tor = {"error": f"torch anchors failed: {type(e).__name__}: {e}", "dense": [], "host": [], "grouped": [],
                   "notes": []}
        if tor.get("error"):
            log(tor["error"])

    bw = "" if a.no_bandwidth else run_bandwidth(os.path.dirname(os.path.abspath(a.bench)), a.outdir, a.quick)
    rows = merge(cpp, tor)
    tg = targets(cpp, rows, tor)
    md = markdown(env, cpp, tor, rows, tg, status) + ("\n" + bw if bw else "")
    write_result(os.path.join(a.outdir, "results.md"), md)
    pngs = plots(rows, a.outdir)
    write_result(os.path.join(a.outdir, "results.json"),
                 json.dumps({"environment": env, "bench_status": status, "bench_gemm": cpp, "torch": tor, "rows": rows,
                             "targets": tg, "plots": [os.path.basename(p) for p in pngs]}, indent=1))
    print()
    print(md)
    log(f"wrote {a.outdir}/results.md, results.json, bench_gemm.md, bench_gemm.json"
        + (", torch_anchors.json" if tor and tor.get("dense") else "") + "".join(f", {os.path.basename(p)}" for p in pngs))
    return 0 if cpp is not None else 1


if __name__ == "__main__":
    sys.exit(main())
