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
