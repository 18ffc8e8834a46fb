"""A jitted function's device time, kernel by kernel, from JAX's own profiler (no Nsight needed).

    rows = kernel_table(f, *args, calls=5)      # run f `calls` times under jax.profiler.trace
    print_table("train/bf16", rows)

The device planes of the trace hold one line per stream and one event per kernel or copy; each row
sums one name's time per call. `busy` is the union of the kernels' intervals (overlapping streams
count once) and `span` the first kernel's start to the last one's end, so span - busy is the time the
device sat idle inside the calls (host gaps, waits)."""

from __future__ import annotations

import collections
import glob
import tempfile

import jax


def _host_events(path):
    """XLA's own host events (thunks, custom calls), not the Python frames."""
    from jax.profiler import ProfileData

    for plane in ProfileData.from_file(path).planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            if line.name.startswith("python"):
                continue
            for ev in line.events:
                if ev.duration_ns > 0:
                    yield ev.name, float(ev.duration_ns)


def _device_events(path):
    from jax.profiler import ProfileData

    pd = ProfileData.from_file(path)
    for plane in pd.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            # XLA's device lines: "Stream #N(...)" per stream; skip the derived summary lines
            # ("XLA Ops", "XLA Modules", "Steps"), which repeat the kernels' time.
            if not line.name.startswith("Stream"):
                continue
            for ev in line.events:
                yield ev.name, float(ev.start_ns), float(ev.duration_ns)


def _union(intervals):
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def kernel_table(f, *args, calls=5):
    """({name: (us per call, launches per call)}, busy us per call, span us per call, {host event: us per
    call}) of f(*args)."""
    jax.block_until_ready(f(*args))
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            for _ in range(calls):
                out = f(*args)
            jax.block_until_ready(out)
        paths = glob.glob(f"{d}/**/*.xplane.pb", recursive=True)
        events = [e for p in paths for e in _device_events(p)]
        host = collections.defaultdict(float)
        for p in paths:
            for name, dur in _host_events(p):
                host[name] += dur / 1e3 / calls
    if not events:
        return {}, 0.0, 0.0, dict(host)
    per = collections.defaultdict(lambda: [0.0, 0])
    for name, _, dur in events:
        per[name][0] += dur / 1e3 / calls
        per[name][1] += 1
    rows = {n: (t, c / calls) for n, (t, c) in per.items()}
    busy = _union([(s, s + d) for _, s, d in events]) / 1e3 / calls
    span = (max(s + d for _, s, d in events) - min(s for _, s, _ in events)) / 1e3 / calls
    return rows, busy, span, dict(host)


def print_table(title, table, top=25):
    rows, busy, span, host = table
    if rows:
        print(f"profile {title}: device busy {busy:.1f} us per call, span {span:.1f} us (idle {span - busy:.1f})")
    else:
        print(f"profile {title}: no device events (not a GPU, or the profiler saw none)")
    for name, t in sorted(host.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  host {t:9.1f} us  {name[:100]}")
    for name, (t, c) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {t:9.1f} us  x{c:<5.1f} {name[:110]}")
    rest = sorted(rows.items(), key=lambda kv: -kv[1][0])[top:]
    if rest:
        print(f"  {sum(t for _, (t, _) in rest):9.1f} us  in {len(rest)} more kernels")
