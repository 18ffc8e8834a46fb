"""Grouped (MoE) GEMMs against PyTorch, in one process on one GPU.

For each MoE shape (G experts, M_g tokens each, N, K), with equal sizes and with the same total split
unevenly (Dirichlet, each size a multiple of 16 as torch requires), CUDA-event medians of:
  scalemm blockwise   scalemm.scaled_grouped_mm, block1x128 x block128x128 (auto: the contiguous
                      kernel at decode, else the CUTLASS grouped kernel, or per-group for large
                      groups), host sizes and device-side sizes
  scalemm per-group   the same call on the per-group backend (one cuBLASLt call per group)
  naive loop          a Python loop of scalemm.scaled_mm over the groups (what a user writes first)
  scalemm rowwise     scalemm.scaled_grouped_mm, rowwise x rowwise (auto: the CUTLASS rowwise grouped
                      kernel, or per-group for large groups), and the same call on the per-group backend
  scalemm rowwise fast accumulation, and torch's rowwise kernel with use_fast_accum=True
  torch rowwise       torch._scaled_grouped_mm (rowwise: what torch runs on sm_90)
  torch bf16          torch._grouped_mm on bf16 copies
  DeepGEMM            deep_gemm.m_grouped_fp8_gemm_nt_contiguous on the same FP8 bytes and scales
                      (A's scales handed over MN-major, as its quantizers write them); groups that are
                      not multiples of its 128-row alignment run padded to it (m_indices -1), and
                      groups smaller than one tile through its masked kernel (decode). Skipped, with
                      the reason, when deep_gemm does not import (tools/fetch-deepgemm.sh,
                      tools/build-deepgemm.sh). Its output is checked against scalemm's.
and the memory floor: A, B and D bytes at this run's device-to-device copy bandwidth. scalemm blockwise
and DeepGEMM are also timed interleaved after a two-second warm-up (bench_interleaved): the ratio to
quote, as a GEMM timed alone after an idle moment reads fast. scalemm's contiguous kernel joins them by
name where auto runs another backend (scalemm_contiguous_interleaved_us).
Then the dense blockwise anchors: the grouped kernel at G = 1 and DeepGEMM's dense GEMM against
scalemm.scaled_mm (cuBLASLt). Every column is timed the same way (bench()).

    python benchmarks/grouped.py [--json out.json] [--quick]
    python benchmarks/grouped.py --plot out.json plot.png     (matplotlib; no GPU needed)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

SHAPES = [(8, 2048, 4096, 7168), (32, 1024, 2048, 7168), (16, 256, 2048, 2048), (64, 8, 4096, 7168)]
DENSE = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 7168, 2048), (128, 7168, 2048), (2048, 2048, 7168)]


HOST_US = {}  # id of the last timed function -> CPU microseconds per call (enqueue time)


def bench(torch, fn, iters, reps=5):
    """Device microseconds per call: median over `reps` loops of `iters` calls between CUDA events.
    The CPU time per call of the same loops (no synchronisation inside) goes to HOST_US["last"]."""
    fn()
    torch.cuda.synchronize()
    out, cpu = [], []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        cpu.append((time.perf_counter() - t0) / iters * 1e6)
        stop.record()
        stop.synchronize()
        out.append(start.elapsed_time(stop) / iters * 1e3)
    HOST_US["last"] = statistics.median(cpu)
    return statistics.median(out)


def bench_interleaved(torch, fns, iters, reps=9, warm_s=2.0):
    """Device microseconds per call of each of `fns`, sampled in turn (one loop of `iters` calls of each
    per round, median over `reps` rounds) after `warm_s` seconds of calling them all: timed one after
    the other, whichever ran first on a cooler GPU read up to 12% faster (H100, large GEMMs)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warm_s:
        for fn in fns:
            for _ in range(4):
                fn()
        torch.cuda.synchronize()
    out = [[] for _ in fns]
    for _ in range(reps):
        for i, fn in enumerate(fns):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            stop.record()
            stop.synchronize()
            out[i].append(start.elapsed_time(stop) / iters * 1e3)
    return [statistics.median(x) for x in out]


def uneven(torch, g, total, seed):
    """G sizes summing to `total`, Dirichlet(1) proportions, each a multiple of 16 (some may be 0)."""
    gen = torch.Generator().manual_seed(seed)
    w = -torch.log(torch.rand(g, generator=gen))  # Exp(1) samples, normalised: Dirichlet(1)
    units = total // 16
    raw = (w / w.sum() * units).floor().long()
    raw[torch.argmax(w)] += units - int(raw.sum())
    return [int(x) * 16 for x in raw]


def copy_bandwidth(torch):
    """Device-to-device copy bandwidth (bytes read + written per second) of a 2 GiB buffer."""
    src = torch.empty(1 << 31, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = bench(torch, lambda: dst.copy_(src), 10)
    del src, dst
    return 2 * (1 << 31) / (us * 1e-6)


def load_deepgemm():
    """(deep_gemm, None) when it imports, else (None, why)."""
    try:
        import deep_gemm

        return deep_gemm, None
    except Exception as e:  # noqa: BLE001 (the reason is reported)
        return None, f"deep_gemm does not import ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); " \
                     "stage and build it with tools/fetch-deepgemm.sh and tools/build-deepgemm.sh"


def mn_major(torch, s):
    """The same scale values with the rows dimension contiguous (DeepGEMM's A-scale layout)."""
    return s.transpose(-1, -2).contiguous().transpose(-1, -2)


def max_rel(torch, got, want):
    """max |got - want| / max |want| (both bf16 outputs of the same FP8 problem)."""
    w = want.float()
    return float((got.float() - w).abs().max() / w.abs().max().clamp_min(1e-30))


def settle(torch, fn, seconds=0.3):
    """Back-to-back calls for a moment, so that a column timed after an idle GPU (DeepGEMM compiles a
    kernel for each new shape on first use: seconds without GPU work) starts from the same clocks as
    the others."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()


def deepgemm_grouped(torch, dg, a, b, sa, sb, sizes):
    """DeepGEMM on the same m-grouped problem: (call, layout, output), the call compiled already."""
    G, N = b.shape[0], b.shape[1]
    K = a.shape[1]
    align = int(dg.get_mk_alignment_for_contiguous_layout())
    starts = [sum(sizes[:g]) for g in range(G)]
    if max(sizes) < align:  # decode: every group fits one tile
        max_m = align
        a3 = torch.zeros(G, max_m, K, dtype=a.dtype, device=a.device)
        s3 = torch.ones(G, max_m, K // 128, device=a.device)
        for g in range(G):
            a3[g, :sizes[g]] = a[starts[g]:starts[g] + sizes[g]]
            s3[g, :sizes[g]] = sa[starts[g]:starts[g] + sizes[g]]
        s3 = mn_major(torch, s3)
        d3 = torch.empty(G, max_m, N, dtype=torch.bfloat16, device=a.device)
        masked = torch.tensor(sizes, dtype=torch.int32, device=a.device)
        expected = max(1, sum(sizes) // G)
        fn = lambda: dg.m_grouped_fp8_gemm_nt_masked((a3, s3), (b, sb), d3, masked, expected,  # noqa: E731
                                                      disable_ue8m0_cast=True)
        fn()
        return fn, f"masked (max_m {max_m})", lambda: torch.cat([d3[g, :sizes[g]] for g in range(G)])
    if all(x % align == 0 for x in sizes):  # the same bytes, as they are
        ap, sp, rows = a, sa, None
        idx = torch.repeat_interleave(torch.arange(G, dtype=torch.int32, device=a.device),
                                      torch.tensor(sizes, device=a.device))
        layout = "contiguous"
    else:  # each group padded to the alignment, padding rows marked -1
        padded = [(x + align - 1) // align * align for x in sizes]
        rows = torch.cat([torch.arange(starts[g], starts[g] + sizes[g], device=a.device) for g in range(G)])
        dst = torch.cat([torch.arange(sizes[g], device=a.device) + sum(padded[:g]) for g in range(G)])
        ap = torch.zeros(sum(padded), K, dtype=a.dtype, device=a.device)
        sp = torch.ones(sum(padded), K // 128, device=a.device)
        ap[dst] = a[rows]
        sp[dst] = sa[rows]
        idx = torch.full((sum(padded),), -1, dtype=torch.int32, device=a.device)
        for g in range(G):
            idx[sum(padded[:g]):sum(padded[:g]) + sizes[g]] = g
        rows = dst
        layout = f"contiguous, padded to {align} rows per group ({sum(padded)} rows for {sum(sizes)})"
    sp = mn_major(torch, sp)
    d = torch.empty(ap.shape[0], N, dtype=torch.bfloat16, device=a.device)
    fn = lambda: dg.m_grouped_fp8_gemm_nt_contiguous((ap, sp), (b, sb), d, idx,  # noqa: E731
                                                      disable_ue8m0_cast=True)
    fn()
    return fn, layout, lambda: d if rows is None else d[rows]


def run(args):
    import torch

    import scalemm

    f8 = torch.float8_e4m3fn
    dev = torch.cuda.get_device_name()
    bw = copy_bandwidth(torch)
    dg, dg_why = load_deepgemm()
    print(f"device: {dev}; copy bandwidth {bw / 1e12:.2f} TB/s; scalemm {scalemm.__version__}; "
          + (f"DeepGEMM {getattr(dg, '__version__', '?')}" if dg else f"DeepGEMM skipped: {dg_why}"))
    results = {"device": dev, "copy_tb_s": bw / 1e12, "grouped": [], "dense": [],
               "deepgemm": getattr(dg, "__version__", "?") if dg else None, "deepgemm_skipped": dg_why}
    iters = 3 if args.quick else 20
    gen = torch.Generator(device="cuda").manual_seed(0)
    for (G, mg, N, K) in SHAPES:
        for kind in ("equal", "uneven"):
            sizes = [mg] * G if kind == "equal" else uneven(torch, G, G * mg, seed=G * 1000 + mg)
            M = sum(sizes)
            a = torch.randn(M, K, device="cuda", generator=gen).to(f8)
            b = torch.randn(G, N, K, device="cuda", generator=gen).to(f8)
            sa = torch.rand(M, K // 128, device="cuda", generator=gen) + 0.5
            sb = torch.rand(G, N // 128, K // 128, device="cuda", generator=gen) + 0.5
            dev_sizes = torch.tensor(sizes, dtype=torch.int32, device="cuda")
            kw = dict(recipe_a="block1x128", recipe_b="block128x128")
            row = {"G": G, "M_g": mg, "N": N, "K": K, "sizes": kind, "flops": 2.0 * M * N * K}
            ms = lambda fn: bench(torch, fn, iters)  # noqa: E731
            row["plan"] = scalemm.explain(a, b, sa, sb, group_sizes=sizes, **kw).splitlines()[0]
            blockwise = lambda: scalemm.scaled_grouped_mm(a, b, sa, sb, sizes, **kw)  # noqa: E731
            dg_call = None
            if dg is not None:  # compiled before any column is timed, then the GPU settles
                try:
                    dg_call = deepgemm_grouped(torch, dg, a, b, sa, sb, sizes)
                except Exception as e:  # noqa: BLE001 (reported, not hidden)
                    row["deepgemm_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            settle(torch, blockwise)
            row["scalemm_blockwise_us"] = ms(blockwise)
            row["scalemm_blockwise_host_us"] = HOST_US["last"]
            if dg_call is not None:
                fn, layout, output = dg_call
                row.update(deepgemm_us=ms(fn), deepgemm_layout=layout,
                           deepgemm_max_rel_vs_scalemm=max_rel(torch, output(), blockwise()))
                # The same calls interleaved after a warm-up: the ratio the comparison quotes. scalemm's own
                # kernel by name too, wherever auto runs another backend, so that it meets DeepGEMM on
                # every shape.
                fns = [blockwise, fn]
                if "contiguous grouped backend" not in row["plan"]:
                    fns.append(lambda: scalemm.scaled_grouped_mm(a, b, sa, sb, sizes, grouped_backend="contiguous", **kw))
                got = bench_interleaved(torch, fns, iters)
                row.update(scalemm_blockwise_interleaved_us=got[0], deepgemm_interleaved_us=got[1])
                row["scalemm_contiguous_interleaved_us"] = got[2] if len(got) > 2 else got[0]
            row["scalemm_blockwise_device_sizes_us"] = ms(
                lambda: scalemm.scaled_grouped_mm(a, b, sa, sb, dev_sizes, **kw))
            row["scalemm_per_group_us"] = ms(
                lambda: scalemm.scaled_grouped_mm(a, b, sa, sb, sizes, grouped_backend="per-group", **kw))
            starts = [sum(sizes[:g]) for g in range(G)]

            def naive():
                for g in range(G):
                    if sizes[g]:
                        r0 = starts[g]
                        scalemm.scaled_mm(a[r0:r0 + sizes[g]], b[g], sa[r0:r0 + sizes[g]], sb[g], **kw)
            row["naive_loop_us"] = ms(naive)
            # Rowwise: scalemm's per-group backend against torch's grouped kernel, same FP8 data.
            ra_s = torch.rand(M, device="cuda", generator=gen) + 0.5
            rb_s = torch.rand(G, N, device="cuda", generator=gen) + 0.5
            rkw = dict(recipe_a="rowwise", recipe_b="rowwise")
            row["rowwise_plan"] = scalemm.explain(a, b, ra_s, rb_s, group_sizes=sizes, **rkw).splitlines()[0]
            row["scalemm_rowwise_us"] = ms(lambda: scalemm.scaled_grouped_mm(a, b, ra_s, rb_s, sizes, **rkw))
            row["scalemm_rowwise_per_group_us"] = ms(lambda: scalemm.scaled_grouped_mm(
                a, b, ra_s, rb_s, sizes, grouped_backend="per-group", **rkw))
            row["scalemm_rowwise_fast_accum_us"] = ms(lambda: scalemm.scaled_grouped_mm(
                a, b, ra_s, rb_s, sizes, fast_accum=True, **rkw))
            offs = torch.tensor(sizes, device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)
            bt = b.transpose(1, 2)
            try:
                row["torch_rowwise_us"] = ms(lambda: torch._scaled_grouped_mm(
                    a, bt, ra_s, rb_s, offs=offs, out_dtype=torch.bfloat16))
                row["torch_rowwise_fast_accum_us"] = ms(lambda: torch._scaled_grouped_mm(
                    a, bt, ra_s, rb_s, offs=offs, out_dtype=torch.bfloat16, use_fast_accum=True))
            except Exception as e:  # noqa: BLE001 (reported, not hidden)
                row["torch_rowwise_error"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
            if "torch_rowwise_fast_accum_us" in row:
                # Fast accumulation interleaved: what auto runs, each one-launch and per-group backend by
                # name, and torch's kernel, the ratio the fast-accumulation target quotes.
                row["rowwise_fast_accum_plan"] = scalemm.explain(
                    a, b, ra_s, rb_s, group_sizes=sizes, fast_accum=True, **rkw).splitlines()[0]
                fast = lambda backend: (lambda: scalemm.scaled_grouped_mm(  # noqa: E731
                    a, b, ra_s, rb_s, sizes, fast_accum=True, grouped_backend=backend, **rkw))
                got = bench_interleaved(torch, [fast("auto"), fast("cutlass"), fast("per-group"), lambda: torch._scaled_grouped_mm(
                    a, bt, ra_s, rb_s, offs=offs, out_dtype=torch.bfloat16, use_fast_accum=True)], iters)
                row.update(scalemm_rowwise_fast_accum_interleaved_us=got[0], scalemm_rowwise_fast_accum_cutlass_interleaved_us=got[1],
                           scalemm_rowwise_fast_accum_per_group_interleaved_us=got[2], torch_rowwise_fast_accum_interleaved_us=got[3])
            a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16).transpose(1, 2)
            try:
                row["torch_bf16_us"] = ms(lambda: torch._grouped_mm(a16, b16, offs=offs))
            except Exception as e:  # noqa: BLE001
                row["torch_bf16_error"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
            del a16, b16
            experts = sum(1 for x in sizes if x)  # an empty expert's weights are not read
            moved = M * K + experts * N * K + 2 * M * N + 4 * (sa.numel() + experts * sb[0].numel())
            row["memory_floor_us"] = moved / bw * 1e6
            results["grouped"].append(row)
            tf = lambda us: row["flops"] / (us * 1e-6) / 1e12  # noqa: E731
            t_rw = row.get("torch_rowwise_us")
            print(f"G={G:3d} M_g={mg:5d} N={N} K={K} {kind:6s}: blockwise {row['scalemm_blockwise_us']:8.1f} us "
                  f"({tf(row['scalemm_blockwise_us']):6.0f} TF/s, host {row['scalemm_blockwise_host_us']:.0f} us), device sizes {row['scalemm_blockwise_device_sizes_us']:8.1f}, "
                  f"per-group {row['scalemm_per_group_us']:8.1f}, naive {row['naive_loop_us']:8.1f}, "
                  f"rowwise {row['scalemm_rowwise_us']:8.1f} (per-group {row['scalemm_rowwise_per_group_us']:.1f}) | torch rowwise "
                  f"{t_rw if t_rw is None else round(t_rw, 1)}, bf16 {row.get('torch_bf16_us', 'n/a')}"
                  f" | floor {row['memory_floor_us']:.1f}")
            if "deepgemm_us" in row:
                print(f"    DeepGEMM {row['deepgemm_us']:8.1f} us ({tf(row['deepgemm_us']):6.0f} TF/s, "
                      f"{row['deepgemm_layout']}): scalemm / DeepGEMM time "
                      f"{row['scalemm_blockwise_us'] / row['deepgemm_us']:.3f}, max rel diff "
                      f"{row['deepgemm_max_rel_vs_scalemm']:.1e}; interleaved: scalemm "
                      f"{row['scalemm_blockwise_interleaved_us']:.1f} us, DeepGEMM {row['deepgemm_interleaved_us']:.1f} us, "
                      f"ratio {row['scalemm_blockwise_interleaved_us'] / row['deepgemm_interleaved_us']:.3f}; "
                      f"contiguous kernel {row['scalemm_contiguous_interleaved_us']:.1f} us, ratio "
                      f"{row['scalemm_contiguous_interleaved_us'] / row['deepgemm_interleaved_us']:.3f}")
            elif "deepgemm_error" in row:
                print(f"    DeepGEMM failed: {row['deepgemm_error']}")
            if "torch_rowwise_fast_accum_us" in row:
                print(f"    rowwise fast accumulation: scalemm {row['scalemm_rowwise_fast_accum_us']:.1f} us, torch "
                      f"{row['torch_rowwise_fast_accum_us']:.1f} us (torch / scalemm "
                      f"{row['torch_rowwise_fast_accum_us'] / row['scalemm_rowwise_fast_accum_us']:.2f}x)")
                if "torch_rowwise_fast_accum_interleaved_us" in row:
                    t = row["torch_rowwise_fast_accum_interleaved_us"]
                    print(f"      interleaved: auto {row['scalemm_rowwise_fast_accum_interleaved_us']:.1f} us ({t / row['scalemm_rowwise_fast_accum_interleaved_us']:.2f}x), "
                          f"CUTLASS kernel {row['scalemm_rowwise_fast_accum_cutlass_interleaved_us']:.1f} ({t / row['scalemm_rowwise_fast_accum_cutlass_interleaved_us']:.2f}x), "
                          f"per-group {row['scalemm_rowwise_fast_accum_per_group_interleaved_us']:.1f} ({t / row['scalemm_rowwise_fast_accum_per_group_interleaved_us']:.2f}x), torch {t:.1f}")
            if t_rw:
                print(f"    blockwise vs torch rowwise {t_rw / row['scalemm_blockwise_us']:.2f}x, vs naive "
                      f"{row['naive_loop_us'] / row['scalemm_blockwise_us']:.2f}x, rowwise vs torch "
                      f"{t_rw / row['scalemm_rowwise_us']:.2f}x, blockwise / floor "
                      f"{row['scalemm_blockwise_us'] / row['memory_floor_us']:.2f}")
            del a, b, sa, sb
            torch.cuda.empty_cache()
    for (M, N, K) in DENSE:
        a = torch.randn(M, K, device="cuda", generator=gen).to(f8)
        b = torch.randn(N, K, device="cuda", generator=gen).to(f8)
        sa = torch.rand(M, K // 128, device="cuda", generator=gen) + 0.5
        sb = torch.rand(N // 128, K // 128, device="cuda", generator=gen) + 0.5
        kw = dict(recipe_a="block1x128", recipe_b="block128x128")
        b3, sb3 = b.unsqueeze(0), sb.unsqueeze(0)
        row = {"M": M, "N": N, "K": K, "flops": 2.0 * M * N * K}
        dense = lambda: scalemm.scaled_mm(a, b, sa, sb, **kw)  # noqa: E731
        dg_text, fn = "", None
        if dg is not None:  # compiled first, as in the grouped rows
            try:
                sam, d = mn_major(torch, sa), torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
                fn = lambda: dg.fp8_gemm_nt((a, sam), (b, sb), d, disable_ue8m0_cast=True)  # noqa: E731
                fn()
            except Exception as e:  # noqa: BLE001 (reported, not hidden)
                row["deepgemm_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                dg_text, fn = f", DeepGEMM failed: {row['deepgemm_error']}", None
        settle(torch, dense)
        row["cublaslt_us"] = bench(torch, dense, iters)
        row["cutlass_g1_us"] = bench(torch, lambda: scalemm.scaled_grouped_mm(a, b3, sa, sb3, [M], **kw), iters)
        if fn is not None:
            try:
                row["deepgemm_us"] = bench(torch, fn, iters)
                row["deepgemm_max_rel_vs_scalemm"] = max_rel(torch, d, scalemm.scaled_mm(a, b, sa, sb, **kw))
                dg_text = (f", DeepGEMM {row['deepgemm_us']:8.1f} us (scalemm / DeepGEMM time "
                           f"{row['cublaslt_us'] / row['deepgemm_us']:.3f}, max rel diff "
                           f"{row['deepgemm_max_rel_vs_scalemm']:.1e})")
            except Exception as e:  # noqa: BLE001 (reported, not hidden)
                row["deepgemm_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                dg_text = f", DeepGEMM failed: {row['deepgemm_error']}"
        results["dense"].append(row)
        tf = lambda us: row["flops"] / (us * 1e-6) / 1e12  # noqa: E731
        print(f"dense {M}x{N}x{K}: cuBLASLt {row['cublaslt_us']:8.1f} us ({tf(row['cublaslt_us']):6.0f} TF/s), "
              f"CUTLASS grouped G=1 {row['cutlass_g1_us']:8.1f} us ({tf(row['cutlass_g1_us']):6.0f} TF/s), "
              f"ratio {row['cublaslt_us'] / row['cutlass_g1_us']:.2f}{dg_text}")
        del a, b
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def plot(src, dst):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(src) as f:
        r = json.load(f)
    rows = r["grouped"]
    labels = [f"G={x['G']} M_g={x['M_g']}\nN={x['N']} K={x['K']}\n{x['sizes']}" for x in rows]
    series = [("scalemm blockwise (auto: CUTLASS grouped or per-group)", "scalemm_blockwise_us"),
              ("scalemm rowwise (auto: CUTLASS grouped or per-group)", "scalemm_rowwise_us"),
              ("torch._scaled_grouped_mm rowwise", "torch_rowwise_us"),
              ("torch._grouped_mm bf16", "torch_bf16_us"),
              ("naive loop of scalemm.scaled_mm", "naive_loop_us")]
    fig, ax = plt.subplots(figsize=(13, 5))
    w = 0.8 / len(series)
    for i, (name, key) in enumerate(series):
        ys = [x["flops"] / (x[key] * 1e-6) / 1e12 if x.get(key) else 0 for x in rows]
        ax.bar([j + (i - len(series) / 2 + 0.5) * w for j in range(len(rows))], ys, w, label=name)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("TF/s (higher is better)")
    ax.set_title(f"Grouped FP8 GEMMs on {r['device']} (one process, CUDA-event medians)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--plot", nargs=2, metavar=("JSON", "PNG"))
    a = p.parse_args()
    if a.plot:
        plot(*a.plot)
        sys.exit(0)
    run(a)
