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
