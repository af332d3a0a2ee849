"""Scheduling under a stolen core (issue 35): big Vector kernels get more host blocks than
threads (dynamic claiming evens out a slow thread), and a big launch that waited for a core
turns the pool's spinning off for a while. No timing asserts: a block that sleeps stands in
for a descheduled thread (it takes wall time, no CPU time), deterministically."""

from __future__ import annotations

import ctypes
import threading
import time

import numpy as np
import pytest

import lazymath as lm
from lazymath import _threads
from lazymath.backend import compile as C
from lazymath.runtime.device import ASCEND910


def _ir(n: int):
    x = lm.tensor(np.ones(n, np.float32))
    (k,) = lm.schedule(x * 2.0 + 1.0, spec="ascend910").kernels
    return k.ir


@pytest.mark.parametrize(
    ("n", "workers", "blocks"),
    [
        (1 << 10, 2, 1),  # tiny: one block
        (600_000, 2, 2),  # under 2 x 2 x BLOCK_WORK: one block per thread
        (1_200_000, 2, 4),
        (4 << 20, 2, 8),  # BLOCKS_PER_THREAD per thread at most
        (4 << 20, 16, 16),  # 16 threads: 4M / (16 x 256K) = 1 block each
        (64 << 20, 16, 32),  # capped by the program's device blocks (32 Vector cores)
    ],
)
def test_big_vector_kernels_get_blocks_to_claim(n, workers, blocks):
    ir = _ir(n)
    prog = C.build_program(ir, ASCEND910, "k")
    assert prog.blocks == 32 or n < (1 << 20)
    assert C.host_blocks(ir, prog, workers) == blocks


def test_more_blocks_than_threads_stay_correct():
    rng = np.random.default_rng(3)
    xn = rng.standard_normal((4 << 20) + 7).astype(np.float32)
    x = lm.tensor(xn)
    (k,) = lm.schedule(lm.exp(x) * 0.5 - x).kernels
    prog = C.build_program(k.ir, ASCEND910, "k")
    t = _threads.num_threads()
    per = min(C.BLOCKS_PER_THREAD, max(1, xn.size // (t * C.BLOCK_WORK)))
    assert C.host_blocks(k.ir, prog, spec=ASCEND910) == min(prog.blocks, t * per)
    got = (lm.exp(x) * 0.5 - x).numpy()
    np.testing.assert_allclose(got, np.exp(xn) * 0.5 - xn, rtol=2e-6, atol=1e-6)


def test_observe_flags_launches_that_waited_for_a_core():
    pool = _threads.BlockPool(2)
    assert pool._spinning() and not pool.oversubscribed()
    now = time.perf_counter_ns()
    # busy the whole launch (CPU time = 90 % of wall): not late
    assert not pool._observe(now - 1_000_000, 0, now, 900_000)
    # too short to say anything
    assert not pool._observe(now - 100_000, 0, now, 0)
    assert pool.late_launches == 0
    # 1 ms of wall, 0.1 ms of CPU: waited for a core; LATE_STREAK in a row start the quiet time
    for _ in range(_threads.LATE_STREAK):
        assert pool._spinning() and not pool.oversubscribed()
        assert pool._observe(now - 1_000_000, 0, now, 100_000)
    assert pool.late_launches == _threads.LATE_STREAK and pool.quiet_periods == 1
    assert not pool._spinning() and pool.oversubscribed()
    assert pool._quiet_until == now + _threads.QUIET_NS
    pool._quiet_until = time.perf_counter_ns() - 1  # the quiet period is over
    assert pool._spinning() and not pool.oversubscribed()
    # a launch on time in between resets the streak
    pool._observe(now - 1_000_000, 0, now, 100_000)
    pool._observe(now - 1_000_000, 0, now, 900_000)
    pool._observe(now - 1_000_000, 0, now, 100_000)
    assert pool.quiet_periods == 1 and not pool.oversubscribed()


@pytest.mark.parametrize("detect", [True, False])
def test_launches_whose_blocks_wait_run_serially_for_a_while(monkeypatch, detect):
    """Blocks that sleep (wall time without CPU time, like a thread whose core was taken):
    the launcher, done with its own blocks, waits for the helper's."""
    monkeypatch.setattr(_threads, "OVERSUB_DETECT", detect)
    pool = _threads.BlockPool(2)
    ran = []

    @ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)
    def kernel(i, n, argv):  # a native kernel's signature; sleeping releases the GIL
        ran.append((i, threading.get_ident()))
        time.sleep(0.002)

    block = _threads._NativeBlocks(kernel)
    try:
        for _ in range(_threads.LATE_STREAK):
            pool.run(block, None, 6)
        assert sorted(i for i, _ in ran) == sorted(list(range(6)) * _threads.LATE_STREAK)
        assert pool.quiet_periods == (1 if detect else 0)
        assert pool.oversubscribed() is detect and pool._spinning() is (not detect)
        ran.clear()
        pool.run(block, None, 6)
        assert sorted(i for i, _ in ran) == list(range(6))
        if detect:  # oversubscribed: every block on the calling thread
            assert {t for _, t in ran} == {threading.get_ident()}
        pool.run(block, None, 6, threads=2)  # an explicit count is the caller's: not watched
        assert pool.quiet_periods == (1 if detect else 0)
        pool._quiet_until = 0
        for _ in range(_threads.LATE_STREAK):  # Python blocks wait for the GIL: not watched
            pool.run(lambda argv, i, n: time.sleep(0.002), None, 6)
        assert pool.quiet_periods == (1 if detect else 0) and not pool.oversubscribed()
    finally:
        pool.shutdown()


def test_threadpool_limits_one_runs_blocks_on_the_calling_thread():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    if not hasattr(threadpoolctl, "register"):
        pytest.skip("threadpoolctl < 3.5 has no custom controllers")
    seen = set()

    def block(argv, i, n):
        seen.add(threading.get_ident())

    with threadpoolctl.threadpool_limits(1):
        if lm.get_num_threads() != 1:
            pytest.skip("no C library threadpoolctl can see on this platform")
        _threads.run_blocks(block, None, 9)
    assert seen == {threading.get_ident()}
