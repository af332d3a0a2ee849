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

The native lane (Linux x86-64; `tools/native_lane.c`, mapped from `_LANE_CODE`): a native
kernel's launch, `run_native(cfunc, argv, blocks)`, never needs the GIL on a pool thread. The
launcher publishes (function, argv, block count) in the lane and claims blocks itself in native
code; pool threads wait in native code too (`lane_work`) and call the kernel directly. Through
the Python queue a helper woke, then waited for the GIL (held by the launcher until its own
first block) before its first block, and the launcher, after its last block, waited for the
GIL the helper held while it finished in Python: each wait a futex wake-up of a halted vCPU,
~10 and ~20 us of a 256^3 float32 matmul's ~160 us on this project's Zen 5 VM (2 blocks,
interleaved A/B in issue 11's note: 158 -> 102 us per cached realize, numpy 88 us). Python
jobs (`run`: the interpreter, AI CPU steps, non-kernel callables) ring the lane's bell, and the
threads waiting in it return to Python to take them from the queue.

Bounded spinning (`LAZYMATH_POOL_SPIN_US`, default 1000 us): an idle pool thread, and
a launching thread waiting for the helpers' last block, first spins that long on a memory word in
native code (no GIL held, `pause` between reads) before it blocks (a futex in the lane). An idle
vCPU halts, takes tens of microseconds to wake and runs slow for a while after: a launch that
follows another within the window finds its helpers running (measured in issue 11's note: 256^3
f32 realizes with 1 ms of Python between them ran 6-16% faster with 1-3 ms windows; back to back
no change). After the window the threads block: an idle process burns no CPU. No spinning when
the pool has more threads than cores (a launch asked for more), nor without the native code
(other systems: threads block on the queue at once) or with the setting at 0.

Oversubscription (`OVERSUB_DETECT`): a multi-block launch whose launching thread got less than
half the launch's wall time as CPU time waited for a core -- it was descheduled, or a helper's
block ended long after its own. Another process or a peer library's pool holds a core. After
two such launches in a row, for the next second launches run on the calling thread only and
nothing spins (then the pool is tried again): waiting for a descheduled helper, or spinning on
a core somebody needs, costs more than the helper's share of the work. Measured with
`benchmarks/sharing.py --machine` (docs/performance.md). `BlockPool.late_launches` and
`quiet_periods` count what it saw.

Peer pools (`_peers.py`): before a native launch whose kernel took `_peers.QUIET_MIN_NS` or
more last time (`BlockPool._before`/`_after` remember them), a loaded OpenBLAS whose workers may
still be spinning after a numpy call is shut down when no other thread can be inside it
(`LAZYMATH_QUIET_PEERS`); pool threads running Python jobs are marked in `BUSY` meanwhile.

Thread counts (`num_threads`): `set_num_threads(n)` (also what the threadpoolctl controller in
`_tpctl.py` calls, so `threadpool_limits(1)` runs launches on the calling thread), else
LAZYMATH_NUM_THREADS, else `available_cpus()`: the affinity mask (`taskset`) capped by the cgroup
v1/v2 CPU quota (`docker --cpus`), never `os.cpu_count()` (a pinned process or a container on a
big host would start one thread per host core). Compile workers and the host block split use it.

Fork: the pool's threads do not exist in a forked child, and its locks may have been held by
them; the child starts with no pool and builds a fresh one on its first multi-block launch.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import os
import platform
import queue
import sys
import threading
import time

from lazymath import _peers, settings

# --------------------------------------------------------------------------- native code
# tools/native_lane.c, gcc (Debian 12.2.0-14+deb12u1) 12.2.0: gcc -O2 -fPIC -ffreestanding
# -fno-stack-protector -fcf-protection=none -fno-asynchronous-unwind-tables -fno-exceptions
# -fno-jump-tables (rebuild: python tools/build_native_lane.py). Position independent, no
# relocations, no libc: x86-64 SysV, Linux futexes.
_LANE_CODE = bytes.fromhex(
    "4155415441bcffffffff554889f5534889fb4883ec08662e0f1f840000000000488b034889c289c748c1fa20"
    "4839ea75674c39e77462488b8b80000000488b93880000004c8bab900000004c39ef7d48488d7001f0480fb1"
    "3375c54c89eeffd1488d7b40b801000000f00fc10783c00148984c39e875a98b434485c074a24531d2b8ca00"
    "0000be81000000ba010000000f05eb8c0f1f40004883c4085b5d415c415dc366662e0f1f8400000000006690"
    "4989d00f314889c148c1e2204809d1eb1a0f1f8000000000f3900f3148c1e2204809d04829c84c39c0731548"
    "8b074839f074e5b801000000c30f1f800000000031c0c366662e0f1f84000000000066900f3148c1e2204809"
    "d0c3660f1f440000415741564989f6415541544989d455534889fb4883ec180f3149c7c0ffffffff41bfffff"
    "ffff48c1e220488dafc00000004c8dafd00000004809d04889c666908b7d00498b45004885c07545488b83c8"
    "0000004c39e00f85b4000000488b0b4989c949c1f9204d39c8740789c94c39f9756e0f3148c1e2204809d048"
    "29f04c39f07325f3908b7d00498b45004885c074bb4883c41831c05b5d415c415d415e415fc3660f1f440000"
    "f08383c4000000014531d2b8ca000000be800000004863d74889ef0f05f083abc4000000010f3148c1e22048"
    "09d04889c6e962ffffff66904c89ce4889df4c894c2408e800feffff0f314c8b44240848c1e2204809d04889"
    "c6e93affffff662e0f1f8400000000004883c418b8010000005b5d415c415d415e415fc366662e0f1f840000"
    "0000009041574889d0baffffffff41564d89c6415541544989cc55534889fb4883ec084c8b0749c1f8204983"
    "c0014181e0ffffff7f4c89c148c1e1204809ca4887174887b780000000488787880000004c89e04887879000"
    "000031c0488d6f4087450048870ff08387c0000000018b87c400000085c0741b4881c7c00000004531d2b8ca"
    "000000be81000000baffffff7f0f054c89c64889dfe826fdffff0f3141bf010000004531c0be800000004989"
    "c548c1e2204883c3444909d50f1f8400000000004c634d004d39e1741c0f3148c1e2204809d04c29e84c39f0"
    "731ef3904c634d004d39e175e44883c4085b5d415c415d415e415fc30f1f40004489f88703486345004c39e0"
    "74104531d2b8ca0000004889ef4c89ca0f054489c08703eba30f1f004889f8f0488387c800000001488dbfc0"
    "000000f08380c0000000018b80c400000085c074144531d2b8ca000000be81000000baffffff7f0f05c3660f"
    "1f4400004889f84887b7d0000000488dbfc0000000f08380c0000000018b80c400000085c074144531d2b8ca"
    "000000be81000000baffffff7f0f05c3"
)
_LANE_SYMBOLS = {
    "lane_spin": 0xB0,
    "lane_tsc": 0x100,
    "lane_work": 0x110,
    "lane_launch": 0x240,
    "lane_ring": 0x360,
    "lane_stop": 0x3A0,
}
_LANE_BYTES = 256  # struct lane of tools/native_lane.c: 4 cache lines
_PYBELL = 0xC8  # offset of the lane's Python bell


class _Native:
    """The native code (tools/native_lane.c) mapped executable, and the TSC rate (measured
    against perf_counter_ns, lazily: the first calls only record a reference point, so building
    it costs nothing measurable).

    `spin(word, seen, ticks)`: 1 as soon as *word != seen, 0 once `ticks` TSC ticks passed;
    `tsc()`; the lane's `work`, `launch`, `ring` and `stop` (see `BlockPool`)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        mmap_, mprotect = libc.mmap, libc.mprotect
        mmap_.restype, mmap_.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t,
                                                          ctypes.c_int, ctypes.c_int,
                                                          ctypes.c_int, ctypes.c_long]  # fmt: skip
        mprotect.restype = ctypes.c_int
        mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        size = 4096
        # PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS; never unmapped (a page per process)
        addr = mmap_(None, size, 0x1 | 0x2, 0x02 | 0x20, -1, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        ctypes.memmove(addr, _LANE_CODE, len(_LANE_CODE))
        if mprotect(addr, size, 0x1 | 0x4) != 0:  # PROT_READ|PROT_EXEC
            raise OSError(ctypes.get_errno(), "mprotect failed")
        sym = _LANE_SYMBOLS
        i64, u64, vp = ctypes.c_int64, ctypes.c_uint64, ctypes.c_void_p
        # CFUNCTYPE (not PYFUNCTYPE): every call releases the GIL while it runs
        self.spin = ctypes.CFUNCTYPE(i64, vp, i64, u64)(addr + sym["lane_spin"])
        self.tsc = ctypes.CFUNCTYPE(u64)(addr + sym["lane_tsc"])
        self.work = ctypes.CFUNCTYPE(i64, vp, u64, i64)(addr + sym["lane_work"])
        # the kernel function and its argv go as they are: c_void_p passes a ctypes function
        # object's code address and a ctypes array's buffer address
        self.launch = ctypes.CFUNCTYPE(None, vp, vp, vp, i64, u64)(addr + sym["lane_launch"])
        self.ring = ctypes.CFUNCTYPE(None, vp)(addr + sym["lane_ring"])
        self.stop = ctypes.CFUNCTYPE(None, vp, i64)(addr + sym["lane_stop"])
        self._ref = (self.tsc(), time.perf_counter_ns())
        self.ticks_per_us = 0.0
        self._mmap = mmap_
        self._lanes: list[int] = []  # free lanes of the last mapped page
        self._lanes_lock = threading.Lock()

    def new_lane(self) -> int:
        """The address of a zeroed lane (64-byte aligned) in memory that is never freed: a pool
        thread may still be reading it while the interpreter shuts down (daemon threads stop
        only when they next want the GIL)."""
        with self._lanes_lock:
            if not self._lanes:
                page = self._mmap(None, 4096, 0x1 | 0x2, 0x02 | 0x20, -1, 0)  # zeroed
                if page in (None, ctypes.c_void_p(-1).value):
                    raise OSError(ctypes.get_errno(), "mmap failed")
                self._lanes = [page + i for i in range(0, 4096, _LANE_BYTES)][::-1]
            return self._lanes.pop()

    def ticks(self, us: int) -> int:
        """TSC ticks in `us` microseconds; 0 until the rate is known (>= 2 ms after creation)."""
        if not self.ticks_per_us:
            t0, n0 = self._ref
            t1, n1 = self.tsc(), time.perf_counter_ns()
            if n1 - n0 < 2_000_000:
                return 0
            self.ticks_per_us = max(0.0, (t1 - t0) * 1e3 / (n1 - n0))
        return int(us * self.ticks_per_us)


_SPINNER: _Native | None = None
_SPIN_TRIED = False


def _spinner() -> _Native | None:
    """The process's native code, None where there is none (not Linux x86-64, or mapping
    failed)."""
    global _SPINNER, _SPIN_TRIED
    if not _SPIN_TRIED:
        _SPIN_TRIED = True
        if sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64"):
            try:
                _SPINNER = _Native()
            except (OSError, AttributeError):
                _SPINNER = None
    return _SPINNER


def _spin_window() -> tuple[_Native | None, int]:
    """(spinner, TSC ticks to spin) for one wait; (None, 0) when waits block at once."""
    us = settings.POOL_SPIN_US.get()
    if us <= 0:
        return None, 0
    sp = _SPINNER if _SPIN_TRIED else _spinner()
    if sp is None:
        return None, 0
    return sp, sp.ticks(us)


def _window_ticks() -> int:
    return _spin_window()[1]


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


_CFuncPtr = ctypes.CFUNCTYPE(None).__mro__[1]  # ctypes' base class of C function pointers

# lazymath threads running Python work (which may be inside numpy): `_peers.quiet_peers` leaves
# OpenBLAS alone while one is (the streams mark their workers here)
BUSY = _peers.BUSY

# Native launches go through the lane (False: through `run`, the Python path; for A/B
# measurements and tests)
LANE = True

# Oversubscription detection (False: off, for A/B measurements). A multi-block launch whose
# launching thread got less than LATE_FRACTION of the launch's wall time as CPU time waited
# for a core: the launcher was descheduled, or a helper's block ended far (beyond the spin
# window) after the launcher's own -- another process or a peer library's pool holds a core.
# LATE_STREAK such launches in a row: for QUIET_NS launches run on the calling thread only and
# nothing spins (waiting for a descheduled helper, or spinning on a core somebody else needs,
# costs more than the helper's share); then the pool is tried again.
OVERSUB_DETECT = True
LATE_FRACTION = 0.5
LATE_STREAK = 2
QUIET_NS = 1_000_000_000
MIN_OBSERVED_NS = 200_000  # shorter launches say nothing reliable (timer and wake-up noise)


class BlockPool:
    """Daemon threads that help run the blocks of multi-block launches.

    `n_threads` (default: `num_threads()`, the CPUs the process may use unless a setting,
    `set_num_threads` or threadpoolctl says otherwise) is how many threads, the caller's
    included, run one launch's blocks unless the launch asks for another count.

    With the native code (Linux x86-64) the first `n_threads - 1` threads wait in the lane
    (`lane_work`, no GIL held): they run native launches (`run_native`) without any Python, and
    return to Python only for a job of the Python queue (`run`). Without it every thread blocks
    on the queue."""

    def __init__(self, n_threads: int | None = None) -> None:
        self.n_threads = max(1, n_threads or num_threads())
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._start_lock = threading.Lock()
        self._lane_lock = threading.Lock()  # one native launch at a time uses the lane
        self._n_lane = 0  # threads started in the lane (each joins every lane launch)
        self._quiet_until = 0  # perf_counter_ns before which launches run serially, no spinning
        self._late = 0  # late launches in a row (see _observe)
        self.late_launches = 0  # launches that waited for a core (see _observe)
        self.quiet_periods = 0  # times the host was found oversubscribed
        self._long: dict[int, None] = {}  # id(cfunc) of native launches that took >= QUIET_MIN_NS
        self._native = _spinner()
        self._lane = None
        if self._native is not None:
            self._lane = self._native.new_lane()  # the lane's words (tools/native_lane.c)
            self._pybell = ctypes.c_int64.from_address(self._lane + _PYBELL)

    def _ensure_started(self, n: int) -> None:
        with self._start_lock:
            while len(self._threads) < n:
                k = len(self._threads)
                lane = self._lane is not None and k < self.n_threads - 1
                t = threading.Thread(target=self._lane_loop if lane else self._loop,
                                     name=f"lazymath-block-{k}", daemon=True)  # fmt: skip
                t.start()
                self._threads.append(t)
                self._n_lane += lane

    def _spinning(self) -> bool:
        """Whether waits may spin: not when the pool has more threads than cores (a launch
        asked for more threads), nor while the host is oversubscribed (`_observe`): a
        spinning thread would hold a core another one needs."""
        return len(self._threads) < self.n_threads and time.perf_counter_ns() >= self._quiet_until

    def oversubscribed(self) -> bool:
        """Whether launches currently run on the calling thread only (see OVERSUB_DETECT)."""
        return self._quiet_until != 0 and time.perf_counter_ns() < self._quiet_until

    def _observe(self, wall0: int, cpu0: int, wall1: int | None = None,
                 cpu1: int | None = None) -> bool:  # fmt: skip
        """After a multi-block launch that started at (perf_counter_ns, thread_time_ns) =
        (wall0, cpu0): whether it waited for a core (see OVERSUB_DETECT); LATE_STREAK in a
        row start a quiet period of QUIET_NS. `wall1`/`cpu1`: the end stamps (default now;
        given by tests)."""
        wall1 = time.perf_counter_ns() if wall1 is None else wall1
        wall = wall1 - wall0
        if wall < MIN_OBSERVED_NS:
            return False
        cpu = (time.thread_time_ns() if cpu1 is None else cpu1) - cpu0
        if cpu >= LATE_FRACTION * wall:
            self._late = 0
            return False
        self.late_launches += 1
        self._late += 1
        if self._late >= LATE_STREAK:
            self._late = 0
            self._quiet_until = wall1 + QUIET_NS
            self.quiet_periods += 1
        return True

    def _before(self, cfunc) -> int:
        """Before a native launch of `cfunc`: its start time (perf_counter_ns); if it took
        QUIET_MIN_NS or more last time, peer pools that may be spinning are quieted first
        (`_peers.quiet_peers`)."""
        if self._long and id(cfunc) in self._long:
            _peers.quiet_peers()
        return time.perf_counter_ns()

    def _after(self, cfunc, wall0: int) -> int:
        """After a native launch of `cfunc` that started at `wall0`: remember whether it was
        long (at most 256 kernels; an id reused by a new kernel costs at most one needless
        check). Returns the end time."""
        wall1 = time.perf_counter_ns()
        if wall1 - wall0 >= _peers.QUIET_MIN_NS:
            if len(self._long) >= 256:
                self._long.clear()
            self._long[id(cfunc)] = None
        elif self._long:
            self._long.pop(id(cfunc), None)
        return wall1

    @staticmethod
    def _work(job: _BlockJob) -> None:
        """A helper's share of `job`; a Python job (not native blocks) marks this thread busy
        meanwhile (`_peers.BUSY`: it may be inside numpy)."""
        if isinstance(job.fn, _NativeBlocks):
            job.work()
            return
        me = threading.get_ident()
        _peers.BUSY.add(me)
        try:
            job.work()
        finally:
            _peers.BUSY.discard(me)

    def _loop(self) -> None:
        jobs = self._jobs
        while True:
            job = jobs.get()
            if job is None:
                return
            self._work(job)

    def _lane_loop(self) -> None:
        """A lane thread: Python jobs first, else wait in the lane (running native launches)
        until the Python bell rings (1) or the lane stops (0)."""
        jobs, native, lane, bell = self._jobs, self._native, self._lane, self._pybell
        while True:
            seen = bell.value  # before the queue is looked at: a later put rings past it
            try:
                job = jobs.get_nowait()
            except queue.Empty:
                ticks = _window_ticks() if self._spinning() else 0
                if native.work(lane, ticks, seen) == 0:
                    return
                continue
            if job is None:
                return
            self._work(job)

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
        # native blocks only (Python blocks wait for the GIL: CPU time says nothing), and not
        # with an explicit thread count (the caller's choice)
        watch = (OVERSUB_DETECT and threads in (0, self.n_threads)
                 and isinstance(fn, _NativeBlocks))  # fmt: skip
        if watch and self._quiet_until and self.oversubscribed():
            run_serial(fn, argv, blocks)
            return
        job = _BlockJob(fn, argv, blocks)
        native = isinstance(fn, _NativeBlocks)
        if native:
            w0 = self._before(fn.cfunc)
            c0 = time.thread_time_ns()
        put = self._jobs.put
        for _ in range(helpers):
            put(job)
        if self._lane is not None:
            self._native.ring(self._lane)
        job.work()
        job.wait(self._spinning())
        if native:
            w1 = self._after(fn.cfunc, w0)
            if watch:
                self._observe(w0, c0, w1)
        if job.error is not None:
            raise job.error

    def run_native(self, cfunc, argv, blocks: int, threads: int = 0) -> None:
        """Run a native kernel's blocks, `cfunc(i, blocks, argv)` for every block index (a
        ctypes function of lazymath's kernel signature and its ctypes argv array), like `run`.

        Through the lane when there is one and the launch may use every thread: the calling
        thread publishes the launch and runs blocks in native code, the pool's threads join
        without the GIL. Else (another launch holds the lane, a smaller thread count, no
        native code) through `run`."""
        if blocks <= 1:
            if blocks == 1:
                cfunc(0, 1, argv)
            return
        n = self.n_threads
        # `_n_lane > n - 1`: the count was lowered (set_num_threads) below the threads already
        # in the lane, which would all join a lane launch
        if (self._lane is None or (threads and threads < n) or n == 1 or not LANE
                or not isinstance(cfunc, _CFuncPtr) or self._n_lane > n - 1):  # fmt: skip
            self.run(_NativeBlocks(cfunc), argv, blocks, threads)
            return
        if not self._lane_lock.acquire(False):
            self.run(_NativeBlocks(cfunc), argv, blocks)
            return
        try:
            if len(self._threads) < n - 1:
                self._ensure_started(n - 1)
            watch = OVERSUB_DETECT
            if watch and self._quiet_until and self.oversubscribed():
                for i in range(blocks):  # the host is oversubscribed: this thread only
                    cfunc(i, blocks, argv)
                return
            w0 = self._before(cfunc)
            c0 = time.thread_time_ns()
            self._native.launch(self._lane, cfunc, argv, blocks,
                                _window_ticks() if self._spinning() else 0)  # fmt: skip
            w1 = self._after(cfunc, w0)
            if watch:
                self._observe(w0, c0, w1)
        finally:
            self._lane_lock.release()

    def shutdown(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)
        if self._lane is not None:
            self._native.stop(self._lane, 1)
        for t in self._threads:
            t.join(timeout=1.0)
        self._threads.clear()
        self._n_lane = 0
        while not self._jobs.empty():  # the Nones lane threads did not take (they stopped)
            self._jobs.get_nowait()
        if self._lane is not None:
            self._native.stop(self._lane, 0)


class _NativeBlocks:
    """`fn(argv, i, n)` of a native kernel function `cfunc(i, n, argv)` (the Python path)."""

    __slots__ = ("cfunc",)

    def __init__(self, cfunc) -> None:
        self.cfunc = cfunc

    def __call__(self, argv, i: int, n: int) -> None:
        self.cfunc(i, n, argv)


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

    def run_native(self, cfunc, argv, blocks: int) -> None:
        """`BlockPool.run_native` with this thread count."""
        if self.n_threads == 1 or blocks <= 1:
            for i in range(blocks):
                cfunc(i, blocks, argv)
        else:
            block_pool().run_native(cfunc, argv, blocks, self.n_threads)


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


def launch_blocks(pool, kernel, argv, blocks: int) -> None:
    """A kernel's blocks on `pool` (a BlockPool or a Threads count): native code (the kernel's
    `_cfunc`, `_cfunc(i, n, argv)`) through `run_native`, so the pool's threads run it without
    the GIL; any other kernel through `run(kernel.run_block, ...)`."""
    cf = getattr(kernel, "_cfunc", None)
    if cf is not None:
        pool.run_native(cf, argv, blocks)
    else:
        pool.run(kernel.run_block, argv, blocks)


def run_blocks(fn, argv, blocks: int) -> None:
    """Run every block of a launch on the shared pool (one block: on the calling thread)."""
    if blocks <= 1:
        if blocks == 1:
            fn(argv, 0, 1)
        return
    (_POOL or _new_pool()).run(fn, argv, blocks)


# --------------------------------------------------------------------------- thread counts
_CGROUP_ROOT = "/sys/fs/cgroup"
_PROC_CGROUP = "/proc/self/cgroup"
_LIMIT: int | None = None  # lm.set_num_threads / the threadpoolctl controller; None: not set


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _ancestors(rel: str) -> list[str]:
    """`rel` ("/a/b") and its parents up to "" (the mount root)."""
    parts = [p for p in rel.strip().split("/") if p and p != ".."]
    return ["/".join(parts[:i]) for i in range(len(parts), -1, -1)]


def cgroup_cpu_limit(root: str | None = None, proc_cgroup: str | None = None) -> float | None:
    """The CPU quota of the process's cgroup, in CPUs (quota / period, e.g. 2.0 for `docker
    --cpus 2`), or None when there is none or no cgroup file says.

    cgroup v2: `cpu.max` ("max 100000" or "200000 100000") of the process's cgroup (the "0::"
    line of /proc/self/cgroup) and of every parent up to the mount root; v1: `cpu.cfs_quota_us`
    and `cpu.cfs_period_us` (-1: no quota) in the "cpu" controller's hierarchy. In a container the
    process's own path is often not visible below the mount: the mount root counts too. The
    tightest quota found wins. `root` (default /sys/fs/cgroup) and `proc_cgroup` (default
    /proc/self/cgroup) are for tests with fixture trees."""
    root = _CGROUP_ROOT if root is None else root
    text = _read(_PROC_CGROUP if proc_cgroup is None else proc_cgroup) or ""
    limits: list[float] = []
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, rel = fields
        if controllers == "":  # v2
            for d in _ancestors(rel):
                raw = _read(os.path.join(root, d, "cpu.max"))
                if raw is None:
                    continue
                words = raw.split()
                if len(words) >= 1 and words[0] != "max":
                    try:
                        quota = int(words[0])
                        period = int(words[1]) if len(words) > 1 else 100000
                    except ValueError:
                        continue
                    if quota > 0 and period > 0:
                        limits.append(quota / period)
        elif "cpu" in controllers.split(","):  # v1
            for mount in (controllers, "cpu,cpuacct", "cpu"):
                base = os.path.join(root, mount)
                if not os.path.isdir(base):
                    continue
                for d in _ancestors(rel):
                    q = _read(os.path.join(base, d, "cpu.cfs_quota_us"))
                    p = _read(os.path.join(base, d, "cpu.cfs_period_us"))
                    try:
                        quota, period = int(q), int(p)  # type: ignore[arg-type]
                    except (TypeError, ValueError):
                        continue
                    if quota > 0 and period > 0:
                        limits.append(quota / period)
                break
    return min(limits) if limits else None


def available_cpus(affinity: set[int] | None = None, quota: float | None = None,
                   cpu_count: int | None = None) -> int:  # fmt: skip
    """How many CPUs this process may use: the CPUs of its affinity mask
    (`os.sched_getaffinity`, what `taskset` sets; `os.cpu_count()` where there is none), capped
    by the cgroup CPU quota rounded up (`cgroup_cpu_limit`). At least 1. The arguments replace
    what the host says (tests)."""
    if affinity is None and hasattr(os, "sched_getaffinity"):
        try:
            affinity = os.sched_getaffinity(0)
        except OSError:
            affinity = None
    n = len(affinity) if affinity else (cpu_count or os.cpu_count() or 1)
    if quota is None:
        quota = cgroup_cpu_limit()
    if quota is not None and quota > 0:
        n = min(n, max(1, math.ceil(quota - 1e-9)))
    return max(1, n)


def num_threads() -> int:
    """Lazymath's execution thread count: `set_num_threads(n)` (or a threadpoolctl limit) if
    set, else LAZYMATH_NUM_THREADS if set (not 0), else `available_cpus()`."""
    if _LIMIT is not None:
        return _LIMIT
    n = settings.NUM_THREADS.get()
    return n if n else available_cpus()


def set_num_threads(n: int | None) -> None:
    """Run kernel blocks on at most `n` threads (the calling thread included) from now on;
    None returns to the default (`num_threads`). The pool keeps its started threads; a lower
    count wakes fewer of them."""
    global _LIMIT
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"set_num_threads: expected an int or None, got {type(n).__name__}")
        if n < 1:
            raise ValueError(f"set_num_threads: the thread count must be >= 1, got {n}")
    _LIMIT = n
    pool = _POOL
    if pool is not None:
        pool.n_threads = num_threads()


def get_num_threads() -> int:
    """The thread count kernel launches use now (the pool's if it exists, else `num_threads`)."""
    pool = _POOL
    return pool.n_threads if pool is not None else num_threads()


def _after_fork_in_child() -> None:
    global _POOL, _POOL_LOCK
    _POOL = None
    _POOL_LOCK = threading.Lock()
    if _SPINNER is not None:
        _SPINNER._lanes_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
