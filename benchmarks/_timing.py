"""Timing helper shared by the benchmark scripts (run as `python benchmarks/<name>.py`, so this
directory is on sys.path)."""

from __future__ import annotations

import statistics
import sys
import time


def settle_compiles(timeout: float = 60.0) -> None:
    """Wait for lazymath's background tier-ups (a big kernel starts on quickly compiled code
    and its optimized code replaces it when ready): steady-state timings measure the latter."""
    compile_ = sys.modules.get("lazymath.backend.compile")
    if compile_ is not None:
        compile_.wait_tiering(timeout)


def median_time(fn, reps: int, warmup: int = 2) -> float:
    """Median wall time in seconds of `reps` calls of `fn`, after `warmup` untimed calls (and
    lazymath's background compiles: `settle_compiles`)."""
    for _ in range(warmup):
        fn()
    settle_compiles()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def host_roof(*tensors, refresh: bool = False):
    """The host roofline of the graph of `tensors` (lazymath/backend/host/roofline.py): a function
    of the measured seconds returning one line -- the sum of its kernels' roofs (the tighter
    of each kernel's memory and compute bounds at its host block count), which roof each
    kernel is under, and the fraction of the summed roof the measured time reaches.
    `refresh` measures the host again first (keeping the best of old and new per quantity:
    run under /work/bin/lmbench this moves the cached probe toward the machine's capability)."""
    import lazymath as lm
    from lazymath.backend.compile import build_program, host_blocks
    from lazymath.backend.host import roofline
    from lazymath.backend.native import host

    roofs = roofline.host_roofs(host.target(), refresh=refresh)
    sched = lm.schedule(*tensors)
    parts = []
    for k in sched.kernels:
        if k.unit == "aicpu" or k.ir is None:
            continue
        blocks = host_blocks(k.ir, build_program(k.ir, sched.spec, k.name), spec=sched.spec)
        r = roofline.kernel_roof(k.ir, blocks, roofs)
        if r is not None:
            parts.append((k.name, r))
    total = sum(r.roof_s for _, r in parts)

    def line(measured_s: float) -> str:
        if not parts:
            return "host roof: no kernel with a roofline"
        kinds = ", ".join(
            f"{name} {r.bound} {r.roof_s * 1e3:.3f} ms (memory {r.memory_s * 1e3:.3f}, "
            f"compute {r.compute_s * 1e3:.3f}, {r.threads}t)"
            for name, r in parts
        )
        frac = total / measured_s if measured_s > 0 else float("nan")
        text = f"host roof {total * 1e3:.3f} ms: lazymath at {frac:.0%} of it"
        if measured_s > 0 and any(r.memory_nt_s is not None for _, r in parts):
            # the roof had every DRAM output been streamed (non-temporal stores)
            nt = sum(max(r.compute_s, r.memory_nt_s or r.memory_s) for _, r in parts)
            text += f" ({nt / measured_s:.0%} of {nt * 1e3:.3f} ms with non-temporal stores)"
        return f"{text} [{kinds}]"

    line.roofs = roofs
    return line
