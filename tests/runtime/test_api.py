"""Streams, events, launches and errors of the AscendCL-like runtime, under both schedulers."""

from __future__ import annotations

import os
import random
import threading
import time

import numpy as np
import pytest
from conftest import SleepKernel

from lazymath import runtime as rt
from lazymath.runtime import Device, Event, KernelLaunchError


def _intersect(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_every_block_runs_once(device):
    seen = np.zeros(7, dtype=np.int32)

    def body(argv, i, n):
        assert n == 7
        argv[0][i] += 1

    k = SleepKernel("blocks", body=body)
    device.launch(k, 7, [seen])
    device.synchronize()
    assert seen.tolist() == [1] * 7
    assert sorted(k.calls) == list(range(7))


def test_zero_blocks_is_a_no_op(device):
    k = SleepKernel("empty")
    device.launch(k, 0, [])
    device.synchronize()
    assert k.calls == []


def test_two_streams_run_concurrently(device):
    """Threads: the kernels on two streams run at the same time (each block waits at a barrier
    for the other: only concurrent execution gets both through). Sync: in launch order, one
    after the other. Event order, not wall time (which is a benchmark's job)."""
    if device.scheduler == "threads":
        meet = threading.Barrier(2)

        def body(*_):
            meet.wait(timeout=120)  # a liveness bound, not a speed assertion

        a, b = SleepKernel("a", body=body), SleepKernel("b", body=body)
    else:
        a, b = SleepKernel("a", 0.001), SleepKernel("b")
    device.launch(a, 1, [], device.stream(0))
    device.launch(b, 1, [], device.stream(1))
    device.synchronize()
    assert a.calls == [0] and b.calls == [0]
    if device.scheduler == "threads":
        assert _intersect(a.span, b.span)
    else:
        assert not _intersect(a.span, b.span)
        assert a.span[1] <= b.span[0]  # launch order


def test_same_stream_is_in_order(device):
    order = []
    ks = [SleepKernel(f"k{i}", random.random() * 0.002, body=lambda *_, i=i: order.append(i))
          for i in range(20)]  # fmt: skip
    st = device.create_stream()
    for k in ks:
        device.launch(k, 1, [], st)
    st.synchronize()
    assert order == list(range(20))


def test_event_orders_streams_under_random_sleeps(device):
    """A on s1 writes, s2 waits for the event recorded after A, B reads A's output."""
    s1, s2 = device.stream(1), device.stream(2)
    rng = random.Random(6)
    buf = np.zeros(1, dtype=np.int64)
    out = np.zeros(60, dtype=np.int64)
    ev = Event("a_done")
    for trial in range(60):

        def write(argv, i, n, trial=trial):
            argv[0][0] = trial

        def read(argv, i, n, trial=trial):
            argv[1][trial] = argv[0][0]

        a = SleepKernel("A", rng.random() * 0.002, write)
        b = SleepKernel("B", rng.random() * 0.0005, read)
        device.launch(a, 1, [buf], s1)
        ev.record(s1)
        s2.wait_event(ev)
        device.launch(b, 1, [buf, out], s2)
        # the next trial's A may overwrite buf only after B has read it
        back = Event()
        back.record(s2)
        s1.wait_event(back)
    device.synchronize()
    assert out.tolist() == list(range(60))


def test_wait_event_blocks_the_stream_not_the_host(device):
    """The host enqueues a wait and a launch behind a kernel that cannot finish yet (it waits for
    the host's gate): both calls return while A is still running, B starts only after A."""
    if device.scheduler == "sync":
        pytest.skip("sync mode runs everything inline on the host")
    s1, s2 = device.stream(1), device.stream(2)
    gate = threading.Event()
    a = SleepKernel("A", body=lambda *_: gate.wait(timeout=120))
    b = SleepKernel("B")
    ev = Event()
    device.launch(a, 1, [], s1)
    ev.record(s1)
    s2.wait_event(ev)
    device.launch(b, 1, [], s2)  # the host went on: A is still blocked on the gate
    assert not ev.query() and a.calls == [] and b.calls == []
    gate.set()
    s2.synchronize()
    assert ev.query()
    assert b.span[0] >= a.span[1]


def test_rerecorded_event_binds_waiters_to_the_earlier_record(device):
    s1, s2 = device.stream(1), device.stream(2)
    ev = Event()
    order = []
    device.launch(SleepKernel("A", 0.01, lambda *_: order.append("A")), 1, [], s1)
    ev.record(s1)
    s2.wait_event(ev)
    device.launch(SleepKernel("B", 0.0, lambda *_: order.append("B")), 1, [], s2)
    device.launch(SleepKernel("C", 0.05, lambda *_: order.append("C")), 1, [], s1)
    ev.record(s1)  # B must not wait for C
    device.synchronize()
    assert order.index("A") < order.index("B")
    if device.scheduler == "threads":
        assert order.index("B") < order.index("C")


def test_unrecorded_event_is_complete(device):
    ev = Event()
    assert ev.query()
    ev.synchronize()
    device.default_stream.wait_event(ev)  # no-op
    device.synchronize()


def test_event_elapsed_time_and_query(device):
    st = device.default_stream
    start, end = Event(), Event()
    start.record(st)
    device.launch(SleepKernel("sleep", 0.02), 1, [], st)
    end.record(st)
    end.synchronize()
    assert start.query() and end.query()
    ms = rt.elapsed_time(start, end)
    assert ms >= 15.0  # at least the 20 ms sleep between the records (no upper bound: load)
    assert start.elapsed_time(end) == ms
    with pytest.raises(rt.DeviceError, match="never recorded"):
        rt.elapsed_time(Event(), end)


def test_failing_kernel_surfaces_at_stream_synchronize(device):
    def boom(argv, i, n):
        raise ValueError("bad tile")

    k = SleepKernel("k3_exp_mul", body=boom)
    k.source_loc = "model.py:42"
    st = device.create_stream()
    device.launch(k, 1, [], st)
    with pytest.raises(KernelLaunchError) as info:
        st.synchronize()
    err = info.value
    assert err.kernel_name == "k3_exp_mul" and err.source_loc == "model.py:42"
    assert "k3_exp_mul" in str(err) and "model.py:42" in str(err) and "bad tile" in str(err)
    assert isinstance(err.__cause__, ValueError)
    # reported once; the runtime stays usable
    st.synchronize()
    device.synchronize()
    ok = SleepKernel("ok")
    device.launch(ok, 2, [], st)
    st.synchronize()
    assert sorted(ok.calls) == [0, 1]


def test_failing_block_of_multi_block_kernel(device):
    def boom(argv, i, n):
        if i == 3:
            raise RuntimeError(f"block {i}")

    k = SleepKernel("multi", body=boom)
    device.launch(k, 6, [])
    with pytest.raises(KernelLaunchError, match="block 3"):
        device.synchronize()
    assert sorted(k.calls) == [0, 1, 2, 4, 5]  # the other blocks still ran


def test_error_surfaces_at_device_and_event_synchronize(device):
    def boom(argv, i, n):
        raise ZeroDivisionError("x")

    s1, s2 = device.stream(1), device.stream(2)
    device.launch(SleepKernel("bad", body=boom), 1, [], s1)
    ev = Event()
    ev.record(s1)
    with pytest.raises(KernelLaunchError, match="'bad'"):
        ev.synchronize()
    device.synchronize()  # already reported
    # an error crosses streams through a wait
    device.launch(SleepKernel("bad2", body=boom), 1, [], s1)
    ev.record(s1)
    s2.wait_event(ev)
    with pytest.raises(KernelLaunchError, match="'bad2'"):
        s2.synchronize()
    device.synchronize()
    # several errors: the first is raised, the rest ride along
    device.launch(SleepKernel("e1", body=boom), 1, [], s1)
    device.launch(SleepKernel("e2", body=boom), 1, [], s1)
    with pytest.raises(KernelLaunchError, match="'e1'") as info:
        device.synchronize()
    assert [e.kernel_name for e in info.value.others] == ["e2"]


def test_sync_mode_runs_inline_without_threads(monkeypatch):
    monkeypatch.setenv("LAZYMATH_SCHEDULER", "sync")
    before = threading.active_count()
    dev = Device()
    assert dev.scheduler == "sync" and threading.active_count() == before
    where = []
    k = SleepKernel("inline", body=lambda *_: where.append(threading.get_ident()))
    dev.launch(k, 3, [], dev.stream(1))
    assert where == [threading.get_ident()] * 3  # ran at launch, before any synchronize
    ev = Event()
    ev.record(dev.stream(1))
    assert ev.query()
    dev.close()


def test_bad_scheduler_name(monkeypatch):
    monkeypatch.setenv("LAZYMATH_SCHEDULER", "fast")
    with pytest.raises(ValueError, match="LAZYMATH_SCHEDULER"):
        Device()


def test_closed_device_runs_inline():
    dev = Device(scheduler="threads")
    dev.close()
    k = SleepKernel("after_close")
    dev.launch(k, 2, [], dev.stream(1))
    dev.synchronize()
    assert sorted(k.calls) == [0, 1]


def test_execute_replays_a_program(device):
    """Device.execute: waits, launch and record per step, as a compiled program replays."""
    log = []
    ka = SleepKernel("a", 0.003, lambda *_: log.append("a"))
    kb = SleepKernel("b", 0.0, lambda *_: log.append("b"))
    kj = SleepKernel("join", 0.0, lambda *_: log.append("join"))
    program = [
        rt.Launch(ka, 1, stream=0, record=0),
        rt.Launch(kb, 1, stream=1, record=1),
        rt.Launch(kj, 1, stream=1, waits=(0,)),
    ]
    events = [Event(), Event()]
    for _ in range(3):
        log.clear()
        device.execute(program, [(), (), ()], events)
        assert log[-1] == "join" and sorted(log) == ["a", "b", "join"]


def test_make_argv_uses_kernel_builder(device):
    class WithArgv(SleepKernel):
        def make_argv(self, arrays):
            return ("built", [a.nbytes for a in arrays])

    got = []
    k = WithArgv("argv", body=lambda argv, i, n: got.append(argv))
    buf = device.malloc(100)
    device.launch(k, 1, [buf, np.zeros(3, np.float32)])
    device.synchronize()
    assert got == [("built", [100, 12])]
    device.free(buf)


def test_host_callback_and_stream_ordered_free(device):
    st = device.create_stream()
    buf = device.malloc(4096)
    seen = []

    def body(argv, i, n):
        time.sleep(0.01)
        seen.append(device.memory_stats().allocated)

    device.launch(SleepKernel("user", body=body), 1, [buf], st)
    device.free(buf, st)  # returns to the pool only after the kernel
    st.launch_callback(lambda: seen.append("cb"))
    st.synchronize()
    assert seen[0] >= 4096 and seen[1] == "cb"
    assert buf.freed and device.memory_stats().allocated == 0


def test_module_level_api_uses_current_device(monkeypatch):
    monkeypatch.delenv("LAZYMATH_SCHEDULER", raising=False)
    old = rt.api._CURRENT
    rt.api._CURRENT = None  # do not close whatever device another test made current
    try:
        dev = rt.init_device(0, "ascend910b")
        assert rt.current_device() is dev and dev.spec.name == "ascend910b"
        assert rt.init_device(0, "ascend910b") is dev  # idempotent
        buf = rt.malloc(64)
        rt.memcpy_h2d(buf, np.arange(16, dtype=np.float32))
        k = SleepKernel("double", body=lambda argv, i, n: np.multiply(argv[0], 2, out=argv[0]))
        rt.launch(k, 1, [buf.as_array(np.float32, 16)])
        rt.synchronize()
        out = rt.memcpy_d2h(np.empty(16, np.float32), buf)
        np.testing.assert_array_equal(out, np.arange(16, dtype=np.float32) * 2)
        rt.free(buf)
        assert rt.memory_stats().allocated == 0
        s = rt.create_stream()
        e = rt.create_event("e")
        e.record(s)
        e.synchronize()
        dev2 = rt.init_device(0, "ascend910")
        assert dev2 is not dev and rt.current_device() is dev2
        assert rt.init_device(0, "ascend910b") is dev  # switching back: the same device
        assert rt.init_device(0, "ascend910b", memory_limit=1 << 20) is not dev
    finally:
        rt.api._CURRENT = old


def test_many_launches_on_one_stream_each_run_once_in_order(device):
    """launch + synchronize repeated 2,000 times: every launch runs exactly once, in order (the
    overhead itself is measured by tests/runtime/bench_launch.py, not asserted here)."""
    import ctypes

    libc = ctypes.CDLL(None)
    order: list[int] = []

    class Trivial:
        name = "trivial"

        def run_block(self, argv, i, n):
            libc.getpid()  # a real ctypes call (releases the GIL)
            order.append(argv[0])

    k, st = Trivial(), device.default_stream
    for j in range(2000):
        device.launch_argv(k, 1, (j,), st)
        st.synchronize()
        assert order[-1] == j
    assert order == list(range(2000))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_runs_inline(device):
    device.launch(SleepKernel("parent"), 1, [], device.stream(1))
    device.synchronize()
    pid = os.fork()
    if pid == 0:  # child: worker threads are gone, launches must still complete
        code = 1
        try:
            seen = np.zeros(2, np.int64)
            k = SleepKernel("child", body=lambda argv, i, n: argv[0].__setitem__(i, 7))
            device.launch(k, 2, [seen], device.stream(1))
            ev = Event()
            ev.record(device.stream(1))
            ev.synchronize()
            device.synchronize()
            code = 0 if seen.tolist() == [7, 7] else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
