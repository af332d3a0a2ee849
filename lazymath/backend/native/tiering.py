"""Background (tiered) compilation: the count of tier-ups in flight, the watchdog that gives up
on a hung background compile, and `wait_tiering`.

A kernel (compile.py) or a vector math library function (vmlib.py) starts on quick tier-0
code and is replaced when its optimized code arrives from the compile workers. Both use this
module, which sits below them and the compile driver: it was part of compile.py, which made
vmlib import compile and compile import vmlib (an import cycle, issue 36).
"""

from __future__ import annotations

import atexit
import heapq
import os
import threading
import time
import warnings
from concurrent.futures import Future

from lazymath import settings
from lazymath.backend.native import isolate, workers

TIER_STATS = {"tiered": 0, "tiered_up": 0}  # kernels started on tier 0 / replaced since


def tiered_setting() -> bool:
    """LAZYMATH_TIERED=0 turns tiered compilation off (every kernel waits for its final code)."""
    return settings.TIERED.get()


class _Watchdog:
    """One daemon thread that fires callbacks at deadlines (the background compiles' watchdog:
    a timer thread per tier-up would be one thread per kernel)."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.heap: list = []
        self.seq = 0
        self.thread: threading.Thread | None = None

    def at(self, delay: float, fn) -> None:
        with self.cv:
            self.seq += 1
            heapq.heappush(self.heap, (time.monotonic() + delay, self.seq, fn))
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._loop, name="lazymath-watchdog",
                                               daemon=True)  # fmt: skip
                self.thread.start()
            self.cv.notify()

    def _loop(self) -> None:
        while True:
            with self.cv:
                while not self.heap or self.heap[0][0] > time.monotonic():
                    wait = self.heap[0][0] - time.monotonic() if self.heap else None
                    self.cv.wait(wait)
                _, _, fn = heapq.heappop(self.heap)
            try:
                fn()
            except Exception:  # noqa: BLE001,S110 - a watchdog callback must not kill the thread
                pass


_watchdog = _Watchdog()


def watch_background(fut, retry, on_done, what: str) -> None:
    """The watchdog of a background compile (a kernel's tier-up, a vector math library
    function's optimized code): `on_done(future)` runs exactly once, with `fut` when it
    finishes within LAZYMATH_COMPILE_TIMEOUT seconds; otherwise the stuck worker is abandoned
    (the pool gets a new thread, see `_result`), `retry()` submits the compile again with the
    vectorizers off, and on_done gets that one -- or, if it times out too, a future holding
    the error (the caller keeps the quick code it has). A compile that finishes after its
    deadline is ignored."""
    lock = threading.Lock()
    done = [False]

    def deliver(f) -> None:
        with lock:
            if done[0]:
                return
            done[0] = True
        on_done(f)

    timeout = settings.COMPILE_TIMEOUT.get()
    wait = isolate.watchdog_timeout(timeout)  # server mode: the server kills a hung compile itself

    def expired(stage: int, job) -> None:
        if done[0]:
            return
        if not job.running() and not job.done():  # still queued (background jobs wait for
            _watchdog.at(wait, lambda: expired(stage, job))  # foreground ones): no hang
            return
        workers.abandon(job)
        if stage == 0:
            warnings.warn(f"lazymath: LLVM did not finish optimizing {what} in the background "
                          f"within {timeout:g} s (a known LLVM loop-vectorizer hang); compiling "
                          "it again with the vectorizers off. The stuck compiler thread keeps "
                          "one core busy until the process exits.", RuntimeWarning,
                          stacklevel=1)  # fmt: skip
            again = retry()
            again.add_done_callback(deliver)
            _watchdog.at(wait, lambda: expired(1, again))
            return
        failed: Future = Future()
        failed.set_exception(RuntimeError(
            f"LLVM did not finish compiling {what} within {timeout:g} s, even with the "
            "vectorizers off (LAZYMATH_COMPILE_TIMEOUT)"))  # fmt: skip
        deliver(failed)

    fut.add_done_callback(deliver)
    if not done[0]:
        _watchdog.at(wait, lambda: expired(0, fut))


_tiering = 0
_tiering_cv = threading.Condition()


_atexit_registered = False


def started() -> None:
    """A background tier-up began (a kernel's, or a library function's optimized code)."""
    global _tiering, _atexit_registered
    with _tiering_cv:
        _tiering += 1
        if not _atexit_registered:
            atexit.register(wait_tiering, 30.0)
            _atexit_registered = True


def finished() -> None:
    """A background tier-up ended (linked, failed or abandoned)."""
    global _tiering
    with _tiering_cv:
        _tiering -= 1
        _tiering_cv.notify_all()


def wait_tiering(timeout: float | None = None) -> bool:
    """Wait until every background tier-up has finished (True) or `timeout` passed (False).
    Benchmarks and tests use it; the process also waits (up to 30 s) at exit so the optimized
    code reaches the disk cache."""
    with _tiering_cv:
        return _tiering_cv.wait_for(lambda: _tiering == 0, timeout)


def _after_fork_in_child() -> None:
    """Background tier-ups of the parent never finish in a forked child: its kernels keep their
    tier-0 code, and the child's exit does not wait for them; the parent's deadlines are the
    parent's."""
    global _tiering, _tiering_cv, _watchdog
    _tiering = 0
    _tiering_cv = threading.Condition()
    _watchdog = _Watchdog()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
