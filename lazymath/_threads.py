"""The host thread pool that runs kernel blocks: one per process, shared by every caller.

A kernel's blocks are independent calls `fn(argv, i, n)` (for native kernels a ctypes call that
releases the GIL, so they run truly in parallel). Whoever runs blocks goes through `block_pool()`:
the runtime's streams (a launch), the engine's replay of a cached program, a compiled kernel
called directly (`CompiledKernel.__call__`). One pool means one set of threads, sized to the
cores, and no oversubscription when two of them run at once.

This module sits below every layer (it imports nothing of lazymath): the backend, the runtime
and the driver all use it, and none of them may import the others' modules for it.

`run(fn, argv, blocks, threads)` publishes a `_BlockJob`; the calling thread runs blocks itself
and at most `threads - 1` pool threads help, each claiming the next block index from an atomic
counter. Threads start on first use and only as many as a launch can use.

Fork: the pool's threads do not exist in a forked child, and its locks may have been held by
them; the child starts with no pool and builds a fresh one on its first multi-block launch.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading


class _BlockJob:
    """One launch's blocks, claimed one at a time by whoever runs `work()`.

    `next(itertools.count)` is a single C call, atomic under the GIL, so claiming needs no lock.
    The thread that finishes the last block releases `_done`.
    """

    __slots__ = ("fn", "argv", "n", "_next", "_finished", "_done", "error")

    def __init__(self, fn, argv, n: int) -> None:
        self.fn = fn
        self.argv = argv
        self.n = n
        self._next = itertools.count()
        self._finished = itertools.count(1)
        self._done = threading.Lock()
        self._done.acquire()
        self.error: BaseException | None = None

    def work(self) -> None:
        fn, argv, n = self.fn, self.argv, self.n
        while True:
            i = next(self._next)
            if i >= n:
                return
            try:
                fn(argv, i, n)
            except BaseException as exc:  # noqa: BLE001 - re-raised by the launching thread
                if self.error is None:
                    self.error = exc
            if next(self._finished) == n:
                self._done.release()

    def wait(self) -> None:
        self._done.acquire()


class BlockPool:
    """Daemon threads that help run the blocks of multi-block launches.

    `n_threads` (default: the host's cores) is how many threads, the caller's included, run one
    launch's blocks unless the launch asks for another count."""

    def __init__(self, n_threads: int | None = None) -> None:
        self.n_threads = max(1, n_threads or os.cpu_count() or 1)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._start_lock = threading.Lock()

    def _ensure_started(self, n: int) -> None:
        with self._start_lock:
            while len(self._threads) < n:
                t = threading.Thread(
                    target=self._loop, name=f"lazymath-block-{len(self._threads)}", daemon=True
                )
                t.start()
                self._threads.append(t)

    def _loop(self) -> None:
        get = self._jobs.get
        while True:
            job = get()
            if job is None:
                return
            job.work()

    def run(self, fn, argv, blocks: int, threads: int = 0) -> None:
        """Run `fn(argv, i, blocks)` for every block index; the calling thread takes part.

        At most `threads - 1` helpers (default `n_threads - 1`) are woken, so calling thread +
        helpers = the thread count. Raises the first exception any block raised, after all
        blocks have finished.
        """
        if blocks <= 1:
            if blocks == 1:
                fn(argv, 0, 1)
            return
        helpers = min(blocks, threads or self.n_threads) - 1
        if helpers <= 0:
            run_serial(fn, argv, blocks)
            return
        if len(self._threads) < helpers:
            self._ensure_started(helpers)
        job = _BlockJob(fn, argv, blocks)
        put = self._jobs.put
        for _ in range(helpers):
            put(job)
        job.work()
        job.wait()
        if job.error is not None:
            raise job.error

    def shutdown(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join(timeout=1.0)
        self._threads.clear()


def run_serial(fn, argv, blocks: int) -> None:
    """All blocks in order on the calling thread; like the pool, a failing block does not stop
    the others and the first error is raised at the end."""
    error: BaseException | None = None
    for i in range(blocks):
        try:
            fn(argv, i, blocks)
        except BaseException as exc:  # noqa: BLE001
            if error is None:
                error = exc
    if error is not None:
        raise error


class Threads:
    """A thread count on the shared pool: what a Device with `block_threads=n` (or the sync
    scheduler, n = 1) runs its launches with. It owns no threads: `Threads(1)` runs every block
    on the calling thread, a bigger count borrows the shared pool's threads (starting more if
    the count exceeds the cores)."""

    __slots__ = ("n_threads",)

    def __init__(self, n_threads: int) -> None:
        self.n_threads = max(1, n_threads)

    def run(self, fn, argv, blocks: int) -> None:
        if self.n_threads == 1 or blocks <= 1:
            run_serial(fn, argv, blocks)
        else:
            block_pool().run(fn, argv, blocks, self.n_threads)


SERIAL = Threads(1)

_POOL: BlockPool | None = None
_POOL_LOCK = threading.Lock()


def block_pool() -> BlockPool:
    """The process-wide block pool (its threads start on the first multi-block launch)."""
    pool = _POOL
    if pool is None:
        pool = _new_pool()
    return pool


def _new_pool() -> BlockPool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = BlockPool()
        return _POOL


def run_blocks(fn, argv, blocks: int) -> None:
    """Run every block of a launch on the shared pool (one block: on the calling thread)."""
    if blocks <= 1:
        if blocks == 1:
            fn(argv, 0, 1)
        return
    (_POOL or _new_pool()).run(fn, argv, blocks)


def _after_fork_in_child() -> None:
    global _POOL, _POOL_LOCK
    _POOL = None
    _POOL_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
