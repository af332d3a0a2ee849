"""Peer thread pools in this process that keep a core busy after their call returned, and
quieting them before a long lazymath launch (issue 35).

Why: OpenBLAS's pthreads server (what numpy and scipy load) keeps each worker thread in a busy
loop of `nop`s for `thread_timeout` TSC ticks (2**28 by default, ~0.1 s here) after its last
job, in case another call comes. A lazymath kernel that starts inside that window shares the
two cores with it: the Zen 4 host's fp16 `relu(A @ B) * 0.5` 2048^3 took 1.32-1.38x its time
alone right after a numpy 2048 matmul (the worker got 56-64 ms of CPU during the ~100 ms
kernel), at the 2 / 1.5 bound that any block split has with 1.5 cores left. Nothing on
lazymath's side of the split helps; what helps is the worker not spinning. OpenBLAS has no
call that ends the spin, but it exports `blas_thread_shutdown_` (what its own fork handler
calls): the workers exit, and its next threaded call re-creates them (lazily, since 0.2.9:
`blas_server_avail` is 0 until then). lazymath calls it right before a launch that took at
least `QUIET_MIN_NS` last time (`_threads.BlockPool` knows), when

- `LAZYMATH_QUIET_PEERS` is on (the default);
- a loaded OpenBLAS (>= 0.3, pthreads build) has its server up with more than one thread;
- one of the process's native threads is running (state R in /proc: a spinning worker; a
  sleeping one costs nothing, and shutting it down would only make the next numpy call
  re-create it): `_spinning_candidates`;
- no other thread can be inside OpenBLAS (a call in flight would hang or lose its buffers):
  every other Python thread is lazymath's own and idle (`BUSY` marks a lazymath thread that
  runs Python work: stream commands, Python block jobs), except the main thread while the
  realize thread runs its program (it waits for it). The check and the shutdown run holding
  the GIL, so no Python thread can enter a BLAS call in between. Any other thread (a user's
  loader thread, a Jupyter kernel's) means: leave OpenBLAS alone.

Numerical results never change (OpenBLAS splits its work by its thread count, not by its
threads' lifetimes). The cost: ~0.1 ms per shutdown, and the next threaded numpy call pays
its workers' start (docs/performance.md has the numbers). OpenMP (torch's libgomp) has no call
that ends a spin from another thread's pool; its idle threads spin for a much shorter time
(GOMP_SPINCOUNT) and were measured within issue 35's goal.

This module sits in the base layer: it imports only `lazymath.settings`.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import threading
import time

from lazymath import settings

# A launch that took at least this long last time gets the peers quieted first (the shutdown
# costs ~0.1 ms, the spin it ends up to a third of the machine for up to ~0.1 s)
QUIET_MIN_NS = 5_000_000
# The loaded libraries are looked up again at most this often, and only when sys.modules grew
# (a new extension may have loaded another OpenBLAS, scipy's)
RESCAN_NS = 1_000_000_000
_REALIZE_THREAD = "lazymath-realize"  # engine._RealizeThread's thread (runs main's programs)
_OWN_PREFIX = "lazymath-"  # every thread lazymath starts is named so

# Idents of lazymath threads running Python work right now (stream commands, Python block jobs):
# such a thread may be inside numpy (an interpreted kernel, an AI CPU step). set.add/discard are
# single C calls, atomic under the GIL.
BUSY: set[int] = set()

_MAPS = "/proc/self/maps"
_TASKS = "/proc/self/task"
_NAME = re.compile(r"openblas", re.IGNORECASE)
_VERSION = re.compile(rb"OpenBLAS\s+(\d+)\.(\d+)")
_AFFIXES = [(p, s) for p in ("", "scipy_") for s in ("", "64_", "_64")]


class OpenBLAS:
    """One loaded OpenBLAS whose pthreads server can be shut down: `path`, its
    `blas_server_avail` and `blas_num_threads` words, and `blas_thread_shutdown_` called holding
    the GIL (a PYFUNCTYPE, not a CDLL function, which would release it)."""

    __slots__ = ("path", "_avail", "_threads", "_shutdown", "_lib", "shutdowns")

    def __init__(self, path: str, lib, avail, threads, shutdown) -> None:
        self.path = path
        self._lib = lib  # keeps the handle (and so the words) alive
        self._avail = avail
        self._threads = threads
        self._shutdown = shutdown
        self.shutdowns = 0

    def awake(self) -> bool:
        """Whether its worker threads exist (the server is up with more than one thread)."""
        return self._avail.value == 1 and self._threads.value > 1

    def quiet(self) -> None:
        """End its worker threads (they are re-created by its next threaded call)."""
        self._shutdown()
        self.shutdowns += 1


def _symbol(lib, name: str):
    """`name` under the affixes OpenBLAS builds use (numpy's: scipy_<name>64_), else None."""
    for prefix, suffix in _AFFIXES:
        try:
            return getattr(lib, f"{prefix}{name}{suffix}")
        except AttributeError:
            continue
    return None


def version_ok(config: bytes | None) -> bool:
    """Whether `openblas_get_config()`'s text names OpenBLAS 0.3 or later (the lazy re-init
    after a shutdown exists since 0.2.9; 0.3 is what was read and tested)."""
    m = _VERSION.search(config or b"")
    return m is not None and (int(m.group(1)), int(m.group(2))) >= (0, 3)


def open_openblas(path: str) -> OpenBLAS | None:
    """The OpenBLAS at `path` if it is already loaded, a pthreads build of 0.3 or later and
    exports what a shutdown needs; None otherwise (never loads a library)."""
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except (OSError, AttributeError):  # not loaded (RTLD_NOLOAD), or no dlopen
        return None
    try:
        shutdown = lib.blas_thread_shutdown_
        avail = ctypes.c_int.in_dll(lib, "blas_server_avail")
        threads = ctypes.c_int.in_dll(lib, "blas_num_threads")
    except (AttributeError, ValueError):
        return None
    parallel, config = _symbol(lib, "openblas_get_parallel"), _symbol(lib, "openblas_get_config")
    if parallel is None or config is None:
        return None
    parallel.restype, config.restype = ctypes.c_int, ctypes.c_char_p
    if parallel() != 1 or not version_ok(config()):  # 1: pthreads (0 sequential, 2 OpenMP)
        return None
    addr = ctypes.cast(shutdown, ctypes.c_void_p).value
    return OpenBLAS(path, lib, avail, threads, ctypes.PYFUNCTYPE(ctypes.c_int)(addr))


def openblas_paths(maps: str) -> list[str]:
    """Paths of mapped files whose name says OpenBLAS, in /proc/self/maps text `maps`."""
    seen: list[str] = []
    for line in maps.splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith("/"):
            path = fields[5].strip()
            if _NAME.search(os.path.basename(path)) and path not in seen:
                seen.append(path)
    return seen


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


class _Libraries:
    """The OpenBLAS libraries of this process, looked up lazily (at the first long launch, not
    at import) and again when sys.modules grew, at most every RESCAN_NS."""

    def __init__(self) -> None:
        self.libs: list[OpenBLAS] = []
        self._modules = -1
        self._at = 0
        self._lock = threading.Lock()

    def get(self) -> list[OpenBLAS]:
        n = len(sys.modules)
        if n != self._modules and time.perf_counter_ns() - self._at >= RESCAN_NS:
            with self._lock:
                maps = _read(_MAPS) or ""
                known = {lib.path: lib for lib in self.libs}
                libs = []
                for path in openblas_paths(maps):
                    lib = known.get(path) or open_openblas(path)
                    if lib is not None:
                        libs.append(lib)
                self.libs, self._modules, self._at = libs, n, time.perf_counter_ns()
        return self.libs


LIBRARIES = _Libraries()


def alone(current: threading.Thread | None = None,
          threads: list[threading.Thread] | None = None) -> bool:  # fmt: skip
    """Whether no thread but `current` (default: the calling thread) can be inside a BLAS call:
    every other Python thread is lazymath's and idle (not in BUSY), or the main thread while
    `current` is the realize thread (which runs only the main thread's programs while it
    waits). `threads`: the threads to judge (default threading.enumerate(); tests)."""
    cur = threading.current_thread() if current is None else current
    main = threading.main_thread()
    for t in threading.enumerate() if threads is None else threads:
        if t is cur:
            continue
        if t is main:
            if cur.name == _REALIZE_THREAD:
                continue
            return False
        if not t.name.startswith(_OWN_PREFIX) or t.ident in BUSY:
            return False
    return True


def thread_state(stat: str) -> str:
    """The state letter of a /proc/<pid>/task/<tid>/stat line ("R", "S", ...; "" if none): the
    field after the command name, which is in parentheses and may itself hold ") "."""
    i = stat.rfind(")")
    return stat[i + 2 : i + 3] if i >= 0 else ""


class _Watch:
    """Which native threads may be a peer's spinning workers: those not started by Python and
    not seen right after the last shutdown (then they were another library's)."""

    def __init__(self) -> None:
        self.old: set[int] = set()

    def native_tids(self, py: set[int]) -> set[int] | None:
        try:
            return {int(t) for t in os.listdir(_TASKS)} - py
        except (OSError, ValueError):
            return None

    def spinning(self, py: set[int]) -> bool:
        """Whether a candidate native thread is running (True when /proc says nothing)."""
        tids = self.native_tids(py)
        if tids is None:
            return True
        for tid in tids - self.old:
            if thread_state(_read(f"{_TASKS}/{tid}/stat") or "") == "R":
                return True
        return False

    def after_shutdown(self, py: set[int]) -> None:
        self.old = self.native_tids(py) or set()


WATCH = _Watch()


def quiet_peers() -> int:
    """Before a long launch: shut down the workers of every loaded OpenBLAS that may be
    spinning, when that is safe (see the module). Returns how many were shut down."""
    if not settings.QUIET_PEERS.get():
        return 0
    awake = [lib for lib in LIBRARIES.get() if lib.awake()]
    if not awake:
        return 0
    threads = threading.enumerate()
    py = {t.native_id for t in threads if t.native_id is not None}
    if not WATCH.spinning(py) or not alone(None, threads):
        return 0
    for lib in awake:  # holding the GIL: no Python thread starts a BLAS call meanwhile
        lib.quiet()
    WATCH.after_shutdown(py)
    return len(awake)


def _after_fork_in_child() -> None:
    global LIBRARIES, WATCH
    BUSY.clear()
    LIBRARIES = _Libraries()
    WATCH = _Watch()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
