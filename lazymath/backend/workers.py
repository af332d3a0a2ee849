"""LLVM compile workers: kernels are optimized and code-generated on threads, in parallel.

    fut = workers.submit(ir_text, "lmmod_x", level=3)   # concurrent.futures.Future[bytes]
    obj = fut.result()                                   # relocatable object code
    addr, how = jit.load_cached(obj, symbol, "lmmod_x")  # elfload (or MCJIT) links it in

Why not the MCJIT engine (`jit.Jit.compile`): llvmlite serializes every call into LLVM with one
process-wide lock, and the engine's optimizer shares LLVM's global context, so two kernels can
never compile at the same time and a compile holds up anything else that touches LLVM. LLVM
itself is thread safe across contexts. Each worker thread owns an LLVM context, a target
machine (the Jit's CPU and features) and pass builders; the two long calls -- the optimization
pipeline and code generation -- run through llvmlite's C functions without its lock (short
ones, parsing and verifying a module in the worker's own context, keep it). The object the
worker emits is what MCJIT would emit for the module; it is linked in with `jit.load_cached`
(elfload: no LLVM at all) and stored in the disk cache unchanged.

Levels: 3 the O3 pipeline, 1 speed level 1 (tiny kernels, see compile._is_tiny), 0 no IR
optimization (tiered compilation's first tier: code generation only). Vectorizers on at 1 and 3.
Floating point is IEEE at every level (no fast-math flags anywhere): levels only change speed,
never results.
"""

from __future__ import annotations

import os
import queue
import threading
from concurrent.futures import Future

_local = threading.local()
_queue: queue.SimpleQueue = queue.SimpleQueue()
_threads: list[threading.Thread] = []
_threads_lock = threading.Lock()
_abandoned = 0


def n_workers() -> int:
    """Compile threads: LAZYMATH_COMPILE_THREADS, default (0) one per core, at most 4."""
    from lazymath import settings

    n = settings.COMPILE_THREADS.get()
    return max(1, n or min(os.cpu_count() or 1, 4))


def _loop() -> None:
    while True:
        fut, fn, args = _queue.get()
        if not fut.set_running_or_notify_cancel():
            continue
        try:
            fut.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits
            fut.set_exception(e)


def _start_threads() -> None:
    """Daemon threads (a thread stuck in LLVM must not hold up the interpreter's exit)."""
    with _threads_lock:
        want = n_workers() + _abandoned
        while len(_threads) < want:
            t = threading.Thread(target=_loop, name=f"lazymath-compile-{len(_threads)}",
                                 daemon=True)  # fmt: skip
            t.start()
            _threads.append(t)


def abandon() -> None:
    """A worker is stuck in LLVM for good (see compile's watchdog): start one more thread so
    the pool keeps its size; the stuck one keeps its core until the process exits."""
    global _abandoned
    with _threads_lock:
        _abandoned += 1
    _start_threads()


class Compiler:
    """One thread's LLVM state: context, target machine, pass builders (levels 0, 1, 3)."""

    def __init__(self, target: str | None = None) -> None:
        from lazymath.backend.jit import _binding, get_jit

        llvm = _binding()
        jit = get_jit(target)  # initializes the native target; its CPU name and features
        self.cpu_name = jit.cpu_name
        self.context = llvm.create_context()
        target = llvm.Target.from_default_triple()
        self.tm = target.create_target_machine(
            cpu=jit.cpu_name, features=jit.cpu_features, opt=3, jit=True
        )
        self.triple = jit.triple
        self.data_layout = jit.data_layout
        self.pbs: dict = {}

    def _pb(self, level: int, vectorize: bool):
        pb = self.pbs.get((level, vectorize))
        if pb is None:
            from lazymath.backend.jit import _binding

            llvm = _binding()
            pto = llvm.PipelineTuningOptions(speed_level=level)
            pto.loop_vectorization = vectorize
            pto.slp_vectorization = vectorize
            if level == 3:
                pto.loop_interleaving = True
                pto.loop_unrolling = True
            pb = self.pbs[(level, vectorize)] = llvm.create_pass_builder(self.tm, pto)
        return pb

    def compile(self, ir_text: str, module_name: str, level: int, vectorize: bool = True) -> bytes:
        """Object code of `ir_text` (one module) optimized at `level`."""
        from llvmlite.binding import ffi

        from lazymath.backend.jit import _binding

        mod = _binding().parse_assembly(ir_text, context=self.context)
        mod.name = module_name
        mod.triple = self.triple
        mod.data_layout = self.data_layout
        mod.verify()
        if level > 0:
            pb = self._pb(3 if level >= 3 else 1, vectorize)
            mpm = pb.getModulePassManager()
            ffi.lib.LLVMPY_RunNewModulePassManager._cfn(mpm, mod, pb)  # without the lock
        with ffi.OutputString() as err:
            mb = ffi.lib.LLVMPY_TargetMachineEmitToMemory._cfn(self.tm, mod, 1, err)
            if not mb:
                raise RuntimeError(f"LLVM code generation failed for {module_name}: {err}")
        try:
            start = ffi.lib.LLVMPY_GetBufferStart(mb)
            size = ffi.lib.LLVMPY_GetBufferSize(mb)
            import ctypes

            return ctypes.string_at(start, size)
        finally:
            ffi.lib.LLVMPY_DisposeMemoryBuffer(mb)


# Every thread's compiler, referenced here too: a forked child deletes the parent's other
# threads' state, and freeing their compilers there would dispose LLVM contexts another parent
# thread may have been using (under llvmlite's lock, inherited held): they are never freed.
_compilers: list[Compiler] = []


def _requested() -> str:
    from lazymath.backend import host

    return host.requested()


def _compiler(target: str | None = None) -> Compiler:
    """This thread's compiler for `target` (a LAZYMATH_TARGET_CPU value; None: the one in
    effect now). One per target: a process that switches targets (the tests run the forced
    AVX2 path after native code) must not generate the new target's kernels with the target
    machine a worker built for the first one."""
    if target is None:
        target = _requested()
    cs = getattr(_local, "compilers", None)
    if cs is None:
        cs = _local.compilers = {}
    c = cs.get(target)
    if c is None:
        c = cs[target] = Compiler(target)
        with _threads_lock:
            _compilers.append(c)
    return c


def _work(ir_text: str, module_name: str, level: int, vectorize: bool = True,
          marker: str | None = None, target: str | None = None) -> bytes:  # fmt: skip
    if marker is None:
        return _compiler(target).compile(ir_text, module_name, level, vectorize)
    from lazymath.backend import isolate

    with isolate.compiling(marker):  # a process dying in LLVM here leaves the mark
        return _compiler(target).compile(ir_text, module_name, level, vectorize)


def submit(ir_text: str, module_name: str, level: int = 3, vectorize: bool = True,
           marker: str | None = None) -> Future:  # fmt: skip
    """Compile on a worker thread; the Future's result is the object code. `marker`: the
    kernel's disk key, marked as being compiled while LLVM runs (see `isolate`). The code is
    generated for the host target in effect at submission (the IR and its disk key were made
    for it), whichever target the worker compiled for before."""
    _start_threads()
    fut: Future = Future()
    _queue.put((fut, _work, (ir_text, module_name, level, vectorize, marker, _requested())))
    return fut


def compile_here(ir_text: str, module_name: str, level: int = 3, vectorize: bool = True) -> bytes:
    """Compile on the calling thread (its own LLVM state, no lock held during the work)."""
    return _work(ir_text, module_name, level, vectorize)


def child_main() -> None:
    """The isolated compiler process (`isolate.compile_in_child`): JSON request on stdin,
    object code on stdout."""
    import json
    import sys

    req = json.loads(sys.stdin.buffer.read())
    from lazymath import settings

    fault = settings.TEST_COMPILE_FAULT.get()  # tests: simulate LLVM failing
    if fault == "abort" or (fault == "abort-vectorized" and req["vectorize"]):
        os.abort()
    if fault == "hang" or (fault == "hang-vectorized" and req["vectorize"]):
        import time

        time.sleep(3600)
    # the same compiler as the parent's workers (own context, target machine, pass builders)
    obj = compile_here(req["text"], req["module"], int(req["level"]), bool(req["vectorize"]))
    if not obj:
        sys.exit(3)
    sys.stdout.buffer.write(obj)
    sys.stdout.buffer.flush()


def _after_fork_in_child() -> None:
    """A forked child has none of the parent's worker threads (the list still names them) and
    may have inherited the queue's or the list's lock held: fresh ones; compiles the parent
    had queued or running are lost to the child (their futures never finish there)."""
    global _queue, _threads, _threads_lock, _abandoned
    _queue = queue.SimpleQueue()
    _threads = []
    _threads_lock = threading.Lock()
    _abandoned = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
