"""Regression tests for the defects of issue 13 found by an outside fuzzer (one test per repro)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import lazymath as lm
from lazymath import settings
from lazymath.fusion.memory import plan_memory


@pytest.fixture(params=["ascend910", "ascend910b"])
def spec(request):
    lm.init_device(0, spec=request.param)
    yield request.param
    lm.init_device(0, spec="ascend910")


# ----------------------------------------------------------------------------- defect 3


def test_memory_plan_releases_a_buffer_read_twice_once():
    """A kernel reading one intermediate through two inputs (x - max(x)) released its block
    twice, so two later buffers that are live together got the same arena bytes."""
    kernels = [
        ([], [(1, 20)]),
        ([(1, 20), (1, 20)], [(2, 20)]),  # reads buffer 1 twice; it dies here
        ([], [(3, 4)]),
        ([(3, 4)], [(4, 4)]),
        ([(4, 4), (3, 4)], [(5, 20)]),
    ]
    plan = plan_memory(kernels, {2, 5}, lambda k, i, o: False)
    a, b = plan.buffers[3], plan.buffers[4]
    assert a.offset + 64 <= b.offset or b.offset + 64 <= a.offset, (a, b)


def _log_softmax_and_softmax():
    a = lm.log_softmax(lm.asarray(np.array([20.81, 16.04, 7.70, 4.07, 7.27], np.float32)))
    b = lm.softmax(lm.asarray(np.ones((1, 5), np.float32)), axis=0)
    return a, b


def test_realize_order_does_not_change_log_softmax(backend, spec):
    x = np.array([20.81, 16.04, 7.70, 4.07, 7.27], np.float32)
    want = x - x.max() - np.log(np.exp(x - x.max()).sum())
    for order in itertools.permutations(range(2)):
        ts = _log_softmax_and_softmax()
        lm.realize(*[ts[i] for i in order])
        np.testing.assert_allclose(ts[0].numpy(), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ts[1].numpy(), np.ones((1, 5)), rtol=1e-6)


def test_sigmoid_softmax_concat_with_log_softmax(backend):
    """The issue's second instance: sigmoid(softmax(x)) concatenated, realized together with
    a log_softmax over axis 0, in every order."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    y = rng.standard_normal((4, 5)).astype(np.float32)

    def np_softmax(v, axis):
        e = np.exp(v - v.max(axis, keepdims=True))
        return e / e.sum(axis, keepdims=True)

    s = 1 / (1 + np.exp(-np_softmax(x, -1)))
    want_c = np.concatenate([s, s], 0)
    want_l = y - y.max(0) - np.log(np.exp(y - y.max(0)).sum(0))
    for order in itertools.permutations(range(2)):
        sx = lm.sigmoid(lm.softmax(lm.asarray(x)))
        ts = (lm.concatenate([sx, sx], 0), lm.log_softmax(lm.asarray(y), axis=0))
        lm.realize(*[ts[i] for i in order])
        np.testing.assert_allclose(ts[0].numpy(), want_c, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ts[1].numpy(), want_l, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- defect 4


@pytest.mark.parametrize("shape", [(0, 4), (4, 0), (0,), (3, 0, 2)])
def test_zero_size_graph_with_a_cast(backend, shape, check):
    x = np.zeros(shape)
    check(lm.asarray(x).astype("float32") * 2, x.astype(np.float32) * 2)
    check(lm.exp(lm.asarray(x).astype("float16")) + 1, np.exp(x.astype(np.float16)) + 1)


# ----------------------------------------------------------------------------- defect 5


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_var_std_of_complex_are_real_like_numpy(backend, dtype, check):
    x = np.array([1 + 1j, -1 - 1j, 1j, -1j], dtype)
    check(lm.var(lm.asarray(x)), np.var(x))
    check(lm.std(lm.asarray(x)), np.std(x))
    rng = np.random.default_rng(0)
    z = (rng.standard_normal((3, 7)) + 1j * rng.standard_normal((3, 7))).astype(dtype)
    for axis in (None, 0, 1):
        check(lm.var(lm.asarray(z), axis=axis, ddof=1), np.var(z, axis=axis, ddof=1))
        check(lm.std(lm.asarray(z), axis=axis, keepdims=True),
              np.std(z, axis=axis, keepdims=True))  # fmt: skip


# ----------------------------------------------------------------------------- defect 2


@pytest.mark.parametrize("shape", [(31, 8), (30, 8), (31, 4), (31, 2), (63, 2), (5, 1)])
@pytest.mark.parametrize("dtype", [np.bool_, np.int8])
def test_flip_of_small_rows_compiles(shape, dtype, spec, monkeypatch):
    """LLVM's loop vectorizer aborted the process (SIGABRT) on the reversed row copy of a flip
    of 2-, 4- or 8-byte rows; the copy loop is now kept away from the vectorizer."""
    monkeypatch.setenv("LAZYMATH_BACKEND", "llvm")
    x = (np.arange(np.prod(shape)).reshape(shape) % 3).astype(dtype)
    for axis in (0, 1, (0, 1)):
        np.testing.assert_array_equal(lm.flip(lm.asarray(x), axis).numpy(), np.flip(x, axis))


# ----------------------------------------------------------------------------- defect 8 (caches)


def test_caches_are_bounded_and_evicted_code_is_freed(tmp_path, monkeypatch):
    from lazymath.backend.native import jit, kernel_cache

    monkeypatch.setenv("LAZYMATH_BACKEND", "llvm")
    monkeypatch.setenv("LAZYMATH_CACHE_DIR", str(tmp_path / "kc"))
    monkeypatch.setenv("LAZYMATH_KERNEL_CACHE_LIMIT", "4")
    monkeypatch.setenv("LAZYMATH_PROGRAM_CACHE_LIMIT", "3")
    monkeypatch.setenv("LAZYMATH_DISK_CACHE_LIMIT", "1")  # keeps just the newest file
    monkeypatch.setenv("LAZYMATH_SCALAR_ARGS", "0")  # each scalar value: a new kernel to evict
    lm.clear_cache()
    base = jit.loaded_code()["symbols"]
    x = np.linspace(-1, 1, 1003).astype(np.float32)
    kept = lm.tensor(x) * 7.0 + 1.0  # a live result keeps nothing compiled alive
    kept.realize()
    for i in range(12):
        s = 1.0 + i * 1e-3
        np.testing.assert_allclose((lm.tensor(x) * s).numpy(), x * np.float32(s), rtol=1e-6)
        info = lm.cache_info()
        assert info["programs"] <= 3 and info["memory_entries"] <= 4
        assert info["disk_files"] <= 1
    assert jit.loaded_code()["symbols"] - base <= 4 + 3  # code of evicted kernels is freed
    assert info["program_evictions"] >= 9 and info["memory_evictions"] >= 8
    assert info["disk_evictions"] >= 11
    lm.clear_cache()
    assert jit.loaded_code()["symbols"] == base
    np.testing.assert_allclose(kept.numpy(), x * 7 + 1, rtol=1e-6)
    # everything still compiles and runs after the code was freed
    np.testing.assert_allclose((lm.tensor(x) * 1.0).numpy(), x, rtol=1e-6)
    kernel_cache.reset_stats()


# ----------------------------------------------------------------------------- defect 9


def test_big_endian_input_is_converted_and_named_clearly(backend, check):
    x = np.arange(6, dtype=">f4").reshape(2, 3)
    check(lm.asarray(x) * 2, x.astype(np.float32) * 2)
    check(lm.asarray(np.arange(3, dtype=">i8")) + 1, np.arange(3) + 1)
    with pytest.raises(TypeError, match="byte order.*big-endian"):
        lm.asarray(np.ones(3, np.float32)).astype(">f4")


@pytest.mark.parametrize("dtype", [np.int8, np.int32])
def test_pad_constant_that_does_not_fit_raises_like_numpy(dtype):
    x = np.ones(3, dtype)
    big = 1000 if dtype == np.int8 else 2**40
    with pytest.raises(OverflowError):
        np.pad(x, 1, constant_values=big)
    with pytest.raises(OverflowError, match="does not fit"):
        lm.pad(lm.asarray(x), 1, constant_values=big)
    lo = int(np.iinfo(dtype).min)
    np.testing.assert_array_equal(lm.pad(lm.asarray(x), 1, constant_values=lo).numpy(),
                                  np.pad(x, 1, constant_values=lo))  # fmt: skip


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.bool_])
def test_integer_to_negative_integer_power_raises_like_numpy(dtype, backend, check):
    x = np.array([1, 2, 3], dtype)
    for e in (-1, np.int64(-2)):
        with pytest.raises(ValueError, match="negative integer powers"):
            np.power(x, e)
        with pytest.raises(ValueError, match="negative integer powers"):
            lm.asarray(x) ** e
    if dtype != np.bool_:
        check(lm.asarray(x) ** 2, x**2)
        check(lm.asarray(x) ** -1.0, x**-1.0)
        # an exponent whose values are known (realized tensor, array, list) is checked at the
        # call like numpy's; a non-negative one computes normally
        exps = np.array([1, -2, 0], dtype)
        for e in (lm.asarray(exps), exps, [1, -2, 0]):
            with pytest.raises(ValueError, match="negative integer powers"):
                np.power(x, np.asarray(e) if not isinstance(e, lm.Tensor) else exps)
            with pytest.raises(ValueError, match="negative integer powers"):
                lm.asarray(x) ** e
        with pytest.raises(ValueError, match="negative integer powers"):
            2 ** lm.asarray(exps)
        check(lm.asarray(x) ** lm.asarray(np.abs(exps)), x ** np.abs(exps))


@pytest.mark.parametrize(
    "make",
    [lambda: lm.zeros((2**62, 4)), lambda: lm.zeros((2**61, 4)).reshape(-1),
     lambda: lm.broadcast_to(lm.asarray(np.ones(3)), (2**62, 3)),
     lambda: lm.ones((2**40, 2**40), "int8")],
)  # fmt: skip
def test_sizes_overflowing_int64_are_refused_at_the_call(make):
    with pytest.raises(ValueError, match="too big"):
        make()


_SIGINT = r"""
import os, signal, threading, time
import numpy as np
import lazymath as lm
from lazymath import engine

running = threading.Event()
run = engine.Program.run


def watched_run(self, *args, **kw):  # the long program has started its kernels
    running.set()
    return run(self, *args, **kw)


engine.Program.run = watched_run
x = lm.asarray(np.ones(1, np.float32))
t = lm.sum(lm.broadcast_to(x, (2**22, 2**22)))  # 2**44 elements: hours of work


def ctrl_c():  # Ctrl-C once the kernels run, however long compiling took on this host
    running.wait()
    time.sleep(0.5)  # well inside the tile loops: a flag read once at their entry misses it
    os.kill(os.getpid(), signal.SIGINT)


threading.Thread(target=ctrl_c, daemon=True).start()
try:
    t.realize()
    print("finished")
except KeyboardInterrupt:
    print("interrupted")
engine.Program.run = run
print(float(lm.sum(lm.broadcast_to(x, (1000, 1000))).numpy()))  # the process still works
"""


@pytest.mark.parametrize("be", ["llvm", "interp"])
def test_ctrl_c_stops_a_huge_reduction(be, tmp_path):
    """SIGINT while the kernels of a 2**44-element sum run (sent half a second after they have
    started, however long compiling took): the tile loops see the cancel flag and return, the
    realize raises KeyboardInterrupt, and the process keeps working. (Finishing the sum would
    take hours: the subprocess timeout is the only bound.) On llvm this failed whenever the
    signal came after the kernels' first tile: O3 hoisted the flag's load out of the stride-0
    tile loop (llvmlite drops ``volatile``); the flag is now read by an atomic load."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "LAZYMATH_BACKEND": be,
           "LAZYMATH_CACHE_DIR": str(tmp_path / "kc")}  # fmt: skip
    p = subprocess.run([sys.executable, "-c", _SIGINT], env=env, capture_output=True, text=True,
                       timeout=240)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["interrupted", "1000000.0"], p.stdout + p.stderr[-2000:]


def test_tile_loops_read_the_cancel_flag_atomically(monkeypatch):
    """The LLVM IR of a stride-0 tile loop reads the cancel flag with an atomic load: a plain
    load (llvmlite has no volatile ones) is loop-invariant, and O3 hoisted it out of the loop
    -- the cause of the llvm case of test_ctrl_c_stops_a_huge_reduction failing. In process,
    nothing runs: the program is taken at its first run."""
    from lazymath import engine

    class Taken(Exception):
        pass

    taken: list = []

    def take(self, *args, **kw):
        taken.extend(ck for _, ck, _ in self.kernels)
        raise Taken

    monkeypatch.setenv("LAZYMATH_BACKEND", "llvm")
    monkeypatch.setattr(engine.Program, "run", take)
    x = lm.asarray(np.ones(1, np.float32))
    with pytest.raises(Taken):
        lm.sum(lm.broadcast_to(x, (2**22, 2**22))).realize()
    (ck,) = taken
    reads = [ln for ln in ck.llvm_ir.splitlines() if '@"lazymath_cancel"' in ln and "load" in ln]
    assert reads, ck.llvm_ir
    assert all("load atomic" in ln and "monotonic" in ln for ln in reads), reads


def test_long_realizes_share_one_realize_thread(monkeypatch):
    """The main thread's long programs run on one long-lived realize thread (a fresh thread per
    realize faulted in a new stack and GEMM workspace every time): the same thread runs every
    long realize, results equal numpy, and an error raised there reaches the caller, after
    which the thread still serves."""
    import threading

    from lazymath import engine

    monkeypatch.setattr(engine, "LONG_WORK", 0)  # every program counts as long
    ran_on: list = []
    run = engine.Program.run

    def spying_run(self, *args, **kw):
        ran_on.append(threading.current_thread())
        return run(self, *args, **kw)

    monkeypatch.setattr(engine.Program, "run", spying_run)
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.linspace(-1, 1, 20, dtype=np.float32).reshape(4, 5)
    for k in range(3):
        got = (lm.relu(lm.asarray(a) @ lm.asarray(b)) * (k + 0.5)).numpy()
        np.testing.assert_allclose(got, np.maximum(a @ b, 0) * (k + 0.5), rtol=1e-6)
    assert len(ran_on) == 3 and len(set(ran_on)) == 1
    assert ran_on[0] is not threading.main_thread() and ran_on[0].name == "lazymath-realize"
    with pytest.raises(ZeroDivisionError):
        engine._REALIZE_THREAD.run(lambda: 1 / 0)
    assert engine._REALIZE_THREAD.run(lambda: 41 + 1) == 42
    assert sum(t.name == "lazymath-realize" for t in threading.enumerate()) == 1


# ----------------------------------------------------------------------------- fuzzer findings


@pytest.mark.parametrize("backend", ["llvm", "interp"])
def test_complex_cast_feeding_a_row_region_stays_on_ai_cpu(backend):
    """Fuzzer seed 200196: a complex -> bool cast (an AI CPU kernel: complex has no AI Core
    lowering) read by a softmax's row region was fused into the row kernel (the region's
    nodes skipped the AI CPU boundary check): 'dtype complex64 has no LLVM lowering'."""
    x = np.array([-2.29 - 0.018j, -0.61 + 0.97j, 0j, -0.25 + 1.01j], np.complex64)
    s = np.float32(0.87)
    xs = lm.asarray(x)
    e = lm.expand_dims(lm.asarray(s), 0)
    e.realize()  # a realized broadcast operand, as in the fuzzer's 'intermediate' order
    w = lm.where(lm.logical_and(xs, xs), e, lm.asarray(np.float32(-1.5)))
    out = lm.softmax(w)
    kinds = {sk.group.kind for sk in lm.schedule(out).kernels}
    assert "aicpu" in kinds and "rows" in kinds
    with settings.override(LAZYMATH_BACKEND=backend):
        got = out.numpy()
    v = np.where(np.logical_and(x, x), s, np.float32(-1.5))
    want = np.exp(v - v.max()) / np.exp(v - v.max()).sum()
    np.testing.assert_allclose(got, want, rtol=1e-6)


# ----------------------------------------------------------------------------- defect 8: scalars


@pytest.mark.parametrize("backend", ["llvm", "interp"])
def test_scalar_args_compile_once_for_every_value(backend):
    """LAZYMATH_SCALAR_ARGS=1 (the default): `a * s + 0.5` over 25 values of s builds one program and one
    set of kernels (the scalar is a 0-d kernel input, not a literal); every result is right."""
    from lazymath import engine

    x = np.linspace(-3, 3, 1001).astype(np.float32)
    a = lm.asarray(x)
    with settings.override(LAZYMATH_SCALAR_ARGS="1", LAZYMATH_BACKEND=backend):
        misses = engine.PROGRAMS.misses
        for i in range(25):
            s = 1.0 + i * 1e-3
            got = (a * s + 0.5).numpy()
            np.testing.assert_allclose(got, x * np.float32(s) + np.float32(0.5), rtol=1e-6)
        assert engine.PROGRAMS.misses - misses == 1


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32", "bool", "complex64"])
def test_scalar_args_keep_the_weak_scalar_dtype(dtype):
    """The scalar argument has the dtype numpy's weak-scalar rule gives a Python float, on
    either side of + - * /: results (values and dtypes) are numpy's."""
    v = (np.arange(7) - 3).astype(dtype)
    t = lm.asarray(v)
    with settings.override(LAZYMATH_SCALAR_ARGS="1"):
        for f in (lambda u: u * 2.5, lambda u: 2.5 - u, lambda u: u / 0.75, lambda u: 1.5 + u):
            got, want = f(t).numpy(), f(v)
            assert got.dtype == want.dtype
            np.testing.assert_allclose(got, want, rtol=1e-3)


def test_scalar_args_leave_lazymath_composites_folded():
    """Only scalars written in user code become arguments (the default): mean's own 1/n (a
    constant of lazymath's code) stays folded, the user's `* 2.0` is one more kernel input.
    A row kernel (softmax) takes its scalars folded (its pipelined form has no scalar input,
    see engine.plan_schedule), so its kernels equal the setting-off ones."""
    a = lm.asarray(np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8))

    def inputs(f):
        return [len(sk.group.ir.inputs) for sk in lm.schedule(f(a * 2.0)).kernels]

    def mean(t):
        return lm.mean(t, axis=1)

    with settings.override(LAZYMATH_SCALAR_ARGS="0"):
        off, soft = inputs(mean), inputs(lm.softmax)
    assert inputs(mean) == [n + 1 for n in off]  # only the user's `* 2.0`
    assert inputs(lm.softmax) == soft


class _InterruptAfterQueueing:
    """A Condition whose notify() is followed by a KeyboardInterrupt: Ctrl-C landing right
    after the realize thread's job was queued, before the caller's interruptible wait."""

    def __init__(self, cv) -> None:
        self.cv = cv  # the realize thread's own (it waits on it)

    def __enter__(self):
        return self.cv.__enter__()

    def __exit__(self, *exc):
        return self.cv.__exit__(*exc)

    def wait(self, *a):
        return self.cv.wait(*a)

    def notify(self) -> None:
        self.cv.notify()
        raise KeyboardInterrupt


def test_ctrl_c_right_after_queueing_does_not_leave_the_job_running():
    """A Ctrl-C between queueing a long program on the realize thread and waiting for it
    escaped before the cancel flag was raised: the kernels ran on (for hours, holding the
    block pool, so the next realize hung). Now the job is withdrawn if it has not started,
    or cancelled and waited for; either way nothing runs after the KeyboardInterrupt."""
    import time

    from lazymath import engine
    from lazymath.backend.npu import cancel

    rt = engine._RealizeThread()
    state: list = []

    def long_job():  # polls the cancel flag like a tile loop; 20 s at most
        state.append("started")
        end = time.monotonic() + 20
        while not cancel.CANCEL.value and time.monotonic() < end:
            time.sleep(0.001)
        state.append("stopped")

    assert rt.run(lambda: 7) == 7  # the thread exists: the next job may start at once
    rt._cv = _InterruptAfterQueueing(rt._cv)
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        rt.run(long_job)
    assert time.monotonic() - t0 < 10
    time.sleep(0.3)  # a job left queued would have started by now
    assert state in ([], ["started", "stopped"]), state  # withdrawn, or cancelled and joined
    assert not cancel.CANCEL.value
    rt._cv = rt._cv.cv
    assert rt.run(lambda: 8) == 8  # still serves
