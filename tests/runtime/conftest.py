"""Fixtures for runtime tests: every device-level test runs under both schedulers."""

from __future__ import annotations

import time

import pytest

from lazymath.runtime import Device


@pytest.fixture(params=["threads", "sync"])
def scheduler(request, monkeypatch) -> str:
    """The scheduler under test, also exported as LAZYMATH_SCHEDULER (how users select it)."""
    monkeypatch.setenv("LAZYMATH_SCHEDULER", request.param)
    return request.param


@pytest.fixture
def device(scheduler):
    dev = Device()  # reads LAZYMATH_SCHEDULER
    assert dev.scheduler == scheduler
    yield dev
    dev.close()


class SleepKernel:
    """A fake kernel: each block sleeps (time.sleep releases the GIL like a ctypes call) and
    stamps its host interval; `body(argv, i, n)` runs after the sleep."""

    def __init__(self, name: str, seconds: float = 0.0, body=None, blocks: int = 1) -> None:
        self.name = name
        self.seconds = seconds
        self.body = body
        self.blocks = blocks
        self.intervals: list[tuple[int, int]] = []
        self.calls: list[int] = []

    def run_block(self, argv, block_idx: int, block_num: int) -> None:
        t0 = time.perf_counter_ns()
        if self.seconds:
            time.sleep(self.seconds)
        if self.body is not None:
            self.body(argv, block_idx, block_num)
        self.calls.append(block_idx)
        self.intervals.append((t0, time.perf_counter_ns()))

    @property
    def span(self) -> tuple[int, int]:
        return min(s for s, _ in self.intervals), max(e for _, e in self.intervals)
