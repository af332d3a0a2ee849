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

Bounded spinning (`LAZYMATH_POOL_SPIN_US`, default 1000 us): an idle pool thread, and
a launching thread waiting for the helpers' last block, first spins that long on a memory word in
native code (no GIL held, `pause` between reads) before it blocks. An idle vCPU halts, takes tens
of microseconds to wake and runs slow for a while after: a launch that follows another within the
window finds its helpers running (measured in issue 11's note: 256^3 f32 realizes with 1 ms of
Python between them ran 6-16% faster with 1-3 ms windows; back to back no change). After the
window the threads block: an idle process burns no CPU. No spinning when the pool has more threads
than cores (a launch asked for more), nor without the few instructions of `_SPIN_CODE` (Linux
x86-64 only) or with the setting at 0: threads block at once.

Fork: the pool's threads do not exist in a forked child, and its locks may have been held by
them; the child starts with no pool and builds a fresh one on its first multi-block launch.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import platform
import queue
import sys
import threading
import time

from lazymath import settings

# --------------------------------------------------------------------------- bounded spin
# int64 spin(int64 *word, int64 seen, uint64 ticks): 1 as soon as *word != seen, 0 once `ticks`
# TSC ticks have passed; int64 tsc(void): the time stamp counter. SysV x86-64 (as(1) output):
_SPIN_CODE = bytes.fromhex(
    "4989d0"  # spin:  mov r8, rdx            ; ticks
    "0f31"  #          rdtsc
    "48c1e220"  #      shl rdx, 32
    "4809d0"  #        or rax, rdx
    "4989c1"  #        mov r9, rax            ; start
    "488b07"  # 1:     mov rax, [rdi]
    "4839f0"  #        cmp rax, rsi
    "7516"  #          jne 2f
    "f390"  #          pause
    "0f31"  #          rdtsc
    "48c1e220"  #      shl rdx, 32
    "4809d0"  #        or rax, rdx
    "4c29c8"  #        sub rax, r9
    "4c39c0"  #        cmp rax, r8
    "72e5"  #          jb 1b                  ; unsigned: a TSC step back ends the spin
    "31c0"  #          xor eax, eax
    "c3"  #            ret
    "b801000000"  # 2: mov eax, 1
    "c3"  #            ret
    "0f31"  # tsc:     rdtsc                  ; offset 0x33
    "48c1e220"  #      shl rdx, 32
    "4809d0"  #        or rax, rdx
    "c3"  #            ret
)
_TSC_OFFSET = 0x33


class _Spinner:
    """The native spin and the TSC rate (measured against perf_counter_ns, lazily: the first
    calls only record a reference point, so building it costs nothing measurable)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        mmap_, mprotect = libc.mmap, libc.mprotect
        mmap_.restype, mmap_.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t,
                                                          ctypes.c_int, ctypes.c_int,
                                                          ctypes.c_int, ctypes.c_long]  # fmt: skip
        mprotect.restype = ctypes.c_int
        mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        size = 4096
        # PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS; never unmapped (a few bytes per process)
        addr = mmap_(None, size, 0x1 | 0x2, 0x02 | 0x20, -1, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        ctypes.memmove(addr, _SPIN_CODE, len(_SPIN_CODE))
        if mprotect(addr, size, 0x1 | 0x4) != 0:  # PROT_READ|PROT_EXEC
            raise OSError(ctypes.get_errno(), "mprotect failed")
        # CFUNCTYPE (not PYFUNCTYPE): the calls release the GIL while they spin
        self.spin = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                                     ctypes.c_uint64)(addr)  # fmt: skip
        self.tsc = ctypes.CFUNCTYPE(ctypes.c_uint64)(addr + _TSC_OFFSET)
        self._ref = (self.tsc(), time.perf_counter_ns())
        self.ticks_per_us = 0.0

    def ticks(self, us: int) -> int:
        """TSC ticks in `us` microseconds; 0 until the rate is known (>= 2 ms after creation)."""
        if not self.ticks_per_us:
            t0, n0 = self._ref
            t1, n1 = self.tsc(), time.perf_counter_ns()
            if n1 - n0 < 2_000_000:
                return 0
            self.ticks_per_us = max(0.0, (t1 - t0) * 1e3 / (n1 - n0))
        return int(us * self.ticks_per_us)


_SPINNER: _Spinner | None = None
_SPIN_TRIED = False


def _spinner() -> _Spinner | None:
    """The process's spinner, None where there is none (not Linux x86-64, or mapping failed)."""
    global _SPINNER, _SPIN_TRIED
    if not _SPIN_TRIED:
        _SPIN_TRIED = True
        if sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64"):
            try:
                _SPINNER = _Spinner()
            except (OSError, AttributeError):
                _SPINNER = None
    return _SPINNER


def _spin_window() -> tuple[_Spinner | None, int]:
    """(spinner, TSC ticks to spin) for one wait; (None, 0) when waits block at once."""
    us = settings.POOL_SPIN_US.get()
    if us <= 0:
        return None, 0
    sp = _SPINNER if _SPIN_TRIED else _spinner()
    if sp is None:
        return None, 0
    return sp, sp.ticks(us)


class _BlockJob:
    """One launch's blocks, claimed one at a time by whoever runs `work()`.

    `next(itertools.count)` is a single C call, atomic under the GIL, so claiming needs no lock.
    The thread that finishes the last block releases `_done`.
    """

    __slots__ = ("fn", "argv", "n", "_next", "_finished", "_done", "_flag", "error")

    def __init__(self, fn, argv, n: int) -> None:
        self.fn = fn
        self.argv = argv
        self.n = n
        self._next = itertools.count()
        self._finished = itertools.count(1)
        self._done = threading.Lock()
        self._done.acquire()
        self._flag = ctypes.c_int64(0)  # 1 once every block finished (what a waiter spins on)
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
                self._flag.value = 1
                self._done.release()

    def wait(self, spin: bool = False) -> None:
        """Until every block finished; with `spin`, spin the window first (see the module)."""
        if spin and not self._flag.value:
            sp, ticks = _spin_window()
            if ticks:
                sp.spin(ctypes.addressof(self._flag), 0, ticks)
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
        # bumped after every publish: what idle threads spin on before they block on the queue
        self._bell = ctypes.c_int64(0)
        self._rings = itertools.count(1)

    def _ensure_started(self, n: int) -> None:
        with self._start_lock:
            while len(self._threads) < n:
                t = threading.Thread(
                    target=self._loop, name=f"lazymath-block-{len(self._threads)}", daemon=True
                )
                t.start()
                self._threads.append(t)

    def _spinning(self) -> bool:
        """Whether waits may spin: not when the pool has more threads than cores (a launch
        asked for more threads): a spinning thread would hold a core another one needs."""
        return len(self._threads) < self.n_threads

    def _loop(self) -> None:
        jobs, bell = self._jobs, self._bell
        bell_addr = ctypes.addressof(bell)
        while True:
            if jobs.empty() and self._spinning():
                seen = bell.value
                if jobs.empty():  # nothing was published before `seen` was read: spin on it
                    sp, ticks = _spin_window()
                    if ticks:
                        sp.spin(bell_addr, seen, ticks)
            job = jobs.get()  # the queue decides; the spin only delays blocking
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
        self._bell.value = next(self._rings)
        job.work()
        job.wait(self._spinning())
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
