"""CUDA-event timing shared by the benchmarks: one event pair around each call, the host waiting for the
end event, so that every sample is one call's device time."""

from __future__ import annotations


def event_times(torch, step, steps):
    """The device time of each of `steps` calls of step(), in ms."""
    times = []
    for _ in range(steps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return times


def profiled(torch, step):
    """(device ms, torch.profiler profile) of one call of step(), CPU and CUDA activity recorded."""
    from torch.profiler import ProfilerActivity, profile

    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        a.record()
        step()
        b.record()
        b.synchronize()
    return a.elapsed_time(b), p
