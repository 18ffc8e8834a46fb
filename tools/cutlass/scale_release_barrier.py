"""Orders every consumer thread's block-scale reads before a stage is released, in CUTLASS's Hopper
pointer-array blockwise-scaling mainloop (the grouped kernel's).

The mainloop reads a stage's scales from shared memory in every consumer thread, and one or two lanes
of warp 0 of each consumer warpgroup then release the stage (an mbarrier arrive) for the producer to
refill with cp.async. Nothing orders the other threads' reads before that arrive, which
compute-sanitizer's racecheck reports as write-after-read hazards (docs/reliability.md). This script
inserts a barrier over the warpgroup's 128 threads before each release: after it every thread's reads
happen before the arrive. One named barrier per consumer warpgroup: user ids 0 and 1, which CUTLASS
places after its reserved ones (hardware ids 8 and 9 of 16), so the two warpgroups of the
cooperative schedule never share one. The unaligned form (barrier.sync) does not assume the warp
is converged there.

    python3 tools/cutlass/scale_release_barrier.py .deps/cutlass/include

Idempotent (an earlier form of the barrier is replaced); fails when the header does not have the expected release sites (another CUTLASS version).
"""

import pathlib
import sys

HEADER = "cutlass/gemm/collective/sm90_mma_array_tma_gmma_ss_warpspecialized_fp8_blockwise_scaling.hpp"
SITE = "pipeline.consumer_release(smem_pipe_release);"
MARK = "// scalemm: scale reads before release"
BARRIER = ("cutlass::arch::NamedBarrier(cutlass::NumThreadsPerWarpGroup, "
           "uint32_t(cutlass::canonical_warp_group_idx() - 1)).arrive_and_wait_unaligned();")
EXPECTED_SITES = 3  # two in the k-tile loop, one in mma_tail (CUTLASS 4.2.0.0)


def main() -> int:
    path = pathlib.Path(sys.argv[1]) / HEADER
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    if any(BARRIER in line and MARK in line for line in lines):
        print(f"scale_release_barrier: {path.name} already has the barriers")
        return 0
    lines = [line for line in lines if MARK not in line]  # an earlier form of the barrier
    out, sites = [], 0
    for line in lines:
        if line.strip().startswith(SITE):
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}{BARRIER}  {MARK}\n")
            sites += 1
        out.append(line)
    if sites != EXPECTED_SITES:
        print(f"scale_release_barrier: {path} has {sites} release sites, expected {EXPECTED_SITES}: "
              "another CUTLASS version; update this script", file=sys.stderr)
        return 1
    path.write_text("".join(out))
    print(f"scale_release_barrier: CUTLASS patched for scalemm's grouped kernel: {sites} barriers order the "
          f"scale reads before each stage release in {path.name} (why: this script's docstring)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
