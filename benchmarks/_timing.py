"""Timing helper shared by the benchmark scripts (run as `python benchmarks/<name>.py`, so this
directory is on sys.path)."""

from __future__ import annotations

import statistics
import time


def median_time(fn, reps: int, warmup: int = 2) -> float:
    """Median wall time in seconds of `reps` calls of `fn`, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
