"""The one host thread pool that runs kernel blocks (lazymath/_threads.py): every runner of
blocks (a device's streams, the engine's replay, a compiled kernel called directly) uses it,
a thread count is a cap on it (not a second pool), and errors surface after every block ran."""

from __future__ import annotations

import threading
import types

import numpy as np
import pytest

import lazymath as lm
from lazymath import _threads
from lazymath.backend.compile import CompiledKernel
from lazymath.runtime import Device


def _recorder():
    seen: list = []

    def fn(argv, i, n):
        seen.append((i, n, threading.get_ident()))

    return seen, fn


@pytest.mark.parametrize("blocks", [0, 1, 2, 3, 7, 64])
def test_every_block_runs_once(blocks):
    seen, fn = _recorder()
    _threads.block_pool().run(fn, None, blocks)
    assert sorted(i for i, _, _ in seen) == list(range(blocks))
    assert all(n == blocks for _, n, _ in seen)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_thread_count_caps_the_threads_of_one_launch(threads):
    seen, fn = _recorder()
    _threads.Threads(threads).run(fn, None, 32)
    assert sorted(i for i, _, _ in seen) == list(range(32))
    assert len({t for _, _, t in seen}) <= threads


def test_serial_runs_on_the_calling_thread():
    seen, fn = _recorder()
    _threads.SERIAL.run(fn, None, 5)
    assert {t for _, _, t in seen} == {threading.get_ident()}


def test_the_first_error_is_raised_after_every_block_ran():
    ran = []

    def fn(argv, i, n):
        ran.append(i)
        if i in (1, 4):
            raise ValueError(f"block {i}")

    for runner in (_threads.block_pool(), _threads.SERIAL, _threads.Threads(3)):
        ran.clear()
        with pytest.raises(ValueError, match="block"):
            runner.run(fn, None, 6)
        assert sorted(ran) == list(range(6))


def test_concurrent_launches_share_the_pool():
    """Launches from several threads at once (two streams, or users' threads) each get all their
    blocks run: the caller always takes part, so no launch waits on another's helpers."""
    results = []

    def launch(k):
        seen, fn = _recorder()
        for _ in range(20):
            seen.clear()
            _threads.block_pool().run(fn, None, 5 + k)
            results.append(sorted(i for i, _, _ in seen) == list(range(5 + k)))

    ts = [threading.Thread(target=launch, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(results) == 80 and all(results)


def test_devices_and_compiled_kernels_use_the_one_pool():
    pool = _threads.block_pool()
    dev = Device()
    try:
        assert dev.block_pool is pool
    finally:
        dev.close()
    capped = Device(block_threads=3)
    try:  # a thread count on the shared pool, not threads of its own
        assert isinstance(capped.block_pool, _threads.Threads)
        assert capped.block_pool.n_threads == 3
    finally:
        capped.close()
    # CompiledKernel.__call__ runs its blocks through the pool too (no executor of its own)
    seen, fn = _recorder()
    fake = types.SimpleNamespace(blocks=6, make_argv=lambda arrays: arrays, run_block=fn)
    CompiledKernel.__call__(fake, np.zeros(1))
    assert sorted(i for i, _, _ in seen) == list(range(6))
    names = {t.name for t in threading.enumerate()}
    assert not any(n.startswith("lm-block") for n in names)  # the old executor's threads


def test_a_multi_block_realize_is_right_with_a_capped_device():
    x = np.arange(64 * 4096, dtype=np.float32).reshape(64, 4096) / 1e4
    for dev in (Device(block_threads=2), Device(scheduler="sync")):
        prev = lm.current_device()
        try:
            lm.runtime.set_device(dev)
            got = lm.sum(lm.tensor(x) * 2.0, axis=1).numpy()
        finally:
            lm.runtime.set_device(prev)
            dev.close()
        np.testing.assert_allclose(got, (x * 2).sum(axis=1), rtol=1e-5)


# ----------------------------------------------------------------------------- bounded spinning


def _spin_us(us: int):
    return lm.settings.override(LAZYMATH_POOL_SPIN_US=us)


@pytest.mark.parametrize("us", [0, 2000])
def test_spinning_or_not_every_block_runs_once_and_errors_surface(us):
    """Spinning only delays when an idle thread blocks on the queue: launches back to back (the
    helpers still spinning), after a pause (blocked) and from several threads at once all run
    every block once, and a failing block still raises after the others ran."""
    import time

    with _spin_us(us):
        pool = _threads.block_pool()
        for blocks in (2, 3, 7, 64, 2, 2):
            seen, fn = _recorder()
            pool.run(fn, None, blocks)
            assert sorted(i for i, _, _ in seen) == list(range(blocks))
        time.sleep(0.01)  # past the spin window: the helpers block, then wake for this launch
        seen, fn = _recorder()
        pool.run(fn, None, 5)
        assert sorted(i for i, _, _ in seen) == list(range(5))
        ran = []

        def bad(argv, i, n):
            ran.append(i)
            if i == 3:
                raise ValueError("block 3")

        with pytest.raises(ValueError, match="block 3"):
            pool.run(bad, None, 6)
        assert sorted(ran) == list(range(6))
        test_concurrent_launches_share_the_pool()


def test_an_idle_pool_stops_spinning():
    """After the spin window the pool's threads block: an idle process burns no CPU."""
    import time

    if not hasattr(time, "pthread_getcpuclockid"):
        pytest.skip("no per-thread CPU clocks here")
    with _spin_us(1000):
        seen, fn = _recorder()
        pool = _threads.block_pool()
        pool.run(fn, None, 8)
        time.sleep(0.05)  # well past the window
        clocks = [time.pthread_getcpuclockid(t.ident) for t in pool._threads]
        cpu = [time.clock_gettime(c) for c in clocks]
        time.sleep(0.5)
        used = [time.clock_gettime(c) - c0 for c, c0 in zip(clocks, cpu)]
        assert clocks and max(used) < 0.1  # a thread spinning on would take ~0.5 s


def test_the_spinner_waits_for_a_change_or_its_window():
    """The native spin returns 1 as soon as the word differs from what the waiter saw, 0 once
    its window passed; where there is no spinner (not Linux x86-64) waits block at once."""
    import ctypes
    import platform
    import sys
    import time

    sp = _threads._spinner()
    if not (sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")):
        assert sp is None
        with _spin_us(2000):
            assert _threads._spin_window() == (None, 0)
        return
    assert sp is not None
    with _spin_us(0):
        assert _threads._spin_window() == (None, 0)
    time.sleep(0.003)  # the TSC rate is measured against a reference point >= 2 ms old
    assert sp.ticks(1000) > 0 and sp.ticks(2000) >= sp.ticks(1000)
    word = ctypes.c_int64(7)
    assert sp.spin(ctypes.addressof(word), 6, sp.ticks(10**6)) == 1  # differs: returns at once
    t = time.perf_counter()
    assert sp.spin(ctypes.addressof(word), 7, sp.ticks(2000)) == 0
    assert time.perf_counter() - t >= 0.001  # it spun (about) its window, then gave up
    done = threading.Timer(0.02, lambda: setattr(word, "value", 8))
    done.start()
    assert sp.spin(ctypes.addressof(word), 7, sp.ticks(10**7)) == 1  # woken by the store
    done.join()
