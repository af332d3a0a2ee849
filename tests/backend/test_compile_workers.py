"""The compile workers' job queue: foreground compiles (someone waits for them) go first,
background ones (tier-ups, the library's optimized code) yield to them and to a realize's first
call, but always make progress. (Tier 0's -O0 code generator giving the same bits as the
optimized code: tests/backend/test_compile_tiers.py.)"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

from lazymath.backend.native import workers


def _job(tag: str):
    return (Future(), None, (tag,))


def _tag(job) -> str:
    return job[2][0]


def test_foreground_jobs_go_before_background_ones(monkeypatch):
    monkeypatch.setattr(workers, "n_workers", lambda: 2)
    q = workers._Jobs()
    q.put(_job("bg1"), background=True)
    q.put(_job("fg1"))
    q.put(_job("bg2"), background=True)
    q.put(_job("fg2"))
    first, second = q.get(), q.get()
    assert [_tag(first), _tag(second)] == ["fg1", "fg2"]
    # foreground jobs still running: no background job may start
    assert q._bg_wait() is None
    q.done(first[0])
    assert q._bg_wait() is None
    q.done(second[0])
    third = q.get()
    assert _tag(third) == "bg1"
    # at most n - 1 background jobs at once: one worker stays free for foreground work
    assert q._bg_wait() != 0.0
    q.put(_job("fg3"))
    assert _tag(q.get()) == "fg3"


def test_held_realizes_delay_background_jobs_at_most_hold_max(monkeypatch):
    monkeypatch.setattr(workers, "n_workers", lambda: 2)
    monkeypatch.setattr(workers, "HOLD_MAX", 0.5)
    q = workers._Jobs()
    q.hold(1)
    t0 = time.monotonic()  # before put: the hold is counted from the job's arrival
    q.put(_job("bg"), background=True)
    wait = q._bg_wait()
    assert wait is not None and 0.0 < wait <= 0.5
    # the job is held: the queue knows a running job by id(its future), and a freed future's
    # address may come back as the Future() below (then done() ended this job: flaky)
    job = q.get()
    assert _tag(job) == "bg"  # waits for HOLD_MAX, then runs despite the hold
    assert time.monotonic() - t0 >= 0.5
    q.hold(-1)
    q.done(Future())  # a job this queue never handed out: ignored
    assert q.bg_running == 1


def test_a_long_background_job_does_not_starve_the_others(monkeypatch):
    """One background compile running for long (or hung until the watchdog): after
    BG_STARVED seconds the next background job may take the last free worker."""
    monkeypatch.setattr(workers, "n_workers", lambda: 2)
    monkeypatch.setattr(workers, "BG_STARVED", 0.5)
    q = workers._Jobs()
    q.put(_job("long"), background=True)
    assert _tag(q.get()) == "long"
    t0 = time.monotonic()  # before put: starvation is counted from the job's arrival
    q.put(_job("next"), background=True)
    wait = q._bg_wait()
    assert wait is not None and 0.0 < wait <= 0.5
    assert _tag(q.get()) == "next"
    assert time.monotonic() - t0 >= 0.5
    q.put(_job("third"), background=True)
    assert q._bg_wait() != 0.0  # not now
    time.sleep(0.55)
    assert q._bg_wait() is None  # starved too, but both workers are busy


def test_an_abandoned_job_stops_counting_as_running(monkeypatch):
    monkeypatch.setattr(workers, "n_workers", lambda: 2)
    q = workers._Jobs()
    q.put(_job("fg"))
    stuck = q.get()
    q.put(_job("bg"), background=True)
    assert q._bg_wait() is None
    q.done(stuck[0])  # what workers.abandon(fut) does
    assert q._bg_wait() == 0.0
    q.done(stuck[0])  # the stuck job returning later changes nothing
    assert q.fg_running == 0


def test_queue_runs_jobs_on_threads_in_priority_order(monkeypatch):
    """Through real threads: one worker busy; a background and a foreground job queued
    meanwhile; the foreground one runs first."""
    monkeypatch.setattr(workers, "n_workers", lambda: 1)
    q = workers._Jobs()
    order = []
    gate = threading.Event()

    def worker():
        for _ in range(3):
            fut, fn, args = q.get()
            try:
                fut.set_result(fn(*args))
            finally:
                q.done(fut)

    busy, bg, fg = Future(), Future(), Future()
    q.put((busy, gate.wait, (30,)))
    t = threading.Thread(target=worker, daemon=True)
    t.start()
    while not q.fg_running:
        time.sleep(0.001)
    q.put((bg, order.append, ("bg",)), background=True)
    q.put((fg, order.append, ("fg",)))
    gate.set()
    bg.result(30)
    t.join(30)
    assert order == ["fg", "bg"]


def test_responsive_lowers_the_switch_interval_and_restores_it():
    """`responsive` (compile_kernels): Python's switch interval is SWITCH_INTERVAL inside,
    nested blocks keep it, the outermost exit restores the previous value."""
    import sys

    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.004)
        with workers.responsive():
            assert sys.getswitchinterval() == min(0.004, workers.SWITCH_INTERVAL)
            with workers.responsive():
                assert sys.getswitchinterval() == min(0.004, workers.SWITCH_INTERVAL)
            assert sys.getswitchinterval() == min(0.004, workers.SWITCH_INTERVAL)
        assert sys.getswitchinterval() == 0.004
    finally:
        sys.setswitchinterval(before)


def test_compile_kernels_runs_inside_responsive(monkeypatch):
    """compile_kernels holds `responsive` while it lowers and waits (the interval is back after)."""
    import sys

    import numpy as np

    import lazymath as lm
    from lazymath.backend import compile as bc

    seen = []
    real = bc._compile_kernels

    def spy(*a, **kw):
        seen.append(sys.getswitchinterval())
        return real(*a, **kw)

    monkeypatch.setattr(bc, "_compile_kernels", spy)
    before = sys.getswitchinterval()
    x = np.arange(5, dtype=np.float32)
    monkeypatch.setenv("LAZYMATH_SCALAR_ARGS", "0")  # fold the 1: the call below passes (x, out)
    (sk,) = lm.schedule(lm.exp(lm.tensor(x)) + 1).kernels
    (k,) = bc.compile_kernels([(sk.group.ir, "k")], "ascend910", "interp")
    out = np.zeros_like(x)
    k(x, out)
    np.testing.assert_allclose(out, np.exp(x) + 1, rtol=1e-6)
    assert seen == [min(before, workers.SWITCH_INTERVAL)] and sys.getswitchinterval() == before
