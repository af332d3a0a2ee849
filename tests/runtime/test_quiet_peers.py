"""Quieting a peer's spinning pool before a long launch (issue 35, lazymath/_peers.py): the
rules (when lazymath may shut OpenBLAS's workers down, when it must not), the parsing they rest
on (/proc files as fixtures), the pool's record of long kernels, and, where numpy's BLAS is a
pthreads OpenBLAS, the real shutdown: its workers go, its next call brings them back, and no
result changes. No timing asserts: "long" is set to 0 ns where a test needs every launch long."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

import numpy as np
import pytest

import lazymath as lm
from lazymath import _peers, _threads, settings

MAPS = """\
55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 123 /usr/bin/python3.11
7f0000000000-7f0000001000 r-xp 00000000 08:01 77 /site-packages/numpy.libs/libscipy_openblas64_-32a4b2a6.so
7f0000001000-7f0000002000 r--p 00001000 08:01 77 /site-packages/numpy.libs/libscipy_openblas64_-32a4b2a6.so
7f0000003000-7f0000004000 r-xp 00000000 08:01 78 /usr/lib/x86_64-linux-gnu/libopenblasp-r0.3.21.so
7f0000005000-7f0000006000 rw-p 00000000 00:00 0
7f0000006000-7f0000007000 r-xp 00000000 08:01 79 /usr/lib/libgomp.so.1
7f0000008000-7f0000009000 r-xp 00000000 08:01 80 /opt/openblas dir/libmkl_rt.so
7ffd00000000-7ffd00001000 rw-p 00000000 00:00 0 [stack]
"""


def test_openblas_paths_from_maps():
    assert _peers.openblas_paths(MAPS) == [
        "/site-packages/numpy.libs/libscipy_openblas64_-32a4b2a6.so",
        "/usr/lib/x86_64-linux-gnu/libopenblasp-r0.3.21.so",
    ]  # each once; anonymous maps, [stack] and a directory named openblas do not count
    assert _peers.openblas_paths("") == []


@pytest.mark.parametrize(
    ("config", "ok"),
    [
        (
            b"OpenBLAS 0.3.31.188.0  USE64BITINT DYNAMIC_ARCH NO_AFFINITY SkylakeX MAX_THREADS=64",
            True,
        ),
        (b"OpenBLAS 0.3.0 NO_AFFINITY Haswell", True),
        (b"OpenBLAS 1.0.1", True),
        (b"OpenBLAS 0.2.20 DYNAMIC_ARCH", False),
        (b"something else", False),
        (None, False),
    ],
)
def test_version_rule(config, ok):
    assert _peers.version_ok(config) is ok


def test_thread_state_parsing():
    assert _peers.thread_state("4242 (python3) R 1 4242 4242 0 -1 4194368") == "R"
    assert _peers.thread_state("4243 (a) b (c) S 1 2 3") == "S"  # a name holding ") "
    assert _peers.thread_state("") == ""


def test_open_openblas_never_loads_and_refuses_other_libraries():
    assert _peers.open_openblas("/nonexistent/libopenblas.so") is None
    libc = ctypes.util.find_library("c")
    if libc:
        assert _peers.open_openblas(libc) is None  # loaded, but no OpenBLAS server in it


class _T:
    """A stand-in thread for `alone`: a name and an ident."""

    def __init__(self, name: str, ident: int) -> None:
        self.name, self.ident = name, ident


def test_alone_rules(monkeypatch):
    main = threading.main_thread()
    cur = threading.current_thread()
    pool, stream = _T("lazymath-block-0", 101), _T("lazymath-stream-0", 102)
    realize = _T("lazymath-realize", 103)
    assert _peers.alone(cur, [cur, pool, stream, realize])
    assert _peers.alone(cur, [cur])
    assert not _peers.alone(cur, [cur, pool, _T("loader", 104)])  # a user's thread
    assert not _peers.alone(cur, [cur, _T("Dask-Worker-Thread", 105)])
    monkeypatch.setattr(_peers, "BUSY", {102})
    assert not _peers.alone(cur, [cur, pool, stream])  # a stream running commands
    monkeypatch.setattr(_peers, "BUSY", set())
    # the main thread waits while the realize thread runs its program; from any other
    # lazymath thread the main thread may be doing anything
    assert _peers.alone(realize, [main, realize, pool])
    assert not _peers.alone(stream, [main, stream, pool])


class _FakeBLAS:
    """An OpenBLAS stand-in: awake until quieted."""

    def __init__(self) -> None:
        self.up, self.shutdowns = True, 0

    def awake(self) -> bool:
        return self.up

    def quiet(self) -> None:
        self.up, self.shutdowns = False, self.shutdowns + 1


@pytest.fixture
def fake(monkeypatch):
    lib = _FakeBLAS()
    monkeypatch.setattr(_peers.LIBRARIES, "get", lambda: [lib])
    monkeypatch.setattr(_peers.WATCH, "spinning", lambda py: True)
    monkeypatch.setattr(_peers, "alone", lambda current=None, threads=None: True)
    return lib


def test_quiet_peers_shuts_an_awake_library_down(fake):
    assert _peers.quiet_peers() == 1 and fake.shutdowns == 1
    assert _peers.quiet_peers() == 0 and fake.shutdowns == 1  # asleep now: nothing to do


def test_quiet_peers_respects_the_setting(fake):
    with settings.override(LAZYMATH_QUIET_PEERS=False):
        assert _peers.quiet_peers() == 0
    assert fake.shutdowns == 0


def test_quiet_peers_leaves_it_alone_when_another_thread_may_be_inside(fake, monkeypatch):
    monkeypatch.setattr(_peers, "alone", lambda current=None, threads=None: False)
    assert _peers.quiet_peers() == 0 and fake.shutdowns == 0


def test_quiet_peers_leaves_sleeping_workers_alone(fake, monkeypatch):
    monkeypatch.setattr(_peers.WATCH, "spinning", lambda py: False)
    assert _peers.quiet_peers() == 0 and fake.shutdowns == 0


def test_no_openblas_is_no_error(monkeypatch):
    monkeypatch.setattr(_peers.LIBRARIES, "get", lambda: [])
    assert _peers.quiet_peers() == 0


def test_watch_candidates_skip_python_threads_and_threads_seen_after_a_shutdown(tmp_path,
                                                                               monkeypatch):  # fmt: skip
    tasks = tmp_path / "task"
    for tid, state in ((10, "R"), (11, "S"), (12, "R")):
        (tasks / str(tid)).mkdir(parents=True)
        (tasks / str(tid) / "stat").write_text(f"{tid} (python) {state} 1 2 3")
    monkeypatch.setattr(_peers, "_TASKS", str(tasks))
    w = _peers._Watch()
    assert w.spinning({11}) is True  # 10 and 12 run
    assert w.spinning({10, 12}) is False  # only 11 is native, and it sleeps
    w.after_shutdown({11})  # 10 and 12 were there right after a shutdown: not OpenBLAS's
    assert w.spinning({11}) is False
    monkeypatch.setattr(_peers, "_TASKS", str(tmp_path / "missing"))
    assert _peers._Watch().spinning(set()) is True  # no /proc: assume it may spin


def test_pool_asks_only_before_launches_that_were_long(monkeypatch):
    calls = []
    monkeypatch.setattr(_peers, "quiet_peers", lambda: calls.append(1) or 0)
    pool = _threads.BlockPool(2)

    @ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)
    def kernel(i, n, argv):
        pass

    try:
        monkeypatch.setattr(_peers, "QUIET_MIN_NS", 1 << 62)  # nothing is long
        pool.run_native(kernel, None, 4)
        pool.run_native(kernel, None, 4)
        assert calls == []
        monkeypatch.setattr(_peers, "QUIET_MIN_NS", 0)  # everything is long
        pool.run_native(kernel, None, 4)  # recorded as long ...
        assert calls == []
        pool.run_native(kernel, None, 4)  # ... so the next launch asks first
        pool.run_native(kernel, None, 4, threads=2)
        assert len(calls) == 2
        monkeypatch.setattr(_peers, "QUIET_MIN_NS", 1 << 62)
        pool.run_native(kernel, None, 4)  # asks (long last time), then it was short
        pool.run_native(kernel, None, 4)  # short last time: no question
        assert len(calls) == 3
    finally:
        pool.shutdown()


def test_python_block_jobs_mark_their_threads_busy():
    pool = _threads.BlockPool(2)
    seen: dict[int, bool] = {}
    gate = threading.Barrier(2, timeout=10)

    def block(argv, i, n):
        gate.wait()  # both threads hold a block at once: one is a pool thread
        me = threading.get_ident()
        seen[me] = me in _peers.BUSY

    try:
        pool.run(block, None, 2)
    finally:
        pool.shutdown()
    caller = threading.get_ident()
    assert len(seen) == 2 and seen[caller] is False  # the caller is judged as the caller
    assert all(busy for t, busy in seen.items() if t != caller)
    assert not _peers.BUSY


def _numpy_openblas():
    """numpy's BLAS as an `_peers.OpenBLAS` when it is a pthreads OpenBLAS >= 0.3, else None."""
    for path in _peers.openblas_paths(open("/proc/self/maps").read()):
        lib = _peers.open_openblas(path)
        if lib is not None:
            return lib
    return None


@pytest.fixture
def two_blas_threads():
    """numpy's OpenBLAS on 2 threads for the test (an earlier test's threadpool_limits may have
    left it at 1, and a one-thread call never re-creates the workers); None if there is none."""
    lib = _numpy_openblas()
    if lib is None:
        yield None
        return
    get_n = _peers._symbol(lib._lib, "openblas_get_num_threads")
    set_n = _peers._symbol(lib._lib, "openblas_set_num_threads")
    get_n.restype, set_n.argtypes = ctypes.c_int, [ctypes.c_int]
    old = get_n()
    set_n(2)  # (re-creates the workers if they were shut down)
    yield lib
    set_n(old)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="no /proc")
def test_real_openblas_shutdown_and_lazy_restart(two_blas_threads):
    lib = two_blas_threads
    if lib is None:
        pytest.skip("numpy's BLAS is not a pthreads OpenBLAS >= 0.3")
    rng = np.random.default_rng(5)
    a = rng.standard_normal((257, 263)).astype(np.float64)
    b = rng.standard_normal((263, 251)).astype(np.float64)
    want = a @ b
    if not lib.awake():
        pytest.skip("OpenBLAS has one thread here")
    lib.quiet()
    assert not lib.awake()
    assert np.array_equal(a @ b, want)  # numpy works on: its call re-creates the workers
    lib.quiet()
    lib.quiet()  # twice in a row is harmless
    assert not lib.awake()
    set_n = _peers._symbol(lib._lib, "openblas_set_num_threads")
    set_n.argtypes = [ctypes.c_int]
    set_n(2)  # OpenBLAS's own entry points bring the server back (what threadpoolctl calls)
    assert lib.awake(), (lib._avail.value, lib._threads.value)
    assert np.array_equal(a @ b, want)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="no /proc")
@pytest.mark.parametrize("backend", ["llvm", "interp"])
def test_quieting_changes_no_result(monkeypatch, preset, backend, two_blas_threads):
    """Every launch long and every check passing: numpy's OpenBLAS (if it is one) is shut
    down before each multi-block launch that follows a numpy matmul; lazymath's and numpy's
    results stay bit-identical to those computed with quieting off."""
    monkeypatch.setenv("LAZYMATH_BACKEND", backend)
    rng = np.random.default_rng(6)
    an = rng.standard_normal((96, 130)).astype(np.float16)
    bn = rng.standard_normal((130, 67)).astype(np.float16)
    xn = rng.standard_normal(300_007).astype(np.float32)
    m = rng.standard_normal((200, 200))

    def work():
        A, B, X = lm.asarray(an), lm.asarray(bn), lm.asarray(xn)
        outs = []
        for _ in range(3):
            outs.append(m @ m)  # numpy's threaded BLAS wakes its workers
            outs.append(lm.maximum(A @ B, 0).numpy() * 0.5)
            outs.append(lm.exp(X[::-3]).numpy())
        return outs

    with settings.override(LAZYMATH_QUIET_PEERS=False):
        off = work()
    monkeypatch.setattr(_peers, "QUIET_MIN_NS", 0)
    monkeypatch.setattr(_peers.WATCH, "spinning", lambda py: True)
    monkeypatch.setattr(_peers, "alone", lambda current=None, threads=None: True)
    before = sum(lib.shutdowns for lib in _peers.LIBRARIES.get())
    with settings.override(LAZYMATH_QUIET_PEERS=True):
        on = work()
    for x, y in zip(off, on, strict=True):
        assert np.array_equal(x, y)
    if backend == "llvm" and two_blas_threads is not None and _threads.get_num_threads() > 1:
        assert sum(lib.shutdowns for lib in _peers.LIBRARIES.get()) > before
    np.testing.assert_allclose(on[1], np.maximum(an.astype(np.float32) @ bn, 0) * 0.5,
                               rtol=2e-2, atol=2e-2)  # fmt: skip
    np.testing.assert_allclose(on[2], np.exp(xn[::-3]), rtol=2e-6)


def test_fork_child_starts_clean(monkeypatch):
    monkeypatch.setattr(_peers, "LIBRARIES", _peers.LIBRARIES)
    monkeypatch.setattr(_peers, "WATCH", _peers.WATCH)
    _peers.BUSY.add(12345)
    try:
        old_libs, old_watch = _peers.LIBRARIES, _peers.WATCH
        _peers._after_fork_in_child()
        assert not _peers.BUSY
        assert _peers.LIBRARIES is not old_libs and _peers.WATCH is not old_watch
    finally:
        _peers.BUSY.discard(12345)
