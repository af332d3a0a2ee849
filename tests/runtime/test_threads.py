"""The one host thread pool that runs kernel blocks (lazymath/_threads.py): every runner of
blocks (a device's streams, the engine's replay, a compiled kernel called directly) uses it,
a thread count is a cap on it (not a second pool), and errors surface after every block ran."""

from __future__ import annotations

import ctypes
import os
import threading
import types

import numpy as np
import pytest

import lazymath as lm
from lazymath import _threads
from lazymath.backend.compile import CompiledKernel
from lazymath.runtime import Device


def _on_threads(launch, n: int) -> None:
    """launch(k) for k < n, each on its own thread at once; returns when all have finished."""
    ts = [threading.Thread(target=launch, args=(k,)) for k in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


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

    _on_threads(launch, 4)
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


# ----------------------------------------------------------------------------- the native lane

_KERNEL = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_void_p))


def _native_recorder(delay: float = 0.0):
    """A C function of the kernel signature (a ctypes callback) recording (i, n, thread, argv
    address) per block; `delay` seconds of sleep per block (the GIL released meanwhile)."""
    import time

    seen: list = []

    @_KERNEL
    def fn(i, n, argv):
        if delay:
            time.sleep(delay)
        seen.append((i, n, threading.get_ident(), ctypes.cast(argv, ctypes.c_void_p).value))

    return seen, fn


def _argv():
    argv = (ctypes.c_void_p * 2)(11, 22)
    return argv, ctypes.addressof(argv)


@pytest.fixture(params=[True, False], ids=["lane", "python"])
def lane(request, monkeypatch):
    """Native launches through the lane, or (False) through the Python queue."""
    monkeypatch.setattr(_threads, "LANE", request.param)
    return request.param


@pytest.mark.parametrize("us", [0, 2000])
@pytest.mark.parametrize("blocks", [0, 1, 2, 3, 7, 64])
def test_native_launches_run_every_block_once(blocks, us, lane):
    """`run_native(cfunc, argv, n)` calls cfunc(i, n, argv) once per block, with argv the
    ctypes array's address, on the lane or the Python path, spinning or not, again after a
    pause (the lane's threads asleep on their futex), and with a thread count."""
    import time

    with _spin_us(us):
        for runner in (_threads.block_pool(), _threads.SERIAL, _threads.Threads(2),
                       _threads.Threads(3)):  # fmt: skip
            for pause in (0.0, 0.01):
                time.sleep(pause)
                seen, fn = _native_recorder()
                argv, addr = _argv()
                runner.run_native(fn, argv, blocks)
                assert sorted(i for i, _, _, _ in seen) == list(range(blocks))
                assert all(n == blocks and a == addr for _, n, _, a in seen)


@pytest.mark.skipif(_threads._spinner() is None, reason="no native lane (not Linux x86-64)")
def test_the_lane_threads_run_native_blocks():
    """With the lane, the pool's threads take part in a native launch (blocks that sleep, so
    the calling thread cannot run them all before a helper wakes); every block once."""
    pool = _threads.block_pool()
    if pool.n_threads < 2:
        pytest.skip("one core: the pool has no helper threads")
    assert pool._lane is not None and _threads.LANE
    seen, fn = _native_recorder(delay=0.005)
    argv, _ = _argv()
    pool.run_native(fn, argv, 40)
    assert sorted(i for i, _, _, _ in seen) == list(range(40))
    assert len({t for _, _, t, _ in seen}) >= 2
    helpers = {t.ident for t in pool._threads}
    assert {t for _, _, t, _ in seen} - {threading.get_ident()} <= helpers


def test_native_and_python_launches_from_several_threads(lane):
    """Launches from several threads at once, native (one holds the lane, the others go
    through the Python queue) and Python jobs mixed, each run every block once."""
    results = []

    def launch(k):
        pool = _threads.block_pool()
        for r in range(30):
            blocks = 2 + (k + r) % 6
            if (k + r) % 3:
                seen, fn = _native_recorder()
                argv, _ = _argv()
                pool.run_native(fn, argv, blocks)
                got = [i for i, _, _, _ in seen]
            else:
                seen, fn = _recorder()
                pool.run(fn, None, blocks)
                got = [i for i, _, _ in seen]
            results.append(sorted(got) == list(range(blocks)))

    _on_threads(launch, 4)
    assert len(results) == 120 and all(results)


def test_an_idle_lane_stops_spinning():
    """After native launches, the lane's threads spin their window, then sleep (futex)."""
    import time

    if not hasattr(time, "pthread_getcpuclockid"):
        pytest.skip("no per-thread CPU clocks here")
    with _spin_us(1000):
        pool = _threads.block_pool()
        for _ in range(3):
            seen, fn = _native_recorder()
            argv, _ = _argv()
            pool.run_native(fn, argv, 8)
        time.sleep(0.05)  # well past the window
        clocks = [time.pthread_getcpuclockid(t.ident) for t in pool._threads]
        cpu = [time.clock_gettime(c) for c in clocks]
        time.sleep(0.5)
        used = [time.clock_gettime(c) - c0 for c, c0 in zip(clocks, cpu)]
        assert clocks and max(used) < 0.1  # a thread spinning on would take ~0.5 s


def test_a_pool_shut_down_and_used_again_runs_every_block(lane):
    """shutdown stops the lane's threads (and the queue's); the next launch starts new ones."""
    pool = _threads.BlockPool(3)
    try:
        for _ in range(2):
            for blocks in (2, 5, 9):
                seen, fn = _native_recorder()
                argv, _ = _argv()
                pool.run_native(fn, argv, blocks)
                assert sorted(i for i, _, _, _ in seen) == list(range(blocks))
                seen, fn = _recorder()
                pool.run(fn, None, blocks)
                assert sorted(i for i, _, _ in seen) == list(range(blocks))
            threads = list(pool._threads)
            pool.shutdown()
            assert not pool._threads and not any(t.is_alive() for t in threads)
    finally:
        pool.shutdown()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_realized_results_are_the_same_through_the_lane(preset, dtype, monkeypatch):
    """A cached multi-block matmul (the replay fast path), a matmul with an epilogue and a
    reduction give the same bits with the lane as through the Python queue, equal to numpy."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((256, 256)).astype(dtype)
    b = rng.standard_normal((256, 256)).astype(dtype)
    x = rng.standard_normal((64, 4096)).astype(np.float32)
    ta, tb, tx = lm.tensor(a), lm.tensor(b), lm.tensor(x)
    got = {}
    for flag in (True, False, True):
        monkeypatch.setattr(_threads, "LANE", flag)
        for _ in range(2):  # the second call replays the cached program
            got.setdefault(flag, []).append(
                (
                    (ta @ tb).numpy(),
                    (lm.relu(ta @ tb) * 0.5).numpy(),
                    lm.sum(tx * 2.0, axis=1).numpy(),
                )
            )
    first = got[True][0]
    for runs in got.values():
        for res in runs:
            for r, f in zip(res, first):
                assert np.array_equal(r, f)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    tol = 1e-4 if dtype == "float32" else 1e-2
    np.testing.assert_allclose(first[0], ref, rtol=tol, atol=tol * 16)
    np.testing.assert_allclose(first[1], np.maximum(ref, 0) * 0.5, rtol=tol, atol=tol * 16)
    np.testing.assert_allclose(first[2], (x * 2).sum(axis=1), rtol=1e-5)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_launches_native_blocks_on_a_fresh_pool():
    """The parent's lane threads do not exist in a forked child: its first launch builds a new
    pool (a lane of its own) and runs every block."""
    seen, fn = _native_recorder()
    argv, _ = _argv()
    _threads.block_pool().run_native(fn, argv, 4)  # the parent's lane threads are running
    parent_lane = _threads.block_pool()._lane
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if every block ran once on a fresh pool
        ok = False
        try:
            seen.clear()
            pool = _threads.block_pool()
            pool.run_native(fn, argv, 6)
            ok = sorted(i for i, _, _, _ in seen) == list(range(6))
            ok = ok and (pool._lane is None or pool._lane != parent_lane)
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_lane_code_is_built_from_its_source():
    """`_threads._LANE_CODE` is machine code: it must be exactly what tools/native_lane.c
    compiles to (tools/build_native_lane.py), so a source edit without a rebuild is caught.
    Checked where the recorded compiler is installed (other gcc versions emit other bytes)."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    tools = Path(__file__).resolve().parents[2] / "tools"
    if not all(shutil.which(t) for t in ("gcc", "objcopy", "objdump", "nm")):
        pytest.skip("gcc and binutils are not installed")
    version = subprocess.run(["gcc", "--version"], capture_output=True, text=True).stdout
    src = Path(_threads.__file__).read_text()
    if version.split("\n")[0] not in src:
        pytest.skip(f"the lane was built by another gcc than {version.splitlines()[0]!r}")
    sys.path.insert(0, str(tools))
    try:
        import build_native_lane
    finally:
        sys.path.remove(str(tools))
    code, syms = build_native_lane.build()
    assert code == _threads._LANE_CODE
    assert syms == _threads._LANE_SYMBOLS
